"""The build plan is a printable value: the exact buildx command, no engine needed."""

from __future__ import annotations

import shlex

import pytest

from conftest import REPO, rlbox
from rlbox import build, matrix
from rlbox.errors import RlboxError


@pytest.fixture(scope="module")
def m():
    return matrix.load(REPO)


def test_dry_run_prints_the_exact_command():
    proc = rlbox(
        "build", "verl_pt27_25rc3:a3-arm", "--dry-run",
        "--base-image", "swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:8.3.rc1-a3-ubuntu22.04-py3.11",
        "--pip-index", "https://mirrors.example.com/pypi/simple",
        "--git-mirror", "https://gitcode.com/",
        "--apt-mirror", "http://mirrors.example.com/ubuntu",
        "--hf-endpoint", "https://hf-mirror.com",
        "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt",
        "--push",
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
    assert argv[-1] == str(REPO)


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
