#!/usr/bin/env python3
"""Benchmark: cold build of the self-test image vs a rebuild after editing one patch.

Both builds go through `rlbox build` on the real engine. The cold build starts with no layer
cache and no BuildKit cache mounts (pip's cache is pruned); the rebuild edits the last patch of
the fixture series, re-renders, and builds again. The rebuild must reuse every layer before
the patched component's step: the script checks that from BuildKit's log and fails otherwise.
Prints both times, their ratio and the image size. Needs the engine (make setup).

--quick (CI: proves the bench runs): the first build keeps the layer cache and BuildKit's cache
mounts (no prune, no --no-cache), so it is quick once the self-test image was built; the
rebuild and its check are the same.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import selftest  # noqa: E402
from rlbox.image import matrix  # noqa: E402
from rlbox.image import render


def build(tree: Path, ca: Path, *extra: str) -> tuple[float, str]:
    argv = [sys.executable, "-m", "rlbox.cli", *selftest.build_argv(tree, ca, *extra)[1:]]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=tree, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench: build failed:\n{proc.stderr[-2000:]}")
    return took, proc.stderr


def steps(log: str) -> list[tuple[str, bool]]:
    """(instruction, cached) for every Dockerfile step in BuildKit's plain log, in order."""
    names, cached = {}, set()
    for line in log.splitlines():
        m = re.match(r"#(\d+) \[(?:stage-0 )?\s*(\d+)/(\d+)\] (.*)", line)
        if m:
            names[m.group(1)] = (int(m.group(2)), m.group(4))
        m = re.match(r"#(\d+) CACHED", line)
        if m:
            cached.add(m.group(1))
    return [(text, vid in cached) for vid, (_, text) in sorted(names.items(), key=lambda kv: kv[1][0])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first build from the cache, nothing pruned (CI)")
    quick = parser.parse_args().quick
    selftest.ensure_base_images()
    work = Path(tempfile.mkdtemp(prefix="rlbox-bench-"))
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    repo = selftest.FixtureRepo(work / "git" / "fixture.git").create()
    with selftest.GitDaemon(work / "git") as daemon:
        patches = selftest.fixture_patches(repo)
        tree = selftest.make_tree(work / "tree", daemon.url("fixture.git"), repo.commit, patches, ca)
        if not quick:
            subprocess.run(["docker", "builder", "prune", "--all", "--force"], capture_output=True, check=True)
        cold, _ = build(tree, ca) if quick else build(tree, ca, "--no-cache")

        # Edit one patch (the last of the series), re-render, rebuild.
        patch = tree / "patches" / "fixture" / "0002-feature.patch"
        patch.write_text(patch.read_text().replace('["npu"]', '["npu", "bench"]'))
        render.write(matrix.load(tree))
        warm, log = build(tree, ca)

    done = steps(log)
    first_fixture = next(i for i, (text, _) in enumerate(done) if "patches/fixture" in text)
    before = done[:first_fixture]
    rebuilt_early = [text for text, was_cached in before if not was_cached and not text.startswith("FROM")]
    size = json.loads(subprocess.run(["docker", "image", "inspect", selftest.IMAGE], capture_output=True,
                                     text=True, check=True).stdout)[0]["Size"]
    print(f"{'first build (cached, --quick)' if quick else 'cold build (no cache)':30} {cold:7.1f} s")
    print(f"rebuild after editing 1 patch  {warm:7.1f} s")
    print(f"ratio cold/rebuild             {cold / warm:7.1f}x")
    print(f"steps reused before the patch  {sum(c for _, c in before)}/{len(before)} "
          f"(FROM and metadata steps are not reported as cached)")
    print(f"image size                     {size / 1e6:7.1f} MB ({selftest.IMAGE})")
    if rebuilt_early:
        print(f"FAIL: rebuilt before the patch step: {rebuilt_early}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
