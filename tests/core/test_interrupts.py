"""SIGTERM (and Ctrl-C) within `engine.sigterm_as_interrupt` is taken once, even when it lands in a
finalizer, where Python cannot raise it (ci10: a SIGTERM'd run printed "Exception ignored in ..." with
`Interrupted: 15` and ran its 300 s job on). A real process and a real signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from conftest import REPO

# The signal is sent while the main thread runs a __del__ that sleeps: the handler's raise lands there.
SCRIPT = r"""
import os, signal, sys, threading, time
from rlbox.core import engine

class Slow:
    def __del__(self):
        print("in finalizer", flush=True)
        time.sleep(1.0)  # the signal comes meanwhile: its handler runs here and cannot raise out

try:
    with engine.sigterm_as_interrupt():
        Slow()  # dropped at once: its __del__ runs in the main thread
        print("after finalizer", flush=True)
        for _ in range(100):
            time.sleep(0.1)
        print("never interrupted", flush=True)
except KeyboardInterrupt as err:
    print(f"interrupted {engine.exit_code_of(err)}", flush=True)
    sys.exit(engine.exit_code_of(err))
"""


def _run(signum: int) -> tuple[int, str, str, float]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PYTHONPATH": str(REPO / "launcher")})
    assert proc.stdout.readline().strip() == "in finalizer"
    time.sleep(0.3)
    sent = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err, time.monotonic() - sent


def test_a_sigterm_that_lands_in_a_finalizer_is_taken_once_just_after():
    code, out, err, took = _run(signal.SIGTERM)
    assert code == 143 and "interrupted 143" in out and "never interrupted" not in out, (out, err)
    assert took < 5.0 and "Traceback" not in err and "Exception ignored" not in err, err


def test_a_ctrl_c_that_lands_in_a_finalizer_is_taken_once_just_after():
    code, out, err, _ = _run(signal.SIGINT)
    assert code == 130 and "interrupted 130" in out and "never interrupted" not in out, (out, err)
