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
from rlbox.testbed import slurm, slurm_up
from rlbox.testbed import trust
from rlbox.testbed.look import alive as _alive
from rlbox.testbed.look import host_facts, host_init, in_host, link_kinds, look, machine, netns_list, root_name
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


def state_of(plan: TestbedPlan, phase: str, pids: dict[int, tuple[int | None, int | None]] | None = None,
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
                         f"{down_command(plan.root, plan.name)}")
    links = _run(["ip", "-o", "link", "show"], "list links").stdout
    names = {h.veth for h in plan.hosts} | {plan.bridge}
    taken = sorted(n for n in names if f": {n}:" in links or f": {n}@" in links)
    netns = set(_run(["ip", "netns", "list"], "list namespaces").stdout.split())
    taken += sorted(h.netns for h in plan.hosts if h.netns in netns)
    if taken:
        raise RlboxError(f"testbed {plan.name}: {taken[0]} already exists (left by a killed testbed?); "
                         f"`{down_command(plan.root, plan.name)}` removes it")
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


def down_command(root: str, name: str) -> str:
    """The command taking testbed NAME under ROOT down, as the user would type it."""
    extra = "" if root.rstrip("/") == tbplan.DEFAULT_ROOT else f" --root {root.rstrip('/')}"
    return f"rlbox testbed down --name {name}{extra}"


def strict_modes(plan: TestbedPlan) -> None:
    """Refuse, before anything is made, a root under which each host's sshd would refuse the
    testbed's key (StrictModes: every folder above it owned by root, writable by no one else)."""
    path = Path(os.path.realpath(plan.dir))
    chain = []
    for folder in [path, *path.parents]:
        try:
            st = folder.stat()
        except OSError:
            continue  # `up` makes it, mode 0755
        chain.append((str(folder), st.st_uid, st.st_mode))
    try:
        import pwd

        home = os.path.realpath(pwd.getpwuid(os.geteuid()).pw_dir)
    except (KeyError, ImportError):
        home = None
    why = trust.strict_modes_problem(chain, os.geteuid(), home)
    if why:
        raise RlboxError(f"--root {plan.root}: each host's sshd would refuse the testbed's key there ({why}; sshd's "
                         f"StrictModes wants every folder above the key owned by root and writable by no one else, "
                         f"sticky bit or not); give another --root, e.g. the default {tbplan.DEFAULT_ROOT}")


# -- bring-up ------------------------------------------------------------------------------------
def up(plan: TestbedPlan, echo: Echo, *, load_image: Callable[[TestbedState, Echo], float] | None = None) -> TestbedState:
    """Bring the testbed up (its record first, so `down` finds whatever exists); on any failure or
    Ctrl-C take down what was made and raise."""
    requirements()
    if plan.slurm:
        slurm_up.requirements()
    _conflicts(plan)
    strict_modes(plan)
    started = time.monotonic()
    made = [p for p in (Path(plan.root), Path(plan.dir)) if not p.exists()]
    Path(plan.dir).mkdir(parents=True, exist_ok=True)
    for folder in made:  # whatever the umask: sshd refuses a key under a folder others may write
        folder.chmod(0o755)
    state = state_of(plan, "starting")
    state.save()
    try:
        for argv in plan.network_steps():
            _run(argv, f"testbed {plan.name}: network")
        _keys(plan)
        _known_hosts(plan)
        holders = {}
        for h in plan.hosts:
            tbplan.stand_ins(plan, h)
            Path(h.dir, "daemon.json").write_text("{}\n")
            Path(h.dir, "sshd_config").write_text(h.sshd_config(f"{plan.dir}/authorized_keys"))
            with open(Path(h.dir) / "init.log", "wb") as log:
                holders[h.index] = subprocess.Popen(h.init_argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                                    start_new_session=True)
        pids = {h.index: (holders[h.index].pid, _init_pid(h, holders[h.index])) for h in plan.hosts}
        state = state_of(plan, "starting", pids)
        state.save()
        # every host's dockerd and sshd started, root's login proven (a key sshd refuses is said at once),
        # then each engine waited for: a slow dockerd (a loaded machine) is waited for while it runs
        for step in (lambda h: _start_services(h, pids[h.index][1]), lambda h: prove_login(plan, h),
                     lambda h: wait_engine(h, pids[h.index][1])):
            _, errors = _parallel(step, plan.hosts)
            if errors:
                raise errors[0]
        if plan.slurm:
            slurm_up.start(slurm.plan_slurm(plan, cpus=os.cpu_count() or 1), {i: p[1] for i, p in pids.items()}, echo)
        Path(plan.cluster_file).write_text(plan.cluster_yaml())
        up_seconds = round(time.monotonic() - started, 2)
        echo(f"{len(plan.hosts)} host(s) up in {up_seconds:.1f} s: "
             + ", ".join(f"{h.address} ({h.devices} NPUs)" for h in plan.hosts))
        state = state_of(plan, "starting", pids, up_seconds=up_seconds)
        state.save()
        image_seconds = None
        if plan.image and load_image is not None:
            image_seconds = round(load_image(state, echo), 2)
        state = state_of(plan, "up", pids, up_seconds=up_seconds, image_seconds=image_seconds)
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


