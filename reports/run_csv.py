"""One run as CSV files for spreadsheets: what ``export N`` prints as JSON, in three tables.

    python -m trainer_backend export 7 --csv out/    # out/epochs.csv, steps.csv, system.csv, figures.csv

- ``epochs.csv``: a row per epoch; peak memory per device and the per-epoch extras get a column each
  (``peak_memory_mb[cuda:0]``, ``energy_j[gpu0]``), nested extras are JSON text.
- ``steps.csv``: a row per step point.
- ``system.csv``: a row per sample, wide: the machine sampled (``host``; a run across machines has a
  row per machine and moment), then a column per process and GPU figure (``rank0_cpu_pct``,
  ``gpu1_power_w``: GPU 1 of that row's machine). A spreadsheet charts a column against ``t_s`` with two clicks; a long table (a
  row per device) would need a pivot first, and a run's processes and GPUs do not change while it runs.

- ``figures.csv``: one row, the run's summary as every page shows it (``db.run_figures``): throughput over
  the epochs after the first, training time, the epochs' time, best validation accuracy.

Every file starts with ``run_id``, so the files of several runs can be pasted into one sheet. Text
cells go through ``reports.spreadsheet``'s formula guard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from db.series import GPU_FIELDS, PROCESS_FIELDS, STEP_FIELDS
from db.store import EPOCH_FLOAT_FIELDS
from contract.storage import check_export_dir, write_export

from .spreadsheet import frame_for_csv

CSV_FILES = ("epochs.csv", "steps.csv", "system.csv", "figures.csv")


def epochs_table(exported: dict[str, Any]) -> pd.DataFrame:
    """A row per epoch: the recorded figures, energy per image, then a column per device and extra."""
    rows = []
    for epoch in exported["epochs"]:
        row: dict[str, Any] = {"run_id": exported["run_id"], "epoch": epoch["epoch"]}
        row.update({name: epoch.get(name) for name in EPOCH_FLOAT_FIELDS})
        row["energy_j_per_image"] = epoch.get("energy_j_per_image")
        for device, mb in sorted((epoch.get("peak_memory_mb") or {}).items()):
            row[f"peak_memory_mb[{device}]"] = mb
        for name, value in (epoch.get("extra") or {}).items():
            if name == "energy_j_per_image":
                continue  # already its own column
            if isinstance(value, dict) and all(_scalar(v) for v in value.values()):
                row.update({f"{name}[{key}]": v for key, v in value.items()})
            else:
                row[name] = value if _scalar(value) else json.dumps(value, sort_keys=True)
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["run_id", "epoch", *EPOCH_FLOAT_FIELDS,
                                                         "energy_j_per_image"])


def steps_table(exported: dict[str, Any]) -> pd.DataFrame:
    """A row per step point."""
    return pd.DataFrame([{"run_id": exported["run_id"], **step} for step in exported["steps"]],
                        columns=["run_id", *STEP_FIELDS])


def system_table(exported: dict[str, Any]) -> pd.DataFrame:
    """A row per sample: the host, then each rank's and each GPU's figures in columns of their own."""
    rows = []
    for sample in exported["system"]:
        row = {"run_id": exported["run_id"], "t_s": sample["t_s"], "host": sample["host"], "node": sample["node"],
               "host_cpu_pct": sample["host_cpu_pct"], "host_memory_mb": sample["host_memory_mb"]}
        for process in sample["processes"]:
            row.update({f"rank{process['rank']}_{name}": process.get(name) for name in PROCESS_FIELDS[1:]})
        for gpu in sample["gpus"]:
            row.update({f"gpu{gpu['index']}_{name}": gpu.get(name) for name in GPU_FIELDS[1:]})
        rows.append(row)
    fixed = ["run_id", "t_s", "host", "node", "host_cpu_pct", "host_memory_mb"]
    table = pd.DataFrame(rows, columns=None if rows else fixed)
    # rank10 after rank9, and every rank before every GPU, whatever order the samples listed them in
    return table[fixed + sorted(set(table.columns) - set(fixed), key=_device_order)]


def figures_table(exported: dict[str, Any]) -> pd.DataFrame:
    """One row: the export's ``figures`` (the epochs the throughput is the mean of as "2 3")."""
    figures = dict(exported["figures"])
    figures["images_per_s_epochs"] = " ".join(map(str, figures["images_per_s_epochs"]))
    return pd.DataFrame([{"run_id": exported["run_id"], **figures}])


def write_run_csv(exported: dict[str, Any], directory: Path) -> list[Path]:
    """Write ``CSV_FILES`` for the exported run into ``directory`` (made if missing); returns the paths."""
    check_export_dir(directory, "--csv")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write into --csv {directory}: {exc.strerror or exc}") from None
    written = []
    for name, table in zip(CSV_FILES, (epochs_table(exported), steps_table(exported), system_table(exported),
                                           figures_table(exported))):
        path = directory / name
        # whole or not at all: a full disk is one line naming the file, never half a CSV
        write_export(path, frame_for_csv(table).to_csv(index=False).encode(), "CSV file")
        written.append(path)
    if exported.get("script_metrics"):  # a script run (import parallax): every value it logged
        path = directory / "metrics.csv"
        table = pd.DataFrame(exported["script_metrics"], columns=["name", "step", "t_s", "value"])
        write_export(path, table.to_csv(index=False).encode(), "CSV file")
        written.append(path)
    return written


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _device_order(column: str) -> tuple:
    """rank0_cpu_pct < rank0_rss_mb < rank1_… < gpu0_util_pct < gpu0_memory_used_mb < …"""
    kind, fields = ("rank", PROCESS_FIELDS) if column.startswith("rank") else ("gpu", GPU_FIELDS)
    number, _, name = column[len(kind):].partition("_")
    return (kind == "gpu", int(number) if number.isdigit() else 0,
            fields.index(name) if name in fields else len(fields), column)
