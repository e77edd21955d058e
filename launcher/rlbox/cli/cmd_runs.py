"""`rlbox status`, `rlbox logs`, `rlbox stop`: a run after `rlbox run` started it, read from its
record (runs/NAME/state.json) and its nodes."""

from __future__ import annotations

import json
import sys

import click

from rlbox.cli.common import NAME, RUNS_DIR, out, table_of
from rlbox.cluster import state as run_state
from rlbox.cluster.execute import remove_run
from rlbox.cluster.hosts import connect, connect_all
from rlbox.cluster.jobs import JobsClient, exit_code
from rlbox.cluster.plan import LABEL_RUN
from rlbox.cluster.state import Phase
from rlbox.core.errors import RlboxError


@click.command("status")
@NAME
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name, runs_dir, as_json):
    """Show a run: its nodes' containers and the job's status."""
    state = run_state.load(runs_dir, name)
    nodes = connect_all(state.hosts())
    rows = []
    try:
        for entry, node in zip(state.nodes, nodes):
            boxes = [b for b in node.client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={name}"})
                     if b.name == entry["container"]]
            rows.append({"node": entry["index"], "host": entry["host"], "role": entry["role"], "npus": entry["npus"],
                         "container": entry["container"], "state": boxes[0].status if boxes else "absent"})
        job = None
        if state.submission_id and any(r["state"] == "running" for r in rows):
            job = JobsClient(state.dashboard(nodes[0])).info(state.submission_id)
    finally:
        for n in nodes:
            n.close()
    if as_json:
        click.echo(json.dumps({"run": name, "phase": state.phase_name, "nodes": rows, "job": job,
                               "lost": state.lost, "restarts": list(state.restarts or ())}, indent=2))
        return
    table = table_of("NODE", "HOST", "ROLE", "NPUS", "CONTAINER", "STATE")
    for r in rows:
        table.add_row(str(r["node"]), r["host"], r["role"], str(r["npus"]), r["container"], r["state"])
    out.print(f"run {name} ({state.run_id}): {state.phase_name}, image {state.image}")
    out.print(table)
    if job:
        out.print(f"job {job.get('submission_id')}: {job.get('status')}  {job.get('message') or ''}")
    elif state.status:
        out.print(f"job: {state.status} (exit {state.exit_code})")
    if state.lost:
        out.print(f"lost: {state.lost}", markup=False)
    for line in state.restart_lines():
        out.print(line, markup=False)


@click.command("logs")
@NAME
@RUNS_DIR
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
def logs_cmd(name, runs_dir, follow):
    """Print the job's log (from the cluster while it runs, else the saved log file)."""
    state = run_state.load(runs_dir, name)
    if state.phase in (Phase.FINISHED, Phase.REMOVED) or not state.submission_id:
        log = state.job_log()
        if log is None:
            raise RlboxError(f"run '{name}' has no job log (phase {state.phase_name})")
        sys.stdout.write(log.read_text())
        return
    node = connect(state.hosts()[0])
    try:
        client = JobsClient(state.dashboard(node))
        if follow:
            info = client.follow(state.submission_id, lambda t: (sys.stdout.write(t), sys.stdout.flush()))
            code = exit_code(info)
            if code:
                raise RlboxError(f"job {info.get('status')} with exit code {code}", exit_code=code)
        else:
            sys.stdout.write(client.logs(state.submission_id))
    finally:
        node.close()


@click.command("stop")
@NAME
@RUNS_DIR
def stop_cmd(name, runs_dir):
    """Remove exactly this run's containers (by label) on every node, and its simulation network."""
    state = run_state.load(runs_dir, name)
    nodes = connect_all(state.hosts())
    try:
        removed = remove_run(nodes, name, state.network_name)
    finally:
        for n in nodes:
            n.close()
    state.advance(Phase.REMOVED).save(run_state.state_path(runs_dir, name))
    click.echo(f"run {name}: removed {removed} container(s) on {len(nodes)} node(s)")

