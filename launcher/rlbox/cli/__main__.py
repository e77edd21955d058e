"""`python -m rlbox.cli`: the same as the `rlbox` command."""

from rlbox.cli.main import main

main()
