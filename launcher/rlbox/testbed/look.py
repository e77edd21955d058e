"""Looking at what of a testbed exists on this machine, by what it is, never by its record:
the processes (with what proves whose they are: argv, namespaces, cgroups), this machine's own
namespaces, the links and network namespaces. The judgements are ``trust``'s."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rlbox.testbed import plan as tbplan
from rlbox.testbed import trust
from rlbox.testbed.state import HostState


def _out(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def processes() -> list[trust.Proc]:
    """Every process of this machine, with what proves whose it is."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        base = f"/proc/{entry}"
        try:
            raw = Path(base, "cmdline").read_bytes()
            cgroup = Path(base, "cgroup").read_text(errors="replace")
        except OSError:
            continue
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1]) if raw else ()
        paths = tuple(line.split(":", 2)[2] for line in cgroup.splitlines() if line.count(":") >= 2)
        out.append(trust.Proc(int(entry), argv, _readlink(f"{base}/ns/net"), _readlink(f"{base}/ns/pid"), paths))
    return out


def machine() -> trust.Machine:
    """This machine's own namespaces, and PID 1, rlbox and its ancestors (never a testbed's)."""
    protected, pid = {1}, os.getpid()
    while pid > 1 and pid not in protected:
        protected.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return trust.Machine(nets=frozenset(x for x in (_readlink("/proc/1/ns/net"), _readlink("/proc/self/ns/net")) if x),
                         pidnss=frozenset(x for x in (_readlink("/proc/1/ns/pid"), _readlink("/proc/self/ns/pid")) if x),
                         protected=frozenset(protected))


def host_facts(root: str, name: str) -> list[trust.HostFacts]:
    """Every host testbed NAME under ROOT could have (1..MAX_HOSTS), named as `up` names them."""
    out = []
    for i in range(1, tbplan.MAX_HOSTS + 1):
        netns = f"rlbox-{name}-h{i}"
        try:
            netns_id = f"net:[{os.stat(f'/var/run/netns/{netns}').st_ino}]"
        except OSError:
            netns_id = ""
        out.append(trust.HostFacts(i, f"{root.rstrip('/')}/{name}/h{i}", netns, netns_id))
    return out


def look(root: str, name: str, procs: list[trust.Proc] | None = None) -> dict[int, list[trust.Proc]]:
    """The testbed's processes, by host index, each proved the testbed's (``trust``)."""
    return trust.host_processes(processes() if procs is None else procs, host_facts(root, name), machine())


def root_name(h: HostState) -> tuple[str, str]:
    folder = Path(h.dir).parent  # ROOT/NAME (load checked it is)
    return str(folder.parent), folder.name


def host_init(h: HostState) -> int | None:
    """PID 1 of the host's PID namespace, found by looking (the record's init_pid is not trusted)."""
    return trust.init_of(processes(), h.dir, machine())


def link_kinds() -> dict[str, str]:
    """Every link of this machine's network namespace: name -> kind (bridge, veth, dummy, ...; '' if none)."""
    try:
        return {x["ifname"]: x.get("linkinfo", {}).get("info_kind", "") for x in json.loads(_out(["ip", "-j", "-d", "link", "show"]) or "[]")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def netns_list() -> set[str]:
    return {line.split()[0] for line in _out(["ip", "netns", "list"]).splitlines() if line.split()}


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def in_host(init_pid: int | None) -> list[int]:
    """Every process in the PID namespace of ``init_pid`` (by this machine's numbering); none when
    that is this machine's own PID namespace (a pid that is not a host's init)."""
    if not alive(init_pid):
        return []
    ns = _readlink(f"/proc/{init_pid}/ns/pid")
    if not ns or ns in machine().pidnss:
        return []
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and _readlink(f"/proc/{e}/ns/pid") == ns]
