"""`rlbox metrics`, `rlbox triage`: what a run's job logged, and why it failed."""

from __future__ import annotations

import json
from pathlib import Path

import click

from rlbox.cli.common import RUNS_DIR, err, out, table_of
from rlbox.cluster import state as run_state
from rlbox.cluster.hosts import connect_all
from rlbox.cluster.state import Phase
from rlbox.core.errors import RlboxError
from rlbox.training import metrics, triage


@click.command("metrics")
@click.argument("run", required=False)
@RUNS_DIR
@click.option("--job", metavar="ID", help="Which job of the run: its run id (the log's name) or submission id; default the latest.")
@click.option("--keys", help="Comma-separated metrics for the table, the plot, --csv and --json "
                             "(default: the watched curves for the table and plot, every key for --csv/--json).")
@click.option("--csv", "csv_file", type=click.Path(path_type=Path, dir_okay=False), help="Write every step's metrics (every key, or --keys) to this CSV file.")
@click.option("--json", "as_json", is_flag=True, help="Print every step's metrics (every key, or --keys) as JSON instead of the table.")
@click.option("--plot", "plot_file", type=click.Path(path_type=Path, dir_okay=False),
              help="Draw the curves to this PNG (needs matplotlib: pip install 'rlbox[plot]').")
@click.option("--explain", is_flag=False, flag_value="", default=None, metavar="[KEY]",
              help="What a metric means (from the seeds' glossary); without KEY, every metric.")
def metrics_cmd(run, runs_dir, job, keys, csv_file, as_json, plot_file, explain):
    """Per-step training metrics of a run's verl job, read back from its log.

    RUN is a run name under --runs-dir (its latest job, or --job ID) or a log file. The table
    shows the curves people watch: critic/rewards/mean (should rise), response_length/mean,
    perf/throughput, timing_s/step.

    \b
    rlbox metrics verl
    rlbox metrics verl --plot curves.png --csv metrics.csv
    rlbox metrics --explain critic/rewards/mean
    """
    if explain is not None:
        for line in metrics.explain(explain):
            click.echo(line)
        return
    if not run:
        raise RlboxError("rlbox metrics: give RUN (a run name or a log file), or --explain [KEY]")
    log = run_state.job_log(runs_dir, run, job)
    m = metrics.parse_file(log)
    chosen = metrics.select(m, [k.strip() for k in keys.split(",") if k.strip()]) if keys else None
    if m.skipped_note():
        err.print(f"rlbox: {log}: {m.skipped_note()}", markup=False, highlight=False)
    if csv_file:
        try:
            csv_file.write_text(metrics.to_csv(m, chosen))
        except OSError as e:
            raise RlboxError(f"{csv_file}: cannot write ({e.strerror})") from None
        err.print(f"rlbox: wrote {len(m.rows)} step(s) x {len(chosen or m.keys)} metric(s) to {csv_file}", markup=False)
    if plot_file:
        drawn = metrics.plot(m, plot_file, chosen, title=log.name if Path(run).is_file() else f"run {run}, job {log.stem}")
        err.print(f"rlbox: plotted {', '.join(p['key'] for p in drawn['panels'])} to {plot_file} "
                  f"({drawn['width']}x{drawn['height']})", markup=False)
    if as_json:
        click.echo(metrics.to_json(m, chosen))
        return
    shown = chosen or list(metrics.WATCHED)
    table = table_of("STEP", *[k.upper() for k in shown])
    for s in m.steps:
        table.add_row(str(s), *[metrics.fmt(m.rows[s].get(k)) for k in shown])
    out.print(f"{log}: {len(m.rows)} step(s) ({m.steps[0]}..{m.steps[-1]}), {len(m.keys)} metrics", markup=False)
    out.print(table)
    note = metrics.trend(m)
    if note:
        out.print(note, markup=False)



@click.command("triage")
@click.argument("run")
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (up to 20 hits per signature, with its explanation and source).")
def triage_cmd(run, runs_dir, as_json):
    """Why a run's job failed: collect its logs and match known failure signatures.

    From every node's container (while the run's containers exist, running or stopped): CANN's
    plog directory (/root/ascend/log/debug/plog, and $ASCEND_PROCESS_LOG_PATH when set) and Ray's
    session logs (*.err, *.out, dashboard_agent.log), capped in size, into runs/RUN/triage/
    with the job's log. Once the containers are gone, what was collected before is matched again.
    `rlbox run` does this by itself when the job fails. The signatures (HCCL EI0006 socket
    timeouts, NPUs held by another container, EL0018 host memory, NPU OOM, "No available agent",
    too few NPUs for nnodes x n_gpus_per_node, ...) live in launcher/rlbox/resources/signatures.yaml.
    """
    state = run_state.load(runs_dir, run, folder_is_enough=True)
    folder = run_state.run_dir(runs_dir, run)
    log = state.job_log()
    if log is None and run_state.job_logs(folder):
        log = run_state.job_logs(folder)[-1]
    targets, nodes, notes = None, [], []
    if state.phase == Phase.REMOVED:
        notes.append(f"the containers of run '{run}' are gone; matching the job log and what was collected before")
    else:
        try:
            nodes = connect_all(state.hosts())
            targets = [(f"node{e['index']}", node.client, e["container"]) for e, node in zip(state.nodes, nodes)]
        except RlboxError as e:
            notes.append(f"{e}; matching the job log and what was collected before")
    try:
        report = triage.triage(run, folder, job_log=log, targets=targets, job_env=state.job_env)
    finally:
        for n in nodes:
            n.close()
    report.warnings[:0] = notes
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for line in triage.render(report):
        out.print(line, markup=False, highlight=False)

