"""The delivery plan (rlbox.delivery.plan), table-driven: facts in, plan or one-line refusal out.
No engine, no host: milliseconds."""

from __future__ import annotations

import hashlib
import io
import os
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from rlbox.delivery import execute as deliver
from rlbox.delivery import plan as delivery
from rlbox.delivery import stream as dstream
from rlbox.delivery.plan import ImageFacts, NodeFacts, PlanError, chain_ids
from rlbox.cluster.spec import Host

L = tuple(f"sha256:{c * 64}" for c in "abcd")  # four layers, lowest first
RIGHT = ImageFacts("sha256:" + "1" * 64, L, 600_000_000)
OTHER = ImageFacts("sha256:" + "2" * 64, L[:2], 300_000_000)
CH = chain_ids(L)


def node(name, image=None, held=0):
    """A node holding ``image`` under the name and the lowest ``held`` layers of RIGHT."""
    return NodeFacts(name, image, frozenset(CH[:held]))


def test_chain_ids_follow_docker():
    # layer.CreateChainID: sha256 of "<parent chain> <diff>"; the first is the diff id itself
    assert CH[0] == L[0]
    assert CH[1] == "sha256:" + hashlib.sha256(f"{L[0]} {L[1]}".encode()).hexdigest()
    assert len(CH) == 4 and len(set(CH)) == 4


