"""From `rlbox run` options to a RunPlan: cluster, image, hardware, devices, job.

Everything here is planning. The one thing read from hosts is their NPU count when it is not
known otherwise (real cluster, no --devices, not a dry run).
"""

from __future__ import annotations

import math
import platform as _platform
import re
import secrets
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlbox.cluster import spec as cluster
from rlbox.cluster import hosts
from rlbox.cluster import jobs
from rlbox.cluster import k8s_profile, kuberay
from rlbox.image import matrix
from rlbox.cluster import recipes
from rlbox.cluster import sharing
from rlbox.cluster import sim
from rlbox.core import names
from rlbox.core.config import parse_env, parse_pairs
from rlbox.core.errors import RlboxError
from rlbox.core.paths import find_root
from rlbox.registry.reference import Reference
from rlbox.cluster.plan import NOFILE, SIM_DRIVER, JobPlan, NpuPolicy, Profile, RunPlan, SimNetwork, plan_run



@dataclass
class RunRequest:
    hosts: str | None = None
    cluster_file: Path | None = None
    nodes: int | None = None
    sim: bool = False
    image: str | None = None
    hardware: str | None = None
    devices: int | str | None = None  # a count, or NPU ids: 0-7, 8-15, 0,2,4,6
    mounts: list[str] = field(default_factory=list)
    nic: str | None = None
    env: list[str] = field(default_factory=list)
    privileged: bool = False
    name: str = "verl"
    recipe: str | None = None
    params: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    smoke_test: bool = False
    command: list[str] = field(default_factory=list)
    runs_dir: Path = Path("runs")
    sim_driver: str | None = None
    cpus: int | None = None
    nofile: int | None = None
    dry_run: bool = False
    max_restarts: int | None = None  # None: the recipe's default (0 without a recipe)
    recipe_release: str | None = None  # the release whose form of the recipe runs (default: the image's)
    devices_of: dict[str, tuple[int, ...]] = field(default_factory=dict)  # host -> NPU ids a scheduler gave (Slurm GRES)


def host_arch_variant() -> str:
    return "arm64" if _platform.machine() in ("aarch64", "arm64") else "amd64"


def _devices_asked(req: RunRequest, recipe: recipes.Recipe | None) -> int | tuple[int, ...] | None:
    """--devices (a count or ids), else the recipe's NPUs per node, else None (the hardware's)."""
    asked = sharing.parse_devices(req.devices) if isinstance(req.devices, str) else req.devices
    if isinstance(asked, int) and asked <= 0:
        raise RlboxError("--devices must be positive")
    return asked if asked is not None else (recipe.devices if recipe else None)


def prepare(req: RunRequest) -> tuple[RunPlan, Path]:
    """The plan for a run and its run directory. Raises RlboxError on any inconsistency (and then
    closes the connections counting the hosts' NPUs opened for the run)."""
    try:
        return _prepare(req)
    except BaseException:
        hosts.close_kept()
        raise


