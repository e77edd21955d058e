"""The matrix -> the GitHub Actions workflow that builds every image: a pure function.

``render`` returns the text of ``.github/workflows/images.yml``. ``rlbox render`` writes it next
to the Dockerfiles and ``rlbox render --check`` reports it stale or missing, so the job matrix
is typed once, in ``images/``. The workflow builds each RELEASE:VARIANT through ``make image``
(the target developers use), reusing BuildKit's layers across runs (a registry cache beside the image,
written by the runs that push; the GitHub Actions cache, written by the others), pushes it to SWR by digest
and then tags that digest twice: the human tag (``verl_pt27_25rc3:a3-arm``) and an immutable
one carrying the commit (``a3-arm-<sha12>``, the form ``rlbox push`` gives).

A release that declares ``local_only: <why>`` is left out of the job matrix and named, with its
reason, in the generated file's header. A component installed from a loopback index
(``index_url: http://127.0.0.1:...``) that no hosted runner can reach must come with that
declaration: rendering refuses the release otherwise, rather than write a job that cannot work.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

from urllib.parse import urlsplit

from rlbox.core import quote
from rlbox.core.errors import RlboxError
from rlbox.image.matrix import Matrix, ResolvedVariant
from rlbox.registry.reference import is_loopback

PATH = Path(".github/workflows/images.yml")

DEFAULT_REGISTRY = "swr.cn-south-1.myhuaweicloud.com"
# GitHub-hosted runners per platform: each image builds natively. linux/arm64 falls back to an
# x86 runner with QEMU (docker/setup-qemu-action) when the run asks for it (input arm64_qemu or
# repository variable RLBOX_ARM64_QEMU=true), e.g. where arm64 runners are not available.
NATIVE_RUNNER = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}
QEMU_RUNNER = "ubuntu-24.04"
PYTHON = "3.11"
# GitHub stops a job on a hosted runner after 6 h; stop ours a little before, with a message.
BUILD_TIMEOUT_MINUTES = 350
CHECK_TIMEOUT_MINUTES = 20
# Hardware whose images are built but never pushed (see the comment in the generated file).
UNPUSHED_HARDWARE = ("sim",)
# Bases made on the developer's machine (tools/make-base-image.sh debootstraps rlbox/debian),
# which a BuildKit container builder cannot see: CI builds on the registry image they stand for.
LOCAL_BASES = {"rlbox/debian": "docker.io/library/debian"}
TRIGGER_PATHS = (
    "images/**",
    "templates/**",
    "patches/**",
    "dockerfiles/**",
    "launcher/**",
    "Makefile",
    "pyproject.toml",
    str(PATH),
)


@dataclass(frozen=True)
class Job:
    """One entry of the build job's ``strategy.matrix.include``."""

    ref: str
    platform: str
    runner: str
    qemu_runner: str
    image: str  # the human tag, NAME:TAG
    repository: str  # ORG/NAME under the registry host
    tag: str
    push: bool
    base_image: str  # a fixed --base-image for CI ("" = the manifest's)
    cann_base_tag: str  # tag of the CANN base, for a CANN_BASE_MIRROR ("" = no CANN)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _split_registry(variant: ResolvedVariant) -> tuple[str, str]:
    host, _, org = variant.release.image.registry.partition("/")
    return host, org


def job(variant: ResolvedVariant) -> Job:
    rel = variant.release
    if variant.platform not in NATIVE_RUNNER:
        raise RlboxError(f"{variant.manifest_rel}: variants.{variant.name}: no GitHub runner for {variant.platform}")
    runner = NATIVE_RUNNER[variant.platform]
    _, org = _split_registry(variant)
    base_tag = variant.base_image[len(rel.base.image) + 1:]
    local = LOCAL_BASES.get(rel.base.image)
    try:  # the ref and tag reach `make image REF=...` and shell lines of the workflow
        quote.make_value(variant.ref, "ref")
        quote.make_value(variant.tag, "tag")
    except ValueError as err:
        raise RlboxError(f"{variant.manifest_rel}: variants.{variant.name}: {err}") from None
    return Job(
        ref=variant.ref,
        platform=variant.platform,
        runner=runner,
        qemu_runner=QEMU_RUNNER if variant.platform != "linux/amd64" else runner,
        image=f"{rel.image.name}:{variant.tag}",
        repository=f"{org}/{rel.image.name}" if org else rel.image.name,
        tag=variant.tag,
        push=variant.hardware_name not in UNPUSHED_HARDWARE,
        base_image=f"{local}:{base_tag}" if local else "",
        cann_base_tag=base_tag if rel.cann.version != "none" else "",
    )


