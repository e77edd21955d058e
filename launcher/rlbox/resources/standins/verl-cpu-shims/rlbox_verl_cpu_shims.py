"""rlbox stand-in "verl-cpu-shims": lets stock verl 0.5.0 (PyPI) train on CPU. NOT part of any release.

Loaded by rlbox-verl-cpu-shims.pth in every Python process of the image (the Ray workers too: verl's
own `external_lib` hook runs after `Worker.__init__`, too late). Nothing is imported here: each shim
is applied right after the module it patches has executed (a post-import hook), so `ray start` and
other processes that never import verl or torch pay nothing. Each shim names the verl 0.5.0 line
it works around (the same blockers as verl@796871d, FIELD-NOTES "verl trains on CPU").
Set RLBOX_VERL_CPU_SHIMS=0 to switch them off (to see what verl does without them).
"""

import importlib.abc
import importlib.machinery
import os
import sys

APPLIED = []  # names of the shims applied in this process (for tests and the log)


def _cpu_only():
    import torch
    return not torch.cuda.is_available()


def shim_device(mod):
    # verl/utils/device.py:76-86 get_nccl_backend() raises "No available nccl backend" on CPU: gloo.
    orig = mod.get_nccl_backend

    def get_nccl_backend():
        return "gloo" if not (mod.is_cuda_available or mod.is_npu_available) else orig()
    mod.get_nccl_backend = get_nccl_backend
    APPLIED.append("device.get_nccl_backend=gloo")


def shim_distributed(mod):
    # verl/workers/fsdp_workers.py:121,927,1315 init_process_group(backend="cpu:gloo,cpu:gloo"):
    # torch rejects the duplicate device; on CPU the backend is plain gloo.
    orig = mod.init_process_group

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and backend.startswith("cpu:gloo,cpu:"):
            kwargs["backend"] = "gloo"
        return orig(*args, **kwargs)
    mod.init_process_group = init_process_group
    APPLIED.append("distributed.init_process_group(cpu:gloo,cpu:X)=gloo")


def shim_torch_cpu(mod):
    # torch.cpu lacks the memory calls verl makes unconditionally through get_torch_device():
    # fsdp_workers.py:695-696 (max_memory_*), :755 and hf_rollout.py:172 (empty_cache),
    # utils/profiler/performance.py:33-34 (memory_allocated/reserved). No-ops reporting 0 bytes.
    for name in ("empty_cache", "reset_peak_memory_stats"):
        if not hasattr(mod, name):
            setattr(mod, name, lambda *a, **k: None)
    for name in ("max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"):
        if not hasattr(mod, name):
            setattr(mod, name, lambda *a, **k: 0)
    # utils/flops_counter.py:45 get_device_flops() -> get_device_name(): no known device, so verl's
    # own fallback (inf FLOPS: MFU 0).
    if not hasattr(mod, "get_device_name"):
        mod.get_device_name = lambda *a, **k: "CPU"
    # utils/profiler/performance.py:38 log_gpu_memory_usage -> mem_get_info(): (free, total), the host's.
    if not hasattr(mod, "mem_get_info"):
        def mem_get_info(*a, **k):
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        mod.mem_get_info = mem_get_info
    APPLIED.append("torch.cpu memory calls")


def shim_fsdp_utils(mod):
    # verl/workers/fsdp_workers.py:394 (ref model), :1122, :1411 CPUOffloadPolicy(pin_memory=True):
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
    # times: n*n rows, a batch size mismatch. Upstream dropped the double repeat after 0.5.0; here
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


HOOKS = {
    "verl.utils.device": shim_device,
    "torch.distributed": shim_distributed,
    "torch.cpu": shim_torch_cpu,
    "verl.utils.fsdp_utils": shim_fsdp_utils,
    "verl.workers.rollout.hf_rollout": shim_hf_rollout,
}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, fn):
        self.inner, self.fn = inner, fn

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.fn(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        fn = HOOKS.get(name)
        if fn is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, fn)
        return spec


if os.environ.get("RLBOX_VERL_CPU_SHIMS", "1") != "0":
    sys.meta_path.insert(0, _Finder())
