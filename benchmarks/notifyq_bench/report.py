"""Figures, the results table, the JSON file and the plot."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from notifyq_bench.stats import median

#: The unit of figures that are ratios, shown as a multiplication sign before the number.
RATIO = "ratio"
TIMES = "\u00d7"


@dataclass(frozen=True)
class Target:
    """``value op target``: met when the median satisfies it."""

    op: Literal["<=", ">="]
    value: float

    def met(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return value <= self.value if self.op == "<=" else value >= self.value

    def text(self, unit: str) -> str:
        sign = "≤" if self.op == "<=" else "≥"
        return f"{sign} {fmt(self.value, unit)}"


@dataclass
class Figure:
    """One measured figure: a value per repeat, its target and the floor it compares to."""

    key: str
    scenario: str
    label: str
    unit: str
    values: list[float]
    target: Target | None = None
    floor: list[float] | None = None
    floor_label: str | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return median(self.values)

    @property
    def min(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def max(self) -> float:
        return max(self.values) if self.values else float("nan")

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.median)

    @property
    def floor_median(self) -> float | None:
        return median(self.floor) if self.floor else None

    @property
    def vs_floor(self) -> float | None:
        """This figure's median over the floor's: 1.0 is the floor itself."""
        floor = self.floor_median
        if floor is None or floor == 0 or math.isnan(floor):
            return None
        return self.median / floor

    def measured(self) -> str:
        if not self.values:
            return "n/a"
        text = fmt(self.median, self.unit)
        if len(self.values) > 1:
            low = fmt(self.min, self.unit, bare=True)
            high = fmt(self.max, self.unit, bare=True)
            text += f" [{low}\u2013{high}]"
        return text

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenario": self.scenario,
            "label": self.label,
            "unit": self.unit,
            "values": self.values,
            "median": _num(self.median),
            "min": _num(self.min),
            "max": _num(self.max),
            "target": None
            if self.target is None
            else {"op": self.target.op, "value": self.target.value},
            "met": self.met,
            "floor": self.floor,
            "floor_label": self.floor_label,
            "floor_median": _num(self.floor_median),
            "vs_floor": _num(self.vs_floor),
            "note": self.note,
        }


def _num(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


def fmt(value: float, unit: str, *, bare: bool = False) -> str:
    """A value with sensible precision for its unit; ``bare`` leaves the unit out."""
    if math.isnan(value):
        return "n/a"
    if unit == RATIO:
        text = f"{value:.2f}"
        return text if bare else f"{TIMES}{text}"
    if unit == "%":
        text = f"{value:.0f}"
    elif unit in ("ms", "MB"):
        text = f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.2f}"
    return text if bare else f"{text} {unit}"


def _times(ratio: float) -> str:
    """A ratio to the floor: two decimals, three under 0.1 (a peer can be a few hundredths)."""
    return f"{TIMES}{ratio:.3f}" if abs(ratio) < 0.1 else f"{TIMES}{ratio:.2f}"


COLUMNS = ("figure", "measured: median [min\u2013max]", "target", "floor (bare)", "vs floor", "met")


def rows(figures: list[Figure]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for f in figures:
        floor = f.floor_median
        vs = f.vs_floor
        met = {None: "—", True: "yes", False: "NO"}[f.met]
        out.append(
            (
                f.label,
                f.measured(),
                f.target.text(f.unit) if f.target else "—",
                fmt(floor, f.unit) if floor is not None else "—",
                _times(vs) if vs is not None else "—",
                met,
            )
        )
    return out


def text_table(figures: list[Figure]) -> str:
    table = [COLUMNS, *rows(figures)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = []
    for index, row in enumerate(table):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(figures: list[Figure]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(figures)]
    return "\n".join(lines)


@dataclass
class Results:
    """Everything one run produced."""

    meta: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def as_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "figures": [f.as_json() for f in self.figures],
            "scenarios": self.raw,
            "notes": self.notes,
            "table_markdown": markdown_table(self.figures),
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_json(), indent=2, default=str) + "\n")


def matplotlib_missing() -> str | None:
    """Why ``--plot`` cannot work here, or None."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        # Installed, notifyq-bench depends on it; run from a checkout, it may be missing.
        return "--plot needs matplotlib: pip install matplotlib (or pip install -e ./benchmarks)"
    return None


def plot(results: Results, path: Path) -> None:
    """Latency percentiles and throughput against worker concurrency, from the
    ``concurrency`` scenario's data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = results.raw.get("concurrency", {}).get("levels", [])
    if not sweep:
        raise ValueError("the concurrency scenario produced no data to plot")
    xs = [level["concurrency"] for level in sweep]

    def series(key: str) -> list[float]:
        return [median(level[key]) for level in sweep]

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, style in (
        ("p50_ms", "p50", "o-"),
        ("p95_ms", "p95", "s--"),
        ("p99_ms", "p99", "^:"),
    ):
        left.plot(xs, series(key), style, label=label)
    left.axhline(15, color="grey", linewidth=0.8, linestyle="--", label="p99 target (15 ms)")
    left.set_xscale("log")
    left.set_xticks(xs, [str(x) for x in xs])
    left.set_xlabel("worker concurrency (1 process)")
    left.set_ylabel("commit → handler start (ms)")
    left.set_title("pickup latency, 100 jobs submitted back to back")
    left.grid(True, alpha=0.3)
    left.legend()

    right.plot(xs, series("jobs_per_s"), "o-", label="notifyq, 1 worker process")
    bare_values = results.raw.get("throughput", {}).get("bare_jobs_per_s")
    if bare_values:
        right.axhline(
            median(bare_values), color="tab:green", linestyle="--", label="strict floor (1 x 50)"
        )
    right.axhline(10_000, color="grey", linewidth=0.8, linestyle="--", label="target (10,000/s)")
    right.set_xscale("log")
    right.set_xticks(xs, [str(x) for x in xs])
    right.set_xlabel("worker concurrency (1 process)")
    right.set_ylabel("jobs/s (no-op handler)")
    right.set_title("throughput, draining a full queue")
    right.grid(True, alpha=0.3)
    right.legend()

    meta = results.meta
    fig.suptitle(
        f"notifyq {meta.get('notifyq_version', '')} · PostgreSQL {meta.get('server_version', '')}"
        f" · {meta.get('cpus', '?')} CPUs · {meta.get('connection', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
