"""Planning a Slurm run, and judging Slurm's answers. Pure: text in, values or one line out.

The allocation is held by a batch job whose script only names its nodes and sleeps; rlbox then
starts its own container on each allocated node over ssh, exactly as the hosts path does (Ray's
head on the first node), and ends the job (`scancel`) when the run ends. Slurm's own end of the
job (its time limit, a cancel, a node failure) ends the run. Every value rendered into the script
is quoted (``shlex.quote``): user text is data, never shell.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from rlbox.core.errors import RlboxError

TIME_RE = re.compile(r"^(\d{1,7}|\d{1,7}:\d{1,2}|\d{1,7}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(:\d{1,2}){0,2}|INFINITE|UNLIMITED)$")
PARTITION_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Pending reasons that never clear by waiting: the request cannot be met as it is.
HOPELESS = {
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionConfig": "the partition cannot run this request",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "PartitionTimeLimit": "a time limit above the partition's",
    "BadConstraints": "constraints no node meets",
    "InvalidQOS": "an invalid QOS",
    "InvalidAccount": "an invalid account",
}
ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
         "OUT_OF_MEMORY", "REVOKED")
WHY_ENDED = {
    "TIMEOUT": "Slurm's time limit (--time {time}) ended the allocation",
    "CANCELLED": "the allocation was cancelled (scancel)",
    "NODE_FAIL": "a node of the allocation failed",
    "PREEMPTED": "the allocation was preempted",
    "DEADLINE": "the allocation reached its deadline",
}


@dataclass(frozen=True)
class SlurmPlan:
    name: str  # the run's name; the job is rlbox-NAME
    nodes: int
    partition: str | None = None
    time: str | None = None
    npus: int | None = None  # NPUs per node asked as GRES npu:K (None: whole nodes only)
    login: str | None = None  # where Slurm's commands run (ssh); None: this machine
    node_commands: str = ""  # the hosts path's plan for N nodes, as `--dry-run` prints it
    extra: tuple[str, ...] = field(default_factory=tuple)

    @property
    def job_name(self) -> str:
        return f"rlbox-{self.name}"

    def sbatch_options(self) -> list[str]:
        # whole nodes, or (GRES) K NPUs of each node, which another job may share by the other NPU ids
        opts = [f"--job-name={self.job_name}", f"--nodes={self.nodes}", *(() if self.npus else ("--exclusive",)),
                "--chdir=/", "--output=/dev/null"]
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.time:
            opts.append(f"--time={self.time}")
        if self.npus:
            opts.append(f"--gres=npu:{self.npus}")
        return opts

    def batch_script(self) -> str:
        lines = ["#!/bin/sh",
                 f"# rlbox run --backend slurm: the allocation of run {self.name} ({self.nodes} node(s)).",
                 "# rlbox starts its container on every node over ssh (Ray's head on the first) while this job",
                 "# holds the nodes; it ends the job (scancel) when the run ends. Slurm ending it (--time,",
                 "# scancel, a failed node) ends the run."]
        lines += [f"#SBATCH {shlex.quote(o)}" for o in self.sbatch_options()]
        lines += [f"echo {shlex.quote(f'rlbox run {self.name}: nodes')} $(scontrol show hostnames \"$SLURM_JOB_NODELIST\")",
                  "trap 'exit 0' TERM INT", "while :; do sleep 3600 & wait $!; done", ""]
        return "\n".join(lines)

    def sbatch_argv(self) -> list[str]:
        """The script comes on stdin; the options are also on the line so no #SBATCH parsing is needed."""
        return ["sbatch", "--parsable", *self.sbatch_options()]

    def where(self) -> str:
        return f"on {self.login} (ssh)" if self.login else "on this machine"

    def describe(self) -> str:
        out = [f"# slurm: run {self.name} on {self.nodes} node(s) Slurm allocates "
               f"(partition {self.partition or 'the default'}, time {self.time or 'the partition default'}); "
               f"Slurm's commands {self.where()}",
               f"# {shlex.join(self.sbatch_argv())} < batch script:",
               *self.batch_script().splitlines(),
               f"# then: squeue -j JOB until RUNNING; scontrol show hostnames NODELIST; sinfo -N -o '%N %o' (NodeAddr)",
               "# per node, on the nodes Slurm gives in its order (node 0 = the first = Ray's head):",
               *self.node_commands.splitlines(),
               "# at the end (or on a failure, Ctrl-C, rlbox stop): the run's containers removed, scancel JOB"]
        return "\n".join(out) + "\n"

    def as_dict(self) -> dict:
        return {"backend": "slurm", "name": self.name, "nodes": self.nodes, "partition": self.partition,
                "time": self.time, "npus": self.npus, "login": self.login, "sbatch": self.sbatch_argv(),
                "script": self.batch_script()}


