"""Templates -> committed Dockerfiles: a pure function of the matrix, plus a staleness check.

Each variant renders two generated files under ``dockerfiles/<release>/<variant>/``:
``Dockerfile`` and ``image.json`` (the resolved manifest the image carries as
``/etc/rlbox/image.json``); the whole matrix renders the CI workflow that builds every image,
``.github/workflows/images.yml`` (workflow.py). ``check`` re-renders in memory and lists every
file that is missing, stale or no longer produced by the matrix (orphans: under dockerfiles/).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import jinja2

from .errors import RlboxError
from . import workflow
from .matrix import Matrix, ResolvedVariant


def _environment(root: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root / "templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["hwformat"] = _hardware_format
    return env


def _hardware_format(value: str, variant: ResolvedVariant) -> str:
    """Fill ``{soc_version}``/``{SOC_VERSION}``/``{chip}``/``{arch}`` in a component's build env."""
    hw = variant.hardware
    try:
        return value.format(
            soc_version=hw.soc_version, SOC_VERSION=hw.soc_version.upper(), chip=hw.chip, arch=variant.arch
        )
    except (KeyError, IndexError, ValueError) as err:
        raise RlboxError(
            f"{variant.manifest_rel}: component env value {value!r} has an unknown placeholder {err}; "
            "use {soc_version}, {SOC_VERSION}, {chip} or {arch}"
        ) from None


def image_json(variant: ResolvedVariant) -> str:
    return json.dumps(variant.as_dict(), indent=2, sort_keys=False) + "\n"


def dockerfile(variant: ResolvedVariant, env: jinja2.Environment | None = None) -> str:
    env = env or _environment(variant.root)
    try:
        text = env.get_template("Dockerfile.j2").render(v=variant)
    except jinja2.TemplateError as err:
        where = getattr(err, "filename", None) or "templates/Dockerfile.j2"
        line = f":{err.lineno}" if getattr(err, "lineno", None) else ""
        raise RlboxError(f"{Path(where).name}{line}: {err.message or err}; fix the template") from None
    # Collapse the blank lines that template control blocks leave behind.
    lines, blank = [], False
    for line in text.splitlines():
        if not line.strip():
            if not blank and lines:
                lines.append("")
            blank = True
            continue
        lines.append(line.rstrip())
        blank = False
    return "\n".join(lines).rstrip() + "\n"


def render_all(matrix: Matrix) -> dict[Path, str]:
    """Every generated file, keyed by its path relative to the tree's root."""
    env = _environment(matrix.root)
    out: dict[Path, str] = {}
    for v in matrix.variants:
        out[v.dockerfile] = dockerfile(v, env)
        out[v.dockerfile.parent / "image.json"] = image_json(v)
    out[workflow.PATH] = workflow.render(matrix)
    return out


@dataclass(frozen=True)
class Drift:
    path: Path
    state: str  # "missing", "stale" or "orphaned"


def check(matrix: Matrix, wanted: dict[Path, str] | None = None) -> list[Drift]:
    """Generated files that differ from ``wanted`` (rendered here unless given)."""
    root = matrix.root
    wanted = render_all(matrix) if wanted is None else wanted
    drift = []
    for rel, text in sorted(wanted.items()):
        path = root / rel
        if not path.exists():
            drift.append(Drift(rel, "missing"))
        elif path.read_text(encoding="utf-8") != text:
            drift.append(Drift(rel, "stale"))
    generated = root / "dockerfiles"
    if generated.is_dir():
        for path in sorted(generated.rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and rel not in wanted:
                drift.append(Drift(rel, "orphaned"))
    return drift


def write(matrix: Matrix) -> list[Path]:
    """Write every generated file; remove ones the matrix no longer produces. Returns changes."""
    root = matrix.root
    wanted = render_all(matrix)
    changed = []
    for drift in check(matrix, wanted):
        path = root / drift.path
        if drift.state == "orphaned":
            path.unlink()
            for parent in path.parents:
                if parent == root / "dockerfiles" or any(parent.iterdir()):
                    break
                parent.rmdir()
        changed.append(drift.path)
    for rel, text in wanted.items():
        path = root / rel
        if rel in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    return changed
