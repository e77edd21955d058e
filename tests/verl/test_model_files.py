"""The model's small files for verl's checks (rlbox.verl.model_files): which files, from which source,
into a folder whose names stay inside it; and validation running verl's checks again against them.
Pure tables, a tar made here, a hub served on loopback, and ssh to a closed port (no testbed)."""

from __future__ import annotations

import http.server
import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from rlbox.core.errors import RlboxError
from rlbox.verl import model_files as mf, outcome, own as verl_own, validate
from rlbox.verl.model_files import Missing, Source, Want

# -- which files --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, kept", [
    ("config.json", True), ("generation_config.json", True), ("tokenizer.json", True), ("tokenizer_config.json", True),
    ("tokenizer.model", True), ("special_tokens_map.json", True), ("vocab.json", True), ("vocab.txt", True),
    ("merges.txt", True), ("chat_template.jinja", True), ("chat_template.json", True), ("added_tokens.json", True),
    ("preprocessor_config.json", True), ("configuration_deepseek.py", True), ("tokenization_kimi.py", True),
    ("qwen.tiktoken", True),
    ("model.safetensors", False), ("model-00001-of-00004.safetensors", False), ("model.safetensors.index.json", False),
    ("pytorch_model.bin", False), ("vocab.bin", False), ("optimizer.pt", False), ("modeling_deepseek.py", False),
    ("README.md", False), (".gitattributes", False), ("../config.json", False), ("/etc/passwd", False),
    ("sub/config.json", False), ("..", False), ("config.json\n", False), ("-rf", False), ("tokenizer..json", False),
])
def test_only_the_small_files_verl_reads_are_wanted(name, kept):
    assert mf.wanted([name]) == ([name] if kept else [])


def test_a_listing_keeps_the_wanted_names_of_its_paths():
    listing = "/m/config.json\n/m/model.safetensors\n/m/tokenizer.json\n\n/m/README.md\n"
    assert mf.names_of(listing) == ["config.json", "tokenizer.json"]


# -- from which source ----------------------------------------------------------------------------

HERE = {"/local/tiny", "/srv/here/tiny"}
MOUNTS = (("/srv/models", "/models"), ("/srv/here", "/here"), ("/nfs/big", "/models/big"))


def plan(paths, **kw):
    return mf.plan(paths, here=lambda p: p in HERE, **kw)


@pytest.mark.parametrize("path, kw, sources, why", [
    # under a mount: the mount's source on the head, over ssh
    ("/models/qwen", dict(head="h1", mounts=MOUNTS), [Source("host", "h1", "/srv/models/qwen")], ""),
    # the deepest mount wins
    ("/models/big/q", dict(head="h1", mounts=MOUNTS), [Source("host", "h1", "/nfs/big/q")], ""),
    ("/models/../etc", dict(head="h1", mounts=MOUNTS), [], "under none"),
    # the mount's source is a folder of this machine: read here
    ("/here/tiny", dict(head="h1", mounts=MOUNTS), [Source("here", "this machine", "/srv/here/tiny")], ""),
    # under a mount but no cluster given
    ("/models/qwen", dict(mounts=MOUNTS), [], "not on this machine (give the cluster"),
    # under no mount: only the image can hold it
    ("/opt/m", dict(head="h1", mounts=MOUNTS, image="img"), [Source("image", "img", "/opt/m")], ""),
    ("/opt/m", dict(head="h1", mounts=MOUNTS), [], "only an image could hold it"),
    # a hub name: the hub
    ("Qwen/Qwen2.5-0.5B", dict(head="h1", mounts=MOUNTS, hub="https://hub"), [Source("hub", "https://hub", "Qwen/Qwen2.5-0.5B")], ""),
    ("Qwen/Qwen2.5-0.5B", dict(head="h1", mounts=MOUNTS), [], "neither an absolute path nor a hub name"),
    ("~/models/x", dict(head="h1", mounts=MOUNTS, hub="https://hub"), [], "neither"),
    ("../../etc", dict(head="h1", mounts=MOUNTS, hub="https://hub"), [], "neither"),
])
def test_each_path_gets_its_sources_in_order(path, kw, sources, why):
    (want,) = plan({"actor_rollout_ref.model.path": path}, **kw)
    assert list(want.sources) == sources
    assert why in want.why_none and bool(want.why_none) == bool(why)


def test_a_folder_here_is_read_as_it_is_unless_the_checks_run_in_an_image():
    paths = {"actor_rollout_ref.model.path": "/local/tiny", "critic.model.path": "/local/tiny"}
    assert plan(paths) == []
    assert plan(paths, image="img") == [Want("/local/tiny", ("actor_rollout_ref.model.path", "critic.model.path"),
                                             (Source("here", "this machine", "/local/tiny"),))]


