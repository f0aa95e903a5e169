"""What every benchmark script shares: A/B alternation, summaries, targets, results.json, the report.

A benchmark script builds a ``Report``, adds rows (each a list of measured values, summarised as
median and min–max, optionally checked against a target), and calls ``report.finish(args)``:
that prints the figures and whether each target is met, and merges the report into the results
file named by ``--results`` (``bench/results.json`` for a full run; ``--quick`` writes nothing
unless ``--results`` is given). ``render_markdown`` turns results.json into docs/BENCHMARKS.md.

    report = Report("engine_overhead", "Engine overhead", method="...")
    times = alternate({"plain": run_plain, "engine": run_engine}, repeats=5)
    report.ratio("whole process, engine / plain", times["engine"], times["plain"], target=at_most(1.10))
    report.finish(args)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "bench"
RESULTS_PATH = BENCH_DIR / "results.json"
DOCS_PATH = ROOT / "docs" / "BENCHMARKS.md"
PYTHON = sys.executable
FULL_REPEATS = 5
QUIET_LOAD = 0.5  # 1-minute load average under which the machine counts as quiet


# --- command line ---------------------------------------------------------------------------


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The flags every benchmark takes: --quick, --repeats, --results."""
    parser = argparse.ArgumentParser(description=description.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny settings and one repeat: checks that the script runs, measures nothing")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"repeats of each contender (default {FULL_REPEATS}; 1 with --quick)")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"merge the figures into this JSON file (default {RESULTS_PATH.relative_to(ROOT)}; "
                        "none with --quick)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else FULL_REPEATS
    if args.results is None and not args.quick:
        args.results = RESULTS_PATH
    return args


# --- environment for runs -------------------------------------------------------------------


@contextlib.contextmanager
def parallax_home(prefix: str = "parallax-bench-") -> Iterator[Path]:
    """A fresh PARALLAX_HOME for this process and its children, removed afterwards.

    Benchmark runs never touch the user's database, caches or checkpoints."""
    home = Path(tempfile.mkdtemp(prefix=prefix))
    saved = {key: os.environ.get(key) for key in ("PARALLAX_HOME", "PARALLAX_DB_URL")}
    os.environ["PARALLAX_HOME"] = str(home)
    os.environ.pop("PARALLAX_DB_URL", None)
    try:
        yield home
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(home, ignore_errors=True)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a benchmark subprocess: the project importable, output unbuffered,
    and no hub lookups (every model is built from scratch)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **extra}


@dataclass
class Timed:
    seconds: float
    stdout: str
    stderr: str


def run_timed(command: list[str], *, timeout: float = 600, env: dict[str, str] | None = None) -> Timed:
    """Run ``command`` to its end and return its wall-clock time; raise with its output if it fails."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env or child_env(), capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return Timed(seconds, done.stdout, done.stderr)


def engine_command(*args: str, db_url: str | None = None) -> list[str]:
    """``python -m trainer_backend [--db URL] ARGS``."""
    db = ["--db", db_url] if db_url else []
    return [PYTHON, "-m", "trainer_backend", *db, *args]


def run_id_from(output: str) -> int:
    """The N of the last ``run_id=N ...`` line the CLI printed."""
    for line in reversed(output.splitlines()):
        if line.startswith("run_id="):
            return int(line.split()[0].split("=", 1)[1])
    raise RuntimeError(f"no run_id line in:\n{output[-2000:]}")


def export_run(run_id: int, db_url: str | None = None) -> dict[str, Any]:
    """What ``python -m trainer_backend export N`` prints, parsed."""
    done = run_timed(engine_command("export", str(run_id), db_url=db_url))
    return json.loads(done.stdout)


def engine_accepts(flag: str, command: str = "run") -> bool:
    """True when ``python -m trainer_backend COMMAND --help`` lists ``flag``."""
    done = subprocess.run(engine_command(command, "--help"), cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    return flag in done.stdout


def digits_workload(quick: bool, epochs: int = 3) -> dict[str, Any]:
    """The training work the engine benchmarks share: resnet18 on digits at 32x32, batch 128.

    Quick: one epoch of timm's tiny test_resnet at 16x16, enough to show that the script runs."""
    if quick:
        return {"dataset": "digits", "model": "test_resnet", "epochs": 1, "batch_size": 128, "image_size": 16}
    return {"dataset": "digits", "model": "resnet18", "epochs": epochs, "batch_size": 128, "image_size": 32}


def run_engine(settings: dict[str, Any], db_url: str, *extra: str, strategy: str = "single",
               devices: str = "cpu") -> dict[str, Any]:
    """One foreground ``trainer_backend run``: its wall time, run id and the epochs it recorded."""
    from db import make_engine, store

    done = run_timed(engine_command(
        "run", "--dataset", settings["dataset"], "--model", settings["model"], "--strategy", strategy,
        "--devices", devices, "--epochs", str(settings["epochs"]), "--batch-size", str(settings["batch_size"]),
        "--image-size", str(settings["image_size"]), "--quiet", *extra, db_url=db_url))
    run_id = run_id_from(done.stdout)
    # What `python -m trainer_backend export N` prints, read in this process (saves a process start).
    exported = store.export_run(make_engine(db_url), run_id)
    if exported["status"] != "completed":
        raise RuntimeError(f"run {run_id} ended {exported['status']}: {exported['error']}")
    return {"wall_s": done.seconds, "run_id": run_id, "epochs": exported["epochs"], "export": exported}


def prime_dataset_cache(settings: dict[str, Any], quick: bool) -> None:
    """Decode the dataset into PARALLAX_HOME's cache before the timed runs, so that none of them
    pays the decode. Skipped with --quick: it imports torch here, and the digits decode in the
    first run is tenths of a second."""
    if not quick:
        from trainer_backend.datasets import prepare_data

        prepare_data(settings["dataset"], image_size=settings["image_size"])


def epoch_field(run: dict[str, Any], name: str, *, later: bool = True) -> float:
    """The median of one recorded epoch field over a run's epochs (after the first, by default)."""
    values = [e[name] for e in run["epochs"]]
    return statistics.median(later_epochs(values) if later else values)


def later_epochs(values: list[float]) -> list[float]:
    """Epochs after the first: the first carries one-off costs (allocator growth, oneDNN kernel
    selection, page faults) that every contender pays once."""
    return values[1:] if len(values) > 1 else values


# --- the dashboard and a browser --------------------------------------------------------------


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]


