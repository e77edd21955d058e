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
from rlbox.cluster.agent import BOOT_ID

BOOT = "0f0e0d0c-0b0a-0908-0706-050403020100"
NS = "pid:[4026531836]"
TNS = "time:[4026531834]"
ME = os.getpid()


def _stat(pid: int, start: int, name: str = "python3", state: str = "S") -> str:
    return f"{pid} ({name}) {state} 1 1 1 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0\n"


def _proc(stats: dict[int, str], boot: str = BOOT, ns: str = NS, tns: str | None = TNS, self_pid: int = ME):
    """(read, readlink) of a /proc holding ``stats`` (pid -> its stat line) and this process (ME); ``tns``
    None: a kernel without time namespaces; ``self_pid``: the pid /proc/self names."""
    stats = {ME: _stat(ME, 5000), **stats}

    def read(path: str) -> str:
        if path == BOOT_ID:
            return boot + "\n"
        pid = int(path.split("/")[2])
        if pid not in stats:
            raise FileNotFoundError(path)
        return stats[pid]

    def readlink(path: str) -> str:
        if path == "/proc/self":
            return str(self_pid)
        if path.endswith("/ns/time"):
            if tns is None:
                raise FileNotFoundError(path)
            return tns
        return ns

    return read, readlink


def test_this_process_as_a_holder_is_its_boot_id_pid_namespace_pid_and_start_time():
    label = holder.here()
    boot, ns, tns, pid, start = label.split()
    assert boot == open(BOOT_ID).read().strip() and ns == os.readlink("/proc/self/ns/pid")
    assert tns == (os.readlink("/proc/self/ns/time") if os.path.exists("/proc/self/ns/time") else holder.NO_TIME_NS)
    assert int(pid) == os.getpid() and start.isdigit()
    assert holder.gone(label) is False  # this very process still runs


L = f"{BOOT} {NS} {TNS} 4242 777"


@pytest.mark.parametrize("stats, label, said", [
    ({4242: _stat(4242, 777)}, L, False),  # runs, the same start: still holding
    ({}, L, True),  # no such pid (the kernel's signal-0 check agrees): ended
    ({4242: _stat(4242, 900)}, L, True),  # the pid taken by a later process: ended
    ({4242: _stat(4242, 777, "a b) (c")}, L, False),  # a name with spaces and parentheses
    ({4242: _stat(4242, 777, state="Z")}, L, True),  # killed, not reaped yet: ended
    ({}, L.replace(BOOT, BOOT.replace("0f", "ff")), None),  # another machine: not this kernel's to say
    ({}, L.replace(NS, "pid:[4026532000]"), None),  # another pid namespace (an rlbox in a container)
    ({}, L.replace(TNS, "time:[4026532001]"), None),  # another time namespace: start times shifted
    ({}, None, None),  # a lock of an rlbox before holders were labelled
    ({}, "", None),
    ({}, 4242, None),  # not a string (only a non-Docker engine could give one)
    ({}, f"{BOOT} {NS} 4242 777", None),  # an older form, or not a label: the lock's time limit decides
    ({}, L + "; rm -rf /", None),
    ({}, L.replace("4242", "../../self"), None),
    ({}, L.replace("4242", "42424242424"), None),
])
def test_a_holder_label_is_ended_only_when_this_machine_s_kernel_says_so(stats, label, said):
    read, readlink = _proc(stats)
    assert holder.gone(label, read, readlink, pid_absent=lambda pid: True) is said


def test_a_pid_proc_does_not_show_is_ended_only_when_the_kernel_has_no_such_pid():
    """/proc mounted with hidepid shows another user's process as not there: only the kernel's signal-0
    check tells "no such pid" (ended) from "not yours to see" (not known: the time limit decides)."""
    read, readlink = _proc({})
    assert holder.gone(L, read, readlink, pid_absent=lambda pid: None) is None
    assert holder.gone(L, read, readlink, pid_absent=lambda pid: True) is True
    assert holder.pid_absent(ME) is None  # exists (this process): never "ended"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert holder.pid_absent(child.pid) is True  # reaped: no such pid (unless reused at once: not in a test's time)


def test_a_kernel_without_time_namespaces_and_a_proc_of_another_pid_namespace():
    read, readlink = _proc({4242: _stat(4242, 777)}, tns=None)
    mine = holder.here(read, readlink)
    assert mine.split()[2] == holder.NO_TIME_NS
    label = f"{BOOT} {NS} {holder.NO_TIME_NS} 4242 777"
    assert holder.gone(label, read, readlink) is False
    # a pid namespace whose /proc was not mounted anew: /proc/self is not this process, so no label at all
    read, readlink = _proc({}, self_pid=1)
    assert holder.here(read, readlink) == ""
    assert holder.gone(L, read, readlink, pid_absent=lambda pid: True) is None


def test_without_a_readable_proc_nothing_is_said():
    def read(path: str) -> str:
        raise PermissionError(path)

    assert holder.here(read=read) == ""
    assert holder.gone(L, read, lambda path: str(ME) if path == "/proc/self" else NS) is None


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
