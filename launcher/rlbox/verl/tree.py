"""Which verl a job is checked against, and what its verdict is about.

The verl that will run: a source folder or a PyPI version when one is given, else the verl inside
the image (read through an engine), with the commit its release pins when the image carries no
label of it (so the seed commits' rules apply). The cluster's side (which nodes, how many NPUs,
which mounts) is the caller's: ``cluster/preflight/checks.py`` turns a run plan into the
arguments of ``validate.examine``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from rlbox.core.errors import RlboxError
from rlbox.core.paths import find_root
from rlbox.image import matrix
from rlbox.verl import validate
from rlbox.verl.validate import VerlTree


class Release(Protocol):
    """What a recipe says of where it runs (``cluster.recipes.Recipe`` is one)."""
    release: str
    hardware: str


def choose(verl_version, verl_config, client, image, echo=None) -> VerlTree | None:
    """Where the verl config comes from: an explicit folder or version, else the image's verl
    (None, with a notice, when the image has none, as the simulation image)."""
    if verl_config:
        return validate.from_folder(verl_config)
    if verl_version:
        return validate.from_wheel(verl_version)
    try:
        return validate.from_image(client, image)
    except RlboxError as err:
        if "has no verl" in str(err) and echo:
            echo(f"not validated: {err}")
            return None
        raise


def release_pin(variant) -> str | None:
    """The verl commit a release variant pins (None for a PyPI verl or no variant)."""
    return next((c.spec.commit for c in variant.components if c.name == "verl"), None) if variant else None


def for_validation(*, image: str | None, verl_version: str | None, verl_config, recipe: Release | None,
                   client_factory) -> VerlTree:
    """Which verl `rlbox validate` checks against: a folder or PyPI version given, else the verl
    in the image (given, or the recipe's release for its hardware) read through the local engine."""
    if verl_config or verl_version:
        return choose(verl_version, verl_config, None, None)
    m = matrix.load(find_root())
    ref = image or (m.for_hardware(recipe.release, recipe.hardware).ref if recipe else None)
    if not ref:
        raise RlboxError("validate: say which verl: --image, --verl-version or --verl-config")
    target, variant = m.image_for(ref)
    tree = validate.from_image(client_factory(), target)
    pin = release_pin(variant)
    return tree if tree.commit or not pin else replace(tree, commit=pin)  # the release's verl: its rules


def about(tree: VerlTree) -> str:
    """What a run's verdict is about (before `rlbox run` starts the job)."""
    return f"the job's overrides against {tree.origin}"


def about_job(argv: list[str], nodes: int, npus: int, tree: VerlTree) -> str:
    """What `rlbox validate`'s verdict is about: the entrypoint, its overrides, the shape, the verl."""
    return (f"{argv[2] if len(argv) > 2 else ''} with {len(validate.hydra_overrides(argv))} overrides "
            f"for {nodes} x {npus} NPUs against {tree.origin}")