@contextlib.contextmanager
def dashboard_server(home: Path, *, timeout_s: float = 60) -> Iterator[tuple[subprocess.Popen, str, float]]:
    """``streamlit run app.py`` on a free port with PARALLAX_HOME ``home``: yields (process, URL,
    seconds from start until it answered its health check). Its whole process group ends after."""
    import socket
    import signal
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = home / f"streamlit-{port}.log"
    env = child_env(PARALLAX_HOME=str(home))
    env.pop("PARALLAX_DB_URL", None)
    started = time.perf_counter()
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [PYTHON, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
             "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false",
             "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if server.poll() is not None or time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"streamlit did not answer on {url}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield server, url, time.perf_counter() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=20)


def browser_missing() -> str | None:
    """Why a real browser cannot be driven here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


# --- repeats and statistics -----------------------------------------------------------------


def alternate(contenders: dict[str, Callable[[], Any]], repeats: int, *, label: str = "") -> dict[str, list[Any]]:
    """Run the contenders in turn, A B A B ..., ``repeats`` times each.

    Interleaving spreads slow drifts of the machine (another process waking up, thermal state,
    the page cache) over every contender instead of loading them onto whichever ran last."""
    results: dict[str, list[Any]] = {name: [] for name in contenders}
    for repeat in range(1, repeats + 1):
        for name, measure in contenders.items():
            started = time.perf_counter()
            results[name].append(measure())
            print(f"  {label}{name} #{repeat}: {time.perf_counter() - started:.1f} s", flush=True)
    return results


def summarize(values: list[float]) -> dict[str, Any]:
    values = [float(v) for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def pair_ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Ratio of each A/B pair from the same round (the pair shares the machine's state)."""
    return [a / b for a, b in zip(numerators, denominators)]


@dataclass(frozen=True)
class Target:
    op: str       # "<=" or ">="
    limit: float
    unit: str = ""

    def met(self, value: float) -> bool:
        return value <= self.limit if self.op == "<=" else value >= self.limit

    @property
    def text(self) -> str:
        return f"{'≤' if self.op == '<=' else '≥'} {format_number(self.limit)}{self.unit}"


def at_most(limit: float, unit: str = "") -> Target:
    return Target("<=", limit, unit)


def at_least(limit: float, unit: str = "") -> Target:
    return Target(">=", limit, unit)


def format_number(value: float | None) -> str:
    if value is None:
        return "—"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"


# --- machine state --------------------------------------------------------------------------


