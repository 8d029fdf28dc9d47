"""A systemd unit parser that reads units the way systemd does, for the settings a vLLM service uses.

Input is what `systemctl cat --no-pager UNIT` prints (each file introduced by a `# /path` line, the
fragment first, then its drop-ins) or a single unit file. Lines, words, C escapes and specifiers follow
systemd's own rules (see `unit_syntax`). Handled here: ExecStart prefixes (`-@:+!|`, `!!`), an empty
`ExecStart=` resetting the list, `$VAR` (split into words when it is a word of its own) and `${VAR}`
(one word) with `$$` for `$`, drop-ins overriding the fragment, `Environment=` (last wins per
variable; an empty one resets the list; a word without `=` is ignored with a warning) and
`EnvironmentFile=` (`-` meaning optional). What cannot be resolved is recorded in `Unresolved`
entries, never guessed; what systemd would warn about is recorded in `ServiceUnit.warnings`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from eagle3_pipeline.server.unit_syntax import (
    UnitError,
    Unresolved,
    expand_specifiers,
    extract_words,
    split_words,
    unit_lines,
)

__all__ = ["UnitError", "Unresolved", "expand_specifiers", "split_words"]  # re-exported for callers

_HEADER = re.compile(r"^# (/\S.*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR_WORD = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_VAR_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
EXEC_PREFIX_CHARS = "-@:+!|"
# systemd's unit-name rules for a startable service (unit_name_is_valid: these characters, one `@`
# with a non-empty instance, at most 255 characters); `..` is refused too because the name becomes a
# path (the serve check's drop-in folder). config/schema.yaml holds the same pattern (a test checks).
UNIT_NAME_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]+)?\.service$"
UNIT_NAME_MAX = 255


@dataclass
class UnitFile:
    """One file of a unit: its path and its (section, key, value) assignments in order."""

    path: str
    assignments: list[tuple[str, str, str]]
    warnings: list[str] = field(default_factory=list)


@dataclass
class ExecCommand:
    """One ExecStart= line: its prefixes, the command text (quotes still in it, specifiers resolved
    on the whole text) and, when parsed from a unit, its words as systemd makes them (quotes and
    escapes removed, then specifiers resolved per word; `$VAR` still in them)."""

    prefixes: str
    raw: str
    words: list[str] | None = None
    unresolved_specifiers: list[str] = field(default_factory=list)  # why each `%x` left stays as is


@dataclass
class ServiceUnit:
    """The [Service] settings that decide what runs, after drop-ins are applied."""

    name: str
    files: list[str] = field(default_factory=list)
    exec_start: list[ExecCommand] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    environment_files: list[tuple[str, bool]] = field(default_factory=list)  # (path, optional)
    working_directory: str | None = None
    user: str | None = None
    service_type: str = "simple"  # Type=
    unresolved: list[Unresolved] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what systemd would log as a warning
    source_text: str = ""  # every file as read, for the secrets pass (never written out as is)


def split_cat_output(text: str, default_path: str = "(unit)") -> list[tuple[str, str]]:
    """Split `systemctl cat` output into (path, text) per file; a plain file is one entry."""
    files: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        match = _HEADER.match(line)
        if match and (not files or _looks_like_unit_path(match.group(1))):
            files.append((match.group(1).strip(), []))
        elif not files:
            files.append((default_path, [line]))
        else:
            files[-1][1].append(line)
    return [(path, "\n".join(lines)) for path, lines in files]


def _looks_like_unit_path(path: str) -> bool:
    return bool(re.search(r"\.(service|conf)$", path.strip()))


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Join backslash-continued lines; comment lines inside a continuation are dropped.

    Returns (first line number, joined line) pairs without comments or blank lines.
    """
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(("#", ";")):
            continue  # a comment, also inside a continuation
        if not pending:
            if not stripped:
                continue
            start = number
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        pending.append(line)
        out.append((start, " ".join(part.strip() for part in pending).strip()))
        pending = []
    if pending:
        out.append((start, " ".join(part.strip() for part in pending).strip()))
    return out


