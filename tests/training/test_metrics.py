"""`rlbox metrics`: verl's step lines read back from job logs as verl and Ray really print them."""

from __future__ import annotations

import csv
import io
import json
import numbers
import os
import pprint
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, rlbox
from rlbox.training import metrics
from rlbox.verl import glossary as verl_glossary
from rlbox.verl import steplog
from rlbox.core.errors import RlboxError

# Verbatim from seed 001 §4.6 ("分析训练日志"): step 1 of the 4xA3 DAPO Qwen3-32B run.
SEED_LINE = (
    "step:1 - global_seqlen/min:33676 - global_seqlen/max:326471 - global_seqlen/minmax_diff:292795 -"
    " global_seqlen/balanced_min:120597 - global_seqlen/balanced_max:120614 - global_seqlen/mean:1206"
    "08.5 - actor/entropy:0.31534484028816223 - actor/pg_loss:0.06752552084314327 - actor/pg_clipfrac"
    ":9.875712657958502e-05 - actor/ppo_kl:-3.158243763815941e-05 - actor/pg_clipfrac_lower:0.0 - act"
    "or/grad_norm:0.04106094129383564 - perf/mfu/actor:0.0 - perf/max_memory_allocated_gb:60.25361061"
    "0961914 - perf/max_memory_reserved_gb:79.15234375 - perf/cpu_memory_used_gb:533.7807006835938 - "
    "actor/lr:0.0 - critic/score/mean:-0.4141845703125 - critic/score/max:1.0 - critic/score/min:-2.0"
    " - critic/rewards/mean:-0.4141845703125 - critic/rewards/max:1.0 - critic/rewards/min:-2.0 - cri"
    "tic/advantages/mean:-0.058039188385009766 - critic/advantages/max:3.7499923706054688 - critic/ad"
    "vantages/min:-2.6211581230163574 - critic/returns/mean:-0.058039188385009766 - critic/returns/ma"
    "x:3.7499923706054688 - critic/returns/min:-2.6211581230163574 - response_length/mean:7385.140625"
    " - response_length/max:20480.0 - response_length/min:1190.0 - response_length/clip_ratio:0.03906"
    "25 - prompt_length/mean:152.890625 - prompt_length/max:606.0 - prompt_length/min:75.0 - prompt_l"
    "ength/clip_ratio:0.0 - timing_s/start_profile:0.0003245100001549872 - timing_s/generate_sequence"
    "s:1081.803466796875 - timing_s/reshard:8.664657592773438 - timing_s/gen:1315.2451746799998 - tim"
    "ing_s/reward:2.444457609999972 - timing_s/old_log_prob:116.21133135000036 - timing_s/adv:0.07527"
    "759000004153 - timing_s/update_actor:303.92059642999993 - timing_s/step:1738.0274970199998 - tim"
    "ing_s/stop_profile:0.00010573000008662348 - timing_per_token_ms/gen:0.17391938503519522 - timing"
    "_per_token_ms/adv:9.75231715634179e-06 - timing_per_token_ms/update_actor:0.03937333868855635 - "
    "perf/total_num_tokens:7718944 - perf/time_per_step:1738.0274970199998 - perf/throughput:69.39389"
    "63605546 - train/num_gen_batches:1"
)

# Seed 000 §2.4 shows the same line wrapped at the separators, with elided keys.
SEED_000_EXCERPT = """step:1 - actor/grad_norm:0.04106094129383564 - 
……
critic/rewards/mean:-0.4141845703125 -
response_length/mean:7385.140625 - 
……
prompt_length/mean:152.890625 - 
……
timing_s/generate_sequences:1081.803466796875 - 
timing_s/gen:1315.2451746799998 - 
……
timing_s/update_actor:303.92059642999993 - 
timing_s/step:1738.0274970199998 - 
……
timing_per_token_ms/gen:0.17391938503519522 - 
……
perf/throughput:69.3938963605546 
……
"""


def concat_dict_to_str(data: dict, step) -> str:
    """verl's console logger, as in verl/utils/logger/aggregate_logger.py (verl@796871d7 and HEAD)."""
    output = [f"step:{step}"]
    for k, v in data.items():
        if isinstance(v, numbers.Number):
            output.append(f"{k}:{pprint.pformat(v)}")
    return " - ".join(output)


CYAN, RESET = "\x1b[36m", "\x1b[0m"  # Ray's colorama prefix colours (ray/_private/worker.py)


def ray_line(text: str, actor: str = "TaskRunner", pid: int = 48213, ip: str | None = "172.30.9.11") -> str:
    return f"{CYAN}({actor} pid={pid}{', ip=' + ip if ip else ''}){RESET} {text}"


