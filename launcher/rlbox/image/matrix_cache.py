"""The rows of `rlbox images list` (each variant's ``ResolvedVariant.summary()``), kept in a cache
keyed by the content of everything that makes them, so that listing the matrix does not load and
validate the whole of images/ (yaml + pydantic) on every call.

The key is a sha256 over: this cache's format; rlbox's version and the Python running it; the
source of every rlbox module ``matrix.load`` runs (CODE) and, for each library it imports
(LIBRARIES), the path, size and mtime of the file the library is imported from (an upgrade
rewrites it); every ``images/*.yaml`` and ``images/lock/*.json`` by name and content; and the names
of the files under ``patches/COMPONENT/`` (``load`` checks that each listed patch exists; no row
holds a patch's content). Only a matrix that loaded is cached: an invalid one is loaded every time
and fails with its own error line, as it did without a cache.

One JSON file per tree (named by the hash of the tree's path) under
``rlbox.core.paths.cache_dir()/matrix/``, written atomically (a temporary file in the same folder,
renamed over the old one). Read back it is typed: its format, its key, every row's fields in
order with their types, and the sha256 of the rows must all be what they should, else it is
ignored and written again; a corrupt, truncated, tampered or foreign file is never used and never
a traceback. Where the cache cannot be read or written (no home, a read-only or full disk) the
matrix is loaded as if there were none.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from rlbox import __version__
from rlbox.core.paths import cache_dir

FORMAT = "rlbox.matrix-rows/v1"
MAX_BYTES = 4 << 20  # a cache file larger than this is not ours: ignored unread

# The rlbox modules `import rlbox.image.matrix` loads (tests/image/test_matrix_cache.py checks the
# list against a fresh interpreter's), relative to the package: an edit of any changes the key.
CODE = (
    "__init__.py",
    "core/__init__.py", "core/config.py", "core/errors.py", "core/names.py", "core/paths.py", "core/quote.py",
    "image/__init__.py", "image/lockfile.py", "image/matrix.py", "image/matrix_cache.py", "image/schema.py",
    "registry/__init__.py", "registry/reference.py",
)
# The libraries it loads (checked there too): their installed file's path, size and mtime.
LIBRARIES = ("annotated_types", "pydantic", "pydantic_core", "typing_extensions", "typing_inspection", "yaml")

# One row, as ResolvedVariant.summary() makes it: its fields in order, each a string but these two.
FIELDS = ("release", "variant", "ref", "hardware", "chip", "soc_version", "platform", "tag", "base_image", "cann",
          "python", "driver_min", "dockerfile", "components", "patches", "track")
MAPPINGS = ("components",)  # str -> str
LISTS = ("patches",)  # [str]


def rows(root: Path) -> list[dict[str, Any]]:
    """Every variant's summary row of the matrix under ``root``: from the cache when its key is
    this tree's, else from ``matrix.load`` (its RlboxError on a bad matrix), then cached."""
    root = root.resolve()
    try:
        key, path = inputs_key(root), cache_file(root)
    except OSError:  # an input unreadable here (load says which) or no cache folder: no cache
        key, path = None, None
    if key is not None and path is not None:
        cached = read(path, key)
        if cached is not None:
            return cached
    from rlbox.image import matrix

    made = [v.summary() for v in matrix.load(root).variants]
    if key is not None and path is not None:
        write(path, key, made)
    return made


def cache_file(root: Path) -> Path:
    return cache_dir() / "matrix" / f"{hashlib.sha256(str(root).encode('utf-8', 'surrogateescape')).hexdigest()[:32]}.json"


def inputs_key(root: Path) -> str:
    """The sha256 of everything the rows are made from (see the module's docstring)."""
    h = hashlib.sha256()

    def add(*parts: str) -> None:
        for part in parts:
            data = part.encode("utf-8", "surrogateescape")
            h.update(len(data).to_bytes(8, "big") + data)  # length-prefixed: no two inputs read alike

    add(FORMAT, __version__, sys.version)
    package = Path(__file__).resolve().parents[1]
    for rel in CODE:
        add(rel, _content(package / rel))
    for name in LIBRARIES:
        add(name, _installed(name))
    images = root / "images"
    for label, folder, suffix in (("images", images, ".yaml"), ("lock", images / "lock", ".json")):
        for entry in _entries(folder):
            if entry.name.endswith(suffix):
                add(label, entry.name, _content(Path(entry.path)) if entry.is_file() else "not a file")
    for component in _entries(root / "patches"):
        if component.is_dir():
            for entry in _entries(Path(component.path)):
                add("patch", component.name, entry.name, "file" if entry.is_file() else "not a file")
    return h.hexdigest()


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []  # no such folder: as load sees it (no lock, no patches)


def _content(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _installed(name: str) -> str:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    if not origin:
        return "absent"
    st = os.stat(origin)
    return f"{origin} {st.st_size} {st.st_mtime_ns}"


def read(path: Path, key: str) -> list[dict[str, Any]] | None:
    """The rows cached at ``path`` for ``key``; None for a missing, foreign, stale or broken file."""
    try:  # never follows a link at the file, never blocks on a fifo, never reads more than MAX_BYTES
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            return None
        entry = json.loads(b"".join(chunks).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
        return None
    finally:
        os.close(fd)
    return typed(entry, key)


def typed(entry: Any, key: str) -> list[dict[str, Any]] | None:
    """``entry`` as a cache of ``key``'s rows, each field of the type it has; None otherwise."""
    if not isinstance(entry, dict) or list(entry) != ["format", "key", "rows", "sha256"]:
        return None
    if entry["format"] != FORMAT or entry["key"] != key or not isinstance(entry["rows"], list):
        return None
    for row in entry["rows"]:
        if not isinstance(row, dict) or list(row) != list(FIELDS):
            return None
        for name, value in row.items():
            if name in MAPPINGS:
                ok = isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
            elif name in LISTS:
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            else:
                ok = isinstance(value, str)
            if not ok:
                return None
    if entry["sha256"] != rows_digest(entry["rows"]):
        return None
    return entry["rows"]


def rows_digest(made: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(made, separators=(",", ":")).encode()).hexdigest()


def write(path: Path, key: str, made: list[dict[str, Any]]) -> None:
    """Write the rows for ``key`` atomically: a reader sees the old file or the new one, never
    half of one. A folder that cannot be written is left as it is (the next call loads again)."""
    import tempfile

    entry = {"format": FORMAT, "key": key, "rows": made, "sha256": rows_digest(made)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
