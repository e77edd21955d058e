"""The version matrix: real manifests load with the seed's pins; bad ones fail in one line."""

from __future__ import annotations


import pytest
import yaml

from conftest import REPO, rlbox
from rlbox.image import matrix, schema
from rlbox.core.errors import RlboxError


def test_flagship_pins_exactly_as_the_image_guide(m):
    for variant in ("a2-arm", "a3-arm", "ax-x86"):
        v = m.get(f"verl_pt27_25rc3:{variant}")
        r = v.release
        assert (r.cann.version, r.python, r.driver.min) == ("8.3.RC1", "3.10", "25.3.RC1")
        pins = {c.name: c.spec for c in v.components}
        assert pins["torch"].version.split("+")[0] == "2.7.1"
        assert pins["torch_npu"].pip == "torch-npu==2.7.1"
        assert pins["transformers"].commit.startswith("8365f70e925")
        assert pins["vllm"].commit.startswith("38217877aa7")
        assert pins["vllm_ascend"].commit.startswith("1de16ead8e")
        assert pins["verl"].commit.startswith("796871d7d0")
        assert pins["mindspeed"].commit.startswith("1cdd0abd75")
        assert pins["megatron"].ref == "core_v0.12.1"
        assert pins["rl_plugin"].ref == "v2.2.0" and pins["rl_plugin"].subdir == "rl-plugin"
        assert pins["vllm"].env["VLLM_TARGET_DEVICE"] == "empty"
        assert v.image == f"swr.cn-south-1.myhuaweicloud.com/ascendhub/verl_pt27_25rc3:{variant}"
        assert [p.ref for p in v.patches] == ["verl/0001-import-verl-npu-plugin.patch"]
        assert list(pins) == [n for n in schema.INSTALL_ORDER if n in pins]


def test_variants_name_base_platform_chip_and_soc(m):
    a2, a3, ax = (m.get(f"verl_pt27_25rc3:{n}") for n in ("a2-arm", "a3-arm", "ax-x86"))
    assert a2.base_image == "quay.io/ascend/cann:8.3.rc1-910b-ubuntu22.04-py3.11"
    assert a3.base_image == "quay.io/ascend/cann:8.3.rc1-a3-ubuntu22.04-py3.11"
    assert (a2.platform, a3.platform, ax.platform) == ("linux/arm64", "linux/arm64", "linux/amd64")
    assert (a2.hardware.soc_version, a3.hardware.soc_version) == ("ascend910b1", "ascend910_9391")
    assert a3.hardware.npus_per_node == 16
    # A+X takes the CPU torch from its own index; the arm variants take PyPI's.
    assert {c.name: c.spec for c in ax.components}["torch"].index_url.endswith("/whl/cpu")
    assert {c.name: c.spec for c in a2.components}["torch"].index_url is None


