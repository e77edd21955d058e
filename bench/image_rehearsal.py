"""Real-content image benchmarks (issue 11), each against a baseline measured in the same run.

    python3 bench/image_rehearsal.py lock [REF...]        lock resolution per variant: cold uv cache vs cached
    python3 bench/image_rehearsal.py rebuild [REF]        rehearsal image: no-change rebuild (baseline), then a
                                                          rebuild after editing one verl patch; steps rebuilt, ratio
                                                          (an arm64 REF: the one-patch rebuild under emulation)
    python3 bench/image_rehearsal.py cold [REF]           the same, plus a cold build (--no-cache) as the baseline
    python3 bench/image_rehearsal.py size [REF...]        image size of each rehearsal image
    python3 bench/image_rehearsal.py emulation [ARM_REF]  arm64 under emulation (QEMU) against the x86 variant of
                                                          the same release: cold build time and size of each (the
                                                          emulation factor), then a one-patch rebuild of the arm64
                                                          image (only the steps from verl on may run)
    python3 bench/image_rehearsal.py factors [DIR]        the emulation factor from the rehearsals already run: each
                                                          arm64 report in DIR (build/rehearsal) against its release's
                                                          x86 one, build time, checks time and image size, ratios
    python3 bench/image_rehearsal.py sources [REF [S|-] [--no-whole]]  issue 28, in scratch copies of the tree (the cache hard-linked):
                                                          bytes sent as build context with the checkout as context
                                                          and the whole cache mounted (the old form) vs the staged
                                                          context (issue 35: one directory per release and platform,
                                                          each RUN mounting what it reads), for the first build of
                                                          a new checkout and of a second new checkout; steps
                                                          re-run after unrelated files appear in the cache; a rebuild
                                                          after editing one patch and after bumping one component,
                                                          against REF's cold rehearsal build (its report, or S seconds)
    python3 bench/image_rehearsal.py --quick              smallest: `lock` of rlbox_sim:amd64 (PyPI only), then the
                                                          emulation factor of a fixed Python
                                                          workload in the arm64 and x86 stand-in bases, one
                                                          repetition, the size of the rehearsal images present and
                                                          `factors` of the reports present;
                                                          what is absent is skipped with its reason

REF defaults to verl_pt27_25rc3:ax-x86, ARM_REF to verl_pt27_cann82rc1:a3-arm. `rebuild`/`cold`/`emulation`
need the rehearsal's source cache and stand-in base (`make rehearse-image REF=...` once, for each
platform). The verl patch (the variant's first) is edited in place (a comment line appended to its
header) and restored, then re-rendered, whatever happens; the bench's builds are tagged apart
(`…-bench-baseline`, `…-bench-edited`, removed afterwards), never as the rehearsal's own image.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launcher"))

from rlbox.cluster import recipes  # noqa: E402
from rlbox.image import build, emulation, matrix, rehearsal, render, resolve  # noqa: E402

DEFAULT = "verl_pt27_25rc3:ax-x86"
ARM_DEFAULT = "verl_pt27_cann82rc1:a3-arm"
DEFAULT_SOURCES = "verl_pt210_cann910:ax-x86"  # PyPI only: its cache fills on a fresh machine
# A fixed CPU-bound Python workload for --quick (pure interpreter: what pip and setuptools do under QEMU).
# Timed inside the container (container start-up is not part of it).
WORKLOAD = "import hashlib, json, time; t = time.perf_counter(); d = [{'k': i, 'v': str(i) * 8} for i in range(200000)]; " \
           "hashlib.sha256(json.dumps(d).encode()).hexdigest(); sorted(d, key=lambda x: -x['k']); " \
           "print(time.perf_counter() - t)"


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


def timed_build(ref: str, no_cache: bool = False, tag: str | None = None) -> tuple[float, list[str], str]:
    """Build ``ref``'s rehearsal image (tagged ``tag`` instead of the rehearsal's own tag if given):
    seconds, the steps that ran (not from the cache), the tag."""
    m = matrix.load(ROOT)
    p = rehearsal.plan(m, ref, shipped())
    argv = list(p.build.argv)
    if no_cache:
        argv.insert(argv.index("--load"), "--no-cache")
    if tag:
        argv[argv.index("--tag") + 1] = tag
    with build.staged(p.build, lambda line: None):  # the build context, staged as `rlbox build` does
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True)
        took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"build failed: {proc.stdout[-800:]}")
    rebuilt = [f"{s.position} {s.kind} {s.text[:70]}"
               for s in rehearsal.parse_build_log((proc.stdout + proc.stderr).splitlines()) if not s.cached]
    return took, rebuilt, tag or p.tag


def verl_patch(ref: str) -> Path:
    """The first verl patch the variant applies (the one a one-patch rebuild edits)."""
    v = matrix.load(ROOT).get(ref)
    for c in v.components:
        if c.name == "verl" and c.spec.patches:
            return ROOT / "patches" / "verl" / c.spec.patches[0]
    raise SystemExit(f"{ref} applies no verl patch")


def edited_rebuild(ref: str) -> tuple[float, list[str], Path]:
    """Rebuild ``ref`` after a new edit of its first verl patch (restored afterwards). The edited
    image is tagged apart (``…-bench-edited``, removed afterwards): the rehearsal's own tag keeps
    the image its report describes."""
    patch = verl_patch(ref)
    original = patch.read_bytes()
    tag = rehearsal.plan(matrix.load(ROOT), ref, shipped()).tag + "-bench-edited"
    try:
        text = original.decode()
        # a new edit every run: the same edit twice would come from the layer cache
        patch.write_text(text.replace("\n---\n", f"\n(bench: an edited patch header, {time.time_ns()})\n---\n", 1))
        render.write(matrix.load(ROOT))
        edited, rebuilt, _ = timed_build(ref, tag=tag)
    finally:
        patch.write_bytes(original)
        render.write(matrix.load(ROOT))
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)
    return edited, rebuilt, patch


def bench_rebuild(ref: str, cold: bool) -> None:
    base_label = "cold build (--no-cache)" if cold else "no-change rebuild"
    tag = rehearsal.plan(matrix.load(ROOT), ref, shipped()).tag + "-bench-baseline"
    try:
        base, steps, _ = timed_build(ref, no_cache=cold, tag=tag)
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)
    edited, rebuilt, patch = edited_rebuild(ref)
    print(f"{base_label} ({platform_of(ref)}): {base:.1f} s, {len(steps)} steps ran")
    print(f"after editing verl's patch {patch.name} ({platform_of(ref)}): {edited:.1f} s, {len(rebuilt)} steps rebuilt:")
    for s in rebuilt:
        print(f"    {s}")
    print(f"ratio edited/{'cold' if cold else 'no-change'}: {edited / base:.2f}")
    bench_size([ref])


def platform_of(ref: str) -> str:
    platform = matrix.load(ROOT).get(ref).platform
    return platform if emulation.native(platform) else f"{platform} under emulation"


def bench_size(refs: list[str]) -> None:
    m = matrix.load(ROOT)
    for ref in refs:
        tag = rehearsal.plan(m, ref, shipped()).tag
        size = rehearsal.image_size(tag)
        if size is None:
            print(f"{tag}: skipped, no such image (make rehearse-image REF={ref})")
            continue
        base = rehearsal.standin_base(m.get(ref))
        bsize = rehearsal.image_size(base) or 0
        print(f"{tag}: {size / 1e9:.2f} GB (base {base}: {bsize / 1e9:.2f} GB; the image adds {(size - bsize) / 1e9:.2f} GB)")


QUICK = "rlbox_sim:amd64"
REPORTS = ROOT / "build" / "rehearsal"


def x86_twin(ref: str) -> str:
    """The linux/amd64 variant of ``ref``'s release (ax-x86 for a2-arm/a3-arm)."""
    m = matrix.load(ROOT)
    release = m.get(ref).release.release
    for v in m.variants:
        if v.release.release == release and v.platform == "linux/amd64":
            return v.ref
    raise SystemExit(f"{release} has no linux/amd64 variant to compare {ref} with")


