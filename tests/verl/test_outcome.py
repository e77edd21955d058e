"""The verdict claims only what ran: pure judgements over what validation gathered (no verl, no hydra)."""

from __future__ import annotations

import json

import pytest

from rlbox.verl import outcome
from rlbox.verl.outcome import NotRun, Outcome, Problem

P = Problem(("data.train_batch_size",), "train_batch_size 15 is not divisible by ppo_mini_batch_size 4")
STOPPED = NotRun("verl 0.9.1's own validate_config stopped on the model's files", "put them here")
RAN = ("rlbox's checks", "verl 0.9.1's own code: validate_config")

TABLE = [
    # outcome, verdict, exit status, exit status with --strict, the verdict line
    (Outcome((), RAN), "valid", 0, 0, "valid: JOB"),
    (Outcome((), RAN, (), ("worker-side checks",)), "valid", 0, 0, "valid: JOB"),
    (Outcome((), RAN, (STOPPED,)), "partly checked", 0, 3,
     "partly checked: JOB; not checked: verl 0.9.1's own validate_config stopped on the model's files (put them here)"),
    (Outcome((P,), RAN, (STOPPED,)), "invalid", 2, 2,
     f"invalid: {P}  (1 problem(s) in JOB; nothing was started)"),
    (Outcome((P, P), RAN), "invalid", 2, 2, f"invalid: {P}  (2 problem(s) in JOB; nothing was started)"),
]


@pytest.mark.parametrize("found, verdict, status, strict, line", TABLE)
def test_the_verdict_says_what_ran(found, verdict, status, strict, line):
    assert found.verdict == verdict
    assert outcome.exit_status(verdict) == status and outcome.exit_status(verdict, strict=True) == strict
    assert outcome.summary(found, "JOB") == line
    data = outcome.as_json(found, "JOB", strict=True)
    assert json.loads(json.dumps(data)) == data
    assert data["verdict"] == verdict and data["summary"] == line and data["exit_status"] == strict
    assert data["not_checked"] == [{"what": n.what, "how": n.how} for n in found.not_run]


def test_notes_name_what_ran_what_did_not_and_what_never_runs_before_a_job():
    found = Outcome((), ("a",), (NotRun("b", "do c"),), ("d",))
    assert found.notes() == ["ran: a", "not checked: b (do c)", "not run before a job: d"]
