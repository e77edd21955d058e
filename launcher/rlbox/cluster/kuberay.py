"""The same run as a KubeRay ``RayJob`` (``ray.io/v1``): pure planning, from the run's inputs
(image, hardware, nodes, NPUs per node, job, mounts, env) and a cluster profile
(``k8s_profile.K8sProfile``) to the manifest ``kubectl apply -f`` takes. Nothing here talks to a
cluster.

What a ``--hosts`` node container gets, a pod gets: the node's NPUs (from the device plugin, in
the container's limits), Ray's ``NPU`` resource said explicitly in ``rayStartParams`` (KubeRay
maps GPUs and TPUs by itself, not Ascend NPUs: ray-project/kuberay#5039), ``/dev/shm`` as a
memory-backed emptyDir, the driver and ``npu-smi`` read-only from the host, the socket
interface for HCCL/GLOO/TP with ``HCCL_IF_IP`` the pod's own address (downward API), the run's
HCCL ports (``sharing.hccl_env``), the image's own ``LD_PRELOAD`` (jemalloc; never overridden
here), and no privilege.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from rlbox.cluster import jobs, k8s_profile, sharing
from rlbox.cluster.k8s_profile import K8sProfile
from rlbox.cluster.plan import (BASE_ENV, DCMI_DIR, DRIVER_DIR, INSTALL_INFO, LABEL_MANAGED, LABEL_ROLE, LABEL_RUN,
                                LABEL_RUN_ID, NPU_SMI, JobPlan)
from rlbox.cluster.spec import Mount
from rlbox.core.config import env_name_problem
from rlbox.core.errors import RlboxError
from rlbox.verl import job as verl_job

API_VERSION = "ray.io/v1"
KIND = "RayJob"
LABEL_SCHEDULER = "ray.io/scheduler-name"  # KubeRay's batch-scheduler label (operator: --batch-scheduler=volcano)
LABEL_QUEUE = "volcano.sh/queue-name"
HEAD_CONTAINER, WORKER_CONTAINER, WORKER_GROUP = "ray-head", "ray-worker", "npu"
# The host's Ascend driver files, read-only (as `rlbox run --hosts` mounts them): (volume, path, hostPath type)
HOST_FILES = (("ascend-driver", DRIVER_DIR, "Directory"), ("ascend-dcmi", DCMI_DIR, "Directory"),
              ("npu-smi", NPU_SMI, "File"), ("ascend-install-info", INSTALL_INFO, "File"))


class _Dumper(yaml.SafeDumper):
    """Plain YAML for kubectl and people: no anchors for repeated parts, multi-line text as a block."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


# ---------------------------------------------------------------------------------------------
# What the API server refuses that the OpenAPI schemas (KubeRay's CRD, kubernetes-validate) do
# not say: name formats, int32 ranges, env names, unique mount paths. Checked on every manifest
# before it is printed or written, so an export Kubernetes would refuse never exits 0.

_INT32_FIELDS = ("backoffLimit", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "preRunningDeadlineSeconds",
                 "replicas", "minReplicas", "maxReplicas")


