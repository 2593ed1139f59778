"""A two-seat, zero-sum verifiers (v1) game for the tests, written the way verifiers' own `kuhn_poker` package is:
"odds and evens" for two seats. One task is one round, dealt from its seed; the env opens both seats as live
interactions (each seat's trace is its own rollout), asks each to show fingers, and pays out a zero-sum `payoff`
reward on each seat's trace: player0 wins (+1, player1 -1) when the total shown (plus the round's stake) is
divisible by `--env.modulus`, else player1 wins. With the default modulus 3, player0 is the underdog.

As verifiers' authors write such a game: an INFINITE taskset whose config has no size field (runs bound it, as
`vf-eval -n` does), tasks without a prompt (each seat gets its own system prompt and turn), both seats on the
tool-less `null` harness with verifiers' default runtime (Prime's remote sandboxes), and the game's own config
fields (`modulus`, `max_fingers` on the env, `stake` on the taskset). A seat's move is the last number of its reply;
a reply without one shows as many fingers as it has words (so a random test model still plays), at most
`max_fingers`.
"""

import random
import re
from collections.abc import Iterator
from itertools import count

from pydantic import Field

import verifiers.v1 as vf

RULES = """You are {seat} in a round of odds and evens. Both players show 0 to {most} fingers at once.
Player 0 wins when the total (plus the stake of {stake}) is divisible by {modulus}; otherwise player 1 wins.
Reply with the number of fingers you show."""


def fingers(reply: str, most: int) -> int:
    """The fingers a reply shows: its last number, else its word count; at most `most`."""
    numbers = re.findall(r"\d+", reply)
    return min(int(numbers[-1]) if numbers else len(reply.split()), most)


class DuelData(vf.TaskData):
    info: dict
    """The round's seed: its stake is drawn from it."""


class DuelTask(vf.Task[DuelData]):
    pass


class DuelConfig(vf.TasksetConfig):
    stake: int | None = Field(None, ge=0)
    """Added to the total shown before the divisibility test (None: the round's seed draws it, 0 to 2)."""


class DuelEnvConfig(vf.EnvConfig):
    player0: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    player1: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    modulus: int = Field(3, ge=2)
    """player0 wins when the total is divisible by this (2: the classic odds and evens)."""
    max_fingers: int = Field(5, ge=1)


class DuelEnv(vf.Env[DuelEnvConfig]):
    async def run(self, task, agents):
        stake = self.taskset.config.stake
        if stake is None:
            stake = random.Random(task.data.info["seed"]).randrange(3)
        seat_tasks = [
            vf.Task(vf.TaskData(idx=task.data.idx, prompt=None, system_prompt=RULES.format(
                seat=f"Player {i}", most=self.config.max_fingers, stake=stake, modulus=self.config.modulus)))
            for i in (0, 1)
        ]
        async with (
            agents.player0.interaction(seat_tasks[0]) as player0,
            agents.player1.interaction(seat_tasks[1]) as player1,
        ):
            shown = []
            for interaction in (player0, player1):
                segment = await interaction.turn("Show your fingers.")
                shown.append(fingers(segment.last_reply or "", self.config.max_fingers))
        net0 = 1.0 if (sum(shown) + stake) % self.config.modulus == 0 else -1.0
        for i, trace in enumerate((player0.trace, player1.trace)):
            trace.record_reward("payoff", net0 if i == 0 else -net0)
            trace.record_metric("fingers", float(shown[i]))
            trace.info["duel"] = {"seat": i, "shown": shown, "stake": stake}


class DuelTaskset(vf.Taskset[DuelTask, DuelConfig]):
    INFINITE = True

    def load(self) -> Iterator[DuelTask]:
        for i in count():
            yield DuelTask(DuelData(idx=i, name=f"round#{i}", prompt=None, info={"seed": i}))


__all__ = ["DuelEnv", "DuelTaskset"]
