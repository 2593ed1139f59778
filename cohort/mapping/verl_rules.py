"""verl's `main_ppo` options (dotted Hydra overrides) mapped to cohort's fields: the table `VERL_RULES`.

Units, where a port usually goes wrong:
- `data.train_batch_size` is prompts per generation batch; cohort's rollout.generation_batch_size counts
  completions (× `actor_rollout_ref.rollout.n`).
- `actor.ppo_mini_batch_size` is prompts per optimizer step (verl multiplies it by n itself): cohort's
  train.prompts_per_step; their ratio is the optimizer steps per generation batch.
- `actor.ppo_micro_batch_size_per_gpu` is completions per forward/backward on one GPU: train.micro_batch_size
  (per process).
- verl counts *generation batches* (`trainer.total_training_steps`, its learning-rate schedule, its warm-up);
  cohort counts *optimizer steps*: × (train_batch_size / ppo_mini_batch_size) × ppo_epochs.
- `trainer.total_epochs`: epochs × floor(rows / train_batch_size) generation batches (verl's loader drops the
  last partial batch), known only when the training file is on this machine (or `--rows`).

Defaults given on a rule are verl's own where they differ from cohort's and change the run (verl's ppo_trainer.yaml).
"""

from __future__ import annotations

from typing import Any

from cohort.mapping.rules import (MISSING, Entry, Options, Rule, Unmappable, flow, mapped, model_path, none_of,
                                  steps_for_epochs, whole)
from cohort.mapping.verl_algorithms import (AGG, BOTH, ESTIMATOR, HIGH, LOSS_MODE, LOW, aggregation, dual_clip,
                                            dynamic_sampling, estimator, gen_batch_size, loss_mode, named_by_loss_mode,
                                            rewards, sapo_temperature, when_ppo)

AR = "actor_rollout_ref."
ACTOR, ROLLOUT, REF, MODEL = AR + "actor.", AR + "rollout.", AR + "ref.", AR + "model."
TBS, N, MINI, EPOCHS = "data.train_batch_size", ROLLOUT + "n", ACTOR + "ppo_mini_batch_size", ACTOR + "ppo_epochs"
KL_LOSS, KL_REWARD = ACTOR + "use_kl_loss", "algorithm.use_kl_in_reward"
LOGPROB_NOTE = ("cohort computes log-probs in train.micro_batch_size micro-batches; train.logprob_chunk_size bounds "
                "the logits held at once")


def _steps_per_generation(o: Options) -> int:
    """Optimizer steps per generation batch: data.train_batch_size / actor.ppo_mini_batch_size (prompts / prompts)."""
    return whole(o.get(TBS) / o.get(MINI), f"{TBS} / {MINI} = {o.get(TBS)} / {o.get(MINI)}")


def _optimizer_steps_per_batch(o: Options) -> tuple[int, str]:
    """(optimizer steps per verl step, the arithmetic): steps per generation batch × ppo_epochs."""
    k, epochs = _steps_per_generation(o), o.get(EPOCHS)
    return k * epochs, f"({o.get(TBS)} / {o.get(MINI)} = {k} optimizer steps per generation batch × {o.show(EPOCHS)})"


def _generation_batch(value: int, o: Options) -> list[Entry]:
    return [Entry("rollout.generation_batch_size", value * o.get(N),
                  f"{o.show(TBS)} prompts × {o.show(N)} = {value * o.get(N)} completions")]


def _mini_batch(value: int, o: Options) -> list[Entry]:
    k = _steps_per_generation(o)
    return [Entry("train.prompts_per_step", value, f"{o.show(MINI)} prompts per optimizer step (prompts in both; "
                  f"{o.get(TBS)} / {value} = {k} optimizer steps per generation batch)")]


def _global_micro_batch(value: int, o: Options) -> list[Entry]:
    gpus = o.get("trainer.n_gpus_per_node") * o.get("trainer.nnodes")
    per = whole(value / gpus, f"{ACTOR}ppo_micro_batch_size / GPUs = {value} / {gpus}")
    return [Entry("train.micro_batch_size", per, f"{ACTOR}ppo_micro_batch_size={value} completions over {gpus} GPUs "
                  f"(trainer.n_gpus_per_node × trainer.nnodes) = {per} per process")]


def _total_epochs(value: Any, o: Options) -> list[Entry]:
    if o.has("trainer.total_training_steps"):
        if not o.has("trainer.total_epochs"):
            return []  # (verl's default, which total_training_steps overrides)
        raise Unmappable("verl ignores it when trainer.total_training_steps is set, which sets train.max_steps")
    k, text = _optimizer_steps_per_batch(o)
    return steps_for_epochs("trainer.total_epochs", o, o.get(TBS), k, text)


def _total_steps(value: int, o: Options) -> list[Entry]:
    k, text = _optimizer_steps_per_batch(o)
    return [Entry("train.max_steps", value * k, f"{o.show('trainer.total_training_steps')} generation batches × {text} = {value * k}")]


def _verl_batches(o: Options) -> int | None:
    """verl's total training steps (generation batches), when knowable."""
    if o.has("trainer.total_training_steps"):
        return o.get("trainer.total_training_steps")
    return None if o.rows is None else o.rows // o.get(TBS) * o.get("trainer.total_epochs")


