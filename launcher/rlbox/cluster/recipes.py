"""Recipes: the seeds' verl runs as data (launcher/rlbox/recipes/*.yaml), with paths as parameters.

``--recipe`` takes a shipped recipe's name (``rlbox recipes list``), or the path of a recipe file
of one's own (a value holding ``/`` or ending in ``.yaml``): that file is read through the same
strict ``Recipe`` schema (every key known, ``name:`` equal to the file's name), so any other YAML
is refused in one line, never run as a recipe.

A ``--param`` value is put into the recipe's Hydra overrides quoted for Hydra's override grammar
(rlbox.core.quote.hydra_value): ``/data/qwen,v2`` stays one path, never a sweep or a list.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rlbox.core import names, quote
from rlbox.core.config import load_yaml, read_text, validate
from rlbox.core.errors import RlboxError, did_you_mean
from rlbox.core.paths import RESOURCES
from rlbox.verl import forms
from rlbox.verl.forms import Migration

RECIPES_DIR = RESOURCES / "recipes"
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class Param(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: str
    help: str = ""


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str
    source: str
    release: str
    hardware: str
    nodes: int = Field(gt=0)
    max_restarts: int = Field(default=0, ge=0)  # `rlbox run --max-restarts` unless given
    devices: int | None = Field(default=None, gt=0)  # NPUs per node it is sized for (`--devices` unless given)
    entrypoint: list[str] = Field(min_length=1)
    working_dir: str | None = None
    params: dict[str, Param] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    overrides: list[str] = Field(default_factory=list)
    reaches: list[str] = Field(
        default_factory=list, description="modules the job imports at run time beyond what its entrypoint, "
        "workers, rollout and reward manager import (e.g. its reward function); `rlbox rehearse` imports them")
    notes: list[str] = Field(default_factory=list)
    releases: dict[str, Migration] = Field(
        default_factory=dict, description="release -> how the recipe's job changes on it (renamed keys, entrypoint)")

    def on(self, release: str) -> "Recipe":
        """This recipe as it runs on ``release``: its own release as written, another with its
        migration applied (keys renamed per that verl: ``verl.forms``), one without a migration unchanged."""
        mig = self.releases.get(release)
        if release == self.release or mig is None:
            return self
        return self.model_copy(update={"release": release, "releases": {},
                                       **forms.migrate(mig, self.overrides, self.entrypoint, self.working_dir)})

    def resolve(self, values: dict[str, str], extra: list[str]) -> tuple[list[str], dict[str, str]]:
        """argv and env with every {{param}} filled in; ``extra`` overrides replace same keys."""
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            raise RlboxError(
                f"recipe {self.name} has no parameter '{unknown[0]}'; it takes: {', '.join(self.params) or 'none'}"
            )
        filled = {k: values.get(k, p.default) for k, p in self.params.items()}

        def fill(text: str, as_value=lambda v, name: v) -> str:
            return _PLACEHOLDER.sub(lambda m: as_value(filled[m.group(1)], m.group(1)), text)

        def hydra(value: str, name: str) -> str:  # a param whose default is text stays text (a path, a name)
            return quote.hydra_value(value, string=not quote.HYDRA_NOT_STRING.fullmatch(self.params[name].default))

        try:  # a value in an override is one Hydra string, whatever it holds
            overrides = [fill(o, hydra) for o in self.overrides]
        except ValueError as err:
            raise RlboxError(f"--param: {err}") from None
        for e in extra:
            if not _OVERRIDE.fullmatch(e):
                raise RlboxError(f"--set {e}: not a Hydra override (KEY=VALUE, +KEY=VALUE, ++KEY=VALUE or ~KEY); "
                                 "options of the job go after -- in the command")
        keys = {_key(e) for e in extra}
        overrides = [o for o in overrides if _key(o) not in keys] + list(extra)
        return [*self.entrypoint, *overrides], {k: fill(v) for k, v in self.env.items()}


# a Hydra override: KEY=VALUE, +KEY=VALUE, ++KEY=VALUE, ~KEY[=VALUE]; a key or group path (a.b, a/b, a@pkg)
_OVERRIDE = re.compile(r"(?:~[A-Za-z_][\w./@-]*(?:=.*)?|(?:\+\+|\+)?[A-Za-z_][\w./@-]*=.*)", re.S)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def load(name: str) -> Recipe:
    """A shipped recipe by name, or a recipe file by path (see the module's doc)."""
    if "/" in name or name.endswith((".yaml", ".yml")):
        path = Path(name)
        if not path.is_file():
            raise RlboxError(f"--recipe {name}: no such file (a recipe file, or a name from `rlbox recipes list`)")
        return _parse(path)
    if not names.valid(name, "file"):
        raise RlboxError(f"unknown recipe {name[:60]!r}; see `rlbox recipes list` (or give a recipe file's path)")
    path = names.inside(RECIPES_DIR, f"{name}.yaml", what="--recipe")
    if not path.is_file():
        raise RlboxError(f"unknown recipe '{name}'{did_you_mean(name, names_available())}; see `rlbox recipes list`")
    return _parse(path)


def _parse(path: Path) -> Recipe:
    data = load_yaml(read_text(path), str(path))
    recipe = validate(Recipe, data, str(path))
    known = _releases()
    if known is not None:  # every release it names is one of the matrix (images/RELEASE.yaml)
        for field, release in [("release", recipe.release), *(("releases", r) for r in recipe.releases)]:
            if release not in known:
                raise RlboxError(f"{path}: {field}: no release {release[:60]!r} in images/"
                                 f"{did_you_mean(release, known)}; releases: {', '.join(sorted(known))}")
    for text in [*recipe.overrides, *recipe.env.values()]:
        for m in _PLACEHOLDER.finditer(text):
            if m.group(1) not in recipe.params:
                raise RlboxError(f"{path}: placeholder {{{{{m.group(1)}}}}} has no entry under params")
    if recipe.name != path.stem:
        raise RlboxError(f"{path}: name: must be '{path.stem}' (the file name)")
    return recipe


def _releases() -> set[str] | None:
    """The releases of the tree's matrix (images/RELEASE.yaml), or None with no tree to read."""
    from rlbox.core.paths import find_root
    from rlbox.image.matrix import release_names

    try:
        return release_names(find_root())
    except RlboxError:
        return None


def names_available() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def all_recipes() -> list[Recipe]:
    return [_parse(RECIPES_DIR / f"{n}.yaml") for n in names_available()]
