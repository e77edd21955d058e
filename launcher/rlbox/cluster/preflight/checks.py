"""What must pass before anything starts, as one hook: the verl job's Hydra config against the
verl that will run (validate), then every node's facts (doctor). `rlbox run` calls it once the
nodes are connected; `rlbox validate` runs the first half alone."""

from __future__ import annotations

from dataclasses import replace

from rlbox.cluster import jobs
from rlbox.cluster.plan import RunPlan
from rlbox.cluster.preflight import doctor as doctor_mod
from rlbox.core.errors import RlboxError
from rlbox.core.paths import find_root
from rlbox.image import matrix
from rlbox.verl import outcome, validate
from rlbox.verl.outcome import Outcome


def verl_tree(verl_version, verl_config, client, image, echo=None):
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


def report(found: Outcome, subject: str, warn) -> str:
    """What ran and did not as notes; every problem but the last as a warning and the last as the
    error (one line each); else the verdict line (valid, or partly checked)."""
    for line in found.notes():
        warn(line)
    for p in found.problems[:-1]:
        warn(f"invalid: {p}")
    if found.problems:
        raise RlboxError(outcome.summary(found, subject))
    return outcome.summary(found, subject)


def checks_before_start(plan: RunPlan, *, verl_version=None, verl_config=None, run_validate=True, run_doctor=True,
                        replace=False, echo=print, warn=print):
    """The hook `run.execute` calls once the nodes are connected: the verl job's validation,
    then `rlbox doctor`'s checks; either stops the run before any container starts."""
    verl_job = plan.job is not None and jobs.is_verl(list(plan.job.argv)) and run_validate

    def before(nodes):
        if verl_job:
            tree = verl_tree(verl_version, verl_config, nodes[0].client, plan.image, echo)
            if tree is not None:
                found = validate.examine(tree, list(plan.job.argv), len(plan.nodes), plan.npus_per_node,
                                         restarts=plan.max_restarts, mounts=shared_mounts(plan),
                                         own=lambda t, req: validate.own_checks(t, req, nodes[0].client,
                                                                                head_mounts(plan)))
                echo(report(found, f"the job's overrides against {tree.origin}", warn))
        if run_doctor:
            checks, took = doctor_mod.run_checks(plan, nodes, replace)
            bad = [c for c in checks if not c.ok]
            for c in bad[:-1]:
                warn(f"✗ {c.line()}")
            if bad:
                raise RlboxError(f"pre-flight: {bad[-1].line()}  ({len(bad)} failed check(s); nothing was started; "
                                 "`rlbox doctor` shows all, --no-doctor skips)")
            echo(f"pre-flight: {len(checks)} checks passed on {len(plan.nodes)} node(s) in {took:.2f} s")

    return before


def head_mounts(plan: RunPlan) -> tuple[tuple[str, str], ...]:
    """(source, target) of every mount the head's container gets: verl's checks in the image on the head
    read the model (its config, its tokenizer) where the job will."""
    return tuple((m.source, m.target) for m in plan.nodes[0].container.mounts) if plan.nodes else ()


def shared_mounts(plan: RunPlan) -> tuple[tuple[str, bool], ...]:
    """Each writable mount target every node has, and whether its source is the same on all."""
    per_node = [{m.target: m.source for m in n.container.mounts if not m.read_only} for n in plan.nodes]
    common = set.intersection(*(set(d) for d in per_node)) if per_node else set()
    return tuple(sorted((t, len({d[t] for d in per_node}) == 1) for t in common))


def verl_argv(plan: RunPlan) -> list[str]:
    """The plan's verl job, or the one line that says `rlbox validate` needs one."""
    if plan.job is None or not jobs.is_verl(list(plan.job.argv)):
        raise RlboxError("validate: give a verl job (-- python3 -m verl.trainer.main_ppo ... or --recipe NAME)")
    return list(plan.job.argv)


def tree_for_validation(*, image: str | None, verl_version: str | None, verl_config,
                        recipe, client_factory):
    """Which verl `rlbox validate` checks against: a folder or PyPI version given, else the verl
    in the image (given, or the recipe's release for its hardware) read through the local engine."""
    if verl_config or verl_version:
        return verl_tree(verl_version, verl_config, None, None)
    m = matrix.load(find_root())
    ref = image or (m.for_hardware(recipe.release, recipe.hardware).ref if recipe else None)
    if not ref:
        raise RlboxError("validate: say which verl: --image, --verl-version or --verl-config")
    target, variant = m.image_for(ref)
    tree = validate.from_image(client_factory(), target)
    pin = next((c.spec.commit for c in variant.components if c.name == "verl"), None) if variant else None
    return tree if tree.commit or not pin else replace(tree, commit=pin)  # the release's verl: its rules


def examine_plan(plan: RunPlan, argv: list[str], tree, fetch_model=None) -> tuple[Outcome, str]:
    """`rlbox validate`: the plan's verl job ``argv`` (``verl_argv``) checked against ``tree``, and
    what the verdict is about; ``fetch_model`` (``model_head.fetcher``) brings the model's small files
    when verl's checks stop on them."""
    found = validate.examine(tree, argv, len(plan.nodes), plan.npus_per_node, restarts=plan.max_restarts,
                             mounts=shared_mounts(plan), fetch_model=fetch_model)
    subject = (f"{argv[2] if len(argv) > 2 else ''} with {len(validate.hydra_overrides(argv))} overrides "
               f"for {len(plan.nodes)} x {plan.npus_per_node} NPUs against {tree.origin}")
    return found, subject


def validate_plan(plan: RunPlan, argv: list[str], tree, warn) -> str:
    """The verdict line of ``examine_plan`` (an invalid job raises it, one line)."""
    return report(*examine_plan(plan, argv, tree), warn)


def validate_rayjob(plan, tree, warn) -> str:
    """A KubeRay run's verl job checked as `rlbox run --hosts` checks it, before the manifest is
    written or applied: the pods' shape, restarts, and the profile's writable volumes as mounts."""
    argv = list(plan.job.argv) if plan.job else []
    found = validate.examine(tree, argv, plan.nodes, plan.npus_per_node, restarts=plan.max_restarts,
                             mounts=plan.shared_mounts)
    return report(found, f"the job's overrides against {tree.origin}", warn)