def test_the_model_keys_are_read_from_the_composed_config():
    config = {"actor_rollout_ref.model.path": "/m", "critic.model.path": "/m", "critic.model.tokenizer_path": None,
              "reward_model.model.path": "", "actor_rollout_ref.model.use_shm": False, "data.path": "/d",
              "actor_rollout_ref.model.hf_config_path": "/c"}
    assert mf.model_paths(config, config.get) == {"actor_rollout_ref.model.path": "/m", "critic.model.path": "/m",
                                                   "actor_rollout_ref.model.hf_config_path": "/c"}


def test_overrides_point_the_fetched_keys_at_the_copy_as_one_string():
    paths = {"a.model.path": "/m", "b.model.path": "/other"}
    assert mf.overrides({"/m": "/tmp/x y/model-0"}, paths) == ["++a.model.path='/tmp/x y/model-0'"]


def test_the_commands_are_argv_with_the_cap_and_refuse_a_relative_folder():
    assert mf.find_argv("/srv/m") == ["find", "-L", "/srv/m", "-maxdepth", "1", "-type", "f", "-size", "-65537k"]
    assert mf.tar_argv("/srv/m", ["config.json"]) == ["tar", "-C", "/srv/m", "-chf", "-", "--", "config.json"]
    with pytest.raises(RlboxError, match="not absolute"):
        mf.find_argv("-rf")


# -- into a folder whose names stay inside it -------------------------------------------------------

