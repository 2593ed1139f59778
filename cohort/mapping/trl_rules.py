"""TRL's GRPO options (`GRPOConfig`, the `TrainingArguments` it inherits, and the `trl grpo` script's model,
dataset and reward arguments) mapped to cohort's fields: the table `TRL_RULES`.

Units, where a port usually goes wrong:
- `per_device_train_batch_size` is completions per forward/backward on one process: train.micro_batch_size.
- An optimizer step takes per_device_train_batch_size × processes × gradient_accumulation_steps completions;
  cohort states it in prompts: train.prompts_per_step = that / num_generations. The processes come from
  `accelerate launch --num_processes`, not from the config (`cohort convert --num-processes`).
- TRL's `steps_per_generation` counts micro-steps (default gradient_accumulation_steps); cohort's
  train.steps_per_generation counts optimizer steps: ÷ gradient_accumulation_steps.
- `num_train_epochs` becomes train.max_steps only when the data's size is knowable (a local file, or --rows).

Defaults given on a rule are TRL 1.16's own where they differ from cohort's and change the run.
"""

from __future__ import annotations

import math
from typing import Any

from cohort.mapping.open_r1_rules import OPEN_R1_REFUSED, OPEN_R1_REWARDS, OPEN_R1_RULES
from cohort.mapping.rules import (Entry, Options, PartlyUnmappable, Rule, Unmappable, flow, mapped, model_path,
                                  none_of, steps_for_epochs, whole)

PD, GA, G = "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"
ISC, ISM = "vllm_importance_sampling_correction", "vllm_importance_sampling_mode"
TRL_REWARDS = {"accuracy_reward": {"name": "accuracy"}, "reasoning_accuracy_reward": {"name": "reasoning_accuracy"},
               "think_format_reward": {"name": "think_format"},
               # the `trl grpo` script builds it with max_completion_len=1280, soft_punish_cache=256
               "get_soft_overlong_punishment": {"name": "soft_overlong", "max_completion_length": 1280, "cache_length": 256}}
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow")


def completions_per_step(o: Options) -> tuple[int, str]:
    """(completions per optimizer step, its arithmetic): per_device × processes × accumulation."""
    total = o.get(PD) * o.num_processes * o.get(GA)
    return total, f"{o.show(PD)} × {o.num_processes} process(es) × {o.show(GA)} = {total} completions"


def generation_completions(o: Options) -> int:
    """Completions per generation batch, as TRL derives it."""
    if o.get("generation_batch_size") is not None:
        return o.get("generation_batch_size")
    micro = o.get("steps_per_generation") or o.get(GA)
    return o.get(PD) * o.num_processes * micro


def _prompts_per_step(value: int, o: Options) -> list[Entry]:
    total, text = completions_per_step(o)
    if total % o.get(G):
        raise Unmappable(f"{text} per optimizer step is not a whole number of groups of {o.show(G)}; TRL refuses that "
                         f"too, so this config runs on other processes than {o.num_processes}: give accelerate's "
                         "processes (`cohort convert --num-processes N`, or num_processes in the config)")
    prompts = whole(total / o.get(G), f"completions per optimizer step / {G} = {total} / {o.get(G)}")
    return [Entry("train.prompts_per_step", prompts, f"{text} per optimizer step / {o.show(G)} = {prompts} prompts")]


def _micro_batch(value: int, o: Options) -> list[Entry]:
    return [Entry("train.micro_batch_size", value, f"{o.show(PD)} completions per forward/backward pass (per process)")]


def _steps_per_generation(value: int | None, o: Options) -> list[Entry]:
    if value is None:
        return []
    if o.get("generation_batch_size") is not None:
        raise Unmappable("TRL refuses steps_per_generation together with generation_batch_size")
    steps = whole(value / o.get(GA), f"steps_per_generation / {GA} = {value} / {o.get(GA)}")
    return [Entry("train.steps_per_generation", steps, f"{o.show('steps_per_generation')} micro-steps / {o.show(GA)} = "
                  f"{steps} optimizer steps per generation batch")]


def _generation_batch(value: int | None, o: Options) -> list[Entry]:
    if value is None:
        return []
    total, text = completions_per_step(o)
    if value % total:
        raise Unmappable(f"{value} completions is not a whole number of optimizer steps of {text}: cohort trains whole "
                         f"steps from a generation batch; use a multiple of {total}")
    return [Entry("rollout.generation_batch_size", value, f"{o.show('generation_batch_size')} completions in both "
                  f"({value} / {total} = {value // total} optimizer steps per generation batch)")]


