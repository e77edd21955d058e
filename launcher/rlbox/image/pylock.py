"""Resolving a variant's whole Python set for its platform and Python, with uv.

uv's resolver (``uv pip compile --python-platform … --python-version …``) was chosen over pip's
``install --dry-run --report`` by measurement (docs/research/upstream-audit.md §C): on the
flagship's 216 packages for aarch64 / Python 3.10 it takes 12–13 s against pip's 30–34 s, it
allows an sdist for named projects only (``--no-binary antlr4-python3-runtime``; pip refuses
``--no-binary`` with ``--platform`` and then silently degrades hydra-core to 0.11), and its
PEP 751 output names, per package, the one file for the target with its URL and sha256.

Indexes are probed first. A requirement served by an index this machine cannot reach is never
resolved from another index silently: it takes the stand-in the manifest names (recorded as a
substitution, which ``rlbox lock --strict`` refuses), or the variant stays unlocked.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from packaging.requirements import Requirement

from rlbox.core.errors import RlboxError
from rlbox.image.requirements import Asked, Gathered, Provided, canonical, toml

if TYPE_CHECKING:
    from rlbox.image.matrix import ResolvedVariant

PYPI = "https://pypi.org/simple"
# glibc of the base OS: the newest manylinux tag a wheel may carry to run there.
GLIBC = {"ubuntu22.04": 35, "ubuntu24.04": 39, "debian12": 36, "debian13": 41, "openeuler22.03": 34, "openeuler24.03": 38}


class IndexUnreachable(Exception):
    """A package index that cannot be reached from this machine (not a resolution conflict)."""


@dataclass
class Plan:
    """What uv is asked: requirements (who asks each), indexes, overrides, substitutions."""

    asked: list[Asked]
    no_deps: list[Asked]
    indexes: list[str]
    provided: list = field(default_factory=list)  # requirements.Provided: git sources the image builds
    overrides: list[str] = field(default_factory=list)
    substitutions: list[dict[str, str]] = field(default_factory=list)
    unresolved: list[dict[str, str]] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    standin_files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the stand-in's file

    def describe(self) -> str:
        lines = [f"{len(self.asked) + len(self.no_deps)} requirements from {', '.join(self.indexes)}"]
        lines += [f"  git source {g.dist}=={g.version} ({len(g.requires)} requirements)" for g in self.provided]
        lines += [f"  substitution: {s['used']} for {s['for']}" for s in self.substitutions]
        lines += [f"  unresolved: {u['requirement']} ({u['why']})" for u in self.unresolved]
        lines += [f"  excluded: {name} ({why})" for name, why in self.excluded.items()]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"asked": [a.spec for a in self.asked], "no_deps": [a.spec for a in self.no_deps], "indexes": list(self.indexes),
                "provided": {g.component: f"{g.dist}=={g.version}" for g in self.provided},
                "overrides": list(self.overrides), "substitutions": list(self.substitutions),
                "unresolved": list(self.unresolved), "excluded": dict(self.excluded)}


def uv_bin() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        raise RlboxError("uv is not installed (it resolves the lock): `pip install uv`, or `make setup`") from None
    return find_uv_bin()


def reachable(url: str, timeout: float = 10.0) -> bool:
    import requests

    try:
        requests.get(url.rstrip("/") + "/", timeout=timeout, headers={"Accept": "text/html"}, stream=True).close()
        return True
    except requests.RequestException:
        return False


def plan(v: "ResolvedVariant", gathered: Gathered, *, index: str = PYPI, probe=reachable,
         cache: Path | None = None) -> Plan:
    """Which index serves what, what stands in for what cannot be reached, what is excluded."""
    asked = list(gathered.asked)
    indexes = [index]
    p = Plan(asked, list(gathered.no_deps), indexes, provided=list(gathered.provided), excluded=dict(v.release.exclude))
    up: dict[str, bool] = {}
    for c in v.components:
        if not c.spec.pip or not c.spec.index_url:
            continue
        url = c.spec.index_url
        if url not in up:
            up[url] = probe(url)
        if up[url]:
            if url not in indexes:
                indexes.append(url)
            continue
        where = f"{v.manifest_rel} components.{c.name}"
        if c.spec.standin is None:
            p.unresolved.append({"requirement": c.spec.pip, "index": url,
                                 "why": f"{urlsplit(url).netloc} is not reachable from the machine that locked"})
            continue
        stand = c.spec.standin.pypi
        p.substitutions.append({"for": c.spec.pip, "index": url, "used": stand or "nothing", "from": index,
                                "why": f"{urlsplit(url).netloc} not reachable from the machine that locked; "
                                       f"{c.spec.standin.why}"})
        if stand is None:  # nothing fits the target: the image goes without it, nothing else is bent for it
            p.asked = [a for a in p.asked if a.spec != c.spec.pip]
            continue
        # The stand-in's file takes the real pin's place: to the resolver it is a project with the
        # real version (torch 2.7.1+cpu, so torch-npu's `torch==2.7.1+cpu` holds) and the stand-in's
        # own requirements (its wheel's METADATA), so nothing else is bent to fit it.
        entry, requires = standin_file(v, stand, index, cache)
        name, version = c.spec.pip.split("==", 1)
        p.standin_files[canonical(name)] = dict(entry, standin_for=c.spec.pip)
        p.asked = [a for a in p.asked if a.spec != c.spec.pip]
        p.provided.append(Provided(c.name, name, version, [Asked(r, f"{stand} (stand-in) METADATA") for r in requires]))
    for name in sorted(p.excluded):
        p.overrides.append(f'{name} ; sys_platform == "never"')  # uv: an override that never applies removes it
    return p


def standin_file(v: "ResolvedVariant", spec: str, index: str, cache: Path | None) -> tuple[dict[str, Any], list[str]]:
    """The target's wheel of stand-in ``spec`` on ``index`` (into the source cache, sha256 checked)
    and the requirements its METADATA declares."""
    import zipfile

    from packaging.utils import parse_wheel_filename

    from rlbox.image import sources

    name, version = spec.split("==", 1)
    files = [f for f in sources.index_files(index, name) if f["filename"].endswith(".whl")]

    files = [f for f in files if str(parse_wheel_filename(f["filename"])[1]) == version]
    pkg = {"name": name, "version": version, "wheels": [{"url": f["url"], "hashes": f["hashes"], "size": f.get("size")} for f in files]}
    best = best_file(pkg, {t: i for i, t in enumerate(target_tags(v))})
    url = best["url"].split("#", 1)[0]
    folder = (cache or Path(tempfile.gettempdir())) / "wheels" / f"{v.arch}-py{v.release.python}"
    path = sources.download(url, best["hashes"]["sha256"], folder / url.rsplit("/", 1)[-1])
    with zipfile.ZipFile(path) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        text = whl.read(meta).decode()
    requires = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    requires = [r for r in requires if "extra ==" not in r]
    entry = {"version": version, "file": path.name, "url": url, "sha256": best["hashes"]["sha256"],
             "size": best.get("size"), "index": index}
    return entry, requires


def platform_tag(v: "ResolvedVariant") -> str:
    return f"{v.arch}-manylinux_2_{GLIBC.get(v.release.os, 28)}"


def compile_set(v: "ResolvedVariant", p: Plan, *, cache_dir: Path | None = None, no_deps: bool = False,
                ca_bundle: Path | None = None) -> list[dict[str, Any]]:
    """Run uv; the PEP 751 packages it picks (one file each for the target)."""
    asked = p.no_deps if no_deps else p.asked
    if not asked:
        return []
    with tempfile.TemporaryDirectory(prefix="rlbox-lock-") as tmp:
        req = Path(tmp) / "requirements.in"
        lines = [a.spec for a in asked]
        if not no_deps:  # each git source as a local project with static metadata: its own
            lines += [stub(Path(tmp), g) for g in p.provided]  # requirements, resolved with the rest
        req.write_text("".join(line + "\n" for line in lines))
        out = Path(tmp) / "pylock.rlbox.toml"
        argv = [uv_bin(), "pip", "compile", "--no-config", "--no-python-downloads", "--quiet",
                "--python-platform", platform_tag(v), "--python-version", v.release.python,
                "--index-url", p.indexes[0], "--index-strategy", "unsafe-best-match",
                "--only-binary", ":all:", "--format", "pylock.toml", "-o", str(out), str(req)]
        for url in p.indexes[1:]:
            argv += ["--extra-index-url", url]
        for name in v.release.sdist_only:
            argv += ["--no-binary", name]
        if no_deps:
            argv.append("--no-deps")
        if p.overrides and not no_deps:
            over = Path(tmp) / "overrides.txt"
            over.write_text("".join(o + "\n" for o in p.overrides))
            argv += ["--override", str(over)]
        if cache_dir:
            argv += ["--cache-dir", str(cache_dir)]
        env = {k: val for k, val in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
        if ca_bundle:
            env["SSL_CERT_FILE"] = str(ca_bundle)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise RlboxError(conflict_line(v, proc.stderr, asked + [a for g in p.provided for a in g.requires]))
        return toml(out.read_text(), "uv's pylock output").get("packages", [])


def stub(tmp: Path, g) -> str:
    """A project that declares what git source ``g`` declares, for uv to read without building:
    uv then checks every other package's requirement on it against its real version."""
    import json

    folder = tmp / "provided" / g.component
    folder.mkdir(parents=True)
    deps = ", ".join(json.dumps(a.spec) for a in g.requires)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = {json.dumps(g.dist)}\nversion = {json.dumps(g.version)}\ndependencies = [{deps}]\n')
    return f"{g.dist} @ {folder.as_uri()}"