def _warmup_steps(field: str, prefix: str):
    """verl's lr_warmup_steps count generation batches (its scheduler steps once per batch); cohort's optimizer steps."""

    def convert(value: int, o: Options) -> list[Entry]:
        key = prefix + "optim.lr_warmup_steps"
        if value < 0:  # verl: -1 = use lr_warmup_steps_ratio
            if o.has(prefix + "optim.lr_warmup_steps_ratio"):
                return []  # (the ratio's line names this one)
            return [Entry(field, 0, f"{o.show(key)}: the ratio decides, 0 by default")]
        k, text = _optimizer_steps_per_batch(o)
        return [Entry(field, value * k, f"{o.show(key)} generation batches × {text} = {value * k} (verl steps its "
                      "schedule once per generation batch, cohort once per optimizer step)")]

    return convert


def _warmup_ratio(field: str, prefix: str):
    def convert(value: float, o: Options) -> list[Entry]:
        return _warmup_from_ratio(value, o, field, prefix)

    return convert


def _warmup_from_ratio(value: float, o: Options, field: str, prefix: str) -> list[Entry]:
    steps_key = prefix + "optim.lr_warmup_steps"
    if o.has(steps_key) and o.get(steps_key) >= 0:
        raise Unmappable(f"{steps_key} = {o.get(steps_key)} is set, and verl then ignores the ratio")
    batches = _verl_batches(o)
    if batches is None:
        raise Unmappable("the run's length is not knowable here: set train.warmup_steps = ratio × train.max_steps")
    k, text = _optimizer_steps_per_batch(o)
    warm = int(value * batches) * k
    shown = f" ({o.show(steps_key)})" if o.has(steps_key) else ""
    return [Entry(field, warm, f"int({o.show(prefix + 'optim.lr_warmup_steps_ratio')} × {batches} generation "
                  f"batches) × {text} = {warm}{shown}")]


def _kl_loss(value: bool, o: Options) -> list[Entry]:
    also = f", {o.show(KL_REWARD)}" if o.has(KL_REWARD) else ""
    if value:
        return [Entry("algorithm.kl_placement", "loss", o.show(KL_LOSS) + also)]
    if o.get(KL_REWARD):
        return []  # (the reward's KL line names this one)
    return [Entry("algorithm.beta", 0.0, f"{o.show(KL_LOSS)}{also}: no KL term, no reference model")]


def _kl_reward(value: bool, o: Options) -> list[Entry]:
    if not value:
        return []  # (named on the KL loss line when given)
    if o.get(KL_LOSS):
        raise Unmappable(f"cohort puts the KL term in one place; {KL_LOSS}=True is kept (algorithm.kl_placement=loss)")
    coef = "algorithm.kl_ctrl.kl_coef"
    return [Entry("algorithm.kl_placement", "reward", f"{o.show(KL_REWARD)}, {o.show(KL_LOSS)}"),
            Entry("algorithm.beta", o.get(coef), o.show(coef))]


def _when_kl(placement_key: str, inner: Rule, *, named_by_placement: bool = False) -> Rule:
    """`inner` applies only when verl's KL term of that placement is on; else the option has no effect.
    `named_by_placement`: the placement's own line already carries this option (kl_ctrl.kl_coef)."""

    def convert(value: Any, o: Options) -> list[Entry]:
        if o.get(placement_key):
            return [] if named_by_placement else inner.apply(value, o)
        if not o.has(inner.source):
            return []
        raise Unmappable(f"no effect in verl: {placement_key} is False")

    return Rule(inner.source, inner.targets, convert, inner.note, inner.default)


KL_ESTIMATORS = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "low_var_kl", "k3": "k3"}


def _clip_ratio(value: float, o: Options) -> list[Entry]:
    keys = {"algorithm.epsilon_low": LOW, "algorithm.epsilon_high": HIGH}
    out = [Entry(field, value, o.show(BOTH)) for field, key in keys.items() if not o.has(key)]
    if not out:
        raise Unmappable("overridden by clip_ratio_low and clip_ratio_high, as in verl")
    return out


def _epsilon(field: str, key: str):
    def convert(value: float, o: Options) -> list[Entry]:
        if field == "algorithm.epsilon_low" and value >= 1:
            raise Unmappable(f"{value} ≥ 1 puts the lower clip at 1 − {value} ≤ 0, so it never binds; cohort's "
                             "epsilon_low must be < 1: leave it at 0.2, or a value just under 1 for the same run")
        return [Entry(field, value, o.show(key))]

    return convert


def _top_k(value: int, o: Options) -> list[Entry]:
    return [Entry("rollout.top_k", max(int(value), 0), o.show(ROLLOUT + "top_k") + (" (verl's off; cohort's off is 0)" if value < 0 else ""))]


def _tensor_parallel(value: int, o: Options) -> list[Entry]:
    out = [Entry("engine.tensor_parallel_size", value, o.show(ROLLOUT + "tensor_model_parallel_size"))]
    if value > 1:
        out.append(Entry("engine.mode", "local_server", f"{o.show(ROLLOUT + 'tensor_model_parallel_size')}: cohort splits "
                         "a model over GPUs only with vLLM in its own process (on the GPUs after the trainer's)"))
    return out


def _free_cache(value: bool, o: Options) -> list[Entry]:
    if not value:
        return [Entry("engine.sleep_mode", 0, o.show(ROLLOUT + "free_cache_engine"))]
    if o.get(ROLLOUT + "tensor_model_parallel_size", 1) > 1 or _processes(o) > 1:
        raise Unmappable("cohort's engine.sleep_mode is for vLLM inside the one training process; with tensor "
                         "parallelism or several processes vLLM runs in its own process")
    return [Entry("engine.sleep_mode", 2, f"{o.show(ROLLOUT + 'free_cache_engine')}: level 2 discards the KV cache and "
                  "the weights during the update (the push rewrites every weight)")]


