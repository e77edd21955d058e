"""Watching every node while a job runs: its container through its engine, and Ray's node table.

``judge`` is the pure judgement (facts in, the first lost node out, table-tested); ``Watch``
gathers the facts at most once per ``every`` seconds and raises NodeLost naming the node and
what happened to it. A killed or frozen (paused) container is seen by its engine at once; a
node cut off from the others, or a raylet that died or froze in a running container, is seen
when Ray's GCS marks its node DEAD: its health check, which rlbox tightens (plan.HEALTH_CHECK_ENV:
a node silent for ~20 s instead of Ray's default ~60 s). Ray's rows are matched by the address
the node itself reported when it started (``reported_address``: the node script's line), never
by the host's name, so hosts given by name, by address or simulated are watched alike.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import requests

from rlbox.cluster import ray
from rlbox.cluster.hosts import Call, Node
from rlbox.cluster.plan import RunPlan
from rlbox.core import engine
from rlbox.core.errors import RlboxError

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
GONE = "gone"  # the container no longer exists
UNREACHABLE = "unreachable"  # its engine does not answer
ENGINE_PATIENCE = 3.0  # seconds an engine may not answer (its ping neither) before its node counts as lost
TABLE_TIMEOUT = 2.0  # seconds Ray's node table may take
LOOK_WAIT = 1.0  # seconds a look waits for the engines' answers; a call still out then is an engine not answering
TAIL_LINES = 12  # lines of an exited container's output read back (its last line is said; all are searched)
DASHBOARD_PATIENCE = 10.0  # seconds the head's dashboard may not answer while its container runs
CAUSE_WAIT = 10.0  # seconds a node Ray marks DEAD waits for its engine, still answering, to say what became of it
PING_EVERY = 1.0  # seconds between pings of an engine whose call is out, between looks too (looks far apart at large N)
_REPORTED = re.compile(r"^rlbox-node: (head|worker) on (\S+) \(", re.MULTILINE)


def reported_address(output: str) -> str | None:
    """The address a node said it starts Ray on (the node script's ``rlbox-node: ROLE on IP
    (NIC), head ...`` line, which passes the same IP to ``ray start --node-ip-address``)."""
    found = _REPORTED.findall(_ANSI.sub("", output))
    return found[-1][1] if found else None


@dataclass(frozen=True)
class Box:
    """What a node's engine says of its container."""

    status: str  # running, exited, dead, paused, ..., GONE, UNREACHABLE
    exit_code: int | None = None
    last_line: str = ""
    since: float = 0.0  # seconds the status has held (for UNREACHABLE)
    tail: tuple[str, ...] = ()  # its last lines of output, oldest first (stdout and stderr interleave)
    raylet: str = ""  # a node that gave up on Ray's start-up: the last warning or error of its raylet's own log


@dataclass(frozen=True)
class Expected:
    label: str  # node0 (sim0)
    role: str  # head | worker
    address: str  # the address Ray knows the node by


@dataclass(frozen=True)
class Loss:
    label: str
    role: str
    what: str
    by_ray: int | None = None  # the node's index when only Ray's table showed the loss (its engine may say why)
    silent: bool = False  # its engine has not answered (a host cut off, an engine gone): nothing more to ask it

    def line(self) -> str:
        return f"{self.label}, the {'Ray head' if self.role == 'head' else 'worker'}, was lost: {self.what}"


class NodeLost(RlboxError):
    """A node of a running job was lost (its Loss is ``.loss``; ``named``: already said in a "lost:" line,
    as a job's follow says it at once)."""

    def __init__(self, loss: Loss):
        super().__init__(loss.line())
        self.loss = loss
        self.named = False


class HeadGaveUp(NodeLost):
    """The head exited with Ray's start-up time-out while the cluster came up (``head_gave_up``):
    the run brings the cluster up again, up to START_AGAIN times (execute), before it is a loss.
    ``box``: what its engine said of it, with its raylet's last words (Watch reads them)."""

    def __init__(self, loss: Loss, box: Box | None = None):
        super().__init__(loss)
        self.box = box

    def said(self) -> str:
        """Why, for the line that brings the cluster up again: Ray's words, and its raylet's when its log gave one."""
        return said_when_gave_up(RAY_START_TIMED_OUT, self.box) if self.box is not None else RAY_START_TIMED_OUT