def refusal(manifest: dict[str, Any]) -> str | None:
    """The first thing in ``manifest`` the Kubernetes API server would refuse, as
    ``field.path: what``; None when there is none."""
    meta = manifest.get("metadata") or {}
    if not k8s_profile.DNS_SUBDOMAIN.fullmatch(str(meta.get("name", ""))) or len(str(meta.get("name", ""))) > 63:
        return f"metadata.name {meta.get('name')!r}: not a DNS-1123 name (lower-case, digits, '-', at most 63, " \
               "starting and ending with a letter or digit)"
    if meta.get("namespace") is not None and not k8s_profile.DNS_LABEL.fullmatch(str(meta["namespace"])):
        return f"metadata.namespace {meta['namespace']!r}: not a DNS-1123 label"
    for key, value in (meta.get("labels") or {}).items():
        problem = k8s_profile.label_key_problem(key) or k8s_profile.label_value_problem(value)
        if problem:
            return f"metadata.labels.{str(key)[:70]}: {problem}"
    stack: list[tuple[str, Any]] = [("spec", manifest.get("spec"))]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                if k in _INT32_FIELDS and (not isinstance(v, int) or not 0 <= v <= 2**31 - 1):
                    return f"{path}.{k} {v!r}: not a count Kubernetes takes (0..2147483647, int32)"
                stack.append((f"{path}.{k}", v))
            if "containers" in value and "volumes" in value:
                problem = _pod_refusal(path, value)
                if problem:
                    return problem
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def _pod_refusal(path: str, pod: dict[str, Any]) -> str | None:
    for key, value in (pod.get("nodeSelector") or {}).items():
        problem = k8s_profile.label_key_problem(key) or k8s_profile.label_value_problem(value)
        if problem:
            return f"{path}.nodeSelector: {problem}"
    for t in pod.get("tolerations") or []:
        problem = (t.get("key") and k8s_profile.label_key_problem(t["key"])) or (
            t.get("value") is not None and k8s_profile.label_value_problem(t["value"]))
        if problem:
            return f"{path}.tolerations: {problem}"
    names = [v.get("name", "") for v in pod.get("volumes") or []]
    for name in names:
        if not k8s_profile.DNS_LABEL.fullmatch(name):
            return f"{path}.volumes: name {name!r}: not a DNS-1123 label (lower-case, digits, '-', at most 63; no dots)"
    if len(set(names)) != len(names):
        return f"{path}.volumes: name {next(n for n in names if names.count(n) > 1)!r} twice"
    for c in pod.get("containers") or []:
        for e in c.get("env") or []:
            problem = env_name_problem(e.get("name", ""))
            if problem:
                return f"{path}.containers.{c.get('name')}.env: {problem}"
        seen: set[str] = set()
        for m in c.get("volumeMounts") or []:
            mount = str(m.get("mountPath", "")).rstrip("/") or "/"
            if mount in seen:
                return f"{path}.containers.{c.get('name')}.volumeMounts: mountPath {mount} twice " \
                       "(a profile volume on a path rlbox mounts itself: /dev/shm or the driver files)"
            seen.add(mount)
    return None


def rayjob_name(run: str) -> str:
    return f"rlbox-{run}"


@dataclass(frozen=True)
class RayJobPlan:
    """A run as a RayJob: ``describe()`` is the manifest as YAML (what --dry-run prints and
    `rlbox k8s export` writes), ``as_dict()`` the same manifest as data."""

    name: str
    namespace: str
    manifest: dict[str, Any]
    nodes: int
    npus_per_node: int
    job: JobPlan | None
    max_restarts: int
    shared_mounts: tuple[tuple[str, bool], ...] = ()  # (path, same source on every pod): where checkpoints can go
    notes: tuple[str, ...] = field(default_factory=tuple)
    image_ref: str | None = None  # RELEASE:VARIANT the image comes from, when from the matrix (its verl validates the job)

    def describe(self) -> str:
        return yaml.dump(self.manifest, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120,
                         allow_unicode=True)

    def as_dict(self) -> dict[str, Any]:
        return self.manifest

    def summary(self) -> list[str]:
        """Lines for the operator (stderr), never part of the manifest."""
        lines = [f"RayJob {self.namespace}/{self.name}: {self.nodes} pod(s) x {self.npus_per_node} NPUs "
                 f"= {self.nodes * self.npus_per_node} NPUs"]
        return lines + list(self.notes)


def ray_resources(npus: int) -> str:
    """``rayStartParams.resources`` as KubeRay passes it to `ray start --resources=...`: a JSON
    object inside double quotes, its own quotes escaped (KubeRay's samples' form)."""
    return '"' + json.dumps({"NPU": npus}).replace('"', '\\"') + '"'


