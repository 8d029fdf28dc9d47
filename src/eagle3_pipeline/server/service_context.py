"""What a service runs with on its host, as systemd.exec(5) sets it up: its environment (Environment=
then every EnvironmentFile= match), the variables systemd itself gives it, its User's home and its
working directory. Files are read and globs expanded on the host (local or over SSH)."""

from __future__ import annotations

import posixpath
import re
import shlex

from eagle3_pipeline.server.remote import LocalHost, RemoteHost
from eagle3_pipeline.server.shell_script import SHELLS
from eagle3_pipeline.server.unit import ServiceUnit, Unresolved, parse_environment_file

Host = LocalHost | RemoteHost


def resolve_environment(unit: ServiceUnit, host: Host) -> dict[str, str]:
    """Environment= then each EnvironmentFile= in order (systemd's exec_context_load_environment): a
    glob loads every match, sorted; `-` makes a missing file (or a glob matching nothing) fine; a
    later file overrides an earlier one."""
    env = dict(unit.environment)
    for pattern, optional in unit.environment_files:
        paths = env_file_matches(pattern, host) if _GLOB_CHARS.search(pattern) else [pattern]
        if not paths and not optional:
            unit.unresolved.append(
                Unresolved(f"EnvironmentFile={pattern}", "no file matches it; systemd would not start")
            )
        for path in paths:
            try:
                env.update(parse_environment_file(host.read_file(path), unit.warnings, path))
            except FileNotFoundError as err:
                if not optional:
                    unit.unresolved.append(
                        Unresolved(
                            f"EnvironmentFile={path}", f"cannot read it ({err}); systemd would not start"
                        )
                    )
            except (OSError, UnicodeDecodeError) as err:  # systemd (root) may read what this user cannot
                unit.unresolved.append(
                    Unresolved(
                        f"EnvironmentFile={path}", f"cannot be read here ({err}): its variables are unknown"
                    )
                )
    return env


_GLOB_CHARS = re.compile(r"[*?\[]")


def env_file_matches(pattern: str, host: Host) -> list[str]:
    """The files a glob matches on the host, sorted bytewise (glob(3) in the C locale, as systemd
    runs it; hidden files only where the pattern names the dot)."""
    res = host.run(f'for f in {shell_glob(pattern)}; do [ -e "$f" ] && printf "%s\\n" "$f"; done; true')
    return sorted(line for line in res.stdout.splitlines() if line) if res.ok else []


def shell_glob(pattern: str) -> str:
    """`pattern` for a POSIX shell: the glob characters (`*`, `?`, `[...]`) left bare, the rest quoted."""
    out, i = [], 0
    for match in re.finditer(r"\*|\?|\[!?\]?[^\]/]*\]", pattern):
        out += [shlex.quote(pattern[i : match.start()]) if match.start() > i else "", match.group(0)]
        i = match.end()
    out.append(shlex.quote(pattern[i:]) if i < len(pattern) else "")
    return "".join(out)


def may_use_home(argv: list[str]) -> bool:
    """True when the command may read $HOME or `~` (a shell runs it, or a script)."""
    return any(posixpath.basename(w) in SHELLS for w in argv[:3]) or bool(argv and argv[0].endswith(".sh"))


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"  # systemd.exec(5), merged /usr


def systemd_variables(unit: ServiceUnit, home: str | None) -> dict[str, str]:
    """What systemd itself puts in a service's environment and a shell may read (systemd.exec(5),
    "Environment Variables in Spawned Processes"): $PATH (the system manager's fixed value), and
    $USER, $LOGNAME and $HOME where User= is set."""
    variables = {"PATH": SYSTEM_PATH}
    if unit.user and home is not None:
        variables.update({"USER": unit.user, "LOGNAME": unit.user, "HOME": home})
    return variables


def user_home(unit: ServiceUnit, host: Host) -> str | None:
    """The home folder of the unit's User= (root's, /root, without one), from the host's user
    database; None when it cannot be read (recorded as unresolved for `WorkingDirectory=~`)."""
    if not unit.user or unit.user in ("root", "0"):
        return "/root"
    res = host.run(f"getent passwd -- {shlex.quote(unit.user)}")
    fields = res.stdout.strip().split(":") if res.ok else []
    if len(fields) >= 6 and fields[5]:
        return fields[5]
    if unit.working_directory == "~":
        unit.unresolved.append(
            Unresolved(
                "User=", f"the home folder of {unit.user!r} cannot be read on the host (getent passwd)"
            )
        )
    return None


def working_directory(unit: ServiceUnit, home: str | None) -> str | None:
    """The folder the service runs in (systemd.exec(5) WorkingDirectory=): `~` is the User's home, a
    path is taken as it is, and without the setting it is `/`; None when it is `~` and the home is not
    known. A path that is neither (`~/x`, relative) is ignored by systemd with a warning."""
    value = unit.working_directory
    if value is None:
        return "/"
    if "%" in value:  # a specifier the snapshot does not resolve (`%h`): already listed unresolved
        return None
    if value == "~":
        if home is None:
            unit.unresolved.append(
                Unresolved("WorkingDirectory=", "~ is the User's home, which is not known")
            )
        return home
    if not value.startswith("/"):
        unit.warnings.append(f"WorkingDirectory={value}: not an absolute path or ~; systemd ignores it")
        return "/"
    return posixpath.normpath(value)
