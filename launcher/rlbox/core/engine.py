"""The container engine: one way to reach the local Docker engine, one way to say what it
refused, and the lifecycle rules every container rlbox starts follows (SIGTERM is Ctrl-C;
removal is best effort, never an error of its own)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
import tarfile
import threading
from collections.abc import Iterator

from rlbox.core.errors import RlboxError

LABEL_MANAGED = "io.rlbox.managed"  # every container rlbox starts carries it: "true"


def local_client(node: str | None = None):
    """A docker-py client of this machine's engine (DOCKER_HOST honoured), checked with a ping.
    ``node``: the cluster node it serves, named in the error."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as err:
        first = str(err).splitlines()[0]
        if node:
            raise RlboxError(f"{node}: Docker engine not reachable ({first[:120]}); start dockerd") from None
        raise RlboxError(f"Docker engine not reachable ({first[:160]}): start dockerd or set DOCKER_HOST") from None
    return client


# The errors of a connection to an engine that is not there (refused, reset, cut off, its socket
# file absent); any other OSError (a full disk, a permission) is no statement about the engine.
_UNREACHABLE = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                          errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENETUNREACH, errno.ENETDOWN, errno.ENOENT})


def _socket_error(err: BaseException) -> OSError | None:
    """The connection's own error under a client's wrappers (docker-py, requests, urllib3), if the
    engine could not be reached; None for any other error."""
    seen, todo = set(), [err]
    while todo and len(seen) < 50:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno and e.strerror:
            return e if e.errno in _UNREACHABLE else None
        if isinstance(e, ConnectionError) and e.args and isinstance(e.args[0], str):  # http.client's RemoteDisconnected
            return OSError(0, e.args[0])
        for x in (getattr(e, "reason", None), e.__cause__, e.__context__, *getattr(e, "args", ())):
            if isinstance(x, BaseException):
                todo.append(x)
            elif isinstance(x, tuple):
                todo += [y for y in x if isinstance(y, BaseException)]
    return None


def reason(err: Exception) -> str:
    """What the engine said, as one short line (docker.errors.APIError's explanation, or the text)."""
    text = getattr(err, "explanation", None) or str(err)
    cause = _socket_error(err)
    if cause is not None and cause.strerror and not getattr(err, "explanation", None):
        text = f"not reachable: {cause.strerror[0].lower() + cause.strerror[1:]}"
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " ".join(str(text).split())[:300]


def read_file(container, path: str) -> bytes | None:
    """One file's bytes from a container, through the engine (`docker cp`'s archive: a created, running or
    exited container alike); None when it has no such file (or ``path`` is a folder). Any other answer of
    the engine is raised."""
    from docker.errors import NotFound

    try:
        stream, _ = container.get_archive(path)
    except NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        member = tar.next()
        handle = tar.extractfile(member) if member else None
        return handle.read() if handle else None


def remove_quietly(box) -> None:
    """Remove a container, running or not; one already gone is not an error."""
    try:
        box.remove(force=True)
    except Exception:  # noqa: BLE001 - already gone, or its engine is: nothing left to do here
        pass


def remove_id_quietly(client, container_id: str) -> None:
    """remove_quietly for a container known by its id (the low-level API's lists and creates)."""
    try:
        client.api.remove_container(container_id, force=True)
    except Exception:  # noqa: BLE001 - already gone, or its engine is: nothing left to do here
        pass


def remove_stale(client, name: str) -> None:
    """A container of this name left by an earlier, killed rlbox (only ours: by label)."""
    from docker.errors import NotFound

    try:
        old = client.containers.get(name)
    except NotFound:
        return
    if old.labels.get(LABEL_MANAGED) != "true":
        raise RlboxError(f"a container named {name} exists and is not rlbox's; remove or rename it")
    old.remove(force=True)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM taken as Ctrl-C; ``signum`` says which (the exit code is 128 + it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_code_of(interrupt: BaseException) -> int:
    """The shell's code for an interrupt: 130 for SIGINT (Ctrl-C), 143 for SIGTERM."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def _interrupt(signum, frame):
    ignore_interrupts()  # the first one counts: a second Ctrl-C must not break the cleanup it starts
    raise Interrupted(signum)


def ignore_interrupts() -> None:
    """From now on SIGINT and SIGTERM do nothing (main thread only): called once an interrupt has
    been taken, so that however often Ctrl-C is pressed, the one cleanup runs to its end."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _swallowed(unraisable, chained) -> None:
    """sys.unraisablehook within `sigterm_as_interrupt`: an Interrupted raised while the main thread
    ran a finalizer (a ``__del__``, a weakref callback) cannot leave it; Python prints it as
    "Exception ignored in ..." and goes on, and with every later signal ignored the run would go on
    as if none came (ci10: a SIGTERM'd run printed that and ran its 300 s job on). The interrupt is
    taken again: the handler re-armed and the signal sent to this process once more, from another
    thread, so that it arrives outside the finalizer. Anything else goes to ``chained``, the hook before."""
    err = unraisable.exc_value
    if isinstance(err, Interrupted) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        threading.Timer(0.05, os.kill, (os.getpid(), err.signum)).start()
        return
    chained(unraisable)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise KeyboardInterrupt once (Ctrl-C and SIGTERM take
    one cleanup path); every later signal is ignored, so the cleanup is never itself interrupted
    (only in the main thread, where Python delivers signals). One that lands in a finalizer, which
    cannot raise, is taken again just after (`_swallowed`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt), signal.signal(signal.SIGINT, _interrupt)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: _swallowed(unraisable, hook)
    try:
        yield
    finally:
        sys.unraisablehook = hook
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # not interrupted: as before
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])


@contextlib.contextmanager
def shielded() -> Iterator[list[int]]:
    """Within the block (a teardown), SIGINT and SIGTERM are only recorded, in the list it yields;
    after it they act again."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    seen: list[int] = []
    previous = (signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum)),
                signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum)))
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
