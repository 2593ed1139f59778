"""Which modules this Python can import, and the closest ones to a name that it cannot: the one-line hint every import
path a config names ends with when it does not import (tools.environment, tools.functions, a reward function,
agent.environment's `verifiers:<id>`).

Where a module can come from, and so where the names are looked for:
- a directory on sys.path: the working directory, $PYTHONPATH, site-packages, and the directories `.pth` files add
  (a plain `pip install`, or an editable install whose `.pth` names the project's directory: hatchling's, which
  verifiers' `vf-init` scaffold uses, and setuptools' src-layout) (`pkgutil.iter_modules`);
- an editable install that setuptools (and uv, through it) wrote as an import hook: `__editable___<dist>_finder.py`
  beside a `.pth` that installs it, whose `MAPPING` dict names the modules; no directory on sys.path shows them, so
  the finder file is read (never imported) in every sys.path directory;
- the interpreter's built-in modules.
`distribution_modules(dist)` answers the same question for one installed distribution (its top_level.txt or RECORD,
and the two kinds of editable install above), for hints that only list a kind of package (verifiers environments).

`import_failure(module, exc)` words an ImportError: a module that is not there gets the closest names; a module that is
there but imports something that is not gets that name and `pip install` (not the misleading "is it on PYTHONPATH?").
Standard library only (it sits with the config, below every package that imports a user's module).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import pkgutil
import sys
from importlib import metadata
from pathlib import Path

EDITABLE_FINDER = "__editable___"  # setuptools' finder module: __editable___<dist>_<version>_finder.py


def finder_mapping(path: Path) -> dict[str, str]:
    """The `MAPPING = {module: directory}` of a setuptools editable finder file ({} when it has none), read as text."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "MAPPING" and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}


def _editable_modules(directories: list[str]) -> set[str]:
    names = set()
    for directory in directories:
        try:
            finders = list(Path(directory or ".").glob(f"{EDITABLE_FINDER}*_finder.py"))
        except OSError:
            continue
        for finder in finders:
            names |= {name.split(".")[0] for name in finder_mapping(finder)}
    return names


def importable_modules() -> set[str]:
    """Every top-level module name this interpreter can import (module docstring: where they are looked for)."""
    names = {m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
    names |= _editable_modules(sys.path)
    return {n for n in names if not n.startswith((EDITABLE_FINDER, "_"))}


def submodules(package: str) -> set[str]:
    """`package.x` for each module of an importable package (set() when it is not one)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return set()
    locations = list(spec.submodule_search_locations or []) if spec else []
    return {f"{package}.{m.name}" for m in pkgutil.iter_modules(locations)}


def distribution_modules(dist: metadata.Distribution) -> set[str]:
    """The top-level modules an installed distribution provides, its editable installs included: its top_level.txt,
    else the top-level names of its RECORD's files; and the modules of its editable finder or `.pth` directories."""
    declared = (dist.read_text("top_level.txt") or "").split()
    names = set(declared)
    for file in dist.files or []:
        path = Path(str(file))
        if path.name.startswith(EDITABLE_FINDER) and path.suffix == ".py":
            names |= {m.split(".")[0] for m in finder_mapping(Path(str(dist.locate_file(file))))}
        elif path.suffix == ".pth" and len(path.parts) == 1:
            names |= _pth_modules(Path(str(dist.locate_file(file))))
        elif not declared and len(path.parts) > 1:
            names.add(path.parts[0])
        elif not declared and path.suffix == ".py":
            names.add(path.stem)
    return {n for n in names if n.isidentifier() and not n.startswith(EDITABLE_FINDER)}


def _pth_modules(pth: Path) -> set[str]:
    """The modules in the directories a `.pth` file adds to sys.path (its lines that are not `import` statements)."""
    try:
        lines = pth.read_text(encoding="utf-8").splitlines()
    except OSError:
        return set()
    directories = [line.strip() for line in lines if line.strip() and not line.startswith(("#", "import ", "import\t"))]
    return {m.name for m in pkgutil.iter_modules([d for d in directories if Path(d).is_dir()])}


def closest(name: str, candidates: set[str] | list[str], n: int = 3) -> list[str]:
    """The `n` candidates closest to `name` (difflib's ratio >= 0.6; case ignored), closest first."""
    by_lower = {c.lower(): c for c in sorted(candidates)}
    return [by_lower[c] for c in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)]


def closest_modules(module: str, n: int = 3) -> list[str]:
    """The importable modules closest to `module` (a dotted one: among its importable parent's modules)."""
    parent, _, _ = module.rpartition(".")
    if parent and importlib.util.find_spec(parent.split(".")[0]) is not None:
        return closest(module, submodules(parent), n)
    return closest(module, importable_modules(), n)


def import_failure(module: str, exc: Exception) -> str:
    """Why `module` did not import, in words that say what to do: the closest importable names when it is not there, the
    missing dependency when it is there and its own import failed, the error when it raised another one."""
    missing = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and missing and not (module == missing or module.startswith(missing + ".")):
        return (f"{module!r} is there, but it imports {missing!r}, which is not installed (pip install "
                f"{missing.split('.')[0]}, or the package that provides it)")
    if not isinstance(exc, ModuleNotFoundError):
        return f"importing {module!r} raised {type(exc).__name__}: {exc}"
    module = missing or module  # (`a.b` where `a` is missing: the names closest to `a`)
    near = closest_modules(module)
    where = "can be imported here (the working directory, PYTHONPATH, installed packages, editable ones included)"
    return (f"no module {module!r} {where}; the closest: {', '.join(near)}" if near
            else f"no module {module!r} {where}; install it, or add its directory to PYTHONPATH")
