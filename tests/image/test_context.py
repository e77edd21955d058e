"""The staged build context (rlbox.image.context): what it holds, an exact mirror of the checkout's
inputs, hard-linked (or copied with its mtime), its lock; and the content mtime of fetched files."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import threading
from pathlib import Path

import pytest

from rlbox.core.errors import RlboxError
from rlbox.image import build, context, sources


def test_the_directory_depends_on_release_and_platform_only(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBOX_CACHE", str(tmp_path))
    assert context.directory("verl_pt210_cann910", "linux/amd64") == tmp_path / "context" / "verl_pt210_cann910-linux-amd64"
    assert context.directory("r", "linux/arm64", tmp_path / "b") == tmp_path / "b" / "r-linux-arm64"
    for bad in ("../up", "a/b", ".hidden"):
        with pytest.raises(RlboxError, match="not a name"):
            context.directory(bad, "linux/amd64", tmp_path)


def test_inputs_are_what_the_dockerfile_reads(m):
    v = m.get("verl_pt210_cann910:ax-x86")
    assert context.inputs(v) == (".dockerignore", "templates/files", "dockerfiles/verl_pt210_cann910/ax-x86",
                                 ".rlbox-sources/debs/x86_64", ".rlbox-sources/wheels/x86_64-py3.12",
                                 ".rlbox-sources/sdist/vllm-0.23.0.tar.gz",
                                 ".rlbox-sources/sdist/vllm_ascend-0.23.0.post1.tar.gz")
    patched = next(v for v in m.variants if v.patches)
    staged = context.inputs(patched)
    assert {f"patches/{p.component}/{p.name}" for p in patched.patches} <= set(staged)
    assert "patches" not in staged  # the variant's own patch files, not every release's
    # every path the rendered Dockerfile copies or mounts is staged (and nothing needs the rest of the tree)
    text = (v.root / v.dockerfile).read_text()
    read = set(re.findall(r"source=(\.rlbox-sources/[^,]+)", text))
    read |= {w for line in re.findall(r"^COPY ((?:.*\\\n)*.*)$", text, re.M) for w in line.replace("\\\n", " ").split()[:-1]}
    assert all(any(r == s or r.startswith(s + "/") for s in context.inputs(v)) for r in read), read


def test_the_plan_builds_from_the_staged_directory(m, tmp_path):
    v = m.get("verl_pt210_cann910:ax-x86")
    p = build.plan(v, context_base=tmp_path)
    assert p.argv[-1] == str(tmp_path / "verl_pt210_cann910-linux-amd64") == str(p.context)
    assert p.root == v.root and p.stage == context.inputs(v)
    assert p.as_dict()["stage"] == list(p.stage) and p.as_dict()["root"] == str(v.root)
    assert not p.context.exists()  # planning stages nothing


def checkout(root: Path) -> Path:
    (root / "templates" / "files").mkdir(parents=True)
    (root / "templates" / "files" / "tool").write_text("#!/bin/sh\n")
    (root / "templates" / "Dockerfile.j2").write_text("not an input\n")
    (root / "dockerfiles" / "r" / "v").mkdir(parents=True)
    (root / "dockerfiles" / "r" / "v" / "Dockerfile").write_text("FROM scratch\n")
    (root / "dockerfiles" / "other" / "v").mkdir(parents=True)
    (root / "dockerfiles" / "other" / "v" / "Dockerfile").write_text("FROM other\n")
    wheels = root / ".rlbox-sources" / "wheels" / "x86_64-py3.12"
    wheels.mkdir(parents=True)
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"a" * 1000)
    (root / ".rlbox-sources" / "wheels" / "aarch64-py3.12").mkdir()
    (root / ".rlbox-sources" / "wheels" / "aarch64-py3.12" / "b.whl").write_bytes(b"b")
    (root / ".dockerignore").write_text("*\n")
    return root


INPUTS = (".dockerignore", "templates/files", "dockerfiles/r/v", ".rlbox-sources/wheels/x86_64-py3.12")


def tree_of(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_staging_hard_links_exactly_the_inputs(tmp_path):
    src, dest = checkout(tmp_path / "src"), tmp_path / "ctx"
    said = context.stage(src, INPUTS, dest)
    assert tree_of(dest) == {".dockerignore", "templates", "templates/files", "templates/files/tool", "dockerfiles",
                             "dockerfiles/r", "dockerfiles/r/v", "dockerfiles/r/v/Dockerfile", ".rlbox-sources",
                             ".rlbox-sources/wheels", ".rlbox-sources/wheels/x86_64-py3.12",
                             ".rlbox-sources/wheels/x86_64-py3.12/a-1.0-py3-none-any.whl"}
    wheel = ".rlbox-sources/wheels/x86_64-py3.12/a-1.0-py3-none-any.whl"
    assert (dest / wheel).samefile(src / wheel)  # a hard link: the same stat, nothing copied
    assert said == context.Staged(linked=4, copied=0, kept=0, removed=0)
    assert context.stage(src, INPUTS, dest) == context.Staged(kept=4)  # again: nothing to do


def test_a_new_checkout_stages_into_the_same_directory_and_the_mirror_stays_exact(tmp_path):
    a, dest = checkout(tmp_path / "a"), tmp_path / "ctx"
    context.stage(a, INPUTS, dest)
    (dest / "stray").write_text("left by hand")
    b = checkout(tmp_path / "b")
    (b / "templates" / "files" / "tool").write_text("#!/bin/sh\necho changed\n")  # changed
    (b / "dockerfiles" / "r" / "v" / "Dockerfile").unlink()  # gone from the checkout
    (b / "dockerfiles" / "r" / "v" / "Dockerfile").mkdir()  # ... and now a folder
    os.unlink(b / ".rlbox-sources" / "wheels" / "x86_64-py3.12" / "a-1.0-py3-none-any.whl")
    os.link(a / ".rlbox-sources" / "wheels" / "x86_64-py3.12" / "a-1.0-py3-none-any.whl",
            b / ".rlbox-sources" / "wheels" / "x86_64-py3.12" / "a-1.0-py3-none-any.whl")  # the same file (cp -al)
    said = context.stage(b, INPUTS, dest)
    assert not (dest / "stray").exists() and (dest / "dockerfiles" / "r" / "v" / "Dockerfile").is_dir()
    assert (dest / "templates" / "files" / "tool").read_text().endswith("changed\n")
    assert (dest / "templates" / "files" / "tool").samefile(b / "templates" / "files" / "tool")
    # kept: the wheel (the same inode); linked anew: the changed tool and b's own .dockerignore; removed: the
    # stray file and the Dockerfile that became a folder
    assert said.kept == 1 and said.linked == 2 and said.removed == 2
    # a file replaced in the checkout (a new download: os.replace) is relinked, not left pointing at the old one
    wheel = b / ".rlbox-sources" / "wheels" / "x86_64-py3.12" / "a-1.0-py3-none-any.whl"
    new = wheel.with_name("new")
    new.write_bytes(b"n" * 1000)
    os.replace(new, wheel)
    context.stage(b, INPUTS, dest)
    assert (dest / ".rlbox-sources" / "wheels" / "x86_64-py3.12" / "a-1.0-py3-none-any.whl").read_bytes() == b"n" * 1000
    # an input that disappears takes its staged copy with it
    (b / ".dockerignore").unlink()
    context.stage(b, INPUTS, dest)
    assert not (dest / ".dockerignore").exists()


def test_across_filesystems_staging_copies_with_the_mtime_once(tmp_path, monkeypatch):
    src, dest = checkout(tmp_path / "src"), tmp_path / "ctx"

    def cross_device(a, b, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    first = context.stage(src, INPUTS, dest)
    assert first.copied == 4 and first.linked == 0 and first.copied_bytes == 1000 + 10 + 13 + 2
    tool = "templates/files/tool"
    assert (dest / tool).stat().st_mtime_ns == (src / tool).stat().st_mtime_ns
    assert not (dest / tool).samefile(src / tool)
    assert context.stage(src, INPUTS, dest).kept == 4  # same size, mtime and mode: kept
    (src / tool).write_text("#!/bin/sh\nexit 1\n")  # edited in place
    os.utime(src / tool, ns=(1, 1))
    again = context.stage(src, INPUTS, dest)
    assert again.copied == 1 and (dest / tool).read_text().endswith("exit 1\n")


def test_an_input_path_stays_below_the_checkout(tmp_path):
    for bad in ("../x", "/etc", "a/../../x", ""):
        with pytest.raises(RlboxError, match="give a path below the checkout"):
            context.stage(tmp_path, [bad], tmp_path / "ctx")


def test_the_lock_is_held_for_the_block_and_a_second_build_waits_told_why(tmp_path):
    dest = tmp_path / "ctx"
    lock = tmp_path / "ctx.lock"
    with context.held(dest):
        with open(lock) as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    said = []
    with open(tmp_path / "ctx.lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        done = threading.Event()

        def second():
            with context.held(dest, said.append):
                done.set()

        t = threading.Thread(target=second)
        t.start()
        assert not done.wait(0.5)  # waits while the first holds it
        fcntl.flock(other, fcntl.LOCK_UN)
        t.join(5)
    assert done.is_set() and said == [f"rlbox: another build is using the build context {dest}: waiting for it"]


def test_a_fetched_file_gets_its_contents_mtime(tmp_path, monkeypatch):
    import requests

    body = {"x": b"one file", "y": b"another file"}

    class Answer:
        def __init__(self, url, **kw):
            self.data = body[url.rsplit("/", 1)[1]]

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def raise_for_status(self):
            pass

        def iter_content(self, size):
            yield self.data

    monkeypatch.setattr(requests, "get", Answer)
    sha = {k: hashlib.sha256(v).hexdigest() for k, v in body.items()}
    a = sources.download("https://example.invalid/x", sha["x"], tmp_path / "a" / "x.whl")
    b = sources.download("https://example.invalid/x", sha["x"], tmp_path / "b" / "x.whl")  # another checkout
    assert a.stat().st_mtime_ns == b.stat().st_mtime_ns == sources.content_mtime(sha["x"])
    y = sources.download("https://example.invalid/y", sha["y"], tmp_path / "c" / "x.whl")
    assert y.stat().st_mtime_ns != a.stat().st_mtime_ns  # other content, another mtime
    os.utime(a, ns=(5, 5))  # a file already present (fetched before mtimes were made so) gets it too
    assert sources.download("https://example.invalid/x", sha["x"], a).stat().st_mtime_ns == sources.content_mtime(sha["x"])
    assert 0 <= sources.content_mtime(sha["x"]) < (1 << 31) * 10**9
