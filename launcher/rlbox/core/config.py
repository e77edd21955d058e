"""Config files as data: YAML read strictly, pydantic models that forbid unknown keys, and
validation errors turned into one line naming the file, the field and the nearest real key.

Every manifest, profile and spec rlbox reads (images/*.yaml, mirrors, hardware, cluster files,
recipes, datasets, signatures) goes through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from rlbox.core.errors import RlboxError, did_you_mean


def control_char(text: str) -> str | None:
    """The first control character of ``text`` (newline, tab, escape, ...), or None."""
    return next((c for c in text if ord(c) < 32 or 127 <= ord(c) < 160 or c in "\u2028\u2029"), None)


def one_line(value: Any) -> Any:
    """``value`` (a string, or lists and mappings of them) when no string in it holds a control
    character; else ValueError naming it. Manifest strings reach rendered files (Dockerfiles,
    labels, shell lines): a newline there would be a new instruction."""
    if isinstance(value, str):
        bad = control_char(value)
        if bad is not None:
            raise ValueError(f"control character U+{ord(bad):04X} in {value[:60]!r}; "
                             "a manifest value is one line of printable text")
    elif isinstance(value, dict):
        for k, v in value.items():
            one_line(k)
            one_line(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            one_line(v)
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


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last)."""

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
    try:
        return yaml.load(text, Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise RlboxError(f"{where}{line}: {problem}; fix the YAML syntax") from None


def read_yaml(path: Path, root: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; any problem is one line naming the file."""
    where = rel(path, root)
    data = load_yaml(read_text(path, where), where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RlboxError(f"{where}: expected a mapping at the top level")
    return data


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
    out = {}
    for name, body in entries.items():
        try:
            out[name] = model.model_validate(body or {})
        except ValidationError as err:
            raise RlboxError(error_line(err, where, model).replace(": ", f": {key}.{name}.", 1)) from None
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
