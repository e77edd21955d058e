"""The lockfile: what a build would otherwise resolve at build time, resolved once and committed.

``images/lock/<release>.json`` holds, per variant:

- ``inputs``: a digest of the manifest facts the lock was resolved from (base image, platform,
  Python, every component's source and pin). When the matrix changes, the digest no longer
  matches and ``rlbox lock --check`` (and rendering) say the lock is stale.
- ``base``: the base image's content digest (a registry manifest digest), so ``FROM`` names
  exactly one image; or ``null`` with the reason it could not be resolved.
- ``git``: every git component's commit, in full (tags and short SHAs resolved), the version
  its setuptools-scm computes from full history (builds are told it), and, where the source
  could not be had, the sdist that stood in for it.
- ``pip``: the whole Python set the build installs (PyPI components, CANN's Python packages,
  and every git source's declared requirements), resolved by uv for the variant's platform and
  Python: one file each, with its URL, sha256 and index. Builds install exactly these, hashes
  required, and install git sources without resolving anything. Also recorded: who asked for
  what, requirements dropped or excluded (with why), substitutions (a stand-in for what this
  machine could not reach) and requirements left unresolved here. ``rlbox lock --strict``
  refuses substitutions and unresolved entries.

Reading, comparing, applying and writing a lock is here, and pure; resolution (git, pip,
docker, registries) is ``rlbox.image.resolve``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from rlbox.core import names
from rlbox.core.config import Commit, Digest, Sha256, Strict, Text, Url, load_file
from rlbox.core.errors import RlboxError
from rlbox.core.quote import requirement_part
from rlbox.registry import reference


SCHEMA = "rlbox.lock/v2"


# ---------------------------------------------------------------------------------------------
# The lock's schema: every value that reaches git, pip, a Dockerfile or a download is typed here
# (hex commits, sha256 of 64 hex digits, URLs of http(s)/file, plain words for names and versions),
# so a lock edited by hand or by an attacker is refused in one line before anything uses it.


def _plain(value: str) -> str:
    return requirement_part(value, "value")


class _Rec(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Standin(_Rec):
    for_: Text = Field(alias="for")
    used: Text
    file: names.ArtifactName
    url: Url
    sha256: Sha256
    why: Text


class GitLock(_Rec):
    url: Url
    ref: str | None = None
    commit: Commit
    version: str | None = None
    standin: Standin | None = None

    @field_validator("ref", "version")
    @classmethod
    def _words(cls, v: str | None) -> str | None:
        return None if v is None else _plain(v)


class PipFile(_Rec):
    version: str
    file: names.ArtifactName
    url: Url
    sha256: Sha256
    size: int | None = Field(None, ge=0)
    index: Url | None = None
    standin_for: Text | None = None

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        return _plain(v)


class Dropped(_Rec):
    requirement: Text
    by: Text
    why: Text


class Substitution(_Rec):
    for_: Text = Field(alias="for")
    from_: Text | None = Field(None, alias="from")
    index: Url | None = None
    used: Text
    why: Text


class Unresolved(_Rec):
    requirement: Text
    why: Text


class PipLock(_Rec):
    resolver: Text | None = None
    platform: Text | None = None
    python: Text | None = None
    indexes: list[Url] = Field(default_factory=list)
    sdist_only: list[str] = Field(default_factory=list)
    excluded: dict[str, Text] = Field(default_factory=dict)
    dropped: list[Dropped] = Field(default_factory=list)
    substitutions: list[Substitution] = Field(default_factory=list)
    unresolved: list[Unresolved] = Field(default_factory=list)
    asked: list[Text] = Field(default_factory=list)
    provided: dict[str, Text] = Field(default_factory=dict)
    packages: dict[str, PipFile] = Field(default_factory=dict)

    @field_validator("packages", "excluded")
    @classmethod
    def _names(cls, v: dict) -> dict:
        for key in v:
            _plain(key)
        return v


class BaseLock(_Rec):
    image: reference.ImageRef
    digest: reference.ImageDigest | None = None
    note: Text | None = None


class VariantEntry(_Rec):
    inputs: Digest
    base: BaseLock | None = None
    git: dict[str, GitLock] = Field(default_factory=dict)
    pip: PipLock | None = None


class LockFile(_Rec):
    schema_: Literal["rlbox.lock/v2"] = Field(alias="schema")
    release: names.FileName
    comment: Text | None = None
    variants: dict[names.FileName, VariantEntry]


def path_for(root: Path, release: str) -> Path:
    return names.inside(root / "images" / "lock", f"{names.check(release, 'release', 'file')}.json", what="release")


def rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def read(root: Path, release: str) -> dict[str, Any] | None:
    """The release's lock as data, read through ``LockFile`` (one line naming the file and the
    field on any problem); None when there is none (or only the old v1 lock)."""
    path = path_for(root, release)
    if not path.exists():
        return None
    where = rel(root, path)
    with_hint = f"; run `rlbox lock {release}` to rewrite it"
    try:
        head = load_file(path, _SchemaOnly, where)
    except RlboxError as err:
        raise RlboxError(f"{err}{with_hint}") from None
    if head.schema_ == "rlbox.lock/v1":
        return None  # the old lock held only PyPI pins: every variant is unlocked until `rlbox lock`
    if head.schema_ != SCHEMA:
        raise RlboxError(f"{where}: schema: not an rlbox lock ({SCHEMA}){with_hint}")
    try:
        lock = load_file(path, LockFile, where)
    except RlboxError as err:
        raise RlboxError(f"{err}{with_hint}") from None
    if lock.release != release:  # another release's lock under this name: its pins are not this one's
        raise RlboxError(f"{where}: release: {lock.release!r} is not {release!r}, the release this lock is read for"
                         f"{with_hint}")
    return lock.model_dump(by_alias=True, exclude_unset=True)


class _SchemaOnly(Strict):
    model_config = ConfigDict(extra="allow", frozen=True)
    schema_: str | None = Field(None, alias="schema")


def inputs_digest(release: Any, variant_name: str, components: dict[str, Any], base_image: str,
                  platform: str) -> str:
    """Digest of what the lock is resolved from; patches and build env do not change a lock."""
    facts = {
        "base_image": base_image,
        "platform": platform,
        "python": release.python,
        "os": release.os,
        "cann_python_packages": list(release.cann.python_packages),
        "components": {
            name: c.model_dump(include={"pip", "index_url", "pip_args", "git", "commit", "ref"}, exclude_defaults=True)
            for name, c in components.items()
        },
    }
    blob = json.dumps(facts, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------------------------------------
# The state of a variant's lock, as the matrix sees it.


@dataclass(frozen=True)
class VariantLock:
    state: str  # "fresh", "stale" or "missing"
    entry: dict[str, Any] | None
    path: str  # the lockfile, relative to the tree

    @property
    def base_digest(self) -> str | None:
        return ((self.entry or {}).get("base") or {}).get("digest") if self.state == "fresh" else None

    @property
    def pip(self) -> dict[str, dict[str, str]]:
        return ((self.entry or {}).get("pip") or {}).get("packages", {}) if self.state == "fresh" else {}

    @property
    def git(self) -> dict[str, dict[str, Any]]:
        """The lock's record of each git component (commit, version, stand-in), when fresh."""
        return ((self.entry or {}).get("git") or {}) if self.state == "fresh" else {}

    def commit(self, component: str) -> str | None:
        return self.git.get(component, {}).get("commit")

    @property
    def section(self) -> dict[str, Any]:
        return ((self.entry or {}).get("pip") or {}) if self.state == "fresh" else {}

    def substitutions(self) -> list[str]:
        """Every stand-in this lock holds, one line each (empty for a lock of the real thing)."""
        out = [f"{s['used']} for {s['for']} ({s['why']})" for s in self.section.get("substitutions", [])]
        for name, g in self.git.items():
            if g.get("standin"):
                out.append(f"{name}: {g['standin']['used']} for {g['standin']['for']} ({g['standin']['why']})")
        return out

    def unresolved(self) -> list[str]:
        return [f"{u['requirement']} ({u['why']})" for u in self.section.get("unresolved", [])]

    def digest(self) -> str | None:
        if self.state != "fresh" or self.entry is None:
            return None
        return "sha256:" + hashlib.sha256(json.dumps(self.entry, sort_keys=True).encode()).hexdigest()


