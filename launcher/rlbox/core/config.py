"""Config files as data: YAML read strictly, pydantic models that forbid unknown keys, and
validation errors turned into one line naming the file, the field and the nearest real key.

Every manifest, profile and spec rlbox reads (images/*.yaml, mirrors, hardware, cluster files,
recipes, datasets, signatures) goes through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rlbox.core.errors import RlboxError, did_you_mean


class Strict(BaseModel):
    """A config record: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def rel(path: Path, root: Path) -> str:
    """``path`` as the user knows it: relative to the tree when inside it."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def read_yaml(path: Path, root: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; any problem is one line naming the file."""
    where = rel(path, root)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise RlboxError(f"{where}{line}: {problem}; fix the YAML syntax") from None
    except OSError as err:
        raise RlboxError(f"{where}: cannot read ({err.strerror})") from None
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
    first = err.errors()[0]
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
