"""What must pass before anything starts, as one hook: the verl job's Hydra config against the
verl that will run (validate), then every node's facts (doctor). `rlbox run` calls it once the
nodes are connected; `rlbox validate` runs the first half alone. What is verl's (which verl, its
checks, the verdict) lives in rlbox.verl; here a run plan becomes their arguments: the nodes, the
NPUs per node, the restarts and the mounts every node shares."""

from __future__ import annotations

from rlbox.cluster.plan import RunPlan
from rlbox.cluster.preflight import doctor as doctor_mod
from rlbox.core.errors import RlboxError
from rlbox.verl import outcome, validate
from rlbox.verl import tree as verl_tree
from rlbox.verl.job import is_verl
from rlbox.verl.outcome import Outcome


def checks_before_start(plan: RunPlan, *, verl_version=None, verl_config=None, run_validate=True, run_doctor=True,
                        replace=False, echo=print, warn=print):
    """The hook `run.execute` calls once the nodes are connected: the verl job's validation,
    then `rlbox doctor`'s checks; either stops the run before any container starts."""
    verl_job = plan.job is not None and is_verl(list(plan.job.argv)) and run_validate

    def before(nodes):
        if verl_job:
            tree = verl_tree.choose(verl_version, verl_config, nodes[0].client, plan.image, echo)
            if tree is not None:
                found = validate.examine(tree, list(plan.job.argv), len(plan.nodes), plan.npus_per_node,
                                         restarts=plan.max_restarts, mounts=shared_mounts(plan),
                                         own=lambda t, req: validate.own_checks(t, req, nodes[0].client,
                                                                                head_mounts(plan)))
                echo(outcome.report(found, verl_tree.about(tree), warn))
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


def examine_plan(plan: RunPlan, argv: list[str], tree, fetch_model=None) -> tuple[Outcome, str]:
    """`rlbox validate`: the plan's verl job ``argv`` (``verl.job.required``) checked against ``tree``, and
    what the verdict is about; ``fetch_model`` (``model_head.fetcher``) brings the model's small files
    when verl's checks stop on them."""
    found = validate.examine(tree, argv, len(plan.nodes), plan.npus_per_node, restarts=plan.max_restarts,
                             mounts=shared_mounts(plan), fetch_model=fetch_model)
    return found, verl_tree.about_job(argv, len(plan.nodes), plan.npus_per_node, tree)


def validate_rayjob(plan, tree, warn) -> str:
    """A KubeRay run's verl job checked as `rlbox run --hosts` checks it, before the manifest is
    written or applied: the pods' shape, restarts, and the profile's writable volumes as mounts."""
    argv = list(plan.job.argv) if plan.job else []
    found = validate.examine(tree, argv, plan.nodes, plan.npus_per_node, restarts=plan.max_restarts,
                             mounts=plan.shared_mounts)
    return outcome.report(found, verl_tree.about(tree), warn)
