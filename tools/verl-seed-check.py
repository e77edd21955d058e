#!/usr/bin/env python3
"""The seed commits' own start-up checks, run by their own code in an image, against the table of
restated rules (tests/fixtures/verl_rules/cases.yaml). `make validate-seeds VERL_GIT=DIR`:

    .venv/bin/python tools/verl-seed-check.py VERL_GIT_DIR [--base IMAGE]

VERL_GIT_DIR: a git repository of verl holding both pinned commits (rlbox.verl.rules.A, B; e.g. the
search tool's fetched mirror of verl-project/verl). For each commit it builds
``localhost/rlbox-seed/verl:SHORT``: FROM the verl_cpu release image (verl 0.5.0's Python: torch CPU,
Ray, transformers, hydra), verl's source at that commit (``git archive``: verl/, recipe/) on
PYTHONPATH, labelled ``io.rlbox.component.verl=git+https://github.com/volcengine/verl@COMMIT`` as a
release image names its verl. Then:

1. ``rlbox validate --image`` that image on the research's BASE: its "ran" lines show which code ran
   (verl's own in the image, not rlbox's restatement).
2. Every main_ppo row of cases.yaml, ``violating`` and ``passing``, through verl's own code in the image
   (one container: ``rlbox.verl.own.run_many_in_image``), compared with the restated rule's
   ``expect`` for that commit: a rule's message must be verl's own rejection (its text, and the
   file:line when the rule names one); a row with no rule at that commit must be accepted or refused
   by Hydra (the key does not exist there: rlbox's unknown-key check speaks); ``passing`` must be
   accepted. A row verl's code cannot run here (a package the CPU image lacks) is counted, not judged.

Prints each row that differs and a summary per commit; exits 1 when any row differs. Not run by the
tests: the commits' sources are fetched, never committed, and a clean clone has neither.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from rlbox.core import engine
from rlbox.verl import own as verl_own, rules as verl_rules, validate

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "tests" / "fixtures" / "verl_rules"
MAIN_PPO = ["python3", "-m", "verl.trainer.main_ppo"]
RULE_AT = re.compile(r"^\((?P<file>[\w./-]+\.py):(?P<line>\d+(?:-\d+)?)\): (?P<text>.*)$", re.S)


def base_image(client) -> str:
    """The newest verl_cpu release image on the engine (the tests build it: localhost/rlbox/verl-cpu:amd64-DIGEST)."""
    found = [(img.attrs.get("Created", ""), tag) for img in client.images.list("localhost/rlbox/verl-cpu")
             for tag in img.tags if "-verl-cpu-shims" not in tag]
    if not found:
        raise SystemExit("verl-seed-check: no localhost/rlbox/verl-cpu:amd64 image here; build it first "
                         "(make cpu-image, or any test run that trains on CPU), or give --base IMAGE")
    return max(found)[1]


def seed_image(client, git_dir: Path, commit: str, base: str) -> str:
    """``localhost/rlbox-seed/verl:SHORT``: BASE with verl's source at COMMIT on PYTHONPATH."""
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", "--prefix=src/", commit,
                              "verl", "recipe"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"verl-seed-check: {git_dir} has no verl/ and recipe/ at {commit[:7]}: "
                         f"{archive.stderr.decode(errors='replace').strip()[:200]}")
    dockerfile = (f"FROM {base}\nCOPY src /opt/verl-seed\nENV PYTHONPATH=/opt/verl-seed\n"
                  f'LABEL io.rlbox.component.verl="git+https://github.com/volcengine/verl@{commit}"\n').encode()
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as out:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        out.addfile(info, io.BytesIO(dockerfile))
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as src:
            for member in src.getmembers():
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
    tag = f"localhost/rlbox-seed/verl:{commit[:7]}"
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    return tag


def rows() -> list[dict]:
    every = yaml.safe_load((HERE / "cases.yaml").read_text())
    return [r for r in every if r.get("config", "ppo_trainer") == "ppo_trainer"
            and r.get("entry", "verl.trainer.main_ppo") == "verl.trainer.main_ppo"]


