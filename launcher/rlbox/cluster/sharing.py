"""Runs that share hosts: which NPUs a run takes (``--devices 8`` or ``0-7``/``8-15``/``0,2,4,6``),
the ports that follow from them (Ray's block and HCCL's ranges), and claiming both on a host
atomically.

Ports follow the run's *slot*, the lowest NPU id it uses: runs sharing a host hold disjoint
NPUs, so their slots, and with them every port, differ. A claim is a container that is created
and never started on the host's engine, named after what it holds (``rlbox-claim-npu03``, or
``rlbox-claim-all`` for a run that takes every NPU the host has; on a simulation, whose hosts share
this machine's engine, ``rlbox-claim-HOST-npu03``): never after the name a run gives a real host, so
two runs calling one machine by two names (``node1``, ``10.0.0.5``) claim the same NPUs under the same
names. The engine refuses a second container of the same
name, so of two runs racing for one NPU exactly one gets it (a whole host against one of its NPUs:
``_crossed``). On
each engine claims are taken in one global order (by name); a run claiming on several engines
first takes every engine's claims lock, all or none (it never holds one while it waits for
another), then claims on all of them at once. So two racing runs never both fail (their claims
on a shared engine never overlap in time: the first to claim wins); the loser removes what it
took and is told which run holds the rest. The locks only order racing runs: what is held is decided by the
claims alone, so a lock taken over from a run that died mid-claim never lets two runs hold one
NPU. Claims carry the label
``io.rlbox.claim=RUN`` and go with the run's containers. Two starts of one run name are
serialised by a start lock (a claim held from the name until the run's containers exist): the
second is refused and touches nothing, so a --replace never clears what another start of the
name is still taking; a run's teardown removes only its own run id's containers and claims.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rlbox.cluster import holder as lock_holder
from rlbox.cluster.spec import host_key
from rlbox.core import engine
from rlbox.core.errors import RlboxError

MAX_NPU_ID = 31  # ids 0..31: 32 slots, each with its own Ray block and HCCL ranges
RAY_BASE, RAY_BLOCK = 20000, 1000  # slot s: Ray ports 20000 + 1000 s .. + 999 (20000-51999)
HCCL_BASE, HCCL_BLOCK = 60100, 160  # slot s: 60100 + 160 s .. + 159 (60100-65219, under 65520)
LABEL_CLAIM = "io.rlbox.claim"
LABEL_CLAIM_ID = "io.rlbox.claim-run-id"
LABEL_CLAIM_WHAT = "io.rlbox.claim-what"
LABEL_CLAIM_SCOPE = "io.rlbox.claim-scope"  # an NPU claim's scope (sharing.scope): "" the engine's machine
LABEL_CLAIM_HOLDER = "io.rlbox.claim-holder"  # a claims lock's holder process (lock_holder.here)
CLAIMS_LOCK = "rlbox-claims-lock"  # one per engine, held by a run while it claims there
# seconds: a lock is held while its run claims (about a second); longer, its rlbox died. Only for a holder
# this machine cannot ask about (another machine or pid namespace): one of this machine is asked (lock_holder.gone)
LOCK_WAIT = 30.0


def parse_devices(text: str | None) -> int | tuple[int, ...] | None:
    """``--devices``: a count (``8``) or NPU ids (``0-7``, ``8-15``, ``0,2,4,6``, ``0-3,8-11``)."""
    if text is None:
        return None
    raw = str(text).strip()
    # [0-9], not \d: Python's \d also matches full-width and Arabic-Indic digits (３, ٠-٣)
    if re.fullmatch(r"[0-9]{1,3}", raw):
        count = int(raw)
        if not 0 < count <= MAX_NPU_ID + 1:
            raise RlboxError(f"--devices {raw}: a count is 1..{MAX_NPU_ID + 1}")
        return count
    if not re.fullmatch(r"[0-9]{1,3}(-[0-9]{1,3})?(,[0-9]{1,3}(-[0-9]{1,3})?)*", raw):
        raise RlboxError(f"--devices {text!r}: give a count (8) or NPU ids (0-7, 8-15, 0,2,4,6)")
    ids: set[int] = set()
    for part in raw.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first > last or last > MAX_NPU_ID:
            raise RlboxError(f"--devices {raw}: '{part}' is not a range of NPU ids within 0..{MAX_NPU_ID}")
        overlap = ids & set(range(first, last + 1))
        if overlap:
            raise RlboxError(f"--devices {raw}: NPU {min(overlap)} is named twice")
        ids.update(range(first, last + 1))
    return tuple(sorted(ids))


def ids_text(ids: tuple[int, ...]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``0-3,8``."""
    parts, start = [], None
    for i, n in enumerate(ids):
        if start is None:
            start = n
        if i + 1 == len(ids) or ids[i + 1] != n + 1:
            parts.append(f"{start}-{n}" if n > start else str(n))
            start = None
    return ",".join(parts)


