"""The version matrix: ``images/*.yaml`` loaded, merged and validated into resolved variants.

Layout of an rlbox tree::

    images/hardware.yaml    hardware profiles (a2, a3, ax, sim): chip, SoC, platforms, NPUs
    images/defaults.yaml    facts every release shares unless it overrides them
    images/mirrors.yaml     mirror profiles (cn, intl, offline): see mirrors.py
    images/lock/<release>.json   the lock: see lock.py
    images/<release>.yaml   one release: pins, components in install order, variants
    patches/<component>/NNNN-name.patch

A release may ``extends:`` another release; mappings merge key by key (a component can
override one field of its parent's pin), ``null`` removes a key. Everything is pure:
loading reads files, nothing touches Docker.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from rlbox.image import lockfile
from rlbox.core import config
from rlbox.core.config import Strict, error_line, merge, read_yaml, validate, validate_named
from rlbox.core.errors import RlboxError, did_you_mean

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")
PATCH_NAME = re.compile(r"^\d{4}-[A-Za-z0-9._-]+\.patch$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")

# Components rlbox knows, in the order they must be installed: each one may depend on those
# before it (torch_npu needs torch; vllm-ascend needs vllm; verl needs transformers; the
# rl-plugin patches verl). Components not listed here may stand anywhere.
INSTALL_ORDER = (
    "torch",
    "torchvision",
    "torch_npu",
    "vllm",
    "vllm_ascend",
    "megatron",
    "mindspeed",
    "transformers",
    "verl",
    "rl_plugin",
)

PLATFORM_ARCH = {"linux/arm64": "aarch64", "linux/amd64": "x86_64"}


class Hardware(Strict):
    description: str
    chip: str = Field(description="chip part of the CANN base image tag (910b, a3)")
    npu_smi_chip: str = Field(description="chip name `npu-smi info` prints")
    soc_version: str
    platforms: list[Literal["linux/arm64", "linux/amd64"]] = Field(min_length=1)
    npus_per_node: int = Field(gt=0)
    device_counts: list[int] = Field(default_factory=list, description="NPU counts hosts come with")
    kubernetes_resource: str = "huawei.com/Ascend910"


class Base(Strict):
    image: str
    tag: str = Field(description="format string over cann, chip, os, python (the base's Python)")
    python: str | None = Field(
        None, description="Python of the base image when it differs from the release's; "
        "the release's Python is then installed from the OS packages"
    )


class Cann(Strict):
    version: str = Field(description="CANN release, or `none` for an image without CANN (simulation)")
    env_scripts: list[str] = Field(default_factory=list)
    python_packages: list[str] = Field(
        default_factory=list, description="what CANN's own Python tools import (te, hccl); held by later pins"
    )

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v == "none":
            return v
        if not re.fullmatch(r"\d+\.\d+\.(\d+|RC\d+)(\.\w+)?", v):
            raise ValueError(f"'{v}' is not a CANN version such as 8.3.RC1 or 8.5.0")
        return v

    @model_validator(mode="after")
    def _scripts(self) -> "Cann":
        if self.version != "none" and not self.env_scripts:
            raise ValueError("env_scripts: a CANN image needs its set_env.sh scripts listed")
        if self.version == "none" and self.env_scripts:
            raise ValueError("env_scripts: an image without CANN (version none) has no set_env.sh to list")
        return self


class Driver(Strict):
    min: str = Field(description="oldest Ascend HDK driver the CANN version supports")
    max: str | None = Field(None, description="newest driver known to work, when Ascend's table gives one")


class ImageName(Strict):
    registry: str
    name: str


class User(Strict):
    name: str
    uid: int = Field(ge=1000)


class Component(Strict):
    """One pinned piece of software: a PyPI release or a git source at a fixed commit."""

    pip: str | None = Field(None, description="PyPI requirement pinned with ==, e.g. torch==2.7.1")
    index_url: str | None = Field(None, description="extra index for this pip install")
    git: str | None = None
    commit: str | None = Field(
        None, description="full 40-hex commit; a short SHA or none (with `ref:`) is resolved by `rlbox lock`"
    )
    ref: str | None = Field(None, description="tag or branch the commit belongs to; `rlbox lock` resolves it")
    subdir: str | None = Field(None, description="install from this folder of the source")
    install: Literal["editable", "pip", "source"] = "editable"
    requirements: list[str] = Field(default_factory=list, description="requirement files to install first")
    pip_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    patches: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> "Component":
        if bool(self.pip) == bool(self.git):
            raise ValueError("give exactly one source: `pip: name==version` or `git: URL` with `commit:`")
        if self.pip:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,-]+\])?==[A-Za-z0-9.+!-]+", self.pip):
                raise ValueError(f"pip: '{self.pip}' is not pinned; write it as name==version")
            for key in ("commit", "ref", "subdir", "requirements", "patches"):
                if getattr(self, key):
                    raise ValueError(f"{key}: only git components take it")
        if self.git:
            if not self.commit and not self.ref:
                raise ValueError(
                    "commit: missing pin; give the full 40-hex commit, or a `ref:` (tag) for `rlbox lock` to resolve"
                )
            if not re.match(r"^(https?|git|ssh|file)://", self.git):
                raise ValueError(f"git: '{self.git}' is not a URL (https://, git://, ssh://, file://)")
        return self

    @field_validator("commit")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        if v is not None and not (FULL_SHA.fullmatch(v) or SHORT_SHA.fullmatch(v)):
            raise ValueError(
                f"'{v}' is not a commit: give the full 40-hex SHA (or at least 7 hex digits for `rlbox lock` to resolve)"
            )
        return v

    @property
    def pinned(self) -> bool:
        """A PyPI pin, or a git source at a full commit (nothing left for `rlbox lock` to resolve)."""
        return bool(self.pip) or bool(self.commit and FULL_SHA.fullmatch(self.commit))

    @field_validator("patches")
    @classmethod
    def _patch_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not PATCH_NAME.fullmatch(name):
                raise ValueError(f"'{name}' is not named NNNN-name.patch")
        if v != sorted(v):
            raise ValueError("patches must be listed in series order (NNNN ascending)")
        return v

    @property
    def version(self) -> str | None:
        return self.pip.split("==", 1)[1] if self.pip else None

    def pin(self) -> str:
        """One-line pin, as recorded in labels: ``torch==2.7.1`` or ``git+URL@sha``."""
        return self.pip if self.pip else f"git+{self.git}@{self.commit or self.ref}"


class Variant(Strict):
    hardware: str
    platform: Literal["linux/arm64", "linux/amd64"] | None = None
    tag: str | None = None
    base_tag: str | None = Field(None, description="override of the base image tag")
    components: dict[str, Any] = Field(
        default_factory=dict, description="per-variant overrides of component fields (e.g. x86 torch index)"
    )


class Release(Strict):
    release: str
    description: str
    sources: list[str] = Field(default_factory=list, description="where the pins come from")
    extends: str | None = None
    image: ImageName
    base: Base
    os: str
    python: str
    cann: Cann
    driver: Driver
    system_packages: dict[Literal["apt", "dnf"], list[str]] = Field(default_factory=dict)
    user: User
    env: dict[str, str] = Field(default_factory=dict)
    components: dict[str, Component] = Field(min_length=1)
    variants: dict[str, Variant] = Field(min_length=1)

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not re.fullmatch(r"3\.\d+", v):
            raise ValueError(f"'{v}' is not a Python minor version such as 3.10")
        return v

    @field_validator("components")
    @classmethod
    def _order(cls, v: dict[str, Component]) -> dict[str, Component]:
        for name in v:
            if not NAME.fullmatch(name):
                raise ValueError(f"component name '{name}' must be lower-case letters, digits, _ . -")
        known = [n for n in v if n in INSTALL_ORDER]
        expected = sorted(known, key=INSTALL_ORDER.index)
        if known != expected:
            for got, want in zip(known, expected):
                if got != want:
                    raise ValueError(
                        f"'{got}' is listed before '{want}', but installs after it "
                        f"(order: {' -> '.join(INSTALL_ORDER)})"
                    )
        return v


# ---------------------------------------------------------------------------------------------
# Resolved values: what render and build consume, and what lands in /etc/rlbox/image.json.


@dataclass(frozen=True)
class PatchFile:
    component: str
    name: str
    path: Path
    sha256: str

    @property
    def ref(self) -> str:
        return f"{self.component}/{self.name}"


@dataclass(frozen=True)
class ResolvedComponent:
    name: str
    spec: Component
    patches: tuple[PatchFile, ...]

    def as_dict(self) -> dict[str, Any]:
        d = self.spec.model_dump(exclude_defaults=True)
        d["pin"] = self.spec.pin()
        d["install"] = self.spec.install if self.spec.git else "pip"
        d["patches"] = [{"name": p.ref, "sha256": p.sha256} for p in self.patches]
        return d


@dataclass(frozen=True)
class ResolvedVariant:
    release: Release
    name: str
    variant: Variant
    hardware_name: str
    hardware: Hardware
    platform: str
    manifest: Path
    root: Path
    components: tuple[ResolvedComponent, ...] = field(default_factory=tuple)
    lock_inputs: str = ""
    lock: lockfile.VariantLock = lockfile.VariantLock("missing", None, "")

    @property
    def ref(self) -> str:
        return f"{self.release.release}:{self.name}"

    @property
    def arch(self) -> str:
        return PLATFORM_ARCH[self.platform]

    @property
    def base_image(self) -> str:
        rel = self.release
        tag = self.variant.base_tag or rel.base.tag.format(
            cann=rel.cann.version.lower(), chip=self.hardware.chip, os=rel.os,
            python=rel.base.python or rel.python,
        )
        return f"{rel.base.image}:{tag}"

    @property
    def locked_base_image(self) -> str:
        """The base as FROM names it: pinned to its locked digest when the lock has one."""
        digest = self.lock.base_digest
        return f"{self.base_image}@{digest}" if digest else self.base_image

    @property
    def unresolved(self) -> list[str]:
        """Git components whose commit the lock must still resolve (a ref or a short SHA)."""
        return [c.name for c in self.components if not c.spec.pinned]

    @property
    def tag(self) -> str:
        return self.variant.tag or self.name

    @property
    def image(self) -> str:
        return f"{self.release.image.registry}/{self.release.image.name}:{self.tag}"

    @property
    def dockerfile(self) -> Path:
        return Path("dockerfiles") / self.release.release / self.name / "Dockerfile"

    @property
    def manifest_rel(self) -> str:
        try:
            return str(self.manifest.relative_to(self.root))
        except ValueError:
            return str(self.manifest)

    @property
    def package_manager(self) -> str:
        return "dnf" if self.release.os.startswith(("openeuler", "centos", "rhel")) else "apt"

    @property
    def python_from_os(self) -> bool:
        return bool(self.release.base.python) and self.release.base.python != self.release.python

    @property
    def python_bin(self) -> str:
        return f"/usr/bin/python{self.release.python}" if self.python_from_os else "python3"

    @property
    def system_packages(self) -> list[str]:
        pm = self.package_manager
        pkgs = list(self.release.system_packages.get(pm, []))
        pkgs.append("libjemalloc2" if pm == "apt" else "jemalloc")
        if self.python_from_os:
            py = self.release.python
            pkgs += [f"python{py}", f"python{py}-venv", f"python{py}-dev"] if pm == "apt" else [f"python{py}"]
        return list(dict.fromkeys(pkgs))

    @property
    def jemalloc(self) -> str:
        if self.package_manager == "dnf":
            return "/usr/lib64/libjemalloc.so.2"
        return f"/usr/lib/{self.arch}-linux-gnu/libjemalloc.so.2"

    @property
    def bashrc(self) -> str:
        return "/etc/bashrc" if self.package_manager == "dnf" else "/etc/bash.bashrc"

    @property
    def patch_label(self) -> str:
        return ",".join(f"{p.ref}@sha256:{p.sha256}" for p in self.patches)

    @property
    def patches(self) -> tuple[PatchFile, ...]:
        return tuple(p for c in self.components for p in c.patches)

    def as_dict(self) -> dict[str, Any]:
        """The resolved manifest: every pin, digest and derived fact of this variant."""
        rel = self.release
        return {
            "schema": "rlbox.image/v1",
            "release": rel.release,
            "variant": self.name,
            "ref": self.ref,
            "description": rel.description,
            "sources": list(rel.sources),
            "manifest": self.manifest_rel,
            "image": self.image,
            "tag": self.tag,
            "hardware": self.hardware_name,
            "chip": self.hardware.chip,
            "npu_smi_chip": self.hardware.npu_smi_chip,
            "soc_version": self.hardware.soc_version,
            "npus_per_node": self.hardware.npus_per_node,
            "platform": self.platform,
            "base_image": self.base_image,
            "base_digest": self.lock.base_digest,
            "os": rel.os,
            "python": rel.python,
            "cann": rel.cann.version,
            "driver_min": rel.driver.min,
            "driver_max": rel.driver.max,
            "dockerfile": str(self.dockerfile),
            "components": {c.name: c.as_dict() for c in self.components},
            "patches": [{"name": p.ref, "sha256": p.sha256} for p in self.patches],
            "lock": {
                "file": self.lock.path,
                "state": self.lock.state,
                "digest": self.lock.digest(),
                "pip": {name: p["version"] for name, p in self.lock.pip.items()},
            },
        }


@dataclass(frozen=True)
class Matrix:
    root: Path
    hardware: dict[str, Hardware]
    releases: dict[str, Release]
    variants: tuple[ResolvedVariant, ...]

    def get(self, ref: str) -> ResolvedVariant:
        """Look up ``RELEASE:VARIANT``; a bad reference names what exists."""
        release, sep, variant = ref.partition(":")
        if not sep or not release or not variant:
            raise RlboxError(f"'{ref}' is not RELEASE:VARIANT (see `rlbox images list`)")
        if release not in self.releases:
            hint = did_you_mean(release, self.releases)
            raise RlboxError(f"unknown release '{release}'{hint}; known: {', '.join(sorted(self.releases))}")
        names = [v.name for v in self.variants if v.release.release == release]
        for v in self.variants:
            if v.release.release == release and v.name == variant:
                return v
        hint = did_you_mean(variant, names)
        raise RlboxError(f"release {release} has no variant '{variant}'{hint}; it has: {', '.join(names)}")

    def image_for(self, ref: str) -> tuple[str, ResolvedVariant | None]:
        """An image for ``ref``: RELEASE:VARIANT of this matrix, or any other image reference."""
        release, sep, _ = ref.partition(":")
        if sep and "/" not in release and release in self.releases:
            variant = self.get(ref)
            return variant.image, variant
        return ref, None

    def for_hardware(self, release: str, hardware: str) -> ResolvedVariant:
        for v in self.variants:
            if v.release.release == release and v.hardware_name == hardware:
                return v
        raise RlboxError(f"release {release} has no variant for hardware '{hardware}'")


# ---------------------------------------------------------------------------------------------
# Loading.


def load_hardware(root: Path) -> dict[str, Hardware]:
    path = root / "images" / "hardware.yaml"
    data = read_yaml(path, root)
    profiles = data.get("hardware")
    if not isinstance(profiles, dict) or not profiles:
        raise RlboxError(f"{config.rel(path, root)}: hardware: missing; list the hardware profiles under `hardware:`")
    return validate_named(Hardware, profiles, config.rel(path, root), "hardware")


def load(root: Path) -> Matrix:
    """Load and validate the whole matrix under ``root``; raise RlboxError on the first problem."""
    root = root.resolve()
    images = root / "images"
    hardware = load_hardware(root)
    defaults = read_yaml(images / "defaults.yaml", root) if (images / "defaults.yaml").exists() else {}
    raw: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in sorted(images.glob("*.yaml")):
        if path.name in ("hardware.yaml", "defaults.yaml", "mirrors.yaml"):
            continue
        data = read_yaml(path, root)
        rel = config.rel(path, root)
        name = data.get("release")
        if name != path.stem:
            raise RlboxError(f"{rel}: release: must be '{path.stem}' (the file name), found {name!r}")
        raw[name] = (path, data)
    if not raw:
        raise RlboxError(f"{config.rel(images, root)}: no release manifests (*.yaml) found")

    def merged(name: str, chain: tuple[str, ...] = ()) -> dict[str, Any]:
        path, data = raw[name]
        parent = data.get("extends")
        if parent is None:
            return merge(defaults, data)
        if parent not in raw:
            raise RlboxError(
                f"{config.rel(path, root)}: extends: no release '{parent}'{did_you_mean(parent, raw)}"
            )
        if parent in chain:
            raise RlboxError(f"{config.rel(path, root)}: extends: cycle {' -> '.join((*chain, name, parent))}")
        base = merged(parent, (*chain, name))
        if "variants" in data:  # a child's variant list replaces its parent's
            base.pop("variants", None)
        return merge(base, data)

    releases: dict[str, Release] = {}
    variants: list[ResolvedVariant] = []
    for name, (path, _) in raw.items():
        rel = config.rel(path, root)
        release = validate(Release, merged(name), rel)
        releases[name] = release
        lock_data = lockfile.read(root, name)
        lock_rel = config.rel(lockfile.path_for(root, name), root)
        comps = tuple(
            ResolvedComponent(cname, comp, _patch_files(root, rel, cname, comp))
            for cname, comp in release.components.items()
        )
        for vname, variant in release.variants.items():
            where = f"{rel}: variants.{vname}"
            if variant.hardware not in hardware:
                raise RlboxError(
                    f"{where}.hardware: unknown hardware '{variant.hardware}'"
                    f"{did_you_mean(variant.hardware, hardware)}; known: {', '.join(hardware)}"
                )
            hw = hardware[variant.hardware]
            platform = variant.platform or hw.platforms[0]
            if platform not in hw.platforms:
                raise RlboxError(
                    f"{where}.platform: {platform} does not fit hardware {variant.hardware} "
                    f"({hw.description}), which runs {', '.join(hw.platforms)}"
                )
            vcomps = comps
            if variant.components:
                vcomps = _variant_components(root, rel, release, vname, variant)
            resolved = ResolvedVariant(release, vname, variant, variant.hardware, hw, platform, path, root, vcomps)
            inputs = lockfile.inputs_digest(release, vname, {c.name: c.spec for c in vcomps}, resolved.base_image, platform)
            vlock = lockfile.variant_lock(lock_data, lock_rel, vname, inputs)
            variants.append(dataclasses.replace(
                resolved, components=tuple(_locked(c, vlock) for c in vcomps), lock_inputs=inputs, lock=vlock))
    tags = {}
    for v in variants:
        if v.image in tags:
            raise RlboxError(f"{v.manifest_rel}: variants.{v.name}: image {v.image} is also built by {tags[v.image]}")
        tags[v.image] = v.ref
    return Matrix(root, hardware, releases, tuple(variants))


def _locked(comp: ResolvedComponent, vlock: lockfile.VariantLock) -> ResolvedComponent:
    """A git component pinned by ref or short SHA takes its full commit from a fresh lock."""
    if comp.spec.pinned:
        return comp
    commit = vlock.commit(comp.name)
    if commit is None or not commit.startswith(comp.spec.commit or ""):
        return comp
    return ResolvedComponent(comp.name, comp.spec.model_copy(update={"commit": commit}), comp.patches)


def _variant_components(root: Path, rel: str, release: Release, vname: str, variant: Variant):
    out = []
    for cname, comp in release.components.items():
        over = variant.components.get(cname)
        if over is not None:
            where = f"{rel}: variants.{vname}.components.{cname}"
            if not isinstance(over, dict):
                raise RlboxError(f"{where}: expected a mapping of component fields")
            merged = merge(comp.model_dump(exclude_defaults=True), over)
            try:
                comp = Component.model_validate(merged)
            except ValidationError as err:
                raise RlboxError(error_line(err, where, Component)) from None
        out.append(ResolvedComponent(cname, comp, _patch_files(root, rel, cname, comp)))
    unknown = set(variant.components) - set(release.components)
    if unknown:
        name = sorted(unknown)[0]
        raise RlboxError(
            f"{rel}: variants.{vname}.components.{name}: no such component in the release"
            f"{did_you_mean(name, release.components)}"
        )
    return tuple(out)


def _patch_files(root: Path, rel: str, cname: str, comp: Component) -> tuple[PatchFile, ...]:
    out = []
    for name in comp.patches:
        path = root / "patches" / cname / name
        if not path.is_file():
            raise RlboxError(
                f"{rel}: components.{cname}.patches: patches/{cname}/{name} does not exist; "
                "add the file or remove it from the series"
            )
        out.append(PatchFile(cname, name, path, hashlib.sha256(path.read_bytes()).hexdigest()))
    return tuple(out)
