"""The manual (docs/, mkdocs.yml) and the README stay true and whole.

- The strict mkdocs build passes (a broken link, a missing anchor or a page left out of the nav
  fails it), and a broken link does fail it.
- `--help` and the manual agree, from click's command tree: every command has a reference section
  (`### \\`rlbox X\\``) on one page, whose option table names exactly the options `rlbox X --help`
  lists; every `rlbox ...` command line the manual or the README shows uses only options its command
  has.
- The troubleshooting page lists every triage signature (generated, gated by re-render).
- The README is a front door: at most ~200 lines, a row per command linking into the manual, and
  its relative links name files that exist.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from rlbox.cli.main import COMMANDS, cli

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md"))
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def leaves(group=cli, ctx=None, path=()):
    """(path, command) of every runnable command, read from click's tree (lazy groups included)."""
    ctx = ctx or click.Context(cli, info_name="rlbox")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from leaves(command, click.Context(command, info_name=name, parent=ctx), path + (name,))
        else:
            yield path + (name,), command


def options_of(command: click.Command) -> set[str]:
    ctx = click.Context(command)
    return {o for p in command.get_params(ctx) if isinstance(p, click.Option) and not p.hidden
            for o in (*p.opts, *p.secondary_opts) if o not in ("--help", "-h")}


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


def test_strict_build_passes(tmp_path):
    proc = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "launcher.html").is_file()


@pytest.mark.parametrize("breakage", ["[gone](no-such-page.md)", "[gone](launcher.md#no-such-heading)"])
def test_strict_build_fails_on_a_broken_link(tmp_path, breakage):
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "index.md"
    page.write_text(page.read_text() + f"\n{breakage}\n")
    proc = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0


def sections() -> dict[str, list[tuple[Path, str]]]:
    """`rlbox X` -> [(page, text of its ### section)] over every page of the manual."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for page in PAGES:
        parts = re.split(r"(?m)^(?=#{1,3} )", page.read_text())
        for part in parts:
            m = re.match(r"### `rlbox ([^`]+)`\n", part)
            if m:
                found.setdefault(m.group(1), []).append((page, part))
    return found


def table_options(text: str) -> set[str]:
    """The options named in the first cell of each row of a section's option table."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `-"):
            first = line.split(" | ", 1)[0]
            names |= set(OPTION.findall(" ".join(re.findall(r"`([^`]*)`", first))))
    return names


COMMAND_PATHS = sorted(" ".join(p) for p, _ in leaves())


def test_every_command_is_in_the_tree_read_here():
    assert len(COMMAND_PATHS) > len(COMMANDS)  # groups expanded into their subcommands
    assert "images list" in COMMAND_PATHS and "k8s export" in COMMAND_PATHS and "run" in COMMAND_PATHS


@pytest.mark.parametrize("path", COMMAND_PATHS)
def test_manual_section_lists_exactly_the_options_of_help(path):
    command = dict((" ".join(p), c) for p, c in leaves())[path]
    found = sections().get(path, [])
    assert len(found) == 1, (f"`rlbox {path}` needs exactly one reference section (### `rlbox {path}`) in docs/*.md, "
                             f"found {len(found)}: python3 tools/docs-options.py {path} prints one")
    page, text = found[0]
    listed, real = table_options(text), options_of(command)
    assert not real - listed, f"{page.name}: `rlbox {path}` options missing from its table: {sorted(real - listed)}"
    assert not listed - real, f"{page.name}: `rlbox {path}` has no options {sorted(listed - real)}"
    usage = " ".join(["rlbox", path, *command.collect_usage_pieces(click.Context(command))])
    assert usage in text, f"{page.name}: `rlbox {path}` section must show its usage line: {usage}"


def test_no_section_for_a_command_that_does_not_exist():
    assert not set(sections()) - set(COMMAND_PATHS)


def command_lines(text: str):
    """Every `rlbox ...` command the text shows: lines of code blocks (continuations joined, `$ `
    prompts and comments dropped) and inline code spans, without rlbox's own output lines."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("rlbox ") and not line.startswith(("rlbox: ", "rlbox-")):
                yield line.split(" #", 1)[0]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`(rlbox [^`]+)`", prose):
        yield span


def resolve(words: list[str]):
    """The command a command line names, and the words after its name; None for a group alone."""
    node, path = cli, []
    while isinstance(node, click.Group) and words and words[0] in node.list_commands(None):
        path.append(words[0])
        node = node.get_command(None, words.pop(0))
    return (None if isinstance(node, click.Group) else node), path, words


def test_every_command_line_shown_uses_only_real_options():
    wrong = []
    for doc in [REPO / "README.md", *PAGES]:
        for line in command_lines(doc.read_text()):
            try:
                words = shlex.split(line)
            except ValueError:
                words = line.split()
            command, path, rest = resolve(words[1:])
            if command is None:
                continue
            real = options_of(command) | {"--help", "-h"}
            if "--" in rest:
                rest = rest[:rest.index("--")]  # what follows `--` is the job's command line
            for word in rest:
                opt = word.split("=", 1)[0]
                if OPTION.fullmatch(opt) and opt not in real:
                    wrong.append(f"{doc.name}: `{line.strip()[:90]}`: rlbox {' '.join(path)} has no {opt}")
    assert not wrong, "\n".join(wrong)


def test_troubleshooting_lists_every_signature():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "docs-signatures.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import yaml

    ids = [s["id"] for s in yaml.safe_load((REPO / "launcher/rlbox/resources/signatures.yaml").read_text())["signatures"]]
    page = (DOCS / "troubleshooting.md").read_text()
    assert all(f"| `{i}` |" in page for i in ids)


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 210
    assert "make rehearsal" in readme and "make test" in readme
    for name in COMMANDS:  # a row per command, linking into the manual
        row = re.search(rf"^\| `rlbox {re.escape(name)}[ `].*$", readme, re.M)
        assert row, f"README.md: the command table has no row for `rlbox {name}`"
        assert re.search(r"\]\(docs/[\w-]+\.md(#[\w-]+)?\)", row.group(0)), f"README.md: the row for `rlbox {name}` links into no docs/ page"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


# -- what the pages quote exists: stand-in lines, image tags, the HF-style layout, recipes ----------
def _variants():
    from rlbox.image import matrix

    return list(matrix.load(REPO).variants)


def _quoted_standin_lines() -> list[tuple[str, str]]:
    """Every `rlbox: stand-in: ... [NAME]` line the manual quotes (wrapped lines joined)."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("rlbox: stand-in: "):
                text, j = line, i
                while not text.rstrip().endswith("]") and j + 1 < len(lines):
                    j += 1
                    text += " " + lines[j].strip()
                found.append((page.name, text.strip()))
    return found