def bench_emulation(arm_ref: str) -> None:
    """Cold builds (--no-cache) of the arm64 variant under emulation and of its release's x86 one,
    sizes, the factor; then a one-patch rebuild under emulation."""
    x86_ref = x86_twin(arm_ref)
    m = matrix.load(ROOT)
    for ref in (x86_ref, arm_ref):
        p = rehearsal.plan(m, ref, shipped())
        if p.missing or rehearsal.image_size(p.base) is None:
            raise SystemExit(f"{ref}: its source cache or stand-in base is missing: run `make rehearse-image REF={ref}` first")
    build.require_platform(m.get(arm_ref).platform)
    x86_s, _, x86_tag = timed_build(x86_ref, no_cache=True)
    arm_s, _, arm_tag = timed_build(arm_ref, no_cache=True)
    x86_b, arm_b = rehearsal.image_size(x86_tag) or 0, rehearsal.image_size(arm_tag) or 0
    print(f"cold build {x86_ref} (native x86_64): {x86_s:.1f} s, image {x86_b / 1e9:.2f} GB")
    print(f"cold build {arm_ref} (linux/arm64 under QEMU): {arm_s:.1f} s, image {arm_b / 1e9:.2f} GB")
    print(f"emulation factor (arm64 cold / x86 cold): {arm_s / x86_s:.2f}; size arm64/x86: {arm_b / max(x86_b, 1):.2f}")
    edited, rebuilt, patch = edited_rebuild(arm_ref)
    print(f"after editing verl's patch {patch.name}, under emulation: {edited:.1f} s, {len(rebuilt)} steps rebuilt:")
    for s in rebuilt:
        print(f"    {s}")
    print(f"ratio one-patch rebuild / cold build (arm64): {edited / arm_s:.3f}")


