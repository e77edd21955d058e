"""Runs sharing hosts, on a real engine with real Ray: NPU ids per run, distinct Ray and HCCL
ports, atomic claims (an overlapping run is refused naming the live one; of two racing runs
exactly one starts), simulation networks that never collide."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import docker
import pytest

from conftest import REPO, rlbox
from support.engine import claim_race, remove_test_runs

pytestmark = pytest.mark.engine
SLEEP = ["--", "python3", "-c", "import time; time.sleep(600)"]


def _cleanup():
    remove_test_runs("t13-")
    for box in docker.from_env().containers.list(all=True, ignore_removed=True, filters={"label": "io.rlbox.managed=true"}):
        if box.labels.get("io.rlbox.claim", "").startswith("t13-"):
            box.remove(force=True)


@pytest.fixture(autouse=True)
def clean():
    _cleanup()
    yield
    _cleanup()


def _env(name: str, index: int = 0) -> dict[str, str]:
    box = docker.from_env().containers.get(f"rlbox-{name}-node{index}")
    return dict(e.split("=", 1) for e in box.attrs["Config"]["Env"])


def _devices(name: str, index: int = 0) -> list[str]:
    box = docker.from_env().containers.get(f"rlbox-{name}-node{index}")
    return sorted(d["PathInContainer"] for d in box.attrs["HostConfig"]["Devices"] if d["PathInContainer"][12:].isdigit())


def _claims(run: str) -> list[str]:
    return sorted(b.name for b in docker.from_env().containers.list(all=True, ignore_removed=True, filters={"label": f"io.rlbox.claim={run}"}))


def _subnet(name: str) -> str:
    return docker.from_env().networks.get(f"rlbox-{name}").attrs["IPAM"]["Config"][0]["Subnet"]


def test_two_runs_split_the_same_nodes_and_an_overlapping_third_is_refused(runs):
    lo = rlbox("run", "--sim", "--nodes", "2", "--devices", "0-7", "--name", "t13-lo", "--runs-dir", runs,
               "--detach", "--timeout", "180", *SLEEP)
    assert lo.returncode == 0, lo.stderr[-2000:]
    hi = rlbox("run", "--sim", "--nodes", "2", "--devices", "8-15", "--name", "t13-hi", "--runs-dir", runs,
               "--detach", "--timeout", "180", *SLEEP)
    assert hi.returncode == 0, hi.stderr[-2000:]
    assert "ray: 2/2 nodes, 16/16 NPUs" in lo.stderr and "ray: 2/2 nodes, 16/16 NPUs" in hi.stderr
    for i in (0, 1):  # side by side on sim0 and sim1, each with its own NPUs and ports
        assert _devices("t13-lo", i) == sorted(f"/dev/davinci{n}" for n in range(8))
        assert _devices("t13-hi", i) == sorted(f"/dev/davinci{n}" for n in range(8, 16))
        a, b = _env("t13-lo", i), _env("t13-hi", i)
        for key in ("HCCL_IF_BASE_PORT", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE",
                    "DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT"):
            assert a[key] and b[key] and a[key] != b[key], key
    assert _subnet("t13-lo") != _subnet("t13-hi")
    assert len(_claims("t13-lo")) == 1 + 16 + 1 and len(_claims("t13-hi")) == 1 + 16 + 1  # name, NPUs, port
    status = rlbox("status", "--name", "t13-hi", "--runs-dir", runs, "--json")
    assert status.returncode == 0 and '"state": "running"' in status.stdout

    # A third run over NPUs 4-11 overlaps both; refused by the claim (doctor skipped) and by the doctor
    third = rlbox("run", "--sim", "--nodes", "2", "--devices", "4-11", "--name", "t13-mid", "--runs-dir", runs,
                  "--no-doctor", "--smoke-test")
    assert third.returncode == 2
    line = third.stderr.strip().splitlines()[-1]
    assert "NPU 4 of sim0 is held by run 't13-lo'" in line, third.stderr[-1500:]
    assert not _claims("t13-mid") and "rlbox-t13-mid" not in str(docker.from_env().networks.list())
    third = rlbox("run", "--sim", "--nodes", "2", "--devices", "4-11", "--name", "t13-mid", "--runs-dir", runs,
                  "--smoke-test")
    assert third.returncode == 2 and "devices free: held by rlbox-t13-" in third.stderr
    assert "rlbox-t13-lo-node0" in third.stderr and "rlbox-t13-hi-node0" in third.stderr
    # the live runs are untouched
    live = json.loads(rlbox("status", "--name", "t13-lo", "--runs-dir", runs, "--json").stdout)
    assert [n["state"] for n in live["nodes"]] == ["running", "running"]
    for name in ("t13-lo", "t13-hi"):
        stop = rlbox("stop", "--name", name, "--runs-dir", runs)
        assert stop.returncode == 0 and "removed 2 container(s)" in stop.stdout
        assert _claims(name) == []


def test_two_runs_racing_for_the_same_npus_exactly_one_starts(runs):
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "rlbox.cli", "run", "--sim", "--nodes", "1", "--devices", "0-3", "--name", name,
             "--runs-dir", str(runs), "--detach", "--timeout", "180", *SLEEP],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("t13-ra", "t13-rb")
    }
    results = {name: (p.wait(timeout=300), p.stderr.read()) for name, p in procs.items()}
    won = [n for n, (code, _) in results.items() if code == 0]
    lost = [n for n, (code, _) in results.items() if code != 0]
    assert len(won) == 1 and len(lost) == 1, {n: r[1][-800:] for n, r in results.items()}
    code, err = results[lost[0]]
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("rlbox: error: ") and "Traceback" not in err
    # refused by the claim (is held by run) or, when the winner was already up, by the doctor, whose last
    # line names its first failed check (the winner's ports, when they are up first) and whose lines before
    # it name each one: the NPUs held by the winner's node among them
    assert f"held by run '{won[0]}'" in last or f"held by rlbox-{won[0]}-node0" in err, err
    assert _claims(lost[0]) == [] and docker.from_env().containers.list(all=True, ignore_removed=True, filters={"label": f"io.rlbox.run={lost[0]}"}) == []
    assert rlbox("stop", "--name", won[0], "--runs-dir", runs).returncode == 0


def test_same_name_started_twice_at_once_is_refused_plainly(runs):
    argv = [sys.executable, "-m", "rlbox.cli", "run", "--sim", "--nodes", "1", "--devices", "0-1", "--name", "t13-twin",
            "--runs-dir", str(runs), "--detach", "--timeout", "180", *SLEEP]
    procs = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], [r[1][-800:] for r in results]
    err = next(e for code, e in results if code)
    # which line the loser says depends on how far the winner got: its name claim, its live containers, or (the
    # loser's pre-flight after the winner's containers were made) the doctor naming the winner's node on its NPUs
    assert "subnet" not in err and ("run name 't13-twin' is held by run 't13-twin'" in err or "is already live" in err
                                    or "another `rlbox run --name t13-twin` (run id " in err
                                    or "devices free: held by rlbox-t13-twin-node0" in err), err
    assert rlbox("run", "--sim", "--nodes", "1", "--name", "t13-twin", "--runs-dir", runs, "--smoke-test").returncode == 2
    assert rlbox("stop", "--name", "t13-twin", "--runs-dir", runs).returncode == 0
    assert _claims("t13-twin") == []


def test_simulation_subnets_never_collide_for_names_that_hash_alike(engine):
    """t-g21 and t-g22 shared a subnet when it followed the name; now the engine's free /24s decide. The
    networks are made as `rlbox run --sim` makes them (sim.create_network on this engine), without the
    runs' Ray around them: every simulated run of the suite starts on the network this makes."""
    import hashlib

    from rlbox.cluster import sim

    def bucket(name):
        return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 256
    a = "t13-g21"
    b = next(f"t13-g{i}" for i in range(1000) if f"t13-g{i}" != a and bucket(f"t13-g{i}") == bucket(a))
    client = docker.from_env()  # the networks go with the module's own (`clean`: remove_test_runs("t13-"))
    made = [sim.create_network(client, sim.network_for(name), name, f"{name}-id") for name in (a, b)]
    assert made[0] != made[1]
    assert [_subnet(a), _subnet(b)] == made


