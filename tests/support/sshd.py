"""A throwaway OpenSSH server on loopback, so tests can reach "a remote host" that is this machine.

    with SshServer(tmp_path) as srv:
        subprocess.run(srv.ssh_argv("echo", "ok"), check=True)
        subprocess.Popen(srv.ssh_argv(options=["-N", "-L", f"{sock}:/var/run/docker.sock"]))

Everything lives in `workdir`: a fresh ed25519 host key and client key, authorized_keys,
known_hosts, sshd_config, the pid file and sshd's log. The user's ~/.ssh, /etc/ssh and the
system sshd are never touched. Needs /usr/sbin/sshd (Debian: openssh-server) and ssh/ssh-keygen
(openssh-client), and must run as root (sshd privilege separation).
"""

from __future__ import annotations

import ctypes
import getpass
import os
import pathlib
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = pathlib.Path("/run/sshd")
START_TIMEOUT = 10.0


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _keygen(path: pathlib.Path, comment: str) -> None:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)  # ssh-keygen would ask before overwriting
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, capture_output=True)


def _password_locked(user: str) -> bool:
    """Whether user's shadow entry is locked ("!..."): sshd without PAM then refuses even keys."""
    try:
        for line in pathlib.Path("/etc/shadow").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == user:
                return rest.startswith("!")
    except OSError:
        pass
    return False


def _die_with_parent() -> None:
    """preexec_fn: sshd gets SIGTERM if the test process dies without running __exit__."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _children() -> dict[int, list[int]]:
    """ppid -> live (non-zombie) child pids, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _alive(int(entry)):
            try:
                ppid = int(pathlib.Path("/proc", entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def _descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    children = _children() if children is None else children
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _reaped(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def _end_tree(root: int, timeout: float = 5.0) -> None:
    """End root's descendants, leaves first, each while its parent still lives to reap it (so
    nothing is orphaned, not even as a zombie under an init that does not reap)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = _children()
        leaves = [pid for pid in _descendants(root, children) if not children.get(pid)]
        if not leaves:
            break
        for pid in leaves:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        step = min(deadline, time.monotonic() + 2)
        while not all(map(_reaped, leaves)) and time.monotonic() < step:
            time.sleep(0.02)
    for pid in _descendants(root):  # out of time: no more courtesy
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SshServer:
    host: str = "127.0.0.1"

    def __init__(self, workdir: pathlib.Path):
        self.workdir = pathlib.Path(workdir).resolve()
        self.user = getpass.getuser()
        self.port = 0
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self.identity_file = self.workdir / "id_ed25519"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.known_hosts = self.workdir / "known_hosts"
        self.config = self.workdir / "sshd_config"
        self.pid_file = self.workdir / "sshd.pid"
        self.log = self.workdir / "sshd.log"
        self.proc: subprocess.Popen | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> "SshServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        _keygen(self.host_key, "rlbox-test-host")
        _keygen(self.identity_file, f"rlbox-test-{self.user}")
        self.authorized_keys.write_text(self.identity_file.with_name("id_ed25519.pub").read_text())
        host_pub = " ".join(self.host_key.with_name(self.host_key.name + ".pub").read_text().split()[:2])
        try:
            for attempt in range(3):  # the free port may be taken between probe and bind
                self.port = _free_port(self.host)
                self.known_hosts.write_text(f"[{self.host}]:{self.port} {host_pub}\n")
                self.config.write_text(self._sshd_config())
                if self._start():
                    return self
                if "Address already in use" not in self._log_text() or attempt == 2:
                    break
            raise RuntimeError(f"sshd did not come up on {self.host}:{self.port}:\n{self._log_text()}")
        except BaseException:
            self._stop()
            raise

    def __exit__(self, *exc) -> None:
        self._stop()

    def _sshd_config(self) -> str:
        q = lambda p: f'"{p}"'  # noqa: E731  (sshd_config accepts double-quoted paths)
        return "\n".join([
            f"ListenAddress {self.host}",
            f"Port {self.port}",
            f"HostKey {q(self.host_key)}",
            f"PidFile {q(self.pid_file)}",
            f"AuthorizedKeysFile {q(self.authorized_keys)}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # UsePAM no keeps PAM's session modules out; but without PAM, sshd rejects a
            # locked account ("root:!..." after `passwd -l`) even for keys, and PAM does not.
            f"UsePAM {'yes' if _password_locked(self.user) else 'no'}",
            "StrictModes no",
            "AllowStreamLocalForwarding yes",
            "AllowTcpForwarding yes",
            "PermitUserEnvironment no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            "MaxStartups 100",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            "LogLevel ERROR",
            "",
        ])

    def _start(self) -> bool:
        """Start sshd and wait for its banner; False (sshd stopped) if it does not come up."""
        self._stop()
        with open(self.log, "wb") as log:  # a file, not a pipe: nobody has to drain it
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as s:
                    s.settimeout(max(0.1, deadline - time.monotonic()))
                    banner = b""
                    while b"\n" not in banner:
                        chunk = s.recv(256)
                        if not chunk:
                            break
                        banner += chunk
                    if banner.startswith(b"SSH-"):
                        s.sendall(b"SSH-2.0-rlbox-probe\r\n")  # else sshd logs a kex error
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        self._stop()
        return False

    def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        # Per-connection sshd processes (and the sessions under them, e.g. an `ssh -N -L`
        # forward a test left open) setsid() and outlive the listener: end that tree first.
        if proc.poll() is None:
            _end_tree(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace").strip() or "(sshd wrote nothing)"
        except OSError:
            return "(no sshd log)"

    # -- client side -----------------------------------------------------------------------

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}"

    def ssh_options(self) -> list[str]:
        """Client options (no destination) that reach this server and nothing else."""
        return [
            "-F", "none",  # ignore ~/.ssh/config and /etc/ssh/ssh_config (and never create ~/.ssh)
            "-i", str(self.identity_file),
            "-p", str(self.port),
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes",
        ]

    def ssh_argv(self, *remote_cmd: str, options: Sequence[str] = ()) -> list[str]:
        """`ssh ... user@127.0.0.1 -- cmd`; `options` (e.g. ["-N", "-L", "a.sock:/b.sock"]) go
        before the destination. As with plain ssh, the remote shell gets the words of remote_cmd
        joined by spaces: shlex.quote() arguments that must stay one word."""
        return ["ssh", *self.ssh_options(), *options, self.destination, "--", *map(str, remote_cmd)]
