"""Architecture rules for launcher/rlbox, read from the source with ``ast`` (nothing is imported).

Every ``*.py`` file under the package is a module; nothing here lists them, so modules that are
added, split or moved are checked as they are. The rules:

layers
    Subpackages are layered, lowest first: resources (data only) < core < registry < image < verl <
    cluster < delivery < training < backends < testbed < cli. A module may import its own subpackage or a
    lower layer, never a higher or a sibling one. ``rlbox/__init__.py`` is exempt, as importer and as target. A module
    outside every layer (e.g. a new ``rlbox/foo.py`` or ``rlbox/foo/``) is reported too: give it
    a layer in LAYERS.
scripts
    ``rlbox/training/scripts/``, ``rlbox/image/scripts/`` and ``rlbox/verl/scripts/`` run inside containers (or
    another Python's environment) as standalone files: they import nothing of rlbox, and no rlbox module imports
    them (they are read as text).
verl
    What rlbox knows of verl's code (validating against it, the scripts that run in its Python, its job's
    command line, its recipes' release forms, its step line and metric keys) lives in ``rlbox/verl/``. Checked
    by proxy in every module outside that room and outside ``rlbox/resources`` (data, and the stand-ins'
    files copied into images): none imports verl itself (``import verl``, ``from verl... import``), none
    names a file of verl's source (``verl/utils/device.py``, with or without ``:LINE``, in code, docstrings
    or comments), and no module under ``rlbox/cluster`` is named for verl.
cycles
    The module graph has no cycle. An edge is any import of an rlbox module, at the top of a
    file or inside a function, absolute or relative; ``from pkg import sub`` is an edge to the
    submodule ``pkg.sub``, ``from mod import name`` an edge to ``mod``. Parent packages'
    ``__init__`` are not edges of their own (they are executed, but rlbox's import nothing of
    their subpackages' users). Imports under ``if TYPE_CHECKING:`` are not edges: they never
    run, and are how one module names another's types without a cycle. They still count for the
    layer and private-name rules.
private
    No private name (``_x``, not dunder) crosses modules: neither ``from rlbox.a.b import _x``
    nor ``mod._x`` on a name bound to an imported rlbox module (e.g. ``matrix._did_you_mean(``).
    Bindings are tracked per file, not per scope: a local variable shadowing an imported
    module's name would be taken for the module.
resolves
    Every rlbox import names something that exists: a module, or a name bound at the top of the
    module it is imported from (relative imports resolved, so a ``..`` too many is caught).
size
    No module under rlbox over 600 lines; none under rlbox/cli over 400.

Each violation names file:line, the rule and what to do. The self-checks at the bottom run the
same checker on a small synthetic package that breaks every rule, and assert exactly what each
rule reports there.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "launcher"  # the folder holding the ``rlbox`` package
PACKAGE = "rlbox"

LAYERS = ("resources", "core", "registry", "image", "verl", "cluster", "delivery", "training", "backends", "testbed",
          "cli")
SCRIPTS = ("rlbox.training.scripts", "rlbox.image.scripts", "rlbox.verl.scripts")
MAX_LINES = 600
MAX_CLI_LINES = 400


# ---------------------------------------------------------------------------------------------
# The scan: modules, their imports and the private names they reach, from the source alone.


@dataclass(frozen=True, order=True)
class Violation:
    path: str  # relative to the scanned root's parent, e.g. launcher/rlbox/cli/main.py
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.detail}"


@dataclass
class Module:
    name: str  # dotted: rlbox.image.matrix; a package is named by its __init__: rlbox.image
    rel: str
    is_package: bool
    tree: ast.Module
    lines: int

    @property
    def package(self) -> str:
        """The package relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Edge:
    importer: str
    target: str  # a module name that exists in the scan
    line: int
    type_checking: bool


@dataclass(frozen=True)
class PrivateUse:
    importer: str
    line: int
    owner: str  # the module the name belongs to
    name: str
    how: str  # the source form, e.g. "from rlbox.cluster.launch import _pairs"


