"""A cached folder made once, safely when several rlbox processes want it at the same moment.

The folder is made under an exclusive lock (``fcntl.flock`` on ``DEST.lock`` beside it), in a
fresh folder of its own beside ``DEST``, stamped (``DEST/.complete`` holds what it was made
from) and renamed into place. A folder without the stamp, or with another stamp, is half-made
or stale: it is removed and made again. Readers that find the stamp take no lock.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

STAMP = ".complete"


def is_made(dest: Path, stamp: str) -> bool:
    try:
        return (dest / STAMP).read_text(encoding="utf-8") == stamp
    except OSError:
        return False


@contextmanager
def locked(path: Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """An exclusive lock on ``path`` (made if missing) for the duration of the block; ``waiting`` is
    called first when another process holds it (a notice: this one waits for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (fcntl.LOCK_NB if waiting else 0))
        except BlockingIOError:
            waiting()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def made_once(dest: Path, stamp: str, make: Callable[[Path], None], before: Callable[[], None] | None = None) -> Path:
    """``dest``, made by ``make(folder)`` unless a complete one with ``stamp`` is there. ``make``
    fills the empty folder it is given or raises (nothing is left behind); ``before`` runs only
    when something is to be made (a notice)."""
    if is_made(dest, stamp):
        return dest
    with locked(dest.with_name(dest.name + ".lock")):
        if is_made(dest, stamp):  # another process made it while this one waited
            return dest
        if before:
            before()
        partial = Path(tempfile.mkdtemp(prefix=dest.name + ".partial-", dir=dest.parent))
        try:
            make(partial)
            (partial / STAMP).write_text(stamp, encoding="utf-8")
            if dest.exists() or dest.is_symlink():  # half-made or stale: made again
                shutil.rmtree(dest, ignore_errors=True)
            partial.rename(dest)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return dest
