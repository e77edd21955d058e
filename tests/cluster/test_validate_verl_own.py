"""verl's own start-up checks for a verl without restated rules (verl 0.9.1 from PyPI): run by that
verl's own code in the environment rlbox makes from its wheel, compared with the table recorded by
tools/verl-own-table.py (tests/fixtures/verl_rules/own-0.9.1.yaml). Nothing of a pinned commit's
rules reaches it: a row 65eb019 rejects and 0.9.1 accepts stays clean.

The environment is made once (uv, PyPI; a CPU torch where pip's find-links hold one) and cached
under RLBOX_CACHE; the table runs in one process (verl imported once)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlbox.verl import own as verl_own, rules as verl_rules, validate
from rlbox.verl import outcome
from rlbox.verl.outcome import NotRun
from rlbox.core.errors import RlboxError
from support import verl_env

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_rules"
RECORDED = yaml.safe_load((HERE / "own-0.9.1.yaml").read_text())
ROWS = {r["rule"]: r for r in yaml.safe_load((HERE / "cases.yaml").read_text())}
BASE = yaml.safe_load((HERE / "base.yaml").read_text())
# the rows 0.9.1 rejects in its own words, and rows 65eb019's checks reject that 0.9.1 accepts
CHOSEN = ["A3", "A8", "A9", "A11", "A14 none", "A22", "B1", "A1", "A24", "W1", "W5"]


# -- pure: the verdict is input, typed at its boundary --------------------------------------

def test_a_verdict_is_read_as_data_and_refused_when_it_is_not_one():
    v = verl_own.Verdict.parse('noise\n{"verl": "0.9.1", "ran": ["x", 3], "could_not": "no", '
                               '"rejected": "ValueError: a\\nb", "where": "verl/x.py:1"}\n', "here")
    assert v == verl_own.Verdict("0.9.1", ("x",), (), "ValueError: a b", "verl/x.py:1")
    for bad in ("", "{not json", "[1, 2]"):
        with pytest.raises(RlboxError, match="printed"):
            verl_own.Verdict.parse(bad, "here")
    with pytest.raises(RlboxError, match="1 verdict"):
        verl_own.Verdict.parse_all('{"verl": "1"}', "here", 2)


def test_a_rejection_names_the_verl_that_made_it_and_notes_say_what_ran():
    v = verl_own.Verdict("0.9.1", ("validate_config",), ("validate_config stopped on a package this Python lacks (x)",),
                         "AssertionError: no", "verl/utils/config.py:124", ("worker-side checks",))
    (p,) = verl_own.problems(v)
    assert str(p) == "verl: verl 0.9.1 rejects this at start-up (verl/utils/config.py:124): AssertionError: no"
    assert verl_own.ran(v) == ["verl 0.9.1's own code: validate_config"]
    assert verl_own.not_run(v) == [NotRun("verl 0.9.1's own validate_config stopped on a package this Python lacks (x)",
                                          "validate with --image: the image has the rollout engine")]
    assert verl_own.beyond(v) == ["verl 0.9.1's worker-side checks"]
    assert verl_own.problems(verl_own.Verdict("0.9.1", (), (), None, None)) == []


def test_when_verls_own_checks_cannot_run_validation_says_so_and_the_rest_stands(tmp_path):
    from rlbox.verl.validate import VerlTree

    cfg = tmp_path / "verl" / "trainer" / "config"
    cfg.mkdir(parents=True)
    (cfg / "ppo_trainer.yaml").write_text("trainer:\n  device: cuda\n  nnodes: 1\n  n_gpus_per_node: 8\n")
    (tmp_path / "verl" / "trainer" / "main_ppo.py").write_text(
        '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\n')

    def cannot(tree, req):
        raise RlboxError("cannot make the environment of verl 9.9.9 for its own checks: offline")

    tree = VerlTree(tmp_path, "verl 9.9.9 wheel", version="9.9.9")
    found = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo"], 1, 8, own=cannot)
    assert [str(p) for p in found.problems] == ["trainer.device: is 'cuda'; Ascend runs need trainer.device=npu"]
    assert [n.what for n in found.not_run] == [
        "verl's start-up checks: cannot make the environment of verl 9.9.9 for its own checks: offline"]
    ok = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo", "trainer.device=npu"], 1, 8, own=cannot)
    assert ok.verdict == outcome.PARTLY and ok.problems == ()
    folder = VerlTree(tmp_path, str(tmp_path))
    said = validate.examine(folder, ["python3", "-m", "verl.trainer.main_ppo", "trainer.device=npu"], 1, 8, own=cannot)
    assert said.verdict == outcome.PARTLY and "source folder" in said.not_run[0].what


def test_a_seed_commit_is_validated_by_its_own_code_where_it_can_run_and_by_the_restated_rules_where_not(tmp_path):
    """With an image, verl's own code in it; the restated rules only when that code cannot run."""
    from rlbox.verl.validate import VerlTree

    cfg = tmp_path / "verl" / "trainer" / "config"
    cfg.mkdir(parents=True)
    (cfg / "ppo_trainer.yaml").write_text("trainer:\n  device: npu\n  nnodes: 1\n  n_gpus_per_node: 8\n")
    (tmp_path / "verl" / "trainer" / "main_ppo.py").write_text(
        '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\n')
    tree = VerlTree(tmp_path, "verl in img", verl_rules.A, image="img")
    asked = []

    def runs(tree, req):
        asked.append(req)
        return verl_own.Verdict("0.5.0.dev", ("RayPPOTrainer._validate_config",), (), None, None)

    found = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo"], 1, 8, own=runs)
    assert asked and found.verdict == outcome.VALID
    assert found.ran[-1] == "verl 0.5.0.dev's own code: RayPPOTrainer._validate_config"
    assert not any("restates" in r for r in found.ran)

    def cannot(tree, req):
        raise RlboxError("verl's own checks could not start in img: no engine")

    fallback = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo"], 1, 8, own=cannot)
    assert fallback.problems and all("verl 796871d rejects this at start-up" in p.message for p in fallback.problems)
    assert "restates" in fallback.ran[-1] and "could not run: verl's own checks could not start in img" in fallback.ran[-1]


