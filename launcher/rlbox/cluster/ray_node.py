"""How Ray starts on one node, as data (split from plan.py): the run's port block, the `ray start`
command line, the workers' start pacing, the GCS health check, and the release's NPU env policy."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from rlbox.cluster import sharing


# Workers do not all call `ray start` in the same instant once the head is up, and none waits on a
# clock: workers 1..START_FIRST go as soon as the head's GCS answers; worker k past them is gated (its
# node script waits for the launcher's go, go_file written into its container and a SIGUSR1) until Ray's node table holds
# enough of the workers before it (`released`): the GCS's own answers pace them, a slow head takes them
# slowly, a quick one at once. Why any pacing: on 16 testbed hosts sharing 2 cores, 15 raylets started
# together timed out registering with the GCS (Ray's fixed 30 s: `raylet_start_wait_time_s` in
# ray/_private/node.py, not configurable) 7 to 13 at a time; a fixed spread (worker k waited (k mod 16) x
# 0.25 s) cured that at up to 3.75 s of every bring-up, whatever the head could take. Only a launcher
# that watches Ray's node table gives the go (the hosts, simulated and Slurm backends), and it gives
# every gated worker its go at once when no two nodes share a machine (`paced`).
START_FIRST = 8
START_PER_REGISTERED = 2


def paced(machines: list[str | None]) -> bool:
    """Whether the gated workers start in turn (``released``) rather than at once: whenever nodes share
    one machine's CPUs (the same kernel boot id: a simulation, the testbed's hosts), or a node's machine
    is not known. Nodes each on a machine of their own start Ray at once, as a bare `ray start` on each
    would: there no raylet is starved by the others, and the pacing would only cost them a worker's
    start-up (one more for every doubling of the workers past 8)."""
    return any(m is None for m in machines) or len(set(machines)) < len(machines)


GO_DIR = "/tmp"  # where a gated worker's go is written into its container (its RLBOX_GO_FILE, NODE_SCRIPT)


def go_file(run_id: str, index: int) -> str:
    """A gated worker's go file: named by run id and node, so a /tmp a user mounts from the host (shared by a
    simulation's nodes, kept after the run) never holds another worker's or another run's go."""
    return f"{GO_DIR}/rlbox-go-{run_id}-{index}"


def go_archive(path: str) -> bytes:
    """The empty file ``path`` as the tar the engine's archive API writes into its folder (`docker cp`'s call)."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        tar.addfile(tarfile.TarInfo(path.rsplit("/", 1)[1]), io.BytesIO(b""))
    return out.getvalue()


def gated(index: int) -> bool:
    """Whether worker ``index`` waits for the launcher's go before its `ray start`."""
    return index > START_FIRST


def released(registered: int) -> int:
    """The highest worker index that may start once ``registered`` workers are in Ray's node table."""
    return START_FIRST + START_PER_REGISTERED * max(0, registered)


# Ray's GCS health check of every raylet (ray_config_def.h; the head's environment sets it):
# Ray's defaults (period 3 s, timeout 10 s, 5 failures) call a frozen or cut-off node DEAD after
# about a minute; these after about 20 s (4 checks in a row unanswered for 4 s each, one a
# second). Not tighter: on a loaded host a raylet busy for seconds must not count as dead.
HEALTH_CHECK_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "4000",
                    "RAY_health_check_failure_threshold": "4"}


@dataclass(frozen=True)
class RayPorts:
    """A block of ports owned by one run: never Ray's defaults, so a stale cluster cannot collide."""

    gcs: int
    dashboard: int
    client: int
    node_manager: int
    object_manager: int
    dashboard_agent_grpc: int
    dashboard_agent_http: int
    metrics: int
    runtime_env_agent: int
    autoscaler_metrics: int
    dashboard_metrics: int
    worker_range: tuple[int, int]

    @classmethod
    def block(cls, base: int) -> "RayPorts":
        """Consecutive ports from ``base``; Ray's workers take ``base+100 .. base+999``."""
        singles = [f.name for f in fields(cls) if f.name != "worker_range"]
        return cls(*(base + i for i in range(len(singles))), worker_range=(base + 100, base + 999))

    def env(self) -> dict[str, str]:
        """The two head ports Ray takes only from the environment, not from flags."""
        return {"AUTOSCALER_METRIC_PORT": str(self.autoscaler_metrics), "DASHBOARD_METRIC_PORT": str(self.dashboard_metrics)}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ports_for(slot: int) -> RayPorts:
    """The Ray block of a run's slot (its lowest NPU id): 20000 + 1000 x slot, never Ray's
    defaults; runs sharing a host hold different NPUs, so their blocks differ."""
    return RayPorts.block(sharing.ray_base(slot))


def ray_start(role: str, head: str, ports: RayPorts, npus: int, cpus: int | None = None) -> list[str]:
    """`ray start` for one node; the node script appends --node-ip-address, and
    --dashboard-host (head) or --address (workers) once it has resolved the head."""
    argv = ["ray", "start", "--block", "--disable-usage-stats", f"--resources={{\"NPU\": {npus}}}"]
    if role == "head":
        argv += [
            "--head",
            f"--port={ports.gcs}",
            f"--dashboard-port={ports.dashboard}",
            f"--ray-client-server-port={ports.client}",
            "--include-dashboard=true",
        ]
    lo, hi = ports.worker_range
    argv += [
        f"--node-manager-port={ports.node_manager}",
        f"--object-manager-port={ports.object_manager}",
        f"--dashboard-agent-grpc-port={ports.dashboard_agent_grpc}",
        f"--dashboard-agent-listen-port={ports.dashboard_agent_http}",
        f"--metrics-export-port={ports.metrics}",
        f"--runtime-env-agent-port={ports.runtime_env_agent}",
        f"--min-worker-port={lo}",
        f"--max-worker-port={hi}",
    ]
    if cpus is not None:
        argv.append(f"--num-cpus={cpus}")
    return argv


# What Ray reads to leave ASCEND_RT_VISIBLE_DEVICES alone (ray/_private/accelerators/npu.py).
NOSET_VISIBLE = "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
VISIBLE = "ASCEND_RT_VISIBLE_DEVICES"


@dataclass(frozen=True)
class NpuPolicy:
    """The release's NPU env policy (images/*.yaml ``ray_npu_env``): whether Ray is told to leave
    ASCEND_RT_VISIBLE_DEVICES alone, and the line of the docs it follows."""

    noset: bool
    follows: str
    release: str

    def env(self, npus: int) -> dict[str, str]:
        """What a node with ``npus`` NPUs gets: under noset, the node's NPUs as the container
        numbers them (0..npus-1: it holds only its own /dev/davinci*), ascending, as CANN wants."""
        return {NOSET_VISIBLE: "1", VISIBLE: ",".join(map(str, range(npus)))} if self.noset else {}

    def words(self) -> str:
        how = (f"{NOSET_VISIBLE}=1, {VISIBLE} set on every node" if self.noset
               else f"{NOSET_VISIBLE} unset, Ray sets each worker's {VISIBLE}")
        return f"{self.release}: {how} (follows {self.follows})"
