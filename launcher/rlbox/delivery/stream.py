"""Image delivery's streams: the script each node runs (tee into its load and to its children in
the tree), the argv that reaches a node, the tar filter that leaves held layers out, and Stream,
one group's stream from the source down its tree. The rules are in rlbox.delivery.plan; what
carries a plan out is rlbox.delivery.execute."""

from __future__ import annotations

import hashlib
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from rlbox.cluster.hosts import SSH_CONNECT_TIMEOUT, ssh_argv, ssh_base, ssh_target
from rlbox.cluster.spec import Host
from rlbox.core.errors import RlboxError, last_line
from rlbox.delivery import plan as delivery
from rlbox.delivery.links import PERSIST
from rlbox.delivery.plan import DeliveryPlan
from rlbox.delivery.progress import Progress

CHUNK = 1 << 20

# On one node: load stdin and forward it to this node's children in the tree while loading.
# Arguments: $0 the marker every report line starts with, $1 this script's own text, $2 this
# node's name, $3 what a node does with the stream (load: `docker load`; discard: `cat >
# /dev/null`, the bench's sink), $4 "-", or on a node that is the source the image to `docker
# save` (it then loads nothing), $5 P, then P hop prefixes (each the ssh argv up to and including
# `--`, shell-quoted as one word: nodes with the same ssh settings share one), then this node's
# descendants in pre-order, each 4 words: its name, the size of its subtree (itself included),
# the number of its hop prefix, and its `[user@]host`. A child's command is quoted here from the
# plain values: it grows by 4 short words per descendant (about 50 bytes; 50 KB at 1,000 nodes,
# under the kernel's 128 KB for one argument), never by nesting quotes.
NODE_SCRIPT = r"""set -u
self=$1; label=$2; mode=$3; image=$4; np=$5; shift 5
say() { printf '%s %s %s\n' "$0" "$label" "$*" >&2; }
q() { case $1 in *\'*) printf "'"; printf '%s' "$1" | sed "s/'/'\\\\''/g"; printf "'" ;; *) printf "'%s'" "$1" ;; esac; }
sink() { if [ "$mode" = discard ]; then cat >/dev/null; else docker load; fi; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/rlbox-deliver.XXXXXX") || { say failed cannot make a temporary directory; exit 1; }
pids=""
trap 'rm -rf "$dir"' EXIT
trap 'for p in $pids; do kill "$p" 2>/dev/null; done; exit 129' HUP INT TERM PIPE
pfx=""; i=0
while [ "$i" -lt "$np" ]; do i=$((i + 1)); eval "pfx_$i=\$1"; pfx="$pfx $(q "$1")"; shift; done
kids=0
while [ $# -gt 0 ]; do
    name=$1; size=$2; k=$3; target=$4; shift 4
    case $k in *[!0-9]*|'') say failed bad hop number; exit 1 ;; esac
    eval "hop=\$pfx_$k"
    rest=""; j=1
    while [ "$j" -lt "$size" ]; do rest="$rest $(q "$1") $(q "$2") $(q "$3") $(q "$4")"; shift 4; j=$((j + 1)); done
    kids=$((kids + 1))
    mkfifo "$dir/k$kids" || { say failed cannot make a fifo; exit 1; }
    cmd="sh -c $(q "$self") $(q "$0") $(q "$self") $(q "$name") $(q "$mode") - $np$pfx$rest"
    eval "$hop $(q "$target") \"\$cmd\"" <"$dir/k$kids" &
    pids="$pids $!"
done
# running, its children's hops begun: said before any byte arrives (the launcher holds the stream until
# every node has said it, so the chain is made on CPUs the transfer does not use yet)
say ready
i=0
while [ "$i" -lt "$kids" ]; do i=$((i + 1)); set -- "$@" "$dir/k$i"; done
# GNU tee -p: an output that fails (this node's load, or a child) is dropped and the others are
# still fed, so one bad node does not fail its neighbours
p=; if tee -p </dev/null >/dev/null 2>&1; then p=-p; fi
if [ "$image" != - ]; then
    # the source: its own docker save, to its children directly; its input is the launcher's ssh,
    # which only ever closes: then (Ctrl-C, a failure there) the save and the stream stop
    mkfifo "$dir/in" || { say failed cannot make a fifo; exit 1; }
    docker save -- "$image" >"$dir/in" 2>"$dir/out" &
    save=$!
    tee $p "$@" <"$dir/in" >/dev/null &
    feed=$!
    pids="$pids $save $feed"
    exec 3<&0
    # the launcher's ssh closing ends the delivery; the watcher's reader is killed with it (a TERM to the
    # watcher alone left its `cat` holding the session's stderr, and a reader of that stderr waited forever)
    { reader=""; trap '[ -z "$reader" ] || kill -9 "$reader" 2>/dev/null; exit 0' TERM
      cat <&3 >/dev/null 2>&1 & reader=$!
      wait "$reader"; for c in $pids; do kill "$c" 2>/dev/null; done; } &
    watch=$!
    wait "$save"; rc=$?
    wait "$feed"
    kill "$watch" 2>/dev/null
    for c in $pids; do wait "$c"; done
    if [ "$rc" -eq 0 ]; then say saved; else say failed "docker save: $(tail -n 1 "$dir/out")"; fi
    exit "$rc"
fi
if [ "$kids" -eq 0 ]; then
    sink >"$dir/out" 2>&1
    rc=$?
else
    mkfifo "$dir/load" || { say failed cannot make a fifo; exit 1; }
    sink <"$dir/load" >"$dir/out" 2>&1 &
    load=$!
    tee $p "$dir/load" "$@" >/dev/null
    wait "$load"
    rc=$?
    for c in $pids; do wait "$c"; done
fi
if [ "$rc" -eq 0 ]; then say loaded "$(tail -n 1 "$dir/out")"; else say failed "$(tail -n 1 "$dir/out")"; fi
exit "$rc"
"""



