#!/usr/bin/env python3
"""`make rehearsal`: the production path on a 4-host A3 testbed (64 NPUs), as a user runs it.

  rlbox testbed up --hosts 4 --hardware a3                 (4 hosts: namespaces, engines, sshd, NPU stand-ins)
  rlbox distribute IMAGE --cluster CLUSTER_FILE            (the image to every host: one pipelined stream)
  rlbox run --cluster CLUSTER_FILE --image IMAGE --smoke-test  (ssh, doctor, containers, Ray, job, teardown)
  rlbox testbed down                                        (always, even after a failure or Ctrl-C)

`--slurm` (`make rehearsal-slurm`): the testbed runs Slurm (`testbed up --slurm`) and the run is
`rlbox run --backend slurm --nodes 4`: an allocation of the 4 nodes, the smoke job on them, scancel.
RLBOX_REHEARSAL_TESTBED / RLBOX_REHEARSAL_SUBNET name another testbed and subnet.

Prints the time rlbox takes to deliver the image to the hosts apart from the time to a ready cluster. Where
namespaces are not available (no root, no iproute2), says so in one line and names
`make rehearsal-sim`, the simulation on this machine's one engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME, SUBNET, ROOT = "rhs", "10.201.5.0/24", "/var/lib/rlbox-testbed"
SLURM = "--slurm" in sys.argv[1:]
if SLURM:
    NAME, SUBNET = "rhsl", "10.201.6.0/24"
NAME = os.environ.get("RLBOX_REHEARSAL_TESTBED", NAME)
SUBNET = os.environ.get("RLBOX_REHEARSAL_SUBNET", SUBNET)


def rlbox(*args: str, capture: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlbox.cli", *args], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE if capture else None)


def main() -> int:
    from rlbox.cluster.launch import host_arch_variant
    from rlbox.core.errors import RlboxError
    from rlbox.testbed import execute

    try:
        execute.requirements()
    except RlboxError as err:
        print(f"make rehearsal: {err}; `make rehearsal-sim` rehearses on simulated nodes instead", file=sys.stderr)
        return 2
    image = f"localhost/rlbox/sim:{host_arch_variant()}"
    if Path(ROOT, NAME, "testbed.json").exists():  # left by a killed rehearsal
        rlbox("testbed", "down", "--name", NAME, capture=True)
    started = time.monotonic()
    up = rlbox("testbed", "up", "--hosts", "4", "--hardware", "a3", "--name", NAME, "--subnet", SUBNET,
               *(["--slurm"] if SLURM else []), capture=True)
    sys.stderr.write(up.stderr)
    code, ready, run_seconds, delivered = 1, None, float("nan"), float("nan")
    record = {"up_seconds": float("nan")}
    try:
        if up.returncode != 0:
            return up.returncode
        record = json.loads(Path(ROOT, NAME, "testbed.json").read_text())
        delivery_started = time.monotonic()
        deliver = rlbox("distribute", image, "--cluster", record["cluster_file"])
        delivered = time.monotonic() - delivery_started
        if deliver.returncode != 0:
            return deliver.returncode
        run_started = time.monotonic()
        backend = ["--backend", "slurm", "--nodes", "4", "--time", "10"] if SLURM else []
        proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "run", *backend, "--cluster", record["cluster_file"],
                                 "--image", image, "--smoke-test", "--name", "rehearsal"], cwd=REPO, text=True,
                                stderr=subprocess.PIPE)
        ready = None
        for line in proc.stderr:
            sys.stderr.write(line)
            m = re.search(r"cluster ready: .* in ([\d.]+) s", line)
            if m:
                ready = float(m.group(1))
        code = proc.wait()
        run_seconds = time.monotonic() - run_started
    finally:
        down_started = time.monotonic()
        down = rlbox("testbed", "down", "--name", NAME, capture=True)
        sys.stderr.write(down.stderr)
    print(f"rehearsal{' (slurm)' if SLURM else ''}: 4 hosts up in {record['up_seconds']:.1f} s | image delivered to 4 hosts by rlbox distribute "
          f"in {delivered:.1f} s | cluster ready (64 NPUs) in {ready if ready is not None else float('nan'):.1f} s "
          f"| smoke job exit {code}, run {run_seconds:.1f} s | testbed down in {time.monotonic() - down_started:.1f} s "
          f"| total {time.monotonic() - started:.1f} s")
    return code or down.returncode


if __name__ == "__main__":
    sys.exit(main())
