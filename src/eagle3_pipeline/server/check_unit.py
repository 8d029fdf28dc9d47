"""The serve check's own systemd unit: a transient unit (`systemd-run`) that runs production's command
with the draft, under the execution settings production's unit really applies, read from
`systemctl show` and translated into what `systemd-run -p` accepts (PROPERTIES; docs/server.md has
the table), with `Conflicts=` AND `After=` production, `Restart=no`, `RuntimeMaxSec=` bounding the
check, and, when production was running, an `ExecStopPost=` that starts production again however the
check unit stops (the pipeline's stop, a crash, the time limit, its lease running out).

Why each piece, as a real systemd (252) behaves:
- `Conflicts=` alone implies no ordering (systemd.unit(5)): the draft's start and production's stop
  would run at once, two servers on one set of GPUs. With `After=` the conflicting stop always runs
  first, both ways: the check unit starts once production is gone, and production's start (the
  restore) waits until the check unit is inactive, i.e. its whole cgroup has exited, workers
  included. `KillMode=process`/`none` would leave workers behind, so the check unit never takes them.
- systemd loads every `EnvironmentFile=` again before each `ExecStopPost=`; one that is missing
  without `-` fails that spawn and ends the list. The check's own env file is optional (`-`) and
  removed by the LAST ExecStopPost, after the restore; production's own files are checked to exist
  before anything changes (host_record) and read with `-`, so the restore can always spawn; each
  ExecStopPost carries `-`, so one failing does not end the next.
- Why a transient unit and not a file under /run/systemd/system: a file needs `daemon-reload`, which
  also loads whatever an operator saved and did not load yet. With `--collect` systemd forgets the
  unit when it stops, failed or not.

Environment= values (which may hold secrets) never travel on a command line: they go to a 0600 file
(`env_file_text`) that the check unit reads first, production's own EnvironmentFile= entries after it,
which is the order in which systemd applies them to production.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from eagle3_pipeline.server.draft_command import ServeCheckError

PREFIX = "eagle3-serve-check-"
# The oldest systemd the check runs on: `systemd-run --collect` (236), ExecStopPost= and the `+`
# prefix in transient units, `Conflicts=`/`After=` through `-p`; Debian 10, RHEL 8 and Ubuntu 20.04
# ship 239-245. Tested: 252 (Debian 12), booted for real in tests/integration.
MIN_SYSTEMD = 239
_ENV_FILE = re.compile(r"^(?P<path>.*) \(ignore_errors=(?P<ignore>yes|no)\)$")
LIMITS = ("NOFILE", "MEMLOCK", "NPROC", "CORE", "STACK", "AS", "DATA", "FSIZE", "RSS", "NICE", "RTPRIO")
Props = dict[str, list[str]]


def _last(props: Props, name: str) -> str:
    return props.get(name, [""])[-1]


def _verbatim(name: str) -> Callable[[Props], list[str]]:
    """`show` prints the unit-file syntax: copied as `NAME=VALUE`, left out when empty (systemd's
    default then applies, as it does to production)."""
    return lambda props: [f"{name}={v}" for v in [_last(props, name)] if v]


def _each_line(name: str) -> Callable[[Props], list[str]]:
    """A list property `show` prints one entry a line (DeviceAllow=/dev/nvidia0 rw)."""
    return lambda props: [f"{name}={v}" for v in props.get(name, []) if v]


def _numa_policy(props: Props) -> list[str]:
    """`n/a` is how `show` prints "no policy set" (refused by `-p`); `default` is the same."""
    value = _last(props, "NUMAPolicy")
    return [f"NUMAPolicy={value}"] if value not in ("", "n/a", "default") else []


def _working_directory(props: Props) -> list[str]:
    """`show` prints `-/path` (missing is fine) as `!/path`."""
    value = _last(props, "WorkingDirectory")
    return (
        [f"WorkingDirectory=-{value[1:]}" if value.startswith("!") else f"WorkingDirectory={value}"]
        if value
        else []
    )


def _delegate(props: Props) -> list[str]:
    """`Delegate=yes` plus a separate DelegateControllers= list in `show`; one `Delegate=` for `-p`."""
    if _last(props, "Delegate") != "yes":
        return []
    controllers = _last(props, "DelegateControllers")
    return [f"Delegate={controllers or 'yes'}"]


def _kill_mode(props: Props) -> list[str]:
    """process/none would leave the draft's workers on the GPUs once the unit counts as stopped."""
    return ["KillMode=mixed"] if _last(props, "KillMode") == "mixed" else ["KillMode=control-group"]