@dataclass
class Scan:
    root: Path  # the folder holding the package; paths in messages are relative to its parent
    modules: dict[str, Module] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    private: list[PrivateUse] = field(default_factory=list)
    unresolved: list[Violation] = field(default_factory=list)

    def __repr__(self) -> str:  # what pytest prints for the fixture when a rule fails
        return f"Scan({self.root}: {len(self.modules)} modules, {len(self.edges)} imports of rlbox)"


def scan(root: Path, package: str = PACKAGE) -> Scan:
    """Parse every module of ``root/package`` and collect its rlbox imports."""
    result = Scan(root)
    base = root / package
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent).as_posix()
        result.modules[".".join(parts)] = Module(
            ".".join(parts), rel, is_package, ast.parse(text, filename=rel), len(text.splitlines())
        )
    for module in result.modules.values():
        _collect(result, module, package)
    return result


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _walk(node: ast.AST, type_checking: bool = False):
    """Every node below ``node`` with whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield stmt, True
                yield from _walk(stmt, True)
            for stmt in child.orelse:
                yield stmt, type_checking
                yield from _walk(stmt, type_checking)
        else:
            yield child, type_checking
            yield from _walk(child, type_checking)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve_relative(module: Module, level: int, name: str | None) -> str | None:
    if level == 0:
        return name
    parts = module.package.split(".")
    if level - 1 >= len(parts):
        return None
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _collect(scan_: Scan, module: Module, package: str) -> None:
    modules = scan_.modules
    bound: dict[str, str] = {}  # local name -> rlbox module it is bound to
    attributes: list[tuple[ast.Attribute, bool]] = []

    def ours(name: str | None) -> bool:
        return name is not None and (name == package or name.startswith(package + "."))

    def unresolved(line: int, what: str, how: str) -> None:
        scan_.unresolved.append(Violation(
            module.rel, line, "resolves",
            f"`{how}`: {what} does not exist under {package}; the import fails when it runs",
        ))

    def edge(target: str, line: int, tc: bool) -> None:
        scan_.edges.append(Edge(module.name, target, line, tc))

    for node, tc in _walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not ours(alias.name):
                    continue
                how = f"import {alias.name}"
                target = alias.name
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target != alias.name:
                    unresolved(node.lineno, f"module {alias.name}", how)
                if not target:
                    continue
                edge(target, node.lineno, tc)
                if alias.asname:
                    bound[alias.asname] = target
                else:
                    bound[alias.name.partition(".")[0]] = package
        elif isinstance(node, ast.ImportFrom):
            dots = "." * node.level
            how_from = f"from {dots}{node.module or ''} import"
            base = _resolve_relative(module, node.level, node.module)
            if base is None:
                if node.level:
                    unresolved(node.lineno, f"the package {dots} above {module.package}",
                               f"{how_from} ...")
                continue
            if not ours(base):
                continue
            if base not in modules:
                unresolved(node.lineno, f"module {base}", f"{how_from} ...")
                continue
            names = _top_level_names(modules[base].tree)
            for alias in node.names:
                how = f"{how_from} {alias.name}"
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    edge(sub, node.lineno, tc)
                    bound[alias.asname or alias.name] = sub
                    if _private(alias.name):
                        scan_.private.append(PrivateUse(module.name, node.lineno, base, alias.name, how))
                    continue
                edge(base, node.lineno, tc)
                if alias.name == "*":
                    continue
                if _private(alias.name):
                    scan_.private.append(PrivateUse(module.name, node.lineno, base, alias.name, how))
                if names is not None and alias.name not in names and not alias.name.startswith("__"):
                    unresolved(node.lineno, f"{alias.name} (neither a submodule of {base} nor a name it binds)", how)
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            attributes.append((node, tc))

    def module_of(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return bound.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = module_of(expr.value)
            if owner is not None and f"{owner}.{expr.attr}" in modules:
                return f"{owner}.{expr.attr}"
        return None

    for node, _ in attributes:
        owner = module_of(node.value)
        if owner is not None and owner != module.name:
            scan_.private.append(PrivateUse(
                module.name, node.lineno, owner, node.attr, f"{ast.unparse(node.value)}.{node.attr}"
            ))


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """Names a module binds at its top level; None when it may bind anything (``import *``,
    a module ``__getattr__``)."""
    names: set[str] = set()
    dynamic = False

    def targets(node: ast.expr) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                names.add(n.id)

    def visit(stmts: list[ast.stmt]) -> None:
        nonlocal dynamic
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(s.name)
                dynamic |= s.name == "__getattr__"
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    targets(t)
            elif isinstance(s, (ast.AnnAssign, ast.AugAssign)):
                targets(s.target)
            elif isinstance(s, ast.Import):
                names.update(a.asname or a.name.partition(".")[0] for a in s.names)
            elif isinstance(s, ast.ImportFrom):
                for a in s.names:
                    dynamic |= a.name == "*"
                    names.add(a.asname or a.name)
            elif isinstance(s, (ast.For, ast.AsyncFor)):
                targets(s.target)
                visit(s.body + s.orelse)
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                for item in s.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
                visit(s.body)
            elif isinstance(s, (ast.If, ast.While)):
                visit(s.body + s.orelse)
            elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
                visit(s.body + s.orelse + s.finalbody)
                for h in s.handlers:
                    if h.name:
                        names.add(h.name)
                    visit(h.body)

    visit(tree.body)
    return None if dynamic else names


# ---------------------------------------------------------------------------------------------
# The rules: each returns its violations, sorted.


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def check_layers(s: Scan) -> list[Violation]:
    out = []
    for m in s.modules.values():
        if m.name != PACKAGE and _layer(m.name) is None:
            out.append(Violation(m.rel, 1, "layers",
                                 f"{m.name} is in no layer; move it into a subpackage of {', '.join(LAYERS)} "
                                 "or give its subpackage a place in LAYERS"))
    for e in s.edges:
        if PACKAGE in (e.importer, e.target):
            continue
        mine, theirs = _layer(e.importer), _layer(e.target)
        if mine is None or theirs is None or mine == theirs:
            continue
        if LAYERS.index(theirs) > LAYERS.index(mine):
            allowed = ", ".join(reversed(LAYERS[: LAYERS.index(mine) + 1]))
            where = " (under TYPE_CHECKING)" if e.type_checking else ""
            out.append(Violation(
                s.modules[e.importer].rel, e.line, "layers",
                f"{e.importer} ({mine}) imports {e.target} ({theirs}){where}; {mine} may import only "
                f"{allowed}: move the shared code down or invert the dependency",
            ))
    return sorted(set(out))


def check_scripts(s: Scan) -> list[Violation]:
    out = []
    for e in s.edges:
        inside = any(e.importer == x or e.importer.startswith(x + ".") for x in SCRIPTS)
        into = any(e.target == x or e.target.startswith(x + ".") for x in SCRIPTS)
        if inside:
            out.append(Violation(s.modules[e.importer].rel, e.line, "scripts",
                                 f"{e.importer} imports {e.target}; container scripts run as standalone "
                                 "files and may import nothing of rlbox"))
        elif into:
            out.append(Violation(s.modules[e.importer].rel, e.line, "scripts",
                                 f"{e.importer} imports {e.target}; container scripts are shipped as text "
                                 "(read their path), never imported"))
    return sorted(set(out))


def _components(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan), iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    out.append(sorted(comp))
    return out


def check_cycles(s: Scan) -> list[Violation]:
    graph: dict[str, set[str]] = {m: set() for m in s.modules}
    lines: dict[tuple[str, str], int] = {}
    for e in s.edges:
        if e.type_checking or e.importer == e.target:
            continue
        graph[e.importer].add(e.target)
        key = (e.importer, e.target)
        lines[key] = min(lines.get(key, e.line), e.line)
    out = []
    for comp in _components(sorted(graph), graph):
        if len(comp) < 2:
            continue
        members = set(comp)
        # One concrete cycle through the component's first module (the shortest, by BFS) ...
        start, end = comp[0], None
        prev: dict[str, str] = {}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            if start in graph[node]:
                end = node
                break
            for nxt in sorted(graph[node] & members):
                if nxt != start and nxt not in prev:
                    prev[nxt] = node
                    queue.append(nxt)
        path = [end]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycle = list(reversed(path)) + [start]
        # ... and every import inside the component, each at its file:line.
        inner = sorted(
            f"{s.modules[a].rel}:{line} -> {b}" for (a, b), line in lines.items() if a in members and b in members
        )
        out.append(Violation(
            s.modules[cycle[0]].rel, lines[(cycle[0], cycle[1])], "cycles",
            f"import cycle {' -> '.join(cycle)} (modules in the cycle: {', '.join(comp)}); its imports: "
            + "; ".join(inner)
            + ". Break it: move what both need into one of them or a lower module, or import under "
            "TYPE_CHECKING when only types are needed",
        ))
    return sorted(out)


def check_private(s: Scan) -> list[Violation]:
    out = [
        Violation(s.modules[p.importer].rel, p.line, "private",
                  f"`{p.how}` reaches {p.owner}.{p.name}, private to {p.owner}; make it public there "
                  "(and test it as such) or keep its callers inside that module")
        for p in s.private
    ]
    return sorted(set(out))


def check_resolves(s: Scan) -> list[Violation]:
    return sorted(set(s.unresolved))


def check_sizes(s: Scan, limit: int, under: str = PACKAGE) -> list[Violation]:
    out = []
    for m in s.modules.values():
        if (m.name == under or m.name.startswith(under + ".")) and m.lines > limit:
            out.append(Violation(m.rel, 1, "size",
                                 f"{m.lines} lines, over the {limit}-line limit for a module under {under}; "
                                 "split it by responsibility"))
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# The rules on launcher/rlbox.


@pytest.fixture(scope="module")
def tree() -> Scan:
    return scan(SRC)


def _report(rule: str, violations: list[Violation]) -> str:
    return f"{len(violations)} violation(s) of the {rule} rule:\n" + "\n".join(map(str, violations))


def test_the_scan_sees_the_package(tree):
    # Guards the rules below against passing on an empty or misplaced scan.
    assert f"{PACKAGE}.cli" in tree.modules and f"{PACKAGE}.core" in tree.modules, sorted(tree.modules)
    assert len(tree.modules) >= 30, sorted(tree.modules)
    seen = {_layer(m) for m in tree.modules} - {None}
    assert seen == set(LAYERS), f"layers with no module: {sorted(set(LAYERS) - seen)}"
    assert any(e.importer.startswith(f"{PACKAGE}.cli") for e in tree.edges)


def test_layers_import_only_their_own_subpackage_or_lower(tree):
    violations = check_layers(tree)
    assert not violations, _report("layers (" + " < ".join(LAYERS) + ")", violations)


def test_container_scripts_import_nothing_of_rlbox(tree):
    violations = check_scripts(tree)
    assert not violations, _report("scripts", violations)


VERL_SOURCE = re.compile(r"\bverl/[\w/]+\.py\b")  # a file of verl's source, e.g. verl/utils/device.py(:76)
SOURCE_LINE = re.compile(r"\b[\w./-]+\.py:\d+")  # an upstream line, e.g. workers/fsdp_workers.py:846 (a shim's where)


def _imports_verl(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "verl" or a.name.startswith("verl.") for a in node.names)
    return isinstance(node, ast.ImportFrom) and not node.level and bool(node.module) and \
        (node.module == "verl" or node.module.startswith("verl."))


def check_verl_room(s: Scan) -> list[Violation]:
    """verl knowledge outside rlbox.verl (and rlbox.resources, data): a module under rlbox.cluster named
    for verl (verl_*.py, a verl* package), an import of verl itself, a reference to a file of verl's source."""
    out = []
    move = f"move it into {PACKAGE}.verl (git mv, so merges follow the rename)"
    for m in s.modules.values():
        if any(m.name == x or m.name.startswith(x + ".") for x in (f"{PACKAGE}.verl", f"{PACKAGE}.resources")):
            continue
        if m.name.startswith(f"{PACKAGE}.cluster.") and any(part.startswith("verl") for part in m.name.split(".")[2:]):
            out.append(Violation(m.rel, 1, "verl", f"{m.name} is verl knowledge under rlbox/cluster; {move}"))
        for node in ast.walk(m.tree):
            if _imports_verl(node):
                out.append(Violation(m.rel, node.lineno, "verl", f"{m.name} imports verl itself; what runs in verl's "
                                     f"Python is a script under {PACKAGE}/verl/scripts/, what knows it a module of {PACKAGE}.verl"))
        text = (s.root.parent / m.rel).read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(), 1):
            found = VERL_SOURCE.search(line) or SOURCE_LINE.search(line)
            if found:
                out.append(Violation(m.rel, n, "verl", f"{m.name} names verl's source ({found.group(0)}): what knows "
                                     f"verl's code is {PACKAGE}.verl's (or data under {PACKAGE}/resources); {move}"))
    return sorted(out)


