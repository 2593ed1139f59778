"""`quick_stop_chat_model`: the random tiny chat checkpoint (Qwen2.5-style template, byte-level BPE) with half of the
vocabulary outside the template's tool scaffolding declared as stop tokens (generation_config.json), so a random model's
turns end after a few tokens and multi-turn rollouts happen without a trained model."""

from __future__ import annotations

import json

import pytest

from cohort.models.pretrained import load_tokenizer
from cohort.tools.render import BASE


@pytest.fixture(scope="session")
def quick_stop_chat_model(tmp_path_factory):
    from cohort.models.tiny_chat import build_random_chat_model

    model_dir = build_random_chat_model(tmp_path_factory.mktemp("tiny-chat-quick-stop"))
    tok = load_tokenizer(model_dir)
    assistant = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "count", "arguments": {}}}]}
    scaffold = tok.apply_chat_template(BASE + [assistant, {"role": "tool", "name": "count", "content": "7"}], tokenize=False,
                                       add_generation_prompt=True)
    used = set(tok(scaffold, add_special_tokens=False)["input_ids"])
    im_end, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    free = [i for i in range(len(tok)) if i not in used and i not in (im_end, pad)]
    config = json.loads((model_dir / "generation_config.json").read_text())
    config["eos_token_id"] = [im_end, pad] + free[::2]
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    return model_dir
