"""Planning a run: from a cluster description to per-node container specs, Ray commands and
the job. Pure functions and printable values (``--dry-run`` prints them); nothing here touches
a host. ``run.py`` carries a plan out.

The same plan serves a real cluster and the simulation: in ``--sim`` only the device source
(``/dev/null`` instead of ``/dev/davinciN``), the host-side driver files (stand-ins) and the
network (a private Docker network with one address per node instead of the host network)
differ.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from rlbox.cluster import sharing
from rlbox.cluster.ray_node import (HEALTH_CHECK_ENV, NOSET_VISIBLE, START_FIRST, START_PER_REGISTERED,  # noqa: F401
                                     VISIBLE, NpuPolicy, RayPorts, gated, go_file, paced, ports_for, ray_start, released)
from rlbox.cluster.spec import ClusterSpec, Host, Mount
from rlbox.core import engine
from rlbox.core.errors import RlboxError

SIM_DRIVER = "25.3.rc1"  # the driver simulated hosts report when no image names its minimum
LABEL_RUN = "io.rlbox.run"
LABEL_RUN_ID = "io.rlbox.run-id"
LABEL_NODE = "io.rlbox.node"
LABEL_ROLE = "io.rlbox.role"
LABEL_HOST = "io.rlbox.host"  # the host a node container stands for (simulated hosts share one engine)
LABEL_MANAGED = engine.LABEL_MANAGED

CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
DRIVER_DIR = "/usr/local/Ascend/driver"
DCMI_DIR = "/usr/local/dcmi"
NPU_SMI = "/usr/local/bin/npu-smi"
INSTALL_INFO = "/etc/ascend_install.info"

# What every node's container gets (seed 001 ray_start.sh, seed 004 runtime_env.yaml).
BASE_ENV = {
    "RAY_DEDUP_LOGS": "0",
    "HYDRA_FULL_ERROR": "1",
    "TASK_QUEUE_ENABLE": "1",
    "HCCL_CONNECT_TIMEOUT": "3600",
    "HCCL_EXEC_TIMEOUT": "3600",
    "HCCL_ASYNC_ERROR_HANDLING": "0",
}
NOFILE = 65536
NPROC = 65536

# The node's main process. Constant text: every value reaches it as a positional argument, so
# nothing from the command line is ever parsed by a shell. It resolves the head's name on the
# node (a name the operator's machine cannot resolve is fine; so is a simulated head known only
# to the engine's DNS), finds the interface that routes to the head (unless RLBOX_NIC names
# one), exports the socket variables from it, waits on workers for the head's GCS port (a gated one
# first for the launcher's go), and replaces itself with `ray start ... --block` plus the addresses it found.
NODE_SCRIPT = r"""set -eu
go=; trap 'go=1' USR1  # a gated worker's go (ray_node.gated), from the launcher: set before anything else
role=$1 head=$2 port=$3; shift 3
case $head in
  *[!0-9.]*)
    addr=$(getent ahostsv4 "$head" | awk '$1 !~ /^127\./ {print $1; exit}')
    if [ -z "$addr" ] && [ "$role" = head ]; then  # the head's own name may map to loopback here
      addr=$(ip -o route get 1.0.0.0 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}')
    fi
    [ -n "$addr" ] || { echo "rlbox-node: cannot resolve the head $head on this node" >&2; exit 3; }
    head=$addr ;;
esac
if [ -n "${RLBOX_NIC:-}" ]; then
  nic=$RLBOX_NIC
  ip=$(ip -o -4 addr show dev "$nic" | awk '{split($4, a, "/"); print a[1]; exit}')
elif ip -o -4 addr show | awk '{split($4, a, "/"); print a[1]}' | grep -qx "$head"; then
  nic=$(ip -o -4 addr show | awk -v h="$head" '{split($4, a, "/"); if (a[1] == h) {print $2; exit}}')
  ip=$head
