"""tiny:arith: the cached build, its loading through transformers, and its accuracy band.

The real build takes about a minute on one core, so the accuracy tests share it
through the normal cache (``$COHORT_CACHE`` or ``~/.cache/cohort``): the first run
builds, later runs (and other test modules using ``tiny:arith``) find it. The
cache mechanics are tested with a seconds-long toy recipe in a temporary cache.
"""

import dataclasses
import json
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cohort.data.tasks import get_task
from cohort.models import tiny, tiny_recipes
from cohort.models.char_tokenizer import EOS_TOKEN_ID

# Documented band for held-out greedy accuracy of the warm start: aimed at 30–45%
# (validation-based early stop at 33%); the margin covers other machines' floats.
ACCURACY_BAND = (0.25, 0.55)

TOY_RECIPE = tiny_recipes.TinyRecipe(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=64, max_steps=3, check_every=3, target_accuracy=1.0,
    validation_size=8, expected_build_s=1,
)


@pytest.fixture(scope="module")
def arith_dir():
    return tiny.resolve_model_path("tiny:arith")


@pytest.fixture(scope="module")
def arith_metadata(arith_dir):
    return json.loads((arith_dir / tiny.METADATA_FILE).read_text())


def hf_greedy_accuracy(model, tokenizer, rows):
    """Greedy accuracy with transformers' own generate (an independent decoder):
    prompts grouped by length, so there is no padding."""
    correct = 0
    for length in sorted({len(row["prompt"]) for row in rows}):
        group = [row for row in rows if len(row["prompt"]) == length]
        input_ids = torch.tensor([tokenizer.encode(row["prompt"]) for row in group])  # (B, L)
        output = model.generate(
            input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=5,
            eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID,
        )
        for row, completion in zip(group, output[:, length:].tolist()):
            if EOS_TOKEN_ID in completion:
                text = tokenizer.decode(completion[: completion.index(EOS_TOKEN_ID)])
                correct += text == row["answer"]
    return correct / len(rows)


@pytest.mark.builtin_models('arith')
def test_checkpoint_loads_and_holds_its_documented_accuracy(arith_dir, arith_metadata):
    model = AutoModelForCausalLM.from_pretrained(arith_dir)
    tokenizer = AutoTokenizer.from_pretrained(arith_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(tokenizer)
    assert tokenizer.decode(tokenizer.encode("47 + 8 = 55")) == "47 + 8 = 55"
    accuracy = hf_greedy_accuracy(model, tokenizer, get_task("arith").eval_rows)
    assert ACCURACY_BAND[0] <= accuracy <= ACCURACY_BAND[1]
    # The builder's own decoder measured the same thing; allow two near-ties of 300.
    assert abs(accuracy - arith_metadata["eval_greedy_accuracy"]) <= 2 / 300


@pytest.mark.builtin_models('arith')
def test_metadata_records_the_build_and_rl_headroom(arith_dir, arith_metadata):
    assert arith_metadata["name"] == "tiny:arith"
    assert arith_metadata["recipe_digest"] in arith_dir.name
    assert arith_metadata["build_seconds"] > 0 and arith_metadata["steps"] > 0
    assert arith_metadata["validation_greedy_accuracy"] >= tiny.TINY_RECIPES["arith"].target_accuracy
    # Headroom for GRPO: the right answer is often sampled when greedy misses it.
    assert arith_metadata["eval_pass_at_8_t1"] >= arith_metadata["eval_greedy_accuracy"] + 0.2


def test_resolve_model_path(tmp_path):
    assert tiny.resolve_model_path(str(tmp_path)) == tmp_path
    with pytest.raises(FileNotFoundError, match="tiny:arith"):
        tiny.resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="unknown tiny model 'nope'"):
        tiny.resolve_model_path("tiny:nope")


@pytest.fixture
def toy_recipe(monkeypatch):
    monkeypatch.setitem(tiny.TINY_RECIPES, "toy", TOY_RECIPE)
    builds = []
    real_build = tiny._build_into
    monkeypatch.setattr(tiny, "_build_into", lambda *args: (builds.append(args[1]), real_build(*args)))
    return builds


@pytest.mark.slow
def test_build_is_cached_and_keyed_by_the_recipe(tmp_path, monkeypatch, toy_recipe):
    first = tiny.build_tiny_model("toy", cache_dir=tmp_path)
    assert (first / "config.json").is_file() and (first / "model.safetensors").is_file()
    assert tiny.build_tiny_model("toy", cache_dir=tmp_path) == first
    assert len(toy_recipe) == 1  # the second call found the cache
    monkeypatch.setenv("COHORT_CACHE", str(tmp_path))
    assert tiny.build_tiny_model("toy") == first
    assert tiny.build_tiny_model("toy", cache_dir=tmp_path, force=True) == first
    assert len(toy_recipe) == 2
    monkeypatch.setitem(tiny.TINY_RECIPES, "toy", dataclasses.replace(TOY_RECIPE, learning_rate=1e-3))
    changed = tiny.build_tiny_model("toy", cache_dir=tmp_path)
    assert changed != first and len(toy_recipe) == 3
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_concurrent_builders_build_once(tmp_path, toy_recipe):
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.build_tiny_model("toy", cache_dir=tmp_path)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert len(toy_recipe) == 1
