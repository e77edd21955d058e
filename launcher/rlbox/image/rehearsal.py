"""A real-content rehearsal of an image build: the variant's own rendered Dockerfile, the real
pinned sources and the real locked files, on a CANN stand-in base that runs here.

Only what needs the CANN compiler or the NPU runtime is switched off, by named settings listed in
the output (``build.REHEARSAL_SETTINGS`` for the build; ``CHECK_SETTINGS`` for the checks). Every
substitution is listed too: the base (a stand-in of the CANN image), and whatever the lock
records as standing in (an sdist for a git commit, PyPI's torch for the CPU build…). In the built
image the checks are: ``rlbox-verify`` (installed set == lock, pip check, pins), each git
source's version against what its release reports, and every module each shipped recipe's
entrypoint reaches, imported (``scripts/imports.py``).

``plan`` is a printable value (``rlbox rehearse --dry-run``); ``execute`` carries it out;
``judge`` turns the checks' facts into a verdict and is pure.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlbox.core.errors import RlboxError, last_line
from rlbox.image import build, emulation, sources, standins
from rlbox.image.matrix import Matrix, ResolvedVariant

STANDIN_REPO = "rlbox/cann-standin"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "imports.py"
CHECK_SETTINGS = {
    "torch-autoload-off": "checks run with TORCH_DEVICE_BACKEND_AUTOLOAD=0: `import torch` would load torch_npu's "
                          "native library, which needs the CANN runtime and the NPU driver",
    "hide-torch-npu": "the import check hides torch_npu (its native library needs libhccl/libascend_hal): code takes "
                      "its no-NPU path, and what needs torch_npu is listed as npu-runtime",
    "no-vllm-platform-plugins": "the import check runs with VLLM_PLUGINS='' (vllm_ascend's platform loads torch_npu); "
                                "vllm_ascend itself is imported and listed",
}
WORKERS = {"fsdp": "fsdp", "fsdp2": "fsdp", "megatron": "megatron"}
FIRST_PARTY = ("verl", "recipe", "verl_npu")


@dataclass(frozen=True)
class RehearsalPlan:
    ref: str
    real_base: str
    base: str
    tag: str
    settings: dict[str, str]
    substitutions: tuple[str, ...]
    missing: tuple[str, ...]
    entries: tuple[tuple[str, str, tuple[str, ...]], ...]  # (recipe, entry module, run-time modules)
    expected_versions: dict[str, str]  # distribution -> version its release reports
    build: build.BuildPlan = field(repr=False)
    standin: Standin | None = None
    also_import: tuple[str, ...] = ()  # imported beside each entry (vllm_ascend where the variant installs it)
    cpu_vllm: str = ""  # vLLM's CPU build the variant installs: its engine is started on a tiny model and generates
    imports_in: str = ""  # the image the import checks run in (a stand-in layer on the rehearsal); "" = tag

    @property
    def checked_in(self) -> str:
        """The image the import and engine checks run in."""
        return self.imports_in or self.tag

    def describe(self) -> str:
        where = f" (in {self.imports_in})" if self.imports_in else ""
        lines = [f"rehearsal of {self.ref} -> {self.tag}",
                 f"  base: {self.base} " + (f"(stand-in for {self.real_base})" if self.standin else "(the release's own)")]
        lines += [f"  off: {name}: {why}" for name, why in self.settings.items()]
        lines += [f"  substitution: {s}" for s in self.substitutions]
        lines += [f"  source cache: fetch {m}" for m in self.missing] or ["  source cache: complete"]
        if self.cpu_vllm:
            lines.append(f"  check: vLLM {self.cpu_vllm} (CPU build) starts its engine on a tiny model and generates{where}")
        lines += [f"  check: {recipe} imports from {module}" + (f" + {', '.join(extra)}" if extra else "") + where
                  for recipe, module, extra in self.entries]
        lines.append(f"  build: {self.build.command()}")
        lines.append(f"  {self.build.describe_context()}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "real_base": self.real_base, "base": self.base, "tag": self.tag,
                "settings": dict(self.settings), "substitutions": list(self.substitutions),
                "missing": list(self.missing), "entries": [[r, m, list(x)] for r, m, x in self.entries],
                "expected_versions": dict(self.expected_versions), "build": self.build.as_dict(),
                "platform": self.build.platform, "base_os": self.standin.os if self.standin else None}


@dataclass(frozen=True)
class Standin:
    """The CANN stand-in base for one variant, made by tools/make-cann-standin.sh, and, for a Python its
    plain image lacks, a layer on top of it (``python_script``: tools/make-python310-standin.sh for a
    release Python the real Dockerfile installs from Ubuntu's packages, tools/make-python-standin.sh for
    the base's own Python when it is not the stand-in's)."""
    image: str
    os: str          # its /etc/os-release ID+VERSION_ID: where an offline build finds its OS packages
    platform: str
    what: str        # what it is, for the substitution line
    os_image: str = ""  # the plain stand-in (the OS, Python 3.11, the CANN tree) when ``image`` adds a Python to it
    python_script: tuple[str, ...] = ()  # the script that adds it and its arguments before BASE IMAGE

    def script_args(self, cann: str) -> list[str]:
        return ["--platform", self.platform, "--os", self.os, cann, self.os_image or self.image]

    def python_step(self) -> tuple[str, list[str]]:
        script, *args = self.python_script
        return script, [*args, self.os_image, self.image]


# Per platform: the OS the stand-in is debootstrapped from. Ubuntu 22.04 is the real base's OS; Ubuntu's
# arm64 archive (ports.ubuntu.com) is not reachable from every build machine, Debian's is, and Debian 12
# has the base's Python 3.11 as a package (the script handles what differs: see its debian_fixups).
STANDIN_OS = {
    "linux/amd64": ("ubuntu22.04", "Ubuntu 22.04 with Python 3.11 (Ubuntu's 3.11.0rc1 package)"),
    "linux/arm64": ("debian12", "Debian 12 (bookworm) arm64 with Python 3.11 (Debian's package; Ubuntu's arm64 archive is "
                                "not reachable here), run under QEMU emulation on a non-arm64 machine"),
}
STANDIN_PYTHON = "3.11"  # the python3 of every plain stand-in (tools/make-cann-standin.sh)
# The release Pythons the real Dockerfiles install from Ubuntu 22.04's packages, which a Debian 12 stand-in
# lacks: built from Ubuntu's own source package instead (tools/make-python310-standin.sh).
FROM_SOURCE = {
    ("debian12", "3.10"): "CPython 3.10.12 as /usr/bin/python3.10, built from Ubuntu jammy-updates' python3.10 "
                          "3.10.12-1~22.04.18 source (cross-compiled for aarch64; no arm64 Python 3.10 package is "
                          "reachable here), with empty python3.10/-venv/-dev packages standing in for Ubuntu's",
}
# The base's own Python (CANN's, built from source in /usr/local/pythonX.Y.Z) where it is not the stand-in's:
# built from source the same way, from the CPython source Ubuntu ships (tools/make-python-standin.sh).
BASE_PYTHON = {
    "3.12": "CPython 3.12.3 as the base's python3 in /usr/local/python3.12.3, built from source as CANN's base "
            "images build theirs (--enable-shared, rpath) from Ubuntu noble's python3.12 3.12.3 orig tarball "
            "(python.org does not resolve here)",
}


def standin(v: ResolvedVariant) -> Standin:
    os_name, what = STANDIN_OS.get(v.platform, STANDIN_OS["linux/amd64"])
    tag = v.base_image.rsplit(":", 1)[1]
    if os_name != v.release.os:
        tag = tag.replace(v.release.os, os_name)
    arch = f"-{v.platform.rsplit('/', 1)[1]}" if v.platform != "linux/amd64" else ""  # never the x86 one's tag
    extra = FROM_SOURCE.get((os_name, v.release.python))
    if extra:
        return Standin(f"{STANDIN_REPO}:{tag}-cpython{v.release.python}{arch}", os_name, v.platform,
                       f"{what}, plus {extra}", f"{STANDIN_REPO}:{tag}{arch}", ("make-python310-standin.sh",))
    base_py = v.release.base.python
    if base_py and base_py != STANDIN_PYTHON and not v.python_from_os:  # the venv is made on the base's python3
        if base_py not in BASE_PYTHON:
            raise RlboxError(f"{v.manifest_rel}: base.python {base_py}: no stand-in makes it (tools/make-python-standin.sh "
                             f"knows {', '.join(sorted(BASE_PYTHON))}); rehearse on the real base")
        plain = tag.replace(f"py{base_py}", f"py{STANDIN_PYTHON}")  # what the plain stand-in really has
        return Standin(f"{STANDIN_REPO}:{plain}-cpython{base_py}{arch}", os_name, v.platform,
                       f"{what}, plus {BASE_PYTHON[base_py]}", f"{STANDIN_REPO}:{plain}{arch}",
                       ("make-python-standin.sh", "--platform", v.platform, base_py))
    return Standin(f"{STANDIN_REPO}:{tag}{arch}", os_name, v.platform, what)


def standin_base(v: ResolvedVariant) -> str:
    return standin(v).image


def plan(m: Matrix, ref: str, recipes: dict[str, dict], *, ca_bundle: Path | None = None) -> RehearsalPlan:
    """What ``rlbox rehearse REF`` does; ``recipes`` maps a shipped recipe's name to its record."""
    v = m.get(ref)
    no_cann = v.release.cann.version == "none"
    if no_cann and (v.lock.state != "fresh" or not v.lock.substitutions()):
        # nothing stands in for anything: a release without CANN is built for real
        raise RlboxError(f"{ref} has no CANN base to stand in for and its lock records no substitution: "
                         f"build it for real with `rlbox build {ref}`")
    if v.lock.state != "fresh" or not v.lock.pip:
        raise RlboxError(f"{v.lock.path}: {ref} has no complete lock ({v.lock.state}): run `rlbox lock {ref}` first")
    if no_cann:  # the release's own base; only what the lock records as standing in differs from a real build
        sb = None
        base = v.locked_base_image
        subs = list(v.lock.substitutions())
    else:
        sb = standin(v)
        base = sb.image
        subs = [f"base {base} for {v.base_image}: {sb.what}, a CANN tree of empty "
                "directories and set_env.sh scripts (tools/make-cann-standin.sh); no CANN binary, compiler or driver",
                *v.lock.substitutions()]
    entries = []
    for name, recipe in sorted(recipes.items()):
        if recipe.get("release") == v.release.release:
            argv = list(recipe.get("entrypoint") or [])
            if "-m" in argv:
                entries.append((name, argv[argv.index("-m") + 1], runtime_modules(recipe)))
    expected = {}
    git = {c.name for c in v.components if c.spec.git}
    for component, pin in (v.lock.section.get("provided") or {}).items():
        if component not in git:
            continue  # a PyPI pin's stand-in: rlbox-verify checks it against the lock
        dist, version = pin.split("==", 1)
        expected[dist] = version
    tag = f"localhost/rlbox-rehearsal/{v.release.image.name}:{v.tag}"
    missing = tuple(sources.missing(v, base_os=sb.os if sb else None))
    plan_ = build.plan(v, base_image=base, tags=(tag,), ca_bundle=ca_bundle, offline=True, require_sources=False,
                       rehearsal=() if no_cann else tuple(build.REHEARSAL_SETTINGS), revision=build.source_revision(m.root))
    settings = {**({} if no_cann else build.REHEARSAL_SETTINGS), **CHECK_SETTINGS}
    also = tuple(name for name in ("vllm_ascend",) if any(c.name == name for c in v.components))
    return RehearsalPlan(ref, v.base_image, base, tag, settings, tuple(subs), missing,
                         tuple(entries), expected, plan_, sb, also, standins.cpu_vllm(v))