else
  route=$(ip -o route get "$head")
  nic=$(echo "$route" | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
  ip=$(echo "$route" | awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}')
fi
if [ -z "$nic" ] || [ -z "$ip" ]; then echo "rlbox-node: no interface routes to the head $head" >&2; exit 3; fi
export HCCL_SOCKET_IFNAME=${HCCL_SOCKET_IFNAME:-$nic} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$nic}
export TP_SOCKET_IFNAME=${TP_SOCKET_IFNAME:-$nic} HCCL_IF_IP=${HCCL_IF_IP:-$ip}
echo "rlbox-node: $role on $ip ($nic), head $head:$port"
if [ "$role" = worker ]; then
  if [ "${RLBOX_GATED:-0}" = 1 ]; then  # until the launcher's go: Ray has registered workers before it
    echo "rlbox-node: waiting for the launcher's go (Ray registers the workers before this one first)"
    # the go is a file the launcher writes (it stays, whenever it came) and a signal that ends the wait at
    # once (lost when it came before the trap was set: the file is then seen within the second)
    until [ -n "$go" ] || [ -e "${RLBOX_GO_FILE:-}" ]; do sleep 1 & wait $! || true; done
    [ -z "${!:-}" ] || kill "$!" 2>/dev/null || true  # no sleep at all when the go came first (set -u)
  fi
  # the head's GCS: a worker started before it answers gives up; once it answers, `ray start` waits (Ray's
  # own 40 s) for the head's raylet to register, its imports and start-up meanwhile overlapping the head's.
  # A gated worker's go comes once Ray has registered workers: it finds the GCS at once.
  i=0
  until (exec 3<>"/dev/tcp/$head/$port") 2>/dev/null; do
    i=$((i + 1)); [ "$i" -lt 3000 ] || { echo "rlbox-node: head $head:$port unreachable" >&2; exit 4; }
    sleep 0.1
  done
fi
if [ "$role" = head ]; then
  exec "$@" --node-ip-address="$ip" --dashboard-host="$ip"
fi
exec "$@" --node-ip-address="$ip" --address="$head:$port"
"""


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerSpec:
    """One node's container, as data. Renders to the exact `docker run` and to docker-py kwargs."""

    name: str
    image: str
    command: tuple[str, ...]
    devices: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    env: tuple[tuple[str, str], ...]
    labels: tuple[tuple[str, str], ...]
    network: str = "host"
    ip: str | None = None
    hostname: str | None = None
    ipc: str = "host"
    ulimits: tuple[tuple[str, int, int], ...] = (("nofile", NOFILE, NOFILE), ("nproc", NPROC, NPROC))
    privileged: bool = False
    publish: tuple[tuple[str, int, int], ...] = ()  # (host ip, host port, container port)

    def docker_run(self) -> list[str]:
        argv = ["docker", "run", "--detach", "--name", self.name, "--network", self.network]
        if self.ip:
            argv += ["--ip", self.ip]
        if self.hostname:
            argv += ["--hostname", self.hostname]
        # the node script is the container's first process: a daemon's `"init": true` would put an init before
        # it that passes a go signal on to a script not yet listening, or to the `ray start` it became
        argv += ["--ipc", self.ipc, "--init=false"]
        if self.privileged:
            argv.append("--privileged")
        for name, soft, hard in self.ulimits:
            argv += ["--ulimit", f"{name}={soft}:{hard}"]
        for src, dst in self.devices:
            argv += ["--device", src if src == dst else f"{src}:{dst}"]
        for m in self.mounts:
            argv += ["--volume", m.spec()]
        for host_ip, host_port, port in self.publish:
            argv += ["--publish", f"{host_ip}:{host_port}:{port}"]
        for k, v in self.env:
            argv += ["--env", f"{k}={v}"]
        for k, v in self.labels:
            argv += ["--label", f"{k}={v}"]
        return argv + [self.image, *self.command]

    def docker_py(self) -> dict[str, Any]:
        """Arguments for ``client.containers.create`` meaning exactly what docker_run says."""
        from docker.types import Mount as DockerMount
        from docker.types import Ulimit

        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command),
            "name": self.name,
            "detach": True,
            "ipc_mode": self.ipc,
            "init": False,
            "privileged": self.privileged,
            "devices": [f"{src}:{dst}:rwm" for src, dst in self.devices],
            "mounts": [DockerMount(m.target, m.source, type="bind", read_only=m.read_only) for m in self.mounts],
            "environment": dict(self.env),
            "labels": dict(self.labels),
            "ulimits": [Ulimit(name=n, soft=s, hard=h) for n, s, h in self.ulimits],
        }
        if self.network == "host":
            kwargs["network_mode"] = "host"
        else:
            kwargs["network"] = self.network
        if self.hostname:
            kwargs["hostname"] = self.hostname
        if self.publish:
            kwargs["ports"] = {f"{port}/tcp": (host_ip, host_port) for host_ip, host_port, port in self.publish}
        return kwargs


