"""tiny:long_tail: batches of similar length, decoding on a KV cache equal to decoding without, and the built model's
sampled lengths (a long tail) and headroom."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from cohort.data.tasks import get_task
from cohort.models import tiny, tiny_decode, tiny_recipes
from cohort.models.char_tokenizer import EOS_TOKEN_ID
from cohort.models.tiny_decode import decode_group

RECIPE = tiny.TINY_RECIPES["long_tail"]


def test_batches_group_rows_of_one_length_and_thin_out_the_shortest():
    recipe = dataclasses.replace(RECIPE, batch_size=2, short_batch_keep=2)
    # 11 rows: six one-number rows (19 tokens), three of 25, two of 31; 11 % 2 = 1 row (a shortest one) is left over
    lengths = torch.tensor([19, 25, 19, 31, 19, 25, 19, 31, 19, 25, 19])
    order = torch.randperm(11, generator=torch.Generator().manual_seed(0))
    batches = recipe.batches(order, lengths, torch.Generator().manual_seed(1))
    widths = sorted(lengths[b].tolist() for b in batches)
    # sorted by length: [19]*5 | [19, 25]... cut from the long end into pairs: (31, 31), (25, 25), (19, 25), (19, 19),
    # (19, 19) -> the two all-19 batches are the shortest ones, of which one in two (short_batch_keep) stays
    assert widths == [[19, 19], [19, 25], [25, 25], [31, 31]]
    assert all(len(b) == 2 for b in batches)
    assert len({int(i) for b in batches for i in b}) == 8  # no row twice


def test_kv_cache_decoding_equals_recomputing_the_whole_sequence():
    torch.manual_seed(0)
    recipe = dataclasses.replace(RECIPE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                 intermediate_size=64)
    model = tiny_recipes.new_tiny_model(recipe)
    prompts = ["14797..14800=", "99900..99900=", "1=", "12="]  # (three prompt lengths: three groups)
    assert tiny_decode.greedy_completions(model, prompts, 16, kv_cache=True) == tiny_decode.greedy_completions(model, prompts, 16)
    assert (tiny_decode.sampled_completions(model, prompts, 2, 16, seed=3, kv_cache=True)
            == tiny_decode.sampled_completions(model, prompts, 2, 16, seed=3))


class CountdownModel(torch.nn.Module):
    """A fake causal LM: row r of a batch emits token 65 ("A") until it has generated r + 1 tokens, then eos."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, input_ids, past_key_values=None, use_cache=False):
        self.calls += 1
        generated = self.calls - 1  # tokens each row has generated before this call
        logits = torch.full((input_ids.shape[0], input_ids.shape[1], 300), -1e9)
        for row in range(input_ids.shape[0]):
            logits[row, -1, EOS_TOKEN_ID if generated >= row + 1 else 65] = 0.0
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


def test_on_the_kv_cache_a_group_stops_once_every_row_has_its_eos():
    model = CountdownModel()
    tokens = decode_group(model, torch.zeros(3, 1, dtype=torch.long), 50, None, EOS_TOKEN_ID, kv_cache=True)  # (3, 1 + 4)
    # row 0 ends at its 2nd token, row 2 (the last to end) at its 4th: 4 calls, not 50, and row 0 keeps its text
    assert model.calls == 4 and tokens.shape == (3, 5)
    assert tokens[0, 1:3].tolist() == [65, EOS_TOKEN_ID] and tokens[2, 1:].tolist() == [65, 65, 65, EOS_TOKEN_ID]
    # without the cache (the arithmetic recipes' decoding) every group runs to max_new_tokens, as they were built
    model = CountdownModel()
    assert decode_group(model, torch.zeros(3, 1, dtype=torch.long), 6, None, EOS_TOKEN_ID, kv_cache=False).shape == (3, 7)
    assert model.calls == 6


@pytest.mark.slow  # tiny:long_tail is built before the tests (~6-20 minutes on 2 shared cores), then found cached
@pytest.mark.builtin_models('long_tail')
def test_the_built_model_samples_a_long_tail_of_lengths_and_leaves_headroom():
    directory = tiny.resolve_model_path("tiny:long_tail")
    metadata = json.loads((directory / tiny.METADATA_FILE).read_text())
    assert metadata["validation_greedy_accuracy"] >= RECIPE.target_accuracy
    # headroom: greedy short of every answer, and pass@8 above one sample. The shipped build (Intel Xeon, step 600) reads
    # 92.0% greedy, 88.3% sampled, pass@8 94.0%; builds on AMD EPYC machines stopped at 78.5% and 79.5%
    assert 0.6 <= metadata["eval_greedy_accuracy"] <= 0.95 and metadata["eval_pass_at_8_t1"] > metadata["eval_sampled_accuracy_t1"]
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert model.config.max_position_embeddings >= 13 + 256  # the prompt and a whole completion budget
    # What the engine will see: one temperature-1 sample for each of the first 512 train prompts (the task's
    # distribution: 25 of their answers are over 100 tokens), its length in tokens (eos included; a completion that
    # never stops counts the whole budget). The build stopped only where 1-10% of them run past 100 tokens
    # (LongTailRecipe.stop_check); replayed here as it measured it (one thread, seed 0), the model says the same.
    # Built on three machines: 13 of 512 over 100 at step 300 on one, 8 of 512 at step 350 on another (its step-300
    # check read none, and the recipe before this stop check stopped there), 8 of 512 at step 600 on the one whose
    # build ships. Most stop within a few numbers.
    prompts = [row["prompt"] for row in get_task("long_tail").train_rows[: RECIPE.tail_prompts]]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lengths = sorted(tiny_decode.tail_lengths(model, prompts, 256))
    finally:
        torch.set_num_threads(previous)
    assert len(lengths) == 512 and lengths[len(lengths) // 2] <= 18  # the median at most 3 numbers (17 characters, eos)
    share = sum(n > 100 for n in lengths) / len(lengths)
    assert 0.01 <= share <= 0.10 and share == metadata["sampled_share_over_100_tokens"]


def test_the_warm_start_stops_only_when_the_recipes_stop_check_agrees():
    # A recipe whose accuracy target every check meets (0.0) and whose stop check says no twice, then yes: the warm
    # start checks after steps 1, 2 and 3 (check_every 1) and stops after the third, keeping what the check read.
    calls = []

    @dataclasses.dataclass(frozen=True)
    class Picky(type(RECIPE)):
        def stop_check(self, model, sft_rows, codec):
            calls.append(len(sft_rows))
            return len(calls) == 3, {"checks": len(calls)}

    recipe = Picky(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                   batch_size=4, check_every=1, target_accuracy=0.0, max_steps=10, max_new_tokens=4, warmup_steps=1)
    rows = get_task("long_tail").train_rows[:12]
    torch.manual_seed(0)
    stats = tiny_recipes.warm_start(tiny_recipes.new_tiny_model(recipe), recipe, rows[:8], rows[8:], tiny_decode.char_codec())
    assert stats["steps"] == 3 and stats["checks"] == 3 and calls == [8, 8, 8]
    assert [entry[0] for entry in stats["history"]] == [1, 2, 3] and stats["history"][-1][-1] == 3
