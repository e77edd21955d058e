"""The node watch's judgement, restarts' job and record, the log stream's resume: pure, in ms."""

from __future__ import annotations

import io
import tarfile

import pytest

from rlbox.cluster import jobs, watch
from rlbox.cluster.ray import RayNode
from rlbox.cluster.state import Phase, RunState, restart_line
from rlbox.cluster.watch import Box, Expected, judge

NODES = [Expected("node0 (h0)", "head", "10.0.0.1"), Expected("node1 (h1)", "worker", "10.0.0.2"),
         Expected("node2 (h2)", "worker", "10.0.0.3")]
UP = Box("running")
ALIVE = [RayNode("10.0.0.1", True, True, 8), RayNode("10.0.0.2", True, False, 8), RayNode("10.0.0.3", True, False, 8)]


@pytest.mark.parametrize("boxes, table, down, expected", [
    ([UP, UP, UP], ALIVE, 0, None),
    ([UP, Box("exited", 137), UP], ALIVE, 0, "node1 (h1), the worker, was lost: its container exited with code 137 (killed)"),
    ([UP, Box("exited", 1, "boom"), UP], ALIVE, 0, "node1 (h1), the worker, was lost: its container exited with code 1; last output: boom"),
    ([Box("exited", 137), Box("exited", 137), UP], None, 0, "node0 (h0), the Ray head, was lost: its container exited"),
    ([UP, UP, Box(watch.GONE)], ALIVE, 0, "node2 (h2), the worker, was lost: its container is gone"),
    ([UP, Box(watch.UNREACHABLE, since=2), UP], ALIVE, 0, None),
    ([UP, Box(watch.UNREACHABLE, since=6), UP], ALIVE, 0, "node1 (h1), the worker, was lost: its engine has not answered for 6 s"),
    ([UP, UP, UP], [ALIVE[0], ALIVE[1], RayNode("10.0.0.3", False, False, 8, "health check failed")], 0,
     "node2 (h2), the worker, was lost: Ray marks it DEAD (health check failed)"),
    # a node that re-joined (new node id, same address) is alive
    ([UP, UP, UP], [*ALIVE, RayNode("10.0.0.3", False, False, 8, "old")], 0, None),
    # frozen: `docker pause` (or the engine froze it) is seen at once, not after Ray's health checks
    ([UP, Box("paused"), UP], ALIVE, 0, "node1 (h1), the worker, was lost: its container is paused (frozen"),
    ([Box("paused"), UP, UP], None, 0, "node0 (h0), the Ray head, was lost: its container is paused"),
    # cut off (docker network disconnect, a partition): the container runs, Ray's GCS marks it DEAD
    ([UP, UP, UP], [ALIVE[0], RayNode("10.0.0.2", False, False, 8, "Health check failed due to timeout"), ALIVE[2]], 0,
     "node1 (h1), the worker, was lost: Ray marks it DEAD (Health check failed due to timeout)"),
    ([UP, UP, UP], None, 3, None),
    ([UP, UP, UP], None, 12, "node0 (h0), the Ray head, was lost: its Ray dashboard has not answered for 12 s"),
])
def test_judge(boxes, table, down, expected):
    loss = judge(NODES, boxes, table, down)
    if expected is None:
        assert loss is None
    else:
        assert loss is not None and loss.line().startswith(expected), loss


def test_rows_are_matched_by_the_address_the_node_reported_not_its_name():
    """Hosts given by name (node1) or simulated (sim1): Ray's rows carry the node's IP, which the
    node reported when it started; the watch matches by that."""
    from rlbox.cluster import launch

    plan, _ = launch.prepare(launch.RunRequest(hosts="node-a,node-b", image="localhost/x:1", hardware="a3",
                                               devices=8, smoke_test=True, name="ft-addr", dry_run=True))
    by_name = watch.expected_of(plan)
    assert [e.address for e in by_name] == ["node-a", "node-b"]  # unresolvable here: nothing better planned
    reported = watch.expected_of(plan, {0: "10.1.0.5", 1: "10.1.0.6"})
    assert [(e.label, e.role, e.address) for e in reported] == [
        ("node0 (node-a)", "head", "10.1.0.5"), ("node1 (node-b)", "worker", "10.1.0.6")]
    table = [RayNode("10.1.0.5", True, True, 8), RayNode("10.1.0.6", False, False, 8, "Health check failed")]
    assert judge(by_name, [UP, UP], table) is None  # by name, the DEAD row is never seen (the defect)
    assert judge(reported, [UP, UP], table).line() == \
        "node1 (node-b), the worker, was lost: Ray marks it DEAD (Health check failed)"
    record = [{"index": 0, "host": "node-a", "role": "head"}, {"index": 1, "host": "node-b", "role": "worker"}]
    assert watch.expected_of_record(record, {"0": "10.1.0.5", "1": "10.1.0.6"}) == reported


@pytest.mark.parametrize("output, address", [
    ("rlbox-node: worker on 172.30.7.3 (eth0), head 172.30.7.2:20000\n", "172.30.7.3"),
    ("noise\n\x1b[0mrlbox-node: head on 10.0.0.1 (bond0), head 10.0.0.1:20000\nRay runtime started.\n", "10.0.0.1"),
    ("rlbox-node: cannot resolve the head h0 on this node\n", None),
    ("", None),
])
def test_reported_address_is_read_from_the_node_scripts_line(output, address):
    assert watch.reported_address(output) == address


