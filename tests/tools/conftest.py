"""`quick_stop_chat_model`: the random tiny chat checkpoint (Qwen2.5-style template, byte-level BPE) with half of the
vocabulary outside the template's tool scaffolding declared as stop tokens (generation_config.json), so a random model's
turns end after a few tokens and multi-turn rollouts happen without a trained model."""

from __future__ import annotations

import pytest

from cohort.tools.render import BASE
from tests.builders import stop_early


@pytest.fixture(scope="session")
def quick_stop_chat_model(tmp_path_factory):
    from cohort.models.tiny_chat import build_random_chat_model

    model_dir = build_random_chat_model(tmp_path_factory.mktemp("tiny-chat-quick-stop"))
    assistant = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "count", "arguments": {}}}]}
    return stop_early(model_dir, BASE + [assistant, {"role": "tool", "name": "count", "content": "7"}])
