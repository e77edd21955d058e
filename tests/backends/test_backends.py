"""The one backend interface of `rlbox run`: every backend by name, each refusing the options of
another in one line, and `--backend slurm --dry-run` printing the batch script and the per-node
commands without touching anything (no Slurm, no host)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlbox.backends import base
from rlbox.core.errors import RlboxError


@pytest.mark.parametrize("name", base.NAMES)
def test_every_backend_has_the_shape(name):
    backend = base.get(name)
    assert isinstance(backend, base.Backend) and backend.name == name
    for method in ("plan", "submit", "stop", "check_options"):
        assert callable(getattr(backend, method))


@pytest.mark.parametrize("name, opts, line", [
    ("hosts", base.RunOptions(partition="p"), "--partition: not an option of --backend hosts (it goes with --backend slurm)"),
    ("hosts", base.RunOptions(k8s_profile="x.yaml"), "--k8s-profile: not an option of --backend hosts (it goes with --backend kuberay)"),
    ("slurm", base.RunOptions(detach=True), "--detach: not an option of --backend slurm (it goes with --backend hosts)"),
    ("slurm", base.RunOptions(queue="q"), "--queue: not an option of --backend slurm (it goes with --backend kuberay)"),
    ("kuberay", base.RunOptions(time="10"), "--time: not an option of --backend kuberay (it goes with --backend slurm)"),
    ("kuberay", base.RunOptions(keep=True), "--detach, --keep, --replace and --no-doctor are for --backend hosts"),
])
def test_options_of_another_backend_are_one_line(name, opts, line):
    with pytest.raises(RlboxError) as e:
        base.get(name).check_options(opts)
    assert str(e.value).startswith(line)


@pytest.mark.parametrize("name, opts", [
    ("hosts", base.RunOptions(detach=True, keep=True, replace=True, no_doctor=True)),
    ("slurm", base.RunOptions(partition="p", time="10", gres_npus=True, replace=True)),
    ("kuberay", base.RunOptions(k8s_profile="x.yaml", scheduler="volcano", queue="q", deadline=5)),
])
def test_own_options_pass(name, opts):
    base.get(name).check_options(opts)


def test_backend_of_a_run(tmp_path):
    assert base.of_run(tmp_path) == "hosts"
    (tmp_path / "slurm.json").write_text("{}")
    assert base.of_run(tmp_path) == "slurm"


def _rlbox(*args):
    return subprocess.run([sys.executable, "-m", "rlbox.cli", *args], capture_output=True, text=True, timeout=120)


def test_slurm_dry_run_prints_the_batch_script_and_the_node_commands(tmp_path):
    proc = _rlbox("run", "--backend", "slurm", "--nodes", "2", "--partition", "npu", "--time", "30", "--smoke-test",
                  "--hardware", "a3", "--image", "localhost/rlbox/sim:amd64", "--name", "sl-dry", "--runs-dir", tmp_path,
                  "--dry-run")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "#SBATCH --nodes=2" in out and "#SBATCH --partition=npu" in out and "#SBATCH --time=30" in out
    assert "sbatch --parsable --job-name=rlbox-sl-dry --nodes=2 --exclusive" in out
    assert "slurm-node1" in out and "slurm-node2" in out and "docker run --detach --name rlbox-sl-dry-node0" in out
    assert "ray start" in out and "scancel" in out
    assert not any(tmp_path.iterdir())  # touched nothing


@pytest.mark.parametrize("args, line", [
    (("--backend", "slurm", "--smoke-test"), "rlbox: error: --backend slurm: give --nodes N"),
    (("--backend", "slurm", "--nodes", "2", "--hosts", "a,b", "--smoke-test"), "rlbox: error: --backend slurm takes its nodes from Slurm"),
    (("--backend", "slurm", "--nodes", "2", "--partition", "a;b", "--smoke-test"), "rlbox: error: --partition 'a;b': a partition name"),
    (("--backend", "hosts", "--sim", "--nodes", "1", "--time", "5", "--smoke-test"), "rlbox: error: --time: not an option of --backend hosts"),
])
def test_bad_slurm_runs_are_one_line(tmp_path, args, line):
    proc = _rlbox("run", *args, "--image", "localhost/rlbox/sim:amd64", "--hardware", "a3", "--runs-dir", tmp_path, "--dry-run")
    assert proc.returncode != 0 and proc.stderr.startswith(line) and "Traceback" not in proc.stderr, proc.stderr
