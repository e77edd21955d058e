"""The job: planning its entrypoint (pure), and the Ray Jobs REST calls that carry it out.

REST only (requests): no `import ray` on the operator's machine.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import requests

from rlbox.core.errors import RlboxError
from rlbox.cluster.plan import JobPlan
from rlbox.verl import job as verl_job

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}

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
    if verl_job.is_verl(argv):
        argv = verl_job.sized(list(argv), nodes, npus_per_node)
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


def for_restart(job: JobPlan, attempt: int) -> JobPlan:
    """The same job, submitted again after restart ``attempt`` (Ray wants a new submission id); a
    verl job resuming from its newest checkpoint (``verl.job.resuming``)."""
    argv = verl_job.resuming(list(job.argv))
    command = shlex.join(argv)
    base = job.submission_id.rsplit("-r", 1)[0] if re.search(r"-r\d+$", job.submission_id) else job.submission_id
    return replace(job, argv=tuple(argv),
                   entrypoint=f"cd {shlex.quote(job.working_dir)} && {command}" if job.working_dir else command,
                   submission_id=f"{base}-r{attempt}")


# ---------------------------------------------------------------------------------------------
class LostContact(RlboxError):
    """The dashboard stopped answering while a job was followed (the job may well go on)."""


@dataclass
class JobsClient:
    """Ray Jobs REST API on the head's dashboard."""

    base: str
    timeout: float = 10.0
    received: int = 0  # bytes of log text fetched by `follow` (the benchmark reads it)

    def _call(self, method: str, path: str, timeout: float | None = None, **kw) -> requests.Response:
        try:
            resp = requests.request(method, f"{self.base}{path}", timeout=timeout or self.timeout, **kw)
        except requests.RequestException as err:
            raise RlboxError(f"Ray dashboard {self.base} not reachable ({type(err).__name__})") from None
        return resp

    def submit(self, job: JobPlan, patience: float = 60.0) -> str:
        """Submit; while the head's job agent is still registering (a 5xx right after the nodes
        joined: "No available agent to submit job"), retry for up to ``patience`` seconds. The dashboard
        answers a submission only once it has started the job's supervisor actor: on a loaded machine
        that takes longer than the other calls' timeout, so the answer is awaited up to ``patience``."""
        deadline = time.monotonic() + patience
        while True:
            resp = self._call("POST", "/api/jobs/", timeout=max(self.timeout, patience), json=job.as_dict())
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

    def logs(self, submission_id: str, timeout: float | None = None) -> str:
        resp = self._call("GET", f"/api/jobs/{submission_id}/logs", timeout=timeout)
        if resp.status_code != 200:
            return ""
        try:
            return resp.json().get("logs", "")
        except ValueError:
            return ""

    def save_log(self, submission_id: str, path) -> bool:
        """Write the job's whole log (Ray replays it from its start) to ``path``: a detached
        run's copy under its run dir, taken by `status`, `logs` and `stop` while the head lives.
        False when the head gave nothing (the copy already there stays)."""
        text = self.logs(submission_id)
        if not text:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        return True

    def stop(self, submission_id: str) -> None:
        self._call("POST", f"/api/jobs/{submission_id}/stop")

    def follow(self, submission_id: str, emit: Callable[[str], None], tick: Callable[[], None] | None = None,
               patience: float = 120.0, stop_on_loss: bool = False) -> dict:
        """Stream the job's log to ``emit`` until the job ends; return its final info.

        Through Ray's ``/api/jobs/{id}/logs/tail`` WebSocket: each frame is new text, so the cost
        is the new bytes and nothing is kept. The stream's close says nothing of the outcome, so
        the job's info is read then; a stream that drops while the job runs is opened again and
        the text already shown (Ray replays the log from its start) is skipped. ``tick`` runs at
        least every half second (the node watch: it may raise). A dashboard that stops answering
        is retried for ``patience`` seconds, then LostContact (the job itself may be fine).
        ``stop_on_loss`` (the run's own following, which tears the cluster down next): the job is
        stopped before its log is drained, so that no line the driver prints after the drain (a
        step, a checkpoint a restart resumes after) is lost with the head."""
        watch = tick or (lambda: None)
        raised: list[BaseException] = []

        def tick() -> None:  # what the watch raises ends the following; it is no lost contact
            try:
                watch()
            except BaseException as err:
                raised.append(err)
                raise

        count = [0]  # characters emitted so far, whichever session emitted them

        def counted(text: str) -> None:
            emit(text)
            count[0] += len(text)

        try:
            return self._follow(submission_id, counted, count, tick, raised, patience)
        except BaseException:
            if raised and not isinstance(raised[0], KeyboardInterrupt):
                # the watch ended the following (a node lost): before anything is torn down, the rest
                # of the job's log from the head while it lives, so that the attempt's end is in the log
                self.drain(submission_id, counted, count[0], stop=stop_on_loss)
            raise

    def drain(self, submission_id: str, emit: Callable[[str], None], shown: int, stop: bool = False,
              budget: float = 3.0) -> None:
        """What the job's log holds after its first ``shown`` characters, read once from the head
        (Ray keeps the driver's whole log); where the head cannot answer, one line saying where the
        log ends and why. With ``stop``, the job is stopped first and its end awaited, so the log
        read is the attempt's last. At most ``budget`` s in all: a lost node is named right after
        (a head cut off the network must not hold that back)."""
        deadline = time.monotonic() + budget
        if stop:
            self._stop_and_wait(submission_id, deadline - 1.0)
        try:
            text = self.logs(submission_id, timeout=max(1.0, deadline - time.monotonic()))
        except RlboxError as err:
            emit(f"rlbox: the job's log ends here: the Ray head did not give the rest of it ({err})\n")
            return
        if not text:
            emit("rlbox: the job's log ends here: the Ray head gave no log to read the rest from\n")
        elif len(text) > shown:
            rest = text[shown:]
            emit(rest if rest.endswith("\n") else rest + "\n")

    def _stop_and_wait(self, submission_id: str, until: float) -> None:
        """Ask the head to stop the job and wait (until ``until``, monotonic) for its end; quietly
        nothing where the head does not answer in time."""
        try:
            self._call("POST", f"/api/jobs/{submission_id}/stop", timeout=max(0.3, until - time.monotonic()))
            while time.monotonic() < until:
                resp = self._call("GET", f"/api/jobs/{submission_id}", timeout=max(0.3, until - time.monotonic()))
                if resp.status_code != 200 or resp.json().get("status") in TERMINAL:
                    return
                time.sleep(0.1)
        except (RlboxError, ValueError):
            return

    def _follow(self, submission_id: str, emit: Callable[[str], None], count: list[int], tick: Callable[[], None],
                raised: list[BaseException], patience: float) -> dict:
        failing_since = None
        while True:
            try:
                self._tail(submission_id, emit, count[0], tick)
                info = self.info(submission_id)
            except RlboxError as err:
                if raised:
                    raise
                tick()
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > patience:
                    raise LostContact(f"lost contact with the job for {patience:.0f} s ({err})") from None
                time.sleep(1.0)
                continue
            failing_since = None
            if info.get("status") in TERMINAL:
                if count[0] == 0:  # a job that never ran a driver streams nothing: its log, if any, once
                    emit(self.logs(submission_id))
                return info
            tick()

    def _tail(self, submission_id: str, emit: Callable[[str], None], skip: int, tick: Callable[[], None]) -> int:
        """One WebSocket session: emit what comes after the first ``skip`` characters, return how
        many new characters were emitted. RlboxError when it cannot connect."""
        import websocket

        url = "ws" + self.base.removeprefix("http") + f"/api/jobs/{submission_id}/logs/tail"
        try:
            ws = websocket.create_connection(url, timeout=self.timeout, enable_multithread=False)
        except websocket.WebSocketBadStatusException as err:
            if err.status_code == 404:
                raise RlboxError(f"job {submission_id} is not known to {self.base}") from None
            raise RlboxError(f"Ray dashboard {self.base}: log stream refused ({err.status_code})") from None
        except (OSError, websocket.WebSocketException) as err:
            raise RlboxError(f"Ray dashboard {self.base} not reachable ({type(err).__name__})") from None
        ws.settimeout(0.5)
        seen = emitted = 0
        try:
            while True:
                tick()
                try:
                    opcode, data = ws.recv_data(control_frame=True)
                except websocket.WebSocketTimeoutException:
                    continue
                except (OSError, websocket.WebSocketException):
                    break  # dropped: the caller asks for the job's status and may come back
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                if opcode != websocket.ABNF.OPCODE_TEXT:
                    continue
                self.received += len(data)
                text = data.decode("utf-8", errors="replace")
                fresh = text[max(0, skip - seen):]
                seen += len(text)
                if fresh:
                    emit(fresh)
                    emitted += len(fresh)
        finally:
            try:
                ws.close(timeout=0.2)
            except Exception:  # noqa: BLE001 - closing a stream that is gone
                pass
        return emitted


