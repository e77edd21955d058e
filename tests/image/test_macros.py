"""Golden strings for templates/macros.j2, one building block at a time (as hpccm tests each of
its building blocks): every macro rendered alone, in render.environment (the environment every
Dockerfile renders in), on small explicit inputs built with the real models of rlbox.image.matrix,
and compared with the exact text written below. A change to a macro fails here with a line diff.

The steps Dockerfile.j2 writes inline (user, venv, CANN environment, runtime environment) are
not macros; the last section renders Dockerfile.j2 whole and compares those steps one by one.
"""

from __future__ import annotations

import dataclasses
import difflib
import textwrap
from pathlib import Path

import jinja2
import pytest

from rlbox.core.errors import RlboxError
from rlbox.image import lockfile, render
from rlbox.image.matrix import (
    Component,
    Hardware,
    PatchFile,
    Release,
    ResolvedComponent,
    ResolvedVariant,
)

REPO = Path(__file__).resolve().parents[2]

A2 = Hardware(
    description="Atlas 800T A2, for the macro tests", chip="910b", npu_smi_chip="910B",
    soc_version="ascend910b1", platforms=["linux/arm64", "linux/amd64"], npus_per_node=8,
)
VERL_PATCH_SHA = "5d41402abc4b2a76b9719d911017c592ae1f5c1e0c1b5e8f1e5a4c2b9d6e3f70"
VERL_PATCH2_SHA = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"


def variant(*, os: str = "ubuntu22.04", platform: str = "linux/arm64", python: str = "3.11",
            base_python: str | None = None, cann: dict | None = None, env: dict | None = None,
            system_packages: dict | None = None, components: tuple[ResolvedComponent, ...] = ()
            ) -> ResolvedVariant:
    """A variant of a one-release matrix, ``images/macros.yaml``, on the A2 profile above."""
    release = Release.model_validate({
        "release": "macros",
        "description": "macro golden tests",
        "image": {"registry": "localhost/rlbox", "name": "macros"},
        "base": {"image": "quay.io/ascend/cann", "tag": "{cann}-{chip}-{os}-py{python}",
                 **({"python": base_python} if base_python else {})},
        "os": os,
        "python": python,
        "cann": cann or {"version": "8.3.RC1", "env_scripts": ["/usr/local/Ascend/ascend-toolkit/set_env.sh"]},
        "driver": {"min": "25.3.RC1"},
        "system_packages": system_packages or {"apt": ["git", "patch"], "dnf": ["git", "patch"]},
        "user": {"name": "rlbox", "uid": 1001},
        "env": env or {},
        "components": {"torch": {"pip": "torch==2.7.1"}},
        "variants": {"a2": {"hardware": "a2", "platform": platform}},
    })
    return ResolvedVariant(release, "a2", release.variants["a2"], "a2", A2, platform,
                           REPO / "images" / "macros.yaml", REPO, components)


def comp(name: str, patches: tuple[PatchFile, ...] = (), **fields) -> ResolvedComponent:
    return ResolvedComponent(name, Component(**fields), patches)


def patch(component: str, name: str, sha256: str) -> PatchFile:
    return PatchFile(component, name, REPO / "patches" / component / name, sha256)


@pytest.fixture(scope="module")
def env() -> jinja2.Environment:
    return render.environment(REPO)


@pytest.fixture(scope="module")
def m(env):
    """templates/macros.j2 as Dockerfile.j2 imports it: each macro is an attribute."""
    return env.get_template("macros.j2").module


ARM = variant()
X86 = variant(platform="linux/amd64")
DNF = variant(os="openeuler22.03")


def assert_golden(rendered: str, golden: str) -> None:
    """``rendered`` is exactly ``golden``, a block written indented in the test (dedented here,
    without its first and last newline); else fail with a line diff, whatever pytest's verbosity."""
    __tracebackhide__ = True
    want = textwrap.dedent(golden).removeprefix("\n").removesuffix("\n")
    if rendered != want:
        diff = difflib.unified_diff(want.splitlines(), rendered.splitlines(), "golden", "rendered", lineterm="")
        pytest.fail("rendered text differs from the golden string (- golden, + rendered):\n" + "\n".join(diff))


