"""A quiet machine for each measurement of a bench: this machine's CPU time by kind, and a wait for
the disk's writeback and the CPUs (bench/bringup.py, bench/distribute.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_times() -> list[int]:
    """This machine's CPU time so far by kind (/proc/stat's first line: user, nice, system, idle,
    iowait, ...), every process and container."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def cpu_jiffies() -> tuple[int, int]:
    """(busy, all) CPU time of this machine so far (waiting on the disk counted as idle)."""
    values = cpu_times()
    return sum(values) - values[3] - values[4], sum(values)


def own_cpu() -> float:
    """CPU-seconds used so far by this process (all its threads) and every live process under it (the
    launcher's ssh tunnels and sessions): what the launcher itself costs, apart from what it waits for."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    spent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        spent[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime, stime
    total, todo = 0, [os.getpid()]
    while todo:  # this process, then everything under it, at any depth
        pid = todo.pop()
        total += spent.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / tick


def settle(label: str, idle_share: float = 0.8, most: float = 120.0) -> None:
    """Flush the disk's dirty pages (os.sync) and wait until this machine's CPUs were at least
    ``idle_share`` idle, waiting on the disk counted as busy, over one second (at most ``most``
    seconds), so that each measurement starts on a quiet machine: loading the image into 16 hosts
    writes ~10 GB, and its writeback otherwise slows the next measurement's container creates."""
    start = time.monotonic()
    os.sync()
    while time.monotonic() - start < most:
        before = cpu_times()
        time.sleep(1.0)
        after = cpu_times()
        total = sum(after) - sum(before)
        if total > 0 and (after[3] - before[3]) / total >= idle_share:
            break
    waited = time.monotonic() - start
    if waited > 1.5:
        print(f"{label}: waited {waited:.0f} s for the disk's writeback and the CPUs to be {idle_share:.0%} idle",
              flush=True)
