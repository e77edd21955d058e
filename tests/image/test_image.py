"""The self-test image, built on a real engine through the same templates and build code.

Read back with the Docker SDK (as jupyter/docker-stacks does): labels, /etc/rlbox/image.json,
the patched source, the CANN environment in every kind of process, jemalloc, the non-root user,
and the absence of the CA bundle and of pip/apt caches in every layer.
"""

from __future__ import annotations

import io
import json
import tarfile

import docker
import pytest

from support import selftest
from conftest import rlbox

pytestmark = pytest.mark.engine


def sh(client, image, script, entrypoint=None, user=None):
    kw = {"entrypoint": entrypoint} if entrypoint is not None else {}
    out = client.containers.run(image, script, remove=True, user=user, **kw)
    return out.decode().strip()


def test_labels_and_manifest_record_every_pin_and_patch(client, selftest_image):
    tree, image, _ = selftest_image
    labels = client.images.get(image).labels
    expected = json.loads((tree / "dockerfiles" / "selftest" / selftest.VARIANT / "image.json").read_text())
    assert labels["io.rlbox.release"] == "selftest"
    assert labels["io.rlbox.component.six"] == "six==1.17.0"
    fixture = expected["components"]["fixture"]
    assert labels["io.rlbox.component.fixture"] == f"git+{fixture['git']}@{fixture['commit']}"
    assert labels["org.opencontainers.image.version"] == selftest.REF
    for p in expected["patches"]:
        assert f"{p['name']}@sha256:{p['sha256']}" in labels["io.rlbox.patches"]
    proc = rlbox("inspect", image, "--json", check=True)
    info = json.loads(proc.stdout)
    assert info["manifest"] == expected
    assert info["labels"] == labels


def test_pinned_commit_with_patch_series_applied(client, selftest_image):
    tree, image, _ = selftest_image
    manifest = json.loads((tree / "dockerfiles" / "selftest" / selftest.VARIANT / "image.json").read_text())
    out = sh(client, image, ["python3", "-c", "import rlbox_fixture as f; print(f.GREETING, f.features())"])
    assert out == "patched by rlbox ['npu']"
    head = sh(client, image, ["git", "-C", "/opt/rlbox/src/fixture", "rev-parse", "HEAD"])
    assert head == manifest["components"]["fixture"]["commit"]
    applied = sh(client, image, ["cat", "/etc/rlbox/patches.applied"]).splitlines()
    assert applied == [f"{p['name']} sha256:{p['sha256']}" for p in manifest["patches"]]
    assert sh(client, image, ["rlbox-verify", "/etc/rlbox/image.json"]).startswith("rlbox-verify: selftest:")


def test_cann_environment_reaches_every_kind_of_process(client, selftest_image):
    _, image, _ = selftest_image
    want = "/usr/local/Ascend/ascend-toolkit/latest"
    # the container's own command through the entrypoint, no shell involved (Ray's processes)
    assert sh(client, image, ["python3", "-c", "import os; print(os.environ['ASCEND_TOOLKIT_HOME'])"]) == want
    # non-interactive bash without the entrypoint (BASH_ENV)
    assert sh(client, image, ["-c", "echo $ATB_HOME_PATH"], entrypoint="bash").endswith("cxx_abi_1")
    # login shell (/etc/profile.d)
    assert sh(client, image, ["-lc", "echo $ASCEND_OPP_PATH"], entrypoint="bash") == f"{want}/opp"
    # docker exec into a running container
    box = client.containers.run(image, ["sleep", "60"], detach=True)
    try:
        code, out = box.exec_run(["bash", "-c", "echo $ASCEND_TOOLKIT_HOME"])
        assert code == 0 and out.decode().strip() == want
        code, out = box.exec_run(["bash", "-ic", "echo $ASCEND_HOME_PATH"])  # interactive: bash.bashrc
        assert want in out.decode().splitlines()  # (bash also complains there is no terminal)
    finally:
        box.remove(force=True)


def test_jemalloc_preloaded_and_user_available(client, selftest_image):
    _, image, _ = selftest_image
    maps = sh(client, image, ["python3", "-c", "print(open('/proc/self/maps').read())"])
    assert "libjemalloc.so.2" in maps
    assert sh(client, image, ["id", "-un"], user="rlbox") == "rlbox"
    home = sh(client, image, ["bash", "-c", "getent passwd rlbox | cut -d: -f6"])
    assert not home.startswith("/home")
    assert sh(client, image, ["bash", "-c", "python3 -c 'import sys; print(sys.prefix)'"]) == "/opt/rlbox/venv"


