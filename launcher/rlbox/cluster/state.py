"""A run's record on disk: ``runs/NAME/state.json`` (a typed RunState, written atomically here
and nowhere else) and one job log per job, ``runs/NAME/<run-id>.log`` (the run id is the suffix
of the job's submission id ``rlbox-NAME-<run-id>``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlbox.cluster.sim import network_for
from rlbox.cluster.spec import Host, HostName, SshUser
from rlbox.core import names
from rlbox.core.config import CLUSTER_NODES, Int32, load_file
from rlbox.core.errors import RlboxError
from rlbox.registry import reference

STATE_FILE = "state.json"


class Phase(str, Enum):
    """Where a run is: each phase is written before the step it names starts."""

    STARTING = "starting"  # containers being started
    READY = "ready"  # every NPU joined Ray
    RUNNING = "running"  # the job was submitted
    FINISHED = "finished"  # the job ended (status, exit_code)
    RESTARTING = "restarting"  # a node was lost or the job failed retryably: down, checked, up again
    REMOVED = "removed"  # the run's containers were removed


# What the run adds to its plan (RunPlan.as_dict()); everything else in state.json is the plan.
_OWN = ("phase", "ready_seconds", "log", "submission_id", "status", "exit_code", "lost", "restarts", "reason",
        "addresses")


@dataclass(frozen=True)
class RunState:
    plan: dict[str, Any]
    phase: Phase | None  # None: a record that names no phase rlbox knows
    ready_seconds: float | None = None
    log: str | None = None
    submission_id: str | None = None
    status: str | None = None
    exit_code: int | None = None
    lost: str | None = None  # the node lost that ended the run, as rlbox named it
    restarts: tuple[dict[str, Any], ...] | None = None  # {attempt, of, cause, resumed_step} each
    reason: str | None = None  # why the run failed, as rlbox said it (any failure after its start)
    addresses: dict[str, str] | None = None  # node index -> the address the node reported (Ray's rows carry it)

    # -- what readers need of the plan ------------------------------------------------------
    @property
    def name(self) -> str:
        return self.plan.get("run", "")

    @property
    def run_id(self) -> str:
        return self.plan.get("run_id", "")

    @property
    def image(self) -> str:
        return self.plan.get("image", "")

    @property
    def nodes(self) -> list[dict[str, Any]]:
        return list(self.plan.get("nodes") or [])

    @property
    def network_name(self) -> str | None:
        return (self.plan.get("network") or {}).get("name")

    @property
    def job_env(self) -> dict[str, str]:
        return ((self.plan.get("job") or {}).get("runtime_env") or {}).get("env_vars") or {}

    def hosts(self) -> tuple[Host, ...]:
        """The hosts of the run's nodes, as the plan reached them."""
        return tuple(Host.from_record(n) for n in self.nodes)

    def dashboard(self, head_node) -> str:
        """The Ray dashboard's URL from here (hosts.Node.dashboard)."""
        return head_node.dashboard(self.plan.get("head"), self.plan["ports"]["dashboard"], bool(self.plan.get("sim")))

    def restart_lines(self) -> list[str]:
        """One line per restart, as `rlbox run` printed it (with the step verl resumed from)."""
        return [restart_line(r) for r in self.restarts or ()]

    def job_log(self) -> Path | None:
        return Path(self.log) if self.log and Path(self.log).is_file() else None

    # -- change and persistence ---------------------------------------------------------------
    def advance(self, phase: Phase, **changes) -> "RunState":
        return dataclasses.replace(self, phase=phase, **changes)

    def as_dict(self) -> dict[str, Any]:
        own = {k: getattr(self, k) for k in _OWN if getattr(self, k) is not None}
        if self.restarts is not None:
            own["restarts"] = [dict(r) for r in self.restarts]
        if self.addresses is not None:
            own["addresses"] = dict(self.addresses)
        if self.phase is not None:
            own["phase"] = self.phase.value
        return self.plan | own

    @property
    def phase_name(self) -> str | None:
        return self.phase.value if self.phase else None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunState":
        phase = Phase(data["phase"]) if data.get("phase") in {p.value for p in Phase} else None
        plan = {k: v for k, v in data.items() if k not in _OWN}
        restarts = data.get("restarts")
        addresses = data.get("addresses")
        return cls(plan, phase, data.get("ready_seconds"), data.get("log"), data.get("submission_id"),
                   data.get("status"), data.get("exit_code"), data.get("lost"),
                   tuple(r for r in restarts if isinstance(r, dict)) if isinstance(restarts, list) else None,
                   data.get("reason") if isinstance(data.get("reason"), str) else None,
                   {str(k): v for k, v in addresses.items() if isinstance(v, str)} if isinstance(addresses, dict) else None)

    def save(self, path: Path) -> None:
        """Write atomically: a reader sees the old record or the new one, never half of one. On a
        full disk (no room for the second copy) the record is rewritten in place instead, so that
        it still tells the truth; OSError when even that fails."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        text = json.dumps(self.as_dict(), indent=2)
        try:
            tmp.write_text(text)
            tmp.replace(path)
        except OSError:
            tmp.unlink(missing_ok=True)
            data, blocks = text.encode(), lambda n: -(-n // 4096)
            if not path.is_file() or blocks(len(data)) > blocks(path.stat().st_size):
                raise
            with path.open("r+b") as f:  # the old record's blocks hold the new one: no new space needed
                f.write(data)
                f.truncate()


def record_run_id(path: Path) -> str | None:
    """The run id of the record at ``path`` (None: no readable record)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data.get("run_id") if isinstance(data, dict) else None


