"""Everything a variant's build installs, as requirements with the place that asks for each.

The lock resolves this whole set (``rlbox.image.resolve``), so nothing floats at build time:

- CANN's Python packages and the release's ``python_packages`` (the manifest);
- every PyPI component's pin (the manifest);
- for every git source the build installs: its build requirements (the requirement files the
  manifest names, else its ``pyproject.toml`` ``[build-system]``) and its own requirements, read
  from the source at the pinned commit as its build would see them: the requirement files its
  ``setup.py`` reads, or the metadata its build backend writes (run with the component's env),
  plus the extras the manifest asks for, minus what the manifest ``drop``s with a reason.

A source comes from the source cache (``.rlbox-sources/git/NAME-COMMIT.git``, filled by
``rlbox fetch-sources``). Where it cannot be had and the manifest names a ``standin`` (a PyPI
sdist of the nearest release), the stand-in's files are read instead and the substitution is
recorded, never hidden.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement

from rlbox.core.errors import RlboxError

if TYPE_CHECKING:
    from rlbox.image.matrix import ResolvedComponent, ResolvedVariant


@dataclass(frozen=True)
class Asked:
    """One requirement and who asks for it (shown when the lock cannot be resolved)."""

    spec: str
    by: str

    @property
    def name(self) -> str:
        return canonical(Requirement(self.spec).name)


@dataclass
class SourceFiles:
    """The files of one git component as its build sees them: its pinned commit in the source
    cache, or the sdist that stands in for it."""

    component: str
    origin: str  # "git COMMIT" or "sdist FILE"
    read: object  # callable(path) -> str | None
    export: object  # callable(dest: Path) -> Path (the source tree, subdir applied)
    version: str | None = None  # the version its setuptools-scm would compute, when it uses it
    standin: dict | None = None  # the substitution record, when a stand-in is read


@dataclass
class Provided:
    """A git source as the resolver sees it: its distribution, version and requirements (it is
    built by the image, never taken from an index)."""

    component: str
    dist: str
    version: str
    requires: list[Asked] = field(default_factory=list)


@dataclass
class Gathered:
    asked: list[Asked] = field(default_factory=list)
    provided: list[Provided] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)
    sources: dict[str, SourceFiles] = field(default_factory=dict)
    no_deps: list[Asked] = field(default_factory=list)  # PyPI components installed --no-deps


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def target_environment(v: "ResolvedVariant") -> dict[str, str]:
    """PEP 508 marker values of the variant's platform and Python (not this machine's)."""
    py = v.release.python
    return {
        "implementation_name": "cpython", "implementation_version": py + ".0", "os_name": "posix",
        "platform_machine": v.arch, "platform_python_implementation": "CPython", "platform_release": "",
        "platform_system": "Linux", "platform_version": "", "python_full_version": py + ".0",
        "python_version": py, "sys_platform": "linux", "extra": "",
    }


def parse_lines(text: str, where: str, include=None) -> list[str]:
    """Requirement lines of a requirements file: comments, blank lines and pip options (``--…``,
    e.g. ``--extra-index-url``) dropped, as setup.py readers upstream do; ``-r FILE`` followed
    through ``include``."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")) and include is not None:
            out += include(line.split(None, 1)[1].strip())
            continue
        if line.startswith("-"):
            continue
        try:
            Requirement(line)
        except InvalidRequirement as err:
            raise RlboxError(f"{where}: '{line}' is not a requirement ({err})") from None
        out.append(line)
    return out


