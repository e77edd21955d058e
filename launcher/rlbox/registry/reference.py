"""Image references in the distribution spec's grammar, ``[HOST[:PORT]/]PATH[:TAG][@DIGEST]``:
parsed, checked and printed; the first component is a registry host when it is ``localhost`` or
holds a dot, a port or an upper-case letter. The one grammar for every image reference rlbox
takes (options, manifests' base images, locks' base digests, state.json, records). Also this
host's platform (linux/amd64, linux/arm64)."""

from __future__ import annotations

import ipaddress
import platform as _platform
import re
from dataclasses import dataclass, replace
from typing import Annotated

from rlbox.core.errors import RlboxError

DOCKER_HUB = "docker.io"
MACHINE_PLATFORM = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}

# The grammar, restated from github.com/distribution/reference (reference.go's grammar comment,
# regexp.go's patterns, Parse's length check) and github.com/opencontainers/go-digest (the
# algorithms a digest may name and their lengths):
#
#   reference        := name [ ":" tag ] [ "@" digest ]
#   name             := [domain '/'] remote-name                (at most 255 characters, domain included)
#   domain           := host [':' port-number]
#   host             := domain-name | IPv4address | \[ IPv6address \]
#   domain-name      := domain-component ['.' domain-component]*
#   domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
#   port-number      := /[0-9]+/                                (rlbox: a TCP port, 1-65535)
#   path-component   := alpha-numeric [separator alpha-numeric]*
#   remote-name      := path-component ['/' path-component]*
#   alpha-numeric    := /[a-z0-9]+/
#   separator        := /[_.]|__|[-]+/
#   tag              := /[\w][\w.-]{0,127}/                      (\w: ASCII letters, digits, _)
#   digest           := algorithm ":" hex; algorithm /[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*/,
#                       hex /[0-9a-fA-F]{32,}/; go-digest then takes only the algorithms it knows,
#                       each with its length of lower-case hex: sha256 64, sha384 96, sha512 128.
#
# Which first component is a domain is normalize.go's splitDockerDomain: ``localhost``, or one
# holding ``.`` or ``:``, or one with an upper-case letter (a path never has one).
NAME_MAX = 255
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
PATH_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST_GRAMMAR = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
DIGEST_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}
DIGEST_RE = re.compile("|".join(f"{alg}:[a-f0-9]{{{n}}}" for alg, n in DIGEST_LENGTHS.items()))
HOST_RE = re.compile(rf"{_HOST}(?::[0-9]+)?")
_NOT_A_DIGEST = "sha256:<64 lower-case hex> (or sha384:<96>, sha512:<128>)"


def digest_problem(digest: str) -> str | None:
    """Why ``digest`` is not one (the grammar, then go-digest's algorithms and lengths), or None."""
    if not DIGEST_GRAMMAR.fullmatch(digest):
        return f"not a digest ({_NOT_A_DIGEST})"
    algorithm, hexpart = digest.split(":", 1)
    if algorithm not in DIGEST_LENGTHS:
        return f"algorithm {algorithm[:20]!r} is not one of {', '.join(DIGEST_LENGTHS)}"
    if not re.fullmatch("[a-f0-9]+", hexpart):
        return "a digest's hex digits are lower-case"
    if len(hexpart) != DIGEST_LENGTHS[algorithm]:
        return f"{algorithm} takes {DIGEST_LENGTHS[algorithm]} hex digits, not {len(hexpart)}"
    return None


def check_digest(digest: str, what: str) -> str:
    problem = digest_problem(digest)
    if problem:
        raise RlboxError(f"{what}: {digest[:90]!r}: {problem}")
    return digest


def check_tag(tag: str, what: str) -> str:
    if not TAG_RE.fullmatch(tag):
        raise RlboxError(f"{what}: {tag[:90]!r} is not a valid tag (ASCII letters, digits, _ . -, "
                         "not starting with . or -; at most 128)")
    return tag


# ---------------------------------------------------------------------------------------------
# References.


