"""The tiny models' build-time decoding (``cohort.models.tiny``): the ``Codec`` a recipe encodes and decodes with, and
greedy and sampled completions with no engine and no padding; `char_codec`: the character tokenizer's codec.

Prompts are grouped by length and each group decodes as one batch, so no row is ever padded.

Two ways to run the model, chosen by the recipe: the whole sequence again at every token for ``max_new_tokens``
(``kv_cache=False``, what the arithmetic recipes were built and pinned with: a rebuild of ``tiny:arith`` gives the
same bytes), or one token at a time on transformers' KV cache, a group stopping as soon as every row in it has its
eos (``kv_cache=True``, for completions of hundreds of tokens: the long-tail recipe). The two can differ: argmax on
a near tie, and the sampled texts of every group after one that stopped early (the generator is shared, and a
stopped group skips its draws), which is why the older recipes keep the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from cohort.models.char_tokenizer import EOS_TOKEN_ID, VOCAB_SIZE, build_char_tokenizer


@dataclass(frozen=True)
class Codec:
    """How the warm start turns a task row into token ids and a completion back into text."""

    encode_prompt: Callable[[Any], list[int]]
    encode_answer: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    vocab_size: int
    eos_id: int  # ends a completion (and the supervised target)
    pad_id: int


@torch.no_grad()
def decode_loop(model, prompts: list, num_samples: int, max_new_tokens: int, generator, codec: Codec, *,
                kv_cache: bool = False) -> list[list[str | None]]:
    """``num_samples`` completions per prompt: argmax when ``generator`` is None, else sampling at temperature 1."""
    was_training = model.training
    model.eval()
    encoded = [codec.encode_prompt(prompt) for prompt in prompts]
    results: list[list[str | None]] = [[] for _ in prompts]
    for length in sorted({len(ids) for ids in encoded}):
        indices = [i for i, ids in enumerate(encoded) if len(ids) == length]
        tokens = torch.tensor([encoded[i] for i in indices]).repeat_interleave(num_samples, dim=0)  # (B*S, L)
        tokens = decode_group(model, tokens, max_new_tokens, generator, codec.eos_id, kv_cache)  # (B*S, L + new)
        for row, index in enumerate(indices):
            for sample in range(num_samples):
                completion = tokens[row * num_samples + sample, length:].tolist()
                results[index].append(_text_until_eos(codec, completion))
    model.train(was_training)
    return results


def decode_group(model, tokens: torch.Tensor, max_new_tokens: int, generator, eos_id: int, kv_cache: bool) -> torch.Tensor:
    """``tokens`` (B, L) extended by up to ``max_new_tokens`` columns; with ``kv_cache``, stops once every row holds eos."""
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool)  # (B,)
    past, step_input = None, tokens
    for _ in range(max_new_tokens):
        if kv_cache:
            output = model(input_ids=step_input, past_key_values=past, use_cache=True)
            past = output.past_key_values
        else:
            output = model(input_ids=tokens)
        logits = output.logits[:, -1].float()  # (B, V)
        if generator is None:
            next_token = logits.argmax(dim=-1)
        else:
            next_token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)[:, 0]
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        step_input = next_token[:, None]  # (B, 1)
        finished |= next_token == eos_id
        if kv_cache and bool(finished.all()):
            break
    return tokens


def _text_until_eos(codec: Codec, completion_ids: list[int]) -> str | None:
    """The completion's text before eos; None when it never stopped (never correct)."""
    if codec.eos_id not in completion_ids:
        return None
    return codec.decode(completion_ids[: completion_ids.index(codec.eos_id)])


def char_codec() -> Codec:
    tokenizer = build_char_tokenizer()
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    return Codec(encode, encode, tokenizer.decode, VOCAB_SIZE, EOS_TOKEN_ID, EOS_TOKEN_ID)


def greedy_completions(model, prompts: list, max_new_tokens: int = 5, *, codec: Codec | None = None,
                       kv_cache: bool = False) -> list[str | None]:
    """Greedy completion text per prompt (None if no eos within ``max_new_tokens``); ``kv_cache``: see tiny_decode."""
    return [texts[0] for texts in decode_loop(model, prompts, 1, max_new_tokens, None, codec or char_codec(), kv_cache=kv_cache)]


def sampled_completions(
    model, prompts: list, num_samples: int, max_new_tokens: int = 5, *, seed: int = 0, codec: Codec | None = None,
    kv_cache: bool = False,
) -> list[list[str | None]]:
    """``num_samples`` temperature-1 completions per prompt, from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return decode_loop(model, prompts, num_samples, max_new_tokens, generator, codec or char_codec(), kv_cache=kv_cache)


def tail_lengths(model, prompts: list, max_new_tokens: int, codec: Codec | None = None) -> list[int]:
    """Each prompt's one temperature-1 completion (seed 0, on the KV cache), as its length with the eos (in tokens with the
    character tokenizer, which the recipes that read it use); one that never stops counts ``max_new_tokens``: what an
    engine sampling these prompts would decode."""
    samples = sampled_completions(model, prompts, 1, max_new_tokens, seed=0, codec=codec, kv_cache=True)
    return [max_new_tokens if texts[0] is None else len(texts[0]) + 1 for texts in samples]