@pytest.mark.parametrize("info, code, words", [
    ({"status": "SUCCEEDED", "driver_exit_code": 0}, 0, "SUCCEEDED with exit code 0"),
    ({"status": "FAILED", "driver_exit_code": 3}, 3, "FAILED with exit code 3"),
    ({"status": "FAILED", "driver_exit_code": -9}, 137, "FAILED: its driver was killed by SIGKILL (9): out of memory?"),
    ({"status": "FAILED", "driver_exit_code": 137}, 137, "FAILED: its driver was killed by SIGKILL (9): out of memory?"),
    ({"status": "FAILED", "driver_exit_code": 130}, 130, "FAILED: its driver was killed by SIGINT (2)"),
    ({"status": "FAILED", "driver_exit_code": 200}, 200, "FAILED with exit code 200"),
    ({"status": "FAILED", "driver_exit_code": -15}, 143, "FAILED: its driver was killed by SIGTERM (15)"),
    ({"status": "FAILED", "driver_exit_code": -11}, 139, "FAILED: its driver was killed by SIGSEGV (11)"),
    ({"status": "FAILED", "driver_exit_code": None}, 1, "FAILED with exit code 1"),
    ({"status": "FAILED", "driver_exit_code": 300}, 255, "FAILED with exit code 255"),
    ({"status": "STOPPED"}, 130, "STOPPED with exit code 130"),
])
def test_a_killed_driver_is_told_from_a_failed_one(info, code, words):
    assert jobs.exit_code(info) == code
    assert jobs.ended(info).startswith(words)


def test_interrupts_exit_with_the_shells_codes():
    import signal

    from rlbox.core import engine

    assert engine.exit_code_of(engine.Interrupted(signal.SIGTERM)) == 143
    assert engine.exit_code_of(engine.Interrupted(signal.SIGINT)) == 130
    assert engine.exit_code_of(KeyboardInterrupt()) == 130


