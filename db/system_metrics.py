"""System samples stored per metric: each figure a sample holds (the host's CPU and memory, each rank's CPU and
resident memory, each GPU's utilisation, memory, power, temperature and SM clock) is a series of its own
(``system_series``: run, machine, device, metric), its values packed by block of ``BLOCK_S`` seconds
(``system_chunks``) with each block's count, minimum, maximum, sum and last value.

A chart of one metric reads that metric's series alone, and of a long run only the blocks' summaries (in
their index): 8 ranks' and GPUs' day of one-second samples is 1,440 summaries per series, never 86,400 JSON
documents parsed. A sampler's batch of a few seconds joins its block's chunk (the chunk is rewritten whole,
a few hundred bytes), so a block holds one chunk whatever the flush interval.

    add_samples(engine, run_id, [{"t_s": 1.0, "node": 0, "host_cpu_pct": 97.0, "host_memory_mb": 2210.0,
                                  "processes": [{"rank": 0, "cpu_pct": 99.0, "rss_mb": 812.0}],
                                  "gpus": [{"index": 0, "util_pct": 98, "memory_used_mb": 20311, ...}]}])
    read_metric(engine, [run_id], [("process", "cpu_pct"), ("host", "cpu_pct")], max_points=600)
    read_samples(engine, [run_id])        # every sample whole again (export)
    metric_totals(engine, [run_id], [("gpu", "util_pct")])   # sums and counts, for a mean over the run
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, and_, bindparam, case, func, insert, select, tuple_, update
from sqlalchemy.orm import aliased

from db.connection import lock_wait_at_most
from db.point_chunks import reduce_runs
from db.tables import Run, SystemChunk, SystemSeries

# Seconds per block: at one sample a second a block holds 60 values and a day 1,440 blocks per series. A chart
# of about a thousand buckets reads summaries alone once its run spans a quarter of that many blocks (2.5 hours).
BLOCK_S = 60
FLOAT_TYPE = np.dtype("<f8")
# What a sample holds: (kind, its field in the sample, the metric stored).
HOST_METRICS = (("cpu_pct", "host_cpu_pct"), ("memory_mb", "host_memory_mb"))
PROCESS_METRICS = ("cpu_pct", "rss_mb")
GPU_METRICS = ("util_pct", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz")
SAMPLE_FIELDS: tuple[str, ...] = ("t_s", "node", "host_cpu_pct", "host_memory_mb", "processes", "gpus")
PROCESS_FIELDS: tuple[str, ...] = ("rank", *PROCESS_METRICS)
GPU_FIELDS: tuple[str, ...] = ("index", *GPU_METRICS)
DEFAULT_MAX_POINTS = 600
SERIES_PER_QUERY = 500  # series looked up in one statement (SQLite takes up to 32,766 parameters)
ROW_FIELDS = ("run_id", "node", "kind", "device", "metric", "bucket", "t_s", "value", "min", "max", "n", "nonfinite")

Key = tuple[int, str, int, str]  # (node, kind, device, metric)


def split_samples(rows: Iterable[Mapping[str, Any]]) -> dict[Key, tuple[list[float], list[float]]]:
    """Samples (``SAMPLE_FIELDS``) as each series' (seconds, values). A host figure that is None is not the
    sample's (a rank other than a machine's first samples no host); a rank's or GPU's None is a figure not
    measured (NaN). An unknown field is refused, naming it: a misspelt one would vanish from every chart."""
    columns: dict[Key, tuple[list[float], list[float]]] = {}

    def add(key: Key, t_s: float, value: Any) -> None:
        column = columns.get(key)
        if column is None:
            column = columns[key] = ([], [])
        column[0].append(t_s)
        column[1].append(math.nan if value is None else float(value))

    for row in rows:
        _refuse_unknown(row, SAMPLE_FIELDS, "system sample")
        t_s, node = float(row["t_s"]), int(row.get("node") or 0)
        for metric, field in HOST_METRICS:
            if row.get(field) is not None:
                add((node, "host", 0, metric), t_s, row[field])
        for process in row.get("processes") or []:
            _refuse_unknown(process, PROCESS_FIELDS, "process")
            for metric in PROCESS_METRICS:
                add((node, "process", int(process["rank"]), metric), t_s, process.get(metric))
        for gpu in row.get("gpus") or []:
            _refuse_unknown(gpu, GPU_FIELDS, "gpu")
            for metric in GPU_METRICS:
                add((node, "gpu", int(gpu["index"]), metric), t_s, gpu.get(metric))
    return columns


def _refuse_unknown(row: Mapping[str, Any], names: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(row) - set(names))
    if unknown:
        raise ValueError(f"unknown {what} fields {unknown}; allowed: {', '.join(names)}")


def add_samples(engine: Engine, run_id: int, rows: Iterable[Mapping[str, Any]], *, lock_wait_s: float | None = None
                ) -> int:
    """Append samples to the run in one transaction, each figure to its series; returns how many values.
    LookupError for no such run."""
    columns = split_samples(rows)
    if not columns:
        return 0
    with engine.connect() as connection, lock_wait_at_most(connection, lock_wait_s):
        try:
            if connection.scalar(select(Run.id).where(Run.id == run_id)) is None:
                raise LookupError(f"no run with id {run_id}")
            added = add_columns_on(connection, run_id, columns)
            connection.commit()
        except BaseException:
            connection.rollback()
            raise
    return added


def add_columns_on(connection: Connection, run_id: int, columns: Mapping[Key, tuple[list[float], list[float]]]) -> int:
    """``add_samples`` of values already split by series, within the caller's transaction."""
    ids = _series_ids(connection, run_id, list(columns))
    parts: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (series id, block) -> new seconds, values
    for key, (t_s, values) in columns.items():
        t_array, value_array = np.asarray(t_s, dtype=FLOAT_TYPE), np.asarray(values, dtype=FLOAT_TYPE)
        blocks = np.floor(t_array / BLOCK_S).astype(np.int64)
        for block in np.unique(blocks).tolist():
            inside = blocks == block
            parts[ids[key], block] = (t_array[inside], value_array[inside])
    existing = _chunks_from(connection, sorted(set(ids.values())), min(block for _, block in parts))
    inserts, updates = [], []
    for (series_id, block), (t_array, value_array) in parts.items():
        old = existing.get((series_id, block))
        if old is not None:  # the block's chunk grows: rewritten whole, in time order
            t_array = np.concatenate((np.frombuffer(old.t_s, dtype=FLOAT_TYPE), t_array))
            value_array = np.concatenate((np.frombuffer(old.values, dtype=FLOAT_TYPE), value_array))
        chunk = pack(t_array, value_array)
        if old is None:
            inserts.append({"series_id": series_id, "block": block, **chunk})
        else:
            updates.append({"chunk_id": old.id, **chunk})
    if inserts:
        connection.execute(insert(SystemChunk.__table__), inserts)
    if updates:
        table = SystemChunk.__table__
        connection.execute(update(table).where(table.c.id == bindparam("chunk_id"))
                           .values({name: bindparam(name) for name in updates[0] if name != "chunk_id"}), updates)
    table = SystemSeries.__table__
    counts = [{"series": ids[key], "added": len(t_s), "low": min(t_s), "high": max(t_s)}
              for key, (t_s, _) in columns.items()]
    low, high = bindparam("low"), bindparam("high")
    connection.execute(
        update(table).where(table.c.id == bindparam("series")).values(
            points=table.c.points + bindparam("added"),
            first_t_s=case((table.c.first_t_s.is_(None) | (table.c.first_t_s > low), low), else_=table.c.first_t_s),
            last_t_s=case((table.c.last_t_s.is_(None) | (table.c.last_t_s < high), high), else_=table.c.last_t_s)),
        counts)
    return sum(len(t_s) for t_s, _ in columns.values())


