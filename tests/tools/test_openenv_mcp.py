"""OpenEnv's MCP environments (cohort/tools/openenv.py), on tests/tools/envs/capitals_env.py: an environment written
the way OpenEnv's own `echo_env` and `finqa_env` are (FastMCP tools inline, `MCPEnvironment`, a bare `Observation` from
reset and on `submit_answer`), in-process and served by openenv's `create_app` with MCP's CallToolAction. Before
2026-12-07 cohort offered such an environment as one `step(type, tool_name, arguments)` tool built from the
CallToolAction schema, its reset showed the model "{}", and the in-process class (whose `step` is annotated with the
bare `Action`) was refused for having no Action field."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cohort.models.pretrained import load_tokenizer
from cohort.rollout.base import Request, SamplingConfig, generate_requests
from cohort.tools.loop import ToolEngine
from cohort.tools.openenv import render, render_tool_result
from cohort.tools.parsers import parse_hermes
from cohort.tools.tool_schemas import environment_tools
from cohort.connectors import resolve_environment

from tests.tools.test_openenv import free_port, serve_app
from tests.tools.test_tool_loop import Scripted, _call

ENVS = Path(__file__).parent / "envs"
sys.path.insert(0, str(ENVS))
from capitals_env import CapitalsEnvironment  # noqa: E402

# the tools as the model is shown them: each MCP tool's own name, input schema (FastMCP's, with the docstring's
# argument descriptions) and the first paragraph of its description
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look up the capital of a country.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["country"],
                   "properties": {"country": {"type": "string", "description": "The country's name, e.g. \"France\""}}}}}
FACTS_PARAMETERS = {"country": {"type": "string", "description": "The country's name"},
                    "fields": {"type": "array", "items": {"type": "string"}, "description": "Which facts to return"}}


@pytest.fixture(scope="module")
def capitals_server():
    port = free_port()
    server = serve_app("capitals_env:app", port, {"CAPITALS_SESSIONS": "8"})
    yield f"ws://127.0.0.1:{port}"
    server.kill()
    server.wait()


def _check_episode(cls):
    env = cls()
    schemas = {tool.name: tool.schema for tool in environment_tools(env)}
    assert sorted(schemas) == ["country_facts", "lookup", "submit_answer"]  # no `step` tool
    assert schemas["lookup"] == LOOKUP
    assert schemas["country_facts"]["function"]["parameters"]["properties"] == FACTS_PARAMETERS
    assert env.reset(country="Japan") == ""  # a bare Observation: nothing to show (it showed "{}")
    assert env.lookup(country="Japan") == "Tokyo"
    # a tool's own error and bad arguments are the tool's result, as MCP clients see them; the episode goes on
    assert env.lookup(country="Atlantis") == "error: Error calling tool 'lookup': Atlantis has sunk"
    assert env.lookup(nation="Japan").startswith("error: ") and not env.done and env.failure is None
    assert json.loads(env.country_facts(country="Japan", fields=["area"])) == {"country": "Japan", "area": "unknown"}
    # submit_answer: the environment's own step ends the episode with its reward (1.0: Tokyo is right)
    env.submit_answer(answer="Tokyo")
    assert env.done and env.get_reward() == 1.0
    env.close()
    wrong = cls()
    wrong.reset(country="kenya")
    wrong.submit_answer(answer="Mombasa")
    assert wrong.done and wrong.get_reward() == 0.0
    wrong.close()


def test_an_in_process_mcp_environment_offers_each_of_its_tools():
    _check_episode(resolve_environment(CapitalsEnvironment))


def test_a_served_mcp_environment_offers_each_of_its_tools(capitals_server):
    _check_episode(resolve_environment(capitals_server, timeout_s=10.0))


def test_the_tool_loop_calls_an_mcp_tool_by_its_name(capitals_server, tiny_chat_model_dir):
    tok = load_tokenizer(tiny_chat_model_dir)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    turns = {"r/0": [_call(tok, "lookup", '{"country": "France"}') + [stop],
                     _call(tok, "submit_answer", '{"answer": "Paris"}') + [stop], [stop]]}
    engine = ToolEngine(Scripted(turns, stop), tok, parser=parse_hermes, environment=resolve_environment(capitals_server),
                        rows=lambda r: {"country": "France"}, max_turns=5, tool_timeout_s=10.0)
    (t,) = generate_requests(engine, [Request("r/0", (1,), SamplingConfig(400))])
    assert [m["content"] for m in t.episode.conversation if m["role"] == "tool"] == ["Paris", ""]
    # two turns: the second call's step was done, so the episode ends there; reward 1.0
    assert t.episode.turns == 2 and t.episode.status == "ok" and t.episode.environment.get_reward() == 1.0


@pytest.mark.parametrize("fields, text", [
    ({"tool_name": "t", "result": None, "error": {"error_type": "timeout", "message": "took too long"}}, "error: took too long"),
    ({"tool_name": "t", "result": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                                   "data": "ab", "is_error": False}, "error": None}, "a\nb"),
    ({"tool_name": "t", "result": {"content": [], "data": {"x": 1}, "is_error": False}, "error": None}, '{"x": 1}'),
    ({"tool_name": "t", "result": {"content": [{"type": "text", "text": "bad"}], "is_error": True}, "error": None},
     "error: bad"),
    ({"tool_name": "t", "result": "plain", "error": None}, "plain"),
    ({"tool_name": "t", "result": None, "error": None}, ""),
])
def test_a_tool_result_reads_as_its_text(fields, text):
    assert render_tool_result(fields) == text


@pytest.mark.parametrize("observation, text", [
    # OpenEnv's own reasoning_gym_env: `question` on reset, `score`/`correct_answer` on the step, the others None
    ({"question": "How many legs?", "score": None, "correct_answer": None, "dataset_metadata": None}, "How many legs?"),
    ({"question": None, "score": 0.0, "correct_answer": "100", "dataset_metadata": None}, '{"score": 0.0, "correct_answer": "100"}'),
    ({"feedback": ""}, ""),  # one field, empty: its value
    ({"board": None}, ""),   # nothing set: nothing shown (it showed "null")
])
def test_an_observation_s_unset_fields_are_left_out(observation, text):
    assert render({"observation": {**observation, "done": False, "reward": None}}) == text
