"""The TextArena connector on real TextArena 0.7 games, with scripted players in place of the model (a fake of the
OpenAI client the agent endpoint hands an agent): the game's own rewards, one seat per player, the chain of each
player's turns, an unfinished game, and the checks before anything loads."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("textarena")

from cohort.config import load_config  # noqa: E402
from cohort.connectors.textarena import EVAL_SEED_OFFSET, game_outcome, new_turn  # noqa: E402
from cohort.plan.run_environment import RunEnvironment  # noqa: E402
from tests.builders import stop_early  # noqa: E402


class ScriptedClient:
    """`client.chat.completions.create(...)` answering from `play(messages)`; records each call's messages and
    X-Session-ID. `finish_reason="length"` with no content once `budget` calls were answered (the run's budget spent)."""

    def __init__(self, play, budget: int | None = None):
        self.play, self.budget, self.calls = play, budget, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, model, messages, extra_headers=None):
        self.calls.append(([dict(m) for m in messages], (extra_headers or {}).get("X-Session-ID")))
        if self.budget is not None and len(self.calls) > self.budget:
            return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=""), finish_reason="length")])
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.play(messages)),
                                                        finish_reason="stop")])


def binary_search():
    """Guesses 1..20 by halving on the game's 'higher' / 'lower' hints."""
    state = {"lo": 1, "hi": 20, "guess": None}

    def play(messages):
        hint = messages[-1]["content"].strip().splitlines()[-1]  # (the first turn's rules mention both words)
        if state["guess"] is not None and "lower" in hint:
            state["hi"] = state["guess"] - 1
        elif state["guess"] is not None and "higher" in hint:
            state["lo"] = state["guess"] + 1
        state["guess"] = (state["lo"] + state["hi"]) // 2
        return f"[{state['guess']}]"

    return play


def _environment(*overrides: str) -> RunEnvironment:
    return RunEnvironment(load_config(None, list(overrides)))


def test_a_one_player_game_is_played_to_its_end_and_its_reward_is_the_run_s():
    env = _environment("environment=textarena:GuessTheNumber-v0", "agent.num_examples=4", "environment_args.eval_games=2")
    assert env.problems() == [] and env.config.agent.environment == "textarena:GuessTheNumber-v0"
    client = ScriptedClient(binary_search())
    outcome = asyncio.run(env.agent("m")(client, {"ta_seed": 3}))
    # seed 3's number is 8 (read from the game): 10 "lower" -> 5 "higher" -> 7 "higher" -> 8, a win in 4 guesses
    assert outcome == {"reward": 1.0, "unfinished": 0.0, "moves": 4.0}
    # each call extends the last: system, then the game's log as user turns, each reply as the assistant's
    sent = [messages for messages, _ in client.calls]
    assert [len(m) for m in sent] == [2, 4, 6, 8]
    assert all(later[: len(earlier)] == earlier[: len(later)] for earlier, later in zip(sent, sent[1:]))
    assert sent[1][2] == {"role": "assistant", "content": "[10]"} and "lower" in sent[1][3]["content"]
    assert "You are Player 0" not in sent[1][3]["content"]  # (only what the log gained, not the whole log again)
    assert all(session is None for _, session in client.calls)  # one player: no seats
    rows = env.rows()
    assert [r["ta_seed"] for r in rows.train] == [0, 1, 2, 3] and [r["ta_seed"] for r in rows.eval] == [EVAL_SEED_OFFSET,
                                                                                                    EVAL_SEED_OFFSET + 1]
    assert rows.train[3]["prompt"] == sent[0]  # seed 3's row shows what the game's first call sent
    assert rows.train[0]["prompt"][1]["content"].startswith("\n[GAME] You are Player 0")


def test_a_two_player_game_gives_each_player_a_seat_with_its_own_reward():
    env = _environment("environment=textarena:TicTacToe-v0")
    assert env.connectors[0].players() == 2  # (the fewest the game resets with)
    moves = iter(["[0]", "[3]", "[1]", "[4]", "[2]"])  # player 0 takes the top row: 0, 1, 2
    client = ScriptedClient(lambda messages: next(moves))
    outcome = asyncio.run(env.agent("m")(client, {"ta_seed": 1}))
    seats = {v["seat"]: v["reward"] for v in outcome["seats"].values()}
    assert seats == {"player0": 1.0, "player1": -1.0}  # the game's own: a win and a loss
    assert outcome["reward"] == 0.0 and outcome["moves"] == 5.0  # the run's: the players' mean (zero-sum)
    # each call came with its player's session id, the one the seat names; players alternate
    by_seat = {sid: v["seat"] for sid, v in outcome["seats"].items()}
    assert [by_seat[session] for _, session in client.calls] == ["player0", "player1", "player0", "player1", "player0"]
    player1 = [messages for messages, session in client.calls if by_seat[session] == "player1"]
    assert "[Player 0] [0]" in player1[0][1]["content"]  # its first turn: the rules and player 0's first move
    # its second: only what its log gained (its own move echoed, player 0's answer), not the rules again
    second = player1[1][-1]["content"]
    assert "[Player 1] [3]" in second and "[Player 0] [1]" in second and "You are Player 1" not in second