def _epochs(value: float, o: Options) -> list[Entry]:
    if (o.get("max_steps") or -1) > 0:
        if o.has("num_train_epochs"):
            raise Unmappable("max_steps is set, and TRL then ignores num_train_epochs")
        return []
    per_step, _ = completions_per_step(o)
    gen = generation_completions(o)
    prompts = whole(gen / o.get(G), f"generation batch / {G} = {gen} / {o.get(G)}")
    k = whole(gen / per_step, f"generation batch / completions per step = {gen} / {per_step}") * o.get("num_iterations")
    text = f"({gen} / {per_step} optimizer steps per generation batch × {o.show('num_iterations')})"
    out = steps_for_epochs("num_train_epochs", o, prompts, k, text)
    return [Entry(e.field, e.value, e.comment + (f", {o.show('max_steps')}" if o.has("max_steps") else "")) for e in out]


def _max_steps(value: int, o: Options) -> list[Entry]:
    if value is None or value <= 0:
        return []  # (num_train_epochs decides; its line names this one)
    return [Entry("train.max_steps", value, o.show("max_steps") + " optimizer steps in both")]


def _total_steps(o: Options) -> int | None:
    if (o.get("max_steps") or -1) > 0:
        return o.get("max_steps")
    try:
        return _epochs(o.get("num_train_epochs"), o)[0].value
    except (Unmappable, IndexError):
        return None


def _warmup(key: str):
    def convert(value: float, o: Options) -> list[Entry]:
        if key == "warmup_ratio" or 0 < value < 1:  # transformers: warmup_steps below 1 is a ratio of the total steps
            total = _total_steps(o)
            if total is None:
                raise Unmappable("a ratio of the run's length, which is not knowable here: set train.warmup_steps = "
                                 f"ceil({value} × train.max_steps)")
            steps = math.ceil(value * total)
            return [Entry("train.warmup_steps", steps, f"ceil({o.show(key)} × {total} steps) = {steps}")]
        return [Entry("train.warmup_steps", int(value), o.show(key))]

    return convert


def _seed(value: int, o: Options) -> list[Entry]:
    return [Entry("train.seed", value, o.show("seed") + " (data order)"), Entry("rollout.seed", value, o.show("seed") + " (sampling)")]


