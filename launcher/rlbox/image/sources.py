"""The source cache for air-gapped builds and for locking: what a variant's build downloads, fetched once.

``fetch(variant, dest)`` fills ``.rlbox-sources/`` (see its README): the pinned commit of every
git source (with its history when the lock needs ``git describe``), the sdist that stands in for
a git source the lock records as substituted, every file of the lock (downloaded from the URL the
lock names and checked against its sha256), and the OS packages the image adds to its base
(downloaded in a container of the base itself, so the set is exactly what that base lacks).
``missing`` tells an offline build what is not there yet.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlbox.core import names
from rlbox.core.config import HEX40, HEX64, redact_url
from rlbox.core.errors import RlboxError, last_line
from rlbox.image.matrix import ResolvedVariant
from rlbox.image.mirrors import SOURCES_DIR, Profile
from rlbox.image.requirements import canonical


def checked_commit(commit: object, what: str) -> str:
    """A commit as git may be given it: 40 lower-case hex digits, never an option (``--upload-pack=``)."""
    if not isinstance(commit, str) or not HEX40.fullmatch(commit):
        raise RlboxError(f"{what}: commit {str(commit)[:60]!r} is not a full git commit (40 lower-case hex digits)")
    return commit


def git_dir(dest: Path, name: str, commit: str) -> Path:
    return names.inside(dest / "git", f"{names.check(name, 'component', 'file')}-{checked_commit(commit, name)}.git",
                        what="component")


def wheel_dir(dest: Path, v: ResolvedVariant) -> Path:
    return dest / "wheels" / f"{v.arch}-py{v.release.python}"


def deb_dir(dest: Path, v: ResolvedVariant, base_os: str | None = None) -> Path:
    """The OS packages for ``v``'s base: below its architecture (what a Dockerfile can name), named by
    the base's OS (``base_os``, the ID+VERSION_ID of its /etc/os-release, as the in-image installer reads
    it; a stand-in base may differ from the manifest's)."""
    return dest / "debs" / v.arch / (base_os or v.release.os)


def sdist_dir(dest: Path) -> Path:
    return dest / "sdist"


def default_dest(v: ResolvedVariant) -> Path:
    return v.root / SOURCES_DIR


def standin_of(v: ResolvedVariant, name: str) -> dict | None:
    """The lock's record of the sdist standing in for git component ``name``, if any."""
    return v.lock.git.get(name, {}).get("standin")


# What each step of a rendered Dockerfile bind-mounts from the source cache (paths relative to it, the
# same inside the image under TARGET): only what that step reads, so that BuildKit, which keys a RUN on
# the content of what it mounts, keeps every layer a change elsewhere in the cache does not concern, and
# sends in the build context only the mounted paths.
TARGET = "/opt/rlbox/sources"


def deb_mount(v: ResolvedVariant) -> str | None:
    """The OS packages step of an apt base: ``debs/ARCH/``, the packages of every OS of the variant's
    architecture (a Dockerfile cannot name the base's own OS folder: a stand-in base may differ from
    the manifest's, and the BuildKit of Docker 20.10 expands no ARG in a mount's source), so that the
    packages of another platform never touch this step. None for dnf, which installs from the network."""
    return f"debs/{v.arch}" if v.package_manager == "apt" else None


def wheel_mount(v: ResolvedVariant) -> str:
    """The locked-files step: the wheels of the variant's platform and Python."""
    return f"wheels/{v.arch}-py{v.release.python}"


def component_mount(v: ResolvedVariant, c) -> str | None:
    """A git component's step: its stand-in sdist file, or its commit's bare repository; None for a pip pin."""
    if not c.spec.git:
        return None
    standin = standin_of(v, c.name)
    if standin:
        return f"sdist/{names.check(standin['file'], 'sdist', 'file')}"
    return f"git/{names.check(c.name, 'component', 'file')}-{checked_commit(c.spec.commit, c.name)}.git"


def mounts(v: ResolvedVariant) -> list[str]:
    """Every path of the cache the rendered Dockerfile of ``v`` bind-mounts, in step order."""
    found = [deb_mount(v), wheel_mount(v), *(component_mount(v, c) for c in v.components)]
    return [p for p in found if p]


