#!/usr/bin/env python3
"""Benchmark: time from `rlbox run --cluster` to a ready cluster, for 1, 2 and 4 A3 hosts of a
testbed (`rlbox testbed`: each host its own address, Docker engine and sshd on this machine).

Measured in the same run, on the same testbed hosts and image, against two baselines, each
driving the hosts over ssh as an operator does:

  (a) seed 001's ray_start.sh: hosts brought up one after another (`ray start` on a node run to
      completion before the next node is started), the head polling `ray status` every 5 s
      until NHOSTS x 16 NPUs are there;
  (b) bare parallel `ray start --block` on every host at once (`ssh HOST docker run --network
      host ...`), workers waiting for the head's port, readiness polled every 0.1 s through the
      dashboard REST API: what Ray itself needs here.

rlbox is timed from the start of planning to its "cluster ready" line: counting the hosts' NPUs
over ssh, the pre-flight checks (`rlbox doctor` on every host) as `rlbox run` does them,
claims, containers, Ray, readiness. Loading the image into the hosts is not counted (it is done
once, before; `rlbox testbed up` prints its time) and neither is teardown.
Prints the times and the ratios rlbox/(a) and rlbox/(b). --quick: 1 host, once.
Needs root and the sim image (make sim-image).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from rlbox.cluster import execute as run
from rlbox.cluster import launch
from rlbox.cluster.preflight import checks
from rlbox.testbed import execute as tb
from rlbox.testbed import plan as tbplan

NPUS = 16
NAME = "tbb"
SUBNET = "10.201.3.0/24"
GCS, DASHBOARD = 6766, 8260


class Bed:
    """The bench's testbed and ssh to its hosts."""

    def __init__(self, hosts: int, image: str):
        root = tbplan.DEFAULT_ROOT
        try:
            tb.down(root, NAME, lambda line: None)  # left by a killed bench
        except Exception:  # noqa: BLE001 - none there
            pass
        plan = tbplan.plan_testbed(hosts=hosts, hardware="a3", name=NAME, subnet=SUBNET, image=image, nofile=20000)
        self.state = tb.up(plan, lambda line: print(f"testbed: {line}", flush=True), load_image=tb.load_image_by_save)

    def down(self) -> None:
        tb.down(self.state.root, NAME, lambda line: None)

    def address(self, i: int) -> str:
        return self.state.hosts[i].address

    def ssh(self, i: int, *command: str, check: bool = True) -> str:
        s = self.state
        proc = subprocess.run(["ssh", "-i", s.identity_file, "-o", f"UserKnownHostsFile={s.known_hosts}", "-o", "BatchMode=yes",
                               "--", f"root@{self.address(i)}", *command], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise SystemExit(f"bench: ssh {self.address(i)} {' '.join(command[:3])} failed: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def cluster(self, n: int, folder: Path) -> Path:
        lines = [line for line in Path(self.state.cluster_file).read_text().splitlines() if not line.startswith("  - host:")]
        path = folder / f"cluster-{n}.yaml"
        path.write_text("\n".join(lines + [f"  - host: {self.address(i)}" for i in range(n)]) + "\n")
        return path

    def clean(self, n: int, prefix: str) -> None:
        def one(i):
            self.ssh(i, "sh", "-c", f'ids=$(docker ps -aq --filter name={prefix}); [ -z "$ids" ] || docker rm -f $ids',
                     check=False)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def rlbox_bringup(n: int, cluster: Path, runs: Path) -> float:
    start = time.perf_counter()
    ready_at: list[float] = []

    def echo(line: str) -> None:
        if line.startswith("cluster ready"):
            ready_at.append(time.perf_counter())

    plan, run_dir = launch.prepare(launch.RunRequest(cluster_file=cluster, name=f"tbb{n}", runs_dir=runs))
    run.execute(plan, run_dir=run_dir, echo=echo, emit=lambda t: None, timeout=300, replace=True, bring_up_only=True,
                before=checks.checks_before_start(plan, replace=True, echo=echo))
    if not ready_at:
        raise SystemExit("bench: rlbox never said the cluster was ready")
    return ready_at[0] - start


def seed_script(bed: Bed, n: int, image: str) -> float:
    """(a) one host after another; the head polls `ray status` every 5 s (seed 001 §4.5)."""
    prefix = "rlbox-bench-seed"
    bed.clean(n, prefix)
    start = time.perf_counter()
    head = bed.address(0)
    done = threading.Event()
    ready: list[float] = []

    def poll_head():
        while not done.is_set():
            out = bed.ssh(0, "docker", "exec", f"{prefix}-0", "ray", "status", f"--address={head}:{GCS}", check=False)
            m = re.search(r"/(\d+(?:\.\d+)?) NPU", out)
            if m and int(float(m.group(1))) // NPUS == n:
                ready.append(time.perf_counter())
                done.set()
                return
            time.sleep(5)

    for i in range(n):
        name, ip = f"{prefix}-{i}", bed.address(i)
        bed.ssh(i, "docker", "run", "-d", "--name", name, "--network", "host", "--ipc", "host", "--entrypoint", "sleep",
                image, "infinity")
        if i == 0:
            bed.ssh(i, "docker", "exec", name, "ray", "start", "--head", f"--port={GCS}", f"--dashboard-port={DASHBOARD}",
                    f"--dashboard-host={head}", f"--node-ip-address={head}", f"--resources='{{\"NPU\": {NPUS}}}'",
                    "--disable-usage-stats")
            threading.Thread(target=poll_head, daemon=True).start()
        else:
            bed.ssh(i, "docker", "exec", name, "ray", "start", f"--address={head}:{GCS}", f"--node-ip-address={ip}",
                    f"--resources='{{\"NPU\": {NPUS}}}'", "--disable-usage-stats")
    done.wait(timeout=300)
    took = (ready[0] if ready else time.perf_counter()) - start
    bed.clean(n, prefix)
    if not ready:
        raise SystemExit("bench: the seed procedure's cluster never got ready")
    return took


def parallel_bare(bed: Bed, n: int, image: str) -> float:
    """(b) every host's bare `ray start --block` at once; REST readiness polled every 0.1 s."""
    prefix = "rlbox-bench-bare"
    bed.clean(n, prefix)
    start = time.perf_counter()
    head = bed.address(0)
    threads, failures = [], []

    def one(i: int) -> None:
        ip = bed.address(i)
        wait = "" if i == 0 else f"until (exec 3<>/dev/tcp/{head}/{GCS}) 2>/dev/null; do sleep 0.1; done; "
        role = (f"--head --port={GCS} --dashboard-port={DASHBOARD} --dashboard-host={head}" if i == 0
                else f"--address={head}:{GCS}")
        script = (f"{wait}exec ray start --block {role} --node-ip-address={ip} "
                  f"--resources='{{\"NPU\": {NPUS}}}' --disable-usage-stats")
        try:
            bed.ssh(i, "docker", "run", "-d", "--name", f"{prefix}-{i}", "--network", "host", "--ipc", "host",
                    "--entrypoint", "bash", image, "-c", f'"{script}"')
        except SystemExit as err:
            failures.append(str(err))

    for i in range(n):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(failures[0])
    took = None
    while time.perf_counter() - start < 300:
        try:
            rows = requests.get(f"http://{head}:{DASHBOARD}/api/v0/nodes", params={"detail": "1"}, timeout=2).json()["data"]["result"]["result"]
            if sum(int(r["resources_total"].get("NPU", 0)) for r in rows if r["state"] == "ALIVE") >= n * NPUS:
                took = time.perf_counter() - start
                break
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(0.1)
    bed.clean(n, prefix)
    if took is None:
        raise SystemExit("bench: bare cluster never got ready")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--quick", action="store_true", help="1 host, once (CI: proves the bench runs)")
    args = parser.parse_args()
    sizes = [1] if args.quick else args.hosts
    image = f"localhost/rlbox/sim:{launch.host_arch_variant()}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        raise SystemExit(f"bench: {image} missing; run `make sim-image`")
    bed = Bed(max(sizes), image)
    print(f"testbed: {max(sizes)} host(s) up in {bed.state.up_seconds:.1f} s; image into every host in "
          f"{bed.state.image_seconds:.1f} s (not counted below)", flush=True)
    results = []
    try:
        runs = Path(tempfile.mkdtemp(prefix="rlbox-tbb-runs-"))
        for n in sizes:
            cluster = bed.cluster(n, runs)
            r = rlbox_bringup(n, cluster, runs)
            a = seed_script(bed, n, image)
            b = parallel_bare(bed, n, image)
            results.append({"hosts": n, "rlbox_s": round(r, 2), "seed_script_s": round(a, 2), "parallel_bare_s": round(b, 2)})
            print(f"{n} host(s): rlbox {r:6.1f} s | (a) seed ray_start.sh {a:6.1f} s | (b) bare parallel ray start {b:6.1f} s"
                  f" | rlbox/(a) {r / a:4.2f} | rlbox/(b) {r / b:4.2f} | rlbox-(b) {r - b:+5.1f} s", flush=True)
    finally:
        bed.down()
    print("RESULTS " + json.dumps(results))
    return 0


if __name__ == "__main__":
    from rlbox.core.errors import RlboxError

    try:
        sys.exit(main())
    except RlboxError as err:  # one line, as rlbox says it (the testbed was taken down)
        raise SystemExit(f"bench: {err}") from None
