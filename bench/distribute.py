#!/usr/bin/env python3
"""Benchmark: delivering an image to 1, 2, 4 and 8 testbed hosts over rate-limited links, the
topology's own cost apart from the loads' CPU, against one host in the same run.

The hosts are a testbed's (`rlbox testbed`: per host its own network namespace, veth, Docker
engine and sshd on this machine). Every link is rate-limited with `tc ... tbf` (both ends of each
host's veth, and the bridge's, which carries what this machine sends), so that a link, not the
2 shared cores, is what a transfer waits for, as on a real network. The image is incompressible
data in 4 layers on this machine's engine. For each number of hosts N:

  load      rlbox's delivery as `rlbox distribute` runs it (plan, stream down the tree, every
            node `docker load`s while it forwards, verified by image id);
  sink      the same plan and stream with every node reading into `cat > /dev/null` instead of
            `docker load`: the topology's own cost, without every host's load competing for the
            same cores (on a cluster each node loads on its own CPUs);
  star      the sink again with `--via launcher`: this machine sends every node its own copy
            (what a topology without forwarding costs: N copies through this machine's link).

and per host the bytes its link received (its veth's counters) against the stream's size. Every
host's images are removed before each measurement, then (not --quick) the disk's writeback and the
CPUs are waited for (bench/_quiet.py); the testbed is taken down at the end.
Prints per N the times, the ratios to one host (goal: sink at 8 hosts <= 1.5 x one host) and the
largest bytes per link / stream size (goal <= 1.05), and the load average.
--quick: 2 hosts, 12 MB, once (CI: does it run). Needs root (testbed, tc).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlbox.cluster import spec as cluster_spec
from rlbox.delivery import execute as deliver
from rlbox.delivery.links import links_for
from rlbox.testbed import execute as tb
from rlbox.testbed import plan as tbplan
from _quiet import settle

PREFIX = os.environ.get("RLBOX_BENCH_PREFIX", "")
IMAGE = f"localhost/{PREFIX}ds-bench-distribute:1".replace("//", "/")
NAME, SUBNET = "tbdl", "10.201.6.0/24"


def sh(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kw)


def build_image(ctx: Path, layer_mb: int, layers: int) -> None:
    lines = ["FROM scratch"]
    for i in range(layers):
        path = ctx / f"l{i}"
        subprocess.run(["sh", "-c", f"openssl enc -aes-128-ctr -pass pass:bench{i} -nosalt -pbkdf2 < /dev/zero "
                        f"2>/dev/null | head -c {layer_mb << 20} > {path}"], check=True)
        lines.append(f"COPY l{i} /l{i}")
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    sh("docker", "build", "-q", "-t", IMAGE, str(ctx), env=dict(os.environ, DOCKER_BUILDKIT="0"))


def shape(state, rate: str) -> list[list[str]]:
    """tbf on both ends of every host's veth and on the bridge: each host receives and sends at
    ``rate``, and so does this machine into the bridge. Returns the commands that undo it."""
    undo = []
    tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
    for dev in [state.bridge] + [h.veth for h in state.hosts]:
        sh("tc", "qdisc", "replace", "dev", dev, *tbf)
        undo.append(["tc", "qdisc", "del", "dev", dev, "root"])
    for h in state.hosts:
        sh("nsenter", f"--net=/var/run/netns/{h.netns}", "tc", "qdisc", "replace", "dev", "eth0", *tbf)
    return undo


def received(state) -> dict[str, int]:
    """Bytes each host's link has carried to it so far (the root end's transmit counter)."""
    return {h.address: int(Path(f"/sys/class/net/{h.veth}/statistics/tx_bytes").read_text()) for h in state.hosts}


def clear(state, hosts) -> None:
    for h in hosts:
        engine = ["docker", "-H", f"unix://{h.socket}"]
        ids = subprocess.run([*engine, "image", "ls", "-aq"], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run([*engine, "image", "rm", "-f", *sorted(set(ids))], capture_output=True)
        left = subprocess.run([*engine, "image", "ls", "-aq"], capture_output=True, text=True).stdout.split()
        if left:
            raise SystemExit(f"bench: images left on {h.address} after removing them: {left}")


def left_over(state) -> list[str]:
    """Delivery processes still running in any host's PID namespace (there must be none)."""
    spaces = {os.readlink(f"/proc/{h.init_pid}/ns/pid"): h.address for h in state.hosts if h.init_pid}
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"rlbox-deliver" in (proc / "cmdline").read_bytes():
                where = spaces.get(os.readlink(proc / "ns" / "pid"))
                if where:
                    out.append(f"{where}: pid {proc.name}")
        except OSError:
            continue
    return out


