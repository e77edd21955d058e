"""A job's per-step metrics, read back from its log: parse, tabulate, export, plot, explain.

How verl prints a step (and how Ray, a terminal or a document mangle the line) is
rlbox.verl.steplog's; what the keys mean is rlbox.verl.glossary's (the seeds' glossary). A step seen
twice (a repeated line, a resumed run) keeps the last value of each key.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rlbox.core.errors import RlboxError, nearest
from rlbox.verl import steplog
from rlbox.verl.glossary import Entry, glossary
from rlbox.verl.steplog import MAX_VALUE

# The curves people watch (seed 000 §2.4, seed 001 §4.6, seed 002, seed 003).
WATCHED = ("critic/rewards/mean", "response_length/mean", "perf/throughput", "timing_s/step")
PLOT_SIZE = (12.0, 8.0)  # inches
PLOT_DPI = 100


@dataclass
class Metrics:
    """Every step's metrics from one log, steps in order."""

    source: str
    rows: dict[int, dict[str, float | int]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # first-seen order
    lines: int = 0  # step lines read (a step seen twice counts twice)
    seen: set[str] = field(default_factory=set, repr=False)  # the keys again, for O(1) membership
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (step, key) of values over MAX_VALUE characters

    def skipped_note(self) -> str | None:
        """One line saying which values were left out, or None."""
        if not self.skipped:
            return None
        step, key = self.skipped[0]
        return (f"{len(self.skipped)} value(s) longer than {MAX_VALUE} characters skipped as no number "
                f"(first: {key} at step {step})")

    @property
    def steps(self) -> list[int]:
        return sorted(self.rows)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        steps = [s for s in self.steps if key in self.rows[s]]
        return steps, [float(self.rows[s][key]) for s in steps]

    def add(self, step: int, pairs: dict[str, float | int]) -> None:
        self.lines += 1
        for k in pairs:  # a set, not the list: a 70,000-key line stays linear
            if k not in self.seen:
                self.seen.add(k)
                self.keys.append(k)
        self.rows.setdefault(step, {}).update(pairs)

    def records(self, keys: list[str] | None = None) -> list[dict]:
        keys = keys or self.keys
        return [{"step": s, **{k: self.rows[s][k] for k in keys if k in self.rows[s]}} for s in self.steps]


def parse(text: str, source: str = "") -> Metrics:
    out = Metrics(source)
    for step, pairs, too_long in steplog.steps(text):
        out.add(step, pairs)
        out.skipped += [(step, key) for key in too_long]
    return out


def parse_file(path: Path) -> Metrics:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise RlboxError(f"{path}: cannot read ({err.strerror})") from None
    metrics = parse(text, str(path))
    if not metrics.rows:
        raise RlboxError(f"{path}: no verl step lines (`step:N - key:value - ...`); "
                         "the job prints them only with trainer.logger including 'console'")
    return metrics


def select(metrics: Metrics, keys: list[str]) -> list[str]:
    """``keys`` checked against the log; an unknown one is an error naming the nearest."""
    for k in keys:
        if k not in metrics.keys:
            near = nearest(k, metrics.keys, n=3, cutoff=0.5)
            hint = f"; nearest: {', '.join(near)}" if near else ""
            raise RlboxError(f"metric '{k}' is not in {metrics.source}{hint} ({len(metrics.keys)} keys logged)")
    return keys


# -- output ------------------------------------------------------------------------------------
def fmt(v: float | int | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.6g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"


def to_csv(metrics: Metrics, keys: list[str] | None = None) -> str:
    keys = keys or metrics.keys
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["step", *keys])
    for s in metrics.steps:
        row = metrics.rows[s]
        writer.writerow([s, *(repr(row[k]) if isinstance(row.get(k), float) else row.get(k, "") for k in keys)])
    return buf.getvalue()


def to_json(metrics: Metrics, keys: list[str] | None = None) -> str:
    def clean_nan(v):
        return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v

    records = [{k: clean_nan(v) for k, v in r.items()} for r in metrics.records(keys)]
    return json.dumps({"log": metrics.source, "steps": len(records), "keys": keys or metrics.keys,
                       "records": records}, indent=2)


def trend(metrics: Metrics, key: str = "critic/rewards/mean") -> str | None:
    """One line on whether ``key`` rises: mean of the first vs the last quarter of its steps."""
    steps, values = metrics.series(key)
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return None
    n = max(1, len(values) // 4)
    first, last = sum(values[:n]) / n, sum(values[-n:]) / n
    spread = (max(values) - min(values)) or 1.0
    word = "rising" if last - first > 0.05 * spread else "falling" if first - last > 0.05 * spread else "flat"
    return (f"{key}: {fmt(first)} (mean of the first {n} step(s)) -> {fmt(last)} (last {n}): {word}"
            + ("" if word == "rising" else "; it should trend upwards (seed 000 §2.4)"))


def plot(metrics: Metrics, path: Path, keys: list[str] | None = None, title: str | None = None) -> dict:
    """A PNG of ``keys`` (default: the watched curves), one panel each, against the step.
    Returns what was drawn (and the matplotlib figure, for whoever wants to look closer)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RlboxError("--plot needs matplotlib: pip install 'rlbox[plot]'") from None
    keys = list(keys or WATCHED)
    fig = Figure(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    FigureCanvasAgg(fig)
    cols = 1 if len(keys) == 1 else 2
    rows = math.ceil(len(keys) / cols)
    drawn = []
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        steps, values = metrics.series(key)
        if steps:
            ax.plot(steps, values, marker="o" if len(steps) <= 40 else None, markersize=3, linewidth=1.5)
        else:
            ax.text(0.5, 0.5, "not in this log", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(key + ("  (should rise)" if key == "critic/rewards/mean" else ""), fontsize=11)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        drawn.append({"key": key, "points": len(steps)})
    fig.suptitle(title or Path(metrics.source).name, fontsize=12)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as err:
        raise RlboxError(f"{path}: cannot write the plot ({err.strerror})") from None
    width, height = (round(x * PLOT_DPI) for x in PLOT_SIZE)
    return {"path": str(path), "width": width, "height": height, "panels": drawn, "figure": fig}


def explain(key: str | None) -> list[str]:
    """Lines explaining ``key`` (a metric, or a prefix such as ``critic/rewards``); every
    entry when ``key`` is empty. An unknown key is an error naming the nearest ones."""
    source, entries = glossary()

    def lines_for(entry: Entry) -> list[str]:
        out = [f"{', '.join(entry.keys)}: {entry.text}"]
        if entry.watch:
            out.append(f"    watch: {entry.watch}")
        if entry.note:
            out.append(f"    note: {entry.note}")
        return out

    if not key:
        seen, out = set(), []
        for entry in entries.values():
            if entry.keys not in seen:
                seen.add(entry.keys)
                out += lines_for(entry)
        return out + [f"({len(entries)} metrics; from {source})"]
    if key in entries:
        return lines_for(entries[key])
    group = [e for k, e in entries.items() if k.startswith(key.rstrip("/") + "/")]
    if group:
        out, seen = [], set()
        for entry in group:
            if entry.keys not in seen:
                seen.add(entry.keys)
                out += lines_for(entry)
        return out
    near = nearest(key, entries, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise RlboxError(f"unknown metric '{key}'{hint} (`rlbox metrics --explain` lists all)")
