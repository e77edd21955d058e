"""What validating a verl job found, and the verdict it earns: data and pure judgements.

A verdict claims only what ran. ``valid``: rlbox's checks and every check verl makes before its
workers start ran to the end and found nothing. ``partly checked``: nothing was found, but some
of verl's checks did not run (each is named, with how to run it). ``invalid``: a problem was
found. What verl checks only inside its workers (after they start) is never run before a job;
the verdict says so once instead of claiming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlbox.core.errors import RlboxError

VALID = "valid"
PARTLY = "partly checked"
INVALID = "invalid"
# exit status of `rlbox validate` per verdict; --strict makes "partly checked" an error
EXIT = {VALID: 0, PARTLY: 0, INVALID: 2}
EXIT_STRICT_PARTLY = 3


@dataclass(frozen=True)
class Problem:
    keys: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{', '.join(self.keys)}: {self.message}"


@dataclass(frozen=True)
class NotRun:
    """A check that did not run: what and why, and how to make it run."""

    what: str
    how: str = ""

    def __str__(self) -> str:
        return f"{self.what}{f' ({self.how})' if self.how else ''}"


@dataclass(frozen=True)
class Outcome:
    problems: tuple[Problem, ...] = ()
    ran: tuple[str, ...] = ()  # the checks that ran to the end (or to their rejection)
    not_run: tuple[NotRun, ...] = ()  # checks made before the workers start that did not run
    beyond: tuple[str, ...] = ()  # checks verl makes only once its workers run: never run before a job
    model_files: tuple[str, ...] = ()  # one line per model path fetched for verl's checks: which files, from where
    model_from: tuple[str, ...] = ()  # the same, short, for the verdict line: "PATH from WHERE"

    @property
    def verdict(self) -> str:
        return INVALID if self.problems else PARTLY if self.not_run else VALID

    def notes(self) -> list[str]:
        """One line each: what ran, what did not (and how to run it), what is never run before a job."""
        return ([f"ran: {r}" for r in self.ran] + list(self.model_files) + [f"not checked: {n}" for n in self.not_run]
                + [f"not run before a job: {b}" for b in self.beyond])


def exit_status(verdict: str, strict: bool = False) -> int:
    return EXIT_STRICT_PARTLY if strict and verdict == PARTLY else EXIT[verdict]


def summary(outcome: Outcome, subject: str) -> str:
    """The verdict line: ``valid: SUBJECT``, ``partly checked: SUBJECT; not checked: ...`` or
    ``invalid: PROBLEM (N problem(s) ...)``; the SUBJECT says where fetched model files came from."""
    if outcome.model_from:
        subject = f"{subject}, the model's files of {', '.join(outcome.model_from)}"
    if outcome.verdict == INVALID:
        return (f"invalid: {outcome.problems[-1]}  ({len(outcome.problems)} problem(s) in {subject}; "
                "nothing was started)")
    if outcome.verdict == PARTLY:
        return f"partly checked: {subject}; not checked: " + "; ".join(str(n) for n in outcome.not_run)
    return f"valid: {subject}"


def report(found: Outcome, subject: str, warn) -> str:
    """What ran and did not as notes; every problem but the last as a warning and the last as the
    error (one line each); else the verdict line (valid, or partly checked)."""
    for line in found.notes():
        warn(line)
    for p in found.problems[:-1]:
        warn(f"invalid: {p}")
    if found.problems:
        raise RlboxError(summary(found, subject))
    return summary(found, subject)


def as_json(outcome: Outcome, subject: str, strict: bool = False) -> dict:
    return {"verdict": outcome.verdict, "summary": summary(outcome, subject),
            "exit_status": exit_status(outcome.verdict, strict),
            "problems": [{"keys": list(p.keys), "message": p.message} for p in outcome.problems],
            "ran": list(outcome.ran), "not_checked": [{"what": n.what, "how": n.how} for n in outcome.not_run],
            "not_run_before_a_job": list(outcome.beyond), "model_files": list(outcome.model_files)}
