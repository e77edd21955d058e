"""`rlbox triage`: known failure signatures over real error lines, log collection from the nodes.

The corpus tests/fixtures/triage/<signature>.log holds real lines from public issues and the seeds
(each file names its sources); every signature must hit its own file and no other. The engine
test runs a real simulated cluster whose job leaves an HCCL error in one node's CANN plog."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, rlbox
from support.engine import leftovers, remove_run
from rlbox.cluster import execute as run_mod
from rlbox.training import triage

FIXTURES = REPO / "tests" / "fixtures" / "triage"
SIGNATURES = triage.load_signatures()
IDS = [s.id for s in SIGNATURES]


def comment_lines(path: Path) -> set[int]:
    return {i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("#")}


def test_the_corpus_loads_and_covers_the_issue_s_failures():
    assert len(IDS) == len(set(IDS)) >= 15
    for must in ("hccl-socket-timeout", "hccl-init", "npu-busy", "host-memory", "ray-no-agent", "npus-short",
                 "npu-oom", "hccl-exec-timeout", "cann-env", "vllm-kv-cache"):
        assert must in IDS
    assert sorted(p.stem for p in FIXTURES.glob("*.log")) == sorted([*IDS, "no-signature"])
    for path in FIXTURES.glob("*.log"):
        head = path.read_text().splitlines()[:3]
        assert head[0].startswith("# ") and any(w in h.lower() for h in head for w in ("source:", "seed 00", "verl/")), path.name


@pytest.mark.parametrize("sig_id", IDS)
def test_each_signature_hits_its_own_real_lines_and_nothing_else(sig_id):
    path = FIXTURES / f"{sig_id}.log"
    findings = triage.scan([path], SIGNATURES)
    assert [f.signature.id for f in findings] == [sig_id]
    assert all(h.line not in comment_lines(path) for h in findings[0].hits)
    for other in FIXTURES.glob("*.log"):
        if other != path:
            assert sig_id not in [f.signature.id for f in triage.scan([other], SIGNATURES)], other.name


def test_lines_of_healthy_runs_match_nothing():
    assert triage.scan([FIXTURES / "no-signature.log"], SIGNATURES) == []


def test_weak_lines_count_only_without_the_stronger_signature(tmp_path):
    # seed 004's bare line alone is the host-memory failure (jemalloc)...
    alone = tmp_path / "a.log"
    alone.write_text("[Error]: Failed to apply for memory.\n")
    assert [f.signature.id for f in triage.scan([alone], SIGNATURES)] == ["host-memory"]
    # ...but next to a device-memory error it is that one (vllm-ascend#3141, in npu-oom.log)
    assert [f.signature.id for f in triage.scan([alone, FIXTURES / "npu-oom.log"], SIGNATURES)] == ["npu-oom"]
    # hcclCommInitRootInfo next to EJ0001 is a symptom of it
    assert [f.signature.id for f in triage.scan([FIXTURES / "hccl-init.log", FIXTURES / "hccp-busy.log"], SIGNATURES)] \
        == ["hccp-busy"]


def test_everything_at_once_is_reported_in_the_corpus_order(tmp_path):
    files = sorted(FIXTURES.glob("*.log"))
    ids = [f.signature.id for f in triage.scan(files, SIGNATURES)]
    assert ids == [i for i in IDS if i != "hccl-init"]  # its lines are symptoms of the socket/HCCP errors


# -- collection ---------------------------------------------------------------------------------
def tar_stream(entries: dict[str, bytes | None], chunk: int = 1000):
    """A directory archive as docker's get_archive streams it, in chunks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return (raw[i:i + chunk] for i in range(0, len(raw), chunk))


