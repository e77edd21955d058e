#!/usr/bin/env python3
"""Benchmark: the launcher's side of watching N nodes whose engines all hang, against N that answer.

What a bring-up holds while Ray comes up (cluster/execute.py's wait_ready): the node watch
(watch.Watch: an engine call a node, a ping beside each call still out), the reads of the nodes'
address lines and the gos to gated workers (hosts.Rounds, one of each a node), all made from this
process's threads. Here each node's engine is a stand-in in this process: one that answers at once
(the baseline) or one whose every call hangs (a cluster cut off the network: a real call would hang
until ssh gives the tunnel up, 45-60 s). Per N (16, 256, 1000): the hung case's seconds until the
watch names a node (goal: ENGINE_PATIENCE, 3 s, plus at most a look, whatever N), its peak threads
and the process's peak memory, against the answering case's threads, memory and CPU per look.

Not measured here: what a hung call holds outside this process (its ssh tunnel's connection: the
launcher's open-files budget counts 64 a host, hosts.FILES_PER_HOST), and real engines' latency.

--quick (CI: proves the bench runs): 16 nodes only.
"""

from __future__ import annotations

import argparse
import threading
import time
from types import SimpleNamespace

from rlbox.cluster import watch
from rlbox.cluster.hosts import Rounds

POLL = 0.25  # as ray.POLL: the bring-up's loop reads Ray's table and looks this often


class _Engine:
    """A node's engine: answers at once, or (``hung``) never until released."""

    def __init__(self, hung: threading.Event | None):
        self.hung = hung
        self.containers = self

    def _wait(self):
        if self.hung is not None:
            self.hung.wait()

    def get(self, name):  # containers.get
        self._wait()
        return SimpleNamespace(status="running", attrs={}, labels={})

    def ping(self):
        self._wait()
        return True


def _rss_mb() -> tuple[float, float]:
    """This process's resident memory now and at its peak (VmRSS, VmHWM), in MB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _nodes(n: int, hung: threading.Event | None) -> tuple[list, list[watch.Expected], list[str]]:
    nodes = [SimpleNamespace(client=_Engine(hung), host=SimpleNamespace(name=f"h{i}")) for i in range(n)]
    expected = [watch.Expected(f"node{i} (h{i})", "head" if i == 0 else "worker", f"10.0.{i // 250}.{i % 250}")
                for i in range(n)]
    return nodes, expected, [f"c{i}" for i in range(n)]


def answering(n: int, looks: int) -> dict:
    """The baseline: ``looks`` looks of N answering engines (each look at once, not paced)."""
    nodes, expected, names = _nodes(n, None)
    w = watch.Watch(expected, names, nodes, None)
    base = threading.active_count()
    cpu = time.process_time()
    for _ in range(looks):
        w.check(force=True)
    per_look = (time.process_time() - cpu) / looks
    return {"cpu_ms_per_look": per_look * 1000, "threads": threading.active_count() - base, "rss_mb": _rss_mb()[0]}


def hung(n: int) -> dict:
    """The bring-up's loop over N engines that never answer, until the watch names one."""
    release = threading.Event()
    nodes, expected, names = _nodes(n, release)
    w = watch.Watch(expected, names, nodes, None)
    hang = lambda item: item.client.ping()  # noqa: E731 - an address read, a go: any engine call
    key = lambda node: node.host.name  # noqa: E731 - as bringup's reads key a node by its index
    reads, gos = Rounds(hang, watch.LOOK_WAIT, key), Rounds(hang, watch.LOOK_WAIT, key)
    base, peak = threading.active_count(), 0
    began, cpu = time.monotonic(), time.process_time()
    named = None
    try:
        while named is None and time.monotonic() - began < 60:
            try:
                w.check()
            except watch.NodeLost as lost:
                named = time.monotonic() - began, str(lost)
            reads.round(nodes)
            gos.round(nodes)
            peak = max(peak, threading.active_count() - base)
            time.sleep(POLL)
    finally:
        release.set()  # every hung call comes back; its thread ends
    took = named[0] if named else float("nan")
    return {"named_s": took, "line": named[1] if named else "not named in 60 s", "threads": peak,
            "cpu_s": time.process_time() - cpu, "rss_mb": _rss_mb()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 nodes only (CI)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 256, 1000])
    args = parser.parse_args()
    sizes = [16] if args.quick else args.nodes
    rows = []
    for n in sizes:
        ok = answering(n, 3)
        time.sleep(0.5)  # the baseline's threads end
        bad = hung(n)
        for _ in range(50):  # the released calls' threads end before the next size
            if threading.active_count() <= 1:
                break
            time.sleep(0.1)
        rows.append((n, ok, bad))
        print(f"{n:5d} nodes: answering: {ok['cpu_ms_per_look']:.1f} ms CPU a look, {ok['threads']} threads left, "
              f"RSS {ok['rss_mb']:.0f} MB | all hung: named after {bad['named_s']:.1f} s (goal <= "
              f"{watch.ENGINE_PATIENCE + watch.LOOK_WAIT + watch.period(n):.1f}), peak {bad['threads']} threads "
              f"({bad['threads'] / n:.1f} a node), {bad['cpu_s']:.2f} CPU-s, RSS {bad['rss_mb']:.0f} MB "
              f"(peak of the process so far {_rss_mb()[1]:.0f} MB)", flush=True)
        if bad["named_s"] != bad["named_s"]:
            print(f"  {bad['line']}")
    first = rows[0]
    for n, ok, bad in rows[1:]:
        print(f"{n} / {first[0]} nodes: hung threads a node {bad['threads'] / n / (first[2]['threads'] / first[0]):.2f} x, "
              f"naming {bad['named_s'] / first[2]['named_s']:.2f} x, answering CPU a look a node "
              f"{ok['cpu_ms_per_look'] / n / (first[1]['cpu_ms_per_look'] / first[0]):.2f} x")
    return 0 if all(bad["named_s"] == bad["named_s"] for _, _, bad in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
