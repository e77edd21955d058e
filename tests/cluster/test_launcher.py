"""The launcher on a real engine with real Ray: simulated Ascend nodes, one reached over real sshd.
Scenarios the session's testbed runs on the production path are not repeated here: 4 A3 hosts to 64 NPUs
and the smoke job, a job's exit code (tests/testbed/test_cluster_on_testbed.py); Ctrl-C on simulated
nodes: tests/cluster/test_node_loss.py (three in a row)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import rlbox
from support.engine import leftovers, remove_test_runs
from support.sshd import SshServer

pytestmark = pytest.mark.engine


@pytest.fixture(autouse=True)
def no_leftovers_between_tests():
    """Whatever a failing test leaves behind must not fail the next one."""
    yield
    remove_test_runs("t-")


def smoke_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("rlbox-smoke: node")]


def test_detach_status_logs_stop_and_refusal(runs):
    name = "t-life"
    proc = rlbox("run", "--sim", "--nodes", "2", "--hardware", "a2", "--name", name, "--runs-dir", runs, "--detach",
                 "--", "bash", "-c", "echo started; npu-smi info | head -7 | tail -1; sleep 4; echo done")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(leftovers(name)) == 3  # two nodes and the network stay up
    again = rlbox("run", "--sim", "--nodes", "2", "--name", name, "--runs-dir", runs, "--smoke-test")
    assert again.returncode == 2 and f"run '{name}' is already live" in again.stderr
    status = rlbox("status", "--name", name, "--runs-dir", runs, "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert [n["state"] for n in info["nodes"]] == ["running", "running"]
    assert info["job"]["status"] in ("PENDING", "RUNNING", "SUCCEEDED")
    logs = rlbox("logs", "--name", name, "--runs-dir", runs, "-f")
    assert logs.returncode == 0, logs.stderr
    assert "started" in logs.stdout and "done" in logs.stdout
    assert "| 0     910B3               | OK" in logs.stdout  # the npu-smi stand-in, A2 layout
    stop = rlbox("stop", "--name", name, "--runs-dir", runs)
    assert stop.returncode == 0 and "removed 2 container(s)" in stop.stdout
    assert leftovers(name) == []


def test_worker_that_cannot_join_times_out_naming_it(runs, tmp_path):
    fake_ray = tmp_path / "ray"
    fake_ray.write_text("#!/bin/sh\necho 'this ray never joins' >&2\nexec sleep 3600\n")
    fake_ray.chmod(0o755)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"hosts:\n  - host: node-a\n  - host: node-b\n    mounts: ['{fake_ray}:/opt/rlbox/venv/bin/ray:ro']\n")
    proc = rlbox("run", "--sim", "--cluster", cluster, "--nodes", "2", "--name", "t-join", "--runs-dir", runs,
                 "--timeout", "40", "--smoke-test")  # the head's Ray joins well within it on a loaded machine
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "cluster not ready (timed out after 40 s): 16/32 NPUs from 1/2 nodes; never joined: node1 (node-b)" in last
    assert leftovers("t-join") == []


def test_missing_image_and_missing_device_are_clear_and_leave_nothing(runs, sim_image):
    proc = rlbox("run", "--sim", "--nodes", "2", "--image", "localhost/rlbox/nothing:here", "--name", "t-img",
                 "--runs-dir", runs, "--smoke-test")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("rlbox: error: sim0: image localhost/rlbox/nothing:here is not present; "
                                   "pull it with `docker pull localhost/rlbox/nothing:here` "
                                   "(or `rlbox pull localhost/rlbox/nothing:here`)")
    assert leftovers("t-img") == []
    # A real (not simulated) node on this machine: it has no /dev/davinci0. Pre-flight says so...
    proc = rlbox("run", "--hosts", "localhost", "--image", sim_image, "--hardware", "a2", "--devices", "8",
                 "--name", "t-dev", "--runs-dir", runs, "--smoke-test")
    assert proc.returncode == 2
    assert "pre-flight: " in proc.stderr and "✗ devices: 0 /dev/davinci* (plan: 8; a2 hosts have 8/16)" in proc.stderr
    assert leftovers("t-dev") == []
    # ...and without it, the engine's refusal (this machine has no driver either: bind mounts are
    # never created on the host) becomes the same kind of one line, nothing left behind.
    proc = rlbox("run", "--hosts", "localhost", "--image", sim_image, "--hardware", "a2", "--devices", "8",
                 "--name", "t-dev", "--runs-dir", runs, "--smoke-test", "--no-doctor")
    assert proc.returncode == 2
    assert "localhost: /usr/local/Ascend/driver does not exist on the host; install the Ascend driver" in proc.stderr
    assert not Path("/usr/local/Ascend/driver").exists()
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert leftovers("t-dev") == []


def test_node_over_ssh_works_like_a_local_one(runs, tmp_path):
    with SshServer(tmp_path / "sshd") as srv:
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(
            "hosts:\n  - host: local\n"
            f"  - host: 127.0.0.1\n    ssh: {{user: {srv.user}, port: {srv.port}, identity_file: {srv.identity_file}, "
            f"known_hosts: {srv.known_hosts}}}\n"
        )
        dry = rlbox("run", "--sim", "--cluster", cluster, "--name", "t-ssh", "--runs-dir", runs, "--smoke-test", "--dry-run")
        assert f"node 1 (worker) on 127.0.0.1 via ssh://{srv.user}@127.0.0.1" in dry.stdout
        proc = rlbox("run", "--sim", "--cluster", cluster, "--name", "t-ssh", "--runs-dir", runs, "--smoke-test",
                     "--hardware", "a3", "--timeout", "120", "--nofile", "16384")
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines = smoke_lines(proc.stdout)
        assert len(lines) == 2 and all(" ok NPUs=16 " in line for line in lines)
        assert leftovers("t-ssh") == []
        # An unreachable host is named, and nothing starts anywhere.
        cluster.write_text(
            "hosts:\n  - host: local\n"
            f"  - host: 127.0.0.1\n    ssh: {{port: 1, identity_file: {srv.identity_file}, known_hosts: {srv.known_hosts}}}\n"
        )
        proc = rlbox("run", "--sim", "--cluster", cluster, "--name", "t-ssh2", "--runs-dir", runs, "--smoke-test")
        assert proc.returncode == 2 and "127.0.0.1: cannot reach over ssh" in proc.stderr
        assert leftovers("t-ssh2") == []