def test_a_claim_whose_answer_never_came_is_not_left_behind(sim_image):
    """The engine made the claim but the client's read timed out (seen under load: the next start of
    the name was refused by the start lock it left): the failed claim removes it by name and run id."""
    from types import SimpleNamespace

    import requests

    from rlbox.cluster import sharing

    real = docker.from_env()

    class LostAnswer:  # the real engine's create, then the answer lost on the way back
        def __init__(self):
            self.containers = self.api = self

        def create_container(self, *args, **kwargs):
            real.api.create_container(*args, **kwargs)
            raise requests.exceptions.ReadTimeout("engine read timed out (60 s)")

        def create_host_config(self, **kwargs):
            return real.api.create_host_config(**kwargs)

        def get(self, name):
            return real.containers.get(name)

    plan = SimpleNamespace(run="t13-lost", run_id="t13-lost-1", image=sim_image)
    from rlbox.cluster.spec import Host

    nodes = [SimpleNamespace(client=LostAnswer(), host=Host("sim0", transport="local"))]
    with pytest.raises(requests.exceptions.ReadTimeout):
        sharing.claim(plan, nodes, [sharing.start_lock(plan)])
    assert _claims("t13-lost") == []


_PORTS = itertools.count(45000)  # each claims plan's own simulated dashboard port (claimed too)


