"""Image delivery, the executing half: gather what every node's engine holds, carry out a
DeliveryPlan (rlbox.delivery.plan), verify every node by image id.

Every command is an argv list; what runs on a node is one of three fixed scripts below, its
values passed as positional arguments and the whole quoted with shlex for the remote shell.
A stream goes ``docker save`` (here or on a source node) -> this machine -> node 1 -> node 2 ...:
on each node ``tee`` feeds a fifo read by ``docker load`` and the ssh to the next node, so every
node loads while it forwards. Each node reports one line on stderr (``<marker> NODE loaded|failed
...``), passed back up the chain. A failure or Ctrl-C ends the local processes; every node then
sees its input end, its ``docker load`` fails on the truncated tar before registering anything
(moby loads only after the whole tar is unpacked), and its script exits: nothing half-loaded,
nothing left running. What did arrive is checked by image id afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from rlbox.delivery import plan as delivery
from rlbox.delivery.plan import DeliveryPlan, ImageFacts, NodeFacts
from rlbox.delivery.progress import Progress
from rlbox.cluster.hosts import on_every, ssh_argv
from rlbox.cluster.spec import Host
from rlbox.core import engine
from rlbox.core.errors import RlboxError, last_line
from rlbox.registry.reference import Reference

Echo = Callable[[str], None]
CHUNK = 1 << 20

# What the engine holds: the image under the name (id, size, layers) and, asked for, the layers
# of every image (what `docker load` may skip). Exit 3: no engine.
GATHER_SCRIPT = r"""set -u
if out=$(docker image inspect --format '{{.Id}} {{.Size}} {{json .RootFS.Layers}}' -- "$1" 2>&1); then
    printf 'image %s\n' "$out"
else
    case "$out" in
        *"No such image"*|*"No such object"*) ;;
        *) printf '%s\n' "$out" >&2; exit 3 ;;
    esac
fi
if [ "$2" = layers ]; then
    ids=$(docker image ls -aq --no-trunc | sort -u)
    [ -z "$ids" ] || docker image inspect --format 'layers {{json .RootFS.Layers}}' $ids