def step_values(step: int) -> dict:
    return {
        "critic/rewards/mean": np.float64(-0.5 + 0.125 * step),
        "critic/score/mean": np.float64(-0.5 + 0.125 * step),
        "response_length/mean": np.float64(800.0 + 12.5 * step),
        "perf/throughput": 60.0 + step,
        "timing_s/step": np.float32(90.5),
        "actor/entropy": np.float64(0.5 / step),
        "actor/lr": 1e-06,
        "perf/total_num_tokens": np.int64(7718944 + step),
        "training/epoch": 0,
        "actor/pg_clipfrac": np.float64("nan") if step == 3 else np.float64(0.0),
        "val-core/openai/gsm8k/reward/mean@1": 0.25,
        "timing/not_a_number": "skipped",  # verl drops non-numbers
    }


def expected(step: int) -> dict:
    v = step_values(step)
    return {k: (x.item() if hasattr(x, "item") else x) for k, x in v.items() if isinstance(x, numbers.Number)}


def generated_log() -> str:
    """Eight steps as a verl job under Ray writes them, with everything around them."""
    out = [
        "2025-11-07 10:00:01,123\tINFO job_manager.py:531 -- Runtime env is setting up.",
        ray_line("Using LocalLogger is deprecated. The constructor API will change", ip=None),
        f"{CYAN}(raylet){RESET} [2025-11-07 10:00:05,000 W 1 1] Failed to detect NPU type",
        ray_line("Training Progress:   0%|          | 0/8 [00:00<?, ?it/s]\rTraining Progress:  12%|#2        | 1/8"),
    ]
    for step in range(1, 9):
        line = concat_dict_to_str(step_values(step), step)
        if step == 2:  # Ray's deduplication repeats the latest instance with a suffix
            out += [ray_line(line), ray_line(line) + f" {CYAN}[repeated 2x across cluster]{RESET}"]
        elif step == 4:  # a vLLM worker's line nested in an actor's prefix, then the step cut by a terminal
            out.append(f"{CYAN}(vLLMHttpServer pid=3847687){RESET} {CYAN}(Worker_TP1 pid=3849557){RESET} INFO step:done")
            wrapped = textwrap.wrap(ray_line(line), width=83, break_long_words=True, break_on_hyphens=False)
            out += wrapped
        elif step == 5:  # cut at a fixed column (a `fold -w 97` copy from a terminal)
            text = ray_line(line)
            out += [text[i:i + 97] for i in range(0, len(text), 97)]
        elif step == 6:  # a tqdm carriage return before the line
            out.append(ray_line("Training Progress:  62%|######2   | 5/8\r") + line)
        else:
            out.append(ray_line(line))
        out.append(ray_line(f"local_global_step_folder: /ckpt/global_step_{step}"))
    out.append("Traceback (most recent call last):")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
def test_the_seed_step_line_parses_whole_and_every_key_is_explained():
    seed = REPO.parent / "shared" / "seeds" / "001_515b449b55797dd9.txt"
    if seed.is_file():  # beside a checkout (CI's clone, /work/main) shared/ holds the seeds
        assert SEED_LINE in seed.read_text()
    m = metrics.parse(SEED_LINE)
    assert m.steps == [1] and len(m.keys) == 54
    row = m.rows[1]
    assert row["critic/rewards/mean"] == -0.4141845703125
    assert row["response_length/mean"] == 7385.140625
    assert row["perf/throughput"] == 69.3938963605546
    assert row["timing_s/step"] == 1738.0274970199998
    assert row["actor/pg_clipfrac"] == 9.875712657958502e-05
    assert row["perf/total_num_tokens"] == 7718944 and isinstance(row["perf/total_num_tokens"], int)
    assert row["train/num_gen_batches"] == 1
    _, glossary = verl_glossary.glossary()
    assert [k for k in m.keys if k not in glossary] == []


@pytest.mark.parametrize("width", range(20, 141, 3))
def test_the_seed_line_cut_at_any_column_parses_the_same(width):
    whole = metrics.parse(SEED_LINE).rows
    folded = "\n".join(SEED_LINE[i:i + width] for i in range(0, len(SEED_LINE), width))
    assert metrics.parse(folded).rows == whole


def test_seed_000_wrapped_excerpt_with_elisions():
    m = metrics.parse(SEED_000_EXCERPT)
    assert m.rows == {1: {
        "actor/grad_norm": 0.04106094129383564, "critic/rewards/mean": -0.4141845703125,
        "response_length/mean": 7385.140625, "prompt_length/mean": 152.890625,
        "timing_s/generate_sequences": 1081.803466796875, "timing_s/gen": 1315.2451746799998,
        "timing_s/update_actor": 303.92059642999993, "timing_s/step": 1738.0274970199998,
        "timing_per_token_ms/gen": 0.17391938503519522, "perf/throughput": 69.3938963605546,
    }}