def _prepare(req: RunRequest) -> tuple[RunPlan, Path]:
    recipe = _recipe_for(req)

    # -- hosts ----------------------------------------------------------------------------
    if req.hosts and req.cluster_file:
        raise RlboxError("give --hosts or --cluster, not both")
    if req.hosts:
        spec = cluster.from_hosts(req.hosts)
    elif req.cluster_file:
        spec = cluster.from_file(req.cluster_file)
    elif req.sim:
        n = req.nodes or (recipe.nodes if recipe else None)
        if not n:
            raise RlboxError("--sim needs --nodes N (or --hosts/--cluster naming the nodes)")
        if not 0 < n <= SimNetwork.max_nodes:
            raise RlboxError(f"--nodes {n}: a simulation has 1..{SimNetwork.max_nodes} nodes (one /24 network)")
        spec = cluster.ClusterSpec(tuple(cluster.Host(name=f"sim{i}", transport="local") for i in range(n)), source="--sim")
    else:
        raise RlboxError("no hosts: give --hosts a,b,c, --cluster FILE, or --sim --nodes N")
    cluster.agree(spec, req.nodes)
    if req.sim and spec.nodes > SimNetwork.max_nodes:
        raise RlboxError(f"{spec.source}: {spec.nodes} hosts; a simulation has at most {SimNetwork.max_nodes} (one /24 network)")
    if req.nic and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,14}", req.nic):
        raise RlboxError(f"--nic {req.nic!r}: not an interface name")
    if req.sim:  # simulated nodes live on the local engine unless a host says how to ssh to it
        spec = replace(spec, hosts=tuple(
            replace(h, transport="ssh" if (h.ssh_user or h.ssh_port or h.identity_file) else "local") for h in spec.hosts))
    if req.nic:
        spec = replace(spec, hosts=tuple(replace(h, nic=h.nic or req.nic) for h in spec.hosts))
    if req.mounts:
        spec = replace(spec, mounts=spec.mounts + tuple(cluster.Mount.parse(m) for m in req.mounts))

    # -- image and hardware ---------------------------------------------------------------
    m = matrix.load(find_root())
    image, from_matrix, hardware, profile = _image_and_hardware(req, m, recipe, spec.image, spec.hardware)
    recipe = _recipe_on(recipe, req, m, from_matrix)

    # -- devices --------------------------------------------------------------------------
    asked = _devices_asked(req, recipe)
    if req.devices_of:  # the ids a scheduler allocated on each node, never guessed
        missing = [h.name for h in spec.hosts if not req.devices_of.get(h.name)]
        if missing:
            raise RlboxError(f"{missing[0]}: the scheduler gave no NPU ids for this node")
        devices = {h.name: tuple(req.devices_of[h.name]) for h in spec.hosts}
    elif asked is not None:
        devices = {h.name: asked for h in spec.hosts}
    elif req.sim:
        devices = {h.name: h.sim.devices if h.sim.devices is not None else profile.npus_per_node for h in spec.hosts}
    elif req.dry_run:
        devices = {h.name: profile.npus_per_node for h in spec.hosts}
    else:
        hosts.raise_open_files(len(spec.hosts))  # each count opens the host's engine tunnel, kept for the run
        counts, errors = hosts.on_every(hosts.count_devices, spec.hosts)  # one ssh per host, all at once
        if errors:
            raise errors[0]
        devices = {h.name: n for h, n in zip(spec.hosts, counts)}

    # -- the run ---------------------------------------------------------------------------
    run_id = secrets.token_hex(4)
    run_dir = names.inside(req.runs_dir, names.check(req.name, "--name"), what="--name")
    sim_files = None
    network = None
    if req.sim:
        sim_files = str(run_dir / "sim")
        network = sim.network_for(req.name)
    npus = min(len(v) if isinstance(v, tuple) else v for v in devices.values())
    driver_min = _driver_for(m, image)
    sim_driver = req.sim_driver or driver_min or SIM_DRIVER
    env = tuple(parse_env(req.env).items())
    job, restarts = _job_and_restarts(req, recipe, spec.nodes, npus, run_id)
    plan = plan_run(spec, run=req.name, run_id=run_id, image=image, profile=profile, devices=devices,
                    sim_files=sim_files, network=network, privileged=req.privileged, job=job,
                    extra_env=env, cpus=req.cpus, nofile={h.name: nofile_for(h, req.nofile if req.nofile is not None else spec.nofile) for h in spec.hosts},
                    sim_driver=sim_driver, driver_min=driver_min or (sim_driver if req.sim else None),
                    driver_max=_driver_for(m, image, "max"), npu_policy=npu_policy_for(m, from_matrix),
                    whole_hosts=_whole_hosts(req, asked, spec, devices, profile))
    plan = replace(plan, max_restarts=restarts)
    if req.sim and hardware not in sim.CHIPS:
        raise RlboxError(f"--sim cannot simulate hardware '{hardware}'; choose a2, a3 or ax")
    return replace(plan, image_ref=from_matrix), run_dir