def loopback_indexes(variant: ResolvedVariant) -> list[tuple[str, str]]:
    """(component, index URL) of each component the variant installs from a loopback index."""
    return [(c.name, c.spec.index_url) for c in variant.components
            if c.spec.index_url and is_loopback(urlsplit(c.spec.index_url).netloc.rpartition("@")[2] or "")]


def built_in_ci(variant: ResolvedVariant) -> bool:
    """False for a release declared ``local_only``; refuses an undeclared loopback index (no
    hosted runner reaches this machine's 127.0.0.1)."""
    if variant.release.local_only:
        return False
    loopback = loopback_indexes(variant)
    if loopback:
        name, url = loopback[0]
        raise RlboxError(
            f"{variant.manifest_rel}: components.{name}.index_url: {url} is a loopback index, which no CI runner "
            f"can reach ({variant.ref} cannot build in the images workflow); give the release "
            "`local_only: <why it builds only on a developer's machine>`, or an index CI can reach"
        )
    return True


def jobs(matrix: Matrix) -> list[Job]:
    return [job(v) for v in matrix.variants if built_in_ci(v)]


def left_out(matrix: Matrix) -> list[ResolvedVariant]:
    """The variants the workflow does not build (their releases are ``local_only``)."""
    return [v for v in matrix.variants if not built_in_ci(v)]


def registry_host(matrix: Matrix) -> str:
    """The one registry every pushed image goes to (the host part of the manifests' image.registry)."""
    hosts: dict[str, str] = {}
    for v in matrix.variants:
        if v.hardware_name not in UNPUSHED_HARDWARE and built_in_ci(v):
            hosts.setdefault(_split_registry(v)[0], v.ref)
    if len(hosts) > 1:
        named = ", ".join(f"{h} ({ref})" for h, ref in hosts.items())
        raise RlboxError(
            f"images/: the CI workflow pushes to one registry, but the releases name several: {named}; "
            "give every release the same image.registry host"
        )
    return next(iter(hosts), DEFAULT_REGISTRY)


def _scalar(value: object) -> str:
    return json.dumps(value)  # a JSON scalar is a YAML scalar: quoted strings, true/false


def _include(matrix: Matrix) -> str:
    lines = []
    for j in jobs(matrix):
        fields = list(j.as_dict().items())
        key, value = fields[0]
        lines.append(f"          - {key}: {_scalar(value)}")
        lines += [f"            {k}: {_scalar(v)}" for k, v in fields[1:]]
    return "\n".join(lines)


def _left_out(matrix: Matrix) -> str:
    out = left_out(matrix)
    if not out:
        return "#\n# Every RELEASE:VARIANT of images/ has a job here.\n#"
    lines = ["#", "# Not built here (the release says `local_only`; build it on a developer's machine):"]
    for v in out:
        lines += textwrap.wrap(f"{v.ref}: {v.release.local_only}", 110, initial_indent="#   ", subsequent_indent="#     ")
    return "\n".join([*lines, "#"])


def _list(items, indent: int) -> str:
    return "\n".join(f"{' ' * indent}- {_scalar(i)}" for i in items)


QEMU = "(inputs.arm64_qemu || vars.RLBOX_ARM64_QEMU == 'true')"

