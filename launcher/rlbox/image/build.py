"""Build an image: a pure plan (the exact buildx command) and a thin executor that runs it."""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rlbox.core import quote
from rlbox.core.errors import RlboxError
from rlbox.image import context as build_context
from rlbox.image import emulation, lockfile, mirrors, render, sources
from rlbox.image.matrix import Matrix, ResolvedVariant
from rlbox.image.mirrors import SOURCES_DIR

# What a rehearsal build (on a CANN stand-in base, `rlbox rehearse`) may switch off, and why.
REHEARSAL_SETTINGS = {
    "no-custom-kernels": "vllm-ascend builds without its custom AscendC kernels (COMPILE_CUSTOM_KERNELS=0): "
                         "they need the CANN compiler, which the stand-in base does not have",
}

# Lines our in-image scripts print when they stop a build (rlbox-apply-patches, rlbox-verify...).
_SCRIPT_ERROR = re.compile(r"rlbox error: (.*)")


@dataclass(frozen=True)
class BuildPlan:
    ref: str
    argv: tuple[str, ...]
    dockerfile: Path
    context: Path
    platform: str
    tags: tuple[str, ...]
    push: bool
    build_args: dict[str, str] = field(default_factory=dict)
    output: str = "load"  # "load", "push", "digest" (push by digest to `repository`) or "none"
    repository: str | None = None
    # what the Dockerfile bind-mounts from the source cache (relative to it), checked before BuildKit starts
    mounts: tuple[str, ...] = ()
    offline: bool = False
    # the checkout the build reads, and what of it the executor stages into ``context`` (rlbox.image.context)
    root: Path | None = None
    stage: tuple[str, ...] = ()

    def describe_output(self) -> str:
        """Where the result goes, for humans: the tags, the repository pushed by digest, or nowhere."""
        if self.output == "digest":
            return f"{self.repository}@<digest> (pushed by digest)"
        if self.output == "none":
            return "BuildKit's cache only (neither loaded nor pushed)"
        return ", ".join(self.tags)

    def command(self) -> str:
        return shlex.join(self.argv)

    def describe(self) -> str:
        """What --dry-run prints: the exact build command."""
        return self.command()

    def describe_context(self) -> str:
        """Where the build context comes from: staged from the checkout just before the build."""
        return (f"build context {self.context}: staged from {self.root} before the build, an exact mirror "
                f"(hard-linked) of {len(self.stage)} paths: {', '.join(self.stage)}")

    def as_dict(self) -> dict:
        return {"ref": self.ref, "argv": list(self.argv), "dockerfile": str(self.dockerfile), "context": str(self.context),
                "platform": self.platform, "tags": list(self.tags), "output": self.output, "repository": self.repository,
                "build_args": dict(self.build_args), "mounts": list(self.mounts),
                "root": str(self.root) if self.root else None, "stage": list(self.stage)}


