#!/usr/bin/env python3
"""Multi-host fault replay: faults of hosts' engines, networks and processes during `rlbox run
--cluster` on a testbed of its own, each checked for: named within 5 s, a true record (exit code,
state.json, `rlbox status`), nothing left on any host (containers, processes, namespaces).

The run is tests/fixtures/launcher/steps_job.py (a step counter on a mount every host shares: one
filesystem) on the simulation image, over ssh to testbed hosts (the production path). Faults:

  worker-net     a worker host cut off the network (its veth down), put back after
  head-net       the head's host cut off the network, put back after
  worker-net-up, head-net-up   the same while Ray comes up (at rlbox's first count of Ray's nodes)
  dockerd-kill   a worker host's dockerd killed (SIGKILL), started again after
  two-workers    two workers' containers killed at once, with --max-restarts 1 (3 hosts)
  driver-kill9   `kill -9` of the `rlbox run` process; `rlbox status` must tell, `rlbox stop` clean
  distribute     `rlbox distribute` interrupted (SIGINT) while it streams the image, then run again
  up-kill9       `kill -9` of `rlbox testbed up` (a testbed of its own), then `rlbox testbed down`
  bed-down       `rlbox testbed down` during a run (last: the testbed is gone after it)

Per fault it prints: named after X s (the first line that names it), outcome (exit code, the last
line, state.json's phase/status), leftovers (after the recovery rlbox's own line asks for, if any).
Exit 1 when a fault is not named within 5 s, its record is not true or something is left.

--quick (CI): driver-kill9 only, on 2 hosts (it proves the bench runs; a cut-off worker is in
tests/cluster/test_faults.py). --faults a,b picks faults. The testbed is
`flt` on 10.231.0.0/24 (RLBOX_FAULTS_TESTBED / RLBOX_FAULTS_SUBNET; runs are named flt-*); it is
brought up with the image and taken down at the end (--keep: left up and reused next time).
RLBOX_FAULTS_REUSE=1 uses the testbed RLBOX_FAULTS_TESTBED as it is and leaves it up (CI: the test
session's, tests/test_bench_quick.py), with RLBOX_FAULTS_IMAGE (rlbox run delivers it where missing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from support.testbed import ROOT, Testbed, rlbox  # noqa: E402

# its own tag of the simulation image: another `make sim-image` on a shared engine retags
# localhost/rlbox/sim:amd64, and the testbed's hosts must hold what the run's tag names
SIM_IMAGE = "localhost/rlbox/sim:amd64"
NAME = os.environ.get("RLBOX_FAULTS_TESTBED", "flt")
IMAGE = os.environ.get("RLBOX_FAULTS_IMAGE", f"localhost/rlbox-{NAME}/sim:amd64")
SUBNET = os.environ.get("RLBOX_FAULTS_SUBNET", "10.231.0.0/24")
UP_NAME, UP_SUBNET = NAME[:3] + "u", SUBNET.rsplit(".", 2)[0] + "." + str(int(SUBNET.split(".")[2]) + 1) + ".0/24"
PREFIX = os.environ.get("RLBOX_BENCH_PREFIX", "flt")
JOB = REPO / "tests" / "fixtures" / "launcher" / "steps_job.py"
NAMED = ("was lost", "rlbox: error:", "interrupted", "driver")
# RLBOX_FAULTS_NO_DOCTOR=1: without the pre-flight (on a shared disk with under 20 GiB free every
# host fails doctor's disk check, which is not what is replayed here)
DOCTOR = ("--no-doctor",) if os.environ.get("RLBOX_FAULTS_NO_DOCTOR") == "1" else ()
ALL = ("worker-net", "head-net", "worker-net-up", "head-net-up", "dockerd-kill", "two-workers", "driver-kill9", "distribute", "up-kill9", "bed-down")
QUICK = ("driver-kill9",)
# a testbed up with --slurm (the tests' session testbed) runs these on its hosts: part of the host, like sshd
SLURM_DAEMONS = ("munged", "slurmd", "slurmctld", "slurmscriptd")


class Run:
    """`rlbox run --cluster` of the steps job in a subprocess, its stderr lines timestamped."""

    def __init__(self, bed: Testbed, work: Path, name: str, hosts: tuple[int, ...], *extra: str, steps: int = 200):
        self.name, self.runs, self.shared = name, work / "runs", work / f"shared-{name}"
        self.shared.mkdir(parents=True, exist_ok=True)
        shutil.copy(JOB, self.shared / "steps_job.py")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlbox.cli", "run", "--cluster", bed.cluster(*hosts), "--name", name,
             "--runs-dir", str(self.runs), "--mount", f"{self.shared}:/shared", "--devices", "0-1", *DOCTOR, *extra, "--",
             "python3", "/shared/steps_job.py", str(steps), "0.5", "/shared/ckpt.json"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []
        self.out: list[str] = []
        threading.Thread(target=lambda: [self.lines.append((time.monotonic(), x)) for x in self.proc.stderr],
                         daemon=True).start()
        threading.Thread(target=lambda: [self.out.append(x) for x in self.proc.stdout], daemon=True).start()

    def wait_step(self, n: int, timeout: float = 420) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if any(x.startswith(f"step:{n} ") for x in self.out):
                return
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: step {n} never came:\n" + "".join(x for _, x in self.lines)[-3000:])

    def named_after(self, since: float, words=NAMED) -> tuple[float | None, str]:
        for t, line in self.lines:
            if t >= since and any(w in line for w in words):
                return t - since, line.strip()
        return None, ""

    def finish(self, timeout: float = 300) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            time.sleep(0.2)

    def state(self) -> dict:
        try:
            return json.loads((self.runs / self.name / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def last(self) -> str:
        return next((x.strip() for _, x in reversed(self.lines) if x.strip()), "")


def started(bed: Testbed, work: Path, name: str, hosts: tuple[int, ...], *extra: str, steps: int = 200,
            step: int = 2) -> Run:
    """A run at step ``step``; a bring-up that Ray's own start-up timeout ended (a loaded machine:
    docs/testbed.md) is tried once more, said."""
    for attempt in (1, 2):
        run = Run(bed, work, name, hosts, *extra, steps=steps)
        try:
            run.wait_step(step)
            return run
        except SystemExit:
            if attempt == 2 or "timed out during startup" not in "".join(x for _, x in run.lines):
                raise
            print(f"{'':13} ({name}: Ray's start-up timed out under load; once more)", flush=True)
    raise AssertionError("unreachable")


def host_state(bed: Testbed, index: int):
    from rlbox.testbed.state import load

    return load(bed.root, bed.name).host(index)


def processes_left(bed: Testbed, run: Run | None) -> list[str]:
    """On this machine: rlbox and ssh processes of the run or the testbed's addresses; on each host:
    any process besides its init, dockerd, containerd(-shim), sshd and, on a testbed up with --slurm,
    its Slurm daemons, that is not in a container."""
    from rlbox.testbed import execute

    left = []
    prefix = SUBNET.rsplit(".", 1)[0] + "."
    for line in subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        if ("ssh" in args.split()[0] and prefix in args) or (run and f"--name {run.name} " in args):
            left.append(f"this machine: {args[:120]}")
    for h in bed.hosts:
        hs = host_state(bed, h["index"])
        for pid in execute.in_host(hs.init_pid):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                parent = 0
            if comm == "sleep" and parent == hs.init_pid:  # the host's init waits in it: part of the host
                continue
            if pid == hs.init_pid or comm in ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2",
                                              "sshd", "docker-init", *SLURM_DAEMONS) or "docker" in cgroup:
                continue
            left.append(f"host {h['index']}: {comm} (pid {pid})")
    return left


def leftovers(bed: Testbed, run: Run | None, grace: float = 20.0) -> list[str]:
    """What is left, looked at until nothing is or ``grace`` s have passed (an sshd session whose
    client vanished behind a cut network ends by its ClientAlive check, ~15 s)."""
    deadline = time.monotonic() + grace
    while True:
        left = [x for h in bed.hosts for x in bed.leftovers_prefix(PREFIX + "-", h["index"])]
        left += processes_left(bed, run)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def veth(bed: Testbed, index: int, up: bool) -> None:
    subprocess.run(["ip", "link", "set", f"rlbox-{bed.name}-h{index}", "up" if up else "down"], check=True)


def dockerd_kill(bed: Testbed, index: int) -> None:
    from rlbox.testbed import execute

    pid = execute.host_process(host_state(bed, index), "dockerd")
    os.kill(pid, signal.SIGKILL)


def dockerd_start(bed: Testbed, index: int) -> None:
    from rlbox.testbed import execute

    hs = host_state(bed, index)
    for comm in ("containerd",):  # the killed dockerd's containerd lives on: its new dockerd starts its own
        pid = execute.host_process(hs, comm)
        if pid:
            os.kill(pid, signal.SIGTERM)
            time.sleep(1)
    execute.start_engine(hs, hs.init_pid)


def recover(run: Run, record: dict) -> str:
    """What rlbox's last line asks for (rerun `rlbox stop --name`), done once the host is back."""
    if "rlbox stop" in run.last() or record.get("phase") != "removed":
        proc = rlbox("stop", "--name", run.name, "--runs-dir", run.runs, timeout=300)
        return f"rlbox stop: exit {proc.returncode}" + (f" ({proc.stderr.strip().splitlines()[-1]})" if proc.returncode else "")
    return ""