def test_a_full_disk_rewrites_the_record_in_place(tmp_path, monkeypatch):
    from pathlib import Path

    path = tmp_path / "state.json"
    RunState({"run": "r", "run_id": "x", "pad": "y" * 100}, Phase.RUNNING).save(path)
    real = Path.write_text

    def full(self, *a, **kw):
        if self.suffix == ".tmp":
            raise OSError(28, "No space left on device", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", full)
    RunState({"run": "r", "run_id": "x", "pad": "y" * 100}, Phase.REMOVED, reason="cannot write log").save(path)
    back = RunState.from_dict(__import__("json").loads(path.read_text()))
    assert back.phase is Phase.REMOVED and back.reason == "cannot write log"
    assert not (tmp_path / "state.tmp").exists()


def test_for_restart_resumes_verl_and_renames_the_submission():
    job = jobs.plan_job(["python3", "-m", "verl.trainer.main_ppo", "trainer.resume_mode=disable", "a.b=1"],
                        nodes=2, npus_per_node=8, run="r", run_id="abcd", working_dir="/w")
    again = jobs.for_restart(job, 1)
    assert again.submission_id == "rlbox-r-abcd-r1" and jobs.for_restart(again, 2).submission_id == "rlbox-r-abcd-r2"
    assert again.argv[-1] == "trainer.resume_mode=auto" and "trainer.resume_mode=disable" not in again.argv
    assert again.entrypoint.startswith("cd /w && python3 -m verl.trainer.main_ppo")
    other = jobs.plan_job(["python3", "job.py", "trainer.resume_mode=disable"], nodes=1, npus_per_node=8, run="r", run_id="x")
    assert jobs.for_restart(other, 1).argv == other.argv  # not verl: the same command


def test_restarts_and_loss_are_recorded_and_read_back(tmp_path):
    entry = {"attempt": 1, "of": 2, "cause": "node1 (h1), the worker, was lost: x", "resumed_step": 7}
    state = RunState({"run": "r", "run_id": "x"}, Phase.RESTARTING, restarts=(entry,), lost="y")
    state.save(tmp_path / "state.json")
    back = RunState.from_dict(__import__("json").loads((tmp_path / "state.json").read_text()))
    assert back == state
    assert back.restart_lines() == ["restart 1/2: node1 (h1), the worker, was lost: x; resumed from step 7"]
    assert restart_line(entry | {"resumed_step": None}) == "restart 1/2: node1 (h1), the worker, was lost: x"



def test_follow_streams_frames_once_across_a_dropped_stream(monkeypatch):
    import websocket

    sessions = [["line 1\n", "line 2\npart"], ["line 1\n", "line 2\npart", "ial\n", "end\n"]]
    closes = iter([False, True])

    class Ws:
        def __init__(self, frames, clean):
            self.frames, self.clean = list(frames), clean

        def settimeout(self, t):
            pass

        def recv_data(self, control_frame=True):
            if self.frames:
                return websocket.ABNF.OPCODE_TEXT, self.frames.pop(0).encode()
            if self.clean:
                return websocket.ABNF.OPCODE_CLOSE, b"\x03\xe8"
            raise websocket.WebSocketConnectionClosedException("dropped")

        def close(self, timeout=None):
            pass

    it = iter(sessions)
    monkeypatch.setattr(websocket, "create_connection", lambda url, **kw: Ws(next(it), next(closes)))
    statuses = iter([{"status": "RUNNING"}, {"status": "SUCCEEDED"}])
    client = jobs.JobsClient("http://127.0.0.1:1")
    monkeypatch.setattr(client, "info", lambda sid: next(statuses))
    got = []
    info = client.follow("s", got.append)
    assert info["status"] == "SUCCEEDED"
    assert "".join(got) == "line 1\nline 2\npartial\nend\n"
    assert client.received == len("line 1\nline 2\npart") * 2 + len("ial\nend\n")


def test_a_loss_seen_while_following_ends_it_at_once(monkeypatch):
    import websocket

    class Quiet:
        def settimeout(self, t):
            pass

        def recv_data(self, control_frame=True):
            raise websocket.WebSocketTimeoutException("quiet")

        def close(self, timeout=None):
            pass

    monkeypatch.setattr(websocket, "create_connection", lambda url, **kw: Quiet())
    client = jobs.JobsClient("http://127.0.0.1:1")
    calls = []

    def tick():
        calls.append(1)
        if len(calls) == 3:
            raise watch.NodeLost(watch.Loss("node1 (h1)", "worker", "gone"))

    with pytest.raises(watch.NodeLost):
        client.follow("s", lambda t: None, tick=tick)
    assert len(calls) == 3


def test_a_submission_awaits_the_dashboards_answer_up_to_its_patience(monkeypatch):
    """Ray's dashboard answers a submission once the job's supervisor actor runs: on a loaded machine
    longer than the other calls' 10 s ("not reachable (ReadTimeout)" before)."""
    import requests

    seen = []

    def answer(method, url, timeout=None, **kw):
        seen.append((method, timeout))
        resp = requests.Response()
        resp.status_code, resp._content = 200, b'{"submission_id": "rr-1"}'
        return resp

    class Job:
        def as_dict(self):
            return {"entrypoint": "true"}

    monkeypatch.setattr(requests, "request", answer)
    client = jobs.JobsClient("http://127.0.0.1:1")
    assert client.submit(Job(), patience=60.0) == "rr-1"
    client.info("rr-1")
    assert seen == [("POST", 60.0), ("GET", 10.0)]


@pytest.mark.parametrize("nodes, seconds", [(1, 1.0), (16, 1.0), (64, 1.0), (128, 2.0), (256, 4.0), (1000, 15.625)])
def test_the_watch_period_grows_with_the_cluster_past_64_nodes(nodes, seconds):
    assert watch.period(nodes) == seconds
    assert watch.Watch([], [], [None] * nodes, None).every == seconds  # the default every Watch gets
    assert watch.Watch([], [], [None] * nodes, None, every=0.5).every == 0.5


@pytest.mark.parametrize("items, limit, expected", [(0, 64, 1), (1, 64, 1), (16, 64, 16), (64, 64, 64), (1000, 64, 64), (5, 2, 2)])
def test_hosts_are_worked_on_at_most_max_parallel_at_once(items, limit, expected):
    from rlbox.cluster import hosts

    assert hosts.width(items, limit) == expected
    assert hosts.width(items) == min(max(1, items), hosts.MAX_PARALLEL)


@pytest.mark.parametrize("hosts, soft, hard, expected", [
    (8, 1024, 4096, None),  # 256 + 64 x 8 = 768 fit
    (100, 1024, 65536, 6656),
    (1000, 1024, 65536, 64256),
    (2000, 1024, 65536, 65536),  # held under the hard limit
    (100, 1024, 1024, None),  # nothing to gain
    (100, 1024, -1, 6656),  # hard: unlimited
    (100, -1, -1, None),  # soft: unlimited
])
def test_the_launcher_raises_its_open_files_limit_for_many_hosts(hosts, soft, hard, expected):
    from rlbox.cluster import hosts as hosts_mod

    assert hosts_mod.files_wanted(hosts, soft, hard, infinity=-1) == expected


def _engines(release, *hang: bool, slow: bool = False) -> list:
    """Nodes whose engine says "running" at once or, where ``hang``, only once ``release`` is set
    (a host cut off the network: docker-py's call waits up to 120 s, its ping too); ``slow``: an
    engine that answers its ping at once but a container's inspection only then (a loaded engine)."""
    import time

    class Box_:
        status = "running"

    class Containers:
        def __init__(self, hang):
            self.hang = hang

        def get(self, name):
            if self.hang:
                release.wait(30)
            return Box_()

    class Client:
        def __init__(self, hang):
            self.containers, self.pings = Containers(hang), 0

        def ping(self):
            if self.containers.hang and not slow:
                release.wait(30)
            time.sleep(0.02)  # a round trip over the host's tunnel: an answer is never there at once
            self.pings += 1
            return True

    return [type("N", (), {"client": Client(h)})() for h in hang]


def test_an_engine_call_that_hangs_names_its_node_after_the_patience_not_the_client_timeout(monkeypatch):
    """A host cut off the network: its engine call hangs (docker-py waits up to 120 s). The look waits
    LOOK_WAIT for it, leaves it out, and counts the node silent from when the call went out; a call
    still out is not waited for again, so looks keep their pace (bench/faults.py found 62 s before)."""
    import threading
    import time

    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.6)
    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    release = threading.Event()
    w = watch.Watch(NODES[:2], ["c0", "c1"], _engines(release, False, True), None, every=0.0)
    began = time.monotonic()
    try:
        with pytest.raises(watch.NodeLost, match=r"node1 \(h1\), the worker, was lost: its engine has not answered"):
            while time.monotonic() - began < 5:
                w.check()
        assert time.monotonic() - began < 1.5
    finally:
        release.set()


