"""rlbox doctor's verdicts from a node's facts alone: one table row per verdict, each a pure call
of `doctor.judge`. No engine and no subprocess (both are refused while these tests run); the
reading half is covered by tests/test_doctor.py on a real engine."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import docker
import pytest

from conftest import REPO
from rlbox.cluster import launch, sim
from rlbox.cluster.preflight import doctor
from rlbox.cluster.preflight.facts import NodeFacts, df_kib, listening_ports
from rlbox.core.errors import RlboxError

GIB = 2**20  # in KiB, what df and the facts count in
REGISTRY = "swr.cn-south-1.myhuaweicloud.com/ascendhub"


@pytest.fixture(autouse=True)
def no_engine_no_subprocess(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a judgement test started a process or reached for an engine")

    for name in ("run", "Popen", "check_output", "call"):
        monkeypatch.setattr(subprocess, name, refuse)
    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.setattr(docker, "DockerClient", refuse)


@pytest.fixture(scope="module")
def plans():
    """Plans from the real planner (dry run: nothing read from any host)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLBOX_ROOT", str(REPO))

        def make(**kw):
            plan, _ = launch.prepare(launch.RunRequest(runs_dir=Path("/nonexistent/runs"), dry_run=True, nofile=65536, **kw))
            return plan

        a3 = make(hosts="10.0.0.1,10.0.0.2", image="verl_pt27_25rc3:a3-arm", name="t-doc-a3")
        return {
            "a3": a3,
            "a3 max": dataclasses.replace(a3, driver_max="25.3.1"),
            "a3 no min": dataclasses.replace(a3, driver_min=None),
            "a3 min none": dataclasses.replace(a3, driver_min="none"),
            "a2": make(hosts="10.0.0.1", image="verl_pt27_25rc3:a2-arm", name="t-doc-a2", nic="enp1",
                       mounts=["/models:/models", "/data:/data:ro"]),
            "a2 x16": make(hosts="10.0.0.1", image="verl_pt27_25rc3:a2-arm", name="t-doc-a2", devices=16),
            "ax": make(hosts="10.0.0.1", image="verl_pt27_25rc3:ax-x86", name="t-doc-ax"),
            "sim": make(sim=True, nodes=2, hardware="a3", name="t-doc-sim"),
        }


def healthy(plan, index: int = 0) -> NodeFacts:
    """What a node fit for this plan reports."""
    node = plan.nodes[index]
    hardware = plan.hardware
    route = None if plan.network or node.host.nic else f"{plan.head} dev enp189s0f0 src 10.0.0.{index + 1} uid 0\n    cache \n"
    return NodeFacts(
        engine_version="24.0.7", transport="ssh",
        devices=tuple(sorted(f"davinci{i}" for i in range(node.npus))),
        npu_smi=sim.npu_smi_table(hardware, node.npus, "25.3.rc1"), driver="25.3.rc1",
        npu_holders=(), listening=frozenset({22, 2379}), ray_processes=(), nofile_hard="1048576",
        shm_kib=64 * GIB, route=route, docker_root="/var/lib/docker", disk_free_kib=500 * GIB,
        image="present", image_size=31_000_000_000, missing_mounts=(),
    )


def _value(x, plan):
    return x(plan) if callable(x) else x


# ---------------------------------------------------------------------------------------------
# One row per verdict: the plan, what differs from a healthy node's facts, --replace, and the
# check that must then read so (name, ok, detail, fix; fix None: not compared).