def bench_factors(folder: Path) -> None:
    """The emulation factor as the rehearsals measured it: each arm64 rehearsal report's build time,
    checks time and image size against its release's x86 one (same machine; the load of the moment
    is in the reports' figures, not controlled)."""
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    rows = rehearsal.emulation_factors(reports)
    if not rows:
        print(f"factors: skipped, no arm64 rehearsal report in {folder} (make rehearse-image REF=RELEASE:a3-arm)")
        return

    def fig(v, unit):
        return "-" if v is None else (f"{v / 1e9:.2f} GB" if unit == "GB" else f"{v:.0f} s")

    def ratio(v):
        return "-" if v is None else f"{v:.2f}"

    print(f"{'arm64 rehearsal (QEMU)':<30} {'verdict':<7} {'build':>7} {'x86':>7} {'ratio':>6} "
          f"{'checks':>7} {'x86':>6} {'ratio':>6} {'image':>8} {'x86':>8} {'ratio':>6}")
    for r in rows:
        verdict = {True: "GREEN", False: "RED"}.get(r["ok"], "?")
        print(f"{r['ref']:<30} {verdict:<7} {fig(r['build_s'], 's'):>7} {fig(r['x86_build_s'], 's'):>7} "
              f"{ratio(r['build_s_ratio']):>6} {fig(r['checks_s'], 's'):>7} {fig(r['x86_checks_s'], 's'):>6} "
              f"{ratio(r['checks_s_ratio']):>6} {fig(r['image_bytes'], 'GB'):>8} {fig(r['x86_image_bytes'], 'GB'):>8} "
              f"{ratio(r['image_bytes_ratio']):>6}")
        if r["x86_ref"]:
            print(f"    against {r['x86_ref']} ({'GREEN' if r['x86_ok'] else 'RED'}, native x86_64)")
        for what in r["missing"]:
            print(f"    missing: {what}")


def bench_quick() -> None:
    """Smallest: one run of a fixed Python workload in each platform's stand-in base (the CPU
    emulation factor), and the sizes of the rehearsal images present; absent ones are skipped."""
    m = matrix.load(ROOT)
    arm = rehearsal.standin_base(m.get(ARM_DEFAULT))
    x86 = rehearsal.standin_base(m.get(x86_twin(ARM_DEFAULT)))
    times = {}
    for platform, image in (("linux/amd64", x86), ("linux/arm64", arm)):
        if rehearsal.image_size(image) is None:
            print(f"{platform}: skipped, no stand-in base {image} (make rehearse-image makes it)")
            continue
        if emulation.judge(platform, emulation.gather()):
            print(f"{platform}: skipped, {emulation.judge(platform, emulation.gather())}")
            continue
        proc = subprocess.run(["docker", "run", "--rm", "--network", "none", "--platform", platform, image,
                               "python3", "-c", WORKLOAD], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"workload in {image} failed: {proc.stderr[-300:]}")
        times[platform] = float(proc.stdout.strip().splitlines()[-1])
        print(f"{platform}: a fixed Python workload in {image}: {times[platform]:.2f} s")
    if len(times) == 2:
        print(f"emulation factor, Python workload (arm64 / x86): {times['linux/arm64'] / times['linux/amd64']:.2f}")
    bench_size([x86_twin(ARM_DEFAULT), ARM_DEFAULT])
    bench_factors(REPORTS)


