"""The rename table (cohort.config.renames): every old dotted name is read as its new one, with one note naming it."""

from __future__ import annotations

import pytest
import yaml

from cohort.config import ConfigError
from cohort.config.resolve import resolve_config
from cohort.config.renames import RENAMED_FIELDS, rename_note

# A value each field accepts that differs from its default, so reading it back proves where it went.
SAMPLE = {
    "engine.name": "hf", "engine.mode": "local_server", "engine.dtype": "float32", "engine.enforce_eager": False,
    "engine.enable_prefix_caching": False, "engine.kv_cache_gib": 2.0, "engine.gpu_memory_utilization": 0.5,
    "engine.sleep_mode": 1, "engine.tensor_parallel_size": 2, "engine.sync_check_tolerance": 0.01, "engine.num_threads": 1,
    "engine.server_urls": ["http://127.0.0.1:8400"], "engine.server_timeout_s": 30.0,
    "pipeline.max_staleness": 2, "pipeline.stale_tokens": "drop", "pipeline.engine_timeout_s": 60.0,
    "pipeline.over_provision": 1.5, "pipeline.max_aborts": 3, "pipeline.dynamic_sampling": True,
    "pipeline.max_refill_rounds": 5, "pipeline.stream_update": "off",
    "tools.functions": ["cohort.tools.builtin.calculator"], "tools.environment": "my_module.MyEnv", "tools.parser": "compact",
    "tools.timeout_s": 3.0, "tools.max_turns": 2, "tools.max_parallel_calls": 1, "tools.max_response_length": 7,
    "tools.response_truncate_side": "left", "tools.failure_policy": "mask",
    "lora.rank": 8, "lora.alpha": 4.0, "lora.dropout": 0.1, "lora.target_modules": ["q_proj"], "lora.save_merged": False,
}


def _get(cfg, dotted: str):
    section, field = dotted.split(".")
    return getattr(getattr(cfg, section), field)


@pytest.mark.parametrize("old", [o for o in RENAMED_FIELDS if o != "rollout.overlap"])
def test_each_old_name_is_read_as_its_new_one_with_one_note(old):
    new = RENAMED_FIELDS[old]
    value = SAMPLE[new]
    section, field = old.split(".")
    as_override = resolve_config(None, [f"{old}={yaml.safe_dump(value, default_flow_style=True).strip()}"])
    as_tree = resolve_config({section: {field: value}})
    for resolved in (as_override, as_tree):
        assert _get(resolved.config, new) == value
        assert resolved.notes == (f"{old} is now {new} (read as that; rename it in your config)",)
    assert new in SAMPLE and len(SAMPLE) == len(RENAMED_FIELDS) - 1  # every target sampled, once


def test_the_new_layout_has_no_notes_and_the_old_sections_keep_their_other_fields():
    resolved = resolve_config({"rollout": {"num_generations": 4, "engine": "hf"}, "model": {"dtype": "float32", "lora_rank": 4}})
    assert (resolved.config.rollout.num_generations, resolved.config.model.dtype) == (4, "float32")
    assert (resolved.config.engine.name, resolved.config.lora.rank) == ("hf", 4)
    assert len(resolved.notes) == 2
    assert resolve_config({"engine": {"name": "hf"}, "lora": {"rank": 4}}).notes == ()


def test_overlap_true_is_staleness_one_and_false_is_dropped():
    on = resolve_config(None, ["rollout.overlap=true"])
    assert on.config.pipeline.max_staleness == 1 and on.notes == (rename_note("rollout.overlap"),)
    assert "true is read as pipeline.max_staleness=1" in on.notes[0]
    off = resolve_config({"rollout": {"overlap": False}})
    assert off.config.pipeline.max_staleness is None and off.notes == (rename_note("rollout.overlap"),)
    # overlap = true beside the old staleness name at 1 agrees; at 2 it does not
    assert resolve_config({"rollout": {"overlap": True, "max_staleness": 1}}).config.pipeline.max_staleness == 1
    with pytest.raises(ConfigError, match="rollout.overlap and rollout.max_staleness are both set"):
        resolve_config({"rollout": {"overlap": True, "max_staleness": 2}})