def plan_slurm(*, name: str, nodes: int | None, partition: str | None, time: str | None, npus: int | None = None,
               login: str | None = None, node_commands: str = "") -> SlurmPlan:
    if not nodes:
        raise RlboxError("--backend slurm: give --nodes N (how many nodes to ask Slurm for)")
    if partition is not None and not PARTITION_RE.fullmatch(partition):
        raise RlboxError(f"--partition {partition[:60]!r}: a partition name is letters, digits and _ . - (at most 64)")
    if time is not None and not TIME_RE.fullmatch(time):
        raise RlboxError(f"--time {time[:60]!r}: Slurm's time format: MINUTES, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or INFINITE")
    return SlurmPlan(name=name, nodes=nodes, partition=partition, time=time, npus=npus, login=login,
                     node_commands=node_commands)


# -- judging Slurm's answers ------------------------------------------------------------------------
def controller_line(said: str, where: str) -> str:
    last = (said.strip().splitlines() or ["no answer"])[-1].strip()
    return f"slurm: the controller does not answer {where} ({last[:160]}); is slurmctld running?"


def judge_partitions(rc: int, stdout: str, stderr: str, plan: SlurmPlan) -> str:
    """``sinfo -h -o '%P %D %a'`` (partition, its nodes, up/down; the default marked *): the
    partition the run goes to, or one line naming what is wrong (wrong partition, too many nodes,
    a dead controller)."""
    if rc != 0 or not stdout.strip():
        if "Unable to contact" in stderr or "connect" in stderr.lower() or rc != 0:
            raise RlboxError(controller_line(stderr or stdout, plan.where()))
        raise RlboxError(f"slurm: sinfo {plan.where()} lists no partition")
    parts: dict[str, tuple[int, str]] = {}
    default = None
    for line in stdout.splitlines():
        words = line.split()
        if len(words) != 3 or not words[1].isdigit():
            continue
        name = words[0].rstrip("*")
        if words[0].endswith("*"):
            default = name
        count, avail = parts.get(name, (0, words[2]))
        parts[name] = (count + int(words[1]), words[2])
    name = plan.partition or default
    if name is None:
        raise RlboxError(f"slurm: no default partition; give --partition ({', '.join(sorted(parts))})")
    if name not in parts:
        raise RlboxError(f"--partition {name}: Slurm has no such partition (it has {', '.join(sorted(parts)) or 'none'})")
    count, avail = parts[name]
    if avail != "up":
        raise RlboxError(f"--partition {name}: the partition is {avail}, not up")
    if plan.nodes > count:
        raise RlboxError(f"--nodes {plan.nodes}: partition {name} has {count} node(s)")
    return name


def judge_sbatch(rc: int, stdout: str, stderr: str, plan: SlurmPlan) -> str:
    """sbatch --parsable's answer: the job id, or one line naming the option Slurm refused."""
    if rc == 0:
        job = stdout.strip().split(";")[0]
        if job.isdigit():
            return job
        raise RlboxError(f"slurm: sbatch answered {stdout.strip()[:80]!r}, not a job id")
    said = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {rc}"
    if "Invalid partition" in stderr or "invalid partition" in stderr:
        raise RlboxError(f"--partition {plan.partition}: Slurm has no such partition ({said[:160]})")
    if "Node count specification invalid" in stderr or "node configuration is not available" in stderr:
        raise RlboxError(f"--nodes {plan.nodes}{f' with npu:{plan.npus} each' if plan.npus else ''}: "
                         f"the cluster cannot give that ({said[:160]})")
    if "time limit" in stderr.lower():
        raise RlboxError(f"--time {plan.time}: {said[:160]}")
    if "Unable to contact" in stderr or "Socket timed out" in stderr:
        raise RlboxError(controller_line(stderr, plan.where()))
    raise RlboxError(f"slurm: sbatch refused the job: {said[:200]}")


def judge_queue(line: str, plan: SlurmPlan, job: str) -> tuple[str, str | None]:
    """One ``squeue -j JOB -h -o '%T|%r|%N'`` line: ("running", NODELIST), ("waiting", None), or a
    line (raised) when the request can never run or the job is gone."""
    words = line.strip().split("|")
    if len(words) != 3 or not words[0]:
        raise RlboxError(f"slurm: job {job} of run {plan.name} is gone from the queue (cancelled or ended)")
    state, reason, nodelist = words
    if state == "RUNNING":
        return "running", nodelist
    if state == "PENDING":
        for key, why in HOPELESS.items():
            if reason.startswith(key):
                what = {"PartitionNodeLimit": f"--nodes {plan.nodes}", "PartitionTimeLimit": f"--time {plan.time}"}
                option = what.get(key, f"--partition {plan.partition or '(the default)'}")
                raise RlboxError(f"{option}: Slurm will never start job {job}: {why} ({reason})")
        return "waiting", None
    if state in ENDED or state in ("COMPLETING", "SUSPENDED", "STOPPED"):
        raise RlboxError(f"slurm: job {job} of run {plan.name} is {state} before it ran ({reason})")
    return "waiting", None


# An ending job shows as COMPLETING (squeue's %T puts that flag first: its processes killed, its epilog
# run) before its final state, which says why it ended (TIMEOUT, CANCELLED, ...): seen at Slurm's time
# limit in CI, where the line said "the allocation is COMPLETING". Its final state is waited for this long.
COMPLETING_WAIT = 60.0


