"""Registry logic without an engine: references, challenges, credentials, host -> variant, label
checks, and the Bearer token flow against a small token-auth registry served here."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from rlbox.image import transfer
from rlbox.core.errors import RlboxError
from rlbox.registry.auth import Credentials, credentials_for, parse_www_authenticate, scrub
from rlbox.registry.client import Registry
from rlbox.registry.reference import Reference
from rlbox.image.transfer import HostFacts

SHA = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ab" * 32


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,registry,repository,tag,digest", [
    ("swr.cn-south-1.myhuaweicloud.com/ascendhub/verl_pt27_25rc3:a3-arm",
     "swr.cn-south-1.myhuaweicloud.com", "ascendhub/verl_pt27_25rc3", "a3-arm", None),
    ("127.0.0.1:5000/ascendhub/verl@" + DIGEST, "127.0.0.1:5000", "ascendhub/verl", None, DIGEST),
    ("localhost:5000/a/b:t@" + DIGEST, "localhost:5000", "a/b", "t", DIGEST),
    ("localhost/rlbox/sim:amd64", "localhost", "rlbox/sim", "amd64", None),
    ("[::1]:5000/x:y", "[::1]:5000", "x", "y", None),
    ("rlbox-test-reg/src:one", None, "rlbox-test-reg/src", "one", None),  # no dot, no port: a path
    ("ubuntu", None, "ubuntu", None, None),
])
def test_reference_parsing(text, registry, repository, tag, digest):
    ref = Reference.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert str(ref) == text
    assert ref.target == (digest or tag or "latest")


@pytest.mark.parametrize("text,needle", [
    ("127.0.0.1:5000/Upper/x", "not a repository path"),
    ("127.0.0.1:5000/x:-bad", "not a valid tag"),
    ("127.0.0.1:5000/x@sha256:abc", "not a digest"),
    ("has space", "not an image reference"),
])
def test_bad_references_are_one_line(text, needle):
    with pytest.raises(RlboxError, match=needle) as info:
        Reference.parse(text)
    assert "\n" not in str(info.value)


def test_loopback_is_http_and_others_https():
    assert Registry("127.0.0.1:5000", credentials=None).base == "http://127.0.0.1:5000"
    assert Registry("localhost", credentials=None).base == "http://localhost"
    assert Registry("swr.cn-south-1.myhuaweicloud.com", credentials=None).base == "https://swr.cn-south-1.myhuaweicloud.com"
    assert Registry("10.0.0.5:5000", insecure=True, credentials=None).base == "http://10.0.0.5:5000"


def test_registry_flag_replaces_the_host_and_keeps_the_path(m):
    v = m.get("verl_pt27_25rc3:a3-arm")
    assert str(transfer.remote_for(v.image, "127.0.0.1:5000")) == "127.0.0.1:5000/ascendhub/verl_pt27_25rc3:a3-arm"
    assert str(transfer.remote_for(v.image, None)) == v.image
    assert str(transfer.repository_for(m, "verl_pt27_25rc3", "127.0.0.1:5000")) == "127.0.0.1:5000/ascendhub/verl_pt27_25rc3"
    assert str(transfer.repository_for(m, "verl_pt27_25rc3", None)) == "swr.cn-south-1.myhuaweicloud.com/ascendhub/verl_pt27_25rc3"
    with pytest.raises(RlboxError, match="HOST\\[:PORT\\]"):
        transfer.remote_for(v.image, "127.0.0.1:5000/other")
    with pytest.raises(RlboxError, match="no registry host"):
        transfer.remote_for("rlbox-test-reg/src:one", None)
    with pytest.raises(RlboxError, match="not a tag"):
        transfer.repository_for(m, "127.0.0.1:5000/a/b:t", None)


def test_pull_target_forms(m):
    facts = HostFacts("linux/amd64", "910B3")
    t = transfer.pull_target(m, "verl_pt27_25rc3:ax-x86@" + DIGEST, hardware=None, release=None,
                             registry_host="127.0.0.1:5000", facts=facts)
    assert str(t.remote) == f"127.0.0.1:5000/ascendhub/verl_pt27_25rc3@{DIGEST}" and t.variant.name == "ax-x86"
    t = transfer.pull_target(m, "127.0.0.1:5000/x/y", hardware=None, release=None, registry_host=None, facts=facts)
    assert str(t.remote) == "127.0.0.1:5000/x/y:latest" and t.variant is None
    t = transfer.pull_target(m, None, hardware="auto", release="verl_pt27_cann82rc1", registry_host=None, facts=facts)
    assert t.variant.ref == "verl_pt27_cann82rc1:ax-x86"
    with pytest.raises(RlboxError, match="several releases fit this host"):
        transfer.pull_target(m, None, hardware="auto", release=None, registry_host=None, facts=facts)
    with pytest.raises(RlboxError, match="not both"):
        transfer.pull_target(m, "verl_pt27_25rc3:ax-x86", hardware="auto", release=None, registry_host=None, facts=facts)


# ---------------------------------------------------------------------------------------------
def test_www_authenticate_parsing():
    c = parse_www_authenticate('Bearer realm="https://swr-api.cn-south-1.myhuaweicloud.com/v2/token",'
                               'service="swr",scope="repository:ascendhub/verl:pull,push"')
    assert c.scheme == "bearer"
    assert c.params == {"realm": "https://swr-api.cn-south-1.myhuaweicloud.com/v2/token", "service": "swr",
                        "scope": "repository:ascendhub/verl:pull,push"}
    assert parse_www_authenticate('Basic realm="basic-realm"').params == {"realm": "basic-realm"}
    assert parse_www_authenticate("Bearer realm=https://a/token, service=a").params == {"realm": "https://a/token", "service": "a"}
    assert parse_www_authenticate("").scheme == ""


# ---------------------------------------------------------------------------------------------
def _config(tmp_path, data) -> dict[str, str]:
    (tmp_path / "config.json").write_text(json.dumps(data))
    return {"DOCKER_CONFIG": str(tmp_path), "PATH": str(tmp_path)}


def test_credentials_from_the_environment_first(tmp_path):
    env = _config(tmp_path, {"auths": {"h:5000": {"auth": base64.b64encode(b"bob:frompass").decode()}}})
    creds = credentials_for("h:5000", {**env, "RLBOX_REGISTRY_USER": "cn-south-1@AK", "RLBOX_REGISTRY_PASSWORD": "key"})
    assert (creds.username, creds.password, creds.source) == ("cn-south-1@AK", "key", "environment")
    assert "key" not in repr(creds)
    with pytest.raises(RlboxError, match="RLBOX_REGISTRY_PASSWORD is not set"):
        credentials_for("h:5000", {**env, "RLBOX_REGISTRY_USER": "u"})


def test_credentials_from_the_docker_config(tmp_path):
    env = _config(tmp_path, {"auths": {"https://h:5000": {"auth": base64.b64encode(b"bob:p:ss").decode()}}})
    creds = credentials_for("h:5000", env)
    assert (creds.username, creds.password) == ("bob", "p:ss")
    assert credentials_for("other:5000", env) is None
    assert credentials_for("h:5000", {"DOCKER_CONFIG": str(tmp_path / "none")}) is None


def test_credentials_from_a_credential_helper(tmp_path):
    helper = tmp_path / "docker-credential-rlboxtest"
    helper.write_text('#!/bin/sh\nread host\n[ "$host" = "h:5000" ] || { echo "credentials not found" >&2; exit 1; }\n'
                      'echo \'{"ServerURL":"h:5000","Username":"carol","Secret":"helpersecret"}\'\n')
    helper.chmod(0o755)
    env = _config(tmp_path, {"credHelpers": {"h:5000": "rlboxtest"},
                             "auths": {"g:5000": {"auth": base64.b64encode(b"dave:x1").decode()}},
                             "credsStore": "rlboxtest"})
    creds = credentials_for("h:5000", env)
    assert (creds.username, creds.password, creds.source) == ("carol", "helpersecret", "docker-credential-rlboxtest")
    # the store has nothing for g:5000: the plain auths entry is used
    assert credentials_for("g:5000", env).username == "dave"
    # a helper that is not installed: fall back to auths
    env = _config(tmp_path, {"credsStore": "absent", "auths": {"g:5000": {"auth": base64.b64encode(b"dave:x1").decode()}}})
    assert credentials_for("g:5000", env).username == "dave"


def test_scrub_blanks_passwords():
    creds = Credentials("u", "hunter22", "environment")
    b64 = base64.b64encode(b"u:hunter22").decode()
    assert scrub(f"failed with hunter22 and {b64}", creds) == "failed with *** and ***"


# ---------------------------------------------------------------------------------------------
def test_immutable_tag_needs_a_commit():
    assert transfer.immutable_tag("a3-arm", SHA) == "a3-arm-0123456789ab"
    with pytest.raises(RlboxError, match="uncommitted changes.*--immutable-tag"):
        transfer.immutable_tag("a3-arm", SHA + "-dirty")
    with pytest.raises(RlboxError, match="'unknown', not a commit"):
        transfer.immutable_tag("a3-arm", "unknown")
    with pytest.raises(RlboxError, match="missing"):
        transfer.immutable_tag("a3-arm", None)


# ---------------------------------------------------------------------------------------------
def test_chip_to_hardware(m):
    assert transfer.hardware_for_chip(m.hardware, "910B3") == ["a2", "ax"]
    assert transfer.hardware_for_chip(m.hardware, "Ascend910") == ["a3"]
    assert transfer.hardware_for_chip(m.hardware, "310P3") == []


@pytest.mark.parametrize("platform,chip,variant", [
    ("linux/amd64", "910B3", "ax-x86"),
    ("linux/arm64", "910B3", "a2-arm"),
    ("linux/arm64", "910B4", "a2-arm"),
    ("linux/arm64", "Ascend910", "a3-arm"),
])
def test_host_picks_its_variant(m, platform, chip, variant):
    assert transfer.choose_variant(m, "verl_pt27_25rc3", HostFacts(platform, chip)).name == variant


def test_host_without_a_variant_is_one_line(m):
    with pytest.raises(RlboxError) as info:
        transfer.choose_variant(m, "verl_pt27_25rc3", HostFacts("linux/amd64", "Ascend910"))
    assert "no variant for this host (linux/amd64, npu-smi chip Ascend910: hardware a3)" in str(info.value)
    with pytest.raises(RlboxError, match="cannot tell this host's NPU: npu-smi not found"):
        transfer.pull_target(m, None, hardware="auto", release="verl_pt27_25rc3", registry_host=None,
                             facts=HostFacts("linux/amd64", None, "npu-smi not found"))


def test_variant_fit(m):
    x86 = HostFacts("linux/amd64", "910B3")
    assert transfer.variant_misfit(m, m.get("verl_pt27_25rc3:ax-x86"), x86) is None
    msg = transfer.variant_misfit(m, m.get("verl_pt27_25rc3:a2-arm"), x86)
    assert "verl_pt27_25rc3:a2-arm is linux/arm64" in msg and "this host is linux/amd64" in msg
    assert "pull verl_pt27_25rc3:ax-x86 instead" in msg
    msg = transfer.variant_misfit(m, m.get("verl_pt27_25rc3:ax-x86"), HostFacts("linux/amd64", "Ascend910"))
    assert "is for chip 910B" in msg and "npu-smi reports Ascend910" in msg
    # no npu-smi: the platform is still checked, the chip is not
    assert transfer.variant_misfit(m, m.get("verl_pt27_25rc3:ax-x86"), HostFacts("linux/amd64", None, "x")) is None
    # a simulation image runs on any chip; the other platform's is pointed to by its hardware
    assert transfer.variant_misfit(m, m.get("rlbox_sim:amd64"), HostFacts("linux/amd64", "Ascend910")) is None
    msg = transfer.variant_misfit(m, m.get("rlbox_sim:arm64"), HostFacts("linux/amd64", None, "no npu-smi"))
    assert msg == ("rlbox_sim:arm64 is linux/arm64 (hardware sim), this host is linux/amd64: pull rlbox_sim:amd64 "
                   "instead; --force pulls it anyway")


def _attrs(arch, **labels):
    return {"Architecture": arch, "Os": "linux", "Config": {"Labels": {f"io.rlbox.{k}": v for k, v in labels.items()}}}


def test_pulled_image_label_checks(m):
    v = m.get("verl_pt27_25rc3:ax-x86")
    x86 = HostFacts("linux/amd64", "910B3")
    good = _attrs("amd64", release="verl_pt27_25rc3", variant="ax-x86", platform="linux/amd64", chip="910b")
    assert transfer.image_problems(good, v, x86, m.hardware) == ([], [])
    wrong, _ = transfer.image_problems(_attrs("amd64", platform="linux/arm64"), None, x86, m.hardware)
    assert wrong == ["labelled io.rlbox.platform=linux/arm64 but its architecture is amd64"]
    wrong, _ = transfer.image_problems(_attrs("amd64", variant="a3-arm", chip="a3", platform="linux/amd64"), v, x86, m.hardware)
    assert wrong == ["labelled io.rlbox.variant=a3-arm, but verl_pt27_25rc3:ax-x86 is ax-x86",
                     "labelled io.rlbox.chip=a3, but verl_pt27_25rc3:ax-x86 is 910b"]
    _, misfit = transfer.image_problems(_attrs("arm64", platform="linux/arm64", chip="a3"), None, x86, m.hardware)
    assert misfit == ["it is linux/arm64, this host is linux/amd64",
                      "it is for chip a3 (Ascend910), this host's npu-smi reports 910B3"]
    # no labels at all (not built by rlbox): only the architecture counts
    assert transfer.image_problems({"Architecture": "amd64", "Os": "linux", "Config": {}}, None, x86, m.hardware) == ([], [])


# ---------------------------------------------------------------------------------------------
# Bearer tokens, as SWR and most registries hand them out: a small registry served here.


def _blob(doc) -> tuple[bytes, str]:
    body = json.dumps(doc).encode()
    return body, "sha256:" + hashlib.sha256(body).hexdigest()


class _TokenRegistry(BaseHTTPRequestHandler):
    user, password = "cn-south-1@AK", "login-key-xyz"
    objects: dict[str, tuple[bytes, str]] = {}
    tokens_issued: list[str] = []

    def log_message(self, *args):
        pass

    def _send(self, code, body=b"", ctype="application/json", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urlsplit(self.path)
        port = self.server.server_address[1]
        if url.path == "/token":
            q = parse_qs(url.query)
            want = "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            if self.headers.get("Authorization") != want:
                return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            token = "tok-" + q.get("scope", [""])[0]
            self.tokens_issued.append(token)
            return self._send(200, json.dumps({"token": token}).encode())
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer tok-repository:team/app:pull"):
            challenge = f'Bearer realm="http://127.0.0.1:{port}/token",service="fake",scope="repository:team/app:pull"'
            return self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', headers=[("WWW-Authenticate", challenge)])
        if url.path == "/v2/team/app/tags/list":
            q = parse_qs(url.query)
            if q.get("last") == ["b"]:
                return self._send(200, json.dumps({"name": "team/app", "tags": ["c"]}).encode())
            return self._send(200, json.dumps({"name": "team/app", "tags": ["a", "b"]}).encode(),
                              headers=[("Link", '</v2/team/app/tags/list?n=2&last=b>; rel="next"')])
        for prefix in ("/v2/team/app/manifests/", "/v2/team/app/blobs/"):
            if url.path.startswith(prefix):
                key = url.path[len(prefix):]
                if key in self.objects:
                    body, ctype = self.objects[key]
                    return self._send(200, body, ctype)
                return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
        self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}')


@pytest.fixture(scope="module")
def token_registry():
    objs = {}
    manifests = []
    for arch in ("amd64", "arm64"):
        cfg, cfg_digest = _blob({"architecture": arch, "os": "linux",
                                 "config": {"Labels": {"io.rlbox.platform": f"linux/{arch}", "io.rlbox.variant": arch}}})
        objs[cfg_digest] = (cfg, "application/octet-stream")
        man, man_digest = _blob({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                 "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest,
                                            "size": len(cfg)}, "layers": []})
        objs[man_digest] = (man, "application/vnd.oci.image.manifest.v1+json")
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man_digest,
                          "size": len(man), "platform": {"os": "linux", "architecture": arch}})
    # a BuildKit attestation entry, which is no image to pick
    manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifests[0]["digest"],
                      "size": 1, "platform": {"os": "unknown", "architecture": "unknown"}})
    index, index_digest = _blob({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                                 "manifests": manifests})
    objs["a"] = objs[index_digest] = (index, "application/vnd.oci.image.index.v1+json")
    _TokenRegistry.objects = objs
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TokenRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", index_digest
    server.shutdown()
    server.server_close()


def test_bearer_token_flow(token_registry):
    host, index_digest = token_registry
    reg = Registry(host, credentials=Credentials(_TokenRegistry.user, _TokenRegistry.password, "environment"))
    assert reg.tags("team/app") == ["a", "b", "c"]  # two pages, through Link
    assert reg.digest(f"{host}/team/app:a") == index_digest
    m = reg.manifest(f"{host}/team/app:a", "linux/arm64")
    assert m.is_index and m.platform == "linux/arm64"
    assert [p for p, _ in m.platforms] == ["linux/amd64", "linux/arm64"]  # the attestation is skipped
    assert reg.config(f"{host}/team/app:a", "linux/arm64").labels["io.rlbox.variant"] == "arm64"
    digest, configs = reg.configs(f"{host}/team/app@{index_digest}")
    assert digest == index_digest and [c.platform for c in configs] == ["linux/amd64", "linux/arm64"]
    with pytest.raises(RlboxError, match="has no image for linux/s390x"):
        reg.manifest(f"{host}/team/app:a", "linux/s390x")
    with pytest.raises(RlboxError, match="no image team/app:zzz"):
        reg.manifest(f"{host}/team/app:zzz")
    assert len(set(_TokenRegistry.tokens_issued)) == 1  # one token per scope, reused


def test_bearer_wrong_password_and_anonymous(token_registry):
    host, _ = token_registry
    reg = Registry(host, credentials=Credentials(_TokenRegistry.user, "wrong-key-123", "environment"))
    with pytest.raises(RlboxError) as info:
        reg.tags("team/app")
    assert str(info.value) == (f"registry {host}: authentication failed for user cn-south-1@AK: check "
                               f"RLBOX_REGISTRY_USER/RLBOX_REGISTRY_PASSWORD or `docker login {host}`")
    with pytest.raises(RlboxError, match="authentication required"):
        Registry(host, credentials=None).tags("team/app")


def test_unreachable_registry_names_host_and_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RlboxError) as info:
        Registry(f"127.0.0.1:{port}", credentials=None).tags("x/y")
    assert f"cannot connect to 127.0.0.1 port {port} (connection refused)" in str(info.value)


# ---------------------------------------------------------------------------------------------
# A registry's answers are input (issue 37): bounded in size, depth and time, typed, one line.

class _HostileRegistry(BaseHTTPRequestHandler):
    stop = threading.Event()
    bodies = {  # repository -> the body of its tag list
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "list": b"[]",
        "tags-str": json.dumps({"name": "x", "tags": "a"}).encode(),
        "tags-int": json.dumps({"name": "x", "tags": [1]}).encode(),
        "number": b'{"tags": [' + b"9" * 5000 + b"]}",
    }

    def do_GET(self):  # noqa: N802 - http.server's name
        repo = self.path.removeprefix("/v2/").removesuffix("/tags/list")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if repo == "flood-length":
            self.send_header("Content-Length", str(10**12))
        self.end_headers()
        try:
            if repo == "drip":
                for _ in range(40):  # a byte every 0.3 s, for at most 12 s
                    if self.stop.wait(0.3):
                        return
                    self.wfile.write(b" ")
                    self.wfile.flush()
            elif repo == "flood":
                for _ in range(20):  # 20 MiB, past the 16 a registry answer may have
                    self.wfile.write(b" " * (1 << 20))
            else:
                self.wfile.write(self.bodies.get(repo, b"{}"))
        except OSError:
            pass

    def log_message(self, *args):
        pass


HOSTILE_REGISTRY = [  # (repository, what the one line says)
    ("deep", "nested deeper than 64 levels"),
    ("list", "is a JSON list, not an object"),
    ("tags-str", "'tags' is not a list of names"),
    ("tags-int", "'tags' is not a list of names"),
    ("number", "not valid JSON"),
    ("drip", "no whole answer within 1 s"),
    ("flood", "over the 16777216 bytes rlbox reads"),
    ("flood-length", "the answer is 1000000000000 bytes"),
]


@pytest.fixture(scope="module")
def hostile_registry():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HostileRegistry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _HostileRegistry.stop.clear()
    yield f"127.0.0.1:{server.server_address[1]}"
    _HostileRegistry.stop.set()
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("repository,expect", HOSTILE_REGISTRY, ids=[r for r, _ in HOSTILE_REGISTRY])
def test_a_hostile_registry_answer_is_one_line(repository, expect, hostile_registry):
    import time

    start = time.monotonic()
    with pytest.raises(RlboxError) as info:
        Registry(hostile_registry, credentials=None, timeout=1).tags(repository)
    text = str(info.value)
    assert text.startswith(f"registry {hostile_registry}: ") and expect in text and "\n" not in text, text
    assert time.monotonic() - start < 8
