"""Resolving a variant's lock: the only part of the image build system that reaches the network.

The base image's digest (local engine, then its registry), every git component's full commit
(``git ls-remote`` for a ref, a tree-less fetch for a short SHA) and the version its
setuptools-scm computes, and the whole Python set the build installs: gathered by
``rlbox.image.requirements`` (git sources' own requirements included), resolved for the
variant's platform and Python by ``rlbox.image.pylock`` (uv), one file and sha256 each. The
result is an entry for ``rlbox.image.lockfile.write``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlbox.core.errors import RlboxError, last_line
from rlbox.image import lockfile, pylock, requirements, sources
from rlbox.image.pylock import PYPI
from rlbox.registry.client import Registry
from rlbox.registry.reference import Reference

if TYPE_CHECKING:
    from rlbox.image.matrix import ResolvedVariant
    from rlbox.image.schema import Component

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class Resolution:
    entry: dict[str, Any]
    warnings: list[str]


def resolve(variant: "ResolvedVariant", *, pip_index: str | None = None, ca_bundle: Path | None = None,
            cache: Path | None = None, uv_cache: Path | None = None, echo=None) -> Resolution:
    echo = echo or (lambda line: None)
    warnings: list[str] = []
    echo(f"{variant.ref}: base image {variant.base_image}")
    base = resolve_base(variant.base_image)
    if base["digest"] is None:
        warnings.append(f"{variant.ref}: base {variant.base_image} not locked: {base['note']}")
    git = {}
    for c in variant.components:
        if c.spec.git:
            echo(f"{variant.ref}: git {c.name} {c.spec.commit or c.spec.ref}")
            git[c.name] = {"url": c.spec.git, "ref": c.spec.ref, "commit": resolve_commit(variant, c.name, c.spec)}
    cache = cache or sources.default_dest(variant)
    gathered = requirements.gather(
        variant, lambda c: source_files(variant, c, git[c.name]["commit"], cache, ca_bundle=ca_bundle, echo=echo))
    for name, src in gathered.sources.items():
        if src.version:
            git[name]["version"] = src.version
        if src.standin:
            git[name]["standin"] = src.standin
            warnings.append(f"{variant.ref}: {name}: {src.standin['used']} stands in for {src.standin['for']} "
                            f"({src.standin['why']})")
    count = len(gathered.asked) + len(gathered.no_deps) + sum(len(g.requires) for g in gathered.provided)
    echo(f"{variant.ref}: resolving {count} requirements for "
         f"{pylock.platform_tag(variant)}, Python {variant.release.python} with uv")
    started = time.monotonic()
    pip = pylock.resolve(variant, gathered, index=pip_index or PYPI, cache_dir=uv_cache, ca_bundle=ca_bundle, cache=cache)
    if pip.get("note"):
        warnings.append(f"{variant.ref}: Python packages not locked: {pip['note']}")
    else:
        echo(f"{variant.ref}: {len(pip['packages'])} packages locked in {time.monotonic() - started:.1f} s")
    for s in pip["substitutions"]:
        warnings.append(f"{variant.ref}: {s['used']} stands in for {s['for']} ({s['why']})")
    entry = {"inputs": variant.lock_inputs, "base": base, "git": git, "pip": pip}
    return Resolution(entry, warnings)


def source_files(v: "ResolvedVariant", c, commit: str, cache: Path, *, ca_bundle: Path | None = None,
                 echo=None) -> requirements.SourceFiles:
    """A git component's files at ``commit``: the source cache, fetched there if missing; where
    it cannot be fetched and the manifest names a stand-in, the stand-in's sdist (recorded)."""
    echo = echo or (lambda line: None)
    repo = sources.git_dir(cache, c.name, commit)
    if not repo.is_dir():
        try:
            sources.fetch_git(c, commit, cache, history=True, echo=echo)
        except RlboxError as err:
            if c.spec.standin is None:
                raise RlboxError(f"{v.manifest_rel}: components.{c.name}: the source at {commit[:12]} is needed to "
                                 f"lock its requirements and {err}; fill {sources.git_dir(cache, c.name, commit)}") from None
            echo(f"{v.ref}: {c.name}: {c.spec.git} not reachable; reading the stand-in {c.spec.standin.pypi}")
            tarball, url = sources.fetch_sdist(c.spec.standin.pypi, cache, ca_bundle=ca_bundle)
            standin = {"for": f"git {c.spec.git}@{commit}", "used": f"sdist {c.spec.standin.pypi}",
                       "file": tarball.name, "url": url, "sha256": sources.sha256(tarball), "why": c.spec.standin.why}
            return requirements.sdist_files(c, tarball, standin)
    return requirements.git_files(c, repo, commit)


