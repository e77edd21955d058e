"""What the tests of serving and evaluation share: a free loopback port, the shipped GSM8K sample, and
model folders the stub OpenAI server (launcher/rlbox/training/scripts/stub_server.py) answers from."""

from __future__ import annotations

import json
import socket
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "fixtures" / "gsm8k-sample"
TEST_ROWS = [json.loads(line) for line in (SAMPLE / "test.jsonl").read_text().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir(path: Path, right: int, architecture: str = "Qwen2ForCausalLM") -> Path:
    """A model folder the stub answers the first ``right`` test questions of correctly."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    answers = [{"match": r["question"], "answer": r["answer"].split("#### ")[1]} for r in TEST_ROWS[:right]]
    (path / "rlbox-stub-answers.json").write_text(json.dumps(answers))
    return path