def judge(expected: list[Expected], boxes: list[Box], table: list[ray.RayNode] | None,
          dashboard_down_for: float = 0.0) -> Loss | None:
    """The first lost node, head first: a container not running (exited, dead, gone), an engine
    silent for ENGINE_PATIENCE, a node Ray marks DEAD with no live row for its address, or a head
    whose dashboard is silent for DASHBOARD_PATIENCE. ``table``: Ray's node table, None when the
    dashboard did not answer."""
    order = sorted(range(len(expected)), key=lambda i: expected[i].role != "head")
    for i in order:
        node, box = expected[i], boxes[i]
        if box.status == GONE:
            return Loss(node.label, node.role, "its container is gone (removed or its host rebooted)")
        if box.status == UNREACHABLE and box.since >= ENGINE_PATIENCE:
            return Loss(node.label, node.role, f"its engine has not answered for {box.since:.0f} s", silent=True)
        if box.status == "paused":
            return Loss(node.label, node.role, "its container is paused (frozen: `docker pause` or the engine froze it)")
        if box.status in ("exited", "dead"):
            code = f" with code {box.exit_code}" if box.exit_code is not None else ""
            killed = box.exit_code in (137, 143)
            tail = f"; last output: {box.last_line}" if box.last_line and not killed else ""
            code += " (killed)" if killed else ""
            return Loss(node.label, node.role, f"its container {box.status}{code}{tail}")
    if table is not None:
        for i in order:
            node = expected[i]
            rows = [r for r in table if r.ip == node.address]
            if rows and not any(r.alive for r in rows):
                why = rows[-1].message or "no reason given"
                return Loss(node.label, node.role, f"Ray marks it DEAD ({why})", by_ray=i)
    elif dashboard_down_for >= DASHBOARD_PATIENCE:
        head = next(e for e in expected if e.role == "head")
        return Loss(head.label, head.role, f"its Ray dashboard has not answered for {dashboard_down_for:.0f} s")
    return None


# Ray's own words when a node's raylet did not register with the GCS within its fixed wait (30 s,
# `ray/_private/node.py`): `ray start` exits, the node never joined. Many raylets registering at
# once with one GCS, or on cores shared with other work, meet it; a second start usually goes through.
RAY_START_TIMED_OUT = "timed out during startup"
# and a worker's `ray start` that found the head's GCS but not the head registered in it within Ray's 40 s
# (`get_all_node_info_until_retrieved`, 20 tries 2 s apart): workers start once the GCS answers, while the
# head's raylet may still be starting
RAY_HEAD_NOT_FOUND = "No node info found for head node in GCS"
# times a worker whose raylet timed out registering is started again during bring-up, 30 s each: a loaded
# machine (the CIs of stops 44 and 47: two runs' four raylets and their GCSs on two shared cores, beside the
# rest of the suite) timed out three, then four times in a row; the bring-up's own timeout (--timeout) is the
# bound that counts, this one only ends a loop that will not end otherwise
RAYLET_WAITS = 8
START_AGAIN = 2  # times a cluster whose head's raylet timed out registering is brought up again
# times a worker that gave up on the head's registration is: 40 s each, as long as a worker waited for the
# head's raylet port before it started at the GCS (~300 s); the bring-up's own timeout ends it sooner
HEAD_WAITS = 7


def budget(why: str | None) -> int:
    """How often a worker that gave up with Ray's words ``why`` is started again."""
    return HEAD_WAITS if why == RAY_HEAD_NOT_FOUND else RAYLET_WAITS


def start_again(node: Expected, box: Box, tries: int) -> bool:
    """Whether a node that exited while Ray comes up is started again instead of being lost: a
    worker (never the head: the others registered with it) whose last lines of output hold Ray's
    start-up time-out (or its give-up on the head's registration), started again ``tries`` times
    so far for that reason, fewer than its ``budget``."""
    why = gave_up(box)
    return node.role == "worker" and box.status == "exited" and why is not None and tries < budget(why)


