"""`rlbox run --backend slurm` on the session's testbed, which runs Slurm (`rlbox testbed up --slurm`:
Debian's munged, slurmctld on host 1, slurmd on every host; tests/conftest.py): the smoke job through a
real allocation on 2 of its 4 hosts, and the one-line failures (a wrong partition, more nodes than the
cluster has, a dead controller, Slurm's time limit), each with nothing left: no job in Slurm's queue, no
container. The CPU verl job through Slurm (a node lost, resumed): tests/training/test_cpu_training.py."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from support.testbed import rlbox

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def bed(testbed, sim_image):
    """The session's testbed, the simulation image on every host."""
    if testbed.image != sim_image:
        testbed.deliver(sim_image)
    return testbed


@pytest.fixture
def clean(bed):
    yield bed
    queue = bed.ssh(1, "squeue -h -o '%i %j %T'")  # one word: the remote shell splits the rest
    left = [line for h in bed.hosts for line in bed.leftovers_prefix("sl-", h["index"])]
    bed.remove_runs("sl-")
    assert queue.returncode == 0 and queue.stdout.strip() == "", queue.stdout + queue.stderr
    assert left == [], left


def run(bed, tmp_path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return rlbox("run", "--backend", "slurm", "--cluster", bed.cluster_file, "--runs-dir", tmp_path,
                 "--image", bed.image, *args, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlbox: error:")]
    assert proc.returncode != 0 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def test_smoke_job_through_a_slurm_allocation(clean, tmp_path):
    proc = run(clean, tmp_path, "--nodes", "2", "--time", "10", "--smoke-test", "--name", "sl-smoke")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rlbox-smoke: 2 nodes, 32 NPUs: all visible" in proc.stdout
    assert "runs on h1 (" in proc.stderr and "Ray's head on h1" in proc.stderr
    assert "ended (scancel)" in proc.stderr
    assert (tmp_path / "sl-smoke" / "slurm.json").exists()


@pytest.mark.parametrize("args, line", [
    (("--nodes", "2", "--partition", "nope"), "--partition nope: Slurm has no such partition (it has rlbox)"),
    (("--nodes", "5"), "--nodes 5: partition rlbox has 4 node(s)"),
])
def test_what_slurm_cannot_give_is_one_line(clean, tmp_path, args, line):
    proc = run(clean, tmp_path, *args, "--smoke-test", "--name", "sl-bad")
    assert _one_line(proc) == f"rlbox: error: {line}"
    assert not (tmp_path / "sl-bad" / "state.json").exists()


def _controller(bed) -> int:
    """slurmctld of this testbed (in host 1's PID namespace), by looking."""
    init = bed.host(1)["init_pid"]
    ns = os.readlink(f"/proc/{init}/ns/pid")
    for pid in subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True, text=True).stdout.split():
        if os.readlink(f"/proc/{pid}/ns/pid") == ns:
            return int(pid)
    raise AssertionError("no slurmctld on host 1")


def test_dead_controller_is_one_line(clean, tmp_path):
    os.kill(_controller(clean), signal.SIGTERM)
    try:
        proc = run(clean, tmp_path, "--nodes", "2", "--smoke-test", "--name", "sl-dead")
        assert "the controller does not answer on " in _one_line(proc) and "is slurmctld running?" in proc.stderr
    finally:
        init = clean.host(1)["init_pid"]
        subprocess.run(["nsenter", f"--target={init}", "--mount", "--net", "--pid", "--", "unshare", "--uts", "sh", "-c",
                        "hostname h1; exec slurmctld"], check=True)
        for _ in range(60):
            if clean.ssh(1, "sinfo", "-h").returncode == 0:
                break


def test_slurm_time_limit_ends_the_run_with_nothing_left(clean, tmp_path):
    proc = run(clean, tmp_path, "--nodes", "2", "--time", "1", "--name", "sl-time", "--no-validate", "--", "sleep", "600")
    assert "Slurm's time limit (--time 1) ended the allocation" in _one_line(proc), proc.stderr[-3000:]
