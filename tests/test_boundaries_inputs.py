"""Inputs held to their grammar at the boundary (issue 27, the input half): one table per kind,
each hostile case a one-line ``rlbox: error:`` naming the field or option (exit 2, no traceback),
each table with the accepted neighbours that must still pass.

Kinds: image references (one grammar, rlbox.registry.reference, for options and every file that
holds one), manifest fields (image/schema.py), lock fields (image/lockfile.py), Kubernetes labels
and k8s-bound options (cluster/k8s_profile.py), path-like options (core/names.py), integer
options (cli/common.py's INT/IntRange), Hydra/--param values (core/quote.hydra_value).

The CLI runs in this process (rlbox.cli.main.main with sys.argv, as `rlbox` runs it): the same
code path as a subprocess, minus an interpreter start per case. tests/test_boundaries.py keeps
the subprocess cases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import pytest
import yaml

from conftest import REPO
from support.kuberay import PROFILE, profile_with

RELEASE = "verl_pt27_25rc3"
LOCK = f"images/lock/{RELEASE}.json"
MANIFEST = f"images/{RELEASE}.yaml"
HEX64 = "0123456789abcdef" * 4


@pytest.fixture
def cli(monkeypatch, capsys):
    """``cli(*argv, cwd=..., env=...)`` -> (exit code, stdout, stderr) of `rlbox ARGV`."""
    from rlbox.cli.main import main

    def run(*argv, cwd: Path = REPO, env: dict[str, str] | None = None):
        monkeypatch.chdir(cwd)
        monkeypatch.delenv("RLBOX_ROOT", raising=False)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", ["rlbox", *map(str, argv)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def refused(result, *expect: str) -> str:
    """One line ``rlbox: error: ...`` on stderr, exit 2, no traceback, every ``expect`` in it."""
    code, out, err = result
    assert code == 2, (code, out[-400:], err[-1500:])
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("rlbox: error: "), err[-1500:]
    for text in expect:
        assert text in err, (text, err)
    return err


# ---------------------------------------------------------------------------------------------
# Image references: the distribution spec's grammar, once.

GOOD_REFERENCES = [
    "quay.io/ascend/cann:8.2.rc1-a3-ubuntu22.04-py3.11",
    f"localhost:5000/a/b@sha256:{HEX64}",
    "ubuntu", "ubuntu:22.04", "library/ubuntu:22.04", "[::1]:5000/x:y", "127.0.0.1:5000/rlbox/sim:amd64",
    "swr.cn-south-1.myhuaweicloud.com/ascendhub/verl:a3", "a__b/c---d.e_f", f"x:t@sha512:{HEX64 * 2}",
    "Registry/x", "localhost/rlbox/sim:amd64", "verl_pt27_25rc3:a3-arm", "h:65535/x", "a" * 240 + ".io/x",
]

BAD_REFERENCES = [  # (reference, what the one line says)
    (f"x@sha256:{HEX64[:-1]}", "sha256 takes 64 hex digits, not 63"),
    (f"x@sha256:{HEX64}0", "sha256 takes 64 hex digits, not 65"),
    (f"x@sha256:{HEX64.upper()}", "hex digits are lower-case"),
    (f"x@md5:{HEX64[:32]}", "algorithm 'md5' is not one of"),
    (f"x@sha512:{HEX64}", "sha512 takes 128"),
    ("x@SHA256:" + HEX64, "algorithm 'SHA256'"),
    ("x@sha256:", "not a digest"),
    ("x@sha256:xyz" + HEX64, "not a digest"),
    ("h:99999/x", "port 99999 is not a port"),
    ("h:0/x", "port 0 is not a port"),
    ("h:５０００/x", "expected a registry HOST[:PORT]"),
    ("a.io/" + "b" * 251, "a registry takes at most 255"),
    ("-x", "is not an image reference"),
    ("--base-image=x", "is not an image reference"),
    ("x:-tag", "is not a valid tag"),
    ("x:.tag", "is not a valid tag"),
    ("x:tág", "is not a valid tag"),
    ("x:" + "t" * 129, "is not a valid tag"),
    ("x:", "is not a valid tag"),
    ("UPPER", "is not a repository path"),
    ("a//b", "is not a repository path"),
    ("a/b:c:d", "is not a repository path"),
    ("x_/y", "is not a repository path"),
    ("x y", "is not an image reference"),
    ("x\n", "is not an image reference"),
    ("", "is not an image reference"),
]


@pytest.mark.parametrize("text", GOOD_REFERENCES)
def test_real_references_parse(text):
    from rlbox.registry.reference import Reference

    ref = Reference.parse(text)
    assert str(ref) == text


@pytest.mark.parametrize("text,expect", BAD_REFERENCES, ids=[repr(b[0])[:40] for b in BAD_REFERENCES])
def test_bad_references_are_one_line(text, expect):
    from rlbox.core.errors import RlboxError
    from rlbox.registry.reference import Reference

    with pytest.raises(RlboxError) as err:
        Reference.parse(text)
    assert expect in str(err.value) and "\n" not in str(err.value)


STATE = {"run": "bd-r", "run_id": "abc", "phase": "finished", "image": "x", "ports": {"dashboard": 8265},
         "nodes": [{"index": 0, "role": "head", "host": "localhost", "transport": "local", "npus": 1,
                    "container": "rlbox-bd-r-node0"}]}

REFERENCE_OPTIONS = [  # (argv, files under the runs dir, what the one line names)
    (["build", f"{RELEASE}:a3-arm", "--base-image", "-x", "--dry-run"], {}, ["--base-image: '-x'"]),
    (["build", f"{RELEASE}:a3-arm", "--base-image", f"quay.io/ascend/cann@sha256:{HEX64[:40]}", "--dry-run"], {},
     ["--base-image:", "sha256 takes 64"]),
    (["build", f"{RELEASE}:a3-arm", "--tag", "--push", "--dry-run"], {}, ["--tag: '--push'"]),
    (["build", f"{RELEASE}:a3-arm", "--tag", "x:a/b", "--dry-run"], {}, ["--tag:"]),
    (["build", f"{RELEASE}:a3-arm", "--tag", "Repo:x", "--dry-run"], {}, ["--tag:"]),
    (["build", f"{RELEASE}:a3-arm", "--tag", "reg:70000/x:y", "--dry-run"], {}, ["--tag:", "port 70000"]),
    (["fetch-sources", f"{RELEASE}:a3-arm", "--base-image", "-oProxyCommand=x"], {}, ["--base-image:"]),
    (["build", f"{RELEASE}:a3-arm", "--tag", f"x@sha256:{HEX64}", "--dry-run"], {}, ["--tag:", "without a digest"]),
    (["build", f"{RELEASE}:a3-arm", "--push-by-digest", "localhost:5000/x:y", "--dry-run"], {},
     ["--push-by-digest:", "without a tag or digest"]),
    (["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--image", "h:65536/x"], {}, ["--image:", "port 65536"]),
    (["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--image", "x@sha384:" + HEX64], {},
     ["--image:", "sha384 takes 96"]),
    (["inspect", f"x@sha256:{HEX64.upper()}"], {}, ["IMAGE:", "lower-case"]),
    (["distribute", "x@sha256:abc", "--hosts", "h1"], {}, ["IMAGE:", "not a digest"]),
    (["images", "tags", "localhost:99999/x"], {}, ["port 99999 is not a port"]),
    (["pull", "--registry", "h:0", "rlbox_sim:amd64"], {}, ["--registry 'h:0'", "port 0"]),
    (["status", "--name", "bd-r", "--runs-dir", "{runs}"], {"bd-r/state.json": {**STATE, "image": "-x"}},
     ["state.json: image:"]),
    (["status", "--name", "bd-r", "--runs-dir", "{runs}"],
     {"bd-r/state.json": {**STATE, "image": f"x@sha256:{HEX64[:40]}"}}, ["state.json: image:", "sha256 takes 64"]),
    (["run", "--dry-run", "--cluster", "{runs}/c.yaml", "--smoke-test"], {"c.yaml": {"image": "-x", "hosts": [{"host": "h1"}]}},
     ["c.yaml: image:"]),
    (["eval", "m", "--name", "bd-r", "--runs-dir", "{runs}"],
     {"serve/bd-r.json": {"host": "localhost", "url": "http://localhost:1", "image": "a b"}}, ["image"]),
]


@pytest.mark.parametrize("case", REFERENCE_OPTIONS, ids=[" ".join(c[0][:5]) for c in REFERENCE_OPTIONS])
def test_reference_options_and_records_are_one_line(case, cli, tmp_path):
    argv, files, expect = case
    runs = tmp_path / "runs"
    for rel, body in files.items():
        (runs / rel).parent.mkdir(parents=True, exist_ok=True)
        (runs / rel).write_text(json.dumps(body))
    refused(cli(*[a.replace("{runs}", str(runs)) for a in argv], env={"RLBOX_ROOT": str(REPO)}), *expect)


URL_OPTIONS = [
    (["build", "rlbox_sim:amd64", "--dry-run", "--pip-index", "-x"], "--pip-index: '-x'"),
    (["build", "rlbox_sim:amd64", "--dry-run", "--apt-mirror", "http://a b/ubuntu"], "--apt-mirror:"),
    (["build", "rlbox_sim:amd64", "--dry-run", "--git-mirror", "--upload-pack=x"], "--git-mirror:"),
    (["build", "rlbox_sim:amd64", "--dry-run", "--hf-endpoint", "gopher://x"], "--hf-endpoint:"),
    (["lock", "rlbox_sim", "--pip-index", "https://u:s3cret@h:99999/simple"], "--pip-index:"),
    (["images", "outdated", "--pip-index", "file"], "--pip-index:"),
    (["eval", "m", "--temperature", "nan"], "'--temperature'"),
    (["eval", "m", "--temperature", "inf"], "'--temperature'"),
]


@pytest.mark.parametrize("argv,expect", URL_OPTIONS, ids=[" ".join(a[:4]) for a, _ in URL_OPTIONS])
def test_url_and_number_options_are_one_line(argv, expect, cli):
    assert "s3cret" not in refused(cli(*argv), expect)


def test_reference_options_accept_real_references(cli):
    code, out, err = cli("build", f"{RELEASE}:a3-arm", "--base-image", "quay.io/ascend/cann:8.2.rc1-a3-ubuntu22.04-py3.11",
                         "--tag", f"localhost:5000/a/b:x", "--dry-run")
    assert code == 0, err
    assert "BASE_IMAGE=quay.io/ascend/cann:8.2.rc1-a3-ubuntu22.04-py3.11" in out and "--tag localhost:5000/a/b:x" in out


# ---------------------------------------------------------------------------------------------
# Files of the tree: manifests and locks, one rule per field kind when read.

def _git(doc):
    return next(c for c in doc["components"].values() if c.get("git"))


def _pip(doc):
    return next(c for c in doc["components"].values() if c.get("pip"))


MANIFEST_FIELDS = [  # (edit(doc), what the one line names)
    (lambda d: d.setdefault("cann", {}).update(env_scripts=["../x;touch y"]), ["cann.env_scripts:", "not an absolute path"]),
    (lambda d: d.setdefault("cann", {}).update(env_scripts=["/usr/local/Ascend/x y.sh"]), ["cann.env_scripts:"]),
    (lambda d: d.setdefault("cann", {}).update(env_scripts="/x.sh"), ["cann.env_scripts: Input should be a valid list"]),
    (lambda d: _pip(d).update(pip_args=["--index-url http://evil"]), [".pip_args:", "is not a pip option"]),
    (lambda d: _pip(d).update(pip_args=["--extra-index-url=http://evil"]), [".pip_args:", "the lock's"]),
    (lambda d: _pip(d).update(pip_args=["-e"]), [".pip_args:"]),
    (lambda d: _pip(d).update(pip_args="--no-deps"), [".pip_args: Input should be a valid list"]),
    (lambda d: _git(d).update(git="https://example.com/a b.git"), [".git:", "no spaces"]),
    (lambda d: _git(d).update(git="-https://example.com/x.git"), [".git:"]),
    (lambda d: _git(d).update(git="ftp://example.com/x.git"), [".git:", "URL scheme must be one of"]),
    (lambda d: _git(d).update(git=5), [".git: Input should be a valid string"]),
    (lambda d: _git(d).update(ref="--upload-pack=x"), [".ref:", "not a git tag or branch"]),
    (lambda d: _git(d).update(subdir="../../x"), [".subdir:", "a path inside the source"]),
    (lambda d: _git(d).update(requirements=["-r /etc/passwd"]), [".requirements:"]),
    (lambda d: _git(d).update(requires=["/etc/passwd"]), [".requires:"]),
    (lambda d: _git(d).update(extras=["a]; x"]), [".extras:"]),
    (lambda d: _pip(d).update(index_url="-i http://x"), [".index_url:"]),
    (lambda d: d.update(python_packages=["-e /x"]), ["python_packages:", "is not a requirement"]),
    (lambda d: d.update(python_packages=["numpy<<2"]), ["python_packages:", "is not a requirement"]),
    (lambda d: d.update(user={"name": "root;x", "uid": 1001}), ["user.name:"]),
    (lambda d: d.update(user={"name": "rlbox", "uid": "x"}), ["user.uid: Input should be a valid integer"]),
    (lambda d: d.update(os="ubuntu 22.04"), ["os:"]),
    (lambda d: d.update(extends=[1]), ["extends: Input should be a valid string"]),
    (lambda d: d.update(env=5), ["env: Input should be a valid dictionary"]),
    (lambda d: d.update(components=[1]), ["components: Input should be a valid dictionary"]),
    (lambda d: d["variants"].update({"a3-arm": 5}), ["variants.a3-arm: Input should be a valid dictionary"]),
    (lambda d: d.update(base={"image": "Quay.io/x:5000000/y", "tag": "x"}), ["base.image:"]),
    (lambda d: d.update(base={"image": "quay.io/ascend/cann:8.2", "tag": "x"}), ["base.image:", "without a tag"]),
    (lambda d: d.update(image={"registry": "evil host", "name": "x"}), ["image.registry:"]),
    (lambda d: d.update(image={"registry": "localhost", "name": "-x"}), ["image.name:"]),
    (lambda d: d["variants"]["a3-arm"].update(tag="-x"), ["variants.a3-arm.tag:"]),
    (lambda d: d.update(base={"image": "quay.io/ascend/cann", "tag": "{cann}:x"}), ["variants.", ": base:"]),
]


def _edit(tree: Path, rel: str, edit) -> None:
    path = tree / rel
    if rel.endswith(".json"):
        doc = json.loads(path.read_text())
        edit(doc)
        path.write_text(json.dumps(doc))
    else:
        doc = yaml.safe_load(path.read_text())
        edit(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.parametrize("case", MANIFEST_FIELDS, ids=[str(i) + "-" + c[1][0][:30] for i, c in enumerate(MANIFEST_FIELDS)])
def test_manifest_fields_are_held_to_their_rule(case, tree, cli):
    edit, expect = case
    _edit(tree, MANIFEST, edit)
    refused(cli("render", "--check", cwd=tree), MANIFEST + ":", *expect)


def _variant(doc):
    return next(iter(doc["variants"].values()))


def _lock_git(doc):
    return next(g for g in _variant(doc)["git"].values() if g.get("standin"))


LOCK_FIELDS = [
    (lambda d: _lock_git(d).update(version="1.0\nRUN touch x"), ["control character U+000A at", ".git.", "version"]),
    (lambda d: _lock_git(d)["standin"].update(sha256=HEX64 + "\n"), ["control character U+000A at", "standin.sha256"]),
    (lambda d: _lock_git(d)["standin"].update(sha256=HEX64.upper()), ["standin.sha256:", "is not a sha256"]),
    (lambda d: _lock_git(d).update(version=5), [".version: Input should be a valid string"]),
    (lambda d: _lock_git(d).update(commit=None), [".commit: Input should be a valid string"]),
    (lambda d: _variant(d)["base"].update(image="Foo//bar"), ["base.image:"]),
    (lambda d: _variant(d)["base"].update(image="-x"), ["base.image:"]),
    (lambda d: _variant(d)["base"].update(digest=f"sha256:{HEX64.upper()}"), ["base.digest:", "lower-case"]),
    (lambda d: _variant(d)["base"].update(digest=f"sha512:{HEX64}"), ["base.digest:", "sha512 takes 128"]),
    (lambda d: _variant(d)["base"].update(digest=f"md5:{HEX64[:32]}"), ["base.digest:", "algorithm 'md5'"]),
    (lambda d: _variant(d)["base"].update(digest=5), ["base.digest: Input should be a valid string"]),
    (lambda d: _variant(d).update(base="x"), ["base: Input should be a valid dictionary"]),
    (lambda d: d.update(release="verl_pt27_cann82rc1"), ["release: 'verl_pt27_cann82rc1' is not 'verl_pt27_25rc3'"]),
]


@pytest.mark.parametrize("command", ["render", "lock"])
@pytest.mark.parametrize("case", LOCK_FIELDS, ids=[str(i) + "-" + c[1][-1][:30] for i, c in enumerate(LOCK_FIELDS)])
def test_lock_fields_are_held_to_their_rule(case, command, tree, cli):
    edit, expect = case
    _edit(tree, LOCK, edit)
    refused(cli(command, "--check", cwd=tree), LOCK + ":", *expect)


def test_the_repos_own_manifests_and_locks_still_load(cli):
    for command in ("render", "lock"):
        code, out, err = cli(command, "--check")
        assert code == 0, err


# ---------------------------------------------------------------------------------------------
# Kubernetes: the label rules for the profile, every k8s-bound option named in its error.

K8S = [  # (profile changes, extra options, what the one line names)
    ({"node_selector": {"a b": "x"}}, [], ["node_selector:", "is not a label key"]),
    ({"node_selector": {"x": "v" * 64}}, [], ["node_selector:", "is not a label value"]),
    ({"node_selector": {"x": "-v"}}, [], ["node_selector:", "is not a label value"]),
    ({"node_selector": {"Example.com/x": "v"}}, [], ["node_selector:", "is not a DNS subdomain"]),
    ({"node_selector": {"example.com/" + "x" * 64: "v"}}, [], ["node_selector:", "is not a label key"]),
    ({"node_selector": {"a" * 254 + "/x": "v"}}, [], ["node_selector:", "is not a DNS subdomain"]),
    ({"node_selector": {"x/": "v"}}, [], ["node_selector:", "is not a label key"]),
    ({"node_selector": {"x": 5}}, [], ["node_selector.x: Input should be a valid string"]),
    ({"tolerations": [{"key": "a b", "operator": "Exists"}]}, [], ["tolerations.0.key:"]),
    ({"tolerations": [{"key": "k", "value": "a/b"}]}, [], ["tolerations.0.value:"]),
    ({"tolerations": [{"key": "k", "effect": "NoScheduleX"}]}, [], ["tolerations.0.effect:"]),
    ({"tolerations": [{"key": "k", "operator": "In"}]}, [], ["tolerations.0.operator:"]),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, [], ["tolerations.0:", "Exists takes no value"]),
    ({"tolerations": [{"operator": "Equal", "value": "v"}]}, [], ["tolerations.0:", "needs operator Exists"]),
    ({}, ["--env", "1A=x"], ["--env: '1A'"]),
    ({}, ["--env", "A B=x"], ["--env: 'A B'"]),
    ({}, ["--env", "Ａ=x"], ["--env:"]),
    ({}, ["--queue", "Bad_Q", "--scheduler", "volcano"], ["--queue 'Bad_Q'"]),
    ({}, ["--queue", "q" * 64, "--scheduler", "volcano"], ["--queue"]),
    ({}, ["--max-restarts", str(2**31)], ["'--max-restarts'"]),
    ({}, ["--deadline", str(2**31)], ["'--deadline'"]),
    ({}, ["--timeout", "nan"], ["'--timeout'"]),
    ({}, ["--nic", "a b"], ["--nic"]),
    ({}, ["--name", "A"], ["--name"]),
    ({}, ["--image", "-x"], ["--image"]),
]

K8S_ACCEPTED = [
    ({"node_selector": {"kubernetes.io/arch": "arm64", "x": "", "a.b_c-d": "A.b_9"}}, []),
    ({"tolerations": [{"operator": "Exists"}, {"key": "huawei.com/Ascend910", "operator": "Equal", "value": "",
                                               "effect": "NoExecute"}]}, []),
    ({}, ["--env", "A.B-c_d=1", "--env", "_X=$(not run)"]),
    ({}, ["--queue", "rl-queue", "--scheduler", "volcano", "--max-restarts", "10000"]),
]


def _export(cli, tmp_path, changes, extra):
    profile = profile_with(tmp_path, **changes) if changes else PROFILE
    out = tmp_path / "out.yaml"
    return cli("k8s", "export", "--k8s-profile", profile, "-o", out, "--smoke-test", "--nodes", "2",
               "--image", "swr.example.com/rl/verl:a3", "--hardware", "a3", "--name", "bd-k", *extra), out


@pytest.mark.parametrize("case", K8S, ids=[str(i) + "-" + c[2][0][:30] for i, c in enumerate(K8S)])
def test_k8s_labels_and_options_are_one_line(case, cli, tmp_path):
    changes, extra, expect = case
    result, out = _export(cli, tmp_path, changes, extra)
    refused(result, *expect)
    assert not out.exists()


@pytest.mark.parametrize("case", K8S_ACCEPTED, ids=[str(i) for i in range(len(K8S_ACCEPTED))])
def test_k8s_labels_and_options_kubernetes_takes(case, cli, tmp_path):
    from rlbox.cluster.kuberay import refusal

    changes, extra = case
    (code, _, err), out = _export(cli, tmp_path, changes, extra)
    assert code == 0, err
    assert refusal(yaml.safe_load(out.read_text())) is None


# ---------------------------------------------------------------------------------------------
# Path-like options: a name never leads outside its folder.

PATH_OPTIONS = [  # (argv, files under the runs dir, what the one line names)
    (["metrics", "r1", "--job", "../../etc/passwd", "--runs-dir", "{runs}"], {"r1/a.log": ""}, ["--job '../../etc/passwd'"]),
    (["metrics", "r1", "--job", "../r2/a", "--runs-dir", "{runs}"], {"r1/a.log": "", "r2/a.log": ""}, ["--job '../r2/a'"]),
    (["metrics", "r1", "--job", "/etc/passwd", "--runs-dir", "{runs}"], {"r1/a.log": ""}, ["--job"]),
    (["metrics", "../r1", "--runs-dir", "{runs}"], {"r1/a.log": ""}, ["not a name"]),
    (["testbed", "status", "--name", "../x"], {}, ["--name '../x'"]),
    (["testbed", "down", "--name", "../x"], {}, ["--name '../x'"]),
    (["stop", "--name", "../r1", "--runs-dir", "{runs}"], {}, ["--name '../r1'"]),
    (["logs", "--name", "r1/..", "--runs-dir", "{runs}"], {}, ["--name 'r1/..'"]),
    (["serve", "--stop", "--name", "../../x", "--runs-dir", "{runs}"], {}, ["--name '../../x'"]),
    (["serve", "m", "--sim", "--dry-run", "--served-model-name", "--port=1"], {}, ["--served-model-name '--port=1'"]),
    (["merge", "../r1", "--step", "1", "--runs-dir", "{runs}"], {}, ["run name '../r1'"]),
    (["triage", "../r1", "--runs-dir", "{runs}"], {}, ["run name '../r1'"]),
    (["stop", "--name", "r1", "--runs-dir", "{runs}"],
     {"r1/state.json": json.dumps({**STATE, "run": "r1", "network": {"name": "bridge"}})},
     ["network.name: 'bridge' is not this run's network ('rlbox-r1')"]),
]


@pytest.mark.parametrize("case", PATH_OPTIONS, ids=[" ".join(c[0][:4]) for c in PATH_OPTIONS])
def test_path_like_options_stay_inside(case, cli, tmp_path):
    argv, files, expect = case
    runs = tmp_path / "runs"
    runs.mkdir()
    for rel, body in files.items():
        (runs / rel).parent.mkdir(parents=True, exist_ok=True)
        (runs / rel).write_text(body)
    before = sorted(tmp_path.rglob("*"))
    refused(cli(*[a.replace("{runs}", str(runs)) for a in argv], cwd=tmp_path, env={"RLBOX_ROOT": str(REPO)}), *expect)
    assert sorted(tmp_path.rglob("*")) == before


def test_a_jobs_own_log_is_still_found(cli, tmp_path):
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "abc.log").write_text("step:1 - critic/rewards/mean:0.5\n")
    for job in ("abc", "rlbox-r1-abc"):
        code, out, err = cli("metrics", "r1", "--job", job, "--runs-dir", runs, "--json", cwd=tmp_path)
        assert code == 0, err
        assert json.loads(out)["records"] == [{"step": 1, "critic/rewards/mean": 0.5}]


# ---------------------------------------------------------------------------------------------
# Integer options: ASCII digits only, one click type for all.

def _commands():
    from rlbox.cli.main import COMMANDS, load_command

    for name in sorted(COMMANDS):
        command = load_command(name)
        subs = command.commands.items() if isinstance(command, click.Group) else [(None, command)]
        for sub, cmd in subs:
            yield [name] + ([sub] if sub else []), cmd


def test_every_integer_option_has_the_shared_type():
    from rlbox.cli.common import Integer, IntRange

    seen = []
    for path, cmd in _commands():
        for param in cmd.params:
            if isinstance(param.type, click.types.IntParamType):
                assert isinstance(param.type, (Integer, IntRange)), (path, param.name, param.type)
                seen.append((" ".join(path), param.opts[-1]))
    assert ("run", "--nodes") in seen and ("serve", "--port") in seen and ("merge", "--step") in seen


def _integer_options():
    for path, cmd in _commands():
        for param in cmd.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.types.IntParamType):
                yield path, param.opts[-1]


INTEGER_OPTIONS = list(_integer_options())


@pytest.mark.parametrize("digits", ["４", "٣", "१२", "²"])
@pytest.mark.parametrize("path,option", INTEGER_OPTIONS, ids=[" ".join(p) + " " + o for p, o in INTEGER_OPTIONS])
def test_integer_options_refuse_unicode_digits(path, option, digits, cli, tmp_path):
    refused(cli(*path, option, digits, cwd=tmp_path), f"'{option}'", "ASCII digits")


def test_integer_options_take_ascii_digits(cli):
    code, out, err = cli("run", "--dry-run", "--sim", "--nodes", "2", "--smoke-test", "--max-restarts", "+3", "--num-cpus", "0")
    assert code == 0, err
    assert "4 node(s)" not in out and "2 node(s)" in out


TESTBED_PAIRS = [(["testbed", "up", "--hosts", "2", "--hardware", "a3", "--host-devices", "２=4", "--dry-run"], "--host-devices"),
                 (["testbed", "up", "--hosts", "2", "--hardware", "a3", "--host-devices", "2=４", "--dry-run"], "--host-devices"),
                 (["testbed", "up", "--hosts", "2", "--hardware", "a3", "--host-devices", "²=4", "--dry-run"], "--host-devices")]


@pytest.mark.parametrize("argv,option", TESTBED_PAIRS)
def test_host_numbers_are_ascii(argv, option, cli, tmp_path):
    refused(cli(*argv, cwd=tmp_path), option)


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "0", "1e9"])
def test_serve_timeout_is_a_number_of_seconds(value, cli, tmp_path):
    refused(cli("serve", "m", "--sim", "--dry-run", "--timeout", value, cwd=tmp_path), "'--timeout'")


# ---------------------------------------------------------------------------------------------
# Hydra overrides and --param values: one literal value each, whatever it holds.

PARAM_VALUES = ["/data/qwen,v2", "[/a,/b]", "{a: 1}", "$(touch /tmp/rlbox-marker)", "`id`", "a'b\"c", "it's",
                "a b", "x=y", "c:\\dir\\", "f(x)", "null", "1e3", "True", "nan", "1_000", "~x", "a#b", "*"]


def test_every_recipe_param_is_one_literal_value():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rlbox.cluster import recipes
    from rlbox.core.quote import HYDRA_NOT_STRING

    parser = OverridesParser.create()
    checked = 0
    for rec in recipes.all_recipes():
        for release in (rec.release, *rec.releases):
            r = rec.on(release)
            for name, param in r.params.items():
                argv, _ = r.resolve({name: "zz-marker"}, [])
                where = [i for i, a in enumerate(argv) if "zz-marker" in a]
                number = HYDRA_NOT_STRING.fullmatch(param.default)
                for value in PARAM_VALUES:
                    argv, _ = r.resolve({name: value}, [])
                    for i in where:
                        override = parser.parse_override(argv[i])
                        assert not override.is_sweep_override(), (rec.name, name, value, argv[i])
                        if not (number and HYDRA_NOT_STRING.fullmatch(value)):
                            assert override.value() == value, (rec.name, release, name, value, argv[i])
                        checked += 1
    assert checked > 500


def test_a_param_reaches_the_job_as_one_word(cli, tmp_path):
    """Through the job's shell line too: the entrypoint (shlex-joined) splits back to the same argv."""
    import shlex

    from rlbox.cluster import recipes

    rec = next(r for r in recipes.all_recipes() if "model_path" in r.params)
    value = "$(touch /tmp/rlbox-marker) `id` 'q' \"d\" a,b [c]"
    code, out, err = cli("run", "--dry-run", "--sim", "--nodes", str(rec.nodes), "--recipe", rec.name,
                         "--param", f"model_path={value}", "--no-validate", cwd=tmp_path)
    assert code == 0, err
    line = next(line for line in out.splitlines() if "actor_rollout_ref.model.path=" in line)
    words = shlex.split(line)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    override = next(w for w in words if w.startswith("actor_rollout_ref.model.path="))
    assert OverridesParser.create().parse_override(override).value() == value
    assert not Path("/tmp/rlbox-marker").exists()


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\x1bb"])
def test_a_param_with_a_control_character_is_one_line(value, cli, tmp_path):
    from rlbox.cluster import recipes

    rec = next(r for r in recipes.all_recipes() if "model_path" in r.params)
    refused(cli("run", "--dry-run", "--sim", "--nodes", str(rec.nodes), "--recipe", rec.name,
                "--param", f"model_path={value}", "--no-validate", cwd=tmp_path), "--param")


