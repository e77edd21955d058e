"""`rlbox render`, `rlbox lock`, `rlbox build`, `rlbox fetch-sources`: from the matrix in images/
to rendered Dockerfiles, a lock, offline sources and a built image."""

from __future__ import annotations

from pathlib import Path

import click

from rlbox.cli.common import checked_image, checked_image_tag, checked_repository, checked_url, err, matrix, note
from rlbox.core.errors import RlboxError
from rlbox.image import build, lockfile, mirrors, render, resolve, sources, standins
from rlbox.image.ci_workflow import PATH as WORKFLOW_PATH


@click.command("render")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 listing every stale, missing or orphaned file.")
def render_cmd(check: bool):
    """Render templates/ + images/ into dockerfiles/ (Dockerfile and image.json per variant) and the CI workflow."""
    m = matrix()
    if check:
        drift = render.check(m)
        for d in drift:
            click.echo(f"{d.state}: {d.path}")
        if drift:
            raise RlboxError(
                f"{len(drift)} generated file(s) out of date with images/, templates/ or patches/: run `rlbox render`",
                exit_code=1,
            )
        click.echo(f"dockerfiles/ and {WORKFLOW_PATH} are up to date ({len(m.variants)} variants)")
        return
    changed = render.write(m)
    for path in changed:
        click.echo(f"wrote {path}" if (m.root / path).exists() else f"removed {path}")
    click.echo(f"{len(changed)} file(s) changed, {len(m.variants)} variants rendered")


@click.command("lock")
@click.argument("refs", nargs=-1, metavar="[RELEASE | RELEASE:VARIANT]...")
@click.option("--check", is_flag=True, help="Resolve nothing; exit 1 listing every variant whose lock is missing or stale.")
@click.option("--strict", is_flag=True, help="Fail on anything not resolved for real: a base digest, an unreachable "
              "index, a stand-in (CI, where registries, GitHub and every index are reachable).")
@click.option("--pip-index", callback=checked_url, help="Index to resolve from (default https://pypi.org/simple).")
@click.option("--ca-bundle", type=click.Path(path_type=Path, exists=True, dir_okay=False), envvar="RLBOX_CA_BUNDLE",
              help="CA bundle (PEM) for pip behind a TLS-inspecting proxy [env RLBOX_CA_BUNDLE].")
def lock_cmd(refs, check, strict, pip_index, ca_bundle):
    """Resolve everything a build installs into images/lock/RELEASE.json.

    Base digests, git refs and the version each git source reports, and the whole Python set
    for the variant's platform and Python (uv): PyPI pins, CANN's packages and every git
    source's own requirements read at its pinned commit (from .rlbox-sources/git, fetched there
    if missing), one file with its sha256 each. Builds install exactly the lock; `rlbox lock
    --check` fails when images/ and the lock disagree. With no argument, every release.
    """
    m = matrix()
    chosen = m.select(refs)
    if check:
        problems = lockfile.check(chosen)
        for p in problems:
            click.echo(p.line())
        if problems:
            raise RlboxError(f"{len(problems)} variant(s) not locked as images/ says: run `rlbox lock`", exit_code=1)
        unresolved = [v.ref for v in chosen if not v.lock.base_digest]
        said = f"; base by tag (no digest) for {', '.join(unresolved)}" if unresolved else ""
        click.echo(f"images/lock/ matches images/ ({len(chosen)} variants){said}")
        return
    warnings = resolve.lock(m, chosen, strict=strict, pip_index=pip_index, ca_bundle=ca_bundle,
                            echo=lambda line: note(f"lock {line}"),
                            wrote=lambda path, v: click.echo(f"wrote {lockfile.rel(m.root, path)} ({v.name})"))
    for w in warnings:
        err.print(f"warning: {w}")
    click.echo("run `rlbox render` to carry the lock into dockerfiles/")


@click.command("build")
@click.argument("ref", metavar="RELEASE:VARIANT")
@click.option("--platform", help="Target platform; defaults to the variant's (linux/arm64 for A2/A3).")
@click.option("--base-image", callback=checked_image, help="Use this base instead of the manifest's (e.g. the SWR copy of the CANN image).")
@click.option("--tag", "tags", multiple=True, callback=checked_image_tag, help="Tag(s) to give the image; default REGISTRY/NAME:VARIANT.")
@click.option("--pip-index", callback=checked_url, help="PyPI mirror for every pip install (e.g. a local devpi or a CN mirror).")
@click.option("--apt-mirror", callback=checked_url, help="Replace the distribution's apt mirror (e.g. http://mirrors.example.com/ubuntu).")
@click.option("--git-mirror", callback=checked_url, help="Rewrite https://github.com/ to this prefix for git sources (e.g. https://gitcode.com/).")
@click.option("--hf-endpoint", callback=checked_url, help="Hugging Face endpoint baked into the image as HF_ENDPOINT.")
@click.option("--ca-bundle", type=click.Path(path_type=Path), help="Extra CA bundle (PEM) for pip/git/apt during the build; passed as a BuildKit secret, never stored in a layer.")
@click.option("--network", type=click.Choice(["default", "host", "none"]), help="Network for RUN steps (host: reach services on the build host's loopback).")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
@click.option("--push", is_flag=True, help="Push to the registry instead of loading into the local engine.")
@click.option("--push-by-digest", metavar="REPO", callback=checked_repository, help="Push to REPO untagged (by digest; CI tags it afterwards with `docker buildx imagetools create`). Read the digest from --metadata-file.")
@click.option("--no-load", is_flag=True, help="Build only: keep the result in BuildKit's cache, neither load nor push it (--cache-to still exports).")
@click.option("--cache-from", multiple=True, metavar="SPEC", help="BuildKit cache source, passed to buildx (e.g. type=gha,scope=REF or type=registry,ref=...).")
@click.option("--cache-to", multiple=True, metavar="SPEC", help="BuildKit cache export, passed to buildx (e.g. type=gha,mode=max,scope=REF).")
@click.option("--metadata-file", type=click.Path(path_type=Path), help="Write buildx's result metadata (JSON; containerimage.digest) to FILE.")
@click.option("--mirror", "mirror", metavar="PROFILE", help="Mirror profile from images/mirrors.yaml (cn, intl, offline): pip index, apt and git mirrors, HF endpoint and base registry together; the options above override it. offline: no network, sources from .rlbox-sources (rlbox fetch-sources).")
@click.option("--standin", "standin", metavar="NAME", help="Then build the named stand-in (e.g. verl-cpu-shims) on top of the "
              "result, tagged TAG-NAME and labelled io.rlbox.standin; the release's own image stays without it.")
