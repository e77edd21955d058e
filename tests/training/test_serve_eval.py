"""rlbox serve --sim on the simulated node: the stub OpenAI server in a simulated NPU container, its
record (what `rlbox eval --name` evaluates), refusals and bad input; eval's own bad input against the real
AISBench (ais-bench-benchmark 3.1.20260630 from .venv-aisbench, made by .ci/provision).

The real AISBench against a real server found through its record: the CPU training chain
(test_cpu_training.py). Repeats, --compare, AISBench's own files and bad GSM8K input, without Docker:
test_eval_aisbench.py.
"""

from __future__ import annotations

import shutil

import pytest
import requests

from conftest import rlbox
from rlbox.training import evaluate
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


def test_serve_eval(env):
    """The simulated server's life (start, refused twice, found through its record by eval, stopped). The
    real AISBench through a server's record runs once, against vLLM's real server, in the CPU training chain
    (test_cpu_training.py); repeats and --compare in test_eval_aisbench.py; the AISBench config's seed
    fields in test_units.py: each AISBench run costs 30-180 s of its own start-up on two cores."""
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
    endpoint = evaluate.endpoint_for(None, runs, name)  # what `rlbox eval --name` evaluates
    assert endpoint.url == f"http://127.0.0.1:{port}" and f"rlbox serve --name {name}" in endpoint.source
    assert evaluate.check_endpoint(endpoint) == "auto"  # the stub answers /v1/models with its served name
    answer = requests.post(f"{endpoint.url}/v1/completions", json={"model": "auto", "prompt": "Question: 1+1?",
                                                                    "max_tokens": 8}, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"], answer.text[:500]
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
