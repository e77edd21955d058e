#!/usr/bin/env python3
"""Benchmark: time from `rlbox run` to a ready cluster, for 1, 2 and 4 simulated A3 nodes.

Measured in the same run, on the same engine and sim image, against two baselines:

  (a) seed 001's ray_start.sh: nodes brought up one after another (each `ray start` run to
      completion before the next node is started), the head polling `ray status` every 5 s
      until NNODES x 16 NPUs are there;
  (b) the physical limit here: every node's bare `ray start --block` launched at once, workers
      waiting for the head's port, readiness polled every 0.1 s through the dashboard REST API.

rlbox is timed from the start of planning to its "cluster ready" line (connecting to the
engine, pre-flight checks as `rlbox run` does them, stand-in files, network, containers, Ray,
readiness). Teardown is not
counted for anyone. Prints the times and the ratios rlbox/(a) and rlbox/(b).
Needs the engine and the sim image (make rehearsal builds it).

--quick (CI: proves the bench runs): 1 node only. RLBOX_BENCH_PREFIX names its runs and
containers (default rlbox-bench); RLBOX_BENCH_DEVICES (e.g. 8-15) gives
rlbox's runs `--devices`, to share the engine with other runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from rlbox.cluster import launch
from rlbox.core.errors import RlboxError
from rlbox.cluster.preflight import checks
from rlbox.cluster import execute as run

NPUS = 16
PREFIX = os.environ.get("RLBOX_BENCH_PREFIX", "rlbox-bench")


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"bench: docker {' '.join(args[:3])} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def cleanup(prefix: str) -> None:
    names = docker("ps", "-aq", "--filter", f"name={prefix}").split()
    if names:
        docker("rm", "-f", *names, check=False)
    docker("network", "rm", prefix, check=False)


def rlbox_bringup(nodes: int, runs: Path) -> float:
    start = time.perf_counter()
    ready_at: list[float] = []

    def echo(line: str) -> None:
        if line.startswith("cluster ready"):
            ready_at.append(time.perf_counter())

    plan, run_dir = launch.prepare(launch.RunRequest(sim=True, nodes=nodes, hardware="a3", name=f"{PREFIX}{nodes}", runs_dir=runs,
                                                        devices=os.environ.get("RLBOX_BENCH_DEVICES") or None))
    run.execute(plan, run_dir=run_dir, echo=echo, emit=lambda t: None, timeout=300, replace=True, bring_up_only=True,
                before=checks.checks_before_start(plan, replace=True, echo=echo))
    return ready_at[0] - start


class _Net:
    """The baselines' own network, with fixed addresses (SimNetwork's come from the engine)."""

    def __init__(self, subnet: str):
        self.subnet = subnet

    def address(self, index: int) -> str:
        return str(ipaddress.ip_network(self.subnet).network_address + 10 + index)


def _net(prefix: str, third: int) -> _Net:
    net = _Net(f"172.30.{third}.0/24")
    docker("network", "create", "--subnet", net.subnet, prefix)
    return net


RAY_PORTS = ["--port=6766", "--dashboard-port=8260"]


def seed_script(nodes: int, image: str) -> float:
    """(a) one node after another; the head polls `ray status` every 5 s (seed 001 §4.5)."""
    prefix = f"{PREFIX}-seed"
    cleanup(prefix)
    start = time.perf_counter()
    net = _net(prefix, 251)
    head = net.address(0)
    names = []
    done = threading.Event()
    ready: list[float] = []

    def poll_head():
        while not done.is_set():
            out = subprocess.run(["docker", "exec", f"{prefix}-0", "ray", "status"], capture_output=True, text=True).stdout
            m = re.search(r"/(\d+(?:\.\d+)?) NPU", out)
            if m and int(float(m.group(1))) // NPUS == nodes:
                ready.append(time.perf_counter())
                done.set()
                return
            time.sleep(5)

    for i in range(nodes):
        name = f"{prefix}-{i}"
        names.append(name)
        docker("run", "-d", "--name", name, "--network", prefix, "--ip", net.address(i), "--ipc", "host",
               "--entrypoint", "sleep", image, "infinity")
        if i == 0:
            docker("exec", name, "ray", "start", "--head", *RAY_PORTS, f"--dashboard-host={head}",
                   f"--node-ip-address={head}", f"--resources={{\"NPU\": {NPUS}}}", "--disable-usage-stats")
            threading.Thread(target=poll_head, daemon=True).start()
        else:
            docker("exec", name, "ray", "start", f"--address={head}:6766", f"--node-ip-address={net.address(i)}",
                   f"--resources={{\"NPU\": {NPUS}}}", "--disable-usage-stats")
    done.wait(timeout=300)
    took = (ready[0] if ready else time.perf_counter()) - start
    cleanup(prefix)
    return took


def parallel_bare(nodes: int, image: str) -> float:
    """(b) every node's bare `ray start --block` at once; REST readiness polled every 0.1 s."""
    prefix = f"{PREFIX}-bare"
    cleanup(prefix)
    start = time.perf_counter()
    net = _net(prefix, 252)
    head = net.address(0)
    procs = []
    for i in range(nodes):
        ip = net.address(i)
        if i == 0:
            cmd = ["ray", "start", "--block", "--head", *RAY_PORTS, f"--dashboard-host={head}"]
            extra = ["--publish", "127.0.0.1:18260:8260"]
        else:
            cmd = ["bash", "-c", f"until (exec 3<>/dev/tcp/{head}/6766) 2>/dev/null; do sleep 0.1; done; exec \"$@\"", "w",
                   "ray", "start", "--block", f"--address={head}:6766"]
            extra = []
        procs.append(subprocess.Popen(
            ["docker", "run", "-d", "--name", f"{prefix}-{i}", "--network", prefix, "--ip", ip, "--ipc", "host", *extra,
             "--entrypoint", cmd[0], image, *cmd[1:], f"--node-ip-address={ip}", f"--resources={{\"NPU\": {NPUS}}}",
             "--disable-usage-stats"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"bench: docker run failed: {p.stderr.read().decode()[:300]}")
    took = None
    while time.perf_counter() - start < 300:
        try:
            rows = requests.get("http://127.0.0.1:18260/api/v0/nodes", params={"detail": "1"}, timeout=2).json()["data"]["result"]["result"]
            if sum(int(r["resources_total"].get("NPU", 0)) for r in rows if r["state"] == "ALIVE") >= nodes * NPUS:
                took = time.perf_counter() - start
                break
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(0.1)
    cleanup(prefix)
    if took is None:
        raise SystemExit("bench: bare cluster never got ready")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--quick", action="store_true", help="1 node only (CI)")
    args = parser.parse_args()
    if args.quick:
        args.nodes = [1]
    image = f"localhost/rlbox/sim:{launch.host_arch_variant()}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        raise SystemExit(f"bench: {image} missing; run `make rehearsal` (or rlbox build rlbox_sim:{launch.host_arch_variant()})")
    runs = Path(tempfile.mkdtemp(prefix="rlbox-bench-runs-"))
    results = []
    for n in args.nodes:
        try:
            r = rlbox_bringup(n, runs)
        except RlboxError as e:  # e.g. pre-flight: another run holds the simulated NPUs
            raise SystemExit(f"bench: rlbox run --sim --nodes {n}: {e}") from None
        a = seed_script(n, image)
        b = parallel_bare(n, image)
        results.append({"nodes": n, "rlbox_s": round(r, 2), "seed_script_s": round(a, 2), "parallel_bare_s": round(b, 2)})
        print(f"{n} node(s): rlbox {r:6.1f} s | (a) seed ray_start.sh {a:6.1f} s | (b) bare parallel {b:6.1f} s"
              f" | rlbox/(a) {r / a:4.2f} | rlbox/(b) {r / b:4.2f} | rlbox-(b) {r - b:+5.1f} s", flush=True)
    print("RESULTS " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