@click.option("--dry-run", is_flag=True, help="Print the exact build command (on stderr, the build context it stages and from where) and do nothing.")
def build_cmd(ref, platform, base_image, tags, pip_index, apt_mirror, git_mirror, hf_endpoint, ca_bundle, network, no_cache, push,
              push_by_digest, no_load, cache_from, cache_to, metadata_file, mirror, standin, dry_run):
    """Build one variant of the matrix with BuildKit (docker buildx)."""
    m = matrix()
    p = build.prepare(
        m, ref, mirror=mirror, dry_run=dry_run,
        warn=lambda line: err.print(f"warning: {line}", markup=False, highlight=False),
        platform=platform, base_image=base_image, tags=tags, pip_index=pip_index, apt_mirror=apt_mirror,
        git_mirror=git_mirror, hf_endpoint=hf_endpoint, ca_bundle=ca_bundle, push=push, push_by_digest=push_by_digest,
        load=not no_load, cache_from=cache_from, cache_to=cache_to, metadata_file=metadata_file, network=network,
        no_cache=no_cache,
    )
    extra = None
    if standin:
        if not p.tags or push or push_by_digest or no_load:
            raise RlboxError("--standin builds on the loaded image: not with --push, --push-by-digest or --no-load")
        extra = standins.plan(m.get(ref), standin, p.tags[0])
    if dry_run:
        click.echo(p.describe())
        err.print(f"rlbox: {p.describe_context()}", markup=False, highlight=False)
        if extra:
            click.echo(extra.describe())
        return
    err.print(f"rlbox: building {ref} -> {p.describe_output()}")
    err.print(f"$ {p.command()}", markup=False)
    build.execute(p)
    err.print(f"rlbox: built {ref} -> {p.describe_output()}")
    if extra:
        standins.execute(extra)
        err.print(f"rlbox: built {standins.describe_labels({standins.LABEL: extra.name, standins.LABEL_SUMMARY: extra.summary})} "
                  f"-> {extra.tag} (not part of {ref})", markup=False, highlight=False)


@click.command("fetch-sources")
@click.argument("ref", metavar="RELEASE:VARIANT")
@click.option("--mirror", "mirror", metavar="PROFILE", help="Mirror profile to fetch through (cn, intl); see images/mirrors.yaml.")
@click.option("--base-image", callback=checked_image, help="Base image to download the OS packages in (default: the locked base).")
@click.option("--ca-bundle", type=click.Path(path_type=Path, exists=True, dir_okay=False), envvar="RLBOX_CA_BUNDLE",
              help="CA bundle (PEM) for pip behind a TLS-inspecting proxy [env RLBOX_CA_BUNDLE].")
@click.option("--wheels-only", is_flag=True, help="Only the lock's files (wheels and allowed sdists), sha256 checked: e.g. "
              "to prove an arm64 lock complete from an x86 machine, where no arm64 container runs.")
def fetch_sources_cmd(ref, mirror, base_image, ca_bundle, wheels_only):
    """Fill .rlbox-sources/ with everything REF's build downloads, for `rlbox build REF --mirror offline`.

    The pinned commit of every git source, every locked wheel (plus what git sources need to
    build), and the OS packages the image adds to its base. Needs a fresh lock (rlbox lock).
    """
    m = matrix()
    variant = m.get(ref)
    if wheels_only:
        count = sources.fetch_locked(variant, sources.default_dest(variant).resolve(), ca_bundle,
                                     echo=lambda line: note(f"fetch-sources {ref}: {line}"))
        click.echo(f"{mirrors.SOURCES_DIR}/: {count} locked files for {ref} ({variant.platform}, Python "
                   f"{variant.release.python}), each matching its locked sha256")
        return
    profile = mirrors.get(m.root, mirror) if mirror else None
    got = sources.fetch(variant, profile=profile, ca_bundle=ca_bundle, base_image=base_image,
                        echo=lambda line: note(f"fetch-sources {ref}: {line}"))
    left = sources.missing(variant)
    click.echo(f"{mirrors.SOURCES_DIR}/: {len(got.git)} git sources, {got.wheels} wheels, {got.debs} OS packages for {ref}"
               + (f"; still missing: {', '.join(left)}" if left else "; ready for `rlbox build " + ref + " --mirror offline`"))

