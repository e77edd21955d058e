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
    assert "COPY rlbox-verl-cpu-shims.pth rlbox_verl_cpu_shims.py /opt/rlbox/venv/lib/python3.11/site-packages/" in lines
    assert 'io.rlbox.standin="verl-cpu-shims"' in p.dockerfile
    assert p.command()[:2] == ["docker", "build"]
    assert standins.describe_labels({standins.LABEL: "verl-cpu-shims", standins.LABEL_SUMMARY: "verl CPU shims (x)"}) \
        == "stand-in: verl CPU shims (x) [verl-cpu-shims]"
    assert standins.describe_labels({"io.rlbox.release": "verl_cpu"}) is None


def test_a_stand_in_refuses_a_release_it_is_not_made_for_and_unknown_names(m):
    with pytest.raises(RlboxError, match="made for verl_cpu, verl_pt27_25rc3, not rlbox_sim"):
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
    assert len(shims) == 5
    for block in shims:
        assert ".py:" in block.split("\n\n")[0], block[:200]
    assert (standins.ROOT / s.name / "rlbox-verl-cpu-shims.pth").read_text() == "import rlbox_verl_cpu_shims\n"
