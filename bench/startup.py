#!/usr/bin/env python3
"""Benchmark: how long the `rlbox` command takes to start, against importing click alone.

Each case is a whole process (`python -m rlbox.cli ...`), timed REPS times after one warm-up;
the median is reported with its ratio to the baseline `python -c 'import click'`, measured
the same way in the same run (the floor of any click program). Wall-clock and CPU time (user +
system of the process) are both printed: on a shared machine the CPU time is the steadier. The goal (issue 21): `rlbox
--help` and the quick commands start in under 0.5 s; the ratio says how far from the floor.

  --help            the root help: lists every command from cli/main.py's table, imports none
  images list       loads the matrix (yaml + pydantic), prints a table (rich)
  recipes list      loads the shipped recipes, prints a table
  status            a run that does not exist: its record looked for, one error line
  X --help          one command's help: imports that command's module only

--quick: one repetition, no warm-up (CI runs it to prove the bench runs).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CASES = (
    ("--help", ["--help"], (0,)),
    ("images list", ["images", "list"], (0,)),
    ("recipes list", ["recipes", "list"], (0,)),
    ("status (no such run)", ["status", "--name", "rlbox-bench-none", "--runs-dir", "{runs}"], (2,)),
    ("run --help", ["run", "--help"], (0,)),
)


def median_time(argv: list[str], codes: tuple[int, ...], reps: int, warm: bool) -> tuple[float, float]:
    """Median wall-clock and median CPU seconds (user + system, the child's own) of ``argv``. On a
    shared, busy machine the CPU time is the steadier of the two."""
    def once() -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode not in codes:
            raise SystemExit(f"bench: {' '.join(argv[1:])} exited {proc.returncode}: {proc.stderr[-500:]}")
        return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    if warm:
        once()
    runs = [once() for _ in range(reps)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, no warm-up (CI)")
    parser.add_argument("--reps", type=int, default=9, help="repetitions per case (default 9)")
    args = parser.parse_args()
    reps, warm = (1, False) if args.quick else (args.reps, True)
    runs = tempfile.mkdtemp(prefix="rlbox-bench-startup-")

    base, base_cpu = median_time([sys.executable, "-c", "import click"], (0,), reps, warm)
    print(f"baseline  python -c 'import click'   {base:5.3f} s wall, {base_cpu:5.3f} s CPU")
    for label, cli_args, codes in CASES:
        argv = [sys.executable, "-m", "rlbox.cli", *[a.format(runs=runs) for a in cli_args]]
        t, cpu = median_time(argv, codes, reps, warm)
        print(f"rlbox {label:22} {t:5.3f} s wall, {cpu:5.3f} s CPU | ratio {t / base:4.1f} x import click (wall), "
              f"{cpu / base_cpu:4.1f} x (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
