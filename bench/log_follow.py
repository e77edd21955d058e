#!/usr/bin/env python3
"""Benchmark: bytes fetched and peak memory while following a job's log (default 200 MB).

A 1-node simulated cluster (`rlbox run --sim --detach`) runs a job printing SIZE MB of 100-byte
lines. A child process follows it as `rlbox run` does (jobs.JobsClient.follow: the logs/tail
WebSocket, every chunk written to a file) and reports the bytes received and its peak RSS.
Baselines measured in the same run: the log's own size, and one child that only fetches the
whole log once (`GET /api/jobs/{id}/logs`, what the old follower did on every poll) with its
peak RSS. Goals: fetched <= 1.1 x the log, follower's memory < 150 MB.

    python3 bench/log_follow.py [SIZE_MB] [--quick]

--quick (CI: proves the bench runs): a 1 MB log. RLBOX_BENCH_PREFIX names the run (default h12);
RLBOX_BENCH_DEVICES (e.g. 8-15) gives the run `--devices`, to share the engine with other runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEVICES = ["--devices", os.environ["RLBOX_BENCH_DEVICES"]] if os.environ.get("RLBOX_BENCH_DEVICES") else []
CHILD = r"""
import json, resource, sys
from rlbox.cluster import jobs
mode, base, sid, out = sys.argv[1:5]
c = jobs.JobsClient(base, timeout=60)
with open(out, "w") as f:
    if mode == "follow":
        c.follow(sid, f.write)
        got = c.received
    else:
        text = c.logs(sid); f.write(text); got = len(text.encode())
print(json.dumps({"bytes": got, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def child(mode, base, sid, out):
    env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"))
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, base, sid, str(out)], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", nargs="?", type=int, default=200, help="log size in MB (default 200)")
    parser.add_argument("--quick", action="store_true", help="a 1 MB log (CI)")
    args = parser.parse_args()
    size = 1 if args.quick else args.size
    work = Path(tempfile.mkdtemp(prefix="rlbox-bench-log-"))
    runs = work / "runs"
    name = os.environ.get("RLBOX_BENCH_PREFIX", "h12") + "-bench-log"
    job = f"import sys\nline = 'x' * 99 + '\\n'\nfor i in range({size} * 10486):\n    sys.stdout.write(line)\n"
    env = dict(os.environ, PYTHONPATH=str(REPO / "launcher"))
    up = subprocess.run([sys.executable, "-m", "rlbox.cli", "run", "--sim", "--nodes", "1", "--name", name,
                         "--runs-dir", str(runs), "--no-doctor", "--detach", *DEVICES, "--", "python3", "-c", job],
                        cwd=REPO, env=env, capture_output=True, text=True)
    if up.returncode:
        raise SystemExit(up.stderr[-2000:])
    try:
        state = json.loads((runs / name / "state.json").read_text())
        base, sid = f"http://127.0.0.1:{state['ports']['dashboard']}", state["submission_id"]
        followed = child("follow", base, sid, work / "followed.log")
        log_bytes = (work / "followed.log").stat().st_size
        whole = child("whole", base, sid, work / "whole.log")
        same = (work / "followed.log").read_bytes() == (work / "whole.log").read_bytes()
    finally:
        subprocess.run([sys.executable, "-m", "rlbox.cli", "stop", "--name", name, "--runs-dir", str(runs)],
                       cwd=REPO, env=env, capture_output=True)
    print(f"log: {log_bytes / 1e6:.1f} MB; followed copy identical to the whole log: {same}")
    print(f"follow (logs/tail WebSocket): fetched {followed['bytes'] / 1e6:.1f} MB = {followed['bytes'] / log_bytes:.3f} x the log "
          f"(goal <= 1.1), peak memory {followed['peak_mb']:.0f} MB (goal < 150)")
    print(f"baseline, one whole-log GET:  fetched {whole['bytes'] / 1e6:.1f} MB, peak memory {whole['peak_mb']:.0f} MB "
          f"(the old follower did this on every poll)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