def test_every_macro_has_a_golden_test(env):
    source = env.loader.get_source(env, "macros.j2")[0]
    macros = {node.name for node in env.parse(source).find_all(jinja2.nodes.Macro)}
    assert macros, "no macro found in templates/macros.j2"
    untested = sorted(name for name in macros if not any(t.startswith(f"test_{name}_") for t in globals()))
    assert not untested, f"macros.j2 macros without a golden test here (test_<macro>_...): {untested}"


# ---------------------------------------------------------------------------------------------
# Mounts.


def test_sources_mount_binds_one_path_of_the_source_cache(m):
    # at the same place inside: the in-image scripts find it below RLBOX_SOURCES as in the cache
    assert m.sources_mount("wheels/aarch64-py3.11") == (
        "--mount=type=bind,source=.rlbox-sources/wheels/aarch64-py3.11,target=/opt/rlbox/sources/wheels/aarch64-py3.11")


def test_sources_mount_refuses_what_is_not_a_plain_path(m):
    with pytest.raises(ValueError):
        m.sources_mount("sdist/a,target=/etc")


def test_network_mounts_arm(m):
    assert_golden(m.network_mounts(ARM, "git/verl-796871d7d092f7cbc6a64e7f4a3796f7a2217f5e.git"), r"""
        --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/verl-796871d7d092f7cbc6a64e7f4a3796f7a2217f5e.git,target=/opt/rlbox/sources/git/verl-796871d7d092f7cbc6a64e7f4a3796f7a2217f5e.git
    """)


def test_network_mounts_x86_has_its_own_pip_cache(m):
    assert_golden(m.network_mounts(X86, "wheels/x86_64-py3.11"), r"""
        --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-x86_64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/wheels/x86_64-py3.11,target=/opt/rlbox/sources/wheels/x86_64-py3.11
    """)


# ---------------------------------------------------------------------------------------------
# System packages: the variant's list, with jemalloc (and the OS's Python when the base lacks it).


def test_system_packages_apt(m):
    assert_golden(m.system_packages(ARM, ARM.system_packages), r"""
        RUN --mount=type=secret,id=ca --mount=type=bind,source=.rlbox-sources/debs/aarch64,target=/opt/rlbox/sources/debs/aarch64 \
            rlbox-system-packages apt git patch libjemalloc2
    """)


def test_system_packages_apt_with_python_from_the_os(m):
    v = variant(python="3.10", base_python="3.11")
    assert_golden(m.system_packages(v, v.system_packages), r"""
        RUN --mount=type=secret,id=ca --mount=type=bind,source=.rlbox-sources/debs/aarch64,target=/opt/rlbox/sources/debs/aarch64 \
            rlbox-system-packages apt git patch libjemalloc2 python3.10 python3.10-venv python3.10-dev
    """)


def test_system_packages_dnf(m):
    v = variant(os="openeuler22.03", system_packages={"apt": ["git"], "dnf": ["git", "patch", "gcc-c++"]})
    assert_golden(m.system_packages(v, v.system_packages), r"""
        RUN --mount=type=secret,id=ca \
            rlbox-system-packages dnf git patch gcc-c++ jemalloc
    """)


# ---------------------------------------------------------------------------------------------
# Components, one install form each.


def locked(v: ResolvedVariant, git: dict | None = None, pip: dict | None = None) -> ResolvedVariant:
    """``v`` with a fresh lock entry holding ``git`` and ``pip`` records."""
    entry = {"inputs": "sha256:x", "base": {"digest": None}, "git": git or {}, "pip": {"packages": pip or {}}}
    return dataclasses.replace(v, lock=lockfile.VariantLock("fresh", entry, "images/lock/macros.json"))


def test_component_pip_pin(m):
    # installed by the venv step, from the lock: the component's own step is a note
    assert_golden(m.component(ARM, comp("torch", pip="torch==2.7.1")), r"""
        # ---- torch: torch==2.7.1
        # installed above from the lock
    """)


