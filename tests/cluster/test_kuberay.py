"""`rlbox run --backend kuberay` / `rlbox k8s export`: the RayJob manifests, checked for real
against KubeRay's own RayJob v1 schema (vendored from a named release by
tools/refresh-kuberay-crd.py) and the pod templates against Kubernetes' core schemas
(kubernetes-validate). No Kubernetes API server runs here: nothing is applied to a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from rlbox.cli.main import cli
from rlbox.cluster import launch, recipes
from rlbox.cluster.preflight import checks
from rlbox.verl import tree as verl_tree
from support.kuberay import profile_with

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kuberay"
PROFILE = FIXTURES / "profile-a3.yaml"
LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
K8S_VERSION = "1.30"  # the Kubernetes whose core schemas the pod templates must satisfy
VENDORED = json.loads((FIXTURES / "rayjob-v1-openapi.json").read_text())


def _strict(schema):
    """The CRD schema as the API server's strict field validation (`kubectl apply`'s default
    since 1.27) reads it: an object that lists its properties refuses any other (jsonschema
    would accept them silently), unless the schema keeps unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


VALIDATOR = jsonschema.Draft7Validator(_strict(VENDORED["openAPIV3Schema"]))


def crd_errors(manifest) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in VALIDATOR.iter_errors(manifest)]


def pod_templates(manifest):
    cluster = manifest["spec"]["rayClusterSpec"]
    yield "head", cluster["headGroupSpec"]["template"]
    for group in cluster.get("workerGroupSpecs", []):
        yield group["groupName"], group["template"]


def check_pods(manifest) -> None:
    for name, template in pod_templates(manifest):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
                                      "template": template}, K8S_VERSION, strict=True)


def assert_valid(manifest) -> None:
    assert crd_errors(manifest) == []
    check_pods(manifest)


@pytest.fixture(autouse=True)
def fixed_run_id(monkeypatch):
    monkeypatch.setattr(launch.secrets, "token_hex", lambda n: "0123abcd")


def export(*args: str, expect_ok: bool = True):
    result = CliRunner().invoke(cli, ["k8s", "export", "--k8s-profile", str(PROFILE), "-o", "-", *args])
    if expect_ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def rlbox(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlbox.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(LAUNCHER), **(env or {})}, timeout=120)


def test_vendored_schema_names_its_release():
    assert VENDORED["kuberay_version"] == "v1.7.0" and len(VENDORED["source_commit"]) == 40
    assert VENDORED["api_version"] == "ray.io/v1" and VENDORED["source"].endswith("ray.io_rayjobs.yaml")


