"""The lockfile: resolution (git refs and short SHAs, pip for the target platform), the check that
matrix and lock agree, and how rendered Dockerfiles consume it."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from support import selftest
from conftest import REPO, rlbox
from rlbox.image import resolve
from rlbox.image import matrix
from rlbox.image import render
from rlbox.core.errors import RlboxError


def _edit_yaml(path, fn):
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_committed_locks_match_the_matrix():
    proc = rlbox("lock", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "images/lock/ matches images/" in proc.stdout
    m = matrix.load(REPO)
    assert all(v.lock.state == "fresh" for v in m.variants)


def test_changed_pin_makes_the_lock_stale_and_build_refuses(tree):
    env = {"RLBOX_ROOT": str(tree)}
    _edit_yaml(tree / "images" / "rlbox_sim.yaml", lambda d: d["components"]["ray"].update(pip="ray[default]==2.59.0"))
    proc = rlbox("lock", "--check", env=env)
    assert proc.returncode == 1
    assert ("images/lock/rlbox_sim.json: rlbox_sim:amd64 was locked from other manifest inputs: "
            "run `rlbox lock rlbox_sim`") in proc.stdout
    proc = rlbox("build", "rlbox_sim:amd64", "--dry-run", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "was locked from other manifest inputs: run `rlbox lock rlbox_sim` before building" in proc.stderr
    # A stale lock is never rendered into the Dockerfile: pip would be held to the old versions.
    assert render.constraints(matrix.load(tree).get("rlbox_sim:amd64")).count("==") == 0


def test_patches_and_build_env_do_not_stale_a_lock(tree):
    patch = tree / "patches" / "verl" / "0001-import-verl-npu-plugin.patch"
    patch.write_bytes(patch.read_bytes() + b"\n")
    _edit_yaml(tree / "images" / "verl_pt27_25rc3.yaml",
               lambda d: d["components"]["vllm"]["env"].update(MAX_JOBS="2"))
    proc = rlbox("lock", "--check", env={"RLBOX_ROOT": str(tree)})
    assert proc.returncode == 0, proc.stdout


def test_locked_dockerfile_installs_under_the_lock_and_pins_the_base(tree):
    m = matrix.load(REPO)
    v = m.get("rlbox_sim:amd64")
    locked = json.loads((REPO / "images" / "lock" / "rlbox_sim.json").read_text())["variants"]["amd64"]
    constraints = (REPO / v.dockerfile.parent / "constraints.txt").read_text().splitlines()
    assert "ray==2.60.0" in constraints
    assert {f"{n}=={p['version']}" for n, p in locked["pip"]["packages"].items()} == {c for c in constraints if "==" in c}
    text = (REPO / v.dockerfile).read_text()
    assert f"COPY {v.dockerfile.parent}/constraints.txt /etc/rlbox/constraints.txt" in text
    assert json.loads((REPO / v.dockerfile.parent / "image.json").read_text())["lock"]["pip"]["ray"] == "2.60.0"

    # With a base digest in the lock, FROM names exactly that image and the labels record it.
    digest = "sha256:" + "ab" * 32
    path = tree / "images" / "lock" / "rlbox_sim.json"
    data = json.loads(path.read_text())
    data["variants"]["amd64"]["base"]["digest"] = digest
    path.write_text(json.dumps(data))
    tv = matrix.load(tree).get("rlbox_sim:amd64")
    text = render.dockerfile(tv)
    assert f"ARG BASE_IMAGE=rlbox/debian:bookworm@{digest}" in text
    assert f"io.rlbox.base.digest={digest}" in text
    assert f"io.rlbox.lock={tv.lock.digest()}" in text


def test_flagship_locks_resolve_for_their_own_platform():
    """The committed arm64 locks hold torch-npu and no CUDA wheels; A+X takes the CPU torch."""
    data = json.loads((REPO / "images" / "lock" / "verl_pt27_25rc3.json").read_text())["variants"]
    for name in ("a2-arm", "a3-arm"):
        pkgs = data[name]["pip"]["packages"]
        assert pkgs["torch"]["version"] == "2.7.1" and pkgs["torch-npu"]["version"] == "2.7.1"
        assert not [p for p in pkgs if p.startswith("nvidia-")]
    ax = data["ax-x86"]["pip"]
    if ax["packages"]:
        assert ax["packages"]["torch"]["version"] == "2.7.1+cpu"
    else:  # locked where download.pytorch.org was out of reach: the lock says so, not silently empty
        assert ax["note"] == "https://download.pytorch.org/whl/cpu not reachable from here; lock again where it is"


def test_pip_markers_are_evaluated_for_the_target(tmp_path):
    """torch from PyPI needs CUDA wheels on x86_64 only: resolve it for both and compare."""
    (tmp_path / "images").mkdir()
    for name in ("hardware.yaml", "defaults.yaml"):
        shutil.copy(REPO / "images" / name, tmp_path / "images")
    for d in ("templates", "patches"):
        (tmp_path / d).mkdir()
    release = yaml.safe_load((REPO / "images" / "rlbox_sim.yaml").read_text())
    release["components"] = {"torch": {"pip": "torch==2.7.1"}}
    (tmp_path / "images" / "rlbox_sim.yaml").write_text(yaml.safe_dump(release))
    m = matrix.load(tmp_path)
    ca = "/etc/ssl/certs/ca-certificates.crt"
    arm = resolve.resolve_pip(m.get("rlbox_sim:arm64"), ca_bundle=ca)["packages"]
    x86 = resolve.resolve_pip(m.get("rlbox_sim:amd64"), ca_bundle=ca)["packages"]
    assert arm["torch"]["version"] == x86["torch"]["version"] == "2.7.1"
    assert not [p for p in arm if p.startswith("nvidia-")]
    assert "nvidia-cublas-cu12" in x86
    assert all(len(p["sha256"]) == 64 for p in arm.values())


# ---------------------------------------------------------------------------------------------
# git: tags and short SHAs resolved to full commits, from a real repository.


@pytest.fixture(scope="module")
def fixture_repo(tmp_path_factory):
    return selftest.FixtureRepo(tmp_path_factory.mktemp("lockgit") / "fixture.git").create()


def _variant_with(tmp_path, fixture_repo, **component):
    tree = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
    (tree / "images").mkdir(parents=True)
    shutil.copy(REPO / "images" / "hardware.yaml", tree / "images")
    for d in ("templates", "patches"):
        (tree / d).mkdir()
    data = selftest.manifest(f"file://{fixture_repo.path}", fixture_repo.commit, [])
    data["components"] = {"fixture": {"git": f"file://{fixture_repo.path}", **component}}
    (tree / "images" / "selftest.yaml").write_text(yaml.safe_dump(data))
    v = matrix.load(tree).variants[0]
    return v, v.components[0]


def test_tag_resolves_to_its_commit(tmp_path, fixture_repo):
    v, c = _variant_with(tmp_path, fixture_repo, ref="v1.0.0")
    assert v.unresolved == ["fixture"]
    assert resolve.resolve_commit(v, c.name, c.spec) == fixture_repo.commit
    v, c = _variant_with(tmp_path, fixture_repo, ref="v1.0.0", commit=fixture_repo.commit[:8])
    assert resolve.resolve_commit(v, c.name, c.spec) == fixture_repo.commit


def test_short_sha_without_ref_resolves(tmp_path, fixture_repo):
    v, c = _variant_with(tmp_path, fixture_repo, commit=fixture_repo.commit[:9])
    assert resolve.resolve_commit(v, c.name, c.spec) == fixture_repo.commit


@pytest.mark.parametrize("component,expected", [
    ({"ref": "v9.9.9"}, "components.fixture: ref 'v9.9.9' does not exist in file://"),
    ({"ref": "v1.0.0", "commit": "0000000"}, "components.fixture: ref 'v1.0.0' is "),
    ({"commit": "0000000"}, "components.fixture: commit 0000000 is not in file://"),
], ids=["unknown tag", "tag vs short sha", "unknown short sha"])
def test_bad_git_pins_are_one_line(tmp_path, fixture_repo, component, expected):
    v, c = _variant_with(tmp_path, fixture_repo, **component)
    with pytest.raises(RlboxError) as err:
        resolve.resolve_commit(v, c.name, c.spec)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_unreachable_source_is_one_line(tmp_path, fixture_repo):
    v, c = _variant_with(tmp_path, fixture_repo, ref="v1.0.0")
    spec = c.spec.model_copy(update={"git": "git://127.0.0.1:9/nothing.git"})
    with pytest.raises(RlboxError) as err:
        resolve.resolve_commit(v, c.name, spec)
    assert "cannot reach git://127.0.0.1:9/nothing.git" in str(err.value)


def test_unlocked_ref_stops_render_naming_the_lock(tree):
    _edit_yaml(tree / "images" / "verl_pt27_25rc3.yaml",
               lambda d: d["components"]["verl"].update(commit="796871d7d0"))
    proc = rlbox("render", "--check", env={"RLBOX_ROOT": str(tree)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert ("images/verl_pt27_25rc3.yaml: components.verl.commit: not a full commit, and no fresh lock of "
            "verl_pt27_25rc3:a2-arm resolves it (images/lock/verl_pt27_25rc3.json): "
            "run `rlbox lock verl_pt27_25rc3`") in proc.stderr