def test_component_pip_pin_with_a_stand_in_in_the_lock(m):
    v = locked(X86, pip={"torch": {"version": "2.7.1", "sha256": "ab", "standin_for": "torch==2.7.1+cpu"}})
    torch = comp("torch", pip="torch==2.7.1+cpu", index_url="https://download.pytorch.org/whl/cpu")
    assert_golden(m.component(v, torch), r"""
        # ---- torch: torch==2.7.1+cpu
        # installed above from the lock (stand-in: see the lock's substitutions)
    """)


def test_component_git_editable(m):
    mindspeed = comp("mindspeed", git="https://github.com/Ascend/MindSpeed.git",
                     commit="1cdd0abd75e40936ad31721c092f57c695dd72c4")
    assert_golden(m.component(ARM, mindspeed), r"""
        # ---- mindspeed: git+https://github.com/Ascend/MindSpeed.git@1cdd0abd75e40936ad31721c092f57c695dd72c4
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/mindspeed-1cdd0abd75e40936ad31721c092f57c695dd72c4.git,target=/opt/rlbox/sources/git/mindspeed-1cdd0abd75e40936ad31721c092f57c695dd72c4.git \
            rlbox-git-fetch mindspeed https://github.com/Ascend/MindSpeed.git 1cdd0abd75e40936ad31721c092f57c695dd72c4 \
         && rlbox-pip --source -e /opt/rlbox/src/mindspeed
    """)


def test_component_git_install_pip(m):
    transformers = comp("transformers", git="https://github.com/huggingface/transformers.git",
                        commit="8365f70e9259c21058bf18f876006f945d2a99de", install="pip")
    assert_golden(m.component(ARM, transformers), r"""
        # ---- transformers: git+https://github.com/huggingface/transformers.git@8365f70e9259c21058bf18f876006f945d2a99de
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/transformers-8365f70e9259c21058bf18f876006f945d2a99de.git,target=/opt/rlbox/sources/git/transformers-8365f70e9259c21058bf18f876006f945d2a99de.git \
            rlbox-git-fetch transformers https://github.com/huggingface/transformers.git 8365f70e9259c21058bf18f876006f945d2a99de \
         && rlbox-pip --source /opt/rlbox/src/transformers
    """)


def test_component_git_install_source_with_ref(m):
    megatron = comp("megatron", git="https://github.com/NVIDIA/Megatron-LM.git",
                    commit="a845aa7e12b3a117e24c2352b9e3e60bad2e3a17", ref="core_v0.12.1", install="source")
    assert_golden(m.component(ARM, megatron), r"""
        # ---- megatron: git+https://github.com/NVIDIA/Megatron-LM.git@a845aa7e12b3a117e24c2352b9e3e60bad2e3a17 (core_v0.12.1)
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/megatron-a845aa7e12b3a117e24c2352b9e3e60bad2e3a17.git,target=/opt/rlbox/sources/git/megatron-a845aa7e12b3a117e24c2352b9e3e60bad2e3a17.git \
            rlbox-git-fetch megatron https://github.com/NVIDIA/Megatron-LM.git a845aa7e12b3a117e24c2352b9e3e60bad2e3a17 core_v0.12.1 \
         && echo /opt/rlbox/src/megatron > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/rlbox-megatron.pth"
    """)


def test_component_git_with_subdir_is_fetched_sparse_and_installed_pep660(m):
    rl_plugin = comp("rl_plugin", git="https://github.com/Ascend/MindSpeed-RL.git",
                     commit="194b52b7b34b69963f21bee0d13d01c155cd2db2", ref="v2.2.0", subdir="rl-plugin",
                     pip_args=["--use-pep517"])
    assert_golden(m.component(ARM, rl_plugin), r"""
        # ---- rl_plugin: git+https://github.com/Ascend/MindSpeed-RL.git@194b52b7b34b69963f21bee0d13d01c155cd2db2 (v2.2.0)
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/rl_plugin-194b52b7b34b69963f21bee0d13d01c155cd2db2.git,target=/opt/rlbox/sources/git/rl_plugin-194b52b7b34b69963f21bee0d13d01c155cd2db2.git \
            rlbox-git-fetch rl_plugin https://github.com/Ascend/MindSpeed-RL.git 194b52b7b34b69963f21bee0d13d01c155cd2db2 v2.2.0 rl-plugin \
         && rlbox-pip --source --use-pep517 -e /opt/rlbox/src/rl_plugin/rl-plugin
    """)


