#!/usr/bin/env python3
"""verl_checks.py REQUEST_JSON: run the start-up config checks of the verl that is importable here,
with verl's own code, and print one JSON line: what ran, what could not, and verl's own rejection.

Runs in a Python that has verl and what verl imports (an image, or rlbox's cached environment made
from a verl wheel); imports nothing of rlbox. The request: ``config_rel`` and
``search_rel`` (config folders, relative to the folder holding ``verl/``), ``config_name``, ``overrides`` (Hydra's), ``nodes``/``npus`` (the cluster size,
given to verl as trainer.nnodes / trainer.n_gpus_per_node), ``module`` (the job's entrypoint).

What runs is what the entrypoint itself runs before any worker starts, found in its source, never
assumed: ``validate_config(config=..., use_reference_policy=need_reference_policy(config),
use_critic=need_critic(config))`` from verl.utils.config and verl.trainer.ppo.utils, as verl 0.9
main_ppo calls it (that function builds the actor and critic dataclasses and runs their
``validate``). An entrypoint that calls something else is said, not guessed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
import traceback


def verl_version() -> str:
    """The version of the verl that is imported (its own ``__version__``, read from its source tree),
    else its distribution's: a source tree on the path may shadow another installed verl."""
    try:
        import verl

        if getattr(verl, "__version__", None):
            return str(verl.__version__)
    except Exception:  # noqa: BLE001 - verl that does not import: its metadata, then the checks say why
        pass
    try:
        from importlib.metadata import version

        return version("verl")
    except Exception:  # noqa: BLE001
        return "unknown"


