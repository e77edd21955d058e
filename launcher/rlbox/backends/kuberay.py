"""The kuberay backend: a run as a KubeRay RayJob (cluster.kuberay renders it, pure), checked
(the run's options, the profile, the verl job) before anything is written or applied; `submit`
is `kubectl apply`. `rlbox k8s export` writes the same plan to a file."""

from __future__ import annotations

from rlbox.backends.base import Backend, Echo, Io, RunOptions
from rlbox.cluster import jobs, k8s_apply, launch, recipes
from rlbox.cluster.preflight import checks
from rlbox.core import engine
from rlbox.core.errors import RlboxError


def plan_kuberay(req: launch.RunRequest, k8s_profile, scheduler, queue, timeout, deadline):
    return launch.prepare_kuberay(req, k8s_profile, scheduler=scheduler, queue=queue, timeout=timeout,
                                  deadline=deadline)


def validated(plan, *, recipe, verl_version, verl_config, no_validate, echo: Echo, warn: Echo) -> None:
    """The verl job checked against the verl that will run, as before a --hosts run."""
    if no_validate or plan.job is None or not jobs.is_verl(list(plan.job.argv)):
        return
    rec = recipes.load(recipe) if recipe else None
    tree = checks.tree_for_validation(image=plan.image_ref or plan.manifest["spec"]["rayClusterSpec"]["headGroupSpec"]
                                      ["template"]["spec"]["containers"][0]["image"],
                                      verl_version=verl_version, verl_config=verl_config, recipe=rec,
                                      client_factory=engine.local_client)
    echo(checks.validate_rayjob(plan, tree, warn=warn))


class KubeRayBackend(Backend):
    name = "kuberay"
    options = frozenset({"--k8s-profile", "--scheduler", "--queue", "--deadline"})

    def check_options(self, opts: RunOptions) -> None:
        stray = [k for k in ("--detach", "--keep", "--replace", "--no-doctor") if k in opts.given()]
        if stray:
            raise RlboxError("--detach, --keep, --replace and --no-doctor are for --backend hosts; a RayJob is "
                             "followed with kubectl and removed by KubeRay (shutdownAfterJobFinishes)")
        super().check_options(opts)

    def plan(self, req: launch.RunRequest, opts: RunOptions):
        if req.hardware == "auto":
            req.hardware = None
        return plan_kuberay(req, opts.k8s_profile, opts.scheduler, opts.queue, opts.timeout, opts.deadline)

    def submit(self, plan, req: launch.RunRequest, opts: RunOptions, io: Io) -> None:
        validated(plan, recipe=req.recipe, verl_version=opts.verl_version, verl_config=opts.verl_config,
                  no_validate=opts.no_validate, echo=io.warn, warn=io.warn)
        answer = k8s_apply.apply(plan)
        for line in [answer, *plan.summary(),
                     f"follow: kubectl get rayjob {plan.name} -n {plan.namespace} -w; "
                     f"kubectl logs -n {plan.namespace} -l job-name={plan.name} -f"]:
            io.warn(line)


BACKEND = KubeRayBackend()