def _volumes(profile: K8sProfile, read_only: frozenset[str] = frozenset()) -> tuple[list[dict], list[dict]]:
    """The pod's volumes and the container's mounts: /dev/shm, the driver files, the profile's.
    A profile volume is mounted read-only when the profile says so or a ``--mount ...:ro`` asked
    for it (``read_only``: those mount paths): never more access than asked."""
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": profile.shm_size}}]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for name, path, kind in HOST_FILES:
        volumes.append({"name": name, "hostPath": {"path": path, "type": kind}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    for v in profile.volumes:
        source = ({"persistentVolumeClaim": {"claimName": v.pvc, **({"readOnly": True} if v.read_only else {})}}
                  if v.pvc else {"hostPath": {"path": v.host_path, "type": "Directory"}})
        volumes.append({"name": f"vol-{v.name}", **source})
        ro = v.read_only or v.path in read_only
        mounts.append({"name": f"vol-{v.name}", "mountPath": v.path, **({"readOnly": True} if ro else {})})
    return volumes, mounts


def _env(nic: str, hccl: dict[str, str], run: str, extra: tuple[tuple[str, str], ...]) -> list[dict]:
    values = dict(BASE_ENV)
    values.update(hccl)
    values.update({"HCCL_SOCKET_IFNAME": nic, "GLOO_SOCKET_IFNAME": nic, "TP_SOCKET_IFNAME": nic, "RLBOX_RUN": run})
    values.update(dict(extra))
    if "HCCL_IF_IP" in values:
        raise RlboxError("--env HCCL_IF_IP: a pod's HCCL_IF_IP is its own address (set from status.podIP); drop it")
    env = [{"name": k, "value": v} for k, v in values.items()]
    return env + [{"name": "HCCL_IF_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def _pod(role: str, *, image: str, npus: int, profile: K8sProfile, labels: dict[str, str], env: list[dict],
         read_only: frozenset[str] = frozenset()) -> dict:
    volumes, mounts = _volumes(profile, read_only)
    limits: dict[str, str] = {profile.resource_name: str(npus)}
    requests: dict[str, str] = {profile.resource_name: str(npus)}
    for key in ("cpu", "memory"):
        value = getattr(profile, key)
        if value:
            limits[key] = requests[key] = value
    container = {
        "name": HEAD_CONTAINER if role == "head" else WORKER_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "env": env,
        "resources": {"limits": limits, "requests": requests},
        "securityContext": {"privileged": False, "allowPrivilegeEscalation": False},
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if profile.service_account:
        spec["serviceAccountName"] = profile.service_account
    if profile.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": profile.image_pull_secret}]
    if profile.node_selector:
        spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        spec["tolerations"] = [t.model_dump(exclude_none=True) for t in profile.tolerations]
    return {"metadata": {"labels": {**labels, LABEL_ROLE: role}}, "spec": spec}


def check_mounts(mounts: tuple[Mount, ...], profile: K8sProfile, where: str) -> None:
    """Every --mount must be a volume of the profile: a pod has no host folder of its own."""
    paths = {v.path: v for v in profile.volumes}
    for m in mounts:
        volume = paths.get(m.target)
        if volume is None:
            known = ", ".join(sorted(paths)) or "none"
            raise RlboxError(f"--mount {m.spec()}: no volume of {where} mounts {m.target} (its volumes: {known}); "
                             "add one under volumes: with pvc: CLAIM or host_path: DIR")
        if volume.host_path and m.source != m.target and m.source != volume.host_path:
            raise RlboxError(f"--mount {m.spec()}: {where} mounts {m.target} from host path {volume.host_path}, "
                             f"not {m.source}")
        if volume.read_only and not m.read_only:
            raise RlboxError(f"--mount {m.spec()}: volume {volume.name} of {where} is read-only; add :ro")


def plan_rayjob(*, run: str, run_id: str, image: str, hardware: str, nodes: int, npus: int, slot: int,
                job: JobPlan | None, profile: K8sProfile, profile_source: str, mounts: tuple[Mount, ...] = (),
                extra_env: tuple[tuple[str, str], ...] = (), nic: str | None = None, cpus: int | None = None,
                max_restarts: int = 0, timeout: int | None = None, deadline: int | None = None,
                scheduler: str | None = None, queue: str | None = None) -> RayJobPlan:
    """The RayJob of a run on ``nodes`` pods of ``npus`` NPUs each (the head trains too: the
    worker group has ``nodes - 1`` replicas). ``timeout``: seconds for the cluster to come up
    (``preRunningDeadlineSeconds``); ``deadline``: seconds for the whole job
    (``activeDeadlineSeconds``)."""
    if job is None:
        raise RlboxError("--backend kuberay needs a job: a command after `--`, --recipe NAME or --smoke-test")
    check_mounts(mounts, profile, profile_source)
    ro = frozenset(m.target for m in mounts if m.read_only)
    scheduler = scheduler or profile.scheduler
    queue = queue or profile.queue
    if queue and scheduler != "volcano":
        raise RlboxError(f"--queue {queue}: a queue is Volcano's; add --scheduler volcano (or scheduler: volcano in {profile_source})")
    nic = nic or profile.nic
    name = rayjob_name(run)
    labels = {LABEL_MANAGED: "true", LABEL_RUN: run, LABEL_RUN_ID: run_id}
    env = _env(nic, sharing.hccl_env(slot, hardware), run, extra_env)
    params: dict[str, str] = {"resources": ray_resources(npus)}
    if cpus is not None:
        params["num-cpus"] = str(cpus)
    head = {"rayStartParams": {"dashboard-host": "0.0.0.0", **params},
            "template": _pod("head", image=image, npus=npus, profile=profile, labels=labels, env=env, read_only=ro)}
    cluster: dict[str, Any] = {"headGroupSpec": head}
    if nodes > 1:
        cluster["workerGroupSpecs"] = [{
            "groupName": WORKER_GROUP, "replicas": nodes - 1, "minReplicas": nodes - 1, "maxReplicas": nodes - 1,
            "rayStartParams": dict(params),
            "template": _pod("worker", image=image, npus=npus, profile=profile, labels=labels, env=env, read_only=ro),
        }]
    # a retried job resumes from the newest checkpoint, as `rlbox run --max-restarts` does
    submitted = jobs.for_restart(job, 1) if max_restarts and verl_job.is_verl(list(job.argv)) else job
    spec: dict[str, Any] = {"entrypoint": submitted.entrypoint}
    if job.env:
        spec["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": dict(job.env)}, sort_keys=False, width=1 << 20)
    spec.update({"shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 600, "backoffLimit": max_restarts})
    if timeout is not None:
        spec["preRunningDeadlineSeconds"] = timeout
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    spec["rayClusterSpec"] = cluster
    meta_labels = dict(labels)
    if scheduler == "volcano":
        meta_labels[LABEL_SCHEDULER] = "volcano"
        if queue:
            meta_labels[LABEL_QUEUE] = queue
    manifest = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": profile.namespace, "labels": meta_labels}, "spec": spec}
    notes = [f"{profile.resource_name}: {npus} per pod; Ray: NPU={npus} per pod (rayStartParams)",
             f"HCCL: {' '.join(f'{k}={v}' for k, v in sharing.hccl_env(slot, hardware).items())}; interface {nic}, "
             "HCCL_IF_IP from status.podIP"]
    if scheduler == "volcano":
        notes.append(f"Volcano gang scheduling{' in queue ' + queue if queue else ''}: the KubeRay operator must run "
                     "with --batch-scheduler=volcano (Helm: batchScheduler.name=volcano)")
    problem = refusal(manifest)
    if problem:
        raise RlboxError(f"k8s: the RayJob would be refused by Kubernetes: {problem}")
    shared = tuple(sorted((v.path, True) for v in profile.volumes if not v.read_only and v.path not in ro))
    return RayJobPlan(name, profile.namespace, manifest, nodes, npus, job, max_restarts, shared, tuple(notes))