CASES = [
    # id, local, nodes, kwargs, targets, skipped, source, omitted, conflicts
    ("all missing, from here", RIGHT, [node("a"), node("b")], {}, ["a", "b"], [], "local", (), []),
    ("one has it", RIGHT, [node("a", RIGHT), node("b")], {}, ["b"], ["a"], "local", (), []),
    ("everyone has it", RIGHT, [node("a", RIGHT)], {}, [], ["a"], "local", (), []),
    ("held layers left out", RIGHT, [node("a", held=3), node("b", held=2)], {}, ["a", "b"], [], "local", L[:2], []),
    ("a layer not held by all travels", RIGHT, [node("a", held=3), node("b", held=0)], {}, ["a", "b"], [], "local", (), []),
    ("all layers held: config only", RIGHT, [node("a", held=4)], {}, ["a"], [], "local", L, []),
    ("no engine here: a node is the source", None, [node("a", RIGHT), node("b")], {}, ["b"], ["a"], "a", (), []),
    ("different image: refused", RIGHT, [node("a", OTHER), node("b")], {}, ["b"], [], "local", (), ["a"]),
    ("different image, --force", RIGHT, [node("a", OTHER), node("b")], {"force": True}, ["a", "b"], [], "local", (), []),
    ("--from a node", RIGHT, [node("a", RIGHT), node("b")], {"source": "a"}, ["b"], ["a"], "a", (), []),
    ("registry only", None, [node("a"), node("b")], {"registry": "reg:5000"}, ["a", "b"], [], None, (), []),
    ("registry with a fallback", RIGHT, [node("a")], {"registry": "reg:5000"}, ["a"], [], "local", (), []),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan(case):
    _, local, nodes, kw, targets, skipped, source, omitted, conflicts = case
    p = delivery.plan("img:1", local, tuple(nodes), **kw)
    assert [t.name for t in p.targets] == targets
    assert list(p.skipped) == skipped
    assert p.source == (source if targets else p.source)
    assert p.omitted == omitted
    assert [t.name for t in p.conflicts] == conflicts
    assert (delivery.refusal(p) is None) == (not conflicts)
    text = p.describe()  # printable, names every node
    assert all(n.name in text for n in nodes)


def test_a_layer_twice_is_sent_for_its_upper_place():
    twice = ImageFacts("sha256:" + "3" * 64, (L[0], L[1], L[0]), 1)
    chains = chain_ids(twice.diff_ids)
    p = delivery.plan("img:1", twice, (NodeFacts("a", None, frozenset(chains[:2])),))
    assert p.omitted == (L[1],)  # L[0] is recognised by content: it must travel for place 3


REFUSALS = [
    ("nodes disagree, nothing here", None, [node("a", RIGHT), node("b", OTHER)], {}, "different images under img:1"),
    ("nowhere", None, [node("a")], {}, "neither on this machine nor on any node"),
    ("--from a stranger", RIGHT, [node("a")], {"source": "zz"}, "--from zz: not a node"),
    ("--from local without it", None, [node("a", RIGHT)], {"source": "local"}, "does not hold img:1"),
    ("--from a node without it", RIGHT, [node("a")], {"source": "a"}, "--from a: a does not hold"),
    ("--via nonsense", RIGHT, [node("a")], {"via": "carrier-pigeon"}, "--via must be one of"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refused(case):
    _, local, nodes, kw, words = case
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        delivery.plan("img:1", local, tuple(nodes), **kw)


def test_refusal_names_node_and_both_ids():
    p = delivery.plan("img:1", RIGHT, (node("a", OTHER),))
    line = delivery.refusal(p)
    assert "a has 222222222222" in line and "111111111111" in line and "--force" in line and "\n" not in line


def test_describe_dry_run():
    p = delivery.plan("img:1", RIGHT, (node("n1", RIGHT), node("n2", held=2), node("n3", held=3)))
    text = p.describe()
    assert "n1" in text and "has it: skipped" in text
    # per-node layer sets: n2 and n3 lack different layers, so each has its stream
    assert "stream 1 this machine -> n2  (" in text and "stream 2 this machine -> n3  (" in text
    assert "2 of 4 held by n2: not sent to them" in text and "3 of 4 held by n3: not sent to them" in text
    same = delivery.plan("img:1", RIGHT, (node("n2", held=2), node("n3", held=2))).describe()
    assert "this machine -> n2 -> n3" in same and "2 of 4 held by every receiving node: not sent" in same


TREES = [
    # n, fanout, the tree ((node, parent) pre-order), depth
    (1, 1, [("n0", "")], 1),
    (3, 1, [("n0", ""), ("n1", "n0"), ("n2", "n1")], 3),
    (5, 2, [("n0", ""), ("n1", "n0"), ("n3", "n1"), ("n4", "n1"), ("n2", "n0")], 3),
    (7, 3, [("n0", ""), ("n1", "n0"), ("n4", "n1"), ("n5", "n1"), ("n6", "n1"), ("n2", "n0"), ("n3", "n0")], 3),
]


@pytest.mark.parametrize("n,fanout,edges,deep", TREES)
def test_tree(n, fanout, edges, deep):
    got = delivery.tree(tuple(f"n{i}" for i in range(n)), fanout)
    assert list(got) == edges and delivery.depth(got) == deep


@pytest.mark.parametrize("n,fanout,deep", [(1, 1, 1), (8, 1, 8), (16, 1, 16), (17, 2, 5), (64, 2, 7),
                                           (256, 2, 9), (1000, 2, 10)])
def test_fanout_chosen_by_n(n, fanout, deep):
    p = delivery.plan("img:1", RIGHT, tuple(node(f"n{i}") for i in range(n)))
    (g,) = p.groups
    assert p.fanout == fanout and delivery.depth(g.edges) == deep and sorted(g.names) == sorted(p.order)
    assert sorted(parent for _, parent in g.edges).count("") == 1  # the source sends one copy


GROUPS = [
    # id, nodes (name, held), kwargs, [(omitted count, names)]
    ("all fresh: one stream", [("a", 0), ("b", 0)], {}, [(0, ["a", "b"])]),
    ("per-node layer sets", [("a", 3), ("b", 0), ("c", 3), ("d", 1)], {},
     [(3, ["a", "c"]), (0, ["b"]), (1, ["d"])]),
    ("a node is the source: every layer, one stream", [("s", 4), ("a", 3), ("b", 0)], {"source": "s"},
     [(0, ["a", "b"])]),
    ("via launcher: one stream per node, each its own layers", [("a", 2), ("b", 0)], {"via": "launcher"},
     [(2, ["a"]), (0, ["b"])]),
]


@pytest.mark.parametrize("case", GROUPS, ids=[c[0] for c in GROUPS])
def test_groups(case):
    _, nodes, kw, want = case
    facts = tuple(node(n, RIGHT if n == "s" else None, held=h) for n, h in nodes)
    p = delivery.plan("img:1", None if "source" in kw else RIGHT, facts, **kw)
    assert [(len(g.omitted), list(g.names)) for g in p.groups] == want
    for g in p.groups:
        assert g.omitted == L[:len(g.omitted)]
        if kw.get("via") == "launcher":
            assert all(parent == "" for _, parent in g.edges)


def test_regroup_keeps_layer_sets_for_the_failed_pulls():
    p = delivery.plan("img:1", RIGHT, (node("a", held=2), node("b"), node("c")), registry="reg:5000")
    sub = delivery.regroup(p, ("a", "c"))
    assert [(len(g.omitted), g.names) for g in sub.groups] == [(2, ("a",)), (0, ("c",))]


def test_describe_tree_and_source_node():
    p = delivery.plan("img:1", RIGHT, tuple(node(f"n{i}") for i in range(5)), fanout=2)
    text = p.describe()
    assert "tree, fan-out 2, depth 3" in text and "this machine -> n0" in text and "n1 -> n3, n4" in text
    p = delivery.plan("img:1", None, (node("s", RIGHT), node("a"), node("b")))
    assert "source   s (docker save there, sent from it directly)" in p.describe()
    assert "s -> a -> b" in p.describe()


# -- the executor's pure parts: argv building, report parsing, the tar filter -------------------


def test_gathered_output_parsed():
    text = (f"image {RIGHT.id} 600 {list(L)!r}\n".replace("'", '"')
            + 'layers ["%s"]\nlayers null\n' % L[0])
    facts = deliver.parse_gathered("n1", text)
    assert facts.image == ImageFacts(RIGHT.id, L, 600)
    assert facts.chains == frozenset({L[0]})


def test_engines_counted_once():
    hosts = (Host("sim0", transport="local"), Host("sim1", transport="local"), Host("n1", ssh_port=22),
             Host("n1", ssh_port=2222))
    assert list(deliver.unique_hosts(hosts)) == ["sim0", "n1:22", "n1:2222"]


def test_hop_is_argv_without_a_local_key():
    host = Host("n2", ssh_user="ops", ssh_port=2222, identity_file="/home/me/.ssh/id", known_hosts="/etc/kh")
    argv = dstream.hop(host)
    assert argv[0] == "ssh" and "-A" in argv and "-i" not in argv and "/home/me/.ssh/id" not in argv
    assert argv[-2:] == ["--", "ops@n2"] and "UserKnownHostsFile=/etc/kh" in argv


@pytest.mark.parametrize("fanout", [1, 2])
def test_a_long_stream_grows_linearly(fanout):
    hosts = {f"n{i}": Host(f"n{i}", ssh_port=22) for i in range(64)}
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in hosts), fanout=fanout)
    stream = dstream.Stream(p, hosts, progress=None, env={})
    stream.build(p.order)
    (sink,) = stream.sinks
    assert sink.names == p.order
    assert len(" ".join(sink.argv)) < 3 * len(dstream.NODE_SCRIPT) + 64 * 400  # no nested quoting


def test_a_thousand_nodes_fit_one_argument():
    """The first node's command names every node below it and is one argument to its shell: it
    must stay under the kernel's 128 KB (MAX_ARG_STRLEN); a larger group is split into streams."""
    hosts = {f"10.1.{i // 250}.{i % 250 + 1}": Host(f"10.1.{i // 250}.{i % 250 + 1}", ssh_user="root", ssh_port=22,
                                                   known_hosts="/etc/rlbox/known_hosts") for i in range(1000)}
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in hosts))
    stream = dstream.Stream(p, hosts, progress=None, env={})
    stream.build(p.order)
    (sink,) = stream.sinks
    assert max(len(a) for a in sink.argv) < 100_000
    big = {f"n{i}": Host(f"n{i}") for i in range(2 * delivery.STREAM_MAX + 1)}
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in big))
    assert [len(g.names) for g in p.groups] == [delivery.STREAM_MAX, delivery.STREAM_MAX, 1]


