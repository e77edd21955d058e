"""The workflow test image: the simulation node (Python + Ray) plus CPU torch, transformers,
pyarrow and verl's PyPI wheel, built through rlbox's own templates and `rlbox build`.

It is what `rlbox data prepare` and `rlbox merge` need from a training image (pyarrow; torch,
transformers, accelerate, safetensors and `python -m verl.model_merger`), and it can be a
simulated node (`rlbox run --sim --image ...`), so a test can train-and-checkpoint across
simulated nodes and merge. The release `extends: rlbox_sim`, so its first layers are the
simulation image's (BuildKit reuses them).

torch comes from the CPU wheel this machine kind keeps on disk (PyPI's Linux torch is a CUDA
build of several GB): a PEP 503 index on a fixed loopback port serves that one file to the
build (`--network host`); everything else comes from PyPI through the CA secret. The image tag
carries a digest of the manifest, so a change rebuilds it and an unchanged one is reused.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import platform
import shutil
import threading
from pathlib import Path

import yaml

from support import selftest

REPO = Path(__file__).resolve().parents[2]
WHEEL_DIRS = (Path("/opt/wheels"), Path("/opt/pypi-more/files"))
INDEX_PORT = 38461  # fixed: it is part of the Dockerfile text, so the layer cache survives sessions
VARIANT = "arm64" if platform.machine() in ("aarch64", "arm64") else "amd64"
TORCH = "torch==2.13.0+cpu"


def torch_wheel() -> Path | None:
    if VARIANT != "amd64":
        return None
    for d in WHEEL_DIRS:
        for w in sorted(d.glob("torch-2.13.0+cpu-cp311-cp311-manylinux*_x86_64.whl")) if d.is_dir() else []:
            return w
    return None


def manifest() -> dict:
    return {
        "release": "workflow",
        "extends": "rlbox_sim",
        "description": "rlbox test image for data prepare and merge: simulation node + CPU torch, transformers, pyarrow, verl wheel",
        "sources": ["tests/workflow_image.py"],
        "image": {"registry": "localhost/rlbox-test", "name": "workflow"},
        "components": {
            "torch": {"pip": TORCH, "index_url": f"http://127.0.0.1:{INDEX_PORT}/simple"},
            "numpy": {"pip": "numpy==1.26.4"},
            "pyarrow": {"pip": "pyarrow==19.0.1"},
            "pandas": {"pip": "pandas==2.2.3"},
            "tensordict": {"pip": "tensordict==0.9.1"},
            "omegaconf": {"pip": "omegaconf==2.3.0"},
            "accelerate": {"pip": "accelerate==1.10.1"},
            "transformers": {"pip": "transformers==4.57.6"},
            # verl's pure-Python wheel; its own dependency list would pull a CUDA torch and more.
            "verl": {"pip": "verl==0.5.0", "pip_args": ["--no-deps"]},
        },
    }


def digest() -> str:
    text = yaml.safe_dump(manifest(), sort_keys=True) + "".join((REPO / "images" / n).read_text() for n in ("defaults.yaml", "rlbox_sim.yaml"))
    text += "".join(p.read_text() for p in sorted((REPO / "templates").rglob("*")) if p.is_file())
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image() -> str:
    return f"localhost/rlbox-test/workflow:{VARIANT}-{digest()}"


def make_tree(dest: Path) -> Path:
    """The tree, locked (the whole Python set: PyPI, and torch from the loopback index, which must
    be serving: WheelIndex) and rendered."""
    from rlbox.image import matrix, render, resolve

    selftest.base_tree(dest, ("hardware.yaml", "defaults.yaml", "rlbox_sim.yaml"))
    (dest / "images" / "workflow.yaml").write_text(yaml.safe_dump(manifest(), sort_keys=False))
    (dest / "images" / "lock").mkdir()
    shutil.copy(REPO / "images" / "lock" / "rlbox_sim.json", dest / "images" / "lock" / "rlbox_sim.json")
    m = matrix.load(dest)
    resolve.lock(m, m.select([f"workflow:{VARIANT}"]), ca_bundle=Path("/etc/ssl/certs/ca-certificates.crt"))
    render.write(matrix.load(dest))
    return dest


class WheelIndex:
    """A PEP 503 simple index with one project (torch) on 127.0.0.1:port (INDEX_PORT unless given)."""

    def __init__(self, root: Path, wheel: Path, port: int = INDEX_PORT):
        self.root = root
        (root / "simple" / "torch").mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, root / wheel.name) if not (root / wheel.name).exists() else None
        href = "../../" + wheel.name.replace("+", "%2B")
        (root / "simple" / "index.html").write_text('<a href="torch/">torch</a>\n')
        (root / "simple" / "torch" / "index.html").write_text(f'<a href="{href}">{wheel.name}</a>\n')
        handler = functools.partial(_Quiet, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