# ---------------------------------------------------------------------------------------------
# issue 28: what the build context carries and what a change in the source cache rebuilds.

WHOLE = "--mount=type=bind,source=.rlbox-sources,target=/opt/rlbox/sources"
CONTEXT = re.compile(r"^#\d+ transferring context: ([\d.]+)([kMG]?B)")
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def scratch_tree(dest: Path) -> Path:
    """A copy of the tree's build inputs in ``dest`` (a new directory, as a fresh checkout: every file
    written anew, with a new mtime, as `git clone` writes them), the source cache hard-linked (new
    files there stay out of the real cache; never edit one in place)."""
    dest.mkdir(parents=True)
    for name in ("images", "templates", "patches", "dockerfiles", "tools"):
        shutil.copytree(ROOT / name, dest / name, symlinks=True, copy_function=shutil.copy)
    shutil.copy(ROOT / ".dockerignore", dest / ".dockerignore")
    subprocess.run(["cp", "-al", str(ROOT / ".rlbox-sources"), str(dest / ".rlbox-sources")], check=True)
    return dest


def build_in(tree: Path, ref: str, tag: str, *, stop_after_context: bool = False, checkout_context: bool = False) -> dict:
    """The rehearsal build of ``ref`` in ``tree``: seconds, context bytes, steps (run or cached, with
    their seconds). With ``stop_after_context`` the build is stopped once the context is sent. The
    context is staged as `rlbox build` stages it (rlbox.image.context: one directory per release and
    platform, whatever the checkout), or with ``checkout_context`` the checkout itself (the old form)."""
    p = rehearsal.plan(matrix.load(tree), ref, shipped())
    argv = list(p.build.argv)
    argv[argv.index("--tag") + 1] = tag
    if stop_after_context:
        argv[argv.index("--load")] = "--output=type=cacheonly"
    trace = open(Path(tempfile.gettempdir()) / f"rlbox-bench-sources-{ref.replace(':', '-')}.log", "a")  # to follow it
    with contextlib.ExitStack() as held:
        if checkout_context:
            argv[-1] = str(tree)
        else:
            held.enter_context(build.staged(p.build, lambda line: trace.write(line + "\n")))
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tree)
        log, sent = [], 0.0
        for line in proc.stdout:
            trace.write(line)
            trace.flush()
            log.append(line.rstrip("\n"))
            hit = CONTEXT.match(line)
            if hit and line.rstrip().endswith("done"):
                sent += float(hit.group(1)) * UNITS[hit.group(2)]
                if stop_after_context and sent > 1000:  # the context proper, not the Dockerfile's 2 B
                    proc.terminate()
        code = proc.wait()
        took = time.monotonic() - t0
    trace.close()
    if code != 0 and not stop_after_context:
        raise SystemExit(f"build of {ref} in {tree} failed:\n" + "\n".join(log[-30:]))
    steps = [s for s in rehearsal.parse_build_log(log) if s.kind != "FROM"]
    done = {m.group(1): float(m.group(2)) for m in map(re.compile(r"^#(\d+) DONE ([\d.]+)s").match, log) if m}
    numbers = {f"{m.group(2)}": m.group(1) for m in map(rehearsal.STEP.match, log) if m}
    timed = [(s, done.get(numbers.get(s.position, ""), 0.0)) for s in steps]
    return {"s": took, "context_bytes": sent, "steps": timed, "log": log}