def test_a_source_node_sends_directly():
    hosts = {n: Host(n, ssh_port=22) for n in ("s", "a", "b")}
    p = delivery.plan("img:1", None, (node("s", RIGHT), node("a"), node("b")))
    stream = dstream.Stream(p, hosts, progress=None, env={})
    stream.build(p.order)
    (sink,) = stream.sinks
    assert stream.direct and sink.names == ("a", "b")
    assert sink.argv[0] == "ssh" and "-A" in sink.argv and sink.argv[sink.argv.index("--") + 1] == "s"
    assert "img:1" in sink.argv[-1] and "docker save" not in " ".join(stream.source_argv()[:0])


def _warmed(stream) -> list[tuple[str, str]]:
    """(sender, child) of each warm-up: the host its session goes to, the child its master reaches."""
    out = []
    for argv in stream.warm:
        sender = argv[argv.index("--") + 1]
        words = shlex.split(argv[-1])
        assert words[:2] == ["sh", "-c"] and words[3] == stream.marker
        out.append((sender, words[4]))
    return out


@pytest.mark.parametrize("fanout", [1, 2])
def test_every_hop_between_nodes_is_warmed_by_its_sender(fanout):
    hosts = {n: Host(n, ssh_port=22) for n in ("a", "b", "c", "d")}
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in hosts), fanout=fanout)
    stream = dstream.Stream(p, hosts, progress=None, env={})
    stream.build(p.order)
    # this machine -> a makes its own connection and a's script its hops at once; every hop below
    # a's children is warmed by its sender
    edges = delivery.tree(p.order, fanout)
    assert _warmed(stream) == [(parent, child) for child, parent in edges[1:] if parent != edges[0][0]]
    assert len(_warmed(stream)) == (2 if fanout == 1 else 1)
    assert f"ControlPath=~/.{stream.marker}-%C" in stream.sinks[0].argv[-1]


