"""One shape for what every benchmark measured, and the one table ``bench/all.py`` prints.

A benchmark run with ``--results PATH`` writes there::

    {"benchmark": "send", "figures": [Figure.to_json(), ...], "raw": {...}}

``figures`` are the numbers the table shows, each with the target it is judged against
(from DESIGN.md section 7 or issue 24), ``raw`` whatever else the benchmark measured.
Nothing here imports the package: the table can be built and tested on its own.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: how a figure is compared with its target
OPS = {"<=": "≤", ">=": "≥", "==": "="}


@dataclass(frozen=True)
class Goal:
    """A target: ``value op bound``, and where the figure comes from."""

    op: str
    bound: float
    source: str = ""

    def met(self, value: float) -> bool:
        if self.op == "<=":
            return value <= self.bound
        if self.op == ">=":
            return value >= self.bound
        if self.op == "==":
            return value == self.bound
        raise ValueError(f"unknown comparison {self.op!r}")

    def text(self, unit: str) -> str:
        glue = "" if unit in ("×", "%") else " "
        shown = f"{OPS[self.op]} {fmt_value(self.bound)}" + (f"{glue}{unit}" if unit else "")
        return shown + (f" ({self.source})" if self.source else "")


@dataclass(frozen=True)
class Figure:
    """One measured number: ``value`` in ``unit``, judged against ``goal`` (if any)."""

    name: str
    value: float | None
    unit: str
    goal: Goal | None = None
    note: str = ""
    skipped: str = ""  # why it was not measured this time (then there is no value)

    @property
    def status(self) -> str:
        """pass, short (target missed), info (no target), skipped or missing (no value)."""
        if self.skipped:
            return "skipped"
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return "missing"
        if self.goal is None:
            return "info"
        return "pass" if self.goal.met(self.value) else "short"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "value": self.value, "unit": self.unit}
        if self.goal is not None:
            out["goal"] = {"op": self.goal.op, "bound": self.goal.bound, "source": self.goal.source}
        if self.note:
            out["note"] = self.note
        if self.skipped:
            out["skipped"] = self.skipped
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        g = data.get("goal")
        goal = Goal(g["op"], float(g["bound"]), g.get("source", "")) if g else None
        value = data.get("value")
        return cls(
            data["name"],
            None if value is None else float(value),
            data.get("unit", ""),
            goal,
            data.get("note", ""),
            data.get("skipped", ""),
        )


def write_results(
    path: str | Path | None, benchmark: str, figures: Iterable[Figure], raw: Any = None
) -> None:
    """Write a benchmark's figures (and its raw measurements) to ``path``, if given."""
    if not path:
        return
    data = {
        "benchmark": benchmark,
        "figures": [f.to_json() for f in figures],
        "raw": raw,
    }
    Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")


def read_results(path: Path) -> list[Figure]:
    data = json.loads(path.read_text())
    return [Figure.from_json(f) for f in data.get("figures", [])]


def fmt_value(v: float) -> str:
    """A number as a person reads it: thousands separated, few decimals."""
    if v != v:  # NaN
        return "-"
    a = abs(v)
    if a >= 1000 or float(v).is_integer():
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


# -- the machine --------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and load average of this machine."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram_gib = math.nan
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = int(line.split()[1]) / 1024 / 1024
                break
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return {"cores": os.cpu_count(), "ram_gib": ram_gib, "cpu_model": model, "loadavg": load}


def machine_line(m: dict[str, Any], load_after: str | None = None) -> str:
    ram = m.get("ram_gib", math.nan)
    line = (
        f"machine: {m.get('cores')} cores, {ram:.1f} GiB RAM, {m.get('cpu_model')}; "
        f"load average {m.get('loadavg')} at the start"
    )
    if load_after:
        line += f", {load_after} at the end"
    return line


# -- the table ----------------------------------------------------------------------------------

COLUMNS = ("benchmark", "figure", "value", "unit", "target", "result")


def rows(results: Sequence[tuple[str, Sequence[Figure]]]) -> list[tuple[str, ...]]:
    """The table's rows, one per figure, in the benchmarks' order."""
    out: list[tuple[str, ...]] = []
    for bench, figures in results:
        for f in figures:
            value = "-" if f.value is None else fmt_value(f.value)
            target = f.goal.text(f.unit) if f.goal is not None else ""
            why = f.skipped or f.note
            result = f"{f.status} ({why})" if why else f.status
            out.append((bench, f.name, value, f.unit, target, result))
    return out


def table(results: Sequence[tuple[str, Sequence[Figure]]]) -> str:
    """A Markdown table (readable as text, pasteable into bench/README.md)."""
    body = rows(results)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in
              enumerate(COLUMNS)]  # fmt: skip
    right = {2}  # values line up on the right

    def line(cells: Sequence[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if i in right else c.ljust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2)
                          for i, w in enumerate(widths)) + "|"  # fmt: skip
    return "\n".join([line(COLUMNS), rule, *(line(r) for r in body)])


def summary(results: Sequence[tuple[str, Sequence[Figure]]]) -> str:
    counts = {"pass": 0, "short": 0, "info": 0, "skipped": 0, "missing": 0}
    for _, figures in results:
        for f in figures:
            counts[f.status] += 1
    return (
        f"{counts['pass']} met, {counts['short']} short of target, "
        f"{counts['info']} without a target, {counts['skipped']} skipped, "
        f"{counts['missing']} missing"
    )
