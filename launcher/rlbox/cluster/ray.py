"""Cluster readiness through the Ray dashboard's REST API (no `import ray` on the operator's side)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import requests

from rlbox.cluster.hosts import Call
from rlbox.core.errors import RlboxError


@dataclass(frozen=True)
class RayNode:
    ip: str
    alive: bool
    head: bool
    npus: int
    message: str = ""  # Ray's state_message: why a DEAD node died


def nodes(base: str, timeout: float = 5.0, session: requests.Session | None = None) -> list[RayNode]:
    """Every node the GCS knows, from ``GET /api/v0/nodes?detail=1`` (over ``session``'s kept
    connection when given)."""
    resp = (session or requests).get(f"{base}/api/v0/nodes", params={"detail": "1"}, timeout=timeout)
    resp.raise_for_status()
    rows = resp.json()["data"]["result"]["result"]
    return [
        RayNode(
            ip=row.get("node_ip", ""),
            alive=row.get("state") == "ALIVE",
            head=bool(row.get("is_head_node")),
            npus=int((row.get("resources_total") or {}).get("NPU", 0)),
            message=row.get("state_message") or "",
        )
        for row in rows
    ]


POLL = 0.25  # seconds between two reads of Ray's node table while a cluster comes up


def wait_for_npus(
    base: str,
    expected: dict[str, str],
    total: int,
    timeout: float,
    progress: Callable[[int, int, int], None] | None = None,
    alive_check: Callable[[], str | None] | None = None,
    poll: float = POLL,
) -> list[RayNode]:
    """Poll until ``total`` NPUs have joined. ``expected`` maps node label -> address.

    ``alive_check`` may report a fatal condition (a node container that exited) to stop early.
    On timeout, raise naming the nodes that never joined. The reads share one kept connection
    (a new one a read cost the head's dashboard and this process ~3 ms more of CPU each), each on a
    thread (hosts.Call) waited for at most ``poll``: one not back then (a head cut off the network holds
    it its whole 5 s) is waited for again at the next poll, and ``alive_check`` keeps its pace meanwhile.
    """
    with requests.Session() as session:
        deadline = time.monotonic() + timeout
        last_seen: list[RayNode] = []
        last_report = read = None
        while True:
            began = time.monotonic()
            read = read or Call(lambda _: nodes(base, session=session), None, began)
            if read.done.wait(poll):
                if read.error is None:
                    last_seen = read.result
                elif not isinstance(read.error, (requests.RequestException, KeyError, ValueError)):
                    raise read.error  # anything but a dashboard not up (yet) is raised, as it was
                read = None
            alive = [n for n in last_seen if n.alive]
            have = sum(n.npus for n in alive)
            if progress and (len(alive), have) != last_report:
                progress(len(alive), have, total)
                last_report = (len(alive), have)
            if have >= total and len(alive) >= len(expected):
                return alive
            problem = alive_check() if alive_check else None
            if problem or time.monotonic() >= deadline:
                joined = {n.ip for n in alive}
                missing = [label for label, addr in expected.items() if addr not in joined]
                why = problem or f"timed out after {timeout:.0f} s"
                names = ", ".join(missing) if missing else "none missing by address"
                raise RlboxError(
                    f"cluster not ready ({why}): {have}/{total} NPUs from {len(alive)}/{len(expected)} nodes; "
                    f"never joined: {names}"
                )
            time.sleep(max(0.0, poll - (time.monotonic() - began)))
