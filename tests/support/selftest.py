"""The self-test image: built through the real templates, render and build code on a local base.

The CANN bases cannot be pulled here, so the self-test release builds on a Debian bookworm made
by debootstrap (tools/make-base-image.sh) plus stand-in CANN ``set_env.sh`` scripts
(tests/fixtures/cann-sim). Its components are a real PyPI pin (through the CA secret) and a
fixture git repository at a pinned commit, served by ``git daemon`` on loopback, with a real
patch series. Used by the engine tests and by bench/build_cache.py.
"""

from __future__ import annotations

import platform as _platform
import shutil
import socket
import subprocess
import json
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
BASE_IMAGE = "rlbox/debian:bookworm"
CANN_SIM_IMAGE = "rlbox-test/cann-sim:bookworm"
HARDWARE = "a2" if _platform.machine() in ("aarch64", "arm64") else "ax"
VARIANT = "a2-arm" if HARDWARE == "a2" else "ax-x86"
REF = f"selftest:{VARIANT}"
IMAGE = f"localhost/rlbox-test/selftest:{VARIANT}"


def run(*argv, check=True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], check=check, text=True, capture_output=True, **kw)


def ensure_base_images() -> None:
    """The debootstrapped base and the simulated-CANN layer on it (no registry needed)."""
    run("bash", REPO / "tools" / "make-base-image.sh", BASE_IMAGE)
    if run("docker", "image", "inspect", CANN_SIM_IMAGE, check=False).returncode != 0:
        run("docker", "buildx", "build", "--load", "--tag", CANN_SIM_IMAGE,
            "--build-arg", f"BASE={BASE_IMAGE}", FIXTURES / "cann-sim")


# ---------------------------------------------------------------------------------------------
@dataclass
class FixtureRepo:
    """A small Python package in a git repository with a tagged commit and patches made from it."""

    path: Path
    commit: str = ""
    dependencies: tuple[str, ...] = ("idna>=3",)

    def create(self) -> "FixtureRepo":
        pkg = self.path / "rlbox_fixture"
        pkg.mkdir(parents=True)
        (self.path / "pyproject.toml").write_text(textwrap.dedent("""\
            [build-system]
            requires = ["setuptools>=61"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "rlbox-fixture"
            version = "1.0.0"
            dependencies = {deps}

            [tool.setuptools]
            packages = ["rlbox_fixture"]
        """).replace("{deps}", json.dumps(list(self.dependencies))))
        (pkg / "__init__.py").write_text(textwrap.dedent("""\
            GREETING = "upstream"


            def features():
                return []
        """))
        git = ["git", "-C", self.path, "-c", "user.name=rlbox", "-c", "user.email=rlbox@localhost"]
        run("git", "init", "-q", "-b", "main", self.path)
        run(*git, "add", "-A")
        run(*git, "commit", "-q", "-m", "fixture 1.0.0")
        run(*git, "tag", "v1.0.0")
        run("git", "-C", self.path, "config", "uploadpack.allowAnySHA1InWant", "true")
        self.commit = run("git", "-C", self.path, "rev-parse", "HEAD").stdout.strip()
        # A later commit on main, so the pinned one is not simply the tip.
        (self.path / "CHANGELOG").write_text("1.1.0: later work\n")
        run(*git, "add", "-A")
        run(*git, "commit", "-q", "-m", "fixture 1.1.0")
        return self

    def patch(self, old: str, new: str, subject: str) -> str:
        """A unified diff against the pinned commit replacing ``old`` by ``new`` in __init__.py."""
        rel = "rlbox_fixture/__init__.py"
        original = run("git", "-C", self.path, "show", f"{self.commit}:{rel}").stdout
        if old not in original:
            raise ValueError(f"{old!r} not in fixture source")
        tmp = self.path.parent / "patch-work"
        if tmp.exists():
            shutil.rmtree(tmp)
        run("git", "clone", "-q", self.path, tmp)
        run("git", "-C", tmp, "checkout", "-q", self.commit)
        (tmp / rel).write_text(original.replace(old, new))
        diff = run("git", "-C", tmp, "diff").stdout
        shutil.rmtree(tmp)
        return f"Subject: {subject}\n\n{diff}"


