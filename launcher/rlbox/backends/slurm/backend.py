"""`rlbox run --backend slurm`: ask Slurm for N whole nodes (``--gres-npus``: and their NPUs as
GRES npu), then run the hosts path on exactly the nodes it gives, in its order (Ray's head on the
first), while the allocation is held; end it (`scancel`) when the run ends. Slurm ending the
allocation (its time limit, a cancel) or marking a node DOWN ends the run with one line."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from rlbox.backends import hosts as hosts_backend
from rlbox.backends.base import Backend, Io, RunOptions
from rlbox.backends.slurm import execute as sx
from rlbox.backends.slurm import plan as sp
from rlbox.cluster import launch
from rlbox.cluster.ending import Ended, cleanup_of
from rlbox.cluster import spec as cluster
from rlbox.core import names as run_names
from rlbox.core.errors import RlboxError


@dataclass(frozen=True)
class Planned:
    slurm: sp.SlurmPlan
    spec: cluster.ClusterSpec | None

    def describe(self) -> str:
        return self.slurm.describe()

    def as_dict(self) -> dict:
        return self.slurm.as_dict()


def derived_cluster(spec: cluster.ClusterSpec | None, source: Path | None, picked: list[str]) -> str:
    """The cluster file of the run's nodes: the given file's settings, its hosts narrowed to (and
    ordered as) PICKED; without a file, the nodes by name with ssh's defaults."""
    if spec is None or source is None:
        return yaml.safe_dump({"hosts": [{"host": h} for h in picked]}, sort_keys=False)
    data = yaml.safe_load(source.read_text())
    if not isinstance(data, dict):  # a hostfile
        return yaml.safe_dump({"hosts": [{"host": h} for h in picked]}, sort_keys=False)
    by_name = {str(e["host"]).split("@")[-1].split(":")[0] if isinstance(e, dict) else str(e): e for e in data["hosts"]}
    data.pop("slurm", None)
    data["hosts"] = [by_name.get(h, {"host": h}) for h in picked]
    return yaml.safe_dump(data, sort_keys=False)


def _node_plan(req: launch.RunRequest, spec, names: list[str]):
    with tempfile.TemporaryDirectory(prefix="rlbox-slurm-plan-") as tmp:
        path = Path(tmp) / "nodes.yaml"
        path.write_text(derived_cluster(spec, req.cluster_file, names))
        plan, _ = launch.prepare(replace(req, cluster_file=path, hosts=None, nodes=len(names), dry_run=True))
    return plan


