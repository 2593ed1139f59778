"""tiny:arith_chat: the realistic chat checkpoint's shape, warm-started on the chat-form arith task.

Like tests/models/test_tiny.py, the build (a minute or two on one core) is shared
through the normal cache (``$COHORT_CACHE`` or ``~/.cache/cohort``): the module
fixture builds it on the first run only. The cache mechanics themselves are tested
there with a toy recipe; here the checkpoint's tokens, stop ids and accuracy.
"""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from cohort.config.resolve import load_config
from cohort.data.tasks import get_task
from cohort.models import tiny
from cohort.models.pretrained import check_model_dir, load_tokenizer, stop_token_ids

# Held-out greedy accuracy of the warm start: aimed at 30–45% as tiny:arith's (validation early stop at 33%);
# the margin covers other machines' floats.
ACCURACY_BAND = (0.25, 0.55)
ONE_TURN = "<|im_start|>user\n47+8=<|im_end|>\n<|im_start|>assistant\n"  # no default system turn (ChatRecipe)


def test_the_name_is_checked_against_the_tiny_recipes_without_a_build(monkeypatch):
    monkeypatch.setattr("cohort.models.pretrained.build_tiny_model", lambda *a, **k: pytest.fail("a name check built a model"))
    assert check_model_dir("tiny:arith_chat") == []
    assert check_model_dir("tiny:nope") == ["model.path = 'tiny:nope': unknown tiny model; choose one of tiny:arith, tiny:arith_chat, tiny:long_tail, tiny:tool_calc"]


@pytest.fixture(scope="module")
def chat_dir():
    return tiny.resolve_model_path("tiny:arith_chat")


@pytest.fixture(scope="module")
def chat_metadata(chat_dir):
    return json.loads((chat_dir / tiny.METADATA_FILE).read_text())


@pytest.fixture(scope="module")
def chat_tok(chat_dir):
    return load_tokenizer(chat_dir)


@pytest.mark.builtin_models('arith_chat')
def test_tokenizer_has_the_chat_specials_and_two_stop_ids(chat_dir, chat_tok):
    assert type(chat_tok).__name__ == "Qwen2Tokenizer"
    assert json.loads((chat_dir / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    im_start, im_end, pad = (chat_tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    assert chat_tok.eos_token_id == im_end and chat_tok.pad_token_id == pad and pad != im_end
    assert {im_start, im_end} <= set(chat_tok.all_special_ids)
    generation = json.loads((chat_dir / "generation_config.json").read_text())
    config = json.loads((chat_dir / "config.json").read_text())
    assert generation["eos_token_id"] == [im_end, pad] and config["eos_token_id"] == im_end and config["pad_token_id"] == pad
    assert stop_token_ids(chat_dir, chat_tok) == sorted([im_end, pad])


@pytest.mark.builtin_models('arith_chat')
def test_the_chat_task_renders_one_turn_with_single_digit_tokens(chat_tok):
    task = get_task("arith_chat")
    row = next(r for r in task.train_rows + task.eval_rows if r["prompt"][0]["content"] == "47+8=")
    text = chat_tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    assert text == ONE_TURN
    # Qwen's split regex isolates every digit, so "47+8=" is 5 tokens whatever the BPE merged
    ids = chat_tok(text, add_special_tokens=False)["input_ids"]
    assert chat_tok.convert_ids_to_tokens(ids)[3:8] == ["4", "7", "+", "8", "="] and len(ids) == 13
    with_system = [{"role": "system", "content": "Be brief."}] + row["prompt"]
    assert chat_tok.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n" + ONE_TURN)


def hf_greedy_accuracy(model, tokenizer, rows):
    """Greedy accuracy with transformers' own generate (an independent decoder) stopping at either stop id;
    prompts grouped by token length, so there is no padding."""
    stops = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    encoded = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in encoded]
    correct = 0
    for length in sorted({len(ids) for ids in encoded}):
        group = [i for i, ids in enumerate(encoded) if len(ids) == length]
        input_ids = torch.tensor([encoded[i] for i in group])  # (B, L)
        output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=5,
                                eos_token_id=stops, pad_token_id=tokenizer.pad_token_id)
        for i, completion in zip(group, output[:, length:].tolist()):
            if tokenizer.eos_token_id in completion:
                text = tokenizer.decode(completion[: completion.index(tokenizer.eos_token_id)])
                correct += text == rows[i]["answer"]
    return correct / len(rows)


@pytest.mark.builtin_models('arith_chat')
def test_checkpoint_holds_its_recorded_accuracy_in_the_band(chat_dir, chat_tok, chat_metadata):
    model = AutoModelForCausalLM.from_pretrained(chat_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(chat_tok)
    recorded = chat_metadata["eval_greedy_accuracy"]
    assert ACCURACY_BAND[0] <= recorded <= ACCURACY_BAND[1]
    # The builder's own decoder measured the same thing; allow two near-ties of 300.
    assert abs(hf_greedy_accuracy(model, chat_tok, get_task("arith_chat").eval_rows) - recorded) <= 2 / 300


@pytest.mark.builtin_models('arith_chat')
def test_metadata_records_the_build_and_rl_headroom(chat_dir, chat_metadata):
    assert chat_metadata["name"] == "tiny:arith_chat" and chat_metadata["task"] == "arith_chat"
    assert chat_metadata["recipe_digest"] in chat_dir.name
    assert chat_metadata["validation_greedy_accuracy"] >= tiny.TINY_RECIPES["arith_chat"].target_accuracy
    assert chat_metadata["eval_pass_at_8_t1"] >= chat_metadata["eval_greedy_accuracy"] + 0.2


def test_the_chat_example_is_the_demo_preset_on_the_chat_model_in_bf16():
    """examples/arith_chat.yaml changes only the model, its dtype and the task, so its gains compare with the demo's."""
    example = load_config(Path(__file__).resolve().parents[2] / "examples" / "arith_chat.yaml").to_dict()
    preset = load_config(None).to_dict()  # no config: the demo preset (examples/arith.yaml)
    assert (example["model"]["path"], example["model"]["dtype"], example["train"]["precision"]) == ("tiny:arith_chat", "bfloat16", "mixed")
    assert example["data"]["task"] == "arith_chat"
    for tree in (example, preset):
        del tree["model"]["path"], tree["model"]["dtype"], tree["data"]["task"]
    assert example == preset
