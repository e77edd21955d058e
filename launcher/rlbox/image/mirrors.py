"""Mirror profiles (``images/mirrors.yaml``): pip index, apt mirror, git mirror, Hugging Face
endpoint and image registries, switched together by name (``--mirror cn``). The ``offline``
profile builds from the local source cache that ``rlbox fetch-sources`` fills."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from rlbox.core.errors import RlboxError, did_you_mean
from rlbox.core.config import Strict, read_yaml, rel, validate_named
from rlbox.registry import reference

SOURCES_DIR = ".rlbox-sources"  # inside the build context: the offline build mounts it


class Profile(Strict):
    description: str
    pip_index: str | None = None
    apt_mirror: dict[str, str] = Field(
        default_factory=dict, description="archive URL per distribution: ubuntu, ubuntu-ports (arm64), debian"
    )
    git_mirror: str | None = Field(None, description="prefix that replaces https://github.com/")
    hf_endpoint: str | None = None
    registries: dict[str, str] = Field(default_factory=dict, description="image reference prefix -> replacement")

    @field_validator("registries")
    @classmethod
    def _prefixes(cls, v: dict[str, str]) -> dict[str, str]:
        for text in (*v, *v.values()):  # each a repository name, or one ending in / (a namespace)
            reference.as_validator(reference.Reference.parse_name)(text.removesuffix("/"))
        return v
    offline: bool = Field(False, description="build with no network, from the source cache only")

    def apt_for(self, os_name: str, arch: str) -> str | None:
        if os_name.startswith("ubuntu"):
            return self.apt_mirror.get("ubuntu-ports" if arch != "x86_64" else "ubuntu") or self.apt_mirror.get("ubuntu")
        if os_name.startswith("debian"):
            return self.apt_mirror.get("debian")
        return None

    def image(self, ref: str) -> str:
        """``ref`` through the profile's registry rewrites (longest matching prefix wins)."""
        for prefix in sorted(self.registries, key=len, reverse=True):
            if ref.startswith(prefix):
                return self.registries[prefix] + ref[len(prefix):]
        return ref


def load(root: Path) -> dict[str, Profile]:
    path = root / "images" / "mirrors.yaml"
    if not path.exists():
        return {}
    data = read_yaml(path, root).get("profiles") or {}
    return validate_named(Profile, data, rel(path, root), "profiles")


def get(root: Path, name: str) -> Profile:
    profiles = load(root)
    if name not in profiles:
        known = ", ".join(profiles) or "none (images/mirrors.yaml is missing)"
        raise RlboxError(f"--mirror {name}: no such profile in images/mirrors.yaml{did_you_mean(name, profiles)}; known: {known}")
    return profiles[name]
