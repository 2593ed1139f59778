"""Launch scripts read as bash reads what they set (cohort.convert.shell), each case taken from a real peer script."""

from __future__ import annotations

import pytest
import yaml

from cohort.convert.core import convert_input, render
from cohort.convert.shell import Shell, ShellError, display, logical_lines, unresolved_names
from cohort.convert.sources import SourceError, read_trl_command, read_verl
from cohort.mapping.rules import Unresolved


def _words(script: str, environ: dict | None = None) -> list[list[str]]:
    return list(Shell(environ or {}).commands(script))


def test_defaults_nested_defaults_and_arithmetic_as_bash_expands_them():
    script = r'''
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-Math-7B"}
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
actor_len=$(((max_prompt_length + max_response_length) * 2))
half=$(( -7 / 2 ))
echo $MODEL_PATH $actor_len $half ${UNSET_BUT_DEFAULTED-plain} ${EMPTY:+x}
'''
    *_, echo = _words(script, {"HOME": "/home/u"})
    # nested default: ${RAY_DATA_HOME} unset -> "${HOME}/verl" with its quotes removed; (2048 + 8192) * 2 = 20480;
    # bash's / truncates toward zero: -7 / 2 = -3 (Python's // would give -4); ${X:+word} of an unset X is empty
    assert echo == ["echo", "/home/u/verl/models/Qwen2.5-Math-7B", "20480", "-3", "plain"]


def test_quoted_list_paths_expand_inside_double_quotes_only():
    script = '''gsm8k_train_path=$HOME/data/gsm8k/train.parquet
math_train_path=$HOME/data/math/train.parquet
train_files="['$gsm8k_train_path', '$math_train_path']"
literal='$gsm8k_train_path'
echo $train_files "$literal"
'''
    *_, echo = _words(script, {"HOME": "/h"})
    # the single quotes inside the double-quoted string are literal characters: $... expands between them;
    # unquoted, the value is split on its space into two words, as bash does
    assert echo == ["echo", "['/h/data/gsm8k/train.parquet',", "'/h/data/math/train.parquet']", "$gsm8k_train_path"]
    options, _ = read_verl(["--", "python3", "-m", "verl.trainer.main_ppo",
                            "data.train_files=['/h/a.parquet', '/h/b.parquet']"][1:])
    assert options == {"data.train_files": ["/h/a.parquet", "/h/b.parquet"]}