def on_host(host: Host | None, words: list[str], *options: str) -> list[str]:
    """The argv running ``words`` on ``host`` (None: this machine); over ssh, quoted for the remote shell."""
    if host is None or host.local:
        return list(words)
    return ssh_argv(host, *options, command=[shlex.join(words)])


def entries(edges: tuple[tuple[str, str], ...], hops: dict[str, list[str]]) -> list[str]:
    """NODE_SCRIPT's tree arguments: P, the P distinct hop prefixes (each quoted as one word),
    then per node of ``edges`` (pre-order, a subtree's root first) its name, the size of its
    subtree, its prefix's number and the word after ``--`` in its hop."""
    size = dict.fromkeys((n for n, _ in edges), 1)
    for name, parent in reversed(edges):
        if parent in size:
            size[parent] += size[name]
    prefixes: dict[str, int] = {}
    words: list[str] = []
    for name, _ in edges:
        argv = hops[name]
        prefix = shlex.join(argv[:-1])
        number = prefixes.setdefault(prefix, len(prefixes) + 1)
        words += [name, str(size[name]), str(number), argv[-1]]
    return [str(len(prefixes)), *prefixes, *words]


def control_path(marker: str) -> str:
    """Where a sending node's ssh master for one child listens: in the user's home, a directory
    no other user can write (ssh_config's advice: in /tmp another user could put a socket of their
    own at the path first, and the hop would hand it the stream). ssh expands ``~`` and %C (a hash
    of the two hosts, the port and the user, so the same in the warm-up and in the hop). Where it
    cannot make the socket (no home, a path over ~100 bytes) the hop makes its own connection."""
    return f"~/.{marker}-%C"


def hop(host: Host, marker: str | None = None) -> list[str]:
    """The argv (without the command) a node runs to reach the next node: ssh with the forwarded
    agent (-A), the cluster file's port, user and known_hosts, never a key file path of this machine.
    With ``marker``: through the master a warm-up left (``warm_words``) when it is there already,
    a connection of its own when not (ssh says nothing of a missing socket)."""
    options = ("-o", "ControlMaster=no", "-o", f"ControlPath={control_path(marker)}") if marker else ()
    return ssh_argv(replace(host, identity_file=None), "-A", *options)


# On a sending node, while a delivery runs: an ssh master to one child, made before the stream
# reaches this node, so that the hop to the child is a session on a connection already made (a
# chain's hops otherwise make their connections one after another, each waiting for the one
# above: ~0.25 s a hop on a 2-core machine). The master has no session of its own (-N): no login
# shell on the child, whose ~/.bashrc every session reads (root's pyenv init here, ~90 ms a
# session; conda's init on a cluster's accounts is the same kind), so a warm-up costs the child a
# key exchange only. With ControlPersist ssh returns once the master is up and leaves it in the
# background; this session then reads its stdin, the launcher's pipe: when that closes (the
# delivery ended, Ctrl-C, the launcher died) or this session is cut, `-O stop` tells the master
# to take no more sessions, and it ends once the hops through it have ended (it removes its
# socket). Killed before that, the master ends PERSIST seconds after its last session.
# $0 the delivery's marker, $1 the child's [user@]host, $2 PERSIST, then ssh and its options.
WARM_SCRIPT = r"""t=$1; persist=$2; shift 2
"$@" -o ControlMaster=yes -o ControlPersist="$persist" -N -- "$t" </dev/null >/dev/null 2>&1
cat >/dev/null
exec "$@" -O stop -- "$t" >/dev/null 2>&1
"""