def _limits(props: Props) -> list[str]:
    """`show` prints the hard limit as LimitX and the soft one as LimitXSoft; `-p LimitX=SOFT:HARD`."""
    out = []
    for limit in LIMITS:
        hard, soft = _last(props, f"Limit{limit}"), _last(props, f"Limit{limit}Soft")
        if hard:
            out.append(f"Limit{limit}={soft}:{hard}" if soft else f"Limit{limit}={hard}")
    return out


def _timeout_stop(props: Props) -> list[str]:
    """`show` names it TimeoutStopUSec and prints a time span (`1min 30s`), which `-p` parses."""
    value = _last(props, "TimeoutStopUSec")
    return [f"TimeoutStopSec={value}"] if value else []


@dataclass(frozen=True)
class Property:
    """One execution setting: the names `show` prints it under, and how it reaches `-p`."""

    shown: tuple[str, ...]
    to_run: Callable[[Props], list[str]]


# Every setting read from production's `systemctl show` and how it reaches `systemd-run -p`;
# docs/server.md has this table with what is left out and why (a test keeps the two equal).
PROPERTIES: tuple[Property, ...] = (
    *(Property((n,), _verbatim(n)) for n in (
        "Type", "NotifyAccess", "User", "Group", "SupplementaryGroups", "DynamicUser", "RootDirectory",
        "UMask", "Nice", "OOMScoreAdjust", "CPUAffinity", "NUMAMask", "DevicePolicy", "PrivateTmp",
        "PrivateDevices", "PrivateNetwork", "ProtectHome", "ProtectSystem", "ReadWritePaths",
        "ReadOnlyPaths", "InaccessiblePaths", "BindPaths", "BindReadOnlyPaths", "PassEnvironment",
        "UnsetEnvironment", "MemoryMax", "TasksMax", "KillSignal", "Slice",
    )),
    Property(("DeviceAllow",), _each_line("DeviceAllow")),
    Property(("NUMAPolicy",), _numa_policy),
    Property(("WorkingDirectory",), _working_directory),
    Property(("Delegate", "DelegateControllers"), _delegate),
    Property(("KillMode",), _kill_mode),
    Property(tuple(n for x in LIMITS for n in (f"Limit{x}", f"Limit{x}Soft")), _limits),
    Property(("TimeoutStopUSec",), _timeout_stop),
)  # fmt: skip
# Read separately: Environment (to the check's own env file), EnvironmentFiles (each with `-`, checked
# first), LoadState (refusals); the unit's type is refused when the check cannot reproduce it.
SHOWN = (*(n for p in PROPERTIES for n in p.shown), "Environment", "EnvironmentFiles", "LoadState")
UNREPRODUCIBLE_TYPES = {
    "dbus": "it claims production's bus name, which systemd still holds for production",
    "oneshot": "a oneshot unit is not a server the check can wait for",
}


def unit_name(run_id: str) -> str:
    """The check unit's name: its own, with the run id (never production's, never reused)."""
    name = f"{PREFIX}{run_id}.service"
    if not re.fullmatch(r"[A-Za-z0-9:_.-]+", name):
        raise ServeCheckError(f"{run_id!r} cannot be part of a unit name")
    return name


def lease_name(check: str) -> str:
    """The check unit's lease: a transient timer (and its service) that stops the check unit unless
    the pipeline renews it (host_record.Lease)."""
    return check.removesuffix(".service") + "-lease"


def parse_show(text: str) -> Props:
    """`systemctl show` output as NAME -> values (a property printed on several lines, such as
    EnvironmentFiles or DeviceAllow, keeps every line; a quoted value holding a newline, which `show`
    prints as it is, is joined back to its line)."""
    props: Props = {}
    lines = iter(text.splitlines())
    for line in lines:
        name, sep, value = line.partition("=")
        if not sep:
            continue
        while name == "Environment" and _open_quote(value):
            value += "\n" + next(lines, '"')
        props.setdefault(name, []).append(value)
    return props


def _open_quote(text: str) -> bool:
    """Whether a `show` line ends inside a double-quoted word (see show_words)."""
    inside, escaped = False, False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and inside:
            escaped = True
        elif char == '"':
            inside = not inside
    return inside


def show_words(line: str) -> list[str]:
    """The words of a list property as `systemctl show` prints them (systemd's shell_maybe_quote,
    src/basic/escape.c): a word with a space, a control character or one of `"\\`$'` (and a few more)
    is double-quoted, and inside the quotes `"`, `\\`, backquote and `$` carry a backslash; any other
    backslash is itself. Not shlex: shlex keeps the backslash of `\\$`."""
    words, word, inside, started, chars = [], [], False, False, iter(line)
    for char in chars:
        if inside and char == "\\":
            nxt = next(chars, "")
            word.append(nxt if nxt in '"\\`$' else "\\" + nxt)
        elif char == '"':
            inside, started = not inside, True
        elif char in " \t" and not inside:
            if started or word:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(char)
    if started or word:
        words.append("".join(word))
    return words