def parse_unit_file(path: str, text: str) -> UnitFile:
    """Parse one file into (section, key, value) assignments."""
    section = ""
    assignments = []
    warnings = []
    for number, line in unit_lines(text):
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if "=" not in line:  # systemd's conf-parser: "Missing '=', ignoring line."
            warnings.append(f"{path}:{number}: missing '=' in {line!r}; systemd ignores the line")
            continue
        key, value = line.split("=", 1)
        assignments.append((section, key.strip(), value.strip()))
    return UnitFile(path, assignments, warnings)


def substitute_env(
    words: list[str], env: dict[str, str], unresolved: list[Unresolved], what: str
) -> list[str]:
    """Apply systemd's variable rules (`replace_env_argv`): a word `$VAR` is replaced by the value split
    into words (quotes honoured), `${VAR}` anywhere in a word by the value as-is, `$$` by `$`; `$VAR`
    inside a longer word stays literal. A variable the unit does not set is recorded as unresolved."""
    out: list[str] = []
    for word in words:
        if word.startswith("$") and word[1:2] not in ("{", "$"):
            if _VAR_WORD.match(word):
                out.extend(split_words(_lookup(word[1:], env, unresolved, what), f"${word[1:]}"))
            else:
                unresolved.append(
                    Unresolved(what, f"{word!r} is not a variable name; systemd drops the word")
                )
            continue

        def replace(match: re.Match[str]) -> str:
            if match.group(0) == "$$":
                return "$"
            return _lookup(match.group(1), env, unresolved, what)

        out.append(_VAR_REF.sub(replace, word))
    return out


def _lookup(name: str, env: dict[str, str], unresolved: list[Unresolved], what: str) -> str:
    if name in env:
        return env[name]
    unresolved.append(
        Unresolved(
            what, f"${name} is not set by the unit (Environment=/EnvironmentFile=); systemd would use ''"
        )
    )
    return ""


def parse_environment_assignments(
    value: str, where: str, unit_name: str, unresolved: list[Unresolved], warnings: list[str]
) -> dict[str, str]:
    """`Environment=` value as systemd's config_parse_environ reads it: words unquoted and unescaped,
    then specifiers resolved per word; a word that is not NAME=VALUE is ignored with a warning, and
    a word that cannot be unquoted or unescaped ends the line (systemd ignores the rest)."""
    env: dict[str, str] = {}
    try:
        words = extract_words(value, where, relax=False)
    except UnitError as err:
        warnings.append(f"{err}; systemd ignores the rest of this Environment= line")
        words = err.words  # those before the word that failed
    for word in words:
        word = expand_specifiers(word, unit_name, unresolved, where)
        name, eq, val = word.partition("=")
        if not eq or not _ENV_NAME.match(name):
            warnings.append(f"{where}: {word!r} is not a NAME=VALUE assignment; systemd ignores it")
            continue
        env[name] = val
    return env


def parse_environment_file(text: str, warnings: list[str] | None = None, where: str = "") -> dict[str, str]:
    """An EnvironmentFile=: VAR=VALUE lines, `#`/`;` comments, quotes, continuations. A line whose name
    is not a variable name (`export NAME=...`, as a shell file has it) is ignored with a warning, as
    systemd's load_env_file does ("invalid variable name")."""
    env = {}
    for number, line in logical_lines(text):
        if "=" not in line:
            continue
        name, value = (part.strip() for part in line.split("=", 1))
        if not _ENV_NAME.match(name):
            if warnings is not None:
                warnings.append(
                    f"{where}:{number}: {name!r} is not a variable name; systemd ignores the line"
                )
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
            if value and line.split("=", 1)[1].strip()[0] == '"':
                value = re.sub(r"\\(.)", r"\1", value)
        env[name] = value
    return env


def split_exec_prefixes(value: str) -> ExecCommand:
    """`ExecStart=` value -> prefixes (`-`, `@`, `:`, `+`, `!`, `!!`, `|`) and the command."""
    i = 0
    while i < len(value) and value[i] in EXEC_PREFIX_CHARS:
        i += 1
    return ExecCommand(prefixes=value[:i], raw=value[i:].strip())


