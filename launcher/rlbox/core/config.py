"""Config files as data: YAML read strictly, pydantic models that forbid unknown keys, and
validation errors turned into one line naming the file, the field and the nearest real key.

Every manifest, profile and spec rlbox reads (images/*.yaml, mirrors, hardware, cluster files,
recipes, datasets, signatures) goes through here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlbox.core.errors import RlboxError, did_you_mean


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def control_char(text: str) -> str | None:
    """The first control character of ``text`` (newline, tab, escape, ...), or None. A compiled
    character class: every string of every manifest and lock passes here (a per-character loop
    made `rlbox images list` spend 1 s in it)."""
    found = _CONTROL.search(text)
    return found.group() if found else None


def one_line(value: Any, at: str = "") -> Any:
    """``value`` (a string, or lists and mappings of them) when no string in it holds a control
    character; else ValueError naming it and where below the field it is (``a2-arm.git.vllm.version``).
    Manifest and lock strings reach rendered files (Dockerfiles, labels, shell lines): a newline
    there would be a new instruction."""
    if isinstance(value, str):
        bad = control_char(value)
        if bad is not None:
            where = f" at {at[1:]}" if at else ""
            raise ValueError(f"control character U+{ord(bad):04X}{where} in {value[:60]!r}; "
                             "a value here is one line of printable text")
    elif isinstance(value, dict):
        for k, v in value.items():
            one_line(k, at)
            one_line(v, f"{at}.{str(k)[:60]}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            one_line(v, f"{at}.{i}")
    return value


class Strict(BaseModel):
    """A config record: unknown keys are errors, values are frozen, strings are one line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _one_line(cls, value: Any) -> Any:
        return one_line(value)