def resolve_base(image: str) -> dict[str, Any]:
    """The base's manifest digest: from the local engine's RepoDigests, else from its registry."""
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    docker = shutil.which("docker")
    if docker is None:
        return {"image": image, "digest": None, "note": "no docker CLI to ask a registry"}
    local = subprocess.run([docker, "image", "inspect", "--format", "{{json .RepoDigests}}", image],
                           capture_output=True, text=True)
    if local.returncode == 0:
        for ref in json.loads(local.stdout.strip() or "[]") or []:
            name, _, digest = ref.partition("@")
            if name == repo:
                return {"image": image, "digest": digest, "note": "registry digest of the local copy"}
    ref = Reference.parse(image)
    if ref.registry:  # the registry's own answer (Registry v2 API, with the credentials rlbox uses)
        try:
            return {"image": image, "digest": Registry(ref.registry).digest(ref), "note": "registry manifest digest"}
        except RlboxError:
            pass
    else:
        proc = subprocess.run([docker, "buildx", "imagetools", "inspect", "--format", "{{json .Manifest}}", image],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            try:
                return {"image": image, "digest": json.loads(proc.stdout)["digest"], "note": "registry manifest digest"}
            except (ValueError, KeyError):
                pass
    if local.returncode == 0:  # on this engine, but never pushed or pulled: nothing to pin
        return {"image": image, "digest": None,
                "note": "local image with no registry digest (made on this machine, e.g. by tools/make-base-image.sh)"}
    host = ref.registry or "docker.io"
    return {"image": image, "digest": None, "note": f"{host} not reachable from the machine that locked; lock again where it is"}


def _git(*argv: str, cwd: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    return subprocess.run(["git", *argv], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


def resolve_commit(variant: "ResolvedVariant", name: str, spec: "Component") -> str:
    """A full commit for a git component: as pinned, or its ref / short SHA resolved upstream."""
    where = f"{variant.manifest_rel}: components.{name}"
    if spec.commit and FULL_SHA.fullmatch(spec.commit):
        return spec.commit
    if spec.ref:
        proc = _git("ls-remote", "--end-of-options", spec.git, f"refs/tags/{spec.ref}^{{}}", f"refs/tags/{spec.ref}", f"refs/heads/{spec.ref}")
        if proc.returncode != 0:
            raise RlboxError(f"{where}: cannot reach {spec.git} ({last_line(proc.stderr)}); lock where it is reachable")
        refs = dict(reversed(line.split("\t", 1)) for line in proc.stdout.splitlines() if "\t" in line)
        sha = refs.get(f"refs/tags/{spec.ref}^{{}}") or refs.get(f"refs/tags/{spec.ref}") or refs.get(f"refs/heads/{spec.ref}")
        if sha is None:
            raise RlboxError(f"{where}: ref '{spec.ref}' does not exist in {spec.git}; fix `ref:`")
        if spec.commit and not sha.startswith(spec.commit):
            raise RlboxError(f"{where}: ref '{spec.ref}' is {sha[:12]}, not commit {spec.commit}; fix `commit:` or `ref:`")
        return sha
    # A short SHA without a ref: fetch the commit graph only (no trees or blobs) and expand it.
    with tempfile.TemporaryDirectory(prefix="rlbox-lock-") as tmp:
        _git("init", "-q", "--bare", tmp)
        proc = _git("fetch", "-q", "--filter=tree:0", "--end-of-options", spec.git, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", cwd=tmp)
        if proc.returncode != 0:
            raise RlboxError(f"{where}: cannot fetch {spec.git} ({last_line(proc.stderr)}); lock where it is reachable")
        proc = _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{spec.commit}^{{commit}}", cwd=tmp)
        if proc.returncode != 0:
            raise RlboxError(f"{where}: commit {spec.commit} is not in {spec.git} (or is ambiguous); fix `commit:`")
        return proc.stdout.strip()



def lock(m, variants, *, strict: bool = False, pip_index: str | None = None, ca_bundle: Path | None = None,
         cache: Path | None = None, uv_cache: Path | None = None, echo=None, wrote=None) -> list[str]:
    """Resolve each variant and write it into its release's lock at once (a long run keeps its
    progress); the warnings of what could not be pinned. ``strict`` makes the first one an error."""
    warnings: list[str] = []
    for v in variants:
        res = resolve(v, pip_index=pip_index, ca_bundle=ca_bundle, cache=cache, uv_cache=uv_cache, echo=echo)
        warnings += res.warnings
        if strict and res.warnings:
            raise RlboxError(res.warnings[0] + " (--strict)", exit_code=1)
        release = v.release.release
        names = {x.name for x in m.variants if x.release.release == release}
        path = lockfile.write(m.root, release, v.name, res.entry, names)
        if wrote is not None:
            wrote(path, v)
    return warnings
