"""`rlbox data`: the seeds' training data, prepared inside the training image.

Recipes are data (datasets.yaml beside this file). Planning here is pure: the endpoint decides
every URL, a custom spec file is checked, and the plan renders to the exact `docker run` that
--dry-run prints. Carrying it out is one container of the image (oneshot.py) running
scripts/in_image.py with the output folder (and a custom input's folder, read-only) mounted at the
same paths, on the host network.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlbox.cluster.spec import Mount
from rlbox.core.config import load_yaml, read_text, validate
from rlbox.core.errors import RlboxError, did_you_mean
from rlbox.core.paths import RESOURCES
from rlbox.training.oneshot import OneShot

RECIPES = RESOURCES / "datasets.yaml"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "in_image.py"  # the datasets step inside the image

ENDPOINTS = {
    "hf": "https://huggingface.co",
    "hf-mirror": "https://hf-mirror.com",
    "modelscope": "https://www.modelscope.cn",
}


class FileRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str
    path: str
    save: str
    split: str | None = None
    modelscope: str | None = None


class Dataset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str
    source: str
    transform: Literal["gsm8k", "geo3k", "custom"] | None = None
    files: list[FileRef] = Field(default_factory=list)


class _Recipes(BaseModel):
    model_config = ConfigDict(extra="forbid")
    datasets: dict[str, Dataset]


def recipes() -> dict[str, Dataset]:
    return validate(_Recipes, load_yaml(read_text(RECIPES), str(RECIPES)), str(RECIPES)).datasets


def get(name: str) -> Dataset:
    known = recipes()
    if name not in known:
        raise RlboxError(f"unknown dataset '{name}'{did_you_mean(name, known)}; known: {', '.join(known)} (rlbox data list)")
    return known[name]


def url_for(f: FileRef, endpoint: str, dataset: str) -> str:
    """The download URL of one file for an endpoint name or an HF-compatible base URL."""
    if endpoint in ("hf", "hf-mirror"):
        return f"{ENDPOINTS[endpoint]}/datasets/{f.repo}/resolve/main/{f.path}"
    if endpoint == "modelscope":
        if not f.modelscope:
            raise RlboxError(f"dataset {dataset}: {f.repo}/{f.path} has no known ModelScope location; "
                             "use --endpoint hf, hf-mirror or an HF-compatible URL")
        return f"{ENDPOINTS['modelscope']}/api/v1/datasets/{f.modelscope}/repo?Revision=master&FilePath={f.path}"
    if re.match(r"^https?://[^/\s]+", endpoint):
        return f"{endpoint.rstrip('/')}/datasets/{f.repo}/resolve/main/{f.path}"
    raise RlboxError(f"--endpoint {endpoint!r}: give hf, hf-mirror, modelscope or an http(s):// URL")


# ---------------------------------------------------------------------------------------------
# The custom spec (seed 001 section 7.1.2, DianJin-R1-Data).

class GroundTruth(BaseModel):
    model_config = ConfigDict(extra="forbid")
    field: str | None = Field(None, description="field holding the text the ground truth is taken from (default: answer)")
    extract: list[str] = Field(default_factory=list, description="regexes applied in turn; each keeps group 1 of its first match")
    choices: str | None = Field(None, description="keep only these letters, in this order (multiple choice)")

    @field_validator("extract", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("extract")
    @classmethod
    def _compiles(cls, v):
        for p in v:
            try:
                re.compile(p)
            except re.error as err:
                raise ValueError(f"{p!r} is not a regular expression ({err})") from None
        return v


class CustomSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input: str = Field(description="JSON array or JSON Lines file; relative to the spec file")
    output: str = Field("train.parquet", description="under --out")
    split: str = "train"
    prompt: str = Field(description="field holding the question: prompt[0].content, role user")
    prompt_suffix: str = ""
    answer: str | None = Field(None, description="field holding the full answer, kept in extra_info.answer")
    ground_truth: GroundTruth = GroundTruth()
    data_source: str | None = Field(None, description="literal data_source (default: the input file's name)")
    data_source_field: str | None = None
    ability: str = "custom"
    ability_field: str | None = None
    reward_style: str = "rule"
    extra_info: dict[str, str] = Field(default_factory=dict, description="extra_info key -> field")
    skip_unmatched: bool = False


def load_spec(path: Path) -> tuple[CustomSpec, Path]:
    """The spec and its input file's absolute path."""
    data = load_yaml(read_text(path, f"--spec {path}"), str(path))
    if not isinstance(data, dict):
        raise RlboxError(f"{path}: expected a mapping (input:, prompt:, answer:, ground_truth:, ...)")
    spec = validate(CustomSpec, data, str(path))
    if not spec.ground_truth.field and not spec.answer:
        raise RlboxError(f"{path}: ground_truth.field: say which field the ground truth comes from (or give answer:)")
    source = Path(spec.input).expanduser()
    source = (path.parent / source).resolve() if not source.is_absolute() else source
    if not source.is_file():
        raise RlboxError(f"{path}: input: {source} does not exist")
    return spec, source