def test_verl_knowledge_lives_in_its_room(tree):
    violations = check_verl_room(tree)
    assert not violations, _report("verl", violations)
    assert f"{PACKAGE}.verl.validate" in tree.modules and f"{PACKAGE}.verl.scripts.verl_checks" in tree.modules
    for room in ("job", "tree", "forms", "steplog", "glossary", "outcome"):  # what the rule moved there
        assert f"{PACKAGE}.verl.{room}" in tree.modules, room


def test_no_import_cycles(tree):
    violations = check_cycles(tree)
    assert not violations, _report("cycles", violations)


def test_no_private_names_across_modules(tree):
    violations = check_private(tree)
    assert not violations, _report("private", violations)


def test_every_rlbox_import_resolves(tree):
    violations = check_resolves(tree)
    assert not violations, _report("resolves", violations)


def test_no_module_over_600_lines(tree):
    violations = check_sizes(tree, MAX_LINES)
    assert not violations, _report(f"size (at most {MAX_LINES} lines)", violations)


def test_no_cli_module_over_400_lines(tree):
    violations = check_sizes(tree, MAX_CLI_LINES, f"{PACKAGE}.cli")
    assert not violations, _report(f"size (at most {MAX_CLI_LINES} lines under rlbox/cli)", violations)


# ---------------------------------------------------------------------------------------------
# Self-checks: a synthetic package that breaks every rule once, and obeys it elsewhere.