ROWS = [
    # engine
    ("engine reached locally", "a3", {"transport": "local"}, False, "engine", True, "Docker 24.0.7 (local)", ""),
    ("engine reached over ssh", "a3", {}, False, "engine", True, "Docker 24.0.7 (ssh)", ""),
    ("engine unreachable", "a3",
     {"engine_error": "10.0.0.1: cannot reach over ssh (ssh: connect to host 10.0.0.1 port 22: Connection refused); "
                      "check the host, its ssh port and key"}, False,
     "engine", False, "cannot reach over ssh (ssh: connect to host 10.0.0.1 port 22: Connection refused); "
                      "check the host, its ssh port and key", "check the host, its ssh port and key, and dockerd"),
    ("engine unreachable over the tunnel", "a3",
     {"engine_error": "10.0.0.1: Docker engine not reachable over ssh (Error while fetching server API version)"}, False,
     "engine", False, "Docker engine not reachable over ssh (Error while fetching server API version)", None),
    ("host cannot be inspected", "a3", {"inspect_error": "Command '['ssh']' timed out after 15 seconds"}, False,
     "host", False, "cannot inspect: Command '['ssh']' timed out after 15 seconds", "check ssh access to the host"),
    # device nodes
    ("devices all there", "a3", {}, False, "devices", True, "16 /dev/davinci* (plan: 16; a3 hosts have 16)", None),
    ("device missing", "a3", {"devices": tuple(sorted(f"davinci{i}" for i in range(15)))}, False,
     "devices", False, "15 /dev/davinci* (plan: 16; a3 hosts have 16)",
     "a device is missing or the driver is not loaded: check `npu-smi info` and dmesg"),
    ("no device at all", "a3", {"devices": ()}, False, "devices", False, "0 /dev/davinci* (plan: 16; a3 hosts have 16)", None),
    ("a2 host of 16 planned for 8", "a2", {"devices": tuple(f"davinci{i}" for i in range(16))}, False,
     "devices", True, "16 /dev/davinci* (plan: 8; a2 hosts have 8/16)", None),
    ("a2 host of 8 planned for 16", "a2 x16", {"devices": tuple(f"davinci{i}" for i in range(8))}, False,
     "devices", False, "8 /dev/davinci* (plan: 16; a2 hosts have 8/16)", None),
    ("device count no a2 host has", "a2", {"devices": tuple(f"davinci{i}" for i in range(12))}, False,
     "devices", False, "12 /dev/davinci* (plan: 8; a2 hosts have 8/16)", None),
    # npu-smi and the chip
    ("npu-smi missing", "a3", {"npu_smi": "", "npu_smi_error": "bash: line 1: npu-smi: command not found"}, False,
     "npu-smi", False, "bash: line 1: npu-smi: command not found", "install the driver's npu-smi at /usr/local/bin/npu-smi"),
    ("npu-smi failed silently", "a3", {"npu_smi": "", "npu_smi_error": ""}, False,
     "npu-smi", False, "npu-smi failed", "install the driver's npu-smi at /usr/local/bin/npu-smi"),
    ("A3 chip on an A3 plan", "a3", {}, False, "chip", True, "npu-smi reports Ascend910 (A3); image hardware a3", None),
    ("A2 chip on an A3 plan", "a3", {"npu_smi": sim.npu_smi_table("a2", 16, "25.3.rc1")}, False,
     "chip", False, "npu-smi reports 910B3 (A2); image hardware a3", "use the a2 variant of the image (rlbox images list)"),
    ("A3 chip on an A2 plan", "a2", {"npu_smi": sim.npu_smi_table("a3", 16, "25.3.rc1")}, False,
     "chip", False, "npu-smi reports Ascend910 (A3); image hardware a2", "use the a3 variant of the image (rlbox images list)"),
    ("A2 chip on an A2 plan", "a2", {}, False, "chip", True, "npu-smi reports 910B3 (A2); image hardware a2", None),
    ("ax accepts a 910B chip", "ax", {}, False, "chip", True, "npu-smi reports 910B3 (A2); image hardware ax", None),
    ("ax refuses an A3 chip", "ax", {"npu_smi": sim.npu_smi_table("a3", 16, "25.3.rc1")}, False,
     "chip", False, "npu-smi reports Ascend910 (A3); image hardware ax", "use the a3 variant of the image (rlbox images list)"),
    ("unknown chip", "a3", {"npu_smi": sim.npu_smi_table("a3", 16, "25.3.rc1", "310P3")}, False,
     "chip", False, "npu-smi reports 310P3 (?); image hardware a3", "unknown chip"),
    ("npu-smi without an NPU row", "a3", {"npu_smi": "+----+\n| npu-smi 25.3.rc1 |\n"}, False,
     "chip", False, "npu-smi reports unknown (?); image hardware a3", "unknown chip"),
    # driver
    ("driver at the minimum", "a3", {}, False, "driver", True, "version.info 25.3.rc1; the image's CANN needs >= 25.3.rc1", None),
    ("driver above the minimum", "a3", {"driver": "25.5.0"}, False,
     "driver", True, "version.info 25.5.0; the image's CANN needs >= 25.3.rc1", None),
    ("driver below the minimum", "a3", {"driver": "24.1.rc1"}, False,
     "driver", False, "version.info 24.1.rc1; the image's CANN needs >= 25.3.rc1",
     "install an Ascend driver (HDK) >= 25.3.rc1, or use an image built for this driver"),
    ("driver of an older release", "a3", {"driver": "25.2.0"}, False,
     "driver", False, "version.info 25.2.0; the image's CANN needs >= 25.3.rc1", None),
    ("driver within both bounds", "a3 max", {"driver": "25.3.1"}, False,
     "driver", True, "version.info 25.3.1; the image's CANN needs >= 25.3.rc1 and <= 25.3.1", None),
    ("driver above the maximum", "a3 max", {"driver": "26.0.0"}, False,
     "driver", False, "version.info 26.0.0; the image's CANN needs >= 25.3.rc1 and <= 25.3.1",
     "install an Ascend driver (HDK) >= 25.3.rc1 and <= 25.3.1, or use an image built for this driver"),
    ("driver below the minimum with a maximum", "a3 max", {"driver": "24.1.rc1"}, False,
     "driver", False, "version.info 24.1.rc1; the image's CANN needs >= 25.3.rc1 and <= 25.3.1", None),
    ("version.info missing", "a3", {"driver": None}, False,
     "driver", False, "version.info missing; the image's CANN needs >= 25.3.rc1",
     "install an Ascend driver (HDK) >= 25.3.rc1, or use an image built for this driver"),
    ("any driver when the image names none", "a3 no min", {"driver": "23.0.0"}, False,
     "driver", True, "version.info 23.0.0", None),
    ("version.info missing when the image names none", "a3 no min", {"driver": None}, False,
     "driver", False, "version.info missing", "install the Ascend driver"),
    ("driver min none", "a3 min none", {"driver": None}, False,
     "driver", False, "version.info missing", "install the Ascend driver"),
    # NPUs held by other containers
    ("NPUs free", "a3", {}, False, "devices free", True, "no other container holds NPUs", ""),
    ("NPUs held by another container", "a3", {"npu_holders": (("d-leftover", None),)}, False,
     "devices free", False, "held by d-leftover", "stop them (docker rm -f d-leftover) or `rlbox stop --name RUN`"),
    ("NPUs held by two", "a3", {"npu_holders": (("old-a", "other"), ("old-b", None))}, False,
     "devices free", False, "held by old-a, old-b", "stop them (docker rm -f old-a old-b) or `rlbox stop --name RUN`"),
    ("NPUs held by this run, no --replace", "a3", {"npu_holders": (("rlbox-t-doc-a3-node0", "t-doc-a3"),)}, False,
     "devices free", False, "held by rlbox-t-doc-a3-node0", None),
    ("NPUs held by this run are ignored under --replace", "a3",
     {"npu_holders": (("rlbox-t-doc-a3-node0", "t-doc-a3"),)}, True, "devices free", True, "no other container holds NPUs", ""),
    ("NPUs held by another run still count under --replace", "a3",
     {"npu_holders": (("rlbox-t-doc-a3-node0", "t-doc-a3"), ("rlbox-other-node0", "other"))}, True,
     "devices free", False, "held by rlbox-other-node0", "stop them (docker rm -f rlbox-other-node0) or `rlbox stop --name RUN`"),
    # ports
    ("ports free", "a3", {}, False, "ports", True, "11 Ray ports of run t-doc-a3 free", ""),
    ("GCS port taken", "a3", lambda p: {"listening": frozenset({22, p.ports.gcs})}, False,
     "ports", False, lambda p: f"taken: {p.ports.gcs} (gcs)",
     lambda p: f"find the owner: ss -ltnp 'sport = :{p.ports.gcs}'; or use other NPUs (--devices): the ports follow the lowest NPU id"),
    ("two ports taken, named in order", "a3", lambda p: {"listening": frozenset({p.ports.metrics, p.ports.dashboard})}, False,
     "ports", False, lambda p: f"taken: {p.ports.dashboard} (dashboard), {p.ports.metrics} (metrics)",
     lambda p: f"find the owner: ss -ltnp 'sport = :{p.ports.dashboard}'; or use other NPUs (--devices): the ports follow the lowest NPU id"),
    ("--replace: the ports of the live run it takes over are its own", "a3",
     lambda p: {"listening": frozenset({p.ports.gcs, p.ports.dashboard}), "own_run_live": True}, True,
     "ports", True, "2 of run t-doc-a3's 11 Ray ports held by the run --replace removes first", ""),
    ("--replace with no live run of its own here: a taken port still fails", "a3",
     lambda p: {"listening": frozenset({p.ports.gcs})}, True,
     "ports", False, lambda p: f"taken: {p.ports.gcs} (gcs)",
     lambda p: f"find the owner: ss -ltnp 'sport = :{p.ports.gcs}'; or use other NPUs (--devices): the ports follow the lowest NPU id"),
    ("its own live run without --replace: a taken port fails", "a3",
     lambda p: {"listening": frozenset({p.ports.gcs}), "own_run_live": True}, False,
     "ports", False, lambda p: f"taken: {p.ports.gcs} (gcs)",
     lambda p: f"find the owner: ss -ltnp 'sport = :{p.ports.gcs}'; or use other NPUs (--devices): the ports follow the lowest NPU id"),
    ("a port in the worker range is not checked", "a3", lambda p: {"listening": frozenset({p.ports.worker_range[0]})}, False,
     "ports", True, "11 Ray ports of run t-doc-a3 free", ""),
    # stale Ray
    ("no Ray running", "a3", {}, False, "stale ray", True, "no Ray running", None),
    ("stale Ray running", "a3", {"ray_processes": ("4242", "4243")}, False,
     "stale ray", False, "2 Ray process(es) running",
     "a previous cluster is alive: `rlbox status` / `rlbox stop --name RUN`, or `ray stop` where it runs"),
    ("stale Ray not looked for under --replace", "a3", {"ray_processes": None}, True,
     "stale ray", True, "not checked: --replace removes this run's Ray first", ""),
    # nofile
    ("nofile high enough", "a3", {}, False, "nofile", True, "hard limit 1048576, the node asks 65536", None),
    ("nofile exactly enough", "a3", {"nofile_hard": "65536"}, False, "nofile", True, "hard limit 65536, the node asks 65536", None),
    ("nofile unlimited", "a3", {"nofile_hard": "unlimited"}, False, "nofile", True, "hard limit unlimited, the node asks 65536", None),
    ("nofile too low", "a3", {"nofile_hard": "4096"}, False,
     "nofile", False, "hard limit 4096, the node asks 65536", "raise it (limits.conf) or pass --nofile 4096"),
    ("nofile unreadable", "a3", {"nofile_hard": ""}, False,
     "nofile", False, "hard limit ?, the node asks 65536", "raise it (limits.conf) or pass --nofile "),
    # shared memory
    ("shm large enough", "a3", {}, False, "shm", True, "/dev/shm 64.0 GiB (shared with --ipc host)", None),
    ("shm at the minimum", "a3", {"shm_kib": 4 * GIB}, False, "shm", True, "/dev/shm 4.0 GiB (shared with --ipc host)", None),
    ("shm too small", "a3", {"shm_kib": 64 * 1024}, False,
     "shm", False, "/dev/shm 0.1 GiB (shared with --ipc host)", "mount /dev/shm with at least 4 GiB"),
    ("shm unreadable", "a3", {"shm_kib": None}, False, "shm", False, "/dev/shm 0.0 GiB (shared with --ipc host)", None),
    # interface towards the head
    ("interface routes to the head", "a3", {}, False, "interface", True, "enp189s0f0 routes to the head 10.0.0.1", None),
    ("no route to the head", "a3", {"route": "RTNETLINK answers: Network is unreachable\n"}, False,
     "interface", False, "no route to the head 10.0.0.1", "fix routing, or give the NIC with --nic / a host's nic:"),
    ("route not read", "a3", {"route": None}, False, "interface", False, "no route to the head 10.0.0.1", None),
    ("the head's own address (ip route get says local ... dev lo)", "a3",
     {"route": "local 10.0.0.1 dev lo table local src 10.0.0.1 uid 0 \\    cache <local> \n"}, False,
     "interface", True, "the head's address 10.0.0.1 is this host's own", None),
    ("a prohibit route to the head", "a3", {"route": "RTNETLINK answers: Permission denied\n"}, False,
     "interface", False, "no route to the head 10.0.0.1", None),
    ("interface given", "a2", {}, False, "interface", True, "enp1 (given)", ""),
    ("interface of the simulated network", "sim", {}, False, "interface", True, "eth0 on rlbox-t-doc-sim (simulated network)", ""),
    # disk and image
    ("disk free", "a3", {}, False, "disk", True, "500 GiB free for /var/lib/docker", None),
    ("disk at the minimum, the image present", "a3", {"disk_free_kib": 5 * GIB}, False, "disk", True, "5 GiB free for /var/lib/docker", None),
    ("disk full", "a3", {"disk_free_kib": 3 * GIB, "docker_root": "/data/docker"}, False,
     "disk", False, "3 GiB free for /data/docker",
     "free space under /data/docker (docker system prune) for at least 5 GiB (the run's logs and Ray's spilled objects)"),
    ("disk enough to run, not to pull the image", "a3", {"disk_free_kib": 49 * GIB, "image": "pullable", "image_size": 0},
     False, "disk", False, "49 GiB free for /var/lib/docker",
     "free space under /var/lib/docker (docker system prune) for at least 50 GiB (the image's pull and the run's logs)"),
    ("disk at the minimum, the image pulled", "a3", {"disk_free_kib": 50 * GIB, "image": "pullable", "image_size": 0},
     False, "disk", True, "50 GiB free for /var/lib/docker", None),
    ("disk unreadable", "a3", {"disk_free_kib": None}, False, "disk", False, "0 GiB free for /var/lib/docker", None),
    ("image present", "a3", {}, False, "image", True, f"{REGISTRY}/verl_pt27_25rc3:a3-arm present (31.0 GB)", ""),
    ("image pullable", "a3", {"image": "pullable", "image_size": 0}, False,
     "image", True, f"{REGISTRY}/verl_pt27_25rc3:a3-arm pullable", ""),
    ("image neither present nor pullable", "a3", {"image": "absent", "image_size": 0}, False,
     "image", False, f"{REGISTRY}/verl_pt27_25rc3:a3-arm neither present nor pullable", "docker pull it, or rlbox build it"),
    # mount sources
    ("no mounts of the run", "a3", {}, False, "paths", True, "0 mount source(s) present", None),
    ("mount sources present", "a2", {}, False, "paths", True, "2 mount source(s) present", None),
    ("mount sources missing", "a2", {"missing_mounts": ("/models", "/data")}, False,
     "paths", False, "missing: /models, /data", "copy the model/data there, or fix --mount"),
]


