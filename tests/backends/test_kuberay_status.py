"""`rlbox status` / `logs` / `stop` of a run applied as a KubeRay RayJob.

The judgement of `kubectl get rayjob -o json` is table-tested with the shapes KubeRay writes
(RayJobStatus of ray-operator/apis/ray/v1/rayjob_types.go). The commands run the real kubectl
(Debian's kubernetes-client) against tests/support/kube_api.py: a local HTTP server that answers
discovery and records every other request, so the tests stop at the exact requests each command
sends. No Kubernetes API server or KubeRay operator runs here: what a real cluster answers beyond
these canned objects (a RayJob's life, the submitter pod's output) is not tested."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlbox.backends import base
from rlbox.cluster import rayjob_status as rs
from rlbox.core.errors import RlboxError
from support.kube_api import KubeApi

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
KUBECTL = shutil.which("kubectl")
# .ci/provision installs it: under CI a missing kubectl fails these tests, never skips them
needs_kubectl = pytest.mark.skipif(KUBECTL is None and os.environ.get("CI") != "true",
                                   reason="kubectl (Debian: kubernetes-client) is not installed")
REC = rs.Record(run="t", name="rlbox-t", namespace="rl")
RAYJOB = "/apis/ray.io/v1/namespaces/rl/rayjobs/rlbox-t"


def rayjob(**status) -> dict:
    """A RayJob as `kubectl get -o json` prints it (metadata trimmed), with STATUS."""
    obj = {"apiVersion": "ray.io/v1", "kind": "RayJob",
           "metadata": {"name": "rlbox-t", "namespace": "rl", "uid": "5f0c", "generation": 1,
                        "creationTimestamp": "2026-01-05T10:00:00Z", "labels": {"io.rlbox.run": "t"}},
           "spec": {"entrypoint": "python3 -m verl.trainer.main_ppo", "shutdownAfterJobFinishes": True}}
    return obj | ({"status": status} if status else {})


RUNNING = dict(jobId="rlbox-t-x7k2p", rayClusterName="rlbox-t-raycluster-8vq4c", jobStatus="RUNNING",
               jobDeploymentStatus="Running", startTime="2026-01-05T10:00:02Z", observedGeneration=1,
               dashboardURL="rlbox-t-raycluster-8vq4c-head-svc.rl.svc.cluster.local:8265",
               rayJobInfo={"startTime": "2026-01-05T10:03:10Z"}, rayClusterStatus={"state": "ready"})

JUDGED = [
    # (status, state, line after "kuberay: RayJob rl/rlbox-t: ")
    ({}, "NEW", "created, no status yet (is a KubeRay operator watching namespace rl?)"),
    (dict(jobDeploymentStatus="Initializing", rayClusterName="rlbox-t-raycluster-8vq4c", startTime="2026-01-05T10:00:02Z"),
     "STARTING", "STARTING (job -, deployment Initializing, RayCluster rlbox-t-raycluster-8vq4c, started 2026-01-05T10:00:02Z)"),
    (dict(jobStatus="PENDING", jobDeploymentStatus="Running", rayClusterName="c"),
     "STARTING", "STARTING (job PENDING, deployment Running, RayCluster c)"),
    (RUNNING, "RUNNING", "RUNNING (job RUNNING, deployment Running, RayCluster rlbox-t-raycluster-8vq4c, "
                         "started 2026-01-05T10:00:02Z)"),
    (dict(RUNNING, jobStatus="SUCCEEDED", jobDeploymentStatus="Complete", endTime="2026-01-05T12:00:00Z", succeeded=1,
          message="Job finished successfully."),
     "SUCCEEDED", "SUCCEEDED (job SUCCEEDED, deployment Complete, RayCluster rlbox-t-raycluster-8vq4c, "
                  "started 2026-01-05T10:00:02Z, ended 2026-01-05T12:00:00Z): Job finished successfully."),
    (dict(RUNNING, jobStatus="FAILED", jobDeploymentStatus="Failed", reason="AppFailed", failed=1,
          message="Job entrypoint command failed with exit code 1,\n last available logs: ..."),
     "FAILED", "FAILED (job FAILED, deployment Failed, RayCluster rlbox-t-raycluster-8vq4c, started 2026-01-05T10:00:02Z): "
               "AppFailed; Job entrypoint command failed with exit code 1, last available logs: ..."),
    (dict(jobDeploymentStatus="Failed", reason="DeadlineExceeded",
          message="The RayJob has passed the activeDeadlineSeconds. DeadlineSeconds: 60"),
     "FAILED", "FAILED (job -, deployment Failed): DeadlineExceeded; The RayJob has passed the activeDeadlineSeconds. "
               "DeadlineSeconds: 60"),
    (dict(RUNNING, jobStatus="STOPPED", jobDeploymentStatus="Complete"), "STOPPED",
     "STOPPED (job STOPPED, deployment Complete, RayCluster rlbox-t-raycluster-8vq4c, started 2026-01-05T10:00:02Z)"),
    (dict(jobDeploymentStatus="Suspended"), "SUSPENDED", "SUSPENDED (job -, deployment Suspended)"),
    (dict(jobDeploymentStatus="Retrying", failed=1), "STARTING", "STARTING (job -, deployment Retrying)"),
]


@pytest.mark.parametrize("status, state, line", JUDGED, ids=[s for _, s, _ in JUDGED])
def test_judge_rayjob_status(status, state, line):
    found = rs.judge(json.dumps(rayjob(**status)), REC)
    assert found["state"] == state and found["rayjob"] == "rlbox-t" and found["namespace"] == "rl"
    assert rs.status_line(found) == f"kuberay: RayJob rl/rlbox-t: {line}"
    assert "\n" not in rs.status_line(found)


@pytest.mark.parametrize("answer", ["", "not json", json.dumps({"kind": "Status", "status": "Failure"}), "[]"])
def test_an_answer_that_is_no_rayjob_is_unknown(answer):
    found = rs.judge(answer, REC)
    assert found["state"] == "UNKNOWN"
    assert rs.status_line(found).startswith("kuberay: RayJob rl/rlbox-t: kubectl's answer is not a RayJob")


def test_of_run_knows_a_kuberay_record(tmp_path):
    assert base.of_run(tmp_path) == "hosts"
    rs.write_record(tmp_path, REC)
    assert base.of_run(tmp_path) == "kuberay" and base.get("kuberay").own_record
    (tmp_path / "state.json").write_text("{}")  # containers of rlbox's: the hosts record wins
    assert base.of_run(tmp_path) == "hosts"


def test_record_reads_back(tmp_path):
    rs.write_record(tmp_path, rs.Record(run="t", name="rlbox-t", namespace="rl", context="prod"))
    assert rs.read_record(tmp_path, "t") == rs.Record(run="t", name="rlbox-t", namespace="rl", context="prod")


TAMPERED = [
    ({"name": "rlbox-t; rm -rf /"}, "field name: 'rlbox-t; rm -rf /' is not a Kubernetes name"),
    ({"name": "-n"}, "field name: '-n' is not a Kubernetes name"),
    ({"namespace": "Kube_System"}, "field namespace: 'Kube_System' is not a Kubernetes name"),
    ({"namespace": None}, "field namespace: None is not a Kubernetes name"),
    ({"context": "--kubeconfig=/tmp/x"}, "field context: '--kubeconfig=/tmp/x' is not a kubectl context name"),
    ({"context": "a\nb"}, "field context: 'a\\nb' is not a kubectl context name"),
    ({"run": "other"}, "field run: 'other' is not this run's name ('t')"),
    ({"kind": "Pod"}, "field kind: 'Pod' is not 'RayJob'"),
    ({"apiVersion": "ray.io/v1alpha1"}, "field apiVersion: 'ray.io/v1alpha1' is not 'ray.io/v1'"),
]


@pytest.mark.parametrize("change, says", TAMPERED, ids=[next(iter(c)) + str(i) for i, (c, _) in enumerate(TAMPERED)])
def test_a_tampered_record_is_one_line(tmp_path, change, says):
    (tmp_path / rs.RECORD).write_text(json.dumps(REC.as_dict() | change))
    with pytest.raises(RlboxError) as caught:
        rs.read_record(tmp_path, "t")
    assert str(caught.value).startswith(f"{tmp_path / rs.RECORD}: {says}") and "\n" not in str(caught.value)


def test_an_unreadable_record_is_one_line(tmp_path):
    (tmp_path / rs.RECORD).write_text("{not json")
    with pytest.raises(RlboxError, match=r"kuberay.json: not a readable RayJob record"):
        rs.read_record(tmp_path, "t")


# ---------------------------------------------------------------------------------------------
# The commands, through the real kubectl, stopped at the requests they send.


@pytest.fixture
def api(tmp_path):
    with KubeApi() as server:
        yield server


def run_dir_with(tmp_path: Path, record: rs.Record = REC) -> Path:
    run_dir = tmp_path / "runs" / record.run
    run_dir.mkdir(parents=True)
    rs.write_record(run_dir, record)
    return run_dir


def rlbox(tmp_path: Path, api: KubeApi | None, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig") if api else tmp_path / "kubeconfig"
    return subprocess.run([sys.executable, "-m", "rlbox.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(LAUNCHER), "KUBECONFIG": str(kubeconfig),
                               "HOME": str(tmp_path), "RLBOX_RUNS_DIR": str(tmp_path / "runs"), **(env or {})})


def one_line_error(proc, says: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("rlbox: error: ") and says in proc.stderr, proc.stderr


@needs_kubectl
def test_status_gets_the_rayjob(tmp_path, api):
    run_dir_with(tmp_path)
    api.rayjobs[("rl", "rlbox-t")] = rayjob(**RUNNING)
    proc = rlbox(tmp_path, api, "status", "--name", "t")
    assert proc.returncode == 0, proc.stderr
    assert api.requests == [("GET", RAYJOB, "timeout=30s")]
    assert proc.stdout.splitlines() == [
        "run t (--backend kuberay)",
        "kuberay: RayJob rl/rlbox-t: RUNNING (job RUNNING, deployment Running, RayCluster rlbox-t-raycluster-8vq4c, "
        "started 2026-01-05T10:00:02Z)"]
    proc = rlbox(tmp_path, api, "status", "--name", "t", "--json")
    shown = json.loads(proc.stdout)
    assert shown["backend"] == "kuberay" and shown["scheduler"]["state"] == "RUNNING"
    assert shown["scheduler"]["ray_cluster"] == "rlbox-t-raycluster-8vq4c"


@needs_kubectl
def test_status_through_the_recorded_context(tmp_path, api):
    run_dir_with(tmp_path, rs.Record(run="t", name="rlbox-t", namespace="rl", context="site-a"))
    api.rayjobs[("rl", "rlbox-t")] = rayjob()
    api.kubeconfig(tmp_path / "kubeconfig", context="site-a")
    kubeconfig = json.loads((tmp_path / "kubeconfig").read_text())
    kubeconfig["current-context"] = "elsewhere"  # only --context=site-a reaches the server
    kubeconfig["contexts"].append({"name": "elsewhere", "context": {"cluster": "nowhere", "user": "test"}})
    kubeconfig["clusters"].append({"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}})
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig))
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "status", "--name", "t"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(LAUNCHER), "HOME": str(tmp_path),
                                            "KUBECONFIG": str(tmp_path / "kubeconfig"),
                                            "RLBOX_RUNS_DIR": str(tmp_path / "runs")})
    assert proc.returncode == 0, proc.stderr
    assert api.requests == [("GET", RAYJOB, "timeout=30s")]
    assert "created, no status yet" in proc.stdout


@needs_kubectl
def test_stop_deletes_the_rayjob(tmp_path, api):
    run_dir_with(tmp_path)
    api.rayjobs[("rl", "rlbox-t")] = rayjob(**RUNNING)
    proc = rlbox(tmp_path, api, "stop", "--name", "t")
    assert proc.returncode == 0, proc.stderr
    # the DELETE, then kubectl's own wait until the RayJob is gone
    assert api.requests == [("DELETE", RAYJOB, "timeout=30s"), ("GET", RAYJOB, "timeout=30s")]
    assert proc.stderr == 'rlbox: kuberay: rayjob.ray.io "rlbox-t" deleted (KubeRay removes its RayCluster)\n'
    assert ("rl", "rlbox-t") not in api.rayjobs


@needs_kubectl
@pytest.mark.parametrize("follow", [False, True])
def test_logs_read_the_submitter_pod(tmp_path, api, follow):
    run_dir_with(tmp_path)
    api.pods[("rl", "rlbox-t-5xq8d")] = {"labels": {"job-name": "rlbox-t", "batch.kubernetes.io/job-name": "rlbox-t"},
                                         "log": "step:1 - loss:0.5\nstep:2 - loss:0.4\n"}
    api.pods[("rl", "other-abcde")] = {"labels": {"job-name": "other"}, "log": "not ours\n"}
    proc = rlbox(tmp_path, api, "logs", "--name", "t", *(["-f"] if follow else []))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "step:1 - loss:0.5\nstep:2 - loss:0.4\n"
    assert api.requests == [
        ("GET", "/api/v1/namespaces/rl/pods", "labelSelector=job-name%3Drlbox-t"),
        ("GET", "/api/v1/namespaces/rl/pods/rlbox-t-5xq8d/log",
         "container=ray-job-submitter&follow=true" if follow else "container=ray-job-submitter")]


@needs_kubectl
def test_logs_before_the_submitter_pod_is_one_line(tmp_path, api):
    run_dir_with(tmp_path)
    proc = rlbox(tmp_path, api, "logs", "--name", "t")
    one_line_error(proc, "`kubectl logs -n rl -l job-name=rlbox-t --tail=-1`: no pod labelled job-name=rlbox-t in "
                         "namespace rl (KubeRay starts RayJob rlbox-t's submitter once its RayCluster is ready")
    assert api.requests == [("GET", "/api/v1/namespaces/rl/pods", "labelSelector=job-name%3Drlbox-t")]


@needs_kubectl
@pytest.mark.parametrize("command", ["status", "stop", "logs"])
def test_a_rayjob_not_found_is_one_line(tmp_path, api, command):
    run_dir_with(tmp_path)
    api.namespaces = set()  # kubectl then asks after the namespace too; a list of pods there is empty
    proc = rlbox(tmp_path, api, command, "--name", "t")
    said = {"status": "`kubectl get rayjob rlbox-t -n rl -o json` failed: Error from server (NotFound)",
            "stop": "`kubectl delete rayjob rlbox-t -n rl` failed: Error from server (NotFound)",
            "logs": "`kubectl logs -n rl -l job-name=rlbox-t --tail=-1`: no pod labelled job-name=rlbox-t"}[command]
    one_line_error(proc, said)
    if command != "logs":
        assert api.requests[0] == ("DELETE" if command == "stop" else "GET", RAYJOB, "timeout=30s")


@needs_kubectl
def test_no_cluster_reachable_is_one_line(tmp_path):
    run_dir_with(tmp_path)
    (tmp_path / "kubeconfig").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}], "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    proc = rlbox(tmp_path, None, "status", "--name", "t")
    one_line_error(proc, "`kubectl get rayjob rlbox-t -n rl -o json` failed: ")
    assert "connection refused" in proc.stderr or "refused" in proc.stderr


def test_kubectl_not_installed_is_one_line(tmp_path):
    run_dir_with(tmp_path)
    proc = rlbox(tmp_path, None, "stop", "--name", "t", env={"RLBOX_KUBECTL": str(tmp_path / "no-kubectl")})
    one_line_error(proc, "no-kubectl not found: install kubectl (Debian: kubernetes-client)")


@needs_kubectl
def test_a_tampered_record_sends_nothing(tmp_path, api):
    run_dir = run_dir_with(tmp_path)
    (run_dir / rs.RECORD).write_text(json.dumps(REC.as_dict() | {"namespace": "rl --all-namespaces"}))
    for command in ("status", "logs", "stop"):
        proc = rlbox(tmp_path, api, command, "--name", "t")
        one_line_error(proc, f"{run_dir / rs.RECORD}: field namespace: 'rl --all-namespaces' is not a Kubernetes name")
    assert api.requests == []


def test_a_run_without_any_record_is_still_no_run(tmp_path):
    (tmp_path / "runs" / "t").mkdir(parents=True)
    proc = rlbox(tmp_path, None, "status", "--name", "t")
    one_line_error(proc, "no run named 't' under")