def test_second_release_inherits_and_differs(m):
    v = m.get("verl_pt27_cann82rc1:a2-arm")
    pins = {c.name: c.spec for c in v.components}
    assert v.release.cann.version == "8.2.RC1" and v.release.python == "3.11"
    assert v.base_image == "quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11"
    assert pins["vllm"].ref == "v0.11.0" and pins["vllm"].env == {"VLLM_TARGET_DEVICE": "empty", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    assert pins["transformers"].pip == "transformers==4.57.1" and pins["transformers"].git is None
    assert "megatron" not in pins and "rl_plugin" not in pins
    assert [p.name for p in v.patches] == ["0002-npu-patch-qwen3-vl.patch", "0003-fsdp-workers-vllm-ascend-patch.patch"]
    # Shared facts are written once: the child file does not repeat the parent's pins.
    text = (REPO / "images" / "verl_pt27_cann82rc1.yaml").read_text()
    assert "vllm-project/vllm.git" not in text and "torch==2.7.1" not in text


# ---------------------------------------------------------------------------------------------
# Bad manifests: one line naming file and field, exit 2, no traceback.

def _edit(data, path, value):
    keys = path.split(".")
    for k in keys[:-1]:
        data = data[k]
    if value is _DELETE:
        del data[keys[-1]]
    else:
        data[keys[-1]] = value


_DELETE = object()

BAD = [
    ("unknown key", "components.verl.pathces", ["0001-import-verl-npu-plugin.patch"],
     "images/verl_pt27_25rc3.yaml: components.verl.pathces: unknown key (did you mean 'patches'?)"),
    ("missing pin", "components.vllm.commit", _DELETE,
     "images/verl_pt27_25rc3.yaml: components.vllm: commit: missing pin"),
    ("bad commit", "components.verl.commit", "v0.5-796871",
     "components.verl.commit: 'v0.5-796871' is not a commit: give the full 40-hex SHA"),
    ("unpinned pip", "components.torch.pip", "torch>=2.7",
     "components.torch: pip: 'torch>=2.7' is not pinned"),
    ("platform vs hardware", "variants.a3-arm.platform", "linux/amd64",
     "variants.a3-arm.platform: linux/amd64 does not fit hardware a3"),
    ("missing patch", "components.verl.patches", ["0009-nothing.patch"],
     "components.verl.patches: patches/verl/0009-nothing.patch does not exist"),
    ("unknown hardware", "variants.a3-arm.hardware", "a33",
     "variants.a3-arm.hardware: unknown hardware 'a33' (did you mean 'a3'?)"),
    ("bad cann", "cann.version", "8.3",
     "cann.version: '8.3' is not a CANN version"),
    ("missing field", "driver", _DELETE,
     "images/verl_pt27_25rc3.yaml: driver: missing; this field is required"),
]


@pytest.mark.parametrize("case,path,value,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_manifest_is_one_line(tree, case, path, value, expected):
    manifest = tree / "images" / "verl_pt27_25rc3.yaml"
    data = yaml.safe_load(manifest.read_text())
    _edit(data, path, value)
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RlboxError) as err:
        matrix.load(tree)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)
    proc = rlbox("images", "list", env={"RLBOX_ROOT": str(tree)})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and expected in proc.stderr


def test_install_order_is_enforced(tree):
    manifest = tree / "images" / "verl_pt27_25rc3.yaml"
    data = yaml.safe_load(manifest.read_text())
    comps = data["components"]
    data["components"] = {"verl": comps.pop("verl"), **comps}
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RlboxError, match=r"components: 'verl' is listed before 'torch', but installs after it"):
        matrix.load(tree)


def test_yaml_syntax_error_names_line(tree):
    (tree / "images" / "verl_pt27_25rc3.yaml").write_text("release: verl_pt27_25rc3\ncomponents: [\n")
    with pytest.raises(RlboxError, match=r"images/verl_pt27_25rc3.yaml:3: .*fix the YAML syntax"):
        matrix.load(tree)


def test_extends_unknown_release(tree):
    path = tree / "images" / "verl_pt27_cann82rc1.yaml"
    path.write_text(path.read_text().replace("extends: verl_pt27_25rc3", "extends: verl_pt27_25rc4"))
    with pytest.raises(RlboxError, match=r"extends: no release 'verl_pt27_25rc4' \(did you mean 'verl_pt27_25rc3'\?\)"):
        matrix.load(tree)


def test_variant_override_of_unknown_component(tree):
    path = tree / "images" / "verl_pt27_25rc3.yaml"
    data = yaml.safe_load(path.read_text())
    data["variants"]["ax-x86"]["components"] = {"troch": {"pip": "torch==2.7.1+cpu"}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RlboxError, match=r"variants.ax-x86.components.troch: no such component.*'torch'"):
        matrix.load(tree)


def test_unknown_ref_names_what_exists(m):
    with pytest.raises(RlboxError, match="has no variant 'a4-arm'.*a2-arm, a3-arm, ax-x86"):
        m.get("verl_pt27_25rc3:a4-arm")
    with pytest.raises(RlboxError, match="not RELEASE:VARIANT"):
        m.get("verl_pt27_25rc3")


def test_images_list_json(m):
    proc = rlbox("images", "list", "--json", check=True)
    import json

    rows = json.loads(proc.stdout)
    assert len(rows) == len(m.variants) >= 6
    for row in rows:
        for key in ("release", "variant", "hardware", "platform", "tag", "dockerfile", "components"):
            assert row[key]
        assert (REPO / row["dockerfile"]).is_file()
    flagship = next(r for r in rows if r["ref"] == "verl_pt27_25rc3:a3-arm")
    assert flagship["components"]["verl"].endswith("@796871d7d092f7cbc6a64e7f4a3796f7a2217f5e")
