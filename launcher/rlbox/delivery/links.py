"""The launcher's connections while a delivery runs: the ssh agent a chain forwards (nodes ssh to
each other with rlbox's key, never a copy of it), and one ssh master per node.

The first session this machine opens to a node (the gather's) leaves its connection open as a
master (ssh's ControlMaster=auto, ControlPersist) in a private directory of this machine; every
later session of the same delivery to that node (the stream's first hop, the senders' warm-ups,
the verify, a pull, the report after a failure) is a session on it, with no key exchange of its
own (~170 ms of CPU each here, and on the path every node waits for). The masters end with the
delivery (``Links.close``: ``ssh -O exit``), or, if this process is killed, PERSIST seconds after
their last session. When a chain may need the agent, the masters are made with it
(ForwardAgent=yes: a master forwards the agent to a session through it only when its own
options say so), so the gather's session has it too, as the chain's nodes do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlbox.cluster.hosts import on_every
from rlbox.cluster.spec import Host

PERSIST = 60  # seconds a master outlives its last session (only when this process died before closing it)
SOCKET_MAX = 107  # characters of a unix socket's path (108 bytes with the NUL on Linux)
# after the directory: "/", ssh's %C (40), and while ssh binds the socket a temporary ".XXXXXXXXXXXXXXXX" (17;
# OpenSSH's muxserver_listen binds that name, then renames it): a longer path and ssh exits 255
SOCKET_SUFFIX = 1 + 40 + 17
MAX_SESSIONS = 10  # sshd's default MaxSessions: sessions at once on one connection


@dataclass
class Agent:
    env: dict[str, str]
    pid: int | None = None
    workdir: tempfile.TemporaryDirectory | None = None

    def close(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, 15)
            except ProcessLookupError:
                pass
        if self.workdir is not None:
            self.workdir.cleanup()


def engine_key(host: Host) -> tuple:
    """Nodes with one key share one engine (the simulation's nodes, a host named twice)."""
    return ("local",) if host.local else (host.ssh_user, host.name, host.ssh_port)


def captured(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``argv`` run to its end, its output captured; a missing program exits 127, no answer in time 124."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env, timeout=timeout)
    except FileNotFoundError as err:
        return subprocess.CompletedProcess(argv, 127, "", f"{err.filename}: not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer in {timeout:.0f} s")


def agent_for(hosts: list[Host]) -> Agent | None:
    """A private ssh-agent holding the cluster file's key(s) for the length of the delivery, else
    the user's own agent (SSH_AUTH_SOCK); None when there is neither."""
    keys = sorted({os.path.expanduser(h.identity_file) for h in hosts if h.identity_file})
    if not keys:
        return Agent(dict(os.environ)) if os.environ.get("SSH_AUTH_SOCK") else None
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        return None
    workdir = tempfile.TemporaryDirectory(prefix="rlbox-agent-")
    sock = os.path.join(workdir.name, "agent.sock")
    proc = captured(["ssh-agent", "-s", "-a", sock], timeout=20)
    pid = next((int(p.split(";")[0].split("=")[1]) for p in proc.stdout.split()
                if p.startswith("SSH_AGENT_PID=")), None)
    agent = Agent(dict(os.environ, SSH_AUTH_SOCK=sock), pid, workdir)
    added = captured(["ssh-add", "-q", *keys], env=agent.env, timeout=20)
    if proc.returncode != 0 or pid is None or added.returncode != 0:
        agent.close()
        return None
    return agent


@dataclass
class Links:
    """What every ssh this machine runs during one delivery gets: ``env`` (the agent's socket) and
    ``options`` (through the node's master, made by the first session when not there yet)."""

    agent: Agent | None = None
    masters: str | None = None  # the directory of the masters' sockets; None: every session connects anew

    @property
    def env(self) -> dict[str, str]:
        return self.agent.env if self.agent else dict(os.environ)

    def options(self, chain: bool = True) -> tuple[str, ...]:
        """``chain``: a session of the chain (the gather, which makes the master, a stream's sessions):
        it gets the agent when there is one. Otherwise (pulls, the verify, the report after a failure)
        through a master when there is one, never making one, never with the agent."""
        if self.masters is None:
            return ()
        path = ("-o", f"ControlPath={self.masters}/%C")
        if not chain:
            return ("-o", "ControlMaster=no", *path, "-o", "ForwardAgent=no")
        forward = ("-o", "ForwardAgent=yes") if self.agent else ()
        return ("-o", "ControlMaster=auto", *path, "-o", f"ControlPersist={PERSIST}", *forward)

    def close(self) -> None:
        """End every master there is (each socket in the directory, whichever session made it), then the
        agent; the agent and the directory go however the masters' ending ends."""
        masters, self.masters = self.masters, None
        try:
            if masters is not None:
                _end_masters(masters)
        finally:
            if self.agent is not None and self.agent.pid:
                self.agent.close()
            self.agent = None


def _end_masters(masters: str) -> None:
    """``ssh -O exit`` to each master's socket in ``masters``, then the directory goes (however that ends)."""
    try:
        sockets = [os.path.join(masters, name) for name in sorted(os.listdir(masters))]
    except OSError:  # gone (a tmp cleaner): the sockets with it; their masters end PERSIST after their last session
        sockets = []
    try:
        # the socket's path is the whole address (no config read: the host word is never resolved)
        on_every(lambda sock: captured(["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}", "-O", "exit",
                                        "--", "rlbox-master"], timeout=20), sockets)
    finally:
        shutil.rmtree(masters, ignore_errors=True)


def _masters_dir() -> str | None:
    """A directory only this user can enter, short enough for a socket path; None: none can be made."""
    for base in (None, "/tmp"):
        try:
            path = tempfile.mkdtemp(prefix="rlbox-mux-", dir=base)
        except OSError:
            continue
        if len(path) + SOCKET_SUFFIX <= SOCKET_MAX:
            return path
        os.rmdir(path)
    return None


@contextmanager
def links_for(hosts: tuple[Host, ...] | list[Host], agent: bool = True) -> Iterator[Links]:
    """The links of one delivery to ``hosts``. ``agent``: the delivery may be a chain (``--via chain``),
    so with two nodes over ssh or more the agent is started now, before the first session (the
    masters forward it); never with ``--via launcher``, which forwards no agent to any node."""
    remote = [h for h in hosts if not h.local]
    engines = {engine_key(h) for h in remote}  # a host named twice is one node to reach
    links = Links()
    try:
        links.masters = _masters_dir() if remote and shutil.which("ssh") else None
        links.agent = agent_for(remote) if agent and len(engines) > 1 else None
        yield links
    finally:
        links.close()
