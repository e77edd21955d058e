"""Carrying out a Slurm run: Slurm's commands (on this machine, or over ssh on the cluster file's
login node), the allocation, the hosts path on exactly its nodes, and the end: the run's
containers removed (by the hosts path) and `scancel`. Thin: every judgement is in ``plan``."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

from rlbox.backends.slurm import plan as sp
from rlbox.cluster import hosts as remote
from rlbox.cluster.spec import ClusterSpec, Host
from rlbox.core.errors import RlboxError

POLL = 1.0  # seconds between looks at the allocation and its nodes while the run goes on


class Slurm:
    """Slurm's client commands, where the site runs them."""

    def __init__(self, login: Host | None):
        self.login = login

    def run(self, argv: list[str], stdin: str | None = None, timeout: float = 20) -> tuple[int, str, str]:
        full = remote.ssh_argv(self.login, command=[shlex.join(argv)]) if self.login else argv
        try:
            proc = subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=timeout,
                                  stdin=None if stdin is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 124, "", f"{argv[0]}: no answer in {timeout:.0f} s (Socket timed out)"
        except FileNotFoundError:
            raise RlboxError(f"slurm: {argv[0]} not found on this machine; install Slurm's client commands "
                             "(Debian: slurm-client) or name a login node (cluster file: slurm: {login: HOST})") from None
        if self.login and proc.returncode == 255:
            said = (proc.stderr.strip().splitlines() or ["exit 255"])[-1]
            raise RlboxError(f"slurm: cannot reach the login node {self.login.name} over ssh ({said[:160]})")
        if proc.returncode == 127 and "not found" in proc.stderr:
            raise RlboxError(f"slurm: {argv[0]} not found {'on ' + self.login.name if self.login else ''}: "
                             "Slurm's client commands are needed where rlbox asks Slurm")
        return proc.returncode, proc.stdout, proc.stderr


def login_host(spec: ClusterSpec | None) -> Host | None:
    """The cluster file's login node, reached with the file's ssh settings (a host of the file
    when it is one)."""
    if spec is None or not spec.slurm_login:
        return None
    for h in spec.hosts:
        if h.name == spec.slurm_login:
            return replace(h, transport="ssh")
    first = spec.hosts[0]
    return Host(name=spec.slurm_login, ssh_user=first.ssh_user, ssh_port=first.ssh_port,
                identity_file=first.identity_file, known_hosts=first.known_hosts, transport="ssh")


def record_path(run_dir: Path) -> Path:
    return run_dir / "slurm.json"


def allocate(slurm: Slurm, plan: sp.SlurmPlan, run_dir: Path, timeout: float, echo) -> tuple[str, str]:
    """Check the partition, submit the holding job, wait until it runs: (job id, NODELIST)."""
    rc, out, err = slurm.run(["sinfo", "-h", "-o", "%P %D %a"])
    partition = sp.judge_partitions(rc, out, err, plan)
    rc, out, err = slurm.run(plan.sbatch_argv(), stdin=plan.batch_script())
    job = sp.judge_sbatch(rc, out, err, plan)
    run_dir.mkdir(parents=True, exist_ok=True)
    record_path(run_dir).write_text(json.dumps({"job": job, "login": plan.login, "partition": partition,
                                                "nodes": plan.nodes, "time": plan.time}) + "\n")
    echo(f"slurm: job {job} ({plan.job_name}) asks partition {partition} for {plan.nodes} node(s)")
    try:
        return _wait_running(slurm, plan, job, timeout, echo)
    except BaseException:  # never a job left behind: refused, timed out, Ctrl-C
        cancel(slurm, job)
        echo(f"slurm: job {job} cancelled (scancel)")
        raise


def _wait_running(slurm: Slurm, plan: sp.SlurmPlan, job: str, timeout: float, echo) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        rc, out, err = slurm.run(["squeue", "-h", "-j", job, "-o", "%T|%r|%N"])
        if rc != 0 and "Invalid job id" not in err:
            raise RlboxError(sp.controller_line(err, plan.where()))
        state, nodelist = sp.judge_queue(out.strip().splitlines()[0] if out.strip() else "", plan, job)
        if state == "running":
            return job, nodelist
        reason = out.split("|")[1] if out.count("|") == 2 else ""
        if reason != said:
            echo(f"slurm: job {job} pending ({reason or 'no reason given'})")
            said = reason
        if time.monotonic() > deadline:
            raise RlboxError(f"slurm: job {job} still pending after {timeout:.0f} s ({reason}); --timeout waits longer")
        time.sleep(0.5)


def nodes_of(slurm: Slurm, plan: sp.SlurmPlan, nodelist: str) -> tuple[list[str], dict[str, str]]:
    rc, out, err = slurm.run(["scontrol", "show", "hostnames", nodelist])
    if rc != 0:
        raise RlboxError(sp.controller_line(err, plan.where()))
    names = out.split()
    rc, out, err = slurm.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N %o"])
    if rc != 0:
        raise RlboxError(sp.controller_line(err, plan.where()))
    addrs = dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)
    return names, {k: v.strip() for k, v in addrs.items()}


def npu_ids(slurm: Slurm, plan: sp.SlurmPlan, job: str) -> dict[str, tuple[int, ...]]:
    """Node name -> the NPU ids Slurm allocated there (GRES npu), from `scontrol show job -d`."""
    rc, out, err = slurm.run(["scontrol", "show", "job", "-d", job])
    if rc != 0:
        raise RlboxError(sp.controller_line(err, plan.where()))
    found, why = sp.judge_gres(out, plan.npus or 0, job)
    if why:
        raise RlboxError(why)
    ids = {}
    for expr, given in found:
        rc, out, err = slurm.run(["scontrol", "show", "hostnames", expr])
        if rc != 0:
            raise RlboxError(sp.controller_line(err, plan.where()))
        ids.update({name: given for name in out.split()})
    return ids


def cancel(slurm: Slurm, job: str) -> str | None:
    rc, _, err = slurm.run(["scancel", job])
    return None if rc == 0 else (err.strip().splitlines() or [f"exit {rc}"])[-1]


class Watch(threading.Thread):
    """While the run goes on: the allocation still RUNNING and none of its nodes DOWN or not
    responding. On the first line saying otherwise, SIGINT to the main thread: the hosts path then
    tears the run down as on Ctrl-C, and ``ended`` holds the line."""

    def __init__(self, slurm: Slurm, plan: sp.SlurmPlan, job: str, names: list[str]):
        super().__init__(daemon=True, name=f"slurm-watch-{job}")
        self.slurm, self.plan, self.job, self.names = slurm, plan, job, names
        self.ended: str | None = None
        self.done = threading.Event()

    def run(self) -> None:
        completing_since: float | None = None  # when squeue first said COMPLETING (sp.COMPLETING_WAIT)
        while not self.done.wait(POLL):
            try:
                rc, out, err = self.slurm.run(["squeue", "-h", "-t", "all", "-j", self.job, "-o", "%T"], timeout=10)
                if rc == 0 and out.strip().startswith("COMPLETING"):
                    completing_since = completing_since or time.monotonic()
                waited = time.monotonic() - completing_since if completing_since else 0.0
                line = sp.judge_ended(out if rc == 0 else "", self.plan, self.job, waited) if rc == 0 or "Invalid job id" in err else None
                if line is None:
                    rc, out, _ = self.slurm.run(["sinfo", "-h", "-N", "-n", ",".join(self.names), "-o", "%N %T"], timeout=10)
                    line = sp.judge_nodes(out, self.names) if rc == 0 else None
            except RlboxError:
                continue
            if line and not self.done.is_set():
                self.ended = line
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                return