def test_component_git_with_subdir_and_no_ref_install_source(m):
    plugin = comp("plugin", git="https://example.com/plugin.git",
                  commit="0123456789abcdef0123456789abcdef01234567", subdir="python/pkg", install="source")
    assert_golden(m.component(ARM, plugin), r"""
        # ---- plugin: git+https://example.com/plugin.git@0123456789abcdef0123456789abcdef01234567
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/plugin-0123456789abcdef0123456789abcdef01234567.git,target=/opt/rlbox/sources/git/plugin-0123456789abcdef0123456789abcdef01234567.git \
            rlbox-git-fetch plugin https://example.com/plugin.git 0123456789abcdef0123456789abcdef01234567 '' python/pkg \
         && echo /opt/rlbox/src/plugin/python/pkg > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/rlbox-plugin.pth"
    """)


def test_component_git_with_env_and_the_locked_scm_version(m):
    # the version setuptools-scm computed from full history at lock time: a shallow build has no tags
    v = locked(ARM, git={"vllm_ascend": {"commit": "1de16ead8eecfec8903ec1b330b27a4fa2593c35",
                                         "version": "0.10.0rc2.dev53+g1de16ead8"}})
    vllm_ascend = comp("vllm_ascend", git="https://github.com/vllm-project/vllm-ascend.git",
                       commit="1de16ead8eecfec8903ec1b330b27a4fa2593c35",
                       env={"COMPILE_CUSTOM_KERNELS": "1", "SOC_VERSION": "{SOC_VERSION}",
                            "TARGET": "{chip}-{soc_version}-{arch}", "CFLAGS": "-O2 -g"})
    assert_golden(m.component(v, vllm_ascend), r"""
        # ---- vllm_ascend: git+https://github.com/vllm-project/vllm-ascend.git@1de16ead8eecfec8903ec1b330b27a4fa2593c35
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/vllm_ascend-1de16ead8eecfec8903ec1b330b27a4fa2593c35.git,target=/opt/rlbox/sources/git/vllm_ascend-1de16ead8eecfec8903ec1b330b27a4fa2593c35.git \
            rlbox-git-fetch vllm_ascend https://github.com/vllm-project/vllm-ascend.git 1de16ead8eecfec8903ec1b330b27a4fa2593c35 \
         && env COMPILE_CUSTOM_KERNELS=1 SOC_VERSION=ASCEND910B1 TARGET=910b-ascend910b1-aarch64 CFLAGS='-O2 -g' SETUPTOOLS_SCM_PRETEND_VERSION=0.10.0rc2.dev53+g1de16ead8 rlbox-pip --source -e /opt/rlbox/src/vllm_ascend
    """)


def test_component_git_with_a_stand_in_sdist_in_the_lock(m):
    # the lock records that an sdist stood in for the commit: the build installs exactly that
    url = "https://files.pythonhosted.org/packages/ae/a8/b5/vllm-0.10.1.1.tar.gz"
    v = locked(ARM, git={"vllm": {"commit": "38217877aa70041c0115ee367b75197af9cbc5ad", "version": "0.10.1.1",
                                  "standin": {"used": "sdist vllm==0.10.1.1", "url": url, "sha256": "30" * 32,
                                              "file": "vllm-0.10.1.1.tar.gz", "for": "git", "why": "test"}}})
    vllm = comp("vllm", git="https://github.com/vllm-project/vllm.git", commit="38217877aa70041c0115ee367b75197af9cbc5ad",
                requirements=["requirements/build.txt"], requires=["requirements/common.txt"],
                env={"VLLM_TARGET_DEVICE": "empty"})
    assert_golden(m.component(v, vllm), rf"""
        # ---- vllm: git+https://github.com/vllm-project/vllm.git@38217877aa70041c0115ee367b75197af9cbc5ad
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/sdist/vllm-0.10.1.1.tar.gz,target=/opt/rlbox/sources/sdist/vllm-0.10.1.1.tar.gz \
            rlbox-sdist-fetch vllm {url} {"30" * 32} \
         && env VLLM_TARGET_DEVICE=empty SETUPTOOLS_SCM_PRETEND_VERSION=0.10.1.1 rlbox-pip --source -e /opt/rlbox/src/vllm
    """)


