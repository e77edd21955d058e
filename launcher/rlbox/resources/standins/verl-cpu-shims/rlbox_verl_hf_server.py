"""rlbox stand-in "verl-cpu-shims", for verl 0.9.1 only: a LABELLED STAND-IN ROLLOUT, not vLLM.

verl 0.9.1 runs rollouts only as async servers (verl/workers/rollout/base.py:89-93 `_ROLLOUT_REGISTRY`:
vllm, sglang, trtllm; replica.py:399-401 `RolloutReplicaRegistry`), and none of them has a CPU build
that fits verl 0.9.1 here (docs/cpu-training.md "verl 0.9.1"). This module serves HF transformers'
`generate` behind the same interface, registered under the rollout name `hf-standin` (a name verl does
not have, so a config can never mistake it for vLLM):

- `HFStandinReplica(RolloutReplica)`: one Ray actor `HFStandinServer` per replica (hybrid mode, the
  replica's training worker node), as vLLMReplica.launch_servers does (vllm_async_server.py:1336-1416).
- `HFStandinServer`: `generate(request_id, prompt_ids, sampling_params, ...) -> TokenOutput` (the call
  LLMServerClient.generate makes, llm_server.py:146-156), sampling with the model's own `generate`
  (temperature / top_p / top_k, at most `response_length` new tokens), with the chosen tokens' log-probs
  when asked; `update_weights(state_dict)`, and the control calls the replica and the trainer make
  (wake_up, sleep, clear_kv_cache, set_global_steps, abort_all_requests, resume_generation, ...).
- `HFStandinAdapter(BaseRollout)`: the in-worker side (engine_workers.py:667 `get_rollout_class`):
  `update_weights(generator)` consumes the trainer's per-tensor weights (every rank: the generator may
  gather) and sends them, on CPU, to its replica's server; resume/release are no-ops (nothing to
  free on CPU).

Refuses any verl but 0.9.1 by name: written against that wheel's files and lines only.
"""

import asyncio
import os

VERL_VERSION = "0.9.1"
NAME = "hf-standin"
LABEL = "rlbox stand-in rollout: HF transformers generate on CPU behind verl's async server interface (NOT vLLM)"


def check_verl():
    import verl
    found = getattr(verl, "__version__", None)
    if found != VERL_VERSION:
        raise RuntimeError(f"rlbox stand-in rollout {NAME!r} is written for verl {VERL_VERSION}, not verl {found}: "
                           f"its interface is that wheel's (verl/workers/rollout/replica.py, base.py)")


def server_name(replica_rank):
    return f"{NAME}_server_{replica_rank}_0"


