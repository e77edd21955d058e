"""rlbox serve --sim + rlbox eval on the simulated node: the stub OpenAI server in a simulated
NPU container, AISBench's config written, run --repeat times, parsed, averaged, compared.

AISBench is the stand-in tests/fixtures/workflow/ais_bench (same CLI, config search, dataset
file, HTTP requests and summary files as ais-bench-benchmark 3.1). The "before" and "after"
models are two model folders whose rlbox-stub-answers.json make the stub right on 2 and 3 of
5 AIME-style questions.
"""

from __future__ import annotations

import json
import socket

import pytest

from conftest import REPO, rlbox
from support.engine import SERVE, names, remove_labelled

pytestmark = pytest.mark.engine
STAND_IN = REPO / "tests" / "fixtures" / "workflow" / "ais_bench"
QUESTIONS = [("Find the number of ordered pairs (a,b) of positive integers with a+b=10.", "9"),
             ("What is 17 times 3?", "51"), ("Compute 2^10 modulo 1000.", "24"),
             ("How many primes are below 20?", "8"), ("What is the sum 1+2+...+20?", "210")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir(path, right: int):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    answers = [{"match": q, "answer": a} for q, a in QUESTIONS[:right]]
    (path / "rlbox-stub-answers.json").write_text(json.dumps(answers))
    return path


def serving(name):
    return names(SERVE, name)


@pytest.fixture
def env(tmp_path, sim_image):
    data = tmp_path / "ais" / "ais_bench" / "datasets" / "aime"
    data.mkdir(parents=True)
    (data / "aime.jsonl").write_text("".join(json.dumps({"origin_prompt": q, "gold_answer": a}) + "\n" for q, a in QUESTIONS))
    yield tmp_path
    for name in ("t-before", "t-after", "t-bad"):
        remove_labelled(SERVE, name)


def test_serve_eval_compare(env):
    runs, port = env / "runs", free_port()
    results = {}
    for label, right in (("before", 2), ("after", 3)):
        model = model_dir(env / f"qwen-{label}", right)
        name = f"t-{label}"
        proc = rlbox("serve", model, "--sim", "--name", name, "--port", port, "--tp", 8, "--runs-dir", runs, "--timeout", 60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"http://127.0.0.1:{port}/v1"
        assert "SIMULATED: rlbox's stub server, no vLLM" in proc.stderr
        assert serving(name) == [f"rlbox-serve-{name}"]
        again = rlbox("serve", model, "--sim", "--name", name, "--port", port, "--runs-dir", runs)
        assert again.returncode == 2 and f"a server named '{name}' is already there" in again.stderr
        out = env / f"{label}.json"
        proc = rlbox("eval", model, "--dataset", "aime2024", "--repeat", 2, "--name", name, "--runs-dir", runs,
                     "--ais-bench", STAND_IN, "--ais-datasets", env / "ais", "--out", out)
        assert proc.returncode == 0, proc.stderr
        assert f"run 2/2: aime2024 accuracy {20.0 * right:.2f}" in proc.stderr
        assert f"| aime2024 | bf198e  | accuracy | gen  | {20.0 * right:.2f}            |" in proc.stdout
        res = json.loads(out.read_text())
        assert res["mean"] == 20.0 * right and len(res["runs"]) == 2 and res["served_model"] == "auto"
        config = (next((runs / "eval").glob(f"qwen-{label}-aime2024-*")) / "configs/models/vllm_api/vllm_api_general.py").read_text()
        for field in (f"host_port={port}", "max_seq_len=2048", "max_out_len=20480", "batch_size=48", "temperature=0.5",
                      "top_k=10", "top_p=0.95", "repetition_penalty=1.03", "abbr='vllm-api-general'", "type=VLLMCustomAPI"):
            assert field in config, field
        stop = rlbox("serve", "--stop", "--name", name, "--runs-dir", runs)
        assert stop.returncode == 0 and "removed 1 container(s)" in stop.stdout
        assert serving(name) == []
        results[label] = out
    cmp = rlbox("eval", "--compare", results["before"], results["after"])
    assert cmp.returncode == 0, cmp.stderr
    assert cmp.stdout.splitlines()[0].split("|")[1:-1] == [" dataset  ", " version ", " metric   ", " mode ", " before ",
                                                           " after ", " gain   "]
    assert "| aime2024 | bf198e  | accuracy | gen  | 40.00  | 60.00 | +20.00 |" in cmp.stdout


def test_bad_inputs_are_one_line_and_leave_nothing(env):
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
    proc = rlbox("eval", "m", "--endpoint", f"http://127.0.0.1:{port}", "--ais-bench", STAND_IN, "--runs-dir", runs, "--repeat", 1)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert f"endpoint http://127.0.0.1:{port} (--endpoint) does not answer" in proc.stderr
    proc = rlbox("eval", "m", "--dataset", "aime2025x", "--endpoint", f"http://127.0.0.1:{port}", "--ais-bench", STAND_IN)
    assert proc.returncode == 2 and "--dataset aime2025x: not one rlbox knows (aime2024, math500)" in proc.stderr
    proc = rlbox("eval", "m", "--name", "nothing", "--runs-dir", runs, "--ais-bench", STAND_IN)
    assert proc.returncode == 2 and "no server named 'nothing'" in proc.stderr
    proc = rlbox("serve", "--stop", "--name", "t-bad", "--runs-dir", runs)
    assert proc.returncode == 2 and "no server named 't-bad'" in proc.stderr