# ---------------------------------------------------------------------------------------------
# Recipes' release forms (issue 37): the release exists, each add: is one Hydra override, each
# rename: maps a key to a key; checked when the recipe is read, by every command that reads it.

_FORM = "verl_pt210_cann910"
RECIPE_FORMS = [  # (edit(recipe), what the one line names)
    (lambda r: r["releases"].update(verl_pt99={"why": "x"}), ["releases: no release 'verl_pt99' in images/"]),
    (lambda r: r.update(release="verl_pt27_25rc4"), ["release: no release 'verl_pt27_25rc4'", "did you mean"]),
    (lambda r: r["releases"][_FORM].update(add=["a.b=1\n+c.d=2"]), [f"releases.{_FORM}.add", "control character U+000A"]),
    (lambda r: r["releases"][_FORM].update(add=["trainer.total_epochs"]), [f"releases.{_FORM}.add", "not one KEY=VALUE"]),
    (lambda r: r["releases"][_FORM].update(add=["=1"]), [f"releases.{_FORM}.add", "not one KEY=VALUE"]),
    (lambda r: r["releases"][_FORM].update(add=["a b=1"]), [f"releases.{_FORM}.add", "not one KEY=VALUE"]),
    (lambda r: r["releases"][_FORM].update(add=["a.b=1,2"]), [f"releases.{_FORM}.add", "is a sweep"]),
    (lambda r: r["releases"][_FORM].update(add=["a.b='x"]), [f"releases.{_FORM}.add", "is not a Hydra override"]),
    (lambda r: r["releases"][_FORM].update(rename={"data.train_files": "data.train files"}),
     [f"releases.{_FORM}.rename", "is not a config key"]),
    (lambda r: r["releases"][_FORM].update(rename={"data.train_files": "data.x=1"}),
     [f"releases.{_FORM}.rename", "is not a config key"]),
    (lambda r: r["releases"][_FORM].update(rename={"data.train files": "data.x"}),
     [f"releases.{_FORM}.rename", "is not a config key"]),
    (lambda r: r["releases"][_FORM].update(drop={"a=b": "why"}), [f"releases.{_FORM}.drop", "is not a config key"]),
]


