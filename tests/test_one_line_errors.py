"""Failures a user meets first end in one line with the fix on the console, the traceback only in the run's logs
(issue 53, defects 11 and 12): the whole of a long refusal reaches the console (an OpenEnv server with too few
sessions), and only the real cause of an environment that fails to import is printed. Each runs the command line
(`cohort.cli.main`) and reads what it printed."""

from __future__ import annotations

import importlib
import json
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from cohort import cli
from cohort.trainer import failure

from tests.tools.test_openenv import free_port, serve_guess


def _rows(path: Path, n: int = 4) -> str:
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Guess {i}."}], "target": i % 4}) + "\n"
                            for i in range(n)))
    return str(path)


def test_a_long_failure_line_is_kept_whole_up_to_its_fix_and_a_dump_keeps_both_ends():
    fix = "Serve it with create_app(..., max_concurrent_envs=16)"
    refusal = ValueError("x" * 900 + fix)  # 900 + 52 characters: over the old 300-character cut, under 2,000
    assert failure.describe(refusal) == f"ValueError: {'x' * 900}{fix}"
    dump = failure.describe(RuntimeError("a" * 1000 + "b" * 3000 + "c" * 1000))  # 5,000 + "RuntimeError: " (14)
    # the first 600 characters ("RuntimeError: " + 586 a's) and the last 600 (c's), 5,014 - 1,200 = 3,814 left out
    assert dump == f"RuntimeError: {'a' * 586} ... (3,814 characters left out) ... {'c' * 600}"


@pytest.mark.slow  # starts an OpenEnv server under uvicorn (~20 s under load)
@pytest.mark.builtin_models("tool_calc")
def test_the_openenv_capacity_refusal_reaches_the_console_with_its_fix(tmp_path, capsys):
    port = free_port()
    server = serve_guess(port, sessions=1)  # openenv's create_app(..., max_concurrent_envs=1)
    try:
        code = cli.main(["train", "model.path=tiny:tool_calc", f"data.train_files=[{_rows(tmp_path / 'rows.jsonl')}]",
                         f"tools.environment=ws://127.0.0.1:{port}", "tools.parser=hermes", "rewards=[]",
                         "rollout.num_generations=2", "train.prompts_per_step=2", "train.micro_batch_size=4",
                         "rollout.max_completion_length=16", "run.eval_every=0", f"run.output_dir={tmp_path / 'run'}",
                         "tools.in_prompt=false"])  # (tiny:tool_calc: 128 positions, no room for a tools block)
    finally:
        server.kill()
        server.wait()
    err = capsys.readouterr().err
    assert code == 2  # a config problem found before any weights load, not a run failure (exit 4 until issue 60)
    # 2 prompts × 2 completions = 4 sessions open at once; the server takes 1
    (line,) = _problems(err)
    assert "accepted 1 of the 4" in line
    assert line.endswith("Serve it with `create_app(MyEnv, MyAction, MyObservation, max_concurrent_envs=4)` and set "
                         "`SUPPORTS_CONCURRENT_SESSIONS = True` on the environment class (only if its instances share no "
                         "state), or lower train.prompts_per_step")
    assert not (tmp_path / "run" / "logs" / "error.log").exists()


# --------------------------------------------------------------------------- defect 11: a misspelt module, one line


ROOT = Path(__file__).resolve().parents[1]
TOOL_CALC = str(ROOT / "examples" / "tool_calc.yaml")

# A TRL environment_factory class as TRL's docs write one (reset(**kwargs) -> str | None; public methods are tools,
# typed, with a docstring's Args:), and a reward function in TRL's shape, in a module on sys.path.
NUMBER_GUESS = '''
class GuessEnv:
    def reset(self, **kwargs) -> str | None:
        self.target, self.reward = int(kwargs.get("target", 0)), 0.0
        return None

    def guess(self, number: int) -> str:
        """Guess the hidden number.

        Args:
            number: the number you guess
        """
        self.reward = float(number == self.target)
        return "right" if self.reward else "wrong"


def reward(completions, **kwargs):
    return [0.0 for _ in completions]
'''


def _problems(err: str) -> list[str]:
    """The problem lines of a refused config (`  - ...`), after checking nothing else but the header was printed."""
    assert "Traceback" not in err
    return [line[4:] for line in err.splitlines() if line.startswith("  - ")]


@pytest.mark.builtin_models("tool_calc")
def test_a_misspelt_environment_or_reward_module_on_the_path_names_the_closest_one(tmp_path, monkeypatch, capsys):
    (tmp_path / "number_guess.py").write_text(NUMBER_GUESS)
    monkeypatch.syspath_prepend(str(tmp_path))  # (as PYTHONPATH puts it there)
    code = cli.main(["plan", TOOL_CALC, "tools.environment=number_gues.GuessEnv", "rewards=[{name: number_gess.reward}]"])
    assert code == 2
    where = "can be imported here (the working directory, PYTHONPATH, installed packages, editable ones included)"
    reward, environment = sorted(_problems(capsys.readouterr().err))
    # (closest first; the standard library's `numbers` may follow: difflib's ratio 0.8 for number_gess)
    assert reward.startswith(f"rewards[0] (name = 'number_gess.reward'): unknown reward 'number_gess.reward' (no module "
                             f"'number_gess' {where}; the closest: number_guess")
    assert environment.startswith(f"tools.environment 'number_gues.GuessEnv': no module 'number_gues' {where}; the "
                                  "closest: number_guess")


