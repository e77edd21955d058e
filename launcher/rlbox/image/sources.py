"""The source cache for air-gapped builds: everything a variant's build downloads, fetched once.

``fetch(variant, dest)`` fills ``.rlbox-sources/`` (see its README): the pinned commit of every
git source, every wheel of the lock plus the build requirements of git sources, and the OS
packages the image adds to its base (downloaded in a container of the base itself, so the set
is exactly what that base lacks). ``missing`` tells an offline build what is not there yet.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlbox.image import resolve
from rlbox.core.errors import RlboxError
from rlbox.image.matrix import ResolvedVariant
from rlbox.image.mirrors import SOURCES_DIR, Profile


def git_dir(dest: Path, name: str, commit: str) -> Path:
    return dest / "git" / f"{name}-{commit}.git"


def wheel_dir(dest: Path, v: ResolvedVariant) -> Path:
    return dest / "wheels" / f"{v.arch}-py{v.release.python}"


def deb_dir(dest: Path, v: ResolvedVariant) -> Path:
    return dest / "debs" / f"{v.release.os}-{v.arch}"


def default_dest(v: ResolvedVariant) -> Path:
    return v.root / SOURCES_DIR


def missing(v: ResolvedVariant, dest: Path | None = None) -> list[str]:
    """What an offline build of ``v`` would not find in the cache (paths relative to it)."""
    dest = dest or default_dest(v)
    out = []
    for c in v.components:
        if c.spec.git and not git_dir(dest, c.name, c.spec.commit).is_dir():
            out.append(str(git_dir(dest, c.name, c.spec.commit).relative_to(dest)))
    if not wheel_dir(dest, v).is_dir():
        out.append(str(wheel_dir(dest, v).relative_to(dest)))
    if v.package_manager == "apt" and not (deb_dir(dest, v) / "Packages").is_file():
        out.append(str(deb_dir(dest, v).relative_to(dest)))
    return out


@dataclass
class Fetched:
    git: list[str]
    wheels: int
    debs: int


def _run(argv, what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RlboxError(f"fetch-sources: {what} failed: {resolve.last_line(proc.stderr or proc.stdout)}")
    return proc


def fetch(v: ResolvedVariant, dest: Path | None = None, *, profile: Profile | None = None,
          ca_bundle: Path | None = None, base_image: str | None = None, echo=None) -> Fetched:
    echo = echo or (lambda line: None)
    dest = (dest or default_dest(v)).resolve()
    if v.lock.state != "fresh":
        raise RlboxError(f"{v.lock.path}: {v.ref} is {v.lock.state}: run `rlbox lock {v.release.release}` first "
                         "(the cache holds exactly the locked wheels)")
    if v.lock.pip == {} and (v.lock.entry or {}).get("pip", {}).get("note"):
        raise RlboxError(f"{v.lock.path}: {v.ref} has no locked wheels ({v.lock.entry['pip']['note']})")
    git = [_fetch_git(v, c, dest, profile, echo) for c in v.components if c.spec.git]
    wheels = _fetch_wheels(v, dest, profile, ca_bundle, echo)
    debs = _fetch_debs(v, dest, profile, base_image, echo) if v.package_manager == "apt" else 0
    return Fetched(git, wheels, debs)


def _git_env(profile: Profile | None) -> dict[str, str]:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    if profile and profile.git_mirror:
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0=f"url.{profile.git_mirror.rstrip('/')}/.insteadOf",
                   GIT_CONFIG_VALUE_0="https://github.com/")
    return env


def _fetch_git(v: ResolvedVariant, c, dest: Path, profile: Profile | None, echo) -> str:
    target = git_dir(dest, c.name, c.spec.commit)
    if target.is_dir():
        echo(f"git {c.name}@{c.spec.commit[:12]}: cached")
        return target.name
    echo(f"git {c.name}@{c.spec.commit[:12]} from {c.spec.git}")
    env = _git_env(profile)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".fetching-{c.name}-", dir=dest) as tmp:
        repo = Path(tmp) / target.name
        _run(["git", "init", "-q", "--bare", repo], f"git init for {c.name}")
        fetched = subprocess.run(["git", "-C", repo, "fetch", "-q", "--depth", "1", c.spec.git, c.spec.commit],
                                 capture_output=True, text=True, env=env)
        if fetched.returncode != 0:  # servers that refuse a fetch by commit: the ref, then everything
            refs = [f"+refs/tags/{c.spec.ref}:refs/tags/{c.spec.ref}"] if c.spec.ref else []
            _run(["git", "-C", repo, "fetch", "-q", c.spec.git, *(refs or ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"])],
                 f"git fetch of {c.name} from {c.spec.git}", env=env)
        _run(["git", "-C", repo, "update-ref", "refs/rlbox/pin", c.spec.commit],
             f"{c.name}: commit {c.spec.commit} is not in {c.spec.git}; the pin")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(repo, target)
    return target.name


def _toml(text: str) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # Python 3.10: the parser pip carries
        from pip._vendor import tomli as tomllib
    return tomllib.loads(text)


def _build_requirements(v: ResolvedVariant, dest: Path) -> list[str]:
    """What pip needs to build the git sources it installs (pyproject's [build-system])."""
    reqs: list[str] = []
    for c in v.components:
        if not c.spec.git or c.spec.install == "source":
            continue
        path = f"{c.spec.subdir + '/' if c.spec.subdir else ''}pyproject.toml"
        shown = subprocess.run(["git", "-C", git_dir(dest, c.name, c.spec.commit), "show", f"{c.spec.commit}:{path}"],
                               capture_output=True, text=True)
        build = _toml(shown.stdout).get("build-system", {}) if shown.returncode == 0 else {}
        reqs += build.get("requires", ["setuptools>=40.8.0", "wheel"])
        if c.spec.install == "editable":
            reqs.append("wheel")
    return list(dict.fromkeys(reqs))


def _pip(v: ResolvedVariant, command: list[str], profile: Profile | None, ca_bundle: Path | None) -> list[str]:
    index = profile.pip_index if profile and profile.pip_index else resolve.PYPI
    extra = [a for c in v.components if c.spec.index_url for a in ("--extra-index-url", c.spec.index_url)]
    return resolve.target_pip(v, command, index, extra, ca_bundle)


def _fetch_wheels(v: ResolvedVariant, dest: Path, profile: Profile | None, ca_bundle: Path | None, echo) -> int:
    target = wheel_dir(dest, v)
    target.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={p['version']}" for name, p in v.lock.pip.items()]
    echo(f"wheels: {len(pins)} locked for {v.platform}, Python {v.release.python} -> {target.relative_to(dest.parent)}")
    if pins:
        _run([*_pip(v, ["download", "--no-deps", "--dest", target], profile, ca_bundle), *pins],
             f"pip download of the locked wheels for {v.ref}", env=resolve.pip_env())
    build = _build_requirements(v, dest)
    if build:
        echo(f"wheels: build requirements of git sources: {' '.join(build)}")
        _run([*_pip(v, ["download", "--dest", target], profile, ca_bundle), *build],
             f"pip download of build requirements ({' '.join(build)})", env=resolve.pip_env())
    return len(list(target.glob("*.whl")))


def _fetch_debs(v: ResolvedVariant, dest: Path, profile: Profile | None, base_image: str | None, echo) -> int:
    target = deb_dir(dest, v)
    target.mkdir(parents=True, exist_ok=True)
    image = base_image or (profile.image(v.locked_base_image) if profile else v.locked_base_image)
    echo(f"debs: {len(v.system_packages)} OS packages and their dependencies, downloaded in {image}")
    files = v.root / "templates" / "files"
    argv = ["docker", "run", "--rm", "--platform", v.platform, "--entrypoint", "bash",
            "-v", f"{files}:/opt/rlbox/lib:ro", "-v", f"{target}:/out"]
    apt = profile.apt_for(v.release.os, v.arch) if profile else None
    if apt:
        argv += ["-e", f"APT_MIRROR={apt}"]
    argv += [image, "/opt/rlbox/lib/rlbox-system-packages", "apt", "--download-to", "/out", *v.system_packages]
    _run(argv, f"downloading OS packages in a container of {image}")
    return len(list(target.glob("*.deb")))
