"""Read what an image says about itself: its OCI/rlbox labels and /etc/rlbox/image.json."""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

from .errors import RlboxError

MANIFEST_PATH = "/etc/rlbox/image.json"


def docker_client():
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as err:
        raise RlboxError(f"Docker engine not reachable ({_short(err)}): start dockerd or set DOCKER_HOST") from None
    return client


def _short(err: Exception) -> str:
    return str(err).splitlines()[0][:160]


def read_file(client, image: str, path: str) -> bytes | None:
    """A file's bytes from an image, through a created (never started) container."""
    from docker.errors import NotFound

    container = client.containers.create(image, command=["true"], entrypoint=[])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member else None
            return handle.read() if handle else None
    except NotFound:
        return None
    finally:
        container.remove(force=True)


def inspect(image: str, client=None) -> dict[str, Any]:
    from docker.errors import ImageNotFound

    client = client or docker_client()
    try:
        img = client.images.get(image)
    except ImageNotFound:
        raise RlboxError(f"image {image} is not on this engine: pull it or build it (rlbox build RELEASE:VARIANT)") from None
    labels = img.attrs.get("Config", {}).get("Labels") or {}
    raw = read_file(client, image, MANIFEST_PATH)
    manifest = None
    if raw is not None:
        try:
            manifest = json.loads(raw)
        except ValueError:
            raise RlboxError(f"{image}: {MANIFEST_PATH} is not valid JSON") from None
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
    }
