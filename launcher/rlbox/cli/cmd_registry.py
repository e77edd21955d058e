"""`rlbox push`, `rlbox pull`: images between the local engine and a registry, checked against
the matrix and the host."""

from __future__ import annotations

import click

from rlbox.cli.common import INSECURE, MIRROR, REGISTRY, matrix_if_any, mirror_profile, note, checked_image
from rlbox.core import engine
from rlbox.image import transfer


@click.command("push")
@click.argument("ref", metavar="RELEASE:VARIANT|IMAGE", callback=checked_image)
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
    client = engine.local_client()
    m = matrix_if_any()
    profile = mirror_profile(m, mirror)
    transfer.push_remote(m, ref, registry_host, profile)  # a bad reference is named before the engine is asked
    plan = transfer.plan_push(m, ref, transfer.local_labels(client, m, ref), registry_host=registry_host,
                              extra_tags=extra_tags, immutable=immutable_tag, no_immutable=no_immutable_tag,
                              mirror=profile)
    digest = transfer.push(plan, client, insecure=insecure, echo=note)
    for tag in plan.tags:
        note(f"pushed {plan.repository.name}:{tag}")
    click.echo(f"{plan.repository.name}@{digest}")


@click.command("pull")
@click.argument("ref", required=False, metavar="[RELEASE:VARIANT|IMAGE[@sha256:...]]", callback=checked_image)
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
    m = matrix_if_any()
    facts = transfer.host_facts()
    target = transfer.pull_target(m, ref, hardware=hardware, release=release, registry_host=registry_host, facts=facts,
                                  mirror=mirror_profile(m, mirror))
    for w in transfer.precheck(m, target, facts, force):
        note(f"warning: {w}")
    pulled = transfer.pull(target, engine.local_client(), facts=facts, hardware=m.hardware if m else {},
                           insecure=insecure, force=force, echo=note)
    for w in pulled.warnings:
        note(f"warning: {w}")
    what = f" ({target.variant.ref}, {target.variant.hardware_name}, {target.variant.platform})" if target.variant else ""
    note(f"pulled {pulled.local}{what}" + (f"; also tagged {pulled.also_tagged}" if pulled.also_tagged else ""))
    click.echo(pulled.reference)

