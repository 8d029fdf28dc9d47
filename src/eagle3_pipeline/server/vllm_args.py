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
from eagle3_pipeline.server.shell_script import SHELLS
from eagle3_pipeline.server.unit import Unresolved
from eagle3_pipeline.server.vllm_find import API_SERVER_MODULES, find_vllm, runs_server, through_shell
from eagle3_pipeline.vllm_flags import ALIASES, BOOLEAN_FLAGS, MULTI_VALUE_FLAGS, OPTIONAL_VALUE_FLAGS

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("flag", "vllm serve", "--config"),
    ("flag", "vllm serve", "--disable-log-stats"),
    ("flag", "vllm serve", "--enable-per-request-metrics"),
    ("flag", "vllm serve", "--enforce-eager"),
    ("flag", "vllm serve", "--host"),
    ("flag", "vllm serve", "--model"),
    ("flag", "vllm serve", "--per-request-spec-decode-metrics"),
    ("flag", "vllm serve", "--port"),
    ("flag", "vllm serve", "--speculative-config"),
    ("literal", "vllm/config/speculative.py", "eagle3"),
    ("literal", "vllm/", "summary"),
)


__all__ = ["API_SERVER_MODULES", "SHELLS", "find_vllm", "runs_server"]  # re-exported for callers


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
    line, shell, shell_prefix = through_shell(argv, unit_env, read_file, cwd)
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