def test_an_old_yaml_file_and_an_old_override_both_work(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("model: {path: 'tiny:arith', lora_rank: 8}\n"
                   "rollout: {num_generations: 4, mode: local_server, max_staleness: 1, tools: [cohort.tools.builtin.calculator]}\n")
    resolved = resolve_config(old, ["rollout.tool_parser=compact", "rollout.max_turns=2"])
    cfg = resolved.config
    assert (cfg.lora.rank, cfg.rollout.num_generations, cfg.engine.mode, cfg.pipeline.max_staleness) == (8, 4, "local_server", 1)
    assert (cfg.tools.functions, cfg.tools.parser, cfg.tools.max_turns) == (["cohort.tools.builtin.calculator"], "compact", 2)
    assert cfg.tools.enabled
    assert [n.split(" is now ")[0] for n in resolved.notes] == [  # file first (table order), then the overrides
        "rollout.mode", "rollout.max_staleness", "rollout.tools", "model.lora_rank", "rollout.tool_parser", "rollout.max_turns"]


def test_an_override_in_the_new_name_wins_over_an_old_name_in_the_file(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("rollout: {max_staleness: 1}\n")
    assert resolve_config(old, ["pipeline.max_staleness=2"]).config.pipeline.max_staleness == 2  # layers, as ever


def test_an_old_and_a_new_name_of_one_field_in_one_layer_are_refused_naming_both():
    with pytest.raises(ConfigError) as err:
        resolve_config({"rollout": {"max_staleness": 1}, "pipeline": {"max_staleness": 1}})
    assert err.value.problems == ["rollout.max_staleness and pipeline.max_staleness are both set "
                                  "(rollout.max_staleness is now pipeline.max_staleness): keep only pipeline.max_staleness"]
    with pytest.raises(ConfigError) as err:
        resolve_config(None, ["engine.name=hf", "rollout.engine=vllm"])
    assert err.value.problems == ["engine.name and rollout.engine are both given (engine.name is the new name): keep only engine.name"]


def test_an_old_checkpoint_config_yaml_loads_into_the_new_layout(tmp_path):
    # config.yaml as `cohort train` saved it before the split: the whole rollout section, LoRA in model
    saved = {"model": {"path": "tiny:arith", "dtype": "float32", "lora_rank": 0, "lora_alpha": None, "lora_dropout": 0.0,
                       "lora_target_modules": "all-linear", "lora_save_merged": True},
             "rollout": {"engine": "vllm", "num_generations": 8, "generation_batch_size": None, "max_completion_length": 8,
                         "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0, "dtype": "auto", "enforce_eager": True,
                         "enable_prefix_caching": True, "kv_cache_gib": 1.0, "gpu_memory_utilization": None, "sleep_mode": 0,
                         "tensor_parallel_size": 1, "sync_check_tolerance": None, "mode": "local_server", "num_threads": None,
                         "server_urls": [], "server_timeout_s": 300.0, "overlap": False, "stream_update": "auto",
                         "dynamic_sampling": False, "max_refill_rounds": 30, "over_provision": 1.0, "max_aborts": 2,
                         "max_staleness": 1, "stale_tokens": "mask", "engine_timeout_s": 600.0, "tools": [],
                         "environment": None, "tool_parser": "hermes", "tool_timeout_s": 10.0, "max_turns": 4,
                         "max_parallel_calls": 4, "max_tool_response_length": None, "tool_response_truncate_side": "right",
                         "tool_failure_policy": "reward"},
             "train": {"max_steps": 3}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    resolved = resolve_config(tmp_path / "config.yaml", ["train.max_steps=5"])  # as `cohort train --resume` reads it
    cfg = resolved.config
    assert (cfg.engine.mode, cfg.pipeline.max_staleness, cfg.rollout.max_completion_length, cfg.train.max_steps) == (
        "local_server", 1, 8, 5)
    assert len(resolved.notes) == len(RENAMED_FIELDS)  # every old key of the saved file named once
    assert resolve_config(cfg.to_dict()).config == cfg  # and saved again in the new layout, it reads back the same