def test_a_game_cut_off_by_the_budget_has_no_reward():
    env = _environment("environment=textarena:TicTacToe-v0")
    client = ScriptedClient(lambda messages: "[4]" if len(messages) == 2 else "[0]", budget=2)
    outcome = asyncio.run(env.agent("m")(client, {"ta_seed": 0}))
    # two moves made, the third call found the budget spent: the game never ended, so nothing is scored
    assert outcome["reward"] is None and outcome["unfinished"] == 1.0 and outcome["moves"] == 2.0
    assert sorted(v["reward"] is None for v in outcome["seats"].values()) == [True, True]


def test_the_run_s_reward_is_the_game_s_and_a_failed_episode_s_is_none():
    [spec] = _environment("environment=textarena:GuessTheNumber-v0").episode_reward_specs()
    runs = [SimpleNamespace(error=None, outcome={"reward": 1.0}), SimpleNamespace(error="boom", outcome=None), None]
    assert spec["weight"] == 1.0 and spec["name"](["a", "b", "c"], agent_runs=runs) == [1.0, None, None]
    assert game_outcome(None, {0: "s"}, 3) == {"reward": None, "unfinished": 1.0, "moves": 3.0}
    assert new_turn("ab\ncd", "ab") == "\ncd" and new_turn("xy", "ab") == "xy" and new_turn("ab", "") == "ab"


def test_the_checks_name_the_game_the_arguments_and_the_package():
    assert _environment("environment=textarena:TicTacToe-v9").problems() == [
        "environment = 'textarena:TicTacToe-v9': TextArena has no game 'TicTacToe-v9'; did you mean "
        "textarena:TicTacToe-v0, textarena:WildTicTacToe-v0, textarena:TicTacToe-v0-raw?"]
    assert _environment("environment=textarena:TicTacToe-v0", "environment_args.players=2").problems() == [
        "environment_args ['players'] for 'textarena:TicTacToe-v0': TextArena games take num_players, max_turns, eval_games"]
    [three] = _environment("environment=textarena:TicTacToe-v0", "environment_args.num_players=3").problems()
    assert three.startswith("environment = 'textarena:TicTacToe-v0': the game does not start with 3 players here (")
    assert three.endswith("); set environment_args.num_players, or choose a game that needs no download")


def test_a_missing_package_is_refused_with_its_pinned_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textarena" else real(name, *a))
    assert _environment("agent.environment=textarena:TicTacToe-v0").problems() == [
        "agent.environment = 'textarena:TicTacToe-v0' needs the textarena package: pip install 'textarena==0.7.4'"]


@pytest.mark.slow
def test_tictactoe_trains_two_steps_through_the_one_spelling(tmp_path):
    """`environment: textarena:TicTacToe-v0` trains the tiny random chat model two steps: every game's two players
    become two seats' rows, each with its own reward from the game, through the agent endpoint."""
    from cohort.models.tiny_chat import build_random_chat_model
    from cohort.trainer.trainer import Trainer

    model_dir = build_random_chat_model(tmp_path / "model", max_positions=2048)
    _stop_early(model_dir)
    cfg = load_config(None, [f"model.path={model_dir}", "environment=textarena:TicTacToe-v0", "agent.num_examples=4",
                             "environment_args.eval_games=0", "engine.name=hf",
                             "rollout.num_generations=2", "rollout.max_completion_length=768", "train.prompts_per_step=2",
                             "train.micro_batch_size=4", "train.max_steps=2", "run.eval_every=0", "run.save_every=0",
                             "run.progress=false", "run.loggers=[jsonl]", f"run.output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg, run_dir=tmp_path / "run", log=lambda *a: None)
    try:
        for _ in range(2):
            metrics = trainer.step()
            batch = trainer.state.batch
            seats = [e.seat for e in batch.episodes]
            # 2 prompts x 2 games, each game widened into its two players' rows, grouped player by player
            assert sorted(seats) == ["player0"] * 4 + ["player1"] * 4
            assert all(e.outcome is not None and e.error is None for e in batch.episodes)
            rewards = [r for r in batch.rewards.tolist() if r == r]  # (NaN: an unfinished game, scored by nothing)
            assert all(r in (-1.0, 0.0, 1.0) for r in rewards)  # the game's own rewards, seat by seat
            assert "agent/seat/player0/reward" in metrics and "agent/unfinished" in metrics
            # the random model writes no legal move: TextArena lets player0 retry once, then it loses (-1) and player1,
            # which never played (no call, nothing to train), wins (+1); zero-sum over every finished game
            assert sum(rewards) == 0 and len(rewards) >= 2
            assert [e.turns for e in batch.episodes if e.seat == "player0"] == [2] * 4
    finally:
        trainer.close()


def _stop_early(model_dir) -> None:
    """The random model's replies end after a few tokens, so a game gets several turns (tests/tools/conftest.py's
    quick-stop model: tests/builders.py's `stop_early`, with a system and a user turn as the scaffold)."""
    stop_early(model_dir, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
