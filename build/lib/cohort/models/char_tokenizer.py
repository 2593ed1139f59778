"""A character-level tokenizer for the offline tiny models, written with `tokenizers`.

Every ASCII character is exactly one token, so ``"23+45="`` is six tokens and a
model's arithmetic happens one digit per step. The vocabulary is byte-level: ids
0..255 are the 256 bytes (id == byte value, so ``"0"`` is 48 and ``" "`` is 32) and
non-ASCII text falls back to its UTF-8 bytes, so any (NFC) string round-trips
exactly and there is no unknown token. Three special tokens follow the bytes:

    256  <|endoftext|>   eos and pad
    257  <|im_start|>    chat turn start
    258  <|im_end|>      chat turn end

Choices:
- The files are written by hand (``tokenizer.json``, ``tokenizer_config.json``,
  ``special_tokens_map.json``) rather than through ``save_pretrained``, so what is
  on disk does not depend on the installed transformers version.
- Byte-level, not a plain character vocabulary, because transformers 5 (checked
  on 5.19) loads every ``model_type: qwen2`` directory with ``Qwen2Tokenizer``
  whatever ``tokenizer_class`` says. That class rebuilds the pipeline from the
  vocabulary alone (NFC, Qwen's split regex, ByteLevel), which silently drops the
  spaces of a plain character vocabulary. Ours is byte-level and NFC-normalised,
  so the rebuilt tokenizer encodes and decodes exactly as ``tokenizer.json`` does
  (pinned in tests). ``tokenizer_class`` still names ``PreTrainedTokenizerFast``
  for loaders that honour it.
- ``clean_up_tokenization_spaces`` is off (it would rewrite ``" ."`` to ``"."``),
  no BOS is added, and a minimal ChatML template ships in the config so chat-format
  prompts work in transformers and vLLM alike.

Left out: merges (a BPE model with an empty merge list is a pure byte tokenizer)
and any unknown token. NFC normalisation means decomposed Unicode comes back
composed; ASCII is untouched.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
NUM_BYTE_TOKENS = 256
EOS_TOKEN_ID = NUM_BYTE_TOKENS  # 256; also the pad id
VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)  # 259

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_to_symbol() -> dict[int, str]:
    """The byte-level alphabet: each byte's printable stand-in symbol.

    Printable Latin-1 bytes stand for themselves; the others (control characters,
    space, DEL, ...) are shifted to code points 256 and up, which is the convention
    the ``ByteLevel`` pre-tokenizer and decoder of `tokenizers` expect.
    """
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(NUM_BYTE_TOKENS):
        if byte not in mapping:
            mapping[byte] = chr(NUM_BYTE_TOKENS + shifted)
            shifted += 1
    return mapping


def build_char_tokenizer() -> Tokenizer:
    """The raw `tokenizers` object: byte ids 0..255, then the special tokens."""
    vocab = {symbol: byte for byte, symbol in byte_to_symbol().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    assert tokenizer.token_to_id(EOS_TOKEN) == EOS_TOKEN_ID
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    return tokenizer


def tokenizer_config(model_max_length: int) -> dict:
    """``tokenizer_config.json``: the class to load, special tokens, chat template."""
    added_tokens_decoder = {
        str(EOS_TOKEN_ID + offset): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for offset, token in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": [IM_START_TOKEN, IM_END_TOKEN],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
    }


def save_char_tokenizer(out_dir: str | Path, *, model_max_length: int = 128) -> Path:
    """Write the three tokenizer files into ``out_dir`` (created if missing).

    The directory then loads unchanged with ``AutoTokenizer.from_pretrained`` and
    in vLLM. Returns ``out_dir`` as a Path.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    build_char_tokenizer().save(str(out_dir / "tokenizer.json"))
    config = tokenizer_config(model_max_length)
    special_tokens_map = {
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "additional_special_tokens": [IM_START_TOKEN, IM_END_TOKEN],
    }
    for name, payload in (
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", special_tokens_map),
    ):
        (out_dir / name).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return out_dir
