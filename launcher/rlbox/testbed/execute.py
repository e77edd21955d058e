"""Carrying out a TestbedPlan, and taking a testbed down so that nothing is left: no namespace,
link, process, mount, cgroup, firewall rule or folder.

Thin: every name, address, path and argv is in the plan. What this adds is order, waiting for
each host's engine and sshd to answer, and the teardown that runs on any failure or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlbox.core.errors import RlboxError
from rlbox.testbed import plan as tbplan
from rlbox.testbed.plan import HostPlan, TestbedPlan
from rlbox.testbed.state import HostState, TestbedState, load, path_for

Echo = Callable[[str], None]
TOOLS = ("ip", "nsenter", "unshare", "iptables", "dockerd", "ssh-keygen", "ssh", "mountpoint")


def requirements() -> None:
    """Root, iproute2 and the other tools, checked before anything is made (one line each)."""
    if os.geteuid() != 0:
        raise RlboxError("rlbox testbed needs root (namespaces, a bridge, dockerd); run it as root, or use "
                         "`rlbox run --sim` where that is not possible")
    if shutil.which("ip") is None:
        raise RlboxError("rlbox testbed needs iproute2 (`ip`): apt-get install -y iproute2")
    missing = [t for t in TOOLS if shutil.which(t) is None] + [p for p in ("/usr/sbin/sshd",) if not os.path.exists(p)]
    if missing:
        raise RlboxError(f"rlbox testbed needs {', '.join(missing)}: apt-get install -y util-linux iptables docker.io "
                         "openssh-server openssh-client")


def _run(argv: list[str], what: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RlboxError(f"{what}: `{' '.join(argv[:4])} ...` did not finish in {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
        raise RlboxError(f"{what}: {' '.join(argv[:6])} failed: {last}")
    return proc


def _state(plan: TestbedPlan, phase: str, pids: dict[int, tuple[int | None, int | None]] | None = None,
           **extra) -> TestbedState:
    pids = pids or {}
    return TestbedState(
        name=plan.name, root=plan.root, subnet=plan.subnet, bridge=plan.bridge, gateway=plan.gateway,
        hardware=plan.hardware, image=plan.image, phase=phase, cluster_file=plan.cluster_file,
        identity_file=plan.identity_file, known_hosts=plan.known_hosts,
        hosts=tuple(HostState(index=h.index, address=h.address, netns=h.netns, veth=h.veth, dir=h.dir,
                              devices=h.devices, driver=h.driver, holder_pid=pids.get(h.index, (None, None))[0],
                              init_pid=pids.get(h.index, (None, None))[1]) for h in plan.hosts),
        **extra)


def _conflicts(plan: TestbedPlan) -> None:
    if path_for(plan.root, plan.name).exists():
        raise RlboxError(f"testbed {plan.name} exists ({plan.state_file}); take it down first: "
                         f"rlbox testbed down --name {plan.name}")
    links = _run(["ip", "-o", "link", "show"], "list links").stdout
    names = {h.veth for h in plan.hosts} | {plan.bridge}
    taken = sorted(n for n in names if f": {n}:" in links or f": {n}@" in links)
    netns = set(_run(["ip", "netns", "list"], "list namespaces").stdout.split())
    taken += sorted(h.netns for h in plan.hosts if h.netns in netns)
    if taken:
        raise RlboxError(f"testbed {plan.name}: {taken[0]} already exists (left by a killed testbed?); "
                         f"`rlbox testbed down --name {plan.name}` removes it")
    import ipaddress

    subnet = ipaddress.ip_network(plan.subnet)
    for line in _run(["ip", "-o", "-4", "route", "show"], "list routes").stdout.splitlines():
        dest = line.split()[0]
        if dest == "default":
            continue
        try:
            if ipaddress.ip_network(dest, strict=False).overlaps(subnet):
                raise RlboxError(f"--subnet {plan.subnet} overlaps {dest} (route: {line.strip()}); "
                                 "give another --subnet")
        except ValueError:
            continue


# -- bring-up ------------------------------------------------------------------------------------
def up(plan: TestbedPlan, echo: Echo, *, load_image: Callable[[TestbedState, Echo], float] | None = None) -> TestbedState:
    """Bring the testbed up (its record first, so `down` finds whatever exists); on any failure or
    Ctrl-C take down what was made and raise."""
    requirements()
    _conflicts(plan)
    started = time.monotonic()
    Path(plan.dir).mkdir(parents=True, exist_ok=True)
    state = _state(plan, "starting")
    state.save()
    try:
        for argv in plan.network_steps():
            _run(argv, f"testbed {plan.name}: network")
        _keys(plan)
        holders = {}
        for h in plan.hosts:
            tbplan.stand_ins(plan, h)
            Path(h.dir, "daemon.json").write_text("{}\n")
            Path(h.dir, "sshd_config").write_text(h.sshd_config(f"{plan.dir}/authorized_keys"))
            with open(Path(h.dir) / "init.log", "wb") as log:
                holders[h.index] = subprocess.Popen(h.init_argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                    start_new_session=True)
        pids = {h.index: (holders[h.index].pid, _init_pid(h, holders[h.index])) for h in plan.hosts}
        state = _state(plan, "starting", pids)
        state.save()
        _, errors = _parallel(lambda h: _start_services(h, pids[h.index][1]), plan.hosts)
        if errors:
            raise errors[0]
        _known_hosts(plan)
        Path(plan.cluster_file).write_text(plan.cluster_yaml())
        up_seconds = round(time.monotonic() - started, 2)
        echo(f"{len(plan.hosts)} host(s) up in {up_seconds:.1f} s: "
             + ", ".join(f"{h.address} ({h.devices} NPUs)" for h in plan.hosts))
        state = _state(plan, "starting", pids, up_seconds=up_seconds)
        state.save()
        image_seconds = None
        if plan.image and load_image is not None:
            image_seconds = round(load_image(state, echo), 2)
        state = _state(plan, "up", pids, up_seconds=up_seconds, image_seconds=image_seconds)
        state.save()
        return state
    except BaseException:
        echo(f"testbed {plan.name}: bring-up failed; taking down what was made")
        teardown(state, echo=lambda line: None)
        raise


def _keys(plan: TestbedPlan) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"rlbox-testbed-{plan.name}", "-f", plan.identity_file],
         "ssh key")
    shutil.copy(plan.identity_file + ".pub", f"{plan.dir}/authorized_keys")
    for h in plan.hosts:
        Path(h.dir).mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"rlbox-testbed-{plan.name}-{h.name}",
              "-f", f"{h.dir}/ssh_host_ed25519_key"], f"{h.address}: host key")


def _known_hosts(plan: TestbedPlan) -> None:
    lines = []
    for h in plan.hosts:
        kind, key = Path(f"{h.dir}/ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{h.address} {kind} {key}")
    Path(plan.known_hosts).write_text("\n".join(lines) + "\n")


def _init_pid(h: HostPlan, holder: subprocess.Popen, timeout: float = 30) -> int:
    """Wait for a host's init to have set the host up; its PID in this machine's numbering."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if holder.poll() is not None:
            log = Path(h.dir, "init.log").read_text(errors="replace").strip().splitlines()
            raise RlboxError(f"{h.address}: the host's namespaces did not come up ({log[-1] if log else holder.returncode})")
        if Path(h.dir, "ready").exists():
            children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)
    raise RlboxError(f"{h.address}: the host's namespaces did not come up in {timeout:.0f} s (see {h.dir}/init.log)")


