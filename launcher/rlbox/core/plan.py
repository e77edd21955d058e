"""The contract every plan keeps: a value, computed without touching a host, that says what
will happen. ``describe()`` is what ``--dry-run`` prints for a person; ``as_dict()`` is the same
plan as JSON-ready data (``--json``, run records). Executors carry a plan out; they decide nothing."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Plan(Protocol):
    def describe(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...
