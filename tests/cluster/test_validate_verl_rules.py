"""The restated start-up checks of the pinned verl 796871d (what `rlbox validate` applies to the
verl_pt27_25rc3 images, whose label names that commit), restart resumability and unknown-key
precedence, one case per rule, composed over the verl 0.5.0 wheel's config tree (the release
nearest 796871d, standing in for its checkout, which CI cannot fetch; see
docs/research/verl-startup-and-ray.md for each rule's file:line at both pinned commits). verl
0.5.0 itself gets no pinned commit's rules: tests/cluster/test_validate_verl_own.py."""

from __future__ import annotations

from pathlib import Path

import yaml

import pytest

from dataclasses import replace

from rlbox.verl import rules as verl_rules, validate

MAIN_PPO = ["python3", "-m", "verl.trainer.main_ppo"]
# valid for verl at both commits on 1 x 8 NPUs (the research's BASE)
BASE = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "verl_rules" / "base.yaml").read_text())
A = "actor_rollout_ref.actor."


@pytest.fixture(scope="module")
def verl050():
    return replace(validate.from_wheel("0.5.0"), commit=verl_rules.A, version=None)


def check(tree, extra, **kw):
    return [str(p) for p in validate.check(tree, MAIN_PPO + BASE + extra, 1, 8, **kw)]


def test_base_is_valid(verl050):
    assert check(verl050, []) == []


