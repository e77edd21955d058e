"""The `rlbox` command line: one module per command group (cmd_*.py), each reading
parse -> plan -> print (--dry-run) or execute -> render. Logic lives in the subpackages."""

from rlbox.cli.main import cli, main

__all__ = ["cli", "main"]
