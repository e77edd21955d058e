"""verl's per-step console line, read back from a job log.

verl's console logger (verl/utils/logger/aggregate_logger.py, ``concat_dict_to_str``) prints one
line per step: ``step:N`` then every numeric metric as ``key:pprint.pformat(value)``, joined by
`` - ``. Under Ray the line comes from the TaskRunner actor, so the job log holds it as
``ESC[36m(TaskRunner pid=123, ip=10.0.0.2)ESC[0m step:1 - actor/entropy:0.31 - ...``; values may
be numpy scalars, which pformat writes ``np.float64(0.31)`` under numpy 2; Ray's log
deduplication may append `` [repeated 2x across cluster]``; a log copied from a terminal or a
document may be wrapped, either at the `` - `` separators (seed 000 §2.4) or at a fixed column.
All of that is undone here: ``steps`` yields each step line's step and pairs. What is done with
them (a table, a plot, a trend) is training/metrics.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

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


def steps(text: str) -> Iterator[tuple[int, dict[str, float | int], list[str]]]:
    """Every step line of ``text``, in order: its step, its pairs, and the keys of values over
    MAX_VALUE characters (skipped as no number)."""
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
        pairs = _pairs(body, too_long)
        yield int(m.group(1)), pairs, too_long