def _start_services(h: HostPlan, init_pid: int) -> None:
    start_engine(h, init_pid)
    start_sshd(h, init_pid)


def start_engine(h: HostPlan | HostState, init_pid: int, timeout: float = 60) -> None:
    """Start a host's dockerd inside it and wait until it answers on its socket."""
    argv = (h if isinstance(h, HostPlan) else _host_plan(h)).dockerd_argv(init_pid)
    with open(Path(h.dir) / "dockerd.log", "ab") as log:
        _run_logged(argv, log, f"{h.address}: dockerd")
    deadline = time.monotonic() + timeout
    while not engine_answers(h.socket):
        if time.monotonic() > deadline:
            tail = Path(h.dir, "dockerd.log").read_text(errors="replace").strip().splitlines()
            raise RlboxError(f"{h.address}: dockerd did not answer in {timeout:.0f} s ({tail[-1] if tail else 'no log'})")
        time.sleep(0.1)


def start_sshd(h: HostPlan | HostState, init_pid: int, timeout: float = 20) -> None:
    argv = (h if isinstance(h, HostPlan) else _host_plan(h)).sshd_argv(init_pid)
    with open(Path(h.dir) / "sshd.out", "ab") as log:
        _run_logged(argv, log, f"{h.address}: sshd")
    deadline = time.monotonic() + timeout
    while not port_answers(h.address, 22):
        if time.monotonic() > deadline:
            raise RlboxError(f"{h.address}: sshd did not listen on {h.address}:22 in {timeout:.0f} s (see {h.dir}/sshd.log)")
        time.sleep(0.05)


