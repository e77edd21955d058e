#!/usr/bin/env python3
"""Benchmark: seconds from a node's death to rlbox naming it, and to the cluster being ready again.

A 2-node simulated run (`rlbox run --sim --max-restarts 1`) of tests/fixtures/launcher/steps_job.py
(a step counter checkpointed on a shared mount, every node touched each step). At step 3 the
worker's container is killed. Measured in the same run against a baseline: Ray's own verdict,
the time until the head's node table (`/api/v0/nodes`, polled every 0.2 s by this script) marks
the worker DEAD, which is what a launcher that only watched Ray would wait for. Prints the
seconds to rlbox's "was lost" line (goal < 5 s), to its second "cluster ready" line, the
baseline, and the ratio. Needs the engine and the sim image (make rehearsal builds it).

--quick (CI: proves the bench runs): the same (it is already one run of the smallest cluster that
can lose a worker). RLBOX_BENCH_PREFIX names the run (default h12); RLBOX_BENCH_DEVICES (e.g.
8-15) gives it `--devices`, to share the engine with other runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import docker
import requests

REPO = Path(__file__).resolve().parent.parent
DEVICES = ["--devices", os.environ["RLBOX_BENCH_DEVICES"]] if os.environ.get("RLBOX_BENCH_DEVICES") else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same single run (CI)")
    parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlbox-bench-loss-"))
    shared, runs = work / "shared", work / "runs"
    name = os.environ.get("RLBOX_BENCH_PREFIX", "h12") + "-bench-loss"
    shared.mkdir()
    shutil.copy(REPO / "tests/fixtures/launcher/steps_job.py", shared)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlbox.cli", "run", "--sim", "--nodes", "2", "--name", name, "--runs-dir", str(runs),
         "--mount", f"{shared}:/shared", "--no-doctor", "--max-restarts", "1", *DEVICES, "--",
         "python3", "/shared/steps_job.py", "12", "1", "/shared/ckpt.json"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    threading.Thread(target=lambda: [lines.append((time.monotonic(), x)) for x in proc.stderr], daemon=True).start()
    try:
        while not (shared / "ckpt.json").exists() or json.loads((shared / "ckpt.json").read_text())["step"] < 3:
            if proc.poll() is not None:
                raise SystemExit("rlbox ended early:\n" + "".join(x for _, x in lines))
            time.sleep(0.1)
        state = json.loads((runs / name / "state.json").read_text())
        worker_ip = docker.from_env().containers.get(state["nodes"][1]["container"]).attrs[
            "NetworkSettings"]["Networks"][f"rlbox-{name}"]["IPAddress"]
        dashboard = f"http://127.0.0.1:{state['ports']['dashboard']}"
        killed = time.monotonic()
        docker.from_env().containers.get(state["nodes"][1]["container"]).kill()
        ray_dead = None
        while ray_dead is None and time.monotonic() - killed < 90:
            try:
                rows = requests.get(f"{dashboard}/api/v0/nodes", params={"detail": "1"}, timeout=2).json()["data"]["result"]["result"]
                if any(r["node_ip"] == worker_ip and r["state"] == "DEAD" for r in rows):
                    ray_dead = time.monotonic() - killed
            except (requests.RequestException, KeyError, ValueError):
                break  # rlbox already tore the head down for the restart: Ray's verdict never came
            time.sleep(0.2)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    named = next(t for t, x in lines if "was lost" in x) - killed
    ready = [t for t, x in lines if "cluster ready" in x]
    again = ready[1] - killed if len(ready) > 1 else float("nan")
    print(f"rlbox exit code: {code}")
    if code != 0:  # what rlbox said last, so a failed run names its cause here (a bench's output is all CI keeps)
        print("rlbox's last lines:\n" + "\n".join(f"  {x.rstrip()}" for _, x in lines[-6:]))
    print(f"node death -> rlbox names it:       {named:6.2f} s  (goal < 5 s)")
    print(f"node death -> cluster ready again:  {again:6.2f} s  (teardown, pre-flight, bring-up)")
    if ray_dead is not None:
        print(f"baseline, Ray marks the node DEAD:  {ray_dead:6.2f} s  -> rlbox/baseline = {named / ray_dead:.2f}")
    else:
        print("baseline, Ray marks the node DEAD:  not before rlbox had torn the cluster down for the restart "
              f"(> {named:.2f} s)")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
