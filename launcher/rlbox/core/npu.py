"""NPU facts shared by the image half (which variant fits this host) and the cluster half (is a
node fit to run): what `npu-smi info` says the chip is, which hardware that chip is, and the
Ascend driver's version from its ``version.info`` and how versions order."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

CHIP_HARDWARE = (("Ascend910", "a3"), ("910B", "a2"))  # npu-smi Name column -> hardware
NPU_SMI_ENV = "RLBOX_NPU_SMI"  # the npu-smi command on this machine (tests point it at a stand-in)


def npu_smi_argv() -> list[str]:
    """`npu-smi info` on this machine: ``$RLBOX_NPU_SMI`` (a command, split like a shell) or npu-smi."""
    return [*shlex.split(os.environ.get(NPU_SMI_ENV) or "npu-smi"), "info"]


def chip_name(table: str) -> str | None:
    """The Name column of the first NPU row of `npu-smi info` (910B3, Ascend910, ...)."""
    names = re.findall(r"^\|\s*\d+\s+(\S+)\s+\|\s*(?:OK|Warning|Alarm|Critical)", table, re.M)
    return names[0] if names else None


def chip_hardware(chip: str) -> str | None:
    """The hardware a chip name belongs to (Ascend910 -> a3, 910B3 -> a2), None if unknown."""
    return next((hw for prefix, hw in CHIP_HARDWARE if chip.startswith(prefix)), None)


def local_chip() -> tuple[str | None, str]:
    """This machine's NPU chip from `npu-smi info`: (chip, "") or (None, why not)."""
    argv = npu_smi_argv()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return None, f"{argv[0]} not found (no Ascend driver on this host?)"
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{shlex.join(argv)} failed: {err}"
    if proc.returncode != 0:
        return None, f"{shlex.join(argv)} exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}"
    chip = chip_name(proc.stdout)
    return (chip, "") if chip else (None, f"{shlex.join(argv)} printed no NPU row")


def driver_version(version_info: str) -> str | None:
    """The driver version a ``version.info`` names (``package_version``, else ``Version``)."""
    fields = dict(line.split("=", 1) for line in version_info.splitlines() if "=" in line)
    return fields.get("package_version") or fields.get("Version")


def driver_key(text: str) -> tuple:
    """Sort key of a driver version: 25.3.rc1 < 25.3.rc2 < 25.3.0 < 25.3.1 < 25.5.rc1 (Ascend HDK numbering)."""
    parts = text.lower().split(".")
    out = []
    for p in parts[:3]:
        m = re.fullmatch(r"rc(\d+)", p)
        out.append((0, int(m.group(1))) if m else (1, int(p)) if p.isdigit() else (0, 0))
    return tuple(out)