def test_an_engine_silent_for_the_patience_is_named_then_not_at_the_next_look(monkeypatch):
    """A look goes out once a period; a call of it still out when the patience is reached names its
    node at the next tick (half a second of the log follower), not up to a period later (bench/faults.py:
    a head cut off the network was named after 5.0 s with a patience of 3 s and a 1 s period)."""
    import threading
    import time

    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.6)
    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    release = threading.Event()
    w = watch.Watch(NODES[:1], ["c0"], _engines(release, True), None, every=30.0)
    try:
        w.check()  # the first look: its call hangs
        began = time.monotonic()
        assert not w.overdue(w.clock())
        with pytest.raises(watch.NodeLost, match=r"node0 \(h0\), the Ray head, was lost: its engine has not answered"):
            while time.monotonic() - began < 5:
                w.check()
                time.sleep(0.05)
        assert time.monotonic() - began < 1.0  # the 30 s period did not hold it
    finally:
        release.set()


def test_an_engine_that_refuses_is_named_after_the_patience_not_at_the_next_look(monkeypatch):
    """A host's dockerd killed: every call fails at once (nothing is left out). The node is named once its
    first failure is ENGINE_PATIENCE old, at the next tick, not up to a period later (bench/faults.py
    dockerd-kill: 4.9 s from the kill with a 1 s period, over the 3.4 s of the quiet runs)."""
    import time

    class Refused:
        containers = type("R", (), {"get": staticmethod(lambda name: (_ for _ in ()).throw(ConnectionError("refused")))})()

        def ping(self):
            raise ConnectionError("refused")

    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.6)
    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    w = watch.Watch(NODES[:1], ["c0"], [type("N", (), {"client": Refused()})()], None, every=30.0)
    w.check()  # the first look: refused, silent from now
    began = time.monotonic()
    with pytest.raises(watch.NodeLost, match=r"node0 \(h0\), the Ray head, was lost: its engine has not answered"):
        while time.monotonic() - began < 5:
            w.check()
            time.sleep(0.05)
    assert time.monotonic() - began < 1.0  # the 30 s period did not hold it


@pytest.mark.parametrize("every, tick", [(0.0, 0.05), (30.0, 0.05), (30.0, 0.7)])
def test_a_slow_engine_that_answers_its_ping_is_not_a_lost_node(monkeypatch, every, tick):
    """A loaded machine: the engine takes longer than the patience to inspect a container (ci3, the last
    CI: "its engine has not answered for 4 s", a node lost mid-run and the run failed) but answers its
    ping: the node is not named; once the inspection comes back, the watch goes on as before. Also where
    looks are far apart (``every`` 30 s: the period at 1,920 nodes, watch.period): its ping is asked again
    between looks (bench/watch_scale.py found it named at the first overdue tick, its last ping too old);
    and where the caller's ticks are further apart than the patience (``tick`` 0.7 s: a loop busy for
    seconds on a loaded machine), the time no ping was asked is not counted as the engine's silence."""
    import threading
    import time

    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.6)
    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    monkeypatch.setattr(watch, "PING_EVERY", 0.2)  # a third of the patience, as 1 s is of 3 s
    release = threading.Event()
    nodes = _engines(release, False, True, slow=True)
    w = watch.Watch(NODES[:2], ["c0", "c1"], nodes, None, every=every)
    began = time.monotonic()
    try:
        while time.monotonic() - began < 2.0:  # more than three patiences
            w.check()
            time.sleep(tick)
        assert nodes[1].client.pings >= 2  # asked again and again while the inspection was out
        assert not w.overdue(w.clock())
    finally:
        release.set()
    time.sleep(0.1)
    w.check(force=True)
    assert w.boxes()[1].status == "running"


TIMED_OUT = ("Exception: The current node timed out during startup. This could happen because some of the raylet "
             "failed to startup or the GCS has become overloaded.")


@pytest.mark.parametrize("node, box, tries, again", [
    (NODES[1], Box("exited", 1, TIMED_OUT), 0, True),  # Ray's own words (bench/bringup.py, 16 testbed hosts)
    (NODES[1], Box("exited", 1, TIMED_OUT), 1, True),
    (NODES[1], Box("exited", 1, TIMED_OUT), 3, True),
    (NODES[1], Box("exited", 1, TIMED_OUT), watch.RAYLET_WAITS, False),  # spent: the node is lost
    (NODES[0], Box("exited", 1, TIMED_OUT), 0, False),  # never the head: the workers registered with it
    # the exception on stderr before `ray start`'s last stdout line (16 testbed hosts: node9)
    (NODES[1], Box("exited", 1, "INFO scripts.py:1234 -- Local node IP: 10.0.0.2",
                   tail=(TIMED_OUT, "INFO scripts.py:1234 -- Local node IP: 10.0.0.2")), 0, True),
    (NODES[1], Box("exited", 1, "rlbox-node: head 10.0.0.1:6379 unreachable"), 0, False),  # another failure
    # found the head's GCS, not the head registered in it within Ray's 40 s (ray/_private/utils.py's words)
    (NODES[1], Box("exited", 1, "Exception: No node info found for head node in GCS. Did the head node or gcs start "
                   "successfully?"), 0, True),
    (NODES[1], Box("exited", 1, "Exception: No node info found for head node in GCS."), 2, True),  # its own budget
    (NODES[1], Box("exited", 1, "Exception: No node info found for head node in GCS."), watch.HEAD_WAITS, False),
    (NODES[1], Box("exited", 137, ""), 0, False),  # killed
    (NODES[1], Box("running"), 0, False),
    (NODES[1], Box(watch.GONE), 0, False),
])
def test_a_worker_whose_raylet_timed_out_registering_is_started_again_during_bring_up(node, box, tries, again):
    assert watch.start_again(node, box, tries) is again


