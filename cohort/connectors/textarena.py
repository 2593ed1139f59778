"""TextArena (`textarena` 0.7) text games as a connector: `environment: textarena:<game id>` (e.g.
`textarena:GuessTheNumber-v0`, one player; `textarena:TicTacToe-v0`, two), played by the model in every seat.

Each request is one game, run with TextArena's own loop as its README shows it, the library unchanged:
`env = textarena.make(id)`, `env.reset(num_players=n, seed=row's seed)`, then until `done`: `player, observation =
env.get_observation()`, the player's action, `done, info = env.step(action)`; `rewards, game_info = env.close()`. The
action is the model's reply to that player's conversation, asked through the agent endpoint (cohort/agents/engine.py):
TextArena's own agents' system prompt (`STANDARD_GAME_PROMPT`), then each observation as a user turn and each reply as
the assistant's. The default wrappers make an observation the player's whole game log so far, so a player's next user
turn is what its log gained since its last turn (the whole observation when it is not an extension): the calls form a
chain, one trajectory per seat, token for token.

Rewards: the game's own, from `env.close()` (win 1, loss -1, draw 0 in two-player games; 1 or 0 in one-player ones).
With one player it is the run's reward; with several, each player is a seat (`seats`: one trajectory per player, each
trained on its own reward, grouped with the same player of the other games of its prompt:
cohort/trainer/agent_samples.py), and the run's reward is the players' mean. A game cut off before it ends (the run's
token budget, rollout.max_completion_length, spent; or `max_turns` moves) has no reward: None (not applicable,
advantage 0), counted as `agent/unfinished`. An exception from the game fails that episode only (scored by nothing,
`agent/failed`).

Rows: one per game, `seed` 0, 1, ... (agent.num_examples games, default 64), each prompt the first player's first
observation; `environment_args.eval_games` held-out games (default 16) from seeds after a gap of 10**6. The config
(`environment_args`): `num_players` (default: the fewest of 1, 2 the game accepts), `max_turns` (default 100 moves),
`eval_games`. Checked before anything loads: the package, the game id (the closest registered ones when unknown), and
one reset of the game.

Left out: opponents other than the policy itself (TextArena's agents call remote APIs), games that need downloads
on first use (Wordle and the other word games load nltk's word lists), TextArena's online arena.
"""

from __future__ import annotations

import difflib
import uuid
from typing import Any, ClassVar, Sequence

from cohort.connectors.base import AgentConnector
from cohort.data.run_data import HubRows

PREFIX = "textarena:"
DEFAULT_GAMES = 64
EVAL_SEED_OFFSET = 10**6
ARGS = {"num_players": None, "max_turns": 100, "eval_games": 16}


def _textarena():
    import textarena  # heavy optional dependency: loaded where a game is made

    return textarena


def system_prompt() -> str:
    from textarena.agents.basic_agents import STANDARD_GAME_PROMPT  # (the optional dependency, as above)

    return STANDARD_GAME_PROMPT


def new_turn(observation: str, seen: str) -> str:
    """What a player's observation (its whole log so far, under TextArena's default wrappers) gained since `seen`."""
    return observation[len(seen):] if seen and observation.startswith(seen) else observation


class Game:
    """One game of `game_id` for `seed`: TextArena's loop, step by step (module docstring)."""

    def __init__(self, game_id: str, num_players: int, seed: int):
        self.env = _textarena().make(game_id)
        self.env.reset(num_players=num_players, seed=seed)
        self.done = False
        self.seen: dict[int, str] = {}  # player -> the observation it last saw

    def turn(self) -> tuple[int, str]:
        """(the player to move, its new user turn)."""
        player, observation = self.env.get_observation()
        text = new_turn(observation, self.seen.get(player, ""))
        self.seen[player] = observation
        return player, text

    def step(self, action: str) -> None:
        self.done, _ = self.env.step(action)

    def close(self) -> dict[int, float] | None:
        """The players' rewards (None when the game did not end: it is closed all the same)."""
        try:
            rewards, _ = self.env.close()
        except Exception:  # noqa: BLE001 - an unfinished game may have nothing to report
            if self.done:
                raise
            return None
        return {int(p): float(r) for p, r in rewards.items()} if self.done and rewards else None


class TextArenaAgent:
    """`async (client, row)`: row's game played against `client`'s endpoint, the model in every seat (module
    docstring). `episode_only`: an exception of the game fails its episode only."""

    episode_only = True

    def __init__(self, game_id: str, num_players: int, max_turns: int, model_name: str):
        self.game_id, self.num_players, self.max_turns, self.model_name = game_id, num_players, max_turns, model_name

    async def __call__(self, client, row: dict[str, Any]) -> dict[str, Any]:
        game = Game(self.game_id, self.num_players, row["ta_seed"])
        sessions = {p: f"textarena-{uuid.uuid4().hex}-player{p}" for p in range(self.num_players)}
        messages = {p: [{"role": "system", "content": system_prompt()}] for p in range(self.num_players)}
        moves, budget_spent = 0, False
        while not game.done and moves < self.max_turns and not budget_spent:
            player, text = game.turn()
            messages[player].append({"role": "user", "content": text})
            headers = {"X-Session-ID": sessions[player]} if self.num_players > 1 else None
            reply = await client.chat.completions.create(model=self.model_name, messages=messages[player],
                                                         extra_headers=headers)
            choice = reply.choices[0]
            action = choice.message.content or ""
            budget_spent = choice.finish_reason == "length" and not action  # (nothing sampled: the budget is spent)
            messages[player].append({"role": "assistant", "content": action})
            if not budget_spent:
                game.step(action)
                moves += 1
        return game_outcome(game.close(), sessions, moves)


