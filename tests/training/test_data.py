"""rlbox data prepare inside the verl_cpu release image, against a local HTTP server laid out like
Hugging Face's resolve/main URLs (so --endpoint URL is the real switch), with tiny datasets
made here: downloads, gsm8k and geo3k conversions, skip-when-present, --overwrite, a custom
JSON mapping (seed 001's DianJin example), and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import rlbox
from support.engine import TASK, names
from support.hub import Hub

pytestmark = pytest.mark.engine


@pytest.fixture
def hub(tmp_path):
    h = Hub(tmp_path / "hub")
    h.put("BytedTsinghua-SIA/AIME-2024", "data/aime-2024.parquet", [{"prompt": [{"role": "user", "content": "q"}], "x": 1}])
    h.put("openai/gsm8k", "main/train-00000-of-00001.parquet",
          [{"question": "Tom has 3 apples and buys 1,204 more. How many?", "answer": "3 + 1204 = 1207\n#### 1,207"},
           {"question": "What is 2 - 5?", "answer": "2 - 5 = -3\n#### -3"}])
    h.put("openai/gsm8k", "main/test-00000-of-00001.parquet", [{"question": "1+1?", "answer": "#### 2"}])
    img = [{"bytes": b"\x89PNG fake", "path": None}]
    for split in ("train", "test"):
        h.put("hiyouga/geometry3k", f"data/{split}-00000-of-00001.parquet",
              [{"images": img, "problem": "<image>Find x.", "answer": "12"}])
    yield h
    h.server.shutdown()


def test_download_convert_skip_overwrite(hub, tmp_path, cpu_release_image):
    out = tmp_path / "datasets"
    proc = rlbox("data", "prepare", "aime-2024", "--image", cpu_release_image, "--out", out, "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(out / "aime-2024.parquet").to_pylist() == [{"prompt": [{"role": "user", "content": "q"}], "x": 1}]
    assert hub.gets == ["/datasets/BytedTsinghua-SIA/AIME-2024/resolve/main/data/aime-2024.parquet"]

    proc = rlbox("data", "prepare", "gsm8k", "--image", cpu_release_image, "--out", out, "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    train = pq.read_table(out / "gsm8k" / "train.parquet").to_pylist()
    assert [r["reward_model"] for r in train] == [{"style": "rule", "ground_truth": "1207"}, {"style": "rule", "ground_truth": "-3"}]
    assert train[0]["prompt"] == [{"role": "user", "content": 'Tom has 3 apples and buys 1,204 more. How many? '
                                   'Let\'s think step by step and output the final answer after "####".'}]
    assert train[0]["data_source"] == "openai/gsm8k" and train[0]["ability"] == "math"
    assert train[1]["extra_info"] == {"split": "train", "index": 1, "answer": "2 - 5 = -3\n#### -3", "question": "What is 2 - 5?"}
    assert pq.read_table(out / "gsm8k" / "test.parquet").num_rows == 1

    before = len(hub.gets)
    again = rlbox("data", "prepare", "gsm8k", "--image", cpu_release_image, "--out", out, "--endpoint", hub.url)
    assert again.returncode == 0 and len(hub.gets) == before
    assert again.stdout.count("skip ") == 2 and "2 skipped" in again.stderr
    hub.put("openai/gsm8k", "main/test-00000-of-00001.parquet", [{"question": "2+2?", "answer": "#### 4"}] * 3)
    redo = rlbox("data", "prepare", "gsm8k", "--image", cpu_release_image, "--out", out, "--endpoint", hub.url, "--overwrite")
    assert redo.returncode == 0 and len(hub.gets) == before + 2
    assert pq.read_table(out / "gsm8k" / "test.parquet").num_rows == 3

    proc = rlbox("data", "prepare", "geo3k", "--image", cpu_release_image, "--out", out, "--endpoint", hub.url)
    assert proc.returncode == 0, proc.stderr
    row = pq.read_table(out / "geo3k" / "train.parquet").to_pylist()[0]
    assert row["images"] == [{"bytes": b"\x89PNG fake", "path": None}]
    assert row["prompt"][0]["content"].startswith("<image>Find x. You FIRST think about the reasoning process")
    assert row["reward_model"]["ground_truth"] == "12" and row["data_source"] == "hiyouga/geometry3k"


def test_custom_mapping_dianjin_style(tmp_path, cpu_release_image):
    src = tmp_path / "DianJin" / "cflue_mcq.json"
    src.parent.mkdir()
    records = [{"instruction": "Which is right?\nA. x\nB. y\nC. z\nD. w", "output": "<think>...</think>\n<answer>\nso \\boxed{D}\n</answer>"},
               {"instruction": "Pick two.", "output": "<answer>\\boxed{AC}</answer>"}]
    src.write_text(json.dumps(records, ensure_ascii=False))
    spec = tmp_path / "dianjin.yaml"
    spec.write_text(
        "input: DianJin/cflue_mcq.json\n"
        "output: dianjin/train.parquet\n"
        "data_source: ./cflue_mcq.json\n"
        "ability: finantial\n"
        "prompt: instruction\n"
        "answer: output\n"
        "ground_truth:\n"
        "  extract: ['<answer>(.*?)</answer>', '\\\\boxed\\{(.*?)\\}']\n"
        "  choices: ABCDEFG\n"
    )
    out = tmp_path / "datasets"
    dry = rlbox("data", "prepare", "custom", "--spec", spec, "--image", cpu_release_image, "--out", out, "--dry-run")
    assert dry.returncode == 0 and f"--volume {src.parent}:{src.parent}:ro" in dry.stdout
    proc = rlbox("data", "prepare", "custom", "--spec", spec, "--image", cpu_release_image, "--out", out)
    assert proc.returncode == 0, proc.stderr
    rows = pq.read_table(out / "dianjin" / "train.parquet").to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["D", "AC"]
    assert rows[0] == {"data_source": "./cflue_mcq.json", "prompt": [{"role": "user", "content": records[0]["instruction"]}],
                       "ability": "finantial", "reward_model": {"style": "rule", "ground_truth": "D"},
                       "extra_info": {"split": "train", "index": 0, "answer": records[0]["output"],
                                      "question": records[0]["instruction"]}}
    spec.write_text(spec.read_text().replace("prompt: instruction", "prompt: question"))
    bad = rlbox("data", "prepare", "custom", "--spec", spec, "--image", cpu_release_image, "--out", out, "--overwrite")
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1
    assert "record 0: no field 'question' (the spec's prompt); it has: instruction, output" in bad.stderr


def test_bad_inputs_are_one_line(hub, tmp_path, cpu_release_image):
    out = tmp_path / "d"
    proc = rlbox("data", "prepare", "gsm8", "--image", cpu_release_image, "--out", out)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "rlbox: error: unknown dataset 'gsm8' (did you mean 'gsm8k'?); known: dapo-math-17k, aime-2024, gsm8k, geo3k, "
        "custom (rlbox data list)")
    proc = rlbox("data", "prepare", "dapo-math-17k", "--image", cpu_release_image, "--out", out, "--endpoint", hub.url)
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "HTTP 404" in proc.stderr and "/datasets/BytedTsinghua-SIA/DAPO-Math-17k/resolve/main/data/dapo-math-17k.parquet" in proc.stderr
    proc = rlbox("data", "prepare", "aime-2024", "--image", cpu_release_image, "--out", out, "--endpoint", "http://127.0.0.1:9")
    assert proc.returncode == 3 and "cannot reach it" in proc.stderr and proc.stderr.count("\n") == 1
    proc = rlbox("data", "prepare", "geo3k", "--image", cpu_release_image, "--out", out, "--endpoint", "modelscope", "--dry-run")
    assert proc.returncode == 2 and "has no known ModelScope location" in proc.stderr
    dry = rlbox("data", "prepare", "dapo-math-17k", "--image", cpu_release_image, "--out", out, "--endpoint", "modelscope", "--dry-run")
    assert ("https://www.modelscope.cn/api/v1/datasets/AI-ModelScope/DAPO-Math-17k/repo?Revision=master&FilePath="
            "data/dapo-math-17k.parquet") in dry.stdout
    dry = rlbox("data", "prepare", "dapo-math-17k", "--image", cpu_release_image, "--out", out, "--endpoint", "hf-mirror", "--dry-run")
    assert "https://hf-mirror.com/datasets/BytedTsinghua-SIA/DAPO-Math-17k/resolve/main/data/dapo-math-17k.parquet" in dry.stdout
    assert names(TASK, "data") == []
