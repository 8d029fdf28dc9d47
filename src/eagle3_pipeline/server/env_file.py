"""Environment files (`EnvironmentFile=`) read the way systemd reads them: src/basic/env-file.c
`parse_env_file_internal`, then `strv_env_clean` (systemd.exec(5) describes the format)."""

from __future__ import annotations

import re

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_environment_file(text: str, warnings: list[str] | None = None, where: str = "") -> dict[str, str]:
    """An EnvironmentFile= as systemd reads it (src/basic/env-file.c `parse_env_file_internal`, then
    `strv_env_clean`): `#`/`;` comments, single quotes (literal), double quotes (`\\` escapes only
    `"`, `\\`, `` ` `` and `$`, and a value may span lines), a backslash-newline continuing a bare
    value, trailing blanks of a bare value dropped, no variable expansion. A name that is not a
    variable name (`export NAME=...`, as a shell file has it) is ignored with a warning."""
    env: dict[str, str] = {}
    for number, name, value in env_file_assignments(text):
        if not _ENV_NAME.match(name):
            if warnings is not None:
                warnings.append(
                    f"{where}:{number}: {name!r} is not a variable name; systemd ignores the line"
                )
            continue
        env[name] = value
    return env


_BLANKS, _NEWLINES = " \t\n\r", "\n\r"
_DOUBLE_QUOTE_ESCAPES = '"\\`$'


def env_file_assignments(text: str) -> list[tuple[int, str, str]]:
    """(line number, name, value) of every assignment in an env file, in order, before names are
    checked: systemd's state machine, character by character (its states are named alike)."""
    out: list[tuple[int, str, str]] = []
    state, key, value, line, start = "PRE_KEY", "", "", 1, 1

    def push() -> None:
        out.append((start, key.rstrip(_BLANKS), value))

    for char in text:
        if state == "PRE_KEY":
            if char in "#;":
                state = "COMMENT"
            elif char not in _BLANKS:
                state, key, value, start = "KEY", char, "", line
        elif state == "KEY":
            if char in _NEWLINES:
                state = "PRE_KEY"  # a line without `=` is dropped
            elif char == "=":
                state = "PRE_VALUE"
            else:
                key += char
        elif state == "PRE_VALUE":
            if char in _NEWLINES:
                push()
                state = "PRE_KEY"
            elif char == "'":
                state = "SINGLE"
            elif char == '"':
                state = "DOUBLE"
            elif char == "\\":
                state = "VALUE_ESCAPE"
            elif char not in _BLANKS:
                state, value = "VALUE", value + char
        elif state == "VALUE":
            if char in _NEWLINES:
                value = value.rstrip(_BLANKS)
                push()
                state = "PRE_KEY"
            elif char == "\\":
                state = "VALUE_ESCAPE"
            else:
                value += char
        elif state == "VALUE_ESCAPE":
            state = "VALUE"
            value += "" if char in _NEWLINES else char  # an escaped newline is eaten up
        elif state == "SINGLE":
            state, value = ("PRE_VALUE", value) if char == "'" else ("SINGLE", value + char)
        elif state == "DOUBLE":
            if char == '"':
                state = "PRE_VALUE"
            elif char == "\\":
                state = "DOUBLE_ESCAPE"
            else:
                value += char
        elif state == "DOUBLE_ESCAPE":
            state = "DOUBLE"
            if char in _DOUBLE_QUOTE_ESCAPES:
                value += char
            elif char != "\n":
                value += "\\" + char  # kept, as the shell keeps it
        elif state == "COMMENT":
            if char == "\\":
                state = "COMMENT_ESCAPE"
            elif char in _NEWLINES:
                state = "PRE_KEY"
        elif state == "COMMENT_ESCAPE":
            state = "PRE_KEY" if char in _NEWLINES else "COMMENT"
        line += char == "\n"
    if state == "VALUE":
        value = value.rstrip(_BLANKS)
    if state in ("PRE_VALUE", "VALUE", "VALUE_ESCAPE", "SINGLE", "DOUBLE", "DOUBLE_ESCAPE"):
        push()  # the last line, without its newline (an unclosed quote runs to the end of the file)
    return out