def _claimer(run: str, host: str, ids: tuple[int, ...], whole: bool, image: str, hosts: int = 1, sim: bool = True):
    """A run's claims plan (what sharing.claims reads) on hosts of this machine's engine: ``host``, or with
    ``hosts`` that many (``host`` then 0, 1, ...); simulated ones, or (``sim`` False) real ones reached over
    ssh, as one machine under several names would be."""
    from types import SimpleNamespace

    from rlbox.cluster.spec import Host

    names = [host] if hosts == 1 else [f"{host}{i}" for i in range(hosts)]
    nodes = [SimpleNamespace(index=k, npu_ids=ids, whole_host=whole, host=Host(name, transport="local" if sim else "ssh"),
                             client=docker.from_env()) for k, name in enumerate(names)]
    ports = SimpleNamespace(dashboard=next(_PORTS))
    return SimpleNamespace(run=run, run_id=f"{run}-id", image=image, sim=sim, ports=ports, nodes=nodes), nodes


def _npu_claims(run: str) -> list[str]:
    return [c for c in _claims(run) if not c.startswith("rlbox-claim-port-")]


def test_a_whole_host_and_one_of_its_npus_are_never_held_by_two_runs(sim_image):
    """A run taking every NPU of a host claims it in one container (-all), a run taking some of them one
    container an NPU: either refuses the other, naming the holder, and leaves nothing of its own."""
    from rlbox.cluster import sharing
    from rlbox.core.errors import RlboxError

    whole = _claimer("t13-whole", "sim0", tuple(range(16)), True, sim_image)
    part = _claimer("t13-part", "sim0", (3, 4), False, sim_image)
    assert sharing.claim(*whole) == 2 and _npu_claims("t13-whole") == ["rlbox-claim-sim0-all"]  # and its port
    with pytest.raises(RlboxError, match=r"^every NPU of sim0 is held by run 't13-whole' \(id t13-whole-id\); choose other hosts,"):
        sharing.claim(*part)
    assert _claims("t13-part") == []
    with pytest.raises(RlboxError, match="every NPU of sim0 is held by run 't13-whole'"):  # two whole: the engine's refusal
        sharing.claim(*_claimer("t13-whole2", "sim0", tuple(range(16)), True, sim_image))
    assert sharing.claim(*_claimer("t13-other", "sim1", tuple(range(16)), True, sim_image)) == 2  # another host
    sharing.release(docker.from_env(), "t13-whole")
    assert sharing.claim(*part) == 3
    with pytest.raises(RlboxError, match=r"^NPU [34] of sim0 is held by run 't13-part'"):
        sharing.claim(*whole)
    assert _claims("t13-whole") == [] and docker.from_env().containers.list(all=True, filters={"name": sharing.CLAIMS_LOCK}) == []
    # a claim is told by what it holds, not by its name: run "t13-x-all"'s name claim (rlbox-claim-run-t13-x-all)
    # is no whole-host claim of a host named run-t13-x, whose NPU 3 another run holds
    sharing.claim(*_claimer("t13-x", "run-t13-x", (3,), False, sim_image))
    plan, nodes = _claimer("t13-x-all", "sim2", (0,), False, sim_image)
    assert sharing.claim(plan, nodes, [sharing.name_claim(plan)]) == 1


