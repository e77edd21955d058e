"""A real verl job through the launcher on CPU (issue 19), on the production path: `rlbox run
--cluster` over ssh to two testbed hosts (the session's testbed, tests/conftest.py; each host its
own address, Docker engine, sshd and NPU stand-ins; docs/testbed.md), 2 NPUs of each. Release
verl_cpu with the verl-cpu-shims stand-in, delivered to the hosts by `rlbox run` itself; the recipe
grpo-tiny-cpu; a tiny random Qwen2 made here and a GSM8K-format sample converted by `rlbox data
prepare`, on a folder of this machine every host mounts at /data (the hosts share this machine's
filesystem, as cluster nodes share NFS). verl trains and checkpoints every step; after verl's step 2
the worker's container is killed on its own host's engine; rlbox names it, restarts, and verl resumes
from its own checkpoint; then `rlbox metrics` reads verl's real step lines, `rlbox merge` runs verl's
model_merger on the real shards, and a run with a data path verl cannot open is triaged. Pre-flight
(`rlbox doctor` over ssh on each host) stays on, as in production.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, rlbox
from support import verl_cpu

pytestmark = pytest.mark.engine

PREFIX = "vl-"
HOSTS = (1, 2)  # of the session's testbed: host 1 the head, host 2 the worker (node 1), killed


@pytest.fixture(scope="module")
def cpu_image(cpu_release_image):
    """The release with the verl-cpu-shims stand-in on top (built with it by the session fixture)."""
    return verl_cpu.image()


@pytest.fixture(scope="module")
def bed(testbed):
    """The session's testbed; after the module, no container of a vl- run on any host."""
    yield testbed
    left = [line for h in testbed.hosts for line in testbed.leftovers_prefix(PREFIX, h["index"])]
    testbed.remove_runs(PREFIX)
    assert left == [], left


@pytest.fixture(scope="module")
def shared(cpu_image, tmp_path_factory):
    """The mount every node has (/data): the model, the data, the checkpoints. A folder of this
    machine, which every testbed host sees at the same path."""
    root = tmp_path_factory.mktemp("vl-shared")
    made = verl_cpu.make_model(cpu_image, root)
    assert made.returncode == 0, made.stderr[-3000:]
    prepared = verl_cpu.make_data(cpu_image, root, tmp_path_factory.mktemp("vl-hub"))
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    return root


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
            "run", "--cluster", cluster, "--image", image, "--recipe", "grpo-tiny-cpu", "--mount", f"{shared}:/data",
            "--name", name, "--runs-dir", str(runs), "--timeout", "900",
            # NPUs 0-1 of each host's 16; 4 CPUs for Ray: verl's TaskRunner holds one on the head beside
            # the head's {CPU: 1, NPU: 1} x 2 placement group (Ray would detect this machine's 2)
            "--devices", "0-1", "--num-cpus", "4", *extra]


def scenario(cluster: str, image: str, shared: Path, runs: Path, kill) -> dict:
    """Train with --max-restarts 1, kill a node after verl's step 2 (``kill(run_dir, index)``),
    let rlbox restart; returns what the checks need."""
    name = f"{PREFIX}train"
    started = time.monotonic()
    run = Run(run_argv(cluster, image, shared, runs, name, "--max-restarts", "1"))
    run.until("step:2 ", timeout=1800)  # the first run on fresh hosts delivers the image first
    kill(runs / name, 1)
    code = run.finish(timeout=900)
    return {"name": name, "code": code, "output": run.text(), "seconds": time.monotonic() - started}


