"""cohort's imports, read from the source: no circles, and every arrow points down the layering.

Every .py under cohort/ is parsed (nothing is imported) and every `import` / `from`
statement at any depth (module top, inside functions, under TYPE_CHECKING) becomes an
arrow to the cohort module it names (`from cohort.x import y` names cohort.x.y when that
is a module, else cohort.x). The root package `cohort` is left out: its only import is the
lazy `cohort.train` attribute (cohort/__init__.py), and every import of a submodule runs it.

Checked:
- no cycle between modules, and none between packages (cohort.trainer, cohort.config, ...:
  a top-level module is its own package);
- `LAYERS` (docs/architecture.md): an arrow between packages points to a lower layer or the
  same one, never up; cohort.algorithms imports only torch, the standard library and itself;
- the sizes (docs/STYLE: small modules): no module over MAX_MODULE_LINES lines, no function or method over
  MAX_FUNCTION_LINES (from its `def` line to its last line, docstring included, decorators not).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import cohort

ROOT = Path(cohort.__file__).resolve().parent

# Lowest first. A package may import packages of its own layer or below (docs/architecture.md says why each sits where).
LAYERS = [
    {"cohort.console", "cohort.mapping", "cohort.algorithm_facts"},  # terminal output, verl/TRL option tables, the algorithms' facts: import no other cohort package
    {"cohort.config", "cohort.runs"},  # the typed config (pydantic only), loading and overrides, old names, the field table, the demo preset; what writes and reads a run directory
    {"cohort.algorithms"},  # pure tensor maths behind registries
    {"cohort.data"},  # datasets, built-in tasks, the repeat sampler
    {"cohort.models"},  # loading models and tokenizers, the tiny models, log-prob kernels, batch packing
    {"cohort.rewards"},  # reward functions, registry, sandbox
    {"cohort.rollout", "cohort.tools"},  # engines (vLLM, transformers, remote), the rollout server; the tool loop over them
    {"cohort.agents"},  # the OpenAI-compatible chat endpoint over any engine's requests; agent functions as rollouts
    {"cohort.connectors"},  # the hubs of tasks and environments, one module each behind one interface, and their registry
    {"cohort.prompts"},  # prompts as token ids under the model's length limit (before any weights load)
    {"cohort.plan", "cohort.convert"},  # every check of a config; the batch plan, memory estimate and printout; `cohort convert`
    {"cohort.distributed"},  # process groups, FSDP, rank 0's engine and rewards: no trainer
    {"cohort.trainer"},  # the driver loop and what it builds
    {"cohort.launch"},  # whatever runs a Trainer elsewhere: torchrun, Ray actors
    {"cohort.cli", "cohort.__main__", "cohort.api", "cohort.docs"},  # the command line (and `python -m cohort`), the Python API, the docs generator
]

# Known exceptions to the layering (none: the config package sits at the bottom since issue 40 and imports no checks). An entry here
# is a debt, with the issue that pays it in a comment.
KNOWN_EDGES: set[tuple[str, str]] = set()

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported_names(tree: ast.AST, module: str, is_package: bool, modules: set[str] = frozenset()) -> set[str]:
    """Every dotted name an import statement anywhere in `tree` names: `from a import b` gives a.b when that is one of
    `modules`, else a (the attribute b of a)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one level up per extra dot
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                names.add(f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix)
    return names


def resolve(name: str, modules: set[str]) -> str | None:
    """The cohort module `name` refers to: the longest known module it starts with (None: not cohort's, or the root)."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the cohort modules it imports (the root package `cohort` left out, see the module docstring)."""
    modules = all_modules()
    known = set(modules) - {"cohort"}
    graph: dict[str, set[str]] = {}
    for name in sorted(known):
        path = modules[name]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = {resolve(n, known) for n in imported_names(tree, name, path.name == "__init__.py", known)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def package_of(module: str) -> str:
    """cohort.trainer.loop -> cohort.trainer; a top-level module (cohort.config) is its own package."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for source, targets in graph.items():
        here = package_of(source)
        out.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search; gray = on the current path)."""
    color: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if color.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in color and (found := visit(nxt)):
                return found
        path.pop()
        color[node] = 2
        return None

    for start in sorted(graph):
        if start not in color and (found := visit(start)):
            return found
    return None


def without_known(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {source: {t for t in targets if (source, t) not in KNOWN_EDGES and (package_of(source), package_of(t)) not in KNOWN_EDGES}
            for source, targets in graph.items()}


def layer_of(package: str) -> int:
    for rank, layer in enumerate(LAYERS):
        if package in layer:
            return rank
    raise AssertionError(f"{package} is in no layer of tests/test_imports.py LAYERS; add it (and to docs/architecture.md)")


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a module in a higher layer than the importer's."""
    bad = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            pair = (package_of(source), package_of(target))
            if pair not in KNOWN_EDGES and layer_of(pair[1]) > layer_of(pair[0]):
                bad.append(f"{source} -> {target}")
    return bad


# --------------------------------------------------------------------------- the finder itself


def test_the_cycle_finder_reports_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"z"}, "z": {"y"}}) == ["y", "z", "y"]  # the cycle, without the path into it


def test_relative_and_from_imports_resolve_to_modules():
    modules = {"cohort.trainer", "cohort.trainer.loop", "cohort.trainer.setup", "cohort.config"}
    tree = ast.parse("from . import setup\nfrom ..config import X\nimport cohort.trainer.loop as loop\n"
                     "def f():\n    from cohort.trainer import setup as s\n")
    names = imported_names(tree, "cohort.trainer.loop", is_package=False, modules=modules)
    # `from . import setup` and `from cohort.trainer import setup` name the module, not the package's __init__
    assert {resolve(n, modules) for n in names} - {None} == {"cohort.trainer.setup", "cohort.config", "cohort.trainer.loop"}