def test_a_source_node_warms_the_hops_below_its_own_and_one_node_warms_none():
    hosts = {n: Host(n, ssh_port=22) for n in ("s", "a", "b")}
    p = delivery.plan("img:1", None, (node("s", RIGHT), node("a"), node("b")))
    stream = dstream.Stream(p, hosts, progress=None, env={})
    stream.build(p.order)
    assert _warmed(stream) == [("a", "b")]  # s's script makes s -> a at once
    one = dstream.Stream(delivery.plan("img:1", RIGHT, (NodeFacts("a"),)), hosts, progress=None, env={})
    one.build(("a",))
    assert one.warm == []


def test_the_warm_script_ends_its_master_when_its_input_closes(tmp_path):
    """WARM_SCRIPT with a stand-in for ssh that, like ssh with -N and ControlPersist, returns once
    its master runs in the background, and ends that master on `-O stop`: the master is made with
    no session of its own (-N, no login shell on the child) before the script reads its input,
    runs while that is open and is told to stop once it closes (the real master's ending with its
    last hop: tests/delivery/test_delivery_execute.py)."""
    pidfile = tmp_path / "pid"
    fake = ["sh", "-c", f"""case " $* " in
        *" -N "*) sleep 600 </dev/null >/dev/null 2>&1 & echo $! > {pidfile} ;;
        *" -O stop "*) kill "$(cat {pidfile})" ;;
        *) exit 64 ;;
    esac""", "ssh"]
    proc = subprocess.Popen(["sh", "-c", dstream.WARM_SCRIPT, "rlbox-deliver-t", "child", "60", *fake], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    master = int(pidfile.read_text())
    time.sleep(0.2)
    os.kill(master, 0)  # running, and the script waits on its input
    assert proc.poll() is None
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    deadline = time.monotonic() + 10
    while Path(f"/proc/{master}").exists() and "zombie" not in Path(f"/proc/{master}/status").read_text().lower():
        assert time.monotonic() < deadline, "the master outlived its warm-up"
        time.sleep(0.05)


def test_a_warm_up_masters_with_no_session_and_persists_only_so_long():
    words = dstream.warm_words(Host("b", ssh_port=22), "rlbox-deliver-t")
    assert words[:2] == ["sh", "-c"] and words[3:6] == ["rlbox-deliver-t", "b", str(dstream.PERSIST)]
    assert "-N" in dstream.WARM_SCRIPT and "ControlPersist=\"$persist\"" in dstream.WARM_SCRIPT


class _Shown:
    """What the progress display would show: nothing here."""

    def set(self, *_args) -> None:
        pass


def _held(script: str, names: tuple[str, ...], monkeypatch, silence: float = 10) -> tuple[float, set[str]]:
    """Stream.hold over one sink running ``script`` (its stderr the nodes' reports): seconds held, nodes ready."""
    monkeypatch.setattr(dstream, "SSH_CONNECT_TIMEOUT", silence)
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in names))
    stream = dstream.Stream(p, {n: Host(n, ssh_port=22) for n in names}, progress=_Shown(), env=dict(os.environ),
                            marker="mark")
    stream.sinks.append(dstream.Sink(["sh", "-c", script], names))
    stream.start_sink(stream.sinks[0])
    started = time.monotonic()
    try:
        stream.hold()
        return time.monotonic() - started, set(stream.ready)
    finally:
        stream.stop()


