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
from typing import Any

from rlbox.core.errors import RlboxError


SCHEMA = "rlbox.lock/v2"


def path_for(root: Path, release: str) -> Path:
    return root / "images" / "lock" / f"{release}.json"


def rel(root: Path, path: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def read(root: Path, release: str) -> dict[str, Any] | None:
    path = path_for(root, release)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise RlboxError(f"{rel(root, path)}: not valid JSON ({err}); run `rlbox lock {release}` to rewrite it") from None
    if isinstance(data, dict) and data.get("schema") == "rlbox.lock/v1":
        return None  # the old lock held only PyPI pins: every variant is unlocked until `rlbox lock`
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("variants"), dict):
        raise RlboxError(f"{rel(root, path)}: not an rlbox lock ({SCHEMA}); run `rlbox lock {release}` to rewrite it")
    return data


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