def ssh_argv(plan: TestbedPlan, h: HostPlan, *command: str) -> list[str]:
    """ssh to a host as the cluster file says: the testbed's key, its known_hosts, nothing asked."""
    return ["ssh", "-i", plan.identity_file, "-o", f"UserKnownHostsFile={plan.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
            "-o", "IdentitiesOnly=yes", "-F", "/dev/null", "--", f"root@{h.address}", *command]


def prove_login(plan: TestbedPlan, h: HostPlan, tries: int = 3) -> None:
    """A host is up only once root logs in to it with the testbed's own key (`ssh HOST true`)."""
    for attempt in range(tries):
        proc = _run(ssh_argv(plan, h, "true"), f"{h.address}: ssh", timeout=30, check=False)
        if proc.returncode == 0:
            return
        if proc.returncode != 255 or "Permission denied" in proc.stderr:
            break
        time.sleep(0.5 * (attempt + 1))
    said = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    log = Path(h.dir, "sshd.log").read_text(errors="replace").splitlines() if Path(h.dir, "sshd.log").exists() else []
    refused = [line for line in log if "refused" in line.lower() or "bad ownership" in line.lower()]
    raise RlboxError(f"{h.address}: root cannot log in with the testbed's key ({said[:160]}"
                     + (f"; sshd: {refused[-1].strip()[:200]}" if refused else "") + ")")


def _init_pid(h: HostPlan, holder: subprocess.Popen, timeout: float = 300) -> int:
    """Wait for a host's init to have set the host up; its PID in this machine's numbering. Waited for
    while its holder runs (it says a failure by exiting, at once); ``timeout`` only bounds a hung one."""
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
    """Start a host's dockerd and sshd (the engine is waited for by wait_engine)."""
    launch_engine(h, init_pid)
    start_sshd(h, init_pid)


def start_engine(h: HostPlan | HostState, init_pid: int) -> None:
    """Start a host's dockerd inside it and wait until it answers on its socket."""
    launch_engine(h, init_pid)
    wait_engine(h, init_pid)


def launch_engine(h: HostPlan | HostState, init_pid: int) -> None:
    argv = (h if isinstance(h, HostPlan) else _host_plan(h)).dockerd_argv(_proven_init(h, init_pid))
    with open(Path(h.dir) / "dockerd.log", "ab") as log:
        _run_logged(argv, log, f"{h.address}: dockerd")


def wait_engine(h: HostPlan | HostState, init_pid: int) -> None:
    """Wait until a host's dockerd answers on its socket (see wait_for)."""
    wait_for(h, init_pid, lambda: engine_answers(h.socket), ("dockerd",), "dockerd", "dockerd.log")


def wait_for(h: HostPlan | HostState, init_pid: int, answers: Callable[[], bool], names: tuple[str, ...], what: str,
             log: str, timeout: float = 300, gone_for: float = 5) -> None:
    """Wait until a host's daemon answers, for as long as it runs: on a loaded machine a dockerd's start
    takes minutes. One that has not been running for ``gone_for`` s (it exited) is said then, with its
    log's last line; ``timeout`` only bounds a daemon that runs and never answers."""
    init = _proven_init(h, init_pid)
    deadline = time.monotonic() + timeout
    seen = time.monotonic()
    while not answers():
        now = time.monotonic()
        if host_runs(init, (*names, "setsid", "nsenter")):
            seen = now
        if now > deadline or now - seen > gone_for:
            tail = Path(h.dir, log).read_text(errors="replace").strip().splitlines() if Path(h.dir, log).exists() else []
            why = f"did not answer in {timeout:.0f} s" if now > deadline else "exited before it answered"
            raise RlboxError(f"{h.address}: {what} {why} ({tail[-1] if tail else 'no log'}; see {h.dir}/{log})")
        time.sleep(0.1)


