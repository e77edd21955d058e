"""Can this machine build another platform? The judgement over gathered facts (binfmt_misc, the
buildx builder), table-tested; and `rlbox build` of an arm64 variant stopping before BuildKit."""

from __future__ import annotations

import pytest

from rlbox.core.errors import RlboxError
from rlbox.image import build, emulation
from rlbox.image.emulation import Entry, Facts

AARCH64 = "7f454c460201010000000000000000000200b700"
RISCV = "7f454c460201010000000000000000000200f300"
QEMU_F = Entry("qemu-aarch64", True, "/usr/libexec/qemu-binfmt/aarch64-binfmt-P", "PF", AARCH64)
QEMU_NO_F = Entry("qemu-aarch64", True, "/usr/bin/qemu-aarch64-static", "OC", AARCH64)
QEMU_OFF = Entry("qemu-aarch64", False, "/usr/bin/qemu-aarch64-static", "OCF", AARCH64)
OTHER = Entry("qemu-riscv64", True, "/usr/bin/qemu-riscv64-static", "F", RISCV)
X86_DOCKER = dict(host="x86_64", binfmt_mounted=True, binfmt_enabled=True, driver="docker", builder="default",
                  platforms=("linux/amd64", "linux/386"))


@pytest.mark.parametrize("platform,facts,says", [
    # the machine's own platform: nothing to emulate
    ("linux/amd64", Facts(**{**X86_DOCKER, "binfmt_mounted": False}), None),
    ("linux/arm64", Facts(**{**X86_DOCKER, "host": "aarch64", "binfmt_mounted": False}), None),
    # QEMU registered with F: the docker driver's BuildKit runs arm64 RUN steps
    ("linux/arm64", Facts(**X86_DOCKER, entries=(OTHER, QEMU_F)), None),
    # what is missing, each in one line naming what to install
    ("linux/arm64", Facts(**{**X86_DOCKER, "binfmt_mounted": False}), "binfmt_misc is not mounted"),
    ("linux/arm64", Facts(**{**X86_DOCKER, "binfmt_enabled": False}, entries=(QEMU_F,)), "binfmt_misc is disabled"),
    ("linux/arm64", Facts(**X86_DOCKER), "no aarch64 emulator is registered"),
    ("linux/arm64", Facts(**X86_DOCKER, entries=(OTHER,)), "no aarch64 emulator is registered"),
    ("linux/arm64", Facts(**X86_DOCKER, entries=(QEMU_NO_F,)), "registered without the F flag (flags 'OC')"),
    ("linux/arm64", Facts(**X86_DOCKER, entries=(QEMU_OFF,)), "registered but disabled"),
    # another driver (a native arm64 node, a docker-container builder): its own platform list decides
    ("linux/arm64", Facts(**{**X86_DOCKER, "driver": "remote", "builder": "arm", "platforms": ("linux/arm64",),
                             "binfmt_mounted": False}), None),
    ("linux/arm64", Facts(**{**X86_DOCKER, "driver": "docker-container", "builder": "b1"}, entries=(QEMU_F,)),
     "the buildx builder 'b1' (docker-container) does not list linux/arm64"),
])
def test_judge(platform, facts, says):
    line = emulation.judge(platform, facts)
    if says is None:
        assert line is None
    else:
        assert line is not None and says in line and "\n" not in line
        assert line.startswith(f"cannot build {platform} on this {facts.host} machine")
        assert "qemu-user-static" in line and "make arm64-emulation" in line  # what to install


def test_parse_what_the_kernel_and_buildx_print():
    text = ("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n"
            f"magic {AARCH64}\nmask ffffffffffffff00fffffffffffffffffeffffff\n")
    assert emulation.parse_entry("qemu-aarch64", text) == QEMU_F
    assert emulation.parse_entry("x", "disabled\ninterpreter /q\nflags: \n").enabled is False
    inspect = ("Name:          default\nDriver:        docker\nLast Activity: 2026-11-23\n\nNodes:\nName:             default\n"
               "Endpoint:         default\nStatus:           running\nBuildKit version: v0.8+unknown\n"
               "Platforms:        linux/amd64, linux/386, linux/arm64*\n")
    assert emulation.parse_buildx(inspect) == ("docker", "default", ("linux/amd64", "linux/386", "linux/arm64"))


def test_build_of_an_arm64_variant_stops_before_buildkit_without_emulation(m, monkeypatch):
    facts = Facts(**{**X86_DOCKER, "binfmt_mounted": False})
    monkeypatch.setattr(emulation, "gather", lambda docker="docker": facts)
    ran = []
    monkeypatch.setattr(build.subprocess, "Popen", lambda *a, **k: ran.append(a))
    p = build.plan(m.get("rlbox_sim:arm64"))
    with pytest.raises(RlboxError) as err:
        build.execute(p)
    assert str(err.value).startswith("cannot build linux/arm64 on this x86_64 machine: binfmt_misc is not mounted")
    assert ran == []  # BuildKit never started