def _whole_hosts(req: RunRequest, asked, spec: cluster.ClusterSpec, devices: dict, profile: Profile) -> frozenset[str]:
    """The hosts whose every NPU the run takes (each then claimed in one claim, sharing.claims): none when
    NPUs were asked for or a scheduler gave them; a host's own count read on it; a simulated host when the
    count is all its stand-in will have (sim.stand_in_count: one with no count of its own has the hardware's
    largest, 16 for an A2 whose runs take 8 by default)."""
    if asked is not None or req.devices_of:
        return frozenset()
    if not req.sim:
        return frozenset(devices)
    return frozenset(h.name for h in spec.hosts
                     if devices[h.name] >= sim.stand_in_count(h.sim.devices, profile.counts, tuple(range(devices[h.name]))))


def _recipe_for(req: RunRequest) -> recipes.Recipe | None:
    """The run's name checked, its recipe loaded, and one job asked for at most."""
    names.check(req.name, "--name")
    recipe = recipes.load(req.recipe) if req.recipe else None
    jobs_given = sum([bool(recipe), bool(req.command), req.smoke_test])
    if jobs_given > 1:
        raise RlboxError("give one job: a command after `--`, --recipe NAME, or --smoke-test")
    if (req.params or req.sets) and not recipe:
        raise RlboxError("--param and --set go with --recipe (a command after `--` takes key=value itself)")
    return recipe


def _recipe_on(recipe: recipes.Recipe | None, req: RunRequest, m: matrix.Matrix, from_matrix: str | None):
    """The recipe as it runs on the release of its image (``req.recipe_release`` for a validation,
    which plans no real image): keys that release's verl renamed are migrated (``Recipe.on``)."""
    if recipe is None:
        return None
    release = req.recipe_release
    if release is None and from_matrix and not req.sim:
        variant = m.image_for(from_matrix)[1]
        release = variant.release.release if variant else None
    return recipe.on(release) if release else recipe


def _image_and_hardware(req: RunRequest, m: matrix.Matrix, recipe: recipes.Recipe | None, spec_image: str | None,
                        spec_hardware: str) -> tuple[str, str | None, str, Profile]:
    """The image reference, the RELEASE:VARIANT it comes from (when from the matrix), the
    hardware and its profile, from --image/--hardware, the cluster file and the recipe."""
    image_ref = req.image or spec_image
    hardware = req.hardware or (spec_hardware if spec_hardware != "auto" else None)
    if hardware and hardware not in cluster.HARDWARE_CHOICES:
        raise RlboxError(f"--hardware {hardware}: choose one of {', '.join(cluster.HARDWARE_CHOICES)}")
    if hardware == "auto":
        hardware = None
    if image_ref:  # before anything asks an engine about it
        _reference(image_ref)
    if req.sim:
        image_ref = image_ref or f"rlbox_sim:{host_arch_variant()}"
        image, variant = m.image_for(image_ref)
        hardware = hardware or (recipe.hardware if recipe else None) or "a3"
    else:
        if not image_ref and recipe:
            hw = hardware or recipe.hardware
            image_ref = m.for_hardware(recipe.release, hw).ref
        if not image_ref:
            raise RlboxError("--image: give RELEASE:VARIANT (see `rlbox images list`) or a full image reference")
        image, variant = m.image_for(image_ref)
        if variant and not (hardware and variant.hardware_name == "sim"):  # a sim image simulates any profile
            if hardware and hardware != variant.hardware_name:
                raise RlboxError(f"--hardware {hardware} disagrees with image {image_ref}, built for {variant.hardware_name}")
            hardware = variant.hardware_name
        elif not hardware:
            raise RlboxError(f"--hardware: image {image_ref} is not from the matrix; say a2, a3 or ax")
    hw = m.hardware[hardware]
    profile = Profile(hardware, hw.npus_per_node, hw.npu_smi_chip, tuple(hw.device_counts))

    _reference(image)
    from_matrix = variant.ref if variant else None  # RELEASE:VARIANT, however the image was named

    return image, from_matrix, hardware, profile


