"""The one error type users see: a single line naming what is wrong and what to do."""


class RlboxError(Exception):
    """A user-facing failure. ``str(err)`` is one line; the CLI prints it and exits non-zero."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(" ".join(message.split()) if "\n" in message else message)
        if exit_code is not None:
            self.exit_code = exit_code