def absent_mounts(v: ResolvedVariant, dest: Path | None = None) -> list[str]:
    """The mounted paths that do not exist (BuildKit would stop on the first: "not found")."""
    dest = dest or default_dest(v)
    return [p for p in mounts(v) if not (dest / p).exists()]


def make_placeholders(dest: Path, paths: list[str]) -> None:
    """Empty stand-ins in ``dest`` for absent mount sources of an online build, which downloads what
    they would hold: a folder, or an empty file for an sdist (the in-image scripts take only a
    non-empty one)."""
    for rel in paths:
        path = names.inside(dest, rel, what="mount source")
        if rel.startswith("sdist/"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.mkdir(parents=True, exist_ok=True)


def missing(v: ResolvedVariant, dest: Path | None = None, *, base_os: str | None = None) -> list[str]:
    """What an offline build of ``v`` would not find in the cache (paths relative to it)."""
    dest = dest or default_dest(v)
    out = []
    for c in v.components:
        if not c.spec.git:
            continue
        standin = standin_of(v, c.name)
        if standin:
            sdist = sdist_dir(dest) / standin["file"]
            if not sdist.is_file() or sdist.stat().st_size == 0:  # empty: an online build's placeholder
                out.append(f"sdist/{standin['file']}")
        elif not (git_dir(dest, c.name, c.spec.commit) / "HEAD").is_file():  # not an empty placeholder
            out.append(str(git_dir(dest, c.name, c.spec.commit).relative_to(dest)))
    wheels = wheel_dir(dest, v)
    absent = [p["file"] for p in v.lock.pip.values() if not (wheels / p["file"]).is_file()]
    if absent:
        out.append(f"{wheels.relative_to(dest)}/{absent[0]}" + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""))
    if v.package_manager == "apt" and not debs_hold(deb_dir(dest, v, base_os), v.system_packages):
        out.append(str(deb_dir(dest, v, base_os).relative_to(dest)))
    return out


DEBS_ASKED = "rlbox-asked"  # beside the .debs: the OS packages each fetch into this folder was asked for, one a line


def debs_asked(folder: Path) -> set[str]:
    """The OS packages the fetches into ``folder`` were asked for (none before the record existed)."""
    asked = folder / DEBS_ASKED
    return set(asked.read_text().split()) if asked.is_file() else set()


def debs_hold(folder: Path, packages) -> bool:
    """Whether the OS packages folder was filled for every one of ``packages`` (a folder several releases
    share: one release's packages are not another's; a folder from before the record is taken as not)."""
    asked = debs_asked(folder)
    return (folder / "Packages").is_file() and bool(asked) and set(packages) <= asked


@dataclass
class Fetched:
    git: list[str]
    wheels: int
    debs: int


