"""`rlbox k8s export` and `rlbox run --backend kuberay`: a run as a KubeRay RayJob, checked
(the run's options, the profile, the verl job) before anything is written or applied."""

from __future__ import annotations

from pathlib import Path

import click

from rlbox.cli.common import INT32, MAX_RESTARTS, NAME, SECONDS, IntRange, err
from rlbox.backends import kuberay
from rlbox.cluster import launch
from rlbox.core.config import CLUSTER_NODES
from rlbox.core.errors import RlboxError

PROFILE = click.option("--k8s-profile", "k8s_profile", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                       help="Kubernetes cluster profile YAML: device plugin resource name, namespace, service account, "
                            "pull secret, node selector, tolerations, volumes, scheduler (backend kuberay).")
SCHEDULER = click.option("--scheduler", type=click.Choice(["default", "volcano"]),
                         help="Pod scheduler (backend kuberay; default: the profile's). volcano: gang scheduling "
                              "through KubeRay's Volcano integration.")
QUEUE = click.option("--queue", help="Volcano queue (backend kuberay, with --scheduler volcano).")
DEADLINE = click.option("--deadline", type=IntRange(1, INT32), metavar="SECONDS", help="Seconds the whole job may take (backend kuberay: "
                        "activeDeadlineSeconds; default: none).")


@click.group("k8s")
def k8s_group():
    """A run as Kubernetes objects (KubeRay RayJob)."""


@k8s_group.command("export")
@PROFILE
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Write the RayJob here (`kubectl apply -f FILE`); `-` for stdout.")
@click.option("--nodes", type=IntRange(1, CLUSTER_NODES), help="Pods (Ray nodes), the head included (default: the recipe's).")
@click.option("--image", help="RELEASE:VARIANT from the matrix or a full image reference.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax"]), help="Hardware profile (default: the image's or the recipe's).")
@click.option("--devices", metavar="N|IDS", help="NPUs per pod: a count or ids (default: the profile's npus_per_node, "
              "else the hardware's).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="A volume of the profile the job needs (checked).")
@click.option("--nic", help="Socket interface for HCCL/GLOO/TP inside the pods (default: the profile's, eth0).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra environment for every pod.")
@NAME
@click.option("--recipe", help="A shipped recipe (rlbox recipes list), or the path of a recipe file of your own (holding / or ending in .yaml; read with the same strict schema).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.option("--smoke-test", is_flag=True, help="Job: check that every NPU of every pod is visible through Ray.")
@click.option("--max-restarts", type=IntRange(0, MAX_RESTARTS), metavar="N", help="backoffLimit (default: the recipe's, else 0).")
@click.option("--timeout", type=SECONDS, default=300, show_default=True,
              help="Seconds for the cluster to come up (preRunningDeadlineSeconds).")
@DEADLINE
@SCHEDULER
@QUEUE
@click.option("--num-cpus", "cpus", type=IntRange(0, 4096), help="CPUs each pod offers to Ray.")
@click.option("--verl-version", help="Validate the job against this verl release (PyPI wheel) instead of the image's.")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False), help="... or this verl checkout.")
@click.option("--no-validate", is_flag=True, help="Skip the Hydra validation of a verl job.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def export_cmd(k8s_profile, output, nodes, image, hardware, devices, mounts, nic, envs, name, recipe, params, sets,
               smoke_test, max_restarts, timeout, deadline, scheduler, queue, cpus, verl_version, verl_config,
               no_validate, command):
    """Write a run as a KubeRay RayJob for `kubectl apply -f FILE`.

    \b
    rlbox k8s export --k8s-profile site.yaml --recipe dapo-qwen3-32b-a3 --nodes 4 -o dapo.yaml
    kubectl apply -f dapo.yaml && kubectl get rayjob rlbox-verl -w
    """
    req = launch.RunRequest(nodes=nodes, image=image, hardware=hardware, devices=devices, mounts=list(mounts), nic=nic,
                            env=list(envs), name=name, recipe=recipe, params=list(params), sets=list(sets),
                            smoke_test=smoke_test, command=list(command), cpus=cpus, max_restarts=max_restarts,
                            dry_run=True)
    plan = kuberay.plan_kuberay(req, k8s_profile, scheduler, queue, timeout, deadline)
    kuberay.validated(plan, recipe=recipe, verl_version=verl_version, verl_config=verl_config, no_validate=no_validate,
                      echo=lambda line: err.print(f"rlbox: {line}", markup=False),
                      warn=lambda line: err.print(f"rlbox: {line}", markup=False))
    if str(output) == "-":
        click.echo(plan.describe(), nl=False)
        return
    try:
        output.write_text(plan.describe(), encoding="utf-8")
    except OSError as e:
        raise RlboxError(f"{output}: cannot write ({e.strerror})") from None
    for line in [f"wrote {output}", *plan.summary(), f"apply: kubectl apply -f {output}"]:
        err.print(f"rlbox: {line}", markup=False, highlight=False)