fi
"""

# On one node: load stdin and, when hops follow, forward it to the next node while loading.
# Arguments: $0 the marker every report line starts with, $1 this script's own text, $2 this
# node's name, then per further node: its name, N, and the N words of the ssh argv reaching it
# (ending in `-- [user@]host`). The next node's command is quoted here, from the plain values,
# so its length grows by one hop's words per hop, never by nesting quotes.
NODE_SCRIPT = r"""set -u
self=$1; label=$2; shift 2
say() { printf '%s %s %s\n' "$0" "$label" "$*" >&2; }
q() { printf "'"; printf '%s' "$1" | sed "s/'/'\\\\''/g"; printf "'"; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/rlbox-deliver.XXXXXX") || { say failed cannot make a temporary directory; exit 1; }
trap 'rm -rf "$dir"' EXIT
trap 'exit 129' HUP INT TERM PIPE
if [ $# -eq 0 ]; then
    docker load >"$dir/out" 2>&1
    rc=$?
else
    next=$1; n=$2; shift 2
    i=0
    while [ "$i" -lt "$n" ]; do set -- "$@" "$1"; shift; i=$((i + 1)); done
    cmd="sh -c $(q "$self") $(q "$0") $(q "$self") $(q "$next")"
    m=$(($# - n)); i=0
    while [ "$i" -lt "$m" ]; do cmd="$cmd $(q "$1")"; shift; i=$((i + 1)); done
    mkfifo "$dir/load" || { say failed cannot make a fifo; exit 1; }
    docker load <"$dir/load" >"$dir/out" 2>&1 &
    pid=$!
    # GNU tee -p: an output that fails (this node's load, or the next node) is dropped and the
    # other one still fed, so one bad node does not fail its neighbours
    if tee -p </dev/null >/dev/null 2>&1; then tee -p "$dir/load"; else tee "$dir/load"; fi | "$@" "$cmd"
    wait "$pid"
    rc=$?
fi
if [ "$rc" -eq 0 ]; then say loaded "$(tail -n 1 "$dir/out")"; else say failed "$(tail -n 1 "$dir/out")"; fi
exit "$rc"
"""


# ---------------------------------------------------------------------------------------------
# Reaching an engine: this machine's, or a node's over ssh.


def engine_key(host: Host) -> tuple:
    """Nodes with one key share one engine (the simulation's nodes, a host named twice)."""
    return ("local",) if host.local else (host.ssh_user, host.name, host.ssh_port)


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


def on_host(host: Host | None, words: list[str], *options: str) -> list[str]:
    """The argv running ``words`` on ``host`` (None: this machine); over ssh, quoted for the remote shell."""
    if host is None or host.local:
        return list(words)
    return ssh_argv(host, *options, command=[shlex.join(words)])


def hop(host: Host) -> list[str]:
    """The argv (without the command) a node runs to reach the next node: ssh with the forwarded
    agent (-A), the cluster file's port, user and known_hosts, never a key file path of this machine."""
    return ssh_argv(replace(host, identity_file=None), "-A")


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout)
    except FileNotFoundError as err:
        return subprocess.CompletedProcess(argv, 127, "", f"{err.filename}: not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer in {timeout:.0f} s")


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


def gather_one(label: str, host: Host | None, image: str, layers: bool) -> NodeFacts:
    proc = _run(on_host(host, ["sh", "-c", GATHER_SCRIPT, "rlbox-gather", image, "layers" if layers else "-"]))
    if proc.returncode != 0:
        where = "this machine" if host is None else label
        raise RlboxError(f"{where}: cannot ask its Docker engine what it holds ({last_line(proc.stderr)})")
    return parse_gathered(label, proc.stdout)


def local_image(image: str) -> ImageFacts | None:
    """This machine's image under the name; None without it or without an engine here."""
    if shutil.which("docker") is None:
        return None
    try:
        return gather_one("this machine", None, image, False).image
    except RlboxError:
        return None


def gather(image: str, hosts: dict[str, Host], layers: bool) -> tuple[NodeFacts, ...]:
    facts, errors = on_every(lambda item: gather_one(item[0], item[1], image, layers), list(hosts.items()))
    if errors:
        raise errors[0]
    return tuple(facts)


def check_image(image: str) -> Reference:
    ref = Reference.parse(image)  # also refuses what a command line could read as an option
    if image.startswith("-"):
        raise RlboxError(f"{image!r} is not an image reference")
    return ref


def make_plan(image: str, hosts: tuple[Host, ...], *, force: bool = False, via: str = "chain",
              source: str | None = None, pull: bool = True) -> tuple[DeliveryPlan, dict[str, Host]]:
    """Gather every node's facts (layers only where the image is missing) and plan."""
    ref = check_image(image)
    by_label = unique_hosts(hosts)
    local = local_image(image)
    first = gather(image, by_label, layers=False)
    lacking = {n.name for n in first if n.image is None or (local is not None and n.image.id != local.id)}
    if lacking:  # the layers they hold decide what the stream may leave out
        detailed = {n.name: n for n in gather(image, {k: by_label[k] for k in lacking}, layers=True)}
        first = tuple(detailed.get(n.name, n) for n in first)
    # a bare `localhost/` names no registry to pull from: it is how images built here are named
    registry = ref.registry if pull and ref.registry not in (None, "localhost") else None
    try:
        p = delivery.plan(image, local, first, registry=registry, force=force, via=via,
                          source=source)
    except delivery.PlanError as err:
        raise RlboxError(str(err)) from None
    return p, by_label


# ---------------------------------------------------------------------------------------------
# The stream.


def filtered(source, omit: frozenset[str]) -> Iterator[bytes]:
    """The tar ``docker save`` writes, without the layer files whose content digest is in ``omit``.
    A member is recognised by its content (a diff id is the digest of the uncompressed layer tar),
    so the format of the save (20.10's folders or the OCI layout) does not matter."""
    pending: list[bytes] = []

    class Sink:
        def write(self, data: bytes) -> int:
            pending.append(bytes(data))
            return len(data)

    reader = tarfile.open(fileobj=source, mode="r|")
    writer = tarfile.open(fileobj=Sink(), mode="w|", format=tarfile.PAX_FORMAT)
    for member in reader:
        if not member.isfile():
            writer.addfile(member)
        else:
            with tempfile.SpooledTemporaryFile(max_size=16 << 20) as spool:
                digest = hashlib.sha256()
                data = reader.extractfile(member)
                while chunk := data.read(CHUNK):
                    digest.update(chunk)
                    spool.write(chunk)
                if f"sha256:{digest.hexdigest()}" not in omit:
                    spool.seek(0)
                    writer.addfile(member, spool)
        while pending:
            yield pending.pop(0)
    writer.close()
    reader.close()
    while pending:
        yield pending.pop(0)


def raw(source) -> Iterator[bytes]:
    while chunk := source.read(CHUNK):
        yield chunk


@dataclass
class Sink:
    """One ssh (or local shell) reading the stream: the head of a chain, or one node."""

    argv: list[str]
    names: tuple[str, ...]
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)  # what it said that is not a report
    reader: threading.Thread | None = None


@dataclass
class Stream:
    plan: DeliveryPlan
    hosts: dict[str, Host]
    progress: Progress
    env: dict[str, str]
    marker: str = field(default_factory=lambda: f"rlbox-deliver-{secrets.token_hex(4)}")
    results: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> (loaded|failed, detail)
    sinks: list[Sink] = field(default_factory=list)
    source_proc: subprocess.Popen | None = None

    def node_words(self, name: str, after: list[str]) -> list[str]:
        """The first node's command; ``after``: the nodes it forwards to, each (name, N, N words)."""
        words = ["sh", "-c", NODE_SCRIPT, self.marker, NODE_SCRIPT, name]
        for n in after:
            argv = hop(self.hosts[n])
            words += [n, str(len(argv)), *argv]
        return words

    def build(self, names: tuple[str, ...]) -> None:
        remote = [n for n in names if not self.hosts[n].local]
        local = [n for n in names if self.hosts[n].local]
        for n in local:
            self.sinks.append(Sink(self.node_words(n, []), (n,)))
        if self.plan.via == "launcher" or len(remote) < 2:
            for n in remote:
                self.sinks.append(Sink(on_host(self.hosts[n], self.node_words(n, [])), (n,)))
            return
        words = self.node_words(remote[0], remote[1:])
        self.sinks.append(Sink(on_host(self.hosts[remote[0]], words, "-A"), tuple(remote)))

    def _read_reports(self, sink: Sink) -> None:
        for raw_line in sink.proc.stderr:
            line = raw_line.decode(errors="replace").rstrip("\n")
            if line.startswith(self.marker + " "):
                _, name, rest = line.split(" ", 2)
                state, _, detail = rest.partition(" ")
                self.results[name] = (state, detail)
                self.progress.set(name, "loaded" if state == "loaded" else "failed", detail if state != "loaded" else "")
            elif line.strip():
                sink.lines.append(line.strip())

    def source_argv(self) -> list[str]:
        words = ["docker", "save", "--", self.plan.image]
        return words if self.plan.source == "local" else on_host(self.hosts[self.plan.source], words)

    def run(self, names: tuple[str, ...]) -> None:
        self.build(names)
        try:
            self.source_proc = subprocess.Popen(self.source_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, env=self.env)
        except FileNotFoundError:
            raise RlboxError("this machine: no docker CLI to save the image with") from None
        for sink in self.sinks:
            sink.proc = subprocess.Popen(sink.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, env=self.env)
            sink.reader = threading.Thread(target=self._read_reports, args=(sink,), daemon=True)
            sink.reader.start()
            for n in sink.names:
                self.progress.set(n, "receiving")
        omit = frozenset(self.plan.omitted)
        chunks = filtered(self.source_proc.stdout, omit) if omit else raw(self.source_proc.stdout)
        broken: list[Sink] = []
        for chunk in chunks:
            for sink in self.sinks:
                if sink in broken:
                    continue
                try:
                    sink.proc.stdin.write(chunk)
                except (BrokenPipeError, OSError):
                    broken.append(sink)
            if len(broken) == len(self.sinks):
                break
            self.progress.add(len(chunk))
        for sink in self.sinks:
            try:
                sink.proc.stdin.close()
            except OSError:
                pass
            if sink not in broken:
                for n in sink.names:
                    if n not in self.results:
                        self.progress.set(n, "loading")
        if len(broken) == len(self.sinks):  # no node reads any more: the save is not the cause
            self.source_proc.terminate()
            self.source_proc.wait()
        save_err = self.source_proc.stderr.read().decode(errors="replace")
        if len(broken) < len(self.sinks) and self.source_proc.wait() != 0:
            self.stop()
            where = "this machine" if self.plan.source == "local" else self.plan.source
            raise RlboxError(f"{where}: docker save {self.plan.image} failed ({last_line(save_err)})")
        for sink in self.sinks:
            sink.proc.wait()
            sink.reader.join(timeout=10)

    def stop(self) -> None:
        """End every local process of the stream (the nodes' scripts end on their input's end)."""
        procs = [self.source_proc] + [s.proc for s in self.sinks]
        for proc in procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for proc in procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sink in self.sinks:
            if sink.reader is not None:
                sink.reader.join(timeout=5)

    def failures(self) -> dict[str, str]:
        """Nodes that did not report ``loaded``, with why."""
        out = {}
        for sink in self.sinks:
            for n in sink.names:
                state, detail = self.results.get(n, ("", ""))
                if state != "loaded":
                    out[n] = detail or (sink.lines[-1] if sink.lines else "no report from the node")
        return out


# ---------------------------------------------------------------------------------------------
# The agent a chain forwards (nodes ssh to each other with rlbox's key, never a copy of it).


@dataclass
class Agent:
    env: dict[str, str]
    pid: int | None = None
    workdir: tempfile.TemporaryDirectory | None = None

    def close(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, 15)
            except ProcessLookupError:
                pass
        if self.workdir is not None:
            self.workdir.cleanup()


def agent_for(hosts: list[Host]) -> Agent | None:
    """A private ssh-agent holding the cluster file's key(s) for the length of the delivery, else
    the user's own agent (SSH_AUTH_SOCK); None when there is neither."""
    keys = sorted({os.path.expanduser(h.identity_file) for h in hosts if h.identity_file})
    if not keys:
        return Agent(dict(os.environ)) if os.environ.get("SSH_AUTH_SOCK") else None
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        return None
    workdir = tempfile.TemporaryDirectory(prefix="rlbox-agent-")
    sock = os.path.join(workdir.name, "agent.sock")
    proc = _run(["ssh-agent", "-s", "-a", sock], timeout=20)
    pid = next((int(p.split(";")[0].split("=")[1]) for p in proc.stdout.split()
                if p.startswith("SSH_AGENT_PID=")), None)
    agent = Agent(dict(os.environ, SSH_AUTH_SOCK=sock), pid, workdir)
    added = subprocess.run(["ssh-add", "-q", *keys], env=agent.env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=20)
    if proc.returncode != 0 or pid is None or added.returncode != 0:
        agent.close()
        return None
    return agent


# ---------------------------------------------------------------------------------------------
# Carrying out a plan.


@dataclass
class Report:
    delivered: tuple[str, ...]
    pulled: tuple[str, ...]
    seconds: float
    sent: int


def pull_all(plan: DeliveryPlan, hosts: dict[str, Host], progress: Progress) -> tuple[list[str], dict[str, str]]:
    def pull(name: str) -> tuple[str, str | None]:
        progress.set(name, "pulling")
        proc = _run(on_host(hosts[name], ["docker", "pull", "-q", "--", plan.image]), timeout=24 * 3600)
        if proc.returncode == 0:
            progress.set(name, "pulled")
            return name, None
        progress.set(name, "pull failed", last_line(proc.stderr))
        return name, last_line(proc.stderr)

    results, errors = on_every(pull, list(plan.order))
    if errors:
        raise errors[0]
    return [n for n, e in results if e is None], {n: e for n, e in results if e is not None}


def verify(plan: DeliveryPlan, hosts: dict[str, Host], names: tuple[str, ...]) -> dict[str, str | None]:
    """Every named node's image id under the name now (None: absent)."""
    facts = gather(plan.image, {n: hosts[n] for n in names}, layers=False)
    return {f.name: f.image.id if f.image else None for f in facts}


def carry_out(plan: DeliveryPlan, hosts: dict[str, Host], echo: Echo, *, tty: bool = False) -> Report:
    """Deliver the image to the plan's targets; verify each by image id; on any failure or
    Ctrl-C end every process, say per node what it holds, and raise naming the nodes."""
    refused = delivery.refusal(plan)
    if refused:
        raise RlboxError(refused)
    started = time.monotonic()
    progress = Progress(plan, echo, tty)
    pulled: list[str] = []
    remaining = plan.order
    stream: Stream | None = None
    agent: Agent | None = None
    progress.start()
    try:
        if plan.registry:
            pulled, failed = pull_all(plan, hosts, progress)
            remaining = tuple(n for n in plan.order if n in failed)
            if remaining and not plan.source:
                raise RlboxError("; ".join(f"{n}: docker pull {plan.image} failed ({why})" for n, why in failed.items()))
            if remaining:
                echo(f"pull failed on {', '.join(remaining)}: streaming from "
                     f"{'this machine' if plan.source == 'local' else plan.source}")
        if remaining:
            chain = [hosts[n] for n in remaining if not hosts[n].local]
            via = plan.via
            if via == "chain" and len(chain) > 1:
                agent = agent_for(chain)
                if agent is None:
                    echo("no ssh agent to forward (no identity_file, no SSH_AUTH_SOCK): "
                         "streaming to each node from this machine")
                    via = "launcher"
            stream = Stream(replace(plan, via=via), hosts, progress, agent.env if agent else dict(os.environ))
            stream.run(remaining)
            failures = stream.failures()
            if failures:
                raise RlboxError("; ".join(f"{n}: load failed ({why})" for n, why in failures.items()))
    except KeyboardInterrupt:
        engine.ignore_interrupts()  # one cleanup, to its end, however often Ctrl-C is pressed
        if stream is not None:
            stream.stop()
        progress.stop()
        raise RlboxError("interrupted; " + _aftermath(plan, hosts), exit_code=130) from None
    except RlboxError as err:
        if stream is not None:
            stream.stop()
        progress.stop()
        raise RlboxError(f"{err}; {_aftermath(plan, hosts)}") from None
    except BaseException:
        if stream is not None:
            stream.stop()
        raise
    finally:
        progress.stop()
        if agent is not None and agent.pid:
            agent.close()
    now = verify(plan, hosts, plan.order)
    want = plan.image_id or next(iter(now.values()), None)
    wrong = {n: i for n, i in now.items() if i != want}
    if wrong:
        raise RlboxError("after delivery, " + ", ".join(
            f"{n} holds {delivery.short(i) if i else 'nothing'}" for n, i in wrong.items())
            + f" under {plan.image}, not {delivery.short(want)}")
    for n in plan.order:
        progress.set(n, "verified", delivery.short(want))
    sent = stream.progress.sent if stream else 0
    return Report(tuple(n for n in plan.order if n not in pulled), tuple(pulled), time.monotonic() - started, sent)


def _aftermath(plan: DeliveryPlan, hosts: dict[str, Host]) -> str:
    """What every receiving node holds after a failure: the right image, or nothing new (a node
    that cannot be asked is said so)."""
    def state(name: str):
        try:
            facts = gather_one(name, hosts[name], plan.image, False)
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


def ensure(image: str, hosts: tuple[Host, ...], echo: Echo, *, missing_hint: str, tty: bool = False) -> Report | None:
    """For `rlbox run`: deliver the image where it is missing; refuse nodes holding another image
    under the name. None when every node already holds it."""
    try:
        p, by_label = make_plan(image, hosts)
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
    report = carry_out(p, by_label, echo, tty=tty)
    echo(f"deliver: {image} on {len(p.targets)} node(s) in {report.seconds:.1f} s, verified by image id")
    return report