def test_verl_trains_loses_a_node_resumes_merges_and_reports(bed, cpu_image, shared, runs, tmp_path):
    def kill_on_its_host(run_dir: Path, index: int) -> None:  # the node's container, on its own host's engine
        container = json.loads((run_dir / "state.json").read_text())["nodes"][index]["container"]
        bed.docker(HOSTS[index], "kill", container)

    got = scenario(bed.cluster(*HOSTS), cpu_image, shared, runs, kill_on_its_host)
    name, out = got["name"], got["output"]
    assert got["code"] == 0, out[-6000:]
    delivered = [line for line in out.splitlines() if line.startswith("rlbox: deliver: ") and "verified by image id" in line]
    print(f"\n{name}: {got['seconds']:.0f} s in all; " + (delivered[0] if delivered else "image already on both hosts"))
    # the production path: ssh to each host, pre-flight on each, the stand-in named
    assert f"started on {bed.address(1)} (2 NPUs)" in out and f"started on {bed.address(2)} (2 NPUs)" in out, out[-4000:]
    assert "pre-flight: " in out and " checks passed on 2 node(s)" in out, out[-4000:]
    assert "stand-in: verl CPU shims" in out
    # rlbox names the lost node (by its host) and restarts; verl resumes from its own checkpoint, not step 0
    assert f"restart 1/1: node1 ({bed.address(2)}), the worker, was lost" in out, out[-4000:]
    assert "Resuming from /data/checkpoints/grpo-tiny-cpu/global_step_" in out
    resumed = int(out.split("Resuming from /data/checkpoints/grpo-tiny-cpu/global_step_")[1].split()[0])
    assert resumed >= 2
    assert f"step:{resumed + 1} " in out.split("Resuming from")[1]
    state = json.loads((runs / name / "state.json").read_text())
    assert state["restarts"][0]["resumed_step"] == resumed
    assert state["sim"] is False and [(n["host"], n["transport"]) for n in state["nodes"]] == \
        [(bed.address(1), "ssh"), (bed.address(2), "ssh")]
    ckpt = shared / "checkpoints" / "grpo-tiny-cpu"
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == [f"global_step_{n}" for n in range(1, 6)]
    assert bed.leftovers(name) == []

    # verl's real per-step metrics from the run's log
    table = rlbox("metrics", name, "--runs-dir", str(runs))
    assert table.returncode == 0, table.stderr
    as_json = rlbox("metrics", name, "--runs-dir", str(runs), "--json")
    assert as_json.returncode == 0, as_json.stderr
    by_step = {r["step"]: r for r in json.loads(as_json.stdout)["records"]}
    assert set(by_step) == set(range(1, 6))  # one log across the restart: the first attempt's steps and the resumed ones
    last = by_step[5]
    for key in ("critic/rewards/mean", "response_length/mean", "timing_s/step", "perf/throughput"):
        assert key in last, sorted(last)
    csv_path = tmp_path / "m.csv"
    plot = tmp_path / "m.png"
    assert rlbox("metrics", name, "--runs-dir", str(runs), "--csv", str(csv_path), "--plot", str(plot)).returncode == 0
    rows = list(csv.DictReader(csv_path.open()))
    assert [int(r["step"]) for r in rows][-1] == 5 and plot.stat().st_size > 10_000

    # verl's model_merger on the real shards, and the merged model generates
    merged = rlbox("merge", name, "--step", "5", "--runs-dir", str(runs))
    assert merged.returncode == 0, merged.stderr[-3000:]
    hf = ckpt / "global_step_5" / "hf_merged"
    gen = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{hf}:/m:ro", cpu_image, "python3", "-c",
                          "import torch, transformers as t; tok = t.AutoTokenizer.from_pretrained('/m'); "
                          "m = t.AutoModelForCausalLM.from_pretrained('/m'); ids = tok('2 + 3 =', return_tensors='pt', return_token_type_ids=False); "
                          "out = m.generate(**ids, max_new_tokens=8, do_sample=False); "
                          "print('generated', out.shape[1] - ids['input_ids'].shape[1], type(m).__name__)"],
                         text=True, capture_output=True)
    assert gen.returncode == 0 and "Qwen2ForCausalLM" in gen.stdout, gen.stderr[-3000:]


def test_the_release_image_does_not_carry_the_shims(cpu_image):
    release = verl_cpu.release_tag()
    labels = json.loads(subprocess.run(["docker", "image", "inspect", release], capture_output=True, text=True).stdout)[0]
    assert "io.rlbox.standin" not in (labels["Config"]["Labels"] or {})
    probe = ["python3", "-c", "import rlbox_verl_cpu_shims"]
    assert subprocess.run(["docker", "run", "--rm", "--network", "none", release, *probe], capture_output=True).returncode != 0
    assert subprocess.run(["docker", "run", "--rm", "--network", "none", cpu_image, *probe], capture_output=True).returncode == 0
    shown = rlbox("inspect", cpu_image)
    assert "stand-in    verl CPU shims" in shown.stdout, shown.stdout + shown.stderr


def test_a_data_path_verl_cannot_open_is_triaged_with_its_fix(bed, cpu_image, shared, runs):
    name = f"{PREFIX}nodata"
    proc = subprocess.run(run_argv(bed.cluster(*HOSTS), cpu_image, shared, runs, name,
                                   "--param", "train_files=/data/datasets/gsm8k/trian.parquet"),
                          cwd=REPO, text=True, capture_output=True, timeout=1800)
    assert proc.returncode != 0
    report = rlbox("triage", name, "--runs-dir", str(runs))
    assert "data-file-missing" in report.stdout + report.stderr, report.stdout[-3000:]
    assert "/data/datasets/gsm8k/trian.parquet" in report.stdout
    assert bed.leftovers(name) == []
