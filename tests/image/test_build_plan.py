"""The build plan is a printable value: the exact buildx command, no engine needed."""

from __future__ import annotations

import dataclasses
import re
import shlex

import pytest

from conftest import REPO, rlbox
from rlbox.image import build, sources
from rlbox.core.errors import RlboxError


def test_dry_run_prints_the_exact_command(tmp_path):
    proc = rlbox(
        "build", "verl_pt27_25rc3:a3-arm", "--dry-run",
        "--base-image", "swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:8.3.rc1-a3-ubuntu22.04-py3.11",
        "--pip-index", "https://mirrors.example.com/pypi/simple",
        "--git-mirror", "https://gitcode.com/",
        "--apt-mirror", "http://mirrors.example.com/ubuntu",
        "--hf-endpoint", "https://hf-mirror.com",
        "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt",
        "--push", env={"RLBOX_CACHE": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip())
    assert argv[:3] == ["docker", "buildx", "build"]
    pairs = list(zip(argv, argv[1:]))
    assert ("--platform", "linux/arm64") in pairs
    assert ("--file", str(REPO / "dockerfiles/verl_pt27_25rc3/a3-arm/Dockerfile")) in pairs
    assert ("--tag", "swr.cn-south-1.myhuaweicloud.com/ascendhub/verl_pt27_25rc3:a3-arm") in pairs
    assert ("--secret", "id=ca,src=/etc/ssl/certs/ca-certificates.crt") in pairs
    args = {b for a, b in pairs if a == "--build-arg"}
    assert "BASE_IMAGE=swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:8.3.rc1-a3-ubuntu22.04-py3.11" in args
    assert "PIP_INDEX=https://mirrors.example.com/pypi/simple" in args
    assert "GIT_MIRROR=https://gitcode.com/" in args
    assert "APT_MIRROR=http://mirrors.example.com/ubuntu" in args
    assert "HF_ENDPOINT=https://hf-mirror.com" in args
    assert "--push" in argv and "--load" not in argv
    # the context: the release's and platform's staged directory, not the checkout; said so on stderr
    staged = tmp_path / "context" / "verl_pt27_25rc3-linux-arm64"
    assert argv[-1] == str(staged) and not staged.exists()  # a dry run stages nothing
    assert f"rlbox: build context {staged}: staged from {REPO} before the build" in proc.stderr
    assert "dockerfiles/verl_pt27_25rc3/a3-arm, .rlbox-sources/debs/aarch64" in proc.stderr


def test_plan_defaults_load_into_local_engine(m):
    p = build.plan(m.get("verl_pt27_25rc3:ax-x86"))
    assert p.platform == "linux/amd64" and "--load" in p.argv and "--secret" not in p.argv


def test_plan_refuses_wrong_platform_and_missing_ca(m, tmp_path):
    with pytest.raises(RlboxError, match="--platform linux/amd64 does not fit verl_pt27_25rc3:a2-arm"):
        build.plan(m.get("verl_pt27_25rc3:a2-arm"), platform="linux/amd64")
    with pytest.raises(RlboxError, match="--ca-bundle .*nope.pem: no such file"):
        build.plan(m.get("verl_pt27_25rc3:a2-arm"), ca_bundle=tmp_path / "nope.pem")


def test_cli_errors_are_one_line():
    for args, expected in (
        (("build", "verl_pt27_25rc3:a3", "--dry-run"), "release verl_pt27_25rc3 has no variant 'a3'"),
        (("build", "verl_pt27_25rc9:a3-arm", "--dry-run"), "unknown release 'verl_pt27_25rc9' (did you mean 'verl_pt27_25rc3'?)"),
        (("build", "verl_pt27_25rc3:a3-arm", "--platform", "linux/amd64", "--dry-run"), "does not fit"),
    ):
        proc = rlbox(*args)
        assert proc.returncode == 2, proc
        assert "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1 and expected in proc.stderr


def test_dry_run_passes_cache_and_push_by_digest_to_buildx():
    """What CI runs: BuildKit cache in and out, an untagged push whose digest lands in a file."""
    repo = "swr.cn-south-1.myhuaweicloud.com/ascendhub/verl_pt27_25rc3"
    proc = rlbox(
        "build", "verl_pt27_25rc3:a3-arm", "--dry-run",
        "--cache-from", "type=gha,scope=verl_pt27_25rc3:a3-arm",
        "--cache-to", "type=gha,mode=max,scope=verl_pt27_25rc3:a3-arm",
        "--push-by-digest", repo, "--metadata-file", "/tmp/meta.json",
    )
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip())
    pairs = list(zip(argv, argv[1:]))
    assert ("--cache-from", "type=gha,scope=verl_pt27_25rc3:a3-arm") in pairs
    assert ("--cache-to", "type=gha,mode=max,scope=verl_pt27_25rc3:a3-arm") in pairs
    assert ("--metadata-file", "/tmp/meta.json") in pairs
    assert ("--output", f"type=image,name={repo},push-by-digest=true,name-canonical=true,push=true") in pairs
    # untagged: the digest is tagged afterwards; nothing loaded, no plain --push
    assert "--tag" not in argv and "--load" not in argv and "--push" not in argv
    assert argv[-1].endswith("/context/verl_pt27_25rc3-linux-arm64")


