"""A run whose lost node cannot be cleaned ends on the loss, not on the teardown error alone
(issue 37): the cause that ended the run comes first in its last line, then what the teardown
could not do and what to run, with the cause's exit code. Pure (``execute.last_line``)."""

from __future__ import annotations

import pytest

from rlbox.cluster import execute
from rlbox.core.errors import RlboxError

GONE = RlboxError("node1: cannot list run r1's containers (not reachable: 10.2.0.2); rerun `rlbox stop --name r1`")
LOST = RlboxError("run 'r1' lost node1 (10.2.0.2): its engine has not answered for 3 s", exit_code=3)


@pytest.mark.parametrize("ending, line, code", [
    (LOST, f"{LOST}; then {GONE}", 3),
    (RlboxError(f"{LOST}; every node was cleaned up", exit_code=3),  # not the one the teardown names
     f"{LOST}; the other nodes were cleaned up; then {GONE}", 3),
    (None, str(GONE), 2),  # nothing else ended the run: the teardown's line
    (KeyboardInterrupt(), str(GONE), 2),
    (GONE, str(GONE), 2),  # the same error twice is said once
])
def test_the_cause_comes_first_in_the_last_line(ending, line, code):
    err = execute.last_line(ending, GONE)
    assert str(err) == line and err.exit_code == code and "\n" not in str(err)