def host_runs(init_pid: int, names: tuple[str, ...]) -> bool:
    """A live process of one of these names runs in the host of ``init_pid``."""
    return any(name in names and state != "Z" for _, name, state, _ in _host_procs(init_pid))


def _host_procs(init_pid: int | None):
    """(pid, name, state, ppid) of each process in the host of ``init_pid``."""
    for pid in in_host(init_pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        yield pid, stat[stat.index("(") + 1:stat.rindex(")")], rest[0], int(rest[1])


def start_sshd(h: HostPlan | HostState, init_pid: int) -> None:
    argv = (h if isinstance(h, HostPlan) else _host_plan(h)).sshd_argv(_proven_init(h, init_pid))
    with open(Path(h.dir) / "sshd.out", "ab") as log:
        _run_logged(argv, log, f"{h.address}: sshd")
    wait_for(h, init_pid, lambda: port_answers(h.address, 22), ("sshd",), f"sshd on {h.address}:22", "sshd.log")


def _proven_init(h: HostPlan | HostState, init_pid: int) -> int:
    """The pid to enter a host by: for a host read back from a record, the host's init as found by
    looking (a record's init_pid is only a claim)."""
    if isinstance(h, HostPlan):
        return init_pid
    init = host_init(h)
    if init is None:
        raise RlboxError(f"{h.address}: no init of host {h.index} is running (looked); `rlbox testbed status` says more")
    return init


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
def host_process(h: HostState, comm: str) -> int | None:
    """The host's daemon of this name (dockerd; sshd's listener, the child of the host's init)."""
    init = host_init(h)
    for pid, name, _, ppid in _host_procs(init):
        if name == comm and (comm != "sshd" or ppid == init):
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


def _host_state(root: str, name: str, index: int) -> HostState:
    """A host as `up` makes it (names and folder from the testbed's name and root), for stopping it."""
    return HostState(index=index, address="0.0.0.0", netns=f"rlbox-{name}-h{index}", veth=f"rlbox-{name}-h{index}",
                     dir=f"{root.rstrip('/')}/{name}/h{index}", devices=0, driver=tbplan.DEFAULT_DRIVER)


def _stop_host(h: HostState) -> None:
    """Stop the host's engine, then kill what is provably the host's: its init (PID 1 of its PID
    namespace: the kernel ends the rest), its holder, anything in its network namespace."""
    stop_engine(h)
    root, name = root_name(h)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = [p for p in look(root, name).get(h.index, []) if _alive(p.pid)]
        if not found:
            break
        init = trust.init_of(found, h.dir, machine())
        for pid in ([init] if init else []) + [p.pid for p in found if p.pid != init]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)
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


def _present_hosts(root: str, name: str) -> list[int]:
    """The host indices of which anything exists: a process, a namespace, a link, a folder, a cgroup."""
    netns, links, procs = netns_list(), link_kinds(), look(root, name)
    cgroups = [d for d in Path("/sys/fs/cgroup").iterdir() if d.is_dir()] + [Path("/sys/fs/cgroup")]
    return [h.index for h in host_facts(root, name)
            if h.index in procs or h.netns in netns or h.netns in links
            or any((c / h.netns).exists() for c in cgroups)]


def teardown(state: TestbedState | None, echo: Echo, *, root: str | None = None, name: str | None = None) -> list[str]:
    """Stop every host, remove the network and the folder: only what is provably the testbed's
    (names derived from its name, processes that prove it, links of the kind `up` makes), whatever
    its record says. Returns what is left (nothing, normally), from looking."""
    root = (root if state is None else state.root).rstrip("/")
    name = name if state is None else state.name
    hosts = [_host_state(root, name, i) for i in _present_hosts(root, name)]
    _parallel(_stop_host, hosts)
    links = link_kinds()
    for h in host_facts(root, name):
        if h.netns in netns_list():
            _run(["ip", "netns", "delete", h.netns], "netns", check=False)
        if links.get(h.netns) == "veth":
            _run(["ip", "link", "delete", h.netns], "veth", check=False)
    if link_kinds().get(f"rlbox-{name}") == "bridge":
        _run(["ip", "link", "delete", f"rlbox-{name}"], "bridge", check=False)
    rule = tbplan.TestbedPlan(name, root, "", "", ()).forward_rule()
    while _run(["iptables", "-C", *rule], "iptables", check=False).returncode == 0:
        _run(["iptables", "-D", *rule], "iptables", check=False)
    if testbed_folder(f"{root}/{name}", name):
        shutil.rmtree(f"{root}/{name}", ignore_errors=True)
    try:
        Path(root).rmdir()  # the root folder too, when no other testbed is in it
    except OSError:
        pass
    left = leftovers(root=root, name=name)
    for line in left:
        echo(f"left: {line}")
    return left


