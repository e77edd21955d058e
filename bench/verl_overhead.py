#!/usr/bin/env python3
"""Benchmark: a real verl job (recipe grpo-tiny-cpu on the verl_cpu image with the verl-cpu-shims
stand-in, 2 simulated nodes x 2 NPUs) through `rlbox run --sim`, against the same job by hand.

1. Overhead to verl's first step: seconds from `rlbox run` to verl's `step:1` line, against the
   baseline measured in the same invocation: two containers of the same image on a Docker network
   (`docker run ... ray start --head` / `ray start --address`, same `--num-cpus` and NPU resource),
   then `docker exec HEAD python3 -m verl.trainer.main_ppo` with the same overrides rlbox submits,
   from the first `docker run` to `step:1`. Ratio rlbox / by hand (goal <= 1.1).
2. Node death to verl's resumed step: the worker container is killed after verl's step 2; seconds
   to rlbox naming it, and to verl's first step after "Resuming from .../global_step_2" (teardown,
   bring-up, verl start-up, checkpoint load). Baseline: Ray's own detection in the hand-made
   cluster (its node table, /api/v0/nodes, marks the killed worker DEAD), what a launcher that only
   watched Ray would wait for before it could even start over.

    bench/verl_overhead.py [--quick]     (--quick: one repetition; default 2)

Needs the engine and this machine's CPU torch wheel (the image is built if missing, as the test does).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support import verl_cpu  # noqa: E402

DEVICES, CPUS = "3-4", "4"  # Ray ports 23000-23999 (slot 3); see docs/cpu-training.md for --num-cpus


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


def with_rlbox(image: str, shared: Path, runs: Path, rep: int) -> dict:
    name = f"vl-bench-{rep}"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "run", "--sim", "--nodes", "2", "--devices", DEVICES,
                             "--num-cpus", CPUS, "--image", image, "--recipe", "grpo-tiny-cpu", "--mount", f"{shared}:/data",
                             "--param", "steps=4", "--param", f"checkpoint_dir=/data/ck-rlbox-{rep}", "--max-restarts", "1",
                             "--no-doctor", "--timeout", "900", "--name", name, "--runs-dir", str(runs)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Lines(proc)
    try:
        first = out.wait_for("step:1 ", 1200)
        out.wait_for("step:2 ", 600)
        state = json.loads((runs / name / "state.json").read_text())
        killed = time.monotonic()
        docker("kill", state["nodes"][1]["container"])
        named = out.wait_for("was lost", 300, after=killed)
        resuming = out.wait_for("Resuming from", 1200, after=killed)
        resumed = out.wait_for("step:3 ", 600, after=resuming)
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=300)
    return {"first_step": first - t0, "named": named - killed, "resumed_step": resumed - killed, "code": code}


def verl_argv() -> list[str]:
    """The job rlbox submits for the recipe (its overrides, trainer.nnodes/n_gpus_per_node)."""
    from rlbox.cluster import jobs, recipes

    argv, _ = recipes.load("grpo-tiny-cpu").resolve({"steps": "4", "checkpoint_dir": "/data/ck-hand"}, [])
    return list(jobs.plan_job(argv, nodes=2, npus_per_node=2, run="bench", run_id="x").argv)


def by_hand(image: str, shared: Path, rep: int, ckpt: str) -> dict:
    net, head, worker = f"vl-bench-hand-{rep}", f"vl-bench-hand-{rep}-head", f"vl-bench-hand-{rep}-worker"
    common = ["--detach", "--network", net, "--shm-size", "2g", "-v", f"{shared}:/data"]
    ray = ["ray", "start", "--block", "--disable-usage-stats", "--num-cpus", CPUS, "--resources", '{"NPU": 2}']
    argv = [a.replace("/data/ck-hand", ckpt) for a in verl_argv()]
    docker("network", "create", net)
    proc = None
    try:
        t0 = time.monotonic()
        docker("run", *common, "--name", head, image, *ray, "--head", "--port", "6379", "--dashboard-host", "0.0.0.0")
        docker("run", *common, "--name", worker, image, *ray, f"--address={head}:6379")
        head_ip = json.loads(docker("inspect", head))[0]["NetworkSettings"]["Networks"][net]["IPAddress"]
        worker_ip = json.loads(docker("inspect", worker))[0]["NetworkSettings"]["Networks"][net]["IPAddress"]
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
        proc = subprocess.Popen(["docker", "exec", "-e", "RAY_ADDRESS=auto", head, *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = Lines(proc)
        first = out.wait_for("step:1 ", 1200)
        out.wait_for("step:2 ", 600)
        killed = time.monotonic()
        docker("kill", worker)
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
        docker("rm", "--force", head, worker, check=False)
        docker("network", "rm", net, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repetition")
    args = ap.parse_args()
    reps = 1 if args.quick else 2
    work = Path(tempfile.mkdtemp(prefix="vl-bench-"))
    built = verl_cpu.build(work / "index")
    if built is None or built.returncode != 0:
        raise SystemExit("cannot build the verl_cpu image: " + ("no CPU torch wheel" if built is None else built.stderr[-2000:]))
    image = verl_cpu.image()
    shared = work / "shared"
    for made in (verl_cpu.make_model(image, shared), verl_cpu.make_data(image, shared, work / "hub")):
        if made.returncode != 0:
            raise SystemExit(made.stderr[-2000:])
    rl, hand = [], []
    for rep in range(reps):
        hand.append(by_hand(image, shared, rep, f"/data/ck-hand-{rep}"))
        rl.append(with_rlbox(image, shared, work / "runs", rep))
        print(f"rep {rep}: rlbox {rl[-1]}  by hand {hand[-1]}", flush=True)
    first_rl = statistics.median(r["first_step"] for r in rl)
    first_hand = statistics.median(h["first_step"] for h in hand)
    named = statistics.median(r["named"] for r in rl)
    resumed = statistics.median(r["resumed_step"] for r in rl)
    deads = [h["ray_dead"] for h in hand if h["ray_dead"] is not None]
    print(f"to verl's first step: rlbox run {first_rl:7.1f} s, by hand (docker run + ray start + main_ppo) "
          f"{first_hand:7.1f} s -> overhead ratio {first_rl / first_hand:.2f} (goal <= 1.1)")
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
