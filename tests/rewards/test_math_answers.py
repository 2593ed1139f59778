"""accuracy and reasoning_accuracy with math-verify, in the shared process pool.

TRL parity: the first cases are the examples from the docstrings of TRL's
accuracy_reward and reasoning_accuracy_reward (trl/rewards/accuracy_rewards.py, read
through the search tool; TRL is not installed here), with TRL's stated outputs. Our
implementation calls math-verify with the same parse/verify settings as that source.
"""

import pytest

from cohort.rewards import get

pytest.importorskip("math_verify")


def run(reward, completions, **columns):
    return reward(prompts=[""] * len(completions), completions=completions, **columns)  # a plain call, as TRL users make


@pytest.fixture(scope="module")
def accuracy():
    reward = get("accuracy", num_workers=1)
    yield reward
    reward.close()


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_trl_docstring_example(accuracy):
    completions = [chat(r"My answer is \boxed{\frac{1}{3}}"), chat(r"My answer is \boxed{\frac{1}{2}}")]
    assert run(accuracy, completions, solution=[r"\frac{1}{3}", r"\frac{1}{3}"]) == [1.0, 0.0]


def test_trl_reasoning_docstring_example():
    reward = get("reasoning_accuracy", reasoning_delimiters=["</think>"], num_workers=1)
    completions = [
        chat(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}"),
        chat(r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}"),
        chat(r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer"),
    ]
    try:
        assert run(reward, completions, solution=[r"\frac{1}{3}"] * 3) == [1.0, 0.0, 0.0]
        # the answer is read after the block only: a right answer inside it does not count
        inside = r"<think> maybe \boxed{\frac{1}{3}} </think> so \boxed{\frac{1}{2}}"
        assert run(reward, [inside], solution=[r"\frac{1}{3}"]) == [0.0]
        # incomplete reasoning scores 0.0 even when the gold cannot be parsed (as TRL)
        assert run(reward, ["<think> never closed"], solution=["no math here"]) == [0.0]
    finally:
        reward.close()


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        (r"The answer is \boxed{\frac{3}{4}}.", r"\frac{3}{4}", 1.0),  # LaTeX fraction
        (r"The answer is \boxed{0.75}.", r"\frac{3}{4}", 1.0),  # equivalent decimal
        (r"So $x = \frac{6}{8}$, i.e. \boxed{\dfrac{6}{8}}", "$0.75$", 1.0),  # unreduced, dfrac
        (r"\boxed{2\sqrt{2}}", r"$\sqrt{8}$", 1.0),  # equivalent radicals
        (r"The final answer is $\boxed{x^2+2x+1}$", r"$(x+1)^2$", 1.0),  # equivalent expression
        (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", None),  # math-verify needs $...$ around this gold
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{3}", 0.0),
        (r"I think it is 3/4 but I am not sure", r"\frac{3}{4}", 0.0),  # no anchor, no box: as TRL
        ("I cannot solve this.", "$5$", 0.0),
        (r"\boxed{5}", "not a number at all", None),  # unparseable gold → skipped
        (r"\boxed{5}", "", None),
    ],
)
def test_real_answers(accuracy, completion, gold, expected):
    assert run(accuracy, [completion], solution=[gold]) == [expected]


def test_gold_column_fallback_and_batch(accuracy):
    completions = [r"\boxed{%d}" % i for i in range(12)]
    answers = [str(i if i % 3 else i + 1) for i in range(12)]  # every third one is wrong
    scores = run(accuracy, completions, answer=answers)  # no `solution` column → `answer`
    assert scores == [0.0 if i % 3 == 0 else 1.0 for i in range(12)]


def test_in_a_reward_set():
    from cohort.rewards import RewardSet

    with RewardSet.from_specs([{"name": "accuracy", "num_workers": 1}, {"name": "reasoning_accuracy"}]) as rs:
        out = rs.score(
            prompts=["q", "q"],
            completions=[r"<think>hmm</think> \boxed{4}", r"\boxed{4}"],
            completion_ids=[[1], [1]],
            columns={"solution": ["4", "4"]},
            group_size=2,
        )
    # accuracy reads the first box in both; reasoning_accuracy needs the closed block
    assert out.per_function.tolist() == [[1.0, 1.0], [1.0, 0.0]]
