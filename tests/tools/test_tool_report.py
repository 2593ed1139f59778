"""The HTML report shows a multi-turn completion as its whole conversation, tool turns marked, and its tool status."""

from __future__ import annotations

import json

from cohort.runs.report import write_report


def test_report_shows_conversations_with_tool_turns(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 1.0}) + "\n")
    conversation = [{"role": "assistant", "content": "<tool_call>multiply</tool_call>"}, {"role": "tool", "content": "408"},
                    {"role": "assistant", "content": "408"}]
    (run_dir / "completions.jsonl").write_text(json.dumps({
        "step": 1, "prompt": "12*34=", "completion": "multiply 408 408", "reward": 1.0, "advantage": 0.5,
        "finish_reason": "stop", "conversation": conversation, "tool_status": "ok", "turns": 2}) + "\n")
    text = write_report(run_dir).read_text()
    assert "[assistant] &lt;tool_call&gt;multiply&lt;/tool_call&gt;\n[tool] 408\n[assistant] 408" in text
    assert "stop, tools ok" in text
