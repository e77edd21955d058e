"""verl's own start-up checks, run by that verl's own code, for a verl rlbox has no proven rules for.

``scripts/verl_checks.py`` runs in a Python that has the verl that will run: inside the image
(``--image``), or in an environment rlbox makes once per verl release from its PyPI wheel and keeps
under the cache (``--verl-version``). It composes the job's config there, with the cluster size
given, calls what the job's entrypoint calls before its workers start (verl's ``validate_config``,
which builds verl's config dataclasses and runs their checks), and prints a JSON verdict: what ran,
what could not, and verl's own rejection with the file:line it came from. Reading that verdict
(``Verdict.parse``) and turning it into problems and notes is pure.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlbox.verl.outcome import NotRun, Problem
from rlbox.core.errors import RlboxError

SCRIPT = Path(__file__).resolve().parent / "scripts" / "verl_checks.py"
VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]{0,40}$")
TIMEOUT = 600


@dataclass(frozen=True)
class Verdict:
    """What verl's own checks said (the script's JSON line, typed at this boundary)."""

    verl: str
    ran: tuple[str, ...]
    could_not: tuple[str, ...]
    rejected: str | None
    where: str | None
    beyond: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, origin: str) -> "Verdict":
        return cls.parse_all(text, origin, 1)[0]

    @classmethod
    def parse_all(cls, text: str, origin: str, count: int) -> list["Verdict"]:
        """The last ``count`` JSON lines of the script's output, one verdict each."""
        lines = [ln for ln in text.strip().splitlines() if ln.startswith("{")][-count:]
        if len(lines) != count:
            raise RlboxError(f"verl's own checks in {origin} printed {len(lines)} verdict(s) for {count} request(s): "
                             f"{' '.join(text.split())[-200:]!r}")
        return [cls.one(line, origin) for line in lines]

    @classmethod
    def one(cls, line: str, origin: str) -> "Verdict":
        try:
            data = json.loads(line)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise RlboxError(f"verl's own checks in {origin} printed no verdict: {' '.join(line.split())[-200:]!r}")

        def text_of(key: str) -> str | None:
            value = data.get(key)
            return " ".join(value.split())[:600] if isinstance(value, str) else None

        def texts(key: str) -> tuple[str, ...]:
            value = data.get(key)
            return tuple(" ".join(v.split())[:300] for v in value if isinstance(v, str)) if isinstance(value, list) else ()

        return cls(text_of("verl") or "unknown", texts("ran"), texts("could_not"), text_of("rejected"), text_of("where"),
                   texts("beyond"))


def request(entry, overrides: list[str], nodes: int | None, npus: int | None, root: Path) -> dict:
    """The script's request; config folders relative to the folder holding ``verl/`` (``root``), so
    that the same request composes inside an image, whose verl lives elsewhere."""
    def rel(p: Path) -> str:
        return str(Path(p).resolve().relative_to(root.resolve()))

    return {"config_rel": rel(entry.config_dir), "search_rel": [rel(p) for p in entry.search],
            "config_name": entry.config_name, "overrides": list(overrides), "nodes": nodes, "npus": npus,
            "module": entry.module}


def problems(v: Verdict) -> list[Problem]:
    """verl's rejection, in verl's words, naming the verl that made it."""
    if not v.rejected:
        return []
    at = f" ({v.where})" if v.where else ""
    if (v.where or "").startswith("vllm/") or v.rejected.startswith("vLLM's"):  # the engine verl's rollout starts
        return [Problem(("verl",), f"vLLM rejects this as verl {v.verl}'s rollout server starts it{at}: {v.rejected}")]
    return [Problem(("verl",), f"verl {v.verl} rejects this at start-up{at}: {v.rejected}")]


def ran(v: Verdict) -> list[str]:
    return [f"verl {v.verl}'s own code: {r}" for r in v.ran]


def not_run(v: Verdict) -> list[NotRun]:
    """What verl's own checks could not run here, each with how to run it."""
    out = []
    for c in v.could_not:
        if "model's files" in c:
            how = "give the cluster (--hosts or --cluster) and the run's --mount holding the model, so that its small " \
                  "files are fetched from the head node, or put them at that path on this machine"
        elif "package this Python lacks" in c:
            how = "validate with --image: the image has the rollout engine"
        else:
            how = ""
        out.append(NotRun(f"verl {v.verl}'s own {c}" if not c.startswith("verl") else c, how))
    return out


def beyond(v: Verdict) -> list[str]:
    return [f"verl {v.verl}'s {b}" for b in v.beyond]


# ---------------------------------------------------------------------------------------------
# Where the script runs.

def cache_root() -> Path:
    from rlbox.core.paths import cache_dir

    return cache_dir()


