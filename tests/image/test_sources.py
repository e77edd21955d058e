"""Air-gapped builds: `rlbox fetch-sources` fills the cache, `rlbox build --mirror offline` builds the
self-test image from it with no network at all (index, git server and apt mirror unreachable)."""

from __future__ import annotations

import json

import pytest

from rlbox.image import rehearsal
from support import selftest
from conftest import rlbox

pytestmark = pytest.mark.engine

OFFLINE_TAG = "localhost/rlbox-test/selftest:offline"


def _sbom(client, image):
    out = client.containers.run(image, ["cat", "/etc/rlbox/sbom.json"], remove=True, entrypoint=[])
    return json.loads(out)


def test_offline_build_uses_only_the_source_cache(tmp_path, fixture_git, ca_bundle, selftest_image, client):
    repo, daemon = fixture_git
    tree = selftest.make_tree(tmp_path / "rlbox", daemon.url("fixture.git"), repo.commit,
                              selftest.fixture_patches(repo), ca_bundle)
    build = ("build", selftest.REF, "--mirror", "offline", "--no-cache", "--tag", OFFLINE_TAG)

    # `rlbox lock` read the fixture's requirements from its source: the cache holds its history
    assert (tree / ".rlbox-sources" / "git" / f"fixture-{repo.commit}.git").is_dir()
    # No locked file fetched yet: refused before BuildKit starts, naming the missing piece and the fix.
    proc = rlbox(*build, cwd=tree)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert f"offline build of {selftest.REF}: .rlbox-sources/wheels/" in proc.stderr
    assert f"run `rlbox fetch-sources {selftest.REF}`" in proc.stderr

    proc = rlbox("fetch-sources", selftest.REF, "--ca-bundle", ca_bundle, cwd=tree)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ready for `rlbox build" in proc.stdout
    cache = tree / ".rlbox-sources"
    assert (cache / "git" / f"fixture-{repo.commit}.git").is_dir()
    wheels = {p.name.split("-")[0].lower() for p in (cache / "wheels").glob("*/*.whl")}
    assert {"six", "decorator", "verl", "setuptools", "idna"} <= wheels  # locked: the fixture's build backend and requirement
    debs = (cache / "debs").glob("*/debian12/Packages")
    assert "Package: git" in next(debs).read_text()

    # Offline: every RUN without a network (BuildKit --network none), no layer from the cache.
    proc = rlbox(*build, cwd=tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--network none" in proc.stderr and "RLBOX_OFFLINE=1" in proc.stderr
    # The same image as the online build: same Python and OS packages, same patched source.
    online, offline = _sbom(client, selftest_image[1]), _sbom(client, OFFLINE_TAG)
    assert offline["python_packages"] == online["python_packages"]
    assert offline["os_packages"] == online["os_packages"]
    assert offline["git_sources"] == online["git_sources"] and offline["patches"] == online["patches"]

    # What does not concern a layer leaves it cached (issue 28): each RUN mounts only what it reads, and
    # BuildKit keys it on that alone. A wheel of another platform, another component's repository and
    # another release's sdist appear in the cache; the same build again takes every step from the cache.
    other = "aarch64" if selftest.HARDWARE == "ax" else "x86_64"
    (cache / "wheels" / f"{other}-py3.11").mkdir(parents=True, exist_ok=True)
    (cache / "wheels" / f"{other}-py3.11" / "unrelated-1.0-py3-none-any.whl").write_bytes(b"PK not a wheel")
    (cache / "git" / f"unrelated-{'0' * 40}.git").mkdir()
    (cache / "git" / f"unrelated-{'0' * 40}.git" / "HEAD").write_text("ref: refs/heads/main\n")
    (cache / "sdist").mkdir(exist_ok=True)
    (cache / "sdist" / "unrelated-1.0.tar.gz").write_bytes(b"not an sdist")
    proc = rlbox(*(a for a in build if a != "--no-cache"), cwd=tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [s for s in rehearsal.parse_build_log(proc.stderr.splitlines()) if s.kind != "FROM"]
    assert len(steps) > 10 and all(s.cached for s in steps), [f"{s.position} {s.text[:60]}" for s in steps if not s.cached]
    client.images.remove(OFFLINE_TAG, force=True)
