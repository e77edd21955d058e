"""The NPU probe: after the cluster is ready and before the job is submitted, one Ray task per
node, given the node's NPUs through Ray's ``NPU`` resource (as verl's resource pools ask for
them) with the job's own runtime env, reports what a worker there sees: ASCEND_RT_VISIBLE_DEVICES,
RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES, the ids Ray gave it, the /dev/davinci* files and,
where the image has torch_npu, its device count. ``verdict`` (pure) holds every report to the
plan and the release's env policy (``plan.NpuPolicy``): a node whose workers would see other NPUs
than planned (another set, not ascending, a device file missing, the policy not in force) is
named with its fix before any verl process starts; the run then fails and is torn down.

Why: under `ray job submit` Ray has left workers without their NPUs (ray-project/ray#59063, fixed
by #59163); CANN wants the ids ascending or reports no NPU (agentscope-ai/Trinity-RFT#618); and
RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES set or unset against the release's docs puts
tensors on the wrong device. Readiness counts Ray's ``NPU`` resource only, which says none of this.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

from rlbox.cluster import jobs
from rlbox.cluster.plan import NOSET_VISIBLE, VISIBLE, JobPlan, NodePlan, RunPlan
from rlbox.core.errors import RlboxError

PREFIX = "rlbox-probe: "

# Runs as a Ray job (the script travels in the job's environment, as the smoke test's does).
SCRIPT = r"""
import json, os
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address="auto", logging_level="ERROR")
nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("NPU", 0) > 0]
per_node = [int(n["Resources"]["NPU"]) for n in nodes]
pg = placement_group([{"NPU": k, "CPU": 0.01} for k in per_node], strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=120)
@ray.remote(num_cpus=0.01)
def probe(k):
    import importlib.util, os
    out = {"node": os.environ.get("RLBOX_NODE"), "ip": ray.util.get_node_ip_address(), "npus": k,
           "visible": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
           "noset": os.environ.get("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"),
           "ray_ids": [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("NPU", [])],
           "davinci": sorted(int(d[7:]) for d in os.listdir("/dev") if d.startswith("davinci") and d[7:].isdigit()),
           "torch_npu": None}
    try:
        if importlib.util.find_spec("torch_npu") is not None:
            import torch, torch_npu  # noqa: F401
            out["torch_npu"] = torch.npu.device_count() if torch.npu.is_available() else 0
    except Exception as err:
        out["torch_npu_error"] = f"{type(err).__name__}: {err}"[:200]
    return out