def gather(v: "ResolvedVariant", sources_for) -> Gathered:
    """The requirement set of ``v``; ``sources_for(component)`` gives a git source's SourceFiles."""
    g = Gathered()
    rel = v.manifest_rel
    for spec in v.release.cann.python_packages:
        g.asked.append(Asked(spec, f"{rel} cann.python_packages"))
    for spec in v.release.python_packages:
        g.asked.append(Asked(spec, f"{rel} python_packages"))
    for c in v.components:
        if c.spec.pip:
            target = g.no_deps if "--no-deps" in c.spec.pip_args else g.asked
            target.append(Asked(c.spec.pip, f"{rel} components.{c.name}"))
    env = target_environment(v)
    for c in v.components:
        if not c.spec.git or c.spec.install == "source":
            continue
        src = sources_for(c)
        g.sources[c.name] = src
        dist, version, runtime = install_requirements(v, c, src, env)
        provided = Provided(c.name, dist, version)
        for kind, pairs in (("build", build_requirements(c, src)), ("run", runtime)):
            for spec, by in pairs:
                name = canonical(Requirement(spec).name)
                if name in {canonical(k) for k in c.spec.drop}:
                    why = next(w for k, w in c.spec.drop.items() if canonical(k) == name)
                    g.dropped.append({"requirement": spec, "by": by, "why": why})
                    continue
                (g.asked if kind == "build" else provided.requires).append(Asked(spec, by))
        g.provided.append(provided)
    return g


def build_requirements(c: "ResolvedComponent", src: SourceFiles) -> list[tuple[str, str]]:
    """What building ``c`` without isolation needs installed first."""
    where = f"{c.name} {src.origin}"
    if c.spec.requirements:
        return [(line, f"{c.name} {path}") for path in c.spec.requirements for line in _file(c, src, path)]
    text = src.read("pyproject.toml")
    requires = ["setuptools>=40.8.0", "wheel"]  # pip's default for a source without pyproject.toml
    if text is not None:
        requires = toml(text, f"{where} pyproject.toml").get("build-system", {}).get("requires", requires)
    return [(spec, f"{c.name} pyproject.toml [build-system]") for spec in requires]


def install_requirements(v: "ResolvedVariant", c: "ResolvedComponent", src: SourceFiles,
                         env: dict[str, str]) -> tuple[str, str, list[tuple[str, str]]]:
    """The distribution name, version and runtime requirements of a git source."""
    if isinstance(c.spec.requires, list):
        dist, version = declared_identity(c, src)
        return dist, version, [(line, f"{c.name} {path}") for path in c.spec.requires for line in _file(c, src, path)]
    meta = metadata(v, c, src)
    out = []
    for spec in meta.get("requires_dist", []):
        req = Requirement(spec)
        if req.marker is not None and "extra" in str(req.marker):
            if not any(req.marker.evaluate(dict(env, extra=e)) for e in c.spec.extras):
                continue
            req.marker = None  # an extra the manifest asks for: evaluated for the target here
            spec = str(req)
        out.append((spec, f"{c.name} metadata ({src.origin})"))
    return meta["name"], src.version or meta["version"], out


def declared_identity(c: "ResolvedComponent", src: SourceFiles) -> tuple[str, str]:
    """Name and version of a source read without building it: pyproject's [project], else the
    literals in setup.py (``name=``, ``version=``/``__version__``), else the component's name."""
    project = toml(src.read("pyproject.toml") or "", f"{c.name} pyproject.toml").get("project", {})
    setup = src.read("setup.py") or ""
    setup = setup[setup.rfind("setup("):] if "setup(" in setup else setup  # the call, not extensions' names
    name = project.get("name") or _literal(r"\bname\s*=\s*['\"]([^'\"]+)['\"]", setup) or c.name
    version = src.version or project.get("version") or _literal(
        r"(?:__version__|\bversion)\s*=\s*['\"]([0-9][^'\"]*)['\"]", src.read("setup.py") or "") or "0"
    return name, version


def _literal(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text)
    return found.group(1) if found else None


def _file(c: "ResolvedComponent", src: SourceFiles, path: str) -> list[str]:
    where = f"{c.name} {path} ({src.origin})"
    text = src.read(path)
    if text is None:
        raise RlboxError(f"components.{c.name}: {path} does not exist in {src.origin}; fix `requirements:`/`requires:`")
    base = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
    return parse_lines(text, where, include=lambda inc: _file(c, src, base + inc))


