"""A run's last line as `execute` composes it, driven through `execute()` with its engine steps replaced
(the cluster, the claims, the driver mark): what the teardown did is said only once it has run, and is
true of what existed (nothing was started before the claims); Slurm's ended-allocation line is built from
what the run's end noted, never from its words. The real paths run on engines in test_faults.py,
test_node_loss.py and tests/testbed/."""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace as NS

import pytest

from rlbox.backends.slurm.backend import ended_line
from rlbox.cluster import execute, sharing, watch
from rlbox.core.errors import RlboxError

GONE = RlboxError("h2: cannot list run r's containers (x); rerun `rlbox stop --name r`")
LOSS = watch.NodeLost(watch.Loss("node1 (h2)", "worker", "its container exited"))
SLURM = "Slurm ended allocation 7 (TIMEOUT)"


def _run(monkeypatch, tmp_path, *, check=None, start=None, teardown=None, holder=None, on_claims=None, ready=None,
         echo=None):
    plan = NS(run="r", run_id="id1", nodes=[NS(host=NS(name="h1"))], image="img", sim_files=None, job=None,
              as_dict=lambda: {"run": "r", "run_id": "id1"}, missing_image_hint=lambda: "", total_npus=1, network=None)
    torn = []

    class Cluster:
        def __init__(self, *args, **kwargs):
            self.addresses = {}

        def preflight(self, replace):
            if check:
                raise check

        def clear(self):
            pass

        def start(self):
            if start:
                raise start

        def connect_dashboard(self):
            pass

        def wait_ready(self, timeout):
            if ready:
                raise ready

        def take_down_to_come_up_again(self):
            pass

        def teardown(self):
            torn.append(True)
            if teardown:
                raise teardown

    asked = []

    def interrupted_in_the_takeover_check(plan, nodes):  # on its thread (hosts.Call), as the engine is asked
        asked.append(True)
        if holder is KeyboardInterrupt:  # the check of the end being said (a plain error's): Ctrl-C meanwhile
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(1)
        return None if holder is KeyboardInterrupt else holder

    monkeypatch.setattr(execute, "Cluster", Cluster)
    monkeypatch.setattr(execute, "connect_all", lambda hosts: [NS(close=lambda: None, host=NS(name="h1"))])
    monkeypatch.setattr(execute.watch, "ENGINE_PATIENCE", 0.5)
    monkeypatch.setattr(sharing, "claim_name", lambda *a: None)
    monkeypatch.setattr(sharing, "claim", lambda *a: on_claims and on_claims())
    monkeypatch.setattr(sharing, "end_start", lambda *a: None)
    monkeypatch.setattr(sharing, "holder_of_name", interrupted_in_the_takeover_check)
    monkeypatch.setattr(execute.driver, "mark", lambda d: None)
    monkeypatch.setattr(execute.driver, "unmark", lambda d: None)
    monkeypatch.setattr(execute.engine, "ignore_interrupts", lambda: None)
    try:
        execute.execute(plan, run_dir=tmp_path, echo=echo or (lambda s: None), emit=lambda s: None, bring_up_only=True)
    except BaseException as err:  # noqa: BLE001 - an interrupt that escapes is a wrong ending, said as one
        err.asked = len(asked)
        return err, bool(torn)
    return None, bool(torn)


