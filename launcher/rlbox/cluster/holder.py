"""Who holds an engine's claims lock, as a label another rlbox can check: this process named by its
machine's boot id, its pid namespace, its pid and its start time (``here``), and whether the process a
label names has ended (``gone``), answered by this machine's kernel (/proc) when the waiter shares the
holder's machine and pid namespace, and not answered (None) otherwise.

A lock's label is read back from an engine anyone on the host can write to: it is parsed strictly, and
what it can make rlbox do is only to remove that lock container sooner; no process is ever signalled.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

BOOT_ID = "/proc/sys/kernel/random/boot_id"
_LABEL = re.compile(r"([0-9a-f-]{36}) (pid:\[[0-9]{1,20}\]) ([0-9]{1,10}) ([0-9]{1,20})")


def _read(path: str) -> str:
    return Path(path).read_text()


def _start_time(stat: str) -> str:
    """A process's start time (clock ticks after boot): field 22 of /proc/PID/stat, counted after its
    name, which is in parentheses and may hold spaces and parentheses itself."""
    return stat[stat.rindex(")") + 2:].split()[19]


def here(read: Callable[[str], str] = _read, readlink: Callable[[str], str] = os.readlink,
         pid: int | None = None) -> str:
    """This process as a lock's holder label: ``BOOT_ID pid:[NS] PID START``; "" when /proc cannot say."""
    pid = os.getpid() if pid is None else pid
    try:
        label = f"{read(BOOT_ID).strip()} {readlink(f'/proc/{pid}/ns/pid')} {pid} {_start_time(read(f'/proc/{pid}/stat'))}"
    except (OSError, ValueError, IndexError):
        return ""
    return label if _LABEL.fullmatch(label) else ""


def gone(label: str | None, read: Callable[[str], str] = _read, readlink: Callable[[str], str] = os.readlink) -> bool | None:
    """Whether the holder ``label`` names has ended: True when it is a process of this machine and pid
    namespace whose pid no longer runs (gone, or a zombie not reaped yet), or runs a process started at
    another time (the pid reused);
    False when it still runs; None when this machine cannot tell (another machine or namespace, a label
    that is not one, or /proc unreadable): the lock's own time limit decides then."""
    m = _LABEL.fullmatch(label or "")
    mine = here(read, readlink)
    if m is None or not mine:
        return None
    boot, ns, pid, start = m.groups()
    if mine.split()[:2] != [boot, ns]:
        return None
    try:
        stat = read(f"/proc/{pid}/stat")
        return _start_time(stat) != start or stat[stat.rindex(")") + 2:].split()[0] in ("Z", "X")  # or a zombie
    except (FileNotFoundError, ProcessLookupError):  # no such pid (its /proc folder gone as it was read)
        return True
    except (OSError, ValueError, IndexError):
        return None
