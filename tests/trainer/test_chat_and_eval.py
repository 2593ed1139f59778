"""Chat-format prompts render through the chat template and reach rewards as chat completions; `cohort eval`."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from cohort import cli
from cohort.config.resolve import load_config
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training

MODULE = textwrap.dedent('''
    SEEN = []

    def chat_reward(prompts, completions, **kwargs):
        SEEN.append((prompts[0], completions[0]))
        return [1.0 if c[0]["content"].startswith("1") else 0.0 for c in completions]
''')


@pytest.fixture
def chat_data(tmp_path, monkeypatch):
    (tmp_path / "chat_rewards_mod.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "chat.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1"}], "answer": str(i + 1)} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path, path


@pytest.mark.slow
def test_chat_prompts_use_template_and_chat_completions(chat_data, tiny_model_dir):
    tmp_path, path = chat_data
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files=[{path}]", "engine.name=hf",
                             "rollout.num_generations=2", "rollout.max_completion_length=3", "data.max_prompt_length=64", "train.prompts_per_step=2",
                             "train.micro_batch_size=4", "train.max_steps=1", "rewards=[{name: 'chat_rewards_mod:chat_reward'}]",
                             f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.loggers=[jsonl]"])
    trainer = Trainer(cfg)
    ids = trainer.parts.train_ids[0]
    # ChatML rendering with the generation prompt: "<|im_start|>user\n0+1<|im_end|>\n<|im_start|>assistant\n"
    assert trainer.parts.tokenizer.decode(ids) == "<|im_start|>user\n0+1<|im_end|>\n<|im_start|>assistant\n"
    run_training(trainer)
    trainer.close()
    import chat_rewards_mod

    prompt, completion = chat_rewards_mod.SEEN[0]
    assert isinstance(prompt, list) and prompt[0]["role"] == "user"
    assert isinstance(completion, list) and completion[0]["role"] == "assistant" and isinstance(completion[0]["content"], str)


@pytest.mark.slow
def test_cli_eval_reports_accuracy_and_pass_at_k(tmp_path, tiny_model_dir, capsys):
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+0=", "answer": str(i)}) + "\n" for i in range(6)))
    code = cli.main(["eval", f"model.path={tiny_model_dir}", f"data.train_files=[{path}]", f"data.eval_files=[{path}]",
                     "engine.name=hf", "rollout.max_completion_length=2", "data.max_prompt_length=16", "rewards=[{name: numeric_match}]",
                     f"run.output_dir={tmp_path / 'run'}", "--num-samples", "3"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 0
    # 3 samples and the default k = 4 (run.eval_pass_k): k is lowered to the 3 samples
    assert out["num_prompts"] == 6 and out["pass_samples"] == 3 and out["pass_temperature"] == 1.0
    # the console: what it does and where the engine's output went, then the result in one line (stdout is the JSON)
    log = captured.err.split("(what the engine prints: ", 1)[1].split(")", 1)[0]
    assert (f"eval: loading {tiny_model_dir} and scoring the held-out prompts greedily, then 3 samples each at T=1 for "
            "pass@k") in captured.err
    assert f"eval: accuracy {out['accuracy']:.1%} on 6 held-out prompts; constant answer \"0\": 16.7%" in captured.err
    assert os.path.isfile(log)
    # pass@k >= pass@1 always (any of k correct vs the average of one)
    assert 0.0 <= out["pass@1"] <= out["pass@3"] <= 1.0
    # references 0..5 once each: every count ties at 1, so the smaller texts "0" and "1" are the common answers; a
    # constant "0" is right on 1 of 6; 4 prompts lie beyond
    assert out["constant_answer"] == "0" and out["constant_accuracy"] == pytest.approx(1 / 6)
    assert out["common_answers"] == ["0", "1"] and out["beyond_common_prompts"] == 4


@pytest.mark.slow
def test_cli_eval_builds_no_trainer_and_no_optimizer(tmp_path, tiny_model_dir, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("cohort eval built a Trainer or an optimizer")

    monkeypatch.setattr(Trainer, "__init__", forbidden)
    monkeypatch.setattr("torch.optim.AdamW", forbidden)
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+0=", "answer": str(i)}) + "\n" for i in range(4)))
    code = cli.main(["eval", f"model.path={tiny_model_dir}", f"data.train_files=[{path}]", f"data.eval_files=[{path}]",
                     "engine.name=hf", "rollout.max_completion_length=2", "data.max_prompt_length=16",
                     "rewards=[{name: numeric_match}]", f"run.output_dir={tmp_path / 'run'}"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["num_prompts"] == 4 and "pass@1" in out
