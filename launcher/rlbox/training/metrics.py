"""verl's per-step metrics, read back from a job log: parse, tabulate, export, plot, explain.

verl's console logger (verl/utils/logger/aggregate_logger.py, ``concat_dict_to_str``) prints one
line per step: ``step:N`` then every numeric metric as ``key:pprint.pformat(value)``, joined by
`` - ``. Under Ray the line comes from the TaskRunner actor, so the job log holds it as
``ESC[36m(TaskRunner pid=123, ip=10.0.0.2)ESC[0m step:1 - actor/entropy:0.31 - ...``; values may
be numpy scalars, which pformat writes ``np.float64(0.31)`` under numpy 2; Ray's log
deduplication may append `` [repeated 2x across cluster]``; a log copied from a terminal or a
document may be wrapped, either at the `` - `` separators (seed 000 §2.4) or at a fixed column.
All of that is undone here. A step seen twice (a repeated line, a resumed run) keeps the last
value of each key.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path


from rlbox.core.config import load_yaml, read_text
from rlbox.core.errors import RlboxError, nearest
from rlbox.core.paths import RESOURCES

# The curves people watch (seed 000 §2.4, seed 001 §4.6, seed 002, seed 003).
WATCHED = ("critic/rewards/mean", "response_length/mean", "perf/throughput", "timing_s/step")
GLOSSARY = RESOURCES / "metrics.yaml"
PLOT_SIZE = (12.0, 8.0)  # inches
PLOT_DPI = 100

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# Ray's worker-log prefix (ray/_private/worker.py print_worker_logs): "(Name pid=123)",
# "(pid=123, ip=10.0.0.2)", "(raylet)", "(autoscaler +1s)"; nested ones come from a Ray actor
# that itself prints a subprocess's prefixed lines.
_RAY_PREFIX = re.compile(r"^\s*\((?:[^()\s]+ )?(?:pid=\d+|raylet|gcs_server|autoscaler[^)]*)(?:, ip=[^)\s]+)?\)\s?")
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
_STEP = re.compile(r"(?:^|\s)step:([0-9]{1,18})(?=\s+-\s|\s*-?\s*$)")  # a step past 10**18 is no step
_SEP = re.compile(r"\s+-\s+")
_TRAILING_SEP = re.compile(r"\s+-\s*$")
_KEY = re.compile(r"^[A-Za-z_][\w./@\-]*$")
_NP = re.compile(r"^(?:np|numpy)\.\w+\((.*)\)$")
_INT = re.compile(r"^[+-]?\d+$")
_VALUE_PREFIX = re.compile(r"^(?:[+-]?(?:\d[\d.]*(?:[eE][+-]?\d*)?|\.\d*)?|np(?:\.\w*(?:\([\w.+\-]*)?)?)$")
_ELLIPSIS = {"…", "……", "...", "……", "⋯"}
_LINES = re.compile(r"\r\n|\r|\n")
MAX_LINE = 4 * 1024 * 1024  # characters of one log line read (a step line of 70,000 keys is ~2.5 MB)
MAX_BODY = 16 * 1024 * 1024  # characters of one step line glued from wrapped lines
MAX_VALUE = 64  # characters of one value read: a longer one (30 million digits) is skipped, and said so


def clean(line: str) -> str:
    """One log line as verl printed it: no colour codes, no Ray prefixes, no dedup suffix."""
    line = _ANSI.sub("", line)
    while True:
        stripped = _RAY_PREFIX.sub("", line, count=1)
        if stripped == line:
            break
        line = stripped
    return _REPEATED.sub("", line)


def value(text: str) -> float | int | None:
    """A value as pprint.pformat wrote it: 3, 0.25, 1e-06, nan, True, np.float64(0.25); None for
    anything else, and for a value over MAX_VALUE characters (no number verl logs is that long)."""
    text = text.strip()
    if len(text) > MAX_VALUE:
        return None
    m = _NP.match(text)
    if m:
        text = m.group(1).strip()
    if text in ("True", "False"):
        return int(text == "True")
    if _INT.match(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return None


def _pair(segment: str) -> tuple[str, float | int] | None:
    key, sep, raw = segment.strip().partition(":")
    if not sep or not _KEY.match(key):
        return None
    v = value(_TRAILING_SEP.sub("", raw))
    return None if v is None else (key, v)


def _pairs(body: str, too_long: list[str] | None = None) -> dict[str, float | int]:
    out = {}
    for segment in _SEP.split(body.strip().strip("-").strip()):
        p = _pair(segment)
        if p:
            out[p[0]] = p[1]
        elif too_long is not None and len(segment.strip()) > MAX_VALUE:
            key, sep, raw = segment.strip().partition(":")
            if sep and _KEY.match(key) and len(_TRAILING_SEP.sub("", raw).strip()) > MAX_VALUE:
                too_long.append(key[:80])
    return out


def _segments(text: str) -> list[str]:
    segs = _SEP.split(text.strip())
    segs[-1] = _TRAILING_SEP.sub("", segs[-1])
    return segs


def _partial(segment: str) -> bool:
    """A pair cut short: a key, or a key and the start of a value."""
    key, sep, raw = segment.partition(":")
    if not _KEY.match(key):
        return False
    return not sep or bool(_VALUE_PREFIX.match(raw)) or any(w.startswith(raw) for w in ("nan", "inf", "True", "False"))


def _continues(segments: list[str]) -> bool:
    """Segments that continue a step line: whole pairs, the last possibly cut short."""
    return all(_pair(s) for s in segments[:-1]) and bool(_pair(segments[-1]) or _partial(segments[-1]))


def _last_segment(tail: str) -> str:
    """``_SEP.split(tail)[-1]`` without splitting the whole line: a step line glued from many
    wrapped lines is not re-split at every line (that was quadratic)."""
    end = len(tail)
    while True:
        j = tail.rfind("-", 0, end)
        if j <= 0:
            return tail
        if j + 1 < len(tail) and tail[j - 1].isspace() and tail[j + 1].isspace():
            return tail[j + 1:].lstrip()
        end = j


def _join(body: str, nxt: str) -> str | None:
    """``body`` (a step line so far) with the next line appended if that line continues it."""
    if not nxt.strip() or _STEP.search(nxt):
        return None
    tail = body.rstrip()
    head = nxt.strip()
    if head in _ELLIPSIS:  # seed 000 elides keys with a line of "……"
        return body if tail.endswith(" -") else None
    if head == "-":  # cut between a separator's dash and its space
        return tail + " -"
    if tail.endswith(" -") and _continues(_segments(head)):  # wrapped after a separator
        return f"{tail} {head}"
    if head.startswith("- ") and _continues(_segments(head[2:])):  # wrapped before one
        return f"{tail} {head}"
    # Cut at a fixed column inside a key or a value: glue when that makes the pair whole.
    if body != tail or nxt != nxt.lstrip():
        return None
    last = _last_segment(tail)
    segs = _segments(nxt)
    if not last or any(c.isspace() for c in last + segs[0]):
        return None
    if (_pair(last) is None or ":" not in segs[0]) and _continues([last + segs[0], *segs[1:]]):
        return tail + nxt
    return None


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
    lines = [line[:MAX_LINE] for line in _LINES.split(text)]
    i = 0
    while i < len(lines):
        line = clean(lines[i])
        i += 1
        m = _STEP.search(line)
        if not m:
            continue
        body = line[m.end():]
        while i < len(lines) and len(body) < MAX_BODY:
            joined = _join(body, clean(lines[i]))
            if joined is None:
                break
            body = joined
            i += 1
        too_long: list[str] = []
        out.add(int(m.group(1)), _pairs(body, too_long))
        out.skipped += [(int(m.group(1)), key) for key in too_long]
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


# -- glossary ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    keys: tuple[str, ...]
    text: str
    watch: str = ""
    note: str = ""


def glossary() -> tuple[str, dict[str, Entry]]:
    """The shipped glossary: its source and key -> entry."""
    data = load_yaml(read_text(GLOSSARY), str(GLOSSARY))
    entries = {}
    for item in data["metrics"]:
        entry = Entry(tuple(item["keys"]), item["text"], item.get("watch", ""), item.get("note", ""))
        for k in entry.keys:
            entries[k] = entry
    return data["source"], entries


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