class CpuShare:
    """How busy the machine was with other people's work while a benchmark ran.

    /proc/stat gives the whole machine's busy time; getrusage gives this process's and its
    reaped children's. The difference is what everything else used. Processes we start but do
    not reap (a launched run's detached worker) are added with ``count_as_own``."""

    def __init__(self) -> None:
        self._start = self._read()
        self._extra_own_s = 0.0

    def count_as_own(self, cpu_seconds: float) -> None:
        """CPU time of processes this benchmark started but does not reap (a launched worker)."""
        self._extra_own_s += cpu_seconds

    @staticmethod
    def _read() -> tuple[float, float, float]:
        ticks = os.sysconf("SC_CLK_TCK")
        try:
            with open("/proc/stat") as stat:
                fields = [int(x) for x in stat.readline().split()[1:]]
            busy = (sum(fields) - fields[3] - fields[4]) / ticks  # all but idle and iowait
        except (OSError, ValueError, IndexError):
            busy = float("nan")
        own = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
                  for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return time.monotonic(), busy, own

    def others_cores(self) -> float:
        """Average number of cores other processes kept busy since this object was made."""
        now, busy, own = self._read()
        start, busy0, own0 = self._start
        elapsed = max(now - start, 1e-9)
        return max(0.0, ((busy - busy0) - (own - own0) - self._extra_own_s) / elapsed)


def process_tree_cpu_s(pid: int) -> float:
    """User and system CPU seconds used so far by ``pid`` and its live descendants (Linux)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    from trainer_backend.lifecycle import proc_stats

    ticks = os.sysconf("SC_CLK_TCK")
    for process, fields in proc_stats():
        parents[process] = int(fields[1])
        cpu[process] = (int(fields[11]) + int(fields[12])) / ticks
    tree, changed = {pid}, True
    while changed:
        grown = tree | {child for child, parent in parents.items() if parent in tree}
        changed, tree = grown != tree, grown
    return sum(cpu.get(p, 0.0) for p in tree)


def machine_info() -> dict[str, Any]:
    import torch

    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu_model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }


# --- the report -----------------------------------------------------------------------------


@dataclass
class Report:
    """One benchmark's figures: rows for the summary table, details and notes for its section."""

    key: str
    title: str
    method: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    _load_start: tuple[float, ...] = field(default_factory=os.getloadavg)
    cpu: CpuShare = field(default_factory=CpuShare)
    _started: float = field(default_factory=time.perf_counter)

    def add(self, metric: str, values: list[float], *, unit: str = "", target: Target | None = None,
            headline: bool = True) -> dict[str, Any]:
        """A measured figure: ``values`` are the repeats; the median is checked against ``target``.

        ``headline`` rows go into the summary table; the others only into the benchmark's section."""
        row = {"metric": metric, "unit": unit, **summarize(values), "headline": headline}
        if target is not None:
            row["target"] = target.text
            row["met"] = target.met(row["median"])
        self.rows.append(row)
        return row

    def ratio(self, metric: str, numerators: list[float], denominators: list[float], *,
              target: Target | None = None, headline: bool = True) -> dict[str, Any]:
        """A/B pairs quoted as a ratio: the median of the per-pair ratios, their min–max."""
        return self.add(metric, pair_ratios(numerators, denominators), unit="×", target=target, headline=headline)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def skip(self, reason: str) -> None:
        self.skipped = reason

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "method": self.method,
            "skipped": self.skipped,
            "rows": self.rows,
            "details": self.details,
            "notes": self.notes,
            "settings": self.settings,
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_s": time.perf_counter() - self._started,
            "load_avg_start": list(self._load_start),
            "load_avg_end": list(os.getloadavg()),
            "other_processes_cores": self.cpu.others_cores(),
        }

    def finish(self, args: argparse.Namespace) -> dict[str, Any]:
        """Print the figures, and merge them into ``args.results`` when one is given."""
        data = self.as_dict()
        print(render_console(self.key, data), flush=True)
        if args.results is not None:
            merge_results(args.results, self.key, data, quick=args.quick)
            print(f"wrote {args.results}", flush=True)
        return data


def render_console(key: str, data: dict[str, Any]) -> str:
    lines = [f"== {data['title']} ({key})"]
    if data["skipped"]:
        lines.append(f"   skipped: {data['skipped']}")
        return "\n".join(lines)
    for row in data["rows"]:
        verdict = "" if "met" not in row else f"   target {row['target']}: {'MET' if row['met'] else 'MISSED'}"
        lines.append(f"   {row['metric']}: {format_number(row['median'])}{row['unit']} "
                     f"(min {format_number(row['min'])}, max {format_number(row['max'])}, n={row['n']}){verdict}")
    for note in data["notes"]:
        lines.append(f"   note: {note}")
    lines.append(f"   load average at start {data['load_avg_start'][0]:.2f}; other processes used "
                 f"{data['other_processes_cores']:.2f} cores on average")
    return "\n".join(lines)


