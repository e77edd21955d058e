"""The staged build context on a real engine: the first build of a second checkout sends next to nothing
(BuildKit already holds the staged directory's files, by stat), and a changed file is sent and used."""

from __future__ import annotations

import hashlib
import os
import platform as host
import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from rlbox.image import build, sources

pytestmark = pytest.mark.engine

PLATFORM = "linux/arm64" if host.machine() in ("aarch64", "arm64") else "linux/amd64"
WHEELS = "wheels/x86_64-py3.12"
STAGE = (".dockerignore", "templates/files", "dockerfiles/tiny/v", f".rlbox-sources/{WHEELS}")
DOCKERFILE = f"""\
FROM rlbox/debian:bookworm AS work
COPY templates/files/tool /tool
RUN --mount=type=bind,source=.rlbox-sources/{WHEELS},target=/w sha256sum /w/big.whl > /sum && cp /tool /tool.out
FROM scratch
COPY --from=work /sum /tool.out /
"""
CONTEXT = re.compile(r"^#\d+ transferring context: ([\d.]+)([kMG]?B) .*done")
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def checkout(root: Path, big: bytes, tool: str = "v1\n") -> Path:
    """A checkout with what the tiny Dockerfile reads, and a cache path it does not: each file written anew
    (a new inode, a new mtime), the cache's as `rlbox fetch-sources` leaves it (its content's mtime)."""
    root.mkdir(parents=True)
    shutil.copy(REPO / ".dockerignore", root / ".dockerignore")
    (root / "templates" / "files").mkdir(parents=True)
    (root / "templates" / "files" / "tool").write_text(tool)
    (root / "dockerfiles" / "tiny" / "v").mkdir(parents=True)
    (root / "dockerfiles" / "tiny" / "v" / "Dockerfile").write_text(DOCKERFILE)
    write_wheel(root, big)
    other = root / ".rlbox-sources" / "wheels" / "other-py3.12"
    other.mkdir(parents=True)
    (other / "unread.whl").write_bytes(os.urandom(4 << 20))
    return root


def write_wheel(root: Path, big: bytes) -> None:
    folder = root / ".rlbox-sources" / WHEELS
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / "big.whl.part"
    part.write_bytes(big)
    os.replace(sources.stamp(part, hashlib.sha256(big).hexdigest()), folder / "big.whl")


def build_from(root: Path, base: Path, out: Path) -> tuple[float, str, str]:
    """`build.execute` of the tiny Dockerfile in ``root`` (its context staged under ``base``): context bytes
    sent, and the two files the image holds (the wheel's sha256 as the build read it, the tool)."""
    dockerfile = root / "dockerfiles" / "tiny" / "v" / "Dockerfile"
    staged = base / f"tiny-{PLATFORM.replace('/', '-')}"
    argv = ("docker", "buildx", "build", "--progress", "plain", "--platform", PLATFORM, "--file", str(dockerfile),
            "--output", f"type=local,dest={out}", str(staged))
    plan = build.BuildPlan("tiny:v", argv, dockerfile, staged, PLATFORM, (), False, output="local",
                           mounts=(WHEELS,), root=root, stage=STAGE)
    log: list[str] = []
    build.execute(plan, echo=log.append)
    sent = sum(float(m.group(1)) * UNITS[m.group(2)] for m in map(CONTEXT.match, log) if m)
    return sent, (out / "sum").read_text().split()[0], (out / "tool.out").read_text()


def test_a_second_checkout_sends_next_to_nothing_and_a_changed_file_is_sent_and_used(engine, tmp_path):
    big = os.urandom(20 << 20)
    base = tmp_path / "cache" / "context"
    a = checkout(tmp_path / "a", big)
    sent, sha, tool = build_from(a, base, tmp_path / "out-a")
    assert sent > 20e6 and sha == hashlib.sha256(big).hexdigest() and tool == "v1\n"  # the first: all of it
    assert sent < 24e6  # not the unread 4 MB
    # another checkout, every file written anew: its first build sends next to nothing
    b = checkout(tmp_path / "b", big)
    sent, sha, tool = build_from(b, base, tmp_path / "out-b")
    assert sent < 100e3, f"{sent / 1e6:.1f} MB sent for a second checkout"
    assert sha == hashlib.sha256(big).hexdigest() and tool == "v1\n"
    # a changed wheel (same size, new content and so new mtime) and a changed tool: sent, and what the build uses
    changed = os.urandom(20 << 20)
    write_wheel(b, changed)
    (b / "templates" / "files" / "tool").write_text("v2\n")
    sent, sha, tool = build_from(b, base, tmp_path / "out-c")
    assert sent > 20e6 and sha == hashlib.sha256(changed).hexdigest() and tool == "v2\n"