def plan(
    variant: ResolvedVariant,
    *,
    platform: str | None = None,
    base_image: str | None = None,
    tags: tuple[str, ...] = (),
    pip_index: str | None = None,
    apt_mirror: str | None = None,
    git_mirror: str | None = None,
    hf_endpoint: str | None = None,
    ca_bundle: Path | None = None,
    push: bool = False,
    push_by_digest: str | None = None,
    load: bool = True,
    cache_from: tuple[str, ...] = (),
    cache_to: tuple[str, ...] = (),
    metadata_file: Path | None = None,
    network: str | None = None,
    offline: bool = False,
    revision: str | None = None,
    no_cache: bool = False,
    rehearsal: tuple[str, ...] = (),
    require_sources: bool = True,
    docker: str = "docker",
    context_base: Path | None = None,
) -> BuildPlan:
    """The exact ``docker buildx build`` for one variant. Pure: reads no image, runs nothing.

    Output, one of: load into the local engine (default); ``push`` the tags; ``push_by_digest``
    REPO (an untagged push whose digest lands in ``metadata_file``, tagged afterwards with
    ``docker buildx imagetools create``, as CI does); or ``load=False``: keep the result in
    BuildKit's cache only (a build check; ``cache_to`` still exports the layers).

    The build context is not the checkout but the directory of the release and platform under
    ``context_base`` (default: rlbox's cache), which ``execute`` stages from the checkout first
    (rlbox.image.context): its path, and so BuildKit's copy of it, is the same from every checkout.
    """
    platform = platform or variant.platform
    if platform not in variant.hardware.platforms:
        raise RlboxError(
            f"--platform {platform} does not fit {variant.ref}: hardware {variant.hardware_name} "
            f"runs {', '.join(variant.hardware.platforms)}"
        )
    dockerfile = variant.root / variant.dockerfile
    if not dockerfile.is_file():
        raise RlboxError(f"{variant.dockerfile} is missing: run `rlbox render` first")
    if ca_bundle is not None:
        ca_bundle = Path(ca_bundle).resolve()
        if not ca_bundle.is_file():
            raise RlboxError(f"--ca-bundle {ca_bundle}: no such file (give a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt)")
    if push and push_by_digest:
        raise RlboxError("--push and --push-by-digest exclude each other: give one")
    if push_by_digest and tags:
        raise RlboxError(
            "--tag does nothing with --push-by-digest: the image is pushed untagged; "
            "tag its digest afterwards (docker buildx imagetools create -t TAG REPO@DIGEST)"
        )
    if push_by_digest:
        try:  # it becomes name=VALUE of a buildx --output: no ',' or '=' to add or change an attribute
            quote.buildx_value(push_by_digest, "--push-by-digest")
        except ValueError as err:
            raise RlboxError(str(err)) from None
    if push_by_digest and (":" in push_by_digest.rsplit("/", 1)[-1] or "@" in push_by_digest):
        raise RlboxError(f"--push-by-digest {push_by_digest}: give a repository without tag or digest")
    if not load and (push or push_by_digest):
        raise RlboxError("--no-load with --push/--push-by-digest: a pushed image is not loaded anyway; drop --no-load")
    output = "digest" if push_by_digest else "push" if push else "load" if load else "none"
    tags = () if push_by_digest else tuple(tags) or (variant.image,)
    args: dict[str, str] = {}
    if base_image:
        args["BASE_IMAGE"] = base_image
    for key, value in (
        ("PIP_INDEX", pip_index),
        ("APT_MIRROR", apt_mirror),
        ("GIT_MIRROR", git_mirror),
        ("HF_ENDPOINT", hf_endpoint),
    ):
        if value:
            args[key] = value
    if offline:
        # Air-gapped: no network for any RUN; every source comes from .rlbox-sources.
        if network not in (None, "none"):
            raise RlboxError(f"--network {network} contradicts an offline build, which runs with no network")
        gaps = sources.missing(variant) if require_sources else []
        if gaps:
            raise RlboxError(offline_gap(variant.ref, gaps))
        network = "none"
        args["RLBOX_OFFLINE"] = "1"
    if rehearsal:
        unknown = sorted(set(rehearsal) - set(REHEARSAL_SETTINGS))
        if unknown:
            raise RlboxError(f"rehearsal setting '{unknown[0]}' does not exist; known: {', '.join(REHEARSAL_SETTINGS)}")
        args["RLBOX_REHEARSAL"] = " ".join(rehearsal)
    args["RLBOX_REVISION"] = revision or "unknown"
    argv = [docker, "buildx", "build", "--progress", "plain", "--platform", platform, "--file", str(dockerfile)]
    for tag in tags:
        argv += ["--tag", tag]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    if ca_bundle is not None:
        argv += ["--secret", f"id=ca,src={ca_bundle}"]
    if network:
        argv += ["--network", network]
    if no_cache:
        argv.append("--no-cache")
    for spec in cache_from:
        argv += ["--cache-from", spec]
    for spec in cache_to:
        argv += ["--cache-to", spec]
    if metadata_file is not None:
        argv += ["--metadata-file", str(metadata_file)]
    if output == "digest":
        argv += ["--output", f"type=image,name={push_by_digest},push-by-digest=true,name-canonical=true,push=true"]
    elif output == "none":
        argv += ["--output", "type=cacheonly"]
    else:
        argv.append("--push" if push else "--load")
    context_dir = build_context.directory(variant.release.release, platform, context_base)
    argv.append(str(context_dir))
    return BuildPlan(
        variant.ref, tuple(argv), dockerfile, context_dir, platform, tags, output in ("push", "digest"), args,
        output, push_by_digest, tuple(sources.mounts(variant)), offline, variant.root, build_context.inputs(variant),
    )


