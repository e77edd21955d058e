"""Validation of verl overrides against real verl configs (PyPI wheels, and the verl in an image)."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import docker
import pytest

from conftest import rlbox
from support.engine import leftovers
from rlbox.cluster import recipes
from rlbox.verl import validate

MAIN_PPO = ["python3", "-m", "verl.trainer.main_ppo"]
DAPO = ["python3", "-m", "recipe.dapo.main_dapo"]
CLUSTER = ["trainer.nnodes=4", "trainer.n_gpus_per_node=16", "trainer.device=npu"]


@pytest.fixture(scope="module")
def verl050(tmp_path_factory):
    return validate.from_wheel("0.5.0")


@pytest.fixture(scope="module")
def verl_source(verl050, tmp_path_factory):
    """A verl source tree: the 0.5.0 wheel's package plus a DAPO recipe entry and config.

    recipe/ is not in verl's wheels (only in its git source); this stand-in has the same
    shape as recipe/dapo at verl 796871d: an @hydra.main entry and a config that extends
    ppo_trainer through a relative searchpath and adds the DAPO-only keys."""
    root = tmp_path_factory.mktemp("verl-src")
    shutil.copytree(verl050.root / "verl", root / "verl")
    dapo = root / "recipe" / "dapo"
    (dapo / "config").mkdir(parents=True)
    (dapo / "main_dapo.py").write_text('@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)\ndef main(config):\n    pass\n')
    (dapo / "config" / "dapo_trainer.yaml").write_text(textwrap.dedent("""\
        hydra:
          searchpath:
            - file://verl/trainer/config
        defaults:
          - ppo_trainer
          - _self_
        data:
          gen_batch_size: ${data.train_batch_size}
        reward_model:
          reward_manager: dapo
          overlong_buffer: {enable: false, len: 0, penalty_factor: 0.0, log: false}
        algorithm:
          filter_groups: {enable: false, metric: null, max_num_gen_batches: 0}
        trainer:
          project_name: verl-dapo
    """))
    return validate.from_folder(root)


BROKEN = [
    ("seed typo tainer", MAIN_PPO + ["tainer.device=npu"], "tainer.device: unknown key in ppo_trainer; did you mean trainer.device?"),
    ("seed typo actor_rolloput_ref", MAIN_PPO + CLUSTER + ["actor_rolloput_ref.rollout.n=5"],
     "actor_rolloput_ref.rollout.n: unknown key in ppo_trainer; did you mean actor_rollout_ref.rollout.n?"),
    ("seed typo alogorithm", MAIN_PPO + CLUSTER + ["alogorithm.filter_groups.enable=True"],
     "alogorithm.filter_groups.enable: unknown key in ppo_trainer; did you mean algorithm?"),
    ("filter_groups without DAPO", MAIN_PPO + CLUSTER + ["algorithm.filter_groups.enable=True"],
     "algorithm.filter_groups.enable: filter_groups is a DAPO setting: it needs the DAPO entrypoint"),
    ("type", MAIN_PPO + ["trainer.nnodes=four", "trainer.n_gpus_per_node=16", "trainer.device=npu"],
     "trainer.nnodes: 'four' is not a number (the default is 1)"),
    ("bool type", MAIN_PPO + CLUSTER + ["actor_rollout_ref.model.enable_gradient_checkpointing=maybe"],
     "actor_rollout_ref.model.enable_gradient_checkpointing: 'maybe' is not a boolean"),
    ("npus", MAIN_PPO + ["trainer.nnodes=2", "trainer.n_gpus_per_node=16", "trainer.device=npu"],
     "trainer.nnodes, trainer.n_gpus_per_node: 2 x 16 = 32 NPUs, but the cluster has 4 x 16 = 64"),
    ("device", MAIN_PPO + ["trainer.nnodes=4", "trainer.n_gpus_per_node=16"],
     "trainer.device: is 'cuda'; Ascend runs need trainer.device=npu"),
    ("tp", MAIN_PPO + CLUSTER + ["actor_rollout_ref.rollout.tensor_model_parallel_size=3"],
     "rollout tensor parallel size 3 does not divide 16 NPUs per node"),
    ("sp", MAIN_PPO + CLUSTER + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=5"],
     "ulysses sequence parallel size 5 does not divide 64 NPUs"),
    ("batch", MAIN_PPO + CLUSTER + ["data.train_batch_size=100", "actor_rollout_ref.actor.ppo_mini_batch_size=64"],
     "train_batch_size 100 is not divisible by ppo_mini_batch_size 64"),
    ("token cap", MAIN_PPO + CLUSTER + ["actor_rollout_ref.actor.use_dynamic_bsz=True", "data.max_prompt_length=2048",
                                        "data.max_response_length=20480", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
                                        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "ppo_max_token_len_per_gpu: 8192 cannot hold one sequence: (max_prompt_length 2048 + max_response_length 20480) / ulysses sp 2 = 11264"),
]


@pytest.mark.parametrize("case,argv,expected", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_overrides_are_caught(verl050, case, argv, expected):
    """rlbox's own checks (composition, types, the cluster's arithmetic) name each; verl 0.5.0's own code on
    broken overrides is test_validate_verl_own.py's table, run in one process (here a process a case, 10 s each)."""
    problems = [str(p) for p in validate.check(verl050, argv, nodes=4, npus=16, own=_own_not_here)]
    assert any(expected in p for p in problems), problems
    assert all("\n" not in p for p in problems)