def test_the_stream_is_held_until_every_node_says_it_runs(monkeypatch):
    took, ready = _held('sleep 0.4; echo "mark a ready" >&2; sleep 0.4; echo "mark b other" >&2; '
                        'echo "mark b ready" >&2; exec cat >/dev/null', ("a", "b"), monkeypatch)
    assert ready == {"a", "b"} and 0.7 < took < 5, took


def test_a_silent_node_a_sink_that_ends_or_a_line_that_is_no_report_holds_it_no_longer(monkeypatch):
    # b's hop failing: silent for ssh's own connect timeout (here 0.5 s) after a's answer, then the stream goes
    took, ready = _held('echo "mark a ready" >&2; exec cat >/dev/null', ("a", "b"), monkeypatch, silence=0.5)
    assert ready == {"a"} and 0.4 < took < 3, took
    took, ready = _held('echo "mark a ready" >&2; exit 3', ("a", "b"), monkeypatch)  # the first node's session ended
    assert ready == {"a"} and took < 3, took
    # a's hop to b refused (sshd gone): ssh's line, no report, and b never says ready: no wait for it
    took, ready = _held('echo "mark a ready" >&2; sleep 0.3; echo "ssh: connect to host b port 22: Connection refused" >&2; '
                        'exec cat >/dev/null', ("a", "b"), monkeypatch)
    assert ready == {"a"} and 0.2 < took < 3, took


FAKE_DOCKER = """#!/bin/sh
[ "$1" = load ] || exit 64
f=$(mktemp "$FAKE_DIR/load.XXXXXX") && cat > "$f" && echo "Loaded image: img:1"
"""


def _script_env(tmp_path):
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    return dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path))


SSH = ["sh", "-c", 'eval "$1"', "ssh"]  # runs the quoted command as sshd would ($0: "ssh", the target)


def _entries(edges):
    return dstream.entries(edges, {n: SSH for n, _ in edges})