def exit_code(info: dict) -> int:
    """The process exit code a job's end gives `rlbox run` / `rlbox logs -f`: 0 on success, the
    driver's own code when it exited, 128 + N when signal N killed it (the shell's convention:
    SIGKILL, an OOM kill, is 137), 130 for a stopped job, 1 when Ray gives no code."""
    status = info.get("status")
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 130
    code = info.get("driver_exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        if code > 0:
            return min(code, 255)
        if code < 0:  # Ray (subprocess) reports a driver killed by signal N as -N
            return 128 + min(-code, 127)
    return 1


def killed_by(info: dict) -> int | None:
    """The signal that killed the job's driver, if one did: Ray says -N when it ran the driver
    itself, the shell in front of it 128 + N (137: SIGKILL, what the kernel's OOM killer sends)."""
    code = info.get("driver_exit_code")
    if info.get("status") != "FAILED" or not isinstance(code, int) or isinstance(code, bool):
        return None
    if code < 0:
        return -code
    return code - 128 if 128 < code <= 128 + 64 else None


def ended(info: dict) -> str:
    """How the job ended, in words: ``FAILED with exit code 3``, ``FAILED: its driver was killed
    by SIGKILL (9): out of memory? ...``."""
    status = info.get("status", "UNKNOWN")
    signum = killed_by(info)
    if signum is not None:
        return f"{status}: its driver was {signal_words(signum)} (exit code {exit_code(info)})"
    return f"{status} with exit code {exit_code(info)}"


def signal_words(number: int) -> str:
    """``killed by SIGKILL (9): out of memory?`` for a signal number."""
    import signal

    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    hint = {9: ": out of memory? (the kernel's OOM killer sends SIGKILL; see `dmesg` on the node)",
            15: ": stopped from outside (SIGTERM)", 11: ": a crash (segmentation fault)",
            6: ": aborted (an assertion or a fatal library error)"}.get(number, "")
    return f"killed by {name} ({number}){hint}"
