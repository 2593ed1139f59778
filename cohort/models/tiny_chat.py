"""A realistic tiny chat checkpoint, built offline: what real instruct models have, at test size.

`tiny:arith` (``cohort.models.tiny``) uses a character tokenizer whose EOS is also
its pad token and whose chat template only concatenates. Real checkpoints differ
in the ways that break training code: a byte-level BPE tokenizer with merges,
special chat tokens, a pad token distinct from EOS and two stop ids. This module
builds a Qwen2.5-Instruct-shaped checkpoint with all of them:

- a byte-level BPE tokenizer trained with `tokenizers` on generated text (the
  arith task's problems and answers in chat form, plus tool-call scaffolding),
  with the pipeline transformers' `Qwen2Tokenizer` rebuilds (NFC, Qwen's split
  regex, ByteLevel without prefix space): transformers 5 loads every
  ``model_type: qwen2`` directory with that class whatever ``tokenizer_class``
  says, so matching it keeps the loaded tokenizer encoding exactly as built
  (pinned in tests);
- special tokens after the BPE vocabulary, as Qwen's: ``<|endoftext|>`` (pad),
  ``<|im_start|>``, ``<|im_end|>`` (EOS);
- a Qwen2.5-style chat template (default system message, tools block,
  ``<tool_call>`` rendering of assistant tool calls, ``tool`` turns wrapped in
  ``<tool_response>``); ``chat_template(None)`` is the same without the default
  system turn (a system turn only when the messages give one, as Qwen3's,
  Llama-3's and Mistral's templates do);
- ``generation_config.json`` with ``eos_token_id: [<|im_end|>, <|endoftext|>]``
  (as Qwen2.5-Instruct ships) and config.json's ``eos_token_id`` = ``<|im_end|>``;
- a random-initialised ~0.1M-parameter Qwen2 (hidden 64, 2 layers) with tied
  embeddings (head dim 32, the smallest vLLM's CPU attention accepts).

The warm-started chat model is ``tiny:arith_chat`` (``cohort.models.tiny_recipes.ChatRecipe``):
this tokenizer, the template without a default system turn, tiny:arith's recipe
(hidden 128, 4 layers, lr 2e-3, batch 64, early stop at 33% greedy validation
accuracy), trained on the ``arith_chat`` task rendered by the template, loss on
the answer and ``<|im_end|>`` only; cached like tiny:arith. Why no default system
turn: with Qwen2.5's "You are a helpful assistant." a one-turn prompt is 24 tokens
(13 without) and the same recipe learnt far slower — 5% validation accuracy after
300 steps (7–10% after 600 in an earlier trial), against 30% after 400 steps
without it (one seed each). Digits are single tokens either way (the
split regex isolates each digit), as in the character tokenizer.

Left out: a cache for the random checkpoint (a build takes ~2.5 s, mostly training
the BPE); a vocabulary learnt from real text (the corpus is the arith task and
tool-call scaffolding, so the BPE merges little beyond those words).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from cohort.data.tasks import get_task

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
DEFAULT_SYSTEM = "You are a helpful assistant."
# transformers' Qwen2Tokenizer split regex (models/qwen2/tokenization_qwen2.py), which that class always installs
QWEN2_SPLIT_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

def chat_template(default_system: str | None = DEFAULT_SYSTEM) -> str:
    """A Qwen2.5-style template; with `default_system` None no system turn is added unless the messages give one
    (as Qwen3's, Llama-3's and Mistral's templates do), so a one-turn prompt is ~13 tokens instead of ~24."""
    system_else = "{%- else %}{{- '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' }}" if default_system else ""
    tools_else = "{{- '" + default_system + "\\n\\n' }}" if default_system else ""
    return (
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- else %}" + tools_else + "{%- endif %}"
        "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
        "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
        "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
        "\\n</tool_call><|im_end|>\\n' }}"
        "{%- else %}"
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        + system_else + "{%- endif %}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
        "(message.role == 'assistant' and not message.tool_calls) %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
        "{%- elif message.role == 'assistant' %}"
        "{{- '<|im_start|>' + message.role }}"
        "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
        "{%- for tool_call in message.tool_calls %}"
        "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
        "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- elif message.role == 'tool' %}"
        "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
        "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
        "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


CHAT_TEMPLATE = chat_template()


def chat_corpus(task: str = "arith", seed: int = 0) -> list[str]:
    """Training text for the tokenizer: each train problem as a chat turn and as a calculator tool call."""
    rows = get_task(task, seed=seed).train_rows
    texts = []
    for row in rows:
        prompt, answer = row["prompt"], row["answer"]
        texts.append(f"system\n{DEFAULT_SYSTEM}\nuser\n{prompt}\nassistant\n{answer}\n")
        texts.append(f'assistant\n<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{prompt[:-1]}"}}}}\n'
                     f"</tool_call>\nuser\n<tool_response>\n{answer}\n</tool_response>\n")
    return texts


def build_chat_tokenizer(texts: list[str], vocab_size: int = 512) -> Tokenizer:
    """A byte-level BPE trained on `texts` (special tokens are not in them), then the three special tokens after it."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer


def save_chat_tokenizer(out_dir: Path, tokenizer: Tokenizer, *, model_max_length: int,
                        template: str = CHAT_TEMPLATE) -> dict[str, int]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json, written by hand (as `save_char_tokenizer`
    does, so the files do not depend on the transformers version); returns the special tokens' ids."""
    tokenizer.save(str(out_dir / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                           "special": True} for t in SPECIAL_TOKENS}
    config = {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added, "additional_special_tokens": [IM_START, IM_END],
              "bos_token": None, "eos_token": IM_END, "pad_token": PAD_TOKEN, "unk_token": None, "errors": "replace",
              "clean_up_tokenization_spaces": False, "split_special_tokens": False, "model_max_length": model_max_length,
              "chat_template": template}
    special_map = {"eos_token": IM_END, "pad_token": PAD_TOKEN, "additional_special_tokens": [IM_START, IM_END]}
    for name, payload in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map)):
        (out_dir / name).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return ids


def build_random_chat_model(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 512, max_positions: int = 256,
                            init_std: float = 0.1) -> Path:
    """Write the tiny chat checkpoint (module docstring) into `out_dir`: random weights of std `init_std`
    (larger than the default 0.02 init, so samples are varied but not uniform)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(chat_corpus(), vocab_size)
    ids = save_chat_tokenizer(out_dir, tokenizer, model_max_length=max_positions)
    config = Qwen2Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_positions,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=ids[IM_END], pad_token_id=ids[PAD_TOKEN])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, init_std)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    write_generation_config(out_dir, eos_id=ids[IM_END], pad_id=ids[PAD_TOKEN])
    return out_dir


def write_generation_config(out_dir: Path, *, eos_id: int, pad_id: int) -> None:
    """Two stop ids, end-of-turn first, as Qwen2.5-Instruct ships them (the pad token is `<|endoftext|>`)."""
    generation = {"eos_token_id": [eos_id, pad_id], "pad_token_id": pad_id, "bos_token_id": None}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
