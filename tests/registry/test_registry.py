"""rlbox push / pull / images tags against a REAL registry: Debian's docker-registry (2.8) on
loopback with htpasswd (bcrypt) auth, and the real engine pushing and pulling over http (Docker
treats 127.0.0.0/8 registries as insecure).

The images are tiny: FROM scratch plus one file and the labels rlbox's Dockerfiles carry
(io.rlbox.*, org.opencontainers.image.revision). Built with buildx for either platform without
emulation (no RUN step), they push in well under a second; what is tested is the registry
round trip and the checks on labels and architecture, not the image's contents.
"""

from __future__ import annotations

import base64
import json
import os
import platform as _platform
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import docker
import pytest
import requests
import yaml

from conftest import REPO, rlbox
from support.stub_models import free_port
from rlbox.cluster import sim
from rlbox.core.errors import RlboxError
from rlbox.registry.auth import Credentials
from rlbox.registry.client import Registry

pytestmark = pytest.mark.engine

USER, PASSWORD = "rlbox-ci", "S3cret-" + secrets.token_hex(6)
REVISION = "89abcdef0123456789abcdef0123456789abcdef"
MARK = "io.rlbox.test"  # on every image built here, valued per session: the clean-up finds them by it
SESSION = f"rlbox-test-reg-{os.getpid()}-{secrets.token_hex(3)}"
ARM = _platform.machine() in ("aarch64", "arm64")
HOST_PLATFORM = "linux/arm64" if ARM else "linux/amd64"
OTHER_PLATFORM = "linux/amd64" if ARM else "linux/arm64"
HOST_VARIANT = "a2-arm" if ARM else "ax-x86"  # the 910B variant for this host's platform
OTHER_VARIANT = "ax-x86" if ARM else "a2-arm"  # the 910B variant for the other platform
HOST_HW = "a2" if ARM else "ax"
OTHER_HW = "ax" if ARM else "a2"


