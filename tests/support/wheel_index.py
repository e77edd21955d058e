"""This machine's CPU torch wheel (PyPI's Linux torch is a CUDA build of several GB) and a PEP 503
index on a loopback port that serves that one file to `rlbox lock` / `rlbox build` (`--network
host`): what the verl_cpu release (images/verl_cpu.yaml) names as torch's index. Used by
tests/support/verl_cpu.py and tools/torch-cpu-index.py.
"""

from __future__ import annotations

import functools
import http.server
import platform
import shutil
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEEL_DIRS = (Path("/opt/wheels"), Path("/opt/pypi-more/files"))


def torch_wheel() -> Path | None:
    if platform.machine() != "x86_64":
        return None
    for d in WHEEL_DIRS:
        for w in sorted(d.glob("torch-2.13.0+cpu-cp311-cp311-manylinux*_x86_64.whl")) if d.is_dir() else []:
            return w
    return None


class WheelIndex:
    """A PEP 503 simple index with one project (torch) on 127.0.0.1:port."""

    def __init__(self, root: Path, wheel: Path, port: int):
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