def test_a_version_that_is_not_one_is_refused_before_anything_is_made():
    with pytest.raises(RlboxError, match="is not a version"):
        verl_own.env_python("0.9.1; rm -rf /")


# -- verl 0.9.1's own code ------------------------------------------------------------------

@pytest.fixture(scope="module")
def verl091():
    """The environment of verl 0.9.1 (tests/support/verl_env.py)."""
    return verl_env.environment("0.9.1")


def test_verl_091_own_checks_give_the_recorded_table(verl091):
    tree, python = verl091
    entry = validate.entry_for(tree, ["python3", "-m", "verl.trainer.main_ppo"])
    reqs = [verl_own.request(entry, BASE + ROWS[rule][side], 1, 8, tree.root)
            for rule in CHOSEN for side in ("violating", "passing")]
    found = verl_own.run_many_in_env(python, reqs)
    assert {v.verl for v in found} == {"0.9.1"}
    for i, rule in enumerate(CHOSEN):
        for j, side in enumerate(("violating", "passing")):
            v = found[2 * i + j]
            got = f"({v.where}) {v.rejected}" if v.rejected else None
            assert got == RECORDED[rule][side], (rule, side)
            assert v.ran and v.ran[0].startswith("verl.utils.config.validate_config, as verl.trainer.main_ppo calls it")


def test_validate_against_091_reports_only_what_091_rejects(verl091):
    tree, _ = verl091
    assert tree.version == "0.9.1" and verl_rules.pinned(tree.commit) is None
    argv = ["python3", "-m", "verl.trainer.main_ppo", *BASE]
    notes: list[str] = []
    bad = [str(p) for p in validate.check(tree, argv + ROWS["A3"]["violating"], 1, 8, notes=notes)]
    assert [p for p in bad if "rejects this at start-up" in p] == [
        "verl: verl 0.9.1 rejects this at start-up (verl/utils/config.py:124): AssertionError: real_train_batch_size (15) "
        "must be divisible by minimal possible batch size (8)"], bad
    assert any(n.startswith("ran: verl 0.9.1's own code: verl.utils.config.validate_config") for n in notes), notes
    # W1: both pinned commits reject it at start-up (their FSDP workers normalise ppo_mini_batch_size to 0);
    # verl 0.9.1's validate_config does not (its workers are among what its notes say was not checked)
    assert RECORDED["W1"]["violating"] is None
    clean = [str(p) for p in validate.check(tree, argv + ROWS["W1"]["violating"], 1, 8)]
    assert not [p for p in clean if "rejects this at start-up" in p], clean
    assert not any("65eb019" in p or "796871d" in p for p in bad + clean)


# -- the seeds' recipes on the new release --------------------------------------------------

