"""The cache of `rlbox images list`'s rows (rlbox.image.matrix_cache): a hit serves the rows without
loading the matrix; a changed input misses; a corrupt, tampered or foreign cache file is ignored
(and written again), never trusted and never a traceback. Structure only, never a timing:
bench/startup.py measures the time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, rlbox
from rlbox.core import paths
from rlbox.core.errors import RlboxError
from rlbox.image import matrix, matrix_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("RLBOX_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def made(m):
    """The rows and key of this checkout's matrix, and a valid cache entry's text for them."""
    rows = [v.summary() for v in m.variants]
    key = matrix_cache.inputs_key(REPO.resolve())
    entry = {"format": matrix_cache.FORMAT, "key": key, "rows": rows, "sha256": matrix_cache.rows_digest(rows)}
    return rows, key, entry


def no_load(monkeypatch):
    def refuse(root):
        raise AssertionError("the matrix was loaded: the cache should have served")

    monkeypatch.setattr(matrix, "load", refuse)


def test_a_miss_loads_and_writes_then_a_hit_serves_without_loading(tree, cache, monkeypatch):
    first = matrix_cache.rows(tree)
    assert first == [v.summary() for v in matrix.load(tree).variants]
    files = list((cache / "matrix").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"  # one file, no temporary left behind
    assert files[0].stat().st_mode & 0o777 == 0o600
    no_load(monkeypatch)
    assert matrix_cache.rows(tree) == first
    assert json.dumps(matrix_cache.rows(tree)) == json.dumps(first)  # the same order of fields, too


# An edit of any input: the key changes, the rows are loaded again.
def edit_yaml(tree):
    path = tree / "images" / "verl_pt27_25rc3.yaml"
    text = path.read_text()
    path.write_text(text.replace("  a3-arm:\n    hardware: a3\n", "  a3-arm:\n    hardware: a3\n    tag: a3-arm-edited\n", 1))
    assert path.read_text() != text


def edit_lock(tree):
    path = tree / "images" / "lock" / "verl_pt27_25rc3.json"
    path.write_text(path.read_text() + "\n")


def edit_hardware(tree):
    path = tree / "images" / "hardware.yaml"
    path.write_text(path.read_text() + "\n# a comment\n")


def add_release(tree):
    text = (tree / "images" / "verl_cpu.yaml").read_text().replace("release: verl_cpu", "release: verl_cpu_copy")
    (tree / "images" / "verl_cpu_copy.yaml").write_text(text.replace("  name: verl-cpu\n", "  name: verl-cpu-copy\n"))


def remove_patch(tree):
    next((tree / "patches").glob("*/0001-*.patch")).unlink()


EDITS = [edit_yaml, edit_lock, edit_hardware, add_release, remove_patch]


@pytest.mark.parametrize("edit", EDITS, ids=[e.__name__ for e in EDITS])
def test_a_changed_input_misses(tree, cache, edit):
    before = matrix_cache.inputs_key(tree)
    old = matrix_cache.rows(tree)
    edit(tree)
    assert matrix_cache.inputs_key(tree) != before
    if edit is remove_patch:  # the matrix is broken now: the cache says so, as load does, never the old rows
        with pytest.raises(RlboxError, match=r"patches/verl/0001-\S+ does not exist"):
            matrix_cache.rows(tree)
        return
    rows = matrix_cache.rows(tree)
    assert rows == [v.summary() for v in matrix.load(tree).variants]
    if edit is edit_yaml:
        assert rows != old and any(r["tag"].endswith(":a3-arm-edited") for r in rows)
    if edit is add_release:
        assert len(rows) == len(old) + 1


def test_an_invalid_matrix_is_never_cached(tree, cache):
    path = tree / "images" / "verl_pt27_25rc3.yaml"
    path.write_text(path.read_text().replace("release: verl_pt27_25rc3", "release: nope", 1))
    for _ in range(2):
        with pytest.raises(RlboxError, match=r"release: must be 'verl_pt27_25rc3'"):
            matrix_cache.rows(tree)
    assert not (cache / "matrix").exists()


def text_of(entry: dict) -> str:
    return json.dumps(entry)


def tampered_value(entry):
    entry = json.loads(json.dumps(entry))
    entry["rows"][0]["tag"] = "evil.example/x:y"  # the rows' sha256 no longer matches
    return text_of(entry)


def retyped(field, value):
    def make(entry):
        entry = json.loads(json.dumps(entry))
        entry["rows"][0][field] = value
        entry["sha256"] = matrix_cache.rows_digest(entry["rows"])  # consistent, but of the wrong type
        return text_of(entry)
    make.__name__ = f"{field}={value!r}"
    return make


def reordered(entry):
    entry = json.loads(json.dumps(entry))
    entry["rows"][0] = dict(reversed(list(entry["rows"][0].items())))
    entry["sha256"] = matrix_cache.rows_digest(entry["rows"])
    return text_of(entry)


def with_top(**changes):
    def make(entry):
        return text_of({**entry, **changes})
    make.__name__ = ",".join(changes)
    return make


CORRUPT = [
    ("empty", lambda e: ""),
    ("truncated", lambda e: text_of(e)[: len(text_of(e)) // 2]),
    ("not JSON", lambda e: "rows: [1, 2]"),
    ("not UTF-8", lambda e: b"\xff\xfe" + text_of(e).encode()),
    ("a list", lambda e: "[]"),
    ("nested deeply", lambda e: "[" * 100_000 + "]" * 100_000),
    ("another key", with_top(key="0" * 64)),
    ("another format", with_top(format="rlbox.matrix-rows/v0")),
    ("rows not a list", with_top(rows={"a": 1})),
    ("an extra field", with_top(extra=1)),
    ("a tampered value", tampered_value),
    ("a field of the wrong type", retyped("tag", 1)),
    ("components not strings", retyped("components", {"verl": 1})),
    ("patches not a list", retyped("patches", "verl/0001-x.patch")),
    ("fields reordered", reordered),
    ("over the size limit", lambda e: " " * (matrix_cache.MAX_BYTES + 1) + text_of(e)),
]


@pytest.mark.parametrize("make", [c[1] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_a_corrupt_or_foreign_cache_is_ignored(tmp_path, made, make):
    rows, key, entry = made
    path = tmp_path / "c.json"
    data = make(entry)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    assert matrix_cache.read(path, key) is None


def test_the_valid_entry_is_read_back(tmp_path, made):
    rows, key, entry = made
    path = tmp_path / "c.json"
    matrix_cache.write(path, key, rows)
    assert matrix_cache.read(path, key) == rows == json.loads(path.read_text())["rows"]
    assert json.loads(path.read_text()) == entry


def test_what_is_not_a_regular_file_is_not_read(tmp_path, made):
    rows, key, _ = made
    good = tmp_path / "good.json"
    matrix_cache.write(good, key, rows)
    link = tmp_path / "link.json"
    link.symlink_to(good)
    (tmp_path / "dir.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")  # opened without blocking, then refused
    for name in ("link.json", "dir.json", "fifo.json", "absent.json"):
        assert matrix_cache.read(tmp_path / name, key) is None, name


def test_a_corrupt_cache_is_rebuilt(tree, cache):
    rows = matrix_cache.rows(tree)
    path = matrix_cache.cache_file(tree.resolve())
    path.write_text(path.read_text()[:100])
    assert matrix_cache.rows(tree) == rows
    assert matrix_cache.read(path, matrix_cache.inputs_key(tree.resolve())) == rows  # written again, whole


def test_a_cache_that_cannot_be_written_is_skipped(tree, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("RLBOX_CACHE", str(tmp_path / "a-file" / "cache"))
    assert matrix_cache.rows(tree) == [v.summary() for v in matrix.load(tree).variants]


def test_the_rows_are_the_summaries_fields(m):
    for v in m.variants:
        row = v.summary()
        assert tuple(row) == matrix_cache.FIELDS
        assert matrix_cache.typed({"format": matrix_cache.FORMAT, "key": "k", "rows": [row],
                                   "sha256": matrix_cache.rows_digest([row])}, "k") == [row]


def test_the_key_covers_the_code_and_libraries_the_matrix_loads():
    """CODE and LIBRARIES are what a fresh interpreter loads for the matrix and its cache."""
    # (what the interpreter loaded before, e.g. by a .pth file of the machine's site-packages, is not the matrix's)
    probe = ("import sys; before = set(sys.modules)\n"
             "import rlbox.image.matrix, rlbox.image.matrix_cache\n"
             "print('\\n'.join(n for n in sys.modules if n.startswith('rlbox')))\n"
             "print('--')\n"
             "print('\\n'.join(n for n, m in list(sys.modules.items()) if '.' not in n and not n.startswith('_')"
             " and n not in sys.stdlib_module_names and n != 'rlbox' and n not in before and getattr(m, '__file__', None)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "launcher"))).stdout
    ours, libraries = out.split("--\n")
    files = set()
    for name in ours.split():
        rel = name.removeprefix("rlbox").lstrip(".").replace(".", "/")
        package = paths.PACKAGE / rel
        files.add(f"{rel}/__init__.py".lstrip("/") if package.is_dir() else f"{rel}.py")
    assert files == set(matrix_cache.CODE)
    assert set(libraries.split()) == set(matrix_cache.LIBRARIES)


def test_cache_dir_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RLBOX_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "rlbox"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "rlbox"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "rlbox"
    monkeypatch.setenv("RLBOX_CACHE", str(tmp_path / "mine"))
    assert paths.cache_dir() == tmp_path / "mine"


def test_images_list_from_the_cache_prints_the_same_and_loads_no_yaml_or_pydantic(tmp_path):
    env = {"RLBOX_CACHE": str(tmp_path / "cache")}
    for args in (("images", "list"), ("images", "list", "--json")):
        cold = rlbox(*args, env=env, check=True)  # the first fills the cache
        warm = subprocess.run([sys.executable, "-X", "importtime", "-m", "rlbox.cli", *args], cwd=REPO,
                              env=dict(os.environ, **env), capture_output=True, text=True, check=True)
        assert warm.stdout == cold.stdout
        loaded = {line.rsplit("|", 1)[1].strip() for line in warm.stderr.splitlines() if line.startswith("import time:")}
        assert "rlbox.image.matrix_cache" in loaded  # the log is read right
        assert not {n for n in loaded if n.split(".")[0] in ("yaml", "pydantic", "pydantic_core")}
        assert "rlbox.image.matrix" not in loaded


def test_a_pre_release_is_marked_in_the_list_and_an_unknown_track_refused(tree, cache):
    """`track: pre-release` (a release on a release candidate) is the list's TRACK; every other release is stable."""
    manifest = tree / "images" / "verl_cpu_09.yaml"
    manifest.write_text(manifest.read_text() + "track: pre-release\n")
    rows = {r["ref"]: r["track"] for r in matrix_cache.rows(tree)}
    assert rows.pop("verl_cpu_09:amd64") == "pre-release" and set(rows.values()) == {"stable"}
    listed = rlbox("images", "list", cwd=tree, env={"RLBOX_ROOT": str(tree), "RLBOX_CACHE": str(cache)}, check=True)
    line = next(li for li in listed.stdout.splitlines() if "verl_cpu_09:amd64" in li)
    assert "pre-release" in line.split() and "TRACK" in listed.stdout.splitlines()[0]
    manifest.write_text(manifest.read_text().replace("track: pre-release", "track: beta"))
    with pytest.raises(RlboxError, match="track"):
        matrix_cache.rows(tree)
