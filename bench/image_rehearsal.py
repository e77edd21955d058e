"""Real-content image benchmarks (issue 11), each against a baseline measured in the same run.

    python3 bench/image_rehearsal.py lock [REF...]        lock resolution per variant: cold uv cache vs cached
    python3 bench/image_rehearsal.py rebuild [REF]        rehearsal image: no-change rebuild (baseline), then a
                                                          rebuild after editing one verl patch; steps rebuilt, ratio
    python3 bench/image_rehearsal.py cold [REF]           the same, plus a cold build (--no-cache) as the baseline
    python3 bench/image_rehearsal.py size [REF...]        image size of each rehearsal image

    python3 bench/image_rehearsal.py --quick              `lock` of the smallest variant, rlbox_sim:amd64 (CI: proves
                                                          the bench runs; PyPI only, no source cache needed)

REF defaults to verl_pt27_25rc3:ax-x86. `rebuild`/`cold` need the rehearsal's source cache and
stand-in base (`make rehearse-image REF=...` once). The verl patch is edited in place (a comment
line appended to its header) and restored, then re-rendered, whatever happens.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launcher"))

from rlbox.cluster import recipes  # noqa: E402
from rlbox.image import build, matrix, rehearsal, render, resolve  # noqa: E402

DEFAULT = "verl_pt27_25rc3:ax-x86"


def bench_lock(refs: list[str]) -> None:
    """Per variant: the whole `rlbox lock` (base digest, git, sources' metadata, uv), then uv's
    resolution alone with a cold cache and again with that cache warm."""
    from rlbox.image import pylock, requirements, sources

    m = matrix.load(ROOT)
    print(f"{'variant':<30} {'packages':>8} {'lock s':>7} {'uv cold s':>10} {'uv cached s':>12} {'cached/cold':>12}")
    for ref in refs or [v.ref for v in m.variants if not v.ref.startswith("rlbox_sim")]:
        v = m.get(ref)
        t0 = time.monotonic()
        entry = resolve.resolve(v).entry
        whole = time.monotonic() - t0
        cache = sources.default_dest(v)
        git = {n: g["commit"] for n, g in entry["git"].items()}
        gathered = requirements.gather(v, lambda c: resolve.source_files(v, c, git[c.name], cache))
        with tempfile.TemporaryDirectory(prefix="rlbox-bench-uv-") as uv_cache:
            t0 = time.monotonic()
            section = pylock.resolve(v, gathered, cache_dir=Path(uv_cache), cache=cache)
            cold = time.monotonic() - t0
            t0 = time.monotonic()
            pylock.resolve(v, gathered, cache_dir=Path(uv_cache), cache=cache)
            warm = time.monotonic() - t0
        print(f"{ref:<30} {len(section.get('packages', {})):>8} {whole:>7.1f} {cold:>10.1f} {warm:>12.1f} {warm / cold:>12.2f}")


def shipped() -> dict:
    return {r.name: {"release": r.release, "entrypoint": list(r.entrypoint), "overrides": list(r.overrides),
                     "reaches": list(r.reaches)} for r in recipes.all_recipes()}


def timed_build(ref: str, no_cache: bool = False) -> tuple[float, list[str], str]:
    m = matrix.load(ROOT)
    p = rehearsal.plan(m, ref, shipped())
    argv = list(p.build.argv)
    if no_cache:
        argv.insert(argv.index("--load"), "--no-cache")
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"build failed: {proc.stdout[-800:]}")
    log = proc.stdout + proc.stderr
    steps = {}
    for line in log.splitlines():
        found = re.match(r"#(\d+) \[stage-0 +(\d+)/(\d+)\] (\w+) (.*)", line)
        if found:
            steps[found.group(1)] = f"{found.group(2)}/{found.group(3)} {found.group(4)} {found.group(5)[:70]}"
    cached = set(re.findall(r"^#(\d+) CACHED", log, re.M))
    rebuilt = [s for n, s in steps.items() if n not in cached]
    return took, rebuilt, p.tag


def bench_rebuild(ref: str, cold: bool) -> None:
    base_label = "cold build (--no-cache)" if cold else "no-change rebuild"
    base, _, tag = timed_build(ref, no_cache=cold)
    patch = ROOT / "patches" / "verl" / "0001-import-verl-npu-plugin.patch"
    original = patch.read_bytes()
    try:
        text = original.decode()
        # a new edit every run: the same edit twice would come from the layer cache
        patch.write_text(text.replace("\n---\n", f"\n(bench: an edited patch header, {time.time_ns()})\n---\n", 1))
        render.write(matrix.load(ROOT))
        edited, rebuilt, _ = timed_build(ref)
    finally:
        patch.write_bytes(original)
        render.write(matrix.load(ROOT))
    print(f"{base_label}: {base:.1f} s")
    print(f"after editing verl's patch 0001: {edited:.1f} s, {len(rebuilt)} steps rebuilt:")
    for s in rebuilt:
        print(f"    {s}")
    print(f"ratio edited/{'cold' if cold else 'no-change'}: {edited / base:.2f}")
    bench_size([ref])


def bench_size(refs: list[str]) -> None:
    m = matrix.load(ROOT)
    for ref in refs:
        tag = rehearsal.plan(m, ref, shipped()).tag
        out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True)
        size = int(out.stdout.strip() or 0)
        base = rehearsal.standin_base(m.get(ref))
        bout = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", base], capture_output=True, text=True)
        bsize = int(bout.stdout.strip() or 0)
        print(f"{tag}: {size / 1e9:.2f} GB (base {base}: {bsize / 1e9:.2f} GB; the image adds {(size - bsize) / 1e9:.2f} GB)")


QUICK = "rlbox_sim:amd64"

if __name__ == "__main__":
    mode, *rest = sys.argv[1:] or ["lock"]
    if mode == "--quick":
        bench_lock([QUICK])
    elif mode == "lock":
        bench_lock(rest)
    elif mode in ("rebuild", "cold"):
        bench_rebuild(rest[0] if rest else DEFAULT, cold=mode == "cold")
    elif mode == "size":
        bench_size(rest or [DEFAULT])
    else:
        raise SystemExit(__doc__)