def environment(props: Props) -> list[tuple[str, str]]:
    """Production's Environment= as (name, value), read from `systemctl show` (show_words)."""
    entries = []
    for line in props.get("Environment", []):
        for entry in show_words(line):
            name, sep, value = entry.partition("=")
            if sep:
                entries.append((name, value))
    return entries


def env_file_text(entries: list[tuple[str, str]]) -> str:
    """An EnvironmentFile= holding `entries` as systemd reads them back (src/basic/env-file.c: no
    expansion): single-quoted (nothing is special inside), or double-quoted with `\\`, `"`, `$` and
    backquote escaped when a value holds a single quote."""
    lines = []
    for name, value in entries:
        if "'" not in value:
            lines.append(f"{name}='{value}'")
        else:
            escaped = re.sub(r'([\\"$`])', r"\\\1", value)
            lines.append(f'{name}="{escaped}"')
    return "".join(f"{line}\n" for line in lines)


def env_files(props: Props) -> list[tuple[str, bool]]:
    """Production's EnvironmentFile= entries as (path or glob, required), in order."""
    files = []
    for entry in props.get("EnvironmentFiles", []):
        match = _ENV_FILE.match(entry)
        if match:
            files.append((match["path"], match["ignore"] == "no"))
        elif entry:
            files.append((entry, True))
    return files


def unreproducible(props: Props) -> str | None:
    """Why the check cannot run production's unit as its own, or None."""
    kind = _last(props, "Type")
    if kind in UNREPRODUCIBLE_TYPES:
        return f"Type={kind}: {UNREPRODUCIBLE_TYPES[kind]}"
    return None


def copied_properties(props: Props) -> list[str]:
    """`NAME=VALUE` for every execution setting production's unit applies (PROPERTIES)."""
    return [setting for prop in PROPERTIES for setting in prop.to_run(props)]


def literal_argv(argv: list[str]) -> list[str]:
    """argv systemd passes on as written: it expands `$VAR` in a transient unit's command (252 has no
    `--expand-environment=`, 254 added it), and `$$` is a literal `$` on every version."""
    return [word.replace("$", "$$") for word in argv]


def systemd_run_argv(
    name: str, production: str, argv: list[str], props: Props, *, was_active: bool,
    runtime_max_s: float, systemctl: str, own_env_file: str | None, expand_environment: bool = True,
) -> list[str]:  # fmt: skip
    """`systemd-run` starting the check unit `name` with `argv` (no wait: its start waits for
    production's stop, minutes for a large model).

    `systemctl`: run by ExecStopPost with full privileges (`+`) whatever User= the check unit has (a
    bare name: systemd >= 239 looks it up in its own PATH); `--no-block`: a blocking start queued while
    this unit deactivates would wait on its own stop. `expand_environment` False (production's
    ExecStart has the `:` prefix): `$` reaches the server as written."""
    about = f"--description=eagle3-pipeline serve check of {production} (a draft; stops by itself)"
    run = ["systemd-run", f"--unit={name}", "--collect", "--no-block", "--quiet", about]
    settings = [
        f"Conflicts={production}", f"After={production}", "Restart=no",
        f"RuntimeMaxSec={max(1, int(runtime_max_s))}", *copied_properties(props),
    ]  # fmt: skip
    if own_env_file:
        settings.append(f"EnvironmentFile=-{own_env_file}")
    settings += [f"EnvironmentFile=-{path}" for path, _ in env_files(props)]
    if was_active:  # the restore systemd owns: production again, however this unit stops
        settings.append(f"ExecStopPost=-+{systemctl} --no-block start -- {production}")
    if own_env_file:  # it may hold secrets: gone with the unit, whoever stops it; after the restore
        settings.append(f"ExecStopPost=-+/bin/rm -f -- {own_env_file}")
    for setting in settings:
        run += ["-p", setting]
    return [*run, "--", *(argv if expand_environment else literal_argv(argv))]


def lease_argv(check: str, lease_s: float, systemctl: str) -> list[str]:
    """`systemd-run` arming the check unit's lease: a transient timer that stops the check unit
    `lease_s` after its (re)start, part of the check unit (gone with it). Renewed by restarting the
    timer (OnActiveSec= counts from the timer's activation; RuntimeMaxSec= cannot be changed on a
    running unit in 252)."""
    lease = lease_name(check)
    return [
        "systemd-run", f"--unit={lease}", "--collect", "--quiet", f"--on-active={max(1, int(lease_s))}",
        f"--timer-property=PartOf={check}", "--timer-property=AccuracySec=1s", "-p", f"PartOf={check}",
        f"--description=eagle3-pipeline lease of {check}: stops it unless the pipeline renews it",
        "--", systemctl, "--no-block", "stop", "--", check,
    ]  # fmt: skip
