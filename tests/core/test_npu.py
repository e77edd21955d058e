"""NPU facts shared by the image and cluster halves: the npu-smi command and its chip, chip ->
hardware, the driver's version.info and the order of driver versions."""

from __future__ import annotations

import pytest

from rlbox.cluster import sim
from rlbox.core import npu


def test_npu_smi_stand_in_names_the_chip(tmp_path, monkeypatch):
    for hardware, chip in (("a2", "910B3"), ("a3", "Ascend910")):
        folder = sim.write_stand_ins(tmp_path / hardware, hardware, 8 if hardware == "a2" else 16, "25.3.rc1")
        monkeypatch.setenv(npu.NPU_SMI_ENV, str(folder / "npu-smi"))
        assert npu.local_chip() == (chip, "")
    monkeypatch.setenv(npu.NPU_SMI_ENV, str(tmp_path / "absent" / "npu-smi"))
    chip, problem = npu.local_chip()
    assert chip is None and "not found" in problem


def test_npu_smi_command_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(npu.NPU_SMI_ENV, raising=False)
    assert npu.npu_smi_argv() == ["npu-smi", "info"]
    monkeypatch.setenv(npu.NPU_SMI_ENV, "ssh box -- '/usr/local/bin/npu-smi'")
    assert npu.npu_smi_argv() == ["ssh", "box", "--", "/usr/local/bin/npu-smi", "info"]


@pytest.mark.parametrize("table,chip,hardware", [
    (sim.npu_smi_table("a2", 8, "25.3.rc1"), "910B3", "a2"),
    (sim.npu_smi_table("a3", 16, "25.3.rc1"), "Ascend910", "a3"),
    (sim.npu_smi_table("a2", 8, "25.3.rc1", "910B4"), "910B4", "a2"),
    (sim.npu_smi_table("a3", 16, "25.3.rc1", "310P3"), "310P3", None),
    ("| 0     910B3               | Warning       | 93.5        37                0    / 0             |\n", "910B3", "a2"),
    ("+---+\n| npu-smi 25.3.rc1 |\n", None, None),
])
def test_chip_name_and_its_hardware(table, chip, hardware):
    assert npu.chip_name(table) == chip
    if chip:
        assert npu.chip_hardware(chip) == hardware


@pytest.mark.parametrize("text,version", [
    ("Version=25.3.rc1\npackage_version=25.3.rc1\nascendhal_version=7.35.23\n", "25.3.rc1"),
    ("Version=24.1.0\npackage_version=24.1.rc2\n", "24.1.rc2"),  # package_version wins
    ("Version=23.0.3\n", "23.0.3"),
    ("# no fields\n", None),
    ("", None),
])
def test_driver_version_from_version_info(text, version):
    assert npu.driver_version(text) == version


def test_driver_versions_order_like_the_hdk():
    ordered = ["24.1.rc1", "25.2.0", "25.3.rc1", "25.3.RC2", "25.3.0", "25.3.1", "25.5.rc1", "26.0.0"]
    assert sorted(ordered, key=npu.driver_key) == ordered
    assert npu.driver_key("25.3.RC1") == npu.driver_key("25.3.rc1")
    assert npu.driver_key("25.3.rc1.b020") == npu.driver_key("25.3.rc1")  # builds past the third part do not count
