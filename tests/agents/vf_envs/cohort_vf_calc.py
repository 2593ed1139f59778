"""A tool-using verifiers (v1) taskset for the tests: tool_calc's questions with one MCP tool, `calculator`
(advertised bare: TOOL_PREFIX None), rewarded by an exact match of the last number of the final reply. verifiers runs
the toolset as `python -m cohort_vf_calc` (its subprocess runtime), so the module is also the tool server's."""

import verifiers.v1 as vf
from cohort_vf_arith import ArithConfig, ArithData, last_reply

from cohort.tools.builtin import calculator as evaluate


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression such as 123*45."""
        return evaluate(expression)


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[ArithData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        numbers = [w for w in last_reply(trace).replace("=", " ").split() if w.lstrip("-").isdigit()]
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class CalcConfig(ArithConfig):
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self):
        pairs = [(3 + 7 * i, 2 + 5 * i) for i in range(self.config.num_tasks)]
        return [CalcTask(ArithData(prompt=f"{a}*{b}=", answer=str(a * b)), self.config.task) for a, b in pairs]


__all__ = ["CalcTaskset"]



def parse(text):
    """tools.parser for the random tiny model of the training test: a turn of odd length calls the calculator, an
    even one answers (so some episodes use the tool and some do not)."""
    from cohort.tools.parsers import ParsedTurn, ToolCall

    if len(text) % 2:
        return ParsedTurn(calls=[ToolCall("calculator", {"expression": "3*2"})], content="")
    return ParsedTurn(content=text)


if __name__ == "__main__":
    CalcToolset.run()
