"""A run whose lost node cannot be cleaned ends on the loss, not on the teardown error alone
(issue 37): the cause that ended the run comes first in its last line, then what the teardown
could not do and what to run, with the cause's exit code; what the teardown did is said only once it
has run (``ending.Ending`` completed). Pure (``ending.last_line``)."""

from __future__ import annotations

import pytest

from rlbox.cluster import ending
from rlbox.core.errors import RlboxError

GONE = RlboxError("node1: cannot list run r1's containers (not reachable: 10.2.0.2); rerun `rlbox stop --name r1`")
LOST = RlboxError("run 'r1' lost node1 (10.2.0.2): its engine has not answered for 3 s", exit_code=3)


@pytest.mark.parametrize("end, line, code", [
    (LOST, f"{LOST}; then {GONE}", 3),
    (ending.Ending(str(LOST), exit_code=3),  # a cause that says what the teardown did: not the whole of it
     f"{LOST}; the other nodes were cleaned up; then {GONE}", 3),
    (ending.Ending(str(LOST), exit_code=3, tail="; /r/state.json could not be written (full)"),
     f"{LOST}; the other nodes were cleaned up; /r/state.json could not be written (full); then {GONE}", 3),
    (None, str(GONE), 2),  # nothing else ended the run: the teardown's line
    (KeyboardInterrupt(), str(GONE), 2),
    (GONE, str(GONE), 2),  # the same error twice is said once
])
def test_the_cause_comes_first_in_the_last_line(end, line, code):
    err = ending.last_line(end, GONE)
    assert str(err) == line and err.exit_code == code and "\n" not in str(err)


@pytest.mark.parametrize("started, line", [
    (True, f"{LOST}; every node was cleaned up"),  # the teardown ran and succeeded
    (False, f"{LOST}; nothing was started"),  # it ended before anything of the run existed
])
def test_what_the_teardown_did_is_said_only_once_it_has_run(started, line):
    end = ending.Ending(str(LOST), exit_code=3)
    assert str(end) == str(LOST)  # before the teardown: the cause alone (the record's reason)
    done = end.completed(started)
    assert str(done) == line and done.exit_code == 3 and done.unreached is None


def test_a_takeover_says_what_this_run_removed():
    end = ending.Ending("run 'r' was taken over", cleaned="this one removed only its own containers and claims",
                        partly="this one removed only its own containers and claims, on the nodes it could reach")
    assert str(end.completed(True)) == "run 'r' was taken over; this one removed only its own containers and claims"
    assert str(end.completed(True, GONE)) == ("run 'r' was taken over; this one removed only its own containers and "
                                               f"claims, on the nodes it could reach; then {GONE}")