def _added_layer_files(client, image, base):
    """(layer, path, bytes) of every regular file in the layers the build added on top of base."""
    skip = len(client.images.get(base).attrs["RootFS"]["Layers"])
    raw = b"".join(client.images.get(image).save(named=True))
    with tarfile.open(fileobj=io.BytesIO(raw)) as outer:
        layers = json.load(outer.extractfile("manifest.json"))[0]["Layers"]
        assert len(layers) > skip
        for name in layers[skip:]:
            with tarfile.open(fileobj=outer.extractfile(name)) as layer:
                for item in layer.getmembers():
                    if item.isfile() and not item.name.rsplit("/", 1)[-1].startswith(".wh."):
                        yield name, item.name, layer.extractfile(item).read()


def test_no_ca_bundle_and_no_caches_in_any_layer(client, selftest_image, ca_bundle):
    _, image, _ = selftest_image
    marker = ca_bundle.read_text().splitlines()[0].encode()
    ca_bytes = ca_bundle.read_bytes()
    leaked, caches, seen = [], [], 0
    for layer, path, data in _added_layer_files(client, image, selftest.CANN_SIM_IMAGE):
        seen += 1
        if marker in data or data == ca_bytes or path.startswith("run/secrets/"):
            leaked.append((layer, path))
        if path.startswith(("root/.cache/pip/", "var/lib/apt/lists/", "var/cache/apt/archives/")) and not path.endswith("lock"):
            caches.append(path)
    assert seen > 500  # really read the added layers (apt packages, venv, sources)
    assert leaked == []
    assert caches == []


def test_broken_patch_fails_naming_component_and_patch(tmp_path, fixture_git, ca_bundle, selftest_image, client):
    repo, daemon = fixture_git
    patches = selftest.fixture_patches(repo)
    # A patch written against other code: it cannot apply to the pinned commit.
    patches["0003-broken.patch"] = patches["0001-greeting.patch"].replace('"upstream"', '"someone else"', 1)
    tree = selftest.make_tree(tmp_path / "rlbox", daemon.url("fixture.git"), repo.commit, patches, ca_bundle)
    before = {c.id for c in client.containers.list(all=True, ignore_removed=True)}
    proc = rlbox(*selftest.build_argv(tree, ca_bundle, "--tag", "localhost/rlbox-test/broken:1")[1:], cwd=tree)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: build of selftest:")
    assert "patch fixture/0003-broken.patch does not apply to fixture@" + repo.commit in last
    assert "Traceback" not in proc.stderr
    # nothing of this build is left: no container of its base or its tag (other engine tests' containers, of
    # other images, may come and go meanwhile: tests/conftest.py runs three engine groups side by side)
    ours = {selftest.CANN_SIM_IMAGE, "localhost/rlbox-test/broken:1"}
    assert [c.name for c in client.containers.list(all=True, ignore_removed=True)
            if c.id not in before and c.attrs.get("Config", {}).get("Image") in ours] == []
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get("localhost/rlbox-test/broken:1")


def test_inspect_of_foreign_image_is_one_line(engine):
    proc = rlbox("inspect", selftest.CANN_SIM_IMAGE)
    assert proc.returncode == 2 and "was not built by rlbox" in proc.stderr
    proc = rlbox("inspect", "localhost/rlbox-test/nothing:here")
    assert proc.returncode == 2 and "is not on this engine" in proc.stderr


def test_lock_is_recorded_and_verified(client, selftest_image):
    tree, image, proc = selftest_image
    manifest = json.loads((tree / "dockerfiles" / "selftest" / selftest.VARIANT / "image.json").read_text())
    lock = manifest["lock"]
    assert lock["state"] == "fresh" and lock["pip"]["six"] == "1.17.0" and lock["pip"]["verl"] == "0.5.0"
    labels = client.images.get(image).labels
    assert labels["io.rlbox.lock"] == lock["digest"]
    assert f"{len(lock['pip'])} locked packages installed as locked and nothing else (1 git sources" in proc.stderr
    # the fixture was pinned by tag and short SHA; the lock resolved the full commit
    assert labels["io.rlbox.component.fixture"].endswith("@" + manifest["components"]["fixture"]["commit"])
    assert len(manifest["components"]["fixture"]["commit"]) == 40
    # the image installed exactly the lock, hashes required: the fixture's own requirement (idna) came from it
    held = sh(client, image, ["cat", "/etc/rlbox/requirements.lock"])
    assert "six==1.17.0 \\\n    --hash=sha256:" in held and "idna==" + lock["pip"]["idna"] in held
    versions = json.loads(sh(client, image, ["python3", "-c", "import json; from importlib import metadata as m; "
                                                            "print(json.dumps({d: m.version(d) for d in ('idna', 'six')}))"]))
    assert versions == {"idna": lock["pip"]["idna"], "six": "1.17.0"}


