"""The lockfile: what a build would otherwise resolve at build time, resolved once and committed.

``images/lock/<release>.json`` holds, per variant:

- ``inputs``: a digest of the manifest facts the lock was resolved from (base image, platform,
  Python, every component's source and pin). When the matrix changes, the digest no longer
  matches and ``rlbox lock --check`` (and rendering) say the lock is stale.
- ``base``: the base image's content digest (a registry manifest digest), so ``FROM`` names
  exactly one image; or ``null`` with the reason it could not be resolved.
- ``git``: every git component's commit, in full (tags and short SHAs resolved).
- ``pip``: every distribution pip picks for the PyPI components and CANN's Python packages,
  for the variant's platform and Python, with the wheel's sha256. Builds install under these
  as constraints, so a rebuild months later gets the same wheels.

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


SCHEMA = "rlbox.lock/v1"


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

    def commit(self, component: str) -> str | None:
        if self.state != "fresh":
            return None
        return ((self.entry or {}).get("git") or {}).get(component, {}).get("commit")

    def constraints(self) -> str:
        lines = [f"{name}=={p['version']}" for name, p in sorted(self.pip.items())]
        return "".join(line + "\n" for line in lines)

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