def is_registry_host(component: str) -> bool:
    """splitDockerDomain's rule: the first path component names a registry if it is ``localhost``
    or has a dot, a port or an upper-case letter (``swr.cn-south-1.myhuaweicloud.com``,
    ``127.0.0.1:5000``, ``[::1]:5000``, ``Registry/x``)."""
    return (component == "localhost" or "." in component or ":" in component or component.startswith("[")
            or component.lower() != component)


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
        raise RlboxError(f"{what} {host[:90]!r}: expected a registry HOST[:PORT] such as 127.0.0.1:5000 "
                         "or swr.cn-south-1.myhuaweicloud.com (no scheme, no path)")
    _, port = split_host(host)
    if port is not None and not 1 <= port <= 65535:
        raise RlboxError(f"{what} {host[:90]!r}: port {port} is not a port (1-65535)")
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
        raw = text if isinstance(text, str) else ""
        shown = raw[:120] + ("..." if len(raw) > 120 else "")
        if not raw or not raw.isprintable() or any(c.isspace() for c in raw) or raw.startswith("-"):
            raise RlboxError(f"{shown!r} is not an image reference ([HOST[:PORT]/]PATH[:TAG][@sha256:...])")
        rest, digest = raw, None
        if "@" in raw:
            rest, digest = raw.split("@", 1)
            problem = digest_problem(digest)
            if problem:
                raise RlboxError(f"{shown}: {digest[:90]!r}: {problem}")
        registry = None
        first, sep, remainder = rest.partition("/")
        if sep and is_registry_host(first):
            registry, rest = check_host(first, f"{shown}: registry"), remainder
        tag = None
        last_slash = rest.rfind("/")
        colon = rest.rfind(":")
        if colon > last_slash:
            rest, tag = rest[:colon], rest[colon + 1:]
            check_tag(tag, shown)
        if not PATH_RE.fullmatch(rest):
            raise RlboxError(f"{shown}: {rest[:90]!r} is not a repository path (lower-case letters, digits, "
                             "separators . _ - between them, components joined by /)")
        name = f"{registry}/{rest}" if registry else rest
        if len(name) > NAME_MAX:
            raise RlboxError(f"{shown}: the name is {len(name)} characters; a registry takes at most {NAME_MAX}")
        return cls(registry, rest, tag, digest)

    @classmethod
    def parse_name(cls, text: str) -> "Reference":
        """A repository name, ``[HOST[:PORT]/]PATH``, without tag or digest."""
        ref = cls.parse(text)
        if ref.tag or ref.digest:
            raise RlboxError(f"{text[:120]}: give a repository name without a tag or digest")
        return ref

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


# ---------------------------------------------------------------------------------------------
# The grammar as checks for options and field types for the schemas that read references back
# (manifests, locks, state.json, records): ValueError from a validator is their one line.

def as_validator(check):
    """``check`` (raising RlboxError) as a pydantic validator (raising ValueError, the field's one line)."""

    def validator(value: str) -> str:
        try:
            return check(value)
        except RlboxError as err:
            raise ValueError(str(err)) from None
    return validator


def _reference(text: str) -> str:
    Reference.parse(text)
    return text


def _name(text: str) -> str:
    Reference.parse_name(text)
    return text


def _tag(text: str) -> str:
    return check_tag(text, "tag")


def _digest(text: str) -> str:
    return check_digest(text, "digest")


def _host(text: str) -> str:
    return check_host(text, "registry")


def __getattr__(attr: str):
    """ImageRef, ImageName, ImageTag, ImageDigest, RegistryHost: str types for pydantic schemas, made
    on first use (PEP 562) so that checking an option does not import pydantic."""
    checks = {"ImageRef": _reference, "ImageName": _name, "ImageTag": _tag, "ImageDigest": _digest,
              "RegistryHost": _host}
    if attr not in checks:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    from pydantic import AfterValidator

    made = Annotated[str, AfterValidator(as_validator(checks[attr]))]
    globals()[attr] = made
    return made
