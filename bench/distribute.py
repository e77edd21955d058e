#!/usr/bin/env python3
"""Benchmark: delivering an image to 1, 2, 4 and 8 hosts, against baselines from the same run.

  rlbox       `rlbox distribute IMAGE --cluster FILE`: one `docker save` here, streamed through a
              chain of the hosts, each loading while it forwards (ssh -A between hosts).
  sequential  what users do by hand: `docker save IMAGE | ssh HOST docker load`, host after host.
  pulls       `ssh HOST docker pull REGISTRY/IMAGE` on every host at once, from a local registry
              (Debian's docker-registry on 127.0.0.1:22500, no auth).

The hosts are real engines: per host a dockerd of its own (data root, exec root, socket) and an
sshd on its own loopback address (tests/support/engines.py), every command over ssh as on a
cluster. Before each measurement every host's images are removed. The image is ≈600 MB of
incompressible data in 4 layers (--quick: 12 MB to 2 hosts, once). Goal: rlbox to 8 hosts in at
most 1.2 × rlbox to 1 host. All hosts share this machine's cores and disk, so every extra host
adds a `docker load` (unpack + write) competing for the same 2 cores: see the report.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support.engines import EngineHosts  # noqa: E402

REGISTRY_PORT = 22500
REGISTRY = f"127.0.0.1:{REGISTRY_PORT}"
IMAGE = "ds-bench-distribute:1"


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


class Registry:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc = None

    def __enter__(self):
        config = self.workdir / "registry.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {self.workdir / 'data'}\n"
                          f"http:\n  addr: {REGISTRY}\n")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for _ in range(100):
            if subprocess.run(["curl", "-sf", f"http://{REGISTRY}/v2/"], capture_output=True).returncode == 0:
                return self
            time.sleep(0.1)
        raise SystemExit("bench: docker-registry did not answer")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()


def clear(hosts) -> None:
    for h in hosts:
        ids = h.docker("image", "ls", "-aq").stdout.split()
        if ids:
            h.docker("image", "rm", "-f", *set(ids), check=False)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def check_all(hosts, image: str, want: str) -> None:
    bad = [h.address for h in hosts if h.image_id(image) != want]
    if bad:
        raise SystemExit(f"bench: {image} not delivered to {', '.join(bad)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 MB to 2 hosts, once (CI: does it run)")
    ap.add_argument("--hosts", default="1,2,4,8", help="host counts (default 1,2,4,8)")
    ap.add_argument("--parts", action="store_true",
                    help="also time the parts of one stream on one host: docker save alone, the bytes through "
                         "ssh alone, docker load of a file alone (where the time goes)")
    args = ap.parse_args()
    counts = [2] if args.quick else [int(n) for n in args.hosts.split(",")]
    layer_mb, layers = (4, 3) if args.quick else (150, 4)
    with tempfile.TemporaryDirectory(prefix="ds-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "ctx").mkdir()
        print(f"building {IMAGE}: {layers} layers of {layer_mb} MiB", flush=True)
        build_image(tmp / "ctx", layer_mb, layers)
        want = sh("docker", "image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip()
        remote = f"{REGISTRY}/{IMAGE}"
        (tmp / "reg").mkdir()
        try:
            with Registry(tmp / "reg"), EngineHosts(tmp / "hosts", max(counts), prefix="ds",
                                                    insecure_registry=REGISTRY) as hosts:
                sh("docker", "tag", IMAGE, remote)
                sh("docker", "push", remote)
                rows = []
                for n in counts:
                    some = hosts.hosts[:n]
                    cluster = hosts.cluster_file(tmp / f"cluster{n}.yaml", some)

                    def rlbox():
                        proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "distribute", IMAGE,
                                               "--cluster", str(cluster)], capture_output=True, text=True)
                        if proc.returncode:
                            raise SystemExit(f"bench: rlbox distribute failed: {proc.stderr[-800:]}")

                    def sequential():
                        for h in some:
                            save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
                            subprocess.run(hosts.ssh_argv(h, "docker", "load", "-q"), stdin=save.stdout, check=True,
                                           capture_output=True)
                            save.stdout.close()
                            assert save.wait() == 0

                    def pulls():
                        errors = []

                        def pull(h):
                            p = subprocess.run(hosts.ssh_argv(h, "docker", "pull", "-q", remote), capture_output=True)
                            if p.returncode:
                                errors.append(p.stderr.decode()[-300:])
                        threads = [threading.Thread(target=pull, args=(h,)) for h in some]
                        for t in threads:
                            t.start()
                        for t in threads:
                            t.join()
                        if errors:
                            raise SystemExit(f"bench: pull failed: {errors[0]}")

                    row = {"hosts": n}
                    for name, fn, image in (("rlbox", rlbox, IMAGE), ("sequential", sequential, IMAGE),
                                            ("pulls", pulls, remote)):
                        clear(some)
                        row[name] = timed(fn)
                        check_all(some, image, want)
                        print(f"  {n} host(s) {name:10} {row[name]:7.1f} s", flush=True)
                    rows.append(row)
                clear(hosts.hosts)
                if args.parts:
                    h = hosts.hosts[0]
                    tar = tmp / "image.tar"
                    parts = {
                        "docker save > file": lambda: sh("sh", "-c", f"docker save {IMAGE} > {tar}"),
                        "file | ssh cat > /dev/null": lambda: subprocess.run(
                            hosts.ssh_argv(h, "cat", ">/dev/null"), stdin=tar.open("rb"), check=True),
                        "docker load < file (host engine)": lambda: h.docker("load", "-q", "-i", str(tar)),
                    }
                    print("\nparts of one transfer to one host:")
                    for name, fn in parts.items():
                        if name.startswith("docker load"):
                            clear([h])
                        print(f"  {name:34} {timed(fn):7.1f} s", flush=True)
                    tar.unlink()
                    clear([h])
        finally:
            subprocess.run(["docker", "image", "rm", "-f", IMAGE, remote], capture_output=True)
    one = rows[0]["rlbox"]
    print(f"\nimage {layers * layer_mb} MiB; times in seconds; ratios in the same run")
    print(f"{'hosts':>5} {'rlbox':>7} {'seq':>7} {'pulls':>7} {'rlbox/rlbox(1)':>15} {'seq/rlbox':>10} {'pulls/rlbox':>12}")
    for r in rows:
        print(f"{r['hosts']:>5} {r['rlbox']:7.1f} {r['sequential']:7.1f} {r['pulls']:7.1f} "
              f"{r['rlbox'] / one:15.2f} {r['sequential'] / r['rlbox']:10.2f} {r['pulls'] / r['rlbox']:12.2f}")
    last = rows[-1]
    if len(rows) > 1:
        verdict = "met" if last["rlbox"] <= 1.2 * one else "NOT met"
        print(f"goal: {last['hosts']} hosts in <= 1.2 x one host: {last['rlbox'] / one:.2f} x ({verdict}; "
              f"{os.cpu_count()} cores shared by every host's load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
