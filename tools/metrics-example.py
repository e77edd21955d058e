#!/usr/bin/env python3
"""Regenerate docs/metrics-example.png: a synthetic 60-step verl job log (verl's console-logger
format, as Ray prefixes it in a job log), read back and drawn by `rlbox metrics --plot`.
The numbers are made up (seeded), shaped like seed 001's DAPO run: rewards rising from about
-0.4, responses lengthening, steps of about half an hour."""

import math
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
rng = random.Random(7)
lines = []
for step in range(1, 61):
    progress = 1 - math.exp(-step / 25)
    values = {
        "critic/rewards/mean": -0.41 + 0.75 * progress + rng.gauss(0, 0.06),
        "response_length/mean": 7385 + 2600 * progress + rng.gauss(0, 250),
        "perf/throughput": 69.4 + 6 * progress + rng.gauss(0, 2.5),
        "timing_s/step": 1738 + 500 * progress + rng.gauss(0, 60),
        "actor/entropy": 0.315 - 0.08 * progress + rng.gauss(0, 0.01),
    }
    text = " - ".join([f"step:{step}", *(f"{k}:np.float64({v!r})" for k, v in values.items())])
    lines.append(f"\x1b[36m(TaskRunner pid=48213, ip=10.0.0.2)\x1b[0m {text}")
with tempfile.TemporaryDirectory() as tmp:
    log = Path(tmp) / "dapo-qwen3-32b-example.log"
    log.write_text("\n".join(lines) + "\n")
    sys.exit(subprocess.call([sys.executable, "-m", "rlbox.cli", "metrics", str(log),
                              "--plot", str(REPO / "docs" / "metrics-example.png")], cwd=REPO))
