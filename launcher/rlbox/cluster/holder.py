"""Who holds an engine's claims lock, as a label another rlbox can check: this process named by its
machine's boot id, its pid and time namespaces, its pid and its start time (``here``), and whether the
process a label names has ended (``gone``), answered by this machine's kernel (/proc) when the waiter
shares the holder's machine and namespaces, and not answered (None) otherwise.

A lock's label is read back from an engine anyone on the host can write to: it is parsed strictly, and
what it can make rlbox do is only to remove that lock container sooner; no process is ever signalled
(a pid /proc does not show is asked with signal 0, which sends nothing: it only checks).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from rlbox.cluster.agent import BOOT_ID  # the kernel's boot id: which machine (as Node.machine reads it)
NO_TIME_NS = "time:[-]"  # a kernel before Linux 5.6 has no time namespaces: every process shares its clock
_LABEL = re.compile(r"([0-9a-f-]{36}) (pid:\[[0-9]{1,20}\]) (time:\[(?:[0-9]{1,20}|-)\]) ([0-9]{1,7}) ([0-9]{1,20})")


def _read(path: str) -> str:
    return Path(path).read_text()


def _after_name(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the process's name, which is in parentheses and may hold
    spaces and parentheses itself: [state, ppid, ...], the start time at index 19 (field 22)."""
    return stat[stat.rindex(")") + 2:].split()


def _time_ns(readlink: Callable[[str], str], pid: int | str) -> str:
    try:
        return readlink(f"/proc/{pid}/ns/time")
    except FileNotFoundError:
        return NO_TIME_NS


def here(read: Callable[[str], str] = _read, readlink: Callable[[str], str] = os.readlink,
         pid: int | None = None) -> str:
    """This process (or ``pid``) as a lock's holder label: ``BOOT_ID pid:[NS] time:[NS] PID START``; ""
    when /proc cannot say, or is not this process's own (a pid namespace whose /proc was not mounted
    anew: /proc/PID would name another process)."""
    own = pid is None
    pid = os.getpid() if pid is None else pid
    try:
        if own and readlink("/proc/self") != str(pid):
            return ""
        label = (f"{read(BOOT_ID).strip()} {readlink(f'/proc/{pid}/ns/pid')} {_time_ns(readlink, pid)} {pid} "
                 f"{_after_name(read(f'/proc/{pid}/stat'))[19]}")
    except (OSError, ValueError, IndexError):
        return ""
    return label if _LABEL.fullmatch(label) else ""


def pid_absent(pid: int) -> bool | None:
    """Whether no process has ``pid``, for a pid /proc does not show: True (none), None (one this
    process may not see: /proc mounted with hidepid, another user's)."""
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, the kernel only checks that the pid exists
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):  # PermissionError: it exists, another user's
        return None
    return None  # it exists, yet /proc hides it: this machine cannot tell whose it is


def gone(label: object, read: Callable[[str], str] = _read, readlink: Callable[[str], str] = os.readlink,
         pid_absent: Callable[[int], bool | None] = pid_absent) -> bool | None:
    """Whether the holder ``label`` names has ended: True when it is a process of this machine and pid and
    time namespaces whose pid no longer runs (no such pid, or a zombie not reaped yet), or runs a process
    started at another time (the pid reused); False when it still runs; None when this machine cannot
    tell (another machine or namespace, a /proc that hides other users' processes, a label that is not
    one, or /proc unreadable): the lock's own time limit decides then."""
    m = _LABEL.fullmatch(label) if isinstance(label, str) else None
    mine = here(read, readlink)
    if m is None or not mine:
        return None
    boot, pid_ns, time_ns, pid, start = m.groups()
    if mine.split()[:3] != [boot, pid_ns, time_ns]:
        return None
    try:
        fields = _after_name(read(f"/proc/{pid}/stat"))
        return fields[19] != start or fields[0] in ("Z", "X")  # another process, or a zombie
    except (FileNotFoundError, ProcessLookupError):  # not in /proc: no such pid, or one hidden (hidepid)
        return pid_absent(int(pid))
    except (OSError, ValueError, IndexError):
        return None