def _run_logged(argv: list[str], log, what: str) -> None:
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, timeout=30)
    if proc.returncode != 0:
        raise RlboxError(f"{what} did not start (exit {proc.returncode}; see {getattr(log, 'name', 'its log')})")


def _host_plan(h: HostState) -> HostPlan:
    import ipaddress

    net = ipaddress.ip_network(f"{h.address}/24", strict=False)
    return HostPlan(h.index, h.netns, h.veth, h.address, net.prefixlen, "", h.dir, h.devices, h.driver)


def engine_answers(sock: str) -> bool:
    """The engine at a unix socket answers ``GET /_ping``."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(sock)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b"OK" in s.recv(4096)
    except OSError:
        return False


def port_answers(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((address, port)) == 0


def _parallel(fn, items) -> tuple[list, list[RlboxError]]:
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        futures = [pool.submit(fn, i) for i in items]
    results, errors = [], []
    for f in futures:
        try:
            results.append(f.result())
        except RlboxError as err:
            errors.append(err)
        except Exception as err:  # noqa: BLE001 - one line, never a lost thread
            errors.append(RlboxError(f"{type(err).__name__}: {err}"))
    return results, errors


# -- the image, until `rlbox distribute` delivers it ----------------------------------------------
def load_image_by_save(state: TestbedState, echo: Echo) -> float:
    """Put the testbed's image into every host's engine: `docker save` once on this machine's
    engine, `docker -H unix://HOSTSOCK load` on every host in parallel. Returns the seconds taken.
    (Stand-in for image delivery, `rlbox distribute`, which replaces it.)"""
    started = time.monotonic()
    image = state.image
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        raise RlboxError(f"--image {image}: not on this machine's engine; build it first (make sim-image)")
    with tempfile.TemporaryDirectory(prefix=f"rlbox-{state.name}-image-", dir=state.dir) as tmp:
        tar = f"{tmp}/image.tar"
        _run(["docker", "save", "-o", tar, image], f"docker save {image}", timeout=900)

        def load_one(h: HostState) -> None:
            _run(["docker", "-H", f"unix://{h.socket}", "load", "-q", "-i", tar], f"{h.address}: docker load", timeout=900)

        _, errors = _parallel(load_one, state.hosts)
        if errors:
            raise errors[0]
    took = time.monotonic() - started
    echo(f"image {image} loaded into {len(state.hosts)} host(s) in {took:.1f} s (docker save | docker load)")
    return took


# -- teardown ------------------------------------------------------------------------------------
def _alive(pid: int | None) -> bool:
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
    """Every process in the host's PID namespace (by this machine's numbering)."""
    if not _alive(init_pid):
        return []
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                    out.append(int(entry))
            except OSError:
                continue
    return out


def host_process(h: HostState, comm: str) -> int | None:
    """The host's daemon of this name (dockerd; sshd's listener, the child of the host's init)."""
    for pid in in_host(h.init_pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if name == comm and (comm != "sshd" or ppid == h.init_pid):
            return pid
    return None


def stop_engine(h: HostState, timeout: float = 30) -> None:
    """Remove every container on a host's engine, then stop its dockerd (SIGTERM, wait)."""
    if engine_answers(h.socket):
        _run(["sh", "-c", 'ids=$(docker -H "$1" ps -aq); [ -z "$ids" ] || docker -H "$1" rm -f $ids >/dev/null', "sh",
              f"unix://{h.socket}"], f"{h.address}: remove containers", timeout=120, check=False)
    pid = host_process(h, "dockerd")
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def stop_sshd(h: HostState) -> None:
    pid = host_process(h, "sshd")
    if pid:
        os.kill(pid, signal.SIGTERM)
        while _alive(pid):
            time.sleep(0.05)


def _stop_host(h: HostState) -> None:
    stop_engine(h)
    for pid in (h.init_pid, h.holder_pid):  # PID 1 of the host's namespace: the kernel ends the rest
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in in_host(h.init_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    _remove_cgroups(h.netns)


def _remove_cgroups(parent: str) -> None:
    """The cgroups the host's containers lived in (dockerd --cgroup-parent /NETNS), deepest first."""
    base = Path("/sys/fs/cgroup")
    for top in [base / parent, *(d / parent for d in base.iterdir() if d.is_dir())]:
        if top.is_dir():
            for sub in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError:
                pass


def teardown(state: TestbedState, echo: Echo) -> list[str]:
    """Stop every host, remove the network and the folder. Returns what is left (nothing, normally)."""
    _parallel(_stop_host, state.hosts)
    for h in state.hosts:
        _run(["ip", "netns", "delete", h.netns], "netns", check=False)
        _run(["ip", "link", "delete", h.veth], "veth", check=False)
    _run(["ip", "link", "delete", state.bridge], "bridge", check=False)
    rule = tbplan.TestbedPlan(state.name, state.root, state.subnet, state.hardware, ()).forward_rule()
    while _run(["iptables", "-C", *rule], "iptables", check=False).returncode == 0:
        _run(["iptables", "-D", *rule], "iptables", check=False)
    shutil.rmtree(state.dir, ignore_errors=True)
    try:
        Path(state.root).rmdir()  # the root folder too, when no other testbed is in it
    except OSError:
        pass
    left = leftovers(state)
    for line in left:
        echo(f"left: {line}")
    return left


def down(root: str, name: str, echo: Echo) -> list[str]:
    requirements()
    state = load(root, name)
    left = teardown(state, echo)
    if left:
        raise RlboxError(f"testbed {name}: {len(left)} thing(s) left after down: {left[0]}")
    echo(f"testbed {name} is down: no namespace, link, process, mount or folder left")
    return left


def leftovers(state: TestbedState) -> list[str]:
    """Whatever of the testbed still exists: namespaces, links, processes, mounts, cgroups,
    the firewall rule, the folder."""
    left = []
    netns = set(_run(["ip", "netns", "list"], "netns", check=False).stdout.split())
    left += [f"network namespace {h.netns}" for h in state.hosts if h.netns in netns]
    links = _run(["ip", "-o", "link", "show"], "links", check=False).stdout
    left += [f"link {n}" for n in [state.bridge, *(h.veth for h in state.hosts)] if f": {n}:" in links or f": {n}@" in links]
    for h in state.hosts:
        left += [f"process {p} of host {h.address}" for p in in_host(h.init_pid)]
        if _alive(h.holder_pid):
            left.append(f"process {h.holder_pid} (holder of host {h.address})")
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {line.split()[4]}" for line in mounts.splitlines() if line.split()[4].startswith(state.dir)]
    for d in Path("/sys/fs/cgroup").iterdir():
        left += [f"cgroup {d / h.netns}" for h in state.hosts if (d / h.netns).exists()]
    rule = tbplan.TestbedPlan(state.name, state.root, state.subnet, state.hardware, ()).forward_rule()
    if _run(["iptables", "-C", *rule], "iptables", check=False).returncode == 0:
        left.append(f"iptables rule {' '.join(rule)}")
    if Path(state.dir).exists():
        left.append(f"folder {state.dir}")
    return left


# -- status --------------------------------------------------------------------------------------
def status(root: str, name: str) -> list[dict]:
    state = load(root, name)
    rows = []
    for h in state.hosts:
        rows.append({"host": h.index, "address": h.address, "netns": h.netns, "alive": _alive(h.init_pid),
                     "engine": engine_answers(h.socket), "sshd": port_answers(h.address, 22),
                     "devices": h.devices, "driver": h.driver, "socket": h.socket})
    return rows


def record(root: str, name: str) -> dict:
    return json.loads(path_for(root, name).read_text())
