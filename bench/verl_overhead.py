#!/usr/bin/env python3
"""Benchmark: a real verl job (recipe grpo-tiny-cpu on the verl_cpu image with the verl-cpu-shims
stand-in, 2 nodes x 2 NPUs) through `rlbox run`, against the same job by hand (simulated nodes;
--testbed: two testbed hosts).

1. Overhead to verl's first step: seconds from `rlbox run` to verl's `step:1` line, against the
   baseline measured in the same invocation: two containers of the same image on a Docker network
   (`docker run ... ray start --head` / `ray start --address`, same `--num-cpus` and NPU resource),
   then `docker exec HEAD python3 -m verl.trainer.main_ppo` with the same overrides rlbox submits,
   unbuffered as Ray's job driver runs it, from the first `docker run` to `step:1`. Ratio rlbox /
   by hand (goal <= 1.1).
2. Node death to verl's resumed step: the worker container is killed after verl's step 2; seconds
   to rlbox naming it, and to verl's first step after "Resuming from .../global_step_2" (teardown,
   bring-up, verl start-up, checkpoint load). Baseline: Ray's own detection in the hand-made
   cluster (its node table, /api/v0/nodes, marks the killed worker DEAD), what a launcher that only
   watched Ray would wait for before it could even start over.

    bench/verl_overhead.py [--quick] [--testbed [--no-doctor]]
        (default 2 repetitions; --quick, which CI runs: one repetition at the smallest size, 2 nodes
        x 1 NPU, to verl's first step only, i.e. measure 1 without the node death of 2, with rlbox and
        by hand started at once: it proves the bench runs, its times are no measure)

--testbed: the same on two hosts of a testbed (`rlbox testbed up`; each host its own address,
Docker engine and sshd; docs/testbed.md) instead of the simulation: `rlbox run --cluster` over ssh
with its pre-flight, against `ray start` in a `--network host` container on each host's own engine
(head on host 1, worker on host 2) and `main_ppo` in the head; the worker is killed on host 2's
engine. The image reaches both hosts through `rlbox distribute` before anything is timed (its time
is printed apart). RLBOX_BENCH_PREFIX names its runs (default vl: vl-bench-0). Testbed name and
subnet: RLBOX_BENCH_TESTBED (default tbv) and RLBOX_BENCH_TESTBED_SUBNET (default 10.201.8.0/24).
Needs root. --no-doctor: rlbox run without its pre-flight (pre-flight wants 20 GiB free on each
host; testbed hosts share this machine's disk).

Needs the engine and this machine's CPU torch wheel (the image is built if missing, as the test does).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support import verl_cpu  # noqa: E402

FIRST_DEVICE, CPUS = 3, "4"  # Ray ports 23000-23999 (slot 3); see docs/cpu-training.md for --num-cpus
# runs, containers and networks: PREFIX-0, PREFIX-hand-0-head, ... (tests/test_bench_quick.py gives its own prefix)
PREFIX = os.environ.get("RLBOX_BENCH_PREFIX", "vl") + "-bench"
TESTBED = os.environ.get("RLBOX_BENCH_TESTBED", "tbv")
TESTBED_SUBNET = os.environ.get("RLBOX_BENCH_TESTBED_SUBNET", "10.201.8.0/24")


def devices(first: int, npus: int) -> str:
    """--devices: NPUS ids per node from FIRST, as a range ("3-3": a bare "3" is a count)."""
    return f"{first}-{first + npus - 1}"


class Sim:
    """Both ways on this machine's engine: rlbox's simulated nodes, by hand a Docker network."""

    def __init__(self, npus: int):
        # no doctor: other runs' NPUs share this engine
        self.cluster = ("--sim", "--nodes", "2", "--no-doctor", "--devices", devices(FIRST_DEVICE, npus))

    def cli(self, node: int) -> list[str]:
        return ["docker"]

    def docker(self, node: int, *args: str, check: bool = True) -> str:
        return docker(*args, check=check)

    def hand_network(self, rep: int) -> list[str]:
        net = f"{PREFIX}-hand-{rep}"
        # its own subnet: an engine's next automatic pool can be 172.30.0.0/16, where rlbox's side, started at
        # the same time in --quick, takes its simulation network's /24 (sim.create_network)
        docker("network", "create", "--subnet", f"10.236.{rep % 250}.0/24", net)
        return ["--network", net]  # a container's name resolves to its address there: gloo finds its peers

    def hand_ray(self, head: str) -> tuple[list[str], list[str]]:
        return ["--head", "--port", "6379", "--dashboard-host", "0.0.0.0"], [f"--address={head}:6379"]

    def address(self, node: int, container: str, rep: int) -> str:
        return json.loads(docker("inspect", container))[0]["NetworkSettings"]["Networks"][f"{PREFIX}-hand-{rep}"]["IPAddress"]

    def hand_cleanup(self, rep: int) -> None:
        docker("network", "rm", f"{PREFIX}-hand-{rep}", check=False)

    def down(self) -> None:
        pass


class OnTestbed:
    """Both ways on two testbed hosts: rlbox over ssh, by hand on each host's own engine."""

    def __init__(self, image: str, npus: int, doctor: bool = True):
        from support.testbed import Testbed, problem

        why = problem()
        if why:
            raise SystemExit(f"bench --testbed: {why}")
        self.bed = Testbed.up(hosts=2, hardware="a3", name=TESTBED, extra=("--subnet", TESTBED_SUBNET))
        try:
            t0 = time.monotonic()
            self.bed.deliver(image)
            print(f"image {image} to 2 testbed hosts by rlbox distribute: {time.monotonic() - t0:.1f} s (not timed below)",
                  flush=True)
        except BaseException:
            self.down()
            raise
        self.cluster = ("--cluster", self.bed.cluster(1, 2), "--devices", devices(0, npus),
                        *(() if doctor else ("--no-doctor",)))

    def cli(self, node: int) -> list[str]:
        return ["docker", "-H", f"unix://{self.bed.socket(node + 1)}"]

    def docker(self, node: int, *args: str, check: bool = True) -> str:
        proc = self.bed.docker(node + 1, *args, check=False)
        if check and proc.returncode != 0:
            raise SystemExit(f"docker on host {node + 1} {shlex.join(args)}: {proc.stderr.strip()[-500:]}")
        return proc.stdout.strip()

    def hand_network(self, rep: int) -> list[str]:
        # the hosts share one hostname, which resolves to 127.0.0.1: without an interface, gloo's workers
        # offer their peers a loopback address ("Gloo connectFullMesh failed ... remote=[127.0.0.1]");
        # an operator sets what rlbox sets on every node (the interface routing to the head)
        return ["--network", "host", "-e", "GLOO_SOCKET_IFNAME=eth0", "-e", "TP_SOCKET_IFNAME=eth0",
                "-e", "HCCL_SOCKET_IFNAME=eth0"]

    def hand_ray(self, head: str) -> tuple[list[str], list[str]]:
        ip1, ip2 = self.bed.address(1), self.bed.address(2)
        return (["--head", "--port", "6379", f"--node-ip-address={ip1}", f"--dashboard-host={ip1}"],
                [f"--address={ip1}:6379", f"--node-ip-address={ip2}"])

    def address(self, node: int, container: str, rep: int) -> str:
        return self.bed.address(node + 1)

    def hand_cleanup(self, rep: int) -> None:
        pass

    def down(self) -> None:
        proc = self.bed.down()
        if proc.returncode != 0:
            print(f"bench: testbed down: {proc.stderr.strip()[-500:]}", file=sys.stderr)


