"""The CPU training chain on the production path (issues 19, 32 and 34): a real verl 0.9.1 job whose rollout is
vLLM's own server and weight sync (vLLM's CPU build, vllm-cpu 0.23.0: the vLLM the flagship pins), through
`rlbox run --backend slurm --cluster` (an allocation of two nodes from the Slurm the session's testbed runs,
then ssh to those two testbed hosts; tests/conftest.py; each host its own address, Docker engine, sshd,
slurmd and NPU stand-ins; docs/testbed.md), one NPU of each.
Release verl_cpu_09 with the verl-cpu-shims stand-in, delivered to the hosts by `rlbox run` itself; the
recipe grpo-tiny-cpu-09; a tiny random Qwen2 made here and a GSM8K-format sample converted by `rlbox data
prepare`, on a folder of this machine every host mounts at /data (the hosts share this machine's
filesystem, as nodes share NFS).

verl trains and checkpoints every step; after verl's step 2 the worker's container is killed on its own
host's engine; rlbox names it, restarts, and verl resumes from its own checkpoint; `rlbox metrics` reads
verl's real step lines (including how far vLLM's log-probs are from the actor's: the weight sync), `rlbox
merge` runs verl's model_merger on the real shards, `rlbox serve --cluster` runs vLLM's OpenAI server on the
merged model on host 1 and answers /v1/completions (a run whose data path verl cannot open is triaged in
tests/training/test_triage_on_testbed.py, on the smaller verl 0.5.0 image).
Pre-flight (`rlbox doctor` over ssh on each host) stays on, as in production. Real at every step but the NPU.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import REPO, rlbox
from support import verl_cpu
from support.stub_models import free_port

pytestmark = pytest.mark.engine

PREFIX = "vl-"
HOSTS = (1, 2)  # of the session's testbed: host 1 the head, host 2 the worker (node 1), killed
RECIPE = "grpo-tiny-cpu-09"
CKPT = "/data/checkpoints/grpo-tiny-cpu-09"


@pytest.fixture(scope="module")
def cpu_image(vllm_cpu_image):
    """Release verl_cpu_09 (rehearsed: PyPI's torch 2.11.0 stands in for +cpu) with the verl-cpu-shims layer."""
    return vllm_cpu_image


@pytest.fixture(scope="module")
def bed(testbed):
    """The session's testbed; after the module, no container of a vl- run on any host."""
    with testbed.runs_left_none(PREFIX) as bed:
        yield bed


@pytest.fixture(scope="module")
def shared(cpu_image, tmp_path_factory):
    """The mount every node has (/data): the model, the data, the checkpoints. A folder of this
    machine, which every testbed host sees at the same path."""
    return verl_cpu.shared_folder(cpu_image, tmp_path_factory.mktemp("vl-shared"), tmp_path_factory.mktemp("vl-hub"))


class Run:
    """`rlbox run` in a subprocess; its output lines as they come."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []

    def until(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
            self.lines.append(line)
            if text in line:
                return
        self.proc.kill()
        pytest.fail(f"never saw {text!r}:\n{self.text()[-4000:]}")

    def finish(self, timeout: float) -> int:
        out, _ = self.proc.communicate(timeout=timeout)
        self.lines.append(out)
        return self.proc.returncode

    def text(self) -> str:
        return "".join(self.lines)


def run_argv(cluster: str, image: str, shared: Path, runs: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rlbox.cli",
            "run", *extra, "--cluster", cluster, "--image", image, "--recipe", RECIPE, "--mount", f"{shared}:/data",
            "--name", name, "--runs-dir", str(runs), "--timeout", "1500",
            # 1 NPU (NPU 0) of each host's 16 (one FSDP rank and one vLLM engine a host: 2 cores, 24 GiB for all);
            # 8 CPUs for Ray: verl's TaskRunner, its agent loop, reward and storage actors and the {CPU, NPU}
            # bundles (Ray would detect this machine's 2)
            "--devices", "1", "--num-cpus", "8"]


def served(bed, image: str, model: Path, name: str, runs: Path) -> str:
    """`rlbox serve MODEL --cluster` on host 1 (vLLM's OpenAI server as an NPU node gets it, plus the CPU
    build's memory fraction); its endpoint."""
    port = free_port()
    proc = rlbox("serve", str(model), "--cluster", bed.cluster(*HOSTS), "--image", image, "--tp", "1",
                 "--max-model-len", "1024", "--gpu-memory-utilization", "0.05", "--port", str(port),
                 "--served-model-name", "tiny", "--name", name, "--runs-dir", str(runs), "--timeout", "900")
    assert proc.returncode == 0, proc.stderr[-3000:]
    url = proc.stdout.strip().splitlines()[-1]
    assert url == f"http://{bed.address(1)}:{port}/v1", proc.stdout
    return url


def evaluated(server: str, label: str, runs: Path, datasets: Path, ais_bench: Path, out: Path) -> dict:
    """The real AISBench (`rlbox eval`) on the shipped GSM8K sample against the server `rlbox serve --name
    server` started (its record under ``runs``); rlbox's result."""
    proc = rlbox("eval", label, "--dataset", "gsm8k", "--repeat", "1", "--name", server,
                 "--max-seq-len", "512", "--max-out-len", "32", "--batch-size", "8", "--temperature", "0",
                 "--ais-bench", str(ais_bench), "--ais-datasets", str(datasets), "--runs-dir", str(runs), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.chain  # `make chain`, not `make test`: 20 min alone here, 44 min beside the suite (CI)
def test_verl_trains_with_vllm_loses_a_node_resumes_merges_serves_and_reports(bed, cpu_image, shared, runs, tmp_path,
                                                                              ais_bench):
    name = f"{PREFIX}train"
    timings: dict[str, float] = {}
    started = time.monotonic()
    # through Slurm (the session's testbed runs it): an allocation of 2 whole nodes, the hosts path on exactly
    # them; 4 steps: 2 before the loss, 2 after the resume (each a vLLM rollout, an update and a checkpoint)
    run = Run(run_argv(bed.cluster(*HOSTS), cpu_image, shared, runs, name, "--backend", "slurm", "--nodes", "2",
                       "--time", "60", "--max-restarts", "1", "--param", "steps=4"))
    run.until("step:2 ", timeout=2400)  # the first run on fresh hosts delivers the image first
    timings["to step 2"] = time.monotonic() - started
    container = json.loads((runs / name / "state.json").read_text())["nodes"][1]["container"]
    bed.docker(HOSTS[1], "kill", container)  # the worker's container, on its own host's engine
    code = run.finish(timeout=1500)
    timings["train, lose a node, resume"] = time.monotonic() - started
    out = run.text()
    assert code == 0, out[-6000:]
    delivered = [line for line in out.splitlines() if line.startswith("rlbox: deliver: ") and "verified by image id" in line]
    # the production path: ssh to each host, pre-flight on each, the stand-in named
    assert f"started on {bed.address(1)} (1 NPUs)" in out and f"started on {bed.address(2)} (1 NPUs)" in out, out[-4000:]
    assert "pre-flight: " in out and " checks passed on 2 node(s)" in out, out[-4000:]
    # before anything started: verl's own checks in the image on the head, the model read through the run's
    # mount, up to the rollout server's vLLM engine config (verl's worker-side checks)
    assert "ran: verl 0.9.1's own code: verl's rollout server for vLLM as its replica makes it (vLLMReplica, " \
           "vLLMHttpServer.launch_server), to vLLM's engine config" in out, out[-6000:]
    # Slurm's allocation held for the whole run, the restart inside it, and released at the end
    job = json.loads((runs / name / "slurm.json").read_text())["job"]
    assert f"slurm: job {job} runs on h1 ({bed.address(1)}), h2 ({bed.address(2)}); Ray's head on h1" in out, out[-4000:]
    assert f"slurm: job {job} ended (scancel)" in out, out[-2000:]
    assert bed.ssh(1, "squeue -h -o %i").stdout.split() == []
    assert "stand-in: verl CPU shims for verl 0.9.1" in out and "vllm-cpu-weight-sync" in out
    # vLLM's own engine lines (its version, its CPU platform) and verl's vLLM rollout (its server actors)
    engine = [line for line in out.splitlines() if "Initializing a V1 LLM engine (v0.23.0)" in line]
    assert engine and all("device_config=cpu" in line for line in engine), out[-4000:]
    assert "(vLLMHttpServer pid=" in out
    # rlbox names the lost node (by its host) and restarts; verl resumes from its own checkpoint, not step 0
    assert f"restart 1/1: node1 ({bed.address(2)}), the worker, was lost" in out, out[-4000:]
    assert f"Resuming from {CKPT}/global_step_" in out
    resumed = int(re.search(rf"Resuming from {CKPT}/global_step_(\d+)", out).group(1))
    assert resumed >= 2
    assert f"step:{resumed + 1} " in out.split("Resuming from")[1]
    state = json.loads((runs / name / "state.json").read_text())
    assert state["restarts"][0]["resumed_step"] == resumed
    assert state["sim"] is False and [(n["host"], n["transport"]) for n in state["nodes"]] == \
        [(bed.address(1), "ssh"), (bed.address(2), "ssh")]
    ckpt = shared / "checkpoints" / RECIPE
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == [f"global_step_{n}" for n in range(1, 5)]
    assert bed.leftovers(name) == []

    # verl's real per-step metrics from the run's log
    as_json = rlbox("metrics", name, "--runs-dir", str(runs), "--json")
    assert as_json.returncode == 0, as_json.stderr
    by_step = {r["step"]: r for r in json.loads(as_json.stdout)["records"]}
    assert set(by_step) == set(range(1, 5))  # one log across the restart: the first attempt's steps and the resumed ones
    for key in ("critic/rewards/mean", "response_length/mean", "timing_s/step", "timing_s/gen"):
        assert key in by_step[4], sorted(by_step[4])
    # the weight sync: vLLM's log-probs of what it generated match the actor's on the synced weights, every step
    # (after an update too); a stale or missing sync puts them far apart
    for step, record in by_step.items():
        assert record["training/rollout_probs_diff_max"] < 1e-2, (step, record["training/rollout_probs_diff_max"])
    csv_path = tmp_path / "m.csv"
    assert rlbox("metrics", name, "--runs-dir", str(runs), "--csv", str(csv_path)).returncode == 0
    assert [int(r["step"]) for r in csv.DictReader(csv_path.open())][-1] == 4

    # verl's model_merger on the real shards
    started = time.monotonic()
    merged = rlbox("merge", name, "--step", "4", "--runs-dir", str(runs))
    assert merged.returncode == 0, merged.stderr[-3000:]
    timings["merge"] = time.monotonic() - started
    hf = ckpt / "global_step_4" / "hf_merged"
    assert (hf / "config.json").is_file()

    # vLLM's OpenAI server on the merged model, on host 1, as `rlbox serve` runs it on an NPU node (plus the CPU
    # build's memory fraction), answering /v1/completions; the real AISBench on the shipped GSM8K sample against
    # it, found through the server's record (no --endpoint); the server's log kept when it stops. (--compare and
    # repeats: test_eval_aisbench.py, on stub models whose scores are known.)
    datasets = tmp_path / "ais"
    (datasets / "ais_bench" / "datasets" / "gsm8k").mkdir(parents=True)
    for split in ("train", "test"):
        shutil.copy(verl_cpu.SAMPLE / f"{split}.jsonl", datasets / "ais_bench" / "datasets" / "gsm8k")
    started = time.monotonic()
    server = f"{PREFIX}serve"
    try:
        url = served(bed, cpu_image, hf, server, runs)
        timings["serve: ready"] = time.monotonic() - started
        answer = requests.post(f"{url}/completions", json={"model": "tiny", "prompt": "2 + 3 =", "max_tokens": 8,
                                                            "temperature": 0}, timeout=120)
        assert answer.status_code == 200, answer.text[:500]
        assert answer.json()["usage"]["completion_tokens"] >= 1, answer.json()
        started = time.monotonic()
        res = evaluated(server, "tiny-after", runs, datasets, ais_bench, tmp_path / "after.json")
        timings["eval"] = time.monotonic() - started
    finally:
        stopped = rlbox("serve", "--stop", "--name", server, "--runs-dir", str(runs))
    assert stopped.returncode == 0, stopped.stderr
    log = (runs / "serve" / f"{server}.log").read_text()
    assert "Initializing a V1 LLM engine (v0.23.0" in log and "/completions HTTP/1.1\" 200" in log, log[-2000:]
    assert bed.docker(HOSTS[0], "ps", "-aq", "--filter", f"label=io.rlbox.serve={server}", check=False).stdout.split() == []
    # AISBench's own files, read by rlbox: its dataset, metric and 8 answers scored, from the server of the record
    assert res["dataset"] == "gsm8k" and res["metric"] == "accuracy" and 0 <= res["mean"] <= 100, res
    assert res["served_model"] == "tiny" and len(res["runs"]) == 1, res
    assert res["endpoint"] == url.removesuffix("/v1"), res
    stamp = res["runs"][0]["summary"].rsplit("/summary/", 1)[0]
    preds = [json.loads(line) for line in open(f"{stamp}/predictions/vllm-api-general/gsm8k.jsonl")]
    assert len(preds) == 8 and all(p["success"] for p in preds), preds[:2]  # vLLM answered every request
    print("\n" + name + ": " + "; ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + "; "
          + (delivered[0] if delivered else "image already on both hosts"))


def test_the_release_image_does_not_carry_the_shims(cpu_image):
    release = verl_cpu.release_tag09()
    labels = json.loads(subprocess.run(["docker", "image", "inspect", release], capture_output=True, text=True).stdout)[0]
    assert "io.rlbox.standin" not in (labels["Config"]["Labels"] or {})
    probe = ["python3", "-c", "import rlbox_verl_cpu_shims"]
    assert subprocess.run(["docker", "run", "--rm", "--network", "none", release, *probe], capture_output=True).returncode != 0
    assert subprocess.run(["docker", "run", "--rm", "--network", "none", cpu_image, *probe], capture_output=True).returncode == 0
    # vLLM's CPU build is the distribution vllm-cpu; only the layer names it vllm for verl
    alias = ["python3", "-c", "from importlib.metadata import version; print(version('vllm-cpu'), version('vllm'))"]
    assert subprocess.run(["docker", "run", "--rm", "--network", "none", release, *alias], capture_output=True).returncode != 0
    both = subprocess.run(["docker", "run", "--rm", "--network", "none", cpu_image, *alias], capture_output=True, text=True)
    assert both.stdout.split() == ["0.23.0", "0.23.0+cpu"], both.stdout + both.stderr
    shown = rlbox("inspect", cpu_image)
    assert "stand-in    verl CPU shims" in shown.stdout, shown.stdout + shown.stderr
