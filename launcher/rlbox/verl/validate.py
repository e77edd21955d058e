"""Validate a verl job's Hydra overrides before a single NPU is claimed.

The config is composed with hydra-core's compose API over the config tree of **the verl that
will run**: extracted once from the image (cached by image id), or taken from a verl wheel of a
given version (PyPI, cached), or from a folder (a verl source checkout). Problems come back as one
line each, naming the key(s) and the rule; a typo'd key gets the nearest real key.

verl's start-up checks are that verl's own: at the two pinned commits rlbox's restatement
(``verl_rules``, proven identical to verl's own results by the table in tests/fixtures/verl_rules);
for any other verl, verl's own code run where that verl is (``verl_own``: the image, or an
environment made from the wheel). A source folder gets neither, and validation says so.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbox.verl import model_files, own as verl_own, rules as verl_rules
from rlbox.verl.outcome import NotRun, Outcome, Problem
from rlbox.core.errors import RlboxError, nearest
from rlbox.core.once import made_once

_HYDRA_MAIN = re.compile(r"@hydra\.main\(\s*config_path\s*=\s*[\"']([^\"']+)[\"']\s*,\s*config_name\s*=\s*[\"']([^\"']+)[\"']")


@dataclass(frozen=True)
class VerlTree:
    """A verl source or package tree: ``root/verl/trainer/config`` and maybe ``root/recipe``."""

    root: Path
    origin: str
    commit: str | None = None  # the verl commit, when known (an rlbox image's label, the release's pin)
    version: str | None = None  # a PyPI release (--verl-version): its own checks run in an environment made from it
    image: str | None = None  # the image the tree came from: its own checks run there

    @property
    def trainer_config(self) -> Path:
        return self.root / "verl" / "trainer" / "config"


# ---------------------------------------------------------------------------------------------
# Where the config comes from.

def from_folder(path: Path) -> VerlTree:
    path = path.resolve()
    for root in (path, path.parent, path.parent.parent.parent):
        if (root / "verl" / "trainer" / "config").is_dir():
            return VerlTree(root, str(path))
    raise RlboxError(f"--verl-config {path}: no verl/trainer/config below it (give a verl source checkout)")


def from_wheel(version: str) -> VerlTree:
    """verl's trainer config from its PyPI wheel (recipes are not in the wheel); made once, under a
    lock (two validations at once share it)."""
    if not verl_own.VERSION.fullmatch(version):
        raise RlboxError(f"--verl-version {version!r} is not a version (e.g. 0.9.1)")
    dest = verl_own.cache_root() / "verl" / f"wheel-{version}"

    def make(folder: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp,
                                   f"verl=={version}"], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("verl-*.whl"))
            if proc.returncode != 0 or not wheels:
                last = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise RlboxError(f"--verl-version {version}: cannot download verl=={version} ({last})")
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in wheel.namelist():
                    if name.startswith(TREE_PARTS) and name.endswith((".yaml", ".py")):
                        wheel.extract(name, folder)
        if not (folder / "verl" / "trainer" / "config").is_dir():
            raise RlboxError(f"--verl-version {version}: that wheel has no verl/trainer/config")

    made_once(dest, f"verl=={version}\n{' '.join(TREE_PARTS)}\n", make)
    return VerlTree(dest, f"verl {version} wheel", version=version)


# What of verl a validation reads: the trainer's config (and its entrypoints), the recipes, and the config
# dataclasses verl builds nodes into (their declared fields: declared_fields)
TREE_PARTS = ("verl/trainer/", "recipe/", "verl/workers/config/", "verl/base_config.py")

_FIND_VERL = ("import importlib.util as u, os; s = u.find_spec('verl'); "
              "print(os.path.dirname(list(s.submodule_search_locations)[0]) if s else '')")


def from_image(client, image: str) -> VerlTree:
    """The config tree of the verl inside ``image``, extracted once per image id."""
    from docker.errors import APIError, ContainerError, ImageNotFound, NotFound

    try:
        img = client.images.get(image)
    except ImageNotFound:
        raise RlboxError(f"image {image} is not on this engine; pull it first or pass --verl-version") from None
    dest = verl_own.cache_root() / "verl" / f"image-{img.id.split(':')[-1][:16]}"
    pin = (getattr(img, "labels", None) or {}).get("io.rlbox.component.verl", "")  # git+URL@COMMIT or verl==X
    commit = pin.rpartition("@")[2] if pin.startswith("git+") and "@" in pin else None

    def make(folder: Path) -> None:
        try:  # through the image's own entrypoint: it activates the environment python3 lives in
            out = client.containers.run(image, ["python3", "-c", _FIND_VERL], remove=True, network_mode="none")
        except ContainerError as err:
            raise RlboxError(f"cannot look for verl in {image}: python3 failed ({' '.join(str(err).split())[:160]})") from None
        except APIError as err:
            raise RlboxError(f"cannot look for verl in {image}: {err.explanation or err}") from None
        root = out.decode().strip().splitlines()[-1] if out.strip() else ""
        if not root:
            raise RlboxError(f"image {image} has no verl; validate with --verl-version or --verl-config")
        box = client.containers.create(image, command=["true"], entrypoint=[])
        try:
            for sub in ("verl/trainer", "recipe", "verl/workers/config", "verl/base_config.py"):
                try:
                    stream, _ = box.get_archive(f"{root}/{sub}")
                except NotFound:
                    continue
                target = folder / Path(sub).parent
                target.mkdir(parents=True, exist_ok=True)
                with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                    _extract(tar, target)
        finally:
            box.remove(force=True)
        if not (folder / "verl" / "trainer" / "config").is_dir():
            raise RlboxError(f"image {image}: verl at {root} has no trainer/config")

    made_once(dest, f"{img.id}\n{' '.join(TREE_PARTS)}\n", make)
    return VerlTree(dest, f"verl in {image}", commit, image=image)


def _extract(tar: tarfile.TarFile, target: Path) -> None:
    """Only plain folders and .yaml/.py files, only below ``target`` (tarfile's "data" filter
    is missing from some Python 3.10/3.11 releases, so the check is done here)."""
    members = []
    for m in tar.getmembers():
        if not (m.isdir() or (m.isfile() and m.name.endswith((".yaml", ".py")))):
            continue
        if Path(m.name).is_absolute() or ".." in Path(m.name).parts:
            raise RlboxError(f"refusing to extract {m.name!r}: it points outside the config folder")
        members.append(m)
    tar.extractall(target, members=members)


# ---------------------------------------------------------------------------------------------
# Composing.

@dataclass(frozen=True)
class Entry:
    module: str
    config_dir: Path
    config_name: str
    search: tuple[Path, ...]


def entry_for(tree: VerlTree, argv: list[str]) -> Entry:
    """The config a `python3 -m MODULE ...` entrypoint composes (read from its @hydra.main)."""
    module = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"), None)
    if not module:
        raise RlboxError("validate: the job is not `python3 -m verl...` or `python3 -m recipe...`")
    source = tree.root / (module.replace(".", "/") + ".py")
    if not source.is_file():
        where = "recipes ship only in verl's git source, not in the wheel: validate against the image" \
            if module.startswith("recipe.") else "is it a verl entrypoint?"
        raise RlboxError(f"validate: {module} is not in {tree.origin} ({where})")
    m = _HYDRA_MAIN.search(source.read_text(encoding="utf-8"))
    if not m:
        raise RlboxError(f"validate: {module} has no @hydra.main(config_path=..., config_name=...)")
    config_dir = (source.parent / m.group(1)).resolve()
    name = m.group(2)
    for i, arg in enumerate(argv):
        if arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
        elif arg in ("--config-name", "-cn") and i + 1 < len(argv):
            name = argv[i + 1]
    search = (tree.trainer_config,) if config_dir != tree.trainer_config else ()
    return Entry(module, config_dir, name, search)


def hydra_overrides(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in ("--config-name", "-cn", "--config-path", "-cp"):
            skip = True
            continue
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):  # ~key deletes: no '='
            continue
        out.append(arg)
    return out


def compose(entry: Entry, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    extra = []
    if entry.search:
        paths = ",".join(f"file://{p}" for p in entry.search)
        extra = [f"hydra.searchpath=[{paths}]"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(entry.config_dir), version_base=None):
        return hydra_compose(config_name=entry.config_name, overrides=[*extra, *overrides])


def all_keys(node, prefix="") -> dict[str, Any]:
    """Every dotted key of a config, with its default (containers included)."""
    from omegaconf import DictConfig

    out = {}
    if isinstance(node, DictConfig):
        for k in node.keys():
            path = f"{prefix}.{k}" if prefix else str(k)
            try:
                value = node._get_node(k)._value()
            except Exception:  # noqa: BLE001
                value = None
            out[path] = value
            child = node._get_node(k)
            if isinstance(child, DictConfig):
                out.update(all_keys(child, path))
    return out


def _parse_overrides(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    return parser.parse_overrides(overrides=overrides)


def _suggest(key: str, known: dict[str, Any]) -> str:
    """``; did you mean X?`` for an unknown dotted key: the nearest whole key, else the key with its
    first unknown segment replaced by the nearest real one at that level (``alogorithm.x.y`` ->
    ``algorithm``, or ``algorithm.x.y`` when that exists), else the nearest sibling."""
    close = nearest(key, known, 1, cutoff=0.75)
    if close:
        return f"; did you mean {close[0]}?"
    parts, prefix = key.split("."), ""
    for i, part in enumerate(parts):
        path = f"{prefix}.{part}" if prefix else part
        if path in known:
            prefix = path
            continue
        level = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == prefix]
        seg = nearest(part, level, 1, cutoff=0.5)
        if seg:
            fixed_head = f"{prefix}.{seg[0]}" if prefix else seg[0]
            whole = ".".join([fixed_head, *parts[i + 1:]])
            return f"; did you mean {whole if whole in known else fixed_head}?"
        break
    head = key.rpartition(".")[0]
    siblings = [k for k in known if k.rpartition(".")[0] == head]
    close = nearest(key, siblings, 1, cutoff=0.5)
    return f"; did you mean {close[0]}?" if close else ""


def _type_problem(key: str, default, value) -> str | None:
    if default is None or isinstance(value, str) and value.startswith("${"):
        return None
    expected = type(default)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is bool:
        ok, kind = isinstance(value, bool), "a boolean"
    elif expected in (int, float):  # verl's YAML writes 0 for float knobs: numbers mix
        ok, kind = number, "a number"
    elif expected in (list, tuple):  # verl takes a single name for a list (trainer.logger=console)
        ok, kind = isinstance(value, (list, tuple, str)), "a list"
    else:
        return None
    if ok:
        return None
    return f"{value!r} is not {kind} (the default is {default!r})"


def check(tree: VerlTree, argv: list[str], nodes: int | None = None, npus: int | None = None, *,
          restarts: int = 0, mounts: tuple[tuple[str, bool], ...] = (), notes: list[str] | None = None,
          own=None) -> list[Problem]:
    """The problems of ``examine`` (empty: nothing found); ``notes`` gets its lines of what ran and what did not."""
    found = examine(tree, argv, nodes, npus, restarts=restarts, mounts=mounts, own=own)
    if notes is not None:
        notes += found.notes()
    return list(found.problems)


def declared_fields(tree: VerlTree, target: str, name: str) -> bool | None:
    """Whether verl's dataclass ``target`` (``verl.workers.config.RolloutConfig``) declares field ``name``,
    read from its source in the tree (class bodies' annotated names, its bases' too): True, False, or None
    when the class or one of its bases is not in the tree (then nothing is claimed). A field the dataclass
    declares but the YAML leaves out (``enable_sleep_mode`` in verl 0.9.1's RolloutConfig) is taken."""
    import ast

    module, _, cls = target.rpartition(".")
    base = tree.root / Path(*module.split("."))
    files = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    files += [tree.root / "verl" / "base_config.py"]
    classes: dict[str, ast.ClassDef] = {}
    for f in files:
        try:
            parsed = ast.parse(f.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(parsed):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
    seen: set[str] = set()

    def walk(cname: str) -> bool | None:
        if cname in ("object", "ABC", "Mapping", "Generic") or cname in seen:
            return False
        seen.add(cname)
        node = classes.get(cname)
        if node is None:
            return None
        if any(isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.target.id == name
               for st in node.body):
            return True
        answers = [walk(b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "?")
                   for b in node.bases]
        return True if True in answers else (None if None in answers else False)

    return walk(cls)


def examine(tree: VerlTree, argv: list[str], nodes: int | None = None, npus: int | None = None, *,
            restarts: int = 0, mounts: tuple[tuple[str, bool], ...] = (), own=None, fetch_model=None) -> Outcome:
    """Every problem with this job's overrides, as one-line Problems, and what ran: rlbox's own checks,
    then verl's start-up checks by verl's own code where that verl is (``own(tree, request)``, default
    ``own_checks``: the image, or the environment of its wheel); a seed commit's restated rules only
    when its own code cannot run. With ``restarts``, also that a restart can resume; ``mounts``:
    (target, same source on every node) of each writable mount every node has. When verl's checks stop
    on the model's files and ``fetch_model`` is given (``model_files.fetcher``), its small files are
    fetched from where the model is and the checks run again against them."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    entry = entry_for(tree, argv)
    overrides = hydra_overrides(argv)
    problems: list[Problem] = []
    try:
        parsed = _parse_overrides(overrides)
    except HydraException as err:
        return Outcome((Problem(("overrides",), str(err).splitlines()[0]),))
    try:
        base = compose(entry, [o for o in overrides if "/" in o.split("=", 1)[0]])  # config groups first
    except (HydraException, OmegaConfBaseException) as err:
        return Outcome((Problem(("config groups",), " ".join(str(err).split())[:300]),))
    known = all_keys(base)
    # filter_groups belongs to the DAPO entrypoint where the entry's own config has no such key
    # (796871d, 65eb019); a verl whose trainer config has it (0.9) takes it in main_ppo too
    foreign_filter = not entry.module.startswith("recipe.dapo") and "algorithm.filter_groups" not in known
    good = []
    for text, ov in zip(overrides, parsed):
        key = ov.key_or_group
        # an unknown key is always said, with the nearest real one, whatever else is said of it
        unknown = "/" not in key and key not in known and (ov.is_delete() or not (ov.is_add() or ov.is_force_add()))
        if unknown:
            problems.append(Problem((key,), f"unknown key in {entry.config_name}{_suggest(key, known)}"
                                            + ("" if ov.is_delete() else " (a new key needs a leading +)")))
        parent = key.rpartition(".")[0]
        if ((ov.is_add() or ov.is_force_add()) and key not in known and f"{parent}._target_" in known
                and declared_fields(tree, known[parent + "._target_"], key.rpartition(".")[2]) is False):
            # verl instantiates this node into its dataclass, which takes no field it does not declare
            # (research case T03: FSDPActorConfig.__init__() got an unexpected keyword argument)
            problems.append(Problem((key,), f"unknown field: verl builds {parent} into {known[parent + '._target_']}, "
                                            f"which rejects it at start-up{_suggest(key, known)}"))
            continue
        if "filter_groups" in key and foreign_filter:
            problems.append(Problem((key,), f"filter_groups is a DAPO setting: it needs the DAPO entrypoint "
                                           f"(python3 -m recipe.dapo.main_dapo), not {entry.module}"))
            continue
        if unknown:
            continue
        if ov.is_add() or ov.is_delete() or ov.is_force_add() or "/" in key:
            good.append(text)
            continue
        value = ov.value()
        why = _type_problem(key, known[key], value)
        if why:
            problems.append(Problem((key,), why))
            continue
        good.append(text)
    try:
        cfg = compose(entry, good)
    except (HydraException, OmegaConfBaseException) as err:
        problems.append(Problem(("overrides",), " ".join(str(err).split())[:300]))
        return Outcome(tuple(problems))
    problems += interpolation_problems(cfg)

    def get(key: str):
        try:
            return OmegaConf.select(cfg, key, throw_on_missing=False)
        except OmegaConfBaseException:
            return None

    problems += _cluster_rules(get, foreign_filter, nodes, npus)
    ran = ["rlbox's checks: keys, types, interpolations, the cluster's size and shape"
           + (", restarts" if restarts else "")]
    not_run: list[NotRun] = []
    beyond: list[str] = []
    full = verl_rules.pinned(tree.commit)

    def restated(why: str) -> None:
        problems.extend(verl_rules.check(get, full, entry.module))
        ran.append(f"verl {full[:7]}'s start-up checks as rlbox restates them, held identical to verl's own results "
                   f"at that commit (tests/fixtures/verl_rules){why}")

    fetched = None
    if tree.version or tree.image:
        try:
            req = verl_own.request(entry, good, nodes, npus, tree.root)
            verdict = (own or own_checks)(tree, req)
        except RlboxError as err:  # no environment to run them in: said, and the other checks stand
            if full:
                restated(f", because verl's own code could not run: {err}")
            else:
                not_run.append(NotRun(f"verl's start-up checks: {err}",
                                      "validate where that verl can run: --image, or --verl-version with PyPI reachable"))
        else:
            if fetch_model is not None and any("model's files" in c for c in verdict.could_not):
                # an unreachable head ends validation here, with its one line
                verdict, fetched = with_model_files(tree, req, verdict, model_files.model_paths(all_keys(cfg), get),
                                                    fetch_model, own or own_checks)
            problems += verl_own.problems(verdict)
            ran += verl_own.ran(verdict)
            not_run += verl_own.not_run(verdict)
            beyond += verl_own.beyond(verdict)
    elif full:
        restated("")
    else:
        not_run.append(NotRun(f"verl's start-up checks: {tree.origin} is a source folder with no environment to run them in",
                              "validate with --image or --verl-version"))
    problems += restart_rules(get, restarts, mounts)
    return Outcome(tuple(problems), tuple(ran), tuple(not_run), tuple(beyond),
                   fetched.lines if fetched else (), fetched.sources if fetched else ())


def with_model_files(tree: VerlTree, req: dict, verdict, paths: dict[str, str], fetch_model, own):
    """verl's checks stopped on the model's files: fetch the small ones (``fetch_model(paths, folder)``,
    ``model_files.fetcher``) into a temporary folder and run the checks again against that copy (the
    request's model keys pointed at it; ``model_root`` is the folder an image's container gets, read-only).
    (verdict, Fetched): the new verdict when any path was fetched, else the first."""
    with tempfile.TemporaryDirectory(prefix="rlbox-model-files-") as tmp:
        fetched = fetch_model(paths, Path(tmp))
        if not fetched.copies:
            return verdict, fetched
        again = dict(req, overrides=[*req["overrides"], *model_files.overrides(fetched.copies, paths)], model_root=tmp)
        return own(tree, again), fetched


def interpolation_problems(cfg) -> list[Problem]:
    """What OmegaConf cannot resolve when verl resolves the whole config at start-up (a loop between
    keys, a key that does not exist). Custom resolvers and environment variables are verl's and the
    node's: not judged here."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException, UnsupportedInterpolationType

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except UnsupportedInterpolationType:
        return []
    except InterpolationResolutionError as err:
        text = " ".join(str(err).split())
        if "oc.env" in text or "Environment variable" in text:
            return []
        key = getattr(err, "full_key", None) or "interpolation"
        first = text.split(" full_key:")[0]
        return [Problem((str(key),), f"cannot be resolved, as verl resolves its config at start-up: {first[:240]}")]
    except OmegaConfBaseException:
        return []
    return []


def own_checks(tree: VerlTree, req: dict, client=None, mounts: tuple[tuple[str, str], ...] = ()) -> "verl_own.Verdict":
    """verl's own start-up checks where that verl is: the image (on ``client``'s engine, default the
    local one, with ``mounts`` read-only: (source, target) on that engine's machine), or the
    environment of its wheel."""
    if tree.image:
        from rlbox.core import engine

        return verl_own.run_in_image(client or engine.local_client(), tree.image, req, mounts)
    return verl_own.run_in_env(verl_own.env_python(tree.version, echo=lambda line: print(f"rlbox: {line}", file=sys.stderr)), req)


def restart_rules(get, restarts: int, mounts: tuple[tuple[str, bool], ...]) -> list[Problem]:
    """`--max-restarts N` resumes from verl's newest checkpoint: refuse what cannot resume. verl
    saves every trainer.save_freq steps (default -1: never) into trainer.default_local_dir; that
    folder must outlive the containers (a mount on every node), and Megatron's checkpoint is
    loaded by every rank from one folder, so for it the mount must be the same on every node
    (verl's Ascend FAQ: Megatron checkpoints on per-node disks do not load)."""
    if not restarts:
        return []
    out = []
    freq = get("trainer.save_freq")
    if not isinstance(freq, int) or freq <= 0:
        out.append(Problem(("trainer.save_freq",), f"is {freq!r}: with --max-restarts {restarts} a restart resumes from a "
                                                   "checkpoint, and verl saves none; set trainer.save_freq=N (N > 0)"))
    folder = get("trainer.default_local_dir")
    megatron = get("actor_rollout_ref.actor.strategy") == "megatron"
    need = "a mount that is the same on every node (Megatron)" if megatron else "a mount every node has"
    if not isinstance(folder, str) or not folder.startswith("/"):
        out.append(Problem(("trainer.default_local_dir",), f"{folder!r} is inside the container and dies with it: "
                                                           f"with --max-restarts put checkpoints on {need} (--mount)"))
        return out
    under = [(t, same) for t, same in mounts if folder == t or folder.startswith(t.rstrip("/") + "/")]
    if not under or (megatron and not any(same for _, same in under)):
        out.append(Problem(("trainer.default_local_dir",), f"{folder} is not on {need}: a restart could not "
                                                           "resume from it (add --mount SRC:DIR)"))
    return out


def _cluster_rules(get, foreign_filter: bool, nodes: int | None, npus: int | None) -> list[Problem]:
    out = []
    nnodes, per_node = get("trainer.nnodes"), get("trainer.n_gpus_per_node")
    if nodes is not None and npus is not None and isinstance(nnodes, int) and isinstance(per_node, int):
        if nnodes * per_node != nodes * npus:
            out.append(Problem(("trainer.nnodes", "trainer.n_gpus_per_node"),
                               f"{nnodes} x {per_node} = {nnodes * per_node} NPUs, but the cluster has "
                               f"{nodes} x {npus} = {nodes * npus}"))
    if get("trainer.device") != "npu":
        out.append(Problem(("trainer.device",), f"is {get('trainer.device')!r}; Ascend runs need trainer.device=npu"))
    tp = get("actor_rollout_ref.rollout.tensor_model_parallel_size")
    if isinstance(tp, int) and isinstance(per_node, int) and tp > 0 and per_node % tp:
        out.append(Problem(("actor_rollout_ref.rollout.tensor_model_parallel_size", "trainer.n_gpus_per_node"),
                           f"rollout tensor parallel size {tp} does not divide {per_node} NPUs per node"))
    sp = get("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    if isinstance(sp, int) and sp > 0 and isinstance(nnodes, int) and isinstance(per_node, int) and (nnodes * per_node) % sp:
        out.append(Problem(("actor_rollout_ref.actor.ulysses_sequence_parallel_size",),
                           f"ulysses sequence parallel size {sp} does not divide {nnodes * per_node} NPUs"))
    batch, mini = get("data.train_batch_size"), get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if isinstance(batch, int) and isinstance(mini, int) and mini > 0 and batch % mini:
        out.append(Problem(("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"),
                           f"train_batch_size {batch} is not divisible by ppo_mini_batch_size {mini}"))
    if get("actor_rollout_ref.actor.use_dynamic_bsz"):
        cap = get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
        prompt, response = get("data.max_prompt_length"), get("data.max_response_length")
        sp_ = sp if isinstance(sp, int) and sp > 0 else 1
        if all(isinstance(x, int) for x in (cap, prompt, response)) and cap < (prompt + response) / sp_:
            out.append(Problem(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",),
                               f"{cap} cannot hold one sequence: (max_prompt_length {prompt} + max_response_length "
                               f"{response}) / ulysses sp {sp_} = {(prompt + response) // sp_}"))
    if foreign_filter and get("algorithm.filter_groups") is not None:
        out.append(Problem(("algorithm.filter_groups",), "filter_groups needs the DAPO entrypoint"))
    return out