def _cluster_of(boxes: dict, echo):
    """execute.Cluster of a head (h0, container c0) and a worker (h1, c1) on engines whose containers are
    ``boxes`` (by name), its dashboard nowhere (the tests stand in for Ray's table)."""
    from types import SimpleNamespace

    from rlbox.cluster import execute

    engine = SimpleNamespace(containers=SimpleNamespace(get=lambda name: boxes[name]))
    nodes = [SimpleNamespace(client=engine, close=lambda: None, machine=lambda: None) for _ in boxes]
    plan = SimpleNamespace(total_npus=32, nodes=[
        SimpleNamespace(index=i, label=f"node{i} (h{i})", role=role, container=SimpleNamespace(name=f"c{i}", ip=None),
                        host=SimpleNamespace(name=f"h{i}", address=f"10.0.0.{i + 1}"))
        for i, role in enumerate(("head", "worker"))])
    return execute.Cluster(plan, nodes, echo, dashboard="http://127.0.0.1:1")


def test_bring_up_starts_a_timed_out_worker_again_and_names_it_lost_once_its_budget_is_spent(monkeypatch):
    """Cluster.wait_ready on engines that answer as Docker does: a worker exited with Ray's start-up
    time-out is started again (said in a line) up to RAYLET_WAITS times; then it is a lost node."""
    from rlbox.cluster import ray as ray_mod

    class Container:
        def __init__(self, name):
            self.name, self.status, self.starts = name, "running", 0
            self.attrs = {"State": {"ExitCode": 0}}

        def logs(self, tail=None):
            if self.status == "exited":
                return f"{TIMED_OUT}\nINFO scripts.py:1234 -- Local node IP: 10.0.0.2\n".encode()
            return b"rlbox-node: worker on 10.0.0.2 (eth0), head 10.0.0.1:6379\n"

        def start(self):
            self.starts += 1
            self.status = "running"

        def get_archive(self, path):  # the raylet's own log, as the engine gives a file: a tar stream
            assert path == watch.RAYLET_LOG
            return _raylet_archive()

    boxes = {"c0": Container("c0"), "c1": Container("c1")}
    said = []
    cluster = _cluster_of(boxes, said.append)

    def looks(base, expected, total, timeout, progress, alive_check):  # Ray's table never fills here
        for _ in range(watch.RAYLET_WAITS + 3):
            boxes["c1"].status = "exited"  # the raylet times out again after every start
            boxes["c1"].attrs["State"]["ExitCode"] = 1
            alive_check()

    monkeypatch.setattr(ray_mod, "wait_for_npus", looks)
    monkeypatch.setattr(watch, "period", lambda nodes: 0.0)  # every poll looks (at most one a period otherwise)
    with pytest.raises(watch.NodeLost, match=r"node1 \(h1\), the worker, was lost: its container exited with code 1"):
        cluster.wait_ready(10)
    assert boxes["c1"].starts == watch.RAYLET_WAITS and boxes["c0"].starts == 0
    again = [line for line in said if "starting it again" in line]
    assert again == [f"node1 (h1): Ray's start-up gave up (timed out during startup; raylet: {RAYLET_WARNED}); "
                     f"starting it again ({k}/{watch.RAYLET_WAITS})" for k in range(1, watch.RAYLET_WAITS + 1)]


RAYLET_WARNED = ("[2026-11-29 15:46:20,004 W 61 61] (raylet) gcs_rpc_client.h:151: Failed to connect to GCS at "
                 "address 10.0.0.1:6379 within 5 seconds.")
RAYLET_OUT = ("[2026-11-29 15:46:18,123 I 61 61] (raylet) main.cc:226: Setting cluster ID to: 3f\n"
              f"{RAYLET_WARNED}\n[2026-11-29 15:46:21,500 I 61 61] (raylet) main.cc:300: retrying\n\n")


def _raylet_archive():
    """RAYLET_OUT as the engine's get_archive gives a file: a tar stream, in two chunks, and its stat."""
    data, buf = RAYLET_OUT.encode(), io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("raylet.out")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return iter([buf.getvalue()[:100], buf.getvalue()[100:]]), {"name": "raylet.out"}