def test_plan_output_modes(m):
    v = m.get("rlbox_sim:amd64")
    none = build.plan(v, load=False, cache_to=("type=gha,scope=x",))
    assert none.output == "none" and not none.push
    assert ("--output", "type=cacheonly") in list(zip(none.argv, none.argv[1:]))
    assert "--load" not in none.argv and "--push" not in none.argv
    digest = build.plan(v, push_by_digest="registry.example.com/rlbox/sim")
    assert digest.output == "digest" and digest.push and digest.tags == ()
    assert "registry.example.com/rlbox/sim@<digest>" in digest.describe_output()
    assert build.plan(v, push=True).output == "push"
    for kwargs, message in (
        ({"push": True, "push_by_digest": "r.example.com/a/b"}, "exclude each other"),
        ({"push_by_digest": "r.example.com/a/b", "tags": ("r.example.com/a/b:x",)}, "--tag does nothing"),
        ({"push_by_digest": "r.example.com/a/b:x"}, "without tag or digest"),
        ({"push": True, "load": False}, "--no-load with --push"),
    ):
        with pytest.raises(RlboxError, match=message):
            build.plan(v, **kwargs)


# ---------------------------------------------------------------------------------------------
# What each step mounts from the source cache, and what happens when a mounted path is absent.


def test_the_plan_lists_exactly_the_mounts_of_its_dockerfile(m):
    v = m.get("verl_pt210_cann910:ax-x86")
    p = build.plan(v)
    text = p.dockerfile.read_text()
    binds = re.findall(r"--mount=type=bind,source=\.rlbox-sources/([^,]+),target=/opt/rlbox/sources/([^ ]+)", text)
    assert [s for s, _ in binds] == list(p.mounts) and all(s == t for s, t in binds)
    assert p.mounts[:2] == ("debs/x86_64", "wheels/x86_64-py3.12")
    assert set(p.mounts[2:]) == {"sdist/vllm-0.23.0.tar.gz", "sdist/vllm_ascend-0.23.0.post1.tar.gz"}
    assert "source=.rlbox-sources," not in text  # no step mounts the whole cache


def test_an_online_build_mounts_absent_sources_empty_and_says_so_in_one_line(m, tmp_path):
    p = dataclasses.replace(build.plan(m.get("verl_pt210_cann910:ax-x86")), root=tmp_path)
    said = []
    build.mount_sources(p, said.append)
    cache = tmp_path / ".rlbox-sources"
    assert (cache / "debs" / "x86_64").is_dir() and (cache / "wheels" / "x86_64-py3.12").is_dir()
    assert (cache / "sdist" / "vllm-0.23.0.tar.gz").stat().st_size == 0
    assert said == ["rlbox: .rlbox-sources/debs/x86_64 (and 3 more) not in the source cache: mounted empty, this build downloads "
                    "instead (`rlbox fetch-sources verl_pt210_cann910:ax-x86` fills it)"]
    said.clear()
    build.mount_sources(p, said.append)  # present now: nothing to say
    assert said == []


def test_an_offline_build_names_the_first_absent_mount_and_the_fetch(m, tmp_path):
    p = dataclasses.replace(build.plan(m.get("verl_pt210_cann910:ax-x86")), root=tmp_path, offline=True)
    with pytest.raises(RlboxError) as err:
        build.mount_sources(p, print)
    assert str(err.value) == ("offline build of verl_pt210_cann910:ax-x86: .rlbox-sources/debs/x86_64 is missing (and 3 more): "
                              "run `rlbox fetch-sources verl_pt210_cann910:ax-x86` where the network is reachable")
    assert not (tmp_path / ".rlbox-sources").exists()


def test_placeholders_are_not_taken_for_the_cache_offline(m, tmp_path):
    v = m.get("verl_pt210_cann910:ax-x86")
    sources.make_placeholders(tmp_path, sources.mounts(v))
    gaps = sources.missing(v, tmp_path)
    assert "sdist/vllm-0.23.0.tar.gz" in gaps and any(g.startswith("wheels/x86_64-py3.12/") for g in gaps)
    git = m.get("verl_pt27_25rc3:ax-x86")
    path = next(p for p in sources.mounts(git) if p.startswith("git/"))
    sources.make_placeholders(tmp_path, [path])
    assert path in sources.missing(git, tmp_path)  # an empty folder is not a repository
