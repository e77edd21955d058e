"""Resolving a variant's lock: the only part of the image build system that reaches the network.

The base image's digest (local engine, then its registry), every git component's full commit
(``git ls-remote`` for a ref, a tree-less fetch for a short SHA), and every wheel pip picks for
the variant's platform and Python (pip's resolver run with the target's markers). The result is
an entry for ``rlbox.image.lockfile.write``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlbox.core.errors import RlboxError
from rlbox.image import lockfile
from rlbox.registry.client import Registry
from rlbox.registry.reference import Reference

if TYPE_CHECKING:
    from rlbox.image.matrix import ResolvedVariant
    from rlbox.image.schema import Component

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
PYPI = "https://pypi.org/simple"
# glibc of the base OS: the newest manylinux tag a wheel may carry to run there.
GLIBC = {"ubuntu22.04": 35, "ubuntu24.04": 39, "debian12": 36, "debian13": 41, "openeuler22.03": 34, "openeuler24.03": 38}




@dataclass
class Resolution:
    entry: dict[str, Any]
    warnings: list[str]


def resolve(variant: "ResolvedVariant", *, pip_index: str | None = None, ca_bundle: Path | None = None,
            echo=None) -> Resolution:
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
    echo(f"{variant.ref}: pip resolution for {variant.platform}, Python {variant.release.python}")
    try:
        pip = resolve_pip(variant, pip_index=pip_index, ca_bundle=ca_bundle)
    except IndexUnreachable as unreachable:
        pip = {"index": pip_index or PYPI, "packages": {}, "note": str(unreachable)}
        warnings.append(f"{variant.ref}: pip not locked: {unreachable}")
    entry = {"inputs": variant.lock_inputs, "base": base, "git": git, "pip": pip}
    return Resolution(entry, warnings)


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
        proc = _git("ls-remote", spec.git, f"refs/tags/{spec.ref}^{{}}", f"refs/tags/{spec.ref}", f"refs/heads/{spec.ref}")
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
        proc = _git("fetch", "-q", "--filter=tree:0", spec.git, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", cwd=tmp)
        if proc.returncode != 0:
            raise RlboxError(f"{where}: cannot fetch {spec.git} ({last_line(proc.stderr)}); lock where it is reachable")
        proc = _git("rev-parse", "--verify", "--quiet", f"{spec.commit}^{{commit}}", cwd=tmp)
        if proc.returncode != 0:
            raise RlboxError(f"{where}: commit {spec.commit} is not in {spec.git} (or is ambiguous); fix `commit:`")
        return proc.stdout.strip()


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:160] if lines else "no output"


def wheel_platforms(variant: "ResolvedVariant") -> list[str]:
    arch = variant.arch
    newest = GLIBC.get(variant.release.os, 28)
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(newest, 16, -1)]
    tags.append(f"manylinux2014_{arch}")
    if arch == "x86_64":
        tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    return tags


def pip_groups(variant: "ResolvedVariant") -> list[tuple[list[str], list[str]]]:
    """What pip resolves, as (requirements, extra pip args) groups: everything together, except
    components installed with --no-deps, which resolve alone without their dependencies."""
    together = list(variant.release.cann.python_packages)
    indexes: list[str] = []
    alone = []
    for c in variant.components:
        if not c.spec.pip:
            continue
        extra = ["--extra-index-url", c.spec.index_url] if c.spec.index_url else []
        if "--no-deps" in c.spec.pip_args:
            alone.append(([c.spec.pip], ["--no-deps", *extra]))
        else:
            together.append(c.spec.pip)
            indexes += extra
    groups = [(together, indexes)] if together else []
    return groups + alone


def target_pip(variant: "ResolvedVariant", command: list[str], index: str, extra: list[str],
               ca_bundle: Path | None) -> list[str]:
    """A pip command line that works for the variant's platform and Python, not this machine's:
    binary wheels for its platform tags and ABI, dependency markers evaluated for it."""
    py = variant.release.python
    argv = [shutil.which("python3") or "python3", "-c", _PIP_FOR_TARGET, variant.arch, py, *command, "--quiet",
            "--only-binary=:all:", "--python-version", py, "--implementation", "cp",
            "--abi", "cp" + py.replace(".", ""), "--abi", "abi3", "--abi", "none", "--index-url", index, *extra]
    for tag in wheel_platforms(variant):
        argv += ["--platform", tag]
    if ca_bundle:
        argv += ["--cert", str(ca_bundle)]
    return argv


def pip_env() -> dict[str, str]:
    """The environment for ``target_pip``: the machine's pip configuration (extra indexes, global
    constraints) must not leak into a lock or the source cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return dict(env, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")


def resolve_pip(variant: "ResolvedVariant", *, pip_index: str | None = None, ca_bundle: Path | None = None) -> dict[str, Any]:
    index = pip_index or PYPI
    packages: dict[str, dict[str, str]] = {}
    py = variant.release.python
    for requirements, extra in pip_groups(variant):
        with tempfile.TemporaryDirectory(prefix="rlbox-lock-") as tmp:
            report = Path(tmp) / "report.json"
            argv = target_pip(variant, ["install", "--dry-run", "--ignore-installed", "--report", str(report),
                                        "--target", str(Path(tmp) / "t"), "--timeout", "30", "--retries", "1"],
                              index, extra, ca_bundle)
            env = pip_env()
            proc = subprocess.run([*argv, *requirements], capture_output=True, text=True, env=env, timeout=900)
            if proc.returncode != 0 and _UNREACHABLE.search(proc.stderr):
                indexes = [index, *(extra[i + 1] for i, a in enumerate(extra) if a == "--extra-index-url")]
                raise IndexUnreachable(f"{_unreachable_index(proc.stderr, indexes)} not reachable from here; lock again where it is")
            if proc.returncode != 0:
                raise RlboxError(
                    f"{variant.manifest_rel}: variants.{variant.name}: pip cannot resolve "
                    f"{' '.join(requirements)} for {variant.platform} / Python {py}: {_pip_error(proc.stderr)}"
                )
            for item in json.loads(report.read_text())["install"]:
                meta = item["metadata"]
                name = _canonical(meta["name"])
                hashes = (item.get("download_info") or {}).get("archive_info", {}).get("hashes", {})
                found = {"version": meta["version"], "sha256": hashes.get("sha256", "")}
                if name in packages and packages[name]["version"] != found["version"]:
                    raise RlboxError(
                        f"{variant.manifest_rel}: variants.{variant.name}: {name} resolves to both "
                        f"{packages[name]['version']} and {found['version']}; pin it in the manifest"
                    )
                packages[name] = found
    return {"index": index, "packages": dict(sorted(packages.items()))}


# pip resolves for another platform (--platform, --python-version) but evaluates dependency
# markers such as `platform_machine == "x86_64"` against the machine it runs on: an arm64 lock
# made on x86_64 would pull CUDA wheels. This runs pip with the target's marker environment.
_PIP_FOR_TARGET = """
import sys
from pip._vendor.packaging import markers
arch, py = sys.argv[1], sys.argv[2]
env = markers.default_environment()
env.update(platform_machine=arch, platform_system="Linux", sys_platform="linux", os_name="posix",
           implementation_name="cpython", platform_python_implementation="CPython",
           python_version=py, python_full_version=py + ".0", implementation_version=py + ".0")
markers.default_environment = lambda: dict(env)
from pip._internal.cli.main import main
sys.exit(main(sys.argv[3:]))
"""


class IndexUnreachable(Exception):
    """A package index that cannot be reached from this machine (not a resolution conflict)."""


_UNREACHABLE = re.compile(r"NewConnectionError|NameResolutionError|ConnectTimeoutError|ProxyError|Failed to establish")


def _unreachable_index(stderr: str, indexes: list[str]) -> str:
    """Which index pip could not reach: its retry warnings end with the request's path."""
    from urllib.parse import urlsplit

    paths = re.findall(r"': (/\S*)", stderr)
    for url in sorted(indexes, key=lambda u: -len(urlsplit(u).path)):
        if any(p.startswith(urlsplit(url).path.rstrip("/") + "/") for p in paths):
            return url
    return " or ".join(indexes)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_error(stderr: str) -> str:
    lines = [line.strip().removeprefix("ERROR: ") for line in stderr.splitlines() if line.strip().startswith("ERROR")]
    lines = [line for line in lines if not line.startswith("Ignored the following")] or lines
    return (lines[-1] if lines else last_line(stderr))[:300]


def lock(m, variants, *, strict: bool = False, pip_index: str | None = None, ca_bundle: Path | None = None,
         echo=None, wrote=None) -> list[str]:
    """Resolve each variant and write it into its release's lock at once (a long run keeps its
    progress); the warnings of what could not be pinned. ``strict`` makes the first one an error."""
    warnings: list[str] = []
    for v in variants:
        res = resolve(v, pip_index=pip_index, ca_bundle=ca_bundle, echo=echo)
        warnings += res.warnings
        if strict and res.warnings:
            raise RlboxError(res.warnings[0] + " (--strict)", exit_code=1)
        release = v.release.release
        names = {x.name for x in m.variants if x.release.release == release}
        path = lockfile.write(m.root, release, v.name, res.entry, names)
        if wrote is not None:
            wrote(path, v)
    return warnings
