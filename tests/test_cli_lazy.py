"""The `rlbox` root group is lazy (issue 21, item 6): `rlbox --help` lists every command from
cli/main.py's COMMANDS table without importing a command module or a heavy library, and
`rlbox X` imports X's module only. Structural checks (what gets imported), never a timing:
bench/startup.py measures the time."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import click
import pytest

import rlbox.cli
from rlbox.cli.main import COMMANDS, cli, load_command

HEAVY = ("docker", "pydantic", "rich", "yaml", "requests", "jinja2", "hydra")


def imported_by(*args: str) -> set[str]:
    """Every module `python -X importtime -m rlbox.cli ARGS` imports (from its import log)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlbox.cli", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_root_help_imports_no_command_module_and_no_heavy_library():
    modules = imported_by("--help")
    assert "rlbox.cli.main" in modules  # the log is read right
    assert not {m for m in modules if m.startswith("rlbox.cli.cmd_")}
    assert not {m for m in modules if m.split(".")[0] in HEAVY}


def test_root_help_lists_every_registered_command():
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "--help"], capture_output=True, text=True)
    rows = proc.stdout.split("Commands:\n", 1)[1].splitlines()
    assert [row.split()[0] for row in rows if row.strip()] == sorted(COMMANDS)


@pytest.mark.parametrize("name", ["recipes", "images", "status"])
def test_a_commands_help_imports_its_own_module_only(name):
    module = COMMANDS[name][0]
    loaded = {m for m in imported_by(name, "--help") if m.startswith("rlbox.cli.cmd_")}
    assert loaded == {f"rlbox.cli.{module}"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_table_line_names_its_command_and_its_true_short_help(name):
    command = load_command(name)
    assert isinstance(command, click.Command)
    assert command.name == name
    assert COMMANDS[name][2] == command.get_short_help_str(limit=1000), \
        f"cli/main.py COMMANDS[{name!r}]: the short help must be the command's own (copy it from there)"


def cli_modules():
    return [importlib.import_module(f"rlbox.cli.{m.name}") for m in pkgutil.iter_modules(rlbox.cli.__path__)
            if m.name.startswith("cmd_")]


def test_every_command_defined_in_a_cli_module_is_registered():
    """A top-level click command (one no group of its module holds) that COMMANDS does not name
    would be unreachable: register it with one line in cli/main.py's COMMANDS."""
    registered = {id(load_command(n)) for n in COMMANDS}
    for module in cli_modules():
        commands = [v for v in vars(module).values() if isinstance(v, click.Command)]
        held = {id(sub) for g in commands if isinstance(g, click.Group) for sub in g.commands.values()}
        for c in commands:
            if id(c) not in held:
                assert id(c) in registered, f"{module.__name__}: command {c.name!r} is not in cli/main.py COMMANDS"


def test_unknown_command_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "nosuch"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "rlbox: error: No such command 'nosuch'. (see `rlbox --help`)\n"
    assert cli.get_command(click.Context(cli), "nosuch") is None
