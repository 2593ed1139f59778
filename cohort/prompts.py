"""How long a prompt may be, decided by the model and the data before any weights load.

`data.max_prompt_length = None` (the default) means: as long as the model can hold
beside the completion (its `max_position_embeddings` − `rollout.max_completion_length`).
Whatever the ceiling, every budget that depends on the prompt (the vLLM sequence
length, the planner's token bound, the fit check) follows the longest prompt
actually kept after tokenizing with the model's own tokenizer, not the ceiling:
a 512-position model with 6-token prompts trains with the default config.

- `PromptRenderer`: a dataset prompt (a string, or chat messages rendered with the
  tokenizer's chat template) as token ids, applying `data.overlong_prompts`. In a tools run
  (tools.functions / tools.environment, tools.in_prompt) chat prompts are rendered with
  `tools=` the tools' JSON schemas, as TRL renders them, so the model sees each tool's name,
  description and arguments (the template's tools block); a template without a tools block
  is refused here, before any weights load (`tools_block_problems`). A prompt past the limit in such a run is told
  how many of its tokens the tools block adds, and, when it would fit without them, offered `tools.in_prompt: false`
  first (the block, not the completion budget, is what grew).
- `prompt_limit(cfg, max_positions)`: the ceiling, and how messages name it and fix it.
- `encode_prompts(...)`: token ids of the train and eval prompts under that ceiling
  (`data.overlong_prompts` decides what happens to longer ones), then `fit_problems`:
  a kept prompt + `rollout.max_completion_length` must fit the model's positions.
  Raised as a ConfigError, before the policy's weights load.

It sits above the config and the models (it reads both) and below the planner and
the trainer, which both encode prompts before any weights load.

Left out: the tokenizer's `model_max_length` (often a placeholder such as 1e30);
the model's positions decide.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cohort.config import CohortConfig, ConfigError
from cohort.data.datasets import DataError, PromptDataset
from cohort.models.chat_template import TOOLS_FIX, renders_tools
from cohort.models.tiny import TINY_RECIPES
from cohort.tools.tool_schemas import ToolResolution


class PromptRenderer:
    """`max_prompt_length` None keeps every prompt; `limit_name` and `fix` word the messages (`prompt_limit`)."""

    def __init__(self, tokenizer, max_prompt_length: int | None, overlong: str, *, limit_name: str = "data.max_prompt_length",
                 fix: str = "raise data.max_prompt_length", tools: list[dict] | None = None):
        """`tools`: JSON schemas rendered into chat prompts through the template's tools block (None: none)."""
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.max_prompt_length = max_prompt_length
        self.overlong = overlong
        self.limit_name = limit_name
        self.fix = fix

    def is_chat(self, prompt: Any) -> bool:
        return isinstance(prompt, list)

    def text(self, prompt: Any) -> str:
        if not self.is_chat(prompt):
            return prompt
        if not getattr(self.tokenizer, "chat_template", None):
            raise DataError(
                "prompts are chat messages but the tokenizer has no chat template; give plain-text prompts or a tokenizer "
                "whose tokenizer_config.json has a chat_template"
            )
        return self.tokenizer.apply_chat_template(prompt, tools=self.tools, tokenize=False, add_generation_prompt=True)

    def encode(self, prompt: Any) -> list[int]:
        return list(self.tokenizer(self.text(prompt), add_special_tokens=False)["input_ids"])

    def tools_block_tokens(self, prompt: Any, length: int) -> int | None:
        """How many of a chat prompt's `length` tokens (`encode`) the tools block adds (None: no tools block)."""
        if not self.tools or not self.is_chat(prompt):
            return None
        return length - len(PromptRenderer(self.tokenizer, None, self.overlong).encode(prompt))

    def _fix(self, prompt: Any, length: int, shortest: bool = False) -> tuple[str, str]:
        """(what the tools block adds to this over-long prompt of `length` tokens, "" without one; the fix), the
        `shortest` of several or one row's: leaving the block out (tools.in_prompt: false) is the first fix when the
        prompt would fit without it."""
        block = self.tools_block_tokens(prompt, length)
        if block is None:
            return "", self.fix
        share = f"{block} tokens (the shortest prompt has {length}, {length - block} without it)" if shortest else \
            f"{block} of them ({length - block} without it)"
        note = f"; the tools block rendered into each prompt (tools.in_prompt) adds {share}"
        if length - block <= self.max_prompt_length:
            return note, f"set tools.in_prompt: false (a checkpoint trained without a tools block), or {self.fix}"
        return note, self.fix

    def encode_dataset(self, dataset: PromptDataset, name: str) -> tuple[PromptDataset, list[list[int]], int]:
        """Token ids for every row, with overlong prompts handled; returns (dataset, ids, number filtered)."""
        keep_rows, keep_ids, keep_src, dropped = [], [], [], 0
        shortest: tuple[int, Any] | None = None  # (tokens, prompt) of the shortest over-long prompt
        all_ids = encode_texts(self.tokenizer, [self.text(row[dataset.prompt_key]) for row in dataset.rows])
        for row, src, ids in zip(dataset.rows, dataset.sources, all_ids):
            prompt = row[dataset.prompt_key]
            if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
                if self.overlong == "error":
                    note, fix = self._fix(prompt, len(ids))
                    raise DataError(
                        f"{src}: prompt has {len(ids)} tokens > {self.limit_name} = {self.max_prompt_length}{note}; "
                        f"{fix}, or set data.overlong_prompts to filter or truncate_left"
                    )
                if self.overlong == "filter":
                    dropped += 1
                    shortest = min(shortest, (len(ids), prompt), key=lambda pair: pair[0]) if shortest else (len(ids), prompt)
                    continue
                ids = ids[-self.max_prompt_length:]
            keep_rows.append(row)
            keep_ids.append(ids)
            keep_src.append(src)
        if not keep_rows:
            note, fix = self._fix(shortest[1], shortest[0], shortest=True) if shortest else ("", self.fix)
            raise DataError(f"{name}: every prompt is longer than {self.limit_name} = {self.max_prompt_length}{note}; {fix}")
        return PromptDataset(keep_rows, dataset.prompt_key, keep_src), keep_ids, dropped