refs = [probe.options(resources={"NPU": k}, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote(k)
        for i, k in enumerate(per_node)]
for r in ray.get(refs, timeout=300):
    print("rlbox-probe: " + json.dumps(r, sort_keys=True), flush=True)
"""


def probe_job(plan: RunPlan, job: JobPlan, attempt: int = 0) -> JobPlan:
    """The probe as a job with the job's own runtime env (what verl's workers get)."""
    base = jobs.smoke_job(run=plan.run, run_id=plan.run_id)
    return replace(base, argv=("python3", "-c", "import os; exec(os.environ['RLBOX_NPU_PROBE'])"),
                   entrypoint="python3 -c \"import os; exec(os.environ['RLBOX_NPU_PROBE'])\"",
                   env=tuple(sorted({**dict(job.env), "RLBOX_NPU_PROBE": SCRIPT}.items())),
                   submission_id=f"rlbox-{plan.run}-{plan.run_id}-probe" + (f"-r{attempt}" if attempt else ""),
                   description="rlbox NPU probe: what the job's workers see on every node")


def reports(log: str) -> list[dict]:
    """The per-node reports the probe printed (lines it did not print are skipped)."""
    out = []
    for line in log.splitlines():
        at = line.find(PREFIX)
        if at < 0:
            continue
        try:
            item = json.loads(line[at + len(PREFIX):])
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


@dataclass(frozen=True)
class Finding:
    node: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.node}: {self.what} -> {self.fix}"


def _ids(text: str) -> list[int] | None:
    words = [w.strip() for w in text.split(",")]
    return [int(w) for w in words] if all(w.isdigit() for w in words) else None


def _env_fix(host: str) -> str:
    return f"see where it comes from on {host}: the host's env: in the cluster file, --env, the image's ENV"


def judge_node(plan: RunPlan, node: NodePlan, r: dict | None) -> list[Finding]:
    """One node's report against its plan and the release's policy."""
    label, host = node.label, node.host.name
    if r is None:
        return [Finding(label, "no probe report: no Ray task ran there with its NPUs",
                        "check `ray status` on the head (its NPU resource) and the node's container log")]
    out: list[Finding] = []
    planned = tuple(node.npu_ids or range(node.npus))
    files = sorted(x for x in r.get("davinci") or [] if isinstance(x, int))
    missing = [i for i in planned if i not in files]
    if missing:
        out.append(Finding(label, "missing in the container: " + ", ".join(f"/dev/davinci{i}" for i in missing),
                           f"check the devices on {host} (`ls /dev/davinci*`, `npu-smi info`) and the driver"))
    # the job's workers number the NPUs as the container lists them: planned NPU i is the i-th file
    expect = [files.index(i) for i in planned if i in files]
    policy = plan.npu_policy
    noset = bool(r.get("noset"))
    if policy is not None and noset != policy.noset:
        said = f"{NOSET_VISIBLE}={r.get('noset')} is set" if noset else f"{NOSET_VISIBLE} is unset"
        out.append(Finding(label, f"{said}, against the release's policy ({policy.words()})",
                           ("unset it: " if noset else "do not override it: ") + _env_fix(host)))
    raw = r.get("visible")
    source = "the node's environment (Ray leaves it alone under " + NOSET_VISIBLE + ")" if noset else "Ray"
    if raw in (None, ""):
        out.append(Finding(label, f"{VISIBLE} is unset in the job's workers: torch.npu sees every NPU of the container "
                                  "or none (ray-project/ray#59063)",
                           "use a Ray with #59163 (2.53+), or a release whose policy sets it (images/*.yaml ray_npu_env)"
                           if not noset else f"set {VISIBLE}={','.join(map(str, expect))}: " + _env_fix(host)))
        return out
    ids = _ids(str(raw))
    if ids is None:
        out.append(Finding(label, f"{VISIBLE}={raw!r} (from {source}) is not a list of NPU ids", _env_fix(host)))
        return out
    if ids != sorted(set(ids)):
        out.append(Finding(label, f"{VISIBLE}={raw} (from {source}) is not in ascending order: CANN then finds no NPU "
                                  "(torch.npu.is_available() false; agentscope-ai/Trinity-RFT#618)",
                           f"give it ascending, {','.join(map(str, sorted(set(ids))))}: " + _env_fix(host)
                           if noset else "Ray gave the ids out of order: a Ray with #59163, or the release's noset policy"))
    if sorted(set(ids)) != expect:
        seen = [files[i] for i in sorted(set(ids)) if 0 <= i < len(files)]
        out.append(Finding(label, f"{VISIBLE}={raw} (from {source}): the job would use NPUs "
                                  f"{','.join(map(str, seen)) or 'none'} of {host}, planned {','.join(map(str, planned))} "
                                  f"({VISIBLE}={','.join(map(str, expect))} in the container)",
                           f"set {VISIBLE}={','.join(map(str, expect))}: " + _env_fix(host) if noset else
                           "Ray's NPU resource on the node differs from the plan: check the node's `ray start --resources`"))
    if r.get("torch_npu_error"):
        out.append(Finding(label, f"torch_npu does not load in a worker: {r['torch_npu_error']}",
                           "check the image's CANN set_env and the driver mounted from the host"))
    elif isinstance(r.get("torch_npu"), int) and r["torch_npu"] != len(planned):
        out.append(Finding(label, f"torch_npu sees {r['torch_npu']} NPU(s), planned {len(planned)}",
                           f"check {VISIBLE} and the devices on {host} (`npu-smi info`)"))
    return out


def verdict(plan: RunPlan, found: list[dict]) -> list[Finding]:
    """Every node's findings, in node order (empty: every node sees exactly its planned NPUs)."""
    by_node: dict[int, dict] = {}
    for r in found:
        node = str(r.get("node") or "")
        if node.isdigit():
            by_node[int(node)] = r
    return [f for n in plan.nodes for f in judge_node(plan, n, by_node.get(n.index))]


def check(client: jobs.JobsClient, plan: RunPlan, job: JobPlan, attempt: int, echo, timeout: float = 240) -> float:
    """Run the probe on the ready cluster; RlboxError naming every node that is wrong (the run
    then tears the cluster down). Returns the seconds it took."""
    start = time.monotonic()
    submission = client.submit(probe_job(plan, job, attempt))
    info: dict = {}
    while time.monotonic() - start < timeout:
        info = client.info(submission)
        if info.get("status") in jobs.TERMINAL:
            break
        time.sleep(0.3)
    else:
        client.stop(submission)
        raise RlboxError(f"npu probe: no answer in {timeout:.0f} s (job {submission}); nothing of the job was started")
    log = client.logs(submission)
    found = verdict(plan, reports(log))
    took = time.monotonic() - start
    if info.get("status") != "SUCCEEDED" and not reports(log):
        last = (log.strip().splitlines() or [info.get("message") or "no log"])[-1][:300]
        raise RlboxError(f"npu probe failed ({info.get('status')}): {last}; nothing of the job was started")
    for f in found[:-1]:
        echo(f"npu probe: ✗ {f.line()}")
    if found:
        raise RlboxError(f"npu probe: {found[-1].line()}  ({len(found)} problem(s); the job was not submitted)")
    policy = plan.npu_policy.words() if plan.npu_policy else "no release policy for this image: Ray's own way"
    echo(f"npu probe: {len(plan.nodes)} node(s), {plan.total_npus} NPUs visible to the job's workers as planned "
         f"in {took:.1f} s ({policy})")
    return took