def down(root: str, name: str, echo: Echo) -> list[str]:
    """Take testbed NAME down. Its record is read (one line when it is not what `up` writes) but
    never decides what is killed or deleted: looking does (``teardown``). A record not trusted
    ends non-zero, naming its file and field, after what is the testbed's was taken down."""
    requirements()
    root = root.rstrip("/") or "/"
    path = path_for(root, name)
    untrusted = None
    try:
        state = load(root, name)
    except RlboxError as err:
        if not path.exists():
            if not leftovers(root=root, name=name):
                raise
            echo(f"no record {path}; taking down what is provably testbed {name}'s")
        else:
            untrusted = str(err).split("; ")[0]
            echo(f"{untrusted}: not what `rlbox testbed up` writes; taking down only what is provably testbed {name}'s")
        state = None
    left = teardown(state, echo, root=root, name=name)
    if left:
        raise RlboxError(f"testbed {name}: {len(left)} thing(s) left after down: {left[0]}")
    if untrusted:
        raise RlboxError(f"{untrusted} (the record was not trusted; testbed {name} is down all the same: looked, "
                         "nothing of it left)")
    echo(f"testbed {name} is down: no namespace, link, process, mount or folder of it left (looked)")
    return left


def testbed_folder(folder: str, name: str) -> bool:
    """Whether FOLDER holds only what `up` puts there (so that `down` may delete it)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return False
    return all(trust.made_by_up(e, name) for e in entries)


def leftovers(state: TestbedState | None = None, *, root: str | None = None, name: str | None = None) -> list[str]:
    """Whatever of the testbed still exists, by looking: namespaces and links named as `up` names
    them, processes that prove they are its hosts', mounts and the folder under ROOT/NAME, cgroups,
    the firewall rule."""
    root = (root if state is None else state.root).rstrip("/")
    name = name if state is None else state.name
    folder = f"{root}/{name}"
    hosts = host_facts(root, name)
    netns, links = netns_list(), link_kinds()
    left = [f"network namespace {h.netns}" for h in hosts if h.netns in netns]
    left += [f"link {n}" for n in [f"rlbox-{name}", *(h.netns for h in hosts)] if n in links]
    for index, procs in sorted(look(root, name).items()):
        left += [f"process {p.pid} of host {index} ({' '.join(p.argv)[:60] or '?'})" for p in procs if _alive(p.pid)]
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {line.split()[4]}" for line in mounts.splitlines()
             if line.split()[4] == folder or line.split()[4].startswith(folder + "/")]
    for d in [Path("/sys/fs/cgroup"), *(x for x in Path("/sys/fs/cgroup").iterdir() if x.is_dir())]:
        left += [f"cgroup {d / h.netns}" for h in hosts if (d / h.netns).exists()]
    rule = tbplan.TestbedPlan(name, root, "", "", ()).forward_rule()
    if _run(["iptables", "-C", *rule], "iptables", check=False).returncode == 0:
        left.append(f"iptables rule {' '.join(rule)}")
    if Path(folder).exists():
        left.append(f"folder {folder}" + ("" if testbed_folder(folder, name) else
                                          " (not deleted: it holds what `rlbox testbed up` does not make)"))
    return left


# -- status --------------------------------------------------------------------------------------
def status(root: str, name: str) -> list[dict]:
    state = load(root, name)
    found = look(state.root, state.name)
    rows = []
    for h in state.hosts:
        alive = trust.init_of(found.get(h.index, []), h.dir, machine()) is not None
        rows.append({"host": h.index, "address": h.address, "netns": h.netns, "alive": alive,
                     "engine": engine_answers(h.socket), "sshd": port_answers(h.address, 22),
                     "devices": h.devices, "driver": h.driver, "socket": h.socket})
    return rows


def record(root: str, name: str) -> dict:
    return json.loads(path_for(root, name).read_text())