@dataclass(frozen=True)
class NodePlan:
    index: int
    role: str
    host: Host
    npus: int
    container: ContainerSpec
    ray: tuple[str, ...]
    npu_ids: tuple[int, ...] = ()
    whole_host: bool = False  # it takes every NPU its host has (counted there): one claim holds them all

    @property
    def label(self) -> str:
        return f"node{self.index} ({self.host.name})"


@dataclass(frozen=True)
class SimNetwork:
    """A simulation's private network. Its subnet is taken when it is created (the first /24 of
    172.30.0.0/16 no other network holds) and node addresses come from the engine, so two
    simulations never collide; nodes find the head by its container name."""

    name: str
    subnet: str | None = None
    max_nodes = 253  # a /24 less the gateway


@dataclass(frozen=True)
class JobPlan:
    entrypoint: str
    argv: tuple[str, ...]
    working_dir: str | None
    env: tuple[tuple[str, str], ...]
    submission_id: str
    description: str

    def describe(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        return f"# job {self.submission_id} ({self.description})" + (f", env: {env}" if env else "") + f"\n{self.entrypoint}\n"

    def as_dict(self) -> dict[str, Any]:
        return {
            "entrypoint": self.entrypoint,
            "submission_id": self.submission_id,
            "runtime_env": {"env_vars": dict(self.env)} if self.env else {},
            "metadata": {"rlbox": self.description},
        }


@dataclass(frozen=True)
class RunPlan:
    run: str
    run_id: str
    image: str
    hardware: str
    sim: bool
    head: str
    ports: RayPorts
    nodes: tuple[NodePlan, ...]
    network: SimNetwork | None = None
    job: JobPlan | None = None
    sim_files: str | None = None
    sim_driver: str = SIM_DRIVER
    notes: tuple[str, ...] = field(default_factory=tuple)
    driver_min: str | None = None  # what the image's CANN needs from the host (doctor)
    driver_max: str | None = None
    device_counts: tuple[int, ...] = ()  # NPU counts hosts of this hardware come with
    hccl: tuple[tuple[str, str], ...] = ()  # the run's HCCL port variables
    image_ref: str | None = None  # RELEASE:VARIANT the image comes from, when from the matrix
    npu_policy: NpuPolicy | None = None  # the release's NPU env policy (None: an image from no release)

    def missing_image_hint(self) -> str:
        """The command that makes this run's image present."""
        if self.image_ref and self.image_ref.startswith("rlbox_sim:"):  # built here, never pushed
            return f"build it with `rlbox build {self.image_ref}`"
        if self.image_ref:
            return f"build it with `rlbox build {self.image_ref}` or pull it with `rlbox pull {self.image_ref}`"
        return f"pull it with `docker pull {self.image}` (or `rlbox pull {self.image}`)"
    max_restarts: int = 0  # times a lost node or a retryable failure restarts the cluster and the job

    @property
    def total_npus(self) -> int:
        return sum(n.npus for n in self.nodes)

    @property
    def npus_per_node(self) -> int:
        """What every node can give (verl's trainer.n_gpus_per_node assumes equal nodes)."""
        return min(n.npus for n in self.nodes)

    def describe(self) -> str:
        """What --dry-run prints: per node the exact docker run and Ray command, then the job."""
        lines = [
            f"# rlbox run {self.run} (id {self.run_id}): {len(self.nodes)} node(s) x NPUs "
            f"{'/'.join(str(n.npus) for n in self.nodes)} = {self.total_npus} NPUs, hardware {self.hardware}"
            + (", simulated" if self.sim else ""),
            f"# image {self.image}",
            f"# head {self.head}: GCS port {self.ports.gcs}, dashboard http://{self.head}:{self.ports.dashboard}",
            f"# ports: Ray {self.ports.gcs}-{self.ports.worker_range[1]}, HCCL "
            + " ".join(f"{k}={v}" for k, v in self.hccl),
        ]
        if self.network:
            lines.append(f"docker network create --subnet {self.network.subnet or '<first free 172.30.x.0/24>'} "
                         f"--label {LABEL_RUN}={self.run} {self.network.name}")
        for note in self.notes:
            lines.append(f"# {note}")
        for n in self.nodes:
            where = "local engine" if n.host.local else f"ssh://{n.host.ssh_user + '@' if n.host.ssh_user else ''}{n.host.name}"
            ids = f" (NPU {sharing.ids_text(n.npu_ids)})" if n.npu_ids else ""
            extra = "--dashboard-host=<it>" if n.role == "head" else f"--address=<{self.head}>:{self.ports.gcs}"
            lines += ["", f"# node {n.index} ({n.role}) on {n.host.name} via {where}: {n.npus} NPUs{ids}",
                      shlex.join(n.container.docker_run()),
                      f"#   runs: {shlex.join(n.ray)} --node-ip-address=<address on the interface routing to "
                      f"{self.head}> {extra}"]
        if self.job:
            lines += ["", f"# job {self.job.submission_id}, submitted to http://{self.head}:{self.ports.dashboard}/api/jobs/",
                      f"#   env: {' '.join(k + '=' + (shlex.quote(v) if len(v) < 80 else '<' + str(len(v)) + ' chars>') for k, v in self.job.env) or '-'}",
                      self.job.entrypoint]
            if self.max_restarts:
                lines.append(f"# on a lost node or a retryable failure: up to {self.max_restarts} restart(s), each "
                             "re-running the pre-flight checks and resubmitting the job (verl: trainer.resume_mode=auto)")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "run_id": self.run_id,
            "image": self.image,
            "hardware": self.hardware,
            "sim": self.sim,
            "head": self.head,
            "ports": self.ports.as_dict(),
            "network": {"name": self.network.name, "subnet": self.network.subnet} if self.network else None,
            "nodes": [
                {
                    "index": n.index,
                    "role": n.role,
                    "host": n.host.name,
                    "ssh_user": n.host.ssh_user,
                    "ssh_port": n.host.ssh_port,
                    "identity_file": n.host.identity_file,
                    "known_hosts": n.host.known_hosts,
                    "transport": "local" if n.host.local else "ssh",
                    "npus": n.npus,
                    "npu_ids": list(n.npu_ids),
                    "container": n.container.name,
                    "docker_run": n.container.docker_run(),
                }
                for n in self.nodes
            ],
            "job": self.job.as_dict() if self.job else None,
            "max_restarts": self.max_restarts,
        }


