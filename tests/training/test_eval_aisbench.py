"""rlbox eval with the real AISBench (ais-bench-benchmark 3.1.20260630, from .venv-aisbench, which
.ci/provision installs from tools/aisbench/requirements.lock) on the shipped GSM8K sample.

The endpoint is rlbox's stdlib stub OpenAI server (launcher/rlbox/training/scripts/stub_server.py)
started here as a local process: no Docker, no model. Two model folders whose
rlbox-stub-answers.json make it right on 2 and 6 of the 8 test questions are the "before" and
"after" models. AISBench itself is real: it reads the sample as its GSM8K loader does, sends the
requests, scores them with its own GSM8K evaluator and writes its own result files, which rlbox
parses. (A real vLLM server in front of AISBench was run by hand; its files are the fixture
tests/fixtures/aisbench-3.1.20260630-gsm8k/, parsed in test_units.py.)
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import time

import pytest
import requests

from conftest import REPO, rlbox
from support.stub_models import SAMPLE, TEST_ROWS, free_port, model_dir

pytestmark = [pytest.mark.aisbench, pytest.mark.beside_sims]  # a server on a free port, no simulated host
STUB = REPO / "launcher" / "rlbox" / "training" / "scripts" / "stub_server.py"


@pytest.fixture
def stub_server(tmp_path):
    procs = []

    def start(model, name="tiny"):
        port = free_port()
        log = (tmp_path / f"stub-{port}.log").open("w")
        proc = subprocess.Popen([sys.executable, STUB, "--model", model, "--served-model-name", name,
                                 "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if requests.get(f"{url}/v1/models", timeout=2).ok:
                    return url
            except requests.RequestException:
                time.sleep(0.1)
        raise AssertionError(f"stub server did not answer: {(tmp_path / f'stub-{port}.log').read_text()}")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def ais_datasets(tmp_path):
    """The shipped sample laid out as AISBench's GSM8K loader reads it (gsm8k_gen_0_shot_cot_str:
    path ais_bench/datasets/gsm8k under AIS_BENCH_DATASETS_CACHE, {train,test}.jsonl)."""
    root = tmp_path / "ais"
    (root / "ais_bench" / "datasets" / "gsm8k").mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        shutil.copy(SAMPLE / name, root / "ais_bench" / "datasets" / "gsm8k" / name)
    return root


def test_gsm8k_with_the_real_aisbench_its_files_parsed_and_compared(tmp_path, ais_bench, stub_server, ais_datasets):
    runs = tmp_path / "runs"
    results = {}
    for label, right, repeat in (("before", 2, 1), ("after", 6, 2)):
        url = stub_server(model_dir(tmp_path / f"qwen-{label}", right))
        out = tmp_path / f"{label}.json"
        proc = rlbox("eval", f"qwen-{label}", "--dataset", "gsm8k", "--repeat", repeat, "--endpoint", url,
                     "--max-seq-len", 256, "--max-out-len", 128, "--batch-size", 8, "--ais-bench", ais_bench,
                     "--ais-datasets", ais_datasets, "--runs-dir", runs, "--out", out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        value = 100.0 * right / 8
        assert f"run {repeat}/{repeat}: gsm8k accuracy {value:.2f}" in proc.stderr
        assert "takes no max_seq_len: left out of its config" in proc.stderr  # 3.1's VLLMCustomAPI
        assert f"| gsm8k   | d486ce  | accuracy | gen  | {value:.2f}" in proc.stdout
        res = json.loads(out.read_text())
        assert (res["mean"], res["version"], res["ais_dataset"], res["served_model"]) == (value, "d486ce", "gsm8k_gen_0_shot_cot_str", "tiny")
        assert len(res["runs"]) == repeat
        work = next((runs / "eval").glob(f"qwen-{label}-gsm8k-*"))
        config = (work / "configs/models/vllm_api/vllm_api_general.py").read_text()
        for field in (f"host_port={url.rsplit(':', 1)[1]}", "max_out_len=128", "batch_size=8", "temperature=0.5",
                      "abbr='vllm-api-general'", "type=VLLMCustomAPI"):
            assert field in config, field
        assert "max_seq_len" not in config
        for i, run in enumerate(res["runs"], 1):
            # AISBench's own files, where AISBench puts them: the summary rlbox read, its result and predictions.
            summary = run["summary"]
            assert summary.startswith(str(work / f"outputs/repeat_{i:02d}/")) and summary.endswith(".csv")
            stamp = summary.rsplit("/summary/", 1)[0]
            rows = list(csv.reader(open(summary)))
            assert rows == [["dataset", "version", "metric", "mode", "vllm-api-general"],
                            ["gsm8k", "d486ce", "accuracy", "gen", f"{value:.2f}"]]
            assert json.loads(open(f"{stamp}/results/vllm-api-general/gsm8k.json").read()) == {"accuracy": value}
            preds = [json.loads(line) for line in open(f"{stamp}/predictions/vllm-api-general/gsm8k.jsonl")]
            assert len(preds) == 8 and all(p["success"] for p in preds)
            assert preds[0]["origin_prompt"] == f"Question: {TEST_ROWS[0]['question']}\nLet's think step by step\nAnswer:"
        results[label] = out
    cmp = rlbox("eval", "--compare", results["before"], results["after"])
    assert cmp.returncode == 0, cmp.stderr
    assert "| gsm8k   | d486ce  | accuracy | gen  | 25.00  | 75.00 | +50.00 |" in cmp.stdout, cmp.stdout


def test_bad_gsm8k_input_is_one_line(tmp_path, ais_bench, stub_server, ais_datasets):
    url = stub_server(model_dir(tmp_path / "m", 0))
    base = ("eval", "m", "--dataset", "gsm8k", "--endpoint", url, "--ais-bench", ais_bench, "--runs-dir", tmp_path / "runs")
    gsm8k = ais_datasets / "ais_bench" / "datasets" / "gsm8k"
    (gsm8k / "train.jsonl").unlink()
    proc = rlbox(*base, "--ais-datasets", ais_datasets)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"--ais-datasets {ais_datasets}: no ais_bench/datasets/gsm8k/train.jsonl" in proc.stderr
    shutil.copy(SAMPLE / "train.jsonl", gsm8k / "train.jsonl")
    (gsm8k / "test.jsonl").write_text('{"question": "1+1?", "answer": "2\\n#### 2"}\n{"question": "2+2?"}\n')
    proc = rlbox(*base, "--ais-datasets", ais_datasets)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.strip() == f"rlbox: error: {gsm8k / 'test.jsonl'} line 2: field 'answer' missing or not text"
    (gsm8k / "test.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    proc = rlbox(*base, "--ais-datasets", ais_datasets)
    assert proc.returncode == 2 and "line 1: field 'answer' has no '#### ANSWER'" in proc.stderr
    assert not (tmp_path / "runs" / "eval").exists() or not any((tmp_path / "runs" / "eval").rglob("summary_*.csv"))


def test_the_aisbench_venv_carries_bytecode_for_what_every_run_imports(ais_bench):
    """.ci/provision compiles the AISBench venv's bytecode: the venv is root's and uv writes no .pyc by
    default, so without it every `ais_bench` process (and each worker it starts) compiled torch, transformers
    and datasets from source again (measured: `import transformers, datasets` 14 s of CPU, 8 s with bytecode)."""
    probe = ("import importlib.util, os, sys\n"
             "missing = []\n"
             "for name in ('ais_bench', 'transformers', 'datasets', 'torch'):\n"
             "    src = importlib.util.find_spec(name).origin\n"
             "    if not os.path.isfile(importlib.util.cache_from_source(src)):\n"
             "        missing.append(src)\n"
             "print('\\n'.join(missing))\n")
    python = ais_bench.parent / "python"
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"no bytecode beside these in {ais_bench.parent.parent}:\n{out.stdout}"