# uv's proof speaks of requirements (``numpy<2``, ``verl>=0.9.1``) and of who depends on what
# (``verl>=0.9.1 depends on numpy>=2.0.0``); these two patterns read them back out of it.
REQ_TOKEN = r"[A-Za-z0-9][A-Za-z0-9_.\-]*(?:\[[\w,-]+\])?(?:(?:[<>=!~]=?|===)[^\s,]+(?:,(?:[<>=!~]=?)[^\s,]+)*)?"
REQ_SPEC = r"[A-Za-z0-9][A-Za-z0-9_.\-]*(?:\[[\w,-]+\])?(?:[<>=!~]=?|===)[^\s,]+(?:,(?:[<>=!~]=?)[^\s,]+)*"
DEPENDS = re.compile(rf"({REQ_TOKEN}) depends? on (one of: {REQ_SPEC}(?: {REQ_SPEC})*|{REQ_TOKEN})")


def conflict_line(v: "ResolvedVariant", stderr: str, asked: list[Asked]) -> str:
    """One line: the package no version satisfies, each side with who asks for it (the release field,
    or the package that brings it and the field that brings that package), and the fields to change.
    Falls back to uv's reason, with who asks for what it names, where the proof names no two sides."""
    text = " ".join(line.strip(" ╰─▶│") for line in stderr.splitlines() if line.strip())
    text = re.sub(r"\s+", " ", text).replace("error: ", "").strip()
    if re.search(r"(dns error|failed to lookup|connect error|Failed to fetch|tcp connect)", text, re.I):
        return f"{v.ref}: an index could not be reached while resolving: {text[:300]}"
    reason = re.sub(r"^No solution found when resolving dependencies:?\s*(cause:)?\s*", "", text)
    reason = re.sub(r",? we can conclude that your requirements are unsatisfiable\.?", "", reason)
    reason = re.sub(r"we can conclude that all versions of (\S+) depend on [^.]+\.\s*", "", reason)
    head = f"{v.manifest_rel}: {v.ref}:"
    sides = conflict_sides(reason, asked, v.manifest_rel)
    if sides:
        name, found = sides
        fields = sorted({f for _, _, f in found})
        said = [f"{spec} asked by {by}" for spec, by, _ in found]
        said = f"{said[0]}, but {'; '.join(said[1:])}"
        return (f"{head} no {name} satisfies both on {v.platform} / Python {v.release.python}: {said}; "
                f"change {' or '.join(fields)} in {v.manifest_rel} (another pin, or `drop:`/`exclude:` with its why)")
    who = []
    for a in asked:
        if a.spec in reason or _spec_variants(a.spec) & set(re.findall(r"[A-Za-z0-9_.\-\[\]]+[<>=!~]=?[^\s,]+", reason)):
            who.append(f"{a.spec} asked by {a.by}")
    names = {canonical(m) for m in re.findall(r"([A-Za-z0-9_.\-]+)[<>=!~]", reason)}
    if not who:  # the conflict is between packages' own requirements: name who brings the packages
        who = [f"{a.spec} asked by {a.by}" for a in asked if a.name in names][:4]
    tail = f" ({'; '.join(who)})" if who else ""
    return f"{head} the Python set cannot be resolved for {v.platform} / Python {v.release.python}: {reason[:500]}{tail}"