def _end(proc: subprocess.Popen, grace: float) -> None:
    """Wait ``grace`` seconds for ``proc`` to end, then terminate it, then kill it."""
    for step in (None, proc.terminate, proc.kill):
        if step is not None:
            step()
        try:
            proc.wait(timeout=grace if step is None else 5)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def warm_words(child: Host, marker: str) -> list[str]:
    """The words a sending node runs to make its master to ``child`` (WARM_SCRIPT)."""
    # -A on the master: a session through it gets the agent only when the master forwards it (the
    # -A of the hop asks, the master's own options decide), and the child needs the agent to make
    # its own hop when its master is not ready yet
    base = ssh_base(replace(child, identity_file=None)) + ["-A", "-o", f"ControlPath={control_path(marker)}"]
    return ["sh", "-c", WARM_SCRIPT, marker, ssh_target(child), str(PERSIST), *base]


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
    """One group's stream (delivery.Group): the source's ``docker save`` (filtered here when layers
    are left out), down the group's tree; or, when the source is a node, that node's own save sent
    to its children directly (this machine only starts it, and ends it on Ctrl-C)."""

    plan: DeliveryPlan
    hosts: dict[str, Host]
    progress: Progress
    env: dict[str, str]
    group: delivery.Group | None = None  # None: the plan's only group
    mode: str = "load"  # or "discard": the bench's `cat > /dev/null` instead of docker load
    options: tuple[str, ...] = ()  # of every ssh this machine runs: through the node's master (delivery.links)
    marker: str = field(default_factory=lambda: f"rlbox-deliver-{secrets.token_hex(4)}")
    results: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> (loaded|failed, detail)
    sinks: list[Sink] = field(default_factory=list)
    source_proc: subprocess.Popen | None = None
    direct: bool = False  # the source node sends to its children itself
    warm: list[list[str]] = field(default_factory=list)  # per hop between nodes: the sender's warm-up (its argv here)
    warm_procs: list[subprocess.Popen] = field(default_factory=list)
    ready: set[str] = field(default_factory=set)  # nodes whose script runs (said "ready")
    ended: int = 0  # sinks whose output has ended
    seen: threading.Condition = field(default_factory=threading.Condition, repr=False)  # a ready, a line, an end

    def __post_init__(self):
        if self.group is None and self.plan.groups:
            self.group = self.plan.groups[0]

    def node_words(self, name: str, after: list[str] | tuple = (), image: str = "-") -> list[str]:
        """A node's command; ``after``: entries() of its descendants (hop prefixes, then 4 words each)."""
        return ["sh", "-c", NODE_SCRIPT, self.marker, NODE_SCRIPT, name, self.mode, image, *(after or ["0"])]

    def entries(self, edges: tuple[tuple[str, str], ...]) -> list[str]:
        """The hop prefixes and the pre-order entries of ``edges`` (a subtree, root first)."""
        return entries(edges, {name: hop(self.hosts[name], self.marker) for name, _ in edges})

    def warm_up(self, edges: tuple[tuple[str, str], ...], first: str) -> None:
        """A warm-up per hop of ``edges`` whose sender is a node below ``first`` (parent "" is ``first``).
        Not ``first``'s own hops: the launcher's session starts its script at once, which makes them
        before a warm-up could (one made beside them is a second key exchange at the same moment)."""
        for name, parent in edges:
            sender = parent or first
            if sender != first:
                self.warm.append(self.on(sender, warm_words(self.hosts[name], self.marker), "-A"))

    def on(self, name: str, words: list[str], *options: str) -> list[str]:
        """The argv running ``words`` on node ``name`` from this machine."""
        return on_host(self.hosts[name], words, *options, *self.options)

    def build(self, names: tuple[str, ...]) -> None:
        remote = tuple(n for n in names if not self.hosts[n].local)
        for n in names:
            if self.hosts[n].local:
                self.sinks.append(Sink(self.node_words(n), (n,)))
        if not remote:
            return
        if self.plan.via == "launcher":
            for n in remote:
                self.sinks.append(Sink(self.on(n, self.node_words(n)), (n,)))
            return
        edges = delivery.tree(remote, self.plan.fanout)
        if self.plan.source not in (None, "local"):  # the source node feeds the tree itself
            self.direct = True
            words = self.node_words(self.plan.source, self.entries(edges), image=self.plan.image)
            self.sinks.append(Sink(self.on(self.plan.source, words, "-A"), remote))
            self.warm_up(edges, self.plan.source)
            return
        if len(remote) == 1:
            self.sinks.append(Sink(self.on(remote[0], self.node_words(remote[0])), remote))
            return
        words = self.node_words(remote[0], self.entries(edges[1:]))
        self.sinks.append(Sink(self.on(remote[0], words, "-A"), remote))
        self.warm_up(edges[1:], remote[0])

    def _read_reports(self, sink: Sink) -> None:
        for raw_line in sink.proc.stderr:
            line = raw_line.decode(errors="replace").rstrip("\n")
            if line.startswith(self.marker + " "):
                _, name, rest = line.split(" ", 2)
                state, _, detail = rest.partition(" ")
                if state == "ready":
                    with self.seen:
                        self.ready.add(name)
                        self.seen.notify_all()
                    continue
                if name == self.plan.source and name not in sink.names:  # the source node's own report
                    if state != "saved":
                        sink.lines.append(f"{name}: {detail}")
                    continue
                self.results[name] = (state, detail)
                self.progress.set(name, "loaded" if state == "loaded" else "failed", detail if state != "loaded" else "")
            elif line.strip():
                with self.seen:  # not a report: an ssh's or a shell's error, which may be why a node stays silent
                    sink.lines.append(line.strip())
                    self.seen.notify_all()
        with self.seen:
            self.ended += 1
            self.seen.notify_all()

    def hold(self) -> None:
        """Until every node of the stream has said it runs (NODE_SCRIPT's "ready": its own hops begun),
        reading nothing of the save meanwhile: the chain's hops, made one after another, are then made
        on CPUs the transfer does not use yet, and the bytes sent before them would only have waited in
        the pipes of the hops made so far (8 hosts here: the last node ran 3.9 s after the start with the
        bytes flowing, ~3.2 s without). A wait for answers: a line that is no report (a hop's ssh saying
        it cannot connect: the nodes past it will never say "ready"), a sink that ended, or a node silent
        for ssh's own connect timeout after the one before stops it, and the stream goes on as it would
        have (the chain waits at a hop that is not up, or passes a node that is gone)."""
        want = {n for sink in self.sinks for n in sink.names}
        with self.seen:
            while not want <= self.ready and not self.ended and not any(sink.lines for sink in self.sinks):
                before = len(self.ready)
                if not self.seen.wait(SSH_CONNECT_TIMEOUT) and len(self.ready) == before:
                    return

    def source_argv(self) -> list[str]:
        words = ["docker", "save", "--", self.plan.image]
        return words if self.plan.source == "local" else self.on(self.plan.source, words)

    def start_sink(self, sink: Sink) -> None:
        sink.proc = subprocess.Popen(sink.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=self.env)
        sink.reader = threading.Thread(target=self._read_reports, args=(sink,), daemon=True)
        sink.reader.start()
        for n in sink.names:
            self.progress.set(n, "receiving")

    def run(self, names: tuple[str, ...] | None = None) -> None:
        self.build(names if names is not None else self.group.names)
        try:
            self._stream()
        finally:
            self.cool_down()

    def warm_up_start(self) -> None:
        """Start the warm-ups, once the stream's own first ssh has started (it is the one every node
        waits for; the warm-ups are for hops further down), with less of the CPU than it."""
        for argv in self.warm:
            # `nice`, not preexec_fn (not safe with the threads of several streams)
            niced = ["nice", "-n", "10", *argv] if shutil.which("nice") else argv
            self.warm_procs.append(subprocess.Popen(niced, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL, env=self.env))

    def cool_down(self) -> None:
        """End the warm-ups: each node's master exits once its session's input closes (10 s for
        all of them together, then they are ended)."""
        for proc in self.warm_procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for proc in self.warm_procs:
            _end(proc, grace=max(0.0, deadline - time.monotonic()))
        self.warm_procs.clear()

    def _stream(self) -> None:
        if self.direct:  # nothing passes through here: start it, wait for it
            for sink in self.sinks:
                self.start_sink(sink)
            self.warm_up_start()
            for sink in self.sinks:
                sink.proc.wait()
                sink.reader.join(timeout=10)
            return
        try:
            self.source_proc = subprocess.Popen(self.source_argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, env=self.env)
        except FileNotFoundError:
            raise RlboxError("this machine: no docker CLI to save the image with") from None
        for sink in self.sinks:
            self.start_sink(sink)
        self.warm_up_start()
        self.hold()  # the save runs meanwhile (an engine that exports first does it now), its pipe full
        omit = frozenset(self.group.omitted if self.group else self.plan.omitted)
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
            # its output closed first: docker's CLI, blocked writing it, would wait for three signals to exit
            # (every node's ssh gone mid-stream: the run waited for it for ever), and a write now fails at once
            self.source_proc.stdout.close()
            _end(self.source_proc, grace=0)
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
        procs = [p for p in [self.source_proc] + [s.proc for s in self.sinks] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            _end(proc, grace=10)
        for sink in self.sinks:
            if sink.reader is not None:
                sink.reader.join(timeout=5)
        self.cool_down()

    def failures(self) -> dict[str, str]:
        """Nodes that did not report ``loaded``, with why."""
        out = {}
        for sink in self.sinks:
            for n in sink.names:
                state, detail = self.results.get(n, ("", ""))
                if state != "loaded":
                    out[n] = detail or (sink.lines[-1] if sink.lines else "no report from the node")
        return out