class HFStandinServer:
    """The per-replica server: an HF causal LM on CPU."""

    def __init__(self, config, model_config, replica_rank):
        import torch
        from transformers import AutoModelForCausalLM

        from verl.utils.config import omega_conf_to_dataclass

        check_verl()
        self.config = omega_conf_to_dataclass(config)
        self.model_config = model_config
        self.replica_rank = replica_rank
        path = model_config.local_path if hasattr(model_config, "local_path") else model_config.path
        override = dict(getattr(model_config, "override_config", {}) or {})
        attn = override.get("_attn_implementation", "sdpa")
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation=attn)
        self.model.eval()
        gen = self.model.generation_config
        self.eos = gen.eos_token_id if gen is not None else None
        self.pad = (gen.pad_token_id if gen is not None else None) or self.model.config.pad_token_id
        self.global_steps = None
        self.lock = asyncio.Lock()  # one generate at a time on the model (the CPU has no batching engine)
        self.weights_version = 0
        print(f"[{LABEL}] replica {replica_rank}: {path}", flush=True)

    def get_server_address(self):
        return f"{NAME}-replica-{self.replica_rank}", 0

    def _generate(self, prompt_ids, sampling_params):
        import torch

        params = dict(sampling_params)
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_tokens is None:
            max_tokens = min(self.config.response_length,
                             self.config.prompt_length + self.config.response_length - len(prompt_ids))
        max_tokens = max(1, int(max_tokens))
        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_p = params.get("top_p", 1.0)
        top_k = params.get("top_k", -1)
        kwargs = {"max_new_tokens": max_tokens, "return_dict_in_generate": True, "output_scores": True,
                  "eos_token_id": self.eos, "pad_token_id": self.pad if self.pad is not None else self.eos}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=float(top_p if top_p is not None else 1.0),
                          top_k=int(top_k) if top_k is not None and int(top_k) > 0 else 0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        log_probs = None
        if params.get("logprobs"):
            # the log-probability of each chosen token under the unprocessed distribution (vLLM's default
            # logprobs_mode "raw_logprobs"): a forward pass over prompt + response
            full = out.sequences
            with torch.no_grad():
                logits = self.model(input_ids=full, attention_mask=torch.ones_like(full)).logits[0].float()
            lp = torch.log_softmax(logits[ids.shape[1] - 1:-1], dim=-1)
            log_probs = lp.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1).tolist()
        return tokens, log_probs

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, image_data=None, video_data=None, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data:
            raise NotImplementedError(f"{LABEL}: text only")
        async with self.lock:
            tokens, log_probs = await asyncio.to_thread(self._generate, prompt_ids, sampling_params)
        return TokenOutput(token_ids=tokens, log_probs=log_probs, stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    async def update_weights(self, state, global_steps=None):
        async with self.lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected:
                raise RuntimeError(f"{LABEL}: weights the model does not have: {unexpected[:5]}")
            if missing and not all(k.endswith("lm_head.weight") for k in missing):  # tied embeddings
                raise RuntimeError(f"{LABEL}: weights not sent: {missing[:5]}")
            self.weights_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        return self.weights_version

    async def set_global_steps(self, global_steps):
        self.global_steps = global_steps

    # control calls the replica, the router and the trainer make; nothing to free or abort on CPU
    async def wake_up(self, tags=None):
        return None

    async def sleep(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def wait_for_requests_to_drain(self):
        async with self.lock:
            return None

    async def abort_all_requests(self, reject_request=False):
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self):
        return None

    async def abort_request(self, request_id):
        return {"aborted": False, "request_id": request_id}

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


def replica_class():
    import ray

    from verl.workers.rollout.replica import RolloutReplica

    check_verl()

    class HFStandinReplica(RolloutReplica):
        async def launch_servers(self):
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            assert len(self.workers) == self.world_size == 1, f"{LABEL}: one worker per replica (tensor parallel 1)"
            node_id = await self.workers[0].__ray_call__.remote(lambda w: ray.get_runtime_context().get_node_id())
            server = ray.remote(HFStandinServer).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                name=server_name(self.replica_rank), max_concurrency=self.max_concurrency, num_cpus=0,
            ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            self.servers = [server]
            address, port = await server.get_server_address.remote()
            self._server_handle = server
            self._server_address = f"{address}:{port}"

    return HFStandinReplica


def adapter_class():
    import ray
    import torch

    from verl.workers.rollout.base import BaseRollout

    check_verl()

    class HFStandinAdapter(BaseRollout):
        def __init__(self, config, model_config, device_mesh, replica_rank=-1):
            super().__init__(config, model_config, device_mesh)
            self.replica_rank = int(os.environ["RANK"]) if replica_rank == -1 else replica_rank
            self.server = None
            self.sleep_level = 2

        def _server(self):
            if self.server is None:
                self.server = ray.get_actor(server_name(self.replica_rank))
            return self.server

        async def resume(self, tags):
            return None

        async def release(self):
            return None

        @torch.no_grad()
        async def update_weights(self, weights, global_steps=None, wire_format="named_tensors", **kwargs):
            assert wire_format == "named_tensors", f"{LABEL}: wire_format {wire_format!r}"
            from verl.workers.rollout.utils import ensure_async_iterator

            state = {}
            async for name, tensor in ensure_async_iterator(weights):
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                state[name] = tensor.detach().to("cpu", copy=True)
            await self._server().update_weights.remote(state, global_steps=global_steps)

    return HFStandinAdapter


def register(base_module=None, replica_module=None):
    """Register `hf-standin` in verl 0.9.1's two rollout registries (called by the post-import hooks)."""
    if base_module is not None:
        base_module._ROLLOUT_REGISTRY[(NAME, "async")] = "rlbox_verl_hf_server.HFStandinAdapter"
    if replica_module is not None:
        replica_module.RolloutReplicaRegistry.register(NAME, replica_class)


def __getattr__(name):  # get_rollout_class imports "rlbox_verl_hf_server.HFStandinAdapter"
    if name == "HFStandinAdapter":
        return adapter_class()
    raise AttributeError(name)