def test_component_git_with_patches(m):
    verl = comp("verl", git="https://github.com/volcengine/verl.git",
                commit="796871d7d092f7cbc6a64e7f4a3796f7a2217f5e",
                patches=(patch("verl", "0001-import-verl-npu-plugin.patch", VERL_PATCH_SHA),
                         patch("verl", "0002-fix-npu-device.patch", VERL_PATCH2_SHA)),
                )
    assert_golden(m.component(ARM, verl), r"""
        # ---- verl: git+https://github.com/volcengine/verl.git@796871d7d092f7cbc6a64e7f4a3796f7a2217f5e
        COPY patches/verl/0001-import-verl-npu-plugin.patch patches/verl/0002-fix-npu-device.patch /opt/rlbox/patches/verl/
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/verl-796871d7d092f7cbc6a64e7f4a3796f7a2217f5e.git,target=/opt/rlbox/sources/git/verl-796871d7d092f7cbc6a64e7f4a3796f7a2217f5e.git \
            rlbox-git-fetch verl https://github.com/volcengine/verl.git 796871d7d092f7cbc6a64e7f4a3796f7a2217f5e \
         && rlbox-apply-patches verl 5d41402abc4b2a76b9719d911017c592ae1f5c1e0c1b5e8f1e5a4c2b9d6e3f70=0001-import-verl-npu-plugin.patch 0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9=0002-fix-npu-device.patch \
         && rlbox-pip --source -e /opt/rlbox/src/verl
    """)


def test_component_git_with_everything_in_install_order(m):
    # patches, then the install (with env and pip_args), all in one RUN; requirements are in the lock
    kitchen = comp("kitchen", git="https://example.com/kitchen.git",
                   commit="0123456789abcdef0123456789abcdef01234567", ref="v1.0", subdir="src",
                   requirements=["reqs.txt"], install="pip", pip_args=["--config-settings=a~b"], env={"A": "1"},
                   patches=(patch("kitchen", "0001-sink.patch", VERL_PATCH_SHA),))
    assert_golden(m.component(ARM, kitchen), r"""
        # ---- kitchen: git+https://example.com/kitchen.git@0123456789abcdef0123456789abcdef01234567 (v1.0)
        COPY patches/kitchen/0001-sink.patch /opt/rlbox/patches/kitchen/
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/git/kitchen-0123456789abcdef0123456789abcdef01234567.git,target=/opt/rlbox/sources/git/kitchen-0123456789abcdef0123456789abcdef01234567.git \
            rlbox-git-fetch kitchen https://example.com/kitchen.git 0123456789abcdef0123456789abcdef01234567 v1.0 src \
         && rlbox-apply-patches kitchen 5d41402abc4b2a76b9719d911017c592ae1f5c1e0c1b5e8f1e5a4c2b9d6e3f70=0001-sink.patch \
         && env A=1 rlbox-pip --source '--config-settings=a~b' /opt/rlbox/src/kitchen/src
    """)


def test_component_env_with_an_unknown_placeholder_names_the_manifest(m):
    bad = comp("vllm_ascend", git="https://github.com/vllm-project/vllm-ascend.git",
               commit="1de16ead8eecfec8903ec1b330b27a4fa2593c35", env={"SOC_VERSION": "{soc}"})
    with pytest.raises(RlboxError) as err:
        m.component(ARM, bad)
    assert str(err.value) == (
        "images/macros.yaml: component env value '{soc}' has an unknown placeholder 'soc'; "
        "use {soc_version}, {SOC_VERSION}, {chip} or {arch}"
    )


