"""The character tokenizer loads through AutoTokenizer and round-trips text exactly."""

import json

import pytest
from transformers import AutoTokenizer

from cohort.models.char_tokenizer import (
    EOS_TOKEN,
    EOS_TOKEN_ID,
    IM_END_TOKEN,
    IM_START_TOKEN,
    VOCAB_SIZE,
    build_char_tokenizer,
    save_char_tokenizer,
)

ROUND_TRIP_TEXTS = [
    "23+45=68",
    "47-8=39",
    "two  spaces, a trailing one ",
    " leading space",
    "line one\nline two\n\ttabbed",
    "Answer: (3 * 4) / 2 = 6; done! #@$%^&_[]{}<>|~`'\"?",
    "ABC xyz 0123456789",
    "café, naïve, 漢字",  # non-ASCII falls back to UTF-8 bytes
    "",
]


@pytest.fixture(scope="module", params=["bare", "qwen2_checkpoint"])
def tokenizer(request, tmp_path_factory):
    """Loaded through AutoTokenizer, alone and beside a Qwen2 config.json (where
    transformers 5 substitutes its own tokenizer class)."""
    directory = tmp_path_factory.mktemp(request.param)
    save_char_tokenizer(directory)
    if request.param == "qwen2_checkpoint":
        config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": VOCAB_SIZE}
        (directory / "config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_encode_decode_round_trips_exactly(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text


def test_each_ascii_character_is_one_token_with_its_byte_as_id(tokenizer):
    printable = "".join(chr(code) for code in range(32, 127)) + "\n\t"
    ids = tokenizer.encode(printable)
    assert ids == [ord(char) for char in printable]
    assert tokenizer.encode("47+8=") == [52, 55, 43, 56, 61]  # no BOS, no EOS added


def test_special_tokens(tokenizer):
    assert len(tokenizer) == VOCAB_SIZE == 259
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.eos_token_id == EOS_TOKEN_ID == 256
    assert tokenizer.pad_token_id == EOS_TOKEN_ID
    assert tokenizer.bos_token_id is None
    assert tokenizer.convert_tokens_to_ids([IM_START_TOKEN, IM_END_TOKEN]) == [257, 258]
    assert tokenizer.encode(f"{IM_START_TOKEN}ok{EOS_TOKEN}") == [257, 111, 107, 256]
    assert tokenizer.decode([55, EOS_TOKEN_ID], skip_special_tokens=True) == "7"


def test_autotokenizer_matches_the_raw_tokenizer_file(tokenizer):
    raw = build_char_tokenizer()
    for text in ROUND_TRIP_TEXTS + [f"{IM_START_TOKEN}user\nhi{IM_END_TOKEN}\n"]:
        assert tokenizer.encode(text) == raw.encode(text).ids


def test_chat_template(tokenizer):
    messages = [
        {"role": "system", "content": "Add the numbers."},
        {"role": "user", "content": "47 + 8 = ?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nAdd the numbers.<|im_end|>\n"
        "<|im_start|>user\n47 + 8 = ?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids.count(257) == 3 and ids.count(258) == 2  # each marker is one token
    assert tokenizer.decode(ids) == text
    no_prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")
