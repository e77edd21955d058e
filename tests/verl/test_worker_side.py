"""verl's worker-side checks before a job: the rollout server verl 0.9.1 starts for vLLM, made as its
replica makes it and launched up to vLLM's engine config, in the image of the CPU training chain
(verl 0.9.1 and vLLM 0.23.0's real CPU build). Each case is a mistake that otherwise shows only once
the workers start (minutes into a run on a cluster): verl's own rejection, vLLM's argument parser's,
vLLM's config's. One container runs them all (``run_many_in_image``); the model is the tiny one,
read through a read-only mount as the head's container would see it.

The NPU is the one thing simulated: an NPU image on a machine with no NPU has no vLLM platform; the
last test takes the CPU platform away inside the container to show that the check then stops before
vLLM and says what it did not run, instead of calling vLLM's refusal a problem.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from rlbox.verl import own as verl_own, outcome
from rlbox.verl.own import Verdict

pytestmark = [pytest.mark.engine, pytest.mark.beside_sims]  # one container of its own image, no simulated host

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "launcher" / "rlbox" / "resources" / "recipes" / "grpo-tiny-cpu-09.yaml"
MODEL = "/data/models/tiny-qwen2"


def recipe_overrides(*extra: str) -> list[str]:
    r = yaml.safe_load(RECIPE.read_text())
    params = {k: str(v["default"]) for k, v in r["params"].items()}
    out = []
    for o in r["overrides"]:
        for k, v in params.items():
            o = o.replace("{{" + k + "}}", v)
        out.append(o)
    return out + list(extra)


def request(*extra: str) -> dict:
    return {"config_rel": "verl/trainer/config", "search_rel": [], "config_name": "ppo_trainer",
            "overrides": recipe_overrides(*extra), "nodes": 2, "npus": 2, "module": "verl.trainer.main_ppo"}


@pytest.fixture(scope="module")
def model(vllm_cpu_image, tmp_path_factory) -> Path:
    from support import verl_cpu

    data = tmp_path_factory.mktemp("worker-side")
    made = verl_cpu.make_model(vllm_cpu_image, data)
    assert made.returncode == 0, made.stderr[-2000:]
    return data / "models" / "tiny-qwen2"


CASES = {  # extra overrides -> (rejected starts with, where starts with) or None for a clean pass
    "clean": ((), None),
    "max_model_len over the model's": (("actor_rollout_ref.rollout.max_model_len=99999",),
                                       ("ValueError: max_model_len (99999) should be less than or equal to "
                                        "max_position_embeddings (2048)", "verl/workers/rollout/vllm_rollout/")),
    "an engine_kwargs key vLLM has not": (("+actor_rollout_ref.rollout.engine_kwargs.vllm.no_such_arg=1",),
                                          ("vLLM's argument parser: unrecognized arguments: --no-such-arg 1",
                                           "verl/workers/rollout/vllm_rollout/")),
    "gpu_memory_utilization over 1": (("actor_rollout_ref.rollout.gpu_memory_utilization=1.5",),
                                      ("ValidationError: 1 validation error for CacheConfig gpu_memory_utilization",
                                       "vllm/")),
    "rollout TP the NPUs per node do not divide": (("actor_rollout_ref.rollout.tensor_model_parallel_size=3",),
                                                   ("AssertionError", "verl/")),
}


@pytest.fixture(scope="module")
def verdicts(vllm_cpu_image, model, client) -> dict[str, Verdict]:
    reqs = [request(*extra) for extra, _ in CASES.values()]
    found = verl_own.run_many_in_image(client, vllm_cpu_image, reqs, mounts=((str(model), MODEL),))
    return dict(zip(CASES, found))


@pytest.mark.parametrize("case", list(CASES))
def test_the_rollout_server_is_checked_to_vllms_engine_config(verdicts, case):
    v, (_, expected) = verdicts[case], CASES[case]
    assert v.verl == "0.9.1"
    assert not v.could_not, v
    if expected is None:
        assert v.rejected is None, v
        assert any("rollout server for vLLM as its replica makes it (vLLMReplica, vLLMHttpServer.launch_server), "
                   "to vLLM's engine config, stopped before the engine starts" in r for r in v.ran), v.ran
        assert any("checks that need the NPUs and the weights" in b for b in v.beyond), v.beyond
        assert verl_own.problems(v) == []
        return
    text, where = expected
    assert (v.rejected or "").startswith(text), v
    assert (v.where or "").startswith(where), v
    (problem,) = verl_own.problems(v)
    said = "vLLM rejects this as verl 0.9.1's rollout server starts it" if where == "vllm/" or "vLLM's" in text \
        else "verl 0.9.1 rejects this at start-up"
    assert str(problem).startswith(f"verl: {said} ({v.where}): {text}"), problem


def test_a_model_the_image_cannot_see_is_not_checked_and_said(vllm_cpu_image, client):
    """No mount: the model path is not in the container; the check stops on the model's files (which
    `rlbox validate` then fetches), not on a rejection."""
    (v,) = verl_own.run_many_in_image(client, vllm_cpu_image, [request()])
    assert v.rejected is None, v
    assert any("model's files" in c for c in v.could_not), v
    assert outcome.Outcome(not_run=tuple(verl_own.not_run(v))).verdict == outcome.PARTLY


def test_with_no_vllm_platform_it_stops_before_vllm_and_says_so(vllm_cpu_image, model):
    """As in an NPU image on a machine with no NPU: vLLM resolves no platform, and cannot even build its
    argument parser (its defaults make a DeviceConfig). Simulated by taking the CPU build's platform
    plugin away in the container before the script runs, and its native ops with it: an NPU image's vLLM is
    built with VLLM_TARGET_DEVICE=empty and has no ``vllm._C``, which vLLM with no platform imports (here the CPU
    build's AVX-512 BF16 ``_C``: on an AVX2-only CPU, exit 132, SIGILL). verl's constructors still run (and reject)."""
    import json

    wrapper = ("import runpy, sys, vllm.platforms as p; p.builtin_platform_plugins['cpu'] = lambda: None; "
               "sys.modules['vllm._C'] = None; "
               "sys.argv = ['verl_checks.py', sys.argv[1]]; runpy.run_path('/checks/verl_checks.py', run_name='__main__')")
    reqs = [request(), request("actor_rollout_ref.rollout.max_model_len=99999")]
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "-e", "TORCH_DEVICE_BACKEND_AUTOLOAD=0",
                           "-v", f"{verl_own.SCRIPT}:/checks/verl_checks.py:ro", "-v", f"{model}:{MODEL}:ro",
                           vllm_cpu_image, "python3", "-c", wrapper, json.dumps(reqs)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    clean, too_long = Verdict.parse_all(proc.stdout, "test", 2)
    assert clean.rejected is None and not clean.could_not, clean
    assert any("(vLLMReplica, vLLMHttpServer: world size, the rollout and model configs" in r for r in clean.ran), clean
    assert any(b.startswith("vLLMHttpServer.launch_server (the rollout config as vLLM's engine arguments and vLLM's "
                            "engine config): vLLM has no platform here") for b in clean.beyond), clean.beyond
    assert (too_long.rejected or "").startswith("ValueError: max_model_len (99999)"), too_long