def tar_of(*members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/passwd"
            info.size = len(body) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(body) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


def test_extract_writes_what_was_asked(tmp_path):
    data = tar_of(("config.json", b"{}", tarfile.REGTYPE), ("tokenizer.json", b"[]", tarfile.REGTYPE))
    assert mf.extract(data, tmp_path / "m", ["config.json", "tokenizer.json"], "h1") == ["config.json", "tokenizer.json"]
    assert (tmp_path / "m" / "config.json").read_bytes() == b"{}"


@pytest.mark.parametrize("member, asked, refusal", [
    (("../evil.json", b"x", tarfile.REGTYPE), ["../evil.json"], "not a file that was asked for"),
    (("/etc/cron.d/x", b"x", tarfile.REGTYPE), ["config.json"], "not a file that was asked for"),
    (("sub/config.json", b"x", tarfile.REGTYPE), ["config.json"], "not a file that was asked for"),
    (("model.safetensors", b"x", tarfile.REGTYPE), ["config.json"], "not a file that was asked for"),
    (("config.json", b"", tarfile.SYMTYPE), ["config.json"], "not a regular file"),
    (("config.json", b"", tarfile.DIRTYPE), ["config.json"], "not a regular file"),
])
def test_extract_refuses_what_could_land_outside_or_was_not_asked(tmp_path, member, asked, refusal):
    with pytest.raises(RlboxError, match=refusal):
        mf.extract(tar_of(member), tmp_path / "m", asked, "h1")
    assert not (tmp_path / "evil.json").exists() and not list((tmp_path / "m").iterdir())


def test_extract_refuses_a_file_over_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(mf, "MAX_FILE", 4)
    with pytest.raises(RlboxError, match="over the cap"):
        mf.extract(tar_of(("config.json", b"12345", tarfile.REGTYPE)), tmp_path, ["config.json"], "h1")
    with pytest.raises(RlboxError, match="not a tar archive"):
        mf.extract(b"not a tar" * 100, tmp_path, ["config.json"], "h1")


# -- the sources in turn, one line per path ----------------------------------------------------------

def test_each_path_comes_from_its_first_source_that_has_it_and_the_line_says_which(tmp_path):
    wants = [Want("/models/q", ("critic.model.path",), (Source("host", "h1", "/srv/q"), Source("hub", "https://hub", "q/q"))),
             Want("/opt/x", ("actor_rollout_ref.model.path",), (), "it is under none of the run's mounts")]

    def host(source, dest):
        raise Missing(f"{source.label}: No such file or directory")

    def hub(source, dest):
        dest.mkdir(parents=True)
        (dest / "config.json").write_text("{}")
        return ["config.json"]

    got = mf.fetch(wants, tmp_path, {"host": host, "hub": hub})
    assert got.copies == {"/models/q": str(tmp_path / "model-0")}
    assert got.lines == ("the model's files of /models/q (critic.model.path): config.json (1 kB) from the hub "
                         "https://hub (q/q)",
                         "the model's files of /opt/x: not fetched: it is under none of the run's mounts")
    assert got.sources == ("/models/q from https://hub",)

    def down(source, dest):
        raise RlboxError("the model's files: cannot reach h1 over ssh: Connection refused")

    with pytest.raises(RlboxError, match="cannot reach h1"):
        mf.fetch(wants, tmp_path, {"host": down, "hub": hub})


class Hub:
    """Hugging Face's two URLs on loopback: /api/models/REPO (the listing) and /REPO/resolve/main/NAME."""

    def __init__(self, repo: str, files: dict[str, bytes]):
        listing = json.dumps({"siblings": [{"rfilename": n} for n in files]}).encode()
        self.gets: list[str] = []
        gets = self.gets

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                gets.append(self.path)
                name = self.path.rpartition("/")[2]
                body = listing if self.path == f"/api/models/{repo}" else \
                    files.get(name) if self.path == f"/{repo}/resolve/main/{name}" else None
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_from_the_hub_only_the_wanted_top_level_files_are_asked_for(tmp_path):
    hub = Hub("org/m", {"config.json": b"{}", "model.safetensors": b"W" * 100, "sub/config.json": b"x",
                        "tokenizer.json": b"[]"})
    try:
        names = mf.from_hub(Source("hub", hub.url, "org/m"), tmp_path)
        assert names == ["config.json", "tokenizer.json"]
        assert not any("safetensors" in g for g in hub.gets) and sorted(p.name for p in tmp_path.iterdir()) == names
        with pytest.raises(Missing, match="answers 404"):
            mf.from_hub(Source("hub", hub.url, "org/other"), tmp_path)
    finally:
        hub.server.shutdown()
        hub.server.server_close()
    with pytest.raises(Missing, match=r"^the hub http://127.0.0.1:\d+ is not reachable from here \(ConnectionError\)$"):
        mf.from_hub(Source("hub", hub.url, "org/m"), tmp_path, timeout=2)


# -- validation: verl's checks again, against the copy --------------------------------------------------

def verl_tree(tmp_path: Path) -> validate.VerlTree:
    cfg = tmp_path / "verl" / "trainer" / "config"
    cfg.mkdir(parents=True)
    (cfg / "ppo_trainer.yaml").write_text("trainer:\n  device: npu\n  nnodes: 1\n  n_gpus_per_node: 8\n"
                                          "critic:\n  model:\n    path: ~/models/x\n")
    (tmp_path / "verl" / "trainer" / "main_ppo.py").write_text(
        '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\n')
    return validate.VerlTree(tmp_path, "verl 9.9.9 wheel", version="9.9.9")


STOPPED = verl_own.Verdict("9.9.9", ("validate_config",), ("validate_config stopped on the model's files (x)",), None, None)


def test_when_verls_checks_stop_on_the_model_its_files_are_fetched_and_the_checks_run_again(tmp_path):
    tree, asked, given = verl_tree(tmp_path), [], []

    def own(tree, req):
        asked.append(req)
        if len(asked) == 1:
            return STOPPED
        assert Path(req["model_root"], "model-0", "config.json").is_file()  # the copy is there while verl reads it
        return verl_own.Verdict("9.9.9", ("validate_config",), (), "ValueError: critic batch", "verl/c.py:1")

    def fetch_model(paths, dest):
        given.append(paths)
        return mf.fetch(mf.plan(paths, here=lambda p: False, head="h1", mounts=(("/srv", "/data"),)), dest,
                        {"host": lambda s, d: mf.extract(tar_of(("config.json", b"{}", tarfile.REGTYPE)), d,
                                                         ["config.json"], s.label)})

    argv = ["python3", "-m", "verl.trainer.main_ppo", "critic.model.path=/data/tiny"]
    found = validate.examine(tree, argv, 1, 8, own=own, fetch_model=fetch_model)
    assert given == [{"critic.model.path": "/data/tiny"}]
    assert asked[1]["overrides"][-1] == f"++critic.model.path={asked[1]['model_root']}/model-0"
    assert not Path(asked[1]["model_root"]).exists()  # the temporary folder is gone
    assert found.verdict == outcome.INVALID and "critic batch" in str(found.problems[-1])
    assert found.model_files == ("the model's files of /data/tiny (critic.model.path): config.json (1 kB) from "
                                 "h1:/srv/tiny over ssh",)
    assert "the model's files of /data/tiny from h1" in outcome.summary(found, "JOB")
    assert found.notes()[2] == found.model_files[0]  # after what ran

    # nothing fetched: the first verdict stands, and the line says why
    asked.clear()
    idle = validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo", "critic.model.path=/opt/m"], 1, 8, own=own,
                            fetch_model=lambda paths, dest: mf.fetch(mf.plan(paths, here=lambda p: False), dest, {}))
    assert len(asked) == 1 and idle.verdict == outcome.PARTLY
    assert idle.model_files == ("the model's files of /opt/m: not fetched: it is under none of the run's mounts, so "
                                "only an image could hold it (give --image, or the run's --mount)",)
    assert "the model's files" not in outcome.summary(idle, "JOB").split("; not checked")[0]


def test_an_unreachable_head_is_one_line_naming_it(tmp_path):
    from rlbox.cluster.preflight import model_head

    tree = verl_tree(tmp_path)
    fetch_model = model_head.fetcher(hosts="root@127.0.0.1:1", cluster_file=None, mounts=["/srv:/data"], image=None,
                                     client_factory=None)
    with pytest.raises(RlboxError, match=r"^the model's files: cannot reach 127.0.0.1 over ssh: .*refused"):
        validate.examine(tree, ["python3", "-m", "verl.trainer.main_ppo", "critic.model.path=/data/tiny"], 1, 8,
                         own=lambda t, r: STOPPED, fetch_model=fetch_model)