def merge_unit(files: list[tuple[str, str]], unit_name: str) -> ServiceUnit:
    """Apply the fragment then each drop-in, in order, to the [Service] settings."""
    unit = ServiceUnit(name=unit_name, source_text="\n".join(text for _, text in files))
    for path, text in files:
        parsed = parse_unit_file(path, text)
        unit.files.append(path)
        unit.warnings.extend(parsed.warnings)
        for section, key, value in parsed.assignments:
            if section == "Service":
                _apply(unit, key, value, path)
    if len(unit.exec_start) > 1 and unit.service_type != "oneshot":  # service_verify() in systemd
        raise UnitError(
            f"{unit_name}: Service has more than one ExecStart= setting, which is only allowed for "
            "Type=oneshot services. Refusing. (systemd refuses to start it: a drop-in that sets "
            "ExecStart= needs an empty `ExecStart=` line first to reset the list, and a lone `;` "
            f"separates two commands; files: {', '.join(unit.files)})"
        )
    return unit


def _apply(unit: ServiceUnit, key: str, value: str, path: str) -> None:
    what = f"{key}= in {path}"
    if key == "ExecStart":
        if not value:
            unit.exec_start = []  # an empty assignment resets the list
            return
        command = split_exec_prefixes(value)
        words = split_words(command.raw, what, unit.warnings)
        if ";" in words:  # a lone `;` separates command lines (config_parse_exec); `\;` is a literal
            for part in _split_at_semicolons(words):
                unit.exec_start.append(_exec_command(command.prefixes, part, unit, what))
            return
        before = len(unit.unresolved)
        command.words = [expand_specifiers(w, unit.name, unit.unresolved, what) for w in words]
        command.unresolved_specifiers = [u.why for u in unit.unresolved[before:]]
        command.raw = expand_specifiers(command.raw, unit.name, [], what)  # reported once, above
        unit.exec_start.append(command)
    elif key == "Environment":
        if not value:
            unit.environment = {}  # an empty assignment resets the list
            return
        unit.environment.update(
            parse_environment_assignments(value, what, unit.name, unit.unresolved, unit.warnings)
        )
        return
    spec = expand_specifiers(value, unit.name, unit.unresolved, what)
    if key == "EnvironmentFile":
        if not spec:
            unit.environment_files = []
        else:
            optional = spec.startswith("-")
            unit.environment_files.append((spec.removeprefix("-").strip(), optional))
    elif key == "WorkingDirectory":
        unit.working_directory = spec.removeprefix("-") or None
    elif key == "User":
        unit.user = spec or None
    elif key == "Type":
        unit.service_type = spec or "simple"


def _split_at_semicolons(words: list[str]) -> list[list[str]]:
    parts: list[list[str]] = [[]]
    for word in words:
        if word == ";":
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


def _exec_command(prefixes: str, words: list[str], unit: ServiceUnit, what: str) -> ExecCommand:
    """One command line of several on an ExecStart= line; its text re-quoted from its words."""
    raw = " ".join(systemd_word(w) for w in words)
    before = len(unit.unresolved)
    expanded = [expand_specifiers(w, unit.name, unit.unresolved, what) for w in words]
    return ExecCommand(
        prefixes=prefixes, raw=expand_specifiers(raw, unit.name, [], what), words=expanded,
        unresolved_specifiers=[u.why for u in unit.unresolved[before:]],
    )  # fmt: skip


def systemd_word(word: str) -> str:
    """A word as systemd reads it back: double-quoted, backslashes and quotes escaped."""
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command_argv(command: ExecCommand, env: dict[str, str], unresolved: list[Unresolved]) -> list[str]:
    """The argv an ExecStart line runs with `env`: `@` drops the argv[0] override word, `:` turns
    variable substitution off."""
    words = command.words if command.words is not None else split_words(command.raw, "ExecStart=")
    if ":" not in command.prefixes:
        words = substitute_env(words, env, unresolved, "ExecStart=")
    if "@" in command.prefixes and len(words) >= 2:
        words = [words[0], *words[2:]]
    return words