@pytest.mark.parametrize("text, line", [
    (RAYLET_OUT, RAYLET_WARNED),  # the last warning or error, not the last line
    ("[2026-11-29 15:46:18,123 I 61 61] (raylet) a\n[2026-11-29 15:46:19,000 I 61 61] (raylet) b\n",
     "[2026-11-29 15:46:19,000 I 61 61] (raylet) b"),  # none: the last line
    ("[2026-11-29 15:46:19,000 E 61 61] (raylet) " + "x" * 300, "[2026-11-29 15:46:19,000 E 61 61] (raylet) " + "x" * 157),
    ("", ""),
])
def test_the_raylet_s_words_are_its_last_warning_or_error(text, line):
    assert watch.raylet_line(text) == line


def test_a_container_whose_engine_cannot_give_the_raylet_log_gives_no_words():
    class Gone:
        def get_archive(self, path):
            raise OSError("No such container:path")

    assert watch.raylet_words(Gone()) == ""


@pytest.mark.parametrize("role, last, gives_up", [
    ("head", TIMED_OUT, True),  # bringing the cluster up again is the cure (ci3: bench/bringup.py --quick, 1 host)
    ("head", "Exception: something else", False),
    ("head", "No node info found for head node in GCS", False),  # a worker's words, never the head's
    ("worker", TIMED_OUT, False),  # a worker is started again on its own (start_again)
])
def test_a_head_that_timed_out_starting_ray_is_told_apart(role, last, gives_up):
    node = Expected("node0 (h0)", role, "10.0.0.1")
    assert watch.head_gave_up(node, Box("exited", 1, last, tail=(last,))) is gives_up
    assert not watch.head_gave_up(node, Box("running"))


@pytest.mark.parametrize("late", [False, True])
def test_bring_up_raises_head_gave_up_for_a_head_whose_ray_start_timed_out(monkeypatch, late):
    """Cluster.wait_ready: the head exited with Ray's start-up time-out is HeadGaveUp (the run then brings
    the cluster up again, execute's loop), still a NodeLost naming the head for a caller that knows no more;
    seen at the bring-up's first look, or (``late``) at a look while Ray's table is read."""
    from rlbox.cluster import ray as ray_mod

    class Container:
        def __init__(self, name, status, line):
            self.name, self.status, self.line, self.attrs = name, status, line, {"State": {"ExitCode": 1}}

        def logs(self, tail=None):
            return self.line.encode()

        def get_archive(self, path):  # the head's raylet log, as the engine gives a file
            assert path == watch.RAYLET_LOG
            return _raylet_archive()

    boxes = {"c0": Container("c0", "running" if late else "exited", f"{TIMED_OUT}\n"),
             "c1": Container("c1", "running", "rlbox-node: worker on 10.0.0.2 (eth0), head 10.0.0.1:6379\n")}
    cluster = _cluster_of(boxes, lambda line: None)
    read = []

    def looks(base, expected, total, timeout, progress, alive_check):
        read.append(True)
        boxes["c0"].status = "exited"  # it gives up while Ray's table is read
        alive_check()

    monkeypatch.setattr(ray_mod, "wait_for_npus", looks)
    monkeypatch.setattr(watch, "period", lambda nodes: 0.0)
    with pytest.raises(watch.HeadGaveUp, match=r"node0 \(h0\), the Ray head, was lost: its container exited with code 1") as up:
        cluster.wait_ready(10)
    assert bool(read) is late  # at the first look, before Ray's table is read at all; else at the table's look
    # the line that brings the cluster up again says why in Ray's words and its raylet's (execute)
    assert up.value.said() == f"{watch.RAY_START_TIMED_OUT}; raylet: {RAYLET_WARNED}"
    assert watch.HeadGaveUp(up.value.loss).said() == watch.RAY_START_TIMED_OUT  # no box: Ray's words alone
    boxes["c0"].line = "Exception: something else\n"
    with pytest.raises(watch.NodeLost) as lost:
        cluster.wait_ready(10)
    assert not isinstance(lost.value, watch.HeadGaveUp)


def _dead_in_ray(monkeypatch, answer: float, status: str, ping_hangs: bool = False):
    """A two-node watch whose Ray table marks node1 DEAD; node1's engine inspects its container (``status``,
    killed: code 137) only after ``answer`` seconds, and answers its ping at once unless ``ping_hangs``."""
    import threading
    import time

    release = threading.Event()

    class Exited:
        def __init__(self):
            self.status, self.attrs = status, {"State": {"ExitCode": 137}}

        def logs(self, tail):
            return b"step:3\n"

    class Client:
        def __init__(self, slow):
            self.slow = slow
            self.containers = self

        def get(self, name):
            if self.slow:
                time.sleep(answer)
                return Exited()
            return type("B", (), {"status": "running"})()

        def ping(self):
            if self.slow and ping_hangs:
                release.wait(30)
            return True

    table = [RayNode("10.0.0.1", True, True, 8), RayNode("10.0.0.2", False, False, 8, "health check failed")]
    monkeypatch.setattr(watch.ray, "nodes", lambda base, timeout: table)
    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.6)
    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    nodes = [type("N", (), {"client": Client(slow)})() for slow in (False, True)]
    return watch.Watch(NODES[:2], ["c0", "c1"], nodes, "http://head:8265", every=0.0), release


