"""The `rlbox` command line: thin wrappers over matrix, render, build and provenance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from . import __version__, build, matrix, provenance, render
from .errors import RlboxError
from .paths import find_root

out = Console(highlight=False, soft_wrap=True)
if not out.is_terminal:  # piped: never truncate table cells
    out = Console(highlight=False, soft_wrap=True, width=400)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _matrix() -> matrix.Matrix:
    return matrix.load(find_root())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rlbox")
def cli():
    """Reproducible verl images and launcher for Ascend NPU clusters.

    The version matrix lives in images/*.yaml; `rlbox render` turns it into dockerfiles/,
    `rlbox build` builds one variant with BuildKit, `rlbox inspect` reads an image's provenance.
    """


# ---------------------------------------------------------------------------------------------
@cli.group()
def images():
    """The version matrix: releases x hardware variants."""


@images.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: every variant with its pins.")
def images_list(as_json: bool):
    """List every RELEASE:VARIANT with its hardware, platform and tag."""
    m = _matrix()
    rows = []
    for v in m.variants:
        rows.append(
            {
                "release": v.release.release,
                "variant": v.name,
                "ref": v.ref,
                "hardware": v.hardware_name,
                "chip": v.hardware.chip,
                "soc_version": v.hardware.soc_version,
                "platform": v.platform,
                "tag": v.image,
                "base_image": v.base_image,
                "cann": v.release.cann.version,
                "python": v.release.python,
                "driver_min": v.release.driver.min,
                "dockerfile": str(v.dockerfile),
                "components": {c.name: c.spec.pin() for c in v.components},
                "patches": [p.ref for p in v.patches],
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("RELEASE:VARIANT", "HW", "PLATFORM", "CANN", "PY", "IMAGE", box=None)
    for r in rows:
        table.add_row(r["ref"], r["hardware"], r["platform"], r["cann"], r["python"], r["tag"])
    out.print(table)


# ---------------------------------------------------------------------------------------------
@cli.command("render")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 listing every stale, missing or orphaned file.")
def render_cmd(check: bool):
    """Render templates/ + images/ into dockerfiles/ (Dockerfile and image.json per variant)."""
    m = _matrix()
    if check:
        drift = render.check(m)
        for d in drift:
            click.echo(f"{d.state}: {d.path}")
        if drift:
            raise RlboxError(
                f"{len(drift)} generated file(s) out of date with images/, templates/ or patches/: run `rlbox render`",
                exit_code=1,
            )
        click.echo(f"dockerfiles/ is up to date ({len(m.variants)} variants)")
        return
    changed = render.write(m)
    for path in changed:
        click.echo(f"wrote {path}" if (m.root / path).exists() else f"removed {path}")
    click.echo(f"{len(changed)} file(s) changed, {len(m.variants)} variants rendered")


# ---------------------------------------------------------------------------------------------
def _revision(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "images", "templates", "patches", "dockerfiles"], capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@cli.command("build")
@click.argument("ref", metavar="RELEASE:VARIANT")
@click.option("--platform", help="Target platform; defaults to the variant's (linux/arm64 for A2/A3).")
@click.option("--base-image", help="Use this base instead of the manifest's (e.g. the SWR copy of the CANN image).")
@click.option("--tag", "tags", multiple=True, help="Tag(s) to give the image; default REGISTRY/NAME:VARIANT.")
@click.option("--pip-index", help="PyPI mirror for every pip install (e.g. a local devpi or a CN mirror).")
@click.option("--apt-mirror", help="Replace the distribution's apt mirror (e.g. http://mirrors.example.com/ubuntu).")
@click.option("--git-mirror", help="Rewrite https://github.com/ to this prefix for git sources (e.g. https://gitcode.com/).")
@click.option("--hf-endpoint", help="Hugging Face endpoint baked into the image as HF_ENDPOINT.")
@click.option("--ca-bundle", type=click.Path(path_type=Path), help="Extra CA bundle (PEM) for pip/git/apt during the build; passed as a BuildKit secret, never stored in a layer.")
@click.option("--network", type=click.Choice(["default", "host", "none"]), help="Network for RUN steps (host: reach services on the build host's loopback).")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
@click.option("--push", is_flag=True, help="Push to the registry instead of loading into the local engine.")
@click.option("--dry-run", is_flag=True, help="Print the exact build command and do nothing.")
def build_cmd(ref, platform, base_image, tags, pip_index, apt_mirror, git_mirror, hf_endpoint, ca_bundle, network, no_cache, push, dry_run):
    """Build one variant of the matrix with BuildKit (docker buildx)."""
    m = _matrix()
    variant = m.get(ref)
    drift = [d for d in render.check(m) if d.path.parent == variant.dockerfile.parent]
    if drift:
        raise RlboxError(f"{drift[0].path} is {drift[0].state}: run `rlbox render` before building {ref}")
    p = build.plan(
        variant,
        platform=platform,
        base_image=base_image,
        tags=tags,
        pip_index=pip_index,
        apt_mirror=apt_mirror,
        git_mirror=git_mirror,
        hf_endpoint=hf_endpoint,
        ca_bundle=ca_bundle,
        push=push,
        network=network,
        revision=_revision(m.root),
        no_cache=no_cache,
    )
    if dry_run:
        click.echo(p.command())
        return
    err.print(f"[bold]rlbox[/]: building {ref} -> {', '.join(p.tags)}")
    err.print(f"$ {p.command()}", markup=False)
    build.execute(p)
    err.print(f"[bold]rlbox[/]: built {', '.join(p.tags)}")


# ---------------------------------------------------------------------------------------------
@cli.command("inspect")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Labels and /etc/rlbox/image.json as JSON.")
def inspect_cmd(image: str, as_json: bool):
    """Show what IMAGE holds: release, hardware, every pinned component and applied patch."""
    info = provenance.inspect(image)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    labels, man = info["labels"], info["manifest"] or {}
    out.print(f"[bold]{image}[/]  {info['id'][:19]}  {info['architecture']}  {info['size'] / 1e6:.0f} MB")
    for key, label in (
        ("ref", "org.opencontainers.image.version"),
        ("hardware", "io.rlbox.hardware"),
        ("platform", "io.rlbox.platform"),
        ("base_image", "org.opencontainers.image.base.name"),
        ("cann", "io.rlbox.cann"),
        ("driver_min", "io.rlbox.driver.min"),
        ("python", "io.rlbox.python"),
    ):
        out.print(f"  {key:11} {man.get(key) or labels.get(label, '-')}")
    out.print(f"  {'revision':11} {labels.get('org.opencontainers.image.revision', '-')}")
    table = Table("COMPONENT", "PIN", "PATCHES", box=None)
    comps = man.get("components") or {
        k.removeprefix("io.rlbox.component."): {"pin": v} for k, v in labels.items() if k.startswith("io.rlbox.component.")
    }
    for name, comp in comps.items():
        patches = ", ".join(p["name"].split("/", 1)[1] for p in comp.get("patches", []))
        table.add_row(name, comp["pin"], patches or "-")
    out.print(table)
    for p in man.get("patches", []):
        out.print(f"  patch {p['name']}  sha256:{p['sha256']}")


def main():
    try:
        cli.main(standalone_mode=False)
    except RlboxError as e:
        err.print(f"rlbox: error: {e}", markup=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err.print("rlbox: aborted")
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