def test_a_multi_line_quoted_variable_used_unquoted_gives_its_words(tmp_path):
    # verl's examples/gspo_trainer/run_qwen30b_gspo.sh keeps options in an exported multi-line string
    script = tmp_path / "run.sh"
    script.write_text('''export ACTOR_FSDP_CONFIG="
    actor_rollout_ref.actor.fsdp_config.param_offload=True \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True"
python3 -m verl.trainer.main_ppo data.train_batch_size=8 $ACTOR_FSDP_CONFIG
''')
    options, notes = read_verl([str(script)], {})
    assert options == {"data.train_batch_size": 8, "actor_rollout_ref.actor.fsdp_config.param_offload": True,
                       "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True}
    assert any(n.startswith("exported ACTOR_FSDP_CONFIG=") for n in notes)


def test_an_unset_variable_is_named_never_a_traceback(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text('''python3 -m verl.trainer.main_ppo trainer.nnodes=${NNODES} trainer.n_gpus_per_node=8 \\
    data.train_batch_size=$((NNODES * 64)) actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
    actor_rollout_ref.rollout.n=4 data.train_files=$(ls data/*.parquet)
''')
    options, notes = read_verl([str(script)], {})
    assert options["trainer.nnodes"] == Unresolved("${NNODES}", ("NNODES",))
    assert options["data.train_batch_size"] == Unresolved("${NNODES}", ("NNODES",))  # the arithmetic cannot be done
    assert options["data.train_files"].names == ("$(ls data/*.parquet)",)
    assert any("$NNODES is set neither in the script nor in this environment" in n for n in notes)
    conversion = convert_input([str(script)], environ={})
    reasons = {u.key: u.reason for u in conversion.unmapped}
    assert reasons["trainer.nnodes"].startswith("holds $NNODES, which the script sets nowhere")
    # a rule that reads the unset value is refused naming it too (the batch arithmetic needs data.train_batch_size)
    assert "data.train_batch_size = ${NNODES}" in reasons["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert "command substitution" in reasons["data.train_files"] or "$(ls" in reasons["data.train_files"]
    assert yaml.safe_load(render(conversion)) == conversion.tree()


@pytest.mark.parametrize("command, entry", [
    ("python3 -m recipe.dapo.main_dapo", "recipe.dapo.main_dapo"),
    ("python3 -m recipe.dapo.src.main_dapo", "recipe.dapo.src.main_dapo"),
    ('ray job submit --no-wait --runtime-env="${RUNTIME_ENV}" --working-dir "${WORKING_DIR}" -- python3 -m recipe.dapo.main_dapo',
     "recipe.dapo.main_dapo"),
])
def test_verl_recipes_own_entry_points_are_read(tmp_path, command, entry):
    script = tmp_path / "run.sh"
    script.write_text(f"RUNTIME_ENV=x.yaml\nWORKING_DIR=.\n{command} \\\n    data.gen_batch_size=96 algorithm.filter_groups.enable=True\n")
    options, notes = read_verl([str(script)], {})
    assert options == {"data.gen_batch_size": 96, "algorithm.filter_groups.enable": True}
    assert any(n.startswith(f"{entry}: a verl recipe's own entry point") for n in notes)


def test_pattern_substitution_with_a_literal_pattern():
    # verl's run_qwen30b_gspo.sh derives the critic's options from the actor's this way
    script = 'A="actor_rollout_ref.actor.x=1 actor_rollout_ref.actor.y=2"\nB="${A//actor_rollout_ref.actor/critic.model}"\n'
    script += 'C="${A/actor_rollout_ref.actor/critic}"\necho $B "$C" ${A//[a-z]/}\n'
    *_, echo = _words(script)
    assert echo[:4] == ["echo", "critic.model.x=1", "critic.model.y=2", "critic.x=1 actor_rollout_ref.actor.y=2"]
    assert unresolved_names(echo[4]) == ["${A//[a-z]/}"]  # a glob pattern is not expanded, and says so


def test_operators_redirections_and_comments_end_the_command():
    (line,) = _words('python3 -m verl.trainer.main_ppo a=1 b="x # not a comment" # a comment\n')
    assert line == ["python3", "-m", "verl.trainer.main_ppo", "a=1", "b=x # not a comment"]
    (line,) = _words("python3 -m verl.trainer.main_ppo a=1 2>&1 | tee log.txt\n")
    assert line[3:] == ["a=1", "2>&", "1", "|", "tee", "log.txt"]
    assert read_verl(["python3", "-m", "verl.trainer.main_ppo", "a=1", "2>&1", "|", "tee"])[0] == {"a": 1}


def test_an_unclosed_quote_is_one_clear_error(tmp_path):
    with pytest.raises(ShellError, match="unclosed \" quote"):
        logical_lines('A="open\npython3 -m verl.trainer.main_ppo a=1\n')
    script = tmp_path / "run.sh"
    script.write_text('A="open\npython3 -m verl.trainer.main_ppo a=1\n')
    with pytest.raises(SourceError, match="cannot read the script as bash would"):
        read_verl([str(script)], {})


def test_display_and_unresolved_names_round_trip():
    word = Shell({}).words("x=${NNODES}/$(hostname)")[0]
    assert unresolved_names(word) == ["NNODES", "$(hostname)"] and display(word) == "x=${NNODES}/$(hostname)"


def test_a_trl_command_line_with_accelerates_flags(tmp_path):
    # TRL's examples/scripts/grpo_vlm.py usage, older form: torch_dtype, a flag with no value, and the shell's
    # comma in "q_proj", "v_proj"
    script = tmp_path / "train.sh"
    script.write_text('''accelerate launch \\
    --config_file examples/accelerate_configs/deepspeed_zero3.yaml --num_processes=4 \\
    examples/scripts/grpo_vlm.py \\
    --model_name_or_path Qwen/Qwen2.5-VL-3B-Instruct \\
    --torch_dtype bfloat16 --use_peft \\
    --lora_target_modules "q_proj", "v_proj" \\
    --per_device_train_batch_size 8 --num_generations 8 --gradient_accumulation_steps 2
''')
    options, notes = read_trl_command([str(script)], {})
    assert options == {"model_name_or_path": "Qwen/Qwen2.5-VL-3B-Instruct", "torch_dtype": "bfloat16", "use_peft": True,
                       "lora_target_modules": ["q_proj,", "v_proj"], "per_device_train_batch_size": 8,
                       "num_generations": 8, "gradient_accumulation_steps": 2, "num_processes": 4}
    assert any(n.startswith("accelerate launch --config_file") for n in notes)
    tree = convert_input([str(script)], environ={}).tree()
    # 8 completions per process × 4 processes × 2 accumulation = 64 completions = 8 prompts of 8 per optimizer step
    assert tree["train"]["prompts_per_step"] == 8 and tree["train"]["num_processes"] == 4
    # TRL received 'q_proj,' (comma included), which matches no module: only v_proj was adapted, and is kept
    assert tree["lora"]["target_modules"] == ["v_proj"] and tree["model"]["dtype"] == "bfloat16"


def test_a_missing_file_or_nothing_to_read_is_one_clear_error(tmp_path):
    with pytest.raises(SourceError, match="missing.sh: no such file"):
        convert_input([str(tmp_path / "missing.sh")])
    script = tmp_path / "run.sh"
    script.write_text("python3 -m verl.trainer.main_ppo --config-name=ppo_trainer\n")
    with pytest.raises(SourceError, match="no key=value option of verl's trainer was found: --config-name"):
        convert_input([str(script)], environ={})
