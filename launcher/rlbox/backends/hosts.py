"""The hosts backend: containers on the hosts over ssh (`--hosts`, `--cluster`), or on this
machine's engine (`--sim`). The plan is cluster.launch's RunPlan; carrying it out is
cluster.execute with the steps this layer wires in: the image's delivery, the checks before
start, triage after a failed job, and the detached run's log follower."""

from __future__ import annotations

from pathlib import Path

from rlbox.backends.base import Backend, Io, RunOptions
from rlbox.cluster import execute, launch
from rlbox.cluster.preflight import checks
from rlbox.core import engine
from rlbox.core.errors import RlboxError
from rlbox.delivery import execute as deliver
from rlbox.image import standins
from rlbox.training import triage


class HostsBackend(Backend):
    name = "hosts"
    options = frozenset({"--detach", "--keep", "--replace", "--no-doctor"})

    def plan(self, req: launch.RunRequest, opts: RunOptions):
        plan, _ = launch.prepare(req)
        return plan

    def submit(self, plan, req: launch.RunRequest, opts: RunOptions, io: Io) -> None:
        run_dir = _run_dir(req)
        outcome = run_plan(plan, run_dir, req, opts, io)
        if outcome.exit_code:
            raise RlboxError(f"job of run '{req.name}' {outcome.ended or f'{outcome.status} with exit code {outcome.exit_code}'}; "
                             f"log: {outcome.log_path}", exit_code=outcome.exit_code)


def _run_dir(req: launch.RunRequest) -> Path:
    from rlbox.core import names

    return names.inside(req.runs_dir, names.check(req.name, "--name"), what="--name")


def run_plan(plan, run_dir: Path, req: launch.RunRequest, opts: RunOptions, io: Io):
    """The hosts path: checks, delivery, containers, Ray, the job, triage, teardown; the Outcome."""
    standin = standin_of(plan.image)
    if standin:
        io.warn(standin)
    before = checks.checks_before_start(plan, verl_version=opts.verl_version, verl_config=opts.verl_config,
                                        run_validate=not opts.no_validate, run_doctor=not opts.no_doctor,
                                        replace=opts.replace, echo=io.echo, warn=io.warn)

    def triage_after_failure(nodes, log_path):
        io.echo("job failed: collecting logs from every node (rlbox triage)")
        targets = [(f"node{n.index}", node.client, n.container.name) for n, node in zip(plan.nodes, nodes)]
        report = triage.triage(req.name, run_dir, job_log=log_path, targets=targets,
                               job_env=dict(plan.job.env) if plan.job else {})
        for line in triage.render(report):
            io.line(line)
        return triage.retryable(report)

    outcome = execute.execute(plan, run_dir=run_dir, echo=io.echo, emit=io.emit, timeout=opts.timeout,
                              replace=opts.replace, detach=opts.detach, keep=opts.keep, before=before,
                              on_failure=triage_after_failure, max_restarts=plan.max_restarts, tty=io.tty,
                              deliver=deliver.ensure)
    if opts.detach and outcome.status == "RUNNING" and outcome.log_path:  # the log kept here from its first second
        from rlbox.cluster import follower

        pid = follower.start(req.runs_dir, req.name, outcome.log_path)
        io.echo(f"detached: the job's log is kept in {outcome.log_path} by a follower (pid {pid}) until the job ends, "
                f"even if the head dies; `rlbox logs -f --name {req.name}`, `rlbox stop --name {req.name}`")
    return outcome


def standin_of(image: str) -> str | None:
    """'stand-in: ...' when the image (on the local engine, as --sim uses) carries a named stand-in
    (rlbox build --standin), so a run on it is never mistaken for one on the release."""
    try:
        labels = engine.local_client().images.get(image).labels or {}
    except Exception:  # noqa: BLE001 - not on this engine (remote hosts) or no engine: nothing to say
        return None
    return standins.describe_labels(labels)


BACKEND = HostsBackend()