def head_gave_up(node: Expected, box: Box) -> bool:
    """Whether a head exited with Ray's own start-up time-out (its raylet did not register with its
    own GCS within Ray's 30 s: a GCS starved of CPU, `ray/_private/node.py`). Unlike a worker's, its
    container cannot just start again (the workers' GCS went with it): the cluster comes up again."""
    return node.role == "head" and box.status == "exited" and gave_up(box) == RAY_START_TIMED_OUT


def gave_up(box: Box) -> str | None:
    """Which of Ray's start-up give-ups a node's last lines hold (None: neither)."""
    said = (box.last_line, *box.tail)  # Ray's exception on stderr may come before its last stdout line
    return next((words for words in (RAY_START_TIMED_OUT, RAY_HEAD_NOT_FOUND) if any(words in line for line in said)), None)


# where Ray's raylet writes its own log in a node's container (`ray start`'s session folder), not to the output
RAYLET_LOG = "/tmp/ray/session_latest/logs/raylet.out"
_LEVEL = re.compile(r"^\[[^\]]* ([EWF]) \d+ \d+\] ")  # [2026-11-29 15:46:18,123 E 87 87] (raylet) main.cc:...


def raylet_words(container) -> str:
    """The last warning or error line of the raylet's log in an exited node container (read through the
    engine: no process runs in it), else its last line: why its registration did not come in time, in Ray's
    words. Empty when the engine cannot give it (no session yet)."""
    try:
        log = engine.read_file(container, RAYLET_LOG) or b""
    except Exception:  # noqa: BLE001 - a diagnosis only: the give-up itself is judged from the output
        return ""
    return raylet_line(log[-65536:].decode(errors="replace"))


def raylet_line(text: str) -> str:
    """The last warning or error line of a raylet log's text, else its last line (at most 200 characters)."""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines() if line.strip()]
    flagged = [line for line in lines if _LEVEL.match(line)]
    return (flagged or lines or [""])[-1][:200]


def said_when_gave_up(why: str, box: Box) -> str:
    """A give-up's reason for its line: Ray's words, and the raylet's own when its log gave one."""
    return f"{why}; raylet: {box.raylet}" if box.raylet else why


def expected_of(plan: RunPlan, addresses: dict[int, str] | None = None) -> list[Expected]:
    """Each node and the address Ray knows it by: the one it reported (``addresses``, by node
    index), else the planned one."""
    addresses = addresses or {}
    return [Expected(n.label, n.role, addresses.get(n.index) or n.container.ip or n.host.address or n.host.name)
            for n in plan.nodes]


def expected_of_record(nodes: list[dict], addresses: dict[str, str] | None) -> list[Expected]:
    """The same, from a run's record (state.json's ``nodes`` and ``addresses``)."""
    addresses = addresses or {}
    return [Expected(f"node{n.get('index')} ({n.get('host')})", n.get("role", "worker"),
                     addresses.get(str(n.get("index"))) or n.get("host", "")) for n in nodes]


# The watch looks at most this many containers per second: 1 s between looks up to 64 nodes, then the
# period grows with N (4 s at 256, 15.6 s at 1,000), so the launcher's load stays flat as the cluster
# grows; Ray's own health check (HEALTH_CHECK_ENV: a node DEAD within ~5 s) still catches a lost node
# in the node table, which every look reads whole.
LOOKS_PER_SECOND = 64.0
BASE_PERIOD = 1.0


def period(nodes: int) -> float:
    """Seconds between two looks of the watch over ``nodes`` nodes."""
    return max(BASE_PERIOD, nodes / LOOKS_PER_SECOND)


