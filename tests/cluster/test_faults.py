"""The faults a long run meets (issue 21, item 5), injected into real `rlbox run --sim` clusters: a
frozen (paused) or cut-off (network disconnected) worker, the head killed while a restart brings
Ray up, a driver killed by SIGKILL, SIGTERM, `--replace` after `kill -9` of rlbox and two
`--replace` racing, `logs -f` and `status` after the head died, a detached run's log, a full runs
dir, and the stale-Ray check. Every run uses NPU ids 6-13 (slot 6: Ray ports 26000-26999) of simulated
hosts of this module's own (ft0, ft1, ft-host), so it runs beside the simulated-node group (`beside_sims`,
tests/conftest.py), and is removed after; nothing is left on the engine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import requests

from conftest import REPO, rlbox
from support.engine import leftovers, remove_test_runs
from support.job_run import Run, own_hosts

pytestmark = [pytest.mark.engine, pytest.mark.beside_sims]
# slot 6, not the other beside_sims modules' 5 (support.job_run.BESIDE_DEVICES): with three workers this module
# runs in the testbed group while those run in the engine group, and a simulated run's published dashboard port
# (26001 here) is claimed on this machine (stop 48's CI: the full-runs-dir run refused, port 25001 held by
# test_log_on_loss's run)
DEVICES = ("--devices", "6-13")
# two `--replace` racing: once in CI (each race is a cluster brought up), more by `make replace-races` (N=10)
RACES = max(1, int(os.environ.get("RLBOX_REPLACE_RACES", "1")))


def _sim(folder: Path, *hosts: str) -> tuple[str, ...]:
    """Simulated hosts of this module's own (default one, ft0), on its NPUs: no other suite's simulation
    uses their names, so the doctor's "devices free" check looks at this module's containers only."""
    return (*own_hosts(folder, *(hosts or ("ft0",))), *DEVICES)


def _remove_claims():
    for box in docker.from_env().containers.list(all=True, ignore_removed=True, filters={"label": "io.rlbox.managed=true"}):
        if box.labels.get("io.rlbox.claim", "").startswith("ft-"):
            try:
                box.remove(force=True)
            except docker.errors.NotFound:  # its run removed it meanwhile
                pass


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    Run.end_all()  # a run an assertion left mid-way first: it would remove and make containers meanwhile
    remove_test_runs("ft-")
    _remove_claims()


def _state(runs: Path, name: str) -> dict:
    return json.loads((runs / name / "state.json").read_text())


def _ray_says_dead(port: int, address: str, timeout: float = 120) -> float:
    """When Ray's node table first shows ``address`` DEAD (and no live row for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rows = requests.get(f"http://127.0.0.1:{port}/api/v0/nodes", params={"detail": "1"},
                                timeout=2).json()["data"]["result"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            rows = []
        mine = [r for r in rows if r.get("node_ip") == address]
        if mine and all(r.get("state") == "DEAD" for r in mine):
            return time.monotonic()
        time.sleep(0.2)
    pytest.fail(f"Ray never marked {address} DEAD")


def test_frozen_worker_head_lost_in_a_restart_and_cut_off_worker_are_each_named(runs, tmp_path):
    """(a) a paused worker is named at once; (b) the head killed while the restart brings Ray up
    is one more node loss and the run restarts again; (a) a worker cut off from the network is
    named within 5 s of Ray marking it DEAD; (j) the process exits with the code state.json records."""
    run = Run(runs, tmp_path / "shared", "ft-loss", 400, "--max-restarts", "2", pause=0.5,
              where=(*_sim(tmp_path / "hosts", "ft0", "ft1"), "--no-doctor"))
    run.wait_for("step:2 ")  # a loaded machine brings Ray up slowly (wait_for: 600 s)
    worker = docker.from_env().containers.get(run.container(1))
    worker.pause()
    paused = time.monotonic()
    run.wait_for("restart 1/2: node1 (ft1), the worker, was lost: its container is paused")
    # named: the loss's own line (the restart's follows it once the record is written; ci5, loaded: 6.1 s)
    assert run.seen_at("lost: node1 (ft1), the worker, was lost: its container is paused") - paused < 5.0, run.stderr()[-2000:]
    # the restart's bring-up: kill the new head before Ray is ready
    deadline = time.monotonic() + 300
    while run.stderr().count("node0 head   started") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "cluster ready" not in run.stderr().split("restart 1/2")[-1]
    docker.from_env().containers.get(run.container(0)).kill()
    run.wait_for("restart 2/2: node0 (ft0), the Ray head, was lost: its container exited with code 137 (killed)")
    run.wait_for("resumed from step", timeout=600)
    # cut the worker off: its container runs on, Ray's GCS health check marks it DEAD
    state = run.state()
    address = state["addresses"]["1"]
    docker.from_env().networks.get(state["network"]["name"]).disconnect(run.container(1), force=True)
    dead = _ray_says_dead(state["ports"]["dashboard"], address)
    code = run.finish()
    err = run.stderr()
    assert code == 2, err[-3000:]
    lost = "node1 (ft1), the worker, was lost: Ray marks it DEAD"
    assert run.seen_at(lost) - dead < 5.0, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"rlbox: error: run 'ft-loss' failed: {lost}")
    assert "(after 2 restart(s))" in err.strip().splitlines()[-1] and "Traceback" not in err
    state = run.state()
    assert state["status"] == "NODE_LOST" and state["exit_code"] == code and state["reason"].startswith(lost)
    assert [r["cause"].split(":")[0] for r in state["restarts"]] == [
        "node1 (ft1), the worker, was lost", "node0 (ft0), the Ray head, was lost"]
    assert state["phase"] == "removed" and leftovers("ft-loss") == []