def _dtype(key: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        if key == "model_init_kwargs":
            extra = sorted(set(value) - {"dtype", "torch_dtype"}) if isinstance(value, dict) else value
            if extra or not isinstance(value, dict):
                raise Unmappable(f"{flow(extra)}: cohort loads the checkpoint as it is; only the dtype maps (model.dtype)")
            value = value.get("dtype", value.get("torch_dtype"))
        if value == "bfloat16":
            return [Entry("model.dtype", "bfloat16", o.show(key)),
                    Entry("train.precision", "pure", f"{o.show(key)}: TRL then trains the bfloat16 weights themselves")]
        if value == "float32":
            return [Entry("model.dtype", "float32", o.show(key))]
        raise Unmappable(f"{flow(value)}: TRL's auto keeps the checkpoint's dtype; cohort's model.dtype is auto (by the "
                         "hardware, docs/gpu.md), bfloat16 or float32; float16 needs loss scaling, which cohort does not do")

    return convert


def _bf16(value: bool, o: Options) -> list[Entry]:
    dtype = "bfloat16" if value else "float32"
    note = " (autocast over float32 masters: train.precision=mixed, the default)" if value else ""
    return [Entry("model.dtype", dtype, o.show("bf16") + note)]


def _peft(key: str, target: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        if not o.get("use_peft"):
            if not o.has(key):
                return []
            raise Unmappable("no effect: use_peft is not true")
        if key == "lora_target_modules" and value is None:
            return []  # (peft's per-architecture default; cohort's is all-linear: the docs say so)
        return [Entry(target, value, f"{o.show(key)} with use_peft=True")]

    return convert


def _use_peft(value: bool, o: Options) -> list[Entry]:
    if not value:
        return [Entry("lora.rank", 0, o.show("use_peft") + ": full fine-tuning")]
    return [Entry("lora.rank", o.get("lora_r"), f"{o.show('use_peft')}, {o.show('lora_r')}")]


def _rewards(value: list[str] | None, o: Options) -> list[Entry]:
    specs = [{"name": "reward_model", "model": o.get("reward_model_name_or_path")}] if o.get("reward_model_name_or_path") else []
    value = [value] if isinstance(value, str) else list(value or [])
    weights = o.get("reward_weights")
    if weights is not None and len(weights) != len(specs) + len(value):
        raise Unmappable(f"reward_weights has {len(weights)} weights for {len(specs) + len(value)} reward(s)")
    weights = list(weights) if weights is not None else [None] * (len(specs) + len(value))
    pairs, refused = list(zip(specs, weights)), []
    for name, weight in zip(value, weights[len(specs):]):
        spec = _reward_spec(name, o)
        if isinstance(spec, str):
            refused.append(spec)
        else:
            pairs.append((spec, weight))
    specs = [spec if weight is None else {**spec, "weight": weight} for spec, weight in pairs]
    shown = ", ".join(o.show(k) for k in ("reward_model_name_or_path", "reward_funcs", "reward_weights", "max_completion_len",
                                          "soft_punish_cache") if o.has(k))
    if refused and not specs:
        raise Unmappable("; ".join(refused) + ": no reward of this list maps, so the output has none: set rewards")
    if refused:
        kept = [Entry("rewards", specs, shown + ": only the rewards named here; the others are listed as not mapped")]
        raise PartlyUnmappable(kept, "; ".join(refused) + " (the others are converted)")
    return [Entry("rewards", specs, shown)]


def _reward_spec(name: str, o: Options) -> dict[str, Any] | str:
    """The rewards entry for one of TRL's or open-r1's reward names (or an import path), or why it has none."""
    if name in TRL_REWARDS:
        return dict(TRL_REWARDS[name])
    if name in OPEN_R1_REWARDS:
        return dict(OPEN_R1_REWARDS[name])
    if name == "soft_overlong_punishment":  # open-r1's, sized by its own two options
        return {"name": "soft_overlong", "max_completion_length": o.get("max_completion_len", 16384),
                "cache_length": o.get("soft_punish_cache", 4096)}
    if name in OPEN_R1_REFUSED:
        return f"{name}: {OPEN_R1_REFUSED[name]} (open-r1's open_r1.rewards:{name}_reward as an import path works where open-r1 is installed)"
    if "." in name or ":" in name:
        return {"name": name}
    return f"{name}: neither one of TRL's named rewards ({', '.join(TRL_REWARDS)}), nor open-r1's, nor an import path"


def _reward_part(value: Any, o: Options) -> list[Entry]:
    if o.has("reward_funcs"):
        return []  # (named on the rewards line)
    return _rewards(None, o)


def _dataset(value: str, o: Options) -> list[Entry]:
    if value.endswith(DATA_SUFFIXES) or value.startswith(("/", ".", "~")):
        return [Entry("data.train_files", [value], o.show("dataset_name") + ": a local file")]
    return [Entry("data.dataset_name", value, o.show("dataset_name") + ": a Hub dataset, loaded with "
                  "datasets.load_dataset as TRL loads it")]


def _dataset_part(field: str, key: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        name = o.get("dataset_name")
        if not isinstance(name, str) or name.endswith(DATA_SUFFIXES) or name.startswith(("/", ".", "~")):
            raise Unmappable("read with a Hub dataset_name only (this config names a local file, or none)")
        return [Entry(field, value, o.show(key))]

    return convert


def _dataset_test_split(value: Any, o: Options) -> list[Entry]:
    """TRL's scripts evaluate on the test split only when eval_strategy is not "no" (its default): otherwise the split
    (default "test", which many datasets lack) is never read, and cohort, which would read and score it, leaves it out."""
    if o.get("eval_strategy", "no") == "no":
        raise Unmappable("not read by TRL with eval_strategy=no (its default): no evaluation, so no split to score")
    return _dataset_part("data.dataset_test_split", "dataset_test_split")(value, o)


def _max_prompt_length(value: int | None, o: Options) -> list[Entry]:
    if value is None:
        return [Entry("data.max_prompt_length", None, o.show("max_prompt_length") + ": no limit")]
    return [Entry("data.max_prompt_length", value, o.show("max_prompt_length") + " tokens"),
            Entry("data.overlong_prompts", "truncate_left", o.show("max_prompt_length") + ": the TRL versions that "
                  "have this option keep a longer prompt's last tokens (cut on the left), as truncate_left does; "
                  "cohort's default (filter) would drop it instead")]


def _entropy_coef(value: float, o: Options) -> list[Entry]:
    if o.get("use_adaptive_entropy"):
        raise Unmappable("with use_adaptive_entropy it is the starting point of TRL's adaptive coefficient, which "
                         "cohort does not have; kept as a constant bonus it would change the run, so it is not kept")
    same = o.get("loss_type") == "dapo"
    return [Entry("algorithm.entropy_coeff", value, o.show("entropy_coef") + (
        ": TRL adds coef × the mean token entropy, cohort aggregates the entropy as the loss (loss_type dapo: the same)"
        if same else f": TRL adds coef × the mean token entropy; cohort aggregates the entropy as the loss "
        f"({o.show('loss_type')}), so the bonus is weighted per sequence there"))]


def _num_processes(value: int, o: Options) -> list[Entry]:
    return [Entry("train.num_processes", value, o.show("num_processes") + ": accelerate's processes, one per GPU (FSDP2 "
                  "in cohort); the batch arithmetic above uses them")]


def _target_modules(value: Any, o: Options) -> list[Entry]:
    """`--lora_target_modules "q_proj", "v_proj"` reaches TRL as ["q_proj,", "v_proj"]: a name with the shell's comma
    matches no module, so only the others got an adapter; cohort keeps what TRL adapted and says so."""
    names = [value] if isinstance(value, str) else list(value)
    kept = [n for n in names if not n.endswith(",")]
    dropped = [n for n in names if n.endswith(",")]
    out = _peft("lora_target_modules", "lora.target_modules")(kept if dropped else value, o)
    if dropped and out:
        note = (f"; {', '.join(repr(n) for n in dropped)} (the shell kept the comma) matches no module, so TRL adapted "
                f"only {kept}: kept as TRL ran; add {', '.join(n[:-1] for n in dropped)} if you meant it")
        out = [Entry(e.field, e.value, e.comment + note) for e in out]
    return out


def _vllm_mode(value: str, o: Options) -> list[Entry]:
    if value == "colocate" and o.get("vllm_tensor_parallel_size", 1) > 1:
        return [Entry("engine.mode", "local_server", f"{o.show('vllm_mode')} with {o.show('vllm_tensor_parallel_size')}: "
                      "cohort splits a model over GPUs only with vLLM in its own process")]
    table = {"colocate": "colocate", "server": "server"}
    if value not in table:
        raise Unmappable(f"{value}: cohort's engine.mode is colocate, local_server or server")
    return [Entry("engine.mode", table[value], o.show("vllm_mode") + (" (with `cohort serve`, token in COHORT_SERVER_TOKEN)"
                                                                         if value == "server" else ""))]


def _tensor_parallel(value: int, o: Options) -> list[Entry]:
    out = [Entry("engine.tensor_parallel_size", value, o.show("vllm_tensor_parallel_size"))]
    if value > 1 and not o.has("vllm_mode"):
        out.append(Entry("engine.mode", "local_server", f"{o.show('vllm_tensor_parallel_size')}: cohort splits a model "
                         "over GPUs only with vLLM in its own process"))
    return out


def _server_url(key: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        if o.get("vllm_mode") != "server":
            if not o.has(key):
                return []
            raise Unmappable("no effect: vllm_mode is not server")
        if key != "vllm_server_base_url" and o.get("vllm_server_base_url"):
            return []  # (the base URL wins, as in TRL)
        url = o.get("vllm_server_base_url") or f"http://{o.get('vllm_server_host')}:{o.get('vllm_server_port')}"
        shown = o.show(key) if key == "vllm_server_base_url" else f"{o.show('vllm_server_host')}, {o.show('vllm_server_port')}"
        return [Entry("engine.server_urls", [url], shown)] if key != "vllm_server_port" else []

    return convert


def _correction(value: bool, o: Options) -> list[Entry]:
    if not o.get("use_vllm"):
        if not o.has(ISC):
            return []  # (TRL's default, read only with vLLM)
        raise Unmappable("no effect: TRL corrects for vLLM's sampling only with use_vllm=True")
    if not value:
        return [Entry("algorithm.rollout_correction", "none", o.show(ISC))]
    return _correction_mode(o.get(ISM), o, also=o.show(ISC))


def _correction_mode(value: str, o: Options, also: str = "") -> list[Entry]:
    if o.has(ISC) and not also:
        return []  # (named on the correction's line, or no effect when it is off)
    table = {"token_truncate": "truncate", "token_mask": "mask"}
    if value not in table:
        raise Unmappable(f"{value}: cohort's importance weights are per token (truncate or mask); sequence-level "
                         "correction has no counterpart")
    return [Entry("algorithm.rollout_correction", table[value], ", ".join(filter(None, (also, o.show(ISM)))))]


def _epsilon(value: float, o: Options) -> list[Entry]:
    out = [Entry("algorithm.epsilon_low", value, o.show("epsilon"))]
    if o.get("epsilon_high") is None:
        out.append(Entry("algorithm.epsilon_high", value, o.show("epsilon") + " (TRL: epsilon_high defaults to epsilon)"))
    return out


def _scale_rewards(value: Any, o: Options) -> list[Entry]:
    table = {True: "group", False: "none", "group": "group", "batch": "batch", "none": "none"}
    if value not in table:
        raise Unmappable(f"{flow(value)}: cohort's algorithm.scale_rewards is group, batch or none")
    return [Entry("algorithm.scale_rewards", table[value], o.show("scale_rewards"))]


def _max_turns(value: int | None, o: Options) -> list[Entry]:
    if value is None:
        raise Unmappable("no limit in TRL; cohort's tools.max_turns always bounds the assistant turns (4 by default)")
    return [Entry("tools.max_turns", value + 1, f"{o.show('max_tool_calling_iterations')} tool-calling turns + the "
                  f"answering turn = {value + 1} assistant turns")]


def _log_completions(value: bool, o: Options) -> list[Entry]:
    every = o.get("logging_steps") if value else 0
    return [Entry("run.log_completions_every", every, o.show("log_completions") + (f" every {o.show('logging_steps')}" if value else ""))]


def _loggers(value: Any, o: Options) -> list[Entry]:
    names = [value] if isinstance(value, str) else list(value or [])
    names = [] if names in (["none"], ["all"]) else names
    known = [n for n in names if n in ("wandb", "tensorboard")]
    others = [n for n in names if n not in known]
    note = f"; {', '.join(others)}: no cohort logger (metrics.jsonl is always written)" if others else ""
    return [Entry("run.loggers", ["console", "jsonl", *known], o.show("report_to") + note)]


def _eval_every(key: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        strategy = o.get("eval_strategy")
        if strategy == "no":
            if key == "eval_steps":
                raise Unmappable("no effect: eval_strategy is no")
            return [Entry("run.eval_every", 0, o.show("eval_strategy") + ": before and after training only")]
        if strategy == "epoch":
            raise Unmappable("cohort counts in steps: set run.eval_every to the optimizer steps of one epoch")
        if key == "eval_strategy" and o.has("eval_steps"):
            return []  # (named on eval_steps's line)
        which = "eval_steps" if o.get("eval_steps") else "logging_steps"
        every, shown = _steps_or_ratio(o.get(which), which, o)
        return [Entry("run.eval_every", every, f"{o.show('eval_strategy')}, {shown}" + ("" if which == "eval_steps" else
                      " (eval_steps unset: logging_steps)"))]

    return convert


def _steps_or_ratio(value: Any, key: str, o: Options) -> tuple[int, str]:
    """transformers reads an interval below 1 as a ratio of the run's total steps: (steps, how they were found)."""
    if isinstance(value, float) and 0 < value < 1:
        total = _total_steps(o)
        if total is None:
            raise Unmappable(f"{value} is a ratio of the run's length (transformers' rule for a value below 1), which is "
                             f"not knowable here: set the cohort field to ceil({value} × train.max_steps)")
        steps = math.ceil(value * total)
        return steps, f"{o.show(key)} × {total} steps, rounded up (below 1: a ratio of the run) = {steps}"
    return int(value), o.show(key)


def _save_every(key: str):
    def convert(value: Any, o: Options) -> list[Entry]:
        strategy = o.get("save_strategy")
        if strategy == "epoch":
            raise Unmappable("cohort counts in steps: set run.save_every to the optimizer steps of one epoch")
        if key == "save_strategy" and o.has("save_steps") and strategy != "no":
            return []  # (named on save_steps's line)
        if strategy == "no":
            shown = ", ".join(o.show(k) for k in ("save_strategy", "save_steps") if o.has(k))
            return [Entry("run.save_every", 0, shown + ": no checkpoints (the final model is saved)")]
        steps, shown = _steps_or_ratio(o.get("save_steps"), "save_steps", o)
        also = f", {o.show('save_strategy')}" if o.has("save_strategy") else ""
        return [Entry("run.save_every", steps, shown + also)]

    return convert


def _negated(target: str, key: str):
    return lambda value, o: [Entry(target, not value, o.show(key) + " (negated)")]


def _refuse_adaptive() -> list[Entry]:
    raise Unmappable("TRL's adaptive entropy control (Skywork-OR1: the coefficient moves each step towards "
                     "entropy_target) has no counterpart in cohort; train without it, or with a constant "
                     "algorithm.entropy_coeff if that is what you want")


TRAINER_ONLY = "a transformers Trainer setting with no counterpart in cohort's loop"
GENERATION_ONLY = "vLLM runs at its own defaults in cohort; only temperature, top_p and top_k are set"

TRL_RULES: tuple[Rule, ...] = (
    Rule("model_name_or_path", ("model.path",), model_path("model.path", "model_name_or_path"),
         "a local checkpoint directory or a Hub name, kept as it is"),
    Rule("dtype", ("model.dtype", "train.precision"), _dtype("dtype"),
         "bfloat16: bfloat16 weights trained directly (train.precision=pure); float32"),
    Rule("torch_dtype", ("model.dtype", "train.precision"), _dtype("torch_dtype"), "the older name of dtype"),
    Rule("model_init_kwargs", ("model.dtype", "train.precision"), _dtype("model_init_kwargs"), "only its dtype maps"),
    Rule("bf16", ("model.dtype",), _bf16, "True: bfloat16 autocast over float32 masters (train.precision=mixed); "
         "unset, cohort's model.dtype=auto picks by the hardware"),
    none_of("fp16", "float16 needs loss scaling, which cohort does not do: use bf16"),
    Rule("use_peft", ("lora.rank",), _use_peft, "True: lora.rank = lora_r"),
    Rule("lora_r", ("lora.rank",), _peft("lora_r", "lora.rank"), "with use_peft", default=16),
    Rule("lora_alpha", ("lora.alpha",), _peft("lora_alpha", "lora.alpha"), "with use_peft", default=32),
    Rule("lora_dropout", ("lora.dropout",), _peft("lora_dropout", "lora.dropout"), "with use_peft", default=0.05),
    Rule("lora_target_modules", ("lora.target_modules",), _target_modules,
         "with use_peft; unset, peft picks per architecture and cohort takes all-linear"),
    *(none_of(k, "not in cohort's LoRA (the lora section)") for k in ("use_rslora", "use_dora", "lora_modules_to_save",
                                                                  "lora_target_parameters", "lora_task_type")),
    *(none_of(k, "cohort trains unquantised weights") for k in ("load_in_4bit", "load_in_8bit", "use_bnb_nested_quant")),
    none_of("attn_implementation", "cohort uses transformers' default attention for the checkpoint"),
    Rule("model_revision", ("model.revision",), None, "the Hub revision (branch, tag or commit) of model.path"),
    none_of("trust_remote_code", "cohort loads no remote code"),
    Rule("dataset_name", ("data.dataset_name", "data.train_files"), _dataset, "a Hub dataset (data.dataset_name), or a "
         "local file (data.train_files)"),
    Rule("dataset_config", ("data.dataset_config",), _dataset_part("data.dataset_config", "dataset_config"),
         "the Hub dataset's configuration"),
    Rule("dataset_train_split", ("data.dataset_train_split",), _dataset_part("data.dataset_train_split",
         "dataset_train_split"), "train in both"),
    Rule("dataset_test_split", ("data.dataset_test_split",), _dataset_test_split,
         "scored greedily before and after training, when eval_strategy is not no (as TRL reads it)"),
    Rule("dataset_prompt_column", ("data.prompt_key",), None, "prompt in both"),
    none_of("dataset_streaming", "cohort reads the data files whole"),
    none_of("datasets", "a dataset mixture: save the mixture as one file (data.train_files)"),
    Rule("reward_funcs", ("rewards",), _rewards, "TRL's named rewards are cohort built-ins (accuracy, "
         "reasoning_accuracy, think_format, soft_overlong); import paths stay"),
    Rule("reward_model_name_or_path", ("rewards",), _reward_part, "the reward_model reward ({name: reward_model, model: DIR})"),
    Rule("reward_weights", ("rewards",), _reward_part, "`weight:` of each rewards entry"),
    none_of("multi_objective_aggregation", "cohort sums the weighted rewards, then normalises (TRL's sum_then_normalize)"),
    Rule("num_processes", ("train.num_processes",), _num_processes, "accelerate's processes (the `trl` command passes "
         "it on); they enter the batch arithmetic"),
    Rule(G, ("rollout.num_generations",), None, "completions per prompt", default=8),
    Rule(PD, ("train.micro_batch_size",), _micro_batch, "completions per forward/backward pass", default=8),
    Rule(GA, ("train.prompts_per_step",), _prompts_per_step,
         "per_device_train_batch_size × processes × gradient_accumulation_steps completions ÷ num_generations = prompts",
         default=1),
    Rule("steps_per_generation", ("train.steps_per_generation",), _steps_per_generation,
         "micro-steps in TRL, optimizer steps in cohort: ÷ gradient_accumulation_steps"),
    Rule("generation_batch_size", ("rollout.generation_batch_size",), _generation_batch, "completions in both"),
    Rule("max_completion_length", ("rollout.max_completion_length",), None, "tokens", default=512),
    Rule("max_prompt_length", ("data.max_prompt_length", "data.overlong_prompts"), _max_prompt_length,
         "tokens; the TRL versions that have it cut longer prompts on the left: data.overlong_prompts=truncate_left"),
    Rule("temperature", ("rollout.temperature",), None),
    Rule("top_p", ("rollout.top_p",), None),
    Rule("top_k", ("rollout.top_k",), None, "0 (off) in both"),
    *(none_of(k, GENERATION_ONLY) for k in ("min_p", "repetition_penalty", "generation_kwargs", "cache_implementation",
                                             "vllm_model_impl", "vllm_structured_outputs_regex", "vllm_max_model_length")),
    none_of("chat_template_kwargs", "cohort renders chat prompts with the tokenizer's chat template as it is"),
    none_of("num_generations_eval", "cohort's eval accuracy is greedy; pass@k samples run.eval_num_samples per prompt at rollout.temperature "
            "(`cohort eval --num-samples K`)"),
    mapped("use_vllm", "engine.name", {True: "vllm", False: "hf"},
           "False: transformers; unset, cohort uses vLLM (TRL's default is transformers)"),
    Rule("vllm_mode", ("engine.mode",), _vllm_mode, "colocate or server (with `cohort serve`)"),
    Rule("vllm_server_base_url", ("engine.server_urls",), _server_url("vllm_server_base_url"), "with vllm_mode=server"),
    Rule("vllm_server_host", ("engine.server_urls",), _server_url("vllm_server_host"), "with vllm_mode=server"),
    Rule("vllm_server_port", ("engine.server_urls",), _server_url("vllm_server_port"), "with vllm_mode=server"),
    Rule("vllm_server_timeout", ("engine.server_timeout_s",), None, "seconds"),
    none_of("vllm_group_port", "cohort pushes weights to its servers over HTTP"),
    Rule("vllm_gpu_memory_utilization", ("engine.gpu_memory_utilization",), None, "unset in cohort: derived by the planner"),
    Rule("vllm_tensor_parallel_size", ("engine.tensor_parallel_size", "engine.mode"), _tensor_parallel,
         "> 1 needs vLLM in its own process (engine.mode=local_server)"),
    mapped("vllm_enable_sleep_mode", "engine.sleep_mode", {True: 2, False: 0}, "level 2, as TRL sleeps"),
    Rule(ISC, ("algorithm.rollout_correction",), _correction, "with use_vllm and vllm_importance_sampling_mode: "
         "token_truncate: truncate, token_mask: mask; False: none; TRL's default (True, sequence_mask) has no "
         "counterpart and is listed", default=True),
    Rule(ISM, ("algorithm.rollout_correction",), _correction_mode, "token_truncate: truncate, token_mask: mask"),
    Rule("vllm_importance_sampling_clip_max", ("algorithm.rollout_correction_cap",), None),
    Rule("vllm_importance_sampling_cap", ("algorithm.rollout_correction_cap",), None, "older name of clip_max"),
    none_of("vllm_importance_sampling_clip_min", "cohort's importance weights have an upper cap only"),
    Rule("beta", ("algorithm.beta",), None, "0 loads no reference model in both"),
    Rule("num_iterations", ("algorithm.num_iterations",), None, "updates per generation batch", default=1),
    Rule("epsilon", ("algorithm.epsilon_low", "algorithm.epsilon_high"), _epsilon, "and epsilon_high when that is unset"),
    Rule("epsilon_high", ("algorithm.epsilon_high",), lambda v, o: [] if v is None else [Entry("algorithm.epsilon_high", v, o.show("epsilon_high"))]),
    Rule("delta", ("algorithm.delta",), None),
    mapped("loss_type", "algorithm.loss_type", {k: k for k in ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")},
           "the same names"),
    Rule("sapo_temperature_pos", ("algorithm.sapo_temperature_pos",), None, "loss_type=sapo"),
    Rule("sapo_temperature_neg", ("algorithm.sapo_temperature_neg",), None, "loss_type=sapo"),
    *(Rule(k, (f"algorithm.{k}",), None, "loss_type=vespo") for k in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                                                                     "vespo_lambda_neg")),
    mapped("importance_sampling_level", "algorithm.importance_sampling_level", {"token": "token", "sequence": "sequence"},
           "sequence: GSPO's geometric mean"),
    Rule("scale_rewards", ("algorithm.scale_rewards",), _scale_rewards, "True: group, False: none"),
    Rule("mask_truncated_completions", ("algorithm.mask_truncated_completions",), None),
    Rule("top_entropy_quantile", ("algorithm.top_entropy_quantile",), None),
    Rule("entropy_coef", ("algorithm.entropy_coeff",), _entropy_coef, "entropy bonus; TRL averages it over tokens, "
         "cohort aggregates it like the loss (the same under dapo); refused with use_adaptive_entropy"),
    Rule("use_adaptive_entropy", ("algorithm.entropy_coeff",), lambda v, o: [] if not v else _refuse_adaptive(), "no adaptive entropy control "
         "(Skywork-OR1's) in cohort: refused, and entropy_coef with it"),
    *(none_of(k, "a parameter of TRL's adaptive entropy control (use_adaptive_entropy), which cohort does not have")
      for k in ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")),
    *(none_of(k, "cohort's reference model stays frozen") for k in ("sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps")),
    none_of("off_policy_mask_threshold", "no off-policy sequence masking; algorithm.off_policy_objective=mask_stale masks stale tokens"),
    none_of("use_bias_correction_kl", "cohort's KL term is not multiplied by the importance ratio"),
    Rule("shuffle_dataset", ("data.shuffle",), None),
    Rule("max_tool_calling_iterations", ("tools.max_turns",), _max_turns, "tool-calling turns + 1 = assistant turns"),
    Rule("log_completions", ("run.log_completions_every",), _log_completions, "True: every logging_steps"),
    Rule("num_completions_to_print", ("run.num_completions_to_log",), None),
    *(none_of(k, "cohort writes sample completions to completions.jsonl") for k in ("log_unique_prompts", "log_multimodal",
                                                                                    "log_completions_hub_repo")),
    none_of("disable_dropout", "cohort leaves the model's dropout as its config.json sets it"),
    none_of("remove_unused_columns", "every column of the data reaches the rewards"),
    none_of("pad_to_multiple_of", "cohort pads to the longest sequence of a micro-batch"),
    none_of("ds3_gather_for_generation", "no DeepSpeed: cohort shards with FSDP2 (train.num_processes)"),
    none_of("router_aux_loss_coef", "no MoE router loss in cohort"),
    *(none_of(k, "cohort generates with vLLM or its own transformers engine") for k in (
        "use_transformers_paged", "use_transformers_continuous_batching", "transformers_continuous_batching_config")),
    Rule("learning_rate", ("train.learning_rate",), None, "1e-6 by default in both"),
    mapped("lr_scheduler_type", "train.lr_scheduler", {"linear": "linear", "cosine": "cosine", "constant": "constant",
                                                       "constant_with_warmup": "constant"},
           "TRL inherits linear from TrainingArguments; cohort's default is constant", default="linear"),
    Rule("warmup_steps", ("train.warmup_steps",), _warmup("warmup_steps"), "steps; below 1, a ratio of the total steps"),
    Rule("warmup_ratio", ("train.warmup_steps",), _warmup("warmup_ratio"), "older transformers: ceil(ratio × total steps)"),
    Rule("weight_decay", ("train.weight_decay",), None),
    Rule("adam_beta1", ("train.adam_beta1",), None),
    Rule("adam_beta2", ("train.adam_beta2",), None),
    Rule("max_grad_norm", ("train.max_grad_norm",), None),
    none_of("adam_epsilon", "cohort's AdamW keeps torch's epsilon (1e-8, transformers' default too)"),
    none_of("optim", "cohort's optimizer is torch's AdamW"),
    Rule("max_steps", ("train.max_steps",), _max_steps, "optimizer steps in both"),
    Rule("num_train_epochs", ("train.max_steps",), _epochs,
         "epochs × floor(rows / prompts per generation batch) × optimizer steps per generation batch", default=3.0),
    Rule("seed", ("train.seed", "rollout.seed"), _seed, "data order and sampling"),
    none_of("data_seed", "train.seed orders the data"),
    Rule("gradient_checkpointing", ("train.gradient_checkpointing",), None, "TRL's default is True, cohort's False",
         default=True),
    none_of("gradient_checkpointing_kwargs", "cohort checkpoints each decoder layer"),
    Rule("output_dir", ("run.output_dir",), None),
    Rule("logging_steps", ("run.log_completions_every",), lambda value, o: [],
         "cohort logs every metric every step (metrics.jsonl); with log_completions it sets run.log_completions_every"),
    Rule("report_to", ("run.loggers",), _loggers, "wandb, tensorboard; console and metrics.jsonl always"),
    Rule("save_steps", ("run.save_every",), _save_every("save_steps"), "with save_strategy=steps"),
    Rule("save_strategy", ("run.save_every",), _save_every("save_strategy"), "no: 0; steps: save_steps"),
    Rule("save_total_limit", ("run.keep_checkpoints",), None),
    none_of("save_only_model", "cohort's checkpoints always hold what resuming needs"),
    Rule("eval_strategy", ("run.eval_every",), _eval_every("eval_strategy"), "no: 0 (before and after training only)"),
    Rule("eval_steps", ("run.eval_every",), _eval_every("eval_steps"), "with eval_strategy=steps"),
    none_of("per_device_eval_batch_size", "cohort scores the eval rows in one batch"),
    Rule("use_cpu", ("train.device",), lambda v, o: [Entry("train.device", "cpu" if v else "auto", o.show("use_cpu"))]),
    Rule("disable_tqdm", ("run.progress",), _negated("run.progress", "disable_tqdm")),
    none_of("run_name", "the run directory names the run (run.output_dir)"),
    none_of("logging_dir", "logs go to the run directory"),
    none_of("resume_from_checkpoint", "`cohort train --resume RUN_DIR`"),
    *(none_of(k, "cohort saves to run.output_dir only") for k in ("push_to_hub", "hub_model_id", "hub_strategy", "hub_private_repo")),
    *(none_of(k, TRAINER_ONLY) for k in ("do_train", "do_eval", "overwrite_output_dir", "logging_first_step", "log_level",
                                          "logging_strategy", "dataloader_num_workers", "ddp_find_unused_parameters",
                                          "torch_compile", "tf32", "bf16_full_eval", "fp16_full_eval", "eval_on_start",
                                          "include_tokens_per_second", "auto_find_batch_size")),
    *(none_of(k, "cohort shards with FSDP2 when train.num_processes > 1") for k in ("fsdp", "fsdp_config", "deepspeed")),
    none_of("use_liger_kernel", "cohort uses the model's own transformers kernels; its log-probs are chunked "
            "(train.logprob_chunk_size) instead of Liger's fused loss"),
    none_of("lr_scheduler_kwargs", "cohort's schedules (train.lr_scheduler) take no extra arguments: a cosine decays to 0"),
    none_of("vllm_device", "cohort places vLLM itself (engine.mode: colocate shares the trainer's GPU, local_server takes "
            "the GPUs after the trainer's)"),
    *OPEN_R1_RULES,
)