def test_one_machine_under_two_names_is_one_machine_s_npus(sim_image):
    """Real hosts' NPU claims are named by the engine that holds them, not by the name a run gives the host:
    runs calling one machine `node1` and `10.0.0.5` (here both this machine's engine, over "ssh") are refused
    for each other's NPUs, whole or one at a time, in the refused run's words; one run listing the machine under
    both names is told so; a claim an older rlbox made (named after its host name, no scope) still counts."""
    from rlbox.cluster import sharing
    from rlbox.core.errors import RlboxError

    first = _claimer("t13-alias1", "t13node1", (3, 4), False, sim_image, sim=False)
    assert sharing.claim(*first) == 2 and _claims("t13-alias1") == ["rlbox-claim-npu03", "rlbox-claim-npu04"]
    with pytest.raises(RlboxError, match=r"^NPU 4 of 10\.0\.0\.5 \(as t13node1\) is held by run 't13-alias1'"):
        sharing.claim(*_claimer("t13-alias2", "10.0.0.5", (4, 5), False, sim_image, sim=False))
    with pytest.raises(RlboxError, match=r"^NPU [34] of 10\.0\.0\.5 \(as t13node1\) is held by run 't13-alias1'"):  # the other kind
        sharing.claim(*_claimer("t13-alias3", "10.0.0.5", tuple(range(16)), True, sim_image, sim=False))
    assert _claims("t13-alias2") == _claims("t13-alias3") == []
    assert sharing.claim(*_claimer("t13-alias4", "10.0.0.5", (5,), False, sim_image, sim=False)) == 1  # another NPU
    plan, nodes = _claimer("t13-alias5", "t13twice", (9,), False, sim_image, hosts=2, sim=False)
    with pytest.raises(RlboxError, match=r"^hosts t13twice0 and t13twice1 are one machine \(one engine answers both\)"):
        sharing.claim(plan, nodes)
    assert _claims("t13-alias5") == []
    # a claim made by an rlbox before scopes (named after its run's name for the host, no scope label) is seen
    docker.from_env().api.create_container(sim_image, ["true"], name="rlbox-claim-t13old-npu06", labels={
        "io.rlbox.managed": "true", sharing.LABEL_CLAIM: "t13-old", sharing.LABEL_CLAIM_ID: "t13-old-id",
        sharing.LABEL_CLAIM_WHAT: "NPU 6 of t13old"})
    with pytest.raises(RlboxError, match=r"^NPU 6 of t13node1 \(as t13old\) is held by run 't13-old'"):
        sharing.claim(*_claimer("t13-alias6", "t13node1", (6,), False, sim_image, sim=False))
    with pytest.raises(RlboxError, match=r"^NPU 6 of t13old is held by run 't13-old'"):
        sharing.claim(*_claimer("t13-alias7", "t13old", tuple(range(16)), True, sim_image, sim=False))
    assert _claims("t13-alias6") == _claims("t13-alias7") == []
    assert sharing.claim(*_claimer("t13-alias8", "t13old", (7,), False, sim_image, sim=False)) == 1


