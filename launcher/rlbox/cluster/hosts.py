"""Reaching hosts: the local Docker engine, or a remote one through an SSH tunnel.

A remote engine is reached by forwarding a local unix socket to the host's
``/var/run/docker.sock`` with ``ssh -L`` (argv lists, never a shell string), so every ssh
option (port, identity, known_hosts, batch mode, timeouts) is ours to set and a failure names
the host. That session's remote command is rlbox.cluster.agent's shell, which runs the scripts
rlbox needs on the host (its NPU count, the pre-flight) without a session of their own. The same
tunnel mechanism forwards the Ray dashboard of a remote head.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlbox.cluster import agent
from rlbox.cluster.agent import Agent
from rlbox.cluster.spec import Host, check_name
from rlbox.core import engine
from rlbox.core.errors import RlboxError

DOCKER_SOCKET = "/var/run/docker.sock"
SSH_CONNECT_TIMEOUT = 10


def ssh_base(host: Host) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT}",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
    if host.ssh_port:
        argv += ["-p", str(host.ssh_port)]
    if host.identity_file:
        argv += ["-i", os.path.expanduser(host.identity_file), "-o", "IdentitiesOnly=yes"]
    if host.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={os.path.expanduser(host.known_hosts)}", "-o", "StrictHostKeyChecking=yes"]
    return argv


def ssh_target(host: Host) -> str:
    """``[user@]host``, checked: never something ssh could read as an option."""
    check_name(host.name)
    if host.ssh_user is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}", host.ssh_user):
        raise RlboxError(f"{host.name}: ssh user {host.ssh_user!r} is not a user name")
    return f"{host.ssh_user}@{host.name}" if host.ssh_user else host.name


def ssh_argv(host: Host, *options: str, command: tuple[str, ...] | list[str] = ()) -> list[str]:
    """``ssh OPTIONS... -- [user@]host COMMAND...``: the ``--`` ends ssh's options, so no host
    name reaches ssh as one."""
    return [*ssh_base(host), *options, "--", ssh_target(host), *command]


@dataclass
class Tunnel:
    """One `ssh -L` forward (its session ends with this process); closed with the node."""

    proc: subprocess.Popen
    local: str
    workdir: tempfile.TemporaryDirectory | None = None
    agent: Agent | None = None  # the shell its session carries (the engine's tunnel), for scripts on the host

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        if self.workdir is not None:
            self.workdir.cleanup()


def _open_tunnel(host: Host, forward: str, ready, local: str, workdir=None, timeout: float = 20,
                 shell: bool = False) -> Tunnel:
    # The remote command reads the tunnel's stdin, a pipe only this process holds: when this process
    # dies (kill -9 included) the pipe closes, `cat` on the host ends and so does ssh; no tunnel outlives
    # the rlbox that opened it (with -N it would, for as long as the host answers). With ``shell`` the
    # command is rlbox.cluster.agent's shell, which ends the same way and runs scripts meanwhile.
    token = agent.new_token() if shell else None
    remote = (shlex.join(agent.argv(token)),) if token else ("cat",)
    argv = ssh_argv(host, "-o", "ExitOnForwardFailure=yes", "-L", forward, command=remote)
    try:  # its own session: a Ctrl-C at the terminal must not kill the tunnel teardown needs
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE if token else subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as err:
        if workdir is not None:
            workdir.cleanup()
        raise RlboxError(f"{host.name}: cannot run ssh ({err.strerror}); install openssh-client") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() or b"").decode(errors="replace").strip().splitlines()
            if workdir is not None:
                workdir.cleanup()
            reason = err[-1] if err else f"ssh exited with {proc.returncode}"
            raise RlboxError(f"{host.name}: cannot reach over ssh ({reason}); check the host, its ssh port and key")
        if ready():
            return Tunnel(proc, local, workdir, agent.Agent(proc, token, host.name) if token else None)
        time.sleep(0.05)
    proc.kill()
    if workdir is not None:
        workdir.cleanup()
    raise RlboxError(f"{host.name}: ssh tunnel did not come up in {timeout:.0f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Node:
    """A connection to one host's Docker engine."""

    host: Host
    client: object
    tunnels: list[Tunnel] = field(default_factory=list)

    @property
    def agent(self) -> Agent | None:
        """The shell on the engine tunnel's session (None: a local host)."""
        return next((t.agent for t in self.tunnels if t.agent is not None), None)

    def machine(self) -> str | None:
        """The boot id of the kernel this node's containers run on (None: not known). Nodes that share
        one share a machine's CPUs: the local engine's nodes (a simulation), the testbed's hosts."""
        if self.host.local:
            try:
                return Path(agent.BOOT_ID).read_text().strip() or None
            except OSError:
                return None
        shell = self.agent
        return shell.machine() if shell is not None else None

    def dashboard(self, head: str, port: int, sim: bool) -> str:
        """The Ray dashboard of a cluster whose head is this node: a simulation publishes it
        on this machine's loopback; a real head is reached through ``forward``."""
        return f"http://127.0.0.1:{port}" if sim else self.forward(head, port)

    def forward(self, address: str, port: int) -> str:
        """A local URL reaching ``address:port`` as seen from this host."""
        if self.host.local:
            return f"http://{address}:{port}"
        local = _free_port()
        tunnel = _open_tunnel(self.host, f"127.0.0.1:{local}:{address}:{port}", lambda: _port_open(local), str(local))
        self.tunnels.append(tunnel)
        return f"http://127.0.0.1:{local}"

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass
        for t in self.tunnels:
            t.close()