def test_driver_killed_by_sigkill_is_named_and_exits_137(runs, tmp_path):
    """(e) an OOM kill is SIGKILL: named, exit 128 + 9, recorded."""
    proc = rlbox("run", *_sim(tmp_path), "--name", "ft-oom", "--runs-dir", runs, "--no-doctor", "--",
                 "python3", "-c", "import os; print('eating memory', flush=True); os.kill(os.getpid(), 9)")
    assert proc.returncode == 137, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: job of run 'ft-oom' FAILED: its driver was killed by SIGKILL (9): out of memory?")
    state = _state(runs, "ft-oom")
    assert state["exit_code"] == 137 and "killed by SIGKILL (9)" in state["reason"]
    assert "eating memory" in proc.stdout and leftovers("ft-oom") == []


def test_sigterm_exits_143_and_a_failure_before_the_job_is_recorded(runs, tmp_path):
    """(j) SIGTERM is 128 + 15; a run that fails before its job keeps its reason."""
    early = rlbox("run", *_sim(tmp_path), "--name", "ft-early", "--runs-dir", runs, "--no-doctor",
                  "--timeout", "1", "--smoke-test")
    assert early.returncode == 2, early.stderr[-2000:]
    state = _state(runs, "ft-early")
    assert state["status"] == "FAILED" and state["exit_code"] == 2 and state["phase"] == "removed"
    assert state["reason"].startswith("cluster not ready (timed out after 1 s)")
    status = rlbox("status", "--name", "ft-early", "--runs-dir", runs)
    assert "reason: cluster not ready (timed out after 1 s)" in status.stdout
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "run", *_sim(tmp_path), "--name",
                             "ft-term", "--runs-dir", str(runs), "--no-doctor", "--", "python3", "-c",
                             "import time; print('working', flush=True); time.sleep(300)"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (runs / "ft-term" / "state.json").exists() and _state(runs, "ft-term").get("phase") == "running":
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert "interrupted; every node was cleaned up" in err and "Traceback" not in err
    state = _state(runs, "ft-term")
    assert state["exit_code"] == 143 and state["reason"] == "interrupted by SIGTERM"
    assert leftovers("ft-term") == []


def _run_ids(name: str) -> tuple[set[str], set[str], list[str]]:
    """The run ids of run ``name``'s containers and of its claims, and the claims' names."""
    client = docker.from_env()
    boxes = client.containers.list(all=True, ignore_removed=True, filters={"label": f"io.rlbox.run={name}"})
    claims = client.containers.list(all=True, ignore_removed=True, filters={"label": f"io.rlbox.claim={name}"})
    return ({b.labels["io.rlbox.run-id"] for b in boxes}, {c.labels["io.rlbox.claim-run-id"] for c in claims},
            sorted(c.name for c in claims))


