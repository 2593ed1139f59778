"""Reading a launch script as bash would, for what the script itself sets: commands split into words, variables expanded.

`Shell(environ).commands(text)` yields each simple command of a script as its list of words,
after bash's own steps, in order, remembering assignments as it goes:
- logical lines: a backslash-newline joins lines; a newline inside quotes does not end the command
  (a multi-line `VAR="..."`); `#` at the start of a word begins a comment;
- quoting: '...' literal; "..." with `$` expansions and `\\"`-style escapes; a backslash outside quotes
  takes the next character literally;
- expansions: `$NAME`, `${NAME}`, `${NAME:-word}` / `${NAME-word}` / `${NAME:=word}` / `${NAME:+word}`
  with `word` expanded in turn (nested defaults, quotes removed), `${NAME/old/new}` and `${NAME//old/new}`
  with a literal pattern, `$((...))` integer arithmetic (+ - * / % **,
  parentheses, names with or without `$`; `/` truncates toward zero as bash's does);
- word splitting: an unquoted expansion is split on whitespace (a variable holding several options, used
  as `$OPTS`, gives several words); a quoted one stays one word;
- assignments (`A=1 B=2`, `export A=1`, `local`, `declare`, `readonly`) are remembered for later lines;
- operators `|`, `||`, `&&`, `;`, `&` and redirections (`>`, `2>&1`) become words of their own.

A name the script sets nowhere is looked up in `environ` (each such use noted); set nowhere at all, its
expansion becomes `UNSET + name + UNSET` inside the word, so a reader can name the variable
(`unresolved_names`, `display`) instead of carrying `${NNODES}` as a value or failing on it. The same goes
for what is never run here: command substitution `$(...)` and backquotes, positional parameters (`$1`).

Left out: loops, `if`, functions, `source`, arrays, globbing, brace expansion, glob patterns in
`${VAR//a/b}` and here-documents; their lines are read as commands like any other (a reader skips what is not its
trainer's command), every branch's assignments in order (noted once, since the last one wins).
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Iterator

UNSET = "\x00"  # brackets the name of a variable that could not be expanded, inside a word
OPERATOR_CHARS = "|&;<>"
_NAME = re.compile(r"[A-Za-z_]\w*")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_UNSET_NAME = re.compile(UNSET + r"([^" + UNSET + r"]*)" + UNSET)
_FIELDS = re.compile(r"(?:" + UNSET + r"[^" + UNSET + r"]*" + UNSET + r"|\S)+")  # bash's word splitting, sentinels whole
BRANCHING = ("if", "elif", "else", "case", "for", "while", "until")
DECLARERS = ("export", "local", "declare", "readonly", "typeset")


class ShellError(ValueError):
    """A line that cannot be read as bash would read it (an unclosed quote); the message names the line."""


def unresolved_names(word: str) -> list[str]:
    """The variables (or `$(...)`) a word holds unexpanded."""
    return _UNSET_NAME.findall(word)


def display(word: str) -> str:
    """The word as a user would read it: each unexpanded part written back as `${NAME}`."""
    return _UNSET_NAME.sub(lambda m: m.group(1) if m.group(1).startswith(("$(", "`")) else "${" + m.group(1) + "}", word)


def logical_lines(text: str) -> list[str]:
    """The script's commands, one string each: continuations joined, newlines inside quotes kept, comments dropped."""
    lines, current, quote, i = [], [], None, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'" and i + 1 < len(text):
            if text[i + 1] == "\n":
                i += 2
                continue
            current.append(text[i:i + 2])
            i += 2
            continue
        if quote is None and ch == "#" and (not current or current[-1][-1:].isspace() or current[-1] in ";|&"):
            while i < len(text) and text[i] != "\n":
                i += 1
            continue
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        if ch == "\n" and quote is None:
            lines.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if quote is not None:
        raise ShellError(f"an unclosed {quote} quote starting in: {''.join(current).strip()[:120]}")
    lines.append("".join(current))
    return [line for line in lines if line.strip()]