def pack(t_s: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    """One block's values (any order) as a chunk: packed in time order (equal times in the order given), with
    its summary."""
    if len(t_s) > 1 and np.any(t_s[1:] < t_s[:-1]):
        order = np.argsort(t_s, kind="stable")
        t_s, values = t_s[order], values[order]
    finite = np.isfinite(values)
    kept = values[finite]
    last = float(values[-1])
    return {"first_t_s": float(t_s[0]), "last_t_s": float(t_s[-1]), "points": len(t_s), "finite": len(kept),
            "min_value": float(kept.min()) if len(kept) else None, "max_value": float(kept.max()) if len(kept) else None,
            "total_value": float(kept.sum()) if len(kept) else None, "last_value": last if math.isfinite(last) else None,
            "t_s": np.ascontiguousarray(t_s, dtype=FLOAT_TYPE).tobytes(),
            "values": np.ascontiguousarray(values, dtype=FLOAT_TYPE).tobytes()}


def _series_ids(connection: Connection, run_id: int, keys: list[Key]) -> dict[Key, int]:
    """{key: series id} of the run's ``keys``, the missing series made."""
    ids: dict[Key, int] = {}
    for attempt in range(2):
        missing = [key for key in keys if key not in ids]
        columns = (SystemSeries.node, SystemSeries.kind, SystemSeries.device, SystemSeries.metric)
        for start in range(0, len(missing), SERIES_PER_QUERY):
            part = missing[start:start + SERIES_PER_QUERY]
            ids.update({(node, kind, device, metric): series_id for series_id, node, kind, device, metric in
                        connection.execute(select(SystemSeries.id, *columns).where(
                            SystemSeries.run_id == run_id, tuple_(*columns).in_(part)))})
        missing = [key for key in keys if key not in ids]
        if not missing or attempt:
            break
        connection.execute(insert(SystemSeries.__table__), [
            {"run_id": run_id, "node": node, "kind": kind, "device": device, "metric": metric, "points": 0}
            for node, kind, device, metric in missing])
    return ids


def _chunks_from(connection: Connection, series_ids: list[int], first_block: int) -> dict[tuple[int, int], Any]:
    """The series' chunks of ``first_block`` and later, by (series id, block): the last written of a block."""
    found = {}
    for start in range(0, len(series_ids), SERIES_PER_QUERY):
        part = series_ids[start:start + SERIES_PER_QUERY]
        statement = (select(SystemChunk.id, SystemChunk.series_id, SystemChunk.block, SystemChunk.t_s,
                            SystemChunk.values)
                     .where(SystemChunk.series_id.in_(part), SystemChunk.block >= first_block).order_by(SystemChunk.id))
        found.update({(row.series_id, row.block): row for row in connection.execute(statement)})
    return found


# --- reads ---------------------------------------------------------------------------------


def read_metric(engine: Engine, run_ids: Iterable[int], metrics: Iterable[tuple[str, str]], *,
                max_points: int | None = DEFAULT_MAX_POINTS) -> list[dict[str, Any]]:
    """The runs' series of ``metrics`` ((kind, metric) pairs: ``("gpu", "util_pct")``), by run, series and time:
    ``ROW_FIELDS``. No other series is read.

    ``max_points=None``, or a run whose longest series holds no more than ``max_points`` values: every value
    (``n`` 1, ``bucket`` None). Otherwise each series of the run comes back in at most ``max_points`` buckets of
    equal time, the same buckets for every series of the run (``bucket``: its number from the run's first
    sample), each bucket's last value at its time (``t_s``, ``value``), its minimum and maximum over finite
    values, its count (``n``) and how many of those were not measured or not finite (``nonfinite``): a one-second
    spike is the band's top, never averaged away. Buckets of whole blocks are summed from the blocks' summaries
    in the database; a run spanning fewer blocks than a quarter of ``max_points`` is unpacked instead."""
    _check_max_points(max_points)
    wanted = list(dict.fromkeys((str(kind), str(metric)) for kind, metric in metrics))
    rows: list[dict[str, Any]] = []
    if not wanted:
        return rows
    with engine.connect() as connection:
        for run_id in dict.fromkeys(run_ids):
            rows += _read_run(connection, int(run_id), wanted, max_points)
    return rows


def _check_max_points(max_points: int | None) -> None:
    whole = isinstance(max_points, int) and not isinstance(max_points, bool)
    if max_points is not None and not (whole and max_points >= 2):
        raise ValueError(f"max_points must be a whole number of 2 or more, or None for every row; got {max_points!r}")


def _series_of(connection: Connection, run_id: int, wanted: list[tuple[str, str]] | None) -> list[Any]:
    statement = (select(SystemSeries.id, SystemSeries.node, SystemSeries.kind, SystemSeries.device,
                        SystemSeries.metric, SystemSeries.points, SystemSeries.first_t_s, SystemSeries.last_t_s)
                 .where(SystemSeries.run_id == run_id, SystemSeries.points > 0))
    if wanted is not None:
        statement = statement.where(tuple_(SystemSeries.kind, SystemSeries.metric).in_(wanted))
    return sorted(connection.execute(statement), key=lambda s: (s.node, s.kind, s.device, s.metric))


def _read_run(connection: Connection, run_id: int, wanted: list[tuple[str, str]], max_points: int | None
              ) -> list[dict[str, Any]]:
    series = _series_of(connection, run_id, wanted)
    if not series:
        return []
    heads = {s.id: {"run_id": run_id, "node": s.node, "kind": s.kind, "device": s.device, "metric": s.metric}
             for s in series}
    first = min(s.first_t_s for s in series)
    span = max(s.last_t_s for s in series) - first
    if max_points is None or max(s.points for s in series) <= max_points:
        return [{**heads[series_id], "bucket": None, "t_s": at, "value": _finite(value), "min": _finite(value),
                 "max": _finite(value), "n": 1, "nonfinite": int(not math.isfinite(value))}
                for series_id, (t_s, values) in _unpacked(connection, list(heads)).items()
                for at, value in zip(t_s.tolist(), values.tolist())]
    first_block = math.floor(first / BLOCK_S)
    blocks = math.floor((first + span) / BLOCK_S) - first_block + 1
    if blocks * 4 >= max_points:  # whole blocks per bucket: the database sums their summaries
        return _summed(connection, heads, first_block, -(-blocks // max_points))
    width_s = span / max_points if span > 0 else 1.0
    rows = []
    for series_id, (t_s, values) in _unpacked(connection, list(heads)).items():
        buckets = np.minimum(np.floor((t_s - first) / width_s), max_points - 1).astype(np.int64)
        for end, low, high, count, bad in reduce_runs(buckets, values):
            rows.append({**heads[series_id], "bucket": int(buckets[end]), "t_s": float(t_s[end]),
                         "value": _finite(float(values[end])), "min": low, "max": high, "n": count, "nonfinite": bad})
    return rows


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _unpacked(connection: Connection, series_ids: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each series' (seconds, values), in time order (chunks in the order written where times are equal)."""
    parts: dict[int, list[tuple[bytes, bytes]]] = {series_id: [] for series_id in series_ids}
    for start in range(0, len(series_ids), SERIES_PER_QUERY):
        statement = (select(SystemChunk.series_id, SystemChunk.t_s, SystemChunk.values)
                     .where(SystemChunk.series_id.in_(series_ids[start:start + SERIES_PER_QUERY]))
                     .order_by(SystemChunk.series_id, SystemChunk.block, SystemChunk.id))
        for series_id, t_s, values in connection.execute(statement):
            parts[series_id].append((t_s, values))
    found = {}
    for series_id, chunks in parts.items():
        t_s = np.concatenate([np.frombuffer(t, dtype=FLOAT_TYPE) for t, _ in chunks]) if chunks else np.empty(0)
        values = np.concatenate([np.frombuffer(v, dtype=FLOAT_TYPE) for _, v in chunks]) if chunks else np.empty(0)
        order = np.argsort(t_s, kind="stable")
        found[series_id] = (t_s[order], values[order])
    return found


def _summed(connection: Connection, heads: dict[int, dict[str, Any]], first_block: int, blocks_per_bucket: int
            ) -> list[dict[str, Any]]:
    """Buckets of ``blocks_per_bucket`` blocks from ``first_block``, from the chunks' summaries: the database
    reduces them, and each bucket's last value is read from its last chunk (one index seek)."""
    series_ids = list(heads)
    bucket = ((SystemChunk.block - first_block) // blocks_per_bucket).label("bucket")
    grouped = (select(SystemChunk.series_id, bucket, func.min(SystemChunk.min_value).label("low"),
                      func.max(SystemChunk.max_value).label("high"), func.sum(SystemChunk.points).label("n"),
                      func.sum(SystemChunk.finite).label("finite"), func.max(SystemChunk.block).label("last_block"),
                      func.max(SystemChunk.last_t_s).label("last_t_s"))
               .where(SystemChunk.series_id.in_(series_ids)).group_by(SystemChunk.series_id, bucket).subquery())
    last = aliased(SystemChunk)
    statement = (select(grouped, last.last_value)
                 .join(last, and_(last.series_id == grouped.c.series_id, last.block == grouped.c.last_block,
                                  last.last_t_s == grouped.c.last_t_s))
                 .order_by(grouped.c.series_id, grouped.c.bucket, last.id))
    buckets: dict[tuple[int, int], dict[str, Any]] = {}
    for row in connection.execute(statement):  # equal last times in two chunks: the later chunk's value
        buckets[row.series_id, row.bucket] = {
            **heads[row.series_id], "bucket": int(row.bucket), "t_s": row.last_t_s, "value": row.last_value,
            "min": row.low, "max": row.high, "n": int(row.n), "nonfinite": int(row.n - row.finite)}
    order = {series_id: index for index, series_id in enumerate(series_ids)}
    return [buckets[key] for key in sorted(buckets, key=lambda key: (order[key[0]], key[1]))]


def metric_totals(engine: Engine, run_ids: Iterable[int], metrics: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each series of ``metrics`` of the runs with its values' count, finite count and finite sum
    (``run_id``, ``node``, ``kind``, ``device``, ``metric``, ``points``, ``finite``, ``total``): a mean over a run of
    any length from the blocks' summaries, no value unpacked."""
    wanted = list(dict.fromkeys((str(kind), str(metric)) for kind, metric in metrics))
    run_ids = list(dict.fromkeys(run_ids))
    if not wanted or not run_ids:
        return []
    statement = (select(SystemSeries.run_id, SystemSeries.node, SystemSeries.kind, SystemSeries.device,
                        SystemSeries.metric, func.sum(SystemChunk.points).label("points"),
                        func.sum(SystemChunk.finite).label("finite"), func.sum(SystemChunk.total_value).label("total"))
                 .join(SystemChunk, SystemChunk.series_id == SystemSeries.id)
                 .where(SystemSeries.run_id.in_(run_ids), tuple_(SystemSeries.kind, SystemSeries.metric).in_(wanted))
                 .group_by(SystemSeries.id, SystemSeries.run_id, SystemSeries.node, SystemSeries.kind,
                           SystemSeries.device, SystemSeries.metric)
                 .order_by(SystemSeries.run_id, SystemSeries.node, SystemSeries.kind, SystemSeries.device))
    with engine.connect() as connection:
        return [{**row._asdict(), "points": int(row.points or 0), "finite": int(row.finite or 0),
                 "total": float(row.total or 0.0)} for row in connection.execute(statement)]


def read_samples(engine: Engine, run_ids: Iterable[int]) -> list[dict[str, Any]]:
    """Every sample of the runs whole again (``run_id`` and ``SAMPLE_FIELDS``), by run, time and machine: the
    host's figures (None where the sample had none), each rank (``PROCESS_FIELDS``) and GPU (``GPU_FIELDS``)
    sampled at that moment, by rank and index, a figure not measured as None. Reads every value: for an export,
    not a chart."""
    samples: list[dict[str, Any]] = []
    with engine.connect() as connection:
        for run_id in dict.fromkeys(run_ids):
            series = _series_of(connection, int(run_id), None)
            by_moment: dict[tuple[float, int], dict[str, Any]] = {}
            processes: dict[tuple[float, int], dict[int, dict[str, Any]]] = {}
            gpus: dict[tuple[float, int], dict[int, dict[str, Any]]] = {}
            unpacked = _unpacked(connection, [s.id for s in series])
            for s in series:
                t_s, values = unpacked[s.id]
                for at, value in zip(t_s.tolist(), values.tolist()):
                    moment = (at, s.node)
                    sample = by_moment.get(moment)
                    if sample is None:
                        sample = by_moment[moment] = {"run_id": int(run_id), "t_s": at, "node": s.node,
                                                      "host_cpu_pct": None, "host_memory_mb": None}
                    figure = _finite(value)
                    if s.kind == "host":
                        sample[dict(HOST_METRICS)[s.metric]] = figure
                    elif s.kind == "process":
                        processes.setdefault(moment, {}).setdefault(s.device, {"rank": s.device})[s.metric] = figure
                    else:
                        gpus.setdefault(moment, {}).setdefault(s.device, {"index": s.device})[s.metric] = figure
            for moment in sorted(by_moment):
                sample = by_moment[moment]
                sample["processes"] = [{name: entry.get(name) for name in PROCESS_FIELDS}
                                       for _, entry in sorted(processes.get(moment, {}).items())]
                sample["gpus"] = [{name: entry.get(name) for name in GPU_FIELDS}
                                  for _, entry in sorted(gpus.get(moment, {}).items())]
                samples.append(sample)
    return samples


def samples_stored(engine: Engine, run_ids: Iterable[int]) -> dict[int, int]:
    """How many values each run's sampler has stored (0 for none): it grows with every batch written, for a live
    page's tick (one row per series of the run read, never a value)."""
    run_ids = list(dict.fromkeys(int(run_id) for run_id in run_ids))
    found: dict[int, int] = {}
    if run_ids:
        statement = (select(SystemSeries.run_id, func.sum(SystemSeries.points)).where(SystemSeries.run_id.in_(run_ids))
                     .group_by(SystemSeries.run_id))
        with engine.connect() as connection:
            found = {run_id: int(total or 0) for run_id, total in connection.execute(statement)}
    return {run_id: found.get(run_id, 0) for run_id in run_ids}