def test_dapo_entry_composes_with_trainer_config_on_the_search_path(verl_source):
    micro = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # verl refuses a config without them
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
             "algorithm.adv_estimator=grpo"]  # gae would bring in the critic, whose micro batch verl wants too
    ok = validate.check(verl_source, DAPO + CLUSTER + micro + ["algorithm.filter_groups.enable=True", "data.gen_batch_size=96"], 4, 16)
    assert ok == []
    problems = [str(p) for p in validate.check(verl_source, DAPO + CLUSTER + micro + ["alogorithm.filter_groups.enable=True"], 4, 16)]
    assert problems == ["alogorithm.filter_groups.enable: unknown key in dapo_trainer; did you mean "
                        "algorithm.filter_groups.enable? (a new key needs a leading +)"]


def test_every_recipe_validates_clean(verl050, verl_source):
    """Nothing found in any recipe; the verdict says what ran: a source folder (the seeds' DAPO releases here)
    has no environment for verl's own checks, so that verdict is "partly checked", never "valid"."""
    nearest = {"verl_pt27_25rc3": verl_source, "verl_pt27_cann82rc1": validate.from_wheel("0.7.0"), "verl_cpu": verl050,
               "verl_cpu_09": validate.from_wheel("0.9.1")}
    for r in recipes.all_recipes():
        argv, _ = r.resolve({}, [])
        from rlbox.cluster.jobs import plan_job

        npus = r.devices or (16 if r.hardware == "a3" else 8)
        job = plan_job(argv, nodes=r.nodes, npus_per_node=npus, run="t", run_id="x")
        found = validate.examine(nearest[r.release], list(job.argv), r.nodes, npus, own=_own_not_here)
        assert found.problems == (), r.name
        assert found.verdict == "partly checked", r.name
        assert [n.what.split(":")[0] for n in found.not_run] == ["verl's start-up checks"], r.name


def _own_not_here(tree, req):
    from rlbox.core.errors import RlboxError

    raise RlboxError("not run in this test (tests/cluster/test_validate_verl_own.py runs verl's own code)")


def test_cli_validate_and_run_stop_before_any_container(verl050, tmp_path):
    proc = rlbox("validate", "--verl-version", "0.5.0", "--recipe", "grpo-qwen2.5-0.5b-gsm8k")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "valid: verl.trainer.main_ppo with 39 overrides for 1 x 8 NPUs against verl 0.5.0 wheel\n"
    assert "rlbox: ran: verl 0.5.0's own code: verl.trainer.main_ppo's TaskRunner.run" in proc.stderr
    proc = rlbox("validate", "--verl-version", "0.5.0", "--nodes", "4", "--devices", "16",
                 "--", *MAIN_PPO, "tainer.device=npu", "trainer.n_gpus_per_node=16")
    assert proc.returncode == 2 and "did you mean trainer.device?" in proc.stderr


def test_cli_refuses_a_set_that_is_not_a_hydra_override_and_an_interpolation_loop(verl050):
    proc = rlbox("validate", "--verl-version", "0.5.0", "--recipe", "grpo-qwen2.5-0.5b-gsm8k", "--set", "--config-path=/x")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["rlbox: error: --set --config-path=/x: not a Hydra override (KEY=VALUE, "
                                                "+KEY=VALUE, ++KEY=VALUE or ~KEY); options of the job go after -- in the command"]
    loop = validate.examine(verl050, MAIN_PPO + CLUSTER + ["+data.a=${data.b}", "+data.b=${data.a}"], 4, 16,
                            own=_own_not_here)
    assert "data.a: cannot be resolved, as verl resolves its config at start-up: Recursive interpolation detected" \
        in [str(p) for p in loop.problems]