def runtime_modules(recipe: dict) -> tuple[str, ...]:
    """What a verl job imports at run time, read from its overrides: the workers of its actor
    strategy, its rollout and the weight sync to it, its reward manager; then its ``reaches``."""
    sets = dict(o.split("=", 1) for o in recipe.get("overrides", []) if "=" in o and not o.startswith(("+", "~")))
    strategy = WORKERS.get(sets.get("actor_rollout_ref.actor.strategy", "fsdp"), "fsdp")
    rollout = sets.get("actor_rollout_ref.rollout.name", "vllm")
    manager = sets.get("reward.reward_manager.name") or sets.get("reward_model.reward_manager", "naive")
    # verl <= 0.7 lays its workers out as {strategy}_workers + sharding managers; verl 0.9 as engine_workers and
    # the reward loop's managers: both are asked, and what a verl does not have is reported as not in it
    mods = [f"verl.workers.{strategy}_workers", f"verl.workers.rollout.{rollout}_rollout",
            f"verl.workers.sharding_manager.{strategy}_{rollout}", f"verl.workers.reward_manager.{manager}",
            "verl.workers.engine_workers", f"verl.experimental.reward_loop.reward_manager.{manager}",
            "verl.utils.dataset.rl_dataset"]  # every PPO/DAPO run builds its dataset with it
    return tuple(dict.fromkeys([*mods, *recipe.get("reaches", [])]))