def report(fault: str, named: float | None, line: str, outcome: str, left: list[str], notes: str = "") -> bool:
    ok = named is not None and named <= 5.0 and not left
    print(f"{fault:13} named after {'never' if named is None else f'{named:.1f} s':>7} | {outcome} | "
          f"leftovers: {'none' if not left else '; '.join(left[:4])}{(' | ' + notes) if notes else ''}"
          f"\n{'':13} first line: {line[:220]}", flush=True)
    return ok


def outcome_of(code, record: dict, run: Run) -> str:
    return (f"exit {code}, state {record.get('phase')}/{record.get('status')}"
            f"{' restarts ' + str(len(record['restarts'])) if record.get('restarts') else ''}; last: {run.last()[:160]}")


# -- the faults ----------------------------------------------------------------------------------------
def fault_net(bed: Testbed, work: Path, index: int, hosts=(1, 2), up: bool = False) -> bool:
    """A host cut off the network mid-job, or (``up``) while Ray comes up (at rlbox's first count of
    Ray's nodes); also said: the seconds from the cut to rlbox's exit (its teardown leaves a silent host)."""
    fault = ("head-net" if index == hosts[0] else "worker-net") + ("-up" if up else "")
    if up:
        run = Run(bed, work, f"{PREFIX}-{fault}", hosts)
        deadline = time.monotonic() + 420
        while not any("ray: 0/" in x for _, x in run.lines) and run.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        run = started(bed, work, f"{PREFIX}-{fault}", hosts)
    veth(bed, index, False)
    cut = time.monotonic()
    try:
        code = run.finish(timeout=240)
        ended = time.monotonic() - cut
        named, line = run.named_after(cut)
    finally:
        veth(bed, index, True)
    record = run.state()
    out = outcome_of(code, record, run)
    notes = "; ".join(x for x in (f"exited {ended:.1f} s after the cut", recover(run, record)) if x)
    return report(fault, named, line, out, leftovers(bed, run), notes)


