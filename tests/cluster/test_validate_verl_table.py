"""One table row per verl start-up check and pinned verl commit (tests/fixtures/verl_rules/cases.yaml):
the violating override gets rlbox's message (verl's words, file:line at that commit), the passing
neighbour gets none, and where the research harness ran verl's own check code on the row, rlbox
rejects exactly when verl did. Pure: the rules run over the composed defaults kept in
defaults.yaml (no hydra, no verl, no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from rlbox.verl import rules as verl_rules

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_rules"
ROWS = yaml.safe_load((HERE / "cases.yaml").read_text())
DEFAULTS = yaml.safe_load((HERE / "defaults.yaml").read_text())
COMMITS = {verl_rules.A[:7]: verl_rules.A, verl_rules.B[:7]: verl_rules.B}
BASE = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "verl_rules" / "base.yaml").read_text())


def problems(row, short: str, extra: list[str]) -> list[str]:
    cfg = OmegaConf.create({})
    for key, value in DEFAULTS[short][row.get("config", "ppo_trainer")].items():
        OmegaConf.update(cfg, key, value, force_add=True)
    for text in BASE + list(extra):
        key, _, value = text.partition("=")
        OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)

    def get(key):
        return OmegaConf.select(cfg, key, throw_on_missing=False)

    return [str(p) for p in verl_rules.check(get, COMMITS[short], row.get("entry", "verl.trainer.main_ppo"))]


TABLE = [(row, short) for row in ROWS for short in COMMITS]


@pytest.mark.parametrize("row, short", TABLE, ids=[f"{r['rule']}@{s}" for r, s in TABLE])
def test_verl_start_up_check(row, short):
    expected = row["expect"][short]
    bad = problems(row, short, row["violating"])
    if expected is None:  # that verl has no such check (or no such key: the unknown-key check speaks)
        assert bad == [], bad
    else:
        assert any(expected in p and f"verl {short} rejects this at start-up" in p for p in bad), bad
    assert problems(row, short, row["passing"]) == []
    verl = row.get("verl", {}).get(short)
    if verl is not None:  # verl's own code on this row: rlbox rejects exactly when it did (compose: unknown key)
        assert (expected is not None) == (not verl.startswith(("ok", "compose"))), verl


def test_base_is_valid_at_both_commits():
    for short in COMMITS:
        for config, entry in (("ppo_trainer", "verl.trainer.main_ppo"), ("dapo_trainer", "recipe.dapo.main_dapo")):
            assert problems({"config": config, "entry": entry}, short, []) == []


@pytest.mark.parametrize("commit, expected", [
    (verl_rules.A, verl_rules.A), (verl_rules.B[:7], verl_rules.B), (verl_rules.B.upper(), verl_rules.B),
    (None, None), ("0123456789abcdef", None), ("65eb01", None),
])
def test_restated_rules_apply_only_to_their_own_commit(commit, expected):
    """No other verl gets a pinned commit's rules, whatever keys its config has (verl 0.9.1's has
    ray_kwargs and optim.lr_scheduler_type, as 65eb019's does)."""
    assert verl_rules.pinned(commit) == expected
