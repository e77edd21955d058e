"""Every make target works from a fresh clone in one command, and `make help` lists them all.

Read from make's own database (`make -pRrq`), so a rule added to the Makefile is seen without
being listed here: each target is .PHONY, named by `make help`, and, when its recipe uses the
project's virtualenv, reaches `setup` through its prerequisites (a fresh clone has no .venv)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def database() -> dict[str, tuple[list[str], str]]:
    """target -> (prerequisites, recipe) of every rule the Makefile itself defines."""
    proc = subprocess.run(["make", "-pRrq", "-f", "Makefile", "--no-print-directory"], cwd=REPO,
                          capture_output=True, text=True)
    rules, current, skip = {}, None, False
    for line in proc.stdout.split("# Files", 1)[1].splitlines():
        if line.startswith("# Not a target"):
            skip = True
            continue
        match = re.match(r"^([.A-Za-z][\w.-]*):(?!=)\s*(.*)$", line)
        if match:
            current = None if skip else match.group(1)
            skip = False
            if current:
                rules[current] = (match.group(2).split(), "")
            continue
        if current and line.startswith("\t"):
            prereqs, recipe = rules[current]
            rules[current] = (prereqs, recipe + line + "\n")
        elif not line.strip():
            current = None
    return rules


def phony() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())


def test_every_target_is_phony_and_in_make_help():
    rules = database()
    targets = {t for t in rules if not t.startswith(".")}
    assert {"help", "setup", "test", "lint", "docs", "bench", "bench-quick", "rehearsal"} <= targets
    assert targets == phony(), "the .PHONY line and the rules disagree"
    shown = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True).stdout
    listed = {m.group(1) for m in re.finditer(r"^make ([\w-]+)", shown, re.M)}
    assert listed == targets, f"make help lists {sorted(listed - targets)} that are no target; misses {sorted(targets - listed)}"


def test_targets_that_use_the_venv_reach_setup_first():
    rules = database()

    def reaches_setup(target: str, seen=()) -> bool:
        prereqs = rules.get(target, ([], ""))[0]
        return "setup" in prereqs or any(reaches_setup(p, seen + (target,)) for p in prereqs if p not in seen)

    def uses_venv(target: str) -> bool:
        recipe = rules[target][1]
        return any(v in recipe for v in ("$(PYTHON)", "$(RLBOX)", "$(VENV)", ".venv/"))

    missing = [t for t in rules if not t.startswith(".") and t != "setup" and uses_venv(t) and not reaches_setup(t)]
    # a target that only calls `$(MAKE) OTHER` gets setup from OTHER
    missing = [t for t in missing if "$(MAKE)" not in rules[t][1]]
    assert not missing, f"these targets use .venv but do not depend on setup: {missing}"
