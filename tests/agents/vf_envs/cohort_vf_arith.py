"""A single-turn verifiers (v1) taskset for the tests: tool_calc's questions ("984*19="), rewarded by an exact match
of the last number of the final reply with the product (`@vf.reward`). A top-level module (verifiers imports an
environment by its module name), on sys.path through tests/agents/test_verifiers.py."""

import re

import verifiers.v1 as vf

NUMBER = re.compile(r"-?\d+")


class ArithData(vf.TaskData):
    answer: str = ""


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        numbers = NUMBER.findall(last_reply(trace))
        return float(bool(numbers) and numbers[-1] == self.data.answer)


def last_reply(trace) -> str:
    """The text of the trace's last assistant message."""
    for message in reversed(trace.messages):
        if getattr(message, "role", None) == "assistant":
            content = message.content
            return content if isinstance(content, str) else "".join(getattr(p, "text", "") for p in content or [])
    return ""


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 8
    raise_in_reward: bool = False  # the tests' broken environment: every reward raises
    broken_tasks: list[int] = []  # the tasks (by index) whose reward raises, the others scored as usual


class BrokenArithTask(ArithTask):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        raise ValueError("the scorer broke")


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        broken = lambda i: self.config.raise_in_reward or i in self.config.broken_tasks  # noqa: E731
        pairs = [(3 + 7 * i, 2 + 5 * i) for i in range(self.config.num_tasks)]
        return [(BrokenArithTask if broken(i) else ArithTask)(ArithData(prompt=f"{a}*{b}=", answer=str(a * b)),
                                                               self.config.task) for i, (a, b) in enumerate(pairs)]


__all__ = ["ArithTaskset"]
