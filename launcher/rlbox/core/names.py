"""Names are names, paths stay inside: the one rule for every name taken from input that becomes
a path, a container, a Docker network or a Kubernetes object, and the one function that builds a
path from input and checks it stays under its root before anything is read or written.

Kinds of name (``check(value, what, kind)``):

run
    Runs, servers and anything else named on the command line that becomes a container
    (``rlbox-NAME-node0``), a network, a folder under the runs dir and a Kubernetes object:
    a DNS-1123 label (lower-case letters, digits, ``-``; starts and ends with a letter or
    digit), at most 41 characters so that every name built from it stays within 63.
dns
    A Kubernetes object name or label (DNS-1123 label, at most 63).
file
    A name that only becomes a file or folder (releases, variants, components, jobs): letters,
    digits, ``_ . -``, starting with a letter or digit (never ``.``, ``..`` or ``-x``), at most 128.
artifact
    A downloaded file's name (a wheel or sdist of a lock): as ``file``, and ``+`` for a local
    version (``torch-2.13.0+cpu-cp311-...whl``), at most 255.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from rlbox.core.errors import RlboxError

RULES = {
    "run": (re.compile(r"[a-z0-9](?:[a-z0-9-]{0,39}[a-z0-9])?"),
            "lower-case letters, digits and '-', starting and ending with a letter or digit, at most 41"),
    "dns": (re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"),
            "a Kubernetes name: lower-case letters, digits and '-', starting and ending with a letter or digit, "
            "at most 63"),
    "file": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"),
             "letters, digits, '_', '.' and '-', starting with a letter or digit, at most 128"),
    "artifact": (re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,254}"),
                 "letters, digits, '_', '.', '+' and '-', starting with a letter or digit, at most 255"),
}


def valid(value: object, kind: str = "run") -> bool:
    pattern, _ = RULES[kind]
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def check(value: object, what: str, kind: str = "run") -> str:
    """``value`` when it is a name of ``kind``; else RlboxError ``WHAT 'value': use ...``."""
    if valid(value, kind):
        return value  # type: ignore[return-value]
    shown = repr(value)[:80] if isinstance(value, str) else type(value).__name__
    raise RlboxError(f"{what} {shown}: not a name; use {RULES[kind][1]}")


def check_value(value: object, kind: str = "run") -> str:
    """``value`` when it is a name of ``kind``; else ValueError (for a schema's validator)."""
    if valid(value, kind):
        return value  # type: ignore[return-value]
    raise ValueError(f"{str(value)[:80]!r} is not a name: use {RULES[kind][1]}")


def inside(root: Path, *parts: str | Path, what: str = "path") -> Path:
    """``root / parts...`` resolved (symbolic links followed), refused unless it is ``root`` itself
    or below it: the one way a path is built from input (run names, variant keys, lock entries)."""
    base = Path(root).resolve()
    path = base.joinpath(*map(str, parts)).resolve()
    if path != base and base not in path.parents:
        shown = "/".join(map(str, parts))
        raise RlboxError(f"{what} {shown!r} leads outside {root}; give a name, not a path")
    return path


# The rule as field types of the schemas that read names back from files: RunName, FileName and
# ArtifactName, made on first use (PEP 562), so that checking a name (every CLI command's --name)
# does not import pydantic: `rlbox --help` stays light (tests/test_cli_lazy.py).
_TYPES = {"RunName": "run", "FileName": "file", "ArtifactName": "artifact"}


def __getattr__(attr: str):
    if attr not in _TYPES:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    from pydantic import AfterValidator

    kind = _TYPES[attr]
    made = Annotated[str, AfterValidator(lambda v: check_value(v, kind))]
    globals()[attr] = made
    return made
