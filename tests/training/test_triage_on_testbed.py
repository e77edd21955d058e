"""A verl job whose data path verl cannot open, triaged with its fix, on the hosts path: `rlbox run
--cluster` on two testbed hosts (the session's testbed; tests/conftest.py), one NPU of each, pre-flight on.
verl 0.5.0's own start-up (release verl_cpu with the verl-cpu-shims stand-in, the recipe grpo-tiny-cpu)
fails at its dataset; `rlbox triage` reads the run's log and names the finding, the path and its fix.

The job needs verl only as far as its data, so it runs on the smaller release (1.93 GB, delivered to the two
hosts by `rlbox run` itself): with the 7.4 GB verl 0.9.1 + vLLM image of the training chain
(tests/training/test_cpu_training.py) this one test took 1042-1134 s of CI, most of it that delivery.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, rlbox
from support import verl_cpu

pytestmark = pytest.mark.engine

PREFIX = "tg-"
HOSTS = (1, 2)  # of the session's testbed: host 1 the head, host 2 the worker


def test_a_data_path_verl_cannot_open_is_triaged_with_its_fix(testbed, cpu_release_image, tmp_path):
    # the mount every node has (/data), a folder every testbed host sees at its path: a tiny random Qwen2 (its
    # tokenizer is read before the data) and the GSM8K-format sample converted by `rlbox data prepare`
    (tmp_path / "shared").mkdir()
    (tmp_path / "hub").mkdir()
    shared = verl_cpu.shared_folder(verl_cpu.image(), tmp_path / "shared", tmp_path / "hub")
    runs, name = tmp_path / "runs", f"{PREFIX}nodata"
    with testbed.runs_left_none(PREFIX) as bed:
        proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "run", "--cluster", bed.cluster(*HOSTS),
                               "--image", verl_cpu.image(), "--recipe", "grpo-tiny-cpu", "--mount", f"{shared}:/data",
                               "--name", name, "--runs-dir", str(runs), "--timeout", "1500",
                               # 8 CPUs for Ray: verl's TaskRunner and its bundles (Ray would detect this machine's 2)
                               "--devices", "1", "--num-cpus", "8",
                               "--param", "train_files=/data/datasets/gsm8k/trian.parquet"],
                              cwd=REPO, text=True, capture_output=True, timeout=2400)
        assert proc.returncode != 0, proc.stderr[-3000:]
        report = rlbox("triage", name, "--runs-dir", str(runs))
        assert "data-file-missing" in report.stdout + report.stderr, report.stdout[-3000:]
        assert "/data/datasets/gsm8k/trian.parquet" in report.stdout
        assert bed.leftovers(name) == []
