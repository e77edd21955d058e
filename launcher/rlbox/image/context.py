"""The build context: one stable directory per release and platform, staged before each build.

BuildKit (buildx) keys its incremental sync of a local build context by the context directory's
path, and diffs what it holds against it by each file's stat (size, mtime, mode, owner), never by
content: the same 4 GB of wheels in a new checkout's directory travel again, the same directory a
second time sends a few bytes. Named build contexts, which would let the source cache travel by
itself, need a BuildKit newer than the Docker 20.10 engine we support ("unsupported frontend
capability moby.buildkit.frontend.contexts"). So the context of every build is one directory that
does not depend on where the checkout is: ``rlbox.core.paths.cache_dir()/context/RELEASE-PLATFORM``
(``verl_pt210_cann910-linux-amd64``), which the executor stages from the checkout just before the
build (``stage``), holding the directory's lock for the stage and the build (``held``), so that two
builds of one release and platform never share it at once.

Staging mirrors exactly what the Dockerfile may read (``inputs``): ``.dockerignore``,
``templates/files``, the variant's own patch files, its folder under ``dockerfiles/`` and the
source-cache paths its steps mount (``sources.mounts``); anything else in the directory is
removed, so a file the checkout no longer has never reaches a build. Files are hard-linked
(instant, and the same stat as the checkout's: BuildKit sends nothing it already holds), or, on
another filesystem, copied with their mtime (once: a copy whose size, mtime and mode match is kept).
A source-cache file fetched by ``rlbox fetch-sources`` has an mtime made from its sha256
(``sources.download``), so two checkouts that downloaded it apart still have the same stat.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rlbox.core import names, once, paths
from rlbox.core.errors import RlboxError
from rlbox.image import sources
from rlbox.image.matrix import ResolvedVariant
from rlbox.image.mirrors import SOURCES_DIR

DIR = "context"  # below rlbox.core.paths.cache_dir()


def directory(release: str, platform: str, base: Path | None = None) -> Path:
    """The staged context of ``release`` for ``platform`` (``linux/amd64``): ``BASE/RELEASE-linux-amd64``,
    BASE defaulting to ``cache_dir()/context``. The name stays inside BASE."""
    if base is None:
        try:
            base = paths.cache_dir() / DIR
        except OSError as err:
            raise RlboxError(f"no place for the build context: {err}; set RLBOX_CACHE") from None
    slug = names.check(f"{release}-{platform.replace('/', '-')}", "release and platform", "file")
    return names.inside(base, slug, what="build context")


def inputs(v: ResolvedVariant) -> tuple[str, ...]:
    """What the rendered Dockerfile of ``v`` may read from its context (paths relative to the checkout):
    what every Dockerfile copies, its own patches and folder, and the source-cache paths it mounts."""
    found = [".dockerignore", "templates/files"]
    found += [f"patches/{p.component}/{p.name}" for p in v.patches]
    found.append(PurePosixPath(v.dockerfile).parent.as_posix())
    found += [f"{SOURCES_DIR}/{p}" for p in sources.mounts(v)]
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Staged:
    linked: int = 0
    copied: int = 0
    kept: int = 0
    removed: int = 0
    copied_bytes: int = 0

    def line(self) -> str:
        said = f"{self.linked} linked, {self.copied} copied ({self.copied_bytes / 1e6:.1f} MB), {self.kept} kept"
        return said + (f", {self.removed} removed" if self.removed else "")


def relative(rel: str) -> PurePosixPath:
    """``rel`` as a path below a root: relative, no ``..`` (checked by its words: the source cache may be a
    symbolic link to another disk, which resolving would take for a way out)."""
    path = PurePosixPath(rel)
    if path.is_absolute() or not path.parts or any(part in ("", ".", "..") for part in path.parts):
        raise RlboxError(f"build context input {rel!r}: give a path below the checkout")
    return path


def wanted(root: Path, rels) -> dict[str, tuple[str, Path]]:
    """Every entry the context must hold, by path relative to it: ('dir'|'file'|'link', its source)."""
    out: dict[str, tuple[str, Path]] = {}
    for rel in rels:
        path = relative(rel)
        src = root.joinpath(*path.parts)
        for i in range(1, len(path.parts)):
            out.setdefault(PurePosixPath(*path.parts[:i]).as_posix(), ("dir", root.joinpath(*path.parts[:i])))
        if src.is_dir():  # followed if a symbolic link (a source cache on another disk): BuildKit reads what it leads to
            out[path.as_posix()] = ("dir", src)
            for top, dirs, files in os.walk(src):
                here = PurePosixPath(path, Path(top).relative_to(src).as_posix())
                for name in dirs + files:
                    entry = Path(top) / name
                    kind = "link" if entry.is_symlink() else "dir" if entry.is_dir() else "file"
                    out[(here / name).as_posix()] = (kind, entry)
        elif src.is_file():
            out[path.as_posix()] = ("file", src)
        # absent (a .dockerignore the tree lacks): the Dockerfile cannot read it either
    return out


def kind_of(st: os.stat_result) -> str:
    return "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"


def same_file(src: os.stat_result, dst: os.stat_result) -> bool:
    """``dst`` stands for ``src`` in the context: the same inode, or a copy with its size, mtime and mode."""
    if (src.st_dev, src.st_ino) == (dst.st_dev, dst.st_ino):
        return True
    return (src.st_size, src.st_mtime_ns, stat.S_IMODE(src.st_mode)) == \
        (dst.st_size, dst.st_mtime_ns, stat.S_IMODE(dst.st_mode))


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def stage(root: Path, rels, dest: Path) -> Staged:
    """Make ``dest`` an exact mirror of ``rels`` under ``root`` (see the module's docstring)."""
    want = wanted(root, rels)
    dest.mkdir(parents=True, exist_ok=True)
    removed = 0
    for top, dirs, files in os.walk(dest, topdown=False):  # what the checkout no longer has, or has as another kind
        for name in dirs + files:
            entry = Path(top) / name
            rel = entry.relative_to(dest).as_posix()
            if rel not in want or want[rel][0] != kind_of(entry.lstat()):
                if entry.exists() or entry.is_symlink():
                    remove(entry)
                    removed += 1
    counts = {"linked": 0, "copied": 0, "kept": 0, "copied_bytes": 0}
    for rel, (kind, src) in sorted(want.items()):  # parents before children
        target = dest.joinpath(*PurePosixPath(rel).parts)
        if kind == "dir":
            target.mkdir(exist_ok=True)
            mode = stat.S_IMODE(src.stat().st_mode)
            if stat.S_IMODE(target.stat().st_mode) != mode:
                target.chmod(mode)
            continue
        if kind == "link":
            link = os.readlink(src)
            if target.is_symlink() and os.readlink(target) == link:
                counts["kept"] += 1
                continue
            target.unlink(missing_ok=True)
            os.symlink(link, target)
            counts["linked"] += 1
            continue
        src_st = src.stat()
        if target.exists() and same_file(src_st, target.lstat()):
            counts["kept"] += 1
            continue
        target.unlink(missing_ok=True)
        try:
            os.link(src, target)
            counts["linked"] += 1
        except OSError as err:
            if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            shutil.copy2(src, target)  # another filesystem: a copy with the source's mtime and mode
            counts["copied"] += 1
            counts["copied_bytes"] += src_st.st_size
    return Staged(removed=removed, **counts)


def held(dest: Path, echo=None):
    """The lock of ``dest`` (``DEST.lock`` beside it, rlbox.core.once.locked) for as long as the block
    runs: one build of a release and platform at a time stages and reads it; another waits, told why."""
    def waiting() -> None:
        if echo is not None:
            echo(f"rlbox: another build is using the build context {dest}: waiting for it")

    return once.locked(dest.with_name(dest.name + ".lock"), waiting)
