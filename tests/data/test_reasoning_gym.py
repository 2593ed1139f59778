"""reasoning-gym tasks by name (cohort/data/reasoning_gym.py) and their reward (cohort/rewards/reasoning_gym.py)."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from cohort.config import load_config
from cohort.data.datasets import DataError, check_data_config
from cohort.plan.run_environment import run_data
from cohort.data.reasoning_gym import PREFIX, build_task, check_task, format_tasks, split_indices, task_fields, task_names
from cohort.rewards import reward_registry as registry
from cohort.rewards.reasoning_gym import extract

# No answer key: `answer` is None and the scorer checks a proposed solution (a box-moving plan, a colouring, a
# formula, a move sequence, a sliding-block solution), so no text is "its own answer" (checked below, not assumed).
NO_ANSWER_KEY = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
# game_of_life_halting's scorer is `bool(answer) == bool(entry["answer"])` on strings: any non-empty text equals "True"
# (and "False"), so tagged garbage scores 1.0 there; reasoning-gym's flaw, left as it is.
ACCEPTS_ANY_TEXT = {"game_of_life_halting"}
SLOW_TO_BUILD = {"knight_swap", "quantum_lock"}  # 8 s and 1.6-4 s for two entries (a search per puzzle)


def reward_of(task):
    """The task's reward through cohort's path: the registry builds it from the spec the task wrote."""
    spec = {k: v for k, v in task.reward_specs[0].items() if k not in ("name", "weight")}
    return registry.get(task.reward_specs[0]["name"], **spec)


def score(task, rows, texts):
    return reward_of(task)(completions=texts, rg_index=[r["rg_index"] for r in rows])


TASKS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TO_BUILD else n for n in task_names() if n != "composite"]


@pytest.mark.parametrize("name", TASKS)
def test_every_task_builds_and_its_own_answer_scores_one_and_garbage_less(name):
    task = build_task(PREFIX + name, {}, seed=0, size=1, eval_size=1, answer_format="tags")
    rows = task.train_rows + task.eval_rows  # 1 or 2 (a repeated question is dropped from train)
    own = score(task, rows, [f"<answer>{r['answer']}</answer>" for r in rows])
    if name in NO_ANSWER_KEY:
        assert all(r["answer"] == "" for r in rows) and max(own) < 1.0
    else:
        assert own == [1.0] * len(rows)
    assert score(task, rows, ["zzqx, no tags at all"] * len(rows)) == [0.0] * len(rows)  # tags format: no answer, 0
    garbage = score(task, rows, ["<answer>zzqx</answer>"] * len(rows))  # some scorers give 0.01 for any tagged answer
    assert max(garbage) == 1.0 if name in ACCEPTS_ANY_TEXT else max(garbage) <= 0.25


def test_there_are_105_tasks_and_composite():
    assert len(task_names()) == 106 and "composite" in task_names() and "chain_sum" in task_names()


def test_rows_are_small_deterministic_and_refer_to_their_entry():
    first = build_task(PREFIX + "chain_sum", {"max_digits": 1}, seed=3, size=8, eval_size=4, answer_format="tags")
    from cohort.data.reasoning_gym import _dataset  # the per-process dataset cache: clear it to build again from nothing

    _dataset.cache_clear()
    again = build_task(PREFIX + "chain_sum", {"max_digits": 1}, seed=3, size=8, eval_size=4, answer_format="tags")
    assert first.train_rows == again.train_rows and first.eval_rows == again.eval_rows and first is not again
    row = first.eval_rows[0]
    assert set(row) == {"prompt", "answer", "rg_index"} and row["rg_index"] == 0  # eval: indices 0..3; no metadata
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "<answer>" in row["prompt"][0]["content"]
    json.dumps(first.train_rows)  # serialisable
    assert first.reward_specs == [{"name": "reasoning_gym", "weight": 1.0, "task": "chain_sum", "config": {"max_digits": 1},
                                   "seed": 3, "size": 12, "answer_format": "tags"}]  # 4 eval + 8 train entries
    other_seed = build_task(PREFIX + "chain_sum", {"max_digits": 1}, seed=4, size=8, eval_size=4, answer_format="tags")
    assert other_seed.eval_rows != first.eval_rows


def test_split_drops_train_entries_that_repeat_a_held_out_question():
    # questions a b a c b d, eval_size 3: eval = first a (0), b (1), the second a at 2 is a repeat -> eval [0, 1];
    # train = indices 3.. minus held-out questions: c (3) kept, b (4) dropped, d (5) kept.
    assert split_indices(["a", "b", "a", "c", "b", "d"], 3) == ([3, 5], [0, 1])


def test_held_out_and_train_questions_never_overlap_on_a_small_task():
    # products of two 1-digit numbers: only 100 questions, so 300 entries repeat a lot.
    task = build_task(PREFIX + "products", {"max_digits": 1}, seed=0, size=200, eval_size=100, answer_format="tags")
    question = lambda r: r["prompt"][-1]["content"]  # noqa: E731
    held_out = {question(r) for r in task.eval_rows}
    assert len(held_out) == len(task.eval_rows) < 100  # deduplicated
    assert not held_out & {question(r) for r in task.train_rows}
    assert task.metadata["dropped_train_rows"] == 200 - len(task.train_rows) > 0


def test_composite_mixes_tasks_and_scores_each_with_its_own_scorer():
    config = {"datasets": [{"name": "chain_sum", "weight": 1, "config": {"max_digits": 1}},
                           {"name": "leg_counting", "weight": 3, "config": {"max_animals": 3}}]}
    task = build_task(PREFIX + "composite", config, seed=0, size=40, eval_size=10, answer_format="tags")
    sources = {("legs" in r["prompt"][-1]["content"]) for r in task.train_rows}
    assert sources == {True, False}
    rows = task.train_rows[:6]
    assert score(task, rows, [f"<answer>{r['answer']}</answer>" for r in rows]) == [1.0] * 6


def test_answer_formats():
    text = "Let me think.\nThe product is 1,234.\n"
    assert extract(text, "tags") is None  # reasoning-gym's way: no tags, no answer
    assert extract(text, "last_line") == "The product is 1,234."
    assert extract(text, "last_number") == "1234"
    assert extract("<answer> 7 </answer> then 9", "last_number") == "7"  # tags win in every format
    task = build_task(PREFIX + "products", {"max_digits": 1}, seed=0, size=4, eval_size=4, answer_format="last_number")
    row = task.eval_rows[0]
    assert [m["role"] for m in row["prompt"]] == ["user"]  # no tag-asking system prompt: the template's own
    assert score(task, [row], [f"So the answer is {row['answer']}."]) == [1.0]


def test_an_eval_counts_only_the_task_s_full_score_as_correct():
    # letter_counting's scorer is reasoning-gym's default: 1.0 for the key, len(key) / len(answer) when the key is
    # inside the answer. For a key of one digit k, the answer "k0" holds it and scores 1/2 = 0.5, which the evals'
    # generic 0.5 bar would count as correct; reasoning_gym's correct_at (1.0) does not.
    from cohort.rewards.reward_set import RewardSet
    from cohort.trainer.evaluate import correct_at

    task = build_task(PREFIX + "letter_counting", {"min_words": 3, "max_words": 5}, seed=0, size=20, eval_size=20,
                      answer_format="last_number")
    row = next(r for r in task.eval_rows if len(r["answer"]) == 1)
    rewards = RewardSet.from_specs(task.reward_specs)
    assert score(task, [row, row], [f"It appears {row['answer']} times.", f"It appears {row['answer']}0 times."]) == [1.0, 0.5]
    assert correct_at(rewards) == 1.0
    assert correct_at(RewardSet.from_specs([{"name": "numeric_match"}])) == 0.5


def test_full_credit_pays_only_the_task_s_full_score():
    # data.task_credit: full. The key k (one digit) inside "k0" scores len("k") / len("k0") = 1/2 under reasoning-gym's
    # default scorer (partial credit, above); with credit "full" it is 0.0 (below the full score 1.0), the key itself
    # still 1.0, and a wrong number ("k+1", not containing k) 0.0 either way. The spec carries the choice, so the
    # reward rebuilt in another process pays the same.
    config = {"min_words": 3, "max_words": 5}
    task = build_task(PREFIX + "letter_counting", config, seed=0, size=20, eval_size=20, answer_format="last_number",
                      credit="full")
    assert task.reward_specs[0]["credit"] == "full"
    assert "credit" not in build_task(PREFIX + "letter_counting", config, seed=0, size=20, eval_size=20,
                                      answer_format="last_number").reward_specs[0]  # the default spec is unchanged
    row = next(r for r in task.eval_rows if len(r["answer"]) == 1 and r["answer"] != "9")
    wrong = str(int(row["answer"]) + 1)
    texts = [f"It appears {row['answer']} times.", f"It appears {row['answer']}0 times.", f"It appears {wrong} times."]
    assert score(task, [row] * 3, texts) == [1.0, 0.0, 0.0]
    loaded = run_data(load_config(None, ["data.task=reasoning_gym:letter_counting", "data.task_credit=full",
                                          "data.answer_format=last_number", "data.task_size=20", "data.task_eval_size=20"]))
    assert loaded[2][0]["credit"] == "full"


def _numbers(row) -> list[int]:
    """The two numbers of a gcd question ('... of these numbers: 14, 2. Give only ...')."""
    return [int(n) for n in row["prompt"][-1]["content"].split(": ")[1].split(".")[0].split(", ")]


def test_an_easier_train_config_trains_on_it_and_is_scored_on_the_held_out_config():
    # data.task_train_config: train entries from gcd up to 15, held-out ones from gcd up to 30 (the target). Every
    # train question's numbers are <= 15; the held-out rows are exactly the target's own (as without the option); no
    # train question is a held-out one; each row is scored, and its reference read, from the entry its own config made:
    # gcd(a, b) computed here by hand from the question's two numbers scores 1.0, gcd + 1 scores 0.0.
    import math

    kw = dict(seed=0, size=400, eval_size=60, answer_format="last_number", credit="full")
    task = build_task(PREFIX + "gcd", {"max_value": 30}, train_config={"max_value": 15}, **kw)
    target = build_task(PREFIX + "gcd", {"max_value": 30}, **kw)
    assert task.eval_rows == target.eval_rows
    assert max(max(_numbers(r)) for r in task.eval_rows) > 15  # (the held-out set is the harder config's)
    assert all(max(_numbers(r)) <= 15 for r in task.train_rows) and len(task.train_rows) > 100
    held_out = {r["prompt"][-1]["content"] for r in task.eval_rows}
    assert not any(r["prompt"][-1]["content"] in held_out for r in task.train_rows)
    # (gcd up to 15 repeats held-out questions of gcd up to 30: the split dropped them)
    assert task.metadata["dropped_train_rows"] > 0
    spec = task.reward_specs[0]
    assert (spec["config"], spec["train_config"], spec["eval_size"]) == ({"max_value": 30}, {"max_value": 15}, 60)
    rows = task.train_rows[:5] + task.eval_rows[:5]
    right = [str(math.gcd(*_numbers(r))) for r in rows]
    assert [r["answer"] for r in rows] == right
    assert score(task, rows, [f"The GCD is {g}." for g in right]) == [1.0] * 10
    assert score(task, rows, [f"The GCD is {int(g) + 1}." for g in right]) == [0.0] * 10
    reward = reward_of(task)
    assert reward.reference_answers(rg_index=[r["rg_index"] for r in rows]) == right
    # the same config twice is the plain task (one dataset, no train_config in the spec)
    assert "train_config" not in build_task(PREFIX + "gcd", {"max_value": 30}, train_config={"max_value": 30}, **kw).reward_specs[0]


def test_a_train_config_is_checked_as_the_task_config_is(caplog):
    cfg = load_config(None, ["data.task=reasoning_gym:gcd", "data.task_train_config.max_valu=15"])
    [problem] = check_data_config(cfg.data)
    assert problem.startswith("data.task_train_config: reasoning_gym:gcd has no field(s) ['max_valu']")
    cfg = load_config(None, ["data.task=arith", "data.task_train_config.max_value=15"])
    [problem] = check_data_config(cfg.data)
    assert problem.startswith("data.task_train_config: for reasoning_gym:<name> tasks")
    # the run says once where its rows come from: gcd up to 15 has 15 x 15 = 225 ordered pairs, so 100 entries repeat
    # held-out questions of gcd up to 30 often; the count dropped is the task's own (metadata), the rest train rows
    caplog.set_level(logging.WARNING, logger="cohort.data.run_data")
    args = ["data.task=reasoning_gym:gcd", "data.task_config.max_value=30", "data.task_train_config.max_value=15",
            "data.task_size=100", "data.task_eval_size=50"]
    train, evals, _ = run_data(load_config(None, args))
    dropped = 100 - len(train.rows)
    assert dropped > 0 and len(evals.rows) <= 50
    assert caplog.messages == [f"data.task_train_config: {len(train.rows)} train rows from {{'max_value': 15}} ({dropped} "
                               f"dropped: they ask held-out questions), {len(evals.rows)} held-out rows from data.task_config "
                               "{'max_value': 30}"]
    with pytest.raises(DataError, match=r"data.task_train_config \{'max_value': 0\}"):
        run_data(load_config(None, ["data.task=reasoning_gym:gcd", "data.task_train_config.max_value=0",
                                     "data.task_size=10", "data.task_eval_size=10"]))


def test_no_socket_is_opened(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    from cohort.data.reasoning_gym import _dataset

    _dataset.cache_clear()
    task = build_task(PREFIX + "basic_arithmetic", {"max_terms": 3}, seed=1, size=5, eval_size=5, answer_format="tags")
    rows = task.eval_rows
    assert score(task, rows, [f"<answer>{r['answer']}</answer>" for r in rows]) == [1.0] * len(rows)


def test_unknown_names_and_fields_are_refused_with_the_fix():
    [problem] = check_task(PREFIX + "chain_summ", {})
    assert "reasoning_gym:chain_sum" in problem and "no task 'chain_summ'" in problem  # difflib's closest names
    [problem] = check_task(PREFIX + "chain_sum", {"max_digit": 2})
    assert "['max_digit']" in problem and "max_digits=4" in problem and "min_terms=2" in problem  # the task's fields
    [problem] = check_task(PREFIX + "composite", {"datasets": [{"name": "leg_countin", "weight": 1}]})
    assert "reasoning_gym:leg_counting" in problem
    assert task_fields("chain_sum") == {"min_terms": 2, "max_terms": 6, "min_digits": 1, "max_digits": 4, "allow_negation": False}


def test_config_checks_refuse_before_anything_loads():
    cfg = load_config(None, ["model.path=gguf:smollm2-135m-instruct", "data.task=reasoning_gym:chain_summ"])
    assert any("closest: reasoning_gym:chain_sum" in p for p in check_data_config(cfg.data))
    cfg = load_config(None, ["data.task=arith", "data.task_config.min_terms=2", "data.answer_format=last_line"])
    assert check_data_config(cfg.data) == ["data.task_config, data.answer_format: for reasoning_gym:<name> tasks; the "
                                           "built-in task 'arith' does not read them: remove them"]
    cfg = load_config(None, ["data.task=reasoning_gym:chain_sum", "data.task_config.max_digits=1", "data.task_size=6",
                             "data.task_eval_size=3"])
    assert check_data_config(cfg.data) == []
    train, evals, specs = run_data(cfg)
    assert len(evals.rows) == 3 and len(train.rows) <= 6 and specs[0]["name"] == "reasoning_gym"
    cfg = load_config(None, ["data.task=reasoning_gym:chain_sum", "data.task_config.min_terms=0"])
    with pytest.raises(DataError, match="min_terms must be positive"):  # a value the task's own config rejects
        run_data(cfg)


def test_cohort_tasks_listing():
    listing = format_tasks()
    assert "reasoning_gym:chain_sum: min_terms=2, max_terms=6, min_digits=1, max_digits=4, allow_negation=False" in listing
    assert "reasoning_gym:composite: datasets=[{name:" in listing
    assert format_tasks("leg_counting").startswith("reasoning_gym:leg_counting: min_animals=3")
    with pytest.raises(ValueError, match="closest: reasoning_gym:leg_counting"):
        format_tasks("leg_countin")
