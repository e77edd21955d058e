"""Hostile input is data: each case is one bad input a user or an attacker could hand rlbox.
Every one must end in exactly one line on stderr (`rlbox: error: ...`, never a traceback, never
markup or emoji rendered from the input), the expected exit code, nothing of the run left on the
engine, and no marker file from an injected command."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest
import yaml

from conftest import REPO, rlbox

SIM = "localhost/rlbox/sim:amd64"
IMG = "verl_pt27_25rc3:a3-arm"
RUN = ["run", "--name", "t13-h", "--smoke-test"]
DRY = [*RUN, "--dry-run"]

# (id, argv, files {name: text|bytes} written under {tmp}, what the one line must contain)
CASES = [
    # -- hosts: never an ssh option, never a shell word -------------------------------------------
    ("host-proxycommand", [*DRY, "--hosts", "-oProxyCommand=touch {marker}", "--image", IMG], {}, "not starting with -"),
    ("host-dash-E", [*DRY, "--hosts", "-Eevil", "--image", IMG], {}, "'-Eevil' is not HOST"),
    ("host-second-dash", [*DRY, "--hosts", "10.0.0.1,-oProxyCommand=touch {marker}", "--image", IMG], {}, "is not HOST"),
    ("host-semicolon", [*DRY, "--hosts", "a;touch {marker}", "--image", IMG], {}, "is not HOST"),
    ("host-subshell", [*DRY, "--hosts", "$(touch {marker})", "--image", IMG], {}, "is not HOST"),
    ("host-backticks", [*DRY, "--hosts", "`touch {marker}`", "--image", IMG], {}, "is not HOST"),
    ("host-newline", [*DRY, "--hosts", "a\nb", "--image", IMG], {}, "is not HOST"),
    ("host-space", [*DRY, "--hosts", "a b", "--image", IMG], {}, "is not HOST"),
    ("host-user-dash", [*DRY, "--hosts", "-l@host", "--image", IMG], {}, "is not HOST"),
    ("host-at-dash", [*DRY, "--hosts", "root@-oProxyCommand=x", "--image", IMG], {}, "is not HOST"),
    ("host-port-big", [*DRY, "--hosts", "host:99999", "--image", IMG], {}, "port 99999 out of range"),
    ("host-port-zero", [*DRY, "--hosts", "host:0", "--image", IMG], {}, "port 0 out of range"),
    ("host-unicode", [*DRY, "--hosts", "hôst", "--image", IMG], {}, "is not HOST"),
    ("host-empty", [*DRY, "--hosts", ",", "--image", IMG], {}, "give at least one host"),
    ("host-markup", [*DRY, "--hosts", "[bold]x[/bold]", "--image", IMG], {}, "'[bold]x[/bold]' is not HOST"),
    ("doctor-host-dash", ["doctor", "--hosts", "-oProxyCommand=touch {marker}", "--image", IMG], {}, "is not HOST"),
    ("serve-host-dash", ["serve", "{tmp}", "--hosts", "-oProxyCommand=touch {marker}", "--image", IMG, "--dry-run"], {},
     "is not HOST"),
    ("yaml-host-dash", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: '-oProxyCommand=touch {marker}'\n"}, "not starting with -"),
    ("yaml-user-dash", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: '-l@h'\n"}, "is not a host name"),
    ("yaml-address-space", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: h1\n    address: '1.2.3.4 -oX'\n"}, "is not an address"),
    ("yaml-nic-newline", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: h1\n    nic: \"eth0\\nx\"\n"}, "is not an address or interface name"),
    ("hostfile-dash", [*DRY, "--cluster", "{tmp}/hosts", "--image", IMG], {"hosts": "10.0.0.1\n-oProxyCommand=x\n"},
     "is not a host"),
    ("hostfile-garbage", [*DRY, "--cluster", "{tmp}/hosts", "--image", IMG], {"hosts": "this is ; garbage\n"},
     "'this is ; garbage' is not a host"),
    ("hostfile-two-words", [*DRY, "--cluster", "{tmp}/hosts", "--image", IMG], {"hosts": "node1 node2\n"},
     "'node1 node2' is not a host"),
    ("nic-option", [*DRY, "--hosts", "10.0.0.1", "--image", IMG, "--nic", "-x;touch {marker}"], {}, "not an interface name"),
    # -- cluster files: parse errors, unknown keys, duplicates, bytes --------------------------
    ("yaml-syntax", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG], {"c.yaml": "hosts: [a, b\nimage: x\n"},
     "fix the YAML syntax"),
    ("yaml-syntax-indent", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: a\n   - host: b\n"}, "fix the YAML syntax"),
    ("yaml-unknown-hots", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG], {"c.yaml": "hots:\n  - host: a\n"},
     "hots: unknown key (did you mean 'hosts'?)"),
    ("yaml-unknown-nested", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: a\n    ssh: {prot: 22}\n"}, "unknown key (did you mean 'port'?)"),
    ("yaml-duplicate-key", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: a\nhosts:\n  - host: b\n"}, "duplicate key 'hosts'"),
    ("yaml-duplicate-nested", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts:\n  - host: a\n    host: b\n"}, "duplicate key 'host'"),
    ("yaml-not-utf8", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG], {"c.yaml": b"hosts:\n  - host: \xff\xfe\n"},
     "not UTF-8 text"),
    ("hostfile-not-utf8", [*DRY, "--cluster", "{tmp}/hosts", "--image", IMG], {"hosts": b"\xc3\x28\n"}, "not UTF-8 text"),
    ("yaml-python-tag", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "hosts: !!python/object/apply:os.system ['touch {marker}']\n"}, "fix the YAML syntax"),
    ("yaml-hardware-bad", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG], {"c.yaml": "hardware: a9\nhosts: [{host: a}]\n"},
     "'a9' is not one of"),
    ("yaml-mount-relative", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG],
     {"c.yaml": "mounts: ['data:/data']\nhosts: [{host: a}]\n"}, "paths must be absolute"),
    ("yaml-list-top", [*DRY, "--cluster", "{tmp}/c.yaml", "--image", IMG], {"c.yaml": "- a: 1\n- b\n"}, "is not a host"),
    ("data-spec-duplicate", ["data", "prepare", "custom", "--spec", "{tmp}/s.yaml", "--image", SIM, "--out", "{tmp}/o",
                             "--dry-run"], {"s.yaml": "input: a.json\ninput: b.json\n"}, "duplicate key 'input'"),
    ("data-spec-not-utf8", ["data", "prepare", "custom", "--spec", "{tmp}/s.yaml", "--image", SIM, "--out", "{tmp}/o",
                            "--dry-run"], {"s.yaml": b"input: \xff\n"}, "not UTF-8 text"),
    # -- image references: parsed before any engine call, printed as they are -------------------
    ("image-double-slash", [*DRY, "--sim", "--nodes", "1", "--image", "Bad//Ref:x"], {}, "--image: Bad//Ref:x: '/Ref' is not a repository path"),
    ("image-short-digest", [*DRY, "--sim", "--nodes", "1", "--image", "foo@sha256:abc"], {}, "foo@sha256:abc: 'sha256:abc'"),
    ("image-emoji-code", [*DRY, "--sim", "--nodes", "1", "--image", ":x:"], {}, ":x:: '' is not a valid tag"),
    ("image-upper", [*DRY, "--sim", "--nodes", "1", "--image", "UPPER/Case:1"], {}, "is not a repository path"),
    ("image-space", [*DRY, "--sim", "--nodes", "1", "--image", "a b"], {}, "is not an image reference"),
    ("image-newline", [*DRY, "--sim", "--nodes", "1", "--image", "a\nRUN x"], {}, "is not an image reference"),
    ("image-markup", [*DRY, "--sim", "--nodes", "1", "--image", "[red]x[/red]"], {}, "--image: [red]x[/red]: registry '[red]x['"),
    ("image-option", [*DRY, "--sim", "--nodes", "1", "--image", "--privileged"], {}, "'--privileged' is not an image reference"),
    ("image-real-run", [*RUN, "--sim", "--nodes", "1", "--image", "Bad//Ref:x"], {}, "--image: Bad//Ref:x: '/Ref' is not a repository path"),
    ("serve-image", ["serve", "{tmp}", "--image", "Bad//Ref:x", "--dry-run"], {}, "--image: Bad//Ref:x: '/Ref' is not a repository path"),
    ("data-image", ["data", "prepare", "gsm8k", "--image", "foo@sha256:abc", "--out", "{tmp}/o", "--dry-run"], {},
     "--image: foo@sha256:abc: 'sha256:abc': not a digest"),
    ("inspect-image", ["inspect", "Bad//Ref:x"], {}, "IMAGE: Bad//Ref:x"),
    ("diff-image", ["diff", "foo@sha256:abc", "x"], {}, "IMAGE_A: foo@sha256:abc"),
    ("pull-image", ["pull", ":x:"], {}, ":x:: '' is not a valid tag"),
    ("push-image", ["push", "Bad//Ref:x"], {}, "Bad//Ref:x"),
    ("missing-image-hint", [*RUN, "--sim", "--nodes", "1", "--image", "localhost/rlbox/nothing:here", "--no-doctor"], {},
     "pull it with `docker pull localhost/rlbox/nothing:here`"),
    # -- markup and emoji in user text are printed as they are ----------------------------------
    ("name-markup", [*DRY[:1], "--name", "[bold]x[/]", "--sim", "--nodes", "1", "--dry-run"], {}, "--name '[bold]x[/]'"),
    ("name-emoji", [*DRY[:1], "--name", ":thumbs_up:", "--sim", "--nodes", "1", "--dry-run"], {}, "--name ':thumbs_up:'"),
    ("env-markup", [*DRY, "--sim", "--nodes", "1", "--env", "[red]x"], {}, "--env '[red]x': expected KEY=VALUE"),
    ("mount-emoji", [*DRY, "--sim", "--nodes", "1", "--mount", ":x:"], {}, "':x:' is not SRC[:DST][:ro]"),
    ("param-markup", [*DRY, "--sim", "--nodes", "1", "--param", "[b]"], {}, "--param and --set go with --recipe"),
    ("recipe-emoji", [*DRY[:1], "--recipe", ":x:", "--sim", "--nodes", "1", "--dry-run"], {}, ":x:"),
    # -- usage errors: one line, same form --------------------------------------------------------
    ("usage-unknown-option", ["run", "--bogus"], {}, "No such option '--bogus'"),
    ("usage-not-int", ["run", "--nodes", "x"], {}, "'x' is not a whole number"),
    ("usage-bad-choice", ["run", "--hardware", "a9"], {}, "'a9' is not one of"),
    ("usage-missing-value", ["run", "--name"], {}, "Option '--name' requires an argument"),
    ("usage-unknown-command", ["rnu"], {}, "No such command 'rnu'"),
    ("usage-missing-argument", ["merge"], {}, "Missing argument"),
    ("usage-cluster-missing", ["run", "--cluster", "/nonexistent/c.yaml"], {}, "does not exist"),
    # -- numbers bounded before anything starts --------------------------------------------------
    ("nodes-zero", [*DRY, "--sim", "--nodes", "0"], {}, "0 is not in the range"),
    ("nodes-huge", [*DRY, "--sim", "--nodes", "100000"], {}, "100000 is not in the range"),
    ("nodes-past-subnet", [*DRY, "--sim", "--nodes", "254"], {}, "a simulation has 1..253 nodes"),
    ("nodes-negative", [*DRY, "--sim", "--nodes", "-3"], {}, "-3 is not in the range"),
    ("timeout-negative", [*DRY, "--sim", "--nodes", "1", "--timeout", "-5"], {}, "-5.0 is not in the range"),
    ("timeout-zero", [*DRY, "--sim", "--nodes", "1", "--timeout", "0"], {}, "0.0 is not in the range"),
    ("timeout-nan", [*DRY, "--sim", "--nodes", "1", "--timeout", "nan"], {}, "--timeout"),
    ("cpus-negative", [*DRY, "--sim", "--nodes", "1", "--num-cpus", "-1"], {}, "-1 is not in the range"),
    ("nofile-zero", [*DRY, "--sim", "--nodes", "1", "--nofile", "0"], {}, "0 is not in the range"),
    ("nofile-huge", [*DRY, "--sim", "--nodes", "1", "--nofile", "99999999"], {}, "99999999 is not in the range"),
    ("devices-zero", [*DRY, "--sim", "--nodes", "1", "--devices", "0"], {}, "a count is 1..32"),
    ("devices-negative", [*DRY, "--sim", "--nodes", "1", "--devices", "-1"], {}, "give a count (8) or NPU ids"),
    ("devices-past", [*DRY, "--sim", "--nodes", "1", "--devices", "0-40"], {}, "within 0..31"),
    ("devices-reversed", [*DRY, "--sim", "--nodes", "1", "--devices", "7-0"], {}, "'7-0' is not a range"),
    ("devices-twice", [*DRY, "--sim", "--nodes", "1", "--devices", "0,0"], {}, "NPU 0 is named twice"),
    ("devices-word", [*DRY, "--sim", "--nodes", "1", "--devices", "all"], {}, "give a count (8) or NPU ids"),
    ("devices-injection", [*DRY, "--sim", "--nodes", "1", "--devices", "1;touch {marker}"], {}, "give a count"),
    # -- records and results a crash or a hand left broken ---------------------------------------
    ("serve-record-corrupt", ["serve", "--stop", "--name", "t13-h", "--runs-dir", "{tmp}/runs"],
     {"runs/serve/t13-h.json": '{"host": '}, "not a server record"),
    ("serve-record-host-dash", ["serve", "--stop", "--name", "t13-h", "--runs-dir", "{tmp}/runs"],
     {"runs/serve/t13-h.json": '{"host": "-oProxyCommand=touch {marker}", "ssh_user": "x"}'}, "is not a host name"),
    ("serve-record-list", ["serve", "--stop", "--name", "t13-h", "--runs-dir", "{tmp}/runs"],
     {"runs/serve/t13-h.json": "[1, 2]"}, "not a server record"),
    ("eval-record-corrupt", ["eval", "m", "--name", "t13-h", "--runs-dir", "{tmp}/runs"],
     {"runs/serve/t13-h.json": "\x00\x01"}, "not a server record"),
    ("eval-record-not-utf8", ["eval", "m", "--name", "t13-h", "--runs-dir", "{tmp}/runs"],
     {"runs/serve/t13-h.json": b"\xff"}, "not UTF-8 text"),
    ("eval-compare-no-mean", ["eval", "--compare", "{tmp}/a.json", "{tmp}/a.json"],
     {"a.json": '{"schema": "rlbox.eval/v1", "dataset": "d", "metric": "m", "mode": "gen"}'}, "mean: missing"),
    ("eval-compare-mean-text", ["eval", "--compare", "{tmp}/a.json", "{tmp}/a.json"],
     {"a.json": '{"schema": "rlbox.eval/v1", "dataset": "d", "metric": "m", "mode": "gen", "mean": "[red]1"}'},
     "mean: not a number"),
    ("run-state-corrupt", ["status", "--name", "t13-h", "--runs-dir", "{tmp}/runs"], {"runs/t13-h/state.json": "{"},
     "not valid JSON"),
]

# Manifest strings that reach rendered files (Dockerfile, image.json, labels): a control
# character anywhere is refused before anything is written.
MANIFEST = [
    ("git-url-newline", ("components", "verl", "git"), "https://github.com/volcengine/verl.git\nRUN touch {marker}"),
    ("git-ref-newline", ("components", "verl", "ref"), "v0.5.0\nRUN touch {marker}"),
    ("pip-newline", ("components", "torch", "pip"), "torch==2.7.1\nRUN touch {marker}"),
    ("env-value-newline", ("env", "RLBOX_X"), "1\nRUN touch {marker}"),
    ("env-key-newline", ("env", "X\nRUN touch {marker}"), "1"),
    ("pip-arg-cr", ("components", "verl", "pip_args"), ["--no-deps\rRUN touch {marker}"]),
    ("description-escape", ("description",), "flagship \x1b[31mred"),
    ("image-name-tab", ("image", "name"), "verl\tRUN"),
    ("os-package-newline", ("system_packages", "apt"), ["git\nRUN touch {marker}"]),
    ("component-env-nul", ("components", "verl", "env"), {"A": "b\x00c"}),
]


def _leftovers() -> list[str]:
    client = docker.from_env()
    left = []
    for box in client.containers.list(all=True, ignore_removed=True, filters={"label": "io.rlbox.managed=true"}):
        owner = box.labels.get("io.rlbox.run") or box.labels.get("io.rlbox.claim") or ""
        if owner.startswith("t13-h"):
            left.append(box.name)
    left += [n.name for n in client.networks.list() if n.name.startswith("rlbox-t13-h")]
    return left


def _one_line_error(proc, expect: str, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-500:], proc.stderr[-1500:])
    err = proc.stderr
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err[-1500:]
    assert err.startswith("rlbox: error: "), err
    assert expect in err, err
    for rendered in ("❌", "🔤", "👍", "\x1b["):
        assert rendered not in err, err
    return err


@pytest.mark.engine
@pytest.mark.anywhere  # each refused before anything is made: beside any other test (tests/conftest.py)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_and_leaves_nothing(case, tmp_path, sim_image):
    _, argv, files, expect = case
    marker = tmp_path / "marker"
    for name, body in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body.replace("{marker}", str(marker)))
    args = [a.replace("{tmp}", str(tmp_path)).replace("{marker}", str(marker)) for a in argv]
    proc = rlbox(*args, cwd=REPO)
    _one_line_error(proc, expect.replace("{marker}", str(marker)))
    assert not marker.exists()
    assert _leftovers() == []


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc.setdefault(key, {})
    doc[path[-1]] = value


@pytest.mark.parametrize("case", MANIFEST, ids=[c[0] for c in MANIFEST])
def test_manifest_control_characters_never_reach_a_rendered_file(case, tree):
    _, path, value = case
    marker = tree / "marker"
    value = json.loads(json.dumps(value).replace("{marker}", str(marker)))
    manifest = tree / "images" / "verl_pt27_25rc3.yaml"
    doc = yaml.safe_load(manifest.read_text())
    _set(doc, path, value)
    manifest.write_text(yaml.safe_dump(doc, allow_unicode=False, sort_keys=False))
    before = {p: p.read_bytes() for p in (tree / "dockerfiles").rglob("*") if p.is_file()}
    proc = rlbox("render", cwd=tree)
    err = _one_line_error(proc, "control character U+")
    assert "verl_pt27_25rc3.yaml" in err
    after = {p: p.read_bytes() for p in (tree / "dockerfiles").rglob("*") if p.is_file()}
    assert after == before  # nothing rendered
    assert not any(b"RUN touch" in body for body in after.values())
    assert not marker.exists()


def test_duplicate_key_and_bytes_in_a_manifest(tree):
    manifest = tree / "images" / "verl_pt27_25rc3.yaml"
    text = manifest.read_text()
    manifest.write_text(text + "\npython: '3.11'\n")
    _one_line_error(rlbox("render", cwd=tree), "duplicate key 'python'")
    manifest.write_bytes(text.encode() + b"\n# \xff\xfe\n")
    _one_line_error(rlbox("render", cwd=tree), "not UTF-8 text")


def test_the_corpus_is_large_and_covers_every_class():
    assert len(CASES) + len(MANIFEST) + 1 >= 80
    ids = " ".join(c[0] for c in CASES)
    for cls in ("host-", "yaml-", "hostfile-", "image-", "usage-", "nodes-", "timeout-", "cpus-", "nofile-",
                "devices-", "serve-record", "eval-", "markup", "emoji", "not-utf8", "duplicate", "missing-image-hint"):
        assert cls in ids, cls
