"""rlbox doctor on simulated hosts that are broken in the ways real ones are."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import docker
import pytest

from conftest import rlbox
from support.engine import leftovers
from rlbox.cluster import hosts, launch, sim
from rlbox.cluster.plan import ports_for
from rlbox.cluster.preflight import facts

pytestmark = pytest.mark.engine


def doctor(runs, *args):
    proc = rlbox("doctor", "--sim", "--hardware", "a3", "--runs-dir", runs, "--json", *args)
    data = json.loads(proc.stdout) if proc.stdout.strip() else {"checks": []}
    failed = {(c["node"], c["name"]): c for c in data["checks"] if not c["ok"]}
    return proc, data, failed


def test_healthy_four_node_cluster_passes(runs):
    proc, data, failed = doctor(runs, "--nodes", "4", "--name", "t-doc-ok")
    assert proc.returncode == 0, failed
    names = {c["name"] for c in data["checks"]}
    assert names >= {"engine", "devices", "chip", "driver", "devices free", "ports", "stale ray", "nofile", "shm",
                     "interface", "disk", "image", "paths"}
    assert len({c["node"] for c in data["checks"]}) == 4
    assert data["seconds"] < 30  # sanity only; speed is measured by bench/preflight.py


BROKEN_HOSTS = [
    ("device missing", "{devices: 15}", "devices", "15 /dev/davinci* (plan: 15; a3 hosts have 16)"),
    ("wrong chip", "{chip: 910B3}", "chip", "npu-smi reports 910B3 (A2); image hardware a3"),
    ("old driver", "{driver: 24.1.rc1}", "driver", "version.info 24.1.rc1; the image's CANN needs >= 25.3.rc1"),
]


@pytest.mark.parametrize("case,sim,check,detail", BROKEN_HOSTS, ids=[b[0] for b in BROKEN_HOSTS])
def test_broken_simulated_host_is_named_with_its_fix(runs, tmp_path, case, sim, check, detail):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"hosts:\n  - host: good\n  - host: bad\n    sim: {sim}\n")
    proc, _, failed = doctor(runs, "--cluster", cluster, "--name", "t-doc-bad")
    assert proc.returncode == 1
    assert list(failed) == [("node1 (bad)", check)]
    assert failed[("node1 (bad)", check)]["detail"] == detail
    assert failed[("node1 (bad)", check)]["fix"]
    # rlbox run stops on the same check before anything starts
    run = rlbox("run", "--sim", "--cluster", cluster, "--hardware", "a3", "--name", "t-doc-bad", "--runs-dir", runs, "--smoke-test")
    assert run.returncode == 2
    assert f"pre-flight: node1 (bad): ✗ {check}: {detail}" in run.stderr and "nothing was started" in run.stderr
    assert leftovers("t-doc-bad") == []


def test_port_held_leftover_container_and_missing_path(runs, tmp_path):
    client = docker.from_env()
    port = ports_for(0).gcs  # the run's slot: its lowest NPU id
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    leftover = client.containers.run("rlbox/debian:bookworm", ["sleep", "300"], detach=True, name="t-doc-leftover",
                                     devices=["/dev/null:/dev/davinci0:rwm"])
    try:
        proc, _, failed = doctor(runs, "--nodes", "2", "--name", "t-doc-held", "--mount", "/nonexistent/models:/models")
        assert proc.returncode == 1
        assert failed[("node0 (sim0)", "ports")]["detail"] == f"taken: {port} (gcs)"
        assert failed[("node1 (sim1)", "devices free")]["detail"] == "held by t-doc-leftover"
        assert "docker rm -f t-doc-leftover" in failed[("node1 (sim1)", "devices free")]["fix"]
        assert failed[("node0 (sim0)", "paths")]["detail"] == "missing: /nonexistent/models"
    finally:
        holder.close()
        leftover.remove(force=True)


def test_unreachable_host_is_a_failed_check_not_a_crash(runs, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - host: local\n  - host: 127.0.0.1\n    ssh: {port: 1}\n")
    proc, _, failed = doctor(runs, "--cluster", cluster, "--name", "t-doc-ssh")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "cannot reach over ssh" in failed[("node1 (127.0.0.1)", "engine")]["detail"]


def test_gather_reads_a_simulated_host_as_plain_facts(runs, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - host: good\n  - host: bad\n    sim: {devices: 15, chip: 910B3, driver: 24.1.rc1}\n")
    plan, _ = launch.prepare(launch.RunRequest(sim=True, cluster_file=cluster, hardware="a3", name="t-doc-facts",
                                               runs_dir=runs, mounts=["/nonexistent/models:/models"], dry_run=True))
    sim.write_hosts(plan)
    node = hosts.connect(plan.nodes[1].host)
    try:
        got = facts.gather(plan.nodes[1], node, Path(plan.sim_files) / "bad", plan, replace=True)
    finally:
        node.close()
    assert got.engine_error is None and got.inspect_error is None and got.transport == "local"
    assert got.engine_version == docker.from_env().version()["Version"]
    assert got.devices == tuple(sorted(f"davinci{i}" for i in range(15)))
    assert got.npu_smi_error is None and "910B3" in got.npu_smi and got.driver == "24.1.rc1"
    assert got.ray_processes is None and got.route is None  # --replace; simulated network
    assert got.image == "present" and got.image_size > 0 and got.docker_root and got.disk_free_kib
    assert got.shm_kib and got.nofile_hard and got.missing_mounts == ("/nonexistent/models",)
