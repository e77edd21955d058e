"""Where the project's data lives: the directory holding images/, templates/, patches/."""

from __future__ import annotations

import os
from pathlib import Path

from rlbox.core.errors import RlboxError

_MARKERS = ("images", "templates", "patches")
PACKAGE = Path(__file__).resolve().parents[1]  # launcher/rlbox
RESOURCES = PACKAGE / "resources"  # package data: recipes, datasets, signatures, stand-ins


def _is_root(path: Path) -> bool:
    return all((path / m).is_dir() for m in _MARKERS)


def find_root(start: Path | None = None) -> Path:
    """The rlbox tree to work on.

    Order: ``$RLBOX_ROOT``; the current directory or a parent of it; the checkout the
    package was installed from (``pip install -e .``).
    """
    env = os.environ.get("RLBOX_ROOT")
    if env:
        root = Path(env).resolve()
        if not _is_root(root):
            raise RlboxError(f"RLBOX_ROOT={env}: no images/, templates/ and patches/ there")
        return root
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if _is_root(candidate):
            return candidate
    installed = PACKAGE.parents[1]
    if _is_root(installed):
        return installed
    raise RlboxError(
        "no rlbox tree found: run inside a checkout of rlbox (with images/, templates/, patches/) "
        "or set RLBOX_ROOT"
    )


def cache_dir() -> Path:
    """Where rlbox keeps what it can make again (e.g. the matrix's rows: rlbox.image.matrix_cache).

    Order: ``$RLBOX_CACHE``; ``$XDG_CACHE_HOME/rlbox`` (an absolute path, as the XDG base
    directory spec asks); ``~/.cache/rlbox``. Raises OSError when there is no home to put it in."""
    env = os.environ.get("RLBOX_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "rlbox"
    try:
        return Path.home() / ".cache" / "rlbox"
    except (RuntimeError, KeyError) as err:  # no HOME and no passwd entry
        raise OSError(f"no home directory for a cache ({err})") from None