# ---------------------------------------------------------------------------------------------
# The helpers component() is made of.


def test_src_is_the_checkout(m):
    c = comp("verl", git="https://github.com/volcengine/verl.git", commit="796871d7d092f7cbc6a64e7f4a3796f7a2217f5e")
    assert m.src(c) == "/opt/rlbox/src/verl"


def test_src_with_subdir(m):
    c = comp("rl_plugin", git="https://github.com/Ascend/MindSpeed-RL.git",
             commit="194b52b7b34b69963f21bee0d13d01c155cd2db2", subdir="rl-plugin")
    assert m.src(c) == "/opt/rlbox/src/rl_plugin/rl-plugin"


def test_env_prefix_empty_without_env(m):
    assert m.env_prefix(ARM, comp("torch", pip="torch==2.7.1")) == ""


def test_env_prefix_formats_hardware_and_quotes(m):
    c = comp("x", git="https://example.com/x.git", commit="0123456789abcdef0123456789abcdef01234567",
             env={"SOC_VERSION": "{SOC_VERSION}", "ARCH": "{arch}", "MSG": "a b"})
    assert m.env_prefix(X86, c) == "env SOC_VERSION=ASCEND910B1 ARCH=x86_64 MSG='a b' "


def test_pip_args_empty(m):
    assert m.pip_args(comp("torch", pip="torch==2.7.1")) == ""


def test_pip_args_each_quoted_with_a_leading_space(m):
    c = comp("x", pip="x==1", pip_args=["--no-deps", "--no-build-isolation", "--config-settings=k=v~w"])
    assert m.pip_args(c) == " --no-deps --no-build-isolation '--config-settings=k=v~w'"


# ---------------------------------------------------------------------------------------------
# Dockerfile.j2's inline steps (no macros of their own): rendered whole, compared step by step.
# A step is a paragraph of the rendered Dockerfile (render.dockerfile collapses blank lines).


def step(variant_: ResolvedVariant, heading: str, env_: jinja2.Environment) -> str:
    paragraphs = render.dockerfile(variant_, env_).split("\n\n")
    found = [p for p in paragraphs if p.startswith(heading)]
    assert len(found) == 1, f"{len(found)} steps start with {heading!r} in:\n" + "\n\n".join(paragraphs)
    return found[0]


def test_dockerfile_user_step(env):
    assert_golden(step(ARM, "# ---- Non-root user", env), r"""
        # ---- Non-root user for production runs (NPU device access needs its group on the host)
        RUN useradd --uid 1001 --user-group --create-home --home-dir /var/lib/rlbox \
                --shell /bin/bash rlbox
    """)


def test_dockerfile_venv_step_installs_exactly_the_lock(env):
    assert_golden(step(ARM, "# ---- Python", env), r"""
        # ---- Python 3.11 venv outside /home (users mount /home over the image's), then every
        # Python package the image gets from an index, exactly as locked (0 files, hashes
        # required, nothing resolved): PyPI components, CANN's Python packages, and the requirements and
        # build requirements of every git source below, which then install without resolving anything.
        ENV VIRTUAL_ENV=/opt/rlbox/venv PATH=/opt/rlbox/venv/bin:$PATH
        COPY dockerfiles/macros/a2/requirements.lock dockerfiles/macros/a2/requirements-sdist.lock /etc/rlbox/
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/wheels/aarch64-py3.11,target=/opt/rlbox/sources/wheels/aarch64-py3.11 \
            python3 -m venv --system-site-packages /opt/rlbox/venv \
         && mkdir -p /opt/rlbox/src \
         && touch /etc/rlbox/patches.applied \
         && rlbox-pip --locked
    """)


