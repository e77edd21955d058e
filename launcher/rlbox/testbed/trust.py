"""Judgements over gathered facts: which processes are a testbed's, and whether sshd would accept
the testbed's key under a root folder. Pure functions (the facts are read by ``execute``), so
that nothing rlbox reads back (a testbed's record, a pid in it) decides what is killed or deleted.

A process is host I's of testbed NAME under ROOT when it proves it by what it is, never because
a record names it:

* its argv ends with the host's init (``... sh -c HOST_INIT rlbox-testbed-host ROOT/NAME/hI``:
  the holder and the host's init both do); or
* it lives in the PID namespace of such an init, or in the network namespace
  ``rlbox-NAME-hI`` (or the one such an init lives in), where neither is this machine's own; or
* its cgroup path has the component ``rlbox-NAME-hI`` (the host's engine puts its containers
  under ``--cgroup-parent /rlbox-NAME-hI``).

PID 1, rlbox itself and its ancestors are never anyone's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

INIT_TAG = "rlbox-testbed-host"  # the host init's $0 (plan.HostPlan.init_argv)


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    argv: tuple[str, ...]
    net: str = ""  # readlink /proc/PID/ns/net, e.g. "net:[4026532291]"; "" when unreadable
    pidns: str = ""  # readlink /proc/PID/ns/pid
    cgroups: tuple[str, ...] = ()  # the paths of /proc/PID/cgroup


@dataclass(frozen=True)
class Machine:
    """This machine's own namespaces and the processes no testbed may claim."""

    nets: frozenset[str]
    pidnss: frozenset[str]
    protected: frozenset[int]  # 1, rlbox itself, its ancestors


@dataclass(frozen=True)
class HostFacts:
    """What the testbed makes for host I, derived from its name and root (never from a record)."""

    index: int
    dir: str  # ROOT/NAME/hI: the host init's last argument
    netns: str  # rlbox-NAME-hI: the network namespace, the veth and the cgroup parent
    netns_id: str = ""  # "net:[INODE]" of /var/run/netns/NETNS when it exists


def is_init_of(p: Proc, host_dir: str) -> bool:
    """The holder or the init of the host whose folder is ``host_dir``."""
    return len(p.argv) >= 3 and p.argv[-2] == INIT_TAG and p.argv[-1] == host_dir and "-c" in p.argv


def host_processes(procs: list[Proc], hosts: list[HostFacts], machine: Machine) -> dict[int, list[Proc]]:
    """Each host's processes (by index), each proved the host's as the module says."""
    out: dict[int, list[Proc]] = {}
    for h in hosts:
        marked = [p for p in procs if is_init_of(p, h.dir) and p.pid not in machine.protected]
        pidnss = {p.pidns for p in marked if p.pidns} - machine.pidnss
        nets = ({p.net for p in marked if p.net} | ({h.netns_id} if h.netns_id else set())) - machine.nets
        found = [p for p in procs if p.pid not in machine.protected
                 and (p in marked or p.pidns in pidnss or p.net in nets
                      or any(h.netns in c.split("/") for c in p.cgroups))]
        if found:
            out[h.index] = found
    return out


def init_of(procs: list[Proc], host_dir: str, machine: Machine) -> int | None:
    """PID 1 of the host's PID namespace (as this machine numbers it): the marked process whose
    PID namespace is not this machine's (the holder, before ``--fork``, shares ours)."""
    for p in procs:
        if is_init_of(p, host_dir) and p.pidns and p.pidns not in machine.pidnss and p.pid not in machine.protected:
            return p.pid
    return None


def holder_of(procs: list[Proc], host_dir: str, machine: Machine) -> int | None:
    for p in procs:
        if is_init_of(p, host_dir) and p.pidns in machine.pidnss and p.pid not in machine.protected:
            return p.pid
    return None


# What `up` puts in ROOT/NAME (and nothing else): `down` deletes a folder holding only these.
MADE_BY_UP = re.compile(r"^(testbed\.json|testbed\.tmp|id_ed25519(\.pub)?|authorized_keys|known_hosts|cluster(-[0-9-]+)?\.yaml"
                        r"|h[1-9][0-9]?|slurm)$")


def made_by_up(entry: str, name: str) -> bool:
    return bool(MADE_BY_UP.match(entry)) or entry.startswith(f"rlbox-{name}-image-")


# -- sshd's StrictModes --------------------------------------------------------------------------
def strict_modes_problem(chain: list[tuple[str, int, int]], uid: int, home: str | None = None) -> str | None:
    """What sshd's StrictModes would refuse about the folders holding the testbed's key, or None.

    ``chain`` is (folder, owner uid, st_mode) from the key's folder (or its deepest existing
    ancestor) up to ``/``, symlinks resolved. sshd walks it upwards and refuses any folder not
    owned by root or the user, or writable by group or others (a sticky bit, as on /tmp, does not
    help); it stops after the user's home folder."""
    for path, owner, mode in chain:
        if owner not in (0, uid):
            return f"{path} is owned by uid {owner}, not root"
        if mode & 0o022:
            who = " and ".join(w for w, bit in (("its group", 0o020), ("everyone", 0o002)) if mode & bit)
            return f"{path} (mode {mode & 0o7777:04o}) is writable by {who}"
        if home and path == home:
            break
    return None

