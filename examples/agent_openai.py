"""An agent written with the `openai` package, trained by cohort (examples/agent_openai.yaml, docs/agents.md).

It knows nothing of cohort: it gets an `openai.AsyncOpenAI` client and a dataset row, runs its own tool loop
(ask the model; run the calculator on each tool call and send the result back as a `tool` message; stop at an
answer without a call or after MAX_CALLS), and returns its reward: 1.0 when the last number of the final answer is
the row's answer. cohort points the client at its loopback endpoint, records every call token for token and
trains on the run (pip install cohort[agents] for the `openai` package).

The calculator's schema goes with every call (`tools=`), as for any model. tiny:tool_calc holds 128 positions and
was warm-started without the chat template's tools block (as the in-process tool loop's prompts have none), so
examples/agent_openai.yaml sets `agent.render_tools: false`: the endpoint parses the model's `<tool_call>` without
rendering the schema into the prompt.
"""

from __future__ import annotations

import json
import re

from cohort.tools.builtin import calculator

MAX_CALLS = 2  # model calls per run (examples/tool_calc.yaml: tools.max_turns = 2)
CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as 123*45.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def run_tool(call) -> str:
    """The calculator on one tool call of the reply; the error as text when the call is malformed."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
        if call.function.name != "calculator":
            return f"error: there is no tool {call.function.name!r}; the tool is 'calculator'"
        return calculator(**arguments)
    except Exception as exc:  # noqa: BLE001 - the model sees its mistake, as the in-process tool loop shows it
        return f"error: {type(exc).__name__}: {exc}"


def reward(answer: str | None, gold: str) -> float:
    numbers = NUMBER.findall(answer or "")
    return float(bool(numbers) and float(numbers[-1]) == float(gold))


async def agent(client, row) -> dict:
    """One episode of `a*b=`: the model may call the calculator, then answers."""
    messages = list(row["prompt"])
    calls, answer = 0, None
    for _ in range(MAX_CALLS):
        response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR_SCHEMA])
        calls += 1
        choice = response.choices[0]
        message = choice.message
        answer = message.content
        if not message.tool_calls or choice.finish_reason == "length":
            break
        messages.append({"role": "assistant", "content": message.content or "",
                         "tool_calls": [c.model_dump() for c in message.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": run_tool(c)} for c in message.tool_calls]
    return {"reward": reward(answer, row["answer"]), "model_calls": float(calls)}
