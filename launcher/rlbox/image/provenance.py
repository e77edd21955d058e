"""Read what an image says about itself: its OCI/rlbox labels and /etc/rlbox/image.json."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

from rlbox.core import engine
from rlbox.core.errors import RlboxError

MANIFEST_PATH = "/etc/rlbox/image.json"
SBOM_PATH = "/etc/rlbox/sbom.json"


def read_files(client, image: str, paths: list[str]) -> dict[str, bytes | None]:
    """Files' bytes from an image, through one created (never started) container."""
    container = client.containers.create(image, command=["true"], entrypoint=[])
    try:
        out = {path: engine.read_file(container, path) for path in paths}
    finally:
        container.remove(force=True)
    return out


def _json(image: str, path: str, raw: bytes | None):
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise RlboxError(f"{image}: {path} is not valid JSON") from None


def inspect(image: str, client=None) -> dict[str, Any]:
    from docker.errors import ImageNotFound

    client = client or engine.local_client()
    try:
        img = client.images.get(image)
    except ImageNotFound:
        raise RlboxError(f"image {image} is not on this engine: pull it or build it (rlbox build RELEASE:VARIANT)") from None
    labels = img.attrs.get("Config", {}).get("Labels") or {}
    files = read_files(client, image, [MANIFEST_PATH, SBOM_PATH])
    manifest = _json(image, MANIFEST_PATH, files[MANIFEST_PATH])
    sbom = _json(image, SBOM_PATH, files[SBOM_PATH])
    if manifest is None and not any(k.startswith("io.rlbox.") for k in labels):
        raise RlboxError(f"{image} was not built by rlbox: no io.rlbox.* labels and no {MANIFEST_PATH}")
    return {
        "image": image,
        "id": img.id,
        "repo_digests": img.attrs.get("RepoDigests") or [],
        "architecture": img.attrs.get("Architecture"),
        "size": img.attrs.get("Size"),
        "labels": labels,
        "manifest": manifest,
        "sbom": sbom,
    }


def record(image: str, client=None):
    """What ``image`` records about itself (for `rlbox diff`): from the local engine when it has
    the image, otherwise from its registry (config labels, and the small last layers that hold
    /etc/rlbox/image.json and /etc/rlbox/sbom.json; nothing else is downloaded)."""
    from rlbox.image.diff import Record
    from rlbox.registry.reference import Reference

    try:
        info = inspect(image, client)
    except RlboxError:
        ref = Reference.parse(image)
        if not ref.registry:
            raise
        return _registry_record(ref)
    digest = next((d.split("@", 1)[1] for d in info["repo_digests"]), None)
    return Record(image, "local", info["labels"], info["manifest"], info["sbom"], digest)


_PROVENANCE_LAYER_MAX = 16 * 1024 * 1024  # image.json and sbom.json layers are kilobytes
_PROVENANCE_LAYERS = 6  # how far from the top to look (an image built FROM an rlbox one adds layers)


def _registry_record(ref):
    from rlbox.image.diff import Record
    from rlbox.registry.client import Registry

    reg = Registry(ref.registry)
    manifest = reg.manifest(ref)
    config = reg.config_of(ref, manifest.image)
    wanted = {MANIFEST_PATH.lstrip("/"): None, SBOM_PATH.lstrip("/"): None}
    for layer in list(reversed(manifest.image.get("layers", [])))[:_PROVENANCE_LAYERS]:
        if all(v is not None for v in wanted.values()):
            break
        if layer.get("size", 0) > _PROVENANCE_LAYER_MAX or "zstd" in layer.get("mediaType", ""):
            continue
        try:
            tar = tarfile.open(fileobj=io.BytesIO(reg.blob(ref, layer["digest"])), mode="r:*")
        except tarfile.TarError:
            continue
        with tar:
            for member in tar.getmembers():
                name = member.name.lstrip("./")
                if name in wanted and wanted[name] is None and member.isfile():
                    wanted[name] = tar.extractfile(member).read()
    shown = f"{ref}"
    return Record(shown, "registry", config.labels,
                  _json(shown, MANIFEST_PATH, wanted[MANIFEST_PATH.lstrip("/")]),
                  _json(shown, SBOM_PATH, wanted[SBOM_PATH.lstrip("/")]), manifest.digest)
