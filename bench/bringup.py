#!/usr/bin/env python3
"""Benchmark: time from `rlbox run --cluster` to a ready cluster, for 1, 2, 4, 8 and 16 A3 hosts
of a testbed (`rlbox testbed`: each host its own address, Docker engine and sshd on this machine).

Measured in the same run, on the same testbed hosts and image, against two baselines, each
driving the hosts over ssh as an operator does:

  (a) seed 001's ray_start.sh: hosts brought up one after another (`ray start` on a node run to
      completion before the next node is started), the head polling `ray status` every 5 s
      until NHOSTS x 16 NPUs are there;
  (b) bare parallel `ray start --block` on every host at once (`ssh HOST docker run --network
      host ...`), workers waiting for the head's port, ready when Ray's node table (the head's
      dashboard) has every host's node alive with its NPUs, polled as rlbox polls it (ray.POLL, 0.25 s;
      each read costs the head's dashboard ~3-5 ms of CPU, so a faster poll would load the baseline
      more than rlbox): the readiness rlbox waits for (ray.wait_for_npus), what Ray itself needs here.

Before each baseline the bench checks that nothing answers on its Ray ports (a cluster left over
would be read as ready at once), and after each that none of its containers is left on any host.

rlbox is timed from the start of planning to its "cluster ready" line: counting the hosts' NPUs
over ssh, the pre-flight checks (`rlbox doctor` on every host, also timed alone) as `rlbox run`
does them, claims, containers, Ray, readiness; with rlbox's own breakdown of those seconds (its
`bring-up:` line: ssh, image, pre-flight, claims, containers, head, workers, NPUs), each with how busy
this machine's CPUs were in it (/proc/stat: near 100 % is CPU-bound work, less is waiting). For rlbox and (b)
alike, the CPU-seconds from start to ready: this machine's, and of them the hosts' containers' (their cgroups:
Ray's own work), the rest being the launcher's (its checks, ssh, sshd, the engines). Then, on the ready cluster, the node watch's CPU
per tick (20 forced looks: every engine and Ray's node table), then teardown, timed (each
baseline's teardown too). Loading the image into the hosts is not counted (it is done once,
before; `rlbox testbed up` prints its time).
Prints the times and the ratios rlbox/(a) and rlbox/(b) per size, then at the largest size rlbox/(b)
and rlbox against itself at the smallest, the watch's CPU per tick per node, and the load average.
--reps N: each size N times (rlbox, then the baselines, each time), the summary each size's median.
--quick: 1 host, once. --name/--subnet: the testbed's (tbb, 10.201.3.0/24); --reuse: a testbed that is up,
used as it is and left up (CI's quick run uses the test session's, as bench/faults.py does).
Needs root and the sim image (make sim-image).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


from rlbox.cluster import bringup as phases_of
from rlbox.cluster import execute as run
from rlbox.cluster import launch
from rlbox.cluster import hosts, ray, watch
from rlbox.cluster import state as run_state
from rlbox.cluster.plan import LABEL_RUN
from _quiet import cpu_jiffies, own_cpu, settle
from rlbox.cluster.preflight import checks
from rlbox.core.errors import RlboxError
from rlbox.delivery import execute as deliver
from rlbox.testbed import execute as tb
from rlbox.testbed import plan as tbplan
from rlbox.testbed import state as tb_state

NPUS = 16
NAME = "tbb"
SUBNET = "10.201.3.0/24"
RESOURCES = json.dumps({"NPU": NPUS})
GCS, DASHBOARD = 6766, 8260


class Bed:
    """The bench's testbed and ssh to its hosts."""

    def __init__(self, hosts: int, image: str, name: str = NAME, subnet: str = SUBNET, reuse: bool = False):
        root = tbplan.DEFAULT_ROOT
        self.name, self.image, self.reused = name, image, reuse
        if reuse:  # a testbed that is up (CI: the test session's), used as it is and left up
            self.state = tb_state.load(root, name)
            if len(self.state.hosts) < hosts or self.state.hardware != "a3":
                raise SystemExit(f"bench: --reuse {name}: {len(self.state.hosts)} {self.state.hardware} host(s); "
                                 f"this bench needs {hosts} a3 host(s)")
            return
        try:
            tb.down(root, name, lambda line: None)  # left by a killed bench
        except Exception:  # noqa: BLE001 - none there
            pass
        plan = tbplan.plan_testbed(hosts=hosts, hardware="a3", name=name, subnet=subnet, image=image, nofile=20000)
        self.state = tb.up(plan, lambda line: print(f"testbed: {line}", flush=True), load_image=tb.load_image_by_save)

    def down(self) -> None:
        if not self.reused:
            tb.down(self.state.root, self.name, lambda line: None)

    def address(self, i: int) -> str:
        return self.state.hosts[i].address

    def ssh(self, i: int, *command: str, check: bool = True) -> str:
        """Run ``command`` on host i, each argument as given: ssh joins its arguments into one line
        for the remote shell, so they are quoted here (unquoted, `sh -c 'a; b'` ran only `a` there,
        and a JSON argument lost its double quotes)."""
        s = self.state
        proc = subprocess.run(["ssh", "-i", s.identity_file, "-o", f"UserKnownHostsFile={s.known_hosts}", "-o", "BatchMode=yes",
                               "--", f"root@{self.address(i)}", shlex.join(command)], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise SystemExit(f"bench: ssh {self.address(i)} {' '.join(command[:3])} failed: {proc.stderr.strip()[-300:]}")
        return proc.stdout

    def cluster(self, n: int, folder: Path) -> Path:
        lines = [f"image: {self.image}"] + [line for line in Path(self.state.cluster_file).read_text().splitlines()
                                             if not line.startswith(("  - host:", "image:"))]
        path = folder / f"cluster-{n}.yaml"
        path.write_text("\n".join(lines + [f"  - host: {self.address(i)}" for i in range(n)]) + "\n")
        return path

    def containers_cpu(self, n: int, before: bool = False) -> float:
        """CPU-seconds used so far by every container of hosts 0..n-1: each host's engine puts its containers
        under the cgroup named after its namespace (`--cgroup-parent`), whose usage counts removed ones too.
        Ray's own work (and a node's start script), apart from the launcher, ssh and the engines; nan where a
        host's cgroup cannot be read (then no split is claimed). ``before`` a bring-up, a host whose engine has
        run no container yet has no such cgroup (the engine makes it with the first): 0 there."""
        total = 0.0
        for h in self.state.hosts[:n]:
            v1, v2 = Path("/sys/fs/cgroup/cpuacct", h.netns, "cpuacct.usage"), Path("/sys/fs/cgroup", h.netns, "cpu.stat")
            if v1.exists():
                total += int(v1.read_text()) / 1e9
            elif v2.exists():
                total += next(int(line.split()[1]) for line in v2.read_text().splitlines() if line.startswith("usage_usec")) / 1e6
            elif not before:  # missing after a bring-up too: not this layout of cgroups, so nan in the end
                return float("nan")
        return total

    def on_all(self, n: int, one) -> list:
        out: list = [None] * n

        def run(i):
            out[i] = one(i)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def clean(self, n: int, prefix: str) -> None:
        """Remove the baseline's containers from hosts 0..n-1 and check that none is left."""
        self.on_all(n, lambda i: self.ssh(i, "sh", "-c", f"docker ps -aq --filter name={prefix} | xargs -r docker rm -f",
                                          check=False))
        left = [self.address(i) for i, out in enumerate(self.on_all(
            n, lambda i: self.ssh(i, "docker", "ps", "-aq", "--filter", f"name={prefix}"))) if out.strip()]
        if left:
            raise SystemExit(f"bench: {prefix} containers still on {', '.join(left)} after removing them")

    def quiet(self, n: int) -> None:
        """Nothing answers on the baselines' Ray ports: a cluster left over would be read as ready."""
        busy = [self.address(i) for i, out in enumerate(self.on_all(n, lambda i: self.ssh(
            i, "sh", "-c", f"(exec 3<>/dev/tcp/127.0.0.1/{GCS}) 2>/dev/null && echo busy; "
                           f"(exec 3<>/dev/tcp/{self.address(i)}/{DASHBOARD}) 2>/dev/null && echo busy; true"))) if out.strip()]
        if busy:
            raise SystemExit(f"bench: Ray ports {GCS}/{DASHBOARD} already answer on {', '.join(busy)}; a cluster is left over")

    def ready(self, n: int, start: float) -> float:
        """Seconds from ``start`` until Ray reports every host's node alive with all its NPUs: the same
        readiness rlbox waits for (ray.wait_for_npus, through the head's dashboard)."""
        expected = {f"node{i}": self.address(i) for i in range(n)}
        ray.wait_for_npus(f"http://{self.address(0)}:{DASHBOARD}", expected, n * NPUS, timeout=300, poll=ray.POLL)
        return time.perf_counter() - start


TICKS = 20


class Memory:
    """The testbed's hosts' memory, sampled every ``period`` s: the PSS of each host's processes
    (its holder and everything under it: init, dockerd, containerd, sshd, containers, Ray; shared
    pages split between the processes sharing them, so the sum is what the hosts take). The peak
    of the sum, per number of hosts running, and the idle figure once the hosts are up."""

    def __init__(self, bed: Bed, period: float = 5.0):
        self.bed, self.period = bed, period
        self.peak: dict[int, int] = {}
        self.label = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sample(self) -> int:
        parent: dict[int, int] = {}
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    parent[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        kids: dict[int, list[int]] = {}
        for pid, ppid in parent.items():
            kids.setdefault(ppid, []).append(pid)
        todo = [h.holder_pid for h in self.bed.state.hosts if h.holder_pid]
        total = 0
        while todo:
            pid = todo.pop()
            todo += kids.get(pid, [])
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
            except (OSError, IndexError, ValueError):
                continue
        return total

    def run(self) -> None:
        while not self.stop.wait(self.period):
            used = self.sample()
            self.peak[self.label] = max(self.peak.get(self.label, 0), used)


def busy_per_phase(marks: list[tuple[str, tuple[int, int]]], start: tuple[int, int]) -> str:
    """How busy this machine's CPUs were in each of rlbox's phases: CPU-bound work, or waiting."""
    out, last = {}, start
    for phase, now in marks:
        busy, every = now[0] - last[0], now[1] - last[1]
        before = out.get(phase, (0, 0))
        out[phase] = (before[0] + busy, before[1] + every)
        last = now
    return ", ".join(f"{phase} {100 * b / a:.0f} %" for phase, (b, a) in out.items() if a)


class Sampler:
    """`perf record -a` (every CPU, 99 samples a second, CLOCK_MONOTONIC stamps) from the start of planning
    to the cluster's ready line; ``stop`` cuts its samples at rlbox's own phase marks and says, per phase,
    the CPU-seconds of the process names that took the most: whose work a phase waits for."""

    HZ = 99

    def __init__(self):
        self.out = Path(tempfile.mkdtemp(prefix="rlbox-bench-perf-")) / "perf.data"
        self.proc = subprocess.Popen(["perf", "record", "-a", "-F", str(self.HZ), "-k", "CLOCK_MONOTONIC", "-o",
                                      str(self.out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf's own start is not counted in any phase

    def stop(self, times: list[tuple[str, float]]) -> str:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        script = subprocess.run(["perf", "script", "-i", str(self.out), "-F", "comm,time"], capture_output=True,
                                text=True).stdout
        shutil.rmtree(self.out.parent, ignore_errors=True)
        cuts = [(t, phase) for phase, t in times[1:]]
        counts: dict[str, dict[str, int]] = {}
        for line in script.splitlines():
            comm, _, stamp = line.strip().rstrip(":").rpartition(" ")
            try:
                t = float(stamp)
            except ValueError:
                continue
            if t < times[0][1] or t > cuts[-1][0]:
                continue
            phase = next(p for end, p in cuts if t <= end)
            bucket = counts.setdefault(phase, {})
            name = re.sub(r"[:/].*$|[0-9]+$", "", comm.strip()) or comm.strip()  # ray::IDLE, kworker/0:1
            bucket[name] = bucket.get(name, 0) + 1
        lines = []
        for _, phase in dict.fromkeys(cuts):
            top = sorted(counts.get(phase, {}).items(), key=lambda kv: -kv[1])[:6]
            cpu = sum(counts.get(phase, {}).values()) / self.HZ
            lines.append(f"{phase} {cpu:.1f} CPU-s: " + ", ".join(f"{c} {k / self.HZ:.1f}" for c, k in top))
        return "; ".join(lines)


def cpu_so_far(bed: Bed, n: int, before: bool = False) -> tuple[float, float]:
    """(this machine's busy CPU-seconds, those of hosts 0..n-1's containers) so far: read at a bring-up's start
    (``before``) and at its ready, what lies between is what the bring-up cost, Ray's part and the rest
    (launcher, ssh, sshd, engines, the commands a check runs on a host)."""
    return cpu_jiffies()[0] / os.sysconf("SC_CLK_TCK"), bed.containers_cpu(n, before)


def cpu_since(bed: Bed, n: int, start: tuple[float, float]) -> tuple[float, float]:
    """What cpu_so_far has grown by since ``start`` (one read of it at a bring-up's start)."""
    return tuple(b - a for a, b in zip(start, cpu_so_far(bed, n)))


def busy_share(spent: tuple[float, float], seconds: float) -> float:
    """How busy this machine's CPUs were from a bring-up's start to its ready: its CPU-seconds over what
    every CPU could give in that time (1.0: CPU-bound throughout, lower: time spent waiting)."""
    return spent[0] / (seconds * (os.cpu_count() or 1))


def cpu_line(spent: tuple[float, float], seconds: float) -> str:
    machine, containers = spent
    return (f"{machine:.1f} CPU-s to ready: containers {containers:.1f}, the rest {machine - containers:.1f}, "
            f"the CPUs {busy_share(spent, seconds):.0%} busy")


def rlbox_bringup(bed: Bed, n: int, cluster: Path, runs: Path, name: str, perf: bool = False) -> dict:
    """rlbox's bring-up to its "cluster ready" line (pre-flight within it, also timed alone), then the
    node watch's CPU per tick over the ready cluster (this process's CPU time, all its threads, for
    TICKS forced looks: every engine and Ray's node table), then teardown (`rlbox stop`'s removal); with
    ``perf``, each phase's CPU by process name (Sampler)."""
    sampler = Sampler() if perf else None
    times: list[tuple[str, float]] = [("start", time.monotonic())]
    # rlbox's own CPU (its process and its ssh: a walk of /proc, ~30 ms with 16 hosts' Ray up) is read at the
    # start and at ready, outside the timed window and the machine's CPU count; at each phase mark only with
    # ``perf`` (a dozen walks inside the window cost the measured bring-up ~0.3 CPU-s that bare's does not pay)
    own: list[tuple[str, float]] = [("start", own_cpu())]
    cpu_start = cpu_so_far(bed, n, before=True)
    start = time.perf_counter()
    ready_at: list[float] = []
    cpu_ready: list[tuple[float, float]] = []
    spent: list[float] = []
    phases: list[str] = []
    marks: list[tuple[str, tuple[int, int]]] = []
    own_ready: list[float] = []
    mark = phases_of.Phases.mark

    def marking(self, phase: str) -> None:  # rlbox's own phase marks, with the machine's CPU time at each
        mark(self, phase)
        marks.append((phase, cpu_jiffies()))
        if perf:
            own.append((phase, own_cpu()))
        times.append((phase, time.monotonic()))

    def echo(line: str) -> None:
        if line.startswith("cluster ready"):
            ready_at.append(time.perf_counter())
            cpu_ready.append(cpu_since(bed, n, cpu_start))
            own_ready.append(own_cpu())  # after the machine's count: the walk is not rlbox's
        elif line.startswith("bring-up: "):  # rlbox's own breakdown (execute.Cluster.phases)
            phases.append(line.removeprefix("bring-up: "))
        elif "starting it again" in line:  # a raylet that timed out registering (Ray's 30 s) is counted in
            print(f"{n} host(s): rlbox: {line}", flush=True)

    plan, run_dir = launch.prepare(launch.RunRequest(cluster_file=cluster, name=f"{name}{n}", runs_dir=runs))
    planned = time.perf_counter() - start
    times.append(("plan", time.monotonic()))
    if perf:
        own.append(("plan", own_cpu()))
    phases_of.Phases.mark, jiffies_start = marking, cpu_jiffies()
    checks_of = checks.checks_before_start(plan, replace=True, echo=echo)

    def before(nodes):
        t = time.perf_counter()
        checks_of(nodes)
        spent.append(time.perf_counter() - t)

    try:
        run.execute(plan, run_dir=run_dir, echo=echo, emit=lambda t: None, timeout=300, replace=True,
                    bring_up_only=True, keep=True, before=before, deliver=deliver.ensure)
    finally:
        phases_of.Phases.mark = mark
        by_process = sampler.stop(times) if sampler else ""
    state = run_state.load(runs, plan.run)
    nodes = hosts.connect_all(tuple(p.host for p in plan.nodes))
    try:
        if not ready_at:
            raise SystemExit("bench: rlbox never said the cluster was ready")
        looking = watch.Watch(watch.expected_of_record(state.nodes, state.addresses), [p.container.name for p in plan.nodes],
                              nodes, nodes[0].dashboard(plan.head, plan.ports.dashboard, plan.sim))
        looking.check(force=True)  # connections warm, as in a run
        cpu = time.process_time()
        for _ in range(TICKS):
            looking.check(force=True)
        tick_cpu = (time.process_time() - cpu) / TICKS
    finally:
        t = time.perf_counter()
        run.remove_run(nodes, plan.run, plan.network.name if plan.network else None)
        teardown = time.perf_counter() - t
        left = [p.host.name for p, node in zip(plan.nodes, nodes)
                if node.client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={plan.run}"})]
        for node in nodes:
            node.close()
    if left:
        raise SystemExit(f"bench: rlbox's containers still on {', '.join(left)} after teardown")
    return {"ready": ready_at[0] - start, "preflight": spent[0] if spent else 0.0, "teardown": teardown,
            "tick_cpu_ms": tick_cpu * 1000, "phases": f"plan {planned:.1f} s, " + (phases[0] if phases else "?"),
            "busy": busy_per_phase(marks, jiffies_start),
            "cpu": cpu_ready[0], "by_process": by_process,
            "own": (", ".join(f"{phase} {now - before:.1f}" for (_, before), (phase, now) in zip(own, own[1:]))  # execute's marks only
                    if perf else f"to ready {own_ready[0] - own[0][1]:.1f} (each phase's with --perf)")}


def seed_script(bed: Bed, n: int, image: str) -> tuple[float, float]:
    """(a) one host after another; the head polls `ray status` every 5 s (seed 001 §4.5)."""
    prefix = "rlbox-bench-seed"
    bed.clean(n, prefix)
    bed.quiet(n)
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

    try:
        for i in range(n):
            seed_host(bed, i, prefix, image, poll_head)
        done.wait(timeout=300)
    finally:
        done.set()
        took = (ready[0] if ready else time.perf_counter()) - start
        down = time.perf_counter()
        bed.clean(n, prefix)
        down = time.perf_counter() - down
    if not ready:
        raise SystemExit("bench: the seed procedure's cluster never got ready")
    return took, down


def seed_host(bed: Bed, i: int, prefix: str, image: str, poll_head) -> None:
    """Seed 001's steps on host i: its container, then `ray start` in it (the head starts the polling)."""
    head = bed.address(0)
    name, ip = f"{prefix}-{i}", bed.address(i)
    bed.ssh(i, "docker", "run", "-d", "--name", name, "--network", "host", "--ipc", "host", "--entrypoint", "sleep",
            image, "infinity")
    if i == 0:
        bed.ssh(i, "docker", "exec", name, "ray", "start", "--head", f"--port={GCS}", f"--dashboard-port={DASHBOARD}",
                f"--dashboard-host={head}", f"--node-ip-address={head}", f"--resources={RESOURCES}",
                "--disable-usage-stats")
        threading.Thread(target=poll_head, daemon=True).start()
    else:
        bed.ssh(i, "docker", "exec", name, "ray", "start", f"--address={head}:{GCS}", f"--node-ip-address={ip}",
                f"--resources={RESOURCES}", "--disable-usage-stats")


def parallel_bare(bed: Bed, n: int, image: str, cpu: list | None = None) -> tuple[float, float]:
    """(b) every host's bare `ray start --block` at once; ready when Ray's node table has every host's node
    alive with its NPUs (as for rlbox), polled as rlbox polls it (ray.POLL). ``cpu`` gets what the bring-up cost (cpu_so_far)."""
    prefix = "rlbox-bench-bare"
    bed.clean(n, prefix)
    bed.quiet(n)
    cpu_start = cpu_so_far(bed, n, before=True)
    start = time.perf_counter()
    head = bed.address(0)
    threads, failures = [], []

    def one(i: int) -> None:
        ip = bed.address(i)
        wait = "" if i == 0 else f"until (exec 3<>/dev/tcp/{head}/{GCS}) 2>/dev/null; do sleep 0.1; done; "
        role = (f"--head --port={GCS} --dashboard-port={DASHBOARD} --dashboard-host={head}" if i == 0
                else f"--address={head}:{GCS}")
        script = (f"{wait}exec ray start --block {role} --node-ip-address={ip} "
                  f"--resources={shlex.quote(RESOURCES)} --disable-usage-stats")
        try:
            bed.ssh(i, "docker", "run", "-d", "--name", f"{prefix}-{i}", "--network", "host", "--ipc", "host",
                    "--entrypoint", "bash", image, "-c", script)
        except SystemExit as err:
            failures.append(str(err))

    for i in range(n):
        threads.append(threading.Thread(target=one, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(failures[0])
    try:
        took = bed.ready(n, start)
        if cpu is not None:
            cpu.append(cpu_since(bed, n, cpu_start))
    except RlboxError as err:
        bed.clean(n, prefix)
        raise SystemExit(f"bench: bare cluster: {err}") from None
    down = time.perf_counter()
    bed.clean(n, prefix)
    return took, time.perf_counter() - down


def baseline(run, bed: Bed, n: int, prefix: str, label: str) -> tuple[float, float]:
    """(seconds to ready, teardown) of a baseline; (nan, nan) when it never got ready."""
    try:
        return run()
    except SystemExit as err:
        print(f"{n} host(s): {label} never ready: {err}", flush=True)
        bed.clean(n, prefix)
        return float("nan"), float("nan")


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--quick", action="store_true", help="1 host, once (CI: proves the bench runs)")
    parser.add_argument("--name", default=NAME, help=f"the testbed's name (default {NAME})")
    parser.add_argument("--subnet", default=SUBNET, help=f"the testbed's subnet (default {SUBNET})")
    parser.add_argument("--reuse", action="store_true",
                        help="use the testbed --name as it is and leave it up (CI: the test session's); rlbox run "
                             "delivers the image to a host that lacks it, in its image phase")
    parser.add_argument("--no-seed", action="store_true",
                        help="skip baseline (a), the seed's one-host-after-another procedure (minutes at 16 hosts)")
    parser.add_argument("--reps", type=int, default=1,
                        help="measure each size this many times, rlbox and bare one after the other each time; the "
                             "summary takes each size's median ratio (the Ray phases move by +-20 %% run to run here)")
    parser.add_argument("--perf", action="store_true",
                        help="also sample every CPU with `perf record -a` and print, per phase, the CPU-seconds "
                             "of the processes that took the most")
    args = parser.parse_args()
    if args.perf and shutil.which("perf") is None:
        raise SystemExit("bench: --perf needs perf (linux-perf)")
    sizes = [1] if args.quick else args.hosts
    # each measurement starts on a quiet machine; not --quick's (CI: its figures are no measure, and the
    # machine is never quiet while the other test groups run: each wait would end only at its limit)
    def settled(label: str) -> None:
        if not args.quick:
            settle(label)

    image = f"localhost/rlbox/sim:{launch.host_arch_variant()}"
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
        raise SystemExit(f"bench: {image} missing; run `make sim-image`")
    bed = Bed(max(sizes), image, args.name, args.subnet, reuse=args.reuse)
    if args.reuse:
        print(f"testbed: {args.name}'s {len(bed.state.hosts)} host(s) as they are (--reuse)", flush=True)
    else:
        print(f"testbed: {max(sizes)} host(s) up in {bed.state.up_seconds:.1f} s; image into every host in "
              f"{bed.state.image_seconds:.1f} s (not counted below)", flush=True)
    results = []
    memory = Memory(bed)
    idle = memory.sample()
    print(f"testbed: {max(sizes)} idle host(s) with the image: {idle / 1e9:.2f} GB PSS "
          f"({idle / max(sizes) / 1e6:.0f} MB a host)", flush=True)
    memory.thread.start()
    runs = Path(tempfile.mkdtemp(prefix="rlbox-tbb-runs-"))
    try:
        for n in sizes:
            # fewer hosts if the machine cannot hold them, with the figure that showed it
            per_host = max([(memory.peak[m] - idle) / m for m in memory.peak if m] or [0])
            available = available_memory()
            if per_host and n * per_host + (2 << 30) > available:
                print(f"stopping before {n} hosts: they would need ~{n * per_host / 1e9:.1f} GB with Ray "
                      f"({per_host / 1e9:.2f} GB a host measured above, over the idle hosts) + 2 GB spare, "
                      f"and this machine has {available / 1e9:.1f} GB available", flush=True)
                break
            for rep in range(1 if args.quick else max(1, args.reps)):
                memory.label = n
                cluster = bed.cluster(n, runs)
                settled(f"{n} host(s): rlbox")
                x = rlbox_bringup(bed, n, cluster, runs, args.name, perf=args.perf)
                r = x["ready"]
                print(f"{n} host(s): rlbox {r:6.1f} s (pre-flight {x['preflight']:.1f} s, teardown {x['teardown']:.1f} s, "
                      f"watch {x['tick_cpu_ms']:.1f} ms CPU/tick)", flush=True)
                print(f"{n} host(s): rlbox's phases: {x['phases']}", flush=True)
                print(f"{n} host(s): this machine's CPUs busy in them: {x['busy']}", flush=True)
                print(f"{n} host(s): rlbox's own CPU-seconds in them (its process and its ssh): {x['own']}", flush=True)
                if x["by_process"]:
                    print(f"{n} host(s): CPU by process in each phase (perf): {x['by_process']}", flush=True)
                # a baseline that never gets ready is a result too (Ray gives a raylet 30 s to register:
                # under load some never do); it is said, its containers removed, and the bench goes on
                if not args.no_seed:
                    settled(f"{n} host(s): (a)")
                a, a_down = (float("nan"), float("nan")) if args.no_seed else baseline(
                    lambda: seed_script(bed, n, image), bed, n, "rlbox-bench-seed", "(a)")
                settled(f"{n} host(s): (b)")
                b_cpu: list[tuple[float, float]] = []
                b, b_down = baseline(lambda: parallel_bare(bed, n, image, b_cpu), bed, n, "rlbox-bench-bare", "(b)")
                b_spent = b_cpu[0] if b_cpu else (float("nan"), float("nan"))
                print(f"{n} host(s): rlbox {cpu_line(x['cpu'], r)} | (b) {cpu_line(b_spent, b)}", flush=True)
                results.append({"hosts": n, "rep": rep + 1, "rlbox_s": round(r, 2), "rlbox_preflight_s": round(x["preflight"], 2),
                                "rlbox_teardown_s": round(x["teardown"], 2), "rlbox_phases": x["phases"], "watch_tick_cpu_ms": round(x["tick_cpu_ms"], 2),
                                "seed_script_s": round(a, 2), "seed_teardown_s": round(a_down, 2),
                                "parallel_bare_s": round(b, 2), "bare_teardown_s": round(b_down, 2),
                                "rlbox_cpu_s": [round(v, 1) for v in x["cpu"]], "bare_cpu_s": [round(v, 1) for v in b_spent],
                                "peak_pss_gb": round(memory.peak.get(n, 0) / 1e9, 2)})
                print(f"{n} host(s): rlbox {r:6.1f} s (pre-flight {x['preflight']:.1f} s, teardown {x['teardown']:.1f} s, "
                      f"watch {x['tick_cpu_ms']:.1f} ms CPU/tick) | (a) seed ray_start.sh {a:6.1f} s (teardown {a_down:.1f} s)"
                      f" | (b) bare parallel ray start {b:6.1f} s (teardown {b_down:.1f} s)"
                      f" | rlbox/(a) {r / a:4.2f} | rlbox/(b) {r / b:4.2f} | rlbox-(b) {r - b:+5.1f} s"
                      f" | hosts' peak PSS {memory.peak.get(n, 0) / 1e9:.2f} GB (all {max(sizes)} hosts, {n} with Ray)"
                      f" | load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    finally:
        memory.stop.set()
        bed.down()
        shutil.rmtree(runs, ignore_errors=True)  # the runs' state files: nothing of the bench stays
    first, last = results[0], results[-1]
    if len({x["hosts"] for x in results}) > 1:
        median = statistics.median
        at = {n: [x for x in results if x["hosts"] == n] for n in dict.fromkeys(x["hosts"] for x in results)}
        ratios = [x["rlbox_s"] / x["parallel_bare_s"] for x in at[last["hosts"]]]
        each = f" (each run: {', '.join(f'{v:.2f}' for v in ratios)})" if len(ratios) > 1 else ""
        scale = median([x["rlbox_s"] for x in at[last["hosts"]]]) / median([x["rlbox_s"] for x in at[first["hosts"]]])
        extra = [(x["rlbox_cpu_s"][0] - x["bare_cpu_s"][0], x["rlbox_cpu_s"][1] - x["bare_cpu_s"][1]) for x in at[last["hosts"]]]
        print(f"at {last['hosts']} hosts, CPU-s to ready, rlbox - (b), the median of each run's: this machine "
              f"{median(e[0] for e in extra):+.1f}, the containers {median(e[1] for e in extra):+.1f}, the rest "
              f"{median(e[0] - e[1] for e in extra):+.1f} (rlbox: its checks, ssh, the engines; (b): its ssh and docker CLI); "
              f"the CPUs busy from start to ready (medians): rlbox "
              f"{median(busy_share(x['rlbox_cpu_s'], x['rlbox_s']) for x in at[last['hosts']]):.0%}, (b) "
              f"{median(busy_share(x['bare_cpu_s'], x['parallel_bare_s']) for x in at[last['hosts']]):.0%}", flush=True)
        print(f"at {last['hosts']} hosts: rlbox/(b) {median(ratios):.2f}{each} (goal <= 1) | "
              f"rlbox at {last['hosts']} / rlbox at {first['hosts']}: {scale:.2f} (goal <= 2) | "
              f"watch CPU per tick per node: " + ", ".join(f"{x['hosts']}: {x['watch_tick_cpu_ms'] / x['hosts']:.1f} ms"
                                                           for x in results) + " (linear: flat or falling)")
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print("RESULTS " + json.dumps(results))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RlboxError as err:  # one line, as rlbox says it (the testbed was taken down)
        raise SystemExit(f"bench: {err}") from None
