#!/usr/bin/env python3
"""Benchmark: how long pre-flight takes on warm caches, against baselines from the same run.

  validate  `rlbox validate` (a whole CLI process: start-up, compose, checks) for the GRPO
            quick-start recipe against the verl 0.5.0 config, vs (baseline) a bare hydra
            compose of the same overrides in-process, which is the floor of any validation.
  doctor    `rlbox doctor --sim --nodes 4` (a whole CLI process: 13 checks on each of 4 nodes
            in parallel), vs (baseline) the same facts gathered by hand, one node after
            another: ls /dev, npu-smi info, the driver's version.info, docker ps, ss, df.

Each is run 5 times after one warm-up; the median is reported. Needs the engine and the sim
image for the doctor part (make rehearsal builds it).

--quick (CI: proves the bench runs): one run each, no warm-up, doctor on 1 node.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlbox.cluster import jobs
from rlbox.cluster import recipes
from rlbox.verl import validate


RUNS, WARM = 5, True


def median_time(fn, runs: int | None = None) -> float:
    runs = runs or RUNS
    if WARM:
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cli(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", *args], capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"bench: rlbox {' '.join(args[:2])} failed: {proc.stderr[-500:]}")


def main() -> int:
    global RUNS, WARM
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run each, no warm-up, doctor on 1 node (CI)")
    quick = parser.parse_args().quick
    nodes = 1 if quick else 4
    if quick:
        RUNS, WARM = 1, False
    tree = validate.from_wheel("0.5.0")
    recipe = recipes.load("grpo-qwen2.5-0.5b-gsm8k")
    argv, _ = recipe.resolve({}, [])
    job = jobs.plan_job(argv, nodes=1, npus_per_node=8, run="b", run_id="b")
    entry = validate.entry_for(tree, list(job.argv))
    overrides = validate.hydra_overrides(list(job.argv))

    ours = median_time(lambda: cli("validate", "--verl-version", "0.5.0", "--recipe", recipe.name))
    base = median_time(lambda: validate.compose(entry, overrides))
    print(f"validate  rlbox validate (CLI process) {ours:5.2f} s | bare hydra compose {base:5.2f} s | ratio {ours / base:5.1f}")

    runs = Path(tempfile.mkdtemp(prefix="rlbox-bench-doctor-"))
    ours = median_time(lambda: cli("doctor", "--sim", "--nodes", str(nodes), "--hardware", "a3", "--runs-dir", str(runs), "--json"))
    stand_ins = runs / "verl" / "sim"

    def by_hand():
        for node in sorted(stand_ins.iterdir()):
            for argv in (["ls", "-1", str(node / "dev")], [str(node / "npu-smi"), "info"],
                         ["cat", str(node / "driver" / "version.info")], ["docker", "ps"], ["ss", "-Hltn"],
                         ["df", "-Pk", "/dev/shm"], ["df", "-Pk", "/var/lib/docker"]):
                subprocess.run(argv, capture_output=True)

    base = median_time(by_hand)
    print(f"doctor    rlbox doctor, {nodes} node(s) (CLI) {ours:5.2f} s | the facts by hand, node after node {base:5.2f} s | ratio {ours / base:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
