"""`rlbox images list|outdated|siblings|tags`, `rlbox inspect`, `rlbox diff`: what the matrix says an image is,
what a registry holds of it, and what a built image records about itself."""

from __future__ import annotations

import json
import sys

import click

from rlbox.cli.common import INSECURE, REGISTRY, matrix, matrix_if_any, out, checked_image, checked_url, table_of


@click.group()
def images():
    """The version matrix (releases x hardware variants) and what a registry holds of it."""


@images.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: every variant with its pins.")
def images_list(as_json: bool):
    """List every RELEASE:VARIANT with its hardware, platform, track (stable or pre-release) and tag."""
    from rlbox.core.paths import find_root
    from rlbox.image import matrix_cache

    rows = matrix_cache.rows(find_root())  # the matrix's rows, validated once per content of images/
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = table_of("RELEASE:VARIANT", "HW", "PLATFORM", "CANN", "PY", "TRACK", "IMAGE")
    for r in rows:
        table.add_row(r["ref"], r["hardware"], r["platform"], r["cann"], r["python"], r["track"], r["tag"])
    out.print(table)


@images.command("outdated")
@click.argument("releases", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: one record per release and component.")
@click.option("--fail-on", type=click.Choice(["major", "minor", "patch", "any"]),
              help="Exit 1 when a component is behind by at least this much (any: behind at all): for CI.")
@click.option("--pip-index", callback=checked_url, help="JSON simple-API index to ask (default: the mirror profile's, else https://pypi.org/simple).")
@click.option("--mirror", "mirror", metavar="PROFILE", help="Mirror profile from images/mirrors.yaml whose pip index to ask.")
@click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False), envvar="RLBOX_CA_BUNDLE",
              help="CA bundle (PEM) for an index behind a TLS-inspecting proxy [env RLBOX_CA_BUNDLE].")
def images_outdated(releases, as_json, fail_on, pip_index, mirror, ca_bundle):
    """Every pinned component of each release (default: all) against the newest release on the
    package index, with the age of the pin.

    Asks the index's JSON simple API (PEP 691/700: versions and upload times). A git source is
    compared through the PyPI project its releases are published as (vllm, vllm-ascend, verl,
    transformers, megatron-core), by the version its build reports in the lock; one without such a
    project, and CANN, are listed as unknown (their git tags need GitHub or a mirror). An index that
    cannot be reached, or whose answer is not whole within RLBOX_NET_DEADLINE seconds (default 60)
    or is over 64 MiB or nested too deep, stops the command in one line naming the URL: nothing is
    guessed.
    """
    import datetime as dt

    from rlbox.cli.common import mirror_profile
    from rlbox.core.errors import RlboxError
    from rlbox.image import outdated

    m = matrix()
    profile = mirror_profile(m, mirror)
    index = pip_index or (profile.pip_index if profile and profile.pip_index else None) or outdated.PYPI
    pins = outdated.pins(m, list(releases) or None)
    facts = outdated.gather({p.project for p in pins if p.project}, index, ca_bundle=ca_bundle)
    today = dt.datetime.now(dt.timezone.utc)
    rows = [outdated.compare(p, facts.get(p.project) if p.project else None, today) for p in pins]
    if as_json:
        click.echo(json.dumps({"index": index, "today": today.date().isoformat(), "components": [r.as_dict() for r in rows]},
                              indent=2))
    else:
        table = table_of("RELEASE", "COMPONENT", "PINNED", "PINNED ON", "AGE", "NEWEST", "OF", "NEWEST PRE", "STATUS")
        from rich.text import Text

        for r in rows:  # every cell as text, never markup (versions and names come from files)
            table.add_row(*(Text(c) for c in (
                r.release, r.component, r.pinned, r.pinned_at or "", f"{r.age_days} d" if r.age_days is not None else "",
                r.newest or "", r.newest_at or "", r.newest_pre or "",
                r.status if r.status != "unknown" and r.pinned_at else f"{r.status}: {r.note}")))
        out.print(table)
        for r in rows:  # what keeps a pin where it is, as the manifest says (`blocked:`)
            if r.blocked:
                out.print(f"{r.release} {r.component} {r.pinned}: blocked: {r.blocked}")
        behind = [r for r in rows if r.behind]
        out.print(f"{len(behind)} of {len(rows)} pinned components are behind {index} "
                  f"({sum(r.status == 'unknown' for r in rows)} unknown)", markup=False)
    if fail_on:
        bad = outdated.fails(rows, fail_on)
        if bad:
            first = bad[0]
            raise RlboxError(f"{len(bad)} component(s) behind by at least {fail_on}: first {first.release} {first.component} "
                             f"{first.pinned} < {first.newest}", exit_code=1)