@pytest.mark.parametrize("fanout", [1, 2])
def test_node_script_tree_tees_forwards_and_reports(tmp_path, fanout):
    """The fixed script itself, five nodes as a chain and as a binary tree, with a docker stand-in
    that keeps what it loads, and `sh -c 'eval "$1"'` standing in for ssh. Node names with quotes
    and ; travel as data."""
    env = _script_env(tmp_path)
    names = ("n1", "n 2'x", "n3;rm -rf /", "n4", "n$(5)")
    edges = delivery.tree(names, fanout)
    argv = ["sh", "-c", dstream.NODE_SCRIPT, "mark", dstream.NODE_SCRIPT, names[0], "load", "-", *(_entries(edges[1:]) or ["0"])]
    data = os.urandom(3 << 20)
    proc = subprocess.run(argv, input=data, capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    reports = sorted(line for line in proc.stderr.decode().splitlines() if line.startswith("mark "))
    # each node says it runs (its hops begun) before its load's report: the launcher holds the stream for it
    assert reports == sorted([f"mark {n} loaded Loaded image: img:1" for n in names] + [f"mark {n} ready" for n in names])
    loads = sorted(tmp_path.glob("load.*"))
    assert len(loads) == 5 and all(f.read_bytes() == data for f in loads)


def test_node_script_discard_and_source_node(tmp_path):
    """mode discard reads into /dev/null (no docker load); a source node (image given) runs its
    own docker save and feeds its children, loading nothing itself."""
    env = _script_env(tmp_path)
    saver = tmp_path / "bin" / "docker"
    saver.write_text(FAKE_DOCKER.replace('[ "$1" = load ] || exit 64',
                                         '[ "$1" = save ] && { head -c 1000000 /dev/zero; exit 0; }\n'
                                         '[ "$1" = load ] || exit 64'))
    edges = delivery.tree(("a", "b", "c"), 2)
    argv = ["sh", "-c", dstream.NODE_SCRIPT, "mark", dstream.NODE_SCRIPT, "src", "load", "img:1", *_entries(edges)]
    # its input is the launcher's ssh: open for as long as the delivery runs
    src = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        err = src.stderr.read()
        assert src.wait(timeout=60) == 0, err
    finally:
        src.stdin.close()
        src.kill()
    reports = sorted(line for line in err.decode().splitlines() if line.startswith("mark "))
    assert reports == ["mark a loaded Loaded image: img:1", "mark a ready", "mark b loaded Loaded image: img:1",
                       "mark b ready", "mark c loaded Loaded image: img:1", "mark c ready", "mark src ready",
                       "mark src saved"]
    assert [f.stat().st_size for f in tmp_path.glob("load.*")] == [1000000] * 3
    for f in tmp_path.glob("load.*"):
        f.unlink()
    argv = ["sh", "-c", dstream.NODE_SCRIPT, "mark", dstream.NODE_SCRIPT, "a", "discard", "-", *_entries(edges[1:])]
    proc = subprocess.run(argv, input=os.urandom(1 << 20), capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0 and not list(tmp_path.glob("load.*"))
    assert proc.stderr.decode().count(" loaded") == 3


def test_image_names_are_checked():
    for bad in ("-oProxyCommand=x", "a b", "img;rm"):
        with pytest.raises(Exception):
            deliver.check_image(bad)


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_filter_drops_layer_files_by_content():
    keep, drop = b"upper layer" * 100, b"lower layer" * 100
    tar = _tar({"x/layer.tar": drop, "y/layer.tar": keep, "cfg.json": b"{}", "manifest.json": b"[]"})
    omit = frozenset({"sha256:" + hashlib.sha256(drop).hexdigest()})
    out = b"".join(dstream.filtered(io.BytesIO(tar), omit))
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        names = t.getnames()
        assert names == ["y/layer.tar", "cfg.json", "manifest.json"]  # order kept: manifest last
        assert t.extractfile("y/layer.tar").read() == keep


def test_a_stream_whose_every_node_went_away_ends_its_save_and_names_them(tmp_path):
    """Every node's ssh ends mid-stream (the hosts rebooted): the save is ended and the stream returns,
    naming each node. The save here is a stand-in that, as docker's CLI does, does not exit on one
    SIGTERM while it is blocked writing its output (found by a run that waited for it for ever)."""
    import threading

    from rlbox.delivery.progress import Progress

    hosts = {n: Host(n, ssh_port=22) for n in ("a", "b")}
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in hosts))
    said: list[str] = []
    stream = dstream.Stream(p, hosts, progress=Progress(p, said.append), env=dict(os.environ))
    stream.build(p.order)
    (sink,) = stream.sinks
    sink.argv = ["sh", "-c", "head -c 200000 > /dev/null"]  # reads a little, then its connection is gone
    save = ("import signal, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\n"
            "while True:\n"
            "    sys.stdout.buffer.write(b'x' * 65536)\n")
    stream.source_argv = lambda: [sys.executable, "-c", save]
    done = threading.Thread(target=stream._stream, daemon=True)
    done.start()
    done.join(timeout=30)
    assert not done.is_alive(), "the stream still waits for its save"
    assert stream.source_proc.poll() is not None
    assert set(stream.failures()) == {"a", "b"}