class Lines:
    """A process's output lines with the time each arrived."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        threading.Thread(target=lambda: [self.lines.append((time.monotonic(), x)) for x in proc.stdout], daemon=True).start()

    def wait_for(self, text: str, timeout: float, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if t >= after and text in line:
                    return t
            if self.proc.poll() is not None:
                time.sleep(0.5)
                hit = [t for t, line in self.lines if t >= after and text in line]
                if hit:
                    return hit[0]
                raise SystemExit(f"ended before {text!r}:\n" + "".join(x for _, x in self.lines)[-4000:])
            time.sleep(0.1)
        raise SystemExit(f"no {text!r} in {timeout} s:\n" + "".join(x for _, x in self.lines)[-4000:])


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], text=True, capture_output=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"docker {shlex.join(args)}: {proc.stderr.strip()[-500:]}")
    return proc.stdout.strip()


def with_rlbox(where, image: str, shared: Path, runs: Path, rep: int, first_only: bool = False) -> dict:
    name = f"{PREFIX}-{rep}"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "run", *where.cluster,
                             "--num-cpus", CPUS, "--image", image, "--recipe", "grpo-tiny-cpu", "--mount", f"{shared}:/data",
                             "--param", "steps=4", "--param", f"checkpoint_dir=/data/ck-rlbox-{rep}", "--max-restarts", "1",
                             "--timeout", "900", "--name", name, "--runs-dir", str(runs)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Lines(proc)
    try:
        first = out.wait_for("step:1 ", 1200)
        if first_only:  # Ctrl-C: rlbox tears every node down and exits 130
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=300)
            return {"first_step": first - t0, "code": 0 if code == 130 else code}
        out.wait_for("step:2 ", 600)
        state = json.loads((runs / name / "state.json").read_text())
        killed = time.monotonic()
        where.docker(1, "kill", state["nodes"][1]["container"])
        named = out.wait_for("was lost", 300, after=killed)
        resuming = out.wait_for("Resuming from", 1200, after=killed)
        resumed = out.wait_for("step:3 ", 600, after=resuming)
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=300)
    return {"first_step": first - t0, "named": named - killed, "resumed_step": resumed - killed, "code": code}


def verl_argv(npus: int) -> list[str]:
    """The job rlbox submits for the recipe (its overrides, trainer.nnodes/n_gpus_per_node)."""
    from rlbox.cluster import jobs, recipes

    argv, _ = recipes.load("grpo-tiny-cpu").resolve({"steps": "4", "checkpoint_dir": "/data/ck-hand"}, [])
    return list(jobs.plan_job(argv, nodes=2, npus_per_node=npus, run="bench", run_id="x").argv)


def by_hand(where, image: str, shared: Path, rep: int, ckpt: str, npus: int, first_only: bool = False) -> dict:
    head, worker = f"{PREFIX}-hand-{rep}-head", f"{PREFIX}-hand-{rep}-worker"
    ray = ["ray", "start", "--block", "--disable-usage-stats", "--num-cpus", CPUS, "--resources", json.dumps({"NPU": npus})]
    argv = [a.replace("/data/ck-hand", ckpt) for a in verl_argv(npus)]
    common = ["--detach", *where.hand_network(rep), "--shm-size", "2g", "-v", f"{shared}:/data"]
    head_args, worker_args = where.hand_ray(head)
    proc = None
    try:
        t0 = time.monotonic()
        where.docker(0, "run", *common, "--name", head, image, *ray, *head_args)
        where.docker(1, "run", *common, "--name", worker, image, *ray, *worker_args)
        head_ip, worker_ip = where.address(0, head, rep), where.address(1, worker, rep)
        nodes = f"http://{head_ip}:8265/api/v0/nodes"
        while True:  # what a person does: wait until `ray status` shows both nodes
            try:
                rows = requests.get(nodes, params={"detail": "1"}, timeout=2).json()["data"]["result"]["result"]
                if sum(r["state"] == "ALIVE" for r in rows) == 2:
                    break
            except (requests.RequestException, KeyError, ValueError):
                pass
            if time.monotonic() - t0 > 900:
                raise SystemExit("by hand: the Ray cluster never had 2 nodes")
            time.sleep(0.5)
        # unbuffered, as Ray's job driver runs an entrypoint: through a pipe Python holds the driver's lines
        # (verl's step:N among them) in an 8 KB buffer, and step:1 arrived with step:3, seconds late
        proc = subprocess.Popen([*where.cli(0), "exec", "-e", "RAY_ADDRESS=auto", "-e", "PYTHONUNBUFFERED=1", head, *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = Lines(proc)
        first = out.wait_for("step:1 ", 1200)
        if first_only:
            return {"first_step": first - t0, "ray_dead": None}
        out.wait_for("step:2 ", 600)
        killed = time.monotonic()
        where.docker(1, "kill", worker)
        dead = None
        while dead is None and time.monotonic() - killed < 300:
            try:
                rows = requests.get(nodes, params={"detail": "1"}, timeout=2).json()["data"]["result"]["result"]
                if any(r["node_ip"] == worker_ip and r["state"] == "DEAD" for r in rows):
                    dead = time.monotonic() - killed
            except (requests.RequestException, KeyError, ValueError):
                pass
            time.sleep(0.2)
        return {"first_step": first - t0, "ray_dead": dead}
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        where.docker(0, "rm", "--force", head, check=False)
        where.docker(1, "rm", "--force", worker, check=False)
        where.hand_cleanup(rep)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="one repetition, 2 nodes x 1 NPU, rlbox and by hand at once, to verl's first step only (CI)")
    ap.add_argument("--testbed", action="store_true", help="on two testbed hosts (rlbox run --cluster) instead of --sim")
    ap.add_argument("--no-doctor", action="store_true",
                    help="with --testbed: rlbox run without its pre-flight (e.g. the hosts share a disk under 20 GiB free)")
    args = ap.parse_args()
    reps, npus = (1, 1) if args.quick else (2, 2)
    work = Path(tempfile.mkdtemp(prefix="vl-bench-"))
    built = verl_cpu.build(work / "index")
    if built is None or built.returncode != 0:
        raise SystemExit("cannot build the verl_cpu image: " + ("no CPU torch wheel" if built is None else built.stderr[-2000:]))
    image = verl_cpu.image()
    shared = work / "shared"
    for made in (verl_cpu.make_model(image, shared), verl_cpu.make_data(image, shared, work / "hub")):
        if made.returncode != 0:
            raise SystemExit(made.stderr[-2000:])
    where = OnTestbed(image, npus, doctor=not args.no_doctor) if args.testbed else Sim(npus)
    rl, hand = [], []
    try:
        for rep in range(reps):
            if args.quick:  # both sides at once (CI: every phase runs; on 2 cores each slows the other, no measure)
                with ThreadPoolExecutor(1) as pool:
                    side = pool.submit(by_hand, where, image, shared, rep, f"/data/ck-hand-{rep}", npus, first_only=True)
                    rl.append(with_rlbox(where, image, shared, work / "runs", rep, first_only=True))
                    hand.append(side.result())
            else:
                hand.append(by_hand(where, image, shared, rep, f"/data/ck-hand-{rep}", npus))
                rl.append(with_rlbox(where, image, shared, work / "runs", rep))
            print(f"rep {rep}: rlbox {rl[-1]}  by hand {hand[-1]}", flush=True)
    finally:
        where.down()
    print("on " + (f"2 testbed hosts (rlbox run --cluster, pre-flight {'off' if args.no_doctor else 'on'})" if args.testbed
                    else "2 simulated nodes (rlbox run --sim)") + f" x {npus} NPU(s)")
    first_rl = statistics.median(r["first_step"] for r in rl)
    first_hand = statistics.median(h["first_step"] for h in hand)
    print(f"to verl's first step: rlbox run {first_rl:7.1f} s, by hand (docker run + ray start + main_ppo) "
          f"{first_hand:7.1f} s -> overhead ratio {first_rl / first_hand:.2f} (goal <= 1.1)")
    if args.quick:
        print(f"(--quick: one repetition to the first step, rlbox and by hand at once: each slowed the other, so "
              f"neither time nor the ratio is a measure; node death not measured; rlbox exit codes "
              f"{[r['code'] for r in rl]}, 0 = stopped by Ctrl-C with every node cleaned up)")
        return 0 if all(r["code"] == 0 for r in rl) else 1
    named = statistics.median(r["named"] for r in rl)
    resumed = statistics.median(r["resumed_step"] for r in rl)
    deads = [h["ray_dead"] for h in hand if h["ray_dead"] is not None]
    print(f"node death -> rlbox names it {named:6.1f} s; -> verl's first step after resuming {resumed:6.1f} s")
    if deads:
        ray_dead = statistics.median(deads)
        print(f"baseline: Ray marks the killed node DEAD after {ray_dead:6.1f} s (rlbox naming / Ray = {named / ray_dead:.2f})")
    else:
        print("baseline: Ray did not mark the killed node DEAD within 300 s")
    print(f"(median of {reps} repetition(s); rlbox exit codes {[r['code'] for r in rl]})")
    return 0 if all(r["code"] == 0 for r in rl) else 1


if __name__ == "__main__":
    sys.exit(main())