def rel(path: Path, root: Path) -> str:
    """``path`` as the user knows it: relative to the tree when inside it."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


# Bounds of every file rlbox reads back: a file past them is refused in one line, before any
# model sees it (no RecursionError, no billion laughs, no gigabyte of JSON read into memory).
MAX_BYTES = 8 * 1024 * 1024  # a lock or record file
MAX_YAML_BYTES = 1024 * 1024  # a YAML config file (manifests are tens of KB)
MAX_DEPTH = 64  # nesting of mappings and lists
MAX_NODES = 100_000  # values once YAML aliases are expanded (billion laughs: 10**9)
CLUSTER_NODES = 4096  # nodes (hosts, pods) of one cluster: the one limit of --nodes, --hosts and cluster files


class _UniqueKeys(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml when built with it: 10x faster
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last)
    and a document nested deeper than MAX_DEPTH (checked while composing, so parsing stops there:
    PyYAML's scanner slows down with every open level)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise RlboxError(f"{self.name}:{self.peek_event().start_mark.line + 1}: nested deeper than "
                                 f"{MAX_DEPTH} levels; flatten the file")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports unhashable keys
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {str(key)[:60]!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def _flow_depth(text: str) -> int:
    """An upper bound of how deeply ``[``/``{`` nest in YAML text, quoted strings and comments
    skipped: PyYAML's scanner looks ahead through every open flow level before it yields one token,
    so a file of many thousand ``[`` must be refused before it is parsed."""
    depth = deepest = 0
    quote = None
    prev = "\n"
    comment = False
    for c in text:
        if comment:
            comment = c != "\n"
        elif quote:
            if c == quote:
                quote = None
        elif c in "\"'" and prev in " \t\n[{,:":
            quote = c
        elif c == "#" and prev in " \t\n":
            comment = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(0, depth - 1)
        prev = c
    return deepest


def _expanded_size(root: yaml.Node, where: str) -> None:
    """Refuse a YAML node graph deeper than MAX_DEPTH or holding more than MAX_NODES values once
    its aliases are expanded. Iterative, and each distinct node is sized once (aliases are shared
    nodes), so a billion laughs is refused after a few hundred steps."""
    size: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            raise RlboxError(f"{where}:{node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels; "
                             "flatten the file")
        kids = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if done:
            on_path.discard(id(node))
            size[id(node)] = 1 + sum(size.get(id(k), 1) for k in kids)
            if size[id(node)] > MAX_NODES:
                raise RlboxError(f"{where}: more than {MAX_NODES} values once its aliases (*name) are expanded; "
                                 "a config file this size is a mistake or an attack (billion laughs)")
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            raise RlboxError(f"{where}: an alias refers to itself; remove the recursive alias")
        if len(size) + len(on_path) > MAX_NODES:
            raise RlboxError(f"{where}: more than {MAX_NODES} values; a config file this size is a mistake")
        on_path.add(id(node))
        stack.append((node, depth, True))
        stack.extend((k, depth + 1, False) for k in kids if id(k) not in size)


def read_text(path: Path, where: str | None = None) -> str:
    """A text file as UTF-8; unreadable or not UTF-8 is one line naming the file."""
    where = where or str(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RlboxError(f"{where}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
                         "save it as UTF-8") from None
    except OSError as err:
        raise RlboxError(f"{where}: cannot read ({err.strerror})") from None


def load_yaml(text: str, where: str) -> Any:
    """YAML text parsed strictly (safe types, no duplicate keys); a problem is one line
    ``WHERE:LINE: problem``."""
    if len(text) > MAX_YAML_BYTES:
        raise RlboxError(f"{where}: {len(text)} characters, over the {MAX_YAML_BYTES} a YAML config file may have")
    if _flow_depth(text) > MAX_DEPTH:
        raise RlboxError(f"{where}: nested deeper than {MAX_DEPTH} levels; flatten the file")
    loader = _UniqueKeys(text)  # a SafeLoader subclass
    loader.name = where
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, where)
        return loader.construct_document(node)
    except RecursionError:
        raise RlboxError(f"{where}: nested too deeply to read; flatten the file") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise RlboxError(f"{where}{line}: {problem}; fix the YAML syntax") from None
    finally:
        loader.dispose()


def read_yaml(path: Path, root: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; any problem is one line naming the file."""
    where = rel(path, root)
    data = load_yaml(read_text(path, where), where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RlboxError(f"{where}: expected a mapping at the top level")
    return data


def depth_of(data: Any) -> int:
    """How deeply mappings and lists nest in ``data`` (a scalar is 0); iterative, so any depth is
    measured without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        kids = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else None
        if kids is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((k, depth + 1) for k in kids)
    return deepest


def load_json(text: str, where: str, limit: int = MAX_BYTES) -> Any:
    """JSON text parsed within the bounds (size, depth); a problem is one line naming ``where``."""
    if len(text) > limit:
        raise RlboxError(f"{where}: {len(text)} characters, over the {limit} a record may have")
    try:
        data = json.loads(text)
    except RecursionError:
        raise RlboxError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise RlboxError(f"{where}: not valid JSON ({str(err)[:120]})") from None
    if depth_of(data) > MAX_DEPTH:
        raise RlboxError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return data


def load_file(path: Path, model: type[BaseModel], where: str | None = None, *, fmt: str | None = None):
    """The one way a file rlbox reads back becomes data: read (UTF-8, bounded size), parsed (JSON
    or YAML by suffix, bounded depth and alias expansion) and validated through ``model``. Any
    problem is one line ``WHERE: field.path: what is expected``."""
    where = where or str(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise RlboxError(f"{where}: {path.stat().st_size} bytes, over the {MAX_BYTES} rlbox reads")
    except OSError as err:
        raise RlboxError(f"{where}: cannot read ({err.strerror})") from None
    text = read_text(path, where)
    fmt = fmt or ("json" if path.suffix == ".json" else "yaml")
    data = load_json(text, where) if fmt == "json" else load_yaml(text, where)
    if data is None:
        data = {}
    return validate(model, data, where)


# ---------------------------------------------------------------------------------------------
# Field types shared by every schema: what a value must be to reach its consumer.

INT32 = 2**31 - 1
HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")
# git sources may be served by a git daemon (git://) or over ssh; never ext:: or fd:: (git runs a command)
URL_SCHEMES = ("https", "http", "file", "git", "ssh")


def _matching(pattern: re.Pattern, what: str):
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            shown = value if len(value) <= 80 else value[:80] + "..."
            raise ValueError(f"{shown!r} is not {what}")
        return value
    return check


def redact_url(url: str) -> str:
    """A URL as it may be printed: user and password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return parts._replace(netloc=f"***@{host}{port}").geturl()


_SPACE = re.compile(r"\s")


def _url(value: str) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"{redact_url(value)!r} is not a URL") from None
    if parts.scheme not in URL_SCHEMES:
        raise ValueError(f"{redact_url(value)!r}: URL scheme must be one of {', '.join(URL_SCHEMES)}")
    if parts.scheme != "file" and not parts.hostname:
        raise ValueError(f"{redact_url(value)!r}: URL has no host")
    if _SPACE.search(value) or value.startswith("-"):
        raise ValueError(f"{redact_url(value)!r}: a URL has no spaces and does not start with '-'")
    return value


def check_url(value: str, what: str) -> str:
    """``value`` when it is a URL of the kinds rlbox takes (URL_SCHEMES, a host, one word, not an
    option); else RlboxError ``WHAT: why`` (credentials in it never printed)."""
    try:
        return _url(value)
    except ValueError as err:
        raise RlboxError(f"{what}: {err}") from None


Commit = Annotated[str, AfterValidator(_matching(HEX40, "a full git commit (40 lower-case hex digits)"))]
Sha256 = Annotated[str, AfterValidator(_matching(HEX64, "a sha256 (64 lower-case hex digits)"))]
Digest = Annotated[str, AfterValidator(_matching(re.compile(r"sha256:[0-9a-f]{64}"),
                                                  "an image digest (sha256: and 64 hex digits)"))]
Url = Annotated[str, AfterValidator(_url)]
Int32 = Annotated[int, Field(ge=-INT32 - 1, le=INT32)]
Text = Annotated[str, Field(max_length=4096)]


def merge(base: Any, over: Any) -> Any:
    """Deep merge: mappings key by key, ``None`` deletes, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value)
            else:
                out[key] = value
        return out
    return over


def _model_at(model: type[BaseModel] | None, loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that holds the last element of ``loc`` (for key suggestions)."""
    for part in loc[:-1]:
        if model is None:
            return None
        if isinstance(part, str) and part in model.model_fields:
            ann = model.model_fields[part].annotation
            args = getattr(ann, "__args__", ())
            nested = [a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
            model = nested[0] if nested else None
            if model is None and args:  # dict[str, Model] or list[Model]: the next part is the key
                values = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
                model = values[0] if values else None
    return model


def error_line(err: ValidationError, where: str, model: type[BaseModel]) -> str:
    """The first problem of a validation error as ``WHERE: field.path: what``; an unknown key
    names the nearest real key and every allowed one."""
    errors = err.errors()
    # An unknown key first: a misspelt key (`hots:`) also makes the real one missing.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(first["loc"])
    path = ".".join(str(p) for p in loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        holder = _model_at(model, loc)
        choices = list(holder.model_fields) if holder else []
        msg = f"unknown key{did_you_mean(str(loc[-1]), choices)}"
        if choices:
            msg += f"; allowed: {', '.join(choices)}"
    elif first["type"] == "missing":
        msg = "missing; this field is required"
    else:
        msg = first["msg"].removeprefix("Value error, ")
        if first["type"].endswith(("_type", "_parsing")):  # the kind found, never the value (a file's text)
            msg += f", got {type(first.get('input')).__name__}"
    more = len(err.errors()) - 1
    return f"{where}: {path}: {msg}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")


def validate(model: type[BaseModel], data: Any, where: str):
    """``data`` as ``model``, or RlboxError with ``error_line``."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RlboxError(error_line(err, where, model)) from None


def validate_named(model: type[BaseModel], entries: dict[str, Any], where: str, key: str) -> dict[str, Any]:
    """Each ``NAME: {...}`` under ``key`` of a file as ``model``; a problem names ``key.NAME.field``."""
    if not isinstance(entries, dict):
        raise RlboxError(f"{where}: {key}: Input should be a valid dictionary (NAME: ...), got {type(entries).__name__}")
    out = {}
    for name, body in entries.items():
        try:
            out[name] = model.model_validate(body or {})
        except ValidationError as err:
            raise RlboxError(error_line(err, where, model).replace(": ", f": {key}.{name}.", 1)) from None
    return out


# An environment variable's name as Kubernetes' API server takes it (validation.IsEnvVarName); Docker
# takes these too. Every --env key is held to it, whichever backend the run goes to.
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def env_name_problem(key: object) -> str | None:
    if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
        return (f"{str(key)[:60]!r} is not an environment variable name (letters, digits, '_', '-', '.'; "
                "not starting with a digit)")
    return None


def parse_env(items: list[str] | tuple[str, ...], flag: str = "--env") -> dict[str, str]:
    """``--env KEY=VALUE`` items: KEY=VALUE pairs whose keys are environment variable names."""
    out = parse_pairs(list(items), flag)
    for key in out:
        problem = env_name_problem(key)
        if problem:
            raise RlboxError(f"{flag}: {problem}")
    return out


def parse_pairs(items: list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` items of a repeated command-line option, in order; one line for a bad one."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RlboxError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out