@pytest.mark.builtin_models("tool_calc")
def test_an_environment_that_fails_to_import_prints_only_its_cause(tmp_path, monkeypatch, capsys):
    (tmp_path / "guess_with_numpy2.py").write_text("import not_installed_dep\n" + NUMBER_GUESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    # rewards = []: the environment's get_reward() would be the reward; whether it has one cannot be known, so the
    # 'rewards = []: at least one reward function is needed' line was a second, misleading one
    assert cli.main(["plan", TOOL_CALC, "tools.environment=guess_with_numpy2.GuessEnv", "rewards=[]"]) == 2
    assert _problems(capsys.readouterr().err) == [
        "tools.environment 'guess_with_numpy2.GuessEnv': 'guess_with_numpy2' is there, but it imports 'not_installed_dep', "
        "which is not installed (pip install not_installed_dep, or the package that provides it)"]
    # a module that raises as it imports (an API key read at import time): its error, not a traceback
    (tmp_path / "guess_online.py").write_text("raise RuntimeError('GUESS_API_KEY is not set')\n" + NUMBER_GUESS)
    assert cli.main(["plan", TOOL_CALC, "tools.environment=guess_online.GuessEnv", "rewards=[]"]) == 2
    assert _problems(capsys.readouterr().err) == [
        "tools.environment 'guess_online.GuessEnv': importing 'guess_online' raised RuntimeError: GUESS_API_KEY is not set"]


# --------------------------------------------------------------------------- editable installs, really installed

SETUPTOOLS_PROJECT = '''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "number-guess-env"
version = "0.1"

[tool.setuptools]
packages = ["number_guess_env"]
'''


@pytest.fixture
def editable(tmp_path, monkeypatch):
    """install(project) -> `pip install -e project` into a prefix under tmp_path (offline: --no-build-isolation with
    the build backends of this venv), its site-packages then added as Python adds one at start-up (`site.addsitedir`
    runs its .pth files: setuptools' finder is installed, hatchling's directory put on sys.path). The interpreter's
    import state is restored afterwards."""
    for name in ("path", "meta_path", "path_hooks"):
        monkeypatch.setattr(sys, name, list(getattr(sys, name)))
    monkeypatch.setattr(sys, "path_importer_cache", dict(sys.path_importer_cache))
    before = set(sys.modules)

    def install(project: Path) -> None:
        prefix = tmp_path / "prefix"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "--prefix", str(prefix), "-e", str(project)], check=True, capture_output=True)
        site.addsitedir(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
        importlib.invalidate_caches()

    yield install
    for name in set(sys.modules) - before:
        if name.startswith(("number_guess", "guess_games", "__editable__", "_editable")):
            del sys.modules[name]


@pytest.mark.slow  # two pip installs and verifiers' scaffold (~30 s under load)
def test_misspelt_names_find_editable_installs_and_an_environment_that_raises_is_one_line(
        tmp_path, editable, tiny_chat_model_dir, monkeypatch, capsys):
    # setuptools' editable install of a flat layout: an __editable___*_finder.py import hook, no sys.path entry
    project = tmp_path / "number-guess-env"
    (project / "number_guess_env").mkdir(parents=True)
    (project / "pyproject.toml").write_text(SETUPTOOLS_PROJECT)
    (project / "number_guess_env" / "__init__.py").write_text(NUMBER_GUESS)
    editable(project)
    assert list((tmp_path / "prefix").rglob("__editable___number_guess_env_0_1_finder.py"))
    # a verifiers environment as verifiers' own `vf-init` scaffolds it (hatchling; `uv pip install -e` as it says)
    from verifiers.v1.cli.init import main as vf_init

    vf_init(["guess-games", "--path", str(tmp_path / "environments")])
    editable(tmp_path / "environments" / "guess_games")
    assert list((tmp_path / "prefix").rglob("_editable_impl_guess_games.pth"))
    monkeypatch.chdir(tmp_path)

    assert cli.main(["plan", TOOL_CALC, "tools.environment=number_guess_evn.GuessEnv"]) == 2
    (line,) = _problems(capsys.readouterr().err)
    assert line.startswith("tools.environment 'number_guess_evn.GuessEnv': no module 'number_guess_evn' can be imported "
                           "here (the working directory, PYTHONPATH, installed packages, editable ones included); the "
                           "closest: number_guess_env")

    local = ["agent.environment_args.agent.harness.id=null", "agent.environment_args.agent.runtime.type=subprocess",
             f"model.path={tiny_chat_model_dir}", "rollout.max_completion_length=16", f"run.output_dir={tmp_path / 'run'}"]
    assert cli.main(["plan", "agent.environment=verifiers:guess_gmes", *local]) == 2
    assert _problems(capsys.readouterr().err) == ["agent.environment = 'verifiers:guess_gmes': no verifiers environment "
                                                  "module 'guess_gmes' is installed; the closest installed: guess_games"]
    # the scaffold's taskset raises until its author writes load(): found while reading the rows, after the checks
    assert cli.main(["plan", "agent.environment=verifiers:guess_games", *local]) == 2
    log = tmp_path / "run" / "logs" / "error.log"
    assert _problems(capsys.readouterr().err) == [
        "agent.environment = 'verifiers:guess_games': loading its tasks raised NotImplementedError: Return this taskset's "
        "tasks, e.g. [GuessGamesTask(GuessGamesData(prompt=...), self.config.task) for i in range(self.config.num_tasks)]. "
        f"(the traceback: {log})"]
    assert "Traceback (most recent call last)" in log.read_text() and "NotImplementedError" in log.read_text()