@images.command("siblings")
@click.argument("releases", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: one record per pair.")
def images_siblings(releases, as_json):
    """Whether each release's A2 and A3 variants (same platform) are the same image but for their
    hardware, so that the rehearsal of one covers the other.

    Both are rendered (Dockerfile, image.json, both requirement locks) and every line that differs
    must differ only in a named hardware field (variant, base image, SoC version, chip, hardware,
    NPUs per node, the lock's digest). Exit 1, naming file and line, when anything else differs.
    """
    from rlbox.core.errors import RlboxError
    from rlbox.image import siblings

    m = matrix()
    known = {v.release.release for v in m.variants}
    for r in releases:
        if r not in known:
            raise RlboxError(f"release {r!r} is not in the matrix (rlbox images list)")
    found = [siblings.compare(a, b) for a, b in siblings.pairs(m.variants) if not releases or a.release.release in releases]
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in found], indent=2))
    else:
        for s in found:
            click.echo(s.describe())
    bad = [s for s in found if not s.same_but_for_hardware]
    if bad:
        raise RlboxError(f"{bad[0].release}: {bad[0].a} and {bad[0].b} differ beyond their hardware "
                         f"({bad[0].unexplained[0]}): rehearse both", exit_code=1)


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
    from rlbox.image import transfer
    from rlbox.registry.client import Registry

    repo = transfer.repository_for(matrix_if_any(), repository, registry_host)
    rows = transfer.tag_rows(Registry(repo.registry, insecure=insecure), repo)
    if as_json:
        click.echo(json.dumps({"repository": repo.name, "tags": rows}, indent=2))
        return
    table = table_of("TAG", "DIGEST", "RELEASE:VARIANT", "HW", "PLATFORM")
    for r in rows:
        ref = f"{r['release']}:{r['variant']}" if r["release"] else "-"
        table.add_row(r["tag"], r["digest"], ref, r["hardware"] or "-", r["platform"] or r["architecture"])
    out.print(f"{repo.name}: {len({r['tag'] for r in rows})} tag(s)")
    out.print(table)


@click.command("inspect")
@click.argument("image", callback=checked_image)
@click.option("--json", "as_json", is_flag=True, help="Labels, /etc/rlbox/image.json and the SBOM as JSON.")
@click.option("--packages", is_flag=True, help="List every Python and OS package of the SBOM.")
def inspect_cmd(image: str, as_json: bool, packages: bool):
    """Show what IMAGE holds: release, hardware, every pinned component and applied patch."""
    from rlbox.image import provenance

    info = provenance.inspect(image)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    labels, man = info["labels"], info["manifest"] or {}
    out.print(f"{image}  {info['id'][:19]}  {info['architecture']}  {info['size'] / 1e6:.0f} MB")
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
    from rlbox.image import standins

    standin = standins.describe_labels(labels)
    if standin:
        out.print(f"  {'stand-in':11} {standin.removeprefix('stand-in: ')}, on {labels.get('io.rlbox.standin.base', '-')}; "
                  "not part of the release", markup=False, highlight=False)
    table = table_of("COMPONENT", "PIN", "PATCHES")
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
        table = table_of("KIND", "PACKAGE", "VERSION", "SOURCE")
        for p in sbom["python_packages"]:
            table.add_row("python", p["name"], p["version"], p.get("source") or p.get("location", ""))
        for p in sbom["os_packages"]:
            table.add_row(sbom["os_package_manager"], p["name"], p["version"], "")
        out.print(table)


@click.command("diff")
@click.argument("image_a", callback=checked_image)
@click.argument("image_b", callback=checked_image)
@click.option("--json", "as_json", is_flag=True, help="Every difference as JSON.")
def diff_cmd(image_a: str, image_b: str, as_json: bool):
    """What changed from IMAGE_A to IMAGE_B: image facts, components, patches, Python and OS packages.

    Read from what each image records (labels, /etc/rlbox/image.json, /etc/rlbox/sbom.json), on
    the local engine or, for a reference the engine does not have, from its registry.
    Exits 0 when identical, 1 when they differ.
    """
    from rlbox.image import diff as diff_mod
    from rlbox.image import provenance

    comparison = diff_mod.compare(provenance.record(image_a), provenance.record(image_b))
    if as_json:
        click.echo(json.dumps(comparison.as_dict(), indent=2))
    else:
        for line in diff_mod.lines(comparison):
            click.echo(line)
    sys.exit(0 if comparison.identical else 1)

