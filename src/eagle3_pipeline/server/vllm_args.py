"""Reading a vLLM server's command line: which words are vLLM's, and what its flags say.

Recognised launchers: `vllm serve MODEL ...`, `python -m vllm.entrypoints.openai.api_server --model
...` (also `vllm.entrypoints.cli.main serve`), behind `env` (`NAME=V`, `-u NAME`, `-i`), `uv run`,
`conda run`, `numactl`, `taskset`, `nice`, `ionice`, `stdbuf` and the like (anything before the vLLM
words is the launcher), in a shell: `bash -c 'SCRIPT' NAME ARGS`, `bash FILE ARGS` or a script run by
path, followed as bash runs it (`shell_script.py`: positional parameters, assignments, `cd`) through
scripts that run scripts, or in a container (`docker run` / `podman run`, see `container.py`).
Flags: `--flag value`, `--flag=value`, underscores for dashes, short aliases (`-tp`), `--no-`
booleans, multi-value flags, and `--config args.yaml` (values from the file, the command line wins; a
relative path against the folder vLLM runs in).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from eagle3_pipeline.server import container as containers
from eagle3_pipeline.server import shell_script
from eagle3_pipeline.server._vllm_flags import ALIASES, BOOLEAN_FLAGS, MULTI_VALUE_FLAGS, OPTIONAL_VALUE_FLAGS
from eagle3_pipeline.server.shell_script import SHELLS, script_option_at
from eagle3_pipeline.server.unit import Unresolved

API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
SHELL_OPERATORS = ("&&", "||", ";", "|", "&")


@dataclass
class VllmCommand:
    """The vLLM part of a command line: launcher words, the model, and the flags as given."""

    launcher: list[str]
    model: str | None
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # set by an `env` launcher or the container
    unresolved: list[Unresolved] = field(default_factory=list)
    found: bool = True  # False when no vLLM launcher was recognised
    env_unset: list[str] = field(default_factory=list)  # `env -u NAME`
    env_cleared: bool = False  # `env -i`, or a container: the unit's environment does not reach vLLM
    container: containers.ContainerRun | None = None
    cwd: str | None = "/"  # where vLLM runs (WorkingDirectory, or where its script `cd`s); None: unknown

    def host_path(self, path: str, cwd: str | None) -> str | None:
        """Where a file vLLM names lives on the host (through a container's bind mounts; a relative
        path against the folder vLLM runs in); None when it is inside a container image or relative
        to a folder that is not known."""
        if self.container is not None:
            return self.container.host_path(path)
        if path.startswith("/"):
            return path
        return posixpath.normpath(posixpath.join(cwd, path)) if cwd else None

    def apply_env(self, unit_env: dict[str, str]) -> dict[str, str]:
        """The environment vLLM runs with, from the unit's and this command's launchers."""
        env = {} if self.env_cleared else dict(unit_env)
        for name in self.env_unset:
            env.pop(name, None)
        return {**env, **self.env}


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


def canonical_flag(name: str) -> str:
    """`--max_model_len` -> `--max-model-len`; `-tp` -> `--tensor-parallel-size`."""
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return ALIASES.get(name, name)


def _is_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def parse_flags(words: list[str], positional_model: bool) -> tuple[str | None, dict[str, Any], list[str]]:
    """Parse vLLM arguments into (positional model, {canonical flag: value}, stray positionals).

    Booleans are True/False, multi-value flags lists, others strings; a repeated flag: last wins.
    """
    model, flags, stray = None, {}, []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not _is_flag(word):
            if positional_model and model is None and not flags.get("--model"):
                model = word
            else:
                stray.append(word)
            continue
        if word.startswith("-O") and not word.startswith("--") and len(word) > 2:
            flags["-O"] = word[2:].lstrip("=")
            continue
        name, eq, inline = word.partition("=")
        name = canonical_flag(name)
        negated = name.startswith("--no-") and "--" + name[5:] in BOOLEAN_FLAGS
        if negated or name in BOOLEAN_FLAGS:
            value: Any = inline.lower() not in ("false", "0", "no") if eq else True
            flags["--" + name[5:] if negated else name] = not value if negated else value
        elif eq:
            flags[name] = [inline] if name in MULTI_VALUE_FLAGS else inline
        elif name in MULTI_VALUE_FLAGS:
            values = []
            while i < len(words) and not _is_flag(words[i]):
                values.append(words[i])
                i += 1
            flags[name] = values
        elif name in OPTIONAL_VALUE_FLAGS or i >= len(words) or _is_flag(words[i]):
            has_value = i < len(words) and not _is_flag(words[i])
            flags[name] = words[i] if has_value else True
            i += 1 if has_value else 0
        else:
            flags[name] = words[i]
            i += 1
    return model, flags, stray


def config_file_flags(text: str, path: str) -> dict[str, Any]:
    """`--config args.yaml`: keys are flag names without dashes; values typed by YAML."""
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a vLLM --config file must be a YAML mapping of flag: value")
    flags = {}
    for key, value in data.items():
        name = canonical_flag("--" + str(key))
        if isinstance(value, dict):
            value = json.dumps(value, sort_keys=True)
        elif isinstance(value, list):
            value = [str(v) for v in value]
        elif not isinstance(value, bool):
            value = str(value)
        flags[name] = value
    return flags


def parse_command(
    argv: list[str], read_file: Any, cwd: str | None, env: dict[str, str] | None = None
) -> VllmCommand:
    """Find vLLM in argv (behind launchers, in a `sh -c` script, in the shell wrapper script argv runs,
    or in a container) and read its flags, following `--config FILE` through `read_file(path)`;
    a relative path is read against `cwd` (the unit's WorkingDirectory, or where the script `cd`s)."""
    unit_env = env or {}
    unresolved: list[Unresolved] = []
    line, shell, shell_prefix = _through_shell(argv, unit_env, read_file, cwd)
    if shell is not None:
        unresolved.extend(shell.unresolved)
        cwd = shell.cwd or cwd
    run, command_words = _container(line, unit_env, read_file, unresolved)
    found = find_vllm(command_words) if command_words is not None else None
    if found is None:
        why = (
            f"ExecStart runs {argv[0] if argv else '(nothing)'!r}, not `vllm serve` or "
            "`python -m vllm.entrypoints.openai.api_server`, and no vLLM command was found in it; "
            "set server.base_url and check the command by hand"
        )
        if not any(u.what == "model" for u in unresolved):  # the container's reason says it better
            unresolved.append(Unresolved("model", why))
        return VllmCommand(launcher=argv, model=None, found=False, container=run, unresolved=unresolved)
    launcher, words, _ = found
    positional_model = not launcher[-1].startswith("vllm.entrypoints")
    model, flags, stray = parse_flags(words, positional_model)
    set_env, unset, cleared = env_effects(line if run is None else command_words)
    command = VllmCommand(
        launcher=[*shell_prefix, *launcher], model=model, env=set_env, unresolved=unresolved,
        env_unset=unset, env_cleared=cleared or run is not None, container=run, cwd=cwd,
    )  # fmt: skip
    if shell is not None and run is None:  # the script's own assignments and exports win
        command.env = {**_changed(shell.env, unit_env), **set_env}
        command.env_unset = [*(v for v in unit_env if v not in shell.env), *unset]
    if run is not None:  # the container sees its -e/--env-file variables, not the unit's
        command.env = {**run.env, **set_env}
        command.unresolved.extend(run.unresolved)
    if stray:
        command.unresolved.append(Unresolved("args", f"unexpected positional words {len(stray)} ignored"))
    _apply_config_file(command, flags, read_file, cwd)
    command.flags.update(flags)
    if command.model is None and isinstance(command.flags.get("--model"), str):
        command.model = command.flags["--model"]
    if command.model is None:
        command.unresolved.append(Unresolved("model", "no model given on the command line or in --config"))
    return command


def _changed(env: dict[str, str], before: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if before.get(name) != value}


MAX_SCRIPT_DEPTH = 4  # scripts that run scripts: followed this deep


def _through_shell(
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
        _through_shell(run.argv, run.env, read_file, run.cwd or cwd, depth + 1)
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
    _, run, _ = _through_shell(words, {}, read_file, cwd, depth + 1)
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


def _container(
    line: list[str], unit_env: dict[str, str], read_file: Any, unresolved: list[Unresolved]
) -> tuple[containers.ContainerRun | None, list[str] | None]:
    """(the container run, the argv inside it) when `line` (or its `sh -c` script) runs a container;
    (None, line) otherwise; (run, None) when the image's command is unknown."""
    for candidate in [line]:
        run = containers.parse_run(candidate, unit_env, read_file)
        if run is None:
            continue
        command = run.command()
        if command is None and run.args and find_vllm(run.args) is not None:
            command = run.args  # the image runs its arguments: they name vLLM themselves
        if command is None:
            unresolved.append(
                Unresolved(
                    "model",
                    f"{run.engine} runs the image {run.image!r}, whose entrypoint is unknown here: use "
                    "vllm/vllm-openai, pass --entrypoint, or name `vllm serve` after the image",
                )
            )
        return run, command
    return None, line


def env_effects(words: list[str]) -> tuple[dict[str, str], list[str], bool]:
    """What `env` launchers in words do: (variables set, variables unset, environment cleared)."""
    assigned: dict[str, str] = {}
    unset: list[str] = []
    cleared = False
    i = 0
    while i < len(words):
        if os.path.basename(words[i]) != "env":
            i += 1
            continue
        i += 1
        while i < len(words):
            word = words[i]
            if word in ("-i", "--ignore-environment", "-"):
                cleared, assigned = True, {}
            elif word in ("-u", "--unset") and i + 1 < len(words):
                unset.append(words[i + 1])
                assigned.pop(words[i + 1], None)
                i += 1
            elif word.startswith(("--unset=", "-u")) and len(word) > 2:
                unset.append(word.split("=", 1)[1] if word.startswith("--") else word[2:])
            elif word in ("-C", "--chdir") and i + 1 < len(words):
                i += 1
            elif word.startswith("-") and word != "--":
                pass  # -0, -v, --chdir=DIR and the like change nothing vLLM reads
            elif "=" in word and word != "--":
                name, value = word.split("=", 1)
                assigned[name] = value
            elif word != "--":
                break
            i += 1
    return assigned, unset, cleared


def _apply_config_file(command: VllmCommand, flags: dict[str, Any], read_file: Any, cwd: str | None) -> None:
    """Values from `--config FILE` (the command line wins); a file in a container image is reported."""
    config_path = flags.get("--config")
    if not isinstance(config_path, str):
        return
    full = command.host_path(config_path, cwd)
    if full is None and command.container is None:
        command.unresolved.append(
            Unresolved("--config", f"{config_path} is relative, and the folder vLLM runs in is not known")
        )
        return
    if full is None:
        command.unresolved.append(
            Unresolved("--config", f"{config_path} is inside the container image (no bind mount holds it)")
        )
        return
    try:
        from_file = config_file_flags(read_file(full), full)
    except (OSError, ValueError, yaml.YAMLError) as err:
        command.unresolved.append(Unresolved("--config", f"could not read {full}: {err}"))
        return
    file_model = from_file.pop("--model", None)
    command.flags.update(from_file)
    if command.model is None and isinstance(file_model, str):
        command.model = file_model


def _split_operators(words: list[str]) -> list[list[str]]:
    """The simple commands of a shell line (split at `;`, `&&`, `||`, `|`, `&`)."""
    segments, current = [], []
    for token in [*words, ";"]:
        if token in SHELL_OPERATORS:
            segments.append(current)
            current = []
        else:
            current.append(token)
    return segments


def parse_length(value: Any) -> int:
    """vLLM's `--max-model-len`: an int, or 32k (x1000) / 32K (x1024) / 1m / 1M."""
    text = str(value).strip()
    factors = {"k": 1000, "m": 1000**2, "g": 1000**3, "K": 1024, "M": 1024**2, "G": 1024**3}
    if text and text[-1] in factors:
        return int(float(text[:-1]) * factors[text[-1]])
    return int(text)


def eagle3_draft(checkpoint_dir: str, num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's --speculative-config for an EAGLE-3 draft (the path made absolute: the server's working
    directory may differ)."""
    model = os.path.abspath(checkpoint_dir)
    return {"method": "eagle3", "model": model, "num_speculative_tokens": num_speculative_tokens}


def supports_per_request_metrics(vllm_version: str | None) -> bool:
    """Whether a vLLM takes `--per-request-spec-decode-metrics` (0.32 and later; an unknown version is
    not trusted with a flag it may refuse at start)."""
    match = re.match(r"(\d+)\.(\d+)", vllm_version or "")
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= (0, 32)


def serving_argv(
    vllm_words: list[str],
    speculative_config: dict[str, Any] | None = None,
    host: str | None = None,
    port: int | None = None,
    enforce_eager: bool = False,
    per_request_metrics: bool = False,
) -> list[str]:
    """A vLLM command line re-pointed for the serve check: its own --speculative-config dropped (and
    `speculative_config` set instead, see `eagle3_draft`), --host/--port replaced when given,
    --enforce-eager added when asked (vLLM 0.32's CPU build feeds an EAGLE-3 draft's fc 1x hidden
    instead of 3x without it), and with `per_request_metrics` each reply's own draft counts
    (`--per-request-spec-decode-metrics summary`: the matched check's paired questions).
    Flags match in both spellings (`--port 1`, `--port=1`, underscores for dashes)."""
    drop = {"--speculative-config"} | ({"--host"} if host else set()) | ({"--port"} if port else set())
    drop |= {"--per-request-spec-decode-metrics"} if per_request_metrics and speculative_config else set()
    # (with per_request_metrics, --enable-per-request-metrics too: the timing of each reply)
    words, skip = [], False
    for word in vllm_words:
        if skip:
            skip = False
            continue
        if _flag_name(word) in drop:
            skip = "=" not in word  # `--flag value`: the value goes too
            continue
        words.append(word)
    words += (
        ["--speculative-config", json.dumps(speculative_config, separators=(",", ":"))]
        if speculative_config
        else []
    )
    words += ["--host", host] if host else []
    words += ["--port", str(port)] if port else []
    if enforce_eager and "--enforce-eager" not in {_flag_name(w) for w in words}:
        words.append("--enforce-eager")
    names = {_flag_name(w) for w in words}
    if per_request_metrics and speculative_config:
        words += ["--per-request-spec-decode-metrics", "summary"]
    # each reply's time to first token and inter-token latency (the speedup's); refused beside
    # --disable-log-stats, which the unit may set
    if per_request_metrics and not names & {"--enable-per-request-metrics", "--disable-log-stats"}:
        words.append("--enable-per-request-metrics")
    return words


def _flag_name(word: str) -> str:
    return word.split("=", 1)[0].replace("_", "-") if word.startswith("--") else word