def test_ray_job_log_with_ansi_prefixes_numpy_reprs_duplicates_and_wraps():
    text = generated_log()
    if int(np.__version__.split(".")[0]) >= 2:  # numpy 2's repr, which pformat uses
        assert "critic/rewards/mean:np.float64(-0.375) - " in text
    assert "\x1b[36m(TaskRunner pid=48213, ip=172.30.9.11)\x1b[0m step:1 - " in text
    m = metrics.parse(text)
    assert m.steps == list(range(1, 9))
    for step in m.steps:
        got, want = m.rows[step], expected(step)
        nan_keys = {k for k, v in want.items() if v != v}
        assert {k: v for k, v in got.items() if k not in nan_keys} == {k: v for k, v in want.items() if k not in nan_keys}
        assert all(got[k] != got[k] for k in nan_keys)
    assert m.lines == 9  # step 2 twice
    assert "timing/not_a_number" not in m.keys


def test_a_step_seen_again_keeps_the_latest_values():
    m = metrics.parse("step:3 - a:1 - b:2\nstep:4 - a:5\nstep:3 - a:7\n")
    assert m.rows == {3: {"a": 7, "b": 2}, 4: {"a": 5}}


def test_lines_after_a_whole_step_line_are_not_glued_to_it():
    text = "step:1 - a/b:1 - c:0.5\nDone\nstep:2 - a/b:2 - c:np.float64(0.25)\n  frame #52: ray::core\n-\nstep:3 - a/b:3\n"
    assert metrics.parse(text).rows == {1: {"a/b": 1, "c": 0.5}, 2: {"a/b": 2, "c": 0.25}, 3: {"a/b": 3}}


def test_values_as_pformat_writes_them():
    assert [steplog.value(t) for t in ("3", "-2.0", "1e-06", "np.float64(0.25)", "np.int64(7)", "True", "np.float32(nan)")][:6] \
        == [3, -2.0, 1e-06, 0.25, 7, 1]
    assert steplog.value("tensor(0.5, device='npu:0')") is None


# -- the command ------------------------------------------------------------------------------
@pytest.fixture
def run_with_log(tmp_path):
    """runs/t-m laid out as `rlbox run` leaves it: state.json naming the job's log."""
    runs = tmp_path / "runs"
    folder = runs / "t-m"
    folder.mkdir(parents=True)
    old = folder / "0badc0de.log"
    old.write_text(ray_line(concat_dict_to_str({"critic/rewards/mean": 9.0}, 1)) + "\n")
    os.utime(old, (1, 1))
    log = folder / "5eed0001.log"
    log.write_text(generated_log())
    (folder / "state.json").write_text(json.dumps({"run": "t-m", "run_id": "5eed0001", "log": str(log), "phase": "removed"}))
    return runs, log


