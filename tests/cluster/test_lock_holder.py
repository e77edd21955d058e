"""Who holds an engine's claims lock (cluster.holder), without any engine: this process as a label,
and whether the process a label names has ended, told by this machine's /proc only where the waiter
shares the holder's machine and pid namespace. The engine side (a dead holder's lock taken over at
once) is in tests/cluster/test_sharing.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rlbox.cluster import holder

BOOT = "0f0e0d0c-0b0a-0908-0706-050403020100"
NS = "pid:[4026531836]"


def _proc(stats: dict[int, str], boot: str = BOOT, ns: str = NS, me: int = os.getpid()):
    """(read, readlink) of a /proc holding ``stats`` (pid -> its stat line) and this process as ``me``."""
    def read(path: str) -> str:
        if path == holder.BOOT_ID:
            return boot + "\n"
        pid = int(path.split("/")[2])
        if pid not in stats:
            raise FileNotFoundError(path)
        return stats[pid]

    def readlink(path: str) -> str:
        return ns

    stats.setdefault(me, f"{me} (python3) S 1 1 1 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 5000 0 0\n")
    return read, readlink


def _stat(pid: int, start: int, name: str = "python3", state: str = "S") -> str:
    return f"{pid} ({name}) {state} 1 1 1 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"


def test_this_process_as_a_holder_is_its_boot_id_pid_namespace_pid_and_start_time():
    label = holder.here()
    boot, ns, pid, start = label.split()
    assert boot == open(holder.BOOT_ID).read().strip() and ns == os.readlink("/proc/self/ns/pid")
    assert int(pid) == os.getpid() and start.isdigit()
    assert holder.gone(label) is False  # this very process still runs


@pytest.mark.parametrize("stats, label, said", [
    ({4242: _stat(4242, 777)}, f"{BOOT} {NS} 4242 777", False),  # runs, the same start: still holding
    ({}, f"{BOOT} {NS} 4242 777", True),  # no such pid: ended
    ({4242: _stat(4242, 900)}, f"{BOOT} {NS} 4242 777", True),  # the pid taken by a later process: ended
    ({4242: _stat(4242, 777, "a b) (c")}, f"{BOOT} {NS} 4242 777", False),  # a name with spaces and parentheses
    ({4242: _stat(4242, 777, state="Z")}, f"{BOOT} {NS} 4242 777", True),  # killed, not reaped yet: ended
    ({}, f"{BOOT.replace('0f', 'ff')} {NS} 4242 777", None),  # another machine: not this kernel's to say
    ({}, f"{BOOT} pid:[4026532000] 4242 777", None),  # another pid namespace (an rlbox in a container)
    ({}, None, None),  # a lock of an rlbox before holders were labelled
    ({}, "", None),
    ({}, f"{BOOT} {NS} 4242", None),  # not a label: the lock's time limit decides
    ({}, f"{BOOT} {NS} 4242 777; rm -rf /", None),
    ({}, f"{BOOT} {NS} ../../self 777", None),
    ({}, f"{BOOT} {NS} 42424242424242 777", None),
])
def test_a_holder_label_is_ended_only_when_this_machine_s_kernel_says_so(stats, label, said):
    read, readlink = _proc(stats)
    assert holder.gone(label, read, readlink) is said


def test_without_a_readable_proc_nothing_is_said():
    def read(path: str) -> str:
        raise PermissionError(path)

    assert holder.here(read=read) == ""
    assert holder.gone(f"{BOOT} {NS} 4242 777", read, lambda path: NS) is None


def test_a_real_process_that_ended_is_gone_and_one_that_runs_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        label = holder.here(pid=child.pid)
        assert label and holder.gone(label) is False
        child.kill()
        deadline = time.monotonic() + 10
        while holder.gone(label) is not True and time.monotonic() < deadline:  # a zombie until it is reaped
            time.sleep(0.01)
        assert holder.gone(label) is True
    finally:
        child.kill()
        child.wait()
    assert holder.gone(label) is True