def release_field(by: str, manifest_rel: str) -> str:
    """The release field behind an Asked.by: ``images/x.yaml cann.python_packages`` ->
    ``cann.python_packages``; ``vllm_ascend requirements.txt`` -> ``components.vllm_ascend``."""
    if by.startswith(manifest_rel + " "):
        return by[len(manifest_rel) + 1:].split()[0]
    return f"components.{by.split()[0]}"


def token_name(token: str) -> str:
    """The project a requirement token of uv's proof names (``numpy>=1.25,<2.4.`` -> numpy: the
    sentence's full stop is not part of the version)."""
    return canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", token).group(0).rstrip("."))


def conflict_sides(reason: str, asked: list[Asked], manifest_rel: str) -> tuple[str, list[tuple[str, str, str]]] | None:
    """From uv's proof: the first package with two or more differing specifiers, each as
    (specifier, who asks, release field). A specifier a package brings (``X depends on Y``) is
    asked by X's own asker, named with X."""
    brought: dict[str, list[tuple[str, str]]] = {}
    for parent, child in DEPENDS.findall(reason):
        # uv: "depends on one of: a>=1,<2 a>2,<3"; a requirement that ends uv's sentence keeps its full stop
        alternatives = [a.rstrip(".") for a in child.removeprefix("one of: ").split()]
        brought.setdefault(token_name(alternatives[0]), []).append((" or ".join(alternatives), parent))
    order = [token_name(t) for t in re.findall(REQ_TOKEN, reason) if re.search(r"[<>=!~]", t)]
    for name in dict.fromkeys(order):
        found: list[tuple[str, str, str]] = []
        for a in asked:
            if a.name == name and Requirement(a.spec).specifier:
                found.append((a.spec, a.by, release_field(a.by, manifest_rel)))
        for child, parent in brought.get(name, []):
            pname = canonical(Requirement(parent).name)
            for a in asked:
                if a.name == pname:
                    found.append((child, f"{Requirement(parent).name} ({a.spec} asked by {a.by})", release_field(a.by, manifest_rel)))
                    break
        specs = {spec.split(name, 1)[-1] for spec, _, _ in found}
        if len(found) >= 2 and len(specs) >= 2:
            return name, list(dict.fromkeys(found))
    return None


