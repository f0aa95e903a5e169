"""``parallax.profile``: a torch.profiler window around some of a script's steps, stored where the Run
page's Profile section and the Profiler page read it (the op table, each step's time by phase, the
Chrome trace), per rank, as for a launched run with ``--profile``.

    with parallax.profile(wait=1, warmup=1, active=3) as prof:
        for x, y in loader:
            with prof.range("forward"):      # optional: data_loading, forward, backward, optimizer_step
                loss = model(x).loss
            ...
            prof.step()                      # after each step; the profiler stops after the window

On a GPU each phase waits for the current CUDA device (``torch.cuda.set_device``) at its end, so that its
length is its kernels'. torch is imported here only, when ``profile`` is entered.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path


@contextlib.contextmanager
def profile(*, wait: int = 1, warmup: int = 1, active: int = 3, with_stack: bool = False):
    from parallax import endings

    for name, value, least in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if type(value) is not int or value < least:
            raise ValueError(f"parallax.profile: {name}={value!r} is not allowed; give a whole number of {least} or more")
    run = endings.current()
    if run is None or run.mode != "online" or run.run_id is None:
        raise RuntimeError("parallax.profile needs a run that writes to the database: call parallax.init(...) "
                           "(mode='online') first")
    import torch

    from trainer_backend.telemetry.profiling import StepProfiler, read_rank_outputs

    info = run.info
    # The device the script trains on is its current one (torch.cuda.set_device): cuda:LOCAL_RANK does not exist
    # where each task sees one GPU (srun --gpus-per-task), nor on a second machine of an mp.spawn job.
    devices = [torch.device("cuda", torch.cuda.current_device())] if torch.cuda.is_available() \
        else [torch.device("cpu")]
    with tempfile.TemporaryDirectory(prefix="parallax-profile-") as folder:
        profiler = StepProfiler(wait=wait, warmup=warmup, active=active, devices=devices, rank=info.rank,
                                world_size=info.world_size, out_dir=Path(folder), with_stack=with_stack)
        profiler.start()
        try:
            yield profiler
        finally:
            profiler.finish()
            _store(run, read_rank_outputs(Path(folder)))


def _store(run, outputs) -> None:
    from db import profiles, store
    from db.connection import retry_when_locked

    for summary, trace_gz in outputs:
        if trace_gz is None:
            note = f"Rank {summary['rank']} kept no profile: {summary['skipped']}."
            print(f"parallax: {note}", file=sys.stderr, flush=True)
            retry_when_locked(lambda n=note: store.add_notes(run._engine, run.run_id, [n]), what="note the profile")
            continue
        retry_when_locked(lambda s=summary, t=trace_gz: profiles.save_profile(
            run._engine, run.run_id, s["rank"], ops=s["ops"], steps=s["steps"], trace_gz=t,
            trace_bytes=s["trace_bytes"]), what=f"record rank {summary['rank']}'s profile")
