"""A recipe's job in the form another release's verl takes: what that verl renamed or moved (a
config key, the entrypoint, the working folder), read in that verl's own config and code, each with
its why. Recipes (cluster/recipes.py) name one ``Migration`` per release under ``releases:``; this
module is what such a migration means and how it turns one release's job into another's."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlbox.core import quote


class Migration(BaseModel):
    """The recipe on another release, whose verl renamed or moved what the recipe sets: read in that
    verl's own config and code, each with its why. Applied by ``migrate`` (``Recipe.on(release)``)."""

    model_config = ConfigDict(extra="forbid")
    why: str
    entrypoint: list[str] | None = Field(None, min_length=1)
    working_dir: str | None = Field(None, description="'' for none (a verl installed from its wheel has no source folder)")
    rename: dict[str, str] = Field(default_factory=dict, description="old key (or key prefix) -> new key; a leading + adds it")
    drop: dict[str, str] = Field(default_factory=dict, description="key -> why it is not set on that release")
    add: list[str] = Field(default_factory=list, description="overrides that release needs besides")

    @field_validator("rename")
    @classmethod
    def _keys_to_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for old, new in v.items():  # a key to a key: never a value, a space or a second override
            quote.hydra_key(old)
            quote.hydra_key(new, add=True)
        return v

    @field_validator("drop")
    @classmethod
    def _dropped_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            quote.hydra_key(key)
        return v

    @field_validator("add")
    @classmethod
    def _one_override_each(cls, v: list[str]) -> list[str]:
        for override in v:  # Hydra's grammar: one KEY=VALUE, one line, one value
            quote.hydra_override(override)
        return v


def renamed(override: str, mig: Migration) -> str | None:
    """One override as that release's verl takes it: its key renamed (a prefix too), None when dropped."""
    key, eq, value = override.partition("=")
    bare = key.lstrip("+~")
    for old in mig.drop:
        if bare == old or bare.startswith(old + "."):
            return None
    for old, new in mig.rename.items():
        if bare == old or bare.startswith(old + "."):
            target = new + bare[len(old):]
            return f"{target}{eq}{value}" if target.startswith("+") else f"{key[:len(key) - len(bare)]}{target}{eq}{value}"
    return override


def migrate(mig: Migration, overrides: list[str], entrypoint: list[str], working_dir: str | None) -> dict:
    """The job's overrides, entrypoint and working folder on the migration's release."""
    return {"overrides": [o for o in (renamed(o, mig) for o in overrides) if o is not None] + list(mig.add),
            "entrypoint": list(mig.entrypoint or entrypoint),
            "working_dir": (mig.working_dir or None) if mig.working_dir is not None else working_dir}
