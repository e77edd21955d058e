"""The job: planning its entrypoint (pure), and the Ray Jobs REST calls that carry it out.

REST only (requests): no `import ray` on the operator's machine.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import requests

from rlbox.core.errors import RlboxError
from rlbox.cluster.plan import JobPlan

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
_VERL_MODULE = re.compile(r"^(verl\.|recipe\.)")

# The built-in cluster check (`rlbox run --smoke-test`): one placement group bundle per node
# holding all its NPUs, as verl's resource pools do; each bundle's task reports what it sees.
SMOKE_TEST = r"""
import os, sys
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address="auto", logging_level="ERROR")
nodes = [n for n in ray.nodes() if n["Alive"]]
per_node = sorted(int(n["Resources"].get("NPU", 0)) for n in nodes)
pg = placement_group([{"NPU": k, "CPU": 0.01} for k in per_node], strategy="STRICT_SPREAD")
ray.get(pg.ready(), timeout=120)
keys = ("ASCEND_RT_VISIBLE_DEVICES", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_IF_IP", "RLBOX_NODE")
@ray.remote(num_cpus=0.01)
def probe(npus):
    import os
    out = {k: os.environ.get(k) for k in keys}
    out["npus"] = npus
    out["ip"] = ray.util.get_node_ip_address()
    out["davinci"] = sorted(d for d in os.listdir("/dev") if d.startswith("davinci") and d[7:].isdigit())
    return out
refs = [probe.options(resources={"NPU": k}, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote(k)
        for i, k in enumerate(per_node)]
seen = sorted(ray.get(refs), key=lambda r: int(r["RLBOX_NODE"] or 0))
ok = True
for r in seen:
    k = r["npus"]
    visible = (r["ASCEND_RT_VISIBLE_DEVICES"] or "").split(",")
    good = len(visible) == k and len(r["davinci"]) >= k and r["HCCL_SOCKET_IFNAME"] and r["HCCL_IF_IP"] == r["ip"]
    ok = ok and bool(good)
    print(f"rlbox-smoke: node{r['RLBOX_NODE']} {r['ip']} {'ok' if good else 'FAIL'} NPUs={len(visible)} "
          f"ASCEND_RT_VISIBLE_DEVICES={r['ASCEND_RT_VISIBLE_DEVICES']} HCCL_SOCKET_IFNAME={r['HCCL_SOCKET_IFNAME']} "
          f"GLOO_SOCKET_IFNAME={r['GLOO_SOCKET_IFNAME']} TP_SOCKET_IFNAME={r['TP_SOCKET_IFNAME']} HCCL_IF_IP={r['HCCL_IF_IP']}")
total = sum(per_node)
print(f"rlbox-smoke: {len(seen)} nodes, {total} NPUs: {'all visible' if ok else 'PROBLEMS'}")
sys.exit(0 if ok else 1)
"""


def _cluster_args(argv: list[str], nodes: int, npus: int) -> list[str]:
    """Set trainer.nnodes / trainer.n_gpus_per_node from the cluster; refuse a conflicting value."""
    want = {"trainer.nnodes": str(nodes), "trainer.n_gpus_per_node": str(npus)}
    seen = set()
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in want:
            seen.add(key)
            if value.strip("'\"") != want[key]:
                raise RlboxError(
                    f"{key}={value} conflicts with the cluster ({nodes} node(s) x {npus} NPUs): "
                    f"drop it, rlbox sets {key}={want[key]}"
                )
    return argv + [f"{k}={v}" for k, v in want.items() if k not in seen]


def is_verl(argv: list[str]) -> bool:
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and _VERL_MODULE.match(argv[i + 1]):
            return True
    return False


def plan_job(
    argv: list[str],
    *,
    nodes: int,
    npus_per_node: int,
    run: str,
    run_id: str,
    working_dir: str | None = None,
    env: dict[str, str] | None = None,
    description: str = "",
) -> JobPlan:
    if not argv:
        raise RlboxError("no job: give a command after `--`, --recipe NAME, or --smoke-test")
    if is_verl(argv):
        argv = _cluster_args(list(argv), nodes, npus_per_node)
    command = shlex.join(argv)
    entrypoint = f"cd {shlex.quote(working_dir)} && {command}" if working_dir else command
    return JobPlan(
        entrypoint=entrypoint,
        argv=tuple(argv),
        working_dir=working_dir,
        env=tuple(sorted((env or {}).items())),
        submission_id=f"rlbox-{run}-{run_id}",
        description=description or command[:200],
    )


def smoke_job(*, run: str, run_id: str) -> JobPlan:
    """The smoke test travels in the job's environment, so the entrypoint (which Ray echoes into
    the log) stays one short line and the image needs nothing of rlbox's."""
    return plan_job(["python3", "-c", "import os; exec(os.environ['RLBOX_SMOKE_TEST'])"], nodes=0,
                    npus_per_node=0, run=run, run_id=run_id, env={"RLBOX_SMOKE_TEST": SMOKE_TEST},
                    description="rlbox smoke test: every NPU of every node visible through Ray")


# ---------------------------------------------------------------------------------------------
class LostContact(RlboxError):
    """The dashboard stopped answering while a job was followed (the job may well go on)."""


@dataclass
class JobsClient:
    """Ray Jobs REST API on the head's dashboard."""

    base: str
    timeout: float = 10.0

    def _call(self, method: str, path: str, **kw) -> requests.Response:
        try:
            resp = requests.request(method, f"{self.base}{path}", timeout=self.timeout, **kw)
        except requests.RequestException as err:
            raise RlboxError(f"Ray dashboard {self.base} not reachable ({type(err).__name__})") from None
        return resp

    def submit(self, job: JobPlan, patience: float = 60.0) -> str:
        """Submit; while the head's job agent is still registering (a 5xx right after the nodes
        joined: "No available agent to submit job"), retry for up to ``patience`` seconds."""
        deadline = time.monotonic() + patience
        while True:
            resp = self._call("POST", "/api/jobs/", json=job.as_dict())
            if resp.status_code == 200:
                try:
                    return resp.json()["submission_id"]
                except (ValueError, KeyError):
                    raise RlboxError(f"job submission to {self.base}: unexpected answer {resp.text[:200]!r}") from None
            if resp.status_code < 500 or time.monotonic() >= deadline:
                last = (resp.text.strip().splitlines() or [""])[-1][:300]
                raise RlboxError(f"job submission refused by {self.base}: {resp.status_code} {last}")
            time.sleep(0.5)

    def info(self, submission_id: str) -> dict:
        resp = self._call("GET", f"/api/jobs/{submission_id}")
        if resp.status_code == 404:
            raise RlboxError(f"job {submission_id} is not known to {self.base}")
        if resp.status_code != 200:
            raise RlboxError(f"Ray dashboard {self.base} answered {resp.status_code} for job {submission_id}")
        try:
            return resp.json()
        except ValueError:
            raise RlboxError(f"Ray dashboard {self.base} sent no JSON for job {submission_id}") from None

    def logs(self, submission_id: str) -> str:
        resp = self._call("GET", f"/api/jobs/{submission_id}/logs")
        if resp.status_code != 200:
            return ""
        try:
            return resp.json().get("logs", "")
        except ValueError:
            return ""

    def stop(self, submission_id: str) -> None:
        self._call("POST", f"/api/jobs/{submission_id}/stop")

    def follow(self, submission_id: str, emit: Callable[[str], None], poll: float = 0.5) -> dict:
        """Stream new log text to ``emit`` until the job ends; return its final info."""
        for chunk, info in self._chunks(submission_id, poll):
            if chunk:
                emit(chunk)
            if info is not None:
                return info
        raise AssertionError("unreachable")

    def _chunks(self, submission_id: str, poll: float, patience: float = 120.0) -> Iterator[tuple[str, dict | None]]:
        """New log text and, at the end, the final info. The Jobs API returns the whole log each
        time, so polling slows down as the log grows. A dashboard that stops answering is
        retried for ``patience`` seconds, then LostContact (the job itself may be fine)."""
        shown = 0
        failing_since = None
        while True:
            try:
                info = self.info(submission_id)
                text = self.logs(submission_id)
            except RlboxError as err:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > patience:
                    raise LostContact(f"lost contact with the job for {patience:.0f} s ({err})") from None
                time.sleep(min(5.0, poll * 4))
                continue
            failing_since = None
            if len(text) > shown:
                yield text[shown:], None
                shown = len(text)
            if info.get("status") in TERMINAL:
                time.sleep(poll)  # the last lines reach the log shortly after the status
                yield self.logs(submission_id)[shown:], info
                return
            time.sleep(poll if shown < 1 << 20 else min(10.0, poll * (shown >> 20)))


def exit_code(info: dict) -> int:
    status = info.get("status")
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 130
    code = info.get("driver_exit_code")
    return code if isinstance(code, int) and code > 0 else 1
