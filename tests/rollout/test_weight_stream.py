"""A streamed push (cohort/rollout/server/client.py `stream_weight_parts`): the same parts and the same bytes as
grouping the whole set first, with only one part's tensors alive at a time; and LoRA's merged weights through it are
bit-identical to the merged state dict."""

from __future__ import annotations

import weakref

import pytest
import torch

from cohort.rollout.server import client as remote_engine
from cohort.rollout.base import WeightStream
from cohort.rollout.server.client import plan_weight_parts, serialize_part, stream_weight_parts


def _made_on_the_fly(alive: list, tied: torch.Tensor):
    """Five tensors of 16, 16, 40, 8 and 16 bytes made fresh at each walk (as LoRA merges are), plus one tied twin."""
    def make():
        for i, n in enumerate([4, 4, 10, 2, 4]):
            tensor = torch.arange(n, dtype=torch.float32) + 10 * i
            alive.append(weakref.ref(tensor.untyped_storage()))  # the memory, whatever views of it are made
            yield f"w{i}", tensor
            if i == 1:
                yield "tied", tied
                yield "tied_again", tied  # the same storage, still alive: sent once
    return make


def test_stream_gives_the_parts_and_bytes_of_the_whole_set_holding_one_part_at_a_time():
    tied = torch.full((3,), 7.0)
    alive: list[weakref.ref] = []
    stream = WeightStream(_made_on_the_fly(alive, tied))
    whole = plan_weight_parts(list(_made_on_the_fly([], tied)()), 32)
    # greedy parts of <= 32 bytes: [w0 16 + w1 16], [tied 12 (tied_again skipped)], [w2 40 alone], [w3 8 + w4 16]
    assert [[n for n, _ in part] for part in whole] == [["w0", "w1"], ["tied"], ["w2"], ["w3", "w4"]]
    count, parts = stream_weight_parts(stream, 32)
    assert count == 4
    alive.clear()  # forget the sizing walk's tensors (all freed already)
    largest_alive = 0
    for got, expected in zip(parts, whole, strict=True):
        largest_alive = max(largest_alive, sum(ref() is not None for ref in alive))
        assert serialize_part(got) == serialize_part(expected)  # the very same safetensors bytes
        del got
    # one part's fresh tensors at most (2); grouping the whole set first would hold all 5
    assert largest_alive == 2


def test_a_one_shot_iterator_is_grouped_whole_as_before():
    named = iter([("a", torch.ones(3)), ("b", torch.full((3,), 2.0)), ("c", torch.full((10,), 0.5))])
    count, parts = stream_weight_parts(named, 16)
    assert count == 3 and [[n for n, _ in p] for p in parts] == [["a"], ["b"], ["c"]]


def test_a_source_that_changes_between_walks_is_refused():
    walks = iter([[("a", torch.ones(2)), ("b", torch.ones(2))], [("a", torch.ones(2)), ("x", torch.ones(2))]])
    _, parts = stream_weight_parts(WeightStream(lambda: next(walks)), 1024)
    with pytest.raises(RuntimeError, match="changed between the two walks"):
        list(parts)


def test_part_size_bounds_what_a_push_holds():
    assert remote_engine.PART_BYTES == 64 * 2**20  # a push holds one such part as tensors and one as bytes


def test_lora_merged_weights_streamed_are_bit_identical_to_the_merged_state_dict(tiny_model_dir):
    pytest.importorskip("peft")
    from cohort.config.resolve import load_config
    from cohort.models.pretrained import load_policy
    from cohort.models.lora import attach_lora

    cfg = load_config({"model": {"path": str(tiny_model_dir)}, "lora": {"rank": 4}})
    model = load_policy(tiny_model_dir, "float32")
    lora = attach_lora(model, cfg.lora)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in lora.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    expected = lora.merged_state_dict(torch.bfloat16)
    stream = WeightStream(lambda: ((n, t.to(torch.bfloat16)) for n, t in lora.merged_weights()))  # as the trainer pushes
    count, parts = stream_weight_parts(stream, 2**16)  # small parts: the tiny model's set spans several
    got = {name: tensor for part in parts for name, tensor in part}
    assert count > 1 and list(got) == list(expected)
    assert all(torch.equal(got[n], expected[n]) and got[n].dtype == torch.bfloat16 for n in expected)
