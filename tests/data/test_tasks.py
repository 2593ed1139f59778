"""Built-in tasks: the registry, and arith's determinism, splits and answers."""

import re

import pytest

from cohort.data import tasks
from cohort.data.tasks import Task, arith_rows, get_task, list_tasks, register_task

ARITH_PROMPT = re.compile(r"^(\d{1,2})([+-])(\d)=$")


def triple(row):
    a, op, b = ARITH_PROMPT.match(row["prompt"]).groups()
    return int(a), op, int(b)


def test_registry_lists_arith_and_rejects_unknown_names():
    assert "arith" in list_tasks()
    with pytest.raises(ValueError, match="unknown task 'nope'.*arith"):
        get_task("nope")


def test_registering_a_name_twice_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_task("arith")(lambda seed: None)


def test_arith_task_shape():
    task = get_task("arith")
    assert isinstance(task, Task) and task.name == "arith"
    assert task.reward_specs == [{"name": "numeric_match", "weight": 1.0}]
    # 1,000 '+' problems (a 0..99, b 0..9) + 955 '-' problems (b <= a); 300 held out.
    assert len(task.eval_rows) == 300
    assert len(task.train_rows) == 1000 + 955 - 300
    assert task.description
    assert all(set(row) == {"prompt", "answer"} for row in task.train_rows + task.eval_rows)


def test_arith_answers_are_correct_and_non_negative():
    task = get_task("arith")
    for row in task.train_rows + task.eval_rows:
        a, op, b = triple(row)
        assert row["answer"] == str(a + b if op == "+" else a - b)
        assert int(row["answer"]) >= 0 and len(row["answer"]) <= 3


def test_arith_splits_are_disjoint_and_eval_is_balanced():
    task = get_task("arith")
    train, held_out = {triple(r) for r in task.train_rows}, {triple(r) for r in task.eval_rows}
    assert len(train) == len(task.train_rows) and len(held_out) == len(task.eval_rows)  # no duplicates
    assert not train & held_out
    assert sum(op == "+" for _, op, _ in held_out) == sum(op == "-" for _, op, _ in held_out) == 150


def test_arith_is_deterministic_and_the_held_out_set_does_not_depend_on_the_seed():
    first, again, other = get_task("arith", seed=0), get_task("arith", seed=0), get_task("arith", seed=1)
    assert first.train_rows == again.train_rows and first.eval_rows == again.eval_rows
    assert first.train_rows != other.train_rows  # another order
    assert {r["prompt"] for r in first.eval_rows} == {r["prompt"] for r in other.eval_rows}
    # The generator uses no global random state.
    tasks.random.seed(12345)
    assert get_task("arith", seed=0).train_rows == first.train_rows


def test_arith_rows_sizes_and_errors():
    train, held_out = arith_rows(0, eval_size=10, train_size=20)
    assert len(train) == 20 and len(held_out) == 10
    with pytest.raises(ValueError, match="even"):
        arith_rows(0, eval_size=7)
    with pytest.raises(ValueError, match="train_size"):
        arith_rows(0, train_size=10_000)


def test_arith_chat_is_arith_as_one_user_turn():
    plain, chat = get_task("arith", seed=3), get_task("arith_chat", seed=3)
    assert chat.name == "arith_chat" and chat.reward_specs == plain.reward_specs
    for mine, theirs in ((chat.train_rows, plain.train_rows), (chat.eval_rows, plain.eval_rows)):
        assert mine == [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in theirs]


def test_add_chat_asks_every_ordered_pair_once_with_a_fixed_held_out_split():
    a, b = get_task("add_chat", seed=0), get_task("add_chat", seed=1)
    assert a.reward_specs == [{"name": "numeric_match", "weight": 1.0}]
    pairs = lambda rows: [tuple(int(x) for x in re.fullmatch(r"What is (\d+) \+ (\d+)\?", r["prompt"][0]["content"]).groups())
                          for r in rows]  # noqa: E731
    train, held_out = pairs(a.train_rows), pairs(a.eval_rows)
    # 30 × 30 ordered pairs (3 + 4 and 4 + 3 are two problems), 200 held out, disjoint from the 700 trained on
    assert len(held_out) == 200 and len(train) == 700 and set(train) | set(held_out) == {(x, y) for x in range(1, 31) for y in range(1, 31)}
    assert all(r["answer"] == str(x + y) and r["prompt"][0]["role"] == "user" and len(r["prompt"]) == 1
               for r, (x, y) in zip(a.train_rows + a.eval_rows, train + held_out))
    assert b.eval_rows == a.eval_rows and b.train_rows != a.train_rows and sorted(pairs(b.train_rows)) == sorted(train)