def compose(req: dict, base: str):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    search = [os.path.join(base, p) for p in req.get("search_rel") or []]
    extra = [f"hydra.searchpath=[{','.join('file://' + p for p in search)}]"] if search else []
    size = []
    if req.get("nodes"):
        size.append(f"trainer.nnodes={int(req['nodes'])}")
    if req.get("npus"):
        size.append(f"trainer.n_gpus_per_node={int(req['npus'])}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=os.path.join(base, req["config_rel"]), version_base=None):
        return hydra_compose(config_name=req["config_name"], overrides=[*extra, *req["overrides"], *size])


def where(tb, root: str, *others: str) -> str | None:
    """The innermost frame inside verl (or one of ``others``, vLLM's folder): ``verl/utils/config.py:123``."""
    found = None
    for frame in traceback.extract_tb(tb):
        for top in (root, *others):
            if top and frame.filename.startswith(top + os.sep):
                found = f"{os.path.relpath(frame.filename, os.path.dirname(top))}:{frame.lineno}"
    return found


def environmental(err: BaseException, root: str) -> str | None:
    """What a check needs that is not the config: the model's files (verl reads the HF config of a
    model path it is given) or a package this Python lacks (vLLM outside the image). None: verl
    rejects the config itself."""
    chain, seen = [], err
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    files = [f.filename for e in chain for f in traceback.extract_tb(e.__traceback__)]
    text = " ".join(f"{type(e).__name__} {e}" for e in chain)
    if any("/huggingface_hub/" in f or "/transformers/" in f for f in files) or "Repo id must be" in text:
        return "the model's files (its HF config at the model path), which are on the nodes, not here"
    if isinstance(err, ImportError) or any(f.startswith(os.path.join(root, "third_party")) for f in files[-2:]):
        return "a package this Python lacks"
    return None


def main() -> int:
    """One request (a JSON object) or several (a JSON list: one process, verl imported once)."""
    reqs = json.loads(sys.argv[1])
    # torch_npu as on a host without it: these checks read the config only, and the host validating
    # (a launcher, a login node) may have no NPU runtime, whose absence stops `import torch_npu`
    sys.modules["torch_npu"] = None
    for req in reqs if isinstance(reqs, list) else [reqs]:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # verl prints (the whole config): not the verdict
                out = verdict(req)
        except Exception as err:  # noqa: BLE001 - this Python cannot run the checks: said, not a rejection
            out = {"verl": None, "ran": [], "rejected": None, "where": None, "beyond": [],
                   "could_not": [f"verl's checks could not run here: {type(err).__name__}: {' '.join(str(err).split())[:300]}"]}
        print(json.dumps(out))
    return 0


def verdict(req: dict) -> dict:
    out: dict = {"verl": None, "ran": [], "could_not": [], "beyond": [], "rejected": None, "where": None}
    spec = importlib.util.find_spec("verl")
    if spec is None:
        out["could_not"].append("verl is not importable here")
        return out
    root = list(spec.submodule_search_locations)[0]
    out["verl"] = verl_version()
    entry = importlib.util.find_spec(req["module"])
    source = open(entry.origin, encoding="utf-8").read() if entry and entry.origin else ""
    try:
        cfg = compose(req, os.path.dirname(root))
    except Exception as err:  # noqa: BLE001 - Hydra's own refusal (an unknown key, a bad value)
        out["rejected"] = f"{type(err).__name__}: {' '.join(str(err).split())}"[:600]
        out["where"] = "hydra compose"
        return out
    shape = "validate_config(" in source and 'need_reference_policy(config' in source.replace(" ", "")
    if shape:  # verl 0.8/0.9: validate_config(config, need_reference_policy(config), need_critic(config))
        own_validate_config(req, cfg, source, entry, root, out)
    else:  # verl 0.5-0.7 (and the seed commits): the entrypoint's TaskRunner.run, as verl runs it
        task_runner(req, cfg, root, out)
    if out["rejected"] is None:
        worker_side(cfg, root, out)
    return out


def reject(out: dict, err: BaseException, root: str, what: str, *others: str) -> None:
    """verl's own rejection, or what the check stopped on when it needs something not here; its place
    is the innermost frame in verl, or in one of ``others`` (vLLM's folder)."""
    text = f"{type(err).__name__}: {' '.join(str(err).split()) or type(err).__name__}"[:600]
    needs = environmental(err, root)
    if needs:
        out["could_not"].append(f"{what} stopped on {needs} ({text[:300]})")
    else:
        out["rejected"] = text
        out["where"] = where(err.__traceback__, root, *others)


def own_validate_config(req: dict, cfg, source: str, entry, root: str, out: dict) -> None:
    cfgmod = importlib.import_module("verl.utils.config")
    validate = getattr(cfgmod, "validate_config", None)
    try:
        ppo_utils = importlib.import_module("verl.trainer.ppo.utils")
    except ImportError as err:
        out["could_not"].append(f"verl.trainer.ppo.utils does not import here ({type(err).__name__}: {err})")
        ppo_utils = None
    need_ref = getattr(ppo_utils, "need_reference_policy", None)
    need_critic = getattr(ppo_utils, "need_critic", None)
    params = list(inspect.signature(validate).parameters) if validate else []
    takes_config = [f for f in (need_ref, need_critic)
                    if f is not None and list(inspect.signature(f).parameters)[:1] == ["config"]]
    if params[:3] != ["config", "use_reference_policy", "use_critic"] or len(takes_config) != 2:
        out["could_not"].append("verl.utils.config.validate_config or need_reference_policy/need_critic(config) "
                                "differ from what this check knows how to call")
        return
    line = next((i + 1 for i, text in enumerate(source.splitlines()) if "validate_config(" in text
                 and "import" not in text), None)
    out["ran"].append(f"verl.utils.config.validate_config, as {req['module']} calls it"
                      + (f" ({os.path.relpath(entry.origin, os.path.dirname(root))}:{line})" if line else ""))
    try:
        validate(config=cfg, use_reference_policy=need_ref(cfg), use_critic=need_critic(cfg))
    except Exception as err:  # noqa: BLE001 - verl's own rejection, whatever its type
        reject(out, err, root, "validate_config")


class Reached(Exception):
    """The TaskRunner got past its last config check: stop before it loads models or data."""


def line_of(path: str, needle: str, root: str) -> str:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return ""
    n = next((i + 1 for i, text in enumerate(lines) if needle in text and "def " not in text), None)
    return f" ({os.path.relpath(path, os.path.dirname(root))}:{n})" if n else ""


def task_runner(req: dict, cfg, root: str, out: dict) -> None:
    """The entrypoint's ``TaskRunner.run(config)`` in this process, as verl runs it on the driver, up to
    where it has made every config check it makes before a worker exists: verl 0.6/0.7 call
    ``validate_config`` near its top, verl 0.5 ``RayPPOTrainer._validate_config`` in the trainer's
    constructor; both then construct ``RayPPOTrainer`` (its own asserts: hybrid engine, the roles), after
    loading the tokenizer and the datasets: those loads are stood in for (the files are on the nodes) and
    the run stops at the trainer's dataloaders."""
    main = importlib.import_module(req["module"])
    runner_cls = getattr(main, "TaskRunner", None)
    runner_cls = getattr(runner_cls, "__ray_actor_class__", runner_cls)
    if runner_cls is None or not hasattr(runner_cls, "run"):
        out["could_not"].append(f"{req['module']} has no TaskRunner.run this check knows how to call: its config "
                                "checks run inside the trainer and workers, which need the cluster")
        return
    trainer_mod = importlib.import_module("verl.trainer.ppo.ray_trainer")
    fs = importlib.import_module("verl.utils.fs")
    utils = importlib.import_module("verl.utils")
    trainer = trainer_mod.RayPPOTrainer
    done: list[str] = []
    stood_in: list[str] = []

    started: list[str] = []

    def recorded(fn, name, at):
        fn = getattr(fn, "original", fn)  # several requests in one process: wrap verl's own function once

        def call(*a, **k):
            started.append(name + at)
            result = fn(*a, **k)
            done.append(name + at)
            return result
        call.original = fn
        return call

    if hasattr(main, "validate_config"):
        main.validate_config = recorded(main.validate_config, f"verl.utils.config.validate_config, as {req['module']} calls it",
                                        line_of(main.__file__, "validate_config(", root))
    if hasattr(trainer, "_validate_config"):
        trainer._validate_config = recorded(trainer._validate_config, "RayPPOTrainer._validate_config, as the trainer's "
                                            "constructor calls it", line_of(trainer_mod.__file__, "self._validate_config()", root))

    def copy_to_local(path, *a, **k):  # the model's files are on the nodes: its path stands in for them
        stood_in.append("the model's tokenizer and processor")
        return path

    def stop(self, *a, **k):
        raise Reached

    def none(what):
        def call(*a, **k):
            stood_in.append(what)
        return call

    fs.copy_to_local = copy_to_local
    utils.hf_tokenizer, utils.hf_processor = none("the model's tokenizer and processor"), none("the model's processor")
    for name in ("create_rl_dataset", "create_rl_sampler"):
        if hasattr(main, name):
            setattr(main, name, none("the datasets"))
    trainer._create_dataloader = stop
    try:
        runner_cls().run(cfg)
    except Reached:
        pass
    except Exception as err:  # noqa: BLE001 - verl's own rejection, whatever its type
        reject(out, err, root, f"{req['module']}'s TaskRunner.run")
        out["ran"].append(f"{req['module']}'s TaskRunner.run, as verl runs it on the driver"
                          + (", through " + "; ".join(started) if started else ", before its config checks"))
        return
    else:
        out["could_not"].append(f"{req['module']}'s TaskRunner.run ended without reaching the trainer: "
                                "this check does not know where its config checks are")
    if not done:
        out["could_not"].append(f"{req['module']}'s TaskRunner.run reached the trainer without calling "
                                "validate_config or RayPPOTrainer._validate_config")
    out["ran"].append(f"{req['module']}'s TaskRunner.run, as verl runs it on the driver (worker choice, reward "
                      f"manager, resource pools), through " + "; ".join(done))
    seen = sorted(set(stood_in) - {"the model's processor"})
    if seen:
        out["beyond"].append("loading " + " and ".join(seen) + " (stood in: their files are on the nodes)")


class EngineReached(Exception):
    """verl's run_server got vLLM's engine config and asked for the engine: stop before it starts."""


def worker_side(cfg, root: str, out: dict) -> None:
    """What verl checks once its workers run, before its first step, that needs no NPU: the rollout
    server verl starts on each node for vLLM, made as verl's replica makes it (the replica class for
    ``rollout.name``, its constructor's checks: world size against the NPUs per node; the server's
    constructor: the rollout and model configs as dataclasses, ``max_model_len`` against the model),
    then its ``launch_server`` as verl calls it (the rollout config turned into ``vllm serve``
    arguments, parsed by vLLM's own parser) and its ``run_server`` up to vLLM's engine config
    (``AsyncEngineArgs.create_engine_config``: vLLM's model, cache, parallel and scheduler checks),
    stopped where the engine would start. Ray's runtime context (a job id that names an IPC socket,
    the node's address) is stood in: no Ray cluster runs here."""
    from omegaconf import OmegaConf

    name = OmegaConf.select(cfg, "actor_rollout_ref.rollout.name")
    what = ("worker-side checks (verl's rollout server: the rollout config turned into vLLM's engine arguments "
            "and vLLM's engine config)")
    if name != "vllm":
        out["beyond"].append(f"{what}: the rollout is {name!r}; rlbox runs vLLM's")
        return
    vllm_spec = importlib.util.find_spec("vllm")
    if vllm_spec is None:
        out["beyond"].append(f"{what}: vLLM is not importable here (validate with --image, or the run's image)")
        return
    try:
        replica_mod = importlib.import_module("verl.workers.rollout.replica")
    except ImportError as err:
        out["beyond"].append(f"{what}: verl.workers.rollout.replica does not import here ({type(err).__name__}: {err})")
        return
    get_class = getattr(replica_mod, "get_rollout_replica_class", None)
    if get_class is None:
        out["beyond"].append(f"{what}: this verl builds vLLM's engine inside its workers, with no rollout "
                             "replica class to make without them")
        return
    import asyncio
    import io

    vllm_root = list(vllm_spec.submodule_search_locations)[0]
    rollout, model = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model
    gpus = OmegaConf.select(cfg, "actor_rollout_ref.rollout.n_gpus_per_node") or cfg.trainer.n_gpus_per_node
    disagg = OmegaConf.select(cfg, "actor_rollout_ref.rollout.disaggregation.enabled")
    stage = "the rollout replica"
    try:
        params = inspect.signature(get_class).parameters
        replica_cls = get_class(name, **({"disaggregation_enabled": bool(disagg)} if "disaggregation_enabled" in params else {}))
        replica = replica_cls(replica_rank=0, config=rollout, model_config=model, gpus_per_node=int(gpus))
        server_cls = getattr(replica, "server_class", None)
        server_cls = getattr(server_cls, "__ray_actor_class__", server_cls)
        mod = sys.modules.get(getattr(server_cls, "__module__", ""), None)
        if server_cls is None or not hasattr(server_cls, "launch_server") or not hasattr(mod, "AsyncLLM"):
            out["beyond"].append(f"{what}: {replica_cls.__name__} has no server class whose launch_server this "
                                 "check knows how to call")
            return
        n = int(replica.gpus_per_replica_node)
        given = {"config": replica.config, "model_config": replica.model_config,
                 "rollout_mode": getattr(replica_mod, "RolloutMode").HYBRID, "workers": [None] * n,
                 "replica_rank": 0, "node_rank": 0, "gpus_per_node": n, "nnodes": int(replica.nnodes),
                 "cuda_visible_devices": ",".join(str(i) for i in range(n))}
        wanted = inspect.signature(server_cls.__init__).parameters
        missing = [p for p, v in wanted.items() if p != "self" and v.default is inspect.Parameter.empty and p not in given]
        if missing:
            out["beyond"].append(f"{what}: {server_cls.__name__} takes {', '.join(missing)}, which this check "
                                 "does not know how to give")
            return
        stage = f"verl's {server_cls.__name__}"
        with ray_context():
            server = server_cls(**{k: v for k, v in given.items() if k in wanted})
        platform = vllm_platform()
        if platform:  # an NPU image on a machine with no NPU: vLLM cannot even build its argument parser
            out["ran"].append(f"verl's rollout server for vLLM as its replica makes it ({replica_cls.__name__}, "
                              f"{server_cls.__name__}: world size, the rollout and model configs, max_model_len "
                              "against the model); Ray's runtime context stood in")
            out["beyond"].append(f"{server_cls.__name__}.launch_server (the rollout config as vLLM's engine arguments "
                                 f"and vLLM's engine config): {platform}")
            return
        stage = f"verl's {server_cls.__name__}.launch_server"
        real = mod.AsyncLLM

        class Stop:
            @staticmethod
            def from_vllm_config(*a, **k):
                raise EngineReached

        mod.AsyncLLM, parser_said = Stop, io.StringIO()
        try:
            with contextlib.redirect_stderr(parser_said):
                asyncio.run(server.launch_server())
        finally:
            mod.AsyncLLM = real
    except EngineReached:
        at = line_of(mod.__file__, "AsyncLLM.from_vllm_config(", root)
        out["ran"].append(f"verl's rollout server for vLLM as its replica makes it ({replica_cls.__name__}, "
                          f"{server_cls.__name__}.launch_server), to vLLM's engine config, stopped before the engine "
                          f"starts{at}; Ray's runtime context stood in")
        out["beyond"].append("checks that need the NPUs and the weights: vLLM's memory profiling and KV cache, HCCL, "
                             "loading and syncing the weights")
    except SystemExit as err:  # vLLM's argument parser refused what verl built (an engine_kwargs key, a value)
        said = [ln for ln in parser_said.getvalue().splitlines() if "error:" in ln]
        text = said[-1].split("error:", 1)[1].strip() if said else f"exit {err.code}"
        out["rejected"] = f"vLLM's argument parser: {text} (the rollout config as verl passes it to vllm serve)"[:600]
        out["where"] = line_of(mod.__file__, "parser.parse_args(", root).strip(" ()") or None
        out["ran"].append("verl's rollout server for vLLM as its replica makes it, up to vLLM's argument parser")
    except Exception as err:  # noqa: BLE001 - verl's or vLLM's own rejection, whatever its type
        reject(out, err, root, f"{what}, at {stage}", vllm_root)
        if out["rejected"]:
            out["ran"].append(f"verl's rollout server for vLLM as its replica makes it, up to {stage}")


def vllm_platform() -> str | None:
    """None when vLLM has a platform here (its CPU build; an accelerator); else why its engine config
    cannot be made here (an NPU image on a machine with no NPU: vllm-ascend's platform needs torch_npu)."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_unspecified():
            return None
    except Exception as err:  # noqa: BLE001 - a platform plugin that cannot load here
        return f"vLLM's platform does not load here ({type(err).__name__}: {' '.join(str(err).split())[:160]})"
    return "vLLM has no platform here (its NPU platform needs the NPU runtime): they run on the nodes"


@contextlib.contextmanager
def ray_context():
    """Ray's runtime context as a Ray actor would see it, for the server's constructor: a job id (it
    names the engine's IPC socket) and this node's address."""
    import types

    import ray
    import ray.util

    saved = ray.get_runtime_context, ray.util.get_node_ip_address
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_job_id=lambda: "rlbox-validate",
                                                            get_node_id=lambda: "rlbox-validate")
    ray.util.get_node_ip_address = lambda *a, **k: "127.0.0.1"
    try:
        yield
    finally:
        ray.get_runtime_context, ray.util.get_node_ip_address = saved


if __name__ == "__main__":
    sys.exit(main())
