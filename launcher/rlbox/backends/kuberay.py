"""The kuberay backend: a run as a KubeRay RayJob (cluster.kuberay renders it, pure), checked
(the run's options, the profile, the verl job) before anything is written or applied; `submit`
is `kubectl apply`, then the run's record of the RayJob (RUNS_DIR/NAME/kuberay.json). `status`,
`logs` and `stop` read that record and ask kubectl: `get rayjob -o json` (judged by
cluster.rayjob_status), `logs -l job-name=NAME` (KubeRay's submitter pod: the job's output),
`delete rayjob` (KubeRay then removes the RayCluster). `rlbox k8s export` writes the same plan to a
file."""

from __future__ import annotations

import shlex
from pathlib import Path

from rlbox.backends.base import Backend, Echo, Io, RunOptions
from rlbox.cluster import k8s_apply, launch, recipes
from rlbox.cluster import rayjob_status as rs
from rlbox.cluster.preflight import checks
from rlbox.core import engine
from rlbox.core import names as run_names
from rlbox.core.errors import RlboxError
from rlbox.verl import job as verl_job
from rlbox.verl import tree as verl_tree


def plan_kuberay(req: launch.RunRequest, k8s_profile, scheduler, queue, timeout, deadline):
    return launch.prepare_kuberay(req, k8s_profile, scheduler=scheduler, queue=queue, timeout=timeout,
                                  deadline=deadline)


def validated(plan, *, recipe, verl_version, verl_config, no_validate, echo: Echo, warn: Echo) -> None:
    """The verl job checked against the verl that will run, as before a --hosts run."""
    if no_validate or plan.job is None or not verl_job.is_verl(list(plan.job.argv)):
        return
    rec = recipes.load(recipe) if recipe else None
    tree = verl_tree.for_validation(image=plan.image_ref or plan.manifest["spec"]["rayClusterSpec"]["headGroupSpec"]
                                    ["template"]["spec"]["containers"][0]["image"],
                                    verl_version=verl_version, verl_config=verl_config, recipe=rec,
                                    client_factory=engine.local_client)
    echo(checks.validate_rayjob(plan, tree, warn=warn))


class KubeRayBackend(Backend):
    name = "kuberay"
    options = frozenset({"--k8s-profile", "--scheduler", "--queue", "--deadline"})
    own_record = True

    def check_options(self, opts: RunOptions) -> None:
        stray = [k for k in ("--detach", "--keep", "--replace", "--no-doctor") if k in opts.given()]
        if stray:
            raise RlboxError("--detach, --keep, --replace and --no-doctor are for --backend hosts; a RayJob is "
                             "followed with `rlbox status/logs` (kubectl) and removed by KubeRay (shutdownAfterJobFinishes)")
        super().check_options(opts)

    def plan(self, req: launch.RunRequest, opts: RunOptions):
        if req.hardware == "auto":
            req.hardware = None
        return plan_kuberay(req, opts.k8s_profile, opts.scheduler, opts.queue, opts.timeout, opts.deadline)

    def submit(self, plan, req: launch.RunRequest, opts: RunOptions, io: Io) -> None:
        validated(plan, recipe=req.recipe, verl_version=opts.verl_version, verl_config=opts.verl_config,
                  no_validate=opts.no_validate, echo=io.warn, warn=io.warn)
        run_dir = run_names.inside(req.runs_dir, run_names.check(req.name, "--name"), what="--name")
        if (run_dir / "state.json").exists() or (run_dir / "slurm.json").exists():
            raise RlboxError(f"run '{req.name}' already has a record of another backend under {run_dir}: "
                             f"`rlbox stop --name {req.name}` and remove the folder, or choose another --name")
        record = rs.Record(run=req.name, name=plan.name, namespace=plan.namespace, context=k8s_apply.current_context(),
                           kind=plan.manifest.get("kind", rs.KIND), api_version=plan.manifest.get("apiVersion", rs.API_VERSION))
        answer = k8s_apply.apply(plan)
        run_dir.mkdir(parents=True, exist_ok=True)
        rs.write_record(run_dir, record)
        for line in [answer, *plan.summary(),
                     f"follow: rlbox status --name {req.name}; rlbox logs -f --name {req.name} "
                     f"(kubectl get rayjob {plan.name} -n {plan.namespace} -w; "
                     f"kubectl logs -n {plan.namespace} -l job-name={plan.name} -f)"]:
            io.warn(line)

    def _recorded(self, runs_dir: Path, name: str) -> rs.Record:
        run_dir = run_names.inside(runs_dir, run_names.check(name, "--name"), what="--name")
        return rs.read_record(run_dir, name)

    def status(self, runs_dir: Path, name: str) -> dict:
        """KubeRay's word on the RayJob (`kubectl get rayjob NAME -n NS -o json`)."""
        rec = self._recorded(runs_dir, name)
        found = rs.judge(k8s_apply.run(["get", "rayjob", rec.name, "-n", rec.namespace, "-o", "json"], rec.context), rec)
        return found | {"line": rs.status_line(found)}

    def stop(self, runs_dir: Path, name: str, io: Io) -> None:
        """Delete the RayJob; KubeRay removes its RayCluster and submitter Job with it."""
        rec = self._recorded(runs_dir, name)
        said = k8s_apply.run(["delete", "rayjob", rec.name, "-n", rec.namespace], rec.context).strip()
        io.echo(f"kuberay: {said or f'rayjob {rec.name} deleted'} (KubeRay removes its RayCluster)")

    def logs(self, runs_dir: Path, name: str, follow: bool, io: Io) -> None:
        """The submitter pod's log (`ray job submit`'s output: the job's), all of it; -f follows."""
        rec = self._recorded(runs_dir, name)
        args = ["logs", "-n", rec.namespace, "-l", f"job-name={rec.name}", "--tail=-1", *(["-f"] if follow else [])]
        wrote, said = k8s_apply.stream(args, lambda line: io.emit(line.rstrip("\n")), rec.context)
        if not wrote and "No resources found" in said:
            raise RlboxError(f"`kubectl {shlex.join(args)}`: no pod labelled job-name={rec.name} in namespace "
                             f"{rec.namespace} (KubeRay starts RayJob {rec.name}'s submitter once its RayCluster is "
                             f"ready, and removes it with the RayJob; `rlbox status --name {name}`)")


BACKEND = KubeRayBackend()
