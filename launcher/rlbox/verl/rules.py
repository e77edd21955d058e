"""The pinned verl's own start-up config checks, per pinned verl commit and entrypoint.

Each rule is verl's check re-stated over the composed Hydra config (``get(dotted_key)``), with
verl's own words and the file:line it holds at, so a config that verl would reject after
minutes (model download, datasets, Ray workers) is rejected in a second. Rule ids (A*, B*, W*)
are those of docs/research/verl-startup-and-ray.md, which lists each with a violating override
and verl's result at both commits (tests/fixtures/verl_rules.yaml keeps that ground truth).

What runs depends on the commit and the entrypoint:

- 796871d (verl_pt27_25rc3): ``RayPPOTrainer._validate_config`` runs for main_ppo and main_dapo;
- 65eb019 (verl_pt27_cann82rc1): ``utils/config.validate_config`` runs for main_ppo only
  (main_dapo calls nothing; its config meets only the worker-side checks);
- both: the entrypoint's worker choice, the dataclasses' ``__post_init__`` (built again in the
  workers), the FSDP workers' normalisation and device meshes, the rollout's sizes.

Not re-stated: checks that need the model's HF config or files (max_position_embeddings, an
empty dataset, custom classes), ``???`` values, and the Megatron workers' own normalisation.
"""

from __future__ import annotations

from rlbox.verl.outcome import Problem

A = "796871d7d092f7cbc6a64e7f4a3796f7a2217f5e"
B = "65eb019a81012317b98afc17ce8fd36342a5e786"
RELEASES = {A: "verl_pt27_25rc3", B: "verl_pt27_cann82rc1"}
AR = "actor_rollout_ref."
ACT = AR + "actor."
LOSS_AGG = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
REWARD_MANAGERS = ("batch", "dapo", "naive", "prime")  # registered at both commits (workers/reward_manager)
FSDP = ("fsdp", "fsdp2")


def pinned(commit: str | None) -> str | None:
    """The pinned commit whose restated rules apply: ``commit`` when it is one of them (a prefix of
    at least 7 hex digits will do), else None. Another verl never gets these rules: its own code
    checks it (``verl_own``), or validation says that its start-up checks did not run."""
    for full in RELEASES:
        if commit and len(commit) >= 7 and full.startswith(commit.lower()):
            return full
    return None


