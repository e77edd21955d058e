"""Every bench script runs in its quick mode (`bench/X.py --quick`: smallest size, one repetition)
without crashing, so a bench broken by a change fails CI rather than the next person running
`make bench`. What a bench measures is printed, never asserted here (no timed tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))  # _x.py: a helper of the benches
# the benches whose quick run uses the session's testbed (tests/conftest.py) rather than one of their own
ON_TESTBED = {"faults.py", "bringup.py"}


def test_every_bench_is_listed_here_and_in_make_bench():
    """The parametrisation below is the bench/ folder itself; `make bench` runs each full-size one
    but image_rehearsal.py, which needs a rehearsal's source cache (run by hand)."""
    assert "startup.py" in BENCHES and len(BENCHES) >= 7
    makefile = (REPO / "Makefile").read_text()
    bench_rule = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert {b for b in BENCHES if f"bench/{b}" not in bench_rule} == {"image_rehearsal.py"}


@pytest.mark.engine
@pytest.mark.parametrize("script", [pytest.param(b, marks=pytest.mark.testbed) if b in ON_TESTBED else b for b in BENCHES])
def test_bench_runs_in_quick_mode(script, sim_image, request):
    # runs and containers named t-benchq... (RLBOX_BENCH_PREFIX, if set, names them instead)
    env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"))
    env.setdefault("RLBOX_BENCH_PREFIX", "t-benchq")
    extra: list[str] = []
    if script in ON_TESTBED:  # on the session's testbed, as it is: no testbed of its own to bring up and fill
        bed = request.getfixturevalue("testbed")
    if script == "faults.py":
        env.update(RLBOX_FAULTS_REUSE="1", RLBOX_FAULTS_TESTBED=bed.name, RLBOX_FAULTS_IMAGE=sim_image)
    elif script == "bringup.py":
        extra = ["--reuse", "--name", bed.name]
    # its own process group: on a timeout the bench's children (git daemon, buildx, rlbox) go too
    proc = subprocess.Popen([sys.executable, f"bench/{script}", "--quick", *extra], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"bench/{script} --quick took over 900 s:\n{stdout[-1500:]}\n{stderr[-3000:]}")
    assert proc.returncode == 0 and "Traceback" not in stderr, \
        f"bench/{script} --quick exited {proc.returncode}:\n{stdout[-1500:]}\n{stderr[-3000:]}"
    assert stdout.strip(), f"bench/{script} --quick printed no result"
