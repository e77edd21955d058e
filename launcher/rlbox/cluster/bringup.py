"""Starting a plan's nodes: what an engine's refusal to start one means in the operator's words, the
launcher's go for the workers that wait for it (ray_node.gated), given as Ray's node table fills, and
the nodes whose image differs from the others' (image_skew)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlbox.cluster.hosts import Node, Rounds, awaited, on_every
from rlbox.cluster.plan import NodePlan, RunPlan
from rlbox.cluster.ray_node import START_FIRST, gated, go_archive, paced, released
from rlbox.cluster.watch import ENGINE_PATIENCE, LOOK_WAIT, reported_address
from rlbox.core import engine
from rlbox.core.errors import RlboxError


def start_error(node: NodePlan, err: Exception) -> RlboxError:
    """The engine's refusal to create or start ``node``'s container, as one line naming the host and the fix."""
    reason = engine.reason(err)
    if "gathering device information" in reason or ("no such file or directory" in reason and "/dev/" in reason):
        dev = next((w.strip('":,') for w in reason.split() if w.strip('":,').startswith("/dev/")), "a device")
        return RlboxError(
            f"{node.host.name}: {dev} does not exist on the host; check the Ascend driver, "
            f"or pass --devices with the host's NPU count"
        )
    if "error setting rlimit" in reason:
        limits = dict((n, soft) for n, soft, _ in node.container.ulimits)
        return RlboxError(
            f"{node.host.name}: the engine refuses ulimit nofile={limits.get('nofile')}: its own hard limit is lower; "
            "pass --nofile N (at most the host's `ulimit -Hn`)"
        )
    if "bind source path does not exist" in reason:
        path = reason.rsplit("does not exist:", 1)[-1].strip()
        return RlboxError(f"{node.host.name}: {path} does not exist on the host; install the Ascend driver there, "
                          "or fix the --mount / mounts: entry")
    return RlboxError(f"{node.host.name}: cannot start {node.container.name}: {reason}")


@dataclass
class Gate:
    """The go of each gated worker, once Ray's node table holds enough of the workers before it
    (ray_node.released), or at once when no two nodes share a machine (``at_once``, ray_node.paced);
    once a bring-up (``given``). The go is the worker's go file (ray_node.go_file, its RLBOX_GO_FILE)
    written into the container, which stays whenever it came (before the node script set its trap, or
    while the container was stopped: a start again finds it), and a SIGUSR1 that ends the wait at once."""

    nodes: list[tuple[NodePlan, Node]]
    echo: Callable[[str], None]
    registered: int = 0
    given: set[int] = field(default_factory=set)
    at_once: bool = False  # no two nodes on one machine (ray_node.paced): every go at the first give
    ids: dict[int, str] = field(default_factory=dict)  # by node, its container's id (a go late from a
    # bring-up before a restart must not reach the container of the same name that replaced it)

    def __post_init__(self) -> None:
        self.calls = Rounds(self._go, LOOK_WAIT, key=lambda pair: pair[0].index)

    def give(self, registered: int | None = None) -> list[int]:
        """Give the go to every gated worker that may start now, all at once (one after another, at once
        on 1,000 nodes would be ~2,000 engine calls over ssh in turn), each waited for at most LOOK_WAIT (a
        go to an engine that does not answer holds neither the bring-up nor the other gos: the watch names
        that engine); the indexes whose go came back given by now (this give's, or an earlier one's)."""
        if registered is not None:
            self.registered = max(0, registered)
        upto = len(self.nodes) if self.at_once else released(self.registered)
        todo = [(p, n) for p, n in self.nodes if gated(p.index) and p.index <= upto and p.index not in self.given]
        self.given.update(p.index for p, _ in todo)
        now = []
        for (node_plan, _), call in self.calls.round(todo):
            why = call.result if call.error is None else engine.reason(call.error)
            if why is None:
                now.append(node_plan.index)
            else:
                self.echo(f"{node_plan.label}: cannot give it its go: {why}")
        return sorted(now)

    def line(self) -> str | None:
        """What the run says of its workers' start (None: no worker is gated: 9 nodes or fewer)."""
        if not any(gated(p.index) for p, _ in self.nodes):
            return None
        if self.at_once:
            return f"ray: workers past the first {START_FIRST} start at once too (each node on a machine of its own)"
        return (f"ray: workers past the first {START_FIRST} start as Ray registers the ones before them "
                "(nodes share one machine's CPUs, or a node's machine is not known)")

    def _go(self, pair: tuple[NodePlan, Node]) -> str | None:
        """One worker's go, to its container's id (or name): its go file, then the signal (either alone is a
        go); why neither could be given (None: given)."""
        node_plan, node = pair
        name, path = self.ids.get(node_plan.index) or node_plan.container.name, dict(node_plan.container.env)["RLBOX_GO_FILE"]
        why = None
        try:
            node.client.api.put_archive(name, path.rsplit("/", 1)[0], go_archive(path))
        except Exception as err:  # noqa: BLE001 - gone meanwhile, or its engine: the watch names that
            why = engine.reason(err)
        try:
            node.client.api.kill(name, signal="SIGUSR1")
        except Exception:  # noqa: BLE001 - stopped meanwhile: the file is its go when it starts again
            return why
        return None