def _mapping(spec: CustomSpec, source: Path) -> dict:
    return {
        "prompt": spec.prompt,
        "prompt_suffix": spec.prompt_suffix,
        "answer": spec.answer,
        "ground_truth": {"field": spec.ground_truth.field or spec.answer, "extract": spec.ground_truth.extract,
                         "choices": spec.ground_truth.choices},
        "data_source": spec.data_source or source.name,
        "data_source_field": spec.data_source_field,
        "ability": spec.ability,
        "ability_field": spec.ability_field,
        "reward_style": spec.reward_style,
        "extra_info": spec.extra_info,
        "split": spec.split,
        "skip_unmatched": spec.skip_unmatched,
    }


# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataPlan:
    dataset: str
    recipe: Dataset
    out: Path
    endpoint: str
    overwrite: bool
    steps: tuple[dict, ...]
    job: OneShot

    def describe(self) -> str:
        lines = [f"# rlbox data prepare {self.dataset}: {self.recipe.description}",
                 f"# source: {self.recipe.source}",
                 f"# endpoint: {self.endpoint}; output folder {self.out}"
                 + ("; existing files are replaced (--overwrite)" if self.overwrite else "; existing files are skipped")]
        for s in self.steps:
            what = f"{s['transform']} {s.get('split', '')}".strip() if s.get("transform") else "download"
            origin = s.get("url") or s.get("input")
            lines.append(f"#   {self.out / s['save']}  <-  {what}: {origin}")
        lines.append(self.job.docker_run(("python3", "-c", f"<{SCRIPT.name}>", "<plan JSON>")))
        lines.append(f"# plan JSON: {self.job.argv[-1]}")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"dataset": self.dataset, "source": self.recipe.source, "out": str(self.out), "endpoint": self.endpoint,
                "overwrite": self.overwrite, "steps": [dict(s) for s in self.steps], "container": self.job.as_dict()}


def plan(name: str, *, image: str, out: Path, endpoint: str, overwrite: bool, spec_path: Path | None) -> DataPlan:
    recipe = get(name)
    out = out.expanduser().resolve()
    mounts = [Mount(str(out), str(out))]
    steps: list[dict] = []
    if recipe.transform == "custom":
        if spec_path is None:
            raise RlboxError("dataset custom needs --spec FILE (a YAML mapping: input, prompt, answer, ground_truth, ...)")
        spec, source = load_spec(spec_path)
        mounts.append(Mount(str(source.parent), str(source.parent), True))
        steps.append({"save": spec.output, "input": str(source), "transform": "custom", "mapping": _mapping(spec, source)})
    else:
        if spec_path is not None:
            raise RlboxError(f"--spec goes with the custom dataset, not {name}")
        for f in recipe.files:
            step = {"save": f.save, "url": url_for(f, endpoint, name)}
            if recipe.transform:
                step |= {"transform": recipe.transform, "split": f.split or "train"}
            steps.append(step)
    for s in steps:
        if os.path.isabs(s["save"]) or ".." in Path(s["save"]).parts:
            raise RlboxError(f"output {s['save']!r} must stay under --out")
    doc = {"out": str(out), "overwrite": overwrite, "steps": steps}
    job = OneShot(name=f"rlbox-data-{re.sub(r'[^a-z0-9-]', '-', name.lower())}", image=image,
                  argv=("python3", "-c", SCRIPT.read_text(encoding="utf-8"), json.dumps(doc)),
                  mounts=tuple(mounts), task="data", labels=(("io.rlbox.dataset", name),))
    return DataPlan(name, recipe, out, endpoint, overwrite, tuple(steps), job)


def execute(p: DataPlan, client, emit) -> list[str]:
    """Run the plan's container; the "rlbox-data:" lines it printed (error raised as one line)."""
    from rlbox.training import oneshot

    p.out.mkdir(parents=True, exist_ok=True)
    said: list[str] = []

    def line(text: str) -> None:
        if text.startswith("rlbox-data: "):
            said.append(text.removeprefix("rlbox-data: "))
            if not said[-1].startswith("error: "):
                emit(said[-1])

    result = oneshot.run(client, p.job, where="local", emit=line)
    if result.exit_code != 0:
        errors = [s.removeprefix("error: ") for s in said if s.startswith("error: ")]
        if errors:
            raise RlboxError(f"data prepare {p.dataset}: {errors[-1]}", exit_code=result.exit_code)
        raise RlboxError(f"data prepare {p.dataset}: the container of {p.job.image} exited with "
                         f"{result.exit_code}: {result.last_line}", exit_code=result.exit_code or 1)
    return said
