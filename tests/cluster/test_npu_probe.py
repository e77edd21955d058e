"""The NPU probe's verdict (`probe.verdict`, pure) over per-node reports: one table row per way a
node's workers would see other NPUs than planned. No engine, no Ray. The probe run on testbed
hosts, with a wrong value injected for one host: tests/testbed/test_npu_checks_on_testbed.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import REPO
from rlbox.cluster import launch, probe
from rlbox.cluster.plan import NpuPolicy


@pytest.fixture(scope="module")
def plan():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLBOX_ROOT", str(REPO))
        p, _ = launch.prepare(launch.RunRequest(hosts="10.0.0.1,10.0.0.2", image="verl_pt27_25rc3:a3-arm", devices="4-7",
                                                name="t-probe", runs_dir=Path("/nonexistent/runs"), dry_run=True, nofile=65536,
                                                command=["python3", "-m", "verl.trainer.main_ppo"]))
    return p


def good(node: int, **change) -> dict:
    """What a worker on a node fit for the plan (NPUs 4-7, the flagship's noset policy) reports."""
    r = {"node": str(node), "ip": f"10.0.0.{node + 1}", "npus": 4, "visible": "0,1,2,3", "noset": "1",
         "ray_ids": ["0", "1", "2", "3"], "davinci": [4, 5, 6, 7], "torch_npu": 4}
    return r | change


def test_the_flagship_release_sets_its_policy_on_every_node(plan):
    assert plan.npu_policy is not None and plan.npu_policy.noset and "multi_node" in plan.npu_policy.follows
    for n in plan.nodes:
        env = dict(n.container.env)
        assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
        assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"  # the container holds davinci4-7 only


def test_a_healthy_cluster_has_no_finding(plan):
    assert probe.verdict(plan, [good(0), good(1)]) == []
    # the reports come back from the job's log, among Ray's own lines
    import json
    log = "INFO job_manager.py -- Runtime env is setting up.\n" + "".join(
        f"(pid=1) rlbox-probe: {json.dumps(good(i))}\n" for i in (1, 0))
    assert probe.verdict(plan, probe.reports(log)) == []


ROWS = [
    ("not ascending", good(1, visible="1,0,2,3"), ["node1 (10.0.0.2)", "not in ascending order", "Trinity-RFT#618",
                                                   "give it ascending, 0,1,2,3"]),
    ("another set", good(1, visible="0,1"), ["would use NPUs 4,5 of 10.0.0.2, planned 4,5,6,7",
                                             "set ASCEND_RT_VISIBLE_DEVICES=0,1,2,3"]),
    ("unset under noset", good(1, visible=None), ["ASCEND_RT_VISIBLE_DEVICES is unset", "set ASCEND_RT_VISIBLE_DEVICES=0,1,2,3"]),
    ("policy unset", good(1, noset=None, visible="0,1,2,3"), ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES is unset, "
                                                              "against the release's policy", "do not override it"]),
    ("device file missing", good(1, davinci=[4, 5, 6]), ["missing in the container: /dev/davinci7", "npu-smi info"]),
    ("privileged: every file", good(1, davinci=list(range(16))), ["would use NPUs 0,1,2,3 of 10.0.0.2, planned 4,5,6,7",
                                                                 "ASCEND_RT_VISIBLE_DEVICES=4,5,6,7"]),
    ("torch_npu count", good(1, torch_npu=2), ["torch_npu sees 2 NPU(s), planned 4"]),
    ("torch_npu fails", good(1, torch_npu_error="RuntimeError: no driver"), ["torch_npu does not load", "set_env"]),
    ("garbage", good(1, visible="npu0"), ["'npu0'", "is not a list of NPU ids"]),
]


@pytest.mark.parametrize("case,report,words", ROWS, ids=[r[0] for r in ROWS])
def test_a_wrong_node_is_named_with_its_fix(plan, case, report, words):
    found = probe.verdict(plan, [good(0), report])
    assert found and all(f.node == "node1 (10.0.0.2)" for f in found)
    text = "\n".join(f.line() for f in found)
    for w in words:
        assert w in text, (case, text)


def test_a_node_without_a_report_is_named(plan):
    found = probe.verdict(plan, [good(0)])
    assert [f.node for f in found] == ["node1 (10.0.0.2)"] and "no probe report" in found[0].what


def test_ray_s_own_way_judges_ray_s_ids(plan):
    """Under a release that lets Ray set the variable (rlbox_sim), what Ray set is judged, and the
    noset variable set on a node is against the policy (the ray-project/ray#59063 case: Ray set nothing)."""
    ray_way = dataclasses.replace(plan, npu_policy=NpuPolicy(False, "Ray's accelerator manager, npu.py", "rlbox_sim"))
    assert probe.verdict(ray_way, [good(0, noset=None), good(1, noset=None)]) == []
    text = probe.verdict(ray_way, [good(0, noset=None), good(1, noset=None, visible=None)])[0].line()
    assert "ray-project/ray#59063" in text and "#59163" in text
    assert "is set, against the release's policy" in probe.verdict(ray_way, [good(0, noset=None), good(1)])[0].what


def test_the_probe_job_carries_the_job_s_runtime_env(plan):
    job = dataclasses.replace(plan.job, env=(("VLLM_USE_V1", "1"),))
    pj = probe.probe_job(plan, job, attempt=2)
    env = dict(pj.env)
    assert env["VLLM_USE_V1"] == "1" and "rlbox-probe: " in env["RLBOX_NPU_PROBE"]
    assert pj.submission_id.endswith("-probe-r2") and len(pj.entrypoint) < 100
