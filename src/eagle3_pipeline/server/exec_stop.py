"""ExecStop=/ExecStopPost= commands that reach beyond the unit's own processes.

systemd stops a unit by signalling its own control group (KillMode=, systemd.kill(5)); an ExecStop=
runs in addition, and whatever it signals is not bounded by the cgroup. Stopping vLLM by pattern
(`pkill -f vllm`, `killall python`), killing PIDs other than `$MAINPID` (`kill $(cat /run/x.pid)`,
`kill -9 -1`, `fuser -k /dev/nvidia*`), or stopping other units or containers (`systemctl stop
other.service`, `docker stop other`) can take down other servers on the box: the serve check stops and
starts this unit, so each such command is named in server.json's warnings.
"""

from __future__ import annotations

import posixpath

from eagle3_pipeline.server import shell_script
from eagle3_pipeline.server.unit import ExecCommand

_OWN_PIDS = ("$MAINPID", "${MAINPID}", "-$MAINPID", "-${MAINPID}")  # the main process (its group)
_UNIT_VERBS = {"stop", "kill", "restart", "try-restart", "reload-or-restart", "isolate", "disable",
               "mask", "halt", "poweroff", "reboot", "kexec", "emergency", "rescue"}  # fmt: skip
_CONTAINER_VERBS = {"stop", "kill", "rm", "restart", "pause"}


def reach_warnings(commands: list[ExecCommand], unit_name: str, own_containers: set[str]) -> list[str]:
    """A warning for each ExecStop=/ExecStopPost= command (also inside `sh -c`) that acts beyond this
    unit: `own_containers` are the names this unit's container runs under (`docker run --name X`)."""
    warnings = []
    for command in commands:
        for argv in _simple_commands(command.program_words()):
            why = _reach(argv, unit_name, own_containers)
            if why:
                shown = " ".join(argv)
                warnings.append(
                    f"{command.key}= runs `{shown}`, which {why}: it can stop processes that are not this "
                    "unit's (other vLLM servers on this host); systemd already stops the unit's own "
                    "processes (KillMode=), so prefer no ExecStop= or `kill -s TERM $MAINPID`"
                )
    return warnings


def _simple_commands(words: list[str]) -> list[list[str]]:
    """The command itself, or each command of the script a shell runs (variables left as written)."""
    at = shell_script.shell_c_at(words)
    if at is None:
        return [words]
    script = words[at[1] + 1] if at[1] + 1 < len(words) else ""
    out: list[list[str]] = []
    for command in shell_script.commands_of(script):
        out.extend(_simple_commands(command))
    return out


def _reach(argv: list[str], unit_name: str, own_containers: set[str]) -> str | None:
    """Why argv acts beyond the unit, or None."""
    argv = _past_launchers(argv)
    if not argv:
        return None
    name = posixpath.basename(argv[0])
    args = argv[1:]
    if name in ("pkill", "killall", "killall5", "pgrep", "skill", "snice"):
        return "selects processes by name or pattern"
    if name == "fuser" and any(a.startswith("-") and "k" in a.lstrip("-") for a in args):
        return "kills every process using a file"
    if name == "nvidia-smi" and any(a in ("-r", "--gpu-reset") for a in args):
        return "resets a GPU, whoever uses it"
    if name == "kill":
        others = [t for t in kill_targets(args) if t not in _OWN_PIDS]
        return f"signals {' '.join(others)}, not only $MAINPID" if others else None
    if name == "systemctl":
        return _systemctl_reach(args, unit_name)
    if name in ("docker", "podman", "nerdctl") and args:
        verbs = [a for a in args if not a.startswith("-")]
        if verbs and verbs[0] in _CONTAINER_VERBS:
            targets = [t for t in verbs[1:] if t not in own_containers]
            if targets:
                return f"{verbs[0]}s the container(s) {' '.join(targets)}, not this unit's own"
    return None


def kill_targets(args: list[str]) -> list[str]:
    """The PIDs `kill ARGS` signals: options (`-9`, `-TERM`, `-s SIG`, `-n NUM`) come first; after
    them, or after `--`, a negative number is a process group (`kill -9 -1`: every process)."""
    k = 0
    if args and args[0].startswith("-") and args[0] != "--":  # kill takes one signal option
        k = 2 if args[0] in ("-s", "-n", "--signal") else 1
    return args[k + (k < len(args) and args[k] == "--") :]


def _systemctl_reach(args: list[str], unit_name: str) -> str | None:
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] not in _UNIT_VERBS:
        return None
    others = [u for u in words[1:] if u not in (unit_name, unit_name.removesuffix(".service"))]
    if words[0] in ("halt", "poweroff", "reboot", "kexec", "emergency", "rescue", "isolate"):
        return f"runs `systemctl {words[0]}` for the whole machine"
    return f"runs `systemctl {words[0]}` on other units ({' '.join(others)})" if others else None


def _past_launchers(argv: list[str]) -> list[str]:
    """argv without leading `sudo`, `env NAME=V`, `timeout N`, `nice`, `exec` and the like."""
    k = 0
    while k < len(argv):
        base = posixpath.basename(argv[k])
        if base in ("sudo", "env", "nice", "ionice", "nohup", "exec", "command", "setsid", "stdbuf"):
            k += 1
            while k < len(argv) and (argv[k].startswith("-") or "=" in argv[k]):
                k += 1
        elif base == "timeout":
            k += 1
            while k < len(argv) and argv[k].startswith("-"):
                k += 1
            k += 1  # the duration
        else:
            break
    return argv[k:]
