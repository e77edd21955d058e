"""What only a real cluster (separate hosts, each its own engine) meets, found on the testbed and
kept here as table tests: one host with another image under the run's tag; a site's open-files
limit from the cluster file; workers waiting for the head's raylet, not only its GCS."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time

import pytest

from rlbox.cluster import launch
from rlbox.cluster.bringup import image_skew
from rlbox.cluster.plan import NODE_SCRIPT


def plan_of(tmp_path, hosts=("10.0.0.1", "10.0.0.2", "10.0.0.3"), extra=""):
    path = tmp_path / "cluster.yaml"
    path.write_text("hardware: a3\nimage: localhost/rlbox/sim:amd64\n" + extra
                    + "ssh: {user: root}\nhosts:\n" + "".join(f"  - host: {h}\n" for h in hosts))
    plan, _ = launch.prepare(launch.RunRequest(cluster_file=path, dry_run=True, smoke_test=True, runs_dir=tmp_path))
    return plan


A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.mark.parametrize("ids, odd", [
    ((A, A, A), None),
    ((A, B, A), "10.0.0.2 has bbbbbbbbbbbb, the others aaaaaaaaaaaa"),
    ((B, A, A), "10.0.0.1 has bbbbbbbbbbbb, the others aaaaaaaaaaaa"),
    ((A, B, B), "10.0.0.1 has aaaaaaaaaaaa, the others bbbbbbbbbbbb"),
])
def test_a_node_with_another_image_under_the_tag_is_named(tmp_path, ids, odd):
    plan = plan_of(tmp_path)
    line = image_skew(plan, list(ids))
    if odd is None:
        assert line is None
    else:
        assert line.startswith(f"image {plan.image} differs between nodes: {odd}; ") and "\n" not in line


def test_two_nodes_that_disagree_name_the_worker_not_the_head(tmp_path):
    plan = plan_of(tmp_path, hosts=("10.0.0.1", "10.0.0.2"))
    assert "differs between nodes: 10.0.0.2 has bbbbbbbbbbbb, the others aaaaaaaaaaaa" in image_skew(plan, [A, B])


def test_the_cluster_file_s_nofile_is_every_node_s_limit_and_the_option_wins(tmp_path):
    plan = plan_of(tmp_path, extra="nofile: 20000\n")
    assert {dict((n, s) for n, s, _ in node.container.ulimits)["nofile"] for node in plan.nodes} == {20000}
    assert "--ulimit nofile=20000:20000" in plan.describe()
    path = tmp_path / "cluster.yaml"
    plan, _ = launch.prepare(launch.RunRequest(cluster_file=path, dry_run=True, smoke_test=True, nofile=4096))
    assert {dict((n, s) for n, s, _ in node.container.ulimits)["nofile"] for node in plan.nodes} == {4096}
    plan = plan_of(tmp_path)
    assert {dict((n, s) for n, s, _ in node.container.ulimits)["nofile"] for node in plan.nodes} == {65536}


def _listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


def _worker(gcs_port: int, raylet_port: int, **env) -> subprocess.Popen:
    """The node script as a worker of a head on this machine, its `ray start` an echo of its arguments."""
    return subprocess.Popen(["bash", "-c", NODE_SCRIPT, "rlbox-node", "worker", "127.0.0.1", str(gcs_port),
                             "echo", "ray-started", f"--node-manager-port={raylet_port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, **env))


@contextlib.contextmanager
def _head_and_worker(listening: bool = True, **env):
    """A head's GCS and raylet sockets (bound; the GCS listening unless not ``listening``: a head still
    booting) and the node script as its worker, all ended after the block."""
    import tempfile

    gcs, gcs_port = _listener()
    raylet, raylet_port = _listener()
    if listening:
        gcs.listen()
    with tempfile.TemporaryDirectory(prefix="rlbox-go-") as folder:  # its go file, not there unless a test writes it
        proc = _worker(gcs_port, raylet_port, **{"RLBOX_GO_FILE": f"{folder}/go", **env})
        try:
            yield proc, gcs, raylet, gcs_port, raylet_port
        finally:
            proc.kill()
            proc.wait()
            gcs.close()
            raylet.close()


def test_a_worker_starts_ray_once_the_head_s_gcs_listens_not_before():
    """Not before (its `ray start` would give up), nor later than it must: from then on Ray's own start waits for
    the head's raylet to register (40 s), while its imports overlap the head's start (bench/bringup.py: the
    workers phase of 2 hosts 2.6 -> 0.8 s when the wait for the head's raylet port went)."""
    with _head_and_worker(listening=False) as (proc, gcs, _, gcs_port, raylet_port):  # the raylet never listens here
        time.sleep(1.5)
        assert proc.poll() is None  # the GCS does not answer: still waiting
        gcs.listen()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith(f"ray-started --node-manager-port={raylet_port} --node-ip-address=127.0.0.1 "
                          f"--address=127.0.0.1:{gcs_port}")


def test_a_gated_worker_starts_ray_on_the_launcher_s_go_not_before_and_not_on_a_clock():
    with _head_and_worker(RLBOX_GATED="1") as (proc, _, raylet, _, _):
        raylet.listen()
        deadline = time.monotonic() + 20
        line = proc.stdout.readline()  # "rlbox-node: worker on ..." then the wait's own line
        while "waiting for the launcher's go" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "waiting for the launcher's go" in line
        time.sleep(2.5)
        assert proc.poll() is None  # both head ports answer, yet no go: still waiting, whatever the clock
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith("ray-started --node-manager-port=")


def test_a_gated_worker_whose_go_came_before_it_waited_starts():
    """The launcher may give the go before the node script reaches its wait (a container slow to start): no
    `sleep` was started then, and `set -u` must not end the script on an unset $!."""
    with _head_and_worker(RLBOX_GATED="1") as (proc, _, raylet, _, _):
        raylet.listen()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the go as soon as its trap is set (the script's first line)
            status = open(f"/proc/{proc.pid}/status").read()
            caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
            if caught & (1 << (signal.SIGUSR1 - 1)):
                break
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith("ray-started --node-manager-port=")


def test_a_gated_worker_whose_go_signal_was_lost_starts_on_its_go_file(tmp_path):
    """A go signalled before the script set its trap is lost (bash as a container's first process ignores it):
    the go file the launcher wrote with it is seen within the second, and stays for a start after a restart."""
    go = tmp_path / "go"
    go.write_text("")
    with _head_and_worker(RLBOX_GATED="1", RLBOX_GO_FILE=str(go)) as (proc, _, raylet, _, _):
        raylet.listen()
        out, err = proc.communicate(timeout=20)  # no signal at all
    assert proc.returncode == 0, err
    assert "waiting for the launcher's go" in out and out.splitlines()[-1].startswith("ray-started --node-manager-port=")


def test_a_gated_worker_waits_for_the_go_before_it_polls_the_head():
    """Its go comes once Ray's node table holds the workers before it, so the head answers by then: until the
    go it asks the head nothing (15 workers each polling a booting head ten times a second cost ~1.7 CPU-s at
    16 testbed hosts, bench/bringup.py --perf)."""
    with _head_and_worker(listening=False, RLBOX_GATED="1") as (proc, gcs, raylet, _, _):
        deadline = time.monotonic() + 20
        line = proc.stdout.readline()
        while "waiting for the launcher's go" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        assert "waiting for the launcher's go" in line  # said while the head does not answer yet
        gcs.listen()
        raylet.listen()
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].startswith("ray-started --node-manager-port=")
