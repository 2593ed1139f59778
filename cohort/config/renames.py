"""Config fields that moved (issue 25: `rollout` split into rollout, engine, pipeline and tools; LoRA out of model).

`RENAMED_FIELDS` is the one table of old dotted name -> new dotted name. The loader reads an old name
as its new one, so a config written before the split (a user's YAML, an override, a checkpoint's saved
config.yaml) still works, and says so in one line per old name (`ResolvedConfig.notes`, printed by the
CLI). The same table drove the one-off rewrite of the code, tests and docs.

`rollout.overlap` is the one rename that changes the value: `true` is `pipeline.max_staleness = 1`
(its meaning before the scheduler), `false` is dropped.

Left out: anything about what the values mean (cohort.config) or where they came from (cohort.config.resolve).
Imports nothing of cohort.
"""

from __future__ import annotations

from typing import Any

_ENGINE_FIELDS = ("dtype", "enforce_eager", "enable_prefix_caching", "kv_cache_gib", "gpu_memory_utilization", "sleep_mode",
                  "tensor_parallel_size", "sync_check_tolerance", "num_threads", "server_urls", "server_timeout_s")
_PIPELINE_FIELDS = ("max_staleness", "stale_tokens", "engine_timeout_s", "over_provision", "max_aborts", "dynamic_sampling",
                    "max_refill_rounds", "stream_update")

RENAMED_FIELDS: dict[str, str] = {
    "rollout.engine": "engine.name",
    "rollout.mode": "engine.mode",
    **{f"rollout.{name}": f"engine.{name}" for name in _ENGINE_FIELDS},
    **{f"rollout.{name}": f"pipeline.{name}" for name in _PIPELINE_FIELDS},
    "rollout.overlap": "pipeline.max_staleness",  # true -> 1, false -> dropped (see `_renamed_value`)
    "rollout.tools": "tools.functions",
    "rollout.environment": "tools.environment",
    "rollout.tool_parser": "tools.parser",
    "rollout.tool_timeout_s": "tools.timeout_s",
    "rollout.max_turns": "tools.max_turns",
    "rollout.max_parallel_calls": "tools.max_parallel_calls",
    "rollout.max_tool_response_length": "tools.max_response_length",
    "rollout.tool_response_truncate_side": "tools.response_truncate_side",
    "rollout.tool_failure_policy": "tools.failure_policy",
    "model.lora_rank": "lora.rank",
    "model.lora_alpha": "lora.alpha",
    "model.lora_dropout": "lora.dropout",
    "model.lora_target_modules": "lora.target_modules",
    "model.lora_save_merged": "lora.save_merged",
}

_DROPPED = object()


def rename_note(old: str) -> str:
    """The one line the loader reports for an old name."""
    new = RENAMED_FIELDS[old]
    if old == "rollout.overlap":
        return f"{old} is now {new} (true is read as {new}=1, false is dropped; rename it in your config)"
    return f"{old} is now {new} (read as that; rename it in your config)"


def _renamed_value(old: str, value: Any) -> Any:
    if old == "rollout.overlap":
        return 1 if value is True or value == "true" else _DROPPED
    return value


def renamed_override(path: list[str], value: Any) -> tuple[list[str], Any, str | None]:
    """A dotted override's path in the new layout: (path, value, note); note is None for a name that did not move.
    A dropped value (`rollout.overlap=false`) comes back with an empty path."""
    old = ".".join(path)
    if old not in RENAMED_FIELDS:
        return path, value, None
    value = _renamed_value(old, value)
    return ([] if value is _DROPPED else RENAMED_FIELDS[old].split(".")), value, rename_note(old)


def renamed_tree(tree: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """`tree` (one layer: a YAML file or a dict) in the new layout: (tree, notes, conflicts).

    A conflict is an old and a new name for the same field both set in this layer (or two old names for one new
    one with different values, as rollout.overlap=true beside rollout.max_staleness=2); each names both."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in tree.items()}
    notes, conflicts, set_by = [], [], {}
    for old, new in RENAMED_FIELDS.items():
        old_section, old_field = old.split(".")
        section = out.get(old_section)
        if not isinstance(section, dict) or old_field not in section:
            continue
        value = _renamed_value(old, section.pop(old_field))
        notes.append(rename_note(old))
        if value is _DROPPED:
            continue
        new_section, new_field = new.split(".")
        target = out.setdefault(new_section, {})
        if not isinstance(target, dict):
            conflicts.append(f"{old} and {new_section}: {new_section} is not a mapping of fields")
            continue
        if new_field in target and (new not in set_by or target[new_field] != value):
            other = set_by.get(new, new)
            conflicts.append(f"{old} and {other} are both set ({old} is now {new}): keep only {new}")
            continue
        target[new_field] = value
        set_by[new] = old
    return out, notes, conflicts
