"""`rlbox distribute IMAGE`: put an image on every node that lacks it (a registry pull on every
node, else a stream down a chain or tree of the nodes), verified by image id; `--dry-run` prints the plan."""

from __future__ import annotations

from pathlib import Path

import click

from rlbox.cli.common import checked_image, err, note, out
from rlbox.delivery import execute as deliver
from rlbox.delivery import plan as delivery
from rlbox.delivery.links import links_for
from rlbox.cluster import spec as cluster_spec
from rlbox.core import engine
from rlbox.core.errors import RlboxError


@click.command("distribute")
@click.argument("image", callback=checked_image)
@click.option("--hosts", help="Comma-separated hosts: HOST, USER@HOST or USER@HOST:PORT.")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Cluster YAML (per-host ssh settings) or a hostfile.")
@click.option("--from", "source", metavar="local|NODE",
              help="Stream from this machine's engine (local) or from a node holding the image "
                   "(default: this machine if it has it, else a node that has it).")
@click.option("--via", type=click.Choice(delivery.STREAM_VIAS), default="chain", show_default=True,
              help="chain: each node loads while it forwards to the next ones (a chain; a tree past 16 "
                   "nodes; ssh -A between nodes); "
                   "launcher: this machine streams to every node itself (nodes cannot ssh to each other).")
@click.option("--no-pull", is_flag=True, help="Never pull from the registry the image name gives; stream instead.")
@click.option("--force", is_flag=True, help="Replace a different image held under the same name on a node.")
@click.option("--dry-run", is_flag=True, help="Print the plan (what each node holds, the source, the chain, "
              "the layers left out); touch nothing.")
def distribute_cmd(image, hosts, cluster_file, source, via, no_pull, force, dry_run):
    """Deliver IMAGE to every node whose engine lacks it, then check every node by image id.

    A name with a registry (HOST[:PORT]/PATH:TAG) is pulled on every node at once; a node whose
    pull fails, or a name without a registry, gets the image streamed from this machine (or
    directly from a node that holds it) down a chain of nodes (a binary tree past 16), each
    loading while it forwards, so N nodes take about the time of one. Each node is sent only the
    layers it lacks. A node holding
    a different image under the name is refused, named with both ids, unless --force.

    \b
    rlbox distribute verl_pt27_25rc3:a3-arm --cluster cluster.yaml --dry-run
    rlbox distribute registry.example.com:5000/rlbox/verl:a3-arm --hosts n1,n2,n3,n4
    """
    if bool(hosts) == bool(cluster_file):
        raise RlboxError("say where: --hosts H1,H2,... or --cluster FILE (one of them)")
    spec = cluster_spec.from_hosts(hosts) if hosts else cluster_spec.from_file(cluster_file)
    # Ctrl-C and SIGTERM: one cleanup path, never interrupted itself; the links (the connections every
    # session of the delivery shares) end with it
    with engine.sigterm_as_interrupt(), links_for(spec.hosts, agent=via == "chain" and not dry_run) as links:
        plan, by_label = deliver.make_plan(image, spec.hosts, force=force, via=via, source=source, pull=not no_pull,
                                           links=links)
        if dry_run:
            out.print(plan.describe(), end="")
            return
        refused = delivery.refusal(plan)
        if refused:
            raise RlboxError(refused)
        for line in plan.describe().splitlines():
            note(line)
        if not plan.needed:
            return
        report = deliver.carry_out(plan, by_label, note, tty=err.is_terminal, links=links)
    how = []
    if report.delivered:
        how.append(f"streamed to {len(report.delivered)} ({delivery.human(report.sent)} sent)")
    if report.pulled:
        how.append(f"pulled on {len(report.pulled)}")
    note(f"{image}: {', '.join(how)} in {report.seconds:.1f} s; every node verified by image id "
         f"{delivery.short(plan.image_id) if plan.image_id else ''}".rstrip())


