"""Image delivery, the executing half: gather what every node's engine holds, carry out a
DeliveryPlan (rlbox.delivery.plan), verify every node by image id.

Every command is an argv list; what runs on a node is a fixed script (GATHER_SCRIPT here, NODE_SCRIPT in
rlbox.delivery.stream), its
values passed as positional arguments and the whole quoted with shlex for the remote shell.
A stream goes ``docker save`` (here; filtered here when the group's nodes hold some layers) ->
node 1 -> its children ... along the group's tree (delivery.tree), or from a source node's own
``docker save`` to its children directly: on each node ``tee`` feeds a fifo read by ``docker load``
and one ssh per child, so every node loads while it forwards. Each node reports one line on stderr
(``<marker> NODE loaded|failed ...``), passed back up the tree. A failure or Ctrl-C ends the local
processes; every node then sees its input end (a source node: the launcher's ssh closing), its
``docker load`` fails on the truncated tar before registering anything (moby loads only after the
whole tar is unpacked), and its script exits: nothing half-loaded, nothing left running. What
did arrive is checked by image id afterwards.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from rlbox.cluster.hosts import on_every
from rlbox.cluster.spec import Host
from rlbox.core import engine
from rlbox.core.errors import RlboxError, last_line
from rlbox.delivery import plan as delivery
from rlbox.delivery.plan import DeliveryPlan, ImageFacts, NodeFacts
from rlbox.delivery.progress import Progress
from rlbox.delivery.links import MAX_SESSIONS, Links, captured, engine_key, links_for
from rlbox.delivery.stream import Stream, on_host
from rlbox.registry.reference import Reference

Echo = Callable[[str], None]

# What the engine holds: the image under the name (id, size, layers) and, asked for, the layers
# of every image (what `docker load` may skip): $2 is "-" (never), "unless-held" (when the name is
# absent) or "unless-held:ID" (unless the name is that image), so a node that lacks the image is asked
# once, not twice (one ssh session a node). Exit 3: no engine; 2: a bad $2.
GATHER_SCRIPT = r"""set -u
have=
if out=$(docker image inspect --format '{{.Id}} {{.Size}} {{json .RootFS.Layers}}' -- "$1" 2>&1); then
    printf 'image %s\n' "$out"
    have=${out%% *}
else
    case "$out" in
        *"No such image"*|*"No such object"*) ;;
        *) printf '%s\n' "$out" >&2; exit 3 ;;
    esac
fi
case $2 in
    -) want= ;;
    unless-held) if [ -n "$have" ]; then want=; else want=1; fi ;;
    unless-held:*) if [ "$have" = "${2#unless-held:}" ]; then want=; else want=1; fi ;;
    *) printf 'rlbox-gather: what to list: %s\n' "$2" >&2; exit 2 ;;
esac
if [ -n "$want" ]; then
    ids=$(docker image ls -aq --no-trunc | sort -u)
    [ -z "$ids" ] || docker image inspect --format 'layers {{json .RootFS.Layers}}' $ids
fi
"""

# ---------------------------------------------------------------------------------------------
# Reaching an engine: this machine's, or a node's over ssh.


def unique_hosts(hosts: tuple[Host, ...]) -> dict[str, Host]:
    """One host per engine, in cluster order, by label (the name; name:port when names repeat)."""
    seen, out = set(), {}
    names = [h.name for h in hosts]
    for h in hosts:
        if engine_key(h) in seen:
            continue
        seen.add(engine_key(h))
        label = f"{h.name}:{h.ssh_port}" if names.count(h.name) > 1 and h.ssh_port else h.name
        out[label] = h
    return out


def _run(host: Host | None, words: list[str], links: Links | None, timeout: float = 120,
         chain: bool = False) -> subprocess.CompletedProcess:
    """``words`` on ``host`` (None: this machine), over the delivery's links when given (``chain``:
    a session that makes the node's master and gets the agent, Links.options)."""
    argv = on_host(host, words, *(links.options(chain) if links else ()))
    return captured(argv, links.env if links else None, timeout)


def parse_gathered(name: str, text: str) -> NodeFacts:
    image, chains = None, set()
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "image":
            image_id, size, layers = rest.split(" ", 2)
            image = ImageFacts(image_id, tuple(json.loads(layers) or ()), int(size))
        elif kind == "layers":
            chains.update(delivery.chain_ids(tuple(json.loads(rest) or ())))
    return NodeFacts(name, image, frozenset(chains))


def gather_one(label: str, host: Host | None, image: str, layers: str = "-", links: Links | None = None,
               first: bool = False) -> NodeFacts:
    """One node's facts in one session; ``layers`` as GATHER_SCRIPT's $2; ``first``: the delivery's
    first session to the node, which leaves its master (with the agent, for the chain)."""
    proc = _run(host, ["sh", "-c", GATHER_SCRIPT, "rlbox-gather", image, layers], links, chain=first)
    if proc.returncode != 0:
        where = "this machine" if host is None else label
        raise RlboxError(f"{where}: cannot ask its Docker engine what it holds ({last_line(proc.stderr)})")
    return parse_gathered(label, proc.stdout)


