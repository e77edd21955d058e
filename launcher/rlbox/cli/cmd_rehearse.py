"""rlbox rehearse: a real-content build of one variant on a CANN stand-in base (a CPU release: its own
base), then its checks; optionally a named stand-in layer on the result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from rlbox.cli.common import err, matrix, note
from rlbox.cluster import recipes as recipe_files
from rlbox.core.errors import RlboxError
from rlbox.image import rehearsal, standins


@click.command("rehearse")
@click.argument("ref", metavar="RELEASE:VARIANT")
@click.option("--ca-bundle", type=click.Path(path_type=Path, exists=True, dir_okay=False), envvar="RLBOX_CA_BUNDLE",
              help="CA bundle (PEM) for downloads behind a TLS-inspecting proxy [env RLBOX_CA_BUNDLE].")
@click.option("--report", type=click.Path(path_type=Path), help="Write the facts and verdict as JSON here "
              "(default build/rehearsal/RELEASE-VARIANT.json).")
@click.option("--standin", "standin", metavar="NAME", help="Build the named stand-in (e.g. verl-cpu-shims) on the "
              "rehearsal image, tagged TAG-NAME and labelled io.rlbox.standin; the recipes' imports are checked in it.")
@click.option("--dry-run", is_flag=True, help="Print the plan (base, switched-off settings, substitutions, build) and stop.")
def rehearse_cmd(ref, ca_bundle, report, standin, dry_run):
    """Build REF through its own rendered Dockerfile with the real pinned sources and the real
    locked files, on a CANN stand-in base (tools/make-cann-standin.sh), offline from
    .rlbox-sources; then check the image: rlbox-verify (installed set == lock, pip check),
    each git source's version, and every module each shipped recipe's entrypoint reaches.

    What needs the CANN compiler or the NPU runtime is switched off by named settings, and
    every substitution (the base, what the lock records as standing in) is listed. The image is
    tagged localhost/rlbox-rehearsal/NAME:VARIANT and labelled io.rlbox.rehearsal.

    A release without CANN (a CPU release) rehearses on its own base when its lock records a
    substitution (e.g. PyPI's torch for a +cpu build the locking machine could not reach).
    """
    m = matrix()
    variant = m.image_for(ref)[1] if ":" in ref else None
    release = variant.release.release if variant else None
    # each recipe in the form it runs on this release (keys that release's verl renamed, migrated)
    forms = [r.on(release) if release else r for r in recipe_files.all_recipes()]
    shipped = {r.name: {"release": r.release, "entrypoint": list(r.entrypoint), "overrides": list(r.overrides),
                        "reaches": list(r.reaches)} for r in forms}
    p = rehearsal.plan(m, ref, shipped, ca_bundle=ca_bundle)
    extra = standins.plan(m.get(ref), standin, p.tag) if standin else None
    if extra is not None:  # the recipes' imports are checked where their jobs run: on the stand-in layer
        p = dataclasses.replace(p, imports_in=extra.tag)
    click.echo(p.describe())
    if extra is not None:
        click.echo(extra.describe())
    if dry_run:
        return
    result = rehearsal.execute(m, p, ca_bundle=ca_bundle, echo=lambda line: err.print(line, markup=False, emoji=False,
                                                                                       highlight=False),
                               after_build=(lambda: standins.execute(extra)) if extra is not None else None)
    path = report or m.root / "build" / "rehearsal" / f"{ref.replace(':', '-')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"plan": p.as_dict(), "ok": result.ok, "summary": result.lines, "facts": result.facts},
                               indent=1) + "\n")
    click.echo(f"rehearsal of {ref}: {'GREEN' if result.ok else 'RED'}")
    for line in result.lines:
        click.echo(f"  {line}")
    note(f"report: {path}")
    if not result.ok:
        raise RlboxError(f"rehearsal of {ref} found problems (above; {path})", exit_code=1)
    if extra is not None:
        click.echo(f"built {extra.tag}: {standins.describe_labels({standins.LABEL: extra.name, standins.LABEL_SUMMARY: extra.summary})}")