def test_extract_keeps_ray_logs_tails_and_nothing_outside(tmp_path):
    entries = {
        "logs/raylet.out": b"raylet ok\n",
        "logs/worker-1.err": b"x" * 5000 + b"\nEI0006: Getting socket times out.\n",
        "logs/dashboard_agent.log": b"port 52365 in use\n",
        "logs/gcs_server.log": b"not wanted\n",
        "logs/events/event_RAYLET.log": b"not wanted\n",
        "logs/../../escape.out": b"never\n",
        "logs/link.out": None,
    }
    files, written, cut = triage.extract(tar_stream(entries), tmp_path / "ray", triage._ray_file, file_cap=1000)
    got = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert got == ["ray/dashboard_agent.log", "ray/raylet.out", "ray/worker-1.err"]
    assert files == 3 and cut
    tail = (tmp_path / "ray" / "worker-1.err").read_text()
    assert tail.startswith("[rlbox: the first 4035 bytes of this file were left out]\n")
    assert tail.endswith("EI0006: Getting socket times out.\n")
    # the stream cap stops reading a huge archive, keeping what came before it
    files, _, cut = triage.extract(tar_stream({f"plog/p{i}.log": b"y" * 3000 for i in range(20)}), tmp_path / "plog",
                                   stream_cap=20000)
    assert cut and 0 < files < 20


def test_a_failing_triage_is_one_warning_and_changes_nothing(tmp_path):
    said = []

    def broken(nodes, log):
        raise RuntimeError("engine went away\n  with a second line")

    run_mod.guarded(broken, [], tmp_path / "x.log", echo=said.append)
    assert said == [f"warning: triage failed (engine went away with a second line); the job's own log: {tmp_path / 'x.log'}"]

    def interrupted(nodes, log):
        raise KeyboardInterrupt

    run_mod.guarded(interrupted, [], tmp_path / "x.log", echo=said.append)
    assert said[-1] == "triage interrupted; tearing down"


# -- the command without a cluster ----------------------------------------------------------------
@pytest.fixture
def finished_run(tmp_path):
    """runs/t-gone as a run whose containers were removed, its job log holding real HCCL lines."""
    runs = tmp_path / "runs"
    folder = runs / "t-gone"
    folder.mkdir(parents=True)
    log = folder / "abcd1234.log"
    log.write_text("".join((FIXTURES / n).read_text() for n in ("npus-short.log", "no-signature.log")))
    (folder / "state.json").write_text(json.dumps({"run": "t-gone", "run_id": "abcd1234", "phase": "removed",
                                                   "log": str(log), "nodes": []}))
    return runs, log


def test_triage_of_a_removed_run_matches_its_job_log(finished_run):
    runs, log = finished_run
    proc = rlbox("triage", "t-gone", "--runs-dir", runs)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("triage: 1 known failure(s) in 1 file(s) under ")
    assert lines[1] == "triage: warning: the containers of run 't-gone' are gone; matching the job log and what was collected before"
    assert lines[2] == "✗ Fewer NPUs in Ray than verl asks for (nnodes x n_gpus_per_node) [npus-short]"
    assert lines[3].endswith("t-gone/triage/job/abcd1234.log:3: ValueError: Total available GPUs 8.0 is less than total desired GPUs 16")
    assert lines[4] == "  (and 1 more line(s))"
    assert lines[5].startswith("  fix: rlbox sets trainer.nnodes and trainer.n_gpus_per_node from the cluster")
    data = json.loads(rlbox("triage", "t-gone", "--runs-dir", runs, "--json").stdout)
    assert [f["id"] for f in data["findings"]] == ["npus-short"]
    assert data["findings"][0]["hits"][1]["text"] == "ValueError: Total available GPUs 7.0 is less than total desired GPUs 8"
    assert (runs / "t-gone" / "triage" / "report.json").is_file()


def test_triage_with_nothing_known(finished_run):
    runs, log = finished_run
    log.write_text((FIXTURES / "no-signature.log").read_text())
    proc = rlbox("triage", "t-gone", "--runs-dir", runs)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[-1].startswith("no known signature matched; the error is in the job log: ")