def _recipe_file(tmp_path, edit):
    from rlbox.cluster.recipes import RECIPES_DIR

    doc = yaml.safe_load((RECIPES_DIR / "grpo-qwen2.5-0.5b-gsm8k.yaml").read_text())
    doc["name"] = "hostile"
    edit(doc)
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("command", ["show", "run"])
@pytest.mark.parametrize("case", RECIPE_FORMS, ids=[str(i) + "-" + c[1][0][:30] for i, c in enumerate(RECIPE_FORMS)])
def test_a_recipes_release_forms_are_held_to_their_grammar(case, command, cli, tmp_path):
    edit, expect = case
    path = _recipe_file(tmp_path, edit)
    argv = (["recipes", "show", path] if command == "show" else
            ["run", "--dry-run", "--sim", "--nodes", "1", "--recipe", path, "--no-validate"])
    refused(cli(*argv), f"{path}: ", *expect)


def test_a_recipes_fair_release_forms_still_load(cli, tmp_path):
    path = _recipe_file(tmp_path, lambda r: r["releases"][_FORM].update(
        add=["+a.b=1", "++c.d='x,y'", "~e.f", "g.h=[1,2]", "i.j=${oc.env:HOME}"],
        rename={"data.train_files": "+data.train_path"}, drop={"data.val_files": "why"}))
    code, out, err = cli("recipes", "show", path)
    assert code == 0, err


