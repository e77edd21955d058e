"""Every input checked at its boundary (issue 21): one table per kind of hostile input, each case
run through the real CLI (a subprocess, as a user would) or the one mechanism that closes it.

Mechanisms under test (see each module's doc):
- rlbox.core.config: load_yaml/load_json (bounded size, depth, YAML alias expansion),
  load_file(path, model) (one line: file, field path, what is expected), field types
  (Commit, Sha256, Digest, Url, Int32), redact_url;
- rlbox.core.names: check/inside (one name rule; paths resolved and kept under their root);
- rlbox.core.quote: one function per target (Dockerfile, shell, pip, buildx, make, Hydra,
  env keys, format strings);
- the typed records: image/lockfile.LockFile, cluster/state.StateRecord, training/serve.ServeRecord,
  training/evaluate.EvalResult, cluster/k8s_profile.K8sProfile; cluster/kuberay.refusal.

Each CLI case asserts one line on stderr (``rlbox: error: ...``), exit 2, no traceback, no marker
file from an injected command, and nothing written outside its root."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, rlbox
from support.kuberay import profile_with

RELEASE = "verl_pt27_25rc3"
LOCK = f"images/lock/{RELEASE}.json"
MANIFEST = f"images/{RELEASE}.yaml"
PROFILE = REPO / "tests" / "fixtures" / "kuberay" / "profile-a3.yaml"
SIM = "rlbox_sim:amd64"


def one_line_error(proc, expect: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-400:], proc.stderr[-1500:])
    err = proc.stderr
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("rlbox: error: "), err[-1500:]
    assert expect in err, err
    return err


# ---------------------------------------------------------------------------------------------
# Files rlbox reads back in a tree: the lock and the manifest, edited by hand or by an attacker.
# (id, file, edit(doc, marker) -> None, argv, what the one line says)


def _lock_variant(doc):
    return next(iter(doc["variants"].values()))


def _lock_git(doc):
    return next(iter(_lock_variant(doc)["git"].values()))


def _lock_pip(doc):
    return next(iter(_lock_variant(doc)["pip"]["packages"].values()))


DEEP = "@deep@"  # replaced by 5,000 nested lists in the written text (json.dumps itself would recurse)


TREE = [
    # -- command execution from a file
    ("lock-commit-option", LOCK, lambda d, m: _lock_git(d).update(commit=f"--upload-pack=touch {m}"),
     ["fetch-sources", f"{RELEASE}:a3-arm"], "is not a full git commit"),
    ("lock-commit-option-render", LOCK, lambda d, m: _lock_git(d).update(commit=f"--upload-pack=touch {m}"),
     ["render"], "commit: '--upload-pack"),
    ("apt-package-shell", MANIFEST, lambda d, m: d.setdefault("system_packages", {}).update(apt=[f"procps;touch {m}"]),
     ["render"], "is not a plain word"),
    ("base-tag-attribute", MANIFEST, lambda d, m: d["base"].update(tag="{cann.__class__.__mro__}"),
     ["render"], "unknown field {cann.__class__.__mro__}"),
    ("base-tag-padding", MANIFEST, lambda d, m: d["base"].update(tag="{cann:>400000000}"),
     ["render"], "takes no format spec"),
    ("base-tag-unknown-field", MANIFEST, lambda d, m: d["base"].update(tag="{cpu}-{os}"),
     ["render"], "unknown field {cpu}"),
    # -- values rendered unquoted
    ("lock-digest-newline", LOCK, lambda d, m: _lock_variant(d)["base"].update(digest="sha256:ab\nRUN touch " + str(m)),
     ["render"], "control character U+000A"),
    ("lock-version-newline", LOCK, lambda d, m: _lock_git(d).update(version="1.0\nRUN touch " + str(m)),
     ["render"], "control character U+000A"),
    ("lock-index-option", LOCK, lambda d, m: _lock_pip(d).update(index="--index-url http://evil.example/simple"),
     ["render"], "URL scheme must be one of"),
    ("lock-why-line", LOCK, lambda d, m: _lock_variant(d)["pip"]["dropped"].append(
        {"requirement": "x", "by": "y", "why": "z\n-e /evil"}), ["render"], "control character U+000A"),
    ("variant-name-shell", MANIFEST, lambda d, m: d["variants"].update({f"x;touch {m}": d["variants"]["a3-arm"]}),
     ["render"], "is not a name"),
    ("env-key-space", MANIFEST, lambda d, m: d.setdefault("env", {}).update({"A B": "1"}),
     ["render"], "is not an environment variable name"),
    # -- paths escaping
    ("variant-key-dotdot", MANIFEST, lambda d, m: d["variants"].update({"../../escape": d["variants"]["a3-arm"]}),
     ["render"], "is not a name"),
    ("lock-file-dotdot", LOCK, lambda d, m: _lock_pip(d).update(file="../../../escape.whl"),
     ["fetch-sources", f"{RELEASE}:a3-arm"], "file: '../../../escape.whl' is not a name"),
    # -- reading or leaking
    ("lock-sha256-empty", LOCK, lambda d, m: _lock_pip(d).update(sha256=""), ["render"], "is not a sha256"),
    ("lock-url-credentials", LOCK, lambda d, m: _lock_pip(d).update(url="ftp://alice:s3cret@example.com/x.whl"),
     ["render"], "ftp://***@example.com/x.whl"),
    # -- tracebacks on nested or mistyped files
    ("lock-deep", LOCK, lambda d, m: _lock_variant(d).update(pip=DEEP), ["render"], "nested deeper than 64"),
    ("lock-mistyped", LOCK, lambda d, m: _lock_variant(d)["pip"]["packages"].update(x=5),
     ["render"], "pip.packages.x: Input should be a valid dictionary"),
    ("lock-size-string", LOCK, lambda d, m: _lock_pip(d).update(size="big"), ["render"], "pip.packages."),
    ("lock-not-object", LOCK, lambda d, m: d.update(variants=[1]),
     ["render"], "variants: Input should be a valid dictionary"),
]


@pytest.mark.parametrize("case", TREE, ids=[c[0] for c in TREE])
def test_a_hostile_file_in_the_tree_is_one_line(case, tree):
    _, rel, edit, argv, expect = case
    marker = tree / "marker"
    path = tree / rel
    if rel.endswith(".json"):
        doc = json.loads(path.read_text())
        edit(doc, marker)
        path.write_text(json.dumps(doc).replace(f'"{DEEP}"', "[" * 5000 + "]" * 5000))
    else:
        doc = yaml.safe_load(path.read_text())
        edit(doc, marker)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = {p: p.read_bytes() for p in (tree / "dockerfiles").rglob("*") if p.is_file()}
    err = one_line_error(rlbox(*argv, cwd=tree), expect)
    assert "s3cret" not in err
    assert not marker.exists()
    assert {p: p.read_bytes() for p in (tree / "dockerfiles").rglob("*") if p.is_file()} == before
    assert not (tree / "escape").exists() and not (tree.parent / "escape.whl").exists()
    assert not (tree / ".rlbox-sources").exists()  # refused before anything was fetched


def test_billion_laughs_in_a_manifest_stops_fast(tree):
    laughs = "lol0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"lol{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
    path = tree / MANIFEST
    path.write_text(path.read_text() + "\nx-laughs:\n" + "".join("  " + line for line in laughs.splitlines(True)))
    one_line_error(rlbox("render", cwd=tree), "aliases (*name) are expanded")


# ---------------------------------------------------------------------------------------------
# Records under the runs dir and names from the command line.
# (id, argv, files {path under tmp: text}, what the one line says)

STATE = {"run": "bd-r", "run_id": "abc", "phase": "finished", "image": "x", "ports": {"dashboard": 8265},
         "nodes": [{"index": 0, "role": "head", "host": "localhost", "transport": "local", "npus": 1,
                    "container": "rlbox-bd-r-node0"}]}


def _state(**changes) -> str:
    return json.dumps({**STATE, **changes})


RUNS = [
    # -- names are names, paths stay inside
    ("stop-dotdot", ["stop", "--name", "../victim", "--runs-dir", "{tmp}/runs"],
     {"victim/state.json": _state(run="victim")}, "--name '../victim': not a name"),
    ("status-dotdot", ["status", "--name", "../victim", "--runs-dir", "{tmp}/runs"], {}, "not a name"),
    ("logs-dotdot", ["logs", "--name", "../victim", "--runs-dir", "{tmp}/runs"], {}, "not a name"),
    ("triage-dotdot", ["triage", "../victim", "--runs-dir", "{tmp}/runs"],
     {"victim/state.json": _state(run="victim")}, "run name '../victim': not a name"),
    ("metrics-dotdot", ["metrics", "../victim", "--runs-dir", "{tmp}/runs"], {}, "not a name"),
    ("serve-dotdot", ["serve", "--stop", "--name", "../../x", "--runs-dir", "{tmp}/runs"], {}, "not a name"),
    ("eval-name-dotdot", ["eval", "m", "--name", "../x", "--runs-dir", "{tmp}/runs"], {}, "not a name"),
    ("run-name-trailing-dash", ["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--name", "bd-"], {},
     "not a name"),
    ("run-name-upper", ["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--name", "BD"], {}, "not a name"),
    ("k8s-name-trailing-dash", ["k8s", "export", "--k8s-profile", str(PROFILE), "-o", "{tmp}/out.yaml", "--smoke-test",
                                "--nodes", "1", "--name", "bd-"], {}, "not a name"),
    # -- reading or leaking: a record naming another file
    ("logs-log-outside", ["logs", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(log="/etc/passwd")}, "is not inside the run's folder"),
    ("logs-log-dotdot", ["logs", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(log="../secret.log"), "secret.log": "secret"}, "is not inside the run's folder"),
    ("triage-log-outside", ["triage", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(log="/etc/shadow", phase="removed")}, "is not inside the run's folder"),
    ("state-other-run", ["status", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(run="victim")}, "is not this run's name"),
    # -- tracebacks on nested or mistyped records
    ("state-deep", ["status", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": "[" * 100_000 + "]" * 100_000}, "nested deeper than 64"),
    ("state-nodes-number", ["status", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(nodes=5)}, "nodes: Input should be a valid list"),
    ("state-exit-huge", ["status", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(exit_code=10**30)}, "exit_code: Input should be less than or equal to 2147483647"),
    ("state-port-text", ["stop", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(ports={"dashboard": "x"})}, "ports.dashboard"),
    ("state-ssh-user-dash", ["stop", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(nodes=[{**STATE["nodes"][0], "ssh_user": "-oProxyCommand=touch {marker}",
                                        "transport": "ssh"}])}, "nodes.0.ssh_user"),
    ("state-network-dotdot", ["stop", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"bd-r/state.json": _state(network={"name": "../x"})}, "network.name"),
    ("serve-record-deep", ["serve", "--stop", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"serve/bd-r.json": '{"host": ' * 200 + "1" + "}" * 200}, "nested deeper than 64"),
    ("serve-record-port", ["eval", "m", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"serve/bd-r.json": '{"host": "localhost", "url": "http://localhost:1", "max_model_len": 1e400}'},
     "max_model_len"),
    ("serve-record-url-scheme", ["eval", "m", "--name", "bd-r", "--runs-dir", "{tmp}/runs"],
     {"serve/bd-r.json": '{"host": "localhost", "url": "gopher://u:s3cret@h:1"}'}, "gopher://***@h:1"),
    ("eval-result-deep", ["eval", "--compare", "{tmp}/runs/a.json", "{tmp}/runs/a.json"],
     {"a.json": '{"a":' * 5000 + "1" + "}" * 5000}, "nested deeper than 64"),
    ("eval-result-mean-text", ["eval", "--compare", "{tmp}/runs/a.json", "{tmp}/runs/a.json"],
     {"a.json": '{"schema": "rlbox.eval/v1", "dataset": "d", "metric": "m", "mode": "gen", "mean": "1"}'},
     "mean: not a number"),
    ("eval-result-mean-inf", ["eval", "--compare", "{tmp}/runs/a.json", "{tmp}/runs/a.json"],
     {"a.json": '{"schema": "rlbox.eval/v1", "dataset": "d", "metric": "m", "mode": "gen", "mean": Infinity}'},
     "mean: Input should be a finite number"),
    # -- --recipe: a shipped name or a file with a recipe's schema, never any YAML
    ("recipe-any-yaml", ["run", "--dry-run", "--sim", "--nodes", "1", "--name", "bd-r", "--recipe", "{tmp}/runs/x.yaml"],
     {"x.yaml": "hosts: [a]\n"}, "unknown key"),
    ("recipe-dotdot-name", ["run", "--dry-run", "--sim", "--nodes", "1", "--name", "bd-r", "--recipe", "..%2fx"], {},
     "unknown recipe"),
    # -- a value smuggling an attribute into a buildx option
    ("push-by-digest-comma", ["build", SIM, "--push-by-digest", "localhost:5000/x,registry.insecure=true", "--dry-run"],
     {}, "--push-by-digest: localhost:5000/x,registry.insecure=true: 'x,registry.insecure=true' is not a repository path"),
    # -- accepted nonsense
    ("devices-fullwidth", ["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--name", "bd-r",
                           "--devices", "３"], {}, "give a count"),
    ("devices-arabic-indic", ["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--name", "bd-r",
                              "--devices", "٠-٣"], {}, "give a count"),
    ("image-tag-accent", ["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--name", "bd-r",
                          "--image", "foo:tág"], {}, "is not a valid tag"),
    ("hosts-port-22-twice", ["run", "--dry-run", "--hosts", "h1,h1:22", "--smoke-test", "--name", "bd-r",
                             "--image", SIM], {}, "listed twice"),
    ("hosts-case-twice", ["run", "--dry-run", "--hosts", "node1,NODE1", "--smoke-test", "--name", "bd-r",
                          "--image", SIM], {}, "listed twice"),
    ("hosts-port-fullwidth", ["run", "--dry-run", "--hosts", "h1:２２", "--smoke-test", "--name", "bd-r",
                              "--image", SIM], {}, "is not HOST"),
    ("cluster-ssh-user-dash", ["run", "--dry-run", "--cluster", "{tmp}/runs/c.yaml", "--smoke-test", "--name", "bd-r",
                               "--image", SIM], {"c.yaml": "ssh: {user: '-oProxyCommand=touch {marker}'}\nhosts: [{host: h1}]\n"},
     "is not an ssh user"),
    ("cluster-host-ssh-user-dash", ["run", "--dry-run", "--cluster", "{tmp}/runs/c.yaml", "--smoke-test", "--name",
                                    "bd-r", "--image", SIM],
     {"c.yaml": "hosts: [{host: h1, ssh: {user: '-lroot'}}]\n"}, "is not an ssh user"),
    ("cluster-identity-dir", ["run", "--dry-run", "--cluster", "{tmp}/runs/c.yaml", "--smoke-test", "--name", "bd-r",
                              "--image", SIM], {"c.yaml": "ssh: {identity_file: /etc}\nhosts: [{host: h1}]\n"},
     "is not a regular file"),
    # -- exhaustion
    ("cluster-billion-laughs", ["run", "--dry-run", "--cluster", "{tmp}/runs/c.yaml", "--smoke-test", "--name", "bd-r",
                                "--image", SIM],
     {"c.yaml": "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
         f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)) + "hosts: [{host: h1}]\n"},
     "aliases (*name) are expanded"),
]


@pytest.mark.parametrize("case", RUNS, ids=[c[0] for c in RUNS])
def test_a_hostile_name_or_record_is_one_line(case, tmp_path):
    _, argv, files, expect = case
    marker = tmp_path / "marker"
    runs = tmp_path / "runs"
    runs.mkdir()
    for name, body in files.items():
        path = runs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body.replace("{marker}", str(marker)))
    before = sorted(p for p in tmp_path.rglob("*"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    err = one_line_error(rlbox(*args, cwd=tmp_path, env={"RLBOX_ROOT": str(REPO)}), expect)
    assert "s3cret" not in err
    assert not marker.exists()
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written, inside or outside
    assert not (tmp_path.parent / "x.json").exists() and not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------------------------------------
# Kubernetes: what the API server would refuse is refused at export; never more access than asked.




K8S = [
    ("volume-name-dots", {"volumes": [{"name": "my.data", "path": "/data", "pvc": "shared-data"}]}, [],
     "is not a Kubernetes name"),
    ("volume-name-long", {"volumes": [{"name": "v" * 60, "path": "/data", "pvc": "shared-data"}]}, [],
     "at most 59 characters"),
    ("volume-on-dev-shm", {"volumes": [{"name": "shm", "path": "/dev/shm", "pvc": "shared-data"}]}, [],
     "mountPath /dev/shm twice"),
    ("env-key-space", {}, ["--env", "A B=1"], "is not an environment variable name"),
    ("env-key-digit", {}, ["--env", "1A=x"], "is not an environment variable name"),
    ("backoff-over-int32", {}, ["--max-restarts", str(2**31)], "'--max-restarts': 2147483648 is not in the range"),
    ("profile-billion-laughs", "laughs", [], "aliases (*name) are expanded"),
    ("profile-deep", "deep", [], "nested deeper than 64"),
]


@pytest.mark.parametrize("case", K8S, ids=[c[0] for c in K8S])
def test_k8s_export_refuses_what_kubernetes_would(case, tmp_path):
    _, changes, extra, expect = case
    if changes == "laughs":
        profile = tmp_path / "profile.yaml"
        profile.write_text(PROFILE.read_text() + "x0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)))
    elif changes == "deep":
        profile = tmp_path / "profile.yaml"
        profile.write_text(PROFILE.read_text() + "x: " + "[" * 20000 + "]" * 20000 + "\n")
    else:
        profile = profile_with(tmp_path, **changes)
    out = tmp_path / "out.yaml"
    proc = rlbox("k8s", "export", "--k8s-profile", str(profile), "-o", str(out), "--smoke-test", "--nodes", "2",
                 "--image", "swr.example.com/rl/verl:a3", "--hardware", "a3", "--name", "bd-k", *extra)
    one_line_error(proc, expect)
    assert not out.exists()


def test_k8s_export_read_only_mount_on_a_read_write_volume_is_read_only(tmp_path):
    out = tmp_path / "out.yaml"
    rlbox("k8s", "export", "--k8s-profile", str(PROFILE), "-o", str(out), "--smoke-test", "--nodes", "2",
          "--image", "swr.example.com/rl/verl:a3", "--hardware", "a3", "--name", "bd-k", "--mount", "/data:/data:ro",
          check=True)
    doc = yaml.safe_load(out.read_text())
    pods = [doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"],
            *(g["template"] for g in doc["spec"]["rayClusterSpec"]["workerGroupSpecs"])]
    for pod in pods:
        data = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/data"]
        assert data == [{"name": "vol-data", "mountPath": "/data", "readOnly": True}]


def test_kubernetes_refusal_is_checked_on_the_manifest():
    from rlbox.cluster.kuberay import refusal

    pod = {"containers": [{"name": "c", "env": [{"name": "OK", "value": "1"}],
                           "volumeMounts": [{"name": "a", "mountPath": "/a"}]}], "volumes": [{"name": "a"}]}
    good = {"metadata": {"name": "rlbox-x", "namespace": "rl", "labels": {"io.rlbox.run": "x"}},
            "spec": {"backoffLimit": 3, "template": pod}}
    assert refusal(good) is None
    cases = [
        (("metadata", "name"), "rlbox-x-", "metadata.name"),
        (("metadata", "labels"), {"io.rlbox.run": "x" * 64}, "not a label value"),
        (("spec", "backoffLimit"), 2**31, "int32"),
        (("spec", "backoffLimit"), -1, "int32"),
    ]
    for (a, b), value, expect in cases:
        bad = json.loads(json.dumps(good))
        bad[a][b] = value
        assert expect in (refusal(bad) or ""), (a, b, value)
    for mutate, expect in [
        (lambda p: p["volumes"].append({"name": "a.b"}), "not a DNS-1123 label"),
        (lambda p: p["containers"][0]["env"].append({"name": "A B"}), "not an environment variable name"),
        (lambda p: p["containers"][0]["volumeMounts"].append({"name": "a", "mountPath": "/a/"}), "mountPath /a twice"),
    ]:
        bad = json.loads(json.dumps(good))
        mutate(bad["spec"]["template"])
        assert expect in (refusal(bad) or ""), expect


# ---------------------------------------------------------------------------------------------
# The mechanisms as pure functions.


def test_bounded_loaders():
    from rlbox.core.config import load_json, load_yaml
    from rlbox.core.errors import RlboxError

    laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))
    for text, expect in [(laughs, "expanded"), ("[" * 50_000, "nested deeper"), ("a: " + "{b: " * 70 + "1" + "}" * 70, "nested deeper"),
                         ("a: &x [*x]\n", "refers to itself"), ("x" * (2 << 20), "over the")]:
        with pytest.raises(RlboxError, match=expect):
            load_yaml(text, "f.yaml")
    assert load_yaml("a: &x [1, 2]\nb: *x\n", "f.yaml") == {"a": [1, 2], "b": [1, 2]}  # aliases still work
    assert load_yaml("a: '[[[['\n", "f.yaml") == {"a": "[[[["}
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 65 + "1" + "}" * 65):
        with pytest.raises(RlboxError, match="nested deeper"):
            load_json(text, "f.json")


def test_names_and_confinement(tmp_path):
    from rlbox.core import names
    from rlbox.core.errors import RlboxError

    for good in ("verl", "bd-1", "a" * 41):
        assert names.check(good, "--name") == good
    for bad in ("", "-x", "x-", "X", "a/b", "..", "a" * 42, "a b", "a\nb", "ａ", "a_b", 5):
        with pytest.raises(RlboxError, match="not a name"):
            names.check(bad, "--name")
    assert names.valid("verl_pt27_25rc3", "file") and not names.valid("../x", "file") and not names.valid(".x", "file")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert names.inside(tmp_path / "root", "a", "b") == (tmp_path / "root" / "a" / "b").resolve()
    for bad in ("../x", "/etc/passwd", "link/x", "a/../../x"):
        with pytest.raises(RlboxError, match="leads outside"):
            names.inside(tmp_path / "root", bad)


def test_quote_per_target():
    import shlex

    from rlbox.core import quote

    assert shlex.split(quote.dockerfile_shell("a b;c")) == ["a b;c"]
    for bad_call in (lambda: quote.dockerfile_shell("a\nRUN x"), lambda: quote.shell("a\rb"),
                     lambda: quote.word("procps;touch x"), lambda: quote.word("-x"), lambda: quote.env_key("1A"),
                     lambda: quote.env_key("A B"), lambda: quote.requirement_part("--index-url"),
                     lambda: quote.requirement_part("-e"), lambda: quote.requirement_part("a b"),
                     lambda: quote.buildx_value("repo,registry.insecure=true"), lambda: quote.buildx_value("a=b"),
                     lambda: quote.make_value("x;touch y"), lambda: quote.make_value("$(shell id)"),
                     lambda: quote.format_fields("{cann.__class__}", ("cann",), "tag"),
                     lambda: quote.format_fields("{cann[0]}", ("cann",), "tag"),
                     lambda: quote.format_fields("{cann!r}", ("cann",), "tag"),
                     lambda: quote.format_fields("{cann:>99999999}", ("cann",), "tag"),
                     lambda: quote.format_fields("{x", ("cann",), "tag")):
        with pytest.raises(ValueError):
            bad_call()
    assert quote.format_fields("{cann}-{chip}", ("cann", "chip"), "tag") == "{cann}-{chip}"
    assert quote.make_value("verl_pt27_25rc3:a3-arm") == "verl_pt27_25rc3:a3-arm"
    assert quote.dockerfile_json(["a", 'b"c']) == '["a", "b\\"c"]'


HYDRA = ["/data/qwen,v2", "[/a,/b]", "{a: 1}", "it's", "a b", "f(x)", "x=y", "c:\\dir\\", "'", "a\\'b", "",
         "plain/path.v1", "${oc.env:HOME}/x", "10", "true"]


def test_hydra_values_are_one_string():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlbox.core.quote import hydra_value

    parser = OverridesParser.create()
    for value in HYDRA:
        override = parser.parse_override(f"k.x={hydra_value(value)}")
        assert not override.is_sweep_override(), value
        parsed = override.value()
        if value in ("10", "true") or value.startswith("${"):
            continue  # numbers, bools and interpolations mean what Hydra makes of them
        assert parsed == value, (value, hydra_value(value), parsed)


def test_recipe_param_with_a_comma_is_one_hydra_string():
    from rlbox.cluster import recipes

    rec = next(r for r in recipes.all_recipes() if "model_path" in r.params)
    argv, _ = rec.resolve({"model_path": "/data/qwen,v2"}, [])
    assert any(a.endswith("model.path='/data/qwen,v2'") for a in argv), argv


def test_metrics_keys_are_linear():
    """70,000 keys on one step line: the first-seen order is kept without a scan of the key list
    per key (counted by comparisons, not timed)."""
    from rlbox.training.metrics import Metrics

    compared = [0]

    class Key(str):
        def __eq__(self, other):
            compared[0] += 1
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    n = 70_000
    m = Metrics("x")
    m.add(1, {Key(f"k/{i}"): i for i in range(n)})
    m.add(2, {Key(f"k/{i}"): i for i in range(n)})
    assert len(m.keys) == n
    assert compared[0] < 4 * n  # a list scan per key would be n * n / 2 = 2.45e9


def test_metrics_parses_a_70000_key_line():
    from rlbox.training.metrics import parse

    line = "step:1 - " + " - ".join(f"k/{i}:{i}" for i in range(70_000))
    assert len(parse(line).keys) == 70_000


def test_nearest_key_for_a_misspelt_top_level_segment():
    from rlbox.verl.validate import _suggest  # noqa: PLC2701 - the judgement itself

    known = {"algorithm": None, "algorithm.adv_estimator": "grpo", "algorithm.kl_ctrl": None,
             "algorithm.kl_ctrl.type": "fixed", "trainer": None, "trainer.nnodes": 1, "data": None}
    assert _suggest("alogorithm.filter_groups.enable", known) == "; did you mean algorithm?"
    assert _suggest("alogorithm.kl_ctrl.type", known) == "; did you mean algorithm.kl_ctrl.type?"
    assert _suggest("trainer.nnode", known) == "; did you mean trainer.nnodes?"


def test_git_never_reads_a_commit_as_an_option(tmp_path):
    from rlbox.core.errors import RlboxError
    from rlbox.image import sources

    marker = tmp_path / "marker"
    with pytest.raises(RlboxError, match="not a full git commit"):
        sources.git_dir(tmp_path, "verl", f"--upload-pack=touch {marker}")
    with pytest.raises(RlboxError, match="not 64 hex digits"):
        sources.download("https://example.invalid/x", "", tmp_path / "x")
    with pytest.raises(RlboxError, match="not a name"):
        sources.git_dir(tmp_path, "..", "0" * 40)
    assert not marker.exists() and not (tmp_path / "x").exists()


def test_redacted_urls():
    from rlbox.core.config import redact_url

    assert redact_url("https://u:p@h.example:8443/x?y") == "https://***@h.example:8443/x?y"
    assert redact_url("https://h.example/x") == "https://h.example/x"


# ---------------------------------------------------------------------------------------------
# Cleanup touches only what carries the run's labels.


@pytest.mark.engine
def test_stop_removes_only_the_runs_own_network(engine, client, tmp_path):
    """A record naming any other network than the run's own is refused when read; the run's own
    name is removed only while it carries the run's label."""
    run, own = "bd-netr", "rlbox-bd-netr"
    made = []
    try:
        for name, labels in (("bd-victim-net", {"io.rlbox.run": "someone-else"}), (own, {"io.rlbox.run": "someone-else"})):
            for net in client.networks.list(names=[name]):
                if net.name == name:
                    net.remove()
            made.append(client.networks.create(name, labels=labels))
        runs = tmp_path / "runs"
        (runs / run).mkdir(parents=True)
        record = runs / run / "state.json"
        record.write_text(_state(run=run, network={"name": "bd-victim-net"}))
        one_line_error(rlbox("stop", "--name", run, "--runs-dir", str(runs)), "network.name: 'bd-victim-net' is not this run's network")
        # the run's own name, made by someone else (another label): left alone
        record.write_text(_state(run=run, network={"name": own}))
        proc = rlbox("stop", "--name", run, "--runs-dir", str(runs))
        assert proc.returncode == 0, proc.stderr
        assert {n.name for n in client.networks.list(names=["bd-victim-net", own])} >= {"bd-victim-net", own}
        # the run's own network with the run's label: that one goes
        made.pop().remove()
        client.networks.create(own, labels={"io.rlbox.run": run})
        record.write_text(_state(run=run, network={"name": own}))
        proc = rlbox("stop", "--name", run, "--runs-dir", str(runs))
        assert proc.returncode == 0, proc.stderr
        assert [n for n in client.networks.list(names=[own]) if n.name == own] == []
    finally:
        for net in made:
            net.remove()