SYNTHETIC = {
    "__init__.py": '__version__ = "0"\n',
    "core/__init__.py": "",
    "core/errors.py": (
        "def _helper():\n"
        "    pass\n"
        "def did_you_mean():\n"
        "    pass\n"
    ),
    # core -> image: a forbidden direction, from inside a function.
    "core/config.py": (
        "from rlbox.core.errors import did_you_mean\n"
        "def load():\n"
        "    from rlbox.image import matrix\n"
        "    return matrix\n"
    ),
    "registry/__init__.py": "",
    "registry/client.py": "import rlbox.core.errors\n",
    "image/__init__.py": "",
    # matrix <-> lockfile: a cycle, the second edge inside a function; plus a private attribute.
    "image/matrix.py": (
        "from rlbox.image import lockfile\n"
        "from rlbox.core import errors\n"
        "from rlbox.registry import client\n"
        "X = errors._helper()\n"
        "Y = errors.did_you_mean()\n"
    ),
    "image/lockfile.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from rlbox.cluster.plan import Plan\n"
        "def read():\n"
        "    from rlbox.image.matrix import X\n"
        "    return X\n"
    ),
    # render -> diff only under TYPE_CHECKING, diff -> render at runtime: no cycle.
    "image/render.py": (
        "import typing\n"
        "if typing.TYPE_CHECKING:\n"
        "    from rlbox.image.diff import Record\n"
        "else:\n"
        "    Record = None\n"
    ),
    "image/diff.py": "from . import render\nRecord = 1\n" + "x = 1\n" * 599,  # 601 lines
    "cluster/__init__.py": "",
    "cluster/plan.py": (
        "from rlbox.image import matrix as m\n"
        "Plan = m.Y\n"
    ),
    "cluster/preflight/__init__.py": "",
    "cluster/preflight/doctor.py": (
        "from ..plan import Plan\n"
        "from ...core.errors import _helper\n"
        "import rlbox.image.matrix\n"
        "Z = rlbox.image.matrix.lockfile.read\n"
        "W = rlbox.core.errors._helper\n"
    ),
    "training/__init__.py": "",
    "training/scripts/__init__.py": "",
    "training/scripts/stub.py": "import json\nfrom rlbox.core import errors\n",
    "training/serve.py": (
        "from .. import oneshot\n"
        "from rlbox.training.scripts import stub\n"
        "from rlbox.cluster.plan import Nope, Plan\n"
        "import rlbox.cluster.gone\n"
    ),
    "cli/__init__.py": "from rlbox.cli.main import main\n",
    "cli/main.py": "from rlbox import __version__\ndef main():\n    pass\n" + "# -\n" * 398,  # 401 lines
    "misc.py": "",  # in no layer
}


