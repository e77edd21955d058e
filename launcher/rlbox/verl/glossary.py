"""What the metrics verl prints every step mean: the seeds' glossary (``metrics.yaml`` next to this
module, package data), keyed by metric. ``rlbox metrics --explain`` (training/metrics.py) tells it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlbox.core.config import load_yaml, read_text

GLOSSARY = Path(__file__).resolve().parent / "metrics.yaml"


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