class Shell:
    """Expands and splits commands as bash would, remembering the script's assignments (module docstring)."""

    def __init__(self, environ: dict[str, str]):
        self.environ = environ
        self.variables: dict[str, str] = {}
        self.notes: list[str] = []

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def commands(self, text: str) -> Iterator[list[str]]:
        """Each command's words; assignments are remembered (and yielded too, so a reader may skip them)."""
        for line in logical_lines(text):
            words = self.words(line)
            if not words:
                continue
            if words[0] in BRANCHING or (words[0].endswith(")") and words[-1] == ";;"):
                self._note("the script branches or loops (if/case/for): cohort convert reads every branch's assignments "
                           "in order, the last one winning; check the values of the options that depend on them")
            body = words[1:] if words[0] in DECLARERS else words
            if body and all(_ASSIGNMENT.match(w) for w in body):
                for word in body:
                    name, _, value = word.partition("=")
                    self.variables[name] = value
            yield words

    # -- words ---------------------------------------------------------------------------

    def words(self, line: str) -> list[str]:
        """One command line as its words, every expansion done (module docstring)."""
        words: list[str] = []
        current: list[str] | None = None  # None: between words
        i = 0
        while i < len(line):
            ch = line[i]
            if ch.isspace():
                current = self._flush(words, current)
                i += 1
            elif ch in OPERATOR_CHARS:
                if current is not None and "".join(current).isdigit() and ch in "<>":
                    op_start = "".join(current)  # 2>&1: the descriptor belongs to the redirection
                    current = None
                else:
                    current, op_start = self._flush(words, current), ""
                j = i
                while j < len(line) and line[j] in OPERATOR_CHARS:
                    j += 1
                words.append(op_start + line[i:j])
                i = j
            elif ch == "'":
                end = line.find("'", i + 1)
                if end < 0:
                    raise ShellError(f"an unclosed ' quote in: {line.strip()[:120]}")
                current = (current or []) + [line[i + 1:end]]
                i = end + 1
            elif ch == '"':
                text, i = self._double_quoted(line, i + 1)
                current = (current or []) + [text]
            elif ch == "\\":
                current = (current or []) + [line[i + 1:i + 2]]
                i += 2
            elif ch == "$" or ch == "`":
                value, i = self._expansion(line, i)
                pieces = _FIELDS.findall(value)  # split on whitespace; what was not expanded stays one piece
                if not pieces:
                    current = current if value == "" else (current or [])
                    continue
                if value[:1].isspace():
                    current = self._flush(words, current)
                current = (current or []) + [pieces[0]]
                for piece in pieces[1:]:
                    current = self._flush(words, current)
                    current = [piece]
                if value[-1:].isspace():
                    current = self._flush(words, current)
            else:
                current = (current or []) + [ch]
                i += 1
        self._flush(words, current)
        return words

    @staticmethod
    def _flush(words: list[str], current: list[str] | None) -> None:
        if current is not None:
            words.append("".join(current))
        return None

    def _double_quoted(self, line: str, i: int) -> tuple[str, int]:
        """The text of a "..." starting after its quote, expanded; and the index after the closing quote."""
        out = []
        while i < len(line):
            ch = line[i]
            if ch == '"':
                return "".join(out), i + 1
            if ch == "\\" and i + 1 < len(line) and line[i + 1] in '"\\$`\n':
                out.append(line[i + 1])
                i += 2
            elif ch in "$`":
                value, i = self._expansion(line, i)
                out.append(value)
            else:
                out.append(ch)
                i += 1
        raise ShellError(f'an unclosed " quote in: {line.strip()[:120]}')

    # -- expansions ----------------------------------------------------------------------

    def _expansion(self, line: str, i: int) -> tuple[str, int]:
        """The value of the expansion at line[i] (`$...` or a backquote) and the index after it."""
        if line[i] == "`":
            end = line.find("`", i + 1)
            end = len(line) - 1 if end < 0 else end
            return self._never_run(line[i:end + 1]), end + 1
        rest = line[i + 1:]
        if rest.startswith("(("):
            end = _closing(line, i + 3, "(", ")", depth=2)
            return self._arithmetic(line[i + 3:end - 1]), end + 1
        if rest.startswith("("):
            end = _closing(line, i + 2, "(", ")")
            return self._never_run(line[i:end + 1]), end + 1
        if rest.startswith("{"):
            end = _closing(line, i + 2, "{", "}")
            return self._braced(line[i + 2:end]), end + 1
        name = _NAME.match(rest)
        if name:
            return self._lookup(name.group(0)), i + 1 + name.end()
        if rest[:1] in ("@", "*") or rest[:1].isdigit() or rest[:1] == "#":
            self._note(f"${rest[:1]}: the script's own arguments, unknown here; pass them to `cohort convert` "
                       "as part of the script instead")
            return (UNSET + "$" + rest[:1] + UNSET) if rest[:1] not in "@*" else "", i + 2
        return "$", i + 1

    def _never_run(self, text: str) -> str:
        self._note(f"{text}: command substitution is not run by `cohort convert`; the options that use it are "
                   "listed as not mapped")
        return UNSET + text + UNSET

    def _lookup(self, name: str) -> str | None:
        if name in self.variables:
            return self.variables[name]
        if name in self.environ:
            self._note(f"${name} = {self.environ[name]} (from this shell's environment)")
            return self.environ[name]
        self._note(f"${name} is set neither in the script nor in this environment: every option that uses it is "
                   f"listed as not mapped; set {name} (export {name}=...) and convert again")
        return UNSET + name + UNSET

    def _braced(self, inner: str) -> str:
        """`${NAME}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`, `${NAME:+word}`."""
        m = re.match(r"([A-Za-z_]\w*)(:?[-=+?])?(.*)$", inner, re.S)
        if m is None:
            return self._never_run("${" + inner + "}")
        name, op, word = m.group(1), m.group(2), m.group(3)
        if op is None and word.startswith("/"):  # ${NAME/old/new}, ${NAME//old/new}: a literal pattern
            every = word.startswith("//")
            old, _, new = word[2 if every else 1:].partition("/")
            value = self._lookup(name)
            if any(c in old for c in "*?["):
                return self._never_run("${" + inner + "}")
            return value.replace(self._word(old), self._word(new), -1 if every else 1) if old else value
        if op is None:
            return self._lookup(name) if not word else self._never_run("${" + inner + "}")
        known = name in self.variables or name in self.environ
        value = self.variables.get(name, self.environ.get(name))
        empty = not value if op.startswith(":") else not known
        if op.endswith(("-", "=")):
            if not empty:
                return self._lookup(name)
            default = self._word(word)
            if op.endswith("="):
                self.variables[name] = default
            return default
        if op.endswith("+"):
            return "" if empty else self._word(word)
        return self._lookup(name)  # ${NAME:?message}

    def _word(self, text: str) -> str:
        """A `${NAME:-word}`'s word: expanded, quotes removed, not split (as bash does)."""
        return " ".join(self.words(text)) if text.strip() else text

    def _arithmetic(self, expression: str) -> str:
        """`$((...))`: integer arithmetic over numbers and the script's variables, as bash evaluates it."""
        text = _VAR_IN_ARITH.sub(lambda m: m.group(1) or m.group(2), expression)
        text = "".join(self.words(text)) if "$" in text else text
        names = sorted(set(_NAME.findall(text)))
        values = {}
        for name in names:
            value = self._lookup(name)
            if UNSET in value:
                return value
            values[name] = value
        try:
            return str(_evaluate(ast.parse(text.strip(), mode="eval").body, values))
        except (SyntaxError, ValueError, KeyError, ZeroDivisionError) as exc:
            self._note(f"$(({expression})): not integer arithmetic `cohort convert` can evaluate ({exc})")
            return UNSET + f"$(({expression}))" + UNSET


_VAR_IN_ARITH = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Mod: operator.mod,
           ast.Pow: operator.pow}


def _evaluate(node: ast.AST, values: dict[str, str]) -> int:
    """bash's integer arithmetic on a parsed expression (names read as integers; `/` truncates toward zero)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return _evaluate(ast.parse(values[node.id].strip() or "0", mode="eval").body, values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, values)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, values), _evaluate(node.right, values)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)):
            quotient = abs(left) // abs(right)
            return quotient if (left >= 0) == (right >= 0) else -quotient
        if type(node.op) in _BINARY:
            return _BINARY[type(node.op)](left, right)
    raise ValueError(f"{ast.unparse(node)} is not integer arithmetic")


def _closing(line: str, i: int, opening: str, closing: str, depth: int = 1) -> int:
    """The index of the `closing` that balances `depth` open `opening`s before line[i] (quotes respected)."""
    quote = None
    while i < len(line):
        ch = line[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == opening:
            depth += 1
        elif ch == closing:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ShellError(f"no closing {closing!r} in: {line.strip()[:120]}")
