"""A shell on a remote host, kept on the ssh session that already carries its engine's tunnel.

Every ssh session costs the launcher and the host a key exchange, an authentication and the
user's shell start-up (bash reads ``~/.bashrc`` under sshd): ~170 ms of CPU measured on a testbed
host (docs/benchmarks.md). The tunnel to a host's Docker engine is a session rlbox holds anyway,
and its remote command only waited for its stdin to close (``cat``: the tunnel ends with the rlbox
that opened it). Here that command is a small shell that reads scripts from its stdin and runs them
one at a time: the pre-flight's reads and its ping round go over it, not over sessions of their own.
The tunnel still ends with its rlbox: a closed stdin ends the shell, and with it the session.

Framing: a random token per session ends each script (a line of its own) and each answer (the
script's status after it); no script rlbox sends holds it, and a host cannot guess it. A script's
stdout and stderr come back together (rlbox's scripts capture each command's own, ``batch_script``).
An answer not complete within its timeout leaves the shell unusable (its output no longer framed):
``run`` then raises, and callers fall back to an ssh session of their own.
"""

from __future__ import annotations

import os
import secrets
import selectors
import subprocess
import threading
import time

# $1: the token. Says "TOKEN ready BOOT_ID" once (the host kernel's boot id, read by the shell itself: which
# machine's CPUs the host's containers share; empty when unreadable), then for each script (its lines, then
# a line TOKEN): runs it with no stdin, then prints a newline and "TOKEN STATUS". Fixed text: scripts are data
# read. One line, no single quote: the user's login shell parses it first (csh and tcsh refuse a newline
# inside quotes). A script must not leave background jobs writing: their output would join the next answer.
BOOT_ID = "/proc/sys/kernel/random/boot_id"  # one a running kernel: hosts that share it share one machine's CPUs
SHELL = ('tok=$1; nl=$(printf "\\n_"); nl=${nl%_}; b=; read -r b 2>/dev/null <' + BOOT_ID + ' || b=; '
         'printf "%s ready %s\\n" "$tok" "$b"; '
         'while :; do s=; while :; do IFS= read -r l || exit 0; [ "$l" = "$tok" ] && break; s="$s$l$nl"; done; '
         'sh -c "$s" </dev/null 2>&1; printf "\\n%s %s\\n" "$tok" "$?"; done')


def new_token() -> str:
    return "rlbox-agent-" + secrets.token_hex(8)


def argv(token: str) -> list[str]:
    """The remote command of a tunnel that carries a shell."""
    return ["sh", "-c", SHELL, "rlbox-agent", token]


class Agent:
    """The shell at the far end of one ssh process (its stdin and stdout, as bytes)."""

    def __init__(self, proc: subprocess.Popen, token: str, host: str):
        self.proc, self.token, self.host = proc, token.encode(), host
        self.lock = threading.Lock()
        self.buffer = b""
        self.ready = False
        self.broken: str | None = None
        self.boot_id: str | None = None  # the host kernel's boot id, as the shell said when it began ("": unreadable)

    def _read_until(self, mark: bytes, deadline: float, timeout: float) -> bytes:
        """Bytes up to and including ``mark``; the rest stays buffered."""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:  # poll or epoll: select() fails on descriptors past 1023
            sel.register(fd, selectors.EVENT_READ)
            while mark not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(f"ssh {self.host}", timeout)
                if sel.select(min(left, 1.0)):
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        raise subprocess.SubprocessError(f"ssh {self.host}: the session ended")
                    self.buffer += chunk
        at = self.buffer.index(mark) + len(mark)
        out, self.buffer = self.buffer[:at], self.buffer[at:]
        return out

    def _began(self, deadline: float, timeout: float) -> None:
        """The shell's first line read (once): whatever the user's shell printed before it is dropped."""
        if not self.ready:
            self._read_until(self.token + b" ready ", deadline, timeout)
            self.boot_id = self._read_until(b"\n", deadline, timeout).decode(errors="replace").strip()[:64]
            self.ready = True

    def machine(self, timeout: float = 10) -> str | None:
        """The host kernel's boot id (None: unreadable there, or the shell not answering)."""
        with self.lock:
            if not self.ready and not self.broken:
                try:
                    self._began(time.monotonic() + timeout, timeout)
                except BaseException as err:  # an interrupt too: the first line half read leaves it unusable
                    self.broken = "the shell on the tunnel did not begin"
                    if isinstance(err, (KeyboardInterrupt, SystemExit)):
                        raise
        return self.boot_id or None

    def run(self, script: str, timeout: float) -> tuple[int, str]:
        """(status, stdout and stderr) of ``script`` run by ``sh`` on the host."""
        with self.lock:
            if self.broken:
                raise subprocess.SubprocessError(f"ssh {self.host}: {self.broken}")
            deadline = time.monotonic() + timeout
            try:
                self._began(deadline, timeout)
                self.proc.stdin.write(script.encode() + b"\n" + self.token + b"\n")
                self.proc.stdin.flush()
                out = self._read_until(b"\n" + self.token + b" ", deadline, timeout)
                status = self._read_until(b"\n", deadline, timeout)
            except BaseException as err:  # an interrupt too: an answer left unread would be the next one's
                self.broken = f"the shell on the tunnel stopped answering ({type(err).__name__})"
                if isinstance(err, (subprocess.SubprocessError, KeyboardInterrupt, SystemExit)):
                    raise
                raise subprocess.SubprocessError(f"ssh {self.host}: {self.broken}") from None
            text = out[: -len(b"\n" + self.token + b" ")].decode(errors="replace")
            try:
                return int(status.strip()), text
            except ValueError:
                self.broken = "the shell on the tunnel answered out of frame"
                raise subprocess.SubprocessError(f"ssh {self.host}: {self.broken}") from None