def test_recipe_is_a_shipped_name_or_a_file_with_a_recipes_schema(tmp_path):
    from rlbox.cluster import recipes
    from rlbox.core.errors import RlboxError

    name = recipes.names_available()[0]
    own = tmp_path / f"{name}.yaml"
    own.write_text((recipes.RECIPES_DIR / f"{name}.yaml").read_text())
    assert recipes.load(str(own)) == recipes.load(name)  # a file of one's own, by path
    (tmp_path / "any.yaml").write_text("hosts: [a]\n")
    for bad, expect in [(str(tmp_path / "any.yaml"), "unknown key"), ("/etc/hostname", "Input should be"), ("../recipes/x", "no such file"),
                        ("/etc/passwd", "(top level): Input should be a valid dictionary"), ("..", "unknown recipe"), ("a b", "unknown recipe")]:
        with pytest.raises(RlboxError, match=re.escape(expect)) as err:
            recipes.load(bad)
        assert "root:" not in str(err.value)  # a file's text is never echoed


def test_a_real_plans_record_reads_back(tmp_path):
    """What `rlbox run` writes, state.json reads: the schema refuses nothing a real plan holds."""
    from rlbox.cluster import state
    from rlbox.cluster.launch import RunRequest, prepare

    req = RunRequest(sim=True, nodes=2, hardware="a3", name="bd-plan", smoke_test=True, runs_dir=tmp_path / "runs",
                     dry_run=True)
    plan, _ = prepare(req)
    record = state.RunState(plan.as_dict(), state.Phase.RUNNING, 1.5, str(tmp_path / "runs" / "bd-plan" / "x.log"),
                            "rlbox-bd-plan-abc-r1", "RUNNING", -9, None, ({"attempt": 1, "of": 2, "cause": "x"},))
    record.save(state.state_path(tmp_path / "runs", "bd-plan"))
    back = state.load(tmp_path / "runs", "bd-plan")
    assert back.as_dict() == json.loads(json.dumps(record.as_dict()))
