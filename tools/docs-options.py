#!/usr/bin/env python3
"""Print the manual's reference section for rlbox commands, from click's command tree: a heading,
the short help, the usage line and a table of every option with its help text.

    python3 tools/docs-options.py build            # one command
    python3 tools/docs-options.py images list      # a subcommand
    python3 tools/docs-options.py --all            # every command, in the order of `rlbox --help`

Paste the section into the docs/ page the command belongs to (docs/architecture.md says which),
then edit the prose as you like: tests/test_docs.py only holds the option table and the usage line
to the command (every option listed, none that does not exist).
"""

from __future__ import annotations

import sys

import click

from rlbox.cli.main import cli


def leaves(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    """(path, command, context) of every command under ``group`` that is not itself a group."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        sub = click.Context(command, info_name=name, parent=ctx)
        if isinstance(command, click.Group):
            yield from leaves(command, sub, path + (name,))
        else:
            yield path + (name,), command, sub


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def option_rows(command: click.Command, ctx: click.Context) -> list[tuple[str, str]]:
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden or "--help" in param.opts:
            continue
        metavar = ""
        if not param.is_flag:
            try:
                metavar = " " + cell(param.make_metavar(ctx))  # click >= 8.2
            except TypeError:
                metavar = " " + cell(param.make_metavar())
        help_text = param.help or ""
        if param.show_default and param.default not in (None, (), False):
            help_text += f" (default: {param.default})"
        names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
        rows.append((names + metavar, cell(help_text) or "-"))
    return rows


def section(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> str:
    usage = " ".join(["rlbox", *path, *command.collect_usage_pieces(ctx)])
    lines = [f"### `rlbox {' '.join(path)}`", "", command.get_short_help_str(limit=1000), "", "```", usage, "```", ""]
    rows = option_rows(command, ctx)
    if rows:
        lines += ["| option | what it does |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows]]
    else:
        lines += ["No options."]
    return "\n".join(lines) + "\n"


def find(path: list[str]) -> tuple[tuple[str, ...], click.Command, click.Context]:
    ctx = click.Context(cli, info_name="rlbox")
    for p, command, sub in leaves(cli, ctx):
        if list(p) == path:
            return p, command, sub
    raise SystemExit(f"docs-options: no command rlbox {' '.join(path)} (see rlbox --help)")


def main(argv: list[str]) -> int:
    if argv == ["--all"]:
        ctx = click.Context(cli, info_name="rlbox")
        print("\n".join(section(p, c, sub) for p, c, sub in leaves(cli, ctx)))
    elif argv:
        print(section(*find(argv)))
    else:
        raise SystemExit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
