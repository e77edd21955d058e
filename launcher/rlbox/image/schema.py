"""The schema of images/*.yaml: pydantic records for hardware profiles, releases, components
and variants, each forbidding unknown keys. ``rlbox.image.matrix`` loads and resolves them."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlbox.core import names, quote
from rlbox.core.config import Strict, Url
from rlbox.registry import reference

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


# ---------------------------------------------------------------------------------------------
# One rule per kind of manifest field, applied when the file is read (a validator's ValueError is
# the file's one line naming the field): what reaches a Dockerfile, a shell line, pip or git is
# held to its grammar here, not only quoted where it is rendered.

_SEGMENT = r"[A-Za-z0-9_+][A-Za-z0-9._+-]*"  # never '.', '..' or '-x'
ABS_PATH = re.compile(rf"(?:/{_SEGMENT})+")
REL_PATH = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")
DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")  # a PyPI project or an extra (PEP 508)
GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]*")
POSIX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
OS_NAME = re.compile(r"[a-z][a-z0-9.]*")
PIP_OPTION = re.compile(r"--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?:=[A-Za-z0-9._+:/@=~,-]+)?")
# pip options that would change where packages come from or where they go: a lock decides that
PIP_REFUSED = ("--index-url", "--extra-index-url", "--find-links", "--trusted-host", "--no-index", "--requirement",
               "--constraint", "--editable", "--src", "--target", "--prefix", "--root", "--user", "--upgrade",
               "--force-reinstall", "--pre", "--cert", "--client-cert", "--proxy")


def _matching(pattern: re.Pattern, what: str):
    def check(value: str) -> str:
        if not pattern.fullmatch(value) or "//" in value or "/./" in value:
            raise ValueError(f"{value[:80]!r} is not {what}")
        return value
    return check


abs_path = _matching(ABS_PATH, "an absolute path (/ and letters, digits, . _ + - between; no '..')")
rel_path = _matching(REL_PATH, "a path inside the source (letters, digits, . _ + - joined by /; no '..', not absolute)")
dist_name = _matching(DIST_NAME, "a project or extra name (letters, digits, . _ -)")
posix_user = _matching(POSIX_USER, "a user name (lower-case letters, digits, _ -; at most 32)")
os_name = _matching(OS_NAME, "an OS name such as ubuntu22.04")


def git_ref(value: str) -> str:
    """A tag or branch (git check-ref-format's rule, as far as rlbox needs it): never an option."""
    if not GIT_REF.fullmatch(value) or ".." in value or value.endswith(("/", ".lock", ".")) or "//" in value:
        raise ValueError(f"{value[:80]!r} is not a git tag or branch name")
    return value


def pip_arg(value: str) -> str:
    """One option for pip install of a component: ``--name`` or ``--name=word``, not one that
    changes where packages come from or go (a lock decides that)."""
    if not PIP_OPTION.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a pip option (--name or --name=value, one word)")
    if value.split("=", 1)[0] in PIP_REFUSED:
        raise ValueError(f"{value[:80]!r}: where packages come from or go is the lock's, not a pip_args option")
    return value


def requirement(value: str) -> str:
    """A PEP 508 requirement (``numpy<2``, ``datasets>=3``): never a pip option or a file."""
    from packaging.requirements import InvalidRequirement, Requirement

    if not value or not DIST_NAME.match(value):
        raise ValueError(f"{value[:80]!r} is not a requirement (name[extras] version; never an option)")
    try:
        Requirement(value)
    except InvalidRequirement as err:
        raise ValueError(f"{value[:80]!r} is not a requirement ({str(err).splitlines()[0][:80]})") from None
    return value


def each(check):
    """``check`` on every item of a list (or key of a mapping)."""
    def checked(values):
        for v in values:
            check(v)
        return values
    return checked


class Hardware(Strict):
    description: str
    chip: str = Field(description="chip part of the CANN base image tag (910b, a3)")
    npu_smi_chip: str = Field(description="chip name `npu-smi info` prints")
    soc_version: str
    platforms: list[Literal["linux/arm64", "linux/amd64"]] = Field(min_length=1)
    npus_per_node: int = Field(gt=0)
    device_counts: list[int] = Field(default_factory=list, description="NPU counts hosts come with")
    kubernetes_resource: str = "huawei.com/Ascend910"


BASE_TAG_FIELDS = ("cann", "chip", "os", "python")


class Base(Strict):
    image: reference.ImageName = Field(description="the base's repository name; the tag comes from `tag:`")
    tag: str = Field(description="format string over cann, chip, os, python (the base's Python)")
    python: str | None = Field(
        None, description="Python of the base image when it differs from the release's; "
        "the release's Python is then installed from the OS packages"
    )

    @field_validator("tag")
    @classmethod
    def _tag(cls, v: str) -> str:
        # only the known fields, no {x.attr}/{x[0]}/{x:>999999}: a tag is text, not code or a padding
        return quote.format_fields(v, BASE_TAG_FIELDS, "base tag")


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

    _env_scripts = field_validator("env_scripts")(classmethod(lambda cls, v: each(abs_path)(v)))
    _packages = field_validator("python_packages")(classmethod(lambda cls, v: each(requirement)(v)))

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


class RayNpuEnv(Strict):
    """How Ray hands a node's NPUs to verl's workers on this release: the env policy every node's
    container gets and the NPU probe (`rlbox run`, before every job) holds each node to."""

    noset_visible_devices: bool = Field(
        description="true: RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 and ASCEND_RT_VISIBLE_DEVICES the "
        "node's NPUs in ascending order on every node (Ray leaves it alone); false: neither is set, Ray sets each "
        "worker's ASCEND_RT_VISIBLE_DEVICES to the NPUs it gave it")
    follows: str = Field(min_length=10, max_length=400,
                         description="the line of verl's / vllm-ascend's docs for this release the policy follows")


class ImageName(Strict):
    registry: reference.ImageName = Field(description="HOST[/PATH] the images are pushed under")
    name: reference.ImageName


class User(Strict):
    name: str
    uid: int = Field(ge=1000, le=2**31 - 1)

    _name = field_validator("name")(classmethod(lambda cls, v: posix_user(v)))


class Component(Strict):
    """One pinned piece of software: a PyPI release or a git source at a fixed commit."""

    pip: str | None = Field(None, description="PyPI requirement pinned with ==, e.g. torch==2.7.1")
    index_url: Url | None = Field(None, description="extra index for this pip install")
    git: Url | None = Field(None, description="the source's URL: https, http, git, ssh or file")
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
    # What `rlbox lock` reads to lock a git source's own requirements (they are installed from the
    # lock; the source itself is installed without resolving anything).
    requires: Literal["metadata"] | list[str] = Field(
        "metadata", description="`metadata`: the requirements its build backend declares (built with the "
        "component's env); or the requirement files its setup.py reads, relative to the source"
    )
    extras: list[str] = Field(default_factory=list, description="extras of the git source to install too")
    drop: dict[str, str] = Field(
        default_factory=dict, description="requirement name -> why: requirements of this source not locked"
    )
    standin: "Standin | None" = Field(
        None, description="a PyPI sdist that stands in for the git source where it cannot be fetched "
        "(recorded as a substitution in the lock; `rlbox lock --strict` refuses it)"
    )
    blocked: str | None = Field(
        None, min_length=10, max_length=600,
        description="why this pin cannot move to a newer upstream release: the requirement that blocks it, "
        "with its file:line (`rlbox images outdated` shows it; not part of the image or its lock)")

    @model_validator(mode="after")
    def _one_source(self) -> "Component":
        if bool(self.pip) == bool(self.git):
            raise ValueError("give exactly one source: `pip: name==version` or `git: URL` with `commit:`")
        if self.pip:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,-]+\])?==[A-Za-z0-9.+!-]+", self.pip):
                raise ValueError(f"pip: '{self.pip}' is not pinned; write it as name==version")
            for key in ("commit", "ref", "subdir", "requirements", "patches", "extras", "drop"):
                if getattr(self, key):
                    raise ValueError(f"{key}: only git components take it")
            if self.standin and not self.index_url:
                raise ValueError("standin: a PyPI pin takes a stand-in only for an `index_url` that may be unreachable")
        if self.git:
            if self.standin and self.standin.pypi is None:
                raise ValueError("standin: a git source takes a PyPI sdist in its place (pypi: name==version)")
            if not self.commit and not self.ref:
                raise ValueError(
                    "commit: missing pin; give the full 40-hex commit, or a `ref:` (tag) for `rlbox lock` to resolve"
                )
        return self

    _ref = field_validator("ref")(classmethod(lambda cls, v: v if v is None else git_ref(v)))
    _subdir = field_validator("subdir")(classmethod(lambda cls, v: v if v is None else rel_path(v)))
    _files = field_validator("requirements")(classmethod(lambda cls, v: each(rel_path)(v)))
    _requires = field_validator("requires")(classmethod(lambda cls, v: v if isinstance(v, str) else each(rel_path)(v)))
    _pip_args = field_validator("pip_args")(classmethod(lambda cls, v: each(pip_arg)(v)))
    _extras = field_validator("extras", "drop")(classmethod(lambda cls, v: each(dist_name)(v)))
    _env = field_validator("env")(classmethod(lambda cls, v: each(quote.env_key)(v)))

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


