"""cohort never sets the user's Hugging Face or wandb environment: read from the source, as it is shipped."""

from __future__ import annotations

import re
from pathlib import Path

import cohort

ROOT = Path(cohort.__file__).resolve().parent
USERS_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "HF_TOKEN",
                   "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY")
# os.environ["X"] = ..., os.environ.setdefault("X", ...), os.environ.update(X=...) / ({"X": ...}), os.putenv("X", ...),
# a dict literal {"X": ...} (an environment built for a child or an actor), `export X` in a Makefile
WRITES = [r'environ\[\s*["\']{name}["\']\s*\]\s*=', r'setdefault\(\s*["\']{name}["\']', r'update\([^)]*\b{name}\s*=',
          r'putenv\(\s*["\']{name}["\']', r'["\']{name}["\']\s*:\s*os\.environ\.get\(\s*["\']{name}["\']\s*,',
          r'^\s*export\s+{name}\b']


ANY_WRITE = re.compile("|".join(f"(?:{p.format(name=n)})" for n in USERS_VARIABLES for p in WRITES), re.MULTILINE)


def writes_in(text: str) -> list[str]:
    """Each write of one of USERS_VARIABLES in `text`, as the text matched."""
    return [match.group(0).strip() for match in ANY_WRITE.finditer(text)]


def test_nothing_in_cohort_sets_the_users_hub_or_wandb_variables():
    found = {str(p.relative_to(ROOT.parent)): w for p in sorted(ROOT.rglob("*.py")) if (w := writes_in(p.read_text()))}
    makefile = ROOT.parent / "Makefile"
    if makefile.is_file():
        found.update({"Makefile": w} if (w := writes_in(makefile.read_text())) else {})
    assert found == {}


def test_the_check_finds_what_cohort_used_to_write():
    """The patterns catch each form the product once used (cli.py, ray_cluster.py, loggers.py, the Makefile)."""
    assert writes_in('os.environ.setdefault("HF_HUB_OFFLINE", "1")')
    assert writes_in('"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),')
    assert writes_in('os.environ.setdefault("WANDB_MODE", "offline")')
    assert writes_in("export HF_HUB_OFFLINE ?= 1\nexport TRANSFORMERS_OFFLINE ?= 1")
    assert not writes_in('**{name: os.environ[name] for name in USER_ENV if name in os.environ}')
