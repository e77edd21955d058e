"""rlbox merge on a real FSDP2 checkpoint spread over two simulated nodes' disks.

The workflow test image (CPU torch, transformers, verl's wheel; tests/cpu_release_image.py) is the
node image. A real `rlbox run --sim` on two nodes, each with its own host folder mounted at
/ckpt (its "local disk"), runs tests/fixtures/workflow/fake_trainer.py as the job: every node
writes the FSDP2 shards of the ranks it held, as verl's workers do. Then `rlbox merge` finds the
checkpoint from the run's recorded job and mounts, gathers the shards through the engine
connections and runs verl's own model_merger inside the image. The merged safetensors must
equal the original weights, tensor by tensor, byte for byte.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import REPO, rlbox
from support.engine import MANAGED, names

pytestmark = [pytest.mark.engine, pytest.mark.simulated]  # its `trained` fixture runs `rlbox run --sim`
FIXTURES = REPO / "tests" / "fixtures" / "workflow"


def tensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """A safetensors file read by hand (its format: u64 header size, JSON header, raw data)."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    data = raw[8 + size:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def leftovers(prefix: str) -> list[str]:
    return [name for name in names(MANAGED) if name.startswith(prefix)]


@pytest.fixture(scope="module")
def trained(cpu_release_image, tmp_path_factory):
    """A finished two-node simulated run that saved step 2 across both nodes' disks."""
    base = tmp_path_factory.mktemp("merge")
    disks = [base / "disk0", base / "disk1"]
    for d in disks:
        d.mkdir()
    cluster = base / "cluster.yaml"
    cluster.write_text(
        f"mounts: ['{FIXTURES}:{FIXTURES}:ro']\n"
        "hosts:\n"
        f"  - host: node-a\n    mounts: ['{disks[0]}:/ckpt']\n"
        f"  - host: node-b\n    mounts: ['{disks[1]}:/ckpt']\n"
    )
    runs = base / "runs"
    # The run is not named t-*: test_launcher removes every t-* run it finds on the engine.
    # One NPU per node keeps FSDP at two CPU processes per node; no real A3 host has one, so the
    # pre-flight device-count check is skipped (--no-doctor).
    proc = rlbox("run", "--sim", "--cluster", cluster, "--image", cpu_release_image, "--devices", "1", "--name", "wf-merge",
                 "--runs-dir", runs, "--timeout", "180", "--num-cpus", "2", "--no-doctor",
                 "--", "python3", FIXTURES / "fake_trainer.py", "trainer.default_local_dir=/ckpt/demo/exp",
                 "trainer.total_training_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "fake-trainer: step 2 saved, world size 2" in proc.stdout
    return base, disks, runs


def test_missing_rank_and_step_are_one_line(trained, cpu_release_image):
    base, disks, runs = trained
    shard = disks[1] / "demo/exp/global_step_2/actor/model_world_size_2_rank_1.pt"
    hidden = shard.with_name("hidden.pt")
    shard.rename(hidden)
    try:
        proc = rlbox("merge", "wf-merge", "--step", "2", "--runs-dir", runs)
    finally:
        hidden.rename(shard)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("global_step_2/actor: rank 1 of 2 is missing: model_world_size_2_rank_1.pt is on no node; "
            f"it should be on node1 (node-b) in {disks[1]}/demo/exp/global_step_2/actor") in proc.stderr
    proc = rlbox("merge", "wf-merge", "--step", "5", "--runs-dir", runs)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "no FSDP shards of step 5 (global_step_5/actor) on any node" in proc.stderr
    assert "steps saved: 2" in proc.stderr
    assert leftovers("rlbox-merge-") == []


def test_merge_gathers_shards_and_equals_the_original(trained, cpu_release_image):
    base, disks, runs = trained
    dry = rlbox("merge", "wf-merge", "--step", "2", "--runs-dir", runs, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "checkpoints at /ckpt/demo/exp (trainer.default_local_dir=/ckpt/demo/exp)" in dry.stdout
    assert f"node1 (node-b): {disks[1]}/demo/exp/global_step_2/actor" in dry.stdout
    assert "python3 -m verl.model_merger merge --backend fsdp --local_dir" in dry.stdout

    proc = rlbox("merge", "wf-merge", "--step", "2", "--runs-dir", runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 2: 2 FSDP shard(s) on 2 node(s); merging on node0 (node-a)" in proc.stderr
    assert "gathered rank 1 (model_world_size_2_rank_1.pt" in proc.stderr and "from node1 (node-b) onto node0 (node-a)" in proc.stderr
    target = disks[0] / "demo/exp/global_step_2/hf_merged"
    assert f"merged step 2 of run wf-merge into node0 (node-a):{target}" in proc.stderr
    assert (disks[0] / "demo/exp/global_step_2/actor/model_world_size_2_rank_1.pt").is_file()
    merged = tensors(target / "model.safetensors")
    original = tensors(disks[0] / "demo/exp/reference/reference.safetensors")
    assert sorted(merged) == sorted(original) and len(original) > 10
    for name, (dtype, shape, data) in original.items():
        assert merged[name] == (dtype, shape, data), name
    assert (target / "config.json").is_file() and (target / "tokenizer.json").is_file()
    assert leftovers("rlbox-merge-") == []