def fault_dockerd(bed: Testbed, work: Path) -> bool:
    run = started(bed, work, f"{PREFIX}-dockerd", (1, 2))
    dockerd_kill(bed, 2)
    killed = time.monotonic()
    try:
        code = run.finish(timeout=240)
        named, line = run.named_after(killed)
    finally:
        dockerd_start(bed, 2)
    record = run.state()
    out = outcome_of(code, record, run)
    notes = recover(run, record)
    return report("dockerd-kill", named, line, out, leftovers(bed, run), notes)


def fault_two_workers(bed: Testbed, work: Path) -> bool:
    run = started(bed, work, f"{PREFIX}-two", (1, 2, 3), "--max-restarts", "2", steps=8)
    names = [n["container"] for n in run.state()["nodes"][1:]]
    killers = [subprocess.Popen(["docker", "-H", f"unix://{bed.socket(i)}", "kill", c], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for i, c in zip((2, 3), names)]
    killed = time.monotonic()
    for k in killers:
        k.wait()
    code = run.finish(timeout=420)
    named, line = run.named_after(killed)
    record = run.state()
    steps = sorted({int(x.split()[0][5:]) for x in run.out if x.startswith("step:")})
    ok_record = code == 0 and record.get("status") == "SUCCEEDED" and steps == list(range(1, 9))
    out = outcome_of(code, record, run) + f"; steps {steps[0] if steps else '-'}..{steps[-1] if steps else '-'}"
    return report("two-workers", named, line, out, leftovers(bed, run)) and ok_record


def fault_driver(bed: Testbed, work: Path) -> bool:
    run = started(bed, work, f"{PREFIX}-driver", (1, 2))
    run.proc.kill()
    killed = time.monotonic()
    run.finish(timeout=30)
    status = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "status", "--name", run.name, "--runs-dir",
                               str(run.runs)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    named, first = None, ""
    for line in status.stderr:  # the first thing it says
        if "driver" in line and named is None:
            named, first = time.monotonic() - killed, line.strip()
    stdout = status.stdout.read()
    status.wait()
    said = [first] + [x for x in stdout.splitlines() if "driver" in x]
    stop = rlbox("stop", "--name", run.name, "--runs-dir", run.runs, timeout=300)
    record = run.state()
    out = (f"status exit {status.returncode}, stop exit {stop.returncode}, state {record.get('phase')}/"
           f"{record.get('status')}; {stop.stdout.strip()[:100]}")
    told = record.get("status") == "STOPPED" and "driver" in (record.get("reason") or "") and len(said) > 1
    return report("driver-kill9", named, " / ".join(said)[:300], out, leftovers(bed, run)) and told


def fault_distribute(bed: Testbed, work: Path) -> bool:
    bed.docker(3, "rmi", "-f", IMAGE, check=False)
    cluster = bed.cluster(3)
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "distribute", IMAGE, "--cluster", cluster],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    first = (err.strip().splitlines() or [""])[-1]
    half = [x for x in leftovers(bed, None)]
    again = rlbox("distribute", IMAGE, "--cluster", cluster, timeout=900)
    ids = {bed.docker(i, "image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip() for i in (1, 3)}
    out = (f"interrupted: exit {proc.returncode} in {took:.1f} s; again: exit {again.returncode}, "
           f"{'same image id on hosts 1 and 3' if len(ids) == 1 and '' not in ids else 'image ids differ: ' + str(ids)}")
    ok = report("distribute", took if proc.returncode else None, first, out, half + leftovers(bed, None))
    return ok and again.returncode == 0 and len(ids) == 1


def fault_up_kill(work: Path) -> bool:
    from rlbox.testbed import execute
    from rlbox.testbed.state import load

    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "testbed", "up", "--hosts", "2", "--hardware", "a3",
                             "--name", UP_NAME, "--subnet", UP_SUBNET], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    made = Path(ROOT, UP_NAME, "h2", "docker.sock")  # mid-way: host 1 up, host 2's engine coming
    deadline = time.monotonic() + 120
    while not made.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    killed = time.monotonic()
    proc.wait()
    status = rlbox("testbed", "status", "--name", UP_NAME, timeout=60)
    named = time.monotonic() - killed if status.returncode != 0 else None
    line = (status.stderr.strip() or status.stdout.strip()).splitlines()[-1:] or [""]
    down = rlbox("testbed", "down", "--name", UP_NAME, timeout=300)
    try:
        left = execute.leftovers(load(ROOT, UP_NAME))
    except Exception:  # noqa: BLE001 - no state file: down removed it, look by name
        left = []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"link/netns rlbox-{UP_NAME}" for _ in range(1) if f"rlbox-{UP_NAME}" in links + netns]
    left += [f"process {x[:100]}" for x in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
             if f"/{UP_NAME}/" in x]
    out = f"status exit {status.returncode}; down exit {down.returncode}: {(down.stderr.strip().splitlines() or [''])[-1][:150]}"
    return report("up-kill9", named, line[0], out, left)


