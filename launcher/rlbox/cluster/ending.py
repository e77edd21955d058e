"""A run's last line: what ended it, then what its teardown did, said only once the teardown has run.

A run that ends early (a lost node, Ctrl-C, a lost dashboard, a full runs dir, a takeover) raises an
``Ending`` (its cause, no claim about the nodes yet); `execute` tears the run down and completes it
into an ``Ended``: the cause, then "every node was cleaned up" (the teardown succeeded), "nothing was
started" (no teardown was needed), or the words for the nodes it reached and the teardown's own line
naming the hosts it could not (``then``). Callers that add to the line (Slurm's ended allocation) read
those parts, not the text.
"""

from __future__ import annotations

from rlbox.core.errors import RlboxError

CLEANED = "every node was cleaned up"
PARTLY = "the other nodes were cleaned up"
NOTHING = "nothing was started"


class Ending(RlboxError):
    """What ended a run, before its teardown: ``str()`` is the cause alone (what its record keeps).
    ``takeover_asked``: whether another run holds the name was asked already (or cannot be: the head's
    engine silent), so the end is not asked again before the teardown."""

    def __init__(self, cause: str, exit_code: int | None = None, *, cleaned: str = CLEANED, partly: str = PARTLY,
                 tail: str = "", takeover_asked: bool = False):
        super().__init__(cause, exit_code)
        self.cleaned, self.partly, self.tail = cleaned, partly, tail  # tail: what else the line says (an unsaved record)
        self.takeover_asked = takeover_asked

    def with_tail(self, tail: str) -> "Ending":
        return Ending(str(self), self.exit_code, cleaned=self.cleaned, partly=self.partly, tail=tail,
                      takeover_asked=self.takeover_asked)

    def completed(self, started: bool, unreached: RlboxError | None = None) -> "Ended":
        """The last line once the teardown ran (``started``: there was one), ``unreached``: its error."""
        cleanup = (self.partly if unreached is not None else self.cleaned) if started else NOTHING
        return Ended(str(self), cleanup, unreached, self.tail, self.exit_code)


class Ended(RlboxError):
    """A run's last line, in parts: its ``cause``, what its teardown did (``cleanup``), the teardown's error
    for the hosts it could not reach (``unreached``)."""

    def __init__(self, cause: str, cleanup: str | None, unreached: RlboxError | None, tail: str = "",
                 exit_code: int | None = None):
        said = cause + (f"; {cleanup}" if cleanup else "") + tail
        super().__init__(f"{said}; then {unreached}" if said and unreached else said or str(unreached), exit_code)
        self.cause, self.cleanup, self.unreached = cause, cleanup, unreached


def last_line(ending: BaseException | None, teardown: RlboxError) -> Ended:
    """A run whose teardown failed ends on the cause that ended it (a lost node), then the teardown's line
    (alone when nothing else ended the run, or the cause is the teardown's own)."""
    if isinstance(ending, Ending):
        return ending.completed(True, teardown)
    if isinstance(ending, RlboxError) and str(ending) and str(ending) not in str(teardown):
        return Ended(str(ending), None, teardown, exit_code=ending.exit_code)
    return Ended("", None, teardown, exit_code=teardown.exit_code)


def cleanup_of(err: RlboxError) -> str | None:
    """What the teardown of the run that ``err`` ended did, in words, when execute said or noted it (an
    ``Ended``'s, or ``cleanup`` noted on another error it let through); None: not known."""
    return err.cleanup


def signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
