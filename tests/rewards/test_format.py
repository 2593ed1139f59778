"""think_format and soft_overlong, with TRL parity tables.

TRL is not installed here. The expected TRL values below were derived by hand from
the source of trl/rewards/format_rewards.py (think_format_reward: a regex anchored at
the start that needs "<think>", forbids a second "<think>" after it, and needs a
"</think>"; anything, even nothing, may follow) and trl/rewards/other_rewards.py
(get_soft_overlong_punishment), read through the search tool, plus the examples in
their docstrings.
"""

import pytest

from cohort.rewards import get

# (completion, TRL's think_format_reward, ours with the default require_answer=True)
THINK_CASES = [
    ("<think>\nThis is my reasoning.\n</think>\nThis is my answer.", 1.0, 1.0),  # TRL docstring
    ("<think>\nThis is my reasoning.\nThis is my answer.", 0.0, 0.0),  # TRL docstring
    ("<think>r</think>", 1.0, 0.0),  # no answer: the one deliberate difference
    ("<think>r</think>   \n", 1.0, 0.0),  # blank answer
    ("<think></think>42", 1.0, 1.0),  # empty reasoning is allowed by both
    (" <think>r</think>a", 0.0, 0.0),  # must start with the tag
    ("Answer first <think>r</think>a", 0.0, 0.0),
    ("<think>a<think>b</think>c", 0.0, 0.0),  # nested opening tag
    ("<think>a</think>b<think>c", 0.0, 0.0),  # a second opening tag anywhere
    ("<think>a</think>b</think>c", 1.0, 1.0),  # a stray closing tag after the answer starts
    ("</think>answer", 0.0, 0.0),
    ("plain answer", 0.0, 0.0),
]


@pytest.mark.parametrize("text, trl, ours", THINK_CASES)
def test_think_format_matches_trl(text, trl, ours):
    assert get("think_format")(completions=[text]) == [ours]
    assert get("think_format", require_answer=False)(completions=[text]) == [trl]


def test_think_format_chat_and_custom_tags():
    reward = get("think_format", open_tag="<reasoning>", close_tag="</reasoning>")
    chat = [[{"role": "assistant", "content": "<reasoning>r</reasoning> 7"}], "<think>r</think> 7"]
    assert reward(completions=chat) == [1.0, 0.0]


def test_think_format_opened_in_prompt():
    reward = get("think_format", opened_in_prompt=True)
    texts = ["reasoning...</think>The answer is 3", "<think>again</think>3", "no close tag", "r</think>"]
    assert reward(completions=texts) == [1.0, 0.0, 0.0, 0.0]


def test_soft_overlong_matches_trl():
    # TRL docstring: max 100, cache 20, a 90-token completion → (80 - 90) / 20 = -0.5
    reward = get("soft_overlong", max_completion_length=100, cache_length=20)
    lengths = [0, 80, 81, 90, 100, 101, 500]
    # ≤ 80 → 0; 81 → -1/20; 90 → -0.5; 100 → -1 (still in the linear part); > 100 → -1
    expected = [0.0, 0.0, -0.05, -0.5, -1.0, -1.0, -1.0]
    assert reward(completion_ids=[[7] * n for n in lengths], completions=[""] * 7) == expected


def test_soft_overlong_zero_cache_and_validation():
    reward = get("soft_overlong", max_completion_length=10, cache_length=0)
    assert reward(completion_ids=[[0] * 10, [0] * 11]) == [0.0, -1.0]
    with pytest.raises(ValueError, match="cache_length"):
        get("soft_overlong", max_completion_length=10, cache_length=11)
