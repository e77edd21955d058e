"""The `rlbox` command line: thin wrappers over matrix, render, build and provenance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from rlbox import __version__
from rlbox.image import build
from rlbox.image import matrix
from rlbox.image import provenance
from rlbox.image import render
from rlbox.image import ci_workflow as workflow
from rlbox.cluster import spec as cluster_mod
from rlbox.cluster.preflight import doctor as doctor_mod
from rlbox.image import diff as diff_mod
from rlbox.cluster import jobs as jobs_mod
from rlbox.image import lockfile as lock_mod
from rlbox.image import mirrors as mirrors_mod
from rlbox.image import sources as sources_mod
from rlbox.cluster import recipes as recipes_mod
from rlbox.cluster.preflight import validate as validate_mod
from rlbox.core import engine
from rlbox.core.errors import RlboxError, did_you_mean
from rlbox.core.paths import find_root

out = Console(highlight=False, soft_wrap=True)
if not out.is_terminal:  # piped: never truncate table cells
    out = Console(highlight=False, soft_wrap=True, width=400)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _matrix() -> matrix.Matrix:
    return matrix.load(find_root())


def _matrix_if_any() -> matrix.Matrix | None:
    """The matrix when there is an rlbox tree (commands that also take plain image names)."""
    if os.environ.get("RLBOX_ROOT"):
        return _matrix()
    try:
        root = find_root()
    except RlboxError:
        return None
    return matrix.load(root)


def _note(line: str) -> None:
    err.print(f"rlbox: {line}", markup=False, highlight=False)


REGISTRY = click.option("--registry", "registry_host", metavar="HOST[:PORT]",
                        help="Registry host to use instead of the one in the name or the release's "
                             "image.registry; the repository path is kept.")
MIRROR = click.option("--mirror", "mirror", metavar="PROFILE",
                      help="Mirror profile from images/mirrors.yaml whose registry to use (cn: SWR, intl: quay.io).")
INSECURE = click.option("--insecure", is_flag=True,
                        help="rlbox's own registry requests over plain http (loopback registries always are); "
                             "the engine's push/pull needs the registry in its insecure-registries as well.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rlbox")
def cli():
    """Reproducible verl images and launcher for Ascend NPU clusters.

    The version matrix lives in images/*.yaml; `rlbox render` turns it into dockerfiles/,
    `rlbox build` builds one variant with BuildKit, `rlbox inspect` reads an image's provenance.
    `rlbox run` launches verl across nodes; around it, `rlbox data prepare`, `rlbox merge`,
    `rlbox serve` and `rlbox eval` cover data, checkpoint merging, serving and AISBench.
    """


# ---------------------------------------------------------------------------------------------
@cli.group()
def images():
    """The version matrix (releases x hardware variants) and what a registry holds of it."""


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


@images.command("tags")
@click.argument("repository")
@REGISTRY
@INSECURE
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: every tag with its digest and labels.")
def images_tags(repository: str, registry_host: str | None, insecure: bool, as_json: bool):
    """List a repository's tags (registry v2 API) with digests and io.rlbox.* labels.

    REPOSITORY is HOST[:PORT]/PATH, or a release of the matrix (its image.registry and name).
    Credentials: RLBOX_REGISTRY_USER / RLBOX_REGISTRY_PASSWORD, else the Docker config.
    """
    from rlbox.registry import client as registry_mod
    from rlbox.image import transfer

    repo = transfer.repository_for(_matrix_if_any(), repository, registry_host)
    reg = registry_mod.Registry(repo.registry, insecure=insecure)
    rows = []
    for tag in sorted(reg.tags(repo.api_repository)):
        digest, configs = reg.configs(repo.with_tag(tag))
        for cfg in configs:
            labels = cfg.labels
            rows.append({
                "tag": tag,
                "reference": f"{repo.name}@{digest}",
                "digest": digest,
                "architecture": cfg.platform,
                "release": labels.get("io.rlbox.release"),
                "variant": labels.get("io.rlbox.variant"),
                "hardware": labels.get("io.rlbox.hardware"),
                "platform": labels.get("io.rlbox.platform"),
                "revision": labels.get("org.opencontainers.image.revision"),
                "labels": {k: v for k, v in labels.items() if k.startswith("io.rlbox.")},
            })
    if as_json:
        click.echo(json.dumps({"repository": repo.name, "tags": rows}, indent=2))
        return
    table = Table("TAG", "DIGEST", "RELEASE:VARIANT", "HW", "PLATFORM", box=None)
    for r in rows:
        ref = f"{r['release']}:{r['variant']}" if r["release"] else "-"
        table.add_row(r["tag"], r["digest"], ref, r["hardware"] or "-", r["platform"] or r["architecture"])
    out.print(f"{repo.name}: {len({r['tag'] for r in rows})} tag(s)")
    out.print(table)


# ---------------------------------------------------------------------------------------------
@cli.command("render")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 listing every stale, missing or orphaned file.")
def render_cmd(check: bool):
    """Render templates/ + images/ into dockerfiles/ (Dockerfile and image.json per variant) and the CI workflow."""
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
        click.echo(f"dockerfiles/ and {workflow.PATH} are up to date ({len(m.variants)} variants)")
        return
    changed = render.write(m)
    for path in changed:
        click.echo(f"wrote {path}" if (m.root / path).exists() else f"removed {path}")
    click.echo(f"{len(changed)} file(s) changed, {len(m.variants)} variants rendered")


# ---------------------------------------------------------------------------------------------
@cli.command("lock")
@click.argument("refs", nargs=-1, metavar="[RELEASE | RELEASE:VARIANT]...")
@click.option("--check", is_flag=True, help="Resolve nothing; exit 1 listing every variant whose lock is missing or stale.")
@click.option("--strict", is_flag=True, help="Fail when a base image digest cannot be resolved (CI, where registries are reachable).")
@click.option("--pip-index", help="Index to resolve wheels from (default https://pypi.org/simple).")
@click.option("--ca-bundle", type=click.Path(path_type=Path, exists=True, dir_okay=False), envvar="RLBOX_CA_BUNDLE",
              help="CA bundle (PEM) for pip behind a TLS-inspecting proxy [env RLBOX_CA_BUNDLE].")
def lock_cmd(refs, check, strict, pip_index, ca_bundle):
    """Resolve base digests, git refs and every pip wheel into images/lock/RELEASE.json.

    Builds install under the lock; `rlbox lock --check` fails when images/ and the lock disagree.
    With no argument, every release is locked (or checked).
    """
    m = _matrix()
    chosen = []
    for ref in refs or sorted(m.releases):
        if ":" in ref:
            chosen.append(m.get(ref))
        elif ref in m.releases:
            chosen += [v for v in m.variants if v.release.release == ref]
        else:
            raise RlboxError(f"unknown release '{ref}'{did_you_mean(ref, m.releases)}; "
                             f"known: {', '.join(sorted(m.releases))}")
    if check:
        problems = lock_mod.check(chosen)
        for p in problems:
            click.echo(p.line())
        if problems:
            raise RlboxError(f"{len(problems)} variant(s) not locked as images/ says: run `rlbox lock`", exit_code=1)
        unresolved = [v.ref for v in chosen if not v.lock.base_digest]
        note = f"; base by tag (no digest) for {', '.join(unresolved)}" if unresolved else ""
        click.echo(f"images/lock/ matches images/ ({len(chosen)} variants){note}")
        return
    warnings = []
    for v in chosen:  # each variant is written as soon as it is resolved: a long run keeps its progress
        res = lock_mod.resolve(v, pip_index=pip_index, ca_bundle=ca_bundle, echo=lambda line: err.print(f"rlbox: lock {line}", markup=False))
        warnings += res.warnings
        if strict and res.warnings:
            raise RlboxError(res.warnings[0] + " (--strict)", exit_code=1)
        release = v.release.release
        path = lock_mod.path_for(m.root, release)
        names = {x.name for x in m.variants if x.release.release == release}
        entries = {k: e for k, e in (lock_mod.read(m.root, release) or {"variants": {}})["variants"].items() if k in names}
        entries[v.name] = res.entry
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(lock_mod.document(release, entries), encoding="utf-8")
        click.echo(f"wrote {lock_mod.rel(m.root, path)} ({v.name})")
    for w in warnings:
        err.print(f"[yellow]warning[/]: {w}", markup=True)
    click.echo("run `rlbox render` to carry the lock into dockerfiles/")


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
@click.option("--push-by-digest", metavar="REPO", help="Push to REPO untagged (by digest; CI tags it afterwards with `docker buildx imagetools create`). Read the digest from --metadata-file.")
@click.option("--no-load", is_flag=True, help="Build only: keep the result in BuildKit's cache, neither load nor push it (--cache-to still exports).")
@click.option("--cache-from", multiple=True, metavar="SPEC", help="BuildKit cache source, passed to buildx (e.g. type=gha,scope=REF or type=registry,ref=...).")
@click.option("--cache-to", multiple=True, metavar="SPEC", help="BuildKit cache export, passed to buildx (e.g. type=gha,mode=max,scope=REF).")
@click.option("--metadata-file", type=click.Path(path_type=Path), help="Write buildx's result metadata (JSON; containerimage.digest) to FILE.")
@click.option("--mirror", "mirror", metavar="PROFILE", help="Mirror profile from images/mirrors.yaml (cn, intl, offline): pip index, apt and git mirrors, HF endpoint and base registry together; the options above override it. offline: no network, sources from .rlbox-sources (rlbox fetch-sources).")
@click.option("--dry-run", is_flag=True, help="Print the exact build command and do nothing.")
def build_cmd(ref, platform, base_image, tags, pip_index, apt_mirror, git_mirror, hf_endpoint, ca_bundle, network, no_cache, push,
              push_by_digest, no_load, cache_from, cache_to, metadata_file, mirror, dry_run):
    """Build one variant of the matrix with BuildKit (docker buildx)."""
    m = _matrix()
    variant = m.get(ref)
    profile = mirrors_mod.get(m.root, mirror) if mirror else None
    if profile is not None:
        pip_index = pip_index or profile.pip_index
        apt_mirror = apt_mirror or profile.apt_for(variant.release.os, variant.arch)
        git_mirror = git_mirror or profile.git_mirror
        hf_endpoint = hf_endpoint or profile.hf_endpoint
        if base_image is None and profile.image(variant.locked_base_image) != variant.locked_base_image:
            base_image = profile.image(variant.locked_base_image)
    if variant.lock.state == "stale":
        raise RlboxError(lock_mod.Problem(variant.ref, variant.lock.path, "stale").line() + " before building")
    drift = [d for d in render.check(m) if d.path.parent == variant.dockerfile.parent]
    if drift:
        raise RlboxError(f"{drift[0].path} is {drift[0].state}: run `rlbox render` before building {ref}")
    if variant.lock.state == "missing":
        err.print(f"[yellow]warning[/]: {ref} is not locked ({variant.lock.path}): pip resolves at build time; "
                  f"`rlbox lock {variant.release.release}` pins it")
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
        push_by_digest=push_by_digest,
        load=not no_load,
        cache_from=cache_from,
        cache_to=cache_to,
        metadata_file=metadata_file,
        network=network,
        offline=bool(profile and profile.offline),
        revision=_revision(m.root),
        no_cache=no_cache,
    )
    if dry_run:
        click.echo(p.command())
        return
    err.print(f"[bold]rlbox[/]: building {ref} -> {p.describe_output()}")
    err.print(f"$ {p.command()}", markup=False)
    build.execute(p)
    err.print(f"[bold]rlbox[/]: built {ref} -> {p.describe_output()}")


@cli.command("fetch-sources")
@click.argument("ref", metavar="RELEASE:VARIANT")
@click.option("--mirror", "mirror", metavar="PROFILE", help="Mirror profile to fetch through (cn, intl); see images/mirrors.yaml.")
@click.option("--base-image", help="Base image to download the OS packages in (default: the locked base).")
@click.option("--ca-bundle", type=click.Path(path_type=Path, exists=True, dir_okay=False), envvar="RLBOX_CA_BUNDLE",
              help="CA bundle (PEM) for pip behind a TLS-inspecting proxy [env RLBOX_CA_BUNDLE].")
def fetch_sources_cmd(ref, mirror, base_image, ca_bundle):
    """Fill .rlbox-sources/ with everything REF's build downloads, for `rlbox build REF --mirror offline`.

    The pinned commit of every git source, every locked wheel (plus what git sources need to
    build), and the OS packages the image adds to its base. Needs a fresh lock (rlbox lock).
    """
    m = _matrix()
    variant = m.get(ref)
    profile = mirrors_mod.get(m.root, mirror) if mirror else None
    got = sources_mod.fetch(variant, profile=profile, ca_bundle=ca_bundle, base_image=base_image,
                            echo=lambda line: err.print(f"rlbox: fetch-sources {ref}: {line}", markup=False))
    left = sources_mod.missing(variant)
    click.echo(f"{mirrors_mod.SOURCES_DIR}/: {len(got.git)} git sources, {got.wheels} wheels, {got.debs} OS packages for {ref}"
               + (f"; still missing: {', '.join(left)}" if left else "; ready for `rlbox build " + ref + " --mirror offline`"))


# ---------------------------------------------------------------------------------------------
@cli.command("inspect")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Labels, /etc/rlbox/image.json and the SBOM as JSON.")
@click.option("--packages", is_flag=True, help="List every Python and OS package of the SBOM.")
def inspect_cmd(image: str, as_json: bool, packages: bool):
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
    sbom = info.get("sbom")
    lock = man.get("lock") or {}
    out.print(f"  {'lock':11} {lock.get('file', '-')} ({lock.get('state', 'not recorded')}, {len(lock.get('pip') or {})} pip pins)")
    if sbom is None:
        out.print(f"  {'sbom':11} not recorded ({provenance.SBOM_PATH} absent)")
        return
    out.print(f"  {'sbom':11} {len(sbom['python_packages'])} Python packages, "
              f"{len(sbom['os_packages'])} {sbom['os_package_manager']} packages ({provenance.SBOM_PATH}; --packages lists them)")
    if packages:
        table = Table("KIND", "PACKAGE", "VERSION", "SOURCE", box=None)
        for p in sbom["python_packages"]:
            table.add_row("python", p["name"], p["version"], p.get("source") or p.get("location", ""))
        for p in sbom["os_packages"]:
            table.add_row(sbom["os_package_manager"], p["name"], p["version"], "")
        out.print(table)


# ---------------------------------------------------------------------------------------------
@cli.command("diff")
@click.argument("image_a")
@click.argument("image_b")
@click.option("--json", "as_json", is_flag=True, help="Every difference as JSON.")
def diff_cmd(image_a: str, image_b: str, as_json: bool):
    """What changed from IMAGE_A to IMAGE_B: image facts, components, patches, Python and OS packages.

    Read from what each image records (labels, /etc/rlbox/image.json, /etc/rlbox/sbom.json), on
    the local engine or, for a reference the engine does not have, from its registry.
    Exits 0 when identical, 1 when they differ.
    """
    comparison = diff_mod.compare(provenance.record(image_a), provenance.record(image_b))
    if as_json:
        click.echo(json.dumps(comparison.as_dict(), indent=2))
    else:
        for line in diff_mod.lines(comparison):
            click.echo(line)
    sys.exit(0 if comparison.identical else 1)

def _profile(m, name: str | None):
    if name is None:
        return None
    if m is None:
        raise RlboxError(f"--mirror {name} needs images/mirrors.yaml (an rlbox tree or RLBOX_ROOT)")
    return mirrors_mod.get(m.root, name)


# ---------------------------------------------------------------------------------------------
@cli.command("push")
@click.argument("ref", metavar="RELEASE:VARIANT|IMAGE")
@REGISTRY
@click.option("--tag", "extra_tags", multiple=True, metavar="EXTRA", help="Push under this tag as well (repeatable).")
@click.option("--immutable-tag", metavar="TAG", help="The immutable tag to push instead of TAG-<commit12>.")
@click.option("--no-immutable-tag", is_flag=True, help="Push without an immutable tag (e.g. a build from uncommitted changes).")
@MIRROR
@INSECURE
def push_cmd(ref, registry_host, extra_tags, immutable_tag, no_immutable_tag, mirror, insecure):
    """Push a local image under its tag and an immutable TAG-<commit12> tag; print its digest.

    \b
    The immutable tag carries the rlbox commit the image was built from (its
    org.opencontainers.image.revision label); an image built from uncommitted changes gets
    none unless given with --immutable-tag. An immutable tag already in the registry for
    another image is refused. Credentials: RLBOX_REGISTRY_USER / RLBOX_REGISTRY_PASSWORD (the
    engine logs in with them), else the Docker config (docker login).
    \b
    rlbox push verl_pt27_25rc3:a3-arm
    rlbox push verl_pt27_25rc3:a3-arm --registry 127.0.0.1:5000 --tag latest-a3
    """
    from rlbox.image import transfer

    client = engine.local_client()
    m = _matrix_if_any()
    plan = transfer.plan_push(m, ref, client, registry_host=registry_host, extra_tags=extra_tags,
                              immutable=immutable_tag, no_immutable=no_immutable_tag, mirror=_profile(m, mirror))
    digest = transfer.push(plan, client, insecure=insecure, echo=_note)
    for tag in plan.tags:
        _note(f"pushed {plan.repository.name}:{tag}")
    click.echo(f"{plan.repository.name}@{digest}")


@cli.command("pull")
@click.argument("ref", required=False, metavar="[RELEASE:VARIANT|IMAGE[@sha256:...]]")
@click.option("--hardware", type=click.Choice(["auto", "a2", "a3", "ax"]),
              help="Pull the release's variant for this hardware; auto: this host's architecture and npu-smi chip.")
@click.option("--release", help="Release for --hardware (default: the only one with a variant for it).")
@REGISTRY
@click.option("--force", is_flag=True, help="Pull a variant whose platform or chip does not fit this host "
                                            "(a mislabeled image is still refused).")
@MIRROR
@INSECURE
def pull_cmd(ref, hardware, release, registry_host, force, mirror, insecure):
    """Pull an image by tag or digest, or the variant for this host; refuse what does not fit.

    \b
    Before pulling a variant, its platform and chip are checked against this host
    (platform.machine(), `npu-smi info`, or the command in RLBOX_NPU_SMI). After pulling, the
    image's Architecture and io.rlbox.platform / io.rlbox.chip labels are checked again: an
    image that does not fit, or whose labels disagree with it or with the variant asked for,
    is removed again.
    \b
    rlbox pull --hardware auto --release verl_pt27_25rc3
    rlbox pull verl_pt27_25rc3:a3-arm --registry 127.0.0.1:5000
    rlbox pull 127.0.0.1:5000/ascendhub/verl_pt27_25rc3@sha256:...
    """
    from rlbox.image import transfer

    m = _matrix_if_any()
    facts = transfer.host_facts()
    target = transfer.pull_target(m, ref, hardware=hardware, release=release, registry_host=registry_host, facts=facts,
                                  mirror=_profile(m, mirror))
    warnings = transfer.precheck(m, target, facts, force)
    for w in warnings:
        _note(f"warning: {w}")
    client = engine.local_client()
    pulled = transfer.pull(target, client, facts=facts, hardware=m.hardware if m else {}, insecure=insecure,
                           force=force, echo=_note)
    for w in pulled.warnings:
        _note(f"warning: {w}")
    what = f" ({target.variant.ref}, {target.variant.hardware_name}, {target.variant.platform})" if target.variant else ""
    _note(f"pulled {pulled.local}{what}" + (f"; also tagged {pulled.also_tagged}" if pulled.also_tagged else ""))
    click.echo(pulled.reference)


# ---------------------------------------------------------------------------------------------
RUNS_DIR = click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
                        envvar="RLBOX_RUNS_DIR", help="Where run state and job logs are kept.")
NAME = click.option("--name", default="verl", show_default=True, help="Run name: labels every container of the run.")


@cli.command("run", context_settings={"ignore_unknown_options": False})
@click.option("--hosts", help="Comma-separated hosts (node 0 is the Ray head): HOST, USER@HOST or USER@HOST:PORT.")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Cluster YAML (per-host ssh, nic, mounts) or a hostfile.")
@click.option("--nodes", type=int, help="Number of nodes; must agree with the hosts given (with --sim: how many to simulate).")
@click.option("--sim", is_flag=True, help="Rehearse on simulated nodes: containers on the local engine, devices mapped from /dev/null.")
@click.option("--image", help="RELEASE:VARIANT from the matrix or a full image reference (default for --sim: rlbox_sim).")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]), help="Hardware profile (default: the image's; a3 for --sim).")
@click.option("--devices", type=int, help="NPUs per node (default: the host's /dev/davinci* count; the profile's for --sim).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Extra mount on every node (models, data, checkpoints).")
@click.option("--nic", help="Socket interface for HCCL/GLOO/TP on every node (default: detected per node, the one routing to the head).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra environment for every node's container.")
@click.option("--privileged", is_flag=True, help="Run node containers privileged (off by default; devices are passed one by one).")
@NAME
@click.option("--replace", is_flag=True, help="Remove a live run of the same name first instead of refusing.")
@click.option("--recipe", help="A shipped recipe (rlbox recipes list).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Recipe parameter (model path, data files, checkpoint dir).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Extra or replacing Hydra override for the recipe.")
@click.option("--smoke-test", is_flag=True, help="Job: check that every NPU of every node is visible through Ray.")
@click.option("--timeout", type=float, default=300, show_default=True, help="Seconds to wait for every NPU to join.")
@click.option("--detach", is_flag=True, help="Return once the job is submitted; follow with `rlbox logs -f`, end with `rlbox stop`.")
@click.option("--keep", is_flag=True, help="Keep the cluster up after the job ends (remove it with `rlbox stop`).")
@click.option("--dry-run", is_flag=True, help="Print per node the exact docker run, the Ray command and the job; touch no host.")
@click.option("--sim-driver", help="Driver version the simulated hosts report (default: the image's minimum).")
@click.option("--num-cpus", "cpus", type=int, help="CPUs each node offers to Ray (default: Ray detects).")
@click.option("--nofile", type=int, help="Open-files limit of node containers (default 65536, capped for the local engine).")
@click.option("--verl-version", help="Validate the job's overrides against this verl release (PyPI wheel) instead of the image's verl.")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Validate against this verl source checkout instead of the image's verl.")
@click.option("--no-validate", is_flag=True, help="Skip the Hydra validation of a verl job.")
@click.option("--no-doctor", is_flag=True, help="Skip the per-node pre-flight checks (rlbox doctor).")
@RUNS_DIR
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_cmd(hosts, cluster_file, nodes, sim, image, hardware, devices, mounts, nic, envs, privileged, name, replace,
            recipe, params, sets, smoke_test, timeout, detach, keep, dry_run, sim_driver, cpus, nofile, verl_version,
            verl_config, no_validate, no_doctor, runs_dir, command):
    """Start the training container on every node, bring up Ray, run the job, tear down.

    A job that fails is triaged first (`rlbox triage`): the nodes' CANN and Ray logs are
    collected into runs/NAME/triage/ and matched against known failures.

    \b
    rlbox run --sim --nodes 4 --hardware a3 --smoke-test
    rlbox run --hosts 10.0.0.1,10.0.0.2 --image verl_pt27_25rc3:a3-arm --mount /data \\
        -- python3 -m verl.trainer.main_ppo data.train_files=/data/train.parquet ...
    rlbox run --cluster cluster.yaml --recipe dapo-qwen3-32b-a3 --param model_path=/data/Qwen3-32B
    """
    from rlbox.cluster import launch
    from rlbox.cluster import execute as runner

    req = launch.RunRequest(
        hosts=hosts, cluster_file=cluster_file, nodes=nodes, sim=sim, image=image, hardware=hardware,
        devices=devices, mounts=list(mounts), nic=nic, env=list(envs), privileged=privileged, name=name,
        recipe=recipe, params=list(params), sets=list(sets), smoke_test=smoke_test, command=list(command),
        runs_dir=runs_dir, sim_driver=sim_driver, cpus=cpus, nofile=nofile, dry_run=dry_run,
    )
    plan, run_dir = launch.prepare(req)
    if dry_run:
        click.echo(plan.describe(), nl=False)
        return

    def echo(line: str) -> None:
        err.print(f"[bold]rlbox[/]: {line}", highlight=False)

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    before = launch.checks_before_start(plan, verl_version=verl_version, verl_config=verl_config,
                                        run_validate=not no_validate, run_doctor=not no_doctor, replace=replace,
                                        echo=echo, warn=lambda line: err.print(f"rlbox: {line}", markup=False))

    def triage_after_failure(nodes, log_path):
        from rlbox.training import triage as triage_mod

        echo("job failed: collecting logs from every node (rlbox triage)")
        targets = [(f"node{n.index}", node.client, n.container.name) for n, node in zip(plan.nodes, nodes)]
        report = triage_mod.triage(name, run_dir, job_log=log_path, targets=targets,
                                   job_env=dict(plan.job.env) if plan.job else {})
        for line in triage_mod.render(report):
            err.print(line, markup=False, highlight=False)

    outcome = runner.execute(plan, run_dir=run_dir, echo=echo, emit=emit, timeout=timeout, replace=replace,
                             detach=detach, keep=keep, before=before, on_failure=triage_after_failure)
    if outcome.exit_code:
        raise RlboxError(f"job of run '{name}' {outcome.status} with exit code {outcome.exit_code}; log: {outcome.log_path}",
                         exit_code=outcome.exit_code)


@cli.command("validate")
@click.option("--hosts", help="Hosts of the cluster (only their number matters here).")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--nodes", type=int, help="Nodes of the cluster the job is for.")
@click.option("--devices", type=int, help="NPUs per node (default: the hardware profile's).")
@click.option("--image", help="RELEASE:VARIANT or image whose verl to validate against (default: the recipe's release).")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]))
@click.option("--verl-version", help="Validate against this verl release's config (PyPI wheel).")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False), help="A verl source checkout.")
@click.option("--recipe", help="A shipped recipe.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def validate_cmd(hosts, cluster_file, nodes, devices, image, hardware, verl_version, verl_config, recipe, params, sets, command):
    """Compose a verl job's Hydra config with the verl that will run and check it.

    Unknown keys (with the nearest real key), values of the wrong type, and cluster rules:
    nnodes x n_gpus_per_node equals the cluster's NPUs, rollout TP divides NPUs per node,
    ulysses SP divides the NPU count, train_batch_size divisible by ppo_mini_batch_size,
    ppo_max_token_len_per_gpu holds one sequence, trainer.device=npu, filter_groups only with DAPO.
    """
    from rlbox.cluster import launch

    rec = recipes_mod.load(recipe) if recipe else None
    # Only the shape of the cluster matters here: plan it as a simulation of that many nodes.
    if hosts or cluster_file:
        spec = cluster_mod.from_hosts(hosts) if hosts else cluster_mod.from_file(cluster_file)
        cluster_mod.agree(spec, nodes)
        nodes = spec.nodes
    req = launch.RunRequest(nodes=nodes or (rec.nodes if rec else 1), sim=True,
                            hardware=hardware if hardware not in (None, "auto") else (rec.hardware if rec else None),
                            devices=devices, recipe=recipe, params=list(params), sets=list(sets), command=list(command),
                            dry_run=True)
    plan, _ = launch.prepare(req)
    if plan.job is None or not jobs_mod.is_verl(list(plan.job.argv)):
        raise RlboxError("validate: give a verl job (-- python3 -m verl.trainer.main_ppo ... or --recipe NAME)")
    tree = None
    if verl_config or verl_version:
        tree = launch.verl_tree(verl_version, verl_config, None, None)
    else:
        m = matrix.load(find_root())
        ref = image or (m.for_hardware(rec.release, rec.hardware).ref if rec else None)
        if not ref:
            raise RlboxError("validate: say which verl: --image, --verl-version or --verl-config")
        target, _ = m.image_for(ref)
        tree = validate_mod.from_image(engine.local_client(), target)
    launch.report(validate_mod.check(tree, list(plan.job.argv), len(plan.nodes), plan.npus_per_node), tree,
                  warn=lambda line: err.print(f"rlbox: {line}", markup=False))
    click.echo(f"valid: {plan.job.argv[2] if len(plan.job.argv) > 2 else ''} with {len(validate_mod.hydra_overrides(list(plan.job.argv)))} overrides "
               f"for {len(plan.nodes)} x {plan.npus_per_node} NPUs against {tree.origin}")


def _state(runs_dir: Path, name: str) -> dict:
    path = runs_dir / name / "state.json"
    if not path.is_file():
        raise RlboxError(f"no run named '{name}' under {runs_dir} (rlbox run --name {name} ...)")
    return json.loads(path.read_text())


def _hosts_of(state: dict):
    from rlbox.cluster.spec import Host

    return tuple(Host(name=n["host"], ssh_user=n.get("ssh_user"), ssh_port=n.get("ssh_port"),
                      identity_file=n.get("identity_file"), known_hosts=n.get("known_hosts"),
                      transport=n.get("transport", "auto")) for n in state["nodes"])


@cli.command("doctor")
@click.option("--hosts", help="Comma-separated hosts (node 0 is the Ray head).")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--nodes", type=int)
@click.option("--sim", is_flag=True, help="Check simulated hosts (their stand-in devices, npu-smi and driver).")
@click.option("--image", help="RELEASE:VARIANT or image the run will use.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]))
@click.option("--devices", type=int, help="NPUs per node the run will use.")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Mounts whose sources must exist on every node.")
@click.option("--nic")
@NAME
@click.option("--sim-driver", help="Driver version the simulated hosts report.")
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True)
def doctor_cmd(hosts, cluster_file, nodes, sim, image, hardware, devices, mounts, nic, name, sim_driver, runs_dir, as_json):
    """Check every node before a run, in parallel: ✓ or ✗ with the fix.

    Engine, device nodes and count, npu-smi chip vs the image's hardware, driver version vs
    what the image's CANN needs, NPUs held by other containers, the run's Ray ports, stale Ray,
    nofile, /dev/shm, the interface routing to the head, disk, the image, mount sources.
    `rlbox run` runs the same checks first and stops on a ✗.
    """
    from rlbox.cluster import launch
    from rlbox.cluster import sim as sim_mod

    req = launch.RunRequest(hosts=hosts, cluster_file=cluster_file, nodes=nodes, sim=sim, image=image, hardware=hardware,
                            devices=devices, mounts=list(mounts), nic=nic, name=name, runs_dir=runs_dir,
                            sim_driver=sim_driver, dry_run=True)
    plan, _ = launch.prepare(req)
    if plan.sim_files:
        sim_mod.write_hosts(plan)
    checks, took = doctor_mod.run_checks(plan)
    if as_json:
        click.echo(json.dumps({"checks": doctor_mod.as_json(checks), "seconds": round(took, 3)}, indent=2))
    else:
        table = Table("NODE", "CHECK", "", "DETAIL", "FIX", box=None)
        for c in checks:
            table.add_row(c.node, c.name, "[green]✓[/]" if c.ok else "[red]✗[/]", c.detail, "" if c.ok else c.fix)
        out.print(table)
        out.print(f"{sum(c.ok for c in checks)}/{len(checks)} checks passed on {len(plan.nodes)} node(s) in {took:.2f} s")
    if not all(c.ok for c in checks):
        raise RlboxError(f"{sum(not c.ok for c in checks)} check(s) failed", exit_code=1)


@cli.command("status")
@NAME
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name, runs_dir, as_json):
    """Show a run: its nodes' containers and the job's status."""
    from rlbox.cluster.hosts import connect_all
    from rlbox.cluster.plan import LABEL_RUN

    state = _state(runs_dir, name)
    nodes = connect_all(_hosts_of(state))
    rows = []
    try:
        for entry, node in zip(state["nodes"], nodes):
            boxes = [b for b in node.client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={name}"})
                     if b.name == entry["container"]]
            rows.append({"node": entry["index"], "host": entry["host"], "role": entry["role"], "npus": entry["npus"],
                         "container": entry["container"], "state": boxes[0].status if boxes else "absent"})
        job = None
        if state.get("submission_id") and any(r["state"] == "running" for r in rows):
            from rlbox.cluster.jobs import JobsClient

            url = _dashboard(state, nodes[0])
            job = JobsClient(url).info(state["submission_id"])
    finally:
        for n in nodes:
            n.close()
    if as_json:
        click.echo(json.dumps({"run": name, "phase": state.get("phase"), "nodes": rows, "job": job}, indent=2))
        return
    table = Table("NODE", "HOST", "ROLE", "NPUS", "CONTAINER", "STATE", box=None)
    for r in rows:
        table.add_row(str(r["node"]), r["host"], r["role"], str(r["npus"]), r["container"], r["state"])
    out.print(f"run {name} ({state['run_id']}): {state.get('phase')}, image {state['image']}")
    out.print(table)
    if job:
        out.print(f"job {job.get('submission_id')}: {job.get('status')}  {job.get('message') or ''}")
    elif state.get("status"):
        out.print(f"job: {state['status']} (exit {state.get('exit_code')})")


def _dashboard(state: dict, head_node) -> str:
    if state.get("sim"):
        return f"http://127.0.0.1:{state['ports']['dashboard']}"
    return head_node.forward(state["head"], state["ports"]["dashboard"])


@cli.command("logs")
@NAME
@RUNS_DIR
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
def logs_cmd(name, runs_dir, follow):
    """Print the job's log (from the cluster while it runs, else the saved log file)."""
    from rlbox.cluster.hosts import connect
    from rlbox.cluster.jobs import JobsClient, exit_code

    state = _state(runs_dir, name)
    if state.get("phase") in ("finished", "removed") or not state.get("submission_id"):
        log = state.get("log")
        if not log or not Path(log).is_file():
            raise RlboxError(f"run '{name}' has no job log (phase {state.get('phase')})")
        sys.stdout.write(Path(log).read_text())
        return
    node = connect(_hosts_of(state)[0])
    try:
        client = JobsClient(_dashboard(state, node))
        if follow:
            info = client.follow(state["submission_id"], lambda t: (sys.stdout.write(t), sys.stdout.flush()))
            code = exit_code(info)
            if code:
                raise RlboxError(f"job {info.get('status')} with exit code {code}", exit_code=code)
        else:
            sys.stdout.write(client.logs(state["submission_id"]))
    finally:
        node.close()


@cli.command("stop")
@NAME
@RUNS_DIR
def stop_cmd(name, runs_dir):
    """Remove exactly this run's containers (by label) on every node, and its simulation network."""
    from rlbox.cluster.hosts import connect_all
    from rlbox.cluster.execute import remove_run

    state = _state(runs_dir, name)
    nodes = connect_all(_hosts_of(state))
    try:
        removed = remove_run(nodes, name, (state.get("network") or {}).get("name"))
    finally:
        for n in nodes:
            n.close()
    path = runs_dir / name / "state.json"
    path.write_text(json.dumps(state | {"phase": "removed"}, indent=2))
    click.echo(f"run {name}: removed {removed} container(s) on {len(nodes)} node(s)")


@cli.command("metrics")
@click.argument("run", required=False)
@RUNS_DIR
@click.option("--job", metavar="ID", help="Which job of the run: its run id (the log's name) or submission id; default the latest.")
@click.option("--keys", help="Comma-separated metrics for the table, the plot, --csv and --json "
                             "(default: the watched curves for the table and plot, every key for --csv/--json).")
@click.option("--csv", "csv_file", type=click.Path(path_type=Path, dir_okay=False), help="Write every step's metrics (every key, or --keys) to this CSV file.")
@click.option("--json", "as_json", is_flag=True, help="Print every step's metrics (every key, or --keys) as JSON instead of the table.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Draw the curves to this PNG (needs matplotlib: pip install 'rlbox[plot]').")
@click.option("--explain", is_flag=False, flag_value="", default=None, metavar="[KEY]",
              help="What a metric means (from the seeds' glossary); without KEY, every metric.")
def metrics_cmd(run, runs_dir, job, keys, csv_file, as_json, plot_file, explain):
    """Per-step training metrics of a run's verl job, read back from its log.

    RUN is a run name under --runs-dir (its latest job, or --job ID) or a log file. The table
    shows the curves people watch: critic/rewards/mean (should rise), response_length/mean,
    perf/throughput, timing_s/step.

    \b
    rlbox metrics verl
    rlbox metrics verl --plot curves.png --csv metrics.csv
    rlbox metrics --explain critic/rewards/mean
    """
    from rlbox.training import metrics as metrics_mod
    from rlbox.cluster.state import job_log

    if explain is not None:
        for line in metrics_mod.explain(explain):
            click.echo(line)
        return
    if not run:
        raise RlboxError("rlbox metrics: give RUN (a run name or a log file), or --explain [KEY]")
    log = job_log(runs_dir, run, job)
    m = metrics_mod.parse_file(log)
    chosen = metrics_mod.select(m, [k.strip() for k in keys.split(",") if k.strip()]) if keys else None
    if csv_file:
        try:
            csv_file.write_text(metrics_mod.to_csv(m, chosen))
        except OSError as e:
            raise RlboxError(f"{csv_file}: cannot write ({e.strerror})") from None
        err.print(f"rlbox: wrote {len(m.rows)} step(s) x {len(chosen or m.keys)} metric(s) to {csv_file}", markup=False)
    if plot_file:
        drawn = metrics_mod.plot(m, plot_file, chosen, title=log.name if Path(run).is_file() else f"run {run}, job {log.stem}")
        err.print(f"rlbox: plotted {', '.join(p['key'] for p in drawn['panels'])} to {plot_file} "
                  f"({drawn['width']}x{drawn['height']})", markup=False)
    if as_json:
        click.echo(metrics_mod.to_json(m, chosen))
        return
    shown = chosen or list(metrics_mod.WATCHED)
    table = Table("STEP", *[k.upper() for k in shown], box=None)
    for s in m.steps:
        table.add_row(str(s), *[metrics_mod.fmt(m.rows[s].get(k)) for k in shown])
    out.print(f"{log}: {len(m.rows)} step(s) ({m.steps[0]}..{m.steps[-1]}), {len(m.keys)} metrics", markup=False)
    out.print(table)
    note = metrics_mod.trend(m)
    if note:
        out.print(note, markup=False)


@cli.command("triage")
@click.argument("run")
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (up to 20 hits per signature, with its explanation and source).")
def triage_cmd(run, runs_dir, as_json):
    """Why a run's job failed: collect its logs and match known failure signatures.

    From every node's container (while the run's containers exist, running or stopped): CANN's
    plog directory (/root/ascend/log/debug/plog, and $ASCEND_PROCESS_LOG_PATH when set) and Ray's
    session logs (*.err, *.out, dashboard_agent.log), capped in size, into runs/RUN/triage/
    with the job's log. Once the containers are gone, what was collected before is matched again.
    `rlbox run` does this by itself when the job fails. The signatures (HCCL EI0006 socket
    timeouts, NPUs held by another container, EL0018 host memory, NPU OOM, "No available agent",
    too few NPUs for nnodes x n_gpus_per_node, ...) live in launcher/rlbox/resources/signatures.yaml.
    """
    from rlbox.cluster import state as runs_mod
    from rlbox.training import triage as triage_mod
    from rlbox.cluster.hosts import connect_all

    state = runs_mod.state(runs_dir, run)
    folder = runs_mod.run_dir(runs_dir, run)
    log = Path(state["log"]) if state.get("log") and Path(state["log"]).is_file() else None
    if log is None and runs_mod.job_logs(folder):
        log = runs_mod.job_logs(folder)[-1]
    targets, nodes, notes = None, [], []
    if state.get("phase") == "removed":
        notes.append(f"the containers of run '{run}' are gone; matching the job log and what was collected before")
    else:
        try:
            nodes = connect_all(_hosts_of(state))
            targets = [(f"node{e['index']}", node.client, e["container"]) for e, node in zip(state["nodes"], nodes)]
        except RlboxError as e:
            notes.append(f"{e}; matching the job log and what was collected before")
    try:
        job_env = ((state.get("job") or {}).get("runtime_env") or {}).get("env_vars") or {}
        report = triage_mod.triage(run, folder, job_log=log, targets=targets, job_env=job_env)
    finally:
        for n in nodes:
            n.close()
    report.warnings[:0] = notes
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for line in triage_mod.render(report):
        out.print(line, markup=False, highlight=False)


@cli.group()
def recipes():
    """verl runs shipped as data (the seeds' scripts, typos fixed, paths as parameters)."""


@recipes.command("list")
def recipes_list():
    """List the shipped recipes."""
    table = Table("RECIPE", "HW", "NODES", "RELEASE", "DESCRIPTION", box=None)
    for r in recipes_mod.all_recipes():
        table.add_row(r.name, r.hardware, str(r.nodes), r.release, r.description)
    out.print(table)


@recipes.command("show")
@click.argument("name")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
def recipes_show(name, params, sets):
    """Show a recipe: source, parameters, environment and the resolved command."""
    import shlex

    from rlbox.cluster.launch import _pairs

    r = recipes_mod.load(name)
    argv, env = r.resolve(_pairs(list(params), "--param"), list(sets))
    out.print(f"[bold]{r.name}[/]: {r.description}")
    out.print(f"  source: {r.source}\n  release {r.release}, hardware {r.hardware}, {r.nodes} node(s)")
    for k, p in r.params.items():
        out.print(f"  --param {k}={p.default}    {p.help}", markup=False)
    for k, v in env.items():
        out.print(f"  env {k}={v}", markup=False)
    for note in r.notes:
        out.print(f"  note: {note}", markup=False)
    click.echo((f"cd {shlex.quote(r.working_dir)} && " if r.working_dir else "") + " \\\n    ".join(shlex.quote(a) for a in argv))


# ---------------------------------------------------------------------------------------------
# After training: data, merge, serve, eval.

def _image_ref(ref: str | None, what: str) -> str:
    """An image reference from RELEASE:VARIANT of the matrix or a full reference."""
    if not ref:
        raise RlboxError(f"{what}: give --image RELEASE:VARIANT (rlbox images list) or an image reference "
                         "(or set RLBOX_IMAGE): the work runs inside the training image")
    image, _ = _matrix().image_for(ref)
    return image


def _note(line: str) -> None:
    err.print(f"rlbox: {line}", markup=False, highlight=False)


@cli.group()
def data():
    """Training data the seeds use, prepared inside the training image."""


@data.command("list")
def data_list():
    """List the datasets `rlbox data prepare` knows (launcher/rlbox/resources/datasets.yaml)."""
    from rlbox.training import datasets as data_mod

    table = Table("DATASET", "FILES", "KIND", "DESCRIPTION", box=None)
    for name, d in data_mod.recipes().items():
        files = ", ".join(f.save for f in d.files) or "--spec FILE"
        table.add_row(name, files, d.transform or "download", d.description)
    out.print(table)


@data.command("prepare")
@click.argument("name")
@click.option("--image", envvar="RLBOX_IMAGE", help="Training image to run in: RELEASE:VARIANT or a reference (env RLBOX_IMAGE).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("datasets"),
              show_default=True, help="Folder the parquet files go to (mounted into the container at the same path).")
@click.option("--endpoint", envvar="HF_ENDPOINT", default="hf", show_default=True,
              help="hf, hf-mirror, modelscope, or an HF-compatible base URL (env HF_ENDPOINT).")
@click.option("--spec", "spec", type=click.Path(path_type=Path, dir_okay=False),
              help="custom only: YAML field mapping (input, prompt, answer, ground_truth, data_source, ability).")
@click.option("--overwrite", is_flag=True, help="Download and write again files that are already there.")
@click.option("--dry-run", is_flag=True, help="Print the recipe, every URL and output, and the docker run; do nothing.")
def data_prepare(name, image, out_dir, endpoint, spec, overwrite, dry_run):
    """Download and convert dataset NAME into verl's parquet layout, inside the training image.

    \b
    rlbox data prepare dapo-math-17k --image verl_pt27_25rc3:a3-arm --out /data/datasets
    rlbox data prepare gsm8k --image IMAGE --endpoint hf-mirror --out /data/datasets
    rlbox data prepare custom --spec dianjin.yaml --image IMAGE --out /data/datasets/dianjin
    """
    from rlbox.training import datasets as data_mod

    p = data_mod.plan(name, image=_image_ref(image, f"data prepare {name}"), out=out_dir, endpoint=endpoint,
                      overwrite=overwrite, spec_path=spec)
    if dry_run:
        click.echo(p.describe(), nl=False)
        return
    said = data_mod.execute(p, engine.local_client(), lambda line: click.echo(line))
    wrote = sum(1 for s in said if s.startswith(("wrote", "downloaded")))
    skipped = sum(1 for s in said if s.startswith("skip"))
    _note(f"{name}: {wrote} file(s) written, {skipped} skipped, in {p.out}")


@cli.command("merge")
@click.argument("run")
@click.option("--step", type=int, required=True, help="The training step: global_step_N/actor of the run's checkpoints.")
@click.option("--target", help="Folder for the Hugging Face model, on the node holding rank 0 "
              "(default: CHECKPOINTS/global_step_N/hf_merged).")
@click.option("--image", help="Image with verl to merge in (default: the run's image).")
@click.option("--checkpoint-dir", help="Host folder holding global_step_* on every node, instead of the one "
              "the run's job and mounts say (trainer.default_local_dir).")
@RUNS_DIR
@click.option("--dry-run", is_flag=True, help="Print where the shards are looked for and the merge command; touch no host.")
def merge_cmd(run, step, target, image, checkpoint_dir, runs_dir, dry_run):
    """Merge RUN's FSDP actor shards of one step into a Hugging Face model, with verl's own
    `python -m verl.model_merger merge --backend fsdp`, inside the image.

    Shards spread over the nodes' local disks are first gathered onto the node holding rank 0;
    every rank 0..W-1 must be present.
    """
    from rlbox.training import merge as merge_mod

    state = _state(runs_dir, run)
    p = merge_mod.plan(state, run=run, step=step, image=_image_ref(image, "merge") if image else None,
                       target=target, checkpoint_dir_override=checkpoint_dir)
    if dry_run:
        click.echo(p.describe(), nl=False)
        return
    where = merge_mod.execute(p, echo=_note, emit=lambda line: click.echo(line))
    _note(f"merged step {step} of run {run} into {where}")


SERVE_NAME = click.option("--name", default="serve", show_default=True,
                          help="Server name: its container is rlbox-serve-NAME, its record RUNS_DIR/serve/NAME.json.")


def _serve_state(runs_dir: Path, name: str) -> Path:
    return runs_dir / "serve" / f"{name}.json"


@cli.command("serve")
@click.argument("model", required=False)
@click.option("--tp", type=int, default=8, show_default=True, help="--tensor-parallel-size (as the training's rollout TP).")
@click.option("--dp", type=int, default=1, show_default=True, help="--data-parallel-size.")
@click.option("--max-model-len", type=int, default=22528, show_default=True, help="--max-model-len (and --max-num-batched-tokens).")
@click.option("--port", type=int, default=6380, show_default=True, help="--port of the OpenAI server.")
@click.option("--served-model-name", default="auto", show_default=True, help="Model name the server answers to (seed 000: auto).")
@click.option("--image", envvar="RLBOX_IMAGE", help="Image with vLLM + vllm-ascend: RELEASE:VARIANT or a reference (default for --sim: rlbox_sim).")
@click.option("--hosts", help="The host to serve on (one; default: this machine).")
@click.option("--sim", is_flag=True, help="A simulated node on the local engine running rlbox's stub OpenAI server instead of vLLM.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax"]), default="a3", show_default=True, help="Simulated hardware (--sim).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Extra mount (MODEL itself is mounted read-only).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra environment for the server.")
@SERVE_NAME
@click.option("--timeout", type=float, default=1800, show_default=True, help="Seconds to wait for /health and /v1/models.")
@click.option("--stop", is_flag=True, help="Stop the server of this --name instead (removes its container).")
@RUNS_DIR
@click.option("--dry-run", is_flag=True, help="Print the docker run and the server command; start nothing.")
def serve_cmd(model, tp, dp, max_model_len, port, served_model_name, image, hosts, sim, hardware, mounts, envs, name,
              timeout, stop, runs_dir, dry_run):
    """Serve MODEL (a Hugging Face folder, e.g. from `rlbox merge`) with vLLM's OpenAI server on
    the NPUs, wait until it answers, print the endpoint. `rlbox serve --stop` ends it.

    \b
    rlbox serve /data/qwen3-32b-after-rl --image verl_pt27_25rc3:a3-arm --tp 8
    rlbox serve /data/qwen3-32b-after-rl --sim          # stub server on a simulated node
    rlbox serve --stop
    """
    from rlbox.training import serve as serve_mod
    from rlbox.cluster.spec import Mount, from_hosts
    from rlbox.cluster.hosts import connect, count_devices
    from rlbox.cluster.launch import _nofile, _pairs, host_arch_variant

    state_path = _serve_state(runs_dir, name)
    if stop:
        if not state_path.is_file():
            raise RlboxError(f"no server named '{name}' under {runs_dir} (rlbox serve MODEL --name {name} starts one)")
        state = json.loads(state_path.read_text())
        node = connect(serve_mod.host_of(state))
        try:
            removed = serve_mod.stop(node.client, name)
        finally:
            node.close()
        state_path.unlink()
        click.echo(f"server {name}: removed {removed} container(s) on {state['host']}")
        return
    if not model:
        raise RlboxError("serve: give MODEL (a Hugging Face model folder), or --stop")
    if hosts and sim:
        raise RlboxError("give --hosts or --sim, not both")
    host_list = from_hosts(hosts).hosts if hosts else (_local_host(),)
    if len(host_list) != 1:
        raise RlboxError(f"--hosts {hosts}: serve runs on one host")
    host = host_list[0]
    m = _matrix()
    if sim:
        image_ref, _ = m.image_for(image or f"rlbox_sim:{host_arch_variant()}")
        npus = m.hardware[hardware].npus_per_node
    else:
        image_ref = _image_ref(image, "serve")
        npus = count_devices(host) if not dry_run else tp * dp
        if npus == 0:
            raise RlboxError(f"{host.name}: no /dev/davinci* devices; is the Ascend driver installed? (--sim rehearses without NPUs)")
    p = serve_mod.plan(name=name, model=str(Path(model).expanduser().resolve()) if host.local or sim else model,
                       host=host, image=image_ref, sim=sim, tp=tp, dp=dp, max_model_len=max_model_len, port=port,
                       served_model_name=served_model_name, npus_available=npus, hardware=hardware, runs_dir=runs_dir,
                       mounts=[Mount.parse(x) for x in mounts], env=_pairs(list(envs), "--env"),
                       nofile=_nofile(host if not sim else _local_host(), None))
    if dry_run:
        click.echo(p.describe(), nl=False)
        return
    if (host.local or sim) and not Path(p.model).is_dir():
        raise RlboxError(f"MODEL {p.model} is not a folder")
    node = connect(host)
    try:
        url = serve_mod.start(p, node, timeout=timeout, echo=_note, state_path=state_path, hardware=hardware,
                              driver="25.3.rc1")
    finally:
        node.close()
    _note(f"serving {p.model} as '{served_model_name}'" + (" (SIMULATED: rlbox's stub server, no vLLM)" if sim else "")
          + f"; stop with `rlbox serve --stop --name {name}`")
    click.echo(url)


def _local_host():
    from rlbox.cluster.spec import Host

    return Host(name="localhost", transport="local")


@cli.command("eval")
@click.argument("model", required=False)
@click.option("--dataset", default="aime2024", show_default=True, help="aime2024, math500, or an AISBench dataset config (..._gen).")
@click.option("--repeat", type=int, default=16, show_default=True, help="AISBench runs to average (seed 000: 16).")
@click.option("--endpoint", help="The server: http://HOST:PORT (default: the one `rlbox serve --name NAME` started).")
@click.option("--name", default="serve", show_default=True, help="Without --endpoint: the server `rlbox serve --name NAME` started.")
@click.option("--max-seq-len", type=int, help="AISBench max_seq_len (default 2048).")
@click.option("--max-out-len", type=int, help="AISBench max_out_len (default: the server's max-model-len - max_seq_len = 20480).")
@click.option("--batch-size", type=int, default=48, show_default=True, help="AISBench batch_size (concurrent requests).")
@click.option("--temperature", type=float, default=0.5, show_default=True, help="generation_kwargs temperature (seed: 0.5, top_k 10, top_p 0.95, repetition_penalty 1.03).")
@click.option("--ais-bench", "ais_bench", envvar="RLBOX_AIS_BENCH", help="The ais_bench command (default: ais_bench on PATH; env RLBOX_AIS_BENCH).")
@click.option("--ais-datasets", type=click.Path(path_type=Path, file_okay=False),
              help="AISBench's dataset folder (AIS_BENCH_DATASETS_CACHE: holds ais_bench/datasets/aime/aime.jsonl).")
@click.option("--out", "out", type=click.Path(path_type=Path, dir_okay=False), help="Result JSON (default: RUNS_DIR/eval/<model>-<dataset>-<time>.json).")
@click.option("--compare", "compare_files", nargs=2, type=click.Path(path_type=Path, dir_okay=False),
              metavar="BEFORE.json AFTER.json", help="Print the before/after table of two results and the gain; run nothing.")
@RUNS_DIR
def eval_cmd(model, dataset, repeat, endpoint, name, max_seq_len, max_out_len, batch_size, temperature, ais_bench,
             ais_datasets, out, compare_files, runs_dir):
    """Evaluate MODEL served at an OpenAI endpoint with AISBench, --repeat times, averaged.

    \b
    rlbox eval /data/qwen3-32b --dataset aime2024 --repeat 16     # the server of `rlbox serve`
    rlbox eval after-rl --endpoint http://10.0.0.1:6380 --repeat 16 --out after.json
    rlbox eval --compare before.json after.json
    """
    from rlbox.training import evaluate as ev

    if compare_files:
        rows = ev.compare(ev.load_result(compare_files[0]), ev.load_result(compare_files[1]))
        _print_rows(rows)
        return
    if not model:
        raise RlboxError("eval: give MODEL (a label for the results: the model's path or name), or --compare A B")
    if endpoint:
        ep = ev.Endpoint.parse(endpoint)
    else:
        state_path = _serve_state(runs_dir, name)
        if not state_path.is_file():
            raise RlboxError(f"eval: no --endpoint and no server named '{name}' under {runs_dir} (rlbox serve MODEL)")
        state = json.loads(state_path.read_text())
        ep = ev.Endpoint.parse(state["url"], state.get("max_model_len"), source=f"rlbox serve --name {name}")
    generation = dict(ev.GENERATION, temperature=temperature)
    p = ev.plan(model=model, dataset=dataset, endpoint=ep, repeat=repeat, executable=ais_bench, out_dir=runs_dir,
                max_seq_len=max_seq_len, max_out_len=max_out_len, batch_size=batch_size, generation=generation,
                datasets_cache=ais_datasets.resolve() if ais_datasets else None)
    served = ev.check_endpoint(ep)
    config = ev.write_config(p, _note)
    _note(f"{config} -> {ep.url} (model '{served}', max_seq_len {p.max_seq_len}, max_out_len {p.max_out_len}); "
          f"{repeat} run(s) of: {' '.join(p.argv(1)[:5])}")
    for i in range(1, repeat + 1):
        ev.run_once(p, i, _note)
    res = ev.result(p, served)
    path = out or (runs_dir / "eval" / f"{p.work.name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    _print_rows([["dataset", "version", "metric", "mode", ev.MODEL_ABBR],
                 [res["dataset"], res["version"], res["metric"], res["mode"], f"{res['mean']:.2f}"]])
    _note(f"mean of {repeat} run(s): {', '.join(f'{r.value:.2f}' for r in p.runs)}; saved {path}")


def _print_rows(rows: list[list[str]]) -> None:
    """A result table in the seed's markdown form (| dataset | version | ... |)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    click.echo(line(rows[0]))
    click.echo("| " + " | ".join("-" * w for w in widths) + " |")
    for r in rows[1:]:
        click.echo(line(r))


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