# A connection opened to count a host's NPUs (count_devices, before the plan exists) is kept for the
# connect that follows in this process (the run's own, a server's), taken once: one ssh session a host
# for both instead of two. One left untaken ends with this process (its tunnel's stdin closes).
_kept: dict[tuple, Node] = {}
_kept_lock = threading.Lock()


def _reach(host: Host) -> tuple:
    return (host.name, host.ssh_user, host.ssh_port, host.identity_file, host.known_hosts)


def _take_kept(host: Host) -> Node | None:
    with _kept_lock:
        node = _kept.pop(_reach(host), None)
    if node is not None and all(t.proc.poll() is None for t in node.tunnels):
        return node
    if node is not None:
        node.close()
    return None


def keep(node: Node) -> None:
    """Keep ``node`` for the next connect to its host in this process (one kept a host: an older one closes)."""
    with _kept_lock:
        old = _kept.pop(_reach(node.host), None)
        _kept[_reach(node.host)] = node
    if old is not None and old is not node:
        old.close()


def close_kept() -> None:
    """Close every kept connection (a start that stops after counting the hosts' NPUs)."""
    with _kept_lock:
        nodes = list(_kept.values())
        _kept.clear()
    for node in nodes:
        node.close()


def connect(host: Host) -> Node:
    import docker
    from docker.errors import DockerException

    if host.local:
        return Node(host, engine.local_client(host.name))
    kept = _take_kept(host)
    if kept is not None:
        return replace(kept, host=host)
    workdir = tempfile.TemporaryDirectory(prefix="rlbox-ssh-")
    sock = str(Path(workdir.name) / "docker.sock")
    tunnel = _open_tunnel(host, f"{sock}:{DOCKER_SOCKET}", lambda: os.path.exists(sock) and _accepts(sock), sock, workdir,
                          shell=True)
    try:
        client = docker.DockerClient(base_url=f"unix://{sock}", timeout=120)
        client.ping()
    except DockerException as err:
        tunnel.close()
        raise RlboxError(f"{host.name}: Docker engine not reachable over ssh ({str(err).splitlines()[0][:120]})") from None
    return Node(host, client, [tunnel])


# At most this many hosts are worked on at once (threads, ssh sessions being opened, engine calls in
# flight): bounded so that 1,000 hosts do not mean 1,000 threads and a burst of 1,000 ssh handshakes
# from the launcher at one instant (docs/benchmarks.md, the model to 1,000 nodes).
MAX_PARALLEL = 64


def width(items: int, limit: int = MAX_PARALLEL) -> int:
    """How many of ``items`` hosts run at once: all of them up to ``limit``, then ``limit``."""
    return max(1, min(items, limit))


def on_every(fn, items) -> tuple[list, list[RlboxError]]:
    """``fn`` on every item, up to MAX_PARALLEL at once (one thread each); results in order, and the
    errors, each an RlboxError (an unexpected exception becomes one, so no thread's failure is lost)."""
    pool = ThreadPoolExecutor(max_workers=width(len(items)))
    futures = [pool.submit(fn, item) for item in items]
    try:
        pool.shutdown(wait=True)
    except KeyboardInterrupt:  # let every step under way finish, so the cleanup after sees all it made
        engine.ignore_interrupts()
        pool.shutdown(wait=True)
        raise
    results, errors = [], []
    for item, f in zip(items, futures):
        try:
            results.append(f.result())
        except RlboxError as err:
            errors.append(err)
        except Exception as err:  # noqa: BLE001
            errors.append(RlboxError(f"{host_name_of(item)}: {type(err).__name__}: {' '.join(str(err).split())[:200]}"))
        else:
            continue
        errors[-1].host = host_name_of(item)  # the host it is about, for first_error
    return results, errors


class Call:
    """One call of ``fn(arg)`` on a daemon thread of its own (a hung one never holds the process's exit):
    ``done`` is set once it came back, with its ``result`` or its ``error``."""

    def __init__(self, fn, arg, began: float):
        self.began, self.result, self.error = began, None, None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(fn, arg), daemon=True).start()

    def _run(self, fn, arg) -> None:
        try:
            self.result = fn(arg)
        except BaseException as err:  # noqa: BLE001 - handed to whoever collects the call
            self.error = err
        finally:
            self.done.set()


def silent(node, within: float) -> bool:
    """Whether ``node``'s engine leaves its ping (/_ping: no container, no lock, answered at once even
    by a loaded engine) unanswered for ``within`` seconds: a host cut off the network, where every call
    waits until ssh's keep-alive gives the tunnel up (45-60 s). An engine that refuses is not silent."""
    return not Call(lambda n: n.client.ping(), node, time.monotonic()).done.wait(within)