# ---------------------------------------------------------------------------------------------
# Judging what the checks found (pure).


def version_matches(installed: str, expected: str) -> bool:
    """vLLM's empty-target build appends a local part (``+empty``, or ``.empty`` after one)."""
    return installed == expected or installed in (f"{expected}+empty", f"{expected}.empty")


@dataclass
class Report:
    ref: str
    ok: bool
    lines: list[str]
    facts: dict[str, Any]


def judge(p: RehearsalPlan, facts: dict[str, Any]) -> Report:
    lines, ok = [], True
    verify = facts.get("verify", {})
    if verify.get("code") != 0:
        ok = False
        lines.append(f"FAIL rlbox-verify: {verify.get('output', '').strip()[-600:]}")
    else:
        # its summary, whichever order stdout and stderr (the "expected from" lines) came in
        out = verify.get("output", "").strip().splitlines() or [""]
        lines.append(f"ok   {([x for x in out if 'expected from' not in x] or out)[-1]}")
        lines += [f"     {line}" for line in verify.get("output", "").splitlines() if "expected from" in line]
    pip_check = facts.get("pip_check", "").strip()
    lines.append(f"{'ok  ' if not pip_check or pip_check.startswith('No broken') else 'note'} pip check: "
                 f"{pip_check.splitlines()[0] if pip_check else 'no output'}"
                 + (f" (+{len(pip_check.splitlines()) - 1} more, each from a recorded exclusion or stand-in)"
                    if len(pip_check.splitlines()) > 1 else ""))
    for dist, want in sorted(p.expected_versions.items()):
        have = facts.get("versions", {}).get(dist)
        good = have is not None and version_matches(have, want)
        ok &= good
        lines.append(f"{'ok  ' if good else 'FAIL'} version {dist} {have or 'not installed'} (its release reports {want})")
    for extra, have in sorted(facts.get("source_versions", {}).items()):
        lines.append(f"ok   version {extra} {have} (source on the path)")
    for recipe, module, _ in p.entries:
        found = facts.get("imports", {}).get(recipe)
        if found is None:
            ok = False
            lines.append(f"FAIL imports of {recipe}: not run")
            continue
        mods = found.get("modules", {})
        eager = {n: r for n, r in mods.items() if r.get("reached") != "lazy"}
        lazy = {n: r for n, r in mods.items() if r.get("reached") == "lazy"}
        count = {s: sum(1 for r in eager.values() if r["state"] == s)
                 for s in ("ok", "npu-runtime", "optional", "conditional", "absent", "error")}
        ok &= count["error"] == 0
        lazy_bad = {n: r for n, r in lazy.items() if r["state"] != "ok"}
        lines.append(f"{'ok  ' if not count['error'] else 'FAIL'} imports of {recipe} ({module}): {count['ok']} modules "
                     f"import, {count['npu-runtime']} need the NPU runtime, {count['optional']} optional and absent, "
                     f"{count['conditional']} on a branch not taken here, "
                     f"{count['absent']} not in this version, {count['error']} errors; "
                     f"lazily reached: {len(lazy) - len(lazy_bad)} import, {len(lazy_bad)} do not")
        for name, r in sorted(eager.items()):
            if r["state"] != "ok":
                lines.append(f"     {r['state']:<11} {name}: {r.get('error', '')[:160]}")
        for name, r in sorted(lazy_bad.items()):
            lines.append(f"     lazy {r['state']:<6} {name}: {r.get('error', '')[:160]}")
    if p.cpu_vllm:
        engine = facts.get("engine") or {"ok": False, "error": "not run"}
        ok &= bool(engine.get("ok"))
        lines.append(f"ok   engine: vLLM {engine.get('version')} on {engine.get('platform')} generated {engine.get('tokens')} "
                     "token(s) from a tiny model" if engine.get("ok") else
                     f"FAIL engine: vLLM {p.cpu_vllm} (CPU build) did not generate: {engine.get('error')}")
    timing = facts.get("timing")
    if timing:
        size = timing.get("image_bytes")
        lines.append(f"     took: build {timing.get('build_s')} s, checks {timing.get('checks_s')} s on {p.build.platform}; "
                     f"image {f'{size / 1e9:.2f} GB' if size else 'size unknown'}")
    return Report(p.ref, ok, lines, facts)