def test_the_validators_can_fail():
    good = yaml.safe_load(export("--recipe", "dapo-qwen3-32b-a3", "--no-validate").output)
    assert_valid(good)
    typo = json.loads(json.dumps(good))
    typo["spec"]["shutdownAfterJobFinish"] = True
    assert any("shutdownAfterJobFinish" in e for e in crd_errors(typo))
    wrong = json.loads(json.dumps(good))
    wrong["spec"]["backoffLimit"] = "3"
    assert any("backoffLimit" in e for e in crd_errors(wrong))
    no_group = json.loads(json.dumps(good))
    del no_group["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    assert any("groupName" in e for e in crd_errors(no_group))
    bad_pod = json.loads(json.dumps(good))
    bad_pod["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    assert any("volumeMount" in e for e in crd_errors(bad_pod))
    with pytest.raises(kubernetes_validate.ValidationError):
        check_pods(bad_pod)
    bad_type = json.loads(json.dumps(good))
    bad_type["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"][0]["emptyDir"]["medium"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        check_pods(bad_type)


def test_four_node_a3_dapo_is_a_valid_rayjob():
    """The issue's "done when": the 4-node A3 DAPO recipe through `rlbox run --backend kuberay`."""
    result = CliRunner().invoke(cli, ["run", "--backend", "kuberay", "--k8s-profile", str(PROFILE), "--recipe",
                                      "dapo-qwen3-32b-a3", "--nodes", "4", "--hardware", "a3", "--mount", "/data",
                                      "--max-restarts", "2", "--deadline", "172800", "--scheduler", "volcano",
                                      "--queue", "rl", "--dry-run"])
    assert result.exit_code == 0, (result.output, result.exception)
    rayjob = yaml.safe_load(result.output)  # stdout is the manifest and nothing else
    assert_valid(rayjob)
    spec = rayjob["spec"]
    assert rayjob["apiVersion"] == "ray.io/v1" and rayjob["kind"] == "RayJob"
    assert rayjob["metadata"]["labels"] == {"io.rlbox.managed": "true", "io.rlbox.run": "verl",
                                            "io.rlbox.run-id": "0123abcd", "ray.io/scheduler-name": "volcano",
                                            "volcano.sh/queue-name": "rl"}
    assert spec["backoffLimit"] == 2 and spec["activeDeadlineSeconds"] == 172800
    assert spec["preRunningDeadlineSeconds"] == 300 and spec["shutdownAfterJobFinishes"] is True
    assert "trainer.nnodes=4 trainer.n_gpus_per_node=16" in spec["entrypoint"]
    assert spec["entrypoint"].count("trainer.resume_mode=auto") == 1
    assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]["HCCL_CONNECT_TIMEOUT"] == "3600"
    workers = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert [(w["replicas"], w["minReplicas"], w["maxReplicas"]) for w in workers] == [(3, 3, 3)]
    for name, template in pod_templates(rayjob):
        box = template["spec"]["containers"][0]
        assert box["resources"]["limits"]["huawei.com/Ascend910"] == "16"
        assert box["securityContext"]["privileged"] is False
        env = {e["name"]: e for e in box["env"]}
        assert env["HCCL_IF_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["HCCL_SOCKET_IFNAME"]["value"] == env["GLOO_SOCKET_IFNAME"]["value"] == "eth0"
        assert env["HCCL_IF_BASE_PORT"]["value"] == "60100" and env["HCCL_HOST_SOCKET_PORT_RANGE"]["value"] == "60132-60195"
        assert "LD_PRELOAD" not in env  # the image's jemalloc stays
        mounts = {m["mountPath"]: m for m in box["volumeMounts"]}
        assert mounts["/usr/local/Ascend/driver"]["readOnly"] and mounts["/usr/local/bin/npu-smi"]["readOnly"]
        shm = next(v for v in template["spec"]["volumes"] if v["name"] == mounts["/dev/shm"]["name"])
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    params = [spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"], workers[0]["rayStartParams"]]
    assert all(p["resources"] == '"{\\"NPU\\": 16}"' for p in params)


GOLDEN = [(r, hw) for r in recipes.names_available() for hw in ("a2", "a3")]


@pytest.mark.parametrize("recipe,hardware", GOLDEN, ids=[f"{r}-{hw}" for r, hw in GOLDEN])
def test_golden_manifest_per_recipe(recipe, hardware):
    text = export("--recipe", recipe, "--hardware", hardware, "--no-validate").output
    assert_valid(yaml.safe_load(text))
    golden = FIXTURES / "golden" / f"{recipe}-{hardware}.yaml"
    if os.environ.get("RLBOX_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs; RLBOX_UPDATE_GOLDEN=1 rewrites it (and review the diff)"


def test_validation_runs_before_the_file_is_written(tmp_path, monkeypatch):
    class Tree:
        origin = "verl at test"

    seen = []
    monkeypatch.setattr(verl_tree, "for_validation", lambda **kw: seen.append(kw) or Tree())
    from rlbox.verl.outcome import Outcome, Problem

    monkeypatch.setattr(checks.validate, "examine", lambda tree, argv, nodes, npus, **kw:
                        seen.append((nodes, npus, kw["mounts"])) or Outcome((Problem(("trainer.tainer",), "unknown key"),)))
    out = tmp_path / "job.yaml"
    result = CliRunner().invoke(cli, ["k8s", "export", "--k8s-profile", str(PROFILE), "-o", str(out),
                                      "--recipe", "dapo-qwen3-32b-a3"])
    assert result.exit_code != 0 and "trainer.tainer: unknown key" in str(result.exception)
    assert not out.exists()
    assert seen[0]["image"] == "verl_pt27_25rc3:a3-arm" and seen[1] == (4, 16, (("/data", True),))


BAD = [
    ("unknown resource name", {"resource_name": "huawei.com/Ascend91O"}, [],
     "resource_name: 'huawei.com/Ascend91O' is not an Ascend device plugin resource (did you mean 'huawei.com/Ascend910'?)"),
    ("devices over the node", {}, ["--devices", "32"], "--devices 32: 32 NPUs asked, but a node of"),
    ("NPU id over the node", {"npus_per_node": 8}, ["--devices", "8-15"], "NPU 15 asked, but a node of"),
    ("mount without a volume", {}, ["--mount", "/scratch"], "--mount /scratch:/scratch: no volume of"),
    ("malformed profile", {"namspace": "rl"}, [], "namspace: unknown key (did you mean 'namespace'?)"),
    ("volume with two sources", {"volumes": [{"name": "d", "path": "/d", "pvc": "c", "host_path": "/d"}]}, [],
     "give exactly one of pvc: CLAIM or host_path: /DIR"),
    ("queue without volcano", {}, ["--queue", "rl"], "a queue is Volcano's; add --scheduler volcano"),
    ("privileged", {}, ["--privileged"], "--privileged is for --backend hosts"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_line(case, tmp_path):
    _, changes, extra, expect = case
    proc = rlbox("run", "--backend", "kuberay", "--k8s-profile", str(profile_with(tmp_path, **changes)),
                 "--recipe", "dapo-qwen3-32b-a3", "--dry-run", *extra)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("rlbox: error: ") and expect in proc.stderr, proc.stderr


def test_run_applies_the_manifest_with_kubectl(tmp_path):
    """Without --dry-run the manifest goes to `kubectl apply -f -` (a stand-in kubectl here)."""
    got = tmp_path / "applied.yaml"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f"#!/bin/sh\n[ \"$*\" = 'apply -f -' ] || exit 9\ncat > {got}\necho rayjob.ray.io/rlbox-t created\n")
    kubectl.chmod(0o755)
    proc = rlbox("run", "--backend", "kuberay", "--k8s-profile", str(PROFILE), "--name", "t", "--smoke-test",
                 "--nodes", "2", "--image", "verl_pt27_25rc3:a3-arm",
                 env={"RLBOX_KUBECTL": str(kubectl), "RLBOX_RUNS_DIR": str(tmp_path / "runs")})
    assert proc.returncode == 0, proc.stderr
    assert "rayjob.ray.io/rlbox-t created" in proc.stderr and "kubectl get rayjob rlbox-t -n rl" in proc.stderr
    # the run's record of its RayJob, for `rlbox status/logs/stop` (the stand-in kubectl has no current context)
    assert json.loads((tmp_path / "runs" / "t" / "kuberay.json").read_text()) == {
        "backend": "kuberay", "run": "t", "name": "rlbox-t", "namespace": "rl", "context": None, "kind": "RayJob",
        "apiVersion": "ray.io/v1"}
    applied = yaml.safe_load(got.read_text())
    assert_valid(applied)
    assert applied["metadata"]["name"] == "rlbox-t"
    assert applied["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 1


def test_run_records_the_kubectl_context_and_keeps_another_backends_run(tmp_path):
    """The RayJob record names kubectl's current context at apply; a run folder holding a hosts
    run's state.json is refused before anything is applied (its record would be shadowed)."""
    applied = tmp_path / "applied"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text("#!/bin/sh\ncase \"$*\" in\n  'config current-context') echo site-a ;;\n"
                       f"  'apply -f -') cat > {applied}; echo rayjob.ray.io/rlbox-t created ;;\n  *) exit 9 ;;\nesac\n")
    kubectl.chmod(0o755)
    env = {"RLBOX_KUBECTL": str(kubectl), "RLBOX_RUNS_DIR": str(tmp_path / "runs")}
    args = ("run", "--backend", "kuberay", "--k8s-profile", str(PROFILE), "--name", "t", "--smoke-test", "--nodes", "2",
            "--image", "verl_pt27_25rc3:a3-arm")
    proc = rlbox(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "runs" / "t" / "kuberay.json").read_text())["context"] == "site-a"
    applied.unlink()
    (tmp_path / "runs" / "t" / "state.json").write_text("{}")
    proc = rlbox(*args, env=env)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "rlbox: error: run 't' already has a record of another backend" in proc.stderr
    assert not applied.exists()