def read_results(path: Path) -> dict[str, Any]:
    if path.exists():
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(path.read_text())
    return {}


def merge_results(path: Path, key: str, data: dict[str, Any], *, quick: bool = False) -> None:
    """Replace benchmark ``key`` in the results file, keeping the others."""
    results = read_results(path)
    results.setdefault("benchmarks", {})[key] = {**data, "quick": quick}
    results["machine"] = machine_info()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    temporary.replace(path)


# --- markdown -------------------------------------------------------------------------------


def _figure(row: dict[str, Any]) -> tuple[str, str]:
    unit = row["unit"]
    median = f"{format_number(row['median'])}{unit}"
    spread = f"{format_number(row['min'])}–{format_number(row['max'])}{unit}" if row["n"] > 1 else "—"
    return median, spread


def _verdict(row: dict[str, Any]) -> str:
    if "met" not in row:
        return "—"
    return "met" if row["met"] else "**missed**"


def _is_quiet(data: dict[str, Any]) -> bool:
    return data.get("other_processes_cores", 0.0) < 0.25


def _machine_text(data: dict[str, Any]) -> str:
    others = data.get("other_processes_cores", 0.0)
    return f"{others:.2f} cores" + ("" if _is_quiet(data) else " (**busy**)")


def _quiet_text(data: dict[str, Any]) -> str:
    load = data["load_avg_start"][0]
    others = data.get("other_processes_cores", 0.0)
    quiet = _is_quiet(data)
    return (f"load average {load:.2f} at the start; other processes used {others:.2f} of the cores on "
            f"average{' (quiet machine)' if quiet else ' (**busy machine: figures are noisy**)'}")


def render_markdown(results: dict[str, Any], order: list[str], preamble: str) -> str:
    """docs/BENCHMARKS.md: the summary table, then one section per benchmark."""
    benchmarks = results.get("benchmarks", {})
    machine = results.get("machine", {})
    out = [preamble.rstrip(), ""]
    if machine:
        out += [f"Measured on {machine.get('cores')} cores ({machine.get('cpu') or 'unknown CPU'}), "
                f"Python {machine.get('python')}, torch {machine.get('torch')}, "
                f"{results.get('suite_wall_s', 0) / 60:.1f} minutes for the whole suite.", ""]
    out += ["The last column says how many cores other processes kept busy, on average, while the benchmark "
            "ran: above 0.25 the machine was busy and the figures are noisy.", "",
            "| # | benchmark | measure | median | min–max | n | target | | other processes |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for number, key in enumerate(order, start=1):
        data = benchmarks.get(key)
        if data is None:
            out.append(f"| {number} | {key} | not run yet | | | | | | |")
            continue
        if data["skipped"]:
            out.append(f"| {number} | {data['title']} | skipped: {data['skipped']} | | | | | | |")
            continue
        for row in (r for r in data["rows"] if r.get("headline", True)):
            median, spread = _figure(row)
            out.append(f"| {number} | {data['title']} | {row['metric']} | {median} | {spread} | {row['n']} | "
                       f"{row.get('target', '—')} | {_verdict(row)} | {_machine_text(data)} |")
    out.append("")
    for number, key in enumerate(order, start=1):
        data = benchmarks.get(key)
        if data is None:
            continue
        out += [f"## {number}. {data['title']}", ""]
        if data.get("quick"):
            out += ["*Quick settings (--quick): these figures only show that the script runs.*", ""]
        if data["method"]:
            out += [data["method"].strip(), ""]
        if data["skipped"]:
            out += [f"Skipped: {data['skipped']}", ""]
            continue
        out += ["| measure | median | min–max | n | target | |", "| --- | --- | --- | --- | --- | --- |"]
        for row in data["rows"]:
            median, spread = _figure(row)
            out.append(f"| {row['metric']} | {median} | {spread} | {row['n']} | {row.get('target', '—')} | "
                       f"{_verdict(row)} |")
        out.append("")
        for note in data["notes"]:
            out += [f"- {note}"]
        if data["notes"]:
            out.append("")
        if data["settings"]:
            settings = ", ".join(f"{k} {v}" for k, v in data["settings"].items())
            out += [f"Settings: {settings}. Measured {data['measured_at']} in {data['wall_s']:.0f} s; "
                    f"{_quiet_text(data)}.", ""]
    return "\n".join(out).rstrip() + "\n"
