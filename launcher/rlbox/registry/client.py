"""A thin Docker Registry HTTP API v2 client (over requests): tags, manifests, configs, digests.

Image references follow Docker's grammar: ``[HOST[:PORT]/]PATH[:TAG][@DIGEST]``; the first
component is a registry host when it is ``localhost`` or holds a dot or a port. The client talks
https, or plain http to loopback hosts (as Docker does for 127.0.0.0/8) or when asked
(``insecure``). On a 401 it answers the registry's ``WWW-Authenticate`` challenge: ``Basic``
(Debian's docker-registry with htpasswd) or ``Bearer realm=...,service=...,scope=...`` (a token
from the realm: SWR, Harbor, Docker Hub).

Credentials come from ``RLBOX_REGISTRY_USER`` / ``RLBOX_REGISTRY_PASSWORD`` or, failing that,
from the Docker config (``auths``, ``credsStore``, ``credHelpers``). A password never appears in
a message, a log line or a repr.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

from rlbox.core import answers
from rlbox.core.config import load_json
from rlbox.core.errors import RlboxError

from rlbox.registry.auth import ENV_PASSWORD, ENV_USER, Challenge, Credentials, credentials_for, parse_www_authenticate, scrub
from rlbox.registry.reference import DIGEST_RE, DOCKER_HUB, Reference, check_host, host_platform, is_loopback, split_host

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
REGISTRY_ANSWER_BYTES = 16 * 1024 * 1024  # manifests, config blobs, tag lists, tokens: never layers


# ---------------------------------------------------------------------------------------------
# The client.


@dataclass(frozen=True)
class Manifest:
    """What a reference points to. For an index, ``image`` is the entry for ``platform``."""

    reference: Reference
    digest: str  # digest of what the reference names (the index itself for a multi-platform image)
    media_type: str
    body: dict[str, Any]
    image_digest: str  # the single-platform manifest
    image: dict[str, Any]
    platform: str | None  # from the index entry; None for a single-platform manifest
    platforms: tuple[tuple[str, str], ...] = ()  # (platform, digest) of an index's images

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES

    @property
    def config_digest(self) -> str:
        return self.image["config"]["digest"]


@dataclass(frozen=True)
class ImageConfig:
    digest: str
    os: str
    architecture: str
    variant: str | None
    labels: dict[str, str]
    created: str | None = None

    @property
    def platform(self) -> str:
        return f"{self.os}/{self.architecture}"


def _platform_of(entry: dict[str, Any]) -> str:
    p = entry.get("platform") or {}
    text = f"{p.get('os', 'unknown')}/{p.get('architecture', 'unknown')}"
    return text + (f"/{p['variant']}" if p.get("variant") else "")


def _same_platform(have: str, want: str) -> bool:
    """linux/arm64/v8 is linux/arm64; a requested variant must match."""
    h, w = have.split("/"), want.split("/")
    return h[:2] == w[:2] and (len(w) < 3 or (h + [""])[2] == w[2])


class Registry:
    """One registry host. Reuses one HTTP session and the tokens it was given."""

    def __init__(self, host: str, *, insecure: bool = False, credentials: Credentials | None | str = "auto",
                 timeout: float = 30):
        """``credentials``: "auto" looks them up (credentials_for), None goes anonymous."""
        self.host = check_host(host, "registry")
        self.scheme = "http" if insecure or is_loopback(host) else "https"
        name, port = split_host(host)
        self.hostname, self.port = name, port or (80 if self.scheme == "http" else 443)
        self.credentials = credentials_for(host) if credentials == "auto" else credentials
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "rlbox"
        self._basic = False
        self._tokens: dict[str, str] = {}

    # -- plumbing -------------------------------------------------------------------------
    @property
    def base(self) -> str:
        host = self.host if self.host != DOCKER_HUB else "registry-1.docker.io"
        return f"{self.scheme}://{host}"

    @property
    def _user(self) -> str:
        return self.credentials.username if self.credentials else "(anonymous)"

    def _fail(self, what: str) -> RlboxError:
        return RlboxError(scrub(f"registry {self.host}: {what}", self.credentials))

    def _doc(self, body: bytes, what: str) -> dict[str, Any]:
        """A registry answer's JSON object, within rlbox.core.config.load_json's bounds (depth, size); else one line."""
        try:
            data = load_json(body.decode("utf-8"), f"registry {self.host}: {what}", limit=REGISTRY_ANSWER_BYTES)
        except UnicodeDecodeError:
            raise self._fail(f"{what} is not UTF-8 JSON") from None
        if not isinstance(data, dict):
            raise self._fail(f"{what} is a JSON {type(data).__name__}, not an object")
        return data

    def _auth_failed(self) -> RlboxError:
        return self._fail(f"authentication failed for user {self._user}: check {ENV_USER}/{ENV_PASSWORD} "
                          f"or `docker login {self.host}`")

    def _auth_required(self) -> RlboxError:
        return self._fail(f"authentication required: set {ENV_USER}/{ENV_PASSWORD} or `docker login {self.host}`")

    def _send(self, method: str, url: str, headers: dict[str, str], auth=None, **kw) -> requests.Response:
        """One request, its answer read whole within rlbox.core.answers' bounds (REGISTRY_ANSWER_BYTES,
        ``self.timeout`` seconds for all of it: a registry that drips is cut off there)."""
        try:
            return answers.fetch(url, session=self.session, method=method, deadline=self.timeout,
                                 limit=REGISTRY_ANSWER_BYTES, headers=headers, auth=auth, **kw)
        except answers.Unanswered as err:
            raise self._fail(str(err)) from None
        except requests.exceptions.SSLError:
            raise self._fail(f"TLS handshake with {self.hostname} port {self.port} failed: if it serves plain "
                             "http, pass --insecure") from None
        except requests.exceptions.ConnectTimeout:
            raise self._fail(f"no answer from {self.hostname} port {self.port} within {self.timeout:g} s: "
                             "check the address, the network or a proxy") from None
        except requests.exceptions.ConnectionError as err:
            reason = _connection_reason(err)
            parts = urlsplit(url)
            where = f"{parts.hostname} port {parts.port or (443 if parts.scheme == 'https' else 80)}"
            raise self._fail(f"cannot connect to {where} ({reason}): is the registry running and the "
                             "address right? (--registry HOST[:PORT])") from None
        except requests.exceptions.Timeout:
            raise self._fail(f"{self.hostname} port {self.port} stopped answering (timeout {self.timeout:g} s)") from None
        except requests.exceptions.RequestException as err:
            raise self._fail(f"request failed ({type(err).__name__})") from None

    def _token(self, challenge: Challenge, scope: str | None) -> str:
        """A token from the challenge's realm for ``scope`` (ours: Docker asks for what it will do,
        e.g. pull,push, not only what the challenge names), with basic credentials if we have any."""
        realm = challenge.params.get("realm")
        if not realm:
            raise self._fail("Bearer challenge without a realm: cannot get a token")
        scope = scope or challenge.params.get("scope")
        key = f"{challenge.params.get('service', '')} {scope}"
        if key in self._tokens:
            return self._tokens[key]
        params = {k: v for k, v in (("service", challenge.params.get("service")), ("scope", scope)) if v}
        auth = (self.credentials.username, self.credentials.password) if self.credentials else None
        resp = self._send("GET", realm, {}, auth=auth, params=params)
        if resp.status_code in (401, 403):
            raise self._auth_failed() if self.credentials else self._auth_required()
        if resp.status_code != 200:
            raise self._fail(f"token service {realm.split('?')[0]} answered HTTP {resp.status_code}")
        data = self._doc(resp.content, f"token service {realm.split('?')[0]}")
        token = data.get("token") or data.get("access_token")
        if not token or not isinstance(token, str):
            raise self._fail(f"token service {realm.split('?')[0]} gave no token")
        self._tokens[key] = token
        return token

    def request(self, method: str, path: str, *, scope: str | None, headers: dict[str, str] | None = None,
                what: str = "") -> requests.Response:
        """A v2 API request, answering one authentication challenge if the registry asks."""
        url = path if path.startswith(("http://", "https://")) else self.base + path
        headers = dict(headers or {})
        auth = (self.credentials.username, self.credentials.password) if self._basic and self.credentials else None
        resp = self._send(method, url, headers, auth=auth)
        if resp.status_code == 401:
            challenge = parse_www_authenticate(resp.headers.get("WWW-Authenticate", ""))
            if challenge.scheme == "basic":
                if not self.credentials:
                    raise self._auth_required()
                if self._basic:
                    raise self._auth_failed()
                self._basic = True
                resp = self._send(method, url, headers, auth=(self.credentials.username, self.credentials.password))
                if resp.status_code == 401:
                    raise self._auth_failed()
            elif challenge.scheme == "bearer":
                headers["Authorization"] = f"Bearer {self._token(challenge, scope)}"
                resp = self._send(method, url, headers)
                if resp.status_code == 401:
                    if not self.credentials:
                        raise self._auth_required()
                    action = scope.rsplit(":", 1)[-1] if scope else "access"
                    raise self._fail(f"user {self._user} may not {action} {what or path} "
                                     "(the token lacks that access): check the user's permissions")
            else:
                raise self._fail(f"unsupported authentication scheme {challenge.scheme or '(none)'!r}")
        if resp.status_code == 403:
            raise self._fail(f"access denied to {what or path} for user {self._user}")
        return resp

    def _errors(self, resp: requests.Response) -> set[str]:
        try:
            errors = self._doc(resp.content, "error body").get("errors")
        except RlboxError:
            return set()
        return {e["code"][:60] for e in errors if isinstance(e, dict) and isinstance(e.get("code"), str)} \
            if isinstance(errors, list) else set()

    def _unexpected(self, resp: requests.Response, what: str) -> RlboxError:
        codes = ", ".join(sorted(self._errors(resp))) or resp.reason
        return self._fail(f"{what}: HTTP {resp.status_code} ({codes})")

    # -- API ------------------------------------------------------------------------------
    def ping(self) -> None:
        """GET /v2/: reachable, speaks the v2 API, and the credentials (if any are needed) work."""
        resp = self.request("GET", "/v2/", scope=None, what="/v2/")
        if resp.status_code != 200:
            raise self._unexpected(resp, "GET /v2/ (is this a Docker registry?)")

    def tags(self, repository: str, page_size: int | None = None) -> list[str]:
        """Every tag of a repository, following ``Link: <...>; rel="next"`` pages."""
        path = f"/v2/{repository}/tags/list" + (f"?n={page_size}" if page_size else "")
        out: list[str] = []
        seen = set()
        while path and path not in seen:
            seen.add(path)
            resp = self.request("GET", path, scope=f"repository:{repository}:pull", what=repository)
            if resp.status_code == 404:
                raise self._fail(f"no repository {repository}")
            if resp.status_code != 200:
                raise self._unexpected(resp, f"tags of {repository}")
            tags = self._doc(resp.content, f"tags of {repository}").get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise self._fail(f"tags of {repository}: 'tags' is not a list of names")
            out += tags
            nxt = resp.links.get("next", {}).get("url")
            path = urljoin(resp.url, nxt) if nxt else None
        return out

    def _get_manifest(self, ref: Reference, target: str) -> tuple[bytes, str, str]:
        repo = ref.api_repository
        resp = self.request("GET", f"/v2/{repo}/manifests/{target}", scope=f"repository:{repo}:pull",
                            headers={"Accept": ACCEPT}, what=ref.repository)
        if resp.status_code == 404:
            codes = self._errors(resp)
            if "NAME_UNKNOWN" in codes:
                raise self._fail(f"no repository {ref.repository}")
            sep = "@" if ":" in target else ":"
            raise self._fail(f"no image {ref.repository}{sep}{target} (manifest unknown): see `rlbox images tags "
                             f"{ref.name}`")
        if resp.status_code != 200:
            raise self._unexpected(resp, f"manifest of {ref.repository}:{target}")
        body = resp.content
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if DIGEST_RE.fullmatch(target) and target.startswith("sha256:") and target != digest:
            raise self._fail(f"manifest {ref.repository}@{target} has digest {digest}: the registry returned "
                             "something else than asked")
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        doc = self._doc(body, f"manifest of {ref.repository}:{target}")
        media = doc.get("mediaType") if isinstance(doc.get("mediaType"), str) else media
        return body, digest, media

    def _index_images(self, doc: dict[str, Any]) -> tuple[tuple[str, str], ...]:
        listed = doc.get("manifests")
        entries = ((_platform_of(e), e["digest"]) for e in (listed if isinstance(listed, list) else [])
                   if isinstance(e, dict) and isinstance(e.get("digest"), str) and isinstance(e.get("platform") or {}, dict))
        return tuple((p, d) for p, d in entries if not p.startswith("unknown/"))  # skip attestations

    def _image_manifest(self, ref: Reference, digest: str) -> dict[str, Any]:
        body, _, media = self._get_manifest(ref, digest)
        if media and media not in MANIFEST_TYPES:
            raise self._fail(f"{ref.name}@{digest}: unsupported manifest type {media}")
        return self._doc(body, f"manifest {ref.name}@{digest}")

    def manifest(self, ref: Reference | str, platform: str | None = None) -> Manifest:
        """The manifest ``ref`` names; for an index (OCI or Docker list), the entry for
        ``platform`` (default: this host's) is fetched as well."""
        ref = Reference.parse(ref) if isinstance(ref, str) else ref
        body, digest, media = self._get_manifest(ref, ref.target)
        doc = self._doc(body, f"manifest of {ref}")
        if media in INDEX_TYPES or "manifests" in doc:
            images = self._index_images(doc)
            want = platform or host_platform()
            chosen = next(((p, d) for p, d in images if _same_platform(p, want)), None)
            if chosen is None:
                have = ", ".join(p for p, _ in images) or "none"
                raise self._fail(f"{ref} has no image for {want} (it has: {have})")
            return Manifest(ref, digest, media, doc, chosen[1], self._image_manifest(ref, chosen[1]), chosen[0], images)
        if media and media not in MANIFEST_TYPES:
            raise self._fail(f"{ref}: unsupported manifest type {media} (schema 1 images are not supported)")
        return Manifest(ref, digest, media or DOCKER_MANIFEST, doc, digest, doc, None)

    def blob(self, ref: Reference, digest: str) -> bytes:
        repo = ref.api_repository
        resp = self.request("GET", f"/v2/{repo}/blobs/{digest}", scope=f"repository:{repo}:pull", what=ref.repository)
        if resp.status_code == 404:
            raise self._fail(f"{ref.repository}: blob {digest} is missing from the registry")
        if resp.status_code != 200:
            raise self._unexpected(resp, f"blob {digest} of {ref.repository}")
        if "sha256:" + hashlib.sha256(resp.content).hexdigest() != digest:
            raise self._fail(f"{ref.repository}: blob {digest} does not match its digest")
        return resp.content

    def config_of(self, ref: Reference, image: dict[str, Any]) -> ImageConfig:
        """The config blob of an image manifest already fetched (``Manifest.image``)."""
        digest = image["config"]["digest"]
        doc = self._doc(self.blob(ref, digest), f"config {digest}")
        cfg = doc.get("config") or {}
        return ImageConfig(digest, doc.get("os", ""), doc.get("architecture", ""), doc.get("variant"),
                           dict(cfg.get("Labels") or {}), doc.get("created"))

    def config(self, ref: Reference | str, platform: str | None = None) -> ImageConfig:
        """The image config (labels, OS, architecture) of ``ref``, for ``platform`` if it is an index."""
        ref = Reference.parse(ref) if isinstance(ref, str) else ref
        return self.config_of(ref, self.manifest(ref, platform).image)

    def configs(self, ref: Reference | str) -> tuple[str, list[ImageConfig]]:
        """The digest ``ref`` resolves to and the config of every platform image it holds."""
        ref = Reference.parse(ref) if isinstance(ref, str) else ref
        body, digest, media = self._get_manifest(ref, ref.target)
        doc = self._doc(body, f"manifest of {ref}")
        if media in INDEX_TYPES or "manifests" in doc:
            return digest, [self.config_of(ref, self._image_manifest(ref, d)) for _, d in self._index_images(doc)]
        return digest, [self.config_of(ref, doc)]

    def digest(self, ref: Reference | str) -> str:
        """The digest ``ref`` resolves to (what ``docker pull NAME@DIGEST`` and RepoDigests use)."""
        ref = Reference.parse(ref) if isinstance(ref, str) else ref
        return self._get_manifest(ref, ref.target)[1]

    def exists(self, ref: Reference, actions: str = "pull") -> bool:
        """Whether a tag (or digest) exists; a missing repository counts as missing. Before a push
        ask with ``actions="pull,push"``: token services grant that on a repository not made yet."""
        repo = ref.api_repository
        resp = self.request("HEAD", f"/v2/{repo}/manifests/{ref.target}", scope=f"repository:{repo}:{actions}",
                            headers={"Accept": ACCEPT}, what=ref.repository)
        if resp.status_code == 404:
            return False
        if resp.status_code != 200:
            raise self._unexpected(resp, f"manifest of {ref}")
        return True


def _connection_reason(err: Exception) -> str:
    text = str(err)
    for needle, reason in (("Connection refused", "connection refused"), ("Name or service not known", "unknown host"),
                           ("Temporary failure in name resolution", "name resolution failed"),
                           ("No route to host", "no route to host"), ("Network is unreachable", "network unreachable"),
                           ("timed out", "timed out"), ("RemoteDisconnected", "connection closed by the server"),
                           ("Connection reset", "connection reset")):
        if needle in text:
            return reason
    return "connection failed"
