"""Gymnasium text environments through their adapter (cohort/tools/gym_text.py): the word game written as Gymnasium's
custom-environment page writes one (tests/tools/envs/hangman_env.py, registered with gymnasium.register) and
Gymnasium's own FrozenLake (Discrete actions, ansi text), each made by `gymnasium.make` with its wrappers; reset's
seed and options from the row, terminated / truncated, hand-summed rewards, a failing episode in the tool loop, and
the spellings refused before anything loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium
import pytest

from cohort.api import build_config
from cohort.config import ConfigError
from cohort.models.pretrained import load_tokenizer
from cohort.rollout.base import Request, SamplingConfig, generate_requests
from cohort.tools import gym_text
from cohort.tools.loop import ToolEngine
from cohort.tools.parsers import parse_hermes
from cohort.tools.tool_schemas import environment_tools
from cohort.plan.run_environment import RunEnvironment
from cohort.connectors import resolve_environment

ENVS = Path(__file__).parent / "envs"
sys.path.insert(0, str(ENVS))
from hangman_env import HangmanEnv  # noqa: E402

from tests.tools.test_tool_loop import Scripted, _call  # noqa: E402  (the scripted request-level engine)

HANGMAN = "gym:hangman_env:Hangman-v0"
PROMPT = [{"role": "user", "content": "Play."}]


class BrokenHangman(HangmanEnv):
    """A move of "z" crashes the game (the failure tests)."""

    def step(self, action: str):
        if action == "z":
            raise RuntimeError("the gallows fell over")
        return super().step(action)


gymnasium.register(id="cohort_tests/BrokenHangman-v0", entry_point=BrokenHangman, max_episode_steps=6)
# Gymnasium's own FrozenLake, not slippery (so moves are exact): registered with kwargs, as its users do
gymnasium.register(id="cohort_tests/FrozenLakeDry-v1", entry_point="gymnasium.envs.toy_text.frozen_lake:FrozenLakeEnv",
                   kwargs={"map_name": "4x4", "is_slippery": False}, max_episode_steps=100)


def _wrappers(env) -> list[str]:
    names, inner = [], env._session.env
    while hasattr(inner, "env"):
        names.append(type(inner).__name__)
        inner = inner.env
    return names


def test_hangman_reset_steps_terminate_and_rewards_sum_by_hand():
    env = resolve_environment(HANGMAN)()
    (tool,) = environment_tools(env)
    assert tool.name == "step" and tool.schema["function"]["parameters"]["properties"]["action"]["type"] == "string"
    # the row: its seed is reset's seed, its other columns (not the prompt) reset's options
    first = env.reset(prompt=PROMPT, seed=5, word="sun")
    assert first == "\n\nWord: _ _ _ (3 letters, 0 wrong). Guess a letter or the word."
    assert env._session.env.unwrapped.np_random_seed == 5
    assert _wrappers(env) == ["TimeLimit", "OrderEnforcing", "PassiveEnvChecker"]  # gymnasium.make's, from register
    assert env.step("s") == "Word: s _ _ (3 letters, 0 wrong). Guess a letter or the word." and not env.done
    assert env.step(action="x") == "Word: s _ _ (3 letters, 1 wrong). Guess a letter or the word."
    assert env.step("sun") == "Word: s u n (3 letters, 1 wrong). Guess a letter or the word."
    # "s" shows 1 of 3 letters (1/3), "x" is wrong (-0.1), "sun" shows the other 2 (2/3): 1/3 - 0.1 + 2/3 = 0.9
    assert env.rewards == pytest.approx([1 / 3, -0.1, 2 / 3], abs=1e-12)
    assert env.done and env.terminated and not env.truncated and env.info == {"word_length": 3, "wrong": 1}
    assert env.get_reward() == pytest.approx(0.9, abs=1e-12)
    with pytest.raises(RuntimeError, match="the episode is over"):
        env.step("a")
    env.close()


def test_the_registered_time_limit_truncates_and_an_action_outside_the_space_is_not_stepped():
    env = resolve_environment(HANGMAN)()
    env.reset(word="cat")
    # "Cat" (an upper-case letter) and a 9-letter word are not in Text(1, 8, lowercase): nothing happens, no reward
    assert env.step("Cat").startswith("invalid action 'Cat': not in Text(") and env.step("abcdefghi").startswith("invalid")
    for k, move in enumerate("xyzqw"):  # five wrong moves: not over yet (TimeLimit counts only real steps)
        env.step(move)
        assert not env.done, k
    env.step("v")  # the sixth real step: max_episode_steps=6 truncates
    assert env.done and env.truncated and not env.terminated
    assert env.get_reward() == pytest.approx(-0.6, abs=1e-12)  # six wrong moves x -0.1


def test_the_row_seed_draws_the_same_game_and_a_class_is_made_unregistered():
    games = []
    # a registered id, the class by path, the class (Python), and its path without gym: (a saved config's spelling)
    for spec in (HANGMAN, "gym:hangman_env.HangmanEnv", HangmanEnv, "hangman_env.HangmanEnv", "hangman_env:HangmanEnv"):
        env = resolve_environment(spec)()
        games.append(env.reset(seed=11, prompt=PROMPT))  # no word column: the word is drawn from the seed
        env.close()
    assert len(set(games)) == 1 and len(games) == 5
    assert resolve_environment(HangmanEnv).__name__ == "GymEpisode[HangmanEnv]"
    assert not _wrappers_has_time_limit(resolve_environment("gym:hangman_env.HangmanEnv"))  # unregistered: no TimeLimit


def _wrappers_has_time_limit(cls) -> bool:
    env = cls()
    env.reset(word="cat")
    try:
        return "TimeLimit" in _wrappers(env)
    finally:
        env.close()


def test_gymnasium_s_frozen_lake_discrete_moves_and_ansi_text():
    env = resolve_environment("gym:cohort_tests/FrozenLakeDry-v1")()
    (tool,) = environment_tools(env)
    assert tool.schema["function"]["parameters"]["properties"]["action"] == {
        "type": "integer", "description": "the number of your move, 0 to 3"}
    board = env.reset(seed=0, prompt=PROMPT)
    assert board.startswith("\n\n") and board.endswith("FHFH\nFFFH\nHFFG\n")  # its ansi render (S highlighted)
    # SFFF / FHFH / FFFH / HFFG: right, right, down, down, down, right reaches G; moves 0 left 1 down 2 right 3 up
    for move in (2, "2", 1, 1, 1):  # (a move written as text is read as its number)
        env.step(move)
        assert not env.done and env.rewards[-1] == 0.0
    # the agent on G, shown as FrozenLake's ansi render shows it: the last move, then the board with its cell highlighted
    assert env.step(2) == "  (Right)\nSFFF\nFHFH\nFFFH\nHFF\x1b[41mG\x1b[0m\n"
    assert env.done and env.terminated and env.get_reward() == 1.0
    lake = resolve_environment("gym:cohort_tests/FrozenLakeDry-v1")()
    lake.reset()
    lake.step(1)  # down to (1, 0), then right into the hole at (1, 1): over, reward 0
    lake.step(2)
    assert lake.done and lake.terminated and lake.get_reward() == 0.0
    fresh = resolve_environment("gym:cohort_tests/FrozenLakeDry-v1")()
    fresh.reset()
    assert fresh.step(7) == "invalid action 7: not in Discrete(4); nothing happened" and fresh.rewards == []


def test_a_failing_reset_or_step_fails_its_episode_only():
    env = resolve_environment(HANGMAN)()
    with pytest.raises(RuntimeError, match=r"Hangman-v0 reset raised ValueError: the word must be lowercase letters, got 'Cat'"):
        env.reset(word="Cat")
    assert env.done and env.get_reward() is None
    broken = resolve_environment("gym:cohort_tests/BrokenHangman-v0")()
    broken.reset(word="cat")
    broken.step("c")
    with pytest.raises(RuntimeError, match="BrokenHangman-v0 step raised RuntimeError: the gallows fell over"):
        broken.step("z")
    assert broken.done and broken.get_reward() is None  # (1/3 was earned before: a failed episode scores nothing)


@pytest.fixture(scope="module")
def tok(tiny_chat_model_dir):
    return load_tokenizer(tiny_chat_model_dir)


def test_the_tool_loop_plays_episodes_and_one_failure_stays_in_its_episode(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    move = lambda a: _call(tok, "step", json.dumps({"action": a})) + [stop]  # noqa: E731
    turns = {"r/0": [move("c"), move("at"), move("cat"), [stop]], "r/1": [move("z"), [stop]], "r/2": [move("t"), [stop]],
             "r/3": [move("a"), [stop]]}
    rows = {"r/0": {"word": "cat"}, "r/1": {"word": "cat"}, "r/2": {"word": "Cat"}, "r/3": {"word": "star", "seed": 3}}
    inner = Scripted(turns, stop)
    prompt_with = lambda row, observation: [7, 7] + tok(observation, add_special_tokens=False)["input_ids"]  # noqa: E731
    engine = ToolEngine(inner, tok, parser=parse_hermes, environment=resolve_environment("gym:cohort_tests/BrokenHangman-v0"),
                        rows=lambda r: dict(rows[r.request_id]), max_turns=5, tool_timeout_s=5.0, prompt_with=prompt_with)
    won, crashed, unreset, quiet = generate_requests(engine, [Request(r, (1,), SamplingConfig(400)) for r in sorted(rows)])
    first = "\n\nWord: _ _ _ (3 letters, 0 wrong). Guess a letter or the word."
    assert won.prompt_ids == [7, 7] + tok(first, add_special_tokens=False)["input_ids"]  # appended to the prompt (TRL's rule)
    # "c" shows 1/3, "at" is no letter and not the word (-0.1), "cat" the other 2/3: terminated on the third turn
    assert won.episode.turns == 3 and won.episode.status == "ok"
    assert won.episode.environment.get_reward() == pytest.approx(1 / 3 - 0.1 + 2 / 3, abs=1e-12)
    assert [m["content"] for m in won.episode.conversation if m["role"] == "tool"][-1].startswith("Word: c a t")
    # step raised: that episode fails (status error, no reward), the others go on
    assert crashed.episode.status == "error" and crashed.episode.environment.get_reward() is None
    assert "the gallows fell over" in crashed.episode.conversation[-1]["content"]
    assert unreset.episode.status == "error" and "the word must be lowercase letters" in unreset.episode.conversation[0]["content"]
    # "a" shows 1 of "star"'s 4 letters; the model then stops: the episode's reward is what it earned, 1/4
    assert quiet.episode.status == "ok" and quiet.episode.environment.get_reward() == 0.25
    assert quiet.episode.environment._session.env.unwrapped.np_random_seed == 3


def test_spellings_refused_before_anything_loads_with_the_fix(tmp_path, monkeypatch):
    base = {"model": {"path": "tiny:arith"}, "rewards": [], "rollout": {"max_completion_length": 32},
            "data": {"train_files": [str(tmp_path / "t.jsonl")]}}
    (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    refused = {
        "gym:hangman_env:Hangmn-v0": r"= 'gym:hangman_env:Hangmn-v0': Environment `Hangmn` doesn't exist\. Did you mean: "
                                     r"`Hangman`\?; closest registered: Hangman-v0",
        "gym:hangman_env.HangmanEnvv": r"no gymnasium.Env subclass 'HangmanEnvv' in 'hangman_env'; closest: hangman_env.HangmanEnv",
        "gym:no_such_games:Hangman-v0": r"cannot import 'no_such_games' \(No module named 'no_such_games'\); is it on PYTHONPATH\?",
        "gym:CartPole-v1": r"its observations are Box\(.*\), not text, and it has no 'ansi' render mode; give it a "
                           r"gymnasium.spaces.Text observation space",
        "gym:FrozenLake": r"No registered env with id: FrozenLake; closest registered: FrozenLake-v1, FrozenLake8x8-v1",
    }
    for spec, message in refused.items():
        with pytest.raises(ConfigError, match=message):
            build_config(base, overrides=[f"tools.environment={spec}"])
    with pytest.raises(ValueError, match=r"write gym:<id> \(an id registered with gymnasium.register\), gym:<module>:<id>"):
        resolve_environment("gym:")  # (an override `tools.environment=gym:` is YAML for a mapping: refused by the schema)
    monkeypatch.setattr(gym_text, "gymnasium", None)
    with pytest.raises(ConfigError, match=r"needs gymnasium: pip install 'gymnasium>=1.0'"):
        build_config(base, overrides=[f"tools.environment={HANGMAN}"])
    monkeypatch.undo()
    # the episode's rewards are the reward: rewards = [] is accepted, and the environment reward is its one spec
    cfg = build_config(base, overrides=[f"tools.environment={HANGMAN}"])
    assert [s["alias"] for s in RunEnvironment(cfg).tools.reward_specs()] == ["environment"]
    # a class given from Python is saved as its import path, which names the same Gymnasium environment again (--resume)
    saved = build_config(base, overrides=["tools.environment=hangman_env.HangmanEnv"])
    assert [s["alias"] for s in RunEnvironment(saved).tools.reward_specs()] == ["environment"]
    assert resolve_environment(saved.tools.environment).__name__ == "GymEpisode[HangmanEnv]"
    assert not gym_text.is_gym_spec("trl_shape.EchoEnv") and not gym_text.is_gym_spec("no_such_module.Env")