def _processes(o: Options) -> int:
    return o.get("trainer.n_gpus_per_node", 1) * o.get("trainer.nnodes", 1)


def _gpus(value: int, o: Options) -> list[Entry]:
    nodes = o.get("trainer.nnodes")
    total = value * nodes
    out = [Entry("train.num_processes", total, f"{o.show('trainer.n_gpus_per_node')} × {o.show('trainer.nnodes')}: one "
                 "training process per GPU (FSDP2)")]
    if nodes > 1:
        shown = f"{o.show('trainer.nnodes')} machines"
        out += [Entry("distributed.backend", "ray", f"{shown}: trainer actors on a Ray cluster, as verl runs"),
                Entry("distributed.ray_address", "auto", f"{shown}: join the running cluster (verl's scripts are "
                      "submitted to one; docs/deployment.md, \"Several machines\")"),
                Entry("distributed.gpus_per_trainer", 1.0, f"{shown}: one GPU per training process")]
    return out


def _nodes(value: int, o: Options) -> list[Entry]:
    if o.has("trainer.n_gpus_per_node"):
        return []  # (named on train.num_processes's line)
    raise Unmappable(f"{value} machine(s) without trainer.n_gpus_per_node: set train.num_processes to the GPUs in all, "
                     "with distributed.backend=ray (docs/deployment.md, \"Several machines\")")


def _every(field: str, key: str):
    """verl's test_freq / save_freq count generation batches (its global steps); cohort's counts optimizer steps."""

    def convert(value: int, o: Options) -> list[Entry]:
        if value is None or value <= 0:
            return [Entry(field, 0, f"{o.show(key)}: never" + (" (cohort still scores before and after training)"
                                                               if field == "run.eval_every" else ""))]
        if field == "run.save_every" and _processes(o) > 1:
            raise Unmappable(f"with {_processes(o)} training processes cohort does not write mid-run checkpoints yet (the "
                             "final model is saved); with one process, run.save_every does what save_freq does")
        k, text = _optimizer_steps_per_batch(o)
        return [Entry(field, value * k, f"{o.show(key)} generation batches (verl's global steps) × {text} = {value * k} "
                      "optimizer steps")]

    return convert


def _loggers(value: Any, o: Options) -> list[Entry]:
    names = [value] if isinstance(value, str) else list(value)
    known = [n for n in names if n in ("console", "wandb", "tensorboard")]
    others = [n for n in names if n not in known]
    note = f"; {', '.join(others)}: no cohort logger (metrics.jsonl is always written)" if others else ""
    return [Entry("run.loggers", list(dict.fromkeys(known + ["jsonl"])), f"{o.show('trainer.logger')}{note}")]


def _reward_function_name(value: str, o: Options) -> list[Entry]:
    if o.get("custom_reward_function.path") or not o.has("custom_reward_function.name"):
        return []  # (named on the rewards line)
    raise Unmappable("no effect without custom_reward_function.path")


def _on_rewards_line(condition: str):
    """An option the rewards line reads and names when `condition` (a key) is true; else without effect in verl."""

    def convert(value: Any, o: Options) -> list[Entry]:
        if o.get(condition):
            return []  # (named on the rewards line)
        raise Unmappable(f"no effect in verl: {condition} is {o.get(condition)}")

    return convert


def _overlong_option(value: Any, o: Options) -> list[Entry]:
    if o.get("reward_model.reward_manager") == "dapo" and not o.get("reward_model.enable"):
        return []  # (named on the rewards line when the buffer is on)
    raise Unmappable("read only by reward_model.reward_manager=dapo")


def _param_offload(value: bool, o: Options) -> list[Entry]:
    if value and _processes(o) == 1:
        raise Unmappable("verl offloads even on one GPU; cohort's train.param_offload is FSDP2's CPU offload, which "
                         "needs train.num_processes > 1: with one process, train.optimizer_offload is the offload it has")
    return [Entry("train.param_offload", value, o.show(ACTOR + "fsdp_config.param_offload"))]