def test_a_git_source_requirement_missing_from_the_lock_fails_the_build_naming_it(tmp_path, fixture_git, ca_bundle,
                                                                                 selftest_image, client):
    """Git sources install without resolving: what they declare must be in the lock, or rlbox-verify names it."""
    from rlbox.image import matrix, render

    repo, daemon = fixture_git
    tree = selftest.make_tree(tmp_path / "rlbox", daemon.url("fixture.git"), repo.commit, selftest.fixture_patches(repo),
                              ca_bundle)
    path = tree / "images" / "lock" / "selftest.json"
    data = json.loads(path.read_text())
    del data["variants"][selftest.VARIANT]["pip"]["packages"]["idna"]  # a lock that lost the fixture's requirement
    path.write_text(json.dumps(data))
    render.write(matrix.load(tree))
    proc = rlbox(*selftest.build_argv(tree, ca_bundle, "--tag", "localhost/rlbox-test/unlocked:1")[1:], cwd=tree)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: build of selftest:")
    assert "rlbox-verify: pip check: rlbox-fixture 1.0.0 requires idna, which is not installed." in last
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get("localhost/rlbox-test/unlocked:1")


def test_sbom_lists_every_python_and_os_package(client, selftest_image):
    tree, image, _ = selftest_image
    sbom = json.loads(sh(client, image, ["cat", "/etc/rlbox/sbom.json"]))
    py = {p["name"].lower(): p for p in sbom["python_packages"]}
    assert py["six"]["version"] == "1.17.0" and py["verl"]["version"] == "0.5.0"
    assert py["rlbox-fixture"]["source"].startswith("file:///opt/rlbox/src/fixture")
    # the SBOM's Python packages from an index are exactly the lock, at its versions
    lock = json.loads((tree / "dockerfiles" / "selftest" / selftest.VARIANT / "image.json").read_text())["lock"]["pip"]
    from_lock = {p["name"].lower().replace("_", "-"): p["version"] for p in sbom["python_packages"] if p["origin"] == "lock"}
    assert from_lock == lock
    assert py["rlbox-fixture"]["origin"] == "source"
    os_pkgs = {p["name"].split(":")[0]: p["version"] for p in sbom["os_packages"]}
    assert sbom["os_package_manager"] == "dpkg" and "git" in os_pkgs and "libjemalloc2" in os_pkgs
    assert len(os_pkgs) > 100
    assert sbom["git_sources"] == [{"name": "fixture", "commit": selftest.run(
        "docker", "run", "--rm", "--entrypoint", "git", image, "-C", "/opt/rlbox/src/fixture", "rev-parse", "HEAD").stdout.strip()}]
    # the SBOM is the last layer's only file: `rlbox diff` reads it from a registry by that layer alone
    raw = b"".join(client.images.get(image).save(named=True))
    with tarfile.open(fileobj=io.BytesIO(raw)) as outer:
        last = json.load(outer.extractfile("manifest.json"))[0]["Layers"][-1]
        with tarfile.open(fileobj=outer.extractfile(last)) as layer:
            files = [m.name for m in layer.getmembers() if m.isfile()]
    assert files == ["etc/rlbox/sbom.json"]


def test_diff_names_the_patch_and_the_package(tmp_path, fixture_git, ca_bundle, selftest_image, client):
    repo, daemon = fixture_git
    tree_a, image_a, _ = selftest_image
    patches = selftest.fixture_patches(repo)
    del patches["0002-feature.patch"]

    def older_six(data):
        data["components"]["six"]["pip"] = "six==1.16.0"

    tree = selftest.make_tree(tmp_path / "rlbox", daemon.url("fixture.git"), repo.commit, patches, ca_bundle, edit=older_six)
    image_b = "localhost/rlbox-test/selftest:diff-b"
    proc = rlbox(*selftest.build_argv(tree, ca_bundle, "--tag", image_b)[1:], cwd=tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        proc = rlbox("diff", image_a, image_b)
        assert proc.returncode == 1, proc.stderr
        text = proc.stdout
        assert "components: 1 changed" in text and "~ six: six==1.17.0 -> six==1.16.0" in text
        assert "patches: 1 removed, 1 unchanged" in text and "- fixture/0002-feature.patch: sha256:" in text
        assert "python packages: 1 changed" in text and "~ six: 1.17.0 -> 1.16.0" in text
        assert "os packages: no change" in text
        data = json.loads(rlbox("diff", image_a, image_b, "--json").stdout)
        assert data["components"]["changed"] == {"six": {"from": "six==1.17.0", "to": "six==1.16.0"}}
        assert list(data["patches"]["removed"]) == ["fixture/0002-feature.patch"]
        assert data["python_packages"]["changed"] == {"six": {"from": "1.17.0", "to": "1.16.0"}}
        same = rlbox("diff", image_a, image_a)
        assert same.returncode == 0 and "components: no change" in same.stdout
    finally:
        client.images.remove(image_b, force=True)
