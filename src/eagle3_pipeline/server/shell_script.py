"""A shell script read the way bash runs it, far enough to know the command that starts vLLM.

Used for `bash -c 'SCRIPT' NAME ARGS...` in ExecStart and for a wrapper script ExecStart runs. Nothing
is executed: the script is lexed (quotes, backslashes, `$'...'`, comments, operators, redirections
dropped) and its simple commands are followed in order, as bash(1) would on the success path:

- words are expanded as bash expands them: `$VAR`, `${VAR}`, `${VAR:-x}` (and `-`, `:=`, `=`, `:+`,
  `+`), `$0` (NAME), `$1`..`${10}`, `"$@"` (one word per argument), `"$*"`, `$#`, `~`; an unquoted
  expansion is split into words on blanks, a quoted one is not; an empty unquoted one disappears;
- `NAME=value` alone sets a shell variable (exported when it came from the environment), `export`
  and `declare -x` export, `unset` removes, `cd DIR` moves, `shift` and `set -- ...` move the
  arguments, `source`/`.` are recorded (their effect cannot be known), `exec [-a NAME]` runs what
  follows;
- `NAME=value cmd ...` sets NAME in cmd's environment only.

What cannot be known (a command substitution, an unset variable, arithmetic) is reported as
unresolved, never guessed.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from eagle3_pipeline.server.shell_lex import Part, Word, lex, lex_word
from eagle3_pipeline.server.unit_syntax import Unresolved

SHELLS = ("sh", "bash", "dash", "zsh", "ksh")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORDS = {"then", "do", "else", "{", "}", "!", "if", "while", "until", "elif", "fi", "done"}


@dataclass
class ShellRun:
    """Where following the script stopped: the command that matched, with the environment, folder
    and unknowns it runs with."""

    argv: list[str] | None = None  # the matched command's words, expanded; None: none matched
    env: dict[str, str] = field(default_factory=dict)  # exported variables at that command
    unset: list[str] = field(default_factory=list)  # environment variables the script removed
    cwd: str | None = None  # after `cd`; None when the script did not move
    sourced: list[str] = field(default_factory=list)  # files `source`d before it
    unresolved: list[Unresolved] = field(default_factory=list)


def script_option_at(argv: list[str], shell_at: int) -> int | None:
    """Index of the option that makes the shell at argv[shell_at] run a script string: `-c`, or a
    cluster of short options holding `c` (`bash -lc '...'`, `sh -ec '...'`); None when it has none."""
    for j in range(shell_at + 1, len(argv)):
        word = argv[j]
        if not word.startswith("-") or word.startswith("--") or word == "-":
            return None
        if "c" in word[1:]:
            return j
    return None


def shell_c_at(argv: list[str]) -> tuple[int, int] | None:
    """(index of the shell, index of its `-c`) for the first shell in argv that runs a script string;
    `su USER -c '...'` and `runuser -u USER -c '...'` count (the user's shell runs the string)."""
    for i, word in enumerate(argv):
        base = posixpath.basename(word)
        if base in SHELLS and (c_at := script_option_at(argv, i)) is not None:
            return i, c_at
        if base in ("su", "runuser"):
            c_at = next((j for j in range(i + 1, len(argv)) if argv[j] in ("-c", "--command")), None)
            if c_at is not None:
                return i, c_at
    return None


# -- expansion and following the commands ------------------------------------------------------------


@dataclass
class _Scope:
    vars: dict[str, str]
    exported: set[str]
    name: str
    args: list[str]
    unknown: dict[str, list[Unresolved]]  # variables whose value holds something unknown
    where: str
    cwd: str | None = None


def _param(scope: _Scope, part: Part, found: list[Unresolved]) -> list[str] | str:
    """A parameter's value: a list for `$@`/`$*` (the arguments), a string otherwise."""
    name = part.text
    if name in ("@", "*"):
        return list(scope.args)
    if name == "#":
        return str(len(scope.args))
    if name.isdigit():
        index = int(name)
        value: str | None = (
            scope.name if index == 0 else (scope.args[index - 1] if index <= len(scope.args) else None)
        )
    elif name in scope.vars:
        value = scope.vars[name]
        found.extend(scope.unknown.get(name, []))
    else:
        value = None
    is_set = value is not None and (value != "" or ":" not in part.op)
    if part.op in (":-", "-", ":=", "="):
        if not is_set:
            value = " ".join(_expand(lex_word(part.arg), scope, found)) if part.arg else ""
            if part.op.endswith("=") and _NAME.fullmatch(name):
                scope.vars[name] = value
        return value or ""
    if part.op in (":+", "+"):
        return " ".join(_expand(lex_word(part.arg), scope, found)) if is_set else ""
    if value is None:
        found.append(Unresolved(scope.where, f"${name} is not set by the unit or the script"))
        return ""
    return value


def _expand(word: Word, scope: _Scope, found: list[Unresolved]) -> list[str]:
    """A word's fields, as bash makes them: quoted expansions stay whole, unquoted ones are split on
    blanks, `"$@"` gives one field per argument, an unquoted empty expansion gives none."""
    fields: list[str] = []
    current: str | None = None
    for part in word:
        if part.kind == "lit":
            current = (current or "") + part.text if (part.quoted or part.text) else current
            continue
        if part.kind == "tilde":
            home = scope.vars.get("HOME")
            if home is None:
                found.append(Unresolved(scope.where, "~ names $HOME, which is not known"))
            current = (current or "") + (home or "~")
            continue
        if part.kind == "unknown":
            found.append(Unresolved(scope.where, f"{part.text} is run by the shell; not followed here"))
            current = (current or "") + part.text
            continue
        value = _param(scope, part, found)
        if isinstance(value, list):
            if part.quoted and part.text == "*":
                value = [" ".join(value)]
            elif not part.quoted:
                value = [piece for arg in value for piece in arg.split()]
            for k, item in enumerate(value):
                if k:
                    fields.append(current or "")
                    current = item
                else:
                    current = (current or "") + item
            continue
        if part.quoted:
            current = (current or "") + value
            continue
        pieces = value.split()
        if value[:1].isspace() and current is not None:
            fields.append(current)
            current = None
        for k, piece in enumerate(pieces):
            if k:
                fields.append(current or "")
                current = piece
            else:
                current = (current or "") + piece
        if value[-1:].isspace() and current is not None:
            fields.append(current)
            current = None
    if current is not None:
        fields.append(current)
    return fields


def _assignment(word: Word) -> tuple[str, Word] | None:
    """(name, value parts) when a word is `NAME=value` (the name unquoted)."""
    if not word or word[0].kind != "lit" or word[0].quoted:
        return None
    name, eq, rest = word[0].text.partition("=")
    if not eq or not _NAME.fullmatch(name):
        return None
    value = ([Part("lit", rest, False)] if rest else []) + word[1:]
    return name, value


def _commands(tokens: list[Word | str]) -> list[list[Word]]:
    """The simple commands, in order (split at operators; reserved words at a command's start
    dropped)."""
    commands: list[list[Word]] = [[]]
    for token in tokens:
        if isinstance(token, str):
            commands.append([])
        elif (
            not commands[-1]
            and len(token) == 1
            and token[0].kind == "lit"
            and not token[0].quoted
            and token[0].text in _KEYWORDS
        ):
            continue
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def follow(
    script: str,
    name: str,
    args: list[str],
    env: dict[str, str],
    matches: Callable[[list[str]], bool],
    where: str,
    cwd: str | None = None,
) -> ShellRun:
    """Follow `script` (run as `bash -c script name args...`, with `env` as its environment) to the
    first command for which `matches(argv)` holds.

    Returns:
        ShellRun: that command's words, its exported environment, the folder it runs in, what the
        script sourced, and what could not be known on its way; argv None when no command matched.
    """
    scope = _Scope(dict(env), set(env), name, list(args), {}, where, cwd)
    sourced: list[str] = []
    for command in _commands(lex(script)):
        found: list[Unresolved] = []
        prefix: dict[str, str] = {}
        k = 0
        while k < len(command) and (assignment := _assignment(command[k])):
            value = "".join(_expand_assignment(assignment[1], scope, found))
            prefix[assignment[0]] = value
            k += 1
        argv = [field_ for word in command[k:] for field_ in _expand(word, scope, found)]
        if not argv:  # assignments only: shell variables (exported when already in the environment)
            for var, value in prefix.items():
                _set(scope, var, value, found)
            continue
        argv = _strip_exec(argv)
        if argv and matches(argv):
            exported = {v: scope.vars[v] for v in scope.exported if v in scope.vars}
            return ShellRun(
                argv, {**exported, **prefix}, [v for v in env if v not in exported and v not in prefix],
                scope.cwd, sourced, found,
            )  # fmt: skip
        _builtin(argv, command[k:], scope, sourced, found)
    return ShellRun(None, {}, [], scope.cwd, sourced, [])


def _expand_assignment(value: Word, scope: _Scope, found: list[Unresolved]) -> list[str]:
    """An assignment's value: expanded but never split (bash does not split assignments)."""
    quoted = [Part(p.kind, p.text, True, p.op, p.arg) if p.kind != "tilde" else p for p in value]
    return _expand(quoted, scope, found) if value else [""]


def _set(scope: _Scope, name: str, value: str, found: list[Unresolved]) -> None:
    scope.vars[name] = value
    if found:
        scope.unknown[name] = list(found)
    else:
        scope.unknown.pop(name, None)


def _strip_exec(argv: list[str]) -> list[str]:
    """The command `exec [-cl] [-a NAME] cmd ...` runs (its argv[0] override has no effect on what
    is found); argv itself otherwise."""
    if argv[0] != "exec":
        return argv
    k = 1
    while k < len(argv) and argv[k].startswith("-") and argv[k] != "--":
        k += 2 if argv[k] == "-a" else 1
    return argv[k + (k < len(argv) and argv[k] == "--") :]


def _builtin(
    argv: list[str], words: list[Word], scope: _Scope, sourced: list[str], found: list[Unresolved]
) -> None:
    """The builtins that change what a later command runs with."""
    head = argv[0]
    if head in ("export", "declare", "typeset", "readonly", "local"):
        exporting = head == "export" or any(a.startswith("-") and "x" in a for a in argv[1:])
        unexport = head == "export" and "-n" in argv[1:]
        for word in words[1:]:
            assignment = _assignment(word)
            if assignment:
                _set(scope, assignment[0], "".join(_expand_assignment(assignment[1], scope, found)), found)
                var = assignment[0]
            else:
                fields = _expand(word, scope, [])
                var = fields[0] if fields else ""
                if var.startswith("-") or not _NAME.fullmatch(var):
                    continue
            if exporting and not unexport:
                scope.exported.add(var)
            elif unexport:
                scope.exported.discard(var)
    elif head == "unset":
        for var in argv[1:]:
            if _NAME.fullmatch(var):
                scope.vars.pop(var, None)
                scope.exported.discard(var)
    elif head == "cd":
        target = next((a for a in argv[1:] if not a.startswith("-") or a == "-"), scope.vars.get("HOME"))
        if target and target != "-":
            scope.cwd = posixpath.normpath(posixpath.join(scope.cwd or "/", target))
    elif head == "shift":
        count = argv[1] if len(argv) > 1 else "1"
        if count.isdigit() and int(count) <= len(scope.args):  # bash refuses a shift past the end
            scope.args = scope.args[int(count) :]
    elif head == "set" and "--" in argv:  # `set -- a b`: new positional parameters
        scope.args = argv[argv.index("--") + 1 :]
    elif head in ("source", ".") and len(argv) > 1:
        sourced.append(argv[1])


def commands_of(script: str) -> list[list[str]]:
    """The simple commands of a script with their words as written (quotes removed, expansions kept
    as `$NAME`): for reading what a command does without knowing its variables."""
    return [[_as_written(word) for word in command] for command in _commands(lex(script))]


def _as_written(word: Word) -> str:
    out = []
    for part in word:
        if part.kind == "param":
            out.append(f"${{{part.text}{part.op}{part.arg}}}" if part.op else f"${part.text}")
        else:
            out.append(part.text)
    return "".join(out)