def test_dockerfile_venv_step_on_the_os_python(env):
    v = locked(variant(python="3.10", base_python="3.11"), pip={"attrs": {"version": "25.4.0", "sha256": "ab"}})
    assert_golden(step(v, "# ---- Python", env), r"""
        # ---- Python 3.10 venv outside /home (users mount /home over the image's), then every
        # Python package the image gets from an index, exactly as locked (1 files, hashes
        # required, nothing resolved): PyPI components, CANN's Python packages, and the requirements and
        # build requirements of every git source below, which then install without resolving anything.
        ENV VIRTUAL_ENV=/opt/rlbox/venv PATH=/opt/rlbox/venv/bin:$PATH
        COPY dockerfiles/macros/a2/requirements.lock dockerfiles/macros/a2/requirements-sdist.lock /etc/rlbox/
        RUN --mount=type=secret,id=ca --mount=type=cache,target=/root/.cache/pip,id=rlbox-pip-aarch64,sharing=locked \
            --mount=type=bind,source=.rlbox-sources/wheels/aarch64-py3.10,target=/opt/rlbox/sources/wheels/aarch64-py3.10 \
            /usr/bin/python3.10 -m venv --system-site-packages /opt/rlbox/venv \
         && mkdir -p /opt/rlbox/src \
         && touch /etc/rlbox/patches.applied \
         && rlbox-pip --locked
    """)


def test_dockerfile_cann_env_step(env):
    v = variant(cann={"version": "8.3.RC1", "env_scripts": ["/usr/local/Ascend/ascend-toolkit/set_env.sh",
                                                             "/usr/local/Ascend/nnal/atb/set_env.sh"]})
    assert_golden(step(v, "# ---- CANN", env), r"""
        # ---- CANN 8.3.RC1 environment for every process: login shells, interactive
        # shells, non-interactive bash (BASH_ENV: Ray workers, `docker exec c bash -c`) and the entrypoint.
        RUN rlbox-env-snapshot /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/nnal/atb/set_env.sh > /etc/rlbox/env.sh \
         && ln -s /etc/rlbox/env.sh /etc/profile.d/zz-rlbox-cann.sh \
         && echo '. /etc/rlbox/env.sh' >> /etc/bash.bashrc
        ENV BASH_ENV=/etc/rlbox/env.sh
    """)


def test_dockerfile_cann_env_step_without_cann_on_dnf(env):
    v = variant(os="openeuler22.03", cann={"version": "none"})
    assert_golden(step(v, "# ---- No CANN", env), r"""
        # ---- No CANN in this image: /etc/rlbox/env.sh stays empty, wired the same way as in CANN images.
        RUN echo '# no CANN in this image' > /etc/rlbox/env.sh \
         && ln -s /etc/rlbox/env.sh /etc/profile.d/zz-rlbox-cann.sh \
         && echo '. /etc/rlbox/env.sh' >> /etc/bashrc
        ENV BASH_ENV=/etc/rlbox/env.sh
    """)


def test_dockerfile_runtime_env_step_jemalloc_apt_arm(env):
    v = variant(env={"HF_ENDPOINT": "https://hf-mirror.com", "HCCL_CONNECT_TIMEOUT": "1800", "MSG": "a b"})
    assert_golden(step(v, "# ---- Runtime environment", env), r"""
        # ---- Runtime environment
        ENV LD_PRELOAD=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2 \
            HF_ENDPOINT=${HF_ENDPOINT} \
            HCCL_CONNECT_TIMEOUT=1800 \
            MSG='a b'
    """)


def test_dockerfile_runtime_env_step_jemalloc_apt_x86(env):
    assert_golden(step(X86, "# ---- Runtime environment", env), r"""
        # ---- Runtime environment
        ENV LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \
            HF_ENDPOINT=${HF_ENDPOINT}
    """)


def test_dockerfile_runtime_env_step_jemalloc_dnf(env):
    assert_golden(step(DNF, "# ---- Runtime environment", env), r"""
        # ---- Runtime environment
        ENV LD_PRELOAD=/usr/lib64/libjemalloc.so.2 \
            HF_ENDPOINT=${HF_ENDPOINT}
    """)


def test_dockerfile_system_packages_step_uses_the_macro(env):
    assert_golden(step(DNF, "# ---- System packages", env), r"""
        # ---- System packages: git and patch for sources, jemalloc, build tools
        RUN --mount=type=secret,id=ca \
            rlbox-system-packages dnf git patch jemalloc
    """)