def ray_base(slot: int) -> int:
    return RAY_BASE + RAY_BLOCK * slot


def hccl_env(slot: int, hardware: str) -> dict[str, str]:
    """HCCL's ports for a slot. ``HCCL_IF_BASE_PORT``: the host NIC ports of root-info
    communicators (CANN 8.2/8.3 take 32 from the base; default 60000). On A3 also
    ``HCCL_HOST_SOCKET_PORT_RANGE`` (host side, CANN >= 8.1.RC1; it wins over the base port) and
    ``HCCL_NPU_SOCKET_PORT_RANGE`` (NPU side, default 16666), 64 ports each: at least one per
    HCCL process of the host. On A2 / A+X only the base port: CANN does not support the two
    ranges there with MC2 fused operators (pass them with --env to opt in)."""
    base = HCCL_BASE + HCCL_BLOCK * slot
    env = {"HCCL_IF_BASE_PORT": str(base)}
    if hardware == "a3":
        env["HCCL_HOST_SOCKET_PORT_RANGE"] = f"{base + 32}-{base + 95}"
        env["HCCL_NPU_SOCKET_PORT_RANGE"] = f"{base + 96}-{base + 159}"
    return env


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def name_claim(plan) -> tuple[int, str, str]:
    return (0, f"rlbox-claim-run-{plan.run}", f"run name '{plan.run}'")


def scope(plan, host) -> str:
    """Where a host's NPU claims live on its engine: "" for a real host, whose engine is that machine's
    whatever name a run gives it (``node1``, ``10.0.0.5`` and ``localhost`` may be one machine's NPUs);
    the host's name for a simulated one (all of a simulation's hosts share this machine's engine)."""
    return host.name if plan.sim else ""


def _npu_claim(plan, host, part: str) -> str:
    where = scope(plan, host)
    return f"rlbox-claim-{_safe(where)}-{part}" if where else f"rlbox-claim-{part}"


def claims(plan) -> list[tuple[int, str, str]]:
    """What a run claims, as (node index, claim container name, what it holds), in the one
    global order: the run's name on the head's engine, every NPU of every node (a node that
    takes its whole host: the host, in one claim), and for a simulation the dashboard port it
    publishes on this machine. An NPU claim is named by its ``scope``, not by the name a run
    gives the host."""
    out = [name_claim(plan)]
    for node in plan.nodes:
        if node.whole_host:  # every NPU of the host: one claim (a host's 16 cost 16 creates and 16 removes)
            out.append((node.index, _npu_claim(plan, node.host, "all"), f"every NPU of {node.host.name}"))
            continue
        for i in node.npu_ids:
            out.append((node.index, _npu_claim(plan, node.host, f"npu{i:02d}"), f"NPU {i} of {node.host.name}"))
    if plan.sim:
        port = plan.ports.dashboard
        out.append((0, f"rlbox-claim-port-{port}", f"port {port} of this machine (simulated dashboard)"))
    return sorted(out, key=lambda c: c[1])


STALE_START = 120.0  # seconds: a start of one run name holds its lock for seconds; older, its rlbox died


