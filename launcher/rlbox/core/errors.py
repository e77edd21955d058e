"""The one error type users see: a single line naming what is wrong and what to do; and the
one way rlbox suggests the name that was meant."""

from __future__ import annotations

from collections.abc import Iterable


class RlboxError(Exception):
    """A user-facing failure. ``str(err)`` is one line; the CLI prints it and exits non-zero."""

    exit_code = 2
    cleanup: str | None = None  # what the teardown of the run it ended did, in words (cluster.execute notes it)

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(" ".join(message.split()) if "\n" in message else message)
        if exit_code is not None:
            self.exit_code = exit_code


def nearest(word: str, choices: Iterable[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The ``n`` names of ``choices`` closest to ``word`` (difflib's ratio of at least ``cutoff``)."""
    import difflib  # here: every command imports this module, few suggest a name

    return difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)


def did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string."""
    close = nearest(word, choices, 1, cutoff)
    return f" (did you mean '{close[0]}'?)" if close else ""


def last_line(text: str) -> str:
    """The last non-blank line of a tool's output (at most 160 characters), for a one-line error."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else "no output"
