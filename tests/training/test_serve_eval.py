"""rlbox serve --sim + rlbox eval on the simulated node: the stub OpenAI server in a simulated
NPU container, the real AISBench (ais-bench-benchmark 3.1.20260630 from .venv-aisbench, made by
.ci/provision) pointed at it through the server's record (--name), on the shipped GSM8K sample.

The model is a folder whose rlbox-stub-answers.json makes the stub right on 6 of the 8 test
questions. Repeats, --compare, AISBench's own files and bad GSM8K input, without Docker:
test_eval_aisbench.py.
"""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import rlbox
from support.engine import SERVE, names, remove_labelled
from support.stub_models import SAMPLE, free_port, model_dir

pytestmark = [pytest.mark.engine, pytest.mark.aisbench]


def serving(name):
    return names(SERVE, name)


@pytest.fixture
def env(tmp_path, sim_image):
    data = tmp_path / "ais" / "ais_bench" / "datasets" / "gsm8k"
    data.mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        shutil.copy(SAMPLE / name, data / name)
    yield tmp_path
    for name in ("t-before", "t-after", "t-bad"):
        remove_labelled(SERVE, name)


def test_serve_eval(env, ais_bench):
    """One real AISBench run through the server's record (no --endpoint): one is enough here, as
    each costs 30-180 s of AISBench's own start-up on two cores; repeats and --compare are in
    test_eval_aisbench.py."""
    runs, port = env / "runs", free_port()
    model = model_dir(env / "qwen-after", 6, "LlamaForCausalLM")
    name = "t-after"
    proc = rlbox("serve", model, "--sim", "--name", name, "--port", port, "--tp", 8, "--runs-dir", runs, "--timeout", 60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"http://127.0.0.1:{port}/v1"
    assert "SIMULATED: rlbox's stub server, no vLLM" in proc.stderr
    assert serving(name) == [f"rlbox-serve-{name}"]
    again = rlbox("serve", model, "--sim", "--name", name, "--port", port, "--runs-dir", runs)
    assert again.returncode == 2 and f"a server named '{name}' is already there" in again.stderr
    out = env / "after.json"
    proc = rlbox("eval", model, "--dataset", "gsm8k", "--repeat", 1, "--name", name, "--runs-dir", runs,
                 "--max-out-len", 256, "--ais-bench", ais_bench, "--ais-datasets", env / "ais", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run 1/1: gsm8k accuracy 75.00" in proc.stderr
    assert "| gsm8k   | d486ce  | accuracy | gen  | 75.00" in proc.stdout
    res = json.loads(out.read_text())
    assert res["mean"] == 75.0 and len(res["runs"]) == 1 and res["served_model"] == "auto"
    assert res["endpoint"] == f"http://127.0.0.1:{port}"
    assert res["runs"][0]["summary"].endswith(".csv")  # AISBench's own summary file
    config = (next((runs / "eval").glob("qwen-after-gsm8k-*")) / "configs/models/vllm_api/vllm_api_general.py").read_text()
    for field in (f"host_port={port}", "max_out_len=256", "batch_size=48", "temperature=0.5",
                  "top_k=10", "top_p=0.95", "repetition_penalty=1.03", "abbr='vllm-api-general'", "type=VLLMCustomAPI"):
        assert field in config, field
    stop = rlbox("serve", "--stop", "--name", name, "--runs-dir", runs)
    assert stop.returncode == 0 and "removed 1 container(s)" in stop.stdout
    assert serving(name) == []


def test_bad_inputs_are_one_line_and_leave_nothing(env, ais_bench):
    runs, port = env / "runs", free_port()
    empty = env / "not-a-model"
    empty.mkdir()
    proc = rlbox("serve", empty, "--sim", "--name", "t-bad", "--port", port, "--runs-dir", runs, "--timeout", 60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: server container rlbox-serve-t-bad exited (1) before answering: last log line: "
                           f"ValueError: {empty} has no config.json"), last
    assert serving("t-bad") == []
    proc = rlbox("serve", env / "missing", "--sim", "--name", "t-bad", "--runs-dir", runs)
    assert proc.returncode == 2 and proc.stderr.strip() == f"rlbox: error: MODEL {env / 'missing'} is not a folder"
    proc = rlbox("serve", empty, "--sim", "--tp", 16, "--dp", 2, "--name", "t-bad", "--runs-dir", runs)
    assert proc.returncode == 2 and "--tp 16 x --dp 2 needs 32 NPUs; localhost has 16" in proc.stderr
    proc = rlbox("eval", "m", "--endpoint", f"http://127.0.0.1:{port}", "--ais-bench", ais_bench, "--runs-dir", runs, "--repeat", 1)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"endpoint http://127.0.0.1:{port} (--endpoint) does not answer" in proc.stderr
    proc = rlbox("eval", "m", "--dataset", "aime2025x", "--endpoint", f"http://127.0.0.1:{port}", "--ais-bench", ais_bench)
    assert proc.returncode == 2 and "--dataset aime2025x: not one rlbox knows (aime2024, math500, gsm8k)" in proc.stderr
    proc = rlbox("eval", "m", "--name", "nothing", "--runs-dir", runs, "--ais-bench", ais_bench)
    assert proc.returncode == 2 and "no server named 'nothing'" in proc.stderr
    proc = rlbox("serve", "--stop", "--name", "t-bad", "--runs-dir", runs)
    assert proc.returncode == 2 and "no server named 't-bad'" in proc.stderr
