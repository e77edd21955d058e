#!/usr/bin/env python3
"""imports.py [--path DIR]... [--first-party NAME]... MODULE...: import every module a program
reaches from its entry MODULEs, and say which import and why not (JSON on stdout).

"Reached" is read from the source, not guessed: every `import`/`from … import` anywhere in a
first-party module (verl, recipe, verl_npu, … as given), functions included (fsdp_workers imports
its rollout inside a method), followed through first-party modules; third-party modules are
imported as named (`from vllm.lora.request import X` imports vllm.lora.request). Each module is
then imported, in this process, in the order found. A failure is:
  - "npu-runtime" when what failed is the NPU runtime (torch_npu's native library, CANN's acl,
    libascend_*): a rehearsal on a CANN stand-in cannot load it, so the module is skipped, listed;
  - "optional" when every statement importing it sits in a `try` that catches ImportError (verl's
    optional backends): the program runs without it;
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
first_party, entries = set(), []
while args:
    a = args.pop(0)
    if a == "--path":
        sys.path.insert(0, args.pop(0))
    elif a == "--first-party":
        first_party.add(args.pop(0))
    else:
        entries.append(a)
first_party |= {e.split(".")[0] for e in entries}


def source_of(name):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None, False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None, False
    return spec.origin, bool(spec.submodule_search_locations)


def imports_in(path, module, is_pkg):
    """(name, guarded) for every import statement in the file."""
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
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        guarded = id(node) in guarded_nodes
        if isinstance(node, ast.Import):
            out += [(a.name, guarded) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod:
                continue
            out.append((mod, guarded))
            for a in node.names:  # `from pkg import submodule`
                out.append((f"{mod}.{a.name}", guarded))
    return out


order, guards = [], {}
queue = list(entries)
seen = set()
while queue:
    name = queue.pop(0)
    if name in seen:
        continue
    seen.add(name)
    top = name.split(".")[0]
    path, is_pkg = source_of(name) if top in first_party else (None, False)
    order.append(name)
    if path:
        for dep, guarded in imports_in(path, name, is_pkg):
            guards.setdefault(dep, []).append(guarded)
            if dep not in seen:
                queue.append(dep)


NPU_RUNTIME = re.compile(r"torch_npu|libascend\w*|libhccl|libacl\w*|libge_runner|libtorch_npu|ascend-toolkit"
                         r"|No module named '(acl|torchair|llm_datadist|te|tbe)'")
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
        elif guards.get(name) and all(guards[name]):
            state = "optional"
        else:
            state = "error"
        results[name] = {"state": state, "error": text}
json.dump({"entries": entries, "modules": results}, sys.stdout, indent=1)