def source_revision(root: Path) -> str:
    """The rlbox commit the build comes from (``-dirty`` when images/, templates/, patches/ or
    dockerfiles/ have uncommitted changes), or ``unknown`` outside a git checkout."""
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "images", "templates", "patches", "dockerfiles"],
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def prepare(m: Matrix, ref: str, *, mirror: str | None = None, warn=None, dry_run: bool = False, **options) -> BuildPlan:
    """The plan for ``rlbox build REF``, behind the gates every build passes: the mirror
    profile named ``mirror`` (images/mirrors.yaml) fills what the options leave open; a stale lock or a generated file out of date
    with images/ stops the build, and so does a missing lock (the build installs exactly the lock) or, unless this is
    a rehearsal, a lock holding substitutions (a dry run only warns of those)."""
    variant = m.get(ref)
    mirror = mirrors.get(m.root, mirror) if mirror else None
    if mirror is not None:
        for key, value in (("pip_index", mirror.pip_index), ("apt_mirror", mirror.apt_for(variant.release.os, variant.arch)),
                           ("git_mirror", mirror.git_mirror), ("hf_endpoint", mirror.hf_endpoint)):
            options[key] = options.get(key) or value
        rewritten = mirror.image(variant.locked_base_image)
        if options.get("base_image") is None and rewritten != variant.locked_base_image:
            options["base_image"] = rewritten
    if variant.lock.state == "stale":
        raise RlboxError(lockfile.Problem(variant.ref, variant.lock.path, "stale").line() + " before building")
    drift = [d for d in render.check(m) if d.path.parent == variant.dockerfile.parent]
    if drift:
        raise RlboxError(f"{drift[0].path} is {drift[0].state}: run `rlbox render` before building {ref}")
    if variant.lock.state == "missing":
        raise RlboxError(lockfile.Problem(variant.ref, variant.lock.path, "missing").line()
                         + " before building (the build installs exactly the lock)")
    planned = plan(variant, offline=bool(mirror and mirror.offline), revision=source_revision(m.root), **options)
    subs = variant.lock.substitutions()
    if subs and not options.get("rehearsal"):
        line = (f"{variant.lock.path}: the lock of {ref} holds {len(subs)} substitution(s) ({subs[0].split(' (')[0]}): "
                f"a release image needs the real thing; lock where its sources are reachable, "
                f"or rehearse it with `rlbox rehearse {ref}`")
        if not dry_run:
            raise RlboxError(line)
        if warn is not None:
            warn(line)
    return planned


def execute(build: BuildPlan, *, echo=None) -> None:
    """Run the plan, streaming BuildKit's log; a failure becomes one line naming its cause."""
    echo = echo or (lambda line: print(line, file=sys.stderr))
    docker = build.argv[0]
    if shutil.which(docker) is None:
        raise RlboxError(f"`{docker}` not found: install the Docker CLI with the buildx plugin")
    require_platform(build.platform, docker)
    probe = subprocess.run([docker, "buildx", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise RlboxError("docker buildx is not available: install the buildx plugin (see README, 'Set up')")
    tail: deque[str] = deque(maxlen=60)
    cause = None
    with staged(build, echo):
        proc = subprocess.Popen(build.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        try:
            for line in proc.stdout:
                line = line.rstrip("\n")
                echo(line)
                tail.append(line)
                match = _SCRIPT_ERROR.search(line)
                if match:
                    cause = match.group(1)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise RlboxError(f"build of {build.ref} interrupted", exit_code=130) from None
    if code != 0:
        if cause is None:
            cause = _generic_cause(tail)
        raise RlboxError(f"build of {build.ref} failed: {cause}", exit_code=1)


@contextlib.contextmanager
def staged(build: BuildPlan, echo):
    """Held while the build runs: the context directory's lock, taken before it is staged from the
    checkout (after the source cache's mounted paths are made present: ``mount_sources``)."""
    with build_context.held(build.context, echo):
        mount_sources(build, echo)
        if build.root is not None:
            echo(f"rlbox: build context {build.context}: "
                 f"{build_context.stage(build.root, build.stage, build.context).line()}")
        yield build.context


def mount_sources(build: BuildPlan, echo) -> None:
    """Every path of the source cache the Dockerfile bind-mounts must exist, or BuildKit stops with
    "not found". Offline: one line naming the first absent one and the command that fetches it.
    Online (the build downloads instead): absent ones are made empty, named in one line."""
    cache = (build.root or build.context) / SOURCES_DIR
    absent = [p for p in build.mounts if not (cache / p).exists()]
    if not absent:
        return
    if build.offline:
        raise RlboxError(offline_gap(build.ref, absent))
    more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
    sources.make_placeholders(cache, absent)
    echo(f"rlbox: {SOURCES_DIR}/{absent[0]}{more} not in the source cache: mounted empty, this build downloads "
         f"instead (`rlbox fetch-sources {build.ref}` fills it)")


def offline_gap(ref: str, gaps: list[str]) -> str:
    more = f" (and {len(gaps) - 1} more)" if len(gaps) > 1 else ""
    return (f"offline build of {ref}: {SOURCES_DIR}/{gaps[0]} is missing{more}: run `rlbox fetch-sources {ref}` "
            "where the network is reachable")


def require_platform(platform: str, docker: str = "docker") -> None:
    """Stop before BuildKit, in one line naming what to install, when nothing here builds ``platform``
    (another architecture without emulation or a builder of that architecture)."""
    problem = emulation.judge(platform, emulation.gather(docker))
    if problem:
        raise RlboxError(problem)


def _generic_cause(tail) -> str:
    for line in reversed(tail):
        if line.startswith("ERROR:") or "error:" in line.lower():
            return line.removeprefix("ERROR: ").strip()
    return "see the build log above"