def said_address(pair: tuple[NodePlan, Node]) -> str | None:
    """The address a node's script said it starts Ray on, from its container's output (None: not said yet,
    or not read: the container not there yet or gone, which the watch names)."""
    node_plan, node = pair
    try:
        text = node.client.containers.get(node_plan.container.name).logs().decode(errors="replace")
    except Exception:  # noqa: BLE001
        return None
    return reported_address(text)


SETTLE_WAIT = 30.0  # seconds the read after the cluster is ready waits, at most, for engines that answer pings


def address_reads() -> Rounds:
    """The reads of the nodes' address lines (said_address), by node, each waited for at most LOOK_WAIT."""
    return Rounds(said_address, LOOK_WAIT, key=lambda pair: pair[0].index)


def addresses_said(reads: Rounds, pairs: list[tuple[NodePlan, Node]], settle: bool = False) -> dict[int, str]:
    """By node index, the addresses ``pairs``' nodes said, of the reads back within LOOK_WAIT. ``settle``
    (the cluster is ready: no look comes after): a read still out is waited for as long as its engine
    answers its ping (a loaded engine: slow, not lost), up to SETTLE_WAIT in all (an engine that answers
    its ping, not this read), and left once that is silent for ENGINE_PATIENCE (the run's watch names it)."""
    back = reads.round(pairs)
    if settle:
        until = time.monotonic() + SETTLE_WAIT
        out = [(pair[1], reads.out[reads.key(pair)][1]) for pair in pairs if reads.key(pair) in reads.out]
        on_every(lambda node_call: awaited(node_call[1], node_call[0], ENGINE_PATIENCE, until), out)
        back += reads.round([])
    # what the node says wins over what its engine gave (the same on a simulation)
    return {node_plan.index: call.result for (node_plan, _), call in back if call.result}


def gate_for(nodes: list[tuple[NodePlan, Node]], echo: Callable[[str], None], ids: dict[int, str] | None = None) -> Gate:
    """A bring-up's gate: every go at once when no two nodes share a machine (ray_node.paced)."""
    return Gate(nodes, echo, at_once=not paced([node.machine() for _, node in nodes]), ids=dict(ids or {}))


@dataclass
class Phases:
    """Where a bring-up's seconds went: each phase timed from the end of the one before it (a phase
    that comes again, as after a restart, adds up); said as one line once the cluster is ready."""

    clock: Callable[[], float] = time.monotonic
    spent: dict[str, float] = field(default_factory=dict)
    last: float = field(init=False)

    def __post_init__(self) -> None:
        self.last = self.clock()

    def mark(self, phase: str) -> None:
        now = self.clock()
        self.spent[phase] = self.spent.get(phase, 0.0) + now - self.last
        self.last = now

    def line(self) -> str:
        return "bring-up: " + ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.spent.items())


def held_images(image: str, nodes: list[Node]) -> tuple[str | None, ...]:
    """The image id each node's engine holds under ``image`` (None: not there, or not answered: the
    delivery step that follows asks again and says why)."""

    def held(node: Node) -> str | None:
        try:
            return node.client.images.get(image).id
        except Exception:  # noqa: BLE001 - ImageNotFound, or the engine: asked again by the delivery step
            return None

    return tuple(on_every(held, nodes)[0])


def image_skew(plan: RunPlan, ids: list[str]) -> str | None:
    """One line naming the node(s) whose image, under the run's tag, is not the one most nodes
    (the head, on a tie) have; None when every node has the same image."""
    counts = {i: ids.count(i) for i in ids}
    if len(counts) < 2:
        return None
    common = max(counts, key=lambda i: (counts[i], i == ids[0]))
    odd = [(n, i) for n, i in zip(plan.nodes, ids) if i != common]
    names = ", ".join(f"{n.host.name} has {i[7:19] if i.startswith('sha256:') else i[:12]}" for n, i in odd)
    return (f"image {plan.image} differs between nodes: {names}, the others {common[7:19] if common.startswith('sha256:') else common[:12]}; "
            "load the same image on every node (docker save | docker load, or pull it again) before running")