class Watch:
    """Every node of a running cluster, looked at no more often than ``every`` seconds (by default
    period(N)). ``containers``: each node's container name; ``expected``: each node's label, role, address."""

    def __init__(self, expected: list[Expected], containers: list[str], nodes: list[Node], dashboard: str | None,
                 every: float | None = None, clock: Callable[[], float] = time.monotonic):
        every = period(len(nodes)) if every is None else every
        self.containers, self.nodes, self.dashboard, self.every, self.clock = containers, nodes, dashboard, every, clock
        self.expected = expected
        self._last = float("-inf")
        self._silent_since: dict[int, float] = {}
        self._dashboard_down_since: float | None = None
        self._pending: dict[int, Call] = {}  # per node, its engine call still out
        self._pings: dict[int, Call] = {}  # per node, its engine's ping, asked while a call of the node is out
        self._heard: dict[int, float] = {}  # per node, when its engine last answered a ping
        self._table_call: Call | None = None  # Ray's node table, asked and not answered yet

    def _box(self, index: int) -> Box:
        node = self.nodes[index]
        from docker.errors import NotFound

        try:
            box = node.client.containers.get(self.containers[index])
        except NotFound:
            return Box(GONE)
        except Exception:  # noqa: BLE001 - an engine that does not answer: how long matters
            since = self._silent_since.setdefault(index, self.clock())
            return Box(UNREACHABLE, since=self.clock() - since)
        self._silent_since.pop(index, None)
        if box.status not in ("exited", "dead"):
            return Box(box.status)
        try:
            lines = box.logs(tail=TAIL_LINES).decode(errors="replace").strip().splitlines()
        except Exception:  # noqa: BLE001
            lines = []
        lines = [_ANSI.sub("", line).strip()[:200] for line in lines]
        said = Box(box.status, box.attrs.get("State", {}).get("ExitCode"), lines[-1] if lines else "", tail=tuple(lines))
        return said if gave_up(said) is None else replace(said, raylet=raylet_words(box))

    def _table(self) -> list[ray.RayNode] | None:
        if not self.dashboard:
            return None
        try:
            table = ray.nodes(self.dashboard, timeout=TABLE_TIMEOUT)
        except (requests.RequestException, KeyError, ValueError):
            self._dashboard_down_since = self._dashboard_down_since or self.clock()
            return None
        self._dashboard_down_since = None
        return table

    def _ping(self, index: int) -> None:
        self.nodes[index].client.ping()  # the engine's /_ping: no container, no lock, answered at once
        self._heard[index] = self.clock()

    def _silent(self, index: int, began: float, now: float) -> float:
        """Seconds node ``index``'s engine has said nothing at ``now``, counted from ``began`` (its
        call out since then, or failing), or from its last answered ping when that came later. A ping
        still out counts from PING_EVERY before it was asked at the earliest: a gap in the asking (the
        caller's loop busy for seconds on a loaded machine) is not the engine's silence."""
        ping = self._pings.get(index)
        asked = ping.began - PING_EVERY if ping is not None and not ping.done.is_set() else began
        return now - max(began, self._heard.get(index, began), asked)

    def _ping_again(self, index: int, now: float, after: float) -> None:
        """Ask node ``index``'s engine for its ping: one at a time, not sooner than ``after`` seconds after the last."""
        ping = self._pings.get(index)
        if ping is None or (ping.done.is_set() and now - ping.began >= after):
            self._pings[index] = Call(self._ping, index, now)

    def _still_out(self, index: int, call: Call) -> Box:
        """A node whose call has not come back: its engine is asked for a ping beside it (one at a
        time), so an engine that answers, only slowly (a loaded machine: a container inspected while
        the engine creates and removes others), is told from one cut off, stopped or frozen, whose
        ping is as silent as the call. A slow call still ends at the client's timeout (120 s)."""
        self._ping_again(index, self.clock(), 0.0)
        began = self._silent_since.setdefault(index, call.began)
        return Box(UNREACHABLE, since=self._silent(index, began, self.clock()))

    def boxes(self) -> list[Box]:
        """What each node's engine says of its container, now. A call that has not come back within
        LOOK_WAIT (an engine behind a cut network hangs until the client's own timeout) is left running
        and its node counted as not answering since the call began (or since its engine last answered
        a ping: ``_still_out``), so a host cut off is named after ENGINE_PATIENCE, not after the
        client's timeout, and a slow engine is not named; its next call goes out once it has returned."""
        now = self.clock()
        fresh = []
        for i in range(len(self.nodes)):
            if i not in self._pending:
                self._pending[i] = Call(self._box, i, now)
                fresh.append(self._pending[i])
        deadline = time.monotonic() + LOOK_WAIT
        for call in fresh:  # a call already out at an earlier look is not waited for again
            call.done.wait(max(0.0, deadline - time.monotonic()))
        boxes = []
        for i in range(len(self.nodes)):
            call = self._pending[i]
            if call.done.is_set():
                del self._pending[i]
                if call.error is not None:
                    raise call.error
                boxes.append(call.result)
            else:
                boxes.append(self._still_out(i, call))
        return boxes

    def look(self) -> Loss | None:
        """Gather the facts now and judge them. Ray's table is asked beside the engines and waited
        for as long as they are (LOOK_WAIT): a dashboard behind a cut network does not slow the look;
        one whose answer is out for TABLE_TIMEOUT counts as silent from when it was asked."""
        asked = False
        if self.dashboard and self._table_call is None:
            self._table_call, asked = Call(lambda _: self._table(), 0, self.clock()), True
        started = time.monotonic()
        boxes = self.boxes()
        table, call = None, self._table_call
        if call is not None:
            if asked:
                call.done.wait(max(0.0, LOOK_WAIT - (time.monotonic() - started)))
            if call.done.is_set():
                self._table_call = None
                if call.error is not None:
                    raise call.error
                table = call.result
            elif self.clock() - call.began >= TABLE_TIMEOUT:
                self._dashboard_down_since = self._dashboard_down_since or call.began
        down = self.clock() - self._dashboard_down_since if self._dashboard_down_since else 0.0
        loss = judge(self.expected, boxes, table, down)
        return self._cause(loss, boxes, table, down) if loss is not None and loss.by_ray is not None else loss

    def _cause(self, loss: Loss, boxes: list[Box], table: list[ray.RayNode] | None, down: float) -> Loss:
        """Ray marks a node DEAD whose container its engine has not said anything of yet, or said ran at
        the look: a loaded engine tears a killed container's network down before it says the container
        exited, and answers an inspection of it only then (the CI of stop 44: a worker killed, named by
        Ray's health check as "missing too many heartbeats"). Its engine is asked (again) and waited for,
        while it answers its ping, up to CAUSE_WAIT: the loss names what became of the container
        (killed, exited with its code and last line), and Ray's words when it runs on (cut off) or
        its engine cannot say."""
        i = loss.by_ray
        call = self._pending.get(i)
        if call is None:
            call = self._pending[i] = Call(self._box, i, self.clock())
        deadline = time.monotonic() + CAUSE_WAIT
        while not call.done.wait(0.1):
            if time.monotonic() >= deadline or self._still_out(i, call).since >= ENGINE_PATIENCE:
                return loss
        del self._pending[i]
        if call.error is not None:
            return loss
        known = [*boxes]
        known[i] = call.result
        return judge(self.expected, known, table, down) or loss

    def overdue(self, now: float) -> bool:
        """An engine silent for ENGINE_PATIENCE (a call still out, its ping unanswered as long, or
        calls failing since then: an engine killed refuses them): its node is to be named now, not
        at the next look (which may be up to ``every`` seconds away). Asked often (each tick, each poll
        of a bring-up), it also asks again, every PING_EVERY, the ping of each engine whose call is still
        out: between looks far apart (15.6 s at 1,000 nodes) a slow engine that answers stays heard, and
        is not named at the first tick after its last ping grew ENGINE_PATIENCE old."""
        out = {i: call.began for i, call in self._pending.items() if not call.done.is_set()}  # back: not silent
        for i in out:
            self._ping_again(i, now, PING_EVERY)
        silent = {**out, **self._silent_since}
        return any(self._silent(i, began, now) >= ENGINE_PATIENCE for i, began in silent.items())

    def check(self, force: bool = False) -> None:
        """Raise NodeLost when a node is lost; at most once per ``every`` seconds unless forced, or
        an engine's silence has just reached ENGINE_PATIENCE (named then, not up to a period later)."""
        now = self.clock()
        if not force and now - self._last < self.every and not self.overdue(now):
            return
        self._last = now
        loss = self.look()
        if loss is not None:
            raise NodeLost(loss)