@pytest.mark.parametrize("answer, status, ping_hangs, named", [
    # a loaded engine answers after Ray's health check: the loss names the container's own end
    (1.5, "exited", False, "node1 (h1), the worker, was lost: its container exited with code 137 (killed)"),
    (0.0, "exited", False, "node1 (h1), the worker, was lost: its container exited with code 137 (killed)"),
    # a worker cut off the network: its container runs on, Ray's words are the loss
    (0.0, "running", False, "node1 (h1), the worker, was lost: Ray marks it DEAD (health check failed)"),
    # an engine that answers neither the inspection nor its ping: Ray's words once the patience is spent
    (20.0, "exited", True, "node1 (h1), the worker, was lost: Ray marks it DEAD (health check failed)"),
])
def test_a_node_ray_marks_dead_is_named_by_what_its_engine_says_of_its_container(monkeypatch, answer, status,
                                                                                 ping_hangs, named):
    import time

    w, release = _dead_in_ray(monkeypatch, answer, status, ping_hangs)
    began = time.monotonic()
    try:
        with pytest.raises(watch.NodeLost) as lost:
            w.check()
        assert str(lost.value) == named
        assert time.monotonic() - began < (2.0 if ping_hangs else answer + 1.0)
    finally:
        release.set()


@pytest.mark.parametrize("every", [0.0, 30.0])
def test_bring_up_names_a_node_whose_engine_stops_answering_before_it_said_its_address(monkeypatch, every):
    """A worker's host cut off the network while Ray comes up, before the launcher read its address line:
    every call to its engine hangs (docker-py waits up to 120 s). The read of that line held the bring-up's
    loop until the client gave up; now it is waited for LOOK_WAIT, and the watch names the silent engine
    after ENGINE_PATIENCE, as it does while a job runs; also where looks are far apart (``every`` 30 s:
    the period at 1,920 nodes; bench/watch_scale.py found 1,000 hung engines named after 16.9 s, a period)."""
    import threading
    import time
    from types import SimpleNamespace

    from rlbox.cluster import execute
    from rlbox.cluster import ray as ray_mod

    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.6)
    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    from rlbox.cluster import bringup
    monkeypatch.setattr(bringup, "LOOK_WAIT", 0.1)
    monkeypatch.setattr(watch, "period", lambda nodes: every)
    release = threading.Event()

    class Container:
        status = "running"

        def __init__(self, line):
            self.line = line

        def logs(self, tail=None):
            return self.line

    def engine(hangs: bool, line: bytes):
        def get(name):
            if hangs:
                release.wait(30)
            return Container(line)

        def ping():
            if hangs:
                release.wait(30)
            return True
        return SimpleNamespace(containers=SimpleNamespace(get=get), ping=ping)

    engines = [engine(False, b"rlbox-node: head on 10.0.0.1 (eth0), head 10.0.0.1:6379\n"), engine(True, b"")]
    nodes = [SimpleNamespace(client=e, close=lambda: None, machine=lambda: None) for e in engines]
    plan = SimpleNamespace(total_npus=32, nodes=[
        SimpleNamespace(index=i, label=f"node{i} (h{i})", role=role, container=SimpleNamespace(name=f"c{i}", ip=None),
                        host=SimpleNamespace(name=f"h{i}", address=f"10.0.0.{i + 1}"))
        for i, role in enumerate(("head", "worker"))])
    cluster = execute.Cluster(plan, nodes, print, dashboard="http://127.0.0.1:1")

    def looks(base, expected, total, timeout, progress, alive_check):  # Ray's table never fills here
        while time.monotonic() - began < 10:
            alive_check()
            time.sleep(0.02)
        raise AssertionError("the silent engine was never named")

    monkeypatch.setattr(ray_mod, "wait_for_npus", looks)
    began = time.monotonic()
    try:
        with pytest.raises(watch.NodeLost, match=r"node1 \(h1\), the worker, was lost: its engine has not answered"):
            cluster.wait_ready(60)
        assert time.monotonic() - began < 3.0
        assert cluster.addresses == {0: "10.0.0.1"}  # the head's line was read beside the silent one
    finally:
        release.set()


def test_teardown_leaves_a_host_whose_engine_is_silent_after_its_patience_and_says_so(monkeypatch):
    """A host cut off the network: every call to its engine waits until ssh's keep-alive gives the tunnel
    up (bench: a run whose worker's host was cut took 55-60 s to exit after naming it). Teardown asks each
    engine's ping first and leaves one silent for TEARDOWN_PATIENCE, naming it with what to do; the
    others' containers are removed meanwhile. An engine that refuses at once is said as before."""
    import threading
    import time
    from types import SimpleNamespace

    from rlbox.cluster import execute

    monkeypatch.setattr(execute, "TEARDOWN_PATIENCE", 0.3)
    release = threading.Event()
    removed = []

    class Box:
        def __init__(self, name):
            self.name, self.id, self.labels = name, name, {execute.LABEL_RUN: "r"}

        def remove(self, force=False, v=False):
            removed.append(self.name)

    def client(name: str, hangs: bool = False, refuses: bool = False):
        def ping():
            if refuses:
                raise ConnectionRefusedError("refused")
            if hangs:
                release.wait(30)
            return True
        return SimpleNamespace(ping=ping, containers=SimpleNamespace(list=lambda **kw: [Box(name)]),
                               networks=SimpleNamespace(list=lambda **kw: []))

    monkeypatch.setattr(execute.sharing, "release_own", lambda *a, **kw: None)
    nodes = [SimpleNamespace(client=client("c0"), host=SimpleNamespace(name="h0")),
             SimpleNamespace(client=client("c1", hangs=True), host=SimpleNamespace(name="h1"))]
    began = time.monotonic()
    try:
        with pytest.raises(execute.RlboxError, match=r"^h1: cannot list run r's containers \(its engine has not "
                                                     r"answered for 0 s\); rerun `rlbox stop --name r`$"):
            execute.remove_run(nodes, "r", None, run_id="id")
        assert time.monotonic() - began < 2.0 and removed == ["c0"]
    finally:
        release.set()
    refusing = [SimpleNamespace(client=client("c2", refuses=True), host=SimpleNamespace(name="h2"))]
    refusing[0].client.containers.list = lambda **kw: (_ for _ in ()).throw(ConnectionRefusedError("refused"))
    with pytest.raises(execute.RlboxError, match=r"^h2: cannot list run r's containers \(not reachable: refused\)"):
        execute.remove_run(refusing, "r", None, run_id="id")