def judge_ended(state: str, plan: SlurmPlan, job: str, completing_for: float) -> str | None:
    """While the run goes on: None while the allocation is RUNNING, or COMPLETING for less than
    COMPLETING_WAIT seconds (``completing_for``: since first seen so), else the line saying why it ended."""
    state = state.strip().split()[0] if state.strip() else "GONE"
    if state == "RUNNING" or (state == "COMPLETING" and completing_for < COMPLETING_WAIT):
        return None
    why = WHY_ENDED.get(state, f"the allocation is {state}" if state != "GONE" else "the allocation is gone from the queue")
    return f"slurm: job {job}: {why.format(time=plan.time)}; the run is torn down"


def judge_nodes(sinfo_lines: str, names: list[str]) -> str | None:
    """``sinfo -h -N -n NODES -o '%N %T'`` while the run goes on: None, or a line naming a node Slurm
    marks DOWN, failing or not responding (a `*` after the state)."""
    states = {}
    for line in sinfo_lines.splitlines():
        words = line.split()
        if len(words) == 2:
            states[words[0]] = words[1].lower()
    for n in names:
        st = states.get(n)
        if st is None:
            continue
        if st.endswith("*") or st.startswith(("down", "fail")):  # draining alone lets the allocation run on
            return f"slurm: node {n} is {st.upper()} (Slurm: {'not responding' if st.endswith('*') else 'down'})"
    return None


def map_nodes(names: list[str], addrs: dict[str, str], hosts: list[str]) -> list[int]:
    """Slurm's nodes, in its order, as indices into the cluster file's hosts: a host matches a node
    by the node's NodeAddr, else by its name. One line naming a node no host matches."""
    out = []
    for n in names:
        for key in (addrs.get(n), n):
            if key and key in hosts:
                out.append(hosts.index(key))
                break
        else:
            raise RlboxError(f"slurm: node {n} (NodeAddr {addrs.get(n, '?')}) is in no host of the cluster file "
                             f"({', '.join(hosts[:6])}{' ...' if len(hosts) > 6 else ''})")
    return out


def judge_status(rc: int, out: str, err: str, job: str) -> dict:
    """``squeue -h -t all -j JOB -o '%T|%N|%M|%l'`` for `rlbox status`: the allocation's state, its
    nodes, its elapsed time and its limit; ``GONE`` once Slurm no longer lists it."""
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    words = line.split("|")
    if len(words) == 4 and words[0]:
        return {"job": job, "state": words[0], "nodes": words[1], "elapsed": words[2], "limit": words[3]}
    if rc == 0 or "Invalid job id" in err:
        return {"job": job, "state": "GONE", "nodes": "", "elapsed": "", "limit": ""}
    said = (err.strip().splitlines() or [f"exit {rc}"])[-1]
    return {"job": job, "state": "UNKNOWN", "nodes": "", "elapsed": "", "limit": "", "error": said[:200]}


def status_line(found: dict) -> str:
    """One line of `rlbox status` for the allocation."""
    if found["state"] == "UNKNOWN":
        return f"slurm: job {found['job']}: Slurm did not answer ({found.get('error', '')})"
    if found["state"] == "GONE":
        return f"slurm: job {found['job']}: no longer in Slurm's queue (the allocation ended)"
    return (f"slurm: job {found['job']}: {found['state']} on {found['nodes'] or '(no nodes yet)'}, "
            f"{found['elapsed']} of {found['limit']}")


GRES_LINE = re.compile(r"^\s*Nodes=(\S+)\s.*\bGRES=(\S*)")
GRES_NPU = re.compile(r"(?:^|,)npu(?::[^:(,]+)?(?::\d+)?\(IDX:([0-9,-]+)\)")


def parse_ids(text: str) -> tuple[int, ...]:
    """``0-3,6`` -> (0, 1, 2, 3, 6)."""
    ids: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(ids)


def judge_gres(show_job: str, npus: int, job: str) -> tuple[list[tuple[str, tuple[int, ...]]], str | None]:
    """`scontrol show job -d JOB`: the NPU ids Slurm allocated on each node, as (hostlist expression, ids)
    (one line may name several nodes with the same ids); or the one line saying why they cannot be read
    (no GRES npu in the answer, a count other than asked)."""
    found = []
    for line in show_job.splitlines():
        m = GRES_LINE.match(line)
        if not m:
            continue
        idx = GRES_NPU.search(m.group(2))
        if not idx:
            return [], f"slurm: job {job}: no npu ids in its allocation on {m.group(1)} ({m.group(2)[:80] or 'no GRES'})"
        ids = parse_ids(idx.group(1))
        if len(ids) != npus:
            return [], f"slurm: job {job}: {len(ids)} npu ids on {m.group(1)}, not the {npus} asked"
        found.append((m.group(1), ids))
    if not found:
        return [], f"slurm: job {job}: scontrol shows no node of its allocation"
    return found, None


def ids_text(ids: tuple[int, ...]) -> str:
    """(0, 1, 2, 3, 6) -> ``0-3,6``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)