def start_lock(plan) -> tuple[int, str, str]:
    """The lock every start of a run name holds from taking the name until its containers exist:
    of two `rlbox run --name X` (with or without --replace) at once, exactly one gets it; a
    --replace after it finds the earlier run's containers and claims all there to take over."""
    return (0, f"rlbox-claim-run-{plan.run}-starting", f"the start of run '{plan.run}'")


def claim_name(plan, nodes, replace: bool) -> None:
    """Take the start lock, then the run's name (before an earlier run of the name is cleared).
    A second start of the same name meanwhile is refused plainly and touches nothing. Under
    --replace an earlier run's name claim is taken over (its containers and claims are removed
    next, by the caller, which ends the start with ``end_start``)."""
    _take_start_lock(plan, nodes, replace)
    try:
        try:
            claim(plan, nodes, [name_claim(plan)])
        except RlboxError:
            if not replace:
                raise
            release(nodes[0].client, plan.run, keep_id=plan.run_id)  # the earlier run's; never our lock
            claim(plan, nodes, [name_claim(plan)])
    except BaseException:
        end_start(plan, nodes)
        raise


def _take_start_lock(plan, nodes, replace: bool) -> None:
    import datetime

    from docker.errors import NotFound

    lock = start_lock(plan)
    for _ in range(2):
        try:
            claim(plan, nodes, [lock])
            return
        except RlboxError:
            pass
        client = nodes[0].client
        try:
            box = client.containers.get(lock[1])
        except NotFound:
            continue  # it ended in between: try again
        holder = box.labels.get(LABEL_CLAIM_ID, "?")
        try:
            created = datetime.datetime.fromisoformat(box.attrs.get("Created", "")[:26].rstrip("Z") + "+00:00")
            age = (datetime.datetime.now(datetime.timezone.utc) - created).total_seconds()
        except ValueError:
            age = 0.0
        if replace and age > STALE_START:  # its rlbox died mid-start: --replace takes over
            engine.remove_quietly(box)
            continue
        raise RlboxError(f"another `rlbox run --name {plan.run}` (run id {holder}) is starting right now; this one "
                         "stopped and touched nothing (wait for it, then `rlbox run --replace` if you mean to "
                         f"replace it; `rlbox stop --name {plan.run}` ends it)")
    raise RlboxError(f"cannot take the start lock of run '{plan.run}': it keeps changing hands; try again")


def end_start(plan, nodes) -> None:
    """Give back the start lock (this run id's only)."""
    for box in nodes[0].client.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_CLAIM_ID}={plan.run_id}"}):
        if box.name == start_lock(plan)[1]:
            engine.remove_quietly(box)


def holder_of_name(plan, nodes) -> str | None:
    """The run id holding this run's name now (None: nobody), to tell a run taken over by
    another `rlbox run --replace` from one that failed on its own."""
    from docker.errors import NotFound

    try:
        return nodes[0].client.containers.get(name_claim(plan)[1]).labels.get(LABEL_CLAIM_ID)
    except NotFound:
        return None


def claim(plan, nodes, which: list[tuple[int, str, str]] | None = None) -> int:
    """Take the claims of ``plan`` (``which``, default all but its name) on the connected
    ``nodes``, or none: on a conflict, remove what was taken and raise naming the run that
    holds it. Returns how many were taken. On several engines, or NPUs on one: every engine's claims
    lock (``_take_locks``), then every engine's claims at once (one thread each)."""
    if which is None:
        which = [c for c in claims(plan) if c != name_claim(plan)]
    groups: dict[tuple, list[tuple[int, str, str]]] = {}
    for c in which:  # per engine, each engine's claims in the global order
        groups.setdefault(_engine_of(nodes[c[0]]), []).append(c)
    if len(groups) < 2 and not any(_npus_of(what) for _, _, what in which):
        return len(_claim_on(plan, nodes, which, threading.Event()))
    locks: list[tuple[object, str]] = []
    futures: list = []
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=min(len(groups), 32))
    try:
        _take_locks(plan, [nodes[groups[key][0][0]] for key in sorted(groups)], locks)
        for group in groups.values():
            futures.append(pool.submit(_claim_on, plan, nodes, group, stop))
        pool.shutdown(wait=True)
        errors = [f.exception() for f in futures if not isinstance(f.exception(), (_Stopped, type(None)))]
        if errors:
            raise errors[0]
        return sum(len(f.result()) for f in futures)
    except BaseException:  # a conflict, a failure, or Ctrl-C anywhere above: stop every engine's claiming, undo it all
        stop.set()
        if not isinstance(sys.exc_info()[1], RlboxError):
            engine.ignore_interrupts()
        pool.shutdown(wait=True)
        for f in futures:
            if f.exception() is None:
                for client, made in f.result():
                    engine.remove_id_quietly(client, made)
        raise
    finally:
        for client, made in locks:
            engine.remove_id_quietly(client, made)


