"""Pure parts of the after-training commands: AISBench summaries (the real tool's files),
config writing, where verl put a run's checkpoints, the rank check."""

from __future__ import annotations

import pytest

from conftest import REPO
from rlbox.training import evaluate as ev
from rlbox.training import merge
from rlbox.cluster.spec import Host, Mount
from rlbox.core.errors import RlboxError

REAL = REPO / "tests" / "fixtures" / "workflow" / "aisbench-3.1.20260630"


def test_parses_what_the_real_aisbench_wrote():
    [csv] = REAL.glob("summary_*.csv")
    [row] = ev.parse_summary_csv(csv.read_text())
    assert (row.dataset, row.version, row.metric, row.mode, row.value) == ("aime2024", "bf198e", "accuracy", "gen", 40.0)
    [row] = ev.parse_summary_table((REAL / "stdout.txt").read_text())
    assert row.value == 40.0 and row.dataset == "aime2024"


GSM8K = REPO / "tests" / "fixtures" / "aisbench-3.1.20260630-gsm8k"


@pytest.mark.parametrize("name, parse", [
    ("summary_*.csv", ev.parse_summary_csv),
    ("summary_*.md", ev.parse_summary_md),
])
def test_parses_the_real_aisbench_gsm8k_summary_files(name, parse):
    """AISBench 3.1.20260630 against vLLM (CPU build, a tiny random model): its own files."""
    [path] = GSM8K.glob(f"*/summary/{name}")
    [row] = parse(path.read_text())
    assert (row.dataset, row.version, row.metric, row.mode, row.value, row.raw) == ("gsm8k", "d486ce", "accuracy", "gen", 0.0, "0.00")
    assert ev.parse_summary(path, "") == [row]


def test_parses_the_real_aisbench_gsm8k_console_output():
    raw = (GSM8K / "stdout.txt").read_text()
    assert "\x1b" in raw  # AISBench draws a progress screen; rlbox strips its escapes
    [row] = ev.parse_summary(None, raw)
    assert (row.dataset, row.version, row.value) == ("gsm8k", "d486ce", 0.0)
    [csv] = GSM8K.glob("*/summary/summary_*.csv")
    assert f"write csv to " in raw and csv.name in raw


def test_the_model_config_rlbox_wrote_for_the_real_run_is_written_again():
    ep = ev.Endpoint.parse("http://127.0.0.1:18431")
    accepted = {"path", "model", "stream", "max_out_len", "retry", "api_key", "host_ip", "host_port", "url",
                "trust_remote_code", "generation_kwargs", "meta_template", "enable_ssl", "verbose"} | ev.BUILDER_KEYS
    fields, dropped = ev.config_fields(ep, max_seq_len=256, max_out_len=64, batch_size=8, generation=ev.GENERATION,
                                       accepted=accepted)
    assert dropped == ["max_seq_len"]
    assert ev.render_config(fields, ep.url) == (GSM8K / "vllm_api_general.py").read_text()


@pytest.mark.parametrize("text, why", [
    ("| a | b |\n|---|---|\n| 1 | 2 |\n", "not an AISBench summary"),
    ("| dataset | version | metric | mode | other |\n|-----|-----|-----|-----|-----|\n| gsm8k | d486ce | accuracy | gen | 1.00 |\n",
     "no column vllm-api-general"),
    ("", "not an AISBench summary"),
])
def test_summary_md_refused(text, why):
    with pytest.raises(ValueError, match=why):
        ev.parse_summary_md(text)


def test_parses_md_with_failed_values():
    [row] = ev.parse_summary_md("| dataset | version | metric | mode | vllm-api-general |\n|----- | ----- | ----- | ----- | -----|\n"
                                "| gsm8k | - | - | - | - |\n")
    assert row.value is None and row.raw == "-"


def test_parses_count_columns_and_failed_runs():
    rows = ev.parse_summary_csv("dataset,version,metric,mode,total_count,vllm-api-general\n"
                                "aime2024,187240,accuracy,gen,30,45.33 (14/30)\n")
    assert rows[0].value == 45.33 and rows[0].version == "187240"
    assert ev.parse_summary_csv("dataset,version,metric,mode,vllm-api-general\naime2024,-,-,-,-\n")[0].value is None
    with pytest.raises(ValueError):
        ev.parse_summary_csv("a,b\n1,2\n")