def test_two_validations_at_once_on_a_clean_cache_both_finish_with_the_same_verdict(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ, RLBOX_CACHE=str(tmp_path / "cache"))
    env.pop("RLBOX_ROOT", None)
    argv = [sys.executable, "-m", "rlbox.cli", "validate", "--verl-version", "0.5.0", "--json", "--nodes", "1",
            "--devices", "8", "--", *MAIN_PPO, "trainer.device=npu", "trainer.n_gpus_per_node=8", "data.train_batch_size=15",
            "actor_rollout_ref.actor.ppo_mini_batch_size=5", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1", "algorithm.adv_estimator=grpo"]
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], [e[-600:] for _, e in outs]
    assert "Traceback" not in outs[0][1] + outs[1][1]
    verdicts = [json.loads(o) for o, _ in outs]
    assert verdicts[0] == verdicts[1] and verdicts[0]["verdict"] == "invalid"
    assert any("real_train_batch_size (15) must be divisible by minimal possible batch size (8)" in p["message"]
               for p in verdicts[0]["problems"])
    assert sorted(p.name for p in (tmp_path / "cache" / "verl-env").iterdir()) == ["0.5.0", "0.5.0.lock"]


SEED_TYPOS = [
    (MAIN_PPO, "tainer.device=npu", "tainer.device: unknown key in ppo_trainer; did you mean trainer.device?"),
    (MAIN_PPO, "actor_rolloput_ref.rollout.n=5",
     "actor_rolloput_ref.rollout.n: unknown key in ppo_trainer; did you mean actor_rollout_ref.rollout.n?"),
    (DAPO, "alogorithm.filter_groups.enable=True",
     "alogorithm.filter_groups.enable: unknown key in dapo_trainer; did you mean algorithm.filter_groups.enable?"),
]


@pytest.mark.engine
@pytest.mark.parametrize("entry,typo,expected", SEED_TYPOS, ids=[t[1].split("=")[0] for t in SEED_TYPOS])
def test_run_with_a_seed_typo_starts_nothing(engine, sim_image, tmp_path, verl_source, entry, typo, expected):
    runs = tmp_path / "runs"
    proc = rlbox("run", "--sim", "--nodes", "2", "--name", "t-typo", "--runs-dir", runs, "--verl-config", verl_source.root,
                 "--", *entry, typo, "trainer.device=npu")
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "nothing was started" in proc.stderr
    assert leftovers("t-typo") == []
    assert not (runs / "t-typo" / "state.json").exists()


@pytest.mark.engine
def test_config_is_extracted_from_the_image_once(selftest_image, tmp_path, monkeypatch):
    _, image, _ = selftest_image
    monkeypatch.setenv("RLBOX_CACHE", str(tmp_path / "cache"))  # core.paths.cache_dir: where verl trees are kept
    client = docker.from_env()
    def of_image() -> list[str]:  # other engine tests' containers may come and go meanwhile (tests/conftest.py)
        return [c.name for c in client.containers.list(all=True, ignore_removed=True) if c.attrs.get("Config", {}).get("Image") == image]

    before = of_image()
    tree = validate.from_image(client, image)
    assert tree.trainer_config.joinpath("ppo_trainer.yaml").is_file()
    assert tree.root.name.startswith("image-") and tree.root.parent == tmp_path / "cache" / "verl"
    assert of_image() == before  # the probe and extraction containers are gone
    problems = [str(p) for p in validate.check(tree, MAIN_PPO + ["tainer.device=npu"], 1, 8)]
    assert any("did you mean trainer.device?" in p for p in problems)
    again = validate.from_image(client, image)
    assert again.root == tree.root
    proc = rlbox("validate", "--image", image, "--hardware", "ax", "--nodes", "1", "--", *MAIN_PPO, "tainer.device=npu",
                 env={"RLBOX_CACHE": str(tmp_path / "cache2")})
    assert proc.returncode == 2 and "did you mean trainer.device?" in proc.stderr and f"verl in {image}" in proc.stderr