def awaited(call: Call, node, patience: float, until: float | None = None) -> bool:
    """Whether ``call`` (one of ``node``'s engine calls) came back, waited for as long as that engine answers
    its ping (a loaded engine: slow, not lost): False once the ping too is silent for ``patience``, or at
    ``until`` (time.monotonic()'s clock)."""
    while not call.done.wait(patience if until is None else max(0.0, min(patience, until - time.monotonic()))):
        if (until is not None and time.monotonic() >= until) or silent(node, patience):
            return False
    return True


class Rounds:
    """Calls of ``fn`` on items, made a round at a time beside a watch that names an engine's silence: a
    round waits for the calls it makes at most ``wait`` seconds, and one that has not come back then holds
    nothing (an engine behind a cut network answers only at the client's timeout, 120 s) and is not made
    again for its item (by ``key``) until it has; the round that finds it back hands it over. One thread
    a call (at 1,000 nodes whose engines all hang, one a node and a kind of call: the watch's file budget,
    files_wanted, counts 64 a host)."""

    def __init__(self, fn, wait: float, key=lambda item: item):
        self.fn, self.wait, self.key = fn, wait, key
        self.out: dict = {}  # key -> (item, Call)

    def round(self, items) -> list:
        """(item, Call) of every call back by the end of this round: made now or in an earlier one."""
        waited = []
        for item in items:
            if self.key(item) not in self.out:
                self.out[self.key(item)] = (item, Call(self.fn, item, time.monotonic()))
                waited.append(self.out[self.key(item)][1])
        deadline = time.monotonic() + self.wait
        for call in waited:
            call.done.wait(max(0.0, deadline - time.monotonic()))
        back = [k for k, (_, call) in self.out.items() if call.done.is_set()]
        return [self.out.pop(k) for k in back]


def first_error(errors: list[RlboxError]) -> RlboxError:
    """The first of ``on_every``'s errors, naming the other hosts that had one (each error's ``host``), so a
    line about one host does not pass for all of them."""
    first = getattr(errors[0], "host", None)
    names = list(dict.fromkeys(n for n in (getattr(e, "host", None) for e in errors[1:]) if n and n != first))
    if not names:
        return errors[0]
    more = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return RlboxError(f"{errors[0]} (also on {more})", exit_code=errors[0].exit_code)


def host_name_of(item) -> str:
    """The host an ``on_every`` item is about (a node, a host, a (plan, node) pair), for its error line."""
    for part in item if isinstance(item, tuple) else (item,):
        name = getattr(getattr(part, "host", None), "name", None) or getattr(part, "name", None)
        if isinstance(name, str):
            return name
    return type(item).__name__


# Open files this process may need per host it holds: the ssh tunnel's process pipes and socket,
# the Docker client's pooled connections, the dashboard's. bench/bringup.py's process peaked at 215
# with 4 hosts up (~50 a host, docs/benchmarks.md): 1,000 hosts need ~64,000, over a soft 1024 but
# under a usual hard 65536 (or 1,048,576).
FILES_PER_HOST = 64
FILES_BASE = 256


def files_wanted(hosts: int, soft: int, hard: int, infinity: int = -1) -> int | None:
    """The soft open-files limit to raise this process to for ``hosts`` hosts (held under ``hard``),
    or None when ``soft`` already covers them."""
    want = FILES_BASE + FILES_PER_HOST * hosts
    if soft == infinity or soft >= want:
        return None
    return want if hard == infinity else (min(hard, want) if min(hard, want) > soft else None)


def raise_open_files(hosts: int) -> None:
    """Raise this process's soft open-files limit for ``hosts`` hosts, as far as the hard limit allows."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = files_wanted(hosts, soft, hard, resource.RLIM_INFINITY)
    if new is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def connect_all(hosts: tuple[Host, ...]) -> list[Node]:
    """Connect to every host in parallel; on any failure close the others and name the host."""
    raise_open_files(len(hosts))
    nodes, errors = on_every(connect, hosts)
    if errors:
        for n in nodes:
            n.close()
        raise errors[0]
    return nodes


_DAVINCI = re.compile(r"^davinci(\d+)$")


def count_devices(host: Host) -> int:
    """NPUs on a host: its /dev/davinci<N> nodes (A2 boxes come with 8 or 16)."""
    if host.local:
        names = os.listdir("/dev")
    else:  # over the engine tunnel's session, which the run then uses (kept)
        node = connect(host)
        try:
            status, out = node.agent.run("ls -1 /dev", timeout=SSH_CONNECT_TIMEOUT + 20)
        except subprocess.SubprocessError as err:
            node.close()
            raise RlboxError(f"{host.name}: cannot list /dev over ssh ({err})") from None
        if status != 0:
            node.close()
            raise RlboxError(f"{host.name}: cannot list /dev over ssh ({(out.strip().splitlines() or ['?'])[-1]})")
        keep(node)
        names = out.split()
    return sum(1 for n in names if _DAVINCI.match(n))
