"""The chat template a run renders with: `model.chat_template` and `model.chat_template_kwargs`, applied to the tokenizer
once, where it is loaded, so every rendering reads them (prompts, the tool loop's tool turns, eval, the agent endpoint,
`cohort serve`, and the checkpoint saved with the tokenizer).

- `model.chat_template` (`template_text`): a path to a Jinja file (`~` expanded; relative to the working directory),
  or the name of a template file inside the checkpoint directory as transformers stores them (`chat_template.jinja`,
  `additional_chat_templates/x.jinja`). The tokenizer's `chat_template` becomes that text; `save_pretrained` then
  writes it beside the trained weights, so the checkpoint keeps the template it was trained with.
- `model.chat_template_kwargs` (`with_defaults`): keyword arguments of the template (`{enable_thinking: false}`), as
  TRL's `chat_template_kwargs` and vLLM's `--chat-template-kwargs`. They are written at the head of the template as
  defaults, `{%- if enable_thinking is not defined %}{%- set enable_thinking = false %}{%- endif %}`, so every caller
  of `apply_chat_template` renders with them without being told, and a keyword a caller passes still wins. (Jinja's
  `set` at the top level, outside a loop or macro, sets a template-wide variable.)

`renders_tools(tokenizer)` asks whether the template has a tools block: a probe tool with a distinctive name and
description is rendered with `tools=` and both must appear in the text (a template that ignores `tools` drops them).

Left out: a template by Hub name or URL (a file here, or one in the checkpoint); multimodal processors' templates.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

KWARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PROBE_TOOL = {"type": "function", "function": {
    "name": "cohort_probe_tool", "description": "Cohort probe description 7341.",
    "parameters": {"type": "object", "properties": {"cohort_probe_arg": {"type": "integer", "description": "An argument."}},
                   "required": ["cohort_probe_arg"]}}}
TOOLS_FIX = ("name a template that renders tools as model.chat_template (a Jinja file, e.g. TRL's chat_templates/qwen3.jinja "
             "from `pip download trl --no-deps`, or a file inside the checkpoint)")


class ChatTemplateError(ValueError):
    """model.chat_template or model.chat_template_kwargs cannot be used; the message names the field and the fix."""


def template_file(spec: str, model_dir: str | Path | None) -> Path:
    """The Jinja file `spec` names: a file at that path, else one of that name inside the checkpoint directory."""
    own = Path(spec).expanduser()
    if own.is_file():
        return own
    inside = Path(model_dir) / spec if model_dir is not None else None
    if inside is not None and inside.is_file():
        return inside
    where = f" nor inside the checkpoint {model_dir}" if model_dir is not None else ""
    listed = sorted(str(p.relative_to(model_dir)) for p in Path(model_dir).rglob("*.jinja")) if inside is not None else []
    have = f" (its template files: {', '.join(listed)})" if listed else ""
    raise ChatTemplateError(f"model.chat_template = {spec!r}: no such file here{where}{have}; give a path to a Jinja file "
                            "or the name of one inside the checkpoint directory (chat_template.jinja, "
                            "additional_chat_templates/<name>.jinja)")


def jinja_literal(value: Any, where: str) -> str:
    """`value` (a YAML scalar, list or mapping) as a Jinja literal."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(jinja_literal(v, where) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{jinja_literal(str(k), where)}: {jinja_literal(v, where)}" for k, v in value.items()) + "}"
    raise ChatTemplateError(f"{where} = {value!r} is a {type(value).__name__}; give a string, number, boolean, list or mapping")


def with_defaults(template: str, kwargs: dict[str, Any]) -> str:
    """`template` with `kwargs` as its variables' defaults, written at its head (module docstring)."""
    head = []
    for name, value in kwargs.items():
        if not isinstance(name, str) or not KWARG_NAME.match(name):
            raise ChatTemplateError(f"model.chat_template_kwargs: {name!r} is not a template variable name (letters, "
                                    "digits and _, e.g. enable_thinking)")
        literal = jinja_literal(value, f"model.chat_template_kwargs.{name}")
        head.append(f"{{%- if {name} is not defined %}}{{%- set {name} = {literal} %}}{{%- endif %}}")
    return "".join(head) + template


def apply_chat_template_config(tokenizer, model_dir: str | Path | None, chat_template: str | None,
                               chat_template_kwargs: dict[str, Any] | None) -> None:
    """Set the tokenizer's template from model.chat_template (a file) and model.chat_template_kwargs, in place."""
    if chat_template is not None:
        path = template_file(chat_template, model_dir)
        try:
            tokenizer.chat_template = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"model.chat_template = {chat_template!r}: cannot read {path} ({exc})") from exc
    if chat_template_kwargs:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("model.chat_template_kwargs is set but the tokenizer has no chat template; name one "
                                    "as model.chat_template")
        template = tokenizer.chat_template  # a checkpoint with named templates holds them all: each gets the defaults
        tokenizer.chat_template = ({name: with_defaults(text, chat_template_kwargs) for name, text in template.items()}
                                   if isinstance(template, dict) else with_defaults(template, chat_template_kwargs))


def renders_tools(tokenizer) -> bool:
    """True when the chat template writes a tool's name and description into the prompt (`tools=`)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tools=[PROBE_TOOL], tokenize=False,
                                             add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that fails on tools= does not render them
        return False
    function = PROBE_TOOL["function"]
    return function["name"] in text and function["description"] in text
