"""The launcher on a real engine with real Ray: simulated Ascend nodes, one reached over real sshd.
Scenarios the session's testbed runs on the production path are not repeated here: 4 A3 hosts to 64 NPUs
and the smoke job, a job's exit code (tests/testbed/test_cluster_on_testbed.py); Ctrl-C on simulated
nodes: tests/cluster/test_node_loss.py (three in a row)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import rlbox
from rlbox.cluster import watch
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


# The sim image's raylet (Ray 2.60), replaced on one node by one that writes its log where Ray tells the raylet
# to (its --stdout_filepath: the session's logs/raylet.out) and never registers with the GCS.
SILENT_RAYLET = """#!/bin/sh
for a in "$@"; do case $a in --stdout_filepath=*) out=${a#*=} ;; esac; done
{ echo "[2026-11-29 16:50:00,000 I 7 7] main.cc:1: starting"
  echo "[2026-11-29 16:50:01,000 W 7 7] gcs_rpc_client.h:151: this raylet never registers"
  echo "[2026-11-29 16:50:02,000 I 7 7] main.cc:2: waiting"; } > "$out"
exec sleep 3600
"""
RAYLET_IN_IMAGE = "/opt/rlbox/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet"


def test_worker_that_cannot_join_is_started_again_with_its_raylet_s_words_then_times_out_naming_it(runs, tmp_path):
    """Real `ray start` on a worker whose raylet never registers: Ray's own give-up (its fixed 30 s) is seen, the
    node is started again with the raylet's last warning in the line (read from the exited container), and the
    bring-up's --timeout names the node that never joined."""
    raylet = tmp_path / "raylet"
    raylet.write_text(SILENT_RAYLET)
    raylet.chmod(0o755)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"hosts:\n  - host: node-a\n  - host: node-b\n    mounts: ['{raylet}:{RAYLET_IN_IMAGE}:ro']\n")
    proc = rlbox("run", "--sim", "--cluster", cluster, "--nodes", "2", "--name", "t-join", "--runs-dir", runs,
                 "--timeout", "75", "--smoke-test")  # Ray's 30 s and a start, within it on a loaded machine
    assert proc.returncode == 2
    again = [line for line in proc.stderr.splitlines() if "starting it again" in line]
    assert again and again[0] == ("rlbox: node1 (node-b): Ray's start-up gave up (timed out during startup; raylet: "
                                  "[2026-11-29 16:50:01,000 W 7 7] gcs_rpc_client.h:151: this raylet never registers); "
                                  f"starting it again (1/{watch.RAYLET_WAITS})"), proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "cluster not ready (timed out after 75 s): 16/32 NPUs from 1/2 nodes; never joined: node1 (node-b)" in last
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
