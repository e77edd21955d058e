#!/usr/bin/env python3
"""imports.py [--path DIR]... [--first-party NAME]... [--hide NAME]... [--runtime MODULE]... MODULE...:
import every module a program reaches from its entry MODULEs, and say which import and why not
(JSON on stdout).

--runtime MODULE: a module the program imports at run time (its workers, rollout, reward), checked
  like an entry when this version has it ("absent" otherwise).
--hide NAME: NAME cannot be imported (as on a host without it): a rehearsal hides torch_npu, whose
  native library needs the CANN runtime; a module that needs it then fails as "npu-runtime".
Modules reached only through imports inside functions are "lazy": the program imports them only
when it takes that path, so their failures are listed, apart.

"Reached" is read from the source, not guessed: every `import`/`from … import` anywhere in a
first-party module (verl, recipe, verl_npu, … as given), functions included (fsdp_workers imports
its rollout inside a method), followed through first-party modules; third-party modules are
imported as named (`from vllm.lora.request import X` imports vllm.lora.request). Each module is
then imported, in this process, in the order found. A failure is:
  - "npu-runtime" when what failed is the NPU runtime (torch_npu's native library, CANN's acl,
    libascend_*): a rehearsal on a CANN stand-in cannot load it, so the module is skipped, listed;
  - "optional" when every statement importing it sits in a `try` that catches ImportError (verl's
    optional backends): the program runs without it;
  - "conditional" when every statement importing it sits in an `if` (or such a `try`): the
    importing module chose its branch at run time, and imported (or not) on its own;
  - "error" otherwise: the image is missing something the program needs.
"""
import ast
import importlib
import importlib.util
import json
import re
import sys
import traceback


args = sys.argv[1:]
first_party, entries, runtime, hidden = set(), [], [], set()
while args:
    a = args.pop(0)
    if a == "--path":
        sys.path.insert(0, args.pop(0))
    elif a == "--first-party":
        first_party.add(args.pop(0))
    elif a == "--runtime":
        runtime.append(args.pop(0))
    elif a == "--hide":
        hidden.add(args.pop(0))
    else:
        entries.append(a)
first_party |= {e.split(".")[0] for e in entries}


for name in hidden:  # as on a host without it: find_spec says None, `import` raises ModuleNotFoundError
    sys.modules[name] = None


absent = []
for name in runtime:
    try:
        found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError as err:  # a parent package this version does not have is absence too
        found = not (err.name and (name == err.name or name.startswith(err.name + ".")))
    except (ImportError, ValueError, AttributeError):
        found = True  # its package fails to import: the import below says why
    (entries.append(name) if found else absent.append(name))


def source_of(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None, False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None, False
    return spec.origin, bool(spec.submodule_search_locations)


def imports_in(path, module, is_pkg):
    """(name, guarded, lazy) for every import statement in the file."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (SyntaxError, UnicodeDecodeError):
        return []
    guarded_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            catches = {ast.unparse(h.type) if h.type else "BaseException" for h in node.handlers}
            if any(c in ("ImportError", "ModuleNotFoundError", "Exception", "BaseException") or "ImportError" in c
                   for c in catches):
                for inner in node.body:
                    guarded_nodes |= {id(n) for n in ast.walk(inner)}
    lazy_nodes, cond_nodes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            lazy_nodes |= {id(n) for n in ast.walk(node) if n is not node}
        if isinstance(node, ast.If):  # `if is_nvtx_available(): from .nvtx_profile import ...`
            for inner in node.body + node.orelse:
                cond_nodes |= {id(n) for n in ast.walk(inner)}
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        guarded = id(node) in guarded_nodes or id(node) in cond_nodes and "cond"
        lazy = id(node) in lazy_nodes
        if isinstance(node, ast.Import):
            out += [(a.name, guarded, lazy) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod:
                continue
            out.append((mod, guarded, lazy))
            for a in node.names:  # `from pkg import submodule`
                out.append((f"{mod}.{a.name}", guarded, lazy))
    return out


order, guards, eager = [], {}, set()
edges = {}
queue = [(e, False) for e in entries]
seen = set()
while queue:
    name, lazy = queue.pop(0)
    if not lazy:
        eager.add(name)
    if name in seen:
        continue
    seen.add(name)
    order.append(name)
    top = name.split(".")[0]
    path, is_pkg = source_of(name) if top in first_party else (None, False)
    edges[name] = imports_in(path, name, is_pkg) if path else []
    for dep, guarded, dep_lazy in edges[name]:
        guards.setdefault(dep, []).append(guarded)
        queue.append((dep, lazy or dep_lazy))
# required: reached from an entry by unconditional, unguarded module-level imports only
required, frontier = set(entries), list(entries)
while frontier:
    name = frontier.pop()
    for dep, guarded, dep_lazy in edges.get(name, []):
        if not dep_lazy and not guarded and dep not in required:
            required.add(dep)
            frontier.append(dep)
# a module reached lazily first may be reached eagerly through another path: close over eager edges
frontier = list(eager)
while frontier:
    name = frontier.pop()
    for dep, _, dep_lazy in edges.get(name, []):
        if not dep_lazy and dep not in eager:
            eager.add(dep)
            frontier.append(dep)


NPU_RUNTIME = re.compile(r"torch_npu|libascend\w*|libhccl|libacl\w*|libge_runner|libtorch_npu|ascend-toolkit"
                         r"|No module named '(acl|torchair|llm_datadist|te|tbe)'|import of torch_npu halted")
results = {}
for name in order:
    parent = name.rpartition(".")[0]
    if parent and results.get(parent, {}).get("state", "ok") != "ok":
        continue  # its package failed: that line says why
    if parent and name not in entries:
        try:
            if importlib.util.find_spec(name) is None:
                continue  # `from pkg import attr`: an attribute, not a module
        except ModuleNotFoundError:
            continue
        except BaseException:  # noqa: BLE001 - the parent's own failure is reported below
            pass
    try:
        importlib.import_module(name)
        results[name] = {"state": "ok"}
    except BaseException as err:  # noqa: BLE001 - any failure of a module at import is a result
        if isinstance(err, KeyboardInterrupt):
            raise
        text = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()[-1][:300]
        chain = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        if NPU_RUNTIME.search(chain):
            state = "npu-runtime"
        elif name in required:
            state = "error"
        elif guards.get(name) and all(g is True for g in guards[name]):
            state = "optional"
        elif name in eager:
            state = "conditional"  # reached only through a branch (`if is_nvtx_available():`) or a `try`
        else:
            state = "error"
        results[name] = {"state": state, "error": text}
    results[name]["reached"] = "import" if name in eager else "lazy"
for name in absent:
    results[name] = {"state": "absent", "reached": "runtime", "error": "not in this version"}
json.dump({"entries": entries, "hidden": sorted(hidden), "modules": results}, sys.stdout, indent=1)