def test_config_has_the_seed_fields_and_drops_refused_ones():
    ep = ev.Endpoint.parse("http://10.0.0.1:6380", 22528)
    fields, dropped = ev.config_fields(ep, max_seq_len=2048, max_out_len=20480, batch_size=48,
                                       generation=ev.GENERATION, accepted=None)
    text = ev.render_config(fields, ep.url)
    compile(text, "vllm_api_general.py", "exec")
    for piece in ("type=VLLMCustomAPI", "host_ip='10.0.0.1'", "host_port=6380", "max_seq_len=2048", "max_out_len=20480",
                  "batch_size=48", "seed=None", "repetition_penalty=1.03"):
        assert piece in text
    accepted = {"path", "model", "max_out_len", "retry", "host_ip", "host_port", "trust_remote_code",
                "generation_kwargs", "enable_ssl"} | ev.BUILDER_KEYS
    fields, dropped = ev.config_fields(ep, max_seq_len=2048, max_out_len=20480, batch_size=48,
                                       generation=ev.GENERATION, accepted=accepted)
    assert dropped == ["max_seq_len"] and fields["batch_size"] == 48


def test_compare_table_as_the_seed():
    before = {"dataset": "aime2024", "version": "187240", "metric": "accuracy", "mode": "gen", "mean": 38.99}
    rows = ev.compare(before, before | {"mean": 45.33})
    assert rows[1] == ["aime2024", "187240", "accuracy", "gen", "38.99", "45.33", "+6.34"]


def test_checkpoint_dir_from_the_recorded_job():
    assert merge.checkpoint_dir("python3 -m verl.trainer.main_ppo trainer.default_local_dir=/data/ckpt/q")[0] == "/data/ckpt/q"
    path, origin = merge.checkpoint_dir("cd /opt/rlbox/src/verl && python3 -m verl.trainer.main_ppo "
                                        "trainer.project_name=DAPO trainer.experiment_name=Q32")
    assert path == "/opt/rlbox/src/verl/checkpoints/DAPO/Q32" and "default" in origin
    with pytest.raises(RlboxError, match="relative path checkpoints/verl_examples/gsm8k"):
        merge.checkpoint_dir("python3 -m verl.trainer.main_ppo data.x=1")
    mounts = (Mount("/mnt/disk1", "/data"), Mount("/mnt/ck", "/data/ckpt"))
    assert merge.host_path("/data/ckpt/q", mounts) == "/mnt/ck/q"
    assert merge.host_path("/data/x", mounts) == "/mnt/disk1/x"
    assert merge.host_path("/opt/x", mounts) is None


def test_rank_check_names_node_and_rank():
    loc = merge.Location("/ckpt", "test", ("/a", "/b"))
    nodes = [merge.NodeRef(0, Host("h0"), ()), merge.NodeRef(1, Host("h1"), ())]
    listings = [merge.parse_listing(nodes[0], "/a", {"shards": [["model_world_size_4_rank_0.pt", 1], ["model_world_size_4_rank_1.pt", 1]],
                                                     "fsdp_config": {"world_size": 4}, "huggingface": True, "steps": [3]}),
                merge.parse_listing(nodes[1], "/b", {"shards": [["model_world_size_4_rank_2.pt", 1]], "steps": [3]})]
    with pytest.raises(RlboxError, match=r"rank 3 of 4 is missing: model_world_size_4_rank_3.pt is on no node; "
                                         r"it should be on node1 \(h1\) in /b/global_step_3/actor"):
        merge.check(listings, 3, loc)
    listings[1].shards[3] = ("model_world_size_4_rank_3.pt", 1)
    held = merge.check(listings, 3, loc)
    assert held.world == 4 and held.merge_at == 0 and held.owner[3] == 1


def test_serve_on_a_cluster_host_keeps_the_cluster_files_open_files_limit(tmp_path):
    """`rlbox serve --cluster FILE` serves on the file's host with its ssh settings and, as `rlbox run` does, the
    file's nofile (a testbed host's engine refuses a container above this machine's hard limit:
    "error setting rlimit type 7: operation not permitted")."""
    from rlbox.image import matrix
    from rlbox.training import serve as serve_mod

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - host: 10.9.0.1\n  - host: 10.9.0.2\nnofile: 4096\n")
    p = serve_mod.plan_request(lambda: matrix.load(REPO), model="/data/m", hosts=None, sim=False, image="img:1",
                               image_ref=lambda image, what: image, hardware="a3", tp=1, dp=1, max_model_len=512,
                               port=6380, served_model_name="m", name="s", runs_dir=tmp_path, mounts=[], envs=[],
                               dry_run=True, cluster=cluster, node=1, memory_fraction=0.05)
    assert p.host.name == "10.9.0.2" and ("nofile", 4096, 4096) in p.container.ulimits
    assert "--gpu-memory-utilization 0.05" in " ".join(p.container.command)
    with pytest.raises(RlboxError, match="--node 2: .* has 2 node"):
        serve_mod.plan_request(lambda: matrix.load(REPO), model="/data/m", hosts=None, sim=False, image="img:1",
                               image_ref=lambda image, what: image, hardware="a3", tp=1, dp=1, max_model_len=512,
                               port=6380, served_model_name="m", name="s", runs_dir=tmp_path, mounts=[], envs=[],
                               dry_run=True, cluster=cluster, node=2)
