"""The serve check's own systemd unit: a transient unit (`systemd-run`) that runs production's command
with the draft, under the execution settings production's unit really applies, read from
`systemctl show` (User, Group, WorkingDirectory, environment, limits, CPU/NUMA/device settings,
sandboxing), with `Conflicts=` production (systemd never runs both), `Restart=no`, `RuntimeMaxSec=`
bounding the check, and, when production was running, an `ExecStopPost=` that starts production again
however the check unit stops (the pipeline's stop, a crash, the time limit, the pipeline killed).

Why a transient unit and not a unit file under /run/systemd/system: a file needs `systemctl
daemon-reload` to be loaded, and a reload also loads whatever an operator saved and did not load yet
(production's edited unit would be what the restore starts). `systemd-run` needs no reload and no file
in any unit folder; with `--collect` systemd forgets the unit when it stops, failed or not.

Environment= values (which may hold secrets) never travel on a command line: they go to a 0600 file
(`env_file_text`) that the check unit reads first, production's own EnvironmentFile= entries after it,
which is the order in which systemd applies them to production.
"""

from __future__ import annotations

import re
import shlex

from eagle3_pipeline.server.dropin import ServeCheckError

PREFIX = "eagle3-serve-check-"
# Production's execution settings, as `systemctl show` names them, copied verbatim to the check unit
# with `-p NAME=VALUE` (systemd-run takes the unit-file syntax, which `show` prints). Empty values
# are left out (systemd's default then applies, as it does to production).
COPIED = (
    "Type", "User", "Group", "SupplementaryGroups", "DynamicUser", "WorkingDirectory", "RootDirectory",
    "UMask", "Nice", "OOMScoreAdjust", "CPUAffinity", "NUMAPolicy", "NUMAMask", "DevicePolicy",
    "DeviceAllow", "PrivateTmp", "PrivateDevices", "PrivateNetwork", "ProtectHome", "ProtectSystem",
    "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "BindPaths", "BindReadOnlyPaths",
    "PassEnvironment", "UnsetEnvironment", "MemoryMax", "TasksMax", "KillMode", "KillSignal",
    "Slice", "Delegate",
)  # fmt: skip
# Limits: `show` prints the hard limit as LimitX and the soft one as LimitXSoft; `-p LimitX=SOFT:HARD`.
LIMITS = ("NOFILE", "MEMLOCK", "NPROC", "CORE", "STACK", "AS", "DATA", "FSIZE", "RSS", "NICE", "RTPRIO")
MULTI = ("EnvironmentFiles", "DeviceAllow", "ReadWritePaths", "BindPaths", "BindReadOnlyPaths")
SHOWN = (*COPIED, *(f"Limit{x}" for x in LIMITS), *(f"Limit{x}Soft" for x in LIMITS),
         "Environment", "EnvironmentFiles", "TimeoutStopUSec", "LoadState")  # fmt: skip
_ENV_FILE = re.compile(r"^(?P<path>.*) \(ignore_errors=(?P<ignore>yes|no)\)$")


def unit_name(run_id: str) -> str:
    """The check unit's name: its own, with the run id (never production's, never reused)."""
    name = f"{PREFIX}{run_id}.service"
    if not re.fullmatch(r"[A-Za-z0-9:_.-]+", name):
        raise ServeCheckError(f"{run_id!r} cannot be part of a unit name")
    return name


def parse_show(text: str) -> dict[str, list[str]]:
    """`systemctl show` output as NAME -> values (a property printed on several lines, such as
    EnvironmentFiles or DeviceAllow, keeps every line)."""
    props: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            props.setdefault(name, []).append(value)
    return props


def environment(props: dict[str, list[str]]) -> list[tuple[str, str]]:
    """Production's Environment= as (name, value), read from `systemctl show`: one line of entries,
    an entry with spaces or quotes double-quoted with backslash escapes (systemd >= 246, PR 15345;
    a C escape such as `\\n` inside one is kept as written)."""
    entries = []
    for line in props.get("Environment", []):
        for entry in shlex.split(line):
            name, sep, value = entry.partition("=")
            if sep:
                entries.append((name, value))
    return entries


def env_file_text(entries: list[tuple[str, str]]) -> str:
    """An EnvironmentFile= holding `entries` as systemd reads them back: single-quoted (nothing is
    expanded inside), or double-quoted with `\\`, `"`, `$` and backquote escaped when a value holds a
    single quote."""
    lines = []
    for name, value in entries:
        if "'" not in value:
            lines.append(f"{name}='{value}'")
        else:
            escaped = re.sub(r'([\\"$`])', r"\\\1", value)
            lines.append(f'{name}="{escaped}"')
    return "".join(f"{line}\n" for line in lines)


def env_files(props: dict[str, list[str]]) -> list[str]:
    """Production's EnvironmentFile= entries (globs as written, `-` when missing is fine), in order."""
    files = []
    for entry in props.get("EnvironmentFiles", []):
        match = _ENV_FILE.match(entry)
        if match:
            files.append(("-" if match["ignore"] == "yes" else "") + match["path"])
        elif entry:
            files.append(entry)
    return files


def copied_properties(props: dict[str, list[str]]) -> list[str]:
    """`NAME=VALUE` for every execution setting production's unit applies (see COPIED, LIMITS)."""
    out = []
    for name in COPIED:
        values = props.get(name, [])
        lines = values if name in MULTI else values[-1:]
        out += [f"{name}={v}" for v in lines if v]
    for limit in LIMITS:
        hard, soft = props.get(f"Limit{limit}", [""])[-1], props.get(f"Limit{limit}Soft", [""])[-1]
        if hard:
            out.append(f"Limit{limit}={soft}:{hard}" if soft else f"Limit{limit}={hard}")
    if stop := props.get("TimeoutStopUSec", [""])[-1]:
        out.append(f"TimeoutStopSec={stop}")
    return out


def systemd_run_argv(
    name: str, production: str, argv: list[str], props: dict[str, list[str]], *, was_active: bool,
    runtime_max_s: float, systemctl: str, own_env_file: str | None, expand_environment: bool = True,
) -> list[str]:  # fmt: skip
    """`systemd-run` starting the check unit `name` with `argv` (no wait: the start of a unit that
    conflicts production first waits for production's stop, minutes for a large model).

    `systemctl`: run by ExecStopPost with full privileges (`+`) whatever User= the check unit has (a
    bare name: systemd >= 239 looks it up in its own PATH); `--no-block`: a blocking start queued while
    this unit deactivates would wait on its own stop."""
    about = f"--description=eagle3-pipeline serve check of {production} (a draft; stops by itself)"
    run = ["systemd-run", f"--unit={name}", "--collect", "--no-block", "--quiet", about]
    if not expand_environment:  # ExecStart's `:` prefix: no $VAR expansion
        run.append("--expand-environment=no")
    settings = [
        f"Conflicts={production}", "Restart=no", f"RuntimeMaxSec={max(1, int(runtime_max_s))}",
        *copied_properties(props),
    ]  # fmt: skip
    if own_env_file:
        settings.append(f"EnvironmentFile={own_env_file}")
    settings += [f"EnvironmentFile={path}" for path in env_files(props)]
    if own_env_file:  # it may hold secrets: gone with the unit, whoever stops it
        settings.append(f"ExecStopPost=+/bin/rm -f -- {own_env_file}")
    if was_active:  # the restore systemd owns: production again, however this unit stops
        settings.append(f"ExecStopPost=+{systemctl} --no-block start -- {production}")
    for setting in settings:
        run += ["-p", setting]
    return [*run, "--", *argv]