def restart_line(r: dict[str, Any]) -> str:
    step = r.get("resumed_step")
    resumed = f"; resumed from step {step}" if step is not None else ""
    return f"restart {r.get('attempt')}/{r.get('of')}: {r.get('cause')}{resumed}"


# ---------------------------------------------------------------------------------------------
# state.json's schema, checked where it is read: what readers use of a record is typed (names,
# hosts, ports, the log), the rest of the plan is kept as it is. A record edited by hand (or by
# another user) that fails is one line naming the file and the field.

class _Node(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: int = Field(ge=0, le=CLUSTER_NODES)
    role: Literal["head", "worker"]
    host: HostName
    ssh_user: SshUser | None = None
    ssh_port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    transport: Literal["local", "ssh", "auto"] = "auto"
    npus: int = Field(0, ge=0, le=4096)
    container: names.FileName



class _Network(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: names.FileName


class _Restart(BaseModel):
    model_config = ConfigDict(extra="allow")
    attempt: int | None = Field(None, ge=0, le=10_000)
    of: int | None = Field(None, ge=0, le=10_000)
    cause: str | None = Field(None, max_length=2000)
    resumed_step: int | None = Field(None, ge=0)


class StateRecord(BaseModel):
    """state.json as read back: the run's own fields typed, the plan's other fields kept."""

    model_config = ConfigDict(extra="allow")
    run: names.RunName
    run_id: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,64}$")
    image: str = ""  # an image reference (or none yet)
    ports: dict[str, int | list[int]] = Field(default_factory=dict)
    network: _Network | None = None
    nodes: list[_Node] = Field(default_factory=list, max_length=CLUSTER_NODES)
    phase: str | None = None
    ready_seconds: float | None = None
    log: str | None = Field(None, max_length=4096)
    submission_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    status: str | None = Field(None, max_length=64)
    exit_code: Int32 | None = None
    lost: str | None = Field(None, max_length=2000)
    reason: str | None = Field(None, max_length=4000)
    addresses: dict[Annotated[str, Field(pattern=r"^[0-9]{1,4}$")], Annotated[str, Field(pattern=r"^[0-9A-Fa-f:.]{2,45}$")]] | None = Field(None, max_length=4096)  # node index -> address
    restarts: list[_Restart] | None = None
    max_restarts: int | None = Field(None, ge=0, le=10_000)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if v:  # "": no image yet
            reference.as_validator(reference.Reference.parse)(v)
        return v

    @field_validator("ports")
    @classmethod
    def _ports(cls, v: dict[str, int | list[int]]) -> dict[str, int | list[int]]:
        for key, value in v.items():  # a port, or a range [low, high] (worker_range)
            for port in value if isinstance(value, list) else [value]:
                if not 1 <= port <= 65535:
                    raise ValueError(f"ports.{key}: {port} is not a port (1-65535)")
        return v


def checked_log(folder: Path, log: str | None, where: str) -> Path | None:
    """The job log a record names, only when it lies inside the run's folder (a record naming
    any other file would make `rlbox logs` print it and triage copy it): else RlboxError."""
    if not log:
        return None
    try:
        return names.inside(folder, log, what=f"{where}: log")
    except RlboxError:
        raise RlboxError(f"{where}: log: {log[:120]!r} is not inside the run's folder {folder}; "
                         "a run's log is always runs/NAME/<run-id>.log") from None


def run_dir(runs_dir: Path, name: str) -> Path:
    names.check(name, "run name")
    path = names.inside(runs_dir, name, what="run name")
    if not path.is_dir():
        raise RlboxError(f"no run named '{name}' under {runs_dir} (rlbox run --name {name} ...)")
    return path


def state_path(runs_dir: Path, name: str) -> Path:
    return runs_dir / name / STATE_FILE


def load(runs_dir: Path, name: str, *, folder_is_enough: bool = False) -> RunState:
    """The record of run ``name``; one line naming what is missing or broken. A folder without
    a record is no run at all, unless ``folder_is_enough`` (triage: the logs collected there)."""
    path = run_dir(runs_dir, name) / STATE_FILE
    if not path.is_file():
        if not folder_is_enough:
            raise RlboxError(f"no run named '{name}' under {runs_dir} (rlbox run --name {name} ...)")
        raise RlboxError(f"run '{name}' has no {STATE_FILE} under {path.parent}")
    record = load_file(path, StateRecord, str(path), fmt="json")
    if record.run != name:
        raise RlboxError(f"{path}: run: {record.run!r} is not this run's name ({name!r})")
    own = network_for(name).name
    if record.network is not None and record.network.name != own:  # stop removes it: only ever the run's own
        raise RlboxError(f"{path}: network.name: {record.network.name[:80]!r} is not this run's network ({own!r})")
    data = record.model_dump(exclude_unset=True)
    if record.log:
        data["log"] = str(checked_log(path.parent, record.log, str(path)))
    return RunState.from_dict(data)


def job_logs(folder: Path) -> list[Path]:
    """Every job log of a run, oldest first."""
    return sorted((p for p in folder.glob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)


def job_log(runs_dir: Path, run: str, job: str | None = None) -> Path:
    """The log to read for RUN: a log file given by path, the job ``job`` (its run id or
    submission id) of the run, or the run's latest job (the one state.json names)."""
    given = Path(run)
    if given.is_file() and job is None:
        return given
    folder = run_dir(runs_dir, run)
    logs = job_logs(folder)
    if job:
        names.check(job, "--job", "file")  # a run id or submission id: a file name, never a path
        for candidate in (job, job.removeprefix(f"rlbox-{run}-")):
            if (folder / f"{candidate}.log").is_file():
                return folder / f"{candidate}.log"
        have = ", ".join(p.stem for p in logs) or "none"
        raise RlboxError(f"run '{run}' has no job '{job}' under {folder} (jobs: {have})")
    path = folder / STATE_FILE
    if path.is_file():
        log = load(runs_dir, run).log
        if log and Path(log).is_file():
            return Path(log)
    if logs:
        return logs[-1]
    raise RlboxError(f"run '{run}' has no job log under {folder} (was a job submitted? `rlbox status --name {run}`)")
