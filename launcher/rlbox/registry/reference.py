"""Image references in Docker's grammar, ``[HOST[:PORT]/]PATH[:TAG][@DIGEST]``: parsed, checked
and printed; the first component is a registry host when it is ``localhost`` or holds a dot or a
port. Also this host's platform (linux/amd64, linux/arm64)."""

from __future__ import annotations

import ipaddress
import platform as _platform
import re
from dataclasses import dataclass, replace

from rlbox.core.errors import RlboxError

DOCKER_HUB = "docker.io"
MACHINE_PLATFORM = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # ASCII: \w would take tág
DIGEST_RE = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")
HOST_RE = re.compile(r"^(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]{1,5})?$")


# ---------------------------------------------------------------------------------------------
# References.


def is_registry_host(component: str) -> bool:
    """Docker's rule: the first path component names a registry if it is ``localhost`` or has a
    dot or a port (``swr.cn-south-1.myhuaweicloud.com``, ``127.0.0.1:5000``, ``[::1]:5000``)."""
    return component == "localhost" or "." in component or ":" in component or component.startswith("[")


def split_host(host: str) -> tuple[str, int | None]:
    """``HOST[:PORT]`` -> (HOST, PORT or None); IPv6 in brackets."""
    m = re.fullmatch(r"\[([0-9a-fA-F:]+)\](?::([0-9]+))?|([^:]+)(?::([0-9]+))?", host)
    if not m:
        return host, None
    name = m.group(1) or m.group(3)
    port = m.group(2) or m.group(4)
    return name, int(port) if port else None


def is_loopback(host: str) -> bool:
    name, _ = split_host(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_host(host: str, what: str = "--registry") -> str:
    if not host or "/" in host or not HOST_RE.fullmatch(host):
        raise RlboxError(f"{what} {host!r}: expected a registry HOST[:PORT] such as 127.0.0.1:5000 "
                         "or swr.cn-south-1.myhuaweicloud.com (no scheme, no path)")
    return host


@dataclass(frozen=True)
class Reference:
    """An image reference: registry host, repository path, tag and/or digest."""

    registry: str | None  # None: no registry named (Docker Hub, for Docker)
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Reference":
        raw = text.strip()
        if not raw or any(c.isspace() for c in raw):
            raise RlboxError(f"{text!r} is not an image reference ([HOST[:PORT]/]PATH[:TAG][@sha256:...])")
        rest, digest = raw, None
        if "@" in raw:
            rest, digest = raw.split("@", 1)
            if not DIGEST_RE.fullmatch(digest):
                raise RlboxError(f"{text}: '{digest}' is not a digest (sha256:<64 hex>)")
        registry = None
        first, sep, remainder = rest.partition("/")
        if sep and is_registry_host(first):
            registry, rest = check_host(first, f"{text}: registry"), remainder
        tag = None
        last_slash = rest.rfind("/")
        colon = rest.rfind(":")
        if colon > last_slash:
            rest, tag = rest[:colon], rest[colon + 1:]
            if not TAG_RE.fullmatch(tag):
                raise RlboxError(f"{text}: '{tag}' is not a valid tag (letters, digits, _ . -; at most 128)")
        if not PATH_RE.fullmatch(rest):
            raise RlboxError(f"{text}: '{rest}' is not a repository path (lower-case letters, digits, "
                             "separators . _ - between them, components joined by /)")
        return cls(registry, rest, tag, digest)

    @property
    def name(self) -> str:
        """What Docker calls the repository: HOST/PATH (or just PATH without a registry)."""
        return f"{self.registry}/{self.repository}" if self.registry else self.repository

    @property
    def api_repository(self) -> str:
        """The name in /v2/<name>/: Docker Hub's single-component names live under library/."""
        if self.registry in (None, DOCKER_HUB) and "/" not in self.repository:
            return f"library/{self.repository}"
        return self.repository

    @property
    def target(self) -> str:
        """What to ask the registry for: the digest if there is one, else the tag (default latest)."""
        return self.digest or self.tag or "latest"

    def with_registry(self, host: str) -> "Reference":
        return replace(self, registry=check_host(host))

    def with_tag(self, tag: str | None) -> "Reference":
        return replace(self, tag=tag, digest=None)

    def with_digest(self, digest: str) -> "Reference":
        return replace(self, tag=None, digest=digest)

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def host_platform() -> str:
    machine = _platform.machine()
    if machine not in MACHINE_PLATFORM:
        raise RlboxError(f"this host's architecture {machine!r} has no rlbox platform (linux/amd64 or linux/arm64)")
    return MACHINE_PLATFORM[machine]
