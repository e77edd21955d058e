"""Which `rlbox run` process drives a run: runs/NAME/driver.pid (its pid and start time) while it
follows the run, removed when it ends or detaches. A file whose process is gone means the driver
was killed (kill -9, the machine's OOM killer, a lost session): nothing watches the run or tears it
down any more, and `rlbox status` says so."""

from __future__ import annotations

import os
from pathlib import Path

DRIVER_FILE = "driver.pid"


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot), which tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def mark(run_dir: Path) -> None:
    """This process drives the run now."""
    pid = os.getpid()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DRIVER_FILE).write_text(f"{pid} {_started(pid)}\n")


def unmark(run_dir: Path) -> None:
    """This process drives the run no more (only its own mark is removed)."""
    path = run_dir / DRIVER_FILE
    try:
        if path.read_text().split()[0] == str(os.getpid()):
            path.unlink()
    except (OSError, IndexError):
        pass


def gone(run_dir: Path) -> int | None:
    """The pid of the run's driver when its mark is there but the process is not (it was killed)."""
    try:
        pid_text, started = (run_dir / DRIVER_FILE).read_text().split()[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return None if _started(pid) == started else pid
