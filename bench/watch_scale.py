#!/usr/bin/env python3
"""Benchmark: the launcher's bring-up loop over N nodes whose engines all hang, against N that answer.

The real loop: `execute.Cluster.wait_ready` (Ray's node table read every 0.25 s by `ray.wait_for_npus`,
the node watch's looks, the reads of the nodes' address lines and the gos to gated workers, each on
threads of its own: `watch.Watch`, `hosts.Rounds`, `bringup.Gate`). Stand-ins: each node's Docker
engine, in this process, answers at once (the baseline: containers running, each said its address) or
never until released (a cluster cut off the network: a real call hangs until ssh gives the tunnel up,
45-60 s), every node on a machine of its own (so every gated worker's go goes out at once: the most a
node holds); and Ray's dashboard, a local HTTP server whose node table holds only the head (the
bring-up never ends ready). Per N (16, 256, 1000): the hung case's seconds until the loop names a node
(goal: within 5 s, whatever N; the watch's period grows with N, 15.6 s at 1,000), its peak threads and
peak memory (VmRSS sampled every 0.1 s), against the answering case's over the same seconds, and its
CPU-seconds a second of the loop. Exits 1 when a size misses the goal.

Not measured here: what a hung call holds outside this process (its ssh tunnel's connection: the
launcher's open-files budget counts 64 a host, hosts.FILES_PER_HOST), docker-py's own HTTP and JSON
work of a real engine's answer, and real engines' latency.

--quick (CI: proves the bench runs): 16 nodes only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import threading
import time
from types import SimpleNamespace

from rlbox.cluster import execute, watch
from rlbox.core.errors import RlboxError

GOAL = 5.0  # seconds from the bring-up loop's start to the line naming a node (bench/faults.py's goal)


class _Container:
    def __init__(self, index: int):
        self.status, self.attrs, self.labels = "running", {"State": {"ExitCode": 0}}, {}
        self.line = f"rlbox-node: {'head' if index == 0 else 'worker'} on {_address(index)} (eth0), head {_address(0)}:6379\n"

    def logs(self, tail=None):
        return self.line.encode()


class _Engine:
    """A node's engine (docker-py's client as the launcher uses it): answers at once, or (``hung``) never
    until the event is set."""

    def __init__(self, index: int, hung: threading.Event | None):
        self.hung, self.box = hung, _Container(index)
        self.containers, self.api = self, self

    def _wait(self):
        if self.hung is not None:
            self.hung.wait()

    def get(self, name):  # containers.get
        self._wait()
        return self.box

    def ping(self):
        self._wait()
        return True

    def put_archive(self, name, path, data):  # a go's file
        self._wait()

    def kill(self, name, signal=None):  # a go's signal
        self._wait()


def _address(i: int) -> str:
    return f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}"


class _Dashboard(http.server.ThreadingHTTPServer):
    """Ray's dashboard: a node table that holds the head alive, and no worker."""

    daemon_threads = True

    def __init__(self):
        table = json.dumps({"data": {"result": {"result": [
            {"node_ip": _address(0), "state": "ALIVE", "is_head_node": True, "resources_total": {"NPU": 16}}]}}}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Length", str(len(table)))
                self.end_headers()
                self.wfile.write(table)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def _cluster(n: int, hung: threading.Event | None, dashboard: str) -> execute.Cluster:
    plan = SimpleNamespace(total_npus=16 * n, nodes=[
        SimpleNamespace(index=i, label=f"node{i} (h{i})", role="head" if i == 0 else "worker",
                        container=SimpleNamespace(name=f"c{i}", ip=None, env=(("RLBOX_GO_FILE", f"/tmp/rlbox-go-b-{i}"),)),
                        host=SimpleNamespace(name=f"h{i}", address=_address(i)))
        for i in range(n)])
    nodes = [SimpleNamespace(client=_Engine(i, hung), close=lambda: None, machine=lambda i=i: f"boot-{i}",
                             host=SimpleNamespace(name=f"h{i}")) for i in range(n)]
    return execute.Cluster(plan, nodes, lambda line: None, dashboard=dashboard)


class _Sampler:
    """Peak threads and resident memory of this process, every 0.1 s."""

    def __init__(self):
        self.threads, self.rss_mb, self.stop = 0, 0.0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.wait(0.1):
            self.threads = max(self.threads, threading.active_count() - 2)  # not the main thread, not this one
            rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
            self.rss_mb = max(self.rss_mb, rss / 1024)

    def done(self):
        self.stop.set()
        self.thread.join()


def _settle(most: float = 30.0) -> None:
    """Until the threads of the case before have ended (its released calls)."""
    end = time.monotonic() + most
    while threading.active_count() > 3 and time.monotonic() < end:  # main, the dashboard's server
        time.sleep(0.1)


def measure(n: int, dashboard: str, hung: bool, seconds: float) -> dict:
    """The bring-up loop over N engines: until a node is named (``hung``), or for ``seconds`` (answering)."""
    release = threading.Event() if hung else None
    cluster = _cluster(n, release, dashboard)
    sampler = _Sampler()
    began, cpu = time.monotonic(), time.process_time()
    line = ""
    try:
        cluster.wait_ready(60 if hung else seconds)
    except watch.NodeLost as lost:
        line = str(lost)
    except RlboxError as err:
        line = str(err)
    took, spent = time.monotonic() - began, time.process_time() - cpu
    sampler.done()
    if release is not None:
        release.set()  # every hung call comes back; its thread ends
    _settle()
    return {"seconds": took, "line": line, "named": "was lost" in line, "threads": sampler.threads,
            "rss_mb": sampler.rss_mb, "cpu_per_s": spent / took}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 nodes only (CI)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 256, 1000])
    args = parser.parse_args()
    sizes = [16] if args.quick else args.nodes
    server = _Dashboard()
    dashboard = f"http://127.0.0.1:{server.server_address[1]}"
    missed = []
    for n in sizes:
        bad = measure(n, dashboard, True, 0)
        ok = measure(n, dashboard, False, max(bad["seconds"], 2.0))
        print(f"{n:5d} nodes, all engines hung: named after {bad['seconds']:.1f} s (goal <= {GOAL:.0f}), peak "
              f"{bad['threads']} threads ({bad['threads'] / n:.1f} a node), peak RSS {bad['rss_mb']:.0f} MB, "
              f"{bad['cpu_per_s']:.2f} CPU-s a second | answering, the same {ok['seconds']:.1f} s: peak {ok['threads']} "
              f"threads, RSS {ok['rss_mb']:.0f} MB, {ok['cpu_per_s']:.2f} CPU-s a second | hung / answering: threads "
              f"{bad['threads'] / max(ok['threads'], 1):.1f} x, RSS {bad['rss_mb'] / ok['rss_mb']:.2f} x", flush=True)
        if not bad["named"] or bad["seconds"] > GOAL:
            missed.append(n)
            print(f"  {n} nodes: {bad['line'] or 'not named'}", flush=True)
    server.shutdown()
    print(f"watch_scale: named within {GOAL:.0f} s at " + ", ".join(str(n) for n in sizes if n not in missed) +
          (f"; missed at {', '.join(map(str, missed))}" if missed else "") + " nodes")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