def _spec_variants(spec: str) -> set[str]:
    req = Requirement(spec)
    return {f"{req.name}{s}" for s in req.specifier} | {f"{canonical(req.name)}{s}" for s in req.specifier}


def index_of(url: str, indexes: list[str]) -> str:
    host = urlsplit(url).netloc
    if host in ("files.pythonhosted.org", "pypi.org"):
        return PYPI if PYPI in indexes else indexes[0]
    for ix in indexes:
        if urlsplit(ix).netloc == host:
            return ix
    return indexes[0]


def target_tags(v: "ResolvedVariant") -> list:
    """The wheel tags the target's pip accepts, most preferred first (pip's own order)."""
    from packaging import tags

    major, minor = (int(x) for x in v.release.python.split("."))
    arch = v.arch
    plats = [f"manylinux_2_{n}_{arch}" for n in range(GLIBC.get(v.release.os, 28), 4, -1)]
    plats += [f"manylinux{alias}_{arch}" for alias in ("2014", "2010", "1")] + [f"linux_{arch}"]
    return [*tags.cpython_tags((major, minor), platforms=plats),
            *tags.compatible_tags((major, minor), interpreter=f"cp{major}{minor}", platforms=plats)]


def best_file(pkg: dict[str, Any], ranked: dict) -> dict[str, Any]:
    """The file pip on the target would install, of those uv lists for it."""
    from packaging.utils import parse_wheel_filename

    wheels = pkg.get("wheels") or []
    if not wheels:
        if not pkg.get("sdist"):
            raise RlboxError(f"uv gave no file for {pkg['name']} {pkg.get('version')}")
        return pkg["sdist"]

    def rank(w):
        _, _, _, wtags = parse_wheel_filename(unquote(w["url"].rsplit("/", 1)[-1]))
        return min((ranked.get(t, len(ranked)) for t in wtags), default=len(ranked))

    best = min(wheels, key=rank)
    if rank(best) == len(ranked):
        raise RlboxError(f"no wheel of {pkg['name']} {pkg.get('version')} fits the target")
    return best


