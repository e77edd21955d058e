"""`rlbox run --backend slurm` on the session's testbed, which runs Slurm (`rlbox testbed up --slurm`:
Debian's munged, slurmctld on host 1, slurmd on every host; tests/conftest.py): the smoke job through a
real allocation on 2 of its 4 hosts, and the one-line failures (a wrong partition, more nodes than the
cluster has, a dead controller, Slurm's time limit), each with nothing left: no job in Slurm's queue, no
container. The CPU verl job through Slurm (a node lost, resumed): tests/training/test_cpu_training.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbox.backends.slurm import plan as sp
from support.testbed import rlbox

REPO = Path(__file__).resolve().parents[2]

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


def test_two_runs_share_two_nodes_by_the_npu_ids_slurm_allocates(clean, tmp_path):
    """Two runs asking 8 of each node's 16 NPUs as GRES (`--gres-npus --devices 8`), started at once: Slurm
    packs both on the same two nodes with disjoint ids (read from `scontrol show job -d`, never guessed);
    each run's containers get exactly those devices, and each job sees its 16 NPUs in Ray. Bring-up may take
    600 s: four raylets and two GCSs at once on a loaded 2-core machine met Ray's 30 s registration limit four
    times in a row on one worker (the CI of stop 47), each time started again (watch.RAYLET_WAITS)."""
    job = ["--", "python3", "-c", "import ray, time; ray.init(address='auto'); time.sleep(4);"
           "print('npus', ray.cluster_resources()['NPU'])"]
    procs = [subprocess.Popen([sys.executable, "-m", "rlbox.cli", "run", "--backend", "slurm", "--cluster", clean.cluster_file,
                               "--runs-dir", str(tmp_path), "--image", clean.image, "--nodes", "2", "--devices", "8",
                               "--gres-npus", "--time", "10", "--timeout", "600", "--name", name, *job],
                              cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(REPO / "launcher")))
             for name in ("sl-ga", "sl-gb")]
    outs = [p.communicate(timeout=900) for p in procs]
    ids = {}
    for p, (out, err), name in zip(procs, outs, ("sl-ga", "sl-gb")):
        assert p.returncode == 0, err[-3000:]
        assert "npus 16.0" in out and "cluster ready: 2 nodes, 16 NPUs" in err, (out + err)[-3000:]
        record = json.loads((tmp_path / name / "slurm.json").read_text())
        assert record["nodes_of_job"] == ["h1", "h2"], record
        ids[name] = record["npu_ids"]
        said = ", ".join(f"{n}: {sp.ids_text(tuple(i))}" for n, i in record["npu_ids"].items())
        assert f"slurm: NPU ids (GRES npu) {said}" in err, err[-3000:]
        assert "--exclusive" not in json.dumps(record)
    for node in ("h1", "h2"):
        a, b = set(ids["sl-ga"][node]), set(ids["sl-gb"][node])
        assert len(a) == len(b) == 8 and not a & b and a | b == set(range(16)), ids


@pytest.mark.parametrize("args, line", [
    (("--nodes", "2", "--partition", "nope"), "--partition nope: Slurm has no such partition (it has rlbox)"),
    (("--nodes", "5"), "--nodes 5: partition rlbox has 4 node(s)"),
])
def test_what_slurm_cannot_give_is_one_line(clean, tmp_path, args, line):
    proc = run(clean, tmp_path, *args, "--smoke-test", "--name", "sl-bad")
    assert _one_line(proc) == f"rlbox: error: {line}"
    assert not (tmp_path / "sl-bad" / "state.json").exists()


def _daemon(bed, index: int, name: str) -> int:
    """A Slurm daemon of this testbed (in host ``index``'s PID namespace), by looking."""
    init = bed.host(index)["init_pid"]
    ns = os.readlink(f"/proc/{init}/ns/pid")
    for pid in subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split():
        if os.readlink(f"/proc/{pid}/ns/pid") == ns:
            return int(pid)
    raise AssertionError(f"no {name} on host {index}")


def _controller(bed) -> int:
    return _daemon(bed, 1, "slurmctld")


def _start(bed, index: int, command: str) -> None:
    """Start a Slurm daemon again in host ``index``, as `rlbox testbed up --slurm` does."""
    init = bed.host(index)["init_pid"]
    subprocess.run(["nsenter", f"--target={init}", "--mount", "--net", "--pid", "--", "unshare", "--uts", "sh", "-c",
                    f"hostname h{index}; exec {command}"], check=True)


def test_dead_controller_is_one_line(clean, tmp_path):
    os.kill(_controller(clean), signal.SIGTERM)
    try:
        proc = run(clean, tmp_path, "--nodes", "2", "--smoke-test", "--name", "sl-dead")
        assert "the controller does not answer on " in _one_line(proc) and "is slurmctld running?" in proc.stderr
    finally:
        _start(clean, 1, "slurmctld")
        for _ in range(60):
            if clean.ssh(1, "sinfo", "-h").returncode == 0:
                break


def started(bed, tmp_path: Path, name: str, time_limit: str) -> tuple[subprocess.Popen, list[str]]:
    """`rlbox run --backend slurm` of a `sleep 600` job on 2 nodes, once its job runs on both."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "run", "--backend", "slurm", "--cluster", bed.cluster_file,
                             "--runs-dir", str(tmp_path), "--image", bed.image, "--nodes", "2", "--time", time_limit,
                             "--name", name, "--no-validate", "--", "sleep", "600"],
                            cwd=repo, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(repo / "launcher")))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if " submitted; log: " in line:
            return proc, seen
    raise AssertionError("".join(seen))


def test_slurm_time_limit_ends_the_run_with_nothing_left(clean, tmp_path):
    proc, seen = started(clean, tmp_path, "sl-time", "2")
    try:
        # `rlbox status` while it runs: the nodes' containers and Slurm's own word on the allocation
        status = rlbox("status", "--name", "sl-time", "--runs-dir", tmp_path)
        assert status.returncode == 0, status.stderr
        assert re.search(r"^slurm: job \d+: RUNNING on h\[1-2\], \S+ of 2:00$", status.stdout, re.M), status.stdout
        rest = proc.stderr.read()
        assert proc.wait(timeout=300) != 0
    finally:
        if proc.poll() is None:  # a failed check: the run ends as on Ctrl-C, its allocation cancelled
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    errors = [line for line in rest.splitlines() if line.startswith("rlbox: error:")]
    assert len(errors) == 1 and "Traceback" not in rest, "".join(seen) + rest
    assert "Slurm's time limit (--time 2) ended the allocation" in errors[0], rest[-3000:]
    after = rlbox("status", "--name", "sl-time", "--runs-dir", tmp_path, "--json")
    assert json.loads(after.stdout)["scheduler"]["state"] in ("TIMEOUT", "GONE"), after.stdout


def test_a_slurmd_that_dies_is_named_within_seconds_and_nothing_is_left(clean, tmp_path):
    """slurmd of the worker's node killed mid-run: Slurm marks the node not responding, then DOWN; rlbox
    names the node from Slurm's own answer and tears the run down on every node."""
    proc, seen = started(clean, tmp_path, "sl-down", "10")
    os.kill(_daemon(clean, 2, "slurmd"), signal.SIGKILL)
    killed = time.monotonic()
    try:
        rest = proc.stderr.read()
        code = proc.wait(timeout=120)
        took = time.monotonic() - killed
        errors = [line for line in rest.splitlines() if line.startswith("rlbox: error:")]
        assert code != 0 and len(errors) == 1 and "Traceback" not in rest, "".join(seen) + rest
        assert errors[0].startswith("rlbox: error: slurm: node h2 is "), errors[0]
        print(f"\nslurmd killed -> {errors[0]} after {took:.1f} s")
        assert took < 60, took  # SlurmdTimeout is 10 s on the testbed; the site default 300 s is Slurm's, not rlbox's
    finally:
        _start(clean, 2, "slurmd -N h2")
        for _ in range(60):  # ReturnToService=2: the node is idle again once it answers
            state = clean.ssh(1, "sinfo -h -N -n h2 -o %T").stdout.strip()
            if state == "idle":
                break
            time.sleep(1)