RULES = [
    ("A1 hybrid engine", ["actor_rollout_ref.hybrid_engine=False"], "Currently, only support hybrid engine"),
    ("A3 real batch", ["data.train_batch_size=3", f"{A}ppo_mini_batch_size=2"],
     "real_train_batch_size (15) must be divisible by minimal possible batch size (8)"),
    ("A5 both micro", [f"{A}ppo_micro_batch_size=8"], "[actor] You have set both 'actor.ppo_micro_batch_size' AND"),
    ("A6 no micro", [f"{A}ppo_micro_batch_size_per_gpu=null"], "[actor] Please set at least one of 'actor.ppo_micro_batch_size'"),
    ("A7 loss agg", [f"{A}loss_agg_mode=seq-mean"], "Invalid loss_agg_mode: seq-mean"),
    ("A8 batch < mini", ["data.train_batch_size=32"], "train_batch_size (32) must be >= actor.ppo_mini_batch_size (64)"),
    ("A11 sp without remove padding", [f"{A}ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=False"],
     "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`."),
    ("A12 warmup style", [f"{A}optim.warmup_style=linear"], "warmup_style 'linear'"),
    ("A14 ref micro missing", ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null"],
     "[actor_rollout_ref.ref] Please set at least one of"),
    ("A15 rollout micro both", ["actor_rollout_ref.rollout.log_prob_micro_batch_size=8"],
     "[actor_rollout_ref.rollout] You have set both"),
    ("A22 val temperature", ["actor_rollout_ref.rollout.val_kwargs.do_sample=True", "actor_rollout_ref.rollout.temperature=0"],
     "validation gen temperature should be greater than 0 when enabling do_sample"),
    ("W2 normalized micro", [f"{A}ppo_micro_batch_size_per_gpu=16"],
     "normalized ppo_mini_batch_size 40 should be divisible by ppo_micro_batch_size_per_gpu 16"),
    ("W7 rollout tp", ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"], "rollout world_size: 8 is not divisible by infer_tp: 3"),
]


@pytest.mark.parametrize("case, extra, expected", RULES, ids=[r[0] for r in RULES])
def test_verl_start_up_rule(verl050, case, extra, expected):
    problems = check(verl050, extra)
    assert any(expected in p and "rejects this at start-up" in p for p in problems), problems


def test_the_ref_rule_needs_a_reference_policy(verl050):
    assert check(verl050, ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null", f"{A}use_kl_loss=False"]) == []


RESUME = [
    ("save_freq default", [], (), "trainer.save_freq: is -1: with --max-restarts 2 a restart resumes from a checkpoint"),
    ("relative dir", ["trainer.save_freq=10"], (("/ckpt", True),), "is inside the container and dies with it"),
    ("dir on no mount", ["trainer.save_freq=10", "trainer.default_local_dir=/data/ck"], (("/ckpt", True),),
     "/data/ck is not on a mount every node has"),
    ("megatron needs one mount", ["trainer.save_freq=10", "trainer.default_local_dir=/ckpt/run", f"{A}strategy=megatron"],
     (("/ckpt", False),), "/ckpt/run is not on a mount that is the same on every node (Megatron)"),
]


@pytest.mark.parametrize("case, extra, mounts, expected", RESUME, ids=[r[0] for r in RESUME])
def test_restarts_that_cannot_resume_are_refused(verl050, case, extra, mounts, expected):
    problems = check(verl050, extra, restarts=2, mounts=mounts)
    assert any(expected in p for p in problems), problems


def test_restarts_that_can_resume_pass(verl050):
    ok = ["trainer.save_freq=10", "trainer.default_local_dir=/ckpt/run"]
    assert check(verl050, ok, restarts=2, mounts=(("/ckpt", False),)) == []
    assert check(verl050, [], restarts=0) == []  # no restarts: nothing to resume


@pytest.mark.parametrize("override, nearest, also", [
    # ppo_trainer has no filter_groups at all: unknown (no near key), and the DAPO rule too
    ("algorithm.filter_groups.enabel=True", "", "filter_groups is a DAPO setting"),
    ("~actor_rollout_ref.actor.ppo_micro_batch_size_per_gpus", "; did you mean actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu?", None),
    ("trainer.n_gpus_per_nodes=8", "; did you mean trainer.n_gpus_per_node?", None),
])
def test_an_unknown_key_is_always_named_with_the_nearest(verl050, override, nearest, also):
    problems = check(verl050, [override])
    key = override.lstrip("~").split("=")[0]
    assert any(p.startswith(f"{key}: unknown key in ppo_trainer{nearest}") for p in problems), problems
    if also:
        assert any(also in p for p in problems)


def test_a_new_key_under_a_node_verl_builds_into_a_dataclass_is_refused(verl050):
    # verl instantiates `algorithm` (its _target_) into AlgoConfig, which takes no unknown field;
    # under a plain mapping (data) `+key` is how extra keys are passed, and stays accepted
    problems = check(verl050, ["+algorithm.kl_penalti=kl"])
    assert len(problems) == 1 and problems[0].startswith(
        "algorithm.kl_penalti: unknown field: verl builds algorithm into verl.trainer.config.AlgoConfig, "
        "which rejects it at start-up; did you mean algorithm.kl_penalty?"), problems
    assert check(verl050, ["+data.gen_batch_size=64"]) == []


@pytest.mark.parametrize("override, refused", [
    # verl 0.9.1's RolloutConfig declares enable_sleep_mode (workers/config/rollout.py:268) though its YAML
    # leaves it out: `+` adds it and verl takes it (the CPU recipe turns vLLM's sleep mode off this way)
    ("+actor_rollout_ref.rollout.enable_sleep_mode=False", False),
    ("+actor_rollout_ref.rollout.enable_sleep_mod=False", True),
])
def test_a_field_the_dataclass_declares_but_the_yaml_leaves_out_is_taken(override, refused):
    tree = replace(validate.from_wheel("0.9.1"), version=None)  # rlbox's own checks only, read from the wheel
    assert validate.declared_fields(tree, "verl.workers.config.RolloutConfig", "enable_sleep_mode") is True
    assert validate.declared_fields(tree, "verl.workers.config.RolloutConfig", "enable_sleep_mod") is False
    assert validate.declared_fields(tree, "verl.workers.config.NoSuchConfig", "x") is None
    problems = [str(p) for p in validate.examine(tree, MAIN_PPO + [override], own=lambda *a, **k: None).problems]
    assert any("unknown field" in p for p in problems) is refused, problems