def test_replace_after_kill_9_then_racing_replaces_then_head_lost_and_the_detached_log(runs, tmp_path):
    """(c) after `kill -9` of rlbox, --replace passes its own pre-flight (ports included);
    (d) two --replace at once (once in CI, RLBOX_REPLACE_RACES times by `make replace-races`): exactly
    one wins, the other is told, and the winner holds every claim; (h) a detached run's log is kept
    under runs/NAME/; (g) after its head dies `logs -f` ends naming it and `status` says lost; `stop`
    leaves nothing."""
    name = "ft-repl"
    common = ("run", *_sim(tmp_path, "ft-host"), "--name", name, "--runs-dir", str(runs))
    first = subprocess.Popen([sys.executable, "-m", "rlbox.cli", *common, "--no-doctor", "--", "python3", "-c",
                              "import time; print('first', flush=True); time.sleep(600)"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not ((runs / name / "state.json").exists() and _state(runs, name).get("phase") == "running"):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()[1][-2000:]
        time.sleep(0.2)
    first.kill()  # kill -9 of rlbox: its cluster lives on, its ports are held
    first.communicate()
    again = rlbox(*common, "--replace", "--detach", "--timeout", "300", "--", "bash", "-c", "echo second; sleep 600")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "✗" not in again.stderr
    for trial in range(RACES):
        racers = [subprocess.Popen([sys.executable, "-m", "rlbox.cli", *common, "--replace", "--detach", "--no-doctor",
                                    "--timeout", "300", "--", "bash", "-c",
                                    f"for i in 1 2 3; do echo trial{trial}-racer{k}-line$i; done; sleep 600"],
                                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for k in range(2)]
        results = [(p.wait(timeout=240), *p.communicate()) for p in racers]
        winners = [k for k, (code, _, _) in enumerate(results) if code == 0]
        assert len(winners) == 1, [r[2][-1500:] for r in results]
        (loser,) = [r for k, r in enumerate(results) if k not in winners]
        told = loser[2].strip().splitlines()[-1]
        assert told.startswith("rlbox: error: ") and "Traceback" not in loser[2], loser[2][-2000:]
        assert ("is starting right now" in told or "was taken over by another `rlbox run --replace" in told), told
        winner_id = _state(runs, name)["run_id"]
        boxes, claims, claim_names = _run_ids(name)
        assert boxes == {winner_id} and claims == {winner_id}, (trial, boxes, claims, winner_id)
        assert f"rlbox-claim-run-{name}" in claim_names and not any(n.endswith("-starting") for n in claim_names)
        assert [b.status for b in docker.from_env().containers.list(filters={"label": f"io.rlbox.run={name}"})] == ["running"]
    # (h) the detached winner's log, kept under the run dir by `status`
    # (the job may not have printed yet when the race ends: `status` copies what the head has, so ask again)
    log = Path(_state(runs, name)["log"])
    deadline = time.monotonic() + 120
    while True:
        status = rlbox("status", "--name", name, "--runs-dir", runs, "--json")
        assert status.returncode == 0, status.stderr
        if log.is_file() and "line3" in log.read_text() or time.monotonic() > deadline:
            break
        time.sleep(2)
    last_trial = f"trial{RACES - 1}-racer"
    assert log.parent == runs / name and last_trial in log.read_text() and "line3" in log.read_text()
    # (g) the head dies: `logs -f` ends naming it, `status` tells the truth
    head = docker.from_env().containers.get(_state(runs, name)["nodes"][0]["container"])
    follow = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "logs", "--name", name, "--runs-dir", str(runs), "-f"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    head.kill()
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 2, err
    assert err.strip().startswith(f"rlbox: error: run '{name}': node0 (ft-host), the Ray head, was lost: its container exited")
    info = json.loads(rlbox("status", "--name", name, "--runs-dir", runs, "--json").stdout)
    assert info["phase"] == "lost" and info["recorded_phase"] == "running"
    assert info["lost"].startswith("node0 (ft-host), the Ray head, was lost: its container exited with code 137")
    stop = rlbox("stop", "--name", name, "--runs-dir", runs)
    assert stop.returncode == 0, stop.stderr
    assert last_trial in log.read_text()  # the copy outlives the cluster
    assert leftovers(name) == [] and _run_ids(name) == (set(), set(), [])


@pytest.fixture
def tiny_runs_dir(tmp_path):
    """A 1 MiB tmpfs as the runs dir (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "tiny"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "ft-tiny", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path) -> Path:
    filler = path / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_full_runs_dir_is_one_line_tears_down_and_the_record_tells_the_truth(tiny_runs_dir, tmp_path):
    """(f) full before the start: one line, nothing started; full while the job writes its log:
    one line, every node torn down, state.json says so (or the line names why it cannot)."""
    runs = tiny_runs_dir / "runs"
    filler = _fill(tiny_runs_dir)
    full = rlbox("run", *_sim(tmp_path), "--name", "ft-full", "--runs-dir", runs, "--no-doctor",
                 "--smoke-test")
    assert full.returncode == 2 and "Traceback" not in full.stderr, full.stderr[-2000:]
    assert full.stderr.strip().splitlines()[-1].startswith("rlbox: error: ")
    assert "No space left on device" in full.stderr and leftovers("ft-full") == []
    filler.unlink()
    proc = rlbox("run", *_sim(tmp_path), "--name", "ft-full", "--runs-dir", runs, "--no-doctor", "--",
                 "python3", "-c", "import sys\nfor i in range(40000): print('x' * 60, i)")
    err = proc.stderr
    assert proc.returncode == 2 and "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: run 'ft-full' failed: cannot write ") and "No space left on device" in last
    assert "every node was cleaned up" in last and leftovers("ft-full") == []
    if "could not be written" not in last:
        state = _state(runs, "ft-full")
        assert state["phase"] == "removed" and state["status"] == "FAILED" and "No space left" in state["reason"]
    stop = rlbox("stop", "--name", "ft-full", "--runs-dir", runs)
    assert "Traceback" not in stop.stderr and stop.returncode in (0, 2), stop.stderr


def test_stale_ray_is_found_by_process_name_not_command_line_words(tmp_path):
    """(i) `tail -f raylet.out` is no Ray; a process whose executable is raylet is."""
    from rlbox.cluster.preflight.facts import RAY_PROCESSES

    (tmp_path / "raylet.out").write_text("")
    fake = tmp_path / "raylet"
    shutil.copy(shutil.which("sleep"), fake)
    words = subprocess.Popen(["tail", "-f", str(tmp_path / "raylet.out")])
    named = subprocess.Popen([str(fake), "60"])
    try:
        time.sleep(0.3)
        found = subprocess.run(RAY_PROCESSES, capture_output=True, text=True).stdout.split()
        assert str(named.pid) in found and str(words.pid) not in found
        assert Path(f"/proc/{named.pid}/comm").read_text().strip() == "raylet"
    finally:
        for p in (words, named):
            p.kill()
            p.wait()


def test_stale_ray_is_ray_on_this_hosts_network_only(tmp_path):
    """A raylet in another network namespace (a bridged container; another testbed host, which shares
    this machine's process table) is not this host's stale Ray; one in this namespace is. "This host" is a
    network namespace of the test's own, the check run in it: a raylet in the machine's namespace, even a
    fake one for a second, is stale Ray to every simulated run's pre-flight beside this module (in CI the
    engine group's twin-run test was refused "stale ray: 1 Ray process(es) running" by it)."""
    from rlbox.cluster.preflight.facts import RAY_PROCESSES

    if shutil.which("unshare") is None or subprocess.run(["unshare", "--net", "true"]).returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("unshare --net does not run here: the testbed needs it (docs/testbed.md)")
        pytest.skip("unshare --net does not run here")
    fake = tmp_path / "raylet"
    shutil.copy(shutil.which("sleep"), fake)
    # in a namespace of its own: the raylet started, its pid said once the kernel names it raylet, the check
    here = ('f=$1; shift; "$f" 60 & pid=$!; n=0; while [ "$(cat /proc/$pid/comm 2>/dev/null)" != raylet ] '
            '&& [ $n -lt 200 ]; do sleep 0.05; n=$((n+1)); done; echo "$pid"; "$@"; kill "$pid"')
    away = subprocess.Popen(["unshare", "--net", str(fake), "60"])  # unshare execs: the pid is the raylet
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{away.pid}/comm").read_text().strip() != "raylet" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.readlink(f"/proc/{away.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        out = subprocess.run(["unshare", "--net", "sh", "-c", here, "sh", str(fake), *RAY_PROCESSES],
                             capture_output=True, text=True, timeout=30).stdout.split()
        assert len(out) >= 2 and out[0] in out[1:] and str(away.pid) not in out[1:], out
    finally:
        away.kill()
        away.wait()