# A claim of NPUs: a whole host's ("every NPU of HOST", named -all) or one NPU's ("NPU 3 of HOST", -npu03),
# told by what it holds (its label), never by its name (a run named "x-all" has a name claim ending so). The two
# kinds of one host have different names, so the engine does not decide between them: a run that took either
# looks, once its claims on an engine are made, for the other kind on its hosts held by another run, and gives
# all back if it finds one (``_crossed``). Racing runs hold the engine's claims lock, so the second one to claim
# sees the first's; should the lock be taken over from a run still claiming, each looks after its own creates,
# so at least one of the two sees the other: two runs never hold one NPU.
_WHOLE, _ONE = re.compile(r"every NPU of (.+)"), re.compile(r"NPU ([0-9]+) of (.+)")


def _npus_of(what: str) -> tuple[str, bool, int | None] | None:
    """(host, whole, NPU id: None for a whole host) of a claim holding NPUs, from what it holds; None for
    any other claim."""
    m = _WHOLE.fullmatch(what)
    if m:
        return m.group(1), True, None
    m = _ONE.fullmatch(what)
    return (m.group(2), False, int(m.group(1))) if m else None


def _crossed(plan, nodes, which: list[tuple[int, str, str]]) -> RlboxError | None:
    """The refusal of ``which`` (claims of one engine) when another run holds the other kind of claim
    on one of its hosts (a whole host against one of its NPUs, or the reverse), a host told by its
    ``scope``, not its name; or, made by an rlbox before scopes (no scope label: on a real host's
    engine it named the claim after its own name for the machine), any claim of one of its NPUs. Else None."""
    mine: dict[str, tuple[str, bool, frozenset[int]]] = {}  # by scope: this run's name for the host, whole, NPU ids
    for index, _, what in which:
        held = _npus_of(what)
        if held:
            where = scope(plan, nodes[index].host)
            name, whole, ids = mine.get(where, (held[0], False, frozenset()))
            mine[where] = (name, whole or held[1], ids if held[1] else ids | {held[2]})
    if not mine:
        return None
    for box in nodes[which[0][0]].client.api.containers(all=True, filters={"label": LABEL_CLAIM}):
        labels = box.get("Labels") or {}
        what = labels.get(LABEL_CLAIM_WHAT, "")
        theirs = _npus_of(what)
        if labels.get(LABEL_CLAIM_ID) == plan.run_id or not theirs:
            continue
        older = LABEL_CLAIM_SCOPE not in labels  # its claims' names never meet this run's on a real host
        where = labels.get(LABEL_CLAIM_SCOPE, theirs[0] if plan.sim else "")
        if where not in mine:
            continue
        name, whole, ids = mine[where]
        if whole or theirs[1] or (older and theirs[2] in ids):
            in_my_words = ("every NPU of " if theirs[1] else f"NPU {theirs[2]} of ") + name
            return _held(plan, in_my_words, labels)
    return None


