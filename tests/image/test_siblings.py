"""A2 and A3 of one release: the same image but for named hardware fields (rlbox.image.siblings), so the
rehearsal of one stands for the other; a difference anywhere else is named with its file and line."""

from __future__ import annotations

import pytest

from conftest import rlbox
from rlbox.image import render, siblings


def flagship(m):
    by = {v.name: v for v in m.variants if v.release.release == "verl_pt210_cann910"}
    return by["a2-arm"], by["a3-arm"]


def test_every_a2_of_the_matrix_is_its_a3_but_for_the_hardware(m):
    pairs = siblings.pairs(m.variants)
    assert {a.release.release for a, _ in pairs} >= {"verl_pt210_cann910"}
    for a, b in pairs:
        found = siblings.compare(a, b)
        assert found.same_but_for_hardware, found.describe()
        assert {"base image", "SoC version", "chip", "variant"} <= set(found.fields), found.fields


def _swap(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("file, change, named", [
    # a pin only A2 has
    ("requirements.lock", lambda t: _swap(t, "\nnumpy==", "\nnumpy==0"), "requirements.lock line "),
    # A2 built for A3's SoC: a hardware field, but not A2's own spelling of it
    ("Dockerfile", lambda t: _swap(t, "SOC_VERSION=ASCEND910B1", "SOC_VERSION=ASCEND910_9391"), "Dockerfile line "),
    # an environment value only A2 has
    ("Dockerfile", lambda t: _swap(t, "TORCH_DEVICE_BACKEND_AUTOLOAD=0", "TORCH_DEVICE_BACKEND_AUTOLOAD=1"), "Dockerfile line "),
    # a step only A2 has
    ("Dockerfile", lambda t: t + "RUN true\n", "Dockerfile: "),
    # a package only A2's image.json lists
    ("image.json", lambda t: _swap(t, '"pip": {\n', '"pip": {\n      "extra": "1.0",\n'), "image.json: "),
])
def test_any_other_difference_is_named(m, file, change, named):
    a, b = flagship(m)
    ta, tb = render.variant_files(a), render.variant_files(b)
    ta[file] = change(ta[file])
    found = siblings.compare_texts("verl_pt210_cann910", a, b, ta, tb)
    assert not found.same_but_for_hardware
    assert [u for u in found.unexplained if u.startswith(named)], found.unexplained
    assert "difference(s) no named field explains" in found.describe()


def test_cli_says_it_and_refuses_an_unknown_release():
    proc = rlbox("images", "siblings", "verl_pt210_cann910")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("verl_pt210_cann910: a2-arm vs a3-arm, 4 rendered files: the same image but for ")
    proc = rlbox("images", "siblings", "nope")
    assert proc.returncode == 2 and proc.stderr.strip() == "rlbox: error: release 'nope' is not in the matrix (rlbox images list)"