@pytest.mark.parametrize("plan_key,changes,replace,name,ok,detail,fix",
                         [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_verdict(plans, plan_key, changes, replace, name, ok, detail, fix):
    plan = plans[plan_key]
    node = plan.nodes[0]
    facts = dataclasses.replace(healthy(plan), **_value(changes, plan))
    checks = doctor.judge(facts, node, plan, replace)
    found = [c for c in checks if c.name == name]
    assert len(found) == 1, [c.name for c in checks]
    check = found[0]
    assert (check.node, check.ok, check.detail) == (node.label, ok, _value(detail, plan))
    if fix is not None:
        assert check.fix == _value(fix, plan)
    assert [c.line() for c in checks if not c.ok and c is not check] == []  # the row changes one verdict only


def test_every_verdict_is_in_the_table():
    names = {row[4] for row in ROWS}
    assert names == {"engine", "host", "devices", "npu-smi", "chip", "driver", "devices free", "ports", "stale ray",
                     "nofile", "shm", "interface", "disk", "image", "paths"}
    for name in names - {"host", "npu-smi"}:  # each can pass and fail (those two only fail: a working npu-smi is "chip")
        assert {row[5] for row in ROWS if row[4] == name} == {True, False}, name


def test_healthy_node_passes_every_check_in_order(plans):
    plan = plans["a3"]
    lines = [c.line() for c in doctor.judge(healthy(plan, 1), plan.nodes[1], plan, False)]
    assert lines == [
        "node1 (10.0.0.2): ✓ engine: Docker 24.0.7 (ssh)",
        "node1 (10.0.0.2): ✓ devices: 16 /dev/davinci* (plan: 16; a3 hosts have 16)",
        "node1 (10.0.0.2): ✓ chip: npu-smi reports Ascend910 (A3); image hardware a3",
        "node1 (10.0.0.2): ✓ driver: version.info 25.3.rc1; the image's CANN needs >= 25.3.rc1",
        "node1 (10.0.0.2): ✓ devices free: no other container holds NPUs",
        "node1 (10.0.0.2): ✓ ports: 11 Ray ports of run t-doc-a3 free",
        "node1 (10.0.0.2): ✓ stale ray: no Ray running",
        "node1 (10.0.0.2): ✓ nofile: hard limit 1048576, the node asks 65536",
        "node1 (10.0.0.2): ✓ shm: /dev/shm 64.0 GiB (shared with --ipc host)",
        "node1 (10.0.0.2): ✓ interface: enp189s0f0 routes to the head 10.0.0.1",
        "node1 (10.0.0.2): ✓ disk: 500 GiB free for /var/lib/docker",
        f"node1 (10.0.0.2): ✓ image: {REGISTRY}/verl_pt27_25rc3:a3-arm present (31.0 GB)",
        "node1 (10.0.0.2): ✓ paths: 0 mount source(s) present",
    ]


def test_failed_check_line_carries_its_fix(plans):
    plan = plans["a3"]
    facts = dataclasses.replace(healthy(plan), devices=())
    bad = [c for c in doctor.judge(facts, plan.nodes[0], plan, False) if not c.ok]
    assert [c.line() for c in bad] == [
        "node0 (10.0.0.1): ✗ devices: 0 /dev/davinci* (plan: 16; a3 hosts have 16) -> "
        "a device is missing or the driver is not loaded: check `npu-smi info` and dmesg"]
    assert doctor.as_json(bad)[0] == {"node": "node0 (10.0.0.1)", "name": "devices", "ok": False,
                                      "detail": "0 /dev/davinci* (plan: 16; a3 hosts have 16)",
                                      "fix": "a device is missing or the driver is not loaded: check `npu-smi info` and dmesg"}


def test_unreachable_or_uninspectable_node_is_one_check(plans):
    plan = plans["a3"]
    for facts, name in ((NodeFacts(engine_error="10.0.0.2: cannot reach over ssh (x)"), "engine"),
                        (NodeFacts(inspect_error="[Errno 2] No such file or directory: 'ssh'"), "host")):
        checks = doctor.judge(facts, plan.nodes[1], plan, False)
        assert [(c.node, c.name, c.ok) for c in checks] == [("node1 (10.0.0.2)", name, False)]


# ---------------------------------------------------------------------------------------------
# run_checks wires connect, gather and judge; here with stand-ins for both ends.

def test_run_checks_judges_every_node_in_order(plans, monkeypatch):
    plan = plans["sim"]
    seen = []

    def gather(node_plan, node, stand_ins, plan_, replace):
        seen.append((node_plan.index, node, stand_ins, replace))
        return healthy(plan, node_plan.index)

    monkeypatch.setattr(doctor, "gather", gather)
    checks, took = doctor.run_checks(plan, ["n0", "n1"], replace=True)
    assert [c.node for c in checks] == ["node0 (sim0)"] * 13 + ["node1 (sim1)"] * 13
    assert all(c.ok for c in checks) and took >= 0
    assert sorted(seen) == [(i, f"n{i}", Path(plan.sim_files) / f"sim{i}", True) for i in range(2)]


def test_run_checks_names_an_unreachable_engine(plans, monkeypatch):
    plan = plans["a3"]

    class Opened:
        closed = False

        def close(self):
            self.closed = True

    opened = Opened()

    def connect(host):
        if host.name == "10.0.0.2":
            raise RlboxError("10.0.0.2: cannot reach over ssh (ssh: connect to host 10.0.0.2 port 22: No route to host); "
                             "check the host, its ssh port and key")
        return opened

    monkeypatch.setattr(doctor, "connect", connect)
    monkeypatch.setattr(doctor, "gather", lambda node_plan, *_: healthy(plan, node_plan.index))
    checks, _ = doctor.run_checks(plan)
    assert [c.line() for c in checks if not c.ok] == [
        "node1 (10.0.0.2): ✗ engine: cannot reach over ssh (ssh: connect to host 10.0.0.2 port 22: No route to host); "
        "check the host, its ssh port and key -> check the host, its ssh port and key, and dockerd"]
    assert len(checks) == 14 and opened.closed


# ---------------------------------------------------------------------------------------------
# The small parsers gather uses.

@pytest.mark.parametrize("text,ports", [
    ("LISTEN 0      4096       127.0.0.1:24000      0.0.0.0:*\nLISTEN 0 128 [::]:22 [::]:*\n", {24000, 22}),
    ("LISTEN 0 511 *:8080 *:*\n", {8080}),
    ("", set()),
    ("garbage\nLISTEN 0 1 0.0.0.0:http 0.0.0.0:*\n", set()),
])
def test_listening_ports(text, ports):
    assert listening_ports(text) == ports


@pytest.mark.parametrize("text,available,kib", [
    ("Filesystem 1024-blocks Used Available Capacity Mounted on\ntmpfs 8388608 0 8388608 0% /dev/shm\n", False, 8388608),
    ("Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 100 40 60 40% /\n", True, 60),
    ("df: /nonexistent: No such file or directory\n", False, None),
    ("Filesystem 1024-blocks Used Available Capacity Mounted on\nx y z\n", True, None),
])
def test_df_kib(text, available, kib):
    assert df_kib(text, available) == kib