ENCODE_CHECKED_ROWS = 8  # encode_texts: rows encoded both ways (shared ends and whole) before the shortcut is trusted


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text's token ids, exactly as `tokenizer(text, add_special_tokens=False)` gives them, in a fraction of the
    time when the texts share a head and a tail that end and start at an added token (a chat template's system turn
    and tools block, its end-of-turn and assistant header): those are tokenized once and only each text's middle is.

    Exact because a fast tokenizer splits its input at added tokens before normalizing and pre-tokenizing, so nothing
    merges across one. Only added tokens that do not strip or reach into their neighbours (no lstrip, rstrip,
    single_word, normalized) serve as cuts; and the first ENCODE_CHECKED_ROWS texts, the longest and the shortest are
    encoded both ways first: any difference (a tokenizer that splits otherwise) encodes every text whole.
    Qwen2.5-Coder's 89,100 tool_calc prompts with the tools block (~208 tokens, ~15 of them the question): 47 s whole,
    a few seconds this way (the plan and the trainer each encode them before anything loads)."""
    whole = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    cuts = _shared_ends(tokenizer, texts) if len(texts) > ENCODE_CHECKED_ROWS else None
    if cuts is None:
        return [whole(text) for text in texts]
    head_len, tail_len = cuts
    head, tail = whole(texts[0][:head_len]), whole(texts[0][len(texts[0]) - tail_len:]) if tail_len else []
    middles = [text[head_len:len(text) - tail_len] for text in texts]
    checked = {*range(ENCODE_CHECKED_ROWS), max(range(len(texts)), key=lambda i: len(texts[i])),
               min(range(len(texts)), key=lambda i: len(texts[i]))}
    if any(head + whole(middles[i]) + tail != whole(texts[i]) for i in checked):
        return [whole(text) for text in texts]
    return [head + list(ids) + tail for ids in tokenizer(middles, add_special_tokens=False)["input_ids"]]


def _shared_ends(tokenizer, texts: list[str]) -> tuple[int, int] | None:
    """(characters of the shared head, of the shared tail), each cut at an added token that splits cleanly (the head
    after one, the tail before one); None when neither exists or the tokenizer lists no added tokens."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    cuts = [t.content for t in added.values() if t.content and not (getattr(t, "lstrip", False) or getattr(t, "rstrip", False)
                                                                      or getattr(t, "single_word", False) or getattr(t, "normalized", True))]
    if not cuts:
        return None
    shortest = min(len(text) for text in texts)
    prefix = os.path.commonprefix(texts)
    head_len = max((prefix.rfind(c) + len(c) for c in cuts if c in prefix), default=0)
    suffix = os.path.commonprefix([text[::-1] for text in texts])[::-1]
    room = shortest - head_len  # the tail may not reach into the head of the shortest text
    suffix = suffix[len(suffix) - min(len(suffix), room):] if room > 0 else ""
    starts = [suffix.find(c) for c in cuts if c in suffix]
    tail_len = len(suffix) - min(starts) if starts else 0
    if head_len == 0 and tail_len == 0:
        return None
    return head_len, tail_len


@dataclass(frozen=True)
class PromptLimit:
    """The longest prompt kept whole (None: no bound known) and the words messages use for it."""

    tokens: int | None
    name: str  # e.g. "data.max_prompt_length"
    fix: str  # how to let longer prompts in


def prompt_limit(cfg: CohortConfig, max_positions: int | None) -> PromptLimit:
    if cfg.data.max_prompt_length is not None:
        return PromptLimit(cfg.data.max_prompt_length, "data.max_prompt_length", "raise data.max_prompt_length")
    completion = cfg.rollout.max_completion_length
    if max_positions is None:  # the model's config states no length: nothing to filter by
        return PromptLimit(None, "data.max_prompt_length", "set data.max_prompt_length")
    return PromptLimit(max_positions - completion,
                       f"the model's max_position_embeddings − rollout.max_completion_length ({max_positions} − {completion})",
                       "lower rollout.max_completion_length (or use a model with more positions)")


