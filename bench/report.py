"""A benchmark's report: rows of measured values against targets, printed, merged into
results.json, and rendered into docs/BENCHMARKS.md.

    report = Report("overhead", "Parallax overhead", method="...")
    report.ratio("whole process, Parallax / plain", times["parallax"], times["plain"], target=at_most(1.10))
    report.finish(args)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.machine import CpuShare, machine_info
from bench.stats import Target, format_number, pair_ratios, summarize


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
    temporary.write_text(json.dumps(results, indent=2, sort_keys=False, ensure_ascii=False) + "\n", encoding="utf-8")
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