def _run(argv, what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RlboxError(f"fetch-sources: {what} failed: {last_line(proc.stderr or proc.stdout)}")
    return proc


def fetch(v: ResolvedVariant, dest: Path | None = None, *, profile: Profile | None = None,
          ca_bundle: Path | None = None, base_image: str | None = None, base_os: str | None = None,
          echo=None) -> Fetched:
    echo = echo or (lambda line: None)
    dest = (dest or default_dest(v)).resolve()
    if v.lock.state != "fresh":
        raise RlboxError(f"{v.lock.path}: {v.ref} is {v.lock.state}: run `rlbox lock {v.release.release}` first "
                         "(the cache holds exactly the locked files)")
    if v.lock.pip == {} and (v.lock.entry or {}).get("pip", {}).get("note"):
        raise RlboxError(f"{v.lock.path}: {v.ref} has no locked wheels ({v.lock.entry['pip']['note']})")
    git = []
    for c in v.components:
        if not c.spec.git:
            continue
        standin = standin_of(v, c.name)
        if standin:
            git.append(download(standin["url"], standin["sha256"], names.inside(sdist_dir(dest), standin["file"], what="sdist"),
                                ca_bundle=ca_bundle).name)
        else:
            git.append(fetch_git(c, c.spec.commit, dest, profile=profile, echo=echo).name)
    wheels = fetch_locked(v, dest, ca_bundle, echo)
    debs = _fetch_debs(v, dest, profile, base_image, base_os, echo) if v.package_manager == "apt" else 0
    return Fetched(git, wheels, debs)


def _git_env(profile: Profile | None) -> dict[str, str]:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    if profile and profile.git_mirror:
        env.update(GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0=f"url.{profile.git_mirror.rstrip('/')}/.insteadOf",
                   GIT_CONFIG_VALUE_0="https://github.com/")
    return env


def fetch_git(c, commit: str, dest: Path, *, history: bool = False, profile: Profile | None = None, echo=None) -> Path:
    """``dest/git/NAME-COMMIT.git``: a bare repository holding ``commit`` as ``refs/rlbox/pin``;
    with ``history`` its tags and their history too (what ``git describe`` needs)."""
    echo = echo or (lambda line: None)
    target = git_dir(dest, c.name, commit)
    if target.is_dir():
        echo(f"git {c.name}@{commit[:12]}: cached")
        return target
    echo(f"git {c.name}@{commit[:12]} from {redact_url(c.spec.git)}")
    env = _git_env(profile)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".fetching-{c.name}-", dir=dest) as tmp:
        repo = Path(tmp) / target.name
        _run(["git", "init", "-q", "--bare", repo], f"git init for {c.name}")
        # --end-of-options: the URL and commit are never read as options, whatever they hold
        depth = (["--end-of-options", c.spec.git, "+refs/tags/*:refs/tags/*", commit] if history
                 else ["--depth", "1", "--end-of-options", c.spec.git, commit])
        fetched = subprocess.run(["git", "-C", repo, "fetch", "-q", *depth], capture_output=True, text=True, env=env)
        if fetched.returncode != 0:  # servers that refuse a fetch by commit: the ref, then everything
            refs = [f"+refs/tags/{c.spec.ref}:refs/tags/{c.spec.ref}"] if c.spec.ref else []
            _run(["git", "-C", repo, "fetch", "-q", "--end-of-options", c.spec.git, *(refs or ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"])],
                 f"git fetch of {c.name} from {redact_url(c.spec.git)}", env=env)
        _run(["git", "-C", repo, "update-ref", "refs/rlbox/pin", commit],
             f"{c.name}: commit {commit} is not in {redact_url(c.spec.git)}; the pin")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(repo, target)
    return target


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def content_mtime(sha: str) -> int:
    """The mtime (ns since the epoch, 1970-2038) of a source-cache file whose sha256 is ``sha``: made from
    its content, so that checkouts which downloaded the same file apart give BuildKit, which diffs a build
    context by stat (rlbox.image.context), the same stat, and a changed file a new one."""
    return (int(sha[:8], 16) % (1 << 31)) * 1_000_000_000 + int(sha[8:16], 16) % 1_000_000_000


def stamp(path: Path, sha: str) -> Path:
    """``path`` (whose sha256 is ``sha``) with its content's mtime."""
    when = content_mtime(sha)
    if path.stat().st_mtime_ns != when:
        os.utime(path, ns=(when, when))
    return path


def download(url: str, want: str, target: Path, *, ca_bundle: Path | None = None) -> Path:
    """``url`` into ``target``, kept only if its sha256 is ``want`` (64 hex digits: there is no
    download without a hash to check); a present good file is kept. Either way the file gets
    its content's mtime (``content_mtime``)."""
    import requests

    if not isinstance(want, str) or not HEX64.fullmatch(want):
        raise RlboxError(f"fetch-sources: {target.name}: sha256 {str(want)[:70]!r} is not 64 hex digits; "
                         "nothing is downloaded without a hash to check")
    if target.is_file() and sha256(target) == want:
        return stamp(target, want)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        with requests.get(url, stream=True, timeout=60, verify=str(ca_bundle) if ca_bundle else True) as r:
            r.raise_for_status()
            with open(part, "wb") as f:
                for chunk in r.iter_content(1 << 20):
                    f.write(chunk)
    except requests.RequestException as err:
        part.unlink(missing_ok=True)
        raise RlboxError(f"fetch-sources: cannot download {redact_url(url)}: "
                         f"{str(err).replace(url, redact_url(url))[:160]}") from None
    got = sha256(part)
    if got != want:
        part.unlink()
        raise RlboxError(f"fetch-sources: {target.name}: sha256 {got} is not the locked {want}; the index changed the file")
    os.replace(stamp(part, want), target)
    return target


def index_files(index: str, name: str, *, ca_bundle: Path | None = None) -> list[dict]:
    """Every file a PEP 691 (JSON simple API) index lists for project ``name``: filename, url,
    hashes (entries of another shape left out). PyPI answers it; `pip download` cannot fetch an
    sdist whose metadata needs torch. The answer is read within rlbox.core.answers' bounds."""
    import requests

    from rlbox.core import answers

    url = f"{index.rstrip('/')}/{canonical(name)}/"
    try:
        r = answers.fetch(url, verify=str(ca_bundle) if ca_bundle else True,
                          headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        r.raise_for_status()
        data = answers.json_of(r, redact_url(url))
    except requests.RequestException as err:
        raise RlboxError(f"cannot list {name} on {redact_url(index)}: {str(err).replace(url, redact_url(url))[:160]}") from None
    except RlboxError as err:
        raise RlboxError(f"cannot list {name}: {err}") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise RlboxError(f"cannot list {name}: {redact_url(url)} has no file list (not a PEP 691 index?)")
    return [f for f in files if isinstance(f, dict) and isinstance(f.get("filename"), str)
            and isinstance(f.get("url"), str) and isinstance(f.get("hashes"), dict)]


def fetch_sdist(spec: str, dest: Path, *, ca_bundle: Path | None = None, sha: str | None = None) -> tuple[Path, str]:
    """The PyPI sdist of ``name==version`` in ``dest/sdist/``, and its URL."""
    name, version = spec.split("==", 1)
    norm = name.lower().replace("_", "-")
    files = index_files("https://pypi.org/simple", name, ca_bundle=ca_bundle)
    stems = {f"{n}-{version}" for n in (name, norm, norm.replace("-", "_"))}
    for f in files:
        fn = f["filename"]
        if fn.endswith(".tar.gz") and fn[: -len(".tar.gz")] in stems:
            url = f["url"].split("#", 1)[0]
            return download(url, sha or f["hashes"].get("sha256"), names.inside(sdist_dir(dest), fn, what="sdist"),
                            ca_bundle=ca_bundle), url
    raise RlboxError(f"fetch-sources: PyPI has no sdist of {spec}")


def fetch_locked(v: ResolvedVariant, dest: Path, ca_bundle: Path | None, echo) -> int:
    """Every file of the lock for ``v`` (wheels, and the sdists the manifest allows)."""
    target = wheel_dir(dest, v)
    pkgs = v.lock.pip
    echo(f"wheels: {len(pkgs)} locked files for {v.platform}, Python {v.release.python} -> {target}")
    for name, p in pkgs.items():
        download(p["url"], p["sha256"], names.inside(target, p["file"], what=f"lock file of {name}"), ca_bundle=ca_bundle)
    return len(pkgs)


def _fetch_debs(v: ResolvedVariant, dest: Path, profile: Profile | None, base_image: str | None,
                base_os: str | None, echo) -> int:
    target = deb_dir(dest, v, base_os)
    target.mkdir(parents=True, exist_ok=True)
    image = base_image or (profile.image(v.locked_base_image) if profile else v.locked_base_image)
    echo(f"debs: {len(v.system_packages)} OS packages and their dependencies, downloaded in {image}")
    files = v.root / "templates" / "files"
    argv = ["docker", "run", "--rm", "--platform", v.platform, "--entrypoint", "bash",
            "-v", f"{files}:/opt/rlbox/lib:ro", "-v", f"{target}:/out"]
    apt = profile.apt_for(base_os or v.release.os, v.arch) if profile else None
    if apt:
        argv += ["-e", f"APT_MIRROR={apt}"]
    wanted = sorted(debs_asked(target) | set(v.system_packages))  # with earlier fetches': the Packages index is remade
    argv += [image, "/opt/rlbox/lib/rlbox-system-packages", "apt", "--download-to", "/out", *wanted]
    _run(argv, f"downloading OS packages in a container of {image}")
    (target / DEBS_ASKED).write_text("".join(f"{name}\n" for name in wanted))
    for path in target.iterdir():  # their content's mtime, as a download's (apt's own would differ per fetch)
        if path.is_file() and not path.is_symlink():
            stamp(path, sha256(path))
    return len(list(target.glob("*.deb")))
