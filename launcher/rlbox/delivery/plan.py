"""Image delivery, the planning half: which nodes need the image, from where, in what order, and
which layers need not travel. Pure: facts in (gathered by rlbox.delivery.execute), a printable
DeliveryPlan out; nothing here touches a host.

The rules:
- The right image is the one this machine's engine holds under the name; without it, the one
  every node that holds the name agrees on. Nodes that disagree are named, never guessed between.
- A node holding the right image id is skipped. A node lacking the name receives it. A node with
  a different image under the same name is a conflict: refused (named with both ids) unless
  ``force``, when it receives the right one (docker load moves the tag).
- Source: a reference that names a registry is pulled on every receiving node at once (the
  registry fans out; every engine skips the layers it holds); a node whose pull fails falls back
  to the stream. The stream comes from this machine's engine (``docker save``), else from a node
  holding the right image (its ``docker save`` relayed through this machine).
- The stream is a tree (``tree``): the source feeds one node, and every node tees what it receives
  into its ``docker load`` and forwards it to up to ``fanout`` nodes over ssh with the forwarded
  agent. ``fanout_for(N)``: 1 (a chain: every node receives once and sends once, what a network
  of equal links carries fastest) up to CHAIN_MAX nodes; 2 beyond, so that the depth stays
  log2(N) (each hop adds an ssh and a pipe buffer, cuts off what is below it when it fails, and
  the command it passes on grows with what is below it). With ``via="launcher"`` (nodes cannot
  ssh to each other) this machine writes to every node itself. A node that is the source sends
  from its own ``docker save`` to its children directly, never through this machine.
- Per-node layer sets: each node is sent only the layers it lacks. A layer a node holds (by chain
  id: the layer and all below it) is left out of its stream: ``docker load`` never opens the
  file of a layer whose chain id is present (moby image/tarexport/load.go), so the tar loads
  without it. Nodes that lack the same layers share one stream (``Group``); the filter runs
  where the tar passes through this machine, so a stream from a node carries every layer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

STREAM_VIAS = ("chain", "launcher")
CHAIN_MAX = 16  # up to this many nodes in one stream: a chain; beyond, a binary tree
# At most this many nodes in one stream: the command the first node receives names every node
# below it (about 50 bytes each) and must stay under the kernel's 128 KB for one argument. A
# larger group is split into streams of this size, each from the source.
STREAM_MAX = 1024


def fanout_for(n: int) -> int:
    """How many nodes each node forwards to, for a stream to ``n`` nodes."""
    return 1 if n <= CHAIN_MAX else 2


def tree(order: tuple[str, ...], fanout: int) -> tuple[tuple[str, str], ...]:
    """(node, parent) in pre-order; parent "" is the source, which feeds the first node only.
    Node i (i >= 1) hangs under node (i - 1) // fanout: fanout 1 is the chain."""
    if fanout < 1:
        raise PlanError(f"fanout must be at least 1, not {fanout}")
    if not order:
        return ()
    kids: dict[int, list[int]] = {}
    for i in range(1, len(order)):
        kids.setdefault((i - 1) // fanout, []).append(i)
    out: list[tuple[str, str]] = []
    stack = [(0, "")]
    while stack:
        i, parent = stack.pop()
        out.append((order[i], parent))
        stack.extend((k, order[i]) for k in reversed(kids.get(i, [])))
    return tuple(out)


def depth(edges: tuple[tuple[str, str], ...]) -> int:
    """Hops from the source to the deepest node."""
    level: dict[str, int] = {"": 0}
    for name, parent in edges:
        level[name] = level[parent] + 1
    return max(level.values())


def chain_ids(diff_ids: tuple[str, ...]) -> tuple[str, ...]:
    """The chain id of every layer prefix: chain(0) = diff(0); chain(i) = sha256(chain(i-1) + " " + diff(i))."""
    out: list[str] = []
    for diff in diff_ids:
        if not out:
            out.append(diff)
        else:
            out.append("sha256:" + hashlib.sha256(f"{out[-1]} {diff}".encode()).hexdigest())
    return tuple(out)


@dataclass(frozen=True)
class ImageFacts:
    """One engine's image under the name: its id, layers (diff ids, lowest first) and size."""

    id: str
    diff_ids: tuple[str, ...] = ()
    size: int = 0


@dataclass(frozen=True)
class NodeFacts:
    """What one node's engine holds: the image under the name (None: absent), and the chain ids
    of every layer of every image it has (what docker load may skip)."""

    name: str
    image: ImageFacts | None = None
    chains: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Target:
    name: str
    reason: str  # "missing" | "differs"
    old_id: str | None = None


@dataclass(frozen=True)
class Group:
    """One stream: the nodes that lack the same layers, the layers left out of it, and its tree
    ((node, parent) in pre-order; parent "" is the source)."""

    omitted: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.edges)