@pytest.fixture(scope="module")
def registry(tmp_path_factory, engine):
    """docker-registry serve on 127.0.0.1:<free port>, htpasswd auth; killed afterwards."""
    exe = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(exe).exists() or not shutil.which("htpasswd"):
        pytest.fail("docker-registry and htpasswd are needed: apt-get install docker-registry apache2-utils "
                    "(.ci/provision does)")
    base = tmp_path_factory.mktemp("registry")
    htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True).stdout
    (base / "htpasswd").write_text(htpasswd)
    port = free_port()
    (base / "config.yml").write_text(yaml.safe_dump({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(base / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
        "auth": {"htpasswd": {"realm": "basic-realm", "path": str(base / "htpasswd")}},
    }))
    log = open(base / "registry.log", "w")
    proc = subprocess.Popen([exe, "serve", str(base / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if requests.get(f"http://{host}/v2/", timeout=1).status_code == 401:
                break
        except requests.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"docker-registry did not start: {(base / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.1)
    yield host
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
    _remove_images(host)


def _remove_images(host: str) -> None:
    """Every image this module built (by its session label, tagged or not) and every name it made."""
    client = docker.from_env()
    for img in client.images.list(all=True):
        ours = (img.labels or {}).get(MARK) == SESSION
        names = img.tags + [d for d in img.attrs.get("RepoDigests") or [] if not img.tags]
        for name in names:
            if ours or name.startswith((f"{host}/", "rlbox-test-reg/")):
                try:
                    client.images.remove(name)
                except docker.errors.APIError:
                    pass
        if ours and not names:
            try:
                client.images.remove(img.id)
            except docker.errors.APIError:
                pass


@pytest.fixture(scope="module")
def tree(tmp_path_factory, registry):
    """A small rlbox tree whose releases live in the test registry."""
    root = tmp_path_factory.mktemp("tree")
    (root / "images").mkdir()
    (root / "templates").mkdir()
    (root / "patches").mkdir()
    shutil.copy(REPO / "images" / "hardware.yaml", root / "images" / "hardware.yaml")
    for release, name in (("regtest", "verl"), ("regbad", "verl-bad")):
        (root / "images" / f"{release}.yaml").write_text(yaml.safe_dump({
            "release": release,
            "description": "rlbox registry test release",
            "image": {"registry": f"{registry}/rlbox-test-reg", "name": name},
            "base": {"image": "rlbox/debian", "tag": "bookworm"},
            "os": "debian12",
            "python": "3.11",
            "cann": {"version": "none"},
            "driver": {"min": "none"},
            "user": {"name": "rlbox", "uid": 1001},
            "components": {"six": {"pip": "six==1.17.0"}},
            "variants": {"a2-arm": {"hardware": "a2"}, "a3-arm": {"hardware": "a3"}, "ax-x86": {"hardware": "ax"}},
        }, sort_keys=False))
    return root


@pytest.fixture(scope="module")
def npu_smi(tmp_path_factory):
    """Stand-in npu-smi programs (the table the real one prints) for a 910B host and an A3 host."""
    base = tmp_path_factory.mktemp("npu-smi")
    return {hw: str(sim.write_stand_ins(base / hw, hw, 16, "25.3.rc1") / "npu-smi") for hw in ("a2", "a3")}


def env(tree=None, *, npu="a2", npu_smi=None, user=USER, password=PASSWORD, **extra) -> dict[str, str]:
    out = {"RLBOX_REGISTRY_USER": user, "RLBOX_REGISTRY_PASSWORD": password,
           "DOCKER_CONFIG": str(Path(os.environ.get("TMPDIR", "/tmp")) / "rlbox-test-reg-no-docker-config")}
    if tree:
        out["RLBOX_ROOT"] = str(tree)
    if npu_smi and npu:
        out["RLBOX_NPU_SMI"] = npu_smi[npu]
    return out | extra


def build(tmp_path: Path, name: str, platform: str, labels: dict[str, str]) -> str:
    """A tiny labelled image for ``platform`` (FROM scratch: no emulation needed), loaded as ``name``."""
    ctx = tmp_path / f"ctx-{secrets.token_hex(4)}"
    ctx.mkdir()
    (ctx / "payload").write_text(f"{name} {secrets.token_hex(8)}\n")
    lines = ["FROM scratch", "COPY payload /payload"] + [f'LABEL "{k}"="{v}"' for k, v in (labels | {MARK: SESSION}).items()]
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    subprocess.run(["docker", "buildx", "build", "--load", "--platform", platform, "--tag", name, str(ctx)],
                   check=True, capture_output=True)
    return docker.from_env().images.get(name).id


def labels_for(release: str, variant: str, hardware: str, chip: str, platform: str, revision: str = REVISION):
    return {"io.rlbox.release": release, "io.rlbox.variant": variant, "io.rlbox.hardware": hardware,
            "io.rlbox.chip": chip, "io.rlbox.platform": platform, "org.opencontainers.image.version": f"{release}:{variant}",
            "org.opencontainers.image.revision": revision}


def local(name: str) -> docker.models.images.Image | None:
    try:
        return docker.from_env().images.get(name)
    except docker.errors.ImageNotFound:
        return None


def one_line_error(proc, *needles: str, progress: bool = False) -> str:
    """The command failed with one `rlbox: error:` line, no traceback; with ``progress`` the
    pull's own `rlbox: ...` progress lines may come before it."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    if progress:
        assert all(x.startswith("rlbox: ") for x in lines), proc.stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("rlbox: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def pushed(registry, tree, tmp_path_factory, npu_smi):
    """regtest:HOST_VARIANT and regtest:OTHER_VARIANT pushed through `rlbox push`."""
    tmp = tmp_path_factory.mktemp("images")
    out = {}
    for variant, hw, platform in ((HOST_VARIANT, HOST_HW, HOST_PLATFORM), (OTHER_VARIANT, OTHER_HW, OTHER_PLATFORM)):
        name = f"{registry}/rlbox-test-reg/verl:{variant}"
        image_id = build(tmp, name, platform, labels_for("regtest", variant, hw, "910b", platform))
        proc = rlbox("push", f"regtest:{variant}", env=env(tree))
        assert proc.returncode == 0, proc.stderr
        out[variant] = (image_id, proc)
    return out


# ---------------------------------------------------------------------------------------------
def test_push_human_and_immutable_tags_and_list_them(registry, tree, pushed):
    repo = f"{registry}/rlbox-test-reg/verl"
    _, proc = pushed[HOST_VARIANT]
    digest_ref = proc.stdout.strip()
    assert digest_ref.startswith(f"{repo}@sha256:") and len(digest_ref.split("@")[1]) == 71
    assert f"pushed {repo}:{HOST_VARIANT}\n" in proc.stderr
    assert f"pushed {repo}:{HOST_VARIANT}-{REVISION[:12]}\n" in proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr

    listing = rlbox("images", "tags", "regtest", "--json", env=env(tree))
    assert listing.returncode == 0, listing.stderr
    rows = {r["tag"]: r for r in json.loads(listing.stdout)["tags"]}
    assert set(rows) == {HOST_VARIANT, f"{HOST_VARIANT}-{REVISION[:12]}", OTHER_VARIANT, f"{OTHER_VARIANT}-{REVISION[:12]}"}
    human, fixed = rows[HOST_VARIANT], rows[f"{HOST_VARIANT}-{REVISION[:12]}"]
    assert human["reference"] == fixed["reference"] == digest_ref
    assert (human["release"], human["variant"], human["hardware"], human["platform"]) == (
        "regtest", HOST_VARIANT, HOST_HW, HOST_PLATFORM)
    assert human["revision"] == REVISION and human["architecture"] == HOST_PLATFORM
    assert rows[OTHER_VARIANT]["platform"] == OTHER_PLATFORM

    table = rlbox("images", "tags", f"{repo}", env=env())
    assert table.returncode == 0, table.stderr
    assert f"{repo}: 4 tag(s)" in table.stdout
    line = next(x for x in table.stdout.splitlines() if x.split()[:1] == [HOST_VARIANT])
    assert line.split()[:5] == [HOST_VARIANT, digest_ref.split("@")[1], f"regtest:{HOST_VARIANT}", HOST_HW, HOST_PLATFORM]


def test_tags_follow_link_pagination(registry, pushed):
    reg = Registry(registry, credentials=Credentials(USER, PASSWORD, "test"))
    assert reg.tags("rlbox-test-reg/verl", page_size=1) == reg.tags("rlbox-test-reg/verl")
    assert len(reg.tags("rlbox-test-reg/verl", page_size=1)) == 4


def test_pull_by_tag_and_by_digest(registry, tree, pushed, npu_smi):
    name = f"{registry}/rlbox-test-reg/verl:{HOST_VARIANT}"
    image_id, push = pushed[HOST_VARIANT]
    digest_ref = push.stdout.strip()
    docker.from_env().images.remove(name)
    assert local(image_id) is None

    proc = rlbox("pull", f"regtest:{HOST_VARIANT}", env=env(tree, npu_smi=npu_smi))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == digest_ref
    assert f"pulled {name} (regtest:{HOST_VARIANT}, {HOST_HW}, {HOST_PLATFORM})" in proc.stderr
    assert local(name).id == image_id

    docker.from_env().images.remove(name)
    assert local(image_id) is None
    proc = rlbox("pull", digest_ref, env=env(tree, npu_smi=npu_smi))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == digest_ref
    img = local(digest_ref)
    assert img.id == image_id and digest_ref in img.attrs["RepoDigests"]
    # RELEASE:VARIANT@DIGEST works as well
    proc = rlbox("pull", f"regtest:{HOST_VARIANT}@{digest_ref.split('@')[1]}", env=env(tree, npu_smi=npu_smi))
    assert proc.returncode == 0 and proc.stdout.strip() == digest_ref, proc.stderr
    docker.from_env().images.get(image_id).tag(*name.rsplit(":", 1))  # back for the other tests


def test_push_an_image_to_another_registry_keeps_its_path(registry, tmp_path):
    build(tmp_path, "rlbox-test-reg/src:one", HOST_PLATFORM,
          labels_for("regtest", HOST_VARIANT, HOST_HW, "910b", HOST_PLATFORM, REVISION + "-dirty"))
    proc = rlbox("push", "rlbox-test-reg/src:one", "--registry", registry, env=env())
    one_line_error(proc, "built from uncommitted changes", "--immutable-tag")
    proc = rlbox("push", "rlbox-test-reg/src:one", "--registry", registry, "--immutable-tag", "one-build7",
                 "--tag", "extra", env=env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(f"{registry}/rlbox-test-reg/src@sha256:")
    reg = Registry(registry, credentials=Credentials(USER, PASSWORD, "test"))
    assert sorted(reg.tags("rlbox-test-reg/src")) == ["extra", "one", "one-build7"]
    assert local(f"{registry}/rlbox-test-reg/src:one") is None  # names made only to push are gone again
    # pushing the same image again is fine
    again = rlbox("push", "rlbox-test-reg/src:one", "--registry", registry, "--immutable-tag", "one-build7", env=env())
    assert again.returncode == 0 and again.stdout == proc.stdout, again.stderr
    # an immutable tag is never moved to another image
    build(tmp_path, "rlbox-test-reg/src:one", HOST_PLATFORM, labels_for("regtest", HOST_VARIANT, HOST_HW, "910b", HOST_PLATFORM))
    proc = rlbox("push", "rlbox-test-reg/src:one", "--registry", registry, "--immutable-tag", "one-build7", env=env())
    one_line_error(proc, f"{registry}/rlbox-test-reg/src:one-build7 already exists for another image")


def test_credentials_from_the_docker_config(registry, tree, pushed, tmp_path):
    import base64

    (tmp_path / "config.json").write_text(json.dumps(
        {"auths": {registry: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
    e = {k: v for k, v in env(tree).items() if not k.startswith("RLBOX_REGISTRY_")} | {"DOCKER_CONFIG": str(tmp_path)}
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLBOX_REGISTRY_")}
    proc = subprocess.run([*_cli(), "images", "tags", "regtest"], env=full | e, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert HOST_VARIANT in proc.stdout and PASSWORD not in proc.stdout + proc.stderr


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "rlbox.cli"]


# ---------------------------------------------------------------------------------------------
def test_wrong_password_is_one_clear_line(registry, tree, pushed, npu_smi):
    wrong = "Wr0ng-" + secrets.token_hex(6)
    expected = (f"rlbox: error: registry {registry}: authentication failed for user {USER}: check "
                f"RLBOX_REGISTRY_USER/RLBOX_REGISTRY_PASSWORD or `docker login {registry}`")
    for argv in (("images", "tags", "regtest"), ("push", f"regtest:{HOST_VARIANT}"),
                 ("pull", f"regtest:{HOST_VARIANT}")):
        proc = rlbox(*argv, env=env(tree, npu_smi=npu_smi, password=wrong))
        assert one_line_error(proc) == expected, argv
        assert wrong not in proc.stdout + proc.stderr and PASSWORD not in proc.stdout + proc.stderr
    # without any credentials
    proc = subprocess.run([*_cli(), "images", "tags", "regtest"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if not k.startswith("RLBOX_REGISTRY_")}
                          | {"RLBOX_ROOT": str(tree), "DOCKER_CONFIG": env()["DOCKER_CONFIG"]})
    one_line_error(proc, "authentication required: set RLBOX_REGISTRY_USER/RLBOX_REGISTRY_PASSWORD")


def test_engine_login_failure_is_one_line(registry):
    """The engine's own login path (docker-py client.login), should the registry pass the API check."""
    from rlbox.image.transfer import _login

    creds = Credentials(USER, "Wr0ng-" + secrets.token_hex(6), "environment")
    with pytest.raises(RlboxError) as info:
        _login(docker.from_env(), registry, creds)
    assert str(info.value) == (f"registry {registry}: authentication failed for user {USER}: check "
                               f"RLBOX_REGISTRY_USER/RLBOX_REGISTRY_PASSWORD or `docker login {registry}`")
    assert creds.password not in str(info.value)


def test_unreachable_registry_and_unknown_names(registry, tree, npu_smi):
    port = free_port()
    for argv in (("images", "tags", f"127.0.0.1:{port}/rlbox-test-reg/verl"),
                 ("pull", f"127.0.0.1:{port}/rlbox-test-reg/verl:x"),
                 ("pull", f"regtest:{HOST_VARIANT}", "--registry", f"127.0.0.1:{port}")):
        proc = rlbox(*argv, env=env(tree, npu_smi=npu_smi))
        one_line_error(proc, f"registry 127.0.0.1:{port}: cannot connect to 127.0.0.1 port {port} (connection refused)")
    one_line_error(rlbox("images", "tags", f"{registry}/rlbox-test-reg/nothing", env=env()),
                   f"registry {registry}: no repository rlbox-test-reg/nothing")
    one_line_error(rlbox("pull", f"{registry}/rlbox-test-reg/verl:no-such-tag", env=env(npu_smi=npu_smi)),
                   f"registry {registry}: no image rlbox-test-reg/verl:no-such-tag (manifest unknown)")


# ---------------------------------------------------------------------------------------------
def test_pull_hardware_auto_picks_this_hosts_variant(registry, tree, pushed, npu_smi):
    name = f"{registry}/rlbox-test-reg/verl:{HOST_VARIANT}"
    image_id, push = pushed[HOST_VARIANT]
    docker.from_env().images.remove(name)
    proc = rlbox("pull", "--hardware", "auto", "--release", "regtest", env=env(tree, npu="a2", npu_smi=npu_smi))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == push.stdout.strip()
    assert f"(regtest:{HOST_VARIANT}, {HOST_HW}, {HOST_PLATFORM})" in proc.stderr
    assert local(name).id == image_id
    # A3 npu-smi: the a3 variant is arm64 only
    proc = rlbox("pull", "--hardware", "auto", "--release", "regtest", env=env(tree, npu="a3", npu_smi=npu_smi))
    if ARM:
        one_line_error(proc, "no image rlbox-test-reg/verl:a3-arm")  # chosen, but not pushed
    else:
        one_line_error(proc, "release regtest has no variant for this host (linux/amd64, npu-smi chip Ascend910: hardware a3)")
    # no npu-smi at all
    proc = rlbox("pull", "--hardware", "auto", "--release", "regtest",
                 env=env(tree, npu=None) | {"RLBOX_NPU_SMI": "/nonexistent/npu-smi"})
    one_line_error(proc, "--hardware auto: cannot tell this host's NPU: /nonexistent/npu-smi not found")


def test_pull_of_a_variant_that_does_not_fit_is_refused(registry, tree, pushed, npu_smi):
    other = f"{registry}/rlbox-test-reg/verl:{OTHER_VARIANT}"
    other_id, _ = pushed[OTHER_VARIANT]
    docker.from_env().images.remove(other)
    assert local(other_id) is None
    # platform: the other platform's variant is in the registry, but is not pulled
    proc = rlbox("pull", f"regtest:{OTHER_VARIANT}", env=env(tree, npu_smi=npu_smi))
    one_line_error(proc, f"not pulling {other}: regtest:{OTHER_VARIANT} is {OTHER_PLATFORM}",
                   f"this host is {HOST_PLATFORM}", f"pull regtest:{HOST_VARIANT} instead", "--force")
    assert local(other) is None and local(other_id) is None
    # chip: an A3 host asked for a 910B variant of its own platform
    host_name = f"{registry}/rlbox-test-reg/verl:{HOST_VARIANT}"
    docker.from_env().images.remove(host_name)
    proc = rlbox("pull", f"regtest:{HOST_VARIANT}", env=env(tree, npu="a3", npu_smi=npu_smi))
    one_line_error(proc, f"regtest:{HOST_VARIANT} is for chip 910B", "this host's npu-smi reports Ascend910")
    assert local(host_name) is None
    # --force pulls it anyway, with a warning
    proc = rlbox("pull", f"regtest:{OTHER_VARIANT}", "--force", env=env(tree, npu_smi=npu_smi))
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {other}: it is {OTHER_PLATFORM}, this host is {HOST_PLATFORM} (--force)" in proc.stderr
    assert local(other).id == other_id
    assert rlbox("pull", f"regtest:{HOST_VARIANT}", env=env(tree, npu_smi=npu_smi)).returncode == 0  # back for the others


def test_mislabeled_image_is_refused_after_pull_and_removed(registry, tree, tmp_path, npu_smi):
    # a plain image reference whose label says arm64 while the image is this host's platform
    odd = f"{registry}/rlbox-test-reg/odd:mislabeled"
    odd_id = build(tmp_path, odd, HOST_PLATFORM, {"io.rlbox.platform": OTHER_PLATFORM, "io.rlbox.chip": "910b"})
    assert rlbox("push", odd, "--no-immutable-tag", env=env()).returncode == 0
    docker.from_env().images.remove(odd)
    proc = rlbox("pull", odd, env=env(npu_smi=npu_smi))
    line = one_line_error(proc, f"refused {registry}/rlbox-test-reg/odd@sha256:",
                          f"labelled io.rlbox.platform={OTHER_PLATFORM} but its architecture is {HOST_PLATFORM.split('/')[1]}",
                          "removed it again", progress=True)
    assert local(odd) is None and local(odd_id) is None, line

    # a matrix variant's tag holding an image labelled for another variant (A3) and chip
    bad = f"{registry}/rlbox-test-reg/verl-bad:{HOST_VARIANT}"
    bad_id = build(tmp_path, bad, HOST_PLATFORM, labels_for("regbad", "a3-arm", "a3", "a3", HOST_PLATFORM))
    assert rlbox("push", f"regbad:{HOST_VARIANT}", env=env(tree)).returncode == 0
    docker.from_env().images.remove(bad)
    proc = rlbox("pull", f"regbad:{HOST_VARIANT}", env=env(tree, npu_smi=npu_smi))
    one_line_error(proc, f"labelled io.rlbox.variant=a3-arm, but regbad:{HOST_VARIANT} is {HOST_VARIANT}",
                   f"labelled io.rlbox.chip=a3, but regbad:{HOST_VARIANT} is 910b",
                   "it is for chip a3 (Ascend910), this host's npu-smi reports 910B3", "removed it again", progress=True)
    assert local(bad) is None and local(bad_id) is None
    # --force does not take a mislabeled image either
    proc = rlbox("pull", f"regbad:{HOST_VARIANT}", "--force", env=env(tree, npu_smi=npu_smi))
    one_line_error(proc, "labelled io.rlbox.variant=a3-arm", "removed it again", progress=True)
    assert local(bad_id) is None


def test_multi_platform_index(registry, tree, pushed, npu_smi):
    """An index (as buildx pushes multi-platform images) put into the registry by hand: listed per
    platform, pulled for this host's platform."""
    reg = Registry(registry, credentials=Credentials(USER, PASSWORD, "test"))
    auth = (USER, PASSWORD)
    entries = []
    for variant, platform in ((HOST_VARIANT, HOST_PLATFORM), (OTHER_VARIANT, OTHER_PLATFORM)):
        m = reg.manifest(f"{registry}/rlbox-test-reg/verl:{variant}")
        body = json.dumps(m.image).encode()
        entries.append({"mediaType": m.media_type, "digest": m.digest, "size": len(body),
                        "platform": {"os": "linux", "architecture": platform.split("/")[1]}})
    index = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
             "manifests": entries}
    resp = requests.put(f"http://{registry}/v2/rlbox-test-reg/verl/manifests/multi", data=json.dumps(index), auth=auth,
                        headers={"Content-Type": index["mediaType"]}, timeout=10)
    assert resp.status_code == 201, resp.text
    listing = json.loads(rlbox("images", "tags", "regtest", "--json", env=env(tree)).stdout)
    multi = [r for r in listing["tags"] if r["tag"] == "multi"]
    assert sorted(r["platform"] for r in multi) == sorted([HOST_PLATFORM, OTHER_PLATFORM])
    proc = rlbox("pull", f"{registry}/rlbox-test-reg/verl:multi", env=env(npu_smi=npu_smi))
    assert proc.returncode == 0, proc.stderr
    assert local(f"{registry}/rlbox-test-reg/verl:multi").id == pushed[HOST_VARIANT][0]


# ---------------------------------------------------------------------------------------------
# The image pipeline against the registry: a lock pins the base by its registry digest, and
# `rlbox diff` reads an image's records from the registry without pulling it.


def test_diff_reads_the_records_from_the_registry(registry, selftest_image):
    _, image, _ = selftest_image
    remote = f"{registry}/rlbox-test/selftest:diff"
    proc = rlbox("push", image, "--registry", registry, "--no-immutable-tag", "--tag", "diff", env=env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    pushed = proc.stdout.strip()
    for name in docker.from_env().images.get(image).tags:
        if name.startswith(f"{registry}/"):
            docker.from_env().images.remove(name)  # not on the engine: read from the registry only
    proc = rlbox("diff", remote, image, env=env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--- {remote} (registry, {pushed.split('@')[1][:19]})" in proc.stdout
    for section in ("components", "patches", "python packages", "os packages"):
        assert f"{section}: no change (" in proc.stdout
    data = json.loads(rlbox("diff", remote, image, "--json", env=env()).stdout)
    assert data["identical"] and data["os_packages"]["unchanged"] > 100
    proc = rlbox("diff", remote, image, env=env(password="wrong-" + PASSWORD))
    assert proc.returncode == 2 and "authentication failed" in proc.stderr and PASSWORD not in proc.stderr


def test_lock_pins_the_base_by_its_registry_digest(registry, tmp_path, fixture_git, ca_bundle, engine, monkeypatch):
    from support import selftest

    # Logged in the way CI's docker/login-action leaves it: the Docker config. The lock (run in
    # this process by selftest.make_tree) and BuildKit's pull of the base both use it.
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (config / "config.json").write_text(json.dumps({"auths": {registry: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    base = f"{registry}/rlbox-test/cann-sim"
    proc = rlbox("push", selftest.CANN_SIM_IMAGE, "--registry", registry, "--no-immutable-tag", env=env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    digest = proc.stdout.strip().split("@")[1]
    repo, daemon = fixture_git

    def from_registry(data):
        data["base"] = {"image": base, "tag": "bookworm"}

    tree = selftest.make_tree(tmp_path / "rlbox", daemon.url("fixture.git"), repo.commit,
                              selftest.fixture_patches(repo), ca_bundle, edit=from_registry)
    locked = json.loads((tree / "images" / "lock" / "selftest.json").read_text())["variants"][selftest.VARIANT]
    assert locked["base"]["image"] == f"{base}:bookworm" and locked["base"]["digest"] == digest
    text = (tree / "dockerfiles" / "selftest" / selftest.VARIANT / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={base}:bookworm@{digest}\n" in text
    tag = "localhost/rlbox-test/selftest:base-digest"
    for name in docker.from_env().images.get(selftest.CANN_SIM_IMAGE).tags:
        if name.startswith(f"{registry}/"):
            docker.from_env().images.remove(name)  # FROM ...@digest comes from the registry itself
    proc = rlbox(*selftest.build_argv(tree, ca_bundle, "--tag", tag)[1:], cwd=tree, env={"DOCKER_CONFIG": str(config)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = docker.from_env()
    try:
        labels = client.images.get(tag).labels
        assert labels["io.rlbox.base.digest"] == digest
        assert labels["org.opencontainers.image.base.name"] == f"{base}:bookworm@{digest}"
    finally:
        client.images.remove(tag, force=True)