TEMPLATE = """\
# Generated by `rlbox render` from images/ (launcher/rlbox/image/ci_workflow.py). DO NOT EDIT.
# Change images/*.yaml or launcher/rlbox/image/ci_workflow.py, then run `rlbox render`; CI runs `rlbox render --check`.
#
# Builds the RELEASE:VARIANTs of the matrix (@@COUNT@@ jobs) through `make image`, the target developers use,
# reusing BuildKit's layers across runs (registry cache REPO:buildcache-TAG, Actions cache). On pushes to main, v* tags and manual runs, each image is pushed to
# SWR by digest, then tagged REPO:TAG and REPO:TAG-<commit12>; pull requests build without pushing.
@@LEFT_OUT@@
# Secrets: SWR_USERNAME, SWR_PASSWORD. Optional repository variables:
#   SWR_REGISTRY       registry host (default @@REGISTRY@@, the host of the manifests' image.registry)
#   CANN_BASE_MIRROR   a copy of the CANN base images, e.g. swr.cn-south-1.myhuaweicloud.com/ascendhub/cann
#                      (default: the manifests' base, quay.io/ascend/cann)
#   RLBOX_BUILD_FLAGS  more `rlbox build` options for every image, e.g. --pip-index URL
#   RLBOX_ARM64_QEMU   true: build linux/arm64 on x86 runners under QEMU (slow) instead of arm64 runners
name: images

on:
  push:
    branches: [main]
    tags: ["v*"]
    paths:
@@PATHS@@
  pull_request:
    paths:
@@PATHS@@
  workflow_dispatch:
    inputs:
      arm64_qemu:
        description: Build linux/arm64 images on x86 runners under QEMU (when arm64 runners are not available)
        type: boolean
        default: false

permissions:
  contents: read

concurrency:
  group: images-${{ github.ref }}
  cancel-in-progress: ${{ github.event_name == 'pull_request' }}

env:
  SWR_REGISTRY: ${{ vars.SWR_REGISTRY || '@@REGISTRY@@' }}
  CANN_BASE_MIRROR: ${{ vars.CANN_BASE_MIRROR }}
  RLBOX_BUILD_FLAGS: ${{ vars.RLBOX_BUILD_FLAGS }}

jobs:
  check:
    name: make lint (render --check + hadolint)
    runs-on: ubuntu-24.04
    timeout-minutes: @@CHECK_TIMEOUT@@
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "@@PYTHON@@"
      - name: Install rlbox with its test extras
        run: python -m pip install -e ".[test]"
      - name: make lint
        run: make lint

  build:
    name: build ${{ matrix.ref }}
    needs: check
    runs-on: ${{ @@QEMU@@ && matrix.qemu_runner || matrix.runner }}
    timeout-minutes: @@BUILD_TIMEOUT@@
    strategy:
      fail-fast: false
      matrix:
        # One entry per RELEASE:VARIANT of images/. `push: false` for hardware sim (the rehearsal image,
        # Python + Ray and no NPU stack): it is built on every run, as it is cheap and goes through the
        # same templates and `rlbox build` as the NPU images, but never pushed: `make rehearsal` builds it
        # locally, its name is the local localhost/rlbox/sim, and an image without CANN or verl beside the
        # verl images on SWR would only be pulled by mistake for training. Its manifest base, rlbox/debian,
        # is debootstrapped on the developer's machine (tools/make-base-image.sh), which BuildKit's container
        # builder cannot see, so here it builds on Docker Hub's Debian of the same release (base_image).
        include:
@@INCLUDE@@
    env:
      REF: ${{ matrix.ref }}
      PUSH: ${{ matrix.push && github.event_name != 'pull_request' }}
      EMULATED: ${{ matrix.runner != matrix.qemu_runner && @@QEMU@@ }}
    steps:
      - uses: actions/checkout@v4
      - name: Free disk space (CANN base images and their builds take tens of GB)
        run: |
          sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /opt/hostedtoolcache/CodeQL
          df -h /
      - uses: actions/setup-python@v5
        with:
          python-version: "@@PYTHON@@"
      - name: Install rlbox
        run: python -m pip install -e .
      - name: Set up QEMU (${{ matrix.platform }} on an x86 runner)
        if: env.EMULATED == 'true'
        uses: docker/setup-qemu-action@v3
      - uses: docker/setup-buildx-action@v3
      - name: Expose the Actions cache to buildx (type=gha from a run step)
        uses: crazy-max/ghaction-github-runtime@v3
      - name: Log in to SWR
        if: env.PUSH == 'true'
        uses: docker/login-action@v3
        with:
          registry: ${{ env.SWR_REGISTRY }}
          username: ${{ secrets.SWR_USERNAME }}
          password: ${{ secrets.SWR_PASSWORD }}
      - name: make image REF=${{ matrix.ref }}
        env:
          PLATFORM: ${{ matrix.platform }}
          REPOSITORY: ${{ matrix.repository }}
          TAG: ${{ matrix.tag }}
          BASE_IMAGE: ${{ matrix.base_image }}
          CANN_BASE_TAG: ${{ matrix.cann_base_tag }}
        run: |
          # BuildKit's layer cache across runs, read from both places: runs that push write it next to the image
          # in the registry (a CANN image's layers outgrow the Actions cache's 10 GB), the others to the Actions cache
          cache="$SWR_REGISTRY/$REPOSITORY:buildcache-$TAG"
          flags="--platform $PLATFORM --cache-from type=registry,ref=$cache --cache-from type=gha,scope=$REF"
          if [ "$PUSH" = true ]; then
            flags="$flags --cache-to type=registry,ref=$cache,mode=max,image-manifest=true,oci-mediatypes=true,ignore-error=true"
          else
            flags="$flags --cache-to type=gha,mode=max,ignore-error=true,scope=$REF"
          fi
          if [ -n "$BASE_IMAGE" ]; then
            flags="$flags --base-image $BASE_IMAGE"
          elif [ -n "$CANN_BASE_MIRROR" ] && [ -n "$CANN_BASE_TAG" ]; then
            flags="$flags --base-image $CANN_BASE_MIRROR:$CANN_BASE_TAG"
          fi
          if [ "$PUSH" = true ]; then
            flags="$flags --push-by-digest $SWR_REGISTRY/$REPOSITORY --metadata-file $RUNNER_TEMP/build-metadata.json"
          else
            flags="$flags --no-load"
          fi
          make image REF="$REF" BUILD_FLAGS="$flags $RLBOX_BUILD_FLAGS"
      - name: Tag the pushed digest
        if: env.PUSH == 'true'
        env:
          REPOSITORY: ${{ matrix.repository }}
          TAG: ${{ matrix.tag }}
        run: |
          repo="$SWR_REGISTRY/$REPOSITORY"
          digest=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["containerimage.digest"])' "$RUNNER_TEMP/build-metadata.json")
          immutable="$TAG-${GITHUB_SHA::12}"  # the form `rlbox push` gives: TAG-<commit12>
          docker buildx imagetools create --tag "$repo:$TAG" --tag "$repo:$immutable" "$repo@$digest"
          echo "$REF: \\`$repo:$TAG\\`, \\`$repo:$immutable\\` = \\`$repo@$digest\\`" >> "$GITHUB_STEP_SUMMARY"
"""


def render(matrix: Matrix) -> str:
    """The text of .github/workflows/images.yml for this matrix."""
    text = TEMPLATE
    for key, value in (
        ("@@COUNT@@", str(len(jobs(matrix)))),
        ("@@LEFT_OUT@@", _left_out(matrix)),
        ("@@REGISTRY@@", registry_host(matrix)),
        ("@@PATHS@@", _list(TRIGGER_PATHS, 6)),
        ("@@PYTHON@@", PYTHON),
        ("@@CHECK_TIMEOUT@@", str(CHECK_TIMEOUT_MINUTES)),
        ("@@BUILD_TIMEOUT@@", str(BUILD_TIMEOUT_MINUTES)),
        ("@@QEMU@@", QEMU),
        ("@@INCLUDE@@", _include(matrix)),
    ):
        text = text.replace(key, value)
    return text