def metadata(v: "ResolvedVariant", c: "ResolvedComponent", src: SourceFiles) -> dict:
    """The metadata of ``c`` as its build backend writes it (name, version, Requires-Dist), with
    the component's build env (pip builds the metadata only; nothing is installed)."""
    with tempfile.TemporaryDirectory(prefix=f"rlbox-meta-{c.name}-") as tmp:
        tree = src.export(Path(tmp) / "src")
        report = Path(tmp) / "report.json"
        env = {k: val for k, val in os.environ.items() if not k.startswith("PIP_")}
        env.update({k: val for k, val in v.build_env(c).items() if k != 'SETUPTOOLS_SCM_PRETEND_VERSION'}, PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
        if src.version:
            env["SETUPTOOLS_SCM_PRETEND_VERSION"] = src.version
        proc = subprocess.run(
            ["python3", "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
             "--report", str(report), "--index-url", "https://pypi.org/simple", str(tree)],
            capture_output=True, text=True, env=env, timeout=900,
        )
        if proc.returncode != 0:
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no output"]
            raise RlboxError(f"components.{c.name}: cannot read its metadata from {src.origin}: {last[0][:200]}")
        items = json.loads(report.read_text())["install"]
        if not items:
            raise RlboxError(f"components.{c.name}: pip reported no metadata for {src.origin}")
        return items[0]["metadata"]


def toml(text: str, where: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        from pip._vendor import tomli as tomllib
    try:
        return tomllib.loads(text)
    except ValueError as err:
        raise RlboxError(f"{where}: not valid TOML ({err})") from None


# ---------------------------------------------------------------------------------------------
# Where a component's files come from.


def git_files(c: "ResolvedComponent", repo: Path, commit: str) -> SourceFiles:
    sub = f"{c.spec.subdir}/" if c.spec.subdir else ""

    def read(path: str) -> str | None:
        proc = subprocess.run(["git", "--git-dir", str(repo), "show", "--end-of-options", f"{commit}:{sub}{path}"],
                              capture_output=True)
        return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None

    def export(dest: Path) -> Path:
        dest.mkdir(parents=True)
        # only the subdir when there is one: what a build checks out (rlbox-git-fetch sparse)
        archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "--format=tar", "--end-of-options", commit,
                                  *([c.spec.subdir] if c.spec.subdir else [])], capture_output=True)
        if archive.returncode != 0:
            raise RlboxError(f"components.{c.name}: {repo.name} cannot export {commit[:12]}: "
                             f"{archive.stderr.decode(errors='replace').strip()[:160]}")
        archive = archive.stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dest)
        return dest / sub if sub else dest

    return SourceFiles(c.name, f"git {commit[:12]}", read, export, version=scm_version(c, repo, commit, read))


def sdist_files(c: "ResolvedComponent", tarball: Path, standin: dict) -> SourceFiles:
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    prefix = names[0].split("/", 1)[0] + "/"
    sub = f"{c.spec.subdir}/" if c.spec.subdir else ""

    def read(path: str) -> str | None:
        with tarfile.open(tarball) as tar:
            try:
                member = tar.extractfile(prefix + sub + path)
            except KeyError:
                return None
            return member.read().decode("utf-8", "replace") if member else None

    def export(dest: Path) -> Path:
        dest.mkdir(parents=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dest)
        return dest / prefix / sub

    version = standin["used"].split("==", 1)[1]
    return SourceFiles(c.name, f"sdist {tarball.name}", read, export, version=version, standin=standin)


def uses_scm(read) -> bool:
    text = (read("pyproject.toml") or "") + (read("setup.py") or "")
    return "setuptools_scm" in text or "setuptools-scm" in text


def scm_version(c: "ResolvedComponent", repo: Path, commit: str, read) -> str | None:
    """The version setuptools-scm computes for ``commit`` in a full clone (a shallow clone in a
    build has no tags and would say 0.1.dev1): the build is told it with
    SETUPTOOLS_SCM_PRETEND_VERSION."""
    if not uses_scm(read):
        return None
    proc = subprocess.run(["git", "--git-dir", str(repo), "describe", "--tags", "--long", "--match", "v[0-9]*",
                           "--abbrev=9", "--end-of-options", commit], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RlboxError(f"components.{c.name}: no release tag reaches {commit[:12]} in {repo.name} "
                         "(a shallow copy?): fill the source cache with history (`rlbox fetch-sources`)")
    tag, distance, node = proc.stdout.strip().rsplit("-", 2)
    from setuptools_scm import Configuration
    from setuptools_scm.version import format_version, meta

    return format_version(meta(tag, distance=int(distance), node=node, dirty=False, config=Configuration()))