class GitDaemon:
    """`git daemon` serving a directory on 127.0.0.1 (the build reaches it with --network host)."""

    def __init__(self, base: Path):
        self.base = base
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = None

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> "GitDaemon":
        self.proc = subprocess.Popen(
            ["git", "daemon", "--reuseaddr", "--export-all", "--listen=127.0.0.1", f"--port={self.port}",
             f"--base-path={self.base}", str(self.base)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("git daemon did not start")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------
PATCH_GREETING = ('GREETING = "upstream"', 'GREETING = "patched by rlbox"', "fixture: greet from rlbox")
PATCH_FEATURE = ("    return []", '    return ["npu"]', "fixture: report the npu feature")


def manifest(git_url: str, commit: str, patches: list[str]) -> dict:
    return {
        "release": "selftest",
        "description": "rlbox self-test image: simulated CANN on Debian bookworm",
        "sources": ["tests/selftest.py"],
        "image": {"registry": "localhost/rlbox-test", "name": "selftest"},
        "base": {"image": "rlbox-test/cann-sim", "tag": "bookworm"},
        "os": "debian12",
        "python": "3.11",
        "cann": {
            "version": "8.3.RC1",
            "env_scripts": ["/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh"],
            "python_packages": ["decorator"],
        },
        "driver": {"min": "25.3.RC1"},
        "system_packages": {"apt": ["git", "patch", "iproute2", "procps"]},
        "user": {"name": "rlbox", "uid": 1001},
        "env": {"HF_ENDPOINT": "https://huggingface.co", "RLBOX_SELFTEST": "1"},
        "components": {
            "six": {"pip": "six==1.17.0"},
            # verl's pure-Python wheel without its dependencies: enough for `rlbox validate`
            # to extract the config tree of the verl inside an image.
            "verl": {"pip": "verl==0.5.0", "pip_args": ["--no-deps"]},
            # pinned by tag and short SHA, as upstream docs give it: `rlbox lock` resolves the commit
            "fixture": {"git": git_url, "commit": commit[:10], "ref": "v1.0.0", "patches": patches},
        },
        "variants": {VARIANT: {"hardware": HARDWARE}},
    }


def base_tree(dest: Path, images: tuple[str, ...] = ("hardware.yaml", "mirrors.yaml")) -> Path:
    """A fresh rlbox tree at ``dest``: templates, the given images/ files, and what a build context
    needs besides (.dockerignore, the source-cache folder the templates mount)."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "images").mkdir(parents=True)
    (dest / "patches").mkdir()
    shutil.copytree(REPO / "templates", dest / "templates")
    for name in images:
        shutil.copy(REPO / "images" / name, dest / "images" / name)
    shutil.copy(REPO / ".dockerignore", dest / ".dockerignore")
    (dest / ".rlbox-sources").mkdir()
    shutil.copy(REPO / ".rlbox-sources" / "README.md", dest / ".rlbox-sources" / "README.md")
    return dest


def make_tree(dest: Path, git_url: str, commit: str, patches: dict[str, str], ca_bundle: Path | None = None,
              edit=None) -> Path:
    """An rlbox tree (images/, templates/, patches/, lock, rendered dockerfiles/) for the self-test.

    ``edit`` may change the manifest (a dict) before it is written, locked and rendered.
    """
    from rlbox.image import lockfile, matrix, render, resolve

    base_tree(dest)
    (dest / "patches" / "fixture").mkdir(parents=True)
    for name, text in patches.items():
        (dest / "patches" / "fixture" / name).write_text(text)
    data = manifest(git_url, commit, sorted(patches))
    if edit is not None:
        edit(data)
    (dest / "images" / "selftest.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    entries = {v.name: resolve.resolve(v, ca_bundle=ca_bundle).entry for v in matrix.load(dest).variants}
    lock_file = lockfile.path_for(dest, "selftest")
    lock_file.parent.mkdir(parents=True)
    lock_file.write_text(lockfile.document("selftest", entries))
    render.write(matrix.load(dest))
    return dest


def fixture_patches(repo: FixtureRepo) -> dict[str, str]:
    return {
        "0001-greeting.patch": repo.patch(*PATCH_GREETING),
        "0002-feature.patch": repo.patch(*PATCH_FEATURE),
    }


def build_argv(tree: Path, ca_bundle: Path, *extra: str) -> list[str]:
    return ["rlbox", "build", REF, "--network", "host", "--ca-bundle", str(ca_bundle), *extra]
