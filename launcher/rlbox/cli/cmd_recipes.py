"""`rlbox recipes list|show`: verl runs shipped as data."""

from __future__ import annotations

import shlex

import click

from rlbox.cli.common import out, table_of
from rlbox.cluster import recipes as recipes_mod
from rlbox.core.config import parse_pairs


@click.group()
def recipes():
    """verl runs shipped as data (the seeds' scripts, typos fixed, paths as parameters)."""


@recipes.command("list")
def recipes_list():
    """List the shipped recipes."""
    table = table_of("RECIPE", "HW", "NODES", "RELEASE", "DESCRIPTION")
    for r in recipes_mod.all_recipes():
        table.add_row(r.name, r.hardware, str(r.nodes), r.release, r.description)
    out.print(table)


@recipes.command("show")
@click.argument("name")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
def recipes_show(name, params, sets):
    """Show a recipe: source, parameters, environment and the resolved command."""
    r = recipes_mod.load(name)
    argv, env = r.resolve(parse_pairs(list(params), "--param"), list(sets))
    out.print(f"{r.name}: {r.description}")
    out.print(f"  source: {r.source}\n  release {r.release}, hardware {r.hardware}, {r.nodes} node(s)")
    for k, p in r.params.items():
        out.print(f"  --param {k}={p.default}    {p.help}", markup=False)
    for k, v in env.items():
        out.print(f"  env {k}={v}", markup=False)
    for note in r.notes:
        out.print(f"  note: {note}", markup=False)
    click.echo((f"cd {shlex.quote(r.working_dir)} && " if r.working_dir else "") + " \\\n    ".join(shlex.quote(a) for a in argv))

