"""Node loss on the simulated cluster, real engine, real Ray: a job that checkpoints a step
counter on a shared mount and touches every node each step; a worker or the head killed mid-job;
a head whose Ray start timed out; repeated Ctrl-C. Every run must leave nothing behind. A worker lost
and the run resumed from its checkpoint: tests/cluster/test_log_on_loss.py; restarts used up:
tests/cluster/test_faults.py (three losses, two restarts)."""

from __future__ import annotations

import re
import signal
import time

import docker
import pytest

from conftest import rlbox
from support.engine import claims, leftovers, remove_test_runs
from support.job_run import BESIDE_DEVICES, Run, own_hosts

pytestmark = [pytest.mark.engine, pytest.mark.beside_sims]
HOSTS = ("nl0", "nl1")  # simulated hosts of this module's own (`beside_sims`: tests/conftest.py)


def _where(tmp_path, nodes: int = 2) -> tuple[str, ...]:
    return (*own_hosts(tmp_path / "hosts", *HOSTS[:nodes]), "--no-doctor", *BESIDE_DEVICES)


@pytest.fixture(autouse=True)
def no_leftovers_between_tests():
    yield
    Run.end_all()  # a run an assertion left mid-way first: it would remove and make containers meanwhile
    remove_test_runs("t12-")


def test_worker_lost_without_restarts_is_named_within_seconds_and_nothing_is_left(runs, tmp_path):
    run = Run(runs, tmp_path / "shared", "t12-wlost", 40, where=_where(tmp_path))
    run.wait_for("step:2 ")
    killed = run.kill(1)
    code = run.finish()
    err = run.stderr()
    assert code not in (0, None), err[-2000:]
    assert "node1 (nl1), the worker, was lost: its container exited with code 137 (killed)" in err
    # within seconds: a loaded engine says the container exited only once it has torn its network down (the CI
    # of stop 44: Ray's health check marked the node DEAD first), and the watch waits for those words
    assert run.seen_at("was lost") - killed < 10.0, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("rlbox: error: run 't12-wlost' failed: node1 (nl1), the worker")
    assert "Traceback" not in err
    state = run.state()
    assert state["phase"] == "removed" and state["status"] == "NODE_LOST" and "node1 (nl1)" in state["lost"]
    assert leftovers("t12-wlost") == []


def test_a_head_whose_ray_start_timed_out_is_brought_up_again_and_the_job_runs(runs, tmp_path):
    """The head's raylet frozen as it starts (SIGSTOP from inside its container, within 10 ms of its
    start: it never registers, as a raylet whose GCS is starved of CPU): Ray's own start-up gives up
    after its 30 s and the head's container exits with its words (ci3: bench/bringup.py --quick, a
    loaded machine). The run brings the cluster up again, its claims kept, no restart spent, and the
    job runs to the end. One node, the head: a worker's start and its fall with the head add CPU and
    nothing to what is tested (the test took 265 s of a loaded CI with two)."""
    run = Run(runs, tmp_path / "shared", "t12-headup", 2, pause=0.2, where=_where(tmp_path, 1))
    freeze = ["sh", "-c", "while ! pkill -STOP -x raylet; do sleep 0.01; done"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.proc.poll() is None:
        try:
            if docker.from_env().containers.get(run.container(0)).exec_run(freeze).exit_code == 0:
                break
        except (OSError, KeyError, ValueError, docker.errors.APIError):  # no record, no container, not started yet
            pass
        time.sleep(0.05)
    else:
        pytest.fail("the head's raylet was never frozen:\n" + run.stderr()[-2000:])
    held = claims("t12-headup")
    run.wait_for("bringing the cluster up again (1/2)", timeout=150)
    assert claims("t12-headup") == held
    code = run.finish()
    err = run.stderr()
    assert code == 0, err[-3000:]
    # with the raylet's last words when its log has any (frozen within 10 ms of its start, it may have none)
    assert re.search(r"node0 \(nl0\), the Ray head: Ray's start-up gave up \(timed out during startup(; raylet: [^\n]+)?\); "
                     r"bringing the cluster up again \(1/2\)", err), err[-3000:]
    assert "restart" not in err and "cluster ready" in err
    assert run.state()["status"] == "SUCCEEDED"
    assert leftovers("t12-headup") == []


def test_head_lost_is_named_and_everything_is_removed(runs, tmp_path):
    run = Run(runs, tmp_path / "shared", "t12-head", 40, where=_where(tmp_path))
    run.wait_for("step:2 ")
    killed = run.kill(0)
    code = run.finish()
    err = run.stderr()
    assert code not in (0, None), err[-2000:]
    assert "node0 (nl0), the Ray head, was lost: its container exited with code 137 (killed)" in err
    assert run.seen_at("was lost") - killed < 10.0  # as a worker's (the first test)
    assert "Traceback" not in err
    assert leftovers("t12-head") == []


def test_three_ctrl_c_in_a_row_print_no_traceback_and_leave_nothing(runs, tmp_path):
    run = Run(runs, tmp_path / "shared", "t12-int", 40, where=_where(tmp_path))
    run.wait_for("step:1 ")
    for _ in range(3):
        run.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    code = run.finish(timeout=120)
    err = run.stderr()
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted; every node was cleaned up" in err
    assert leftovers("t12-int") == []


# A worker killed right after a step line, the log checked step by step and in `rlbox metrics`:
# tests/cluster/test_log_on_loss.py (10 of 10 under load: make log-on-loss).
