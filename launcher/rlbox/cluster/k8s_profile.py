"""A Kubernetes cluster profile: what differs between Ascend Kubernetes sites, as data.

Profile YAML (``rlbox run --backend kuberay --k8s-profile FILE``)::

    resource_name: huawei.com/Ascend910   # the device plugin's extended resource (MindCluster);
                                          # HAMi: huawei.com/Ascend910B3 style; verl CI: huawei.com/ascend-1980
    npus_per_node: 16                     # what one node offers (default: the hardware profile's)
    namespace: rl
    service_account: rlbox-runner
    image_pull_secret: swr-pull
    node_selector: {accelerator: huawei-Ascend910}
    tolerations: [{key: huawei.com/Ascend910, operator: Exists, effect: NoSchedule}]
    volumes:                              # on every pod; a --mount must name one of these paths
      - {name: data, path: /data, pvc: shared-data}
      - {name: ckpt, path: /ckpt, host_path: /mnt/ckpt}
    shm_size: 64Gi                        # /dev/shm: a memory-backed emptyDir of this size
    nic: eth0                             # HCCL/GLOO/TP socket interface inside the pods
    cpu: "64"                             # optional requests = limits per pod
    memory: 512Gi
    scheduler: volcano                    # default | volcano (gang scheduling; --scheduler)
    queue: rl-queue                       # Volcano queue (--queue)

Pure parsing; nothing here talks to a cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlbox.core.config import Strict, load_file, read_text
from rlbox.core.errors import RlboxError, did_you_mean

# The Ascend device plugins' resource names: MindCluster's Ascend Device Plugin (910, 910B and
# 910_93 alike), HAMi's per-chip names (Ascend910B, Ascend910B3, Ascend910B4, ...), and the
# name of verl's Ascend CI cluster.
KNOWN_RESOURCES = ("huawei.com/Ascend910", "huawei.com/Ascend910B", "huawei.com/Ascend910B3",
                   "huawei.com/Ascend910B4", "huawei.com/ascend-1980")
_RESOURCE = re.compile(r"huawei\.com/(Ascend910(?:[BC]\d?)?|ascend-1980)")
_QUANTITY = re.compile(r"\d+(\.\d+)?(m|Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?")

# Kubernetes' own validation rules (k8s.io/apimachinery/pkg/util/validation), the one copy rlbox
# checks profiles, options and the RayJob it writes against.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # IsDNS1123Label
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = re.compile(r"(?=.{1,63}$)([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")  # IsQualifiedName's name part
LABEL_VALUE = re.compile(r"(?=.{0,63}$)(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")  # IsValidLabelValue


def _dns(value: str | None, pattern: re.Pattern = DNS_LABEL) -> str | None:
    if value is not None and not pattern.fullmatch(value):
        raise ValueError(f"{value!r} is not a Kubernetes name (lower-case letters, digits and '-')")
    return value


def label_key_problem(key: object) -> str | None:
    """Why ``key`` is not a qualified name (a label or taint key: ``[PREFIX/]NAME``, PREFIX a DNS
    subdomain of at most 253, NAME at most 63 of letters, digits, ``-_.`` between alphanumerics)."""
    text = str(key)
    prefix, slash, name = text.rpartition("/")
    if slash and not DNS_SUBDOMAIN.fullmatch(prefix):
        return f"{text[:80]!r}: prefix {prefix[:60]!r} is not a DNS subdomain (lower-case, digits, '-', '.'; at most 253)"
    if not LABEL_NAME.fullmatch(name):
        return (f"{text[:80]!r} is not a label key ([PREFIX/]NAME; NAME at most 63 letters, digits, '-', '_', '.', "
                "starting and ending with a letter or digit)")
    return None


def label_value_problem(value: object) -> str | None:
    if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
        return (f"{str(value)[:80]!r} is not a label value (at most 63 letters, digits, '-', '_', '.', starting and "
                "ending with a letter or digit; or empty)")
    return None


def _raise(problem: str | None) -> None:
    if problem:
        raise ValueError(problem)


class Volume(Strict):
    name: str
    path: str = Field(description="mount path inside every pod")
    pvc: str | None = None
    host_path: str | None = None
    read_only: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        # the pod's volume is vol-NAME: a DNS-1123 label of at most 63, so NAME at most 59, no dots
        if len(v) > 59:
            raise ValueError(f"{v[:70]!r}: a volume name is at most 59 characters (the pod's volume is vol-NAME)")
        return _dns(v)

    @field_validator("pvc")
    @classmethod
    def _claim(cls, v: str | None) -> str | None:
        return _dns(v, DNS_SUBDOMAIN) if v and "." in v else _dns(v)

    @field_validator("path", "host_path")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v!r}: paths must be absolute")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "Volume":
        if (self.pvc is None) == (self.host_path is None):
            raise ValueError(f"volume {self.name}: give exactly one of pvc: CLAIM or host_path: /DIR")
        return self


class Toleration(Strict):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    @field_validator("key")
    @classmethod
    def _key(cls, v: str | None) -> str | None:
        if v:  # empty: every key (with operator Exists)
            _raise(label_key_problem(v))
        return v

    @field_validator("value")
    @classmethod
    def _value(cls, v: str | None) -> str | None:
        if v is not None:
            _raise(label_value_problem(v))
        return v

    @model_validator(mode="after")
    def _operator(self) -> "Toleration":
        if self.operator == "Exists" and self.value:
            raise ValueError("value: operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("key: an empty key (every taint) needs operator Exists")
        return self


class K8sProfile(Strict):
    resource_name: str
    npus_per_node: int | None = Field(None, gt=0, le=64)
    namespace: str = "default"
    service_account: str | None = None
    image_pull_secret: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    volumes: list[Volume] = Field(default_factory=list)
    shm_size: str = "64Gi"
    nic: str = "eth0"
    cpu: str | None = None
    memory: str | None = None
    scheduler: Literal["default", "volcano"] = "default"
    queue: str | None = None

    @field_validator("resource_name")
    @classmethod
    def _resource(cls, v: str) -> str:
        if not _RESOURCE.fullmatch(v):
            raise ValueError(f"{v!r} is not an Ascend device plugin resource{did_you_mean(v, KNOWN_RESOURCES)}; "
                             f"known: {', '.join(KNOWN_RESOURCES)} (HAMi: huawei.com/Ascend910B<N>)")
        return v

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            _raise(label_key_problem(key) or label_value_problem(value))
        return v

    @field_validator("namespace", "service_account", "image_pull_secret")
    @classmethod
    def _k8s_names(cls, v: str | None) -> str | None:
        return _dns(v, DNS_SUBDOMAIN)

    @field_validator("queue")
    @classmethod
    def _queue(cls, v: str | None) -> str | None:
        return _dns(v)

    @field_validator("shm_size", "cpu", "memory")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None and not _QUANTITY.fullmatch(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity (e.g. 64Gi, 500m, 32)")
        return v

    @field_validator("nic")
    @classmethod
    def _nic(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,14}", v):
            raise ValueError(f"{v!r} is not an interface name")
        return v

    @model_validator(mode="after")
    def _unique(self) -> "K8sProfile":
        for attr in ("name", "path"):
            seen = [getattr(v, attr) for v in self.volumes]
            dup = next((x for x in seen if seen.count(x) > 1), None)
            if dup:
                raise ValueError(f"two volumes have {attr} {dup}; keep one")
        return self


def load(path: Path) -> K8sProfile:
    """A profile file, strictly (rlbox.core.config.load_file: bounded size, depth and aliases; an
    unknown key is named with the nearest real one)."""
    if Path(path).is_file() and not read_text(Path(path)).strip():
        raise RlboxError(f"{path}: empty profile; it needs at least resource_name:")
    return load_file(Path(path), K8sProfile, str(path), fmt="yaml")
