"""engine.reason: an engine that cannot be reached is said so in words; any other error (a full
disk under the runs folder, a refusal the engine explains) is said as it is, never as unreachable."""

from __future__ import annotations

import errno
import os

import pytest
import requests
from docker.errors import APIError

from rlbox.core import engine


def _wrapped(inner: BaseException) -> Exception:
    """docker-py's way: a requests ConnectionError whose cause chain holds the socket's error."""
    try:
        try:
            raise inner
        except BaseException as err:
            raise requests.exceptions.ConnectionError(err) from err
    except requests.exceptions.ConnectionError as outer:
        return outer


@pytest.mark.parametrize("err, expected", [
    (_wrapped(ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))),
     "not reachable: connection refused"),
    (_wrapped(ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))),
     "not reachable: connection reset by peer"),
    (_wrapped(OSError(errno.EHOSTUNREACH, os.strerror(errno.EHOSTUNREACH))), "not reachable: no route to host"),
    (_wrapped(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))), "not reachable: no such file or directory"),
    # a full disk is the launcher's own trouble, not the engine's
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "[Errno 28] No space left on device"),
    (_wrapped(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))), "[Errno 28] No space left on device"),
    (PermissionError(errno.EACCES, os.strerror(errno.EACCES)), "[Errno 13] Permission denied"),
    # what the engine explains is said as it explains it
    (APIError("409 Client Error", explanation="Conflict. The container name is already in use"),
     "Conflict. The container name is already in use"),
])
def test_reason_names_an_unreachable_engine_and_nothing_else_as_one(err, expected):
    assert engine.reason(err) == expected