@pytest.fixture
def matplotlib_installed():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("matplotlib missing under CI=true: it is in rlbox's [test] extra")
        pytest.skip("matplotlib not installed (pip install 'rlbox[plot]')")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_table_csv_json_and_plot_of_a_run(run_with_log, tmp_path, matplotlib_installed):
    runs, log = run_with_log
    out_csv, out_png = tmp_path / "m.csv", tmp_path / "curves.png"
    proc = rlbox("metrics", "t-m", "--runs-dir", runs, "--csv", out_csv, "--plot", out_png)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{log}: 8 step(s) (1..8), {len(expected(1))} metrics"
    assert lines[1].split() == ["STEP", "CRITIC/REWARDS/MEAN", "RESPONSE_LENGTH/MEAN", "PERF/THROUGHPUT", "TIMING_S/STEP"]
    assert lines[2].split() == ["1", "-0.375", "812.5", "61", "90.5"]
    assert lines[9].split() == ["8", "0.5", "900", "68", "90.5"]
    assert lines[10].startswith("critic/rewards/mean: -0.3125 (mean of the first 2 step(s)) -> 0.4375 (last 2): rising")
    # CSV: every key, every step
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    assert set(rows[0]) == {"step", *expected(1)}
    assert float(rows[4]["actor/entropy"]) == 0.1 and rows[0]["perf/total_num_tokens"] == "7718945"
    assert rows[2]["actor/pg_clipfrac"] == "nan"
    # PNG: a real PNG of the expected size, the four watched curves
    assert png_size(out_png) == (1200, 800)
    assert "plotted critic/rewards/mean, response_length/mean, perf/throughput, timing_s/step" in proc.stderr
    # JSON
    proc = rlbox("metrics", "t-m", "--runs-dir", runs, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["log"] == str(log) and data["steps"] == 8
    assert data["records"][0] == {"step": 1, **expected(1)}
    assert data["records"][2]["actor/pg_clipfrac"] is None  # NaN is not JSON


def test_plot_draws_the_four_watched_curves(run_with_log, tmp_path, matplotlib_installed):
    _, log = run_with_log
    m = metrics.parse_file(log)
    drawn = metrics.plot(m, tmp_path / "p.png")
    assert (drawn["width"], drawn["height"]) == png_size(tmp_path / "p.png") == (1200, 800)
    axes = drawn["figure"].axes
    assert [a.get_title() for a in axes] == ["critic/rewards/mean  (should rise)", "response_length/mean",
                                             "perf/throughput", "timing_s/step"]
    rewards = axes[0].lines[0]
    assert list(rewards.get_xdata()) == list(range(1, 9))
    assert list(rewards.get_ydata()) == [-0.5 + 0.125 * s for s in range(1, 9)]
    assert [p["points"] for p in drawn["panels"]] == [8, 8, 8, 8]


def test_keys_job_and_log_file_selection(run_with_log, tmp_path):
    runs, log = run_with_log
    proc = rlbox("metrics", "t-m", "--runs-dir", runs, "--keys", "actor/entropy,perf/total_num_tokens", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records"][1] == {"step": 2, "actor/entropy": 0.25, "perf/total_num_tokens": 7718946}
    proc = rlbox("metrics", "t-m", "--runs-dir", runs, "--job", "rlbox-t-m-0badc0de")
    assert proc.returncode == 0 and proc.stdout.splitlines()[2].split() == ["1", "9", "-", "-", "-"]
    proc = rlbox("metrics", log, "--keys", "critic/score/mean")
    assert proc.returncode == 0 and proc.stdout.splitlines()[1].split() == ["STEP", "CRITIC/SCORE/MEAN"]


def test_explain_a_metric_a_group_and_everything():
    proc = rlbox("metrics", "--explain", "critic/rewards/mean")
    assert proc.returncode == 0
    assert proc.stdout.startswith("critic/rewards/mean, critic/rewards/max, critic/rewards/min: The reward signal")
    assert "should trend upwards" in proc.stdout
    proc = rlbox("metrics", "--explain", "timing_per_token_ms")
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 4
    proc = rlbox("metrics", "--explain")
    assert proc.returncode == 0 and "perf/throughput: End-to-end throughput." in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("(68 metrics; from seed 001 §5.2")


@pytest.mark.parametrize("args, message", [
    (["--explain", "critic/reward/mean"],
     "unknown metric 'critic/reward/mean'; did you mean critic/rewards/mean, critic/rewards/min, critic/rewards/max?"),
    (["nope", "--runs-dir", "{runs}"], "no run named 'nope' under {runs}"),
    (["t-m", "--runs-dir", "{runs}", "--keys", "critic/reward/mean"], "metric 'critic/reward/mean' is not in {log}; nearest: critic/rewards/mean"),
    (["t-m", "--runs-dir", "{runs}", "--job", "feedf00d"], "run 't-m' has no job 'feedf00d' under {runs}/t-m (jobs: 0badc0de, 5eed0001)"),
    (["{empty}"], "{empty}: no verl step lines"),
    ([], "rlbox metrics: give RUN (a run name or a log file), or --explain [KEY]"),
])
def test_bad_input_is_one_line(run_with_log, tmp_path, args, message):
    runs, log = run_with_log
    empty = tmp_path / "empty.log"
    empty.write_text("Traceback (most recent call last):\n  nothing here\n")
    fill = {"runs": runs, "log": log, "empty": empty}
    proc = rlbox("metrics", *[a.format(**fill) for a in args])
    assert proc.returncode == 2
    assert proc.stderr.startswith("rlbox: error: " + message.format(**fill))
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr.replace(str(empty), "")


def test_plot_without_matplotlib_names_the_extra(run_with_log, tmp_path, monkeypatch):
    runs, _ = run_with_log
    code = ("import sys; sys.modules['matplotlib'] = None; from rlbox.cli import main; "
            f"sys.argv = ['rlbox', 'metrics', 't-m', '--runs-dir', {str(runs)!r}, '--plot', {str(tmp_path / 'x.png')!r}]; main()")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "rlbox: error: --plot needs matplotlib: pip install 'rlbox[plot]'\n"
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(RlboxError, match=r"pip install 'rlbox\[plot\]'"):
        metrics.plot(metrics.parse(SEED_LINE), tmp_path / "y.png")
    assert not (tmp_path / "y.png").exists()
