"""`rlbox doctor`: per-node pre-flight checks, run in parallel, each a ✓ or a ✗ with its fix.

Two halves: `facts.gather` reads what a node's host offers (its engine, device nodes, npu-smi,
driver, ports, limits, disk, image, paths) into a `NodeFacts` of plain values, and `judge`
turns those facts into checks without touching anything, so every verdict can be shown with a
table of facts.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlbox.cluster.hosts import Node, connect, on_every
from rlbox.cluster.plan import NodePlan, RunPlan
from rlbox.cluster.preflight import npunet
from rlbox.cluster.preflight.facts import HostView, NodeFacts, gather, ping_peers
from rlbox.core import npu
from rlbox.core.errors import RlboxError

SHM_MIN_GIB = 4
# Free space the run needs under the engine's data root. Every run: the containers' own layers, where
# Ray keeps its session logs and spills objects (/tmp/ray inside each node). A run whose image is not
# on the host yet also pulls it there: the Ascend images are 15-30 GB unpacked, and their packed
# layers (about half that) sit beside them until they are unpacked: 45 GiB for a 30 GB image.
DISK_RUN_GIB = 5
DISK_PULL_GIB = 45


@dataclass(frozen=True)
class Check:
    node: str
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.node}: {'✓' if self.ok else '✗'} {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix and not self.ok else "")


def judge(facts: NodeFacts, node_plan: NodePlan, plan: RunPlan, replace: bool) -> list[Check]:
    """The checks of one node, from its facts alone (in the order `rlbox doctor` prints them)."""
    label = node_plan.label
    if facts.engine_error is not None:
        return [Check(label, "engine", False, facts.engine_error.split(": ", 1)[-1],
                      "check the host, its ssh port and key, and dockerd")]
    if facts.inspect_error is not None:
        return [Check(label, "host", False, f"cannot inspect: {facts.inspect_error}", "check ssh access to the host")]
    driver_min, device_counts = plan.driver_min, plan.device_counts
    out: list[Check] = []

    def add(name, ok, detail, fix=""):
        out.append(Check(label, name, bool(ok), detail, fix))

    # Engine
    add("engine", True, f"Docker {facts.engine_version} ({facts.transport})")

    # Device nodes
    devs = facts.devices
    want = node_plan.npus
    ok = len(devs) in device_counts and {f"davinci{i}" for i in node_plan.npu_ids or range(want)} <= set(devs)
    add("devices", ok, f"{len(devs)} /dev/davinci* (plan: {want}; {plan.hardware} hosts have {'/'.join(map(str, device_counts))})",
        "a device is missing or the driver is not loaded: check `npu-smi info` and dmesg")

    # Chip
    if facts.npu_smi_error is not None:
        add("npu-smi", False, facts.npu_smi_error or "npu-smi failed", "install the driver's npu-smi at /usr/local/bin/npu-smi")
    else:
        chip = npu.chip_name(facts.npu_smi) or "unknown"
        seen_hw = npu.chip_hardware(chip)
        fits = seen_hw == plan.hardware or (seen_hw == "a2" and plan.hardware == "ax")
        add("chip", fits, f"npu-smi reports {chip} ({(seen_hw or '?').upper()}); image hardware {plan.hardware}",
            f"use the {seen_hw} variant of the image (rlbox images list)" if seen_hw else "unknown chip")

    # Driver
    version = facts.driver
    driver_max = plan.driver_max
    if driver_min and driver_min != "none":
        ok = version is not None and npu.driver_key(version) >= npu.driver_key(driver_min)
        too_new = ok and driver_max is not None and npu.driver_key(version) > npu.driver_key(driver_max)
        bounds = f">= {driver_min}" + (f" and <= {driver_max}" if driver_max else "")
        add("driver", ok and not too_new, f"version.info {version or 'missing'}; the image's CANN needs {bounds}",
            f"install an Ascend driver (HDK) {bounds}, or use an image built for this driver")
    else:
        add("driver", version is not None, f"version.info {version or 'missing'}", "install the Ascend driver")

    # Devices held by another container (this run's own are about to go under --replace)
    holders = [name for name, run in facts.npu_holders if not (run == plan.run and replace)]
    add("devices free", not holders, "held by " + ", ".join(holders) if holders else "no other container holds NPUs",
        f"stop them (docker rm -f {' '.join(holders)}) or `rlbox stop --name RUN`" if holders else "")

    # Ports of this run
    ports = plan.ports.as_dict()
    wanted = {v: k for k, v in ports.items() if isinstance(v, int)}
    taken = sorted(p for p in wanted if p in facts.listening)
    if taken and replace and facts.own_run_live:  # the run being replaced holds its own block: freed first
        add("ports", True, f"{len(taken)} of run {plan.run}'s {len(wanted)} Ray ports held by the run --replace removes first")
    else:
        add("ports", not taken, f"{len(wanted)} Ray ports of run {plan.run} free" if not taken else
            "taken: " + ", ".join(f"{p} ({wanted[p]})" for p in taken),
            f"find the owner: ss -ltnp 'sport = :{taken[0]}'; or use other NPUs (--devices): the ports follow the "
            "lowest NPU id" if taken else "")

    # Stale Ray
    if replace:
        add("stale ray", True, "not checked: --replace removes this run's Ray first")
    else:
        stale = facts.ray_processes or ()
        if stale and facts.live_runs:  # neighbours on other NPUs of this host, with their own ports
            add("stale ray", True, f"{len(stale)} Ray process(es) of live run(s) {', '.join(facts.live_runs)}")
        else:
            add("stale ray", not stale, f"{len(stale)} Ray process(es) running" if stale else "no Ray running",
                "a previous cluster is alive: `rlbox status` / `rlbox stop --name RUN`, or `ray stop` where it runs")

    # Limits and shared memory
    hard = facts.nofile_hard
    need = dict((n, soft) for n, soft, _ in node_plan.container.ulimits).get("nofile", 0)
    ok = hard == "unlimited" or (hard.isdigit() and int(hard) >= need)
    add("nofile", ok, f"hard limit {hard or '?'}, the node asks {need}", f"raise it (limits.conf) or pass --nofile {hard}")
    shm = facts.shm_kib
    add("shm", shm is not None and shm >= SHM_MIN_GIB * 2**20, f"/dev/shm {(shm or 0) / 2**20:.1f} GiB (shared with --ipc host)",
        f"mount /dev/shm with at least {SHM_MIN_GIB} GiB")

    # Socket interface towards the head
    if plan.network:
        add("interface", True, f"eth0 on {plan.network.name} (simulated network)")
    elif node_plan.host.nic:
        add("interface", True, f"{node_plan.host.nic} (given)")
    else:
        m = re.search(r"\bdev (\S+)", facts.route or "")
        if m and (facts.route or "").startswith("local "):  # the head itself: its address is one of this host's
            add("interface", True, f"the head's address {plan.head} is this host's own")
        else:
            add("interface", bool(m), f"{m.group(1)} routes to the head {plan.head}" if m else f"no route to the head {plan.head}",
                "fix routing, or give the NIC with --nic / a host's nic:")

    # Disk for the image, the image itself
    root, free = facts.docker_root, facts.disk_free_kib
    pull = facts.image != "present"
    need = DISK_RUN_GIB + (DISK_PULL_GIB if pull else 0)
    add("disk", free is not None and free >= need * 2**20, f"{(free or 0) / 2**20:.0f} GiB free for {root}",
        f"free space under {root} (docker system prune) for at least {need} GiB "
        + ("(the image's pull and the run's logs)" if pull else "(the run's logs and Ray's spilled objects)"))
    if facts.image == "present":
        add("image", True, f"{plan.image} present ({facts.image_size / 1e9:.1f} GB)")
    elif facts.image == "pullable":
        add("image", True, f"{plan.image} pullable")
    else:
        add("image", False, f"{plan.image} neither present nor pullable", "docker pull it, or rlbox build it")

    # Model, data and checkpoint paths
    missing = facts.missing_mounts
    add("paths", not missing, "missing: " + ", ".join(missing) if missing else
        f"{len(node_plan.container.mounts) - 4} mount source(s) present", "copy the model/data there, or fix --mount")

    # The NPUs' own network (RoCE ports, hccn_tool): what HCCL between hosts runs over
    for name, ok, detail, fix in npunet.judge(facts.npu_net, node_plan.npu_ids or tuple(range(node_plan.npus)),
                                              len(plan.nodes) > 1):
        add(name, ok, detail, fix)
    return out


def run_checks(plan: RunPlan, nodes: list[Node] | None = None, replace: bool = False) -> tuple[list[Check], float]:
    """Every check on every node, in parallel. ``nodes`` reuses open connections. Two rounds:
    every node's facts, then (several nodes) each node's NPUs ping the next node's NPU addresses."""
    from dataclasses import replace as changed

    start = time.perf_counter()
    opened: list[Node] = []
    views: dict[int, HostView] = {}

    def one(index: int) -> NodeFacts:
        node_plan = plan.nodes[index]
        node = nodes[index] if nodes else None
        if node is None:
            try:
                node = connect(node_plan.host)
                opened.append(node)
            except RlboxError as err:
                return NodeFacts(engine_error=str(err))
        stand_ins = Path(plan.sim_files) / node_plan.host.name if plan.sim_files else None
        views[index] = HostView(node_plan, node, stand_ins)
        return gather(node_plan, node, stand_ins, plan, replace)

    def ping(index: int) -> NodeFacts:
        facts = found[index]
        if index not in views or facts.npu_net is None:
            return facts
        peer_index = (index + 1) % len(plan.nodes)
        own = plan.nodes[index].npu_ids or tuple(range(plan.nodes[index].npus))
        pairs = npunet.ping_plan(own, plan.nodes[peer_index].label, found[peer_index].npu_net)
        return changed(facts, npu_net=ping_peers(views[index], facts.npu_net, pairs))

    try:
        found, errors = on_every(one, list(range(len(plan.nodes))))
        if errors:
            raise errors[0]
        if len(plan.nodes) > 1:
            found, errors = on_every(ping, list(range(len(plan.nodes))))
            if errors:
                raise errors[0]
    finally:
        for node in opened:
            node.close()
    checks = [c for i, facts in enumerate(found) for c in judge(facts, plan.nodes[i], plan, replace)]
    return checks, time.perf_counter() - start


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