class Standin(Strict):
    pypi: str | None = Field(description="name==version of the release whose sdist (or wheel) stands in; "
                             "null: nothing can (no release fits the target), the rehearsal goes without it")
    why: str

    @field_validator("pypi")
    @classmethod
    def _pinned(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+", v):
            raise ValueError(f"'{v}' is not pinned; write it as name==version")
        return v


Component.model_rebuild()


class Variant(Strict):
    hardware: str
    platform: Literal["linux/arm64", "linux/amd64"] | None = None
    tag: reference.ImageTag | None = None
    base_tag: reference.ImageTag | None = Field(None, description="override of the base image tag")
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
    ray_npu_env: RayNpuEnv | None = Field(
        None, description="the NPU env policy of a run on this release (checked by the NPU probe before every job)")
    python_packages: list[str] = Field(
        default_factory=list, description="more PyPI requirements the image installs (locked like the rest)"
    )
    sdist_only: list[str] = Field(
        default_factory=list, description="PyPI projects that publish no wheel and may come as an sdist"
    )
    exclude: dict[str, str] = Field(
        default_factory=dict, description="distribution -> why: never installed, whoever requires it"
    )
    components: dict[str, Component] = Field(min_length=1)
    variants: dict[str, Variant] = Field(min_length=1)
    track: Literal["stable", "pre-release"] = Field(
        "stable", description="stable: the default; pre-release: a track built on a release candidate of its stack "
        "(vllm-ascend rcN) for those who need it before its stable release; `rlbox images list` says which")
    local_only: str | None = Field(
        None, min_length=10, max_length=400, description="why this release builds only on a developer's machine "
        "(e.g. a component from a loopback index); the CI workflow leaves its variants out and gives this reason"
    )

    _os = field_validator("os")(classmethod(lambda cls, v: os_name(v)))
    _packages_ = field_validator("python_packages")(classmethod(lambda cls, v: each(requirement)(v)))
    _dists = field_validator("sdist_only", "exclude")(classmethod(lambda cls, v: each(dist_name)(v)))

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not re.fullmatch(r"3\.\d+", v):
            raise ValueError(f"'{v}' is not a Python minor version such as 3.10")
        return v

    @field_validator("release")
    @classmethod
    def _release(cls, v: str) -> str:
        return names.check_value(v, "file")

    @field_validator("variants")
    @classmethod
    def _variants(cls, v: dict) -> dict:
        for name in v:  # a variant is a folder of dockerfiles/, a Makefile target and a CI job
            names.check_value(name, "file")
            quote.make_value(name, "variant")
        return v

    @field_validator("system_packages")
    @classmethod
    def _packages(cls, v: dict) -> dict:
        for pkgs in v.values():
            for pkg in pkgs:  # an OS package is a word on the installer's command line
                quote.word(pkg, "package")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict) -> dict:
        for key in v:
            quote.env_key(key)
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
