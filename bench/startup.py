#!/usr/bin/env python3
"""Benchmark: how long the `rlbox` command takes to start, against importing what it needs.

Each case is a whole process (`python -m rlbox.cli ...`), timed REPS times after one warm-up;
the median is reported with its ratio to a baseline measured the same way in the same run. The
cases and the baselines are run round-robin (one repetition of each, then the next), so that a
change of load on a shared machine falls on all of them alike. Wall-clock and CPU time (user +
system of the process) are both printed: on a shared machine the CPU time is the steadier.

Baselines (each a bare `python -c`):
  import click      the floor of any click program: what `rlbox --help` and the quick
                    commands are compared with
  import click+rich+pydantic+yaml   `import click, rich.console, rich.table, pydantic, yaml`:
                    what `rlbox images list` needs to load the matrix and print its table

Cases:
  --help            the root help: lists every command from cli/main.py's table, imports none
  images list       the matrix's rows (from the cache of them, warm: see rlbox.image.matrix_cache),
                    printed as a table
  images list (no cache)   the same with an empty cache each time (a new RLBOX_CACHE): the
                    matrix loaded and validated (yaml + pydantic), then the cache written
  images list --json   the rows from the cache as JSON: no rich (what the table costs)
  recipes list      loads the shipped recipes, prints a table
  status            a run that does not exist: its record looked for, one error line
  X --help          one command's help: imports that command's module only

The goal (issue 35): `rlbox images list` within 1.5 x importing click+rich+pydantic+yaml and
`rlbox --help` within 1.5 x importing click; both are printed at the end.

--before DIR: also run every case with PYTHONPATH=DIR, the launcher/ folder of another checkout
(e.g. `git archive COMMIT launcher | tar -x -C /tmp/before`), in the same round-robin, so
before and after are measured in one run.
--quick: one repetition, no warm-up but the run that fills the cache (CI runs it to prove the bench runs).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

CLICK = "import click"
NEEDS = "import click, rich.console, rich.table, pydantic, yaml"

# label, rlbox arguments, exit codes, the baseline it is compared with, a new empty cache each time
CASES = (
    ("--help", ["--help"], (0,), CLICK, False),
    ("images list", ["images", "list"], (0,), NEEDS, False),
    ("images list (no cache)", ["images", "list"], (0,), NEEDS, True),
    ("images list --json", ["images", "list", "--json"], (0,), NEEDS, False),
    ("recipes list", ["recipes", "list"], (0,), CLICK, False),
    ("status (no such run)", ["status", "--name", "rlbox-bench-none", "--runs-dir", "{runs}"], (2,), CLICK, False),
    ("run --help", ["run", "--help"], (0,), CLICK, False),
)
GOALS = (("--help", CLICK), ("images list", NEEDS))
GOAL = 1.5


@dataclass
class Case:
    label: str
    argv: list[str]
    codes: tuple[int, ...]
    env: dict[str, str]
    fresh_cache: bool = False
    runs: list[tuple[float, float]] = field(default_factory=list)

    def once(self, scratch: str) -> tuple[float, float]:
        """Wall-clock and CPU seconds (user + system, the child's own) of one run."""
        env = dict(self.env)
        if self.fresh_cache:
            env["RLBOX_CACHE"] = tempfile.mkdtemp(prefix="cache-", dir=scratch)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(self.argv, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode not in self.codes:
            raise SystemExit(f"bench: {self.label}: {' '.join(self.argv[1:])} exited {proc.returncode}: "
                             f"{proc.stderr[-500:]}")
        if self.fresh_cache:
            shutil.rmtree(env["RLBOX_CACHE"], ignore_errors=True)
        return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    @property
    def wall(self) -> float:
        return statistics.median(r[0] for r in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(r[1] for r in self.runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, no warm-up (CI)")
    parser.add_argument("--reps", type=int, default=9, help="repetitions per case (default 9)")
    parser.add_argument("--before", metavar="DIR", help="also run each case with PYTHONPATH=DIR (another checkout's launcher/)")
    args = parser.parse_args()
    reps, warm = (1, False) if args.quick else (args.reps, True)
    scratch = tempfile.mkdtemp(prefix="rlbox-bench-startup-")
    try:
        return run(reps, warm, scratch, args.before)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(reps: int, warm: bool, scratch: str, before: str | None) -> int:
    env = dict(os.environ, RLBOX_CACHE=os.path.join(scratch, "cache"))  # this run's own cache, filled by the warm-up
    baselines = {stmt: Case(f"python -c '{stmt}'", [sys.executable, "-c", stmt], (0,), env) for stmt in (CLICK, NEEDS)}
    sides = {"": dict(env)}
    if before:
        sides["before"] = dict(env, PYTHONPATH=os.path.abspath(before))
    cases = {
        (side, label): (Case(label, [sys.executable, "-m", "rlbox.cli", *[a.format(runs=scratch) for a in cli_args]],
                             codes, side_env, fresh), base)
        for side, side_env in sides.items()
        for label, cli_args, codes, base, fresh in CASES
    }
    everything = list(baselines.values()) + [c for c, _ in cases.values()]
    for c in everything:  # the warm-up; without one (--quick), still the run that fills the images list cache
        if warm or (not c.fresh_cache and c.argv[3:5] == ["images", "list"]):
            c.once(scratch)
    for _ in range(reps):  # round-robin: a change of load falls on every case alike
        for c in everything:
            c.runs.append(c.once(scratch))

    for stmt, b in baselines.items():
        print(f"baseline  {b.label:64} {b.wall:5.3f} s wall, {b.cpu:5.3f} s CPU")
    for side in sides:
        if before:
            print(f"-- {'before (PYTHONPATH=' + before + ')' if side else 'this checkout'}")
        for label, *_ in CASES:
            c, stmt = cases[(side, label)]
            b = baselines[stmt]
            print(f"rlbox {label:24} {c.wall:5.3f} s wall, {c.cpu:5.3f} s CPU | ratio {c.wall / b.wall:4.2f} x "
                  f"{'import click' if stmt == CLICK else 'its imports'} (wall), {c.cpu / b.cpu:4.2f} x (CPU)")
    print(f"goal (issue 35): each within {GOAL} x its baseline")
    for label, stmt in GOALS:
        b = baselines[stmt]
        for side in sides:
            c, _ = cases[(side, label)]
            met = "met" if c.cpu / b.cpu <= GOAL else "NOT met"
            print(f"  {label + (' (before)' if side else ''):22} / python -c '{stmt}': {c.cpu / b.cpu:4.2f} x CPU, "
                  f"{c.wall / b.wall:4.2f} x wall: {met} (by CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
