"""`rlbox status`, `rlbox logs`, `rlbox stop`: a run after `rlbox run` started it, read from its
record (runs/NAME/state.json) and its nodes; a run whose backend keeps its own record (kuberay:
runs/NAME/kuberay.json) is answered by that backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rlbox.backends import base
from rlbox.cli.common import NAME, RUNS_DIR, err, out, table_of
from rlbox.cluster import state as run_state
from rlbox.cluster import watch
from rlbox.cluster.execute import NODE_LOST_EXIT, remove_run
from rlbox.cluster.hosts import connect_all
from rlbox.cluster.jobs import JobsClient, ended, exit_code
from rlbox.cluster.state import Phase
from rlbox.core.errors import RlboxError


LIVE = (Phase.STARTING, Phase.READY, Phase.RUNNING, Phase.RESTARTING)


def _watcher(state, nodes) -> watch.Watch:
    return watch.Watch(watch.expected_of_record(state.nodes, state.addresses), [n["container"] for n in state.nodes],
                       nodes, None)


def _io() -> base.Io:
    return base.Io(echo=lambda line: err.print(f"rlbox: {line}", markup=False), emit=click.echo,
                   warn=lambda line: err.print(f"rlbox: {line}", markup=False), line=click.echo)


def _backend(runs_dir: Path, name: str) -> base.Backend:
    """The backend that made the run (by its record files); one with ``own_record`` (kuberay: no
    state.json) answers status/logs/stop for the run itself."""
    return base.get(base.of_run(run_state.run_dir(runs_dir, name)))


def _keep_log(state, client: JobsClient) -> str | None:
    """A copy of the job's log under the run dir while the head still has it (a detached run
    has no other); the reason when it cannot be taken."""
    if not (state.submission_id and state.log):
        return None
    from rlbox.cluster import follower

    if follower.alive(Path(state.log)):  # a detached run's follower writes the log: it is complete there
        return None
    try:
        client.save_log(state.submission_id, Path(state.log))
    except (RlboxError, OSError) as err:
        return str(err)
    return None


@click.command("status")
@NAME
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name, runs_dir, as_json):
    """Show a run: its nodes' containers and the job's status. A run its record calls live whose
    container stopped, froze or vanished is shown as lost, naming the node (the record may not
    know: rlbox was killed, or the run was detached). A KubeRay run: what KubeRay says of its RayJob."""
    backend = _backend(runs_dir, name)
    if backend.own_record:
        scheduler = backend.status(runs_dir, name)
        if as_json:
            click.echo(json.dumps({"run": name, "backend": backend.name, "scheduler": scheduler}, indent=2))
        else:
            out.print(f"run {name} (--backend {backend.name})", markup=False)
            out.print(scheduler["line"], markup=False)
        return
    state = run_state.load(runs_dir, name)
    from rlbox.cluster import driver

    orphan = driver.gone(run_state.state_path(runs_dir, name).parent) if state.phase in LIVE else None
    if orphan is not None:  # said first: reaching the nodes may take a while
        err.print(f"rlbox: run {name}: its driver, the `rlbox run` of pid {orphan}, is gone", markup=False)
    nodes = connect_all(state.hosts())
    rows = []
    loss = None
    try:
        boxes = _watcher(state, nodes).boxes()
        for entry, box in zip(state.nodes, boxes):
            rows.append({"node": entry["index"], "host": entry["host"], "role": entry["role"], "npus": entry["npus"],
                         "container": entry["container"],
                         "state": "absent" if box.status == watch.GONE else box.status})
        if state.phase in LIVE:
            loss = watch.judge(_watcher(state, []).expected, boxes, None)
        job = None
        if state.submission_id and not loss and any(r["state"] == "running" for r in rows):
            client = JobsClient(state.dashboard(nodes[0]))
            job = client.info(state.submission_id)
            _keep_log(state, client)
    finally:
        for n in nodes:
            n.close()
    scheduler = backend.status(runs_dir, name)  # Slurm's word on its allocation (None: hosts)
    phase = "lost" if loss else state.phase_name
    lost = loss.line() if loss else state.lost
    if orphan is not None and not loss:
        phase = "orphaned"
    driverless = (f"driver: the `rlbox run` of this run (pid {orphan}) is gone: nothing watches the run or tears it "
                  f"down; `rlbox stop --name {name}` removes it") if orphan is not None else None
    if as_json:
        click.echo(json.dumps({"run": name, "phase": phase, "recorded_phase": state.phase_name, "nodes": rows,
                               "job": job, "lost": lost, "reason": state.reason, "driver_gone": orphan,
                               "restarts": list(state.restarts or ()), "scheduler": scheduler}, indent=2))
        return
    table = table_of("NODE", "HOST", "ROLE", "NPUS", "CONTAINER", "STATE")
    for r in rows:
        table.add_row(str(r["node"]), r["host"], r["role"], str(r["npus"]), r["container"], r["state"])
    recorded = f" (its record says {state.phase_name})" if loss or orphan is not None else ""
    out.print(f"run {name} ({state.run_id}): {phase}{recorded}, image {state.image}", markup=False)
    out.print(table)
    if scheduler:
        out.print(scheduler["line"], markup=False)
    if job:
        out.print(f"job {job.get('submission_id')}: {job.get('status')}  {job.get('message') or ''}", markup=False)
    elif state.status:
        out.print(f"job: {state.status} (exit {state.exit_code})")
    if driverless:
        out.print(driverless, markup=False)
    if lost:
        out.print(f"lost: {lost}", markup=False)
    elif state.reason:
        out.print(f"reason: {state.reason}", markup=False)
    for line in state.restart_lines():
        out.print(line, markup=False)


@click.command("logs")
@NAME
@RUNS_DIR
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends (or a node of the run is lost).")
def logs_cmd(name, runs_dir, follow):
    """Print the job's log (from the cluster while it runs, else the saved log file). What is
    read from the cluster is also kept under the run dir. Following ends, naming the node, when
    a node of the run is lost (its container stopped, froze or vanished, or Ray marks it DEAD).
    A KubeRay run: its submitter pod's log (kubectl logs)."""
    backend = _backend(runs_dir, name)
    if backend.own_record:
        backend.logs(runs_dir, name, follow, _io())
        return
    state = run_state.load(runs_dir, name)
    if state.phase not in LIVE or not state.submission_id:
        log = state.job_log()
        if log is None:
            raise RlboxError(f"run '{name}' has no job log (phase {state.phase_name})")
        sys.stdout.write(log.read_text())
        return
    nodes = connect_all(state.hosts())
    try:
        client = JobsClient(state.dashboard(nodes[0]))
        if follow:
            looking = _watcher(state, nodes)
            looking.dashboard = client.base
            try:
                looking.check(force=True)
                info = client.follow(state.submission_id, lambda t: (sys.stdout.write(t), sys.stdout.flush()),
                                     tick=looking.check)
            except watch.NodeLost as lost:
                raise RlboxError(f"run '{name}': {lost}; the job cannot go on (`rlbox status --name {name}`, "
                                 f"`rlbox stop --name {name}`)", exit_code=NODE_LOST_EXIT) from None
            _keep_log(state, client)
            code = exit_code(info)
            if code:
                raise RlboxError(f"job {ended(info)}", exit_code=code)
        else:
            sys.stdout.write(client.logs(state.submission_id))
            _keep_log(state, client)
    finally:
        for n in nodes:
            n.close()


