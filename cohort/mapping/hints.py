"""The cohort spelling of a verl or TRL key written where a cohort key belongs (`foreign_key_hint`).

cohort.config.resolve calls it when it refuses an unknown key (a dotted override or a YAML key), so
`cohort train actor_rollout_ref.rollout.n=8` stops before anything loads with one line naming
`rollout.num_generations`. It reads the same tables `cohort convert` applies, and imports
nothing of cohort beyond them (they import nothing of cohort), so `import cohort.config.resolve` stays light.
"""

from __future__ import annotations

from cohort.mapping.rules import Rule
from cohort.mapping.trl_rules import TRL_RULES
from cohort.mapping.verl_rules import VERL_RULES

SOURCES: tuple[tuple[str, tuple[Rule, ...], str], ...] = (("verl", VERL_RULES, "script"), ("TRL", TRL_RULES, "config"))


def _rule_for(rules: tuple[Rule, ...], key: str) -> Rule | None:
    for rule in rules:
        if rule.source == key or (rule.source.endswith(".*") and key.startswith(rule.source[:-1])):
            return rule
    return None


def foreign_key_hint(key: str) -> str | None:
    """One line naming cohort's spelling of `key` when it is a verl or TRL option (or a verl section); else None."""
    for name, rules, whole in SOURCES:
        rule = _rule_for(rules, key)
        if rule is None:
            continue
        tail = f" (or run `cohort convert` on the whole {whole})"
        if not rule.targets:
            return f"{key} is {name}'s name: cohort has no counterpart: {rule.note}{tail}"
        note = f" ({rule.note})" if rule.note else ""
        return f"{key} is {name}'s name: cohort calls it {' and '.join(rule.targets)}{note}{tail}"
    for name, rules, whole in SOURCES:
        if any(rule.source.startswith(key + ".") for rule in rules):
            return (f"{key} is a section of {name}'s config, not of cohort's: run `cohort convert` on the whole {whole} "
                    f"(it writes a cohort YAML and names each option's cohort spelling)")
    return None
