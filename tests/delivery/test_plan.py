"""The delivery plan (rlbox.delivery.plan), table-driven: facts in, plan or one-line refusal out.
No engine, no host: milliseconds."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile

import pytest

from rlbox.delivery import execute as deliver
from rlbox.delivery import plan as delivery
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
    assert "this machine -> n2 -> n3" in text
    assert "2 of 4 held by every receiving node: not sent" in text


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
    argv = deliver.hop(host)
    assert argv[0] == "ssh" and "-A" in argv and "-i" not in argv and "/home/me/.ssh/id" not in argv
    assert argv[-2:] == ["--", "ops@n2"] and "UserKnownHostsFile=/etc/kh" in argv


def test_a_long_chain_grows_linearly():
    hosts = {f"n{i}": Host(f"n{i}", ssh_port=22) for i in range(64)}
    p = delivery.plan("img:1", RIGHT, tuple(NodeFacts(n) for n in hosts))
    stream = deliver.Stream(p, hosts, progress=None, env={})
    stream.build(p.order)
    (sink,) = stream.sinks
    assert sink.names == p.order
    assert len(" ".join(sink.argv)) < 3 * len(deliver.NODE_SCRIPT) + 64 * 400  # no nested quoting


FAKE_DOCKER = """#!/bin/sh
[ "$1" = load ] || exit 64
f=$(mktemp "$FAKE_DIR/load.XXXXXX") && cat > "$f" && echo "Loaded image: img:1"
"""


def test_node_script_chain_tees_forwards_and_reports(tmp_path):
    """The fixed script itself, three nodes deep, with a docker stand-in that keeps what it loads,
    and `sh -c 'eval "$1"'` standing in for ssh (it runs the quoted command as sshd would). Node
    names with quotes and ; travel as data."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "docker"
    fake.write_text(FAKE_DOCKER)
    fake.chmod(0o755)
    ssh = ["sh", "-c", 'eval "$1"', "ssh"]
    names = ["n1", "n 2'x", "n3;rm -rf /"]
    argv = ["sh", "-c", deliver.NODE_SCRIPT, "mark", deliver.NODE_SCRIPT, names[0]]
    for n in names[1:]:
        argv += [n, str(len(ssh)), *ssh]
    data = os.urandom(3 << 20)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", FAKE_DIR=str(tmp_path))
    proc = subprocess.run(argv, input=data, capture_output=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    reports = sorted(line for line in proc.stderr.decode().splitlines() if line.startswith("mark "))
    assert reports == sorted(f"mark {n} loaded Loaded image: img:1" for n in names)
    loads = sorted(tmp_path.glob("load.*"))
    assert len(loads) == 3 and all(f.read_bytes() == data for f in loads)


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
    out = b"".join(deliver.filtered(io.BytesIO(tar), omit))
    with tarfile.open(fileobj=io.BytesIO(out)) as t:
        names = t.getnames()
        assert names == ["y/layer.tar", "cfg.json", "manifest.json"]  # order kept: manifest last
        assert t.extractfile("y/layer.tar").read() == keep
