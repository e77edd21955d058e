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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlbox.image import lockfile
from rlbox.core import config
from rlbox.core.config import error_line, merge, read_yaml, validate, validate_named
from rlbox.core.errors import RlboxError, did_you_mean
from rlbox.registry.reference import Reference
from rlbox.image.schema import PLATFORM_ARCH, Component, Hardware, Release, Variant

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
        d = self.spec.model_dump(exclude_defaults=True, exclude={"blocked"})  # a fact of upstream, not of the image
        d["pin"] = self.spec.pin()
        d["install"] = self.spec.install if self.spec.git else "pip"
        d["patches"] = [{"name": p.ref, "sha256": p.sha256} for p in self.patches]
        return d


def fill_hardware(value: str, variant: ResolvedVariant) -> str:
    """Fill ``{soc_version}``/``{SOC_VERSION}``/``{chip}``/``{arch}`` in a component's build env."""
    hw = variant.hardware
    try:
        return value.format(
            soc_version=hw.soc_version, SOC_VERSION=hw.soc_version.upper(), chip=hw.chip, arch=variant.arch
        )
    except (KeyError, IndexError, ValueError) as err:
        raise RlboxError(
            f"{variant.manifest_rel}: component env value {value!r} has an unknown placeholder {err}; "
            "use {soc_version}, {SOC_VERSION}, {chip} or {arch}"
        ) from None



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

    def build_env(self, c: "ResolvedComponent") -> dict[str, str]:
        """The environment a git component's install runs with: its manifest ``env`` (hardware
        placeholders filled) and the version its setuptools-scm would compute from full history."""
        env = {k: fill_hardware(val, self) for k, val in c.spec.env.items()}
        version = self.lock.git.get(c.name, {}).get("version")
        if version:
            env["SETUPTOOLS_SCM_PRETEND_VERSION"] = version
        return env

    def summary(self) -> dict[str, Any]:
        """One row of `rlbox images list --json`: the variant's identity and pins."""
        return {
            "release": self.release.release,
            "variant": self.name,
            "ref": self.ref,
            "hardware": self.hardware_name,
            "chip": self.hardware.chip,
            "soc_version": self.hardware.soc_version,
            "platform": self.platform,
            "tag": self.image,
            "base_image": self.base_image,
            "cann": self.release.cann.version,
            "python": self.release.python,
            "driver_min": self.release.driver.min,
            "dockerfile": str(self.dockerfile),
            "components": {c.name: c.spec.pin() for c in self.components},
            "patches": [p.ref for p in self.patches],
            "track": self.release.track,
        }

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
                "excluded": sorted(self.lock.section.get("excluded", {})),
                "dropped": sorted({d["requirement"].split(";")[0].strip() for d in self.lock.section.get("dropped", [])}),
                "no_deps": sorted(c.spec.pip.split("==")[0].split("[")[0] for c in self.components
                                  if c.spec.pip and "--no-deps" in c.spec.pip_args),
                "standins": sorted(n for n, p in self.lock.pip.items() if p.get("standin_for"))
                + sorted(n for n, g in self.lock.git.items() if g.get("standin")),
                "substitutions": self.lock.substitutions(),
                "versions": {n: g["version"] for n, g in self.lock.git.items() if g.get("version")},
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

    def select(self, refs) -> list[ResolvedVariant]:
        """Variants named by RELEASE (all of its variants) or RELEASE:VARIANT; none: every variant."""
        chosen: list[ResolvedVariant] = []
        for ref in refs or sorted(self.releases):
            if ":" in ref:
                chosen.append(self.get(ref))
            elif ref in self.releases:
                chosen += [v for v in self.variants if v.release.release == ref]
            else:
                raise RlboxError(f"unknown release '{ref}'{did_you_mean(ref, self.releases)}; "
                                 f"known: {', '.join(sorted(self.releases))}")
        return chosen

    def image_for(self, ref: str) -> tuple[str, ResolvedVariant | None]:
        """An image for ``ref``: RELEASE:VARIANT of this matrix, or the full reference a variant is pushed as (what
        ops engineers pull from SWR: the same release, so the same hardware, recipe forms and NPU env policy), or
        any other image reference (no variant)."""
        release, sep, _ = ref.partition(":")
        if sep and "/" not in release and release in self.releases:
            variant = self.get(ref)
            return variant.image, variant
        for variant in self.variants:
            if variant.image == ref:
                return ref, variant
        return ref, None

    def for_hardware(self, release: str, hardware: str) -> ResolvedVariant:
        for v in self.variants:
            if v.release.release == release and v.hardware_name == hardware:
                return v
        # A release built only for simulated nodes (hardware `sim`, e.g. verl_cpu) stands for any
        # profile: its first variant (amd64 before arm64 in the manifest).
        sims = [v for v in self.variants if v.release.release == release]
        if sims and all(v.hardware_name == "sim" for v in sims):
            return sims[0]
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


NOT_RELEASES = ("hardware.yaml", "defaults.yaml", "mirrors.yaml")  # images/*.yaml that are no release manifest


def release_names(root: Path) -> set[str]:
    """The releases of the matrix under ``root`` by their files (images/RELEASE.yaml), unread:
    what a recipe or a lock naming a release is checked against."""
    return {p.stem for p in (root / "images").glob("*.yaml") if p.name not in NOT_RELEASES}


def load(root: Path) -> Matrix:
    """Load and validate the whole matrix under ``root``; raise RlboxError on the first problem."""
    root = root.resolve()
    images = root / "images"
    hardware = load_hardware(root)
    defaults = read_yaml(images / "defaults.yaml", root) if (images / "defaults.yaml").exists() else {}
    raw: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in sorted(images.glob("*.yaml")):
        if path.name in NOT_RELEASES:
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
        if not isinstance(parent, str):
            raise RlboxError(f"{config.rel(path, root)}: extends: Input should be a valid string (a release), "
                             f"got {type(parent).__name__}")
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
            _references(resolved, where)
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


def _references(v: ResolvedVariant, where: str) -> None:
    """The image a variant builds and the base it builds on, as the references the manifest makes
    of its fields (image.registry/name, tag, base.image, base.tag), by the one grammar."""
    for field, make in (("image", lambda: v.image), ("base", lambda: v.base_image)):
        try:
            Reference.parse(make())
        except (RlboxError, KeyError, IndexError, ValueError) as err:
            raise RlboxError(f"{where}: {field}: {err}") from None


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