def torch_pin() -> tuple[list[str], list[str]]:
    """A CPU torch wheel in pip's find-links folders (PIP_FIND_LINKS), pinned so that the environment
    does not pull a multi-GB CUDA torch: (requirements, uv options); none found: the index's torch."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        for wheel in sorted(Path(folder).glob(f"torch-*+cpu-{tag}-{tag}-*.whl")) if Path(folder).is_dir() else []:
            version = wheel.name.split("-")[1].split("+")[0]
            return [f"torch=={version}"], ["--find-links", folder]
    return [], []


def release_pins(version: str, root: Path | None = None) -> list[str]:
    """The locked set (``name==version``) of a release in rlbox's matrix whose image installs
    ``verl==version`` (images/*.yaml and their lock), torch and stand-ins left out: the environment of
    that verl then holds what the image holds (verl 0.5.0 needs numpy<2, and today's pyarrow and
    transformers do not fit it). None in the matrix (or no rlbox tree here): no pins."""
    from rlbox.core.paths import find_root
    from rlbox.image import matrix

    try:
        m = matrix.load(root or find_root())
    except RlboxError:
        return []
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    chosen = [v for v in m.variants if any(c.name == "verl" and c.spec.pip == f"verl=={version}" for c in v.components)
              and getattr(v, "lock", None) is not None]
    for variant in sorted(chosen, key=lambda v: (v.arch != arch, v.ref)):
        return sorted(f"{name}=={p['version']}" for name, p in variant.lock.pip.items()
                      if name not in ("torch", "verl") and not p.get("standin_for") and p.get("version"))
    return []


def env_plan(version: str, torch: tuple[list[str], list[str]], pins: list[str]) -> tuple[list[str], list[str], str]:
    """(requirements, uv options, stamp) of verl ``version``'s environment; the stamp names all of it,
    so a changed plan makes the environment again."""
    reqs, opts = torch
    stamp = " ".join([f"verl=={version}", *reqs, *(f"-c {p}" for p in pins)]) + "\n"
    return [f"verl=={version}", *reqs], opts, stamp


def env_python(version: str, echo=None) -> Path:
    """The Python of rlbox's cached environment for verl ``version``: made once with uv from the PyPI
    wheel and what it requires (held to the locked set of a release that installs that verl, a CPU
    torch where pip's find-links hold one), under a lock so that two validations at once share it."""
    if not VERSION.fullmatch(version):
        raise RlboxError(f"--verl-version {version!r} is not a version (e.g. 0.9.1)")
    from rlbox.core.once import made_once
    from rlbox.image.pylock import uv_bin

    dest = cache_root() / "verl-env" / version
    pins = release_pins(version)
    reqs, opts, stamp = env_plan(version, torch_pin(), pins)

    def make(folder: Path) -> None:
        uv = uv_bin()
        constraints = folder.parent / f"{folder.name}.constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        try:
            for argv in ([uv, "venv", "--quiet", "--allow-existing", "--python", sys.executable, str(folder)],
                         [uv, "pip", "install", "--quiet", "--python", str(folder / "bin" / "python"), *opts, *reqs,
                          *(["-c", str(constraints)] if pins else [])]):
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
                if proc.returncode != 0:
                    last = " ".join((proc.stderr.strip().splitlines() or ["failed"])[-1].split())[:240]
                    raise RlboxError(f"cannot make the environment of verl {version} for its own checks: {last}")
        finally:
            constraints.unlink(missing_ok=True)

    def say() -> None:
        if echo:
            echo(f"making the environment of verl {version} for its own checks (once; {dest})")

    made_once(dest, stamp, make, before=say)
    return dest / "bin" / "python"


def run_in_env(python: Path, req: dict) -> Verdict:
    return run_many_in_env(python, [req])[0]


def run_many_in_env(python: Path, reqs: list[dict]) -> list[Verdict]:
    """Several requests in one process (verl imported once): what a table of cases needs."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # warm runs reuse bytecode
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", RAY_USAGE_STATS_ENABLED="0")
    with tempfile.TemporaryDirectory() as cwd:  # nothing of the caller's folder shadows verl's imports
        proc = subprocess.run([str(python), str(SCRIPT), json.dumps(reqs)], capture_output=True, text=True,
                              cwd=cwd, env=env, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise RlboxError(f"verl's own checks failed to run in {python.parent.parent}: "
                         f"{' '.join((proc.stderr.strip().splitlines() or ['no output'])[-1].split())[:240]}")
    return Verdict.parse_all(proc.stdout, str(python.parent.parent), len(reqs))


def run_in_image(client, image: str, req: dict, mounts: tuple[tuple[str, str], ...] = ()) -> Verdict:
    return run_many_in_image(client, image, [req], mounts)[0]


def run_many_in_image(client, image: str, reqs: list[dict], mounts: tuple[tuple[str, str], ...] = ()) -> list[Verdict]:
    """The script in a throw-away container of ``image`` (no network), through its own entrypoint, one
    process for all ``reqs``; each request's ``model_root`` (a folder of this machine), when it has one,
    mounted read-only at the same path, and ``mounts`` ((source, target) on ``client``'s machine: the
    run's, so that the checks read the model where the job will) read-only."""
    from docker.errors import APIError, ContainerError
    from docker.types import Mount

    roots = sorted({r["model_root"] for r in reqs if r.get("model_root")})  # the model's small files fetched
    binds = [Mount(dst, src, type="bind", read_only=True) for src, dst in (*mounts, *((r, r) for r in roots))]
    try:  # a bind whose source is not there is refused by the engine (never made): one line, below
        out = client.containers.run(image, ["python3", "-c", SCRIPT.read_text(encoding="utf-8"), json.dumps(reqs)],
                                    remove=True, network_mode="none", mounts=binds,
                                    environment={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    except ContainerError as err:
        raise RlboxError(f"verl's own checks failed to run in {image}: {' '.join(str(err).split())[-240:]}") from None
    except APIError as err:
        raise RlboxError(f"verl's own checks could not start in {image}: {err.explanation or err}") from None
    return Verdict.parse_all(out.decode(errors="replace"), image, len(reqs))
