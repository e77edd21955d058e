"""Named stand-ins: a layer on top of a built release image that makes it run where the real
hardware is missing, never part of a release variant (the release's own Dockerfile, tag and labels
do not carry it; ``rlbox build REF --standin NAME`` builds the release, then this layer under its
own tag).

A stand-in is labelled ``io.rlbox.standin=NAME`` (and ``io.rlbox.standin.summary``): ``rlbox
inspect`` lists it and ``rlbox run`` prints it ("stand-in: ..."), so nobody mistakes a run on it
for one on the release. Its files live in ``resources/standins/NAME/`` and are copied into the
venv's site-packages (a ``.pth`` there loads them in every Python process, Ray workers included).

``plan`` is pure (a printable value); ``execute`` runs ``docker build``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbox.core.errors import RlboxError, last_line
from rlbox.image.matrix import ResolvedVariant

ROOT = Path(__file__).resolve().parents[1] / "resources" / "standins"
LABEL = "io.rlbox.standin"
LABEL_SUMMARY = "io.rlbox.standin.summary"
VENV = "/opt/rlbox/venv"


@dataclass(frozen=True)
class Standin:
    name: str
    summary: str
    releases: tuple[str, ...]  # the releases it may stand on

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(sorted(p for p in (ROOT / self.name).iterdir() if p.is_file() and p.suffix in (".py", ".pth")))


STANDINS = {
    "verl-cpu-shims": Standin(
        "verl-cpu-shims",
        "verl CPU shims (gloo for the device backend, no-op torch.cpu memory calls, unpinned CPU offload, "
        "hf rollout n=1): verl 0.5.0 trains on CPU; the NPU, HCCL and vLLM-Ascend stay simulated",
        ("verl_cpu", "verl_pt27_25rc3"),
    ),
}


@dataclass(frozen=True)
class StandinPlan:
    name: str
    base: str
    tag: str
    dockerfile: str
    context: Path

    def describe(self) -> str:
        return f"stand-in {self.name}: {self.base} -> {self.tag}\n" + "\n".join(f"  | {line}" for line in self.dockerfile.splitlines())

    def command(self) -> list[str]:
        return ["docker", "build", "--tag", self.tag, "--file", "-", str(self.context)]

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (every plan keeps rlbox.core.plan.Plan)."""
        return {"name": self.name, "base": self.base, "tag": self.tag, "dockerfile": self.dockerfile,
                "context": str(self.context), "command": self.command()}


def get(name: str) -> Standin:
    if name not in STANDINS:
        raise RlboxError(f"no stand-in named '{name}' (known: {', '.join(sorted(STANDINS))})")
    return STANDINS[name]


def tag_for(base: str, name: str) -> str:
    return f"{base}-{name}"


def plan(v: ResolvedVariant, name: str, base: str) -> StandinPlan:
    """The stand-in NAME on ``base`` (the built image of variant ``v``)."""
    s = get(name)
    if v.release.release not in s.releases:
        raise RlboxError(f"stand-in {name} is made for {', '.join(s.releases)}, not {v.release.release}")
    site = f"{VENV}/lib/python{v.release.python}/site-packages/"
    files = " ".join(p.name for p in s.files)
    text = "\n".join([
        f"# rlbox stand-in {name} (launcher/rlbox/image/standins.py): NOT part of release {v.release.release}",
        f"FROM {base}",
        f"COPY {files} {site}",
        f'LABEL {LABEL}="{name}" {LABEL_SUMMARY}="{s.summary}" io.rlbox.standin.base="{base}"',
        "",
    ])
    return StandinPlan(name, base, tag_for(base, name), text, ROOT / name)


def execute(p: StandinPlan) -> None:
    proc = subprocess.run(p.command(), input=p.dockerfile, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RlboxError(f"building stand-in {p.name} on {p.base} failed: {last_line(proc.stderr or proc.stdout)}")


def describe_labels(labels: dict[str, str]) -> str | None:
    """'stand-in: NAME (summary)' when an image's labels carry a stand-in, else None."""
    name = (labels or {}).get(LABEL)
    if not name:
        return None
    return f"stand-in: {labels.get(LABEL_SUMMARY) or name} [{name}]"