def judge(expect: str | None, violating: verl_own.Verdict, passing: verl_own.Verdict) -> str | None:
    """None when verl's own code agrees with the restated rule; else what differs. verl's words may be
    bare (``NotImplementedError``, an ``AssertionError`` with no message: the rule then adds what it is
    about) or wrapped (Hydra's ``InstantiationException`` around a dataclass's assertion): then its
    file:line, or the dataclass it names, is what must agree."""
    if passing.rejected and not (expect is None and passing.rejected.startswith("ConfigCompositionException")):
        return f"passing: verl rejects it ({passing.where}): {passing.rejected[:160]}"
    if expect is None:  # no such check at this commit, or no such key (then Hydra refuses it, as rlbox does)
        if violating.rejected and not violating.rejected.startswith("ConfigCompositionException"):
            return f"no rule here, but verl rejects ({violating.where}): {violating.rejected[:160]}"
        return None
    if not violating.rejected:
        return f"rule says {expect[:120]!r}; verl accepts"
    m = RULE_AT.match(expect)
    text = " ".join((m.group("text") if m else expect).split())
    said = " ".join(violating.rejected.split())
    kind, _, words = said.partition(": ")
    bare = words in ("", kind)
    named = re.findall(r"\b(\w+Config)\b", text)
    if m and (bare or text[:60] not in said):
        lo, _, hi = m.group("line").partition("-")
        at = re.search(r"([\w./-]+\.py):(\d+)$", violating.where or "")
        if at and at.group(1).endswith(m.group("file")) and int(lo) <= int(at.group(2)) <= int(hi or lo):
            return None
    if not bare and text[:60] in said:
        return None
    if named and any(n in said for n in named):
        return None
    return f"rule says {expect[:120]!r}; verl says ({violating.where}) {said[:160]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir", type=Path)
    parser.add_argument("--base", help="the image whose Python runs verl (default: the newest verl_cpu image here)")
    args = parser.parse_args()
    client = engine.local_client()
    base = args.base or base_image(client)
    bases = yaml.safe_load((HERE / "base.yaml").read_text())
    table = rows()
    differs = 0
    for commit in (verl_rules.A, verl_rules.B):
        short = commit[:7]
        tag = seed_image(client, args.git_dir, commit, base)
        shown = subprocess.run([sys.executable, "-m", "rlbox.cli", "validate", "--image", tag, "--nodes", "1",
                                "--devices", "8", "--", *MAIN_PPO, *bases],
                               cwd=REPO, capture_output=True, text=True)
        ran = [line for line in shown.stderr.splitlines() if line.startswith("rlbox: ran: ")]
        print(f"verl {short} in {tag} (FROM {base}): rlbox validate --image -> {shown.stdout.strip() or shown.stderr.strip()[-200:]}")
        for line in ran:
            print(f"  {line}")
        if not any("own code" in line for line in ran):
            print(f"  differs: rlbox validate did not run verl {short}'s own code in its image")
            differs += 1
        tree = validate.from_image(client, tag)  # the image's config tree, as rlbox validate reads it
        entry = validate.entry_for(tree, MAIN_PPO)
        reqs = [verl_own.request(entry, bases + r[side], 1, 8, tree.root) for r in table for side in ("violating", "passing")]
        found = verl_own.run_many_in_image(client, tag, reqs)
        agree = cannot = workers = 0
        for i, row in enumerate(table):
            violating, passing = found[2 * i], found[2 * i + 1]
            if violating.could_not or passing.could_not:
                cannot += 1
                continue
            if row["rule"].startswith("W") and not violating.rejected and not passing.rejected:
                workers += 1  # a worker's check (fsdp_workers, the rollout): verl makes it once its workers run
                continue
            why = judge((row.get("expect") or {}).get(short), violating, passing)
            if why:
                differs += 1
                print(f"  {row['rule']}: differs: {why}")
            else:
                agree += 1
        print(f"verl {short}: {agree} of {len(table)} main_ppo rows agree with the restated rules by verl's own code; "
              f"{workers} are checks verl makes in its workers (W rows: not run before its workers start); "
              f"{cannot} could not run here; {len(table) - agree - cannot - workers} differ")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
