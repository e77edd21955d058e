"""What rlbox knows of a verl job's command line and its resume line (launcher/rlbox/verl/job.py)."""

from __future__ import annotations

import pytest

from rlbox.core.errors import RlboxError
from rlbox.verl import job as verl_job


@pytest.mark.parametrize("argv, verl", [
    (["python3", "-m", "verl.trainer.main_ppo", "a=1"], True),
    (["python3", "-m", "recipe.dapo.main_dapo"], True),
    (["python3", "job.py", "-m"], False),
    (["python3", "-m", "verlish"], False),
])
def test_a_verl_job_is_one_that_runs_a_verl_module(argv, verl):
    assert verl_job.is_verl(argv) is verl
    if not verl:
        with pytest.raises(RlboxError, match="validate: give a verl job"):
            verl_job.required(argv)


def test_the_cluster_sets_the_trainers_shape_and_a_conflict_is_refused():
    argv = ["python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2"]
    assert verl_job.sized(argv, 2, 8)[-1] == "trainer.n_gpus_per_node=8"
    with pytest.raises(RlboxError, match="trainer.nnodes=2 conflicts with the cluster"):
        verl_job.sized(argv, 4, 8)


def test_a_restart_resumes_a_verl_job_and_leaves_any_other_command():
    argv = ["python3", "-m", "verl.trainer.main_ppo", "trainer.resume_mode=disable", "a.b=1"]
    assert verl_job.resuming(argv) == ["python3", "-m", "verl.trainer.main_ppo", "a.b=1", "trainer.resume_mode=auto"]
    assert verl_job.resuming(["python3", "job.py", "trainer.resume_mode=disable"])[-1] == "trainer.resume_mode=disable"


@pytest.mark.parametrize("text, step", [
    ("(TaskRunner pid=12, ip=10.0.0.1) Setting global step to 40\n", 40),
    # verl 0.9.1 (trainer/ppo/v1): one logged line
    ("(TaskRunnerV1 pid=672) INFO:2026-11-26 18:07:15,708:Resuming from /data/checkpoints/x/global_step_2, "
     "setting global step to 2\n", 2),
    ("Load from checkpoint folder: /ckpt/global_step_40\n", None),
    ("Training from scratch\n", None),
])
def test_resumed_step_reads_verls_line(text, step):
    assert verl_job.resumed_step(text) == step