def test_triage_of_no_such_run_is_one_line(tmp_path):
    proc = rlbox("triage", "nope", "--runs-dir", tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"rlbox: error: no run named 'nope' under {tmp_path} (rlbox run --name nope ...)\n"


# -- on the simulated cluster ----------------------------------------------------------------------
HCCL_LINE = ("[ERROR] HCCL(2717288,python3):2025-07-23-03:49:57.177.194 [hccl_socket_manager.cc:778] [2734049]"
             "[Wait][LinkEstablish]wait socket establish timeout, role[1] rank[12] timeout[120]")  # vllm-ascend#1955

# The job: on each node (one placement-group bundle per node) a task writes a CANN plog file, the
# real HCCL line only on node 1; a TaskRunner actor prints verl-style step lines (so the job log
# has Ray's prefixes as verl's does); then the driver fails.
FAILING_JOB = r"""
import os, sys, time
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address="auto", logging_level="ERROR")
@ray.remote(num_cpus=0.01)
def plog(line):
    d = "/root/ascend/log/debug/plog"
    os.makedirs(d, exist_ok=True)
    node = os.environ["RLBOX_NODE"]
    with open(f"{d}/plog-{os.getpid()}_20250723034757070.log", "w") as f:
        f.write("[INFO] HCCL(2717288,python3):2025-07-23-03:47:57.070.400 [hccl_communicator.cc:100] init\n")
        if node == "1":
            f.write(line + "\n")
    return node
pg = placement_group([{"CPU": 0.01}, {"CPU": 0.01}], strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=60)
print("plog written on nodes", sorted(ray.get([plog.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote(os.environ["HCCL_LINE"]) for i in range(2)])), flush=True)
@ray.remote(num_cpus=0.01)
class TaskRunner:
    def run(self):
        for s in (1, 2, 3):
            print(f"step:{s} - critic/rewards/mean:{-0.5 + 0.25 * s} - response_length/mean:{800 + 10 * s} - perf/throughput:{60.0 + s} - timing_s/step:90.5", flush=True)
        return True
ray.get(TaskRunner.remote().run.remote())
time.sleep(3)  # Ray's log monitor forwards the actor's lines to this driver
print("RuntimeError: HCCL function error: see the plog", flush=True)
sys.exit(1)
"""


@pytest.mark.engine
def test_failed_job_on_a_sim_cluster_is_triaged_before_teardown(tmp_path, sim_image):
    runs = tmp_path / "runs"
    name = "t-triage"
    try:
        proc = rlbox("run", "--sim", "--nodes", "2", "--hardware", "a2", "--name", name, "--runs-dir", runs,
                     "--env", f"HCCL_LINE={HCCL_LINE}", "--", "python3", "-c", FAILING_JOB)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "plog written on nodes ['0', '1']" in proc.stdout
        err = proc.stderr.splitlines()
        assert err[-1].startswith(f"rlbox: error: job of run '{name}' FAILED with exit code 1")
        assert "rlbox: job failed: collecting logs from every node (rlbox triage)" in err
        start = next(i for i, line in enumerate(err) if line.startswith("triage: "))
        report = err[start:-1]
        assert report[0].startswith("triage: 1 known failure(s) in ")
        assert "node0: plog 1, ray " in report[0] and "node1: plog 1, ray " in report[0]
        assert report[1] == "✗ HCCL ranks could not connect (socket timeout, EI0006) [hccl-socket-timeout]"
        assert f"{name}/triage/node1/plog/plog-" in report[2] and report[2].endswith(f".log:2: {HCCL_LINE}")
        assert report[3].startswith("  fix: HCCL_SOCKET_IFNAME and HCCL_IF_IP must name the interface")
        folder = runs / name / "triage"
        state = json.loads((runs / name / "state.json").read_text())
        assert (folder / "job" / f"{state['run_id']}.log").read_text() == Path(state["log"]).read_text()
        assert len(list((folder / "node0" / "plog").glob("plog-*.log"))) == 1
        assert (folder / "node0" / "ray" / "raylet.out").is_file() and (folder / "node1" / "ray" / "raylet.out").is_file()
        assert not list(folder.glob("node*/ray/*.log")) or all(p.name == "dashboard_agent.log" for p in folder.glob("node*/ray/*.log"))
        assert state["phase"] == "removed" and state["status"] == "FAILED"
        assert leftovers(name) == []  # torn down after the triage
        # the job log, as Ray wrote it (prefixes, colours), reads back as metrics
        metrics = json.loads(rlbox("metrics", name, "--runs-dir", runs, "--json").stdout)
        assert [r["critic/rewards/mean"] for r in metrics["records"]] == [-0.25, 0.0, 0.25]
        assert "(TaskRunner pid=" in Path(state["log"]).read_text()
        # later, with the containers gone, `rlbox triage` matches what was collected
        again = rlbox("triage", name, "--runs-dir", runs)
        assert again.returncode == 0 and "[hccl-socket-timeout]" in again.stdout
    finally:
        remove_run(name)
        shutil.rmtree(runs, ignore_errors=True)