# ---------------------------------------------------------------------------------------------
# Metrics read back from a job log (issue 37): a number is bounded; a huge one is skipped, said so.

METRIC_LOGS = [  # (log text, exit code, what stderr says, records of --json)
    ("step:1 - a:" + "9" * 30_000_000 + " - b:0.5\nstep:2 - a:1 - b:0.25\n", 0,
     "1 value(s) longer than 64 characters skipped as no number (first: a at step 1)",
     [{"step": 1}, {"step": 2, "a": 1, "b": 0.25}]),
    ("step:1 - a:" + "9" * 5000 + " - b:0.5\n", 0, "(first: a at step 1)", [{"step": 1, "b": 0.5}]),
    ("step:1 - a:np.float64(" + "1" * 5000 + ") - b:2\n", 0, "(first: a at step 1)", [{"step": 1, "b": 2}]),
    ("step:" + "9" * 5000 + " - a:1\n", 2, "no verl step lines", None),
    ("step:1 - a:-" + "1" * 4301 + "\nstep:" + "1" * 19 + " - a:2\n", 0, "(first: a at step 1)", [{"step": 1}]),
]


@pytest.mark.parametrize("case", METRIC_LOGS, ids=[str(i) for i in range(len(METRIC_LOGS))])
def test_metrics_bound_the_numbers_they_read(case, cli, tmp_path):
    text, code, expect, records = case
    log = tmp_path / "job.log"
    log.write_text(text)
    got, out, err = cli("metrics", log, "--json", cwd=tmp_path)
    assert got == code and "Traceback" not in err and err.count("\n") == 1 and expect in err, (got, err[-500:])
    if records is not None:
        assert json.loads(out)["records"] == records


