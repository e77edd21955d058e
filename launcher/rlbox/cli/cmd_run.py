"""`rlbox run`, `rlbox validate`, `rlbox doctor`: plan a run from the options, check it (the verl
job's config, every node's facts), print the plan or carry it out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.text import Text

from rlbox.backends import base
from rlbox.cli import cmd_k8s
from rlbox.core.config import CLUSTER_NODES
from rlbox.cli.common import MAX_RESTARTS, NAME, RUNS_DIR, SECONDS, IntRange, err, out, table_of
from rlbox.cluster import launch
from rlbox.cluster import sim as sim_hosts
from rlbox.cluster.preflight import checks, doctor, model_head
from rlbox.core import engine
from rlbox.core.errors import RlboxError
from rlbox.verl import job as verl_job
from rlbox.verl import outcome
from rlbox.verl import tree as verl_tree


@click.command("run", context_settings={"ignore_unknown_options": False})
@click.option("--backend", type=click.Choice(list(base.NAMES)), default="hosts", show_default=True,
              help="hosts: containers over ssh (--hosts/--cluster/--sim); slurm: --nodes N from Slurm, then the hosts "
                   "path on its nodes (--partition, --time; --dry-run prints the batch script and the per-node commands); "
                   "kuberay: a KubeRay RayJob on --nodes pods (--k8s-profile; --dry-run prints the manifest, else `kubectl apply`).")
@click.option("--partition", help="Slurm partition (backend slurm; default: the cluster file's slurm.partition, else Slurm's default).")
@click.option("--time", "time_limit", metavar="T", help="Slurm time limit of the allocation (backend slurm): MINUTES, HH:MM:SS, D-HH:MM.")
@click.option("--gres-npus", is_flag=True, help="Ask Slurm for K NPUs of each node as GRES npu:K (K: --devices N, the recipe's or "
              "the hardware's) instead of whole nodes: another run may share the nodes on the other NPU ids; the run uses "
              "the ids Slurm allocated on each node (backend slurm).")
@cmd_k8s.PROFILE
@cmd_k8s.SCHEDULER
@cmd_k8s.QUEUE
@cmd_k8s.DEADLINE
@click.option("--hosts", help="Comma-separated hosts (node 0 is the Ray head): HOST, USER@HOST or USER@HOST:PORT.")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Cluster YAML (per-host ssh, nic, mounts) or a hostfile.")
@click.option("--nodes", type=IntRange(1, CLUSTER_NODES), help="Number of nodes; must agree with the hosts given (with --sim: how many to simulate, at most 253).")
@click.option("--sim", is_flag=True, help="Rehearse on simulated nodes: containers on the local engine, devices mapped from /dev/null.")
@click.option("--image", help="RELEASE:VARIANT from the matrix or a full image reference (a variant's own, as pulled from SWR, is that variant: its hardware, recipe forms and NPU env policy; default for --sim: rlbox_sim).")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]), help="Hardware profile (default: the image's; a3 for --sim).")
@click.option("--devices", metavar="N|IDS", help="NPUs of every node: a count (8: NPUs 0-7) or ids (0-7, 8-15, 0,2,4,6) "
              "so runs can share a host; ports follow the lowest id. Default: the host's /dev/davinci* count "
              "(the profile's for --sim).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Extra mount on every node (models, data, checkpoints).")
@click.option("--nic", help="Socket interface for HCCL/GLOO/TP on every node (default: detected per node, the one routing to the head).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra environment for every node's container.")
@click.option("--privileged", is_flag=True, help="Run node containers privileged (off by default; devices are passed one by one).")
@NAME
@click.option("--replace", is_flag=True, help="Remove a live run of the same name first instead of refusing.")
@click.option("--recipe", help="A shipped recipe (rlbox recipes list), or the path of a recipe file of your own (holding / or ending in .yaml; read with the same strict schema).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Recipe parameter (model path, data files, checkpoint dir); put into the Hydra overrides as one string (a , [ ] { } in it never makes a sweep or a list).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Extra or replacing Hydra override for the recipe.")
@click.option("--smoke-test", is_flag=True, help="Job: check that every NPU of every node is visible through Ray.")
@click.option("--timeout", type=SECONDS, default=300, show_default=True,
              help="Seconds to wait for every NPU to join (kuberay: preRunningDeadlineSeconds).")
@click.option("--detach", is_flag=True, help="Return once the job is submitted; follow with `rlbox logs -f`, end with `rlbox stop`.")
@click.option("--keep", is_flag=True, help="Keep the cluster up after the job ends (remove it with `rlbox stop`).")
@click.option("--max-restarts", type=IntRange(0, MAX_RESTARTS), metavar="N",
              help="On a lost node or a retryable failure (triage), tear down, re-check every node, bring the cluster "
                   "up again and resubmit the job (verl: trainer.resume_mode=auto), up to N times "
                   "(default: the recipe's, else 0).")
@click.option("--dry-run", is_flag=True, help="Print per node the exact docker run, the Ray command and the job; touch no host.")
@click.option("--sim-driver", help="Driver version the simulated hosts report (default: the image's minimum).")
@click.option("--num-cpus", "cpus", type=IntRange(0, 4096), help="CPUs each node offers to Ray (default: Ray detects).")
@click.option("--nofile", type=IntRange(1024, 1 << 20), help="Open-files limit of node containers (default 65536, capped for the local engine).")
@click.option("--verl-version", help="Validate the job's overrides against this verl release (PyPI wheel) instead of the image's verl.")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Validate against this verl source checkout instead of the image's verl.")
@click.option("--no-validate", is_flag=True, help="Skip the Hydra validation of a verl job.")
@click.option("--no-doctor", is_flag=True, help="Skip the per-node pre-flight checks (rlbox doctor).")
@RUNS_DIR
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_cmd(backend, partition, time_limit, gres_npus, k8s_profile, scheduler, queue, deadline, hosts, cluster_file, nodes, sim, image, hardware, devices, mounts, nic, envs, privileged, name, replace,
            recipe, params, sets, smoke_test, timeout, detach, keep, max_restarts, dry_run, sim_driver, cpus, nofile,
            verl_version, verl_config, no_validate, no_doctor, runs_dir, command):
    """Start the training container on every node, bring up Ray, run the job, tear down.

    A node whose engine lacks the image gets it first (as `rlbox distribute` does: a registry
    pull, else a pipelined stream); a node holding another image under the name stops the run.

    A job that fails is triaged first (`rlbox triage`): the nodes' CANN and Ray logs are
    collected into runs/NAME/triage/ and matched against known failures. While the job runs
    every node is watched (its container, Ray's node table): a lost node or head is named
    within seconds and the run fails and is cleaned up, or restarts (--max-restarts).

    \b
    rlbox run --sim --nodes 4 --hardware a3 --smoke-test
    rlbox run --hosts 10.0.0.1,10.0.0.2 --image verl_pt27_25rc3:a3-arm --mount /data \\
        -- python3 -m verl.trainer.main_ppo data.train_files=/data/train.parquet ...
    rlbox run --cluster cluster.yaml --recipe dapo-qwen3-32b-a3 --param model_path=/data/Qwen3-32B
    rlbox run --backend slurm --cluster cluster.yaml --nodes 4 --partition npu --time 2:00:00 --smoke-test
    rlbox run --backend kuberay --k8s-profile site.yaml --recipe dapo-qwen3-32b-a3 --dry-run > dapo.yaml
    """
    req = launch.RunRequest(
        hosts=hosts, cluster_file=cluster_file, nodes=nodes, sim=sim, image=image, hardware=hardware,
        devices=devices, mounts=list(mounts), nic=nic, env=list(envs), privileged=privileged, name=name,
        recipe=recipe, params=list(params), sets=list(sets), smoke_test=smoke_test, command=list(command),
        runs_dir=runs_dir, sim_driver=sim_driver, cpus=cpus, nofile=nofile, dry_run=dry_run, max_restarts=max_restarts,
    )
    opts = base.RunOptions(timeout=timeout, detach=detach, keep=keep, replace=replace, verl_version=verl_version,
                           verl_config=verl_config, no_validate=no_validate, no_doctor=no_doctor,
                           k8s_profile=k8s_profile, scheduler=scheduler, queue=queue, deadline=deadline,
                           partition=partition, time=time_limit, gres_npus=gres_npus)
    chosen = base.get(backend)
    chosen.check_options(opts)
    plan = chosen.plan(req, opts)
    if dry_run:
        click.echo(plan.describe(), nl=False)
        return
    chosen.submit(plan, req, opts, base.Io(
        echo=lambda line: err.print(f"rlbox: {line}"),
        emit=_emit,
        warn=lambda line: err.print(f"rlbox: {line}", markup=False, highlight=False),
        line=lambda line: err.print(line, markup=False, highlight=False),
        tty=err.is_terminal))


def _emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@click.command("validate")
@click.option("--hosts", help="Hosts of the cluster: their number, and the head (node 0), whence the model's small files "
              "are fetched over ssh when verl's checks need them and they are not here.")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Cluster YAML or hostfile: as --hosts (with its ssh settings and mounts).")
@click.option("--nodes", type=IntRange(1, CLUSTER_NODES), help="Nodes of the cluster the job is for.")
@click.option("--devices", metavar="N|IDS", help="NPUs per node, a count or ids (default: the hardware profile's).")
@click.option("--image", help="RELEASE:VARIANT or image whose verl to validate against (default: the recipe's release).")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]))
@click.option("--verl-version", help="Validate against this verl release's config (PyPI wheel).")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False), help="A verl source checkout.")
@click.option("--recipe", help="A shipped recipe (rlbox recipes list), or the path of a recipe file (holding / or ending in .yaml).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Mounts the run will have (where checkpoints go; a model path under one is on the head's SRC).")
@click.option("--max-restarts", type=IntRange(0, MAX_RESTARTS), metavar="N", help="Restarts the run will allow (default: the recipe's).")
@click.option("--strict", is_flag=True, help="Make 'partly checked' an error (exit 3): for CI.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict, the problems and what ran as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def validate_cmd(hosts, cluster_file, nodes, devices, image, hardware, verl_version, verl_config, recipe, params, sets,
                 mounts, max_restarts, strict, as_json, command):
    """Compose a verl job's Hydra config with the verl that will run and check it.

    Unknown keys (with the nearest real key), values of the wrong type, and cluster rules:
    nnodes x n_gpus_per_node equals the cluster's NPUs, rollout TP divides NPUs per node,
    ulysses SP divides the NPU count, train_batch_size divisible by ppo_mini_batch_size,
    ppo_max_token_len_per_gpu holds one sequence, trainer.device=npu, filter_groups only with DAPO;
    interpolations that cannot resolve; verl's own start-up checks, run by that verl's own code where it is (the
    image, or an environment made from the --verl-version wheel); with restarts, that they can resume
    (trainer.save_freq > 0, checkpoints on a mount every node has).

    Where the image has vLLM, also verl's worker-side checks: the rollout server verl starts for vLLM, made
    as verl's replica makes it and launched by verl's own code up to vLLM's engine config (vLLM's argument
    parser, its model, cache, parallel and scheduler checks), stopped before the engine starts. An NPU
    image on a machine without NPUs stops before vLLM, and says so. `rlbox run` runs all of this in the
    image on the head node, with the run's mounts read-only, so the model is read where the job reads it.

    When verl's checks stop on the model's files and the model path is not on this machine, only its
    small files (config, generation config, tokenizer; never weights) are fetched into a temporary
    folder, from the head node over ssh (a path under one of the run's mounts), the image (a path under
    none), or the hub (a hub name, when it answers), and the checks run again against them; one line
    says where each model's files came from.

    The last line is the verdict: `valid: ...` (exit 0) only when every check verl makes before its workers
    start ran; `partly checked: ...` (exit 0; 3 with --strict) names what did not run and how to run it;
    `invalid: ...` (exit 2).
    """
    plan, rec = launch.plan_for_validation(hosts=hosts, cluster_file=cluster_file, nodes=nodes, devices=devices,
                                           hardware=hardware, recipe=recipe, params=list(params), sets=list(sets),
                                           command=list(command), mounts=list(mounts), max_restarts=max_restarts,
                                           image=image)
    argv = verl_job.required(list(plan.job.argv) if plan.job else None)
    tree = verl_tree.for_validation(image=image, verl_version=verl_version, verl_config=verl_config,
                                    recipe=rec, client_factory=engine.local_client)
    fetch_model = model_head.fetcher(hosts=hosts, cluster_file=cluster_file, mounts=list(mounts), image=tree.image,
                                     client_factory=engine.local_client)
    found, subject = checks.examine_plan(plan, argv, tree, fetch_model)
    status = outcome.exit_status(found.verdict, strict)
    if as_json:
        click.echo(json.dumps(outcome.as_json(found, subject, strict), indent=2))
        if status:
            sys.exit(status)
        return
    line = outcome.report(found, subject, warn=lambda line: err.print(f"rlbox: {line}", markup=False))
    if status:
        raise RlboxError(f"{line} (--strict)", exit_code=status)
    click.echo(line)


@click.command("doctor")
@click.option("--hosts", help="Comma-separated hosts (node 0 is the Ray head).")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--nodes", type=IntRange(1, CLUSTER_NODES))
@click.option("--sim", is_flag=True, help="Check simulated hosts (their stand-in devices, npu-smi and driver).")
@click.option("--image", help="RELEASE:VARIANT or image the run will use.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]))
@click.option("--devices", metavar="N|IDS", help="NPUs per node the run will use: a count or ids (0-7, 8-15).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Mounts whose sources must exist on every node.")
@click.option("--nic")
@NAME
@click.option("--sim-driver", help="Driver version the simulated hosts report.")
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True)
def doctor_cmd(hosts, cluster_file, nodes, sim, image, hardware, devices, mounts, nic, name, sim_driver, runs_dir, as_json):
    """Check every node before a run, in parallel: ✓ or ✗ with the fix.

    Engine, device nodes and count, npu-smi chip vs the image's hardware, driver version vs
    what the image's CANN needs, NPUs held by other containers, the run's Ray ports, stale Ray,
    nofile, /dev/shm, the interface routing to the head, disk, the image, mount sources.
    `rlbox run` runs the same checks first and stops on a ✗.
    """
    req = launch.RunRequest(hosts=hosts, cluster_file=cluster_file, nodes=nodes, sim=sim, image=image, hardware=hardware,
                            devices=devices, mounts=list(mounts), nic=nic, name=name, runs_dir=runs_dir,
                            sim_driver=sim_driver, dry_run=True)
    plan, _ = launch.prepare(req)
    if plan.sim_files:
        sim_hosts.write_hosts(plan)
    found, took = doctor.run_checks(plan)
    if as_json:
        click.echo(json.dumps({"checks": doctor.as_json(found), "seconds": round(took, 3)}, indent=2))
    else:
        table = table_of("NODE", "CHECK", "", "DETAIL", "FIX")
        for c in found:
            table.add_row(c.node, c.name, Text("✓", "green") if c.ok else Text("✗", "red"), c.detail, "" if c.ok else c.fix)
        out.print(table)
        out.print(f"{sum(c.ok for c in found)}/{len(found)} checks passed on {len(plan.nodes)} node(s) in {took:.2f} s")
    if not all(c.ok for c in found):
        raise RlboxError(f"{sum(not c.ok for c in found)} check(s) failed", exit_code=1)

