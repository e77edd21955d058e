"""The `rlbox` command line: thin wrappers over matrix, render, build and provenance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from . import __version__, build, matrix, provenance, render
from . import cluster as cluster_mod
from . import doctor as doctor_mod
from . import jobs as jobs_mod
from . import recipes as recipes_mod
from . import validate as validate_mod
from .errors import RlboxError
from .paths import find_root

out = Console(highlight=False, soft_wrap=True)
if not out.is_terminal:  # piped: never truncate table cells
    out = Console(highlight=False, soft_wrap=True, width=400)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _matrix() -> matrix.Matrix:
    return matrix.load(find_root())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rlbox")
def cli():
    """Reproducible verl images and launcher for Ascend NPU clusters.

    The version matrix lives in images/*.yaml; `rlbox render` turns it into dockerfiles/,
    `rlbox build` builds one variant with BuildKit, `rlbox inspect` reads an image's provenance.
    """


# ---------------------------------------------------------------------------------------------
@cli.group()
def images():
    """The version matrix: releases x hardware variants."""


@images.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable: every variant with its pins.")
def images_list(as_json: bool):
    """List every RELEASE:VARIANT with its hardware, platform and tag."""
    m = _matrix()
    rows = []
    for v in m.variants:
        rows.append(
            {
                "release": v.release.release,
                "variant": v.name,
                "ref": v.ref,
                "hardware": v.hardware_name,
                "chip": v.hardware.chip,
                "soc_version": v.hardware.soc_version,
                "platform": v.platform,
                "tag": v.image,
                "base_image": v.base_image,
                "cann": v.release.cann.version,
                "python": v.release.python,
                "driver_min": v.release.driver.min,
                "dockerfile": str(v.dockerfile),
                "components": {c.name: c.spec.pin() for c in v.components},
                "patches": [p.ref for p in v.patches],
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("RELEASE:VARIANT", "HW", "PLATFORM", "CANN", "PY", "IMAGE", box=None)
    for r in rows:
        table.add_row(r["ref"], r["hardware"], r["platform"], r["cann"], r["python"], r["tag"])
    out.print(table)


# ---------------------------------------------------------------------------------------------
@cli.command("render")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 listing every stale, missing or orphaned file.")
def render_cmd(check: bool):
    """Render templates/ + images/ into dockerfiles/ (Dockerfile and image.json per variant)."""
    m = _matrix()
    if check:
        drift = render.check(m)
        for d in drift:
            click.echo(f"{d.state}: {d.path}")
        if drift:
            raise RlboxError(
                f"{len(drift)} generated file(s) out of date with images/, templates/ or patches/: run `rlbox render`",
                exit_code=1,
            )
        click.echo(f"dockerfiles/ is up to date ({len(m.variants)} variants)")
        return
    changed = render.write(m)
    for path in changed:
        click.echo(f"wrote {path}" if (m.root / path).exists() else f"removed {path}")
    click.echo(f"{len(changed)} file(s) changed, {len(m.variants)} variants rendered")


# ---------------------------------------------------------------------------------------------
def _revision(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "images", "templates", "patches", "dockerfiles"], capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@cli.command("build")
@click.argument("ref", metavar="RELEASE:VARIANT")
@click.option("--platform", help="Target platform; defaults to the variant's (linux/arm64 for A2/A3).")
@click.option("--base-image", help="Use this base instead of the manifest's (e.g. the SWR copy of the CANN image).")
@click.option("--tag", "tags", multiple=True, help="Tag(s) to give the image; default REGISTRY/NAME:VARIANT.")
@click.option("--pip-index", help="PyPI mirror for every pip install (e.g. a local devpi or a CN mirror).")
@click.option("--apt-mirror", help="Replace the distribution's apt mirror (e.g. http://mirrors.example.com/ubuntu).")
@click.option("--git-mirror", help="Rewrite https://github.com/ to this prefix for git sources (e.g. https://gitcode.com/).")
@click.option("--hf-endpoint", help="Hugging Face endpoint baked into the image as HF_ENDPOINT.")
@click.option("--ca-bundle", type=click.Path(path_type=Path), help="Extra CA bundle (PEM) for pip/git/apt during the build; passed as a BuildKit secret, never stored in a layer.")
@click.option("--network", type=click.Choice(["default", "host", "none"]), help="Network for RUN steps (host: reach services on the build host's loopback).")
@click.option("--no-cache", is_flag=True, help="Rebuild every layer.")
@click.option("--push", is_flag=True, help="Push to the registry instead of loading into the local engine.")
@click.option("--dry-run", is_flag=True, help="Print the exact build command and do nothing.")
def build_cmd(ref, platform, base_image, tags, pip_index, apt_mirror, git_mirror, hf_endpoint, ca_bundle, network, no_cache, push, dry_run):
    """Build one variant of the matrix with BuildKit (docker buildx)."""
    m = _matrix()
    variant = m.get(ref)
    drift = [d for d in render.check(m) if d.path.parent == variant.dockerfile.parent]
    if drift:
        raise RlboxError(f"{drift[0].path} is {drift[0].state}: run `rlbox render` before building {ref}")
    p = build.plan(
        variant,
        platform=platform,
        base_image=base_image,
        tags=tags,
        pip_index=pip_index,
        apt_mirror=apt_mirror,
        git_mirror=git_mirror,
        hf_endpoint=hf_endpoint,
        ca_bundle=ca_bundle,
        push=push,
        network=network,
        revision=_revision(m.root),
        no_cache=no_cache,
    )
    if dry_run:
        click.echo(p.command())
        return
    err.print(f"[bold]rlbox[/]: building {ref} -> {', '.join(p.tags)}")
    err.print(f"$ {p.command()}", markup=False)
    build.execute(p)
    err.print(f"[bold]rlbox[/]: built {', '.join(p.tags)}")


# ---------------------------------------------------------------------------------------------
@cli.command("inspect")
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Labels and /etc/rlbox/image.json as JSON.")
def inspect_cmd(image: str, as_json: bool):
    """Show what IMAGE holds: release, hardware, every pinned component and applied patch."""
    info = provenance.inspect(image)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    labels, man = info["labels"], info["manifest"] or {}
    out.print(f"[bold]{image}[/]  {info['id'][:19]}  {info['architecture']}  {info['size'] / 1e6:.0f} MB")
    for key, label in (
        ("ref", "org.opencontainers.image.version"),
        ("hardware", "io.rlbox.hardware"),
        ("platform", "io.rlbox.platform"),
        ("base_image", "org.opencontainers.image.base.name"),
        ("cann", "io.rlbox.cann"),
        ("driver_min", "io.rlbox.driver.min"),
        ("python", "io.rlbox.python"),
    ):
        out.print(f"  {key:11} {man.get(key) or labels.get(label, '-')}")
    out.print(f"  {'revision':11} {labels.get('org.opencontainers.image.revision', '-')}")
    table = Table("COMPONENT", "PIN", "PATCHES", box=None)
    comps = man.get("components") or {
        k.removeprefix("io.rlbox.component."): {"pin": v} for k, v in labels.items() if k.startswith("io.rlbox.component.")
    }
    for name, comp in comps.items():
        patches = ", ".join(p["name"].split("/", 1)[1] for p in comp.get("patches", []))
        table.add_row(name, comp["pin"], patches or "-")
    out.print(table)
    for p in man.get("patches", []):
        out.print(f"  patch {p['name']}  sha256:{p['sha256']}")

# ---------------------------------------------------------------------------------------------
RUNS_DIR = click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
                        envvar="RLBOX_RUNS_DIR", help="Where run state and job logs are kept.")
NAME = click.option("--name", default="verl", show_default=True, help="Run name: labels every container of the run.")


@cli.command("run", context_settings={"ignore_unknown_options": False})
@click.option("--hosts", help="Comma-separated hosts (node 0 is the Ray head): HOST, USER@HOST or USER@HOST:PORT.")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Cluster YAML (per-host ssh, nic, mounts) or a hostfile.")
@click.option("--nodes", type=int, help="Number of nodes; must agree with the hosts given (with --sim: how many to simulate).")
@click.option("--sim", is_flag=True, help="Rehearse on simulated nodes: containers on the local engine, devices mapped from /dev/null.")
@click.option("--image", help="RELEASE:VARIANT from the matrix or a full image reference (default for --sim: rlbox_sim).")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]), help="Hardware profile (default: the image's; a3 for --sim).")
@click.option("--devices", type=int, help="NPUs per node (default: the host's /dev/davinci* count; the profile's for --sim).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Extra mount on every node (models, data, checkpoints).")
@click.option("--nic", help="Socket interface for HCCL/GLOO/TP on every node (default: detected per node, the one routing to the head).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra environment for every node's container.")
@click.option("--privileged", is_flag=True, help="Run node containers privileged (off by default; devices are passed one by one).")
@NAME
@click.option("--replace", is_flag=True, help="Remove a live run of the same name first instead of refusing.")
@click.option("--recipe", help="A shipped recipe (rlbox recipes list).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Recipe parameter (model path, data files, checkpoint dir).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Extra or replacing Hydra override for the recipe.")
@click.option("--smoke-test", is_flag=True, help="Job: check that every NPU of every node is visible through Ray.")
@click.option("--timeout", type=float, default=300, show_default=True, help="Seconds to wait for every NPU to join.")
@click.option("--detach", is_flag=True, help="Return once the job is submitted; follow with `rlbox logs -f`, end with `rlbox stop`.")
@click.option("--keep", is_flag=True, help="Keep the cluster up after the job ends (remove it with `rlbox stop`).")
@click.option("--dry-run", is_flag=True, help="Print per node the exact docker run, the Ray command and the job; touch no host.")
@click.option("--sim-driver", help="Driver version the simulated hosts report (default: the image's minimum).")
@click.option("--num-cpus", "cpus", type=int, help="CPUs each node offers to Ray (default: Ray detects).")
@click.option("--nofile", type=int, help="Open-files limit of node containers (default 65536, capped for the local engine).")
@click.option("--verl-version", help="Validate the job's overrides against this verl release (PyPI wheel) instead of the image's verl.")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Validate against this verl source checkout instead of the image's verl.")
@click.option("--no-validate", is_flag=True, help="Skip the Hydra validation of a verl job.")
@click.option("--no-doctor", is_flag=True, help="Skip the per-node pre-flight checks (rlbox doctor).")
@RUNS_DIR
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_cmd(hosts, cluster_file, nodes, sim, image, hardware, devices, mounts, nic, envs, privileged, name, replace,
            recipe, params, sets, smoke_test, timeout, detach, keep, dry_run, sim_driver, cpus, nofile, verl_version,
            verl_config, no_validate, no_doctor, runs_dir, command):
    """Start the training container on every node, bring up Ray, run the job, tear down.

    A job that fails is triaged first (`rlbox triage`): the nodes' CANN and Ray logs are
    collected into runs/NAME/triage/ and matched against known failures.

    \b
    rlbox run --sim --nodes 4 --hardware a3 --smoke-test
    rlbox run --hosts 10.0.0.1,10.0.0.2 --image verl_pt27_25rc3:a3-arm --mount /data \\
        -- python3 -m verl.trainer.main_ppo data.train_files=/data/train.parquet ...
    rlbox run --cluster cluster.yaml --recipe dapo-qwen3-32b-a3 --param model_path=/data/Qwen3-32B
    """
    from . import launch
    from . import run as runner

    req = launch.RunRequest(
        hosts=hosts, cluster_file=cluster_file, nodes=nodes, sim=sim, image=image, hardware=hardware,
        devices=devices, mounts=list(mounts), nic=nic, env=list(envs), privileged=privileged, name=name,
        recipe=recipe, params=list(params), sets=list(sets), smoke_test=smoke_test, command=list(command),
        runs_dir=runs_dir, sim_driver=sim_driver, cpus=cpus, nofile=nofile, dry_run=dry_run,
    )
    plan, run_dir = launch.prepare(req)
    if dry_run:
        click.echo(plan.describe(), nl=False)
        return

    def echo(line: str) -> None:
        err.print(f"[bold]rlbox[/]: {line}", highlight=False)

    def emit(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    before = launch.checks_before_start(plan, verl_version=verl_version, verl_config=verl_config,
                                        run_validate=not no_validate, run_doctor=not no_doctor, replace=replace,
                                        echo=echo, warn=lambda line: err.print(f"rlbox: {line}", markup=False))

    def triage_after_failure(nodes, log_path):
        from . import triage as triage_mod

        echo("job failed: collecting logs from every node (rlbox triage)")
        targets = [(f"node{n.index}", node.client, n.container.name) for n, node in zip(plan.nodes, nodes)]
        report = triage_mod.triage(name, run_dir, job_log=log_path, targets=targets,
                                   job_env=dict(plan.job.env) if plan.job else {})
        for line in triage_mod.render(report):
            err.print(line, markup=False, highlight=False)

    outcome = runner.execute(plan, run_dir=run_dir, echo=echo, emit=emit, timeout=timeout, replace=replace,
                             detach=detach, keep=keep, before=before, on_failure=triage_after_failure)
    if outcome.exit_code:
        raise RlboxError(f"job of run '{name}' {outcome.status} with exit code {outcome.exit_code}; log: {outcome.log_path}",
                         exit_code=outcome.exit_code)


@cli.command("validate")
@click.option("--hosts", help="Hosts of the cluster (only their number matters here).")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--nodes", type=int, help="Nodes of the cluster the job is for.")
@click.option("--devices", type=int, help="NPUs per node (default: the hardware profile's).")
@click.option("--image", help="RELEASE:VARIANT or image whose verl to validate against (default: the recipe's release).")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]))
@click.option("--verl-version", help="Validate against this verl release's config (PyPI wheel).")
@click.option("--verl-config", type=click.Path(path_type=Path, exists=True, file_okay=False), help="A verl source checkout.")
@click.option("--recipe", help="A shipped recipe.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def validate_cmd(hosts, cluster_file, nodes, devices, image, hardware, verl_version, verl_config, recipe, params, sets, command):
    """Compose a verl job's Hydra config with the verl that will run and check it.

    Unknown keys (with the nearest real key), values of the wrong type, and cluster rules:
    nnodes x n_gpus_per_node equals the cluster's NPUs, rollout TP divides NPUs per node,
    ulysses SP divides the NPU count, train_batch_size divisible by ppo_mini_batch_size,
    ppo_max_token_len_per_gpu holds one sequence, trainer.device=npu, filter_groups only with DAPO.
    """
    from . import launch

    rec = recipes_mod.load(recipe) if recipe else None
    # Only the shape of the cluster matters here: plan it as a simulation of that many nodes.
    if hosts or cluster_file:
        spec = cluster_mod.from_hosts(hosts) if hosts else cluster_mod.from_file(cluster_file)
        cluster_mod.agree(spec, nodes)
        nodes = spec.nodes
    req = launch.RunRequest(nodes=nodes or (rec.nodes if rec else 1), sim=True,
                            hardware=hardware if hardware not in (None, "auto") else (rec.hardware if rec else None),
                            devices=devices, recipe=recipe, params=list(params), sets=list(sets), command=list(command),
                            dry_run=True)
    plan, _ = launch.prepare(req)
    if plan.job is None or not jobs_mod.is_verl(list(plan.job.argv)):
        raise RlboxError("validate: give a verl job (-- python3 -m verl.trainer.main_ppo ... or --recipe NAME)")
    tree = None
    if verl_config or verl_version:
        tree = launch.verl_tree(verl_version, verl_config, None, None)
    else:
        m = matrix.load(find_root())
        ref = image or (m.for_hardware(rec.release, rec.hardware).ref if rec else None)
        if not ref:
            raise RlboxError("validate: say which verl: --image, --verl-version or --verl-config")
        target, _ = m.image_for(ref)
        tree = validate_mod.from_image(provenance.docker_client(), target)
    launch.report(validate_mod.check(tree, list(plan.job.argv), len(plan.nodes), plan.npus_per_node), tree,
                  warn=lambda line: err.print(f"rlbox: {line}", markup=False))
    click.echo(f"valid: {plan.job.argv[2] if len(plan.job.argv) > 2 else ''} with {len(validate_mod.hydra_overrides(list(plan.job.argv)))} overrides "
               f"for {len(plan.nodes)} x {plan.npus_per_node} NPUs against {tree.origin}")


def _state(runs_dir: Path, name: str) -> dict:
    path = runs_dir / name / "state.json"
    if not path.is_file():
        raise RlboxError(f"no run named '{name}' under {runs_dir} (rlbox run --name {name} ...)")
    return json.loads(path.read_text())


def _hosts_of(state: dict):
    from .cluster import Host

    return tuple(Host(name=n["host"], ssh_user=n.get("ssh_user"), ssh_port=n.get("ssh_port"),
                      identity_file=n.get("identity_file"), known_hosts=n.get("known_hosts"),
                      transport=n.get("transport", "auto")) for n in state["nodes"])


@cli.command("doctor")
@click.option("--hosts", help="Comma-separated hosts (node 0 is the Ray head).")
@click.option("--cluster", "cluster_file", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--nodes", type=int)
@click.option("--sim", is_flag=True, help="Check simulated hosts (their stand-in devices, npu-smi and driver).")
@click.option("--image", help="RELEASE:VARIANT or image the run will use.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax", "auto"]))
@click.option("--devices", type=int, help="NPUs per node the run will use.")
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
    from . import launch, sim as sim_mod

    req = launch.RunRequest(hosts=hosts, cluster_file=cluster_file, nodes=nodes, sim=sim, image=image, hardware=hardware,
                            devices=devices, mounts=list(mounts), nic=nic, name=name, runs_dir=runs_dir,
                            sim_driver=sim_driver, dry_run=True)
    plan, _ = launch.prepare(req)
    if plan.sim_files:
        sim_mod.write_hosts(plan)
    checks, took = doctor_mod.run_checks(plan)
    if as_json:
        click.echo(json.dumps({"checks": doctor_mod.as_json(checks), "seconds": round(took, 3)}, indent=2))
    else:
        table = Table("NODE", "CHECK", "", "DETAIL", "FIX", box=None)
        for c in checks:
            table.add_row(c.node, c.name, "[green]✓[/]" if c.ok else "[red]✗[/]", c.detail, "" if c.ok else c.fix)
        out.print(table)
        out.print(f"{sum(c.ok for c in checks)}/{len(checks)} checks passed on {len(plan.nodes)} node(s) in {took:.2f} s")
    if not all(c.ok for c in checks):
        raise RlboxError(f"{sum(not c.ok for c in checks)} check(s) failed", exit_code=1)


@cli.command("status")
@NAME
@RUNS_DIR
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name, runs_dir, as_json):
    """Show a run: its nodes' containers and the job's status."""
    from .hosts import connect_all
    from .plan import LABEL_RUN

    state = _state(runs_dir, name)
    nodes = connect_all(_hosts_of(state))
    rows = []
    try:
        for entry, node in zip(state["nodes"], nodes):
            boxes = [b for b in node.client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={name}"})
                     if b.name == entry["container"]]
            rows.append({"node": entry["index"], "host": entry["host"], "role": entry["role"], "npus": entry["npus"],
                         "container": entry["container"], "state": boxes[0].status if boxes else "absent"})
        job = None
        if state.get("submission_id") and any(r["state"] == "running" for r in rows):
            from .jobs import JobsClient

            url = _dashboard(state, nodes[0])
            job = JobsClient(url).info(state["submission_id"])
    finally:
        for n in nodes:
            n.close()
    if as_json:
        click.echo(json.dumps({"run": name, "phase": state.get("phase"), "nodes": rows, "job": job}, indent=2))
        return
    table = Table("NODE", "HOST", "ROLE", "NPUS", "CONTAINER", "STATE", box=None)
    for r in rows:
        table.add_row(str(r["node"]), r["host"], r["role"], str(r["npus"]), r["container"], r["state"])
    out.print(f"run {name} ({state['run_id']}): {state.get('phase')}, image {state['image']}")
    out.print(table)
    if job:
        out.print(f"job {job.get('submission_id')}: {job.get('status')}  {job.get('message') or ''}")
    elif state.get("status"):
        out.print(f"job: {state['status']} (exit {state.get('exit_code')})")


def _dashboard(state: dict, head_node) -> str:
    if state.get("sim"):
        return f"http://127.0.0.1:{state['ports']['dashboard']}"
    return head_node.forward(state["head"], state["ports"]["dashboard"])


@cli.command("logs")
@NAME
@RUNS_DIR
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
def logs_cmd(name, runs_dir, follow):
    """Print the job's log (from the cluster while it runs, else the saved log file)."""
    from .hosts import connect
    from .jobs import JobsClient, exit_code

    state = _state(runs_dir, name)
    if state.get("phase") in ("finished", "removed") or not state.get("submission_id"):
        log = state.get("log")
        if not log or not Path(log).is_file():
            raise RlboxError(f"run '{name}' has no job log (phase {state.get('phase')})")
        sys.stdout.write(Path(log).read_text())
        return
    node = connect(_hosts_of(state)[0])
    try:
        client = JobsClient(_dashboard(state, node))
        if follow:
            info = client.follow(state["submission_id"], lambda t: (sys.stdout.write(t), sys.stdout.flush()))
            code = exit_code(info)
            if code:
                raise RlboxError(f"job {info.get('status')} with exit code {code}", exit_code=code)
        else:
            sys.stdout.write(client.logs(state["submission_id"]))
    finally:
        node.close()


@cli.command("stop")
@NAME
@RUNS_DIR
def stop_cmd(name, runs_dir):
    """Remove exactly this run's containers (by label) on every node, and its simulation network."""
    from .hosts import connect_all
    from .run import remove_run

    state = _state(runs_dir, name)
    nodes = connect_all(_hosts_of(state))
    try:
        removed = remove_run(nodes, name, (state.get("network") or {}).get("name"))
    finally:
        for n in nodes:
            n.close()
    path = runs_dir / name / "state.json"
    path.write_text(json.dumps(state | {"phase": "removed"}, indent=2))
    click.echo(f"run {name}: removed {removed} container(s) on {len(nodes)} node(s)")


@cli.command("metrics")
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
    from . import metrics as metrics_mod
    from .runs import job_log

    if explain is not None:
        for line in metrics_mod.explain(explain):
            click.echo(line)
        return
    if not run:
        raise RlboxError("rlbox metrics: give RUN (a run name or a log file), or --explain [KEY]")
    log = job_log(runs_dir, run, job)
    m = metrics_mod.parse_file(log)
    chosen = metrics_mod.select(m, [k.strip() for k in keys.split(",") if k.strip()]) if keys else None
    if csv_file:
        try:
            csv_file.write_text(metrics_mod.to_csv(m, chosen))
        except OSError as e:
            raise RlboxError(f"{csv_file}: cannot write ({e.strerror})") from None
        err.print(f"rlbox: wrote {len(m.rows)} step(s) x {len(chosen or m.keys)} metric(s) to {csv_file}", markup=False)
    if plot_file:
        drawn = metrics_mod.plot(m, plot_file, chosen, title=log.name if Path(run).is_file() else f"run {run}, job {log.stem}")
        err.print(f"rlbox: plotted {', '.join(p['key'] for p in drawn['panels'])} to {plot_file} "
                  f"({drawn['width']}x{drawn['height']})", markup=False)
    if as_json:
        click.echo(metrics_mod.to_json(m, chosen))
        return
    shown = chosen or list(metrics_mod.WATCHED)
    table = Table("STEP", *[k.upper() for k in shown], box=None)
    for s in m.steps:
        table.add_row(str(s), *[metrics_mod.fmt(m.rows[s].get(k)) for k in shown])
    out.print(f"{log}: {len(m.rows)} step(s) ({m.steps[0]}..{m.steps[-1]}), {len(m.keys)} metrics", markup=False)
    out.print(table)
    note = metrics_mod.trend(m)
    if note:
        out.print(note, markup=False)


@cli.command("triage")
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
    too few NPUs for nnodes x n_gpus_per_node, ...) live in launcher/rlbox/data/signatures.yaml.
    """
    from . import runs as runs_mod
    from . import triage as triage_mod
    from .hosts import connect_all

    state = runs_mod.state(runs_dir, run)
    folder = runs_mod.run_dir(runs_dir, run)
    log = Path(state["log"]) if state.get("log") and Path(state["log"]).is_file() else None
    if log is None and runs_mod.job_logs(folder):
        log = runs_mod.job_logs(folder)[-1]
    targets, nodes, notes = None, [], []
    if state.get("phase") == "removed":
        notes.append(f"the containers of run '{run}' are gone; matching the job log and what was collected before")
    else:
        try:
            nodes = connect_all(_hosts_of(state))
            targets = [(f"node{e['index']}", node.client, e["container"]) for e, node in zip(state["nodes"], nodes)]
        except RlboxError as e:
            notes.append(f"{e}; matching the job log and what was collected before")
    try:
        job_env = ((state.get("job") or {}).get("runtime_env") or {}).get("env_vars") or {}
        report = triage_mod.triage(run, folder, job_log=log, targets=targets, job_env=job_env)
    finally:
        for n in nodes:
            n.close()
    report.warnings[:0] = notes
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for line in triage_mod.render(report):
        out.print(line, markup=False, highlight=False)


@cli.group()
def recipes():
    """verl runs shipped as data (the seeds' scripts, typos fixed, paths as parameters)."""


@recipes.command("list")
def recipes_list():
    """List the shipped recipes."""
    table = Table("RECIPE", "HW", "NODES", "RELEASE", "DESCRIPTION", box=None)
    for r in recipes_mod.all_recipes():
        table.add_row(r.name, r.hardware, str(r.nodes), r.release, r.description)
    out.print(table)


@recipes.command("show")
@click.argument("name")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE")
def recipes_show(name, params, sets):
    """Show a recipe: source, parameters, environment and the resolved command."""
    import shlex

    from .launch import _pairs

    r = recipes_mod.load(name)
    argv, env = r.resolve(_pairs(list(params), "--param"), list(sets))
    out.print(f"[bold]{r.name}[/]: {r.description}")
    out.print(f"  source: {r.source}\n  release {r.release}, hardware {r.hardware}, {r.nodes} node(s)")
    for k, p in r.params.items():
        out.print(f"  --param {k}={p.default}    {p.help}", markup=False)
    for k, v in env.items():
        out.print(f"  env {k}={v}", markup=False)
    for note in r.notes:
        out.print(f"  note: {note}", markup=False)
    click.echo((f"cd {shlex.quote(r.working_dir)} && " if r.working_dir else "") + " \\\n    ".join(shlex.quote(a) for a in argv))


def main():
    try:
        cli.main(standalone_mode=False)
    except RlboxError as e:
        err.print(f"rlbox: error: {e}", markup=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        err.print("rlbox: aborted")
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