# ---------------------------------------------------------------------------------------------
# Options share one grammar each (issue 37): one node limit, mounts of one line, testbed subnets
# in the private ranges, an image reference where one is expected.

_MANY = ",".join(f"h{i}" for i in range(5000))
TB = ["testbed", "up", "--hosts", "2", "--hardware", "a3", "--dry-run"]
OPTION_GRAMMAR = [  # (argv, files under the runs dir, what the one line names)
    (["run", "--dry-run", "--hosts", _MANY, "--smoke-test", "--image", "x"], {}, ["--hosts: 5000 hosts", "at most 4096"]),
    (["validate", "--hosts", _MANY, "--", "python3", "-m", "x"], {}, ["--hosts: 5000 hosts", "at most 4096"]),
    (["run", "--dry-run", "--cluster", "{runs}/c.yaml", "--smoke-test"],
     {"c.yaml": {"image": "x", "hosts": [{"host": f"h{i}"} for i in range(4097)]}}, ["c.yaml: hosts:", "at most 4096"]),
    (["run", "--dry-run", "--sim", "--nodes", "4097", "--smoke-test"], {}, ["'--nodes'", "4096"]),
    (["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--mount", "/data\n/x:/data"], {},
     ["--mount: '/data\\n/x:/data'", "control character U+000A"]),
    (["run", "--dry-run", "--sim", "--nodes", "1", "--smoke-test", "--mount", "/data:/da\tta"], {}, ["--mount:", "U+0009"]),
    (["run", "--dry-run", "--cluster", "{runs}/c.yaml", "--smoke-test"],
     {"c.yaml": {"image": "x", "mounts": ["/a\r:/b"], "hosts": [{"host": "h1"}]}}, ["c.yaml: mounts:", "U+000D"]),
    ([*TB, "--subnet", "127.0.0.0/24"], {}, ["--subnet '127.0.0.0/24'", "inside 10.0.0.0/8"]),
    ([*TB, "--subnet", "127.1.0.0/16"], {}, ["--subnet '127.1.0.0/16'"]),
    ([*TB, "--subnet", "169.254.0.0/16"], {}, ["--subnet '169.254.0.0/16'"]),
    ([*TB, "--subnet", "0.0.0.0/8"], {}, ["--subnet '0.0.0.0/8'"]),
    ([*TB, "--subnet", "10.０.0.0/24"], {}, ["--subnet"]),
    ([*TB, "--image", "--dry-run"], {}, ["--image: '--dry-run'"]),
    ([*TB, "--image", "-x"], {}, ["--image: '-x'"]),
    ([*TB, "--image", "x;touch /tmp/rlbox-marker"], {}, ["--image:", "is not an image reference"]),
]


@pytest.mark.parametrize("case", OPTION_GRAMMAR, ids=[str(i) + "-" + " ".join(c[0][:2]) for i, c in enumerate(OPTION_GRAMMAR)])
def test_options_share_one_grammar_each(case, cli, tmp_path):
    argv, files, expect = case
    runs = tmp_path / "runs"
    runs.mkdir()
    for rel, body in files.items():
        (runs / rel).write_text(yaml.safe_dump(body))
    refused(cli(*[a.replace("{runs}", str(runs)) for a in argv], cwd=tmp_path, env={"RLBOX_ROOT": str(REPO)}), *expect)


def test_testbed_plan_takes_private_subnets_and_real_images(cli, tmp_path):
    code, out, err = cli(*TB, "--subnet", "192.168.7.0/24", "--image", "localhost/rlbox/sim:amd64", cwd=tmp_path)
    assert code == 0, err
    assert "on 192.168.7.0/24" in out and "# image localhost/rlbox/sim:amd64: docker save" in out
