"""A user's own tool module and dataset train through YAML and through `cohort.train(tools=...)` (the transformers
engine on `quick_stop_chat_model`, whose turns end after a few tokens; the module's parser reads every turn as a call
to `count`, so with tools.max_turns = 3 every trajectory makes exactly 2 calls over 3 assistant turns)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

import cohort

TOOL_MODULE = '''
SEEN = []

def count() -> int:
    """Count the things."""
    return 7

def parse(text):
    from cohort.tools.parsers import ParsedTurn, ToolCall
    return ParsedTurn(calls=[ToolCall("count", {})])

def saw_tool(completions, conversations, **kwargs):
    SEEN.append(conversations)
    return [float(any(m["role"] == "tool" and m["content"] == "7" for m in c)) for c in conversations]

def length(completions, **kwargs):
    return [float(len(c)) for c in completions]
'''


def _config(tmp_path, model_dir, name):
    return {"model": {"path": str(model_dir)}, "data": {"max_prompt_length": 32},
            "rollout": {"num_generations": 2, "max_completion_length": 96}, "engine": {"name": "hf"},
            "tools": {"max_turns": 3, "parser": "cohort_user_tools.parse", "in_prompt": False},  # (32-token prompts)
            "train": {"prompts_per_step": 2, "micro_batch_size": 4, "max_steps": 1},
            "rewards": [{"name": "cohort_user_tools.saw_tool"}, {"name": "cohort_user_tools.length", "weight": 0.01}],
            "run": {"output_dir": str(tmp_path / name), "progress": False, "loggers": ["jsonl"], "log_completions_every": 1}}


def _check_run(run_dir):
    metrics = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    # every trajectory: 3 assistant turns, the first two calling `count`, the third's call not run (max_turns)
    assert metrics["tools/call_frequency"] == 2.0 and metrics["tools/calls/count"] == 8.0  # 4 trajectories x 2 calls
    assert metrics["tools/turns_mean"] == 3.0 and metrics["tools/status/truncated"] == 1.0
    assert metrics["rewards/saw_tool/mean"] == 1.0
    line = json.loads((run_dir / "completions.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in line["conversation"]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert line["tool_status"] == "truncated" and line["turns"] == 3


@pytest.mark.slow
def test_user_tool_module_trains_through_yaml_and_the_python_api(tmp_path, quick_stop_chat_model, monkeypatch):
    (tmp_path / "cohort_user_tools.py").write_text(TOOL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{a}*34="}]}) + "\n" for a in range(4)))
    # YAML, the tools by import path
    yaml_cfg = _config(tmp_path, quick_stop_chat_model, "yaml")
    yaml_cfg["data"]["train_files"] = [str(data)]
    yaml_cfg["tools"]["functions"] = ["cohort_user_tools.count"]
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(yaml_cfg))
    cohort.train(str(tmp_path / "run.yaml"))
    _check_run(tmp_path / "yaml")
    saved = yaml.safe_load((tmp_path / "yaml" / "config.yaml").read_text())
    assert saved["tools"]["functions"] == ["cohort_user_tools.count"]
    # the Python API, the function itself and an in-memory dataset
    import cohort_user_tools

    seen_before = len(cohort_user_tools.SEEN)
    rows = [{"prompt": [{"role": "user", "content": f"{a}*34="}]} for a in range(4)]
    summary = cohort.train(_config(tmp_path, quick_stop_chat_model, "api"), train_dataset=rows, eval_dataset=rows[:2],
                           tools=[cohort_user_tools.count])
    _check_run(tmp_path / "api")
    # the eval runs through the tool loop too: its first reward (saw_tool) is 1 on every multi-turn completion
    assert summary["eval/accuracy_before"] == 1.0 and summary["eval/accuracy_after"] == 1.0
    conversation = cohort_user_tools.SEEN[seen_before + 1][0]  # (SEEN[seen_before]: the "before" eval's call)  # the reward got the whole conversation, prompt first
    assert conversation[0]["role"] == "user" and conversation[0]["content"].endswith("*34=")
    assert [m["role"] for m in conversation[1:]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    sys.modules.pop("cohort_user_tools", None)
