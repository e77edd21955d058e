"""The production path, `rlbox run --cluster`, on testbed hosts: each its own address, Docker
engine and sshd, reached over ssh; no --sim anywhere. The session's 4-host A3 testbed (the
``testbed`` fixture of tests/conftest.py, shared with tests/training/) with the simulation image
delivered to every host (``bed``); most tests use two of its hosts. Every test ends with nothing of
its run left on any host (the ``clean`` fixture), and the session's `testbed down` with nothing of
the testbed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from support.engine import claim_race
from support.job_run import Run
from support.testbed import REPO, Testbed, rlbox

pytestmark = pytest.mark.engine


@pytest.fixture(scope="session")
def bed(testbed, sim_image):
    """The session's testbed, the simulation image on every host (`rlbox distribute`, once)."""
    if testbed.image != sim_image:
        testbed.deliver(sim_image)
    return testbed


@pytest.fixture
def clean(bed):
    """After the test: no container of a tbt- run on any host."""
    yield bed
    Run.end_all()  # a run an assertion left mid-way: it would go on making containers
    left = [line for h in bed.hosts for line in bed.leftovers_prefix("tbt-", h["index"])]
    bed.remove_runs("tbt-")
    assert left == [], left


def run(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return rlbox("run", *args, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and lines, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("rlbox: error: "), proc.stderr[-2000:]
    return lines[-1]


def test_four_hosts_bring_up_64_npus_and_the_smoke_job_passes(clean, tmp_path):
    bed = clean
    proc = run("--cluster", bed.cluster(1, 2, 3, 4), "--smoke-test", "--name", "tbt-smoke", "--runs-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    err = proc.stderr
    assert "cluster ready: 4 nodes, 64 NPUs" in err, err[-3000:]
    assert "pre-flight: 68 checks passed on 4 node(s)" in err, err[-3000:]  # doctor over ssh on every host (17 a host: 4 of them the NPU network)
    for i in range(1, 5):
        assert f"started on {bed.address(i)} (16 NPUs)" in err
    # the head is host 1's address; each node found its interface towards it (eth0 of its namespace)
    state = (tmp_path / "tbt-smoke" / "state.json").read_text()
    assert f'"head": "{bed.address(1)}"' in state and '"transport": "ssh"' in state and '"sim": false' in state
    assert "ray: 4/4 nodes, 64/64 NPUs" in err, err[-3000:]
    # every node's smoke line: its 16 NPUs visible through Ray, and the interface and address towards the head
    # (the simulation's 4-node A3 run, once tests/cluster/test_launcher.py's, asserted the same: one level is enough)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("rlbox-smoke: node")]
    assert len(lines) == 4 and all(" ok NPUs=16 " in line for line in lines), proc.stdout[-3000:]
    assert sorted(line.split()[2] for line in lines) == sorted(bed.address(i) for i in range(1, 5)), lines
    for line in lines:
        assert "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15" in line, line
        assert "HCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 TP_SOCKET_IFNAME=eth0" in line, line
        assert f"HCCL_IF_IP={line.split()[2]}" in line, line
    run_state = json.loads(state)
    log = (tmp_path / "tbt-smoke" / f"{run_state['run_id']}.log").read_text()
    assert "rlbox-smoke: 4 nodes, 64 NPUs: all visible" in log, log[-2000:]
    assert run_state["phase"] == "removed" and run_state["status"] == "SUCCEEDED"


def _claimer(bed, run: str, indices: tuple[int, ...], clients: dict, whole: bool = False):
    """A run's claims plan (what sharing.claims reads) over testbed hosts, each its own engine: NPU by
    NPU, or (``whole``) each host in one claim."""
    from types import SimpleNamespace

    from rlbox.cluster.spec import Host

    nodes = [SimpleNamespace(index=k, npu_ids=tuple(range(16)), whole_host=whole, host=Host(bed.address(i)), client=clients[i])
             for k, i in enumerate(indices)]
    return SimpleNamespace(run=run, run_id=f"{run}-id", image=bed.image, sim=False, nodes=nodes), nodes


def test_runs_racing_for_npus_on_several_engines_never_both_fail_and_never_both_hold(clean, monkeypatch):
    """Claims on several engines at once (a thread an engine, each behind its engine's claims lock,
    taken in one order): two runs racing for NPUs 0-15 of hosts 1-2 and of hosts 2-3, ten times: each
    time exactly one holds all 32 it asked for and the other none, its error naming the winner (every
    other round the first run takes its two hosts whole: 2 claims, against the other's NPU claims). A
    lock left by a run that died mid-claim is taken over after LOCK_WAIT."""
    import docker

    from rlbox.cluster import sharing

    bed = clean
    clients = {i: docker.DockerClient(base_url=f"unix://{bed.socket(i)}") for i in (1, 2, 3)}

    def held(run: str) -> int:
        return sum(len(c.containers.list(all=True, ignore_removed=True, filters={"label": f"io.rlbox.claim={run}"})) for c in clients.values())

    for round_ in range(10):
        runs = [_claimer(bed, f"tbt-race{round_}a", (1, 2), clients, whole=round_ % 2 == 1),
                _claimer(bed, f"tbt-race{round_}b", (2, 3), clients)]
        outcome = claim_race(runs, timeout=120)
        asked = {runs[0][0].run: 2 if round_ % 2 else 32, runs[1][0].run: 32}
        won = [run for run, got in outcome.items() if got == asked[run]]
        assert len(won) == 1, outcome
        lost = next(run for run in outcome if run not in won)
        assert f"is held by run '{won[0]}'" in outcome[lost], outcome
        assert held(won[0]) == asked[won[0]] and held(lost) == 0
        for c in clients.values():
            sharing.release(c, won[0])
            assert c.containers.list(all=True, ignore_removed=True, filters={"name": sharing.CLAIMS_LOCK}) == []

    # a lock left behind (its rlbox killed mid-claim) delays the next claimer by LOCK_WAIT, no more
    clients[2].api.create_container(bed.image, ["true"], name=sharing.CLAIMS_LOCK,
                                    labels={"io.rlbox.managed": "true", sharing.LABEL_CLAIM: "tbt-dead"})
    monkeypatch.setattr(sharing, "LOCK_WAIT", 1.0)
    plan, nodes = _claimer(bed, "tbt-after", (2, 3), clients)
    assert sharing.claim(plan, nodes) == 32
    assert clients[2].containers.list(all=True, ignore_removed=True, filters={"name": sharing.CLAIMS_LOCK}) == []
    for c in clients.values():
        sharing.release(c, "tbt-after")


def test_node_routes_to_the_head_and_picks_its_interface_and_the_job_s_exit_code_comes_back(clean, tmp_path):
    """The node script on each host: its own address, eth0 (the interface routing to the head); the job
    then exits 3, and so does `rlbox run` over two hosts, its last line saying so (one run for both: the
    simulation's exit code, once tests/cluster/test_launcher.py's, is the same path's other transport)."""
    bed = clean
    proc = run("--cluster", bed.cluster(3, 4), "--name", "tbt-nic", "--runs-dir", tmp_path, "--",
               "python3", "-c", "import ray, os, sys; ray.init(address='auto');"
               "f = ray.remote(num_cpus=0)(lambda: (ray.util.get_node_ip_address(), os.environ['HCCL_SOCKET_IFNAME'],"
               " os.environ['GLOO_SOCKET_IFNAME'], os.environ['HCCL_IF_IP']));"
               "print(sorted(set(ray.get([f.options(scheduling_strategy=ray.util.scheduling_strategies"
               ".NodeAffinitySchedulingStrategy(n['NodeID'], soft=False)).remote() for n in ray.nodes() if n['Alive']]))));"
               "print('npu-smi at', os.path.exists('/usr/local/bin/npu-smi'), 'leaving with 3', flush=True); sys.exit(3)")
    assert proc.returncode == 3, proc.stderr[-3000:]
    a3, a4 = bed.address(3), bed.address(4)
    assert f"[('{a3}', 'eth0', 'eth0', '{a3}'), ('{a4}', 'eth0', 'eth0', '{a4}')]" in proc.stdout, proc.stdout[-2000:]
    assert "npu-smi at True leaving with 3" in proc.stdout, proc.stdout[-2000:]
    assert one_line_error(proc).startswith("rlbox: error: job of run 'tbt-nic' FAILED with exit code 3")


# A worker lost and the run resumed on the testbed: tests/training/test_cpu_training.py, with real verl
# (its own checkpoint, "Resuming from .../global_step_2") rather than a step counter.


def test_ctrl_c_mid_run_leaves_nothing_on_any_host(clean, tmp_path):
    bed = clean
    job = Run(tmp_path / "runs", tmp_path / "shared", "tbt-int", 60, where=("--cluster", bed.cluster(1, 2)))
    job.wait_for("step:1 ")
    job.proc.send_signal(signal.SIGINT)
    code = job.finish(timeout=180)
    err = job.stderr()
    assert code == 130, err[-2000:]
    assert "interrupted; every node was cleaned up" in err and "Traceback" not in err
    assert bed.leftovers("tbt-int") == []


def test_a_worker_host_cut_off_is_named_and_the_run_ends_without_waiting_for_ssh_to_give_up(clean, tmp_path):
    """A worker's host cut off the network mid-run (its veth down): the watch names its silent engine
    within seconds, and the teardown leaves that host once its engine's ping has been silent for
    TEARDOWN_PATIENCE, naming it and what to run, instead of waiting for ssh's keep-alive to give the
    tunnel up (the run exited 55-60 s after the cut before). Put back, `rlbox stop` removes what was left."""
    import time

    from rlbox.cluster import execute

    bed = clean
    job = Run(tmp_path / "runs", tmp_path / "shared", "tbt-cut", 600, where=("--cluster", bed.cluster(1, 2)))
    job.wait_for("step:1 ")
    link = bed.host(2)["veth"]
    subprocess.run(["ip", "link", "set", link, "down"], check=True)
    cut = time.monotonic()
    try:
        code = job.finish(timeout=180)
        took = time.monotonic() - cut
    finally:
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
    err = job.stderr()
    last = err.strip().splitlines()[-1]
    assert code == execute.NODE_LOST_EXIT and "Traceback" not in err, err[-2000:]
    assert f"node1 ({bed.address(2)}), the worker, was lost: its engine has not answered for" in last, last
    assert last.endswith(f"the other nodes were cleaned up; then {bed.address(2)}: cannot list run tbt-cut's "
                         f"containers (its engine has not answered for {execute.TEARDOWN_PATIENCE:.0f} s); "
                         "rerun `rlbox stop --name tbt-cut`"), last
    assert took < 40, f"{took:.1f} s from the cut to the run's exit:\n{err[-2000:]}"
    assert bed.leftovers("tbt-cut") != []  # the cut host's container: left, as the line says
    stop = rlbox("stop", "--name", "tbt-cut", "--runs-dir", tmp_path / "runs", timeout=120)
    assert stop.returncode == 0, stop.stderr[-2000:]
    assert bed.leftovers("tbt-cut") == []


@pytest.mark.parametrize("fault, expected", [
    ("engine", "rlbox: error: {h2}: Docker engine not reachable over ssh"),
    ("sshd", "rlbox: error: {h2}: cannot "),
    ("route", "rlbox: error: pre-flight: node1 ({h2}): ✗ interface: no route to the head {h1}"),
    ("image", "rlbox: error: image {image} differs between nodes: {h2} has "),
])
def test_a_fault_of_one_host_is_named_in_one_line_and_nothing_is_left(clean, tmp_path, fault, expected, sim_image):
    bed = clean
    faults = {"engine": lambda: bed.engine_stopped(2), "sshd": lambda: bed.sshd_stopped(2),
              "route": lambda: bed.no_route_to(2, 1), "image": lambda: bed.image_differs(2, sim_image)}
    with faults[fault]():
        proc = run("--cluster", bed.cluster(1, 2), "--smoke-test", "--name", "tbt-fault", "--runs-dir", tmp_path,
                   timeout=300)
        line = one_line_error(proc)
        assert line.startswith(expected.format(h1=bed.address(1), h2=bed.address(2), image=sim_image)), proc.stderr[-2000:]
        if fault == "sshd":
            assert f"connect to host {bed.address(2)} port 22: Connection refused" in line
    assert [x for i in (1, 2) for x in bed.leftovers_prefix("tbt-", i)] == []  # the host put back, checked too


def test_a_host_with_fewer_devices_and_an_older_driver_is_named_by_doctor_and_down_leaves_nothing(engine):
    with Testbed.up(hosts=2, hardware="a3", name="tbd", extra=("--subnet", "10.201.2.0/24", "--host-devices", "2=8",
                                                                "--host-driver", "2=23.0.rc1")) as bed:
        proc = rlbox("doctor", "--cluster", bed.cluster_file, "--image", "verl_pt27_25rc3:a3-arm")
        out = proc.stdout
        assert proc.returncode == 1, proc.stderr
        h2 = bed.address(2)
        lines = [" ".join(line.split()) for line in out.splitlines()]
        assert any(line.startswith(f"node1 ({h2}) devices ✗ 8 /dev/davinci* (plan: 16") for line in lines), out
        assert any(line.startswith(f"node1 ({h2}) driver ✗ version.info 23.0.rc1; the image's CANN needs >= 25.3.rc1")
                   for line in lines), out
        assert any(line.startswith(f"node0 ({bed.address(1)}) driver ✓ version.info 25.3.rc1") for line in lines), out
        assert any(line.startswith(f"node0 ({bed.address(1)}) devices ✓ 16 /dev/davinci*") for line in lines), out
        # each host's own /dev and driver, as a real host has them; this machine's are untouched
        assert bed.ssh(2, "ls", "/dev").stdout.count("davinci") == 8 + 1  # davinci0-7 and davinci_manager
        assert "Version=25.3.rc1" in bed.ssh(1, "cat", "/usr/local/Ascend/driver/version.info").stdout
        assert "Ascend910" in bed.ssh(1, "npu-smi", "info").stdout
        assert "davinci0" not in subprocess.run(["ls", "/dev"], capture_output=True, text=True).stdout
        state_dir = bed.record["root"] + "/tbd"
    from rlbox.testbed.state import HostState, TestbedState
    from rlbox.testbed import execute

    record = TestbedState(**{**bed.record, "hosts": tuple(HostState(**h) for h in bed.hosts)})
    assert execute.leftovers(record) == []  # no namespace, link, process, mount, cgroup, rule or folder
    assert "rlbox-tbd" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "rlbox-tbd" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert state_dir not in open("/proc/self/mountinfo").read()


def test_the_testbed_s_hosts_say_one_machine_over_ssh_so_their_workers_are_paced(testbed):
    """Each host's tunnel shell says its kernel's boot id (agent.SHELL): the testbed's hosts share this
    machine's kernel and CPUs, so a run on them paces its workers (ray_node.paced), as on a simulation."""
    from pathlib import Path

    from rlbox.cluster import hosts, ray_node, spec

    with open("/proc/sys/kernel/random/boot_id") as f:
        here = f.read().strip()
    nodes = hosts.connect_all(spec.from_file(Path(testbed.cluster_file)).hosts)
    try:
        machines = [node.machine() for node in nodes]
    finally:
        for node in nodes:
            node.close()
    assert machines == [here] * len(nodes) and ray_node.paced(machines)
