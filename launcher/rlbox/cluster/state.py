"""Where a run's files are: ``runs/NAME/state.json`` (written by run.py) and one job log per
job, ``runs/NAME/<run-id>.log`` (the run id is the suffix of the job's submission id
``rlbox-NAME-<run-id>``)."""

from __future__ import annotations

import json
from pathlib import Path

from rlbox.core.errors import RlboxError


def run_dir(runs_dir: Path, name: str) -> Path:
    path = runs_dir / name
    if not path.is_dir():
        raise RlboxError(f"no run named '{name}' under {runs_dir} (rlbox run --name {name} ...)")
    return path


def state(runs_dir: Path, name: str) -> dict:
    path = run_dir(runs_dir, name) / "state.json"
    if not path.is_file():
        raise RlboxError(f"run '{name}' has no state.json under {path.parent}")
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise RlboxError(f"{path}: not valid JSON") from None


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
        for candidate in (job, job.removeprefix(f"rlbox-{run}-")):
            if (folder / f"{candidate}.log").is_file():
                return folder / f"{candidate}.log"
        have = ", ".join(p.stem for p in logs) or "none"
        raise RlboxError(f"run '{run}' has no job '{job}' under {folder} (jobs: {have})")
    path = folder / "state.json"
    if path.is_file():
        try:
            log = json.loads(path.read_text()).get("log")
        except ValueError:
            log = None
        if log and Path(log).is_file():
            return Path(log)
    if logs:
        return logs[-1]
    raise RlboxError(f"run '{run}' has no job log under {folder} (was a job submitted? `rlbox status --name {run}`)")