def packages(found: list[dict[str, Any]], indexes: list[str], p: Plan, v: "ResolvedVariant") -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    ranked = {t: i for i, t in enumerate(target_tags(v))}
    for pkg in found:
        if "directory" in pkg:  # a git source the image builds itself, or a stand-in's file
            if canonical(pkg["name"]) in p.standin_files:
                out[canonical(pkg["name"])] = p.standin_files[canonical(pkg["name"])]
            continue
        f = best_file(pkg, ranked)
        url = f.get("url", "")
        name = canonical(pkg["name"])
        entry = {"version": pkg["version"], "file": unquote(url.rsplit("/", 1)[-1]), "url": url,
                 "sha256": f.get("hashes", {}).get("sha256", ""), "size": f.get("size"),
                 "index": pkg.get("index") or index_of(url, indexes)}
        out[name] = entry
    return dict(sorted(out.items()))


def resolve(v: "ResolvedVariant", gathered: Gathered, *, index: str = PYPI, cache_dir: Path | None = None,
            ca_bundle: Path | None = None, probe=reachable, cache: Path | None = None) -> dict[str, Any]:
    """The ``pip`` section of a variant's lock entry."""
    p = plan(v, gathered, index=index, probe=probe, cache=cache)
    section: dict[str, Any] = {
        "resolver": uv_version(), "platform": platform_tag(v), "python": v.release.python,
        "indexes": p.indexes, "sdist_only": list(v.release.sdist_only), "excluded": p.excluded,
        "dropped": gathered.dropped, "substitutions": p.substitutions, "unresolved": p.unresolved,
        "asked": sorted({f"{a.spec}  # {a.by}" for a in [*p.asked, *p.no_deps, *(r for g in p.provided for r in g.requires)]}),
        "provided": {g.component: f"{g.dist}=={g.version}" for g in p.provided},
    }
    if p.unresolved:
        u = p.unresolved[0]
        section.update(packages={}, note=f"{u['requirement']}: {u['why']} ({u['index']}); lock again where it is")
        return section
    found = compile_set(v, p, cache_dir=cache_dir, ca_bundle=ca_bundle)
    found += compile_set(v, p, cache_dir=cache_dir, no_deps=True, ca_bundle=ca_bundle)
    section["packages"] = packages(found, p.indexes, p, v)
    return section


def uv_version() -> str:
    proc = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True)
    return proc.stdout.strip() or "uv"