@pytest.mark.parametrize("case, kw, line, code", [
    ("a lost node, torn down", dict(start=LOSS), f"run 'r' failed: {LOSS}; every node was cleaned up", 2),
    ("a lost node, a host not reached", dict(start=LOSS, teardown=GONE),
     f"run 'r' failed: {LOSS}; the other nodes were cleaned up; then {GONE}", 2),
    ("Ctrl-C before the claims", dict(check=KeyboardInterrupt()), "interrupted; nothing was started", 130),
    ("Ctrl-C after them", dict(start=KeyboardInterrupt()), "interrupted; every node was cleaned up", 130),
    ("a full runs dir before them", dict(check=OSError(28, "No space left on device", "/runs/r")),
     "run 'r' failed: cannot write /runs/r: No space left on device; nothing was started", 2),
    ("taken over", dict(start=LOSS, holder="id2"),
     "run 'r' (id id1) was taken over by another `rlbox run --replace --name r` (run id id2); "
     "this one removed only its own containers and claims", 2),
    ("Ctrl-C while the end is said", dict(start=RlboxError("Ray not ready"), holder=KeyboardInterrupt),
     "Ray not ready; interrupted; every node was cleaned up", 130),
    ("a plain error, a host not reached", dict(start=RlboxError("Ray not ready"), teardown=GONE),
     f"Ray not ready; then {GONE}", 2),
])
def test_the_last_line_says_what_the_teardown_did_once_it_ran(monkeypatch, tmp_path, case, kw, line, code):
    err, torn = _run(monkeypatch, tmp_path, **kw)
    assert isinstance(err, RlboxError) and str(err) == line and err.exit_code == code, (case, repr(err))
    assert torn == ("nothing was started" not in line), case


@pytest.mark.parametrize("kw, line", [
    (dict(start=LOSS), f"{SLURM} (run 'r': every node was cleaned up)"),
    (dict(start=KeyboardInterrupt(), teardown=GONE), f"{SLURM} (run 'r': the other nodes were cleaned up); then {GONE}"),
    (dict(start=RlboxError("Ray not ready")), f"{SLURM} (run 'r': every node was cleaned up)"),  # its line unchanged
    (dict(check=RlboxError("h1: image img is not present")), f"{SLURM} (run 'r': nothing was started)"),
    (dict(teardown=GONE), f"{SLURM} (run 'r'); then {GONE}"),  # it came up, then its teardown could not reach h2
])
def test_slurm_s_line_reads_what_the_run_s_end_noted(monkeypatch, tmp_path, kw, line):
    err, _ = _run(monkeypatch, tmp_path, **kw)
    assert isinstance(err, RlboxError), repr(err)
    assert ended_line(SLURM, "r", err) == line
    if "start" in kw and type(kw["start"]) is RlboxError:
        assert str(err) == "Ray not ready"  # a plain error's own line is not changed


HEAD_CUT = watch.NodeLost(watch.Loss("node0 (h1)", "head", "its engine has not answered for 3 s", silent=True))


@pytest.mark.parametrize("lost, asked", [
    (LOSS, 1),  # a worker lost: who holds the run's name is asked of the head's engine once, not again before teardown
    (HEAD_CUT, 0),  # the head's engine silent: not asked at all (each ask waited ENGINE_PATIENCE for it: +6 s an exit)
    (watch.NodeLost(watch.Loss("node0 (h1)", "head", "its container exited with code 1")), 1),  # its engine answers
])
def test_who_holds_the_name_is_asked_once_and_never_of_a_silent_head(monkeypatch, tmp_path, lost, asked):
    err, torn = _run(monkeypatch, tmp_path, start=lost)
    assert str(err) == f"run 'r' failed: {lost}; every node was cleaned up" and torn
    assert err.asked == asked


def test_a_head_whose_ray_start_gave_up_every_time_is_said_lost_once(monkeypatch, tmp_path):
    """The cluster is brought up again START_AGAIN times, then the head is a loss like any other: said in a
    "lost:" line (a HeadGaveUp's own words, its method ``said``, once hid that line), its run ended."""
    said = []
    head = watch.HeadGaveUp(watch.Loss("node0 (h1)", "head", f"its container exited with code 1; last output: {watch.RAY_START_TIMED_OUT}"))
    err, torn = _run(monkeypatch, tmp_path, ready=head, echo=said.append)
    assert sum("bringing the cluster up again" in line for line in said) == watch.START_AGAIN
    assert [line for line in said if line.startswith("lost: ")] == [f"lost: {head}"]
    assert str(err) == f"run 'r' failed: {head}; every node was cleaned up" and torn