def max_positions_of(model_path: str | Path) -> int | None:
    """The model's max_position_embeddings (n_positions for GPT-2-style configs), from config.json or a tiny recipe."""
    text = str(model_path)
    if text.startswith("tiny:"):
        recipe = TINY_RECIPES.get(text.split(":", 1)[1])
        return recipe.max_position_embeddings if recipe else None
    try:
        config = json.loads((Path(text).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    config = config.get("text_config", config)  # multimodal wrappers keep the LM's numbers inside
    value = config.get("max_position_embeddings", config.get("n_positions"))
    return int(value) if value else None


def fit_problems(cfg: CohortConfig, max_positions: int | None, longest: int | None = None, where: str = "") -> list[str]:
    """A prompt of `longest` tokens (None: the data was not read) + the completion must fit `max_positions`."""
    completion = cfg.rollout.max_completion_length
    if max_positions is None:
        return []
    if completion >= max_positions:
        return [f"rollout.max_completion_length = {completion} leaves no room for a prompt in the model's "
                f"max_position_embeddings = {max_positions}; lower it (e.g. to {max_positions // 2})"]
    if longest is None or longest + completion <= max_positions:
        return []
    fixes = [f"lower data.max_prompt_length to {max_positions - completion} (longer prompts then follow data.overlong_prompts) "
             "or unset it (None: what fits the model)"]
    if max_positions - longest >= 1:
        fixes.append(f"lower rollout.max_completion_length to {max_positions - longest}")
    return [f"the longest prompt kept ({where}: {longest} tokens) + rollout.max_completion_length = {longest} + {completion} = "
            f"{longest + completion} exceeds the model's max_position_embeddings = {max_positions}; {', or '.join(fixes)}"]


def _run_tools(cfg: CohortConfig, resolution: ToolResolution | None) -> list[dict] | None:
    """The tools' schemas the prompts show (`ToolResolution.shown`: the run's resolution when given); a tool that does
    not resolve is the tools checks' problem (cohort/tools/tool_checks.py), so it shows nothing here."""
    try:
        return (resolution if resolution is not None else ToolResolution(cfg.tools)).shown()
    except ValueError:
        return None


def tools_block_problem(cfg: CohortConfig) -> str:
    """The refusal of a chat template that does not render `tools=` (SmolLM2's), with the fix."""
    template = f"model.chat_template = {cfg.model.chat_template!r}" if cfg.model.chat_template else \
        f"the chat template of model.path = {cfg.model.path!r}"
    return (f"tools.in_prompt: {template} has no tools block (rendered with a probe tool, its name and description do not "
            f"appear), so the model would never see the tools' names, descriptions and arguments; {TOOLS_FIX}, or set "
            "tools.in_prompt: false for a checkpoint trained without a tools block")


@dataclass
class EncodedPrompts:
    """The kept prompts of a run and their token ids."""

    renderer: PromptRenderer
    train: PromptDataset
    train_ids: list[list[int]]
    eval: PromptDataset | None
    eval_ids: list[list[int]] | None
    filtered: int  # train prompts dropped as overlong

    def longest(self) -> tuple[int, str]:
        """(tokens, row) of the longest prompt kept, train or eval."""
        pairs = list(zip(self.train_ids, self.train.sources))
        if self.eval is not None:
            pairs += list(zip(self.eval_ids, self.eval.sources))
        ids, where = max(pairs, key=lambda pair: len(pair[0]))
        return len(ids), where


def encode_prompts(cfg: CohortConfig, tokenizer, model_dir: str | Path, train: PromptDataset,
                   evals: PromptDataset | None, tools: ToolResolution | None = None) -> EncodedPrompts:
    """Token ids under the run's prompt limit; raises DataError (a row, or all rows, too long) or ConfigError (cannot
    fit). `tools`: the run's resolved tools (cohort/plan/run_environment.py), whose schemas a tools run shows."""
    positions = max_positions_of(model_dir)
    limit = prompt_limit(cfg, positions)
    problems = fit_problems(cfg, positions)
    if problems:  # no room for any prompt: say so before tokenizing
        raise ConfigError(problems)
    shown = _run_tools(cfg, tools)
    if shown and not renders_tools(tokenizer):
        raise ConfigError([tools_block_problem(cfg)])
    renderer = PromptRenderer(tokenizer, limit.tokens, cfg.data.overlong_prompts, limit_name=limit.name, fix=limit.fix,
                              tools=shown)
    train, train_ids, filtered = renderer.encode_dataset(train, "train data")
    eval_ids = None
    if evals is not None:
        evals, eval_ids, _ = renderer.encode_dataset(evals, "eval data")
    encoded = EncodedPrompts(renderer, train, train_ids, evals, eval_ids, filtered)
    problems = fit_problems(cfg, positions, *encoded.longest())
    if problems:
        raise ConfigError(problems)
    return encoded