def measure(state, cluster: Path, n: int, mode: str, via: str, fanout: int | None, quiet: bool) -> dict:
    spec = cluster_spec.from_file(cluster)
    hosts = state.hosts[:n]
    clear(state, hosts)
    if quiet:  # the loads before wrote up to 2 GB; their writeback otherwise runs under the next measurement
        settle(f"  {n} host(s) {mode}")
    before = received(state)
    start = time.perf_counter()
    with links_for(spec.hosts, agent=via == "chain") as links:  # as `rlbox distribute` does: its masters' close is timed too
        plan, by_label = deliver.make_plan(IMAGE, spec.hosts, via=via, fanout=fanout, pull=False, links=links)
        report = deliver.carry_out(plan, by_label, lambda line: None, mode=mode, links=links)
    took = time.perf_counter() - start
    after = received(state)
    per_link = {h.address: after[h.address] - before[h.address] for h in hosts}
    time.sleep(0.5)
    stray = left_over(state)
    if stray:
        raise SystemExit(f"bench: delivery processes left after the {mode} run: {', '.join(stray)}")
    if mode == "load":
        clear(state, hosts)
    return {"seconds": took, "sent": report.sent, "links": per_link, "fanout": plan.fanout}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 MB to 2 hosts, once, no star (CI: does it run)")
    ap.add_argument("--hosts", default="1,2,4,8", help="host counts (default 1,2,4,8)")
    ap.add_argument("--mb", type=int, default=256, help="image size in MiB, 4 layers (default 256)")
    ap.add_argument("--rate", default="200mbit", help="every link's rate, tc's syntax (default 200mbit)")
    ap.add_argument("--fanout", type=int, default=None, help="the tree's fan-out (default: rlbox's choice by N)")
    ap.add_argument("--no-star", action="store_true", help="skip the star baseline (--via launcher)")
    ap.add_argument("--name", default=NAME, help=f"the testbed's name (default {NAME})")
    ap.add_argument("--subnet", default=SUBNET, help=f"the testbed's subnet (default {SUBNET})")
    args = ap.parse_args()
    counts = [2] if args.quick else [int(n) for n in args.hosts.split(",")]
    layer_mb = 3 if args.quick else max(1, args.mb // 4)
    star = not (args.quick or args.no_star)
    root = tbplan.DEFAULT_ROOT
    rows = []
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "ctx").mkdir()
        print(f"building {IMAGE}: 4 layers of {layer_mb} MiB", flush=True)
        build_image(tmp / "ctx", layer_mb, 4)
        size = int(sh("sh", "-c", f"docker save {IMAGE} | wc -c").stdout)
        try:
            tb.down(root, args.name, lambda line: None)  # left by a killed bench
        except Exception:  # noqa: BLE001 - none there
            pass
        state = None
        try:
            tplan = tbplan.plan_testbed(hosts=max(counts), hardware="a3", name=args.name, subnet=args.subnet,
                                        nofile=20000)
            state = tb.up(tplan, lambda line: None)
            shape(state, args.rate)
            base = [line for line in Path(state.cluster_file).read_text().splitlines()
                    if not line.startswith("  - host:")]
            for n in counts:
                cluster = tmp / f"cluster{n}.yaml"
                cluster.write_text("\n".join(base + [f"  - host: {h.address}" for h in state.hosts[:n]]) + "\n")
                row = {"hosts": n}
                cases = [("load", "chain"), ("sink", "chain")] + ([("star", "launcher")] if star else [])
                for label, via in cases:
                    got = measure(state, cluster, n, "load" if label == "load" else "discard", via, args.fanout,
                                  quiet=not args.quick)  # --quick (CI): never quiet, each wait would run to its limit
                    row[label] = round(got["seconds"], 2)
                    row[f"{label}_link"] = round(max(got["links"].values()) / size, 3)
                    row["fanout"] = got["fanout"]
                    print(f"  {n} host(s) {label:5} {got['seconds']:7.1f} s  bytes per link / stream: "
                          + " ".join(f"{v / size:.3f}" for v in got["links"].values()), flush=True)
                rows.append(row)
        finally:
            if state is not None:
                clear(state, state.hosts)
            tb.down(root, args.name, lambda line: None)
            subprocess.run(["docker", "image", "rm", "-f", IMAGE], capture_output=True)
    one = rows[0]
    print(f"\nimage {4 * layer_mb} MiB (stream {size / 1e6:.1f} MB); links {args.rate}; times in seconds; "
          "ratios in the same run")
    head = f"{'hosts':>5} {'fanout':>6} {'load':>7} {'sink':>7}" + (f" {'star':>7}" if star else "")
    head += f" {'load/load(1)':>12} {'sink/sink(1)':>12}" + (f" {'star/sink':>9}" if star else "")
    print(head + f" {'link/stream':>11}")
    for r in rows:
        line = f"{r['hosts']:>5} {r['fanout']:>6} {r['load']:7.1f} {r['sink']:7.1f}" + (f" {r['star']:7.1f}" if star else "")
        line += f" {r['load'] / one['load']:12.2f} {r['sink'] / one['sink']:12.2f}"
        line += f" {r['star'] / r['sink']:9.2f}" if star else ""
        print(line + f" {max(r['load_link'], r['sink_link']):11.3f}")
    last = rows[-1]
    if len(rows) > 1:
        ratio = last["sink"] / one["sink"]
        link = max(max(r["load_link"], r["sink_link"]) for r in rows)
        print(f"goal: {last['hosts']} hosts in <= 1.5 x one host without the loads: {ratio:.2f} x "
              f"({'met' if ratio <= 1.5 else 'NOT met'}); with every load on these {os.cpu_count()} shared cores: "
              f"{last['load'] / one['load']:.2f} x")
        print(f"goal: bytes per link <= 1.05 x the stream: {link:.3f} ({'met' if link <= 1.05 else 'NOT met'})")
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print("RESULTS " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