def bench_sources(ref: str, cold_s: float | None = None, skip_whole: bool = False) -> None:
    """``cold_s``: the cold build's seconds, when not from REF's rehearsal report (its checks still running);
    ``skip_whole``: no build context of the old form (it sends the whole cache)."""
    report = REPORTS / f"{ref.replace(':', '-')}.json"
    cold = json.loads(report.read_text())["facts"]["timing"] if report.is_file() else {}
    if cold_s:
        cold = {"build_s": cold_s}
    if not cold.get("build_s") or cold.get("steps_cached"):
        raise SystemExit(f"{ref}: no cold rehearsal build in {report} (make rehearse-image REF={ref} on an empty cache)")
    work = Path(tempfile.mkdtemp(prefix="rlbox-bench-sources-", dir=ROOT / "build"))
    tag = rehearsal.plan(matrix.load(ROOT), ref, shipped()).tag + "-bench-sources"
    try:
        # 1. context bytes: the old form (the whole cache mounted) against this one, each from a new directory
        whole = {"context_bytes": 0.0}
        if not skip_whole:
            old = scratch_tree(work / "whole")
            dockerfile = old / matrix.load(old).get(ref).dockerfile
            dockerfile.write_text(re.sub(r"--mount=type=bind,source=\.rlbox-sources/\S+,target=/opt/rlbox/sources/\S+",
                                         WHOLE, dockerfile.read_text()))
            whole = build_in(old, ref, tag, stop_after_context=True, checkout_context=True)
            shutil.rmtree(old)
        tree = scratch_tree(work / "narrow")
        narrow = build_in(tree, ref, tag)
        # ... and a second new checkout: its first build, through the staged context the first one left
        fresh_tree = scratch_tree(work / "fresh")
        fresh = build_in(fresh_tree, ref, tag)
        shutil.rmtree(fresh_tree)
        print(f"{ref} ({platform_of(ref)}), cold build ({'given' if cold_s else 'its rehearsal report'}): "
              f"{cold['build_s']:.0f} s", flush=True)
        if not skip_whole:
            print(f"build context, the checkout, whole cache mounted (before):  {whole['context_bytes'] / 1e6:10.1f} MB")
        print(f"build context, staged ({rehearsal.plan(matrix.load(ROOT), ref, shipped()).build.context}), "
              f"each RUN mounting what it reads:")
        ratio = f" (ratio {narrow['context_bytes'] / whole['context_bytes']:.3f})" if whole["context_bytes"] else ""
        print(f"    first build of a new checkout:              {narrow['context_bytes'] / 1e6:10.2f} MB{ratio}; "
              f"{sum(not s.cached for s, _ in narrow['steps'])} of {len(narrow['steps'])} steps re-run, {narrow['s']:.1f} s")
        print(f"    first build of a second new checkout:       {fresh['context_bytes'] / 1e6:10.2f} MB; "
              f"{sum(not s.cached for s, _ in fresh['steps'])} of {len(fresh['steps'])} steps re-run, {fresh['s']:.1f} s")
        # 2. unrelated files in the cache: another platform's wheel, another component's repository, another sdist
        cache = tree / ".rlbox-sources"
        other = "aarch64" if matrix.load(tree).get(ref).arch == "x86_64" else "x86_64"
        (cache / "wheels" / f"{other}-py3.11").mkdir(parents=True, exist_ok=True)
        (cache / "wheels" / f"{other}-py3.11" / "unrelated-1.0-py3-none-any.whl").write_bytes(os.urandom(1 << 20))
        (cache / "git" / f"unrelated-{'0' * 40}.git").mkdir(parents=True)
        (cache / "git" / f"unrelated-{'0' * 40}.git" / "HEAD").write_text("ref: refs/heads/main\n")
        (cache / "sdist" / "unrelated-1.0.tar.gz").write_bytes(os.urandom(1 << 20))
        touched = build_in(tree, ref, tag)
        rerun = [s for s, _ in touched["steps"] if not s.cached]
        print(f"after 3 unrelated files in the cache: {len(rerun)} of {len(touched['steps'])} steps re-run, "
              f"context {touched['context_bytes'] / 1e6:.2f} MB, {touched['s']:.1f} s")
        # 3. one patch: a patch of the last component built from a source, added (the release has none)
        name, path = patched_component(tree, ref)
        edit_patch(tree, ref, name, path, "rlbox bench: a patch")
        show(f"one patch of {name} added", build_in(tree, ref, tag), cold["build_s"])
        # 4. one component bumped: the same component's source replaced by a new one (its sdist repacked with
        #    one more file, the lock's sha256 changed; or a new commit of its repository)
        bump_component(tree, ref, name)
        show(f"{name} bumped (new source, same requirements)", build_in(tree, ref, tag), cold["build_s"])
        # 5. that patch edited
        edit_patch(tree, ref, name, path, "rlbox bench: the patch edited")
        show(f"one patch of {name} edited", build_in(tree, ref, tag), cold["build_s"])
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def show(what: str, r: dict, cold_s: float) -> None:
    ran = [(s, t) for s, t in r["steps"] if not s.cached]
    print(f"{what}: {r['s']:.1f} s = {r['s'] / cold_s:.3f} of the cold build; {len(ran)} of {len(r['steps'])} steps ran:")
    for s, t in ran:
        print(f"    {s.position:>6} {t:7.1f} s  {s.kind} {s.text[:90]}")
    print(f"    the rest (context, cache lookups, export and load into the engine): {r['s'] - sum(t for _, t in ran):.1f} s")
    sys.stdout.flush()


