"""A systemd unit parser that reads units the way systemd does, for the settings a vLLM service uses.

Input is what `systemctl cat --no-pager UNIT` prints (each file introduced by a `# /path` line, the
fragment first, then its drop-ins) or a single unit file. Lines, words, C escapes and specifiers follow
systemd's own rules (see `unit_syntax`). Handled here: Exec* prefixes (`-@:|` once each, one of `+`,
`!`, `!!`, in any order; `@` makes the second word argv[0]), an empty assignment resetting a list, a
lone unquoted `;` separating command lines, `$VAR` (split into words when it is a word of its own) and
`${VAR}` (one word) with `$$` for `$`, drop-ins overriding the fragment, `Environment=` (last wins per
variable; an empty one resets the list; a word without `=` is ignored with a warning),
`EnvironmentFile=` (`-` meaning optional, a glob allowed, expanded by the snapshot on the host) and
env files read by systemd's own state machine (a double-quoted value may span lines), ExecStop= and
ExecStopPost= (for `exec_stop`), WorkingDirectory= and User= as written (the snapshot resolves `~`).
What cannot be resolved is recorded in `Unresolved` entries, never guessed; what systemd would warn
about is recorded in `ServiceUnit.warnings`. docs/units.md describes each class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from eagle3_pipeline.server.env_file import env_file_assignments, parse_environment_file
from eagle3_pipeline.server.unit_syntax import (
    UnitError,
    Unresolved,
    expand_specifiers,
    extract_words,
    split_words,
    unit_lines,
)

__all__ = [  # re-exported for callers
    "UnitError",
    "Unresolved",
    "env_file_assignments",
    "expand_specifiers",
    "parse_environment_file",
    "split_words",
]

_HEADER = re.compile(r"^# (/\S.*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VAR_WORD = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_VAR_REF = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
EXEC_PREFIX_CHARS = "-@:+!|"
# systemd's unit-name rules for a startable service (unit_name_is_valid: these characters, one `@`
# with a non-empty instance, at most 255 characters); `..` is refused too because the name becomes a
# path (the serve check's host record, UNIT.serve-check.json). config/schema.yaml holds the same
# pattern (a test checks).
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
    key: str = "ExecStart"  # or ExecStop, ExecStopPost

    def program_words(self) -> list[str]:
        """The executable and the arguments it sees after argv[0]: with `@` the second word is
        argv[0] only (`@/opt/venv/bin/vllm vllm-prod serve M` runs vllm's `serve M`), so it is left
        out. What to look for vLLM in; the words themselves are what to write back."""
        words = self.words if self.words is not None else split_words(self.raw, f"{self.key}=")
        return [words[0], *words[2:]] if "@" in self.prefixes and len(words) >= 2 else list(words)


@dataclass
class ServiceUnit:
    """The [Service] settings that decide what runs, after drop-ins are applied."""

    name: str
    files: list[str] = field(default_factory=list)
    exec_start: list[ExecCommand] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    environment_files: list[tuple[str, bool]] = field(default_factory=list)  # (path, optional)
    working_directory: str | None = None  # as written (`~` and specifiers kept for the snapshot)
    working_directory_optional: bool = False  # `WorkingDirectory=-/path`: a missing folder is fine
    user: str | None = None
    exec_stop: list[ExecCommand] = field(default_factory=list)  # ExecStop= then ExecStopPost=
    pass_environment: list[str] = field(default_factory=list)  # PassEnvironment= names
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


def split_exec_prefixes(value: str) -> ExecCommand:
    """`ExecStart=` value -> prefixes and the command, as systemd's config_parse_exec reads them: each of
    `-` (failure ignored), `@` (the second word is argv[0]), `:` (no variable expansion), `|` (run
    through the user's shell) at most once, and one of `+` (full privileges), `!` (no setuid) or `!!`
    (ambient capabilities), in any order; a character that cannot be taken ends the prefixes."""
    taken, i = "", 0
    privilege = ""
    while i < len(value):
        char = value[i]
        if char in "-@:|" and char not in taken:
            taken += char
        elif char == "+" and not privilege:
            privilege = "+"
            taken += char
        elif char == "!" and privilege in ("", "!"):
            privilege += "!"
            taken += char
        else:
            break
        i += 1
    return ExecCommand(prefixes=taken, raw=value[i:].strip())


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
    if key in ("ExecStart", "ExecStop", "ExecStopPost"):
        _apply_exec(unit, key, value, what)
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
        _apply_environment_file(unit, spec, what)
    elif key == "WorkingDirectory":
        unit.working_directory_optional = spec.startswith("-")
        unit.working_directory = spec.removeprefix("-") or None
    elif key == "User":
        unit.user = spec or None
    elif key == "Type":
        unit.service_type = spec or "simple"
    elif key == "PassEnvironment":  # values from the service manager's own environment: unknown here
        unit.pass_environment = [*unit.pass_environment, *spec.split()] if spec else []


def _apply_environment_file(unit: ServiceUnit, spec: str, what: str) -> None:
    """EnvironmentFile=: an empty one resets the list; `-` makes it optional; the path (a glob is
    allowed) must be absolute (systemd's config_parse_unit_env_file ignores another)."""
    if not spec:
        unit.environment_files = []
        return
    optional = spec.startswith("-")
    path = spec.removeprefix("-").strip()
    if not path.startswith("/"):
        unit.warnings.append(f"{what}: path {path!r} is not absolute; systemd ignores it")
        return
    unit.environment_files.append((path, optional))


def _apply_exec(unit: ServiceUnit, key: str, value: str, what: str) -> None:
    """ExecStart=, ExecStop=, ExecStopPost=: an empty assignment resets the list; a lone `;` separates
    commands."""
    target = unit.exec_start if key == "ExecStart" else unit.exec_stop
    if not value:
        if key == "ExecStart":
            unit.exec_start = []
        else:  # ExecStop= and ExecStopPost= are kept in one list: reset only this key's own
            unit.exec_stop[:] = [c for c in unit.exec_stop if c.key != key]
        return
    parts = _split_command_lines(value)
    if len(parts) > 1:  # a lone `;` separates command lines, each with its own prefixes
        for part in parts:
            line = split_exec_prefixes(part)
            words = _literal_semicolons(split_words(line.raw, what, unit.warnings))
            target.append(_exec_command(line.prefixes, words, unit, what, key))
        return
    command = split_exec_prefixes(value)
    command.key = key
    words = _literal_semicolons(split_words(command.raw, what, unit.warnings))
    before = len(unit.unresolved)
    command.words = [expand_specifiers(w, unit.name, unit.unresolved, what) for w in words]
    command.unresolved_specifiers = [u.why for u in unit.unresolved[before:]]
    command.raw = expand_specifiers(command.raw, unit.name, [], what)  # reported once, above
    target.append(command)


def _split_command_lines(value: str) -> list[str]:
    """The command lines of an Exec*= value: split at each unquoted `;` that stands alone between
    blanks (config_parse_exec); a quoted `";"` and an escaped `\\;` are words."""
    parts, start, quote, i = [], 0, "", 0
    while i < len(value):
        char = value[i]
        if char == "\\":
            i += 2
            continue
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ";" and (i == 0 or value[i - 1].isspace()) and value[i + 1 : i + 2] in ("", " ", "\t"):
            parts.append(value[start:i])
            start = i + 1
        i += 1
    parts.append(value[start:])
    return [part.strip() for part in parts if part.strip()]


def _literal_semicolons(words: list[str]) -> list[str]:
    """A lone `\\;` is the word `;` (config_parse_exec checks for it before unescaping)."""
    return [";" if word == "\\;" else word for word in words]


def _exec_command(
    prefixes: str, words: list[str], unit: ServiceUnit, what: str, key: str = "ExecStart"
) -> ExecCommand:
    """One command line of several on an ExecStart= line; its text re-quoted from its words."""
    raw = " ".join(systemd_word(w) for w in words)
    before = len(unit.unresolved)
    expanded = [expand_specifiers(w, unit.name, unit.unresolved, what) for w in words]
    return ExecCommand(
        prefixes=prefixes, raw=expand_specifiers(raw, unit.name, [], what), words=expanded,
        unresolved_specifiers=[u.why for u in unit.unresolved[before:]], key=key,
    )  # fmt: skip


def systemd_word(word: str) -> str:
    """A word as systemd reads it back: double-quoted, backslashes and quotes escaped."""
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command_argv(command: ExecCommand, env: dict[str, str], unresolved: list[Unresolved]) -> list[str]:
    """The argv an ExecStart line runs with `env`, argv[0] being the executable (see
    `ExecCommand.program_words`: `@`'s argv[0] word is left out); `:` turns variable substitution off."""
    words = command.program_words()
    if ":" not in command.prefixes:
        words = substitute_env(words, env, unresolved, f"{command.key}=")
    return words