def variant_lock(data: dict[str, Any] | None, path: str, variant: str, inputs: str) -> VariantLock:
    entry = (data or {}).get("variants", {}).get(variant)
    if entry is None:
        return VariantLock("missing", None, path)
    return VariantLock("fresh" if entry.get("inputs") == inputs else "stale", entry, path)


# ---------------------------------------------------------------------------------------------
# Writing and checking.


def document(release: str, entries: dict[str, dict[str, Any]]) -> str:
    data = {
        "schema": SCHEMA,
        "release": release,
        "comment": f"Written by `rlbox lock {release}`; builds consume it. Do not edit by hand.",
        "variants": dict(sorted(entries.items())),
    }
    return json.dumps(data, indent=2) + "\n"


def write(root: Path, release: str, variant: str, entry: dict[str, Any], variants: set[str]) -> Path:
    """Record one variant's resolved entry in its release's lock, keeping the other variants'
    entries that are still in the matrix (``variants``); written at once, so that a long
    `rlbox lock` keeps each variant it has resolved."""
    path = path_for(root, release)
    entries = {k: e for k, e in (read(root, release) or {"variants": {}})["variants"].items() if k in variants}
    entries[variant] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(document(release, entries), encoding="utf-8")
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class Problem:
    ref: str
    path: str
    state: str  # "missing" or "stale"

    def line(self) -> str:
        release = self.ref.split(":")[0]
        if self.state == "missing":
            return f"{self.path}: {self.ref} is not locked: run `rlbox lock {release}`"
        return f"{self.path}: {self.ref} was locked from other manifest inputs: run `rlbox lock {release}`"


def check(variants) -> list[Problem]:
    return [Problem(v.ref, v.lock.path, v.lock.state) for v in variants if v.lock.state != "fresh"]