# ---------------------------------------------------------------------------------------------
# Carrying it out.


def ensure_base(p: RehearsalPlan, root: Path, cann: str, echo) -> None:
    def present(image: str) -> bool:
        return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0

    if present(p.base):
        return
    if p.standin is None and cann == "none":
        raise RlboxError(f"the base {p.base} of {p.ref} is not on this engine: make it first "
                         f"(tools/make-base-image.sh makes rlbox/debian:bookworm)")
    sb = p.standin or Standin(p.base, "", "", "")
    steps = []
    if not present(sb.os_image or sb.image):
        steps.append(("make-cann-standin.sh", p.standin.script_args(cann) if p.standin else [cann, p.base]))
    if sb.os_image:
        steps.append(sb.python_step())
    for script, args in steps:
        echo(f"making the CANN stand-in base {args[-1]} (tools/{script})")
        proc = subprocess.run(["bash", str(root / "tools" / script), *args], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RlboxError(f"tools/{script} for {args[-1]} failed: {last_line(proc.stderr or proc.stdout)}")


def run_in(image: str, argv: list[str], *, mounts: dict[str, str] | None = None,
           env: dict[str, str] | None = None, timeout: int = 1800) -> tuple[int, str]:
    import docker

    client = docker.from_env()
    box = client.containers.run(
        image, argv, entrypoint=["/usr/local/bin/rlbox-entrypoint"], detach=True, network_mode="none",
        environment={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", **(env or {})}, labels={"io.rlbox.managed": "true", "io.rlbox.task": "rehearsal"},
        volumes={host: {"bind": inside, "mode": "ro"} for host, inside in (mounts or {}).items()},
    )
    try:
        code = box.wait(timeout=timeout)["StatusCode"]
        out = box.logs(stdout=True, stderr=True).decode("utf-8", "replace")
    finally:
        box.remove(force=True)
    return code, out


VERSIONS = """
import json, sys
from importlib import metadata
out = {}
for dist in sys.argv[1:]:
    try:
        out[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
src = {}
try:
    from megatron.core import package_info
    src["megatron-core"] = package_info.__version__
except Exception:
    pass
print(json.dumps({"versions": out, "source_versions": src}))
"""


def check(p: RehearsalPlan) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    # Under emulation every import runs through QEMU: allow it four times as long.
    wait = 1800 if emulation.native(p.build.platform) else 4 * 1800
    code, out = run_in(p.tag, ["rlbox-verify", "/etc/rlbox/image.json"], timeout=wait)
    facts["verify"] = {"code": code, "output": out}
    facts["pip_check"] = run_in(p.tag, ["python3", "-m", "pip", "check"], timeout=wait)[1]
    code, out = run_in(p.tag, ["python3", "-c", VERSIONS, *p.expected_versions], timeout=wait)
    facts.update(json.loads(out.strip().splitlines()[-1]) if code == 0 else {"versions": {}, "versions_error": out[-300:]})
    facts["imports"] = {}
    for recipe, module, extra in p.entries:
        argv = ["python3", "/opt/rlbox/check/imports.py", "--path", "/opt/rlbox/src/verl", "--hide", "torch_npu"]
        for name in FIRST_PARTY:
            argv += ["--first-party", name]
        for name in extra:
            argv += ["--runtime", name]
        code, out = run_in(p.checked_in, [*argv, module, *p.also_import], mounts={str(SCRIPT.parent): "/opt/rlbox/check"},
                           env={"VLLM_PLUGINS": ""}, timeout=wait)
        # the report is the JSON object printed last, from a line of its own: warnings before it may hold braces
        found = re.search(r"^\{\s*$", out, re.M)
        start = found.start() if found else -1
        try:
            facts["imports"][recipe] = json.loads(out[start:]) if start >= 0 else {"modules": {}}
        except ValueError:
            facts["imports"][recipe] = {"modules": {module: {"state": "error", "error": last_line(out)}}}
    if p.cpu_vllm:  # the engine itself, as a rollout or `rlbox serve` starts it: what an import check cannot see
        tools = Path(__file__).resolve().parents[3] / "tools"
        code, out = run_in(p.checked_in, ["bash", "-c", "python3 /opt/rlbox/tools/make-tiny-model.py /tmp/m >/dev/null "
                                                  "&& python3 /opt/rlbox/check/vllm_generate.py /tmp/m"],
                           mounts={str(SCRIPT.parent): "/opt/rlbox/check", str(tools): "/opt/rlbox/tools"}, timeout=wait)
        # the script's one JSON line; the engine's shutdown lines may come after it
        found = [line for line in out.splitlines() if line.startswith('{"ok"')]
        try:
            facts["engine"] = json.loads(found[-1])
        except (IndexError, ValueError):
            facts["engine"] = {"ok": False, "error": last_line(out)[:300] or f"exit {code}"}
    return facts


def execute(m: Matrix, p: RehearsalPlan, *, ca_bundle: Path | None = None, echo=None, after_build=None) -> Report:
    """Build, then ``after_build()`` (e.g. a stand-in layer the import checks run in), then check."""
    echo = echo or print
    v = m.get(p.ref)
    build.require_platform(p.build.platform)  # the stand-in is made under the same emulation as the build
    ensure_base(p, m.root, v.release.cann.version, echo)
    base_os = p.standin.os if p.standin else None
    if sources.missing(v, base_os=base_os):
        echo(f"filling the source cache for {p.ref}")
        sources.fetch(v, ca_bundle=ca_bundle, base_image=p.base, base_os=base_os, echo=echo)
    started = time.monotonic()
    log: list[str] = []
    build.execute(p.build, echo=lambda line: (log.append(line), echo(line)))
    took = time.monotonic() - started
    if after_build is not None:
        after_build()
    echo(f"checking {p.tag}" + (f" (imports in {p.imports_in})" if p.imports_in else ""))
    started = time.monotonic()
    facts = check(p)
    facts["timing"] = {"build_s": round(took, 1), "checks_s": round(time.monotonic() - started, 1),
                       "image_bytes": image_size(p.tag), **build_steps(log)}
    return judge(p, facts)


def image_size(tag: str) -> int | None:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None


STEP = re.compile(r"^#(\d+) \[(?:[\w.-]+ +)?(\d+/\d+)\] (\w+) ?(.*)")
CACHED = re.compile(r"^#(\d+) CACHED\s*$")


@dataclass(frozen=True)
class BuildStep:
    """One Dockerfile step in BuildKit's plain progress log."""
    position: str  # "3/20"
    kind: str      # FROM, COPY, RUN, ...
    text: str      # the instruction's arguments
    cached: bool   # from BuildKit's cache


def parse_build_log(log: list[str]) -> list[BuildStep]:
    """The Dockerfile's steps in a BuildKit plain progress log, in the order BuildKit numbered them. Pure."""
    found: dict[str, tuple[str, str, str]] = {}
    cached: set[str] = set()
    for line in log:
        if step := STEP.match(line):
            found[step.group(1)] = step.group(2, 3, 4)
        elif hit := CACHED.match(line):
            cached.add(hit.group(1))
    return [BuildStep(position, kind, text, number in cached) for number, (position, kind, text) in found.items()]


def build_steps(log: list[str]) -> dict[str, int]:
    """How many of the Dockerfile's steps BuildKit ran and how many came from its cache, from its
    plain progress log (FROM, always reported cached, is not counted). ``steps_cached == 0``: a
    cold build, whose time is the one to compare. Pure."""
    steps = [s for s in parse_build_log(log) if s.kind != "FROM"]
    return {"steps_run": sum(not s.cached for s in steps), "steps_cached": sum(s.cached for s in steps)}


def emulation_factors(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each non-amd64 rehearsal's build time, checks time and image size against the linux/amd64
    rehearsal of the same release (the emulation factor, when the other platform ran under QEMU),
    from reports as `rlbox rehearse` writes them (``plan.ref``, ``plan.platform``,
    ``facts.timing``). A build time counts only from a cold build (no step from the cache). Pure.

    One row per non-amd64 report, in ref order: the figures of both sides and their ratios
    (None where a figure is missing, with ``missing`` saying which and why)."""
    def release(r: dict) -> str:
        return r["plan"]["ref"].split(":", 1)[0]

    def figure(r: dict | None, name: str, key: str, missing: list[str]) -> float | None:
        if r is None:
            return None
        t = (r.get("facts") or {}).get("timing") or {}
        if key == "build_s" and t.get("steps_cached"):
            missing.append(f"a cold build time of {name} (its build took {t['steps_cached']} of "
                           f"{t['steps_cached'] + t.get('steps_run', 0)} steps from the cache)")
            return None
        if not t.get(key):
            missing.append(f"{key} of {name}")
        return t.get(key) or None

    x86 = {release(r): r for r in reports if r["plan"].get("platform") == "linux/amd64"}
    rows = []
    for r in sorted(reports, key=lambda r: r["plan"]["ref"]):
        if r["plan"].get("platform") == "linux/amd64":
            continue
        twin = x86.get(release(r))
        twin_name = twin["plan"]["ref"] if twin else ""
        row: dict[str, Any] = {"ref": r["plan"]["ref"], "platform": r["plan"].get("platform"), "ok": r.get("ok"),
                               "x86_ref": twin["plan"]["ref"] if twin else None, "x86_ok": twin.get("ok") if twin else None,
                               "missing": [] if twin else [f"an amd64 rehearsal report of {release(r)}"]}
        for key in ("build_s", "checks_s", "image_bytes"):
            a = figure(r, row["ref"], key, row["missing"])
            b = figure(twin, twin_name, key, row["missing"])
            row[key], row[f"x86_{key}"], row[f"{key}_ratio"] = a, b, (round(a / b, 2) if a and b else None)
        rows.append(row)
    return rows