@click.command("stop")
@NAME
@RUNS_DIR
def stop_cmd(name, runs_dir):
    """Remove exactly this run's containers (by label) on every node, and its simulation network.
    The job's log is copied under the run dir first (a detached run's only copy is on its head).
    A KubeRay run: its RayJob is deleted (KubeRay removes the RayCluster)."""
    backend = _backend(runs_dir, name)
    if backend.own_record:
        backend.stop(runs_dir, name, _io())
        return
    state = run_state.load(runs_dir, name)
    nodes = connect_all(state.hosts())
    try:
        kept = None
        if state.submission_id and state.log:
            from rlbox.cluster import follower

            follower.stop(Path(state.log))  # then the head's whole log, where the head still answers
        if state.submission_id and state.phase in LIVE:
            kept = _keep_log(state, JobsClient(state.dashboard(nodes[0]), timeout=5.0))
        removed = remove_run(nodes, name, state.network_name)
    finally:
        for n in nodes:
            n.close()
    if kept:
        err.print(f"rlbox: warning: the job's log could not be copied before the stop ({kept})", markup=False)
    click.echo(f"run {name}: removed {removed} container(s) on {len(nodes)} node(s)")
    if backend.name != "hosts":  # the run's allocation (slurm: scancel)
        backend.stop(runs_dir, name, _io())
    try:
        ended = {}
        if state.phase in LIVE:  # the run did not end by itself: the record says how it did
            from rlbox.cluster import driver

            orphan = driver.gone(run_state.state_path(runs_dir, name).parent)
            ended = {"status": "STOPPED", "reason": "stopped by `rlbox stop`" + (
                f" (its driver, the `rlbox run` of pid {orphan}, was gone)" if orphan is not None else "")}
        state.advance(Phase.REMOVED, **ended).save(run_state.state_path(runs_dir, name))
    except OSError as error:
        raise RlboxError(f"run {name}: its containers are removed, but {run_state.state_path(runs_dir, name)} "
                         f"could not be updated ({error.strerror or error})") from None