def resolve(name: str) -> str | None:
    """An IPv4 address for a host name, or None when this machine cannot resolve it (the nodes
    resolve it when they start: a plan is made anywhere)."""
    if name in ("local", "localhost"):
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    import socket

    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def node_name(run: str, index: int) -> str:
    """The container of node ``index`` of run ``run`` (also the head's name on a sim network)."""
    return f"rlbox-{run}-node{index}"


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """What planning needs to know about the hardware (from images/hardware.yaml)."""

    name: str
    npus_per_node: int
    npu_smi_chip: str
    device_counts: tuple[int, ...]

    @property
    def counts(self) -> tuple[int, ...]:
        """The NPU counts hosts of this hardware come with: the matrix's, else its per-node count."""
        return self.device_counts or (self.npus_per_node,)


def node_container(
    *,
    run: str,
    run_id: str,
    index: int,
    role: str,
    host: Host,
    image: str,
    npus: int,
    head: str,
    ports: RayPorts,
    mounts: tuple[Mount, ...],
    sim_files: str | None,
    network: SimNetwork | None,
    privileged: bool,
    extra_env: tuple[tuple[str, str], ...] = (),
    cpus: int | None = None,
    nofile: int = NOFILE,
    npu_ids: tuple[int, ...] = (),
    hccl: dict[str, str] | None = None,
    npu_policy: NpuPolicy | None = None,
) -> tuple[ContainerSpec, list[str]]:
    """The container one node runs. ``sim_files`` (a host folder of stand-ins) marks a simulation.
    ``npu_ids``: which NPUs of the host (default 0..npus-1)."""
    sim = sim_files is not None
    npu_ids = tuple(npu_ids) or tuple(range(npus))
    hccl = hccl or {}
    devices = [("/dev/null" if sim else f"/dev/davinci{i}", f"/dev/davinci{i}") for i in npu_ids]
    devices += [("/dev/null" if sim else d, d) for d in CONTROL_DEVICES]
    if sim:
        stand_ins = f"{sim_files}/{host.name}"
        driver = [
            Mount(f"{stand_ins}/driver", DRIVER_DIR, True),
            Mount(f"{stand_ins}/dcmi", DCMI_DIR, True),
            Mount(f"{stand_ins}/npu-smi", NPU_SMI, True),
            Mount(f"{stand_ins}/ascend_install.info", INSTALL_INFO, True),
        ]
    else:
        driver = [
            Mount(DRIVER_DIR, DRIVER_DIR, True),
            Mount(DCMI_DIR, DCMI_DIR, True),
            Mount(NPU_SMI, NPU_SMI, True),
            Mount(INSTALL_INFO, INSTALL_INFO, True),
        ]
    env = dict(BASE_ENV)
    env.update(ports.env())
    env.update(hccl)
    env.update({"RLBOX_RUN": run, "RLBOX_NODE": str(index), "RLBOX_HEAD": head})
    if role == "head":  # the GCS runs the health checks: a frozen or cut-off node DEAD in ~20 s
        env.update(HEALTH_CHECK_ENV)
    elif gated(index):
        env.update({"RLBOX_GATED": "1", "RLBOX_GO_FILE": go_file(run_id, index)})
    if host.nic:
        env["RLBOX_NIC"] = host.nic
    if npu_policy is not None:
        env.update(npu_policy.env(len(npu_ids)))
    env.update(dict(host.env))
    env.update(dict(extra_env))
    ray = ray_start(role, head, ports, npus, cpus)
    name = node_name(run, index)
    labels = (
        (LABEL_MANAGED, "true"),
        (LABEL_RUN, run),
        (LABEL_RUN_ID, run_id),
        (LABEL_NODE, str(index)),
        (LABEL_ROLE, role),
        (LABEL_HOST, host.name),
    )
    publish: tuple[tuple[str, int, int], ...] = ()
    if network and role == "head":  # the operator reaches the simulated head's dashboard on loopback
        publish = (("127.0.0.1", ports.dashboard, ports.dashboard),)
    spec = ContainerSpec(
        name=name,
        image=image,
        command=("bash", "-c", NODE_SCRIPT, "rlbox-node", role, head, str(ports.gcs), *ray),
        devices=tuple(devices),
        mounts=tuple(driver) + tuple(mounts) + host.mounts,
        env=tuple(env.items()),
        labels=labels,
        network=network.name if network else "host",
        ip=None,
        hostname=f"{run}-node{index}" if network else None,
        privileged=privileged,
        publish=publish,
        ulimits=(("nofile", nofile, nofile), ("nproc", NPROC, NPROC)),
    )
    return spec, ray


