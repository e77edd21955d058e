"""Can this machine build (and run) images for another platform? Gathered facts and a pure judgement.

A ``linux/arm64`` build on an x86_64 machine runs every ``RUN`` step through an emulator: BuildKit
(the engine's own ``docker`` driver) executes the arm64 binaries of the image, which works only
when the kernel's ``binfmt_misc`` hands aarch64 ELF files to ``qemu-aarch64`` and the emulator was
registered with the **F** flag (opened at registration, so it is found inside every container's
root, where ``/usr/bin/qemu-aarch64-static`` does not exist). A builder of another driver
(``docker-container``, ``kubernetes``, ``remote``; e.g. a native arm64 node added with ``docker
buildx create --append``) brings its own platforms: its list is trusted.

``gather()`` reads the facts (``/proc/sys/fs/binfmt_misc``, ``uname -m``, ``docker buildx
inspect``); ``judge(platform, facts)`` says in one line what is missing, or None. Nothing is run
that changes the machine: ``make arm64-emulation`` (tools/enable-arm64-emulation.sh) does that.
"""

from __future__ import annotations

import platform as host_platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlbox.image.schema import PLATFORM_ARCH

BINFMT = Path("/proc/sys/fs/binfmt_misc")
# ELF magic+mask of each architecture as qemu's binfmt registrations give them (e_machine at byte 18).
ELF_MACHINE = {"aarch64": "b700", "x86_64": "3e00"}
ENABLE = {"aarch64": "install qemu-user-static and binfmt-support (`make arm64-emulation` does it: mounts binfmt_misc, "
                     "registers qemu-aarch64 with the F flag), or build on an arm64 builder (docker buildx create --append)"}
HOST_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class Entry:
    """One binfmt_misc registration, as /proc/sys/fs/binfmt_misc/NAME shows it."""
    name: str
    enabled: bool
    interpreter: str
    flags: str
    magic: str


@dataclass(frozen=True)
class Facts:
    host: str                          # uname -m, normalised (x86_64, aarch64)
    binfmt_mounted: bool
    binfmt_enabled: bool               # /proc/sys/fs/binfmt_misc/status says enabled
    entries: tuple[Entry, ...] = ()
    driver: str | None = None          # the current buildx builder's driver (docker, docker-container...)
    builder: str | None = None
    platforms: tuple[str, ...] = field(default=())  # what that builder reports it can build


def parse_entry(name: str, text: str) -> Entry:
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        fields.setdefault(key.rstrip(":"), value.strip())
    return Entry(name, text.startswith("enabled"), fields.get("interpreter", ""), fields.get("flags", ""),
                 fields.get("magic", ""))


def parse_buildx(text: str) -> tuple[str | None, str | None, tuple[str, ...]]:
    """Driver, builder name and platforms from ``docker buildx inspect`` (the first node's)."""
    driver = name = None
    platforms: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "Driver" and driver is None:
            driver = value
        elif key == "Name" and name is None:
            name = value
        elif key == "Platforms" and not platforms:
            platforms = [p.strip().rstrip("*") for p in value.split(",") if p.strip()]
    return driver, name, tuple(platforms)


def emulates(entry: Entry, arch: str) -> bool:
    """Does this registration hand ``arch``'s 64-bit ELF executables to an interpreter?"""
    machine = ELF_MACHINE.get(arch)
    return bool(machine) and entry.magic.startswith("7f454c46") and entry.magic.endswith(machine)


def judge(platform: str, facts: Facts) -> str | None:
    """None when ``platform`` can be built here; else one line: what is missing and what to install."""
    arch = PLATFORM_ARCH.get(platform)
    if arch is None or arch == facts.host:
        return None
    where = f"cannot build {platform} on this {facts.host} machine"
    enable = ENABLE.get(arch, f"register a {arch} emulator (qemu-user-static) with binfmt_misc's F flag, "
                              f"or build on a {arch} builder")
    if facts.driver not in (None, "docker"):
        if platform in facts.platforms:
            return None
        return (f"{where}: the buildx builder '{facts.builder}' ({facts.driver}) does not list {platform} "
                f"(it has {', '.join(facts.platforms) or 'none'}): {enable}")
    if not facts.binfmt_mounted:
        return f"{where}: binfmt_misc is not mounted, so nothing emulates {arch}: {enable}"
    if not facts.binfmt_enabled:
        return f"{where}: binfmt_misc is disabled (/proc/sys/fs/binfmt_misc/status): {enable}"
    mine = [e for e in facts.entries if emulates(e, arch)]
    good = [e for e in mine if e.enabled and "F" in e.flags]
    if good:
        return None
    live = [e for e in mine if e.enabled]
    if live:
        e = live[0]
        return (f"{where}: {e.name} emulates {arch} but is registered without the F flag (flags '{e.flags}'), so "
                f"BuildKit's RUN steps cannot find {e.interpreter} inside the image: {enable}")
    if mine:
        return f"{where}: the {arch} emulator {mine[0].name} is registered but disabled: {enable}"
    return f"{where}: no {arch} emulator is registered with binfmt_misc: {enable}"


def host_arch() -> str:
    machine = host_platform.machine()
    return HOST_ALIASES.get(machine, machine)


def native(platform: str) -> bool:
    """Does ``platform`` run on this machine without emulation?"""
    return PLATFORM_ARCH.get(platform) == host_arch()


def gather(docker: str = "docker") -> Facts:
    """Read the facts ``judge`` needs from this machine (and the current buildx builder)."""
    host = host_arch()
    mounted = (BINFMT / "register").exists()
    status = (BINFMT / "status").read_text().strip() if mounted else ""
    entries = []
    if mounted:
        for path in sorted(BINFMT.iterdir()):
            if path.name in ("register", "status"):
                continue
            try:
                entries.append(parse_entry(path.name, path.read_text()))
            except OSError:
                continue
    driver = name = None
    platforms: tuple[str, ...] = ()
    try:
        proc = subprocess.run([docker, "buildx", "inspect"], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:
            driver, name, platforms = parse_buildx(proc.stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return Facts(host, mounted, status == "enabled", tuple(entries), driver, name, platforms)