def _job_and_restarts(req: RunRequest, recipe: recipes.Recipe | None, nodes: int, npus: int,
                      run_id: str) -> tuple[JobPlan | None, int]:
    """The job (smoke test, recipe or command; trainer.nnodes/n_gpus_per_node from the cluster)
    and how many restarts the run allows."""
    job: JobPlan | None = None
    if req.smoke_test:
        job = jobs.smoke_job(run=req.name, run_id=run_id)
    elif recipe:
        argv, job_env = recipe.resolve(parse_pairs(req.params, "--param"), list(req.sets))
        job = jobs.plan_job(argv, nodes=nodes, npus_per_node=npus, run=req.name, run_id=run_id,
                            working_dir=recipe.working_dir, env=job_env, description=f"recipe {recipe.name}")
    elif req.command:
        job = jobs.plan_job(list(req.command), nodes=nodes, npus_per_node=npus, run=req.name, run_id=run_id)
    restarts = req.max_restarts if req.max_restarts is not None else (recipe.max_restarts if recipe else 0)
    if restarts < 0:
        raise RlboxError("--max-restarts must be 0 or more")
    if restarts and job is None:
        raise RlboxError("--max-restarts needs a job (a command after `--`, --recipe or --smoke-test)")
    return job, restarts


def _reference(text: str) -> None:
    """An image reference, checked as Docker's grammar has it (one line naming what is wrong)."""
    try:
        Reference.parse(text)
    except RlboxError as err:
        raise RlboxError(f"--image: {err}") from None


def nofile_for(host: cluster.Host, asked: int | None) -> int:
    """The open-files limit for a node: asked, else 65536, held under this machine's hard limit
    for nodes on the local engine (a container cannot exceed the engine's own limit)."""
    if asked is not None:
        return asked
    if host.local:
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY:
            return min(NOFILE, hard)
    return NOFILE


def npu_policy_for(m: matrix.Matrix, ref: str | None) -> NpuPolicy | None:
    """The NPU env policy of the release an image (RELEASE:VARIANT) comes from (images/*.yaml)."""
    variant = m.image_for(ref)[1] if ref else None
    policy = variant.release.ray_npu_env if variant else None
    if policy is None:
        return None
    return NpuPolicy(policy.noset_visible_devices, " ".join(policy.follows.split()), variant.release.release)


def _driver_for(m: matrix.Matrix, image: str, bound: str = "min") -> str | None:
    """The driver bound (min or max) the matrix records for an image it builds."""
    for v in m.variants:
        value = getattr(v.release.driver, bound)
        if v.image == image and value and value != "none":
            return value.lower()
    return None


def plan_for_validation(*, hosts: str | None, cluster_file: Path | None, nodes: int | None, devices: int | None,
                        hardware: str | None, recipe: str | None, params: list[str], sets: list[str],
                        command: list[str], mounts: list[str] | None = None,
                        max_restarts: int | None = None, image: str | None = None) -> tuple[RunPlan, recipes.Recipe | None]:
    """`rlbox validate`: only the cluster's shape matters, so it is planned as a simulation of
    that many nodes (nothing is read from any host). ``image`` (a RELEASE:VARIANT) picks the
    release whose form of the recipe is checked."""
    rec = recipes.load(recipe) if recipe else None
    release = None
    if rec and image:
        variant = matrix.load(find_root()).image_for(image)[1]
        release = variant.release.release if variant else None
        rec = rec.on(release) if release else rec
    if hosts or cluster_file:
        spec = cluster.from_hosts(hosts) if hosts else cluster.from_file(cluster_file)
        cluster.agree(spec, nodes)
        nodes = spec.nodes
    req = RunRequest(nodes=nodes or (rec.nodes if rec else 1), sim=True,
                     hardware=hardware if hardware not in (None, "auto") else (rec.hardware if rec else None),
                     devices=devices, recipe=recipe, params=list(params), sets=list(sets), command=list(command),
                     dry_run=True, mounts=list(mounts or ()), max_restarts=max_restarts, recipe_release=release)
    plan, _ = prepare(req)
    return plan, rec