def test_an_upward_arrow_and_a_package_cycle_are_found():
    graph = {"cohort.rollout.engines.hf": {"cohort.trainer.loop"}, "cohort.trainer.loop": set()}
    assert upward_arrows(graph) == ["cohort.rollout.engines.hf -> cohort.trainer.loop"]
    # modules without a cycle, packages with one: trainer.loop -> distributed.rank0 -> trainer.setup
    graph = {"cohort.trainer.loop": {"cohort.distributed.rank0"}, "cohort.distributed.rank0": {"cohort.trainer.setup"},
             "cohort.trainer.setup": set()}
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph)) == ["cohort.distributed", "cohort.trainer", "cohort.distributed"]


# --------------------------------------------------------------------------- cohort's own imports


def test_no_module_imports_itself_back():
    cycle = find_cycle(without_known(import_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_package_imports_itself_back():
    cycle = find_cycle(without_known(package_graph(import_graph())))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or [])


def test_every_arrow_points_down_the_layers():
    assert upward_arrows(import_graph()) == []


def test_algorithms_import_only_torch_and_the_standard_library():
    # (and cohort.algorithm_facts: each algorithm's facts as pure data, which the torch-free planner reads too)
    allowed = set(sys.stdlib_module_names) | {"torch", "cohort"}
    for name, path in all_modules().items():
        if package_of(name) != "cohort.algorithms":
            continue
        names = imported_names(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py")
        foreign = sorted(n for n in names if n.split(".")[0] not in allowed
                         or (n.startswith("cohort.") and package_of(n) not in ("cohort.algorithms", "cohort.algorithm_facts")))
        assert foreign == [], f"{name} imports {foreign}"


@pytest.mark.parametrize("package", ["cohort.rollout", "cohort.rewards"])
def test_rollout_and_rewards_never_import_the_trainer(package):
    graph = import_graph()
    assert sorted(f"{s} -> {t}" for s, ts in graph.items() if package_of(s) == package for t in ts
                  if package_of(t) == "cohort.trainer") == []


def test_nothing_below_the_command_line_imports_it():
    top = {"cohort.cli", "cohort.__main__", "cohort.api", "cohort.launch"}
    graph = import_graph()
    assert sorted(f"{s} -> {t}" for s, ts in graph.items() if package_of(s) not in top | {"cohort.docs"} for t in ts
                  if package_of(t) in top) == []


# --------------------------------------------------------------------------- sizes


def oversized(source: str, name: str) -> list[str]:
    """'NAME: N lines' for a module over MAX_MODULE_LINES, 'NAME.FUNCTION: N lines' for each function over
    MAX_FUNCTION_LINES (methods and nested functions by their qualified name)."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES}: split it by idea)")

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualified = f"{prefix}.{child.name}"
                length = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > MAX_FUNCTION_LINES:
                    found.append(f"{qualified}: {length} lines (at most {MAX_FUNCTION_LINES}: a long function is "
                                 "usually two ideas)")
                visit(child, qualified)
            else:
                visit(child, prefix)

    visit(ast.parse(source), name)
    return found


def test_the_size_check_names_each_long_function_and_module():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))  # def line + 59 = 60 lines: at the limit, not over
    method = "".join(f"    {line}\n" for line in body.splitlines()) + "        y = 1\n"  # def line + 60 = 61: over
    source = f"def fits():\n{body}\nclass C:\n    def long(self):\n{method}"
    assert oversized(source, "m") == ["m.C.long: 61 lines (at most 60: a long function is usually two ideas)"]
    assert oversized("x = 1\n" * 601, "big") == ["big: 601 lines (at most 600: split it by idea)"]
    assert oversized("x = 1\n" * 600, "ok") == []


def test_no_module_over_600_lines_and_no_function_over_60():
    found = [problem for name, path in all_modules().items()
             for problem in oversized(path.read_text(encoding="utf-8"), name)]
    assert found == []


# --------------------------------------------------------------------------- the rollout layer knows no connector


def connector_classes() -> set[str]:
    """The names of the public classes that cohort/tools and cohort/agents define at their modules' top level (the tool
    loop's `Episode`, `ToolEngine`, the agent path's `AgentRun`, `AgentEngine`, ...; a private `_Handler` may be
    anyone's)."""
    names = set()
    for name, path in all_modules().items():
        if package_of(name) in ("cohort.tools", "cohort.agents"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names.update(node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_"))
    return names


def code_names(tree: ast.AST) -> set[str]:
    """Every name the code (not its docstrings or comments) uses: variables, attributes, imported names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
    return names


def test_the_rollout_layer_names_no_connector():
    # cohort/rollout reads multi-turn records through `EpisodeRecord` only (issue 53, "the seam"): no import of the
    # connectors' packages, and none of their classes named in its code (an isinstance dispatch would name one).
    graph = import_graph()
    assert sorted(f"{s} -> {t}" for s, ts in graph.items() if package_of(s) == "cohort.rollout" for t in ts
                  if package_of(t) in ("cohort.tools", "cohort.agents")) == []
    connectors = connector_classes()
    assert {"Episode", "AgentRun", "ToolEngine"} <= connectors  # (the check sees the connectors' classes)
    named = {name: sorted(code_names(ast.parse(path.read_text(encoding="utf-8"))) & connectors)
             for name, path in all_modules().items() if package_of(name) == "cohort.rollout"}
    assert {name: found for name, found in named.items() if found} == {}