def fault_bed_down(bed: Testbed, work: Path) -> bool:
    run = started(bed, work, f"{PREFIX}-beddown", (1, 2))
    down = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "testbed", "down", "--name", bed.name], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    began = time.monotonic()
    code = run.finish(timeout=300)
    named, line = run.named_after(began)
    _, derr = down.communicate(timeout=300)
    record = run.state()
    out = outcome_of(code, record, run) + f"; testbed down exit {down.returncode}"
    from rlbox.testbed import execute
    from rlbox.testbed.state import HostState, TestbedState

    left = execute.leftovers(TestbedState(**{**bed.record, "hosts": tuple(HostState(**h) for h in bed.hosts)}))
    left += [f"this machine: {x[:100]}" for x in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
             .stdout.splitlines() if f"--name {run.name} " in x or ("ssh" in x.split()[0] and SUBNET.rsplit(".", 1)[0] + "." in x)]
    return report("bed-down", named, line, out, left, "" if down.returncode == 0 else derr.strip()[-200:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="driver-kill9 on 2 hosts (CI)")
    parser.add_argument("--faults", help=f"comma-separated, of {', '.join(ALL)}")
    parser.add_argument("--keep", action="store_true", help="leave the testbed up (and reuse one left up)")
    args = parser.parse_args()
    chosen = args.faults.split(",") if args.faults else list(QUICK if args.quick else ALL)
    unknown = [f for f in chosen if f not in ALL]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; choose from {', '.join(ALL)}")
    hosts = 3 if "two-workers" in chosen or "distribute" in chosen else 2
    work = Path(tempfile.mkdtemp(prefix="rlbox-faults-"))
    state = Path(ROOT, NAME, "testbed.json")
    started = time.monotonic()
    reuse = os.environ.get("RLBOX_FAULTS_REUSE") == "1"
    if reuse and not {"bed-down", "up-kill9"}.isdisjoint(chosen):
        parser.error("bed-down and up-kill9 need a testbed of their own (not RLBOX_FAULTS_REUSE)")
    if (reuse or args.keep) and state.exists() and len(json.loads(state.read_text())["hosts"]) >= hosts:
        args.keep = args.keep or reuse
        bed = Testbed(NAME, ROOT, json.loads(state.read_text()), IMAGE)
        global SUBNET
        SUBNET = bed.record.get("subnet", SUBNET)
    else:
        subprocess.run(["docker", "tag", SIM_IMAGE, IMAGE], check=True)
        bed = Testbed.up(hosts=hosts, hardware="a3", name=NAME, image=IMAGE, extra=("--subnet", SUBNET))
    print(f"testbed {NAME}: {len(bed.hosts)} hosts on {SUBNET} ready in {time.monotonic() - started:.0f} s; "
          f"faults: {', '.join(chosen)}", flush=True)
    results = {}
    try:
        for fault in [f for f in ALL if f in chosen]:
            t0 = time.monotonic()
            if fault == "worker-net":
                results[fault] = fault_net(bed, work, 2)
            elif fault == "head-net":
                results[fault] = fault_net(bed, work, 1)
            elif fault.endswith("-net-up"):
                results[fault] = fault_net(bed, work, 1 if fault == "head-net-up" else 2, up=True)
            elif fault == "dockerd-kill":
                results[fault] = fault_dockerd(bed, work)
            elif fault == "two-workers":
                results[fault] = fault_two_workers(bed, work)
            elif fault == "driver-kill9":
                results[fault] = fault_driver(bed, work)
            elif fault == "distribute":
                results[fault] = fault_distribute(bed, work)
            elif fault == "up-kill9":
                results[fault] = fault_up_kill(work)
            elif fault == "bed-down":
                results[fault] = fault_bed_down(bed, work)
            print(f"{'':13} ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        if "bed-down" not in chosen and not args.keep:
            bed.down()
        shutil.rmtree(work, ignore_errors=True)
    bad = [f for f, ok in results.items() if not ok]
    print(f"faults: {len(results) - len(bad)}/{len(results)} named within 5 s with a true record and nothing left"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