@dataclass(frozen=True)
class DeliveryPlan:
    image: str
    image_id: str | None  # None only when the registry alone has it (the pulls must agree)
    diff_ids: tuple[str, ...]
    size: int
    targets: tuple[Target, ...]
    skipped: tuple[str, ...]  # nodes that hold the right image
    registry: str | None  # pull from this registry first
    source: str | None  # "local" or a node's name: where the stream starts; None: no stream possible
    via: str = "chain"
    omitted: tuple[str, ...] = ()  # diff ids held by every target (left out of every stream)
    conflicts: tuple[Target, ...] = field(default=())  # differing nodes, refused (no --force)
    groups: tuple[Group, ...] = ()  # the streams: per set of layers lacked, a tree
    fanout: int = 1

    @property
    def needed(self) -> bool:
        return bool(self.targets)

    @property
    def order(self) -> tuple[str, ...]:
        """Receiving nodes in stream order (the cluster's order)."""
        return tuple(t.name for t in self.targets)

    def describe(self) -> str:
        lines = [f"image    {self.image}"
                 + (f"  id {short(self.image_id)}" if self.image_id else "  id: the registry's")
                 + (f", {human(self.size)}, {len(self.diff_ids)} layers" if self.diff_ids else "")]
        for name in self.skipped:
            lines.append(f"  {name:24} has it: skipped")
        for t in self.targets:
            what = "missing" if t.reason == "missing" else f"holds {short(t.old_id)} under the name: replaced (--force)"
            lines.append(f"  {t.name:24} {what}: receives it")
        for t in self.conflicts:
            lines.append(f"  {t.name:24} holds {short(t.old_id)} under the name: REFUSED (pass --force to replace it)")
        if not self.targets:
            lines.append("nothing to deliver")
            return "\n".join(lines) + "\n"
        source = "this machine (docker save)" if self.source == "local" else (
            f"{self.source} (docker save there, " + ("relayed through this machine)" if self.via == "launcher"
                                                     else "sent from it directly)") if self.source else None)
        if self.registry:
            lines.append(f"source   registry {self.registry}: docker pull on every receiving node at once"
                         + (f"; a failed pull falls back to the stream from {source}" if source else ""))
        elif source:
            lines.append(f"source   {source}")
        if source:
            root = "this machine" if self.source == "local" else self.source
            for k, g in enumerate(self.groups):
                tag = "stream  " if len(self.groups) == 1 else f"stream {k + 1}"
                lines.extend(f"{tag} {line}" for line in self._tree_lines(g, root))
                if self.omitted and len(self.groups) == 1:
                    kept = len(self.diff_ids) - len(self.omitted)
                    lines.append(f"layers   {len(self.omitted)} of {len(self.diff_ids)} held by every receiving node: "
                                 f"not sent; {kept} sent")
                elif g.omitted:
                    lines.append(f"layers   {len(g.omitted)} of {len(self.diff_ids)} held by {', '.join(g.names)}: "
                                 f"not sent to them; {len(self.diff_ids) - len(g.omitted)} sent")
                else:
                    lines.append(f"layers   all {len(self.diff_ids)} sent" + (f" to {', '.join(g.names)}"
                                                                              if len(self.groups) > 1 else ""))
        return "\n".join(lines) + "\n"

    def _tree_lines(self, g: Group, root: str) -> list[str]:
        if self.via == "launcher":
            return [f"{root} -> " + ", ".join(g.names) + "  (one stream per node)"]
        note = "  (each node loads while it forwards; ssh -A)"
        if all(parent == (g.edges[i - 1][0] if i else "") for i, (_, parent) in enumerate(g.edges)):
            return [" -> ".join([root, *g.names]) + note]
        kids: dict[str, list[str]] = {}
        for name, parent in g.edges:
            kids.setdefault(parent, []).append(name)
        out = [f"tree, fan-out {self.fanout}, depth {depth(g.edges)}{note}", f"  {root} -> {g.names[0]}"]
        out += [f"  {p} -> {', '.join(ns)}" for p, ns in kids.items() if p]
        return out

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (every plan keeps rlbox.core.plan.Plan)."""
        return dataclasses.asdict(self) | {"order": list(self.order), "needed": self.needed}


def short(image_id: str | None) -> str:
    return (image_id or "?").removeprefix("sha256:")[:12]


def human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size} B"  # pragma: no cover


class PlanError(ValueError):
    """The facts do not allow a delivery; the message is one line naming the nodes."""


def plan(image: str, local: ImageFacts | None, nodes: tuple[NodeFacts, ...], *, registry: str | None = None,
         force: bool = False, via: str = "chain", source: str | None = None,
         fanout: int | None = None) -> DeliveryPlan:
    """The delivery of ``image`` to ``nodes``. ``local``: this machine's image under the name
    (None: absent or no engine). ``registry``: the registry the reference names (pull first).
    ``source``: "local" or a node name to stream from (default: this machine, else the first node
    holding the right image). ``fanout``: each node forwards to at most this many (default
    fanout_for the number of receiving nodes)."""
    if via not in STREAM_VIAS:
        raise PlanError(f"--via must be one of {', '.join(STREAM_VIAS)}, not {via!r}")
    names = [n.name for n in nodes]
    if source not in (None, "local") and source not in names:
        raise PlanError(f"--from {source}: not a node of this cluster ({', '.join(names)})")
    if source == "local" and local is None:
        raise PlanError(f"--from local: this machine's engine does not hold {image}")
    if source not in (None, "local"):
        chosen = next(n for n in nodes if n.name == source).image
        if chosen is None:
            raise PlanError(f"--from {source}: {source} does not hold {image}")
        right = chosen
    elif local is not None:
        right = local
    else:
        held: dict[str, list[str]] = {}
        for n in nodes:
            if n.image is not None:
                held.setdefault(n.image.id, []).append(n.name)
        if len(held) > 1:
            which = "; ".join(f"{short(i)} on {', '.join(ns)}" for i, ns in held.items())
            raise PlanError(f"the nodes hold different images under {image} ({which}) and this machine has none: "
                            "say which is right with --from NODE")
        right = next((n.image for n in nodes if n.image is not None), None)
    if right is None and registry is None:
        raise PlanError(f"image {image} is neither on this machine nor on any node, and its name has no registry "
                        "to pull from")
    targets, skipped, conflicts = [], [], []
    for n in nodes:
        if n.image is None:
            targets.append(Target(n.name, "missing"))
        elif right is not None and n.image.id == right.id:
            skipped.append(n.name)
        elif right is None:  # registry only: nodes holding the name are checked after the pulls
            targets.append(Target(n.name, "missing"))
        elif force:
            targets.append(Target(n.name, "differs", n.image.id))
        else:
            conflicts.append(Target(n.name, "differs", n.image.id))
    stream_from = None
    if right is not None:
        stream_from = source or ("local" if local is not None else next(n.name for n in nodes if n.image == right))
    omitted: tuple[str, ...] = ()
    groups: tuple[Group, ...] = ()
    width = fanout if fanout is not None else fanout_for(len(targets))
    if right is not None and targets:
        by_name = {n.name: n for n in nodes}
        held = {t.name: _held(right.diff_ids, by_name[t.name].chains) for t in targets}
        omitted = _left_out(right.diff_ids, min(held.values()))
        if stream_from != "local":  # no filter on a node: one stream, every layer
            held, omitted = dict.fromkeys(held, 0), ()
        sets: dict[int, list[str]] = {}
        for t in targets:
            sets.setdefault(held[t.name], []).append(t.name)
        groups = tuple(Group(_left_out(right.diff_ids, k),
                             tree(part, width) if via == "chain" else tuple((n, "") for n in part))
                       for k, ns in sets.items() for part in _parts(tuple(ns), via))
    return DeliveryPlan(
        image=image, image_id=right.id if right else None, diff_ids=right.diff_ids if right else (),
        size=right.size if right else 0, targets=tuple(targets), skipped=tuple(skipped), registry=registry,
        source=stream_from, via=via, omitted=omitted, conflicts=tuple(conflicts), groups=groups, fanout=width,
    )


def _parts(names: tuple[str, ...], via: str) -> list[tuple[str, ...]]:
    """A tree's nodes in streams of at most STREAM_MAX (via launcher: one stream, every node its own)."""
    if via != "chain":
        return [names]
    return [names[i:i + STREAM_MAX] for i in range(0, len(names), STREAM_MAX)]