def game_outcome(rewards: dict[int, float] | None, sessions: dict[int, str], moves: int) -> dict[str, Any]:
    """The run's outcome: the players' mean reward (None for an unfinished game), `unfinished`, `moves`, and with
    several players `seats` ({session id: {"seat": "player<k>", "reward": its reward}})."""
    counts = {"unfinished": float(rewards is None), "moves": float(moves)}  # (each seat's too: seat rows replace the run's)
    out: dict[str, Any] = {"reward": None if rewards is None else sum(rewards.values()) / len(rewards), **counts}
    if len(sessions) > 1:
        out["seats"] = {sid: {"seat": f"player{p}", "reward": None if rewards is None else rewards.get(p), **counts}
                        for p, sid in sessions.items()}
    return out


def game_reward(completions: Sequence[Any], agent_runs: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """Each completion's game reward; None for a failed or unfinished game, or a completion that is no game."""
    if agent_runs is None:
        return [None] * len(completions)
    return [None if run is None or run.error is not None or run.outcome is None else run.outcome.get("reward")
            for run in agent_runs]


def _first_line(exc: Exception) -> str:
    """An exception as one line: its type and its message's first line of words (nltk's are boxes of asterisks)."""
    line = next((text.strip() for text in str(exc).splitlines() if any(c.isalpha() for c in text)), "")
    return f"{type(exc).__name__}: {line}".rstrip(": ")


class TextArena(AgentConnector):
    """`textarena:<game id>` (module docstring)."""

    name: ClassVar[str] = "TextArena"
    prefixes: ClassVar[tuple[str, ...]] = (PREFIX,)
    requires: ClassVar[tuple[str, str] | None] = ("textarena", "textarena==0.7.4")

    @property
    def game_id(self) -> str:
        return self.spec[len(PREFIX):]

    def setting(self, key: str) -> Any:
        return self.args.get(key, ARGS[key])

    def players(self) -> int:
        """environment_args.num_players, else the fewest of 1, 2 the game resets with (ValueError when neither)."""
        if self.setting("num_players") is not None:
            return int(self.setting("num_players"))
        for n in (1, 2):
            try:
                Game(self.game_id, n, 0)
                return n
            except Exception as exc:  # noqa: BLE001 - a game refuses a player count by asserting or raising its own error
                why = _first_line(exc)
        raise ValueError(f"{self.named_by} = {self.spec!r}: the game starts with neither 1 nor 2 players (with 2: {why}); "
                         "set environment_args.num_players, or choose a game that needs no download")

    def problems(self) -> list[str]:
        unknown = sorted(set(self.args) - set(ARGS))
        if unknown:
            return [f"environment_args {unknown} for {self.spec!r}: TextArena games take {', '.join(ARGS)}"]
        registry = _textarena().envs.registration.ENV_REGISTRY
        if self.game_id not in registry:
            close = difflib.get_close_matches(self.game_id, list(registry), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(PREFIX + c for c in close)}?" if close else ""
            return [f"{self.named_by} = {self.spec!r}: TextArena has no game {self.game_id!r}{hint}"]
        try:
            players = self.players()
        except ValueError as exc:
            return [str(exc)]
        try:
            Game(self.game_id, players, 0).turn()
        except Exception as exc:  # noqa: BLE001 - the game's own error (a download it needs, a player count), one line
            return [f"{self.named_by} = {self.spec!r}: the game does not start with {players} players here "
                    f"({_first_line(exc)}); set environment_args.num_players, or choose a game that needs no download"]
        return []

    def _rows(self, seeds: range) -> list[dict[str, Any]]:
        players = self.players()
        rows = []
        for seed in seeds:
            _, first = Game(self.game_id, players, seed).turn()
            rows.append({"prompt": [{"role": "system", "content": system_prompt()}, {"role": "user", "content": first}],
                         "ta_seed": seed})
        return rows

    def rows(self) -> HubRows:
        games = self.cfg.agent.num_examples or DEFAULT_GAMES
        held_out = self._rows(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + int(self.setting("eval_games"))))
        return HubRows(self._rows(range(games)), f"TextArena {self.game_id}", held_out or None)

    def reward_specs(self) -> list[dict[str, Any]]:
        return [{"name": game_reward, "weight": 1.0}]

    def agent(self, model_name: str) -> TextArenaAgent:
        return TextArenaAgent(self.game_id, self.players(), int(self.setting("max_turns")), model_name)
