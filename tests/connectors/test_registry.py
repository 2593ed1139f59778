"""The connector registry: each spelling, old and new, picks its hub's connector; the one spelling is read into the
field the hub has always had; two spellings that disagree are refused naming both; and no hub is named where the
generic layers live (issue 60: trainer/, rollout/, tools/loop.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import cohort
from cohort.config import ConfigError, load_config
from cohort.connectors import CONNECTORS, Connector, chosen, connector_class, routed
from cohort.connectors.base import FIELDS
from cohort.connectors.gym import Gym
from cohort.connectors.openenv import OpenEnv
from cohort.connectors.reasoning_gym import ReasoningGym
from cohort.connectors.textarena import TextArena
from cohort.connectors.trl_class import TrlClass
from cohort.connectors.verifiers import Verifiers
from cohort.data import reasoning_gym
from cohort.plan.run_environment import RunEnvironment, run_data
from cohort.plan.validate import validate_config

ENVS = Path(__file__).resolve().parents[1] / "tools" / "envs"
ROOT = Path(cohort.__file__).resolve().parent


@pytest.fixture
def envs_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


# (the hub, its old field, the spelling): each spelled both ways must give the same connector
SPELLINGS = [
    (ReasoningGym, "data.task", "reasoning_gym:gcd"),
    (Verifiers, "agent.environment", "verifiers:cohort_vf_arith"),
    (TextArena, "agent.environment", "textarena:TicTacToe-v0"),
    (Gym, "tools.environment", "gym:FrozenLake-v1"),
    (OpenEnv, "tools.environment", "ws://127.0.0.1:9"),
    (OpenEnv, "tools.environment", "guess_env.GuessEnv"),  # an Environment subclass, claimed once imported
    (Gym, "tools.environment", "hangman_env.HangmanEnv"),  # a gymnasium.Env subclass, claimed once imported
    (TrlClass, "tools.environment", "trl_shape.EchoEnv"),  # any other class: TRL's environment_factory shape
]


@pytest.mark.parametrize("hub, field, spec", SPELLINGS, ids=[f"{h.__name__}:{s}" for h, _, s in SPELLINGS])
def test_each_spelling_old_and_new_picks_its_hub_and_reads_into_the_old_field(hub, field, spec, envs_path):
    old = chosen(load_config(None, [f"{field}={spec}"]))
    new_cfg, problems = routed(load_config(None, [f"environment={spec}"]))
    new = chosen(new_cfg)
    assert problems == []
    assert [type(c) for c in old] == [hub] and [type(c) for c in new] == [hub]
    assert old[0].field == field and old[0].named_by == field  # the old field named it
    assert new[0].named_by == "environment"
    section, name = field.split(".")
    assert getattr(getattr(new_cfg, section), name) == spec  # read into the hub's own field: every section keeps reading it


def test_a_built_in_task_has_no_connector_and_the_registry_is_one_interface():
    assert chosen(load_config(None, ["data.task=arith"])) == []
    assert chosen(load_config(None, ["data.task=reasoning_gym:gcd", "data.train_files=[x.jsonl]"])) == []  # own data wins
    assert all(issubclass(c, Connector) and c.runs in FIELDS for c in CONNECTORS)
    prefixes = [p for c in CONNECTORS for p in c.prefixes]
    assert len(prefixes) == len(set(prefixes))  # a prefix picks one hub
    assert CONNECTORS[-1] is TrlClass  # the catch-all is asked last
    assert connector_class("no_such_module.Env") is TrlClass  # (whose check then names the import's failure)


def test_environment_args_are_read_as_the_hub_s_own_config():
    cfg, problems = routed(load_config(None, ["environment=reasoning_gym:gcd", "environment_args.max_value=30"]))
    assert problems == [] and cfg.data.task_config == {"max_value": 30}
    cfg, problems = routed(load_config(None, ["environment=textarena:TicTacToe-v0", "environment_args.max_turns=9"]))
    assert problems == [] and cfg.agent.environment_args == {"max_turns": 9}
    # a tools environment owns the data when none is named: the built-in task is not its rows
    cfg, _ = routed(load_config(None, ["environment=gym:FrozenLake-v1"]))
    assert cfg.data.task is None


def test_two_spellings_that_disagree_are_refused_naming_both_fields():
    _, problems = routed(load_config(None, ["environment=gym:FrozenLake-v1", "tools.environment=gym:Taxi-v3"]))
    assert problems == ["environment = 'gym:FrozenLake-v1' and tools.environment = 'gym:Taxi-v3' name two environments; "
                        "keep one (environment is the one spelling; tools.environment the older one)"]
    _, problems = routed(load_config(None, ["environment=verifiers:x", "environment_args.a=1", "agent.environment_args.a=2"]))
    assert problems == ["environment_args = {'a': 1} and agent.environment_args = {'a': 2} give the environment two "
                        "configs; keep one (environment_args beside environment)"]
    _, problems = routed(load_config(None, ["environment=gym:FrozenLake-v1", "environment_args.is_slippery=false"]))
    assert problems == ["environment_args: Gymnasium environments are built with no arguments; unset environment_args"]
    # the same environment in both fields is one environment, not a conflict
    cfg, problems = routed(load_config(None, ["environment=gym:FrozenLake-v1", "tools.environment=gym:FrozenLake-v1"]))
    assert problems == [] and len(chosen(cfg)) == 1
    # and validation refuses the conflict before anything loads, in one line naming both fields
    with pytest.raises(ConfigError, match=r"environment = 'textarena:TicTacToe-v0' and agent.environment = 'verifiers:x' "
                                          r"name two environments"):
        validate_config(load_config(None, ["environment=textarena:TicTacToe-v0", "agent.environment=verifiers:x"]),
                        check_files=False)


def test_a_hub_in_a_field_it_does_not_read_is_refused_with_the_one_spelling():
    problems = RunEnvironment(load_config(None, ["agent.environment=gym:FrozenLake-v1"])).problems()
    assert problems == ["agent.environment = 'gym:FrozenLake-v1' names a Gymnasium environment, which tools.environment "
                        "takes; agent.environment takes verifiers:<...>, textarena:<...>: write it as environment: "
                        "gym:FrozenLake-v1"]


def test_a_reasoning_gym_task_is_built_once_and_carried_in_the_plan(monkeypatch):
    builds, real = [], reasoning_gym.build_task
    monkeypatch.setattr(reasoning_gym, "build_task", lambda *a, **k: (builds.append(a[0]), real(*a, **k))[1])
    plan = validate_config(load_config(None, ["environment=reasoning_gym:gcd", "data.task_size=8", "data.task_eval_size=4",
                                              "rollout.max_completion_length=16"]), check_files=False)
    train, evals, specs = run_data(plan.config, plan.environment)  # what the trainer and `cohort eval` read
    run_data(plan.config, plan.environment)
    assert builds == ["reasoning_gym:gcd"]  # once, by the connector the plan carries (no per-process cache)
    assert len(train.rows) <= 8 and len(evals.rows) == 4 and specs[0]["name"] == "reasoning_gym"


HUB_NAMES = re.compile(r"verifiers|openenv|gym|reasoning.gym|textarena", re.IGNORECASE)


def test_no_hub_is_named_in_the_trainer_the_rollout_layer_or_the_tool_loop():
    files = sorted((ROOT / "trainer").rglob("*.py")) + sorted((ROOT / "rollout").rglob("*.py")) + [ROOT / "tools" / "loop.py"]
    named = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if HUB_NAMES.search(line)]
    assert named == []


def test_the_openenv_prefix_is_optional_and_names_the_same_environment(envs_path):
    from cohort.connectors import resolve_environment

    assert connector_class("openenv:guess_env.GuessEnv") is OpenEnv
    plain, prefixed = resolve_environment("guess_env.GuessEnv"), resolve_environment("openenv:guess_env.GuessEnv")
    assert plain.__name__ == prefixed.__name__ == "OpenEnvEpisode[GuessEnv]"
    episode = prefixed()
    episode.reset(target=2)
    assert episode.step(guess=2) and episode.get_reward() == 1.0  # (the test environment's reward for the right guess)