def _held(diff_ids: tuple[str, ...], chains: frozenset[str]) -> int:
    """How many of the image's lowest layers a node holds (by chain id: each with all below it)."""
    k = 0
    for chain in chain_ids(diff_ids):
        if chain not in chains:
            break
        k += 1
    return k


def _left_out(diff_ids: tuple[str, ...], held: int) -> tuple[str, ...]:
    """The layer files a stream may leave out for nodes holding the lowest ``held`` layers. A file
    is recognised in the stream by its content's digest: one that also sits higher up (the same
    layer twice) must travel for that place."""
    kept = set(diff_ids[held:])
    return tuple(d for d in diff_ids[:held] if d not in kept)


def group_of(p: DeliveryPlan, name: str) -> Group | None:
    return next((g for g in p.groups if name in g.names), None)


def regroup(p: DeliveryPlan, names: tuple[str, ...]) -> DeliveryPlan:
    """The plan's streams for ``names`` only (the nodes whose pull failed), trees re-made."""
    groups = []
    for g in p.groups:
        ns = tuple(n for n in g.names if n in names)
        for part in _parts(ns, p.via) if ns else []:
            edges = tree(part, p.fanout) if p.via == "chain" else tuple((n, "") for n in part)
            groups.append(Group(g.omitted, edges))
    return dataclasses.replace(p, groups=tuple(groups))


def refusal(p: DeliveryPlan) -> str | None:
    """Why the plan must not be carried out (nodes with another image under the name), or None."""
    if not p.conflicts:
        return None
    which = ", ".join(f"{t.name} has {short(t.old_id)}" for t in p.conflicts)
    return (f"image {p.image} differs between nodes: {which}, the right one {short(p.image_id)}; "
            f"replace it with `rlbox distribute {p.image} --force` (or remove it there)")
