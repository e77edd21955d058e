"""`make rehearse-run` (tools/rehearse-run.py): the pure parts, how it reads a job's output into a
verdict and names what fails (file:line, the exception). The target itself runs the real job on the
flagship's rehearsal image and is not CI (docs/cpu-training.md)."""

from __future__ import annotations

import importlib.util

from conftest import REPO

spec = importlib.util.spec_from_file_location("rehearse_run", REPO / "tools" / "rehearse-run.py")
rr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rr)

RAY_FAILURE = """\
(TaskRunner pid=412) step:1 - global_seqlen/min:162 - actor/pg_loss:0.01
(TaskRunner pid=412) Traceback (most recent call last):
(TaskRunner pid=412)   File "/opt/rlbox/venv/lib/python3.10/site-packages/ray/_private/worker.py", line 2771, in get
(TaskRunner pid=412)     raise value.as_instanceof_cause()
(TaskRunner pid=412) ray.exceptions.RayTaskError(AttributeError): ray::WorkerDict.ref_compute_ref_log_prob() (pid=530, ip=172.30.0.3)
(TaskRunner pid=412)   File "/opt/rlbox/src/verl/verl/single_controller/ray/base.py", line 705, in func
(TaskRunner pid=412)     return getattr(self.worker_dict[key], name)(*args, **kwargs)
(TaskRunner pid=412)   File "/opt/rlbox/src/verl/verl/workers/fsdp_workers.py", line 846, in compute_ref_log_prob
(TaskRunner pid=412)     self.ref_policy.actor_module.shard()
(TaskRunner pid=412)   File "/opt/rlbox/venv/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1940, in __getattr__
(TaskRunner pid=412)     raise AttributeError(
(TaskRunner pid=412) AttributeError: 'FSDPQwen2ForCausalLM' object has no attribute 'shard'
rlbox: job rlbox-rr-train-abc SUCCEEDED
"""


def test_the_first_exception_is_named_with_its_frame_and_verls_frame():
    f = rr.first_failure(RAY_FAILURE)
    assert f == {"exception": "AttributeError", "message": "'FSDPQwen2ForCausalLM' object has no attribute 'shard'",
                 "frame": "torch/nn/modules/module.py:1940 (__getattr__)",
                 "verl_frame": "verl/workers/fsdp_workers.py:846 (compute_ref_log_prob)"}
    plain = 'Traceback (most recent call last):\n  File "/x/torch/distributed/distributed_c10d.py", line 4200, in reduce_scatter_tensor\n' \
            "    work = group._reduce_scatter_base(output, input, opts)\nRuntimeError: ProcessGroupGloo does not support reduce_scatter\n"
    assert rr.first_failure(plain) == {"exception": "RuntimeError", "message": "ProcessGroupGloo does not support reduce_scatter",
                                       "frame": "/x/torch/distributed/distributed_c10d.py:4200 (reduce_scatter_tensor)",
                                       "verl_frame": None}
    assert rr.first_failure("step:1 - a:1\nValueError: no traceback before it\n") is None


def test_the_verdict_needs_the_job_the_restart_the_resume_every_step_and_the_merge():
    out = ("rlbox: restart 1/1: node1 (sim1), the worker, was lost\n"
           "(TaskRunner pid=9) Resuming from /data/checkpoints/grpo-tiny-cpu/global_step_2\n")
    good = rr.judge(0, out, [1, 2, 3, 4, 5], 0, "rlbox: merged step 5 of run rr-train into x", 5)
    assert good["ok"] and good["resumed_from"] == 2 and good["failure"] is None
    assert good["merge_line"] == "rlbox: merged step 5 of run rr-train into x"
    bad = rr.judge(1, RAY_FAILURE, [1], None, "", 5)
    assert not bad["ok"] and bad["failure"]["exception"] == "AttributeError"
    assert [k for k, v in bad["checks"].items() if not v] == list(bad["checks"])  # every check failed
    assert not rr.judge(0, out, [1, 2, 3, 5], 0, "", 5)["ok"]  # a step missing from the metrics
    held = rr.judge(1, "rlbox: error: NPU 5 of sim0 is held by run 'x' (id 1); choose other NPUs\n", [], None, "", 5)
    assert held["failure"] == {"exception": "rlbox error", "message": "NPU 5 of sim0 is held by run 'x' (id 1); choose other NPUs",
                               "frame": "rlbox run", "verl_frame": None}


def test_key_lines_keep_rlboxs_and_verls_milestones_and_cut_step_lines():
    text = ("noise\nrlbox: stand-in: verl CPU shims for verl 796871d (x) [verl-cpu-shims]\n"
            f"(TaskRunner pid=1) step:1 - {'a:1 - ' * 60}\n(TaskRunner pid=1) local_global_step_folder: /data/c/global_step_1\n"
            "more noise\n")
    lines = rr.key_lines(text)
    assert [ln[:40] for ln in lines] == ["rlbox: stand-in: verl CPU shims for verl",
                                         "(TaskRunner pid=1) step:1 - a:1 - a:1 - ",
                                         "(TaskRunner pid=1) local_global_step_fol"]
    assert lines[1].endswith(" ...") and len(lines[1]) == 204
