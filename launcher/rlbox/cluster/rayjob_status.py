"""A RayJob after `kubectl apply`, pure: the run's record of it (RUNS_DIR/NAME/kuberay.json: which
RayJob, in which namespace, through which kubectl context), read back as input, and the judgement
of `kubectl get rayjob NAME -o json` for `rlbox status` (KubeRay's RayJobStatus fields,
ray-operator/apis/ray/v1/rayjob_types.go: jobStatus, jobDeploymentStatus, rayClusterName,
startTime/endTime, reason, message)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbox.core import names
from rlbox.core.errors import RlboxError

RECORD = "kuberay.json"
KIND, API_VERSION = "RayJob", "ray.io/v1"
# JobStatus (the Ray job's own) and JobDeploymentStatus (KubeRay's handling of the RayJob)
JOB_STATUSES = ("", "PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED", "SCHEDULED")
JOB_ENDED = ("STOPPED", "SUCCEEDED", "FAILED")
DEPLOYMENT_STATUSES = ("", "Initializing", "Running", "Complete", "Failed", "Suspending", "Suspended", "Retrying",
                       "Waiting", "Scheduling", "Scheduled")


@dataclass(frozen=True)
class Record:
    """Which RayJob a run is: ``name`` in ``namespace``, through kubectl context ``context`` (None:
    kubectl's current one)."""

    run: str
    name: str
    namespace: str
    context: str | None = None
    kind: str = KIND
    api_version: str = API_VERSION

    def as_dict(self) -> dict[str, Any]:
        return {"backend": "kuberay", "run": self.run, "name": self.name, "namespace": self.namespace,
                "context": self.context, "kind": self.kind, "apiVersion": self.api_version}


def valid_context(value: object) -> bool:
    """A kubeconfig context name as rlbox passes it on (``--context=NAME``): printable, no leading
    '-', at most 253 characters."""
    return (isinstance(value, str) and 0 < len(value) <= 253 and value.isprintable() and not value.startswith("-")
            and value.strip() == value)


def write_record(run_dir: Path, record: Record) -> Path:
    path = run_dir / RECORD
    path.write_text(json.dumps(record.as_dict(), indent=2) + "\n")
    return path


def read_record(run_dir: Path, run: str) -> Record:
    """The run's RayJob record, every field checked; one line naming the file and the field."""
    path = run_dir / RECORD
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise RlboxError(f"{path}: not a readable RayJob record ({err}); "
                         "find the RayJob with `kubectl get rayjob -A -l io.rlbox.run=RUN`") from None
    if not isinstance(data, dict):
        raise RlboxError(f"{path}: not a RayJob record (a JSON object)")

    def bad(field: str, rule: str):
        shown = repr(data.get(field))[:80]
        return RlboxError(f"{path}: field {field}: {shown} is not {rule}; nothing was sent to kubectl")

    if data.get("run") != run:
        raise bad("run", f"this run's name ({run!r})")
    for field in ("name", "namespace"):
        if not names.valid(data.get(field), "dns"):
            raise bad(field, "a Kubernetes name (DNS-1123 label: lower-case letters, digits and '-', at most 63)")
    context = data.get("context")
    if context is not None and not valid_context(context):
        raise bad("context", "a kubectl context name (printable, no leading '-', at most 253)")
    if data.get("kind") != KIND:
        raise bad("kind", repr(KIND))
    if data.get("apiVersion") != API_VERSION:
        raise bad("apiVersion", repr(API_VERSION))
    return Record(run=run, name=data["name"], namespace=data["namespace"], context=context)


def judge(answer: str, record: Record) -> dict[str, Any]:
    """`kubectl get rayjob NAME -n NS -o json`'s answer: what KubeRay says of the RayJob."""
    try:
        obj = json.loads(answer)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        shown = answer.strip().splitlines()[0][:120] if answer.strip() else "(nothing)"
        return {"rayjob": record.name, "namespace": record.namespace, "state": "UNKNOWN",
                "error": f"kubectl's answer is not a RayJob: {shown}"}
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}

    def text(key: str) -> str:
        value = status.get(key)
        return " ".join(value.split())[:300] if isinstance(value, str) else ""  # one line

    job, deployment = text("jobStatus"), text("jobDeploymentStatus")
    found = {"rayjob": record.name, "namespace": record.namespace, "job_status": job, "deployment_status": deployment,
             "ray_cluster": text("rayClusterName"), "job_id": text("jobId"), "start_time": text("startTime"),
             "end_time": text("endTime"), "reason": text("reason"), "message": text("message"),
             "succeeded": status.get("succeeded") if isinstance(status.get("succeeded"), int) else None,
             "failed": status.get("failed") if isinstance(status.get("failed"), int) else None}
    if not status or (not job and not deployment):
        state = "NEW"  # the API server has it; no operator has said a word yet
    elif deployment == "Failed" or job == "FAILED":
        state = "FAILED"
    elif job in JOB_ENDED or deployment == "Complete":
        state = job if job in JOB_ENDED else "COMPLETE"
    elif deployment in ("Suspending", "Suspended"):
        state = "SUSPENDED"
    elif job == "RUNNING":
        state = "RUNNING"
    else:
        state = "STARTING"  # Initializing, Waiting, Scheduling, Retrying, PENDING...
    return found | {"state": state}


def status_line(found: dict[str, Any]) -> str:
    """One line of `rlbox status` for the RayJob."""
    where = f"kuberay: RayJob {found['namespace']}/{found['rayjob']}"
    if found["state"] == "UNKNOWN":
        return f"{where}: {found['error']}"
    if found["state"] == "NEW":
        return f"{where}: created, no status yet (is a KubeRay operator watching namespace {found['namespace']}?)"
    parts = [f"job {found['job_status'] or '-'}", f"deployment {found['deployment_status'] or '-'}"]
    if found["ray_cluster"]:
        parts.append(f"RayCluster {found['ray_cluster']}")
    if found["start_time"]:
        parts.append(f"started {found['start_time']}" + (f", ended {found['end_time']}" if found["end_time"] else ""))
    why = "; ".join(p for p in (found["reason"], found["message"]) if p)
    return f"{where}: {found['state']} ({', '.join(parts)})" + (f": {why}" if why else "")