def _train_files(field: str, key: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        files = [value] if isinstance(value, str) else list(value)
        return [Entry(field, files, o.show(key))]

    return convert


def _truncation(value: str, o: Options) -> list[Entry]:
    if o.get("data.filter_overlong_prompts"):
        if not o.has("data.truncation"):
            return []
        raise Unmappable("no effect beside data.filter_overlong_prompts=True (the long prompts are dropped first); "
                         "data.overlong_prompts=filter covers both")
    table = {"error": "error", "left": "truncate_left"}
    if value not in table:
        raise Unmappable(f"{flow(value)}: cohort cuts a prompt only on the left (data.overlong_prompts=truncate_left), "
                         "or filters it (filter), or stops (error)")
    return [Entry("data.overlong_prompts", table[value], o.show("data.truncation"))]


def _filter_overlong(value: bool, o: Options) -> list[Entry]:
    if value:
        return [Entry("data.overlong_prompts", "filter", o.show("data.filter_overlong_prompts"))]
    return []  # (data.truncation decides; its line names this one)


def _betas(value: list[float], o: Options) -> list[Entry]:
    shown = o.show(ACTOR + "optim.betas")
    return [Entry("train.adam_beta1", value[0], shown), Entry("train.adam_beta2", value[1], shown)]


def _dynamic_batch(value: bool, o: Options) -> list[Entry]:
    if not value:
        return []  # (verl's default: fixed micro-batches, as cohort's)
    key = ACTOR + "ppo_max_token_len_per_gpu"
    return [Entry("train.max_tokens_per_microbatch", o.get(key), f"{o.show(ACTOR + 'use_dynamic_bsz')}, {o.show(key)} "
                  "(cohort counts padded tokens over length-sorted completions)")]


def _max_token_len(value: int, o: Options) -> list[Entry]:
    if o.get(ACTOR + "use_dynamic_bsz"):
        return []  # (named on use_dynamic_bsz's line)
    raise Unmappable(f"no effect in verl: {ACTOR}use_dynamic_bsz is False")


def _scale_by_std(value: bool, o: Options) -> list[Entry]:
    return [Entry("algorithm.scale_rewards", "group" if value else "none", o.show("algorithm.norm_adv_by_std_in_grpo"))]


VERL_RULES: tuple[Rule, ...] = (
    Rule(ESTIMATOR, ("algorithm.name", "algorithm.importance_sampling_level"), estimator,
         "grpo, rloo (with verl's token-level ratio), reinforce_plus_plus → reinforce_pp, reinforce_plus_plus_baseline → "
         "reinforce_pp_baseline, gae → ppo (a critic: critic.*); remax, gpg, opo, grpo_passk and the optimal-token "
         "baselines: no counterpart", default="gae"),
    Rule("algorithm.norm_adv_by_std_in_grpo", ("algorithm.scale_rewards",), _scale_by_std, "True: group, False: none"),
    Rule("data.train_files", ("data.train_files",), _train_files("data.train_files", "data.train_files"),
         "a list; verl's parquet layout reads as is"),
    Rule("data.val_files", ("data.eval_files",), _train_files("data.eval_files", "data.val_files"), "scored greedily before and after training"),
    Rule("data.prompt_key", ("data.prompt_key",), None, "`prompt` in both"),
    Rule(TBS, ("rollout.generation_batch_size",), _generation_batch,
         "prompts in verl, completions in cohort: × actor_rollout_ref.rollout.n", default=1024),
    none_of("data.val_batch_size", "cohort scores the eval rows in one batch; data.eval_max_samples caps how many"),
    Rule("data.max_prompt_length", ("data.max_prompt_length",), None, "tokens, after the chat template", default=512),
    Rule("data.max_response_length", ("rollout.max_completion_length",), None, "tokens", default=512),
    Rule("data.filter_overlong_prompts", ("data.overlong_prompts",), _filter_overlong, "True: filter"),
    Rule("data.truncation", ("data.overlong_prompts",), _truncation,
         "error: error, left: truncate_left; right and middle have no counterpart", default="error"),
    Rule("data.shuffle", ("data.shuffle",), None),
    Rule("data.seed", ("train.seed",), None, "cohort's one seed of the data order"),
    none_of("data.return_raw_chat", "cohort renders chat prompts with the tokenizer's chat template itself"),
    none_of("data.reward_fn_key", "the built-in verl_default reward routes by the data_source column"),
    none_of("data.image_key", "cohort trains text models"),
    none_of("data.filter_overlong_prompts_workers", "cohort measures the prompts in its own process"),
    none_of("data.dataloader_num_workers", "cohort reads the data in its own process"),
    none_of("data.trust_remote_code", "cohort loads no remote code"),
    Rule(MODEL + "path", ("model.path",), model_path("model.path", MODEL + "path"), "a local checkpoint directory"),
    Rule(MODEL + "enable_gradient_checkpointing", ("train.gradient_checkpointing",), None, default=True),
    none_of(MODEL + "use_remove_padding", "cohort pads within length-sorted micro-batches; train.max_tokens_per_microbatch "
            "caps the padded tokens of one"),
    Rule(MODEL + "lora_rank", ("lora.rank",), None, "0: full fine-tuning"),
    Rule(MODEL + "lora_alpha", ("lora.alpha",), None),
    Rule(MODEL + "target_modules", ("lora.target_modules",), None),
    none_of(MODEL + "trust_remote_code", "cohort loads no remote code"),
    none_of(MODEL + "use_shm", "cohort reads the checkpoint from its directory"),
    none_of(MODEL + "use_liger", "cohort uses the model's own transformers kernels"),
    none_of(MODEL + "use_fused_kernels", "cohort uses the model's own transformers kernels"),
    none_of(MODEL + "enable_activation_offload", "no activation offloading; train.gradient_checkpointing saves activation memory"),
    none_of(ACTOR + "strategy", "cohort shards with FSDP2 when train.num_processes > 1"),
    Rule(MINI, ("train.prompts_per_step",), _mini_batch, "prompts per optimizer step in both", default=256),
    Rule(ACTOR + "ppo_micro_batch_size_per_gpu", ("train.micro_batch_size",), None,
         "completions per forward/backward pass, per process"),
    Rule(ACTOR + "ppo_micro_batch_size", ("train.micro_batch_size",), _global_micro_batch,
         "verl's older global size: ÷ the GPUs"),
    Rule(ACTOR + "use_dynamic_bsz", ("train.max_tokens_per_microbatch",), _dynamic_batch,
         "True: micro-batches capped by tokens (ppo_max_token_len_per_gpu)"),
    Rule(ACTOR + "ppo_max_token_len_per_gpu", ("train.max_tokens_per_microbatch",), _max_token_len,
         "with use_dynamic_bsz; cohort counts padded tokens"),
    none_of(ACTOR + "ulysses_sequence_parallel_size", "no sequence parallelism in cohort"),
    none_of(ACTOR + "shuffle", "cohort keeps the generation batch's order within an optimizer step"),
    Rule(EPOCHS, ("algorithm.num_iterations",), None, "updates per generation batch"),
    Rule(ACTOR + "grad_clip", ("train.max_grad_norm",), None),
    Rule(BOTH, ("algorithm.epsilon_low", "algorithm.epsilon_high"), named_by_loss_mode(_clip_ratio, clip=True),
         "both sides; cispo: epsilon_high = 1 + it (cohort's cispo cap is the weight itself); geo_mean: the log-ratio bounds"),
    Rule(LOW, ("algorithm.epsilon_low",), named_by_loss_mode(_epsilon("algorithm.epsilon_low", LOW), clip=True),
         "< 1 (a lower clip at 1 − it ≤ 0 never binds); cispo: no lower bound in cohort"),
    Rule(HIGH, ("algorithm.epsilon_high",), named_by_loss_mode(_epsilon("algorithm.epsilon_high", HIGH), clip=True),
         "cispo: epsilon_high = 1 + it"),
    Rule(ACTOR + "clip_ratio_c", ("algorithm.clip_ratio_c",), dual_clip, "dual clip for negative advantages; verl "
         "applies it with the vanilla loss always, cohort only when set", default=3.0),
    Rule(AGG, ("algorithm.loss_type",), named_by_loss_mode(aggregation, clip=False),
         "token-mean → dapo, seq-mean-token-mean → grpo, seq-mean-token-sum-norm → dr_grpo (docs/algorithms.md: the one "
         "difference of seq-mean-token-sum-norm); with cispo, sapo, geo_mean the loss fixes it"),
    Rule(LOSS_MODE, ("algorithm.importance_sampling_level", "algorithm.loss_type", "algorithm.epsilon_high"), loss_mode,
         "vanilla: token ratio; gspo: sequence ratio; cispo → loss_type=cispo; geo_mean → loss_type=gmpo; sapo → "
         "loss_type=sapo; clip_cov, kl_cov, gpg, bypass_mode: no counterpart", default="vanilla"),
    Rule(ACTOR + "tau_pos", ("algorithm.sapo_temperature_pos",), sapo_temperature, "loss_mode=sapo"),
    Rule(ACTOR + "tau_neg", ("algorithm.sapo_temperature_neg",), sapo_temperature, "loss_mode=sapo"),
    none_of(ACTOR + "policy_loss.*", "the parameters of verl's clip_cov and kl_cov losses, which have no counterpart"),
    Rule(ACTOR + "entropy_coeff", ("algorithm.entropy_coeff",), None, "entropy bonus"),
    Rule(KL_LOSS, ("algorithm.kl_placement", "algorithm.beta"), _kl_loss, "True: kl_placement=loss; no KL: beta=0"),
    _when_kl(KL_LOSS, Rule(ACTOR + "kl_loss_coef", ("algorithm.beta",), None, "with use_kl_loss", default=0.001)),
    _when_kl(KL_LOSS, mapped(ACTOR + "kl_loss_type", "algorithm.kl_estimator", KL_ESTIMATORS, "with use_kl_loss",
                             default="low_var_kl")),
    Rule(KL_REWARD, ("algorithm.kl_placement", "algorithm.beta"), _kl_reward,
         "True: kl_placement=reward, beta from algorithm.kl_ctrl.kl_coef"),
    _when_kl(KL_REWARD, Rule("algorithm.kl_ctrl.kl_coef", ("algorithm.beta",), None, "with use_kl_in_reward", default=0.001),
             named_by_placement=True),
    _when_kl(KL_REWARD, mapped("algorithm.kl_penalty", "algorithm.kl_estimator", KL_ESTIMATORS, "with use_kl_in_reward")),
    _when_kl(KL_REWARD, mapped("algorithm.kl_ctrl.type", "algorithm.kl_controller", {"fixed": "fixed", "adaptive": "adaptive"},
                               "with use_kl_in_reward")),
    _when_kl(KL_REWARD, Rule("algorithm.kl_ctrl.target_kl", ("algorithm.kl_target",), None, "with use_kl_in_reward")),
    _when_kl(KL_REWARD, Rule("algorithm.kl_ctrl.horizon", ("algorithm.kl_horizon",), None, "with use_kl_in_reward")),
    Rule("algorithm.gamma", ("algorithm.gamma",), None),
    Rule("algorithm.lam", ("algorithm.lam",), when_ppo("algorithm.lam", "algorithm.lam", "GAE λ"),
         "ppo; verl's 1.0 (Monte-Carlo returns) is carried, cohort's default is 0.95", default=1.0),
    Rule(ACTOR + "optim.lr", ("train.learning_rate",), None, "1e-6 by default in both"),
    Rule(ACTOR + "optim.lr_warmup_steps", ("train.warmup_steps",), _warmup_steps("train.warmup_steps", ACTOR),
         "generation batches in verl, optimizer steps in cohort: × optimizer steps per generation batch"),
    Rule(ACTOR + "optim.lr_warmup_steps_ratio", ("train.warmup_steps",), _warmup_ratio("train.warmup_steps", ACTOR),
         "of verl's total generation batches, converted to optimizer steps"),
    mapped(ACTOR + "optim.warmup_style", "train.lr_scheduler", {"constant": "constant", "cosine": "cosine"}),
    mapped(ACTOR + "optim.lr_scheduler_type", "train.lr_scheduler", {"constant": "constant", "cosine": "cosine"}),
    none_of(ACTOR + "optim.min_lr_ratio", "cohort's cosine schedule decays to 0"),
    Rule(ACTOR + "optim.weight_decay", ("train.weight_decay",), None, "verl's default is 0.01, cohort's 0", default=0.01),
    Rule(ACTOR + "optim.betas", ("train.adam_beta1", "train.adam_beta2"), _betas),
    none_of(ACTOR + "optim.total_training_steps", "set by verl's trainer; cohort's train.max_steps"),
    Rule(ACTOR + "fsdp_config.param_offload", ("train.param_offload",), _param_offload, "with train.num_processes > 1 "
         "(FSDP2's CPU offload); on one GPU refused: train.optimizer_offload"),
    Rule(ACTOR + "fsdp_config.optimizer_offload", ("train.optimizer_offload",), None),
    none_of(ACTOR + "fsdp_config.offload_policy", "train.param_offload is FSDP2's CPUOffloadPolicy"),
    none_of(ACTOR + "fsdp_config.fsdp_size", "cohort shards over all train.num_processes"),
    none_of(ACTOR + "fsdp_config.wrap_policy", "cohort wraps each decoder layer"),
    none_of(ACTOR + "checkpoint.*", "cohort's checkpoints always hold what resuming needs (docs/runs.md)"),
    none_of(REF + "log_prob_micro_batch_size_per_gpu", LOGPROB_NOTE),
    none_of(REF + "log_prob_micro_batch_size", LOGPROB_NOTE),
    none_of(REF + "log_prob_use_dynamic_bsz", LOGPROB_NOTE),
    none_of(REF + "log_prob_max_token_len_per_gpu", LOGPROB_NOTE),
    none_of(REF + "fsdp_config.param_offload", "the reference is offloaded with the policy (train.param_offload); no separate switch"),
    none_of(REF + "strategy", "the reference is sharded as the policy is"),
    mapped(ROLLOUT + "name", "engine.name", {"vllm": "vllm", "hf": "hf", "sglang": MISSING}, "hf: transformers"),
    none_of(ROLLOUT + "mode", "cohort streams requests to the engine either way; pipeline.max_staleness is its asynchronous mode"),
    Rule(N, ("rollout.num_generations",), None, "completions per prompt", default=1),
    Rule(ROLLOUT + "temperature", ("rollout.temperature",), None),
    Rule(ROLLOUT + "top_p", ("rollout.top_p",), None),
    Rule(ROLLOUT + "top_k", ("rollout.top_k",), _top_k, "verl's -1 (off) is cohort's 0"),
    Rule(ROLLOUT + "gpu_memory_utilization", ("engine.gpu_memory_utilization",), None, "unset in cohort: derived by the planner"),
    Rule(ROLLOUT + "tensor_model_parallel_size", ("engine.tensor_parallel_size", "engine.mode"), _tensor_parallel,
         "> 1 needs vLLM in its own process (engine.mode=local_server)"),
    Rule(ROLLOUT + "free_cache_engine", ("engine.sleep_mode",), _free_cache, "True: level 2, vLLM in the trainer's process"),
    Rule(ROLLOUT + "enforce_eager", ("engine.enforce_eager",), None),
    mapped(ROLLOUT + "dtype", "engine.dtype", {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}),
    none_of(ROLLOUT + "log_prob_micro_batch_size_per_gpu", LOGPROB_NOTE),
    none_of(ROLLOUT + "log_prob_micro_batch_size", LOGPROB_NOTE),
    none_of(ROLLOUT + "log_prob_use_dynamic_bsz", LOGPROB_NOTE),
    none_of(ROLLOUT + "log_prob_max_token_len_per_gpu", LOGPROB_NOTE),
    none_of(ROLLOUT + "max_num_batched_tokens", "vLLM's scheduler runs at its own defaults in cohort"),
    none_of(ROLLOUT + "max_num_seqs", "vLLM's scheduler runs at its own defaults in cohort"),
    none_of(ROLLOUT + "enable_chunked_prefill", "vLLM's scheduler runs at its own defaults in cohort"),
    none_of(ROLLOUT + "load_format", "cohort pushes the weights into vLLM itself"),
    none_of(ROLLOUT + "do_sample", "cohort always samples in training (rollout.temperature); eval is greedy"),
    none_of(ROLLOUT + "calculate_log_probs", "cohort always keeps the engine's log-probs"),
    none_of(ROLLOUT + "val_kwargs.*", "cohort's eval accuracy is greedy; pass@k samples run.eval_num_samples per prompt "
            "(`cohort eval --num-samples K --temperature T`)"),
    none_of(ROLLOUT + "multi_turn.*", "multi-turn tools are tools.functions / tools.environment (docs/tools.md)"),
    Rule("trainer.total_epochs", ("train.max_steps",), _total_epochs,
         "epochs × floor(rows / data.train_batch_size) generation batches × optimizer steps per generation batch",
         default=30),
    Rule("trainer.total_training_steps", ("train.max_steps",), _total_steps,
         "generation batches in verl: × optimizer steps per generation batch"),
    Rule("trainer.n_gpus_per_node", ("train.num_processes", "distributed.backend"), _gpus,
         "× trainer.nnodes: one training process per GPU; several machines: Ray (distributed.backend=ray)"),
    Rule("trainer.nnodes", ("distributed.backend",), _nodes, "> 1: distributed.backend=ray (docs/deployment.md)"),
    Rule("trainer.save_freq", ("run.save_every",), _every("run.save_every", "trainer.save_freq"), "one training process only, for now"),
    Rule("trainer.test_freq", ("run.eval_every",), _every("run.eval_every", "trainer.test_freq")),
    Rule("trainer.logger", ("run.loggers",), _loggers, "console, wandb, tensorboard; metrics.jsonl always"),
    Rule("trainer.default_local_dir", ("run.output_dir",), None),
    Rule("trainer.max_actor_ckpt_to_keep", ("run.keep_checkpoints",), None),
    mapped("trainer.device", "train.device", {"cuda": "cuda", "cpu": "cpu", "npu": MISSING}),
    none_of("trainer.project_name", "the wandb run is named after the run directory; set WANDB_PROJECT"),
    none_of("trainer.experiment_name", "the run directory names the run (run.output_dir)"),
    none_of("trainer.critic_warmup", "no critic warm-up; GRPO has no critic (ppo: critic.*)"),
    none_of("trainer.val_before_train", "cohort always scores the eval data before and after training"),
    none_of("trainer.val_only", "`cohort eval CONFIG`"),
    none_of("trainer.resume_mode", "`cohort train --resume RUN_DIR` continues a run exactly"),
    none_of("trainer.log_val_generations", "eval completions go to RUN_DIR; run.num_completions_to_log sets the training sample"),
    none_of("trainer.balance_batch", "cohort balances nothing across processes: each takes whole groups"),
    none_of("trainer.default_hdfs_dir", "cohort writes to run.output_dir only"),
    Rule("custom_reward_function.path", ("rewards",), rewards,
         "a module:function import path (verl's compute_score contract is read as is); unset: verl_default (GSM8K, MATH, "
         "DAPO math by data_source); with reward_model.enable the reward model instead", default=None),
    Rule("custom_reward_function.name", ("rewards",), _reward_function_name, "the function in that file",
         default="compute_score"),
    Rule("reward_model.enable", ("rewards",), lambda v, o: [], "True: rewards=[{name: reward_model, model: "
         "reward_model.model.path}], the reward model's score as the reward"),
    Rule("reward_model.model.path", ("rewards",), _on_rewards_line("reward_model.enable"), "with reward_model.enable"),
    Rule("reward_model.micro_batch_size_per_gpu", ("rewards",), _on_rewards_line("reward_model.enable"),
         "with reward_model.enable: the reward's batch_size"),
    none_of("reward_model.micro_batch_size", "the reward model scores in its own batch_size (the rewards entry)"),
    none_of("reward_model.model.*", "the reward model loads as its checkpoint says (a local sequence-classification "
            "directory); verl's loading options have no counterpart"),
    none_of("reward_model.max_length", "the reward_model reward's max_length option (2048 by default) truncates its input"),
    none_of("reward_model.use_dynamic_bsz", "the reward model scores in fixed batches (batch_size)"),
    none_of("reward_model.forward_max_token_len_per_gpu", "the reward model scores in fixed batches (batch_size)"),
    none_of("reward_model.strategy", "the reward model runs in the training process (rewards: device)"),
    none_of("reward_model.num_workers", "rewards run on the RewardSet's own threads and process pool"),
    none_of("reward_model.use_reward_loop", "cohort scores each group as it finishes (its rewards stage)"),
    none_of("reward_model.rollout.*", "a generative reward model served by vLLM has no counterpart; rewards: remote "
            "calls an HTTP scorer"),
    Rule("reward_model.reward_manager", ("rewards",), lambda v, o: [], "naive: the score; dapo: the score plus "
         "soft_overlong (the overlong buffer); prime, batch: no counterpart", default="naive"),
    *(Rule(f"reward_model.{prefix}{name}", ("rewards",), _overlong_option, "with reward_manager=dapo: soft_overlong "
           "(cache_length = len, weight = penalty_factor)")
      for prefix in ("overlong_buffer.", "reward_kwargs.overlong_buffer_cfg.") for name in ("enable", "len", "penalty_factor")),
    Rule("reward_model.reward_kwargs.max_resp_len", ("rewards",), _overlong_option, "with reward_manager=dapo: "
         "soft_overlong's max_completion_length"),
    none_of("reward_model.overlong_buffer.log", "cohort logs every reward's mean (rewards/soft_overlong) always"),
    none_of("reward_model.reward_kwargs.overlong_buffer_cfg.log", "cohort logs every reward's mean (rewards/soft_overlong) always"),
    Rule("algorithm.filter_groups.enable", ("pipeline.dynamic_sampling", "pipeline.max_refill_rounds"), dynamic_sampling,
         "DAPO's dynamic sampling: groups whose rewards are all equal replaced"),
    Rule("algorithm.filter_groups.metric", ("pipeline.dynamic_sampling",), _on_rewards_line("algorithm.filter_groups.enable"),
         "with filter_groups.enable (cohort compares the reward)"),
    Rule("algorithm.filter_groups.max_num_gen_batches", ("pipeline.max_refill_rounds",),
         _on_rewards_line("algorithm.filter_groups.enable"), "with filter_groups.enable: rounds − 1 refills"),
    Rule("data.gen_batch_size", ("pipeline.dynamic_sampling",), gen_batch_size, "verl's generation rounds of dynamic sampling; cohort refills group by group"),
    Rule("critic.model.path", ("critic.path",), model_path("critic.path", "critic.model.path"), "ppo"),
    Rule("critic.optim.lr", ("critic.learning_rate",), None, "ppo"),
    Rule("critic.optim.lr_warmup_steps", ("critic.warmup_steps",), _warmup_steps("critic.warmup_steps", "critic."),
         "ppo; generation batches in verl, optimizer steps in cohort"),
    Rule("critic.optim.lr_warmup_steps_ratio", ("critic.warmup_steps",), _warmup_ratio("critic.warmup_steps", "critic."),
         "ppo; of verl's total generation batches, converted to optimizer steps"),
    Rule("critic.cliprange_value", ("critic.cliprange_value",), when_ppo("critic.cliprange_value", "critic.cliprange_value",
         "the value clip"), "ppo; verl's 0.5 is carried, cohort's default is 0.2", default=0.5),
    none_of("ray_init.*", "cohort starts Ray only with distributed.backend=ray (distributed.ray_address)"),
    none_of(ACTOR + "megatron.*", "no Megatron-LM in cohort: it trains transformers checkpoints with FSDP2 "
            "(train.num_processes); tensor, pipeline, expert and context parallelism have no counterpart"),
    none_of(REF + "megatron.*", "no Megatron-LM in cohort (the reference is sharded as the policy is)"),
    none_of(ACTOR + "fsdp_config.strategy", "cohort shards with FSDP2 when train.num_processes > 1"),
    none_of(ACTOR + "entropy_checkpointing", "cohort computes entropy in chunks (train.logprob_chunk_size)"),
    none_of(ACTOR + "use_torch_compile", "cohort runs the model's own eager transformers code"),
    none_of(REF + "ulysses_sequence_parallel_size", "no sequence parallelism in cohort"),
    none_of(REF + "use_torch_compile", "cohort runs the model's own eager transformers code"),
    none_of(MODEL + "override_config.*", "cohort loads the checkpoint's config.json as it is: edit it there (e.g. "
            "max_position_embeddings)"),
    mapped(MODEL + "torch_dtype", "model.dtype", {"bfloat16": "bfloat16", "float32": "float32", "fp32": "float32",
                                                   "bf16": "bfloat16"}, "the training dtype of the policy"),
    none_of(MODEL + "external_lib", "cohort imports no extra model code"),
    none_of(ROLLOUT + "data_parallel_size", "cohort runs one vLLM engine per rollout server (distributed.num_rollout_servers)"),
    none_of(ROLLOUT + "expert_parallel_size", "vLLM's expert parallelism is not set by cohort"),
    none_of(ROLLOUT + "layered_summon", "cohort pushes the weights into vLLM itself"),
    none_of(ROLLOUT + "max_model_len", "cohort sizes vLLM's context from data.max_prompt_length + rollout.max_completion_length"),
    none_of(ROLLOUT + "multi_stage_wake_up", "engine.sleep_mode wakes vLLM in one step"),
    none_of(ROLLOUT + "over_sample_rate", "partial rollouts are pipeline.over_provision (a multiple of the batch's groups, "
            "the late ones resumed next step, where verl's over-sampling drops them)"),
    none_of(ROLLOUT + "trace.*", "cohort logs rollouts to RUN_DIR (completions.jsonl); no tracing backend"),
    none_of(ROLLOUT + "agent.*", "multi-turn tools are tools.functions / tools.environment (docs/tools.md)"),
    none_of("algorithm.rollout_correction.*", "cohort's engine-mismatch correction is algorithm.rollout_correction "
            "(truncate or mask, per token) with algorithm.rollout_correction_cap; verl's sequence-level and "
            "rejection-sampling variants have no counterpart"),
    none_of("critic.model.use_remove_padding", "cohort pads within length-sorted micro-batches"),
    none_of("critic.model.enable_gradient_checkpointing", "the critic follows train.gradient_checkpointing"),
    none_of("critic.model.fsdp_config.*", "the critic runs in one process (cohort's PPO is not sharded yet)"),
    none_of("critic.model.*", "the critic's body loads from critic.path as its checkpoint says"),
    none_of("critic.ppo_micro_batch_size_per_gpu", "the critic's forward/backward passes use train.micro_batch_size"),
    none_of("critic.ppo_micro_batch_size", "the critic's forward/backward passes use train.micro_batch_size"),
    none_of("critic.ppo_max_token_len_per_gpu", "the critic's micro-batches follow train.max_tokens_per_microbatch"),
    none_of("critic.use_dynamic_bsz", "the critic's micro-batches follow train.max_tokens_per_microbatch"),
    none_of("critic.ppo_mini_batch_size", "the critic steps once per policy optimizer step (train.prompts_per_step)"),
    none_of("critic.ppo_epochs", "the critic updates as often as the policy (algorithm.num_iterations)"),
    none_of("critic.optim.*", "the critic's AdamW takes train.* betas, weight decay and schedule; critic.learning_rate "
            "and critic.warmup_steps are its own"),
    none_of("critic.strategy", "the critic runs in one process"),
    none_of("critic.ulysses_sequence_parallel_size", "no sequence parallelism in cohort"),
    none_of("global_profiler.*", "no profiler hooks in cohort: each phase is timed in metrics (timing/*)"),
    none_of(ACTOR + "profiler.*", "no profiler hooks in cohort: each phase is timed in metrics (timing/*)"),
    none_of("trainer.use_legacy_worker_impl", "cohort has one implementation of its workers"),
    none_of("trainer.esi_redundant_time", "cohort saves with run.save_every (and on a signal)"),
    none_of("trainer.rollout_data_dir", "cohort writes sample completions to RUN_DIR/completions.jsonl"),
    none_of("trainer.validation_data_dir", "eval completions go to RUN_DIR"),
    none_of("trainer.ray_wait_register_center_timeout", "cohort starts Ray only with distributed.backend=ray"),
)