class Rules:
    """One verl commit's checks over one composed config; ``run()`` gives every problem."""

    def __init__(self, get, commit: str, module: str):
        self.get, self.commit, self.at_a = get, commit, commit == A
        self.dapo = module.startswith("recipe.dapo")
        self.out: list[Problem] = []
        # the trainer-level validation: 796871d both entrypoints, 65eb019 main_ppo only
        self.trainer = self.at_a or not self.dapo
        g = get
        self.use_ref = bool(g("algorithm.use_kl_in_reward") or g(ACT + "use_kl_loss"))
        enable = g("critic.enable")
        self.use_critic = bool(enable) if enable is not None else g("algorithm.adv_estimator") == "gae"
        self.dynamic = bool(g(ACT + "use_dynamic_bsz"))
        self.strategy = g(ACT + "strategy")

    def say(self, where_a: str | None, where_b: str | None, keys, text: str) -> None:
        """A problem, if verl at this commit has the check (``where_*``: its file:line there)."""
        where = where_a if self.at_a else where_b
        if where:
            self.out.append(Problem(tuple(keys), f"verl {self.commit[:7]} rejects this at start-up ({where}): {text}"))

    def ints(self, *keys):
        values = [self.get(k) for k in keys]
        return values if all(isinstance(v, int) and not isinstance(v, bool) for v in values) else None

    def run(self) -> list[Problem]:
        n = self.ints("trainer.nnodes", "trainer.n_gpus_per_node")
        if not n or n[0] * n[1] <= 0:
            return self.out
        self.world = n[0] * n[1]
        self.entrypoint()
        self.trainer_batch()
        self.actor()
        self.log_prob_micro()
        self.critic()
        self.rollout()
        self.workers()
        return self.out

    # -- the entrypoint: worker classes, reward manager, resource pools ----------------------

    def entrypoint(self) -> None:
        g, st = self.get, self.strategy
        if g(AR + "hybrid_engine") is False:  # A1
            self.say("ray_trainer.py:348", "ray_trainer.py:317", [AR + "hybrid_engine"], "Currently, only support hybrid engine")
        if st not in (*FSDP, "megatron"):  # A26
            self.say("main_dapo.py:98-99" if self.dapo else "main_ppo.py:167-168",
                     "main_dapo.py:109" if self.dapo else "main_ppo.py:139", [ACT + "strategy"],
                     f"NotImplementedError (actor strategy {st!r} is not fsdp, fsdp2 or megatron)")
        critic = g("critic.strategy")
        if st in FSDP and critic not in FSDP:  # A24 (65eb019: main_dapo only)
            self.say("main_dapo.py:86" if self.dapo else "main_ppo.py:130-131", "main_dapo.py:96" if self.dapo else None,
                     ["critic.strategy"], f"AssertionError: critic.strategy {critic!r} must be fsdp or fsdp2 with an FSDP actor")
        if st == "megatron" and critic != st:  # A25 (65eb019: main_dapo only)
            self.say("main_dapo.py:93" if self.dapo else "main_ppo.py:155-156", "main_dapo.py:103" if self.dapo else None,
                     ["critic.strategy"], f"AssertionError: critic.strategy {critic!r} must equal the actor's (megatron)")
        if not self.dapo and critic not in (*FSDP, "megatron"):  # B6: 65eb019 chooses the critic on its own
            self.say(None, "main_ppo.py:164", ["critic.strategy"],
                     f"NotImplementedError (critic strategy {critic!r} is not fsdp, fsdp2 or megatron)")
        legacy = g("trainer.use_legacy_worker_impl")
        legacy = "auto" if legacy is None else legacy
        rm = bool(g("reward_model.enable"))
        if not self.dapo and legacy not in ("auto", "enable", "disable"):  # A27
            at_b = "main_ppo.py:158" if critic in FSDP else "main_ppo.py:213" if rm else None
            self.say("main_ppo.py:146" if st in FSDP else None, at_b, ["trainer.use_legacy_worker_impl"],
                     f"Invalid use_legacy_worker_impl: {legacy}")
        rm_strategy = g("reward_model.strategy")
        if rm and rm_strategy not in (*FSDP, "megatron") and (self.dapo or self.at_a or legacy != "disable"):  # A28
            self.say("main_dapo.py:129" if self.dapo else "main_ppo.py:201",
                     "main_dapo.py:139" if self.dapo else "main_ppo.py:207", ["reward_model.strategy"],
                     f"NotImplementedError (reward model strategy {rm_strategy!r} is not fsdp, fsdp2 or megatron)")
        if not self.dapo and g("reward_model.enable_resource_pool"):  # B5
            for key in ("n_gpus_per_node", "nnodes"):
                v = g(f"reward_model.{key}")
                if isinstance(v, int) and v <= 0:
                    self.say(None, "main_ppo.py:180-183", [f"reward_model.{key}"],
                             f"config.reward_model.{key} must be greater than 0")
        manager = g("reward_model.reward_manager") or "naive"
        if manager not in REWARD_MANAGERS:  # A29
            self.say("reward_manager/registry.py:54", "reward_manager/registry.py:54", ["reward_model.reward_manager"],
                     f"Unknown reward manager: {manager}")
        buffer, resp = g("reward_model.overlong_buffer.len"), g("data.max_response_length")
        if self.dapo and manager == "dapo" and isinstance(buffer, int) and isinstance(resp, int) and resp < buffer:  # A30
            self.say("reward_manager/dapo.py:49-51", "reward_manager/dapo.py:49-51",
                     ["data.max_response_length", "reward_model.overlong_buffer.len"],
                     "max_resp_len must be larger than overlong_buffer.len")

    # -- the trainer's batch-size checks (A2, A3) ----------------------------------------------

    def trainer_batch(self) -> None:
        if not self.trainer or (self.dynamic and not self.at_a):  # 65eb019 skips them with use_dynamic_bsz
            return
        g, world = self.get, self.world
        minimal = world
        if self.strategy == "megatron":  # A2
            m = self.ints(ACT + "megatron.tensor_model_parallel_size", ACT + "megatron.pipeline_model_parallel_size",
                          ACT + "megatron.context_parallel_size")
            if not m:
                return
            mp, cp = m[0] * m[1], m[2]
            if mp * cp <= 0:
                return
            if world % (mp * cp):
                self.say("ray_trainer.py:389-399", "utils/config.py:90-101",
                         [ACT + "megatron.tensor_model_parallel_size", ACT + "megatron.pipeline_model_parallel_size",
                          ACT + "megatron.context_parallel_size"],
                         f"n_gpus ({world}) must be divisible by model_parallel_size ({mp}) times context_parallel_size ({cp})")
            micro = g(ACT + "ppo_micro_batch_size_per_gpu")
            if not isinstance(micro, int):
                return
            minimal = world // (mp * cp) * micro
        v = self.ints("data.train_batch_size", AR + "rollout.n")
        if v and minimal > 0 and (v[0] * v[1]) % minimal:  # A3
            self.say("ray_trainer.py:409-414", "utils/config.py:108-113", ["data.train_batch_size", AR + "rollout.n"],
                     f"real_train_batch_size ({v[0] * v[1]}) must be divisible by minimal possible batch size ({minimal})")

    # -- the actor's config dataclass (built by the trainer, and again in the worker) -------------

    def actor(self) -> None:
        g, st = self.get, self.strategy
        micro, per_gpu = g(ACT + "ppo_micro_batch_size"), g(ACT + "ppo_micro_batch_size_per_gpu")
        if not self.dynamic:
            if micro is not None and per_gpu is not None:  # A5
                self.say("workers/config/actor.py:116-122", "workers/config/actor.py:128-134", [ACT + "ppo_micro_batch_size"],
                         "[actor] You have set both 'actor.ppo_micro_batch_size' AND 'actor.ppo_micro_batch_size_per_gpu'. "
                         "Please remove 'actor.ppo_micro_batch_size' because only '*_ppo_micro_batch_size_per_gpu' is "
                         "supported (the former is deprecated).")
            if micro is None and per_gpu is None:  # A6
                self.say("workers/config/actor.py:124-127", "workers/config/actor.py:136-139", [ACT + "ppo_micro_batch_size_per_gpu"],
                         "[actor] Please set at least one of 'actor.ppo_micro_batch_size' or "
                         "'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled.")
        mode = g(ACT + "loss_agg_mode")
        if mode not in LOSS_AGG:  # A7
            self.say("workers/config/actor.py:129-136", "workers/config/actor.py:141-148", [ACT + "loss_agg_mode"],
                     f"Invalid loss_agg_mode: {mode}")
        if st in FSDP:
            self.optimizer(ACT + "optim", "actor")
            engine = g(ACT + "fsdp_config.strategy")
            if not self.at_a and engine is not None and engine not in FSDP:  # B1
                self.say(None, "workers/config/engine.py:119-120", [ACT + "fsdp_config.strategy"], f"strategy {engine} not supported")
        megatron = g(ACT + "megatron.strategy")
        if st == "megatron" and not self.at_a and megatron is not None and megatron != "megatron":  # B2
            self.say(None, "workers/config/engine.py:75-77", [ACT + "megatron.strategy"],
                     f"AssertionError: McoreEngineConfig strategy {megatron!r} must be megatron")
        self.profiler()
        if not self.trainer:
            return
        # ActorConfig.validate (A8-A10), FSDPActorConfig.validate (A11): called by the trainer only
        batch, mini = g("data.train_batch_size"), g(ACT + "ppo_mini_batch_size")
        sp = g(ACT + "ulysses_sequence_parallel_size") or 1
        if not self.dynamic:
            if isinstance(batch, int) and isinstance(mini, int) and batch < mini:  # A8
                self.say("workers/config/actor.py:141-145", "workers/config/actor.py:153-157",
                         ["data.train_batch_size", ACT + "ppo_mini_batch_size"],
                         f"train_batch_size ({batch}) must be >= actor.ppo_mini_batch_size ({mini})")
            if isinstance(micro, int) and micro > 0:
                if isinstance(mini, int) and mini % micro:  # A9
                    self.say("workers/config/actor.py:148-152", "workers/config/actor.py:160-164",
                             [ACT + "ppo_mini_batch_size", ACT + "ppo_micro_batch_size"],
                             f"ppo_mini_batch_size ({mini}) must be divisible by ppo_micro_batch_size ({micro})")
                if isinstance(sp, int) and micro * sp < self.world:  # A10
                    self.say("workers/config/actor.py:154-158", "workers/config/actor.py:166-170",
                             [ACT + "ppo_micro_batch_size", ACT + "ulysses_sequence_parallel_size"],
                             f"ppo_micro_batch_size ({micro}) * ulysses_sequence_parallel_size ({sp}) must be >= n_gpus ({self.world})")
        if st in FSDP and isinstance(sp, int) and sp > 1 and not g(AR + "model.use_remove_padding"):  # A11
            self.say("workers/config/actor.py:230-234", "workers/config/actor.py:244-248",
                     [ACT + "ulysses_sequence_parallel_size", AR + "model.use_remove_padding"],
                     "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`.")
        rank = g(AR + "model.lora_rank")
        if isinstance(rank, int) and rank > 512 and g(AR + "rollout.name") == "vllm":  # B3
            self.say(None, "utils/config.py:197-199", [AR + "model.lora_rank"], "LoRA rank in vLLM must be less than or equal to 512")

    def optimizer(self, node: str, who: str) -> None:
        """FSDPOptimizerConfig.__post_init__ (A12): a bare AssertionError in verl."""
        g = self.get
        warmup = g(node + ".warmup_style")
        if self.at_a or warmup is not None:
            if warmup not in ("constant", "cosine"):
                self.say("workers/config/optimizer.py:63", "workers/config/optimizer.py:77-78", [node + ".warmup_style"],
                         f"AssertionError in the {who}'s FSDPOptimizerConfig: warmup_style {warmup!r} is not constant or cosine")
        kind = g(node + ".lr_scheduler_type")
        if not self.at_a and kind not in ("constant", "cosine"):
            self.say(None, "workers/config/optimizer.py:83", [node + ".lr_scheduler_type"],
                     f"AssertionError in the {who}'s FSDPOptimizerConfig: lr_scheduler_type {kind!r} is not constant or cosine")

    def profiler(self) -> None:
        """ProfilerConfig.__post_init__ (A23): 796871d reads actor_rollout_ref.profiler in the
        worker; 65eb019 the actor's (and the reference policy's) own profiler."""
        nodes = [AR + "profiler"] if self.at_a else [ACT + "profiler"] + ([AR + "ref.profiler"] if self.use_ref else [])
        for node in nodes:
            ranks = self.get(node + ".ranks")
            if ranks is not None and not isinstance(ranks, (list, tuple, set)) and type(ranks).__name__ != "ListConfig":
                self.say("utils/profiler/config.py:53-55", "utils/profiler/config.py:155-156", [node + ".ranks"],
                         f"Profiler ranks must be of type list, got {type(ranks)}")

    # -- the trainer's log-prob and reward-model micro batches (A14-A16, A22) -------------------

    def log_prob_micro(self) -> None:
        if not self.trainer:
            return
        g = self.get
        parts = []
        if not self.dynamic:
            parts = ([("actor_rollout_ref.ref", "log_prob_micro_batch_size")] if self.use_ref else []) \
                + [("actor_rollout_ref.rollout", "log_prob_micro_batch_size")]
        if g("reward_model.enable") and not g("reward_model.use_dynamic_bsz"):
            parts.append(("reward_model", "micro_batch_size"))
        lines = {"actor_rollout_ref.ref": ("ray_trainer.py:458-463", "utils/config.py:155-160"),
                 "actor_rollout_ref.rollout": ("ray_trainer.py:466-470", "utils/config.py:163-168"),
                 "reward_model": ("ray_trainer.py:474-477", "utils/config.py:171-174")}
        for name, param in parts:
            one, per = g(f"{name}.{param}"), g(f"{name}.{param}_per_gpu")
            if one is None and per is None:  # A14, A15, A16
                self.say(*lines[name], [f"{name}.{param}_per_gpu"],
                         f"[{name}] Please set at least one of '{name}.{param}' or '{name}.{param}_per_gpu'.")
            elif one is not None and per is not None:
                self.say(*lines[name], [f"{name}.{param}"],
                         f"[{name}] You have set both '{name}.{param}' AND '{name}.{param}_per_gpu'. Please remove "
                         f"'{name}.{param}' because only '*_{param}_per_gpu' is supported (the former is deprecated).")
        if g(AR + "rollout.val_kwargs.do_sample"):  # A22
            temp = g(AR + "rollout.temperature")
            if isinstance(temp, (int, float)) and not temp > 0:
                self.say("ray_trainer.py:495-498", "utils/config.py:192-195",
                         [AR + "rollout.val_kwargs.do_sample", AR + "rollout.temperature"],
                         "validation gen temperature should be greater than 0 when enabling do_sample")

    # -- the critic's config dataclass (A17-A21) -------------------------------------------------

    def critic(self) -> None:
        if not self.use_critic:
            return
        g = self.get
        fsdp = g("critic.strategy") in FSDP
        dynamic = bool(g("critic.use_dynamic_bsz"))
        micro, per_gpu, mini = g("critic.ppo_micro_batch_size"), g("critic.ppo_micro_batch_size_per_gpu"), g("critic.ppo_mini_batch_size")
        keys = ["critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu"]
        if not dynamic:
            if micro is None and per_gpu is None:  # A17 (verl names critic.micro_batch_size: its words, the real keys)
                self.say("workers/config/critic.py:84,125-126", "workers/config/critic.py:99,140-141", keys,
                         "[critic] Please set at least one of 'critic.micro_batch_size' or 'critic.micro_batch_size_per_gpu'.")
            elif micro is not None and per_gpu is not None:
                self.say("workers/config/critic.py:84,128-133", "workers/config/critic.py:99,143-148", keys,
                         "[critic] You have set both 'critic.micro_batch_size' AND 'critic.micro_batch_size_per_gpu'. "
                         "Please remove 'critic.micro_batch_size' because only '*_micro_batch_size_per_gpu' is supported "
                         "(the former is deprecated).")
            if isinstance(micro, int) and micro > 0 and isinstance(mini, int) and mini % micro:  # A18
                self.say("workers/config/critic.py:86-91", "workers/config/critic.py:101-106",
                         ["critic.ppo_mini_batch_size", "critic.ppo_micro_batch_size"],
                         f"[critic] ppo_mini_batch_size ({mini}) must be divisible by ppo_micro_batch_size ({micro})")
        sp = g("critic.ulysses_sequence_parallel_size") or 1
        if fsdp and isinstance(sp, int) and sp > 1 and not g("critic.model.use_remove_padding"):  # A19
            self.say("workers/config/critic.py:187-192", "workers/config/critic.py:202-207",
                     ["critic.ulysses_sequence_parallel_size", "critic.model.use_remove_padding"],
                     "When using sequence parallelism for critic, you must enable `use_remove_padding`.")
        if fsdp:
            self.optimizer("critic.optim", "critic")
        if not self.trainer or dynamic:
            return
        batch = g("data.train_batch_size")
        if isinstance(batch, int) and isinstance(mini, int) and batch < mini:  # A20
            self.say("workers/config/critic.py:100-105", "workers/config/critic.py:115-120",
                     ["data.train_batch_size", "critic.ppo_mini_batch_size"],
                     f"train_batch_size ({batch}) must be >= critic.ppo_mini_batch_size ({mini})")
        if fsdp and isinstance(micro, int) and isinstance(sp, int) and micro * sp < self.world:  # A21
            self.say("workers/config/critic.py:198-205", "workers/config/critic.py:213-220",
                     ["critic.ppo_micro_batch_size", "critic.ulysses_sequence_parallel_size"],
                     f"critic.ppo_micro_batch_size ({micro}) * ulysses_sequence_parallel_size ({sp}) must be >= n_gpus ({self.world})")

    # -- the rollout (B4, W7, W9) ----------------------------------------------------------------

    def rollout(self) -> None:
        g, world = self.get, self.world
        r = AR + "rollout."
        tp = g(r + "tensor_model_parallel_size")
        dp, pp, ep = (g(r + k) for k in ("data_parallel_size", "pipeline_model_parallel_size", "expert_parallel_size"))
        name = g(r + "name")
        if not self.at_a:  # RolloutConfig.__post_init__, in the worker's _build_rollout
            if isinstance(ep, int) and ep > 1 and isinstance(tp, int) and isinstance(dp, int) and ep != tp * dp:  # B4
                self.say(None, "workers/config/rollout.py:183-186", [r + "expert_parallel_size"],
                         "expert_parallel_size must be equal to tensor_model_parallel_size * data_parallel_size")
            if isinstance(pp, int) and pp > 1 and name in ("vllm", "sglang"):
                self.say(None, "workers/config/rollout.py:188-192", [r + "pipeline_model_parallel_size"],
                         f"Current rollout self.name={name!r} not implemented pipeline_model_parallel_size > 1 yet.")
        if self.strategy in FSDP and isinstance(tp, int) and tp > 0:  # W7
            if self.at_a and world % tp:
                self.say("fsdp_workers.py:469-473", None, [r + "tensor_model_parallel_size"],
                         f"rollout world_size: {world} is not divisible by infer_tp: {tp}")
            size = tp * (dp if isinstance(dp, int) else 1) * (pp if isinstance(pp, int) else 1)
            if not self.at_a and size > 0 and world % size:
                self.say(None, "fsdp_workers.py:573-579", [r + "tensor_model_parallel_size", r + "data_parallel_size",
                                                           r + "pipeline_model_parallel_size"],
                         f"rollout world_size: {world} is not divisible by infer_world_size: {size}")
        tokens = g(r + "max_num_batched_tokens")
        tokens = 8192 if tokens is None else tokens
        length = g(r + "max_model_len") or sum(x for x in (g("data.max_prompt_length"), g("data.max_response_length"))
                                                if isinstance(x, int))
        if name == "vllm" and g(r + "mode") != "async" and g(r + "enable_chunked_prefill") \
                and isinstance(tokens, int) and isinstance(length, int) and tokens < length:  # W9
            self.say("vllm_rollout_spmd.py:139-145", "vllm_rollout_spmd.py:165-171",
                     [r + "max_num_batched_tokens", r + "max_model_len"],
                     f"Enable chunked prefill, max_num_batched_tokens is smaller than max_model_len, please increase "
                     f"max_num_batched_tokens or disable chunked prefill ({tokens} < {length})")

    # -- the FSDP workers' device meshes and normalisation (W1-W6) ------------------------------

    def workers(self) -> None:
        g = self.get
        if self.strategy in FSDP:
            lines = {"mesh": ("fsdp_workers.py:87-94,136", "fsdp_workers.py:98-105,159"),
                     "sp": ("fsdp_workers.py:140-145", "fsdp_workers.py:163-168"),
                     "zero": ("fsdp_workers.py:179-185", "fsdp_workers.py:233-239"),
                     "micro": ("fsdp_workers.py:187-197", "fsdp_workers.py:241-256")}
            self.normalise(ACT, ACT + "fsdp_config.fsdp_size", g(AR + "rollout.n"), lines, zero=True)
        if self.use_critic and g("critic.strategy") in FSDP:
            lines = {"mesh": ("fsdp_workers.py:947-950", "fsdp_workers.py:1144-1147"),
                     "sp": ("fsdp_workers.py:953-958", "fsdp_workers.py:1150-1155"),
                     "micro": ("fsdp_workers.py:967-987", "fsdp_workers.py:1184-1194")}
            self.normalise("critic.", "critic.model.fsdp_config.fsdp_size", g("critic.rollout_n"), lines, zero=False)

    def normalise(self, node: str, fsdp_key: str, n, lines, zero: bool) -> None:
        g, world = self.get, self.world
        fsdp = g(fsdp_key)
        if isinstance(fsdp, int) and 0 < fsdp < world and world % fsdp:  # W4
            self.say(*lines["mesh"], [fsdp_key], f"torch init_device_mesh fails: world size {world} is not divisible "
                     f"by fsdp_size {fsdp} (mesh ({world // fsdp}, {fsdp}))")
        sp = g(node + "ulysses_sequence_parallel_size") or 1
        if not isinstance(sp, int) or sp <= 0:
            return
        if sp > 1 and world % sp:  # W5
            self.say(*lines["sp"], [node + "ulysses_sequence_parallel_size"], f"torch init_device_mesh fails: world "
                     f"size {world} is not divisible by ulysses_sequence_parallel_size {sp}")
            return
        mini = g(node + "ppo_mini_batch_size")
        if not (isinstance(mini, int) and isinstance(n, int)) or world // sp == 0:
            return
        norm = mini * n // (world // sp)
        if zero and norm <= 0:  # W1
            self.say(*lines["zero"], [node + "ppo_mini_batch_size"], f"ppo_mini_batch_size {norm} should be larger than 0 after normalization")
            return
        micro = g(node + "ppo_micro_batch_size")
        per_gpu = micro // (world // sp) if isinstance(micro, int) else g(node + "ppo_micro_batch_size_per_gpu")
        if isinstance(per_gpu, int) and per_gpu > 0 and norm % per_gpu:  # W2, W6 (W3 cannot fire once W2 holds)
            self.say(*lines["micro"], [node + "ppo_micro_batch_size_per_gpu"],
                     f"normalized ppo_mini_batch_size {norm} should be divisible by ppo_micro_batch_size_per_gpu {per_gpu}")


def check(get, commit: str, module: str) -> list[Problem]:
    """Every start-up check verl ``commit`` makes for entrypoint ``module`` that this config fails."""
    return Rules(get, commit, module).run()
