"""The one shape of a backend (torchx's split: ``submit_dryrun`` -> a printable plan, then
``schedule``): ``plan`` turns a resolved run request into a value whose ``describe()`` is what
`--dry-run` prints (nothing touched), ``submit`` carries it out, ``stop`` ends the run it made.
`rlbox status` and `rlbox logs` read the run's record (runs/NAME/state.json), which every backend
that starts containers writes the same way; a backend whose run is no containers of rlbox's
(``own_record``: kuberay) answers `rlbox status`/`logs`/`stop` itself from its own record."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlbox.core.errors import RlboxError

Echo = Callable[[str], None]


class Plan(Protocol):
    """rlbox.core.plan.Plan: what --dry-run prints, and the same as JSON-ready data."""

    def describe(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Io:
    """How a backend speaks: ``echo`` a status line (stderr, "rlbox: " first), ``emit`` the job's
    output (stdout), ``warn`` a line that does not stop the run (no markup), ``line`` a line as it
    is, ``tty`` whether stderr is a terminal."""

    echo: Echo
    emit: Echo
    warn: Echo
    line: Echo  # a line printed as it is (triage's report)
    tty: bool = False


@dataclass(frozen=True)
class RunOptions:
    """What `rlbox run` says beyond the run request itself (launch.RunRequest)."""

    timeout: int = 300
    detach: bool = False
    keep: bool = False
    replace: bool = False
    verl_version: str | None = None
    verl_config: Path | None = None
    no_validate: bool = False
    no_doctor: bool = False
    # backend kuberay
    k8s_profile: Path | None = None
    scheduler: str | None = None
    queue: str | None = None
    deadline: int | None = None
    # backend slurm
    partition: str | None = None
    time: str | None = None
    gres_npus: bool = False

    def given(self) -> dict[str, Any]:
        """The backend-specific options that were given, by their option names."""
        named = {"--k8s-profile": self.k8s_profile, "--scheduler": self.scheduler, "--queue": self.queue,
                 "--deadline": self.deadline, "--partition": self.partition, "--time": self.time,
                 "--gres-npus": self.gres_npus or None, "--detach": self.detach or None, "--keep": self.keep or None,
                 "--replace": self.replace or None, "--no-doctor": self.no_doctor or None}
        return {k: v for k, v in named.items() if v is not None}


class Backend(ABC):
    name: str = ""
    options: frozenset[str] = frozenset()  # the backend-specific options it takes (RunOptions.given's names)
    own_record: bool = False  # its runs have no state.json: status/logs/stop are all its own

    def check_options(self, opts: RunOptions) -> None:
        stray = [k for k in opts.given() if k not in self.options]
        if stray:
            owners = [b for b in NAMES if stray[0] in get(b).options]
            raise RlboxError(f"{', '.join(stray)}: not an option of --backend {self.name}"
                             + (f" (it goes with --backend {' or '.join(owners)})" if owners else ""))

    @abstractmethod
    def plan(self, req, opts: RunOptions) -> Plan:
        """A printable plan (describe()); reads no host (a dry run prints it and touches nothing)."""

    @abstractmethod
    def submit(self, plan: Plan, req, opts: RunOptions, io: Io) -> None:
        """Carry the plan out; raise RlboxError (its exit code) when the run fails."""

    def stop(self, runs_dir: Path, name: str, io: Io) -> None:  # pragma: no cover - per backend
        raise RlboxError(f"--backend {self.name}: rlbox stop does not apply")

    def status(self, runs_dir: Path, name: str) -> dict | None:
        """What the scheduler says of the run, with its one-line form under "line" (`rlbox status` shows
        it beside the nodes); None when the backend has no scheduler of its own (hosts)."""
        return None

    def logs(self, runs_dir: Path, name: str, follow: bool, io: Io) -> None:  # pragma: no cover - own_record only
        """The job's log, for a backend with ``own_record`` (the others' is read from state.json)."""
        raise RlboxError(f"--backend {self.name}: rlbox logs reads the run's state.json")


NAMES = ("hosts", "slurm", "kuberay")
_MODULES = {"hosts": "rlbox.backends.hosts", "slurm": "rlbox.backends.slurm.backend", "kuberay": "rlbox.backends.kuberay"}


def get(name: str) -> Backend:
    """The backend of this name (its module imported only now)."""
    if name not in _MODULES:
        raise RlboxError(f"--backend {name}: choose {', '.join(NAMES)}")
    return importlib.import_module(_MODULES[name]).BACKEND


def of_run(run_dir: Path) -> str:
    """Which backend made the run in RUN_DIR: slurm when its allocation record is there, kuberay
    when its RayJob record is (and no state.json of containers), else hosts."""
    if (run_dir / "slurm.json").exists():
        return "slurm"
    if (run_dir / "kuberay.json").exists() and not (run_dir / "state.json").exists():
        return "kuberay"
    return "hosts"