def prepare_kuberay(req: RunRequest, profile_file: Path | None, *, scheduler: str | None = None,
                    queue: str | None = None, timeout: int | None = None,
                    deadline: int | None = None) -> kuberay.RayJobPlan:
    """The run as a KubeRay RayJob: the same job, image, hardware and restarts as `prepare`,
    on ``--nodes`` pods of the profile's cluster instead of hosts."""
    recipe = _recipe_for(req)
    refused = [flag for flag, given in (("--hosts", req.hosts), ("--cluster", req.cluster_file), ("--sim", req.sim),
                                        ("--privileged", req.privileged), ("--sim-driver", req.sim_driver),
                                        ("--nofile", req.nofile)) if given]
    if refused:
        raise RlboxError(f"{refused[0]} is for --backend hosts; a KubeRay run takes --nodes and --k8s-profile FILE")
    if profile_file is None:
        raise RlboxError("--backend kuberay needs --k8s-profile FILE (device plugin resource name, namespace, volumes)")
    profile = k8s_profile.load(profile_file)
    nodes = req.nodes or (recipe.nodes if recipe else None)
    if not nodes:
        raise RlboxError("--backend kuberay needs --nodes N (or a recipe, which names its nodes)")
    if req.nic and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,14}", req.nic):
        raise RlboxError(f"--nic {req.nic!r}: not an interface name")
    extra_env = parse_env(req.env)  # what the API server would refuse, named by the option that asked for it
    if queue is not None:
        names.check(queue, "--queue", "dns")  # a Volcano Queue's name and a label value
    mounts = tuple(cluster.Mount.parse(m) for m in req.mounts)
    m = matrix.load(find_root())
    image, from_matrix, hardware, hw = _image_and_hardware(req, m, recipe, None, "auto")
    recipe = _recipe_on(recipe, req, m, from_matrix)
    per_node = profile.npus_per_node or hw.npus_per_node
    asked = _devices_asked(req, recipe)
    ids = tuple(range(asked)) if isinstance(asked, int) else (asked or tuple(range(per_node)))
    if max(ids) >= per_node:
        what = f"{len(ids)} NPUs" if isinstance(asked, int) else f"NPU {max(ids)}"
        raise RlboxError(f"--devices {req.devices}: {what} asked, but a node of {profile_file} offers {per_node} "
                         f"({profile.resource_name}, npus_per_node); ask for at most {per_node}")
    run_id = secrets.token_hex(4)
    job, restarts = _job_and_restarts(req, recipe, nodes, len(ids), run_id)
    plan = kuberay.plan_rayjob(run=req.name, run_id=run_id, image=image, hardware=hardware, nodes=nodes, npus=len(ids),
                               slot=min(ids), job=job, profile=profile, profile_source=str(profile_file), mounts=mounts,
                               extra_env=tuple(extra_env.items()), nic=req.nic, cpus=req.cpus,
                               max_restarts=restarts, timeout=math.ceil(timeout) if timeout else None, deadline=deadline, scheduler=scheduler,
                               queue=queue)
    if not isinstance(asked, int) and asked:
        plan = replace(plan, notes=plan.notes + (f"--devices {req.devices}: {len(ids)} NPUs per pod; the device "
                                                 "plugin chooses which (ports follow the lowest id asked)",))
    return replace(plan, image_ref=from_matrix)