@pytest.fixture
def synthetic(tmp_path) -> Scan:
    root = tmp_path / "src"
    for rel, text in SYNTHETIC.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return scan(root)


def _where(violations: list[Violation]) -> list[str]:
    return [f"{v.path.removeprefix('src/rlbox/')}:{v.line}" for v in violations]


def test_self_check_layers(synthetic):
    found = check_layers(synthetic)
    assert _where(found) == [
        "core/config.py:3",  # core -> image, inside a function
        "image/lockfile.py:3",  # image -> cluster, under TYPE_CHECKING: still a layer violation
        "misc.py:1",  # in no layer
    ], "\n".join(map(str, found))
    assert "rlbox.core.config (core) imports rlbox.image.matrix (image); core may import only core, resources" \
        in found[0].detail
    assert "(under TYPE_CHECKING)" in found[1].detail
    assert "rlbox.misc is in no layer" in found[2].detail


def test_self_check_scripts(synthetic):
    found = check_scripts(synthetic)
    assert _where(found) == ["training/scripts/stub.py:2", "training/serve.py:2"], "\n".join(map(str, found))
    assert "may import nothing of rlbox" in found[0].detail and "never imported" in found[1].detail


def test_self_check_verl_room(tmp_path):
    files = {
        "__init__.py": "", "cluster/__init__.py": "", "cluster/preflight/__init__.py": "",
        "cluster/preflight/verl_own.py": "",  # named for verl, under cluster
        "cluster/plan.py": 'ENTRY = "python3 -m verl.trainer.main_ppo"\nimport verlish\n',  # a module name: fine
        "cluster/jobs.py": '"""Jobs.\n\nverl prints it (verl/utils/logger/aggregate_logger.py:42).\n"""\n',
        "training/__init__.py": "",
        "training/metrics.py": "def parse():\n    from verl.utils import logger\n    # see verl/trainer/main_ppo.py\n",
        "image/__init__.py": "", "image/standins.py": "import os, verl.trainer\n",
        "image/shims.py": 'WHERE = {"0.5.0": "utils/device.py:76-86"}\n',  # an upstream line
        "verl/__init__.py": "", "verl/steplog.py": "import verl\n# verl/utils/logger/aggregate_logger.py\n",
        "verl/scripts/__init__.py": "", "verl/scripts/checks.py": "from verl.trainer import main_ppo\n",
        "resources/__init__.py": "", "resources/standins/x/shim.py": "from verl.plugin import y  # verl/plugin/a.py:3\n",
    }
    for rel, text in files.items():
        (tmp_path / "rlbox" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "rlbox" / rel).write_text(text)
    found = check_verl_room(scan(tmp_path))
    assert [(v.path.removeprefix(f"{tmp_path.name}/rlbox/"), v.line, v.rule) for v in found] == [
        ("cluster/jobs.py", 3, "verl"),  # a docstring naming verl's source
        ("cluster/preflight/verl_own.py", 1, "verl"),  # named for verl
        ("image/shims.py", 1, "verl"),  # a shim's upstream line
        ("image/standins.py", 1, "verl"),  # import verl.trainer
        ("training/metrics.py", 2, "verl"),  # from verl.utils import ..., inside a function
        ("training/metrics.py", 3, "verl"),  # a comment naming verl's source
    ], "\n".join(map(str, found))
    assert "names verl's source (verl/utils/logger/aggregate_logger.py)" in found[0].detail
    assert "names verl's source (utils/device.py:76)" in found[2].detail
    assert "rlbox.image.standins imports verl itself" in found[3].detail