def patched_component(tree: Path, ref: str) -> tuple[str, str]:
    """The last component built from a source (git or stand-in sdist), and a file of it to patch."""
    v = matrix.load(tree).get(ref)
    c = [c for c in v.components if c.spec.git][-1]
    return c.name, "setup.py"


def source_text(tree: Path, ref: str, name: str, path: str) -> str:
    from rlbox.image import sources

    v = matrix.load(tree).get(ref)
    c = next(c for c in v.components if c.name == name)
    standin = sources.standin_of(v, name)
    if standin:
        with tarfile.open(tree / ".rlbox-sources" / "sdist" / standin["file"]) as tar:
            member = next(m for m in tar.getmembers() if m.name.split("/", 1)[-1] == path)
            return tar.extractfile(member).read().decode()
    git = sources.git_dir(tree / ".rlbox-sources", name, c.spec.commit)
    return subprocess.run(["git", "--git-dir", str(git), "show", f"{c.spec.commit}:{path}"], capture_output=True,
                          text=True, check=True).stdout


def edit_patch(tree: Path, ref: str, name: str, path: str, comment: str) -> None:
    """patches/NAME/9999-rlbox-bench.patch adding a comment line at the top of ``path``; listed in the
    release's manifest (patches do not change a lock); re-rendered."""
    import difflib

    before = source_text(tree, ref, name, path).splitlines(keepends=True)
    after = [f"# {comment} ({time.time_ns()})\n", *before]
    patch = "".join(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}", n=3))
    (tree / "patches" / name).mkdir(parents=True, exist_ok=True)
    (tree / "patches" / name / "9999-rlbox-bench.patch").write_text(patch)
    manifest = tree / "images" / f"{ref.split(':')[0]}.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["components"][name]["patches"] = ["9999-rlbox-bench.patch"]
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    render.write(matrix.load(tree))


def bump_component(tree: Path, ref: str, name: str) -> None:
    from rlbox.image import sources

    release, variant = ref.split(":")
    lock = tree / "images" / "lock" / f"{release}.json"
    data = json.loads(lock.read_text())
    standin = data["variants"][variant]["git"][name].get("standin")
    if not standin:
        raise SystemExit(f"{name}: a bump of a git component needs a new commit in its cached repository (not done here)")
    sdist = tree / ".rlbox-sources" / "sdist" / standin["file"]
    stem = standin["file"][: -len(".tar.gz")]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tar", "-xzf", str(sdist), "-C", tmp], check=True)
        top = next(Path(tmp).iterdir())
        (top / "RLBOX-BENCH-BUMP").write_text(f"{time.time_ns()}\n")
        sdist.unlink()  # hard-linked to the real cache: a new file, never an edit in place
        subprocess.run(["tar", "-czf", str(sdist), "-C", tmp, top.name], check=True)
    standin["sha256"] = sources.sha256(sdist)
    lock.write_text(json.dumps(data, indent=1) + "\n")
    render.write(matrix.load(tree))
    print(f"bumped {name}: {stem} repacked with one more file, lock sha256 {standin['sha256'][:12]}")


if __name__ == "__main__":
    mode, *rest = sys.argv[1:] or ["lock"]
    if mode == "--quick":
        bench_lock([QUICK])
        bench_quick()
    elif mode == "emulation":
        bench_emulation(rest[0] if rest else ARM_DEFAULT)
    elif mode == "factors":
        bench_factors(Path(rest[0]) if rest else REPORTS)
    elif mode == "lock":
        bench_lock(rest)
    elif mode in ("rebuild", "cold"):
        bench_rebuild(rest[0] if rest else DEFAULT, cold=mode == "cold")
    elif mode == "sources":
        bench_sources(rest[0] if rest else DEFAULT_SOURCES, float(rest[1]) if len(rest) > 1 and rest[1] != "-" else None,
                      skip_whole="--no-whole" in rest)
    elif mode == "size":
        bench_size(rest or [DEFAULT])
    else:
        raise SystemExit(__doc__)