def test_a_recipe_on_another_release_has_its_keys_migrated_as_that_release_says():
    from rlbox.cluster import recipes

    r = recipes.load("dapo-qwen3-8b-custom-reward")
    on = r.on("verl_pt210_cann910")
    assert on.entrypoint == ["python3", "-m", "verl.trainer.main_ppo"] and on.working_dir is None
    assert "reward.reward_manager.name=dapo" in on.overrides and "reward_model.reward_manager=dapo" not in on.overrides
    assert "+reward.reward_kwargs.overlong_buffer_cfg.len=2048" in on.overrides
    assert any(o.startswith("reward.custom_reward_function.path=") for o in on.overrides)
    assert "+reward.reward_kwargs.max_resp_len=10000" in on.overrides
    assert r.on(r.release) is r and r.on("verl_pt27_cann82rc1") is r  # its own release, or one it has no form for


@pytest.mark.parametrize("name", ["dapo-qwen3-32b-a3", "dapo-qwen3-8b-custom-reward", "grpo-qwen2.5-0.5b-gsm8k",
                                  "grpo-qwen3-vl-8b-geo3k"])
def test_the_seeds_recipes_validate_against_verl_091_by_its_own_checks(verl091, name):
    from rlbox.cluster import recipes

    tree, _ = verl091
    r = recipes.load(name).on("verl_pt210_cann910")
    argv, _ = r.resolve({}, [])
    npus = 16 if r.hardware == "a3" else 8
    size = [f"trainer.nnodes={r.nodes}", f"trainer.n_gpus_per_node={npus}", "trainer.device=npu"]
    found = validate.examine(tree, argv + size, r.nodes, npus)
    assert found.problems == ()
    assert any(n.startswith("verl 0.9.1's own code: verl.utils.config.validate_config") for n in found.ran), found
    # what the verdict claims: valid only where verl's checks ran to the end; else what stopped them is named
    if found.verdict == outcome.PARTLY:
        assert all("model's files" in n.what or "package this Python lacks" in n.what for n in found.not_run), found
    else:
        assert found.verdict == outcome.VALID


# -- verl 0.5.0 (release verl_cpu's verl): its trainer's _validate_config, run as verl runs it ---------

RECORDED_050 = yaml.safe_load((HERE / "own-0.5.0.yaml").read_text())
CHOSEN_050 = ["A1", "A3", "A7", "A8", "A11", "A14 none", "A24", "A26", "W1"]


@pytest.fixture(scope="module")
def verl050env():
    return verl_env.environment("0.5.0")


def test_verl_050_own_checks_give_the_recorded_table(verl050env):
    """verl 0.5.0's main_ppo calls no validate_config: its TaskRunner.run builds the trainer, whose constructor
    calls _validate_config on the driver before any worker exists; that runs here, as verl runs it."""
    tree, python = verl050env
    entry = validate.entry_for(tree, ["python3", "-m", "verl.trainer.main_ppo"])
    reqs = [verl_own.request(entry, BASE + ROWS[rule][side], 1, 8, tree.root)
            for rule in CHOSEN_050 for side in ("violating", "passing")]
    found = verl_own.run_many_in_env(python, reqs)
    assert {v.verl for v in found} == {"0.5.0"}
    for i, rule in enumerate(CHOSEN_050):
        for j, side in enumerate(("violating", "passing")):
            v = found[2 * i + j]
            got = f"({v.where}) {v.rejected}" if v.rejected else None
            assert got == RECORDED_050[rule][side], (rule, side)
            assert not v.could_not, (rule, side, v.could_not)
            if not v.rejected:
                assert v.ran == ("verl.trainer.main_ppo's TaskRunner.run, as verl runs it on the driver (worker choice, "
                                 "reward manager, resource pools), through RayPPOTrainer._validate_config, as the "
                                 "trainer's constructor calls it (verl/trainer/ppo/ray_trainer.py:388)",), v.ran


def test_the_050_regression_a_batch_verl_050_rejects_is_invalid(verl050env):
    """rlbox validate --verl-version 0.5.0 once said "calls no validate_config ... valid" for this."""
    tree, _ = verl050env
    found = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo", *BASE, *ROWS["A3"]["violating"]], 1, 8)
    assert found.verdict == outcome.INVALID
    assert "verl: verl 0.5.0 rejects this at start-up (verl/trainer/ppo/ray_trainer.py:415): AssertionError: " \
           "real_train_batch_size (15) must be divisible by minimal possible batch size (8)" in [str(p) for p in found.problems]
    ok = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo", *BASE, *ROWS["A3"]["passing"]], 1, 8)
    assert ok.verdict == outcome.VALID, ok
    assert any("RayPPOTrainer._validate_config" in r for r in ok.ran)
    assert any("worker-side checks" in b for b in ok.beyond)