def _held(plan, what: str, holder: dict[str, str]) -> RlboxError:
    """The refusal of a claim on ``what``, held by the run of ``holder`` (its claim's labels)."""
    mine, theirs = _npus_of(what), _npus_of(holder.get(LABEL_CLAIM_WHAT, ""))
    if mine and theirs and holder.get(LABEL_CLAIM_ID) == plan.run_id and mine[0] != theirs[0]:
        first, second = sorted((theirs[0], mine[0]))  # sorted: which of the two claims first is a race
        return RlboxError(f"hosts {first} and {second} are one machine (one engine answers both): list each machine once")
    if mine and theirs and mine[0] != theirs[0]:
        what = f"{what} (as {theirs[0]})"  # the holder's run calls the machine so
    run = holder.get(LABEL_CLAIM) or plan.run if what.startswith("run name") else holder.get(LABEL_CLAIM, "?")
    if run == plan.run:
        return RlboxError(f"{what} is held by run '{run}' (id {holder.get(LABEL_CLAIM_ID, '?')}): another "
                          f"`rlbox run --name {run}` is starting, or one was killed (`rlbox stop --name {run}` "
                          "clears it; --replace takes it over)")
    other = "other hosts" if _WHOLE.fullmatch(what) else "other NPUs (--devices) or hosts"  # none of a whole host's is free
    return RlboxError(f"{what} is held by run '{run}' (id {holder.get(LABEL_CLAIM_ID, '?')}); "
                      f"choose {other}, or wait for it (`rlbox stop --name {run}` ends it)")


def _engine_of(node) -> tuple:
    """Which engine a node's claims go to, as a key that sorts the same for every run: this
    machine's (every simulated node, each with a client of its own), or its host's (name, port)."""
    return ("", 0) if node.host.local else host_key(node.host)


class _Stopped(Exception):
    """An engine's claiming stopped because another engine's failed."""


def _labels(plan, what: str, where: str | None = None, held_by: str = "") -> dict[str, str]:
    labels = {engine.LABEL_MANAGED: "true", LABEL_CLAIM: plan.run, LABEL_CLAIM_ID: plan.run_id, LABEL_CLAIM_WHAT: what}
    labels = labels if where is None else {**labels, LABEL_CLAIM_SCOPE: where}
    return {**labels, LABEL_CLAIM_HOLDER: held_by} if held_by else labels


def _create(plan, client, name: str, what: str, where: str | None = None, held_by: str = "") -> str:
    """A never-started container ``name`` holding ``what`` for this run id (a claim or a claims lock, ``held_by``
    this process: lock_holder.here; the engine refuses a second of the name: 409). The low-level
    create: one call to the engine (the high-level one reads the container back)."""
    return client.api.create_container(plan.image, ["true"], name=name, labels=_labels(plan, what, where, held_by),
                                       host_config=client.api.create_host_config(network_mode="none"))["Id"]


def _take_locks(plan, nodes, locks: list) -> None:
    """Every engine's claims lock, into ``locks`` as each is taken (so a caller's ``finally``
    gives back all it holds, however this ends). All or none: when one is taken, those held
    are given back, the busy one is waited for, and all are taken again. So a held lock always
    means "claiming now": held for about a second, never while its holder waits, and one held
    LOCK_WAIT by the same holder is a dead rlbox's, taken over. A lock this run holds already
    (one engine under two names) counts as taken."""
    while True:
        busy = None
        for node in nodes:
            if not _try_lock(plan, node, locks):
                busy = node
                break
        if busy is None:
            return
        while locks:
            client, made = locks.pop()
            engine.remove_id_quietly(client, made)
        _wait_for_lock(busy)


def _try_lock(plan, node, locks: list) -> bool:
    from docker.errors import APIError

    client = node.client
    try:
        made = _create(plan, client, CLAIMS_LOCK, "claims lock", held_by=lock_holder.here())
    except APIError as err:
        if err.status_code != 409:
            raise RlboxError(f"{node.host.name}: cannot take the claims lock: {engine.reason(err)}") from None
        try:
            return client.containers.get(CLAIMS_LOCK).labels.get(LABEL_CLAIM_ID) == plan.run_id
        except Exception:  # noqa: BLE001 - given back meanwhile: busy for now, tried again at once
            return False
    except BaseException:  # the answer lost on the way back: a lock of ours may be there
        _remove_own(plan, client, CLAIMS_LOCK)
        raise
    locks.append((client, made))
    return True