class SlurmBackend(Backend):
    name = "slurm"
    options = frozenset({"--partition", "--time", "--gres-npus", "--replace", "--no-doctor"})

    def plan(self, req: launch.RunRequest, opts: RunOptions) -> Planned:
        if req.hosts or req.sim:
            raise RlboxError("--backend slurm takes its nodes from Slurm: give --nodes N (and --cluster FILE for ssh "
                             "settings and the login node), not --hosts or --sim")
        if not req.nodes:
            raise RlboxError("--backend slurm: give --nodes N (how many nodes to ask Slurm for)")
        if opts.gres_npus and isinstance(req.devices, str) and not req.devices.isdigit():
            raise RlboxError(f"--devices {req.devices[:40]}: with --gres-npus Slurm picks the NPU ids; give a count "
                             "(--devices N)")
        run_names.check(req.name, "--name")
        spec = cluster.from_file(req.cluster_file) if req.cluster_file else None
        if spec is not None and spec.nodes >= req.nodes:
            shown = [h.name for h in spec.hosts[:req.nodes]]
        else:
            shown = [f"slurm-node{i}" for i in range(1, req.nodes + 1)]
        nodes = _node_plan(req, spec, shown)
        slurm = sp.plan_slurm(name=req.name, nodes=req.nodes, partition=opts.partition or (spec.slurm_partition if spec else None),
                              time=opts.time, npus=nodes.npus_per_node if opts.gres_npus else None,
                              login=spec.slurm_login if spec else None,
                              node_commands=f"# (shown on {', '.join(shown)}: the nodes Slurm gives take their places)\n" + "\n".join(f"#   {line}" if line and not line.startswith("#") else line
                                                      for line in nodes.describe().splitlines()))
        return Planned(slurm, spec)

    def submit(self, planned: Planned, req: launch.RunRequest, opts: RunOptions, io: Io) -> None:
        plan, spec = planned.slurm, planned.spec
        run_dir = run_names.inside(req.runs_dir, req.name, what="--name")
        slurm = sx.Slurm(sx.login_host(spec))
        job, nodelist = sx.allocate(slurm, plan, run_dir, opts.timeout, io.echo)
        watch = None
        try:
            names, addrs = sx.nodes_of(slurm, plan, nodelist)
            listed = [h.name for h in spec.hosts] if spec else list(addrs.values())
            picked = [listed[i] for i in sp.map_nodes(names, addrs, listed)]
            io.echo(f"slurm: job {job} runs on {', '.join(f'{n} ({h})' for n, h in zip(names, picked))}; "
                    f"Ray's head on {names[0]}")
            given = sx.npu_ids(slurm, plan, job) if plan.npus else {}
            devices_of = {h: given[n] for n, h in zip(names, picked) if n in given}
            if given:
                io.echo("slurm: NPU ids (GRES npu) " + ", ".join(f"{n}: {sp.ids_text(given[n])}" for n in names if n in given))
            nodes_file = run_dir / "slurm-nodes.yaml"
            nodes_file.write_text(derived_cluster(spec, req.cluster_file, picked))
            record = json.loads(sx.record_path(run_dir).read_text()) | {"nodelist": nodelist, "nodes_of_job": names,
                                                                      "hosts": picked,
                                                                      "npu_ids": {n: list(i) for n, i in given.items()}}
            sx.record_path(run_dir).write_text(json.dumps(record) + "\n")
            hreq = replace(req, cluster_file=nodes_file, hosts=None, nodes=len(picked), devices_of=devices_of)
            hplan, hrun_dir = launch.prepare(hreq)
            watch = sx.Watch(slurm, plan, job, names)
            watch.start()
            try:
                outcome = hosts_backend.run_plan(hplan, hrun_dir, hreq, replace(opts, detach=False, keep=False), io)
            except RlboxError as err:
                if watch.ended:
                    raise RlboxError(ended_line(watch.ended, req.name, err), exit_code=2) from None
                raise
            if watch.ended and outcome.exit_code:
                raise RlboxError(f"{watch.ended} (run '{req.name}')", exit_code=2)
            if outcome.exit_code:
                raise RlboxError(f"job of run '{req.name}' {outcome.ended or f'{outcome.status} with exit code {outcome.exit_code}'}; "
                                 f"log: {outcome.log_path}", exit_code=outcome.exit_code)
        finally:
            if watch is not None:
                watch.done.set()
            why = sx.cancel(slurm, job)
            io.echo(f"slurm: job {job} ended (scancel)" if why is None else f"slurm: scancel {job}: {why}")

    def _recorded(self, runs_dir: Path, name: str) -> tuple[sx.Slurm, str]:
        """The run's allocation record (slurm.json, read back as input): where to ask Slurm, the job id."""
        run_dir = run_names.inside(runs_dir, name, what="--name")
        path = sx.record_path(run_dir)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise RlboxError(f"{path}: not a readable allocation record ({err}); scancel the run's job by hand") from None
        job, login = (record.get("job"), record.get("login")) if isinstance(record, dict) else (None, None)
        if not isinstance(job, str) or not job.isdigit() or (login is not None and not isinstance(login, str)):
            raise RlboxError(f"{path}: field job must be a Slurm job id and login a host name; scancel the run's job by hand")
        spec = None
        nodes_file = run_dir / "slurm-nodes.yaml"
        if login:
            spec = cluster.from_file(nodes_file) if nodes_file.exists() else None
            spec = replace(spec, slurm_login=login) if spec else cluster.ClusterSpec((cluster.Host(name=login),), slurm_login=login)
        return sx.Slurm(sx.login_host(spec)), job

    def stop(self, runs_dir: Path, name: str, io: Io) -> None:
        """scancel the run's allocation (its containers are removed by `rlbox stop` as for hosts)."""
        slurm, job = self._recorded(runs_dir, name)
        why = sx.cancel(slurm, job)
        io.echo(f"slurm: job {job} cancelled (scancel)" if why is None else f"slurm: scancel {job}: {why}")

    def status(self, runs_dir: Path, name: str) -> dict:
        """Slurm's own word on the run's allocation (squeue)."""
        slurm, job = self._recorded(runs_dir, name)
        rc, out, err = slurm.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T|%N|%M|%l"], timeout=10)
        found = sp.judge_status(rc, out, err, job)
        return found | {"line": sp.status_line(found)}


BACKEND = SlurmBackend()


def ended_line(ended: str, run: str, err: RlboxError) -> str:
    """The last line of a run whose allocation Slurm ended (``ended``) while rlbox ran it (``err``: how the
    run failed): what its teardown did and a node it could not reach, as the run's end noted them
    (ending.Ended, ending.cleanup_of); nothing about the nodes where it did not."""
    cleanup = cleanup_of(err)
    unreached = err.unreached if isinstance(err, Ended) else None
    return f"{ended} (run '{run}'" + (f": {cleanup})" if cleanup else ")") + (f"; then {unreached}" if unreached else "")
