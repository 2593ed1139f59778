"""Every config field as a row (key, type, default, help): the source of `cohort train --help`, the README's
configuration reference (cohort.docs) and `cohort convert`'s field checks. Reads cohort.config only."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from cohort.config.schema import CohortConfig


def describe_fields() -> list[tuple[str, str, str, str]]:
    """(key, type, default, help) for every field, in declaration order."""
    rows = []
    for section, field in CohortConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for name, sub in ann.model_fields.items():
                default = sub.get_default(call_default_factory=True)
                rows.append((f"{section}.{name}", _type_name(sub.annotation), repr(default), sub.description or ""))
        else:  # a top-level field (environment, rewards)
            default = field.get_default(call_default_factory=True)
            rows.append((section, _type_name(field.annotation), repr(default), field.description or ""))
    return rows


def fields_of(section: Any) -> list[str]:
    """The field names of one section ([] for `rewards` or an unknown name)."""
    field = CohortConfig.model_fields.get(str(section))
    ann = getattr(field, "annotation", None) if field else None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return list(ann.model_fields)
    return []


def _type_name(ann: Any) -> str:
    text = str(ann).replace("typing.", "")
    return text.replace("<class '", "").replace("'>", "")