def test_ray_s_table_read_that_hangs_does_not_hold_the_looks_while_the_cluster_comes_up():
    """A head cut off the network: each read of Ray's node table through its dashboard hangs for the read's
    whole timeout (5 s), and the engines' looks (alive_check) ran only between reads, so a cut head was
    named seconds late (bench/faults.py head-net-up: 5.5 s). The read is waited for at most a poll; the
    looks keep their pace; a dashboard that answers fills the cluster as before."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rlbox.cluster import ray as ray_mod

    answer = threading.Event()

    class Dashboard(BaseHTTPRequestHandler):
        def do_GET(self):
            if not answer.wait(3):
                return  # no answer: the client waits out its own timeout
            rows = [{"node_ip": "10.0.0.1", "state": "ALIVE", "is_head_node": True, "resources_total": {"NPU": 8}}]
            body = json.dumps({"data": {"result": {"result": rows}}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    looks: list[float] = []

    def look():
        looks.append(time.monotonic())
        return "the head's engine is silent" if len(looks) >= 6 else None

    began = time.monotonic()
    try:
        with pytest.raises(ray_mod.RlboxError, match=r"cluster not ready \(the head's engine is silent\): 0/8 NPUs"):
            ray_mod.wait_for_npus(base, {"node0": "10.0.0.1"}, 8, 60, alive_check=look, poll=0.1)
        assert time.monotonic() - began < 1.5  # 6 looks a poll apart, not one a hung read
        answer.set()
        assert [n.ip for n in ray_mod.wait_for_npus(base, {"node0": "10.0.0.1"}, 8, 60, poll=0.1)] == ["10.0.0.1"]
    finally:
        answer.set()
        server.shutdown()


def test_the_takeover_check_waits_for_a_slow_head_engine_and_not_for_a_silent_one(monkeypatch):
    """Before a lost node's restart, whether another `--replace` took the run's name over is read from the
    head's engine: a slow one (its ping answers) is waited for, so a taken-over run ends saying so rather
    than restarting into the other run; a silent one (cut off) is not, after ENGINE_PATIENCE."""
    import threading
    import time
    from types import SimpleNamespace

    from rlbox.cluster import execute

    monkeypatch.setattr(watch, "ENGINE_PATIENCE", 0.2)
    plan = SimpleNamespace(run="r", run_id="mine")
    release = threading.Event()

    def holder(answer_after: float, ping_hangs: bool):
        def holder_of_name(plan, nodes):
            if not release.wait(answer_after) and ping_hangs:
                release.wait(30)
            return "theirs"
        node = SimpleNamespace(client=SimpleNamespace(ping=(lambda: release.wait(30)) if ping_hangs else (lambda: True)))
        return holder_of_name, [node]

    try:
        fn, nodes = holder(0.6, False)
        monkeypatch.setattr(execute.sharing, "holder_of_name", fn)
        assert "was taken over by another `rlbox run --replace --name r` (run id theirs)" in str(execute._taken_over_text(plan, nodes))
        fn, nodes = holder(0.6, True)
        monkeypatch.setattr(execute.sharing, "holder_of_name", fn)
        began = time.monotonic()
        assert execute._taken_over_text(plan, nodes) is None and time.monotonic() - began < 1.0
    finally:
        release.set()


def test_a_worker_started_again_on_an_engine_that_does_not_answer_holds_the_bring_up_only_a_look(monkeypatch):
    """Starting a worker again (Ray's start-up gave up on it) is an engine call: one that does not come back
    within LOOK_WAIT leaves the node to the watch's next look (not answering: named after ENGINE_PATIENCE),
    instead of holding the bring-up's loop until the client's 120 s."""
    import threading
    import time

    monkeypatch.setattr(watch, "LOOK_WAIT", 0.1)
    release = threading.Event()

    class Container:
        status = "exited"

        def start(self):
            release.wait(30)

    said = []
    cluster = _cluster_of({"c0": Container(), "c1": Container()}, said.append)
    began = time.monotonic()
    try:
        box = cluster.start_again(1, 1, watch.RAY_START_TIMED_OUT, watch.Box("exited", 1))
        assert box.status == watch.UNREACHABLE and time.monotonic() - began < 1.0
        assert said[-1].startswith("node1 (h1): Ray's start-up gave up (") and said[-1].endswith("starting it again (1/8)")
    finally:
        release.set()
