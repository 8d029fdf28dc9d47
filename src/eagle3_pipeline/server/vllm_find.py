"""Where vLLM is in a command line: behind launchers, in a shell script (`SHELL -c SCRIPT NAME ARGS`,
`SHELL FILE ARGS`, a script run by path, followed as bash runs it by `shell_script`), through scripts
that run scripts, up to MAX_SCRIPT_DEPTH levels. Script files are read as data, never run."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from eagle3_pipeline.server import container as containers
from eagle3_pipeline.server import shell_script
from eagle3_pipeline.server.shell_script import SHELLS, script_option_at

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
# (vllm.entrypoints.api_server, the legacy server of older releases, is only recognised in a unit)
VLLM_NAMES = (
    ("module", "vllm.entrypoints.openai.api_server"),
    ("module", "vllm.entrypoints.cli.main"),
)
API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


def find_vllm(argv: list[str]) -> tuple[list[str], list[str], dict[str, str]] | None:
    """Split argv into (launcher, vLLM arguments, env from `env`); None when no vLLM is found."""
    env: dict[str, str] = {}
    for i, word in enumerate(argv):
        base = os.path.basename(word)
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return argv[: i + 2], argv[i + 2 :], env
        if word == "-m" and i + 1 < len(argv):
            module = argv[i + 1]
            if module in API_SERVER_MODULES:
                return argv[: i + 2], argv[i + 2 :], env
            if module == "vllm.entrypoints.cli.main" and argv[i + 2 : i + 3] == ["serve"]:
                return argv[: i + 3], argv[i + 3 :], env
        if base in SHELLS and (c_at := script_option_at(argv, i)) is not None:
            run = _follow_shell(argv, i, c_at, {}, None)
            found = find_vllm(run.argv) if run.argv else None
            if found:
                return [*argv[: c_at + 1], *found[0]], found[1], {**env, **found[2]}
            return None
        if "=" in word and not word.startswith("-") and i > 0 and os.path.basename(argv[0]) == "env":
            name, value = word.split("=", 1)
            env[name] = value
    return None


def _follow_shell(
    argv: list[str], shell_at: int, c_at: int, env: dict[str, str], cwd: str | None
) -> shell_script.ShellRun:
    """Follow the script of `SHELL -c SCRIPT [NAME [ARGS...]]` at argv[shell_at] to the command that
    runs vLLM or a container: NAME is its `$0` (the shell's own name when absent), ARGS its `$1`..."""
    script = argv[c_at + 1] if c_at + 1 < len(argv) else ""
    name = argv[c_at + 2] if c_at + 2 < len(argv) else argv[shell_at]
    where = f"{os.path.basename(argv[shell_at])} -c script"
    return shell_script.follow(script, name, argv[c_at + 3 :], env, runs_server, where, cwd)


def runs_server(words: list[str]) -> bool:
    """True when words run vLLM (behind launchers) or a container engine."""
    return find_vllm(words) is not None or containers.engine_at(words) is not None


MAX_SCRIPT_DEPTH = 4  # scripts that run scripts: followed this deep


def through_shell(
    argv: list[str], env: dict[str, str], read_file: Any, cwd: str | None, depth: int = 0
) -> tuple[list[str], shell_script.ShellRun | None, list[str]]:
    """(the command line that runs the server, the shell run that led to it, the words before it for
    the launcher: the shell, `-c` and what the scripts sourced). `SHELL -c SCRIPT NAME ARGS`, `SHELL
    FILE ARGS` and a shell script argv runs are followed, and so are the scripts they run in turn;
    argv is returned as it is otherwise."""
    step = _shell_step(argv, env, read_file, cwd, depth)
    if step is None:
        return argv, None, []
    run, head, before = step
    if run.argv is None:
        return argv, run, []
    sourced = [word for path in run.sourced for word in ("source", path, "&&")]
    inner_line, inner, inner_head = (
        through_shell(run.argv, run.env, read_file, run.cwd or cwd, depth + 1)
        if depth < MAX_SCRIPT_DEPTH
        else (run.argv, None, [])
    )
    if inner is None or inner.argv is None:
        return [*before, *run.argv], run, [*head, *sourced]
    merged = shell_script.ShellRun(
        inner.argv, inner.env, [], inner.cwd or run.cwd, [*run.sourced, *inner.sourced],
        [*run.unresolved, *inner.unresolved],
    )  # fmt: skip
    return [*before, *inner_line], merged, [*head, *sourced, *inner_head]


def _shell_step(
    argv: list[str], env: dict[str, str], read_file: Any, cwd: str | None, depth: int
) -> tuple[shell_script.ShellRun, list[str], list[str]] | None:
    """Follow one shell level of argv: (the run, the words of the shell call, the launcher words
    before the shell); None when argv runs no shell script."""

    def matches(words: list[str]) -> bool:
        return _leads_to_server(words, read_file, cwd, depth)

    at = shell_script.shell_c_at(argv)
    if at is not None:
        script = argv[at[1] + 1] if at[1] + 1 < len(argv) else ""
        name = argv[at[1] + 2] if at[1] + 2 < len(argv) else argv[at[0]]
        where = f"{os.path.basename(argv[at[0]])} -c script"
        run = shell_script.follow(script, name, argv[at[1] + 3 :], env, matches, where, cwd)
        return run, argv[: at[1] + 1], argv[: at[0]]
    call = _script_call(argv, cwd)
    if call is None:
        return None
    path, args, by_shell = call
    # systemd runs a file by path only with a `#!` line; a shell runs one without it itself
    text = _script_text(path, read_file, need_shebang=not by_shell and depth == 0)
    if text is None:
        return None
    run = shell_script.follow(text, path, args, env, matches, f"wrapper script {path}", cwd)
    return run, argv[: len(argv) - len(args)], []


def _leads_to_server(words: list[str], read_file: Any, cwd: str | None, depth: int) -> bool:
    """True when words run vLLM or a container, or a script that does (read as data)."""
    if runs_server(words):
        return True
    if depth >= MAX_SCRIPT_DEPTH:
        return False
    call = _script_call(words, cwd)
    if shell_script.shell_c_at(words) is None and (call is None or not (call[2] or call[0].endswith(".sh"))):
        return False  # inside a script, only `*.sh` and shell-named calls are read (not every binary)
    _, run, _ = through_shell(words, {}, read_file, cwd, depth + 1)
    return run is not None and run.argv is not None


def _script_call(argv: list[str], cwd: str | None) -> tuple[str, list[str], bool] | None:
    """(the script's path, its arguments, whether a shell is named) for `SHELL [-opts] FILE ARGS` or a
    script run by path (`/opt/start.sh`, `./start.sh` against cwd); None otherwise."""
    if not argv or find_vllm(argv) is not None or containers.engine_at(argv) is not None:
        return None
    if posixpath.basename(argv[0]) in SHELLS:
        k = 1
        while k < len(argv) and argv[k].startswith("-") and argv[k] not in ("-", "--"):
            if not argv[k].startswith("--") and "c" in argv[k][1:]:
                return None  # `-c`: a script string, not a file
            k += 1
        k += k < len(argv) and argv[k] == "--"
        return (_against(argv[k], cwd), argv[k + 1 :], True) if k < len(argv) else None
    if argv[0].startswith(("/", "./", "../")):
        return _against(argv[0], cwd), argv[1:], False
    return None


def _against(path: str, cwd: str | None) -> str:
    return path if path.startswith("/") or not cwd else posixpath.normpath(posixpath.join(cwd, path))


def _script_text(path: str, read_file: Any, need_shebang: bool) -> str | None:
    """The text of a shell script (read as data), or None: unreadable, binary, or (run by path) a file
    whose `#!` line names no shell."""
    try:
        text = read_file(path)
    except (OSError, UnicodeDecodeError):
        return None
    if "\0" in text[:4096]:
        return None
    first = text.splitlines()[0] if text else ""
    shebang = first[2:].split()[:2] if first.startswith("#!") else []
    if need_shebang and not any(os.path.basename(word) in SHELLS for word in shebang):
        return None
    return text


_SENTINEL = "--eagle3-pipeline-appended-word"


def appended_words_reach_vllm(argv: list[str], read_file: Any, cwd: str | None = "/") -> bool:
    """True when words added at the end of argv end up at the end of vLLM's own command line: argv
    runs vLLM directly, or a shell whose vLLM line ends in `"$@"` (`bash -c '... exec vllm serve
    "$@"' name ARGS`, or a wrapper script run with ARGS). Then a check can add flags (a draft) to
    such an ExecStart as it adds them to a plain `vllm serve`; otherwise (a shell -c string that names
    its own flags) they would land outside vLLM."""
    if shell_script.shell_c_at(argv) is None and _script_call(argv, cwd) is None:
        return find_vllm(argv) is not None
    line, run, _ = through_shell([*argv, _SENTINEL], {}, read_file, cwd)
    return run is not None and run.argv is not None and find_vllm(line) is not None and line[-1] == _SENTINEL