def local_image(image: str) -> ImageFacts | None:
    """This machine's image under the name; None without it or without an engine here."""
    if shutil.which("docker") is None:
        return None
    try:
        return gather_one("this machine", None, image).image
    except RlboxError:
        return None


def gather(image: str, hosts: dict[str, Host], layers: str = "-", links: Links | None = None,
           first: bool = False) -> tuple[NodeFacts, ...]:
    facts, errors = on_every(lambda item: gather_one(item[0], item[1], image, layers, links, first),
                             list(hosts.items()))
    if errors:
        raise errors[0]
    return tuple(facts)


def check_image(image: str) -> Reference:
    ref = Reference.parse(image)  # also refuses what a command line could read as an option
    if image.startswith("-"):
        raise RlboxError(f"{image!r} is not an image reference")
    return ref


def make_plan(image: str, hosts: tuple[Host, ...], *, force: bool = False, via: str = "chain",
              source: str | None = None, pull: bool = True,
              fanout: int | None = None, links: Links | None = None) -> tuple[DeliveryPlan, dict[str, Host]]:
    """Gather every node's facts (layers only where the image is missing) and plan; ``links``: the
    delivery's connections (links.links_for), whose masters the gather's sessions make."""
    ref = check_image(image)
    by_label = unique_hosts(hosts)
    local = local_image(image)
    # a node lacking the image (or holding another under the name) lists the layers it holds in the same
    # session: they decide what the stream may leave out
    first = gather(image, by_label, layers=f"unless-held:{local.id}" if local is not None else "unless-held",
                   links=links, first=True)
    # a bare `localhost/` names no registry to pull from: it is how images built here are named
    registry = ref.registry if pull and ref.registry not in (None, "localhost") else None
    try:
        p = delivery.plan(image, local, first, registry=registry, force=force, via=via,
                          source=source, fanout=fanout)
    except delivery.PlanError as err:
        raise RlboxError(str(err)) from None
    return p, by_label


# ---------------------------------------------------------------------------------------------
# Carrying out a plan.


@dataclass
class Report:
    delivered: tuple[str, ...]
    pulled: tuple[str, ...]
    seconds: float
    sent: int


def pull_all(plan: DeliveryPlan, hosts: dict[str, Host], progress: Progress,
             links: Links | None = None) -> tuple[list[str], dict[str, str]]:
    def pull(name: str) -> tuple[str, str | None]:
        progress.set(name, "pulling")
        proc = _run(hosts[name], ["docker", "pull", "-q", "--", plan.image], links, timeout=24 * 3600)
        if proc.returncode == 0:
            progress.set(name, "pulled")
            return name, None
        progress.set(name, "pull failed", last_line(proc.stderr))
        return name, last_line(proc.stderr)

    results, errors = on_every(pull, list(plan.order))
    if errors:
        raise errors[0]
    return [n for n, e in results if e is None], {n: e for n, e in results if e is not None}


def verify(plan: DeliveryPlan, hosts: dict[str, Host], names: tuple[str, ...],
           links: Links | None = None) -> dict[str, str | None]:
    """Every named node's image id under the name now (None: absent)."""
    facts = gather(plan.image, {n: hosts[n] for n in names}, links=links)
    return {f.name: f.image.id if f.image else None for f in facts}