def test_the_stand_in_lines_quoted_are_what_rlbox_prints():
    """Each quoted stand-in line is the one `rlbox run` prints for some variant and stand-in
    (standins.plan's label, as describe_labels renders it), not an older wording."""
    from rlbox.core.errors import RlboxError
    from rlbox.image import standins

    real = set()
    for v in _variants():
        for name in standins.STANDINS:
            try:
                p = standins.plan(v, name, v.image)
            except RlboxError:
                continue
            real.add("rlbox: " + standins.describe_labels({standins.LABEL: p.name, standins.LABEL_SUMMARY: p.summary}))
    quoted = _quoted_standin_lines()
    assert len(quoted) >= 3
    wrong = [(page, line) for page, line in quoted if line not in real]
    assert wrong == [], f"not what rlbox prints: {wrong}\nreal: {sorted(real)}"


def test_the_local_image_tags_quoted_are_ones_rlbox_makes():
    """Every localhost/rlbox image the manual names is a variant's image, its stand-in's tag, a
    rehearsal's, or the tests' digest-tagged verl CPU image (tests/support/verl_cpu.py)."""
    from rlbox.image import standins

    made = set()
    for v in _variants():
        for base in (v.image, f"localhost/rlbox-rehearsal/{v.release.image.name}:{v.tag}"):
            made |= {base} | {standins.tag_for(base, s) for s in standins.STANDINS}
    digest_tag = re.compile(r"^localhost/rlbox/verl-cpu(-09)?:amd64-([0-9a-f]{12}|DIGEST)(-verl-cpu-shims)?$")
    quoted = {(p.name, t) for p in PAGES for t in re.findall(r"localhost/rlbox(?:-rehearsal)?/[a-z0-9_.-]+:[A-Za-z0-9_.-]+",
                                                            p.read_text())}
    assert len(quoted) >= 5
    unknown = sorted((page, t) for page, t in quoted if t not in made and not digest_tag.match(t))
    assert unknown == [], unknown
    page = (DOCS / "cpu-training.md").read_text()  # both tags are named where the image is used
    assert "localhost/rlbox/verl-cpu:amd64-verl-cpu-shims" in page and "amd64-DIGEST-verl-cpu-shims" in page


def test_the_hf_style_endpoint_layout_is_the_one_data_prepare_fetches(tmp_path):
    """The layout the CPU training page gives for `--endpoint URL` is where `rlbox data prepare`
    looks, and its snippet turns the shipped sample into the parquet files it serves."""
    import pyarrow.parquet as pq

    from rlbox.training import datasets

    page = (DOCS / "cpu-training.md").read_text()
    for split in ("train", "test"):
        url = datasets.url_for(datasets.FileRef(repo="openai/gsm8k", path=f"main/{split}-00000-of-00001.parquet",
                                                split=split, save=f"gsm8k/{split}.parquet"),
                               "http://127.0.0.1:8765", "gsm8k")
        assert url == f"http://127.0.0.1:8765/datasets/openai/gsm8k/resolve/main/main/{split}-00000-of-00001.parquet"
    assert "URL/datasets/openai/gsm8k/resolve/main/main/train-00000-of-00001.parquet" in page
    snippet = next(line for line in page.splitlines() if "pyarrow.json" in line).strip().strip("'")
    snippet = snippet.replace("/sample/", str(REPO / "tests/fixtures/gsm8k-sample") + "/").replace("/out/", f"{tmp_path}/")
    exec(snippet, {})
    assert pq.read_table(tmp_path / "train-00000-of-00001.parquet").num_rows == 32


def test_recipe_grpo_tiny_cpu_says_where_it_runs():
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "recipes", "show", "grpo-tiny-cpu"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "2 testbed hosts or simulated nodes" in proc.stdout, proc.stdout[:500]


def test_the_npu_smi_stand_in_is_described_as_it_prints():
    """docs/locks.md describes the stand-in npu-smi's rows: 910B3 for A2, Ascend910 with two chips
    per NPU and a Phy-ID column for A3."""
    from rlbox.cluster import sim

    assert "`910B3` rows for A2, `Ascend910` with two chips per NPU and a Phy-ID column for A3" in " ".join(
        (DOCS / "locks.md").read_text().split())
    a2, a3 = sim.npu_smi_table("a2", 8, "25.3.rc1"), sim.npu_smi_table("a3", 16, "25.3.rc1")
    assert "910B3" in a2 and "Phy-ID" not in a2
    assert "Ascend910" in a3 and "Phy-ID" in a3 and sim.CHIPS["a3"][1] == 2
