"""Carrying out a SlurmPlan on a testbed whose hosts are up: the files, `munged` on every host,
`slurmctld` on host 1, `slurmd` on every host, then proof that Slurm answers and runs a step on
every node (`sinfo`, `srun -N N hostname`). The daemons live in the hosts' PID namespaces, so
`rlbox testbed down` ends them with the hosts."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rlbox.core.errors import RlboxError
from rlbox.testbed.slurm import SlurmPlan

Echo = Callable[[str], None]
TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "unshare")


def requirements() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise RlboxError(f"rlbox testbed up --slurm needs {', '.join(missing)}: apt-get install -y slurm-wlm munge "
                         "(make setup installs them)")


def _run(argv: list[str], what: str, timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RlboxError(f"{what}: did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
        raise RlboxError(f"{what}: {last[:200]}")
    return proc


def write_files(plan: SlurmPlan) -> None:
    folder = Path(plan.dir)
    (folder / "state").mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    fd = os.open(plan.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(1024))
    (folder / "slurm.conf").write_text(plan.slurm_conf())
    (folder / "gres.conf").write_text(plan.gres_conf())


def start(plan: SlurmPlan, init_pids: dict[int, int], echo: Echo, timeout: float = 60) -> float:
    """Bring Slurm up on the testbed; the seconds it took. Raises naming the host and daemon."""
    requirements()
    started = time.monotonic()
    write_files(plan)
    hosts = plan.testbed.hosts
    for h in hosts:
        _run(plan.install_argv(h, init_pids[h.index]), f"{h.address}: slurm files")
        _run(plan.munged_argv(h, init_pids[h.index]), f"{h.address}: munged (see {h.dir}/munged.log)")
    ctl = plan.controller
    _run(plan.daemon_argv(ctl, init_pids[ctl.index], "slurmctld"), f"{ctl.address}: slurmctld")
    for h in hosts:
        _run(plan.daemon_argv(h, init_pids[h.index], "slurmd"), f"{h.address}: slurmd (see {h.dir}/slurmd.log)")
    enter = plan.client_argv(ctl, init_pids[ctl.index])
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        proc = subprocess.run([*enter, "sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                              timeout=15, stdin=subprocess.DEVNULL)
        states = dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)
        if proc.returncode == 0 and len(states) == len(hosts) and all(s == "idle" for s in states.values()):
            break
        time.sleep(0.5)
    else:
        waiting = [f"{h.name} {states.get(h.name, 'unknown')}" for h in hosts if states.get(h.name) != "idle"]
        raise RlboxError(f"slurm: node(s) not idle after {timeout:.0f} s: {', '.join(waiting) or 'no answer from slurmctld'} "
                         f"(see {ctl.dir}/slurmctld.log and each host's slurmd.log)")
    names = _run([*enter, "srun", f"--nodes={len(hosts)}", "--chdir=/", "--time=1", "hostname"],
                 "slurm: srun hostname on every node", timeout=60).stdout.split()
    if sorted(names) != sorted(h.name for h in hosts):
        raise RlboxError(f"slurm: srun -N {len(hosts)} hostname answered {' '.join(names)[:120]!r}, not the nodes "
                         f"{' '.join(h.name for h in hosts)}")
    took = time.monotonic() - started
    echo(f"slurm up in {took:.1f} s: slurmctld on {ctl.name} ({ctl.address}), slurmd on "
         f"{', '.join(h.name for h in hosts)}, partition {'rlbox'}; `srun -N {len(hosts)} hostname` ran on every node")
    return took