def test_a_whole_host_and_some_of_its_npus_racing_one_engine_exactly_one_holds(sim_image):
    """Both kinds claimed at once on one engine (8 simulated hosts), five times: the engine's claims lock
    orders them, so exactly one run holds what it asked for and the other nothing (without the lock each
    looked while the other was still claiming, and both gave up)."""
    from rlbox.cluster import sharing

    for round_ in range(5):
        runs = [_claimer(f"t13-rw{round_}", "sim", tuple(range(16)), True, sim_image, hosts=8),
                _claimer(f"t13-rp{round_}", "sim", (5,), False, sim_image, hosts=8)]
        outcome = claim_race(runs, timeout=60)
        won = [run for run, got in outcome.items() if isinstance(got, int)]
        assert len(won) == 1, outcome
        lost = next(run for run in outcome if run not in won)
        assert f"is held by run '{won[0]}'" in outcome[lost] and _claims(lost) == [], outcome
        assert len(_claims(won[0])) == outcome[won[0]] == 9  # 8 hosts' and the port
        sharing.release(docker.from_env(), won[0])


def test_a_claims_lock_whose_holder_ended_on_this_machine_is_taken_over_at_once(sim_image, monkeypatch):
    """A lock left by an rlbox killed mid-claim: when its holder was a process of this machine, the next
    claimer asks this machine's kernel and takes the lock at once, not after LOCK_WAIT (30 s); a holder
    that still runs is waited for as before."""
    import time

    from rlbox.cluster import holder, sharing

    client = docker.from_env()

    def leave_lock(label: str) -> None:
        client.api.create_container(sim_image, ["true"], name=sharing.CLAIMS_LOCK, labels={
            "io.rlbox.managed": "true", sharing.LABEL_CLAIM: "t13-killed", sharing.LABEL_CLAIM_HOLDER: label})

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = holder.here(pid=child.pid)
        leave_lock(alive)
        monkeypatch.setattr(sharing, "LOCK_WAIT", 2.0)  # a holder that runs: its lock's time limit, as before
        began = time.monotonic()
        assert sharing.claim(*_claimer("t13-wait", "sim0", (3,), False, sim_image)) == 2
        assert time.monotonic() - began >= 2.0
        sharing.release(client, "t13-wait")
    finally:
        child.kill()
        child.wait()
    leave_lock(alive)  # the same holder, now ended
    monkeypatch.setattr(sharing, "LOCK_WAIT", 30.0)
    began = time.monotonic()
    assert sharing.claim(*_claimer("t13-after", "sim0", (3,), False, sim_image)) == 2
    assert time.monotonic() - began < 5.0
    assert client.containers.list(all=True, filters={"name": sharing.CLAIMS_LOCK}) == []
    # a claims lock this rlbox takes names it as its holder while it claims: the labels the engine is given
    from docker.api.container import ContainerApiMixin

    seen = []
    real = ContainerApiMixin.create_container

    def spy(self, image, command=None, *args, **kwargs):
        seen.append((kwargs.get("name"), (kwargs.get("labels") or {}).get(sharing.LABEL_CLAIM_HOLDER)))
        return real(self, image, command, *args, **kwargs)

    monkeypatch.setattr(ContainerApiMixin, "create_container", spy)
    sharing.release(client, "t13-after")
    sharing.claim(*_claimer("t13-after", "sim0", (3,), False, sim_image))
    assert (sharing.CLAIMS_LOCK, holder.here()) in seen and holder.here()