def carry_out(plan: DeliveryPlan, hosts: dict[str, Host], echo: Echo, *, tty: bool = False,
              mode: str = "load", links: Links | None = None) -> Report:
    """Deliver the image to the plan's targets; verify each by image id; on any failure or
    Ctrl-C end every process, say per node what it holds, and raise naming the nodes.
    ``mode="discard"`` (bench/distribute.py): every node reads the stream into `cat > /dev/null`
    instead of `docker load`, nothing is verified: the topology's own cost. ``links``: the
    connections the plan's gather made (links.links_for); without them, made here and closed."""
    refused = delivery.refusal(plan)
    if refused:
        raise RlboxError(refused)
    if links is None:
        with links_for(list(hosts.values()), agent=plan.via == "chain") as own:
            return carry_out(plan, hosts, echo, tty=tty, mode=mode, links=own)
    started = time.monotonic()
    progress = Progress(plan, echo, tty)
    pulled: list[str] = []
    remaining = plan.order
    streams: list[Stream] = []
    progress.start()
    try:
        if plan.registry:
            pulled, failed = pull_all(plan, hosts, progress, links)
            remaining = tuple(n for n in plan.order if n in failed)
            if remaining and not plan.source:
                raise RlboxError("; ".join(f"{n}: docker pull {plan.image} failed ({why})" for n, why in failed.items()))
            if remaining:
                echo(f"pull failed on {', '.join(remaining)}: streaming from "
                     f"{'this machine' if plan.source == 'local' else plan.source}")
        if remaining:
            chain = [hosts[n] for n in remaining if not hosts[n].local]
            via = plan.via
            from_node = plan.source not in (None, "local")
            if via == "chain" and (len(chain) > 1 or (chain and from_node)) and links.agent is None:
                echo("no ssh agent to forward (no identity_file, no SSH_AUTH_SOCK): "
                     "streaming to each node from this machine")
                via = "launcher"
            sub = delivery.regroup(replace(plan, via=via), remaining)
            # a source node takes a session a group at once: more than sshd allows on one connection, and
            # each stream makes its own connections
            options = links.options() if len(sub.groups) < MAX_SESSIONS else ()
            streams = [Stream(sub, hosts, progress, links.env, group=g, mode=mode, options=options)
                       for g in sub.groups]
            _run_all(streams)
            failures = {n: why for s in streams for n, why in s.failures().items()}
            if failures:
                raise RlboxError("; ".join(f"{n}: load failed ({why})" for n, why in failures.items()))
    except KeyboardInterrupt:
        engine.ignore_interrupts()  # one cleanup, to its end, however often Ctrl-C is pressed
        for s in streams:
            s.stop()
        progress.stop()
        raise RlboxError("interrupted; " + _aftermath(plan, hosts, links), exit_code=130) from None
    except RlboxError as err:
        for s in streams:
            s.stop()
        progress.stop()
        raise RlboxError(f"{err}; {_aftermath(plan, hosts, links)}") from None
    except BaseException:
        for s in streams:
            s.stop()
        raise
    finally:
        progress.stop()
    sent = progress.sent
    if mode == "discard":
        return Report(tuple(n for n in plan.order if n not in pulled), tuple(pulled), time.monotonic() - started, sent)
    now = verify(plan, hosts, plan.order, links)
    want = plan.image_id or next(iter(now.values()), None)
    wrong = {n: i for n, i in now.items() if i != want}
    if wrong:
        raise RlboxError("after delivery, " + ", ".join(
            f"{n} holds {delivery.short(i) if i else 'nothing'}" for n, i in wrong.items())
            + f" under {plan.image}, not {delivery.short(want)}")
    for n in plan.order:
        progress.set(n, "verified", delivery.short(want))
    return Report(tuple(n for n in plan.order if n not in pulled), tuple(pulled), time.monotonic() - started, sent)


def _run_all(streams: list[Stream]) -> None:
    """Run every group's stream at once (one thread each when there are several); the first
    error is raised once all have ended. Ctrl-C reaches this thread, never a stream's."""
    if len(streams) == 1:
        streams[0].run()
        return
    errors: list[BaseException] = []

    def one(s: Stream) -> None:
        try:
            s.run()
        except BaseException as err:  # noqa: BLE001 - raised below, in this thread
            errors.append(err)

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in streams]
    for th in threads:
        th.start()
    for th in threads:
        while th.is_alive():
            th.join(timeout=0.2)
    if errors:
        raise errors[0]


def _aftermath(plan: DeliveryPlan, hosts: dict[str, Host], links: Links) -> str:
    """What every receiving node holds after a failure: the right image, or nothing new (a node
    that cannot be asked is said so)."""
    def state(name: str):
        try:
            facts = gather_one(name, hosts[name], plan.image, links=links)
        except RlboxError as err:
            return err
        return facts.image.id if facts.image else None

    results, _ = on_every(state, list(plan.order))
    done = [n for n, i in zip(plan.order, results) if plan.image_id and i == plan.image_id]
    unknown = [n for n, i in zip(plan.order, results) if isinstance(i, RlboxError)]
    rest = [n for n in plan.order if n not in done and n not in unknown]
    parts = []
    if done:
        parts.append(f"complete on {', '.join(done)}")
    if rest:
        parts.append(f"not delivered to {', '.join(rest)} (nothing half-loaded there)")
    if unknown:
        parts.append(f"could not check {', '.join(unknown)}")
    return "; ".join(parts)


def ensure(image: str, hosts: tuple[Host, ...], echo: Echo, *, missing_hint: str, tty: bool = False,
           held: tuple[str | None, ...] | None = None) -> Report | None:
    """For `rlbox run`: deliver the image where it is missing; refuse nodes holding another image
    under the name. None when every node already holds it. ``held``: the image id each node's engine
    gave for the name (None: not there), as `rlbox run` asked over its open connections; when every
    node holds one image and it is this machine's (or this machine has none), no node is asked again."""
    if held and all(held) and len(set(held)) == 1:
        local = local_image(image)
        if local is None or local.id == held[0]:
            return None
    with links_for(hosts) as links:
        try:
            p, by_label = make_plan(image, hosts, links=links)
        except RlboxError as err:
            if "neither on this machine nor on any node" in str(err):
                first = hosts[0].name if hosts else "?"
                raise RlboxError(f"{first}: image {image} is not present; {missing_hint}") from None
            raise
        refused = delivery.refusal(p)
        if refused:
            raise RlboxError(refused)
        if not p.needed:
            return None
        for line in p.describe().splitlines():
            echo(f"deliver: {line}")
        report = carry_out(p, by_label, echo, tty=tty, links=links)
    echo(f"deliver: {image} on {len(p.targets)} node(s) in {report.seconds:.1f} s, verified by image id")
    return report