def plan_run(
    spec: ClusterSpec,
    *,
    run: str,
    run_id: str,
    image: str,
    profile: Profile,
    devices: dict[str, int | tuple[int, ...]],
    sim_files: str | None = None,
    network: SimNetwork | None = None,
    privileged: bool = False,
    job: JobPlan | None = None,
    extra_env: tuple[tuple[str, str], ...] = (),
    cpus: int | None = None,
    nofile: dict[str, int] | None = None,
    sim_driver: str = SIM_DRIVER,
    driver_min: str | None = None,
    driver_max: str | None = None,
    npu_policy: NpuPolicy | None = None,
    whole_hosts: Collection[str] = (),
) -> RunPlan:
    """Plan every node. ``devices`` maps host name -> NPU count (detected or from the profile)
    or the NPU ids to use; ``nofile`` host name -> open-files limit (default 65536);
    ``whole_hosts``: the hosts whose count is all they have (read there, or a simulated host's
    own), which the run claims whole (sharing.claims), not NPU by NPU."""
    if not spec.hosts:
        raise RlboxError("no hosts to run on")
    head_host = spec.hosts[0]
    notes = []
    if network:
        head = node_name(run, 0)  # the engine's DNS knows it on the simulation network
    else:
        head = resolve(head_host.address or head_host.name)
        if head is None:
            head = head_host.address or head_host.name
            notes.append(f"the head {head} does not resolve here: every node resolves it when it starts")
        elif ipaddress.ip_address(head).is_loopback and len(spec.hosts) > 1:
            raise RlboxError(
                f"the head {head_host.name} resolves to {head}, which other nodes cannot reach; "
                "name it by its cluster address (or give `address:` in the cluster YAML)"
            )
    ids_of = {}
    for host in spec.hosts:
        given = devices.get(host.name, profile.npus_per_node)
        ids = tuple(range(given)) if isinstance(given, int) else tuple(given)
        if not ids:
            raise RlboxError(f"{host.name}: no /dev/davinci devices found; is the Ascend driver installed?")
        ids_of[host.name] = ids
    slot = min(min(ids) for ids in ids_of.values())
    ports = ports_for(slot)
    hccl = sharing.hccl_env(slot, profile.name)
    nodes = []
    for index, host in enumerate(spec.hosts):
        ids = ids_of[host.name]
        role = "head" if index == 0 else "worker"
        container, ray = node_container(
            run=run, run_id=run_id, index=index, role=role, host=host, image=image, npus=len(ids),
            head=head, ports=ports, mounts=spec.mounts, sim_files=sim_files, network=network,
            privileged=privileged, extra_env=extra_env, cpus=cpus,
            nofile=(nofile or {}).get(host.name, NOFILE), npu_ids=ids, hccl=hccl, npu_policy=npu_policy,
        )
        targets = [m.target for m in container.mounts]
        dup = next((t for t in targets if targets.count(t) > 1), None)
        if dup:
            raise RlboxError(f"{host.name}: two mounts target {dup}; keep one (--mount, mounts:, or a host's mounts:)")
        nodes.append(NodePlan(index, role, host, len(ids), container, tuple(ray), ids,
                              whole_host=host.name in whole_hosts and isinstance(devices.get(host.name), int)))
    counts = {n.npus for n in nodes}
    if len(counts) > 1:
        notes.append("nodes differ in NPU count; verl's trainer.n_gpus_per_node assumes equal nodes")
    return RunPlan(run, run_id, image, profile.name, network is not None, head, ports, tuple(nodes),
                   network, job, sim_files, sim_driver, tuple(notes), driver_min, driver_max,
                   profile.counts, tuple(hccl.items()), npu_policy=npu_policy)