def test_self_check_cycles(synthetic):
    found = check_cycles(synthetic)
    assert len(found) == 1, "\n".join(map(str, found))  # render <-> diff via TYPE_CHECKING is none
    assert _where(found) == ["image/lockfile.py:5"]
    detail = found[0].detail
    assert detail.startswith("import cycle rlbox.image.lockfile -> rlbox.image.matrix -> rlbox.image.lockfile ")
    assert "src/rlbox/image/lockfile.py:5 -> rlbox.image.matrix" in detail
    assert "src/rlbox/image/matrix.py:1 -> rlbox.image.lockfile" in detail


def test_self_check_cycles_of_three():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _components(["a", "b", "c", "d"], graph) == [["d"], ["a", "b", "c"]]


def test_self_check_private(synthetic):
    found = check_private(synthetic)
    assert _where(found) == [
        "cluster/preflight/doctor.py:2",  # relative from-import of a private name
        "cluster/preflight/doctor.py:5",  # rlbox.core.errors._helper through `import rlbox.image.matrix`
        "image/matrix.py:4",  # errors._helper()
    ], "\n".join(map(str, found))
    assert "`from ...core.errors import _helper` reaches rlbox.core.errors._helper" in found[0].detail
    assert "`rlbox.core.errors._helper`" in found[1].detail
    assert "`errors._helper`" in found[2].detail


def test_self_check_resolves(synthetic):
    found = check_resolves(synthetic)
    assert _where(found) == [
        "training/serve.py:1",  # `from .. import oneshot`: rlbox.oneshot is no module, rlbox binds no oneshot
        "training/serve.py:3",  # Nope is not in rlbox.cluster.plan
        "training/serve.py:4",  # no module rlbox.cluster.gone
    ], "\n".join(map(str, found))
    assert "`from .. import oneshot`" in found[0].detail
    assert "`from rlbox.cluster.plan import Nope`" in found[1].detail
    assert "module rlbox.cluster.gone does not exist" in found[2].detail


def test_self_check_sizes(synthetic):
    found = check_sizes(synthetic, MAX_LINES)
    assert [str(v) for v in found] == [
        "src/rlbox/image/diff.py:1: [size] 601 lines, over the 600-line limit for a module under rlbox; "
        "split it by responsibility"
    ]
    found = check_sizes(synthetic, MAX_CLI_LINES, f"{PACKAGE}.cli")
    assert _where(found) == ["cli/main.py:1"] and "401 lines, over the 400-line limit" in found[0].detail