def _wait_for_lock(node) -> None:
    """Until the engine's claims lock is given back, or its holder is known to have died mid-claim
    (then removed): at once when the holder was a process of this machine that has ended (this
    machine's kernel says so: lock_holder.gone), else once the same lock was held LOCK_WAIT (one that
    changed hands is another run's, waited afresh)."""
    client = node.client
    seen, since = None, time.monotonic()
    while True:
        try:
            lock = client.api.inspect_container(CLAIMS_LOCK)
        except Exception:  # noqa: BLE001 - given back
            return
        if lock["Id"] != seen:
            seen, since = lock["Id"], time.monotonic()
        held_by = ((lock.get("Config") or {}).get("Labels") or {}).get(LABEL_CLAIM_HOLDER)
        if lock_holder.gone(held_by) or time.monotonic() - since > LOCK_WAIT:
            engine.remove_id_quietly(client, seen)
            return
        time.sleep(0.05)


def _remove_own(plan, client, name: str) -> None:
    try:
        box = client.containers.get(name)
    except Exception:  # noqa: BLE001 - never made, or the engine is still away: nothing more to do
        return
    if box.labels.get(LABEL_CLAIM_ID) == plan.run_id:
        engine.remove_quietly(box)


def _claim_on(plan, nodes, which: list[tuple[int, str, str]], stop: threading.Event) -> list[tuple[object, str]]:
    """Take ``which`` one after another (claims of one engine, or all when there is one); on any
    failure remove what this call took, tell the other engines' calls to stop (``stop``), raise."""
    from docker.errors import APIError, NotFound

    taken = []
    try:
        for index, name, what in which:
            if stop.is_set():
                raise _Stopped()
            client = nodes[index].client
            try:
                where = scope(plan, nodes[index].host) if _npus_of(what) else None
                taken.append((client, _create(plan, client, name, what, where)))
            except APIError as err:
                if err.status_code != 409:
                    raise RlboxError(f"{nodes[index].host.name}: cannot claim {what}: {engine.reason(err)}") from None
                holder = {}
                for _ in range(20):  # the engine reserves a name before the container can be read
                    try:
                        holder = client.containers.get(name).labels
                        break
                    except NotFound:
                        time.sleep(0.05)
                raise _held(plan, what, holder) from None
        if which and not stop.is_set():
            crossed = _crossed(plan, nodes, which)
            if crossed is not None:
                raise crossed
    except BaseException as err:
        stop.set()
        for client, made in taken:
            engine.remove_id_quietly(client, made)
        if not isinstance(err, _Stopped):
            _remove_unanswered(plan, nodes, which, len(taken))
        raise
    return taken


def _remove_unanswered(plan, nodes, which, answered: int) -> None:
    """A create the engine carried out but whose answer never came (the client's read timed out)
    is a claim of this run id that ``taken`` does not hold: removed by its name and run id, so that
    a failed start leaves no claim (a start lock left so refused the next start of the name)."""
    for index, name, _ in which[answered:answered + 1]:
        _remove_own(plan, nodes[index].client, name)


def release(client, run: str, keep_id: str | None = None) -> None:
    """Remove run ``run``'s claims on one engine (but those of run id ``keep_id``)."""
    # the low-level list: simulated nodes share one engine and release at once, and the
    # high-level one reads each container again (one removed in between would fail it)
    for box in client.api.containers(all=True, filters={"label": f"{LABEL_CLAIM}={run}"}):
        if keep_id is None or (box.get("Labels") or {}).get(LABEL_CLAIM_ID) != keep_id:
            engine.remove_id_quietly(client, box["Id"])


def release_own(client, run: str, run_id: str) -> None:
    """Remove the claims run id ``run_id`` of run ``run`` holds on one engine, and nothing else."""
    for box in client.api.containers(all=True, filters={"label": f"{LABEL_CLAIM_ID}={run_id}"}):
        if (box.get("Labels") or {}).get(LABEL_CLAIM) == run:
            engine.remove_id_quietly(client, box["Id"])
