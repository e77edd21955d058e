"""`rlbox validate` of a job whose model is on the head node only (a testbed host's own /usr/local,
which this machine does not see): verl 0.9.1's checks that read the model (a critic's HFModelConfig,
built by validate_config) stop on it here, so its small files are fetched from the head over the
cluster file's ssh and the checks run to the end against them; the verdict is theirs, and says where
the files came from. The session's testbed (tests/conftest.py), one of its hosts; verl 0.9.1's
environment made from its wheel (tests/support/verl_env.py), whose Python also makes the tiny model
on that host (tools/make-tiny-model.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import verl_env
from support.testbed import REPO, rlbox

pytestmark = pytest.mark.engine

FOLDER = "/usr/local/rlbox-model-files"  # each testbed host has its own /usr/local


@pytest.fixture(scope="module")
def head_model(testbed):
    """verl 0.9.1's environment, and a tiny model made on host 1 only; removed after."""
    _, python = verl_env.environment("0.9.1")
    # torch and transformers imported on the host: 60 s was not enough with four test workers on 2 cores (ci9)
    made = testbed.ssh(1, str(python), str(REPO / "tools" / "make-tiny-model.py"), f"{FOLDER}/tiny", timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    yield testbed
    testbed.ssh(1, "rm", "-rf", "--", FOLDER)


def validate(bed, tmp_path: Path, *sets: str):
    return rlbox("validate", "--verl-version", "0.9.1", "--recipe", "grpo-qwen2.5-0.5b-gsm8k",
                 "--cluster", bed.cluster(1, path=tmp_path / "head.yaml"), "--mount", f"{FOLDER}:/models",
                 "--param", "model_path=/models/tiny", "--set", "algorithm.adv_estimator=gae",
                 "--set", "critic.model.path=/models/tiny", *(a for s in sets for a in ("--set", s)), timeout=900)


def test_the_model_on_the_head_only_is_checked_with_its_files_from_there(head_model, tmp_path):
    bed = head_model
    assert not Path(FOLDER).exists()  # not on this machine
    head = bed.address(1)

    ok = validate(bed, tmp_path, "critic.ppo_micro_batch_size_per_gpu=2")
    assert ok.returncode == 0, ok.stderr[-3000:]
    last = ok.stdout.strip().splitlines()[-1]
    assert last.startswith("valid: verl.trainer.main_ppo") and last.endswith(
        f"the model's files of /models/tiny from {head}"), last
    said = [line for line in ok.stderr.splitlines() if "the model's files of" in line]
    assert len(said) == 1 and re.fullmatch(
        re.escape("rlbox: the model's files of /models/tiny (actor_rollout_ref.model.path, critic.model.path): "
                  "chat_template.jinja, config.json, generation_config.json, tokenizer.json, tokenizer_config.json (")
        + r"\d+ kB" + re.escape(f") from {head}:{FOLDER}/tiny over ssh"), said[0]), ok.stderr[-3000:]
    assert "model.safetensors" not in ok.stderr and "not checked" not in ok.stderr

    # the model-dependent check's own result is the verdict: verl builds the critic and rejects its batch
    bad = validate(bed, tmp_path)
    assert bad.returncode == 2, bad.stderr[-3000:]
    last = bad.stderr.strip().splitlines()[-1]
    assert "verl 0.9.1 rejects this at start-up" in last and "critic.micro_batch_size_per_gpu" in last, last
    assert f"the model's files of /models/tiny from {head}" in last, last
