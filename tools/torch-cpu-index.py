#!/usr/bin/env python3
"""Serve this machine's CPU torch wheel (/opt/wheels) as a one-project PEP 503 index on a loopback
port, for `rlbox lock` / `rlbox build` of a release whose torch names that index (images/verl_cpu.yaml:
127.0.0.1:23461). Runs COMMAND while the index serves, then stops it:

    tools/torch-cpu-index.py 23461 -- rlbox lock verl_cpu:amd64
    tools/torch-cpu-index.py 23461 -- rlbox build verl_cpu:amd64 --network host --ca-bundle /etc/ssl/certs/ca-certificates.crt
"""

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.wheel_index import WheelIndex, torch_wheel  # noqa: E402


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    wheel = torch_wheel()
    if wheel is None:
        print("torch-cpu-index: no torch-2.13.0+cpu x86_64 wheel in /opt/wheels or /opt/pypi-more/files", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="vl-torch-index-") as root, WheelIndex(Path(root), wheel, port=int(sys.argv[1])):
        return subprocess.call(sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
