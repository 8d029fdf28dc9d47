"""Snapshot of the vLLM systemd service: what really runs, as server.json, identity.json and the unit.

The unit text comes from `systemctl cat` on the host (local or SSH), or from `server.unit_file` (and
its `.d/*.conf` drop-ins) where that file is on this machine or systemctl fails. server.json holds no
timestamps and no secrets: re-snapshotting an unchanged server rewrites identical files, so nothing
downstream goes stale. Jobs read server.json back through server_json.ServerSnapshot alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import shlex
from pathlib import Path
from typing import Any

from eagle3_pipeline import io, secrets, vllm_releases
from eagle3_pipeline.server import exec_stop, shell_script
from eagle3_pipeline.server.fingerprints import (
    chat_template_fingerprint,
    detect_vllm_version,
    launcher_python,
    model_fingerprint,
)
from eagle3_pipeline.server.remote import HostError, LocalHost, RemoteHost, open_host
from eagle3_pipeline.server.service_context import (
    may_use_home,
    resolve_environment,
    systemd_variables,
    user_home,
    working_directory,
)
from eagle3_pipeline.server.unit import (
    ServiceUnit,
    Unresolved,
    command_argv,
    merge_unit,
    split_cat_output,
)
from eagle3_pipeline.server.vllm_args import VllmCommand, parse_command, parse_length
from eagle3_pipeline.settings import ServerSettings

__all__ = ["detect_vllm_version", "launcher_python"]  # re-exported for callers
_launcher_python = launcher_python  # its former name, still imported by tests

log = logging.getLogger(__name__)
Host = LocalHost | RemoteHost

# the vLLM names this module relies on (vllm_compat.py checks them in each supported release's wheel)
VLLM_NAMES = (
    ("flag", "vllm serve", "--chat-template"),
    ("flag", "vllm serve", "--chat-template-content-format"),
    ("flag", "vllm serve", "--code-revision"),
    ("flag", "vllm serve", "--config"),
    ("flag", "vllm serve", "--default-chat-template-kwargs"),
    ("flag", "vllm serve", "--dtype"),
    ("flag", "vllm serve", "--enable-auto-tool-choice"),
    ("flag", "vllm serve", "--generation-config"),
    ("flag", "vllm serve", "--hf-config-path"),
    ("flag", "vllm serve", "--hf-overrides"),
    ("flag", "vllm serve", "--host"),
    ("flag", "vllm serve", "--kv-cache-dtype"),
    ("flag", "vllm serve", "--logits-processors"),
    ("flag", "vllm serve", "--max-logprobs"),
    ("flag", "vllm serve", "--max-model-len"),
    ("flag", "vllm serve", "--override-generation-config"),
    ("flag", "vllm serve", "--port"),
    ("flag", "vllm serve", "--quantization"),
    ("flag", "vllm serve", "--reasoning-parser"),
    ("flag", "vllm serve", "--revision"),
    ("flag", "vllm serve", "--seed"),
    ("flag", "vllm serve", "--served-model-name"),
    ("flag", "vllm serve", "--ssl-certfile"),
    ("flag", "vllm serve", "--tensor-parallel-size"),
    ("flag", "vllm serve", "--tokenizer"),
    ("flag", "vllm serve", "--tokenizer-mode"),
    ("flag", "vllm serve", "--tokenizer-revision"),
    ("flag", "vllm serve", "--tool-call-parser"),
    ("flag", "vllm serve", "--trust-remote-code"),
)

# Flags whose value changes what the server writes for a given request (the identity). Port, host,
# parallelism, memory and logging settings do not.
IDENTITY_FLAGS = (
    "--tokenizer",
    "--tokenizer-mode",
    "--tokenizer-revision",
    "--revision",
    "--code-revision",
    "--dtype",
    "--quantization",
    "--kv-cache-dtype",
    "--generation-config",
    "--override-generation-config",
    "--hf-overrides",
    "--hf-config-path",
    "--chat-template-content-format",
    "--default-chat-template-kwargs",
    "--seed",
    "--trust-remote-code",
    "--enable-auto-tool-choice",
    "--logits-processors",
    "--max-logprobs",
)
# Fields server.json fills from vLLM's defaults when the flag is not seen (listed as possibly wrong
# when some source of flags could not be read).
DEFAULTED_FLAGS = (
    "--served-model-name",
    "--max-model-len",
    "--reasoning-parser",
    "--tool-call-parser",
    "--trust-remote-code",
    "--chat-template",
    "--ssl-certfile",
)


class SnapshotError(RuntimeError):
    """The snapshot could not be taken; the message (secrets scrubbed) says what to fix."""


def read_unit_text(host: Host, server: ServerSettings) -> str:
    """`systemctl cat` output for the unit; the unit file and its drop-ins in the same format where the
    file is on this machine (`server.local_unit_file`), or where `systemctl cat` fails and
    server.unit_file is set."""
    unit, unit_file = server.unit, server.unit_file
    if not server.local_unit_file:
        res = host.run(f"systemctl cat --no-pager -- {shlex.quote(unit)}")
        if res.ok and res.stdout.strip():
            return res.stdout
        reason = (res.stderr.strip() or res.stdout.strip() or f"exit {res.exited}").splitlines()[0]
        if not unit_file:
            raise SnapshotError(
                f"`systemctl cat {unit}` failed on {host.name}: {reason}. Check server.unit, or set "
                "server.unit_file to the unit file's path on that host to read it without systemctl"
            )
        log.info("systemctl cat failed on %s (%s); reading %s", host.name, reason, unit_file)
    return _unit_file_text(host, unit_file)


def _unit_file_text(host: Host, unit_file: str) -> str:
    try:
        parts = [f"# {unit_file}\n{host.read_file(unit_file)}"]
    except OSError as err:
        raise SnapshotError(f"cannot read the unit file (server.unit_file) {unit_file}: {err}") from None
    dropin_dir = unit_file + ".d"
    listing = host.run(f"ls -1 -- {shlex.quote(dropin_dir)} 2>/dev/null")
    for name in sorted(listing.stdout.split()) if listing.ok else []:
        if name.endswith(".conf"):
            path = posixpath.join(dropin_dir, name)
            parts.append(f"# {path}\n{host.read_file(path)}")
    return "\n".join(part.rstrip("\n") + "\n" for part in parts)


def _select_exec(unit: ServiceUnit) -> int | None:
    if not unit.exec_start:
        unit.unresolved.append(Unresolved("ExecStart", "the unit has no ExecStart= after drop-ins"))
        return None
    candidates = [i for i, c in enumerate(unit.exec_start) if "vllm" in c.raw]
    if len(unit.exec_start) > 1 and len(candidates) != 1:
        unit.unresolved.append(
            Unresolved("ExecStart", f"{len(unit.exec_start)} ExecStart= lines; none or many run vllm")
        )
    return candidates[-1] if candidates else len(unit.exec_start) - 1


def parse_service(
    cat_text: str, unit_name: str, host: Host
) -> tuple[ServiceUnit, dict[str, str], list[str], VllmCommand]:
    """Unit text -> (unit, resolved environment, ExecStart argv, the vLLM command)."""
    unit = merge_unit(split_cat_output(cat_text, default_path=unit_name), unit_name)
    env = resolve_environment(unit, host)
    index = _select_exec(unit)
    argv = command_argv(unit.exec_start[index], env, unit.unresolved) if index is not None else []
    home = user_home(unit, host) if unit.working_directory == "~" or may_use_home(argv) else None
    cwd = working_directory(unit, home)
    command = parse_command(argv, host.read_file, cwd, {**systemd_variables(unit, home), **env})
    env.update(command.env)
    return unit, env, argv, command


def _base_url(
    host: Host, bind: str | None, port: int | None, flags: dict[str, Any], unresolved: list[Unresolved]
) -> str | None:
    scheme = "https" if flags.get("--ssl-certfile") else "http"
    if port is None:
        return None
    if bind in (None, "", "0.0.0.0", "::"):
        address = "127.0.0.1" if host.is_local else host.hostname()
    else:
        address = bind
        if not host.is_local and bind in ("127.0.0.1", "localhost", "::1"):
            unresolved.append(
                Unresolved(
                    "base_url", f"the server listens on {bind} on {host.name}; set server.tunnel: true"
                )
            )
    if ":" in address:
        address = f"[{address}]"
    return f"{scheme}://{address}:{port}"


def build_server_json(
    unit: ServiceUnit,
    env: dict[str, str],
    command: VllmCommand,
    host: Host,
    server: ServerSettings,
    redactor: secrets.Redactor | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(server.json, identity.json) from a parsed unit, secrets redacted as structures.

    Every secret value of the unit (its text, environment files, flags, `--config`) is collected into
    `redactor` (a new one salted for this host and unit when None); server.json's `redaction` holds
    their fingerprints, so that other jobs hide them too (`secrets.learn`). The process-wide
    `secrets.REDACTOR` learns them as well, for this job's logs and errors.
    """
    found = redactor or secrets.Redactor(secrets.unit_salt(host.name, unit.name))
    secrets.redact_unit_text(unit.source_text, found)  # collect what the unit's text names
    flags = command.flags
    unresolved = [*unit.unresolved, *command.unresolved]
    served = flags.get("--served-model-name")
    served_name = (served[0] if isinstance(served, list) and served else served) or command.model
    unknown = _unknown_sources(unit, command)
    container_port = _number(flags, "--port", 8000 if command.found else None, unresolved, unknown)
    bind, port = _published(command, flags.get("--host"), container_port, unresolved)
    address_unknown = bool(unknown) and "--host" not in flags and port is not None
    if address_unknown:  # no base_url from a guessed address (a config may bind one interface)
        unresolved.append(
            Unresolved("--host", f"not on the command line as read, and {unknown[0]}: set server.base_url")
        )
    if unknown:
        unseen = [f for f in DEFAULTED_FLAGS if f not in flags]
        unresolved.append(
            Unresolved(
                "flags",
                f"{', '.join(unseen)} may be set where the snapshot could not read ({unknown[0]}); "
                "server.json shows vLLM's defaults for them",
            )
        )
    cwd = command.cwd
    template = flags.get("--chat-template") if isinstance(flags.get("--chat-template"), str) else None
    template_path = command.host_path(template, cwd) if template else None
    template_digest, template_problem = chat_template_fingerprint(template, host, template_path)
    if template_problem:
        unresolved.append(Unresolved("chat_template", template_problem))
    snapshot = {
        "model": command.model,
        "served_model_name": served_name,
        "host": bind,
        "port": port,
        "base_url": server.base_url
        or (None if address_unknown else _base_url(host, bind, port, flags, unresolved)),
        "tensor_parallel_size": _number(
            flags, "--tensor-parallel-size", 1 if command.found else None, unresolved, unknown
        ),
        "max_model_len": _number(flags, "--max-model-len", None, unresolved),
        "reasoning_parser": flags.get("--reasoning-parser"),
        "tool_call_parser": flags.get("--tool-call-parser"),
        "trust_remote_code": bool(flags.get("--trust-remote-code", False)),
        "chat_template": template,
        "args": secrets.redact_flags(flags, found),
        "env": secrets.redact_env(command.apply_env(env), found),
        "unit": unit.name,
        "source_host": host.name,
    }
    fields = {
        "model": command.model,
        "served_model_name": served_name,
        "reasoning_parser": snapshot["reasoning_parser"],
        "tool_call_parser": snapshot["tool_call_parser"],
        "chat_template": None if template_digest else template,  # its content counts, not its path
        "chat_template_sha256": template_digest,
        "max_model_len": snapshot["max_model_len"],
        "model_files": model_fingerprint(_model_on_host(command), host),
        "flags": {name: flags[name] for name in IDENTITY_FLAGS if name in flags},
    }
    fields = secrets.redact_data(fields, found)
    identity = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    secrets.redact_env(env, found)  # the unit's own secrets, also where a container does not see them
    python = launcher_python(command.launcher, host) if command.found and command.container is None else None
    version = _vllm_version(command, python, host)
    if version:
        snapshot["vllm_version"] = version
    if python and python.startswith("/"):
        snapshot["python"] = python  # the unit's interpreter: hidden_states' vllm backend runs it
    snapshot["identity"] = identity
    snapshot["unresolved"] = [u.as_dict() for u in _unique(unresolved)]
    own = {command.container.name} if command.container is not None and command.container.name else set()
    stop_warnings = exec_stop.reach_warnings(unit.exec_stop, unit.name, own)
    # a vLLM outside the ranges serving and the exported draft were checked with: said here, before any
    # GPU work (extraction's own range, an error, is checked by the snapshot job: vllm_backend)
    release_warnings = [w for use in ("serve", "export") if (w := vllm_releases.check(use, version))]
    warnings = [*unit.warnings, *stop_warnings, *release_warnings]
    snapshot["warnings"] = list(dict.fromkeys(warnings))  # systemd's, and ours
    snapshot["redaction"] = found.export()
    secrets.REDACTOR.merge(found)
    return secrets.redact_data(snapshot, found), {"identity": identity, "fields": fields}


def _published(
    command: VllmCommand, bind: str | None, port: int | None, unresolved: list[Unresolved]
) -> tuple[str | None, int | None]:
    """(address, port) the host reaches vLLM at: vLLM's own, or for a container the `-p` mapping of
    its port (with `--network host`, its own)."""
    if command.container is None or port is None:
        return bind, port
    host_ip, host_port, why = command.container.host_port(port)
    if why:
        unresolved.append(Unresolved("port", why))
    return (bind, port) if command.container.network == "host" else (host_ip, host_port)


def _model_on_host(command: VllmCommand) -> str | None:
    """The model folder as the host sees it (through a container's mounts; a relative one in the
    folder vLLM runs in, as vLLM looks for a local folder before the hub); a hub id as it is."""
    model = command.model
    if model and command.container is not None and model.startswith("/"):
        return command.host_path(model, "/")
    if model and not model.startswith("/") and command.container is None and command.cwd:
        return command.host_path(model, command.cwd)  # not a folder there: no fingerprint, as a hub id
    return model


def _vllm_version(command: VllmCommand, python: str | None, host: Host) -> str | None:
    """From an official image's tag, or the launcher's Python package metadata."""
    if command.container is not None:
        return command.container.version() if command.found else None
    return detect_vllm_version(python, host)


def _number(
    flags: dict[str, Any],
    name: str,
    default: int | None,
    unresolved: list[Unresolved],
    unknown: list[str] | None = None,
) -> int | None:
    """An integer flag (`32k` forms allowed); a value that is not a number is reported, not guessed.
    vLLM's `default` stands only where every source of flags was read: with `unknown` reasons (an
    unreadable --config, an unset variable in the command) the value is unresolved."""
    value = flags.get(name)
    if value is None:
        if unknown and default is not None:
            unresolved.append(
                Unresolved(
                    name,
                    f"not on the command line as read, and {unknown[0]}: vLLM's default ({default}) is "
                    "not assumed",
                )
            )
            return None
        return default
    try:
        return parse_length(value)
    except ValueError:
        unresolved.append(Unresolved(name, f"value {value!r} is not a number"))
        return None


def _unknown_sources(unit: ServiceUnit, command: VllmCommand) -> list[str]:
    """Why the flags read may lack some the server really has (each as `what: why`): a --config not
    read; a part of the shell script's vLLM line that could not be known (a command substitution, a
    variable nothing visible sets); a variable of ExecStart= that no Environment= sets while an
    EnvironmentFile= could not be read (it may set it)."""
    reasons = [
        u
        for u in command.unresolved
        if u.what == "--config" or u.what.endswith("-c script") or u.what.startswith("wrapper script")
    ]
    env_file_unread = any(u.what.startswith("EnvironmentFile") for u in unit.unresolved)
    passed = tuple(f"${name} " for name in unit.pass_environment)  # the manager's values: not seen
    reasons += [
        u
        for u in unit.unresolved
        if u.what.startswith("ExecStart")
        and "is not set by the unit" in u.why
        and (env_file_unread or u.why.startswith(passed))
    ]
    return [f"{u.what}: {u.why}" for u in reasons]


def _unique(items: list[Unresolved]) -> list[Unresolved]:
    return list(dict.fromkeys(items))


def _write(path: str | Path, text: str) -> None:
    io.write_text(text, path)


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _log_state(host: Host, unit_name: str, argv: list[str]) -> None:
    """Log the unit's state, and warn when the running process differs from the unit's ExecStart."""
    res = host.run(f"systemctl show --no-pager -p ActiveState,SubState,MainPID -- {shlex.quote(unit_name)}")
    if not res.ok:
        log.info("systemctl show unavailable on %s; state not recorded", host.name)
        return
    state = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    log.info(
        "unit %s: %s/%s pid %s",
        unit_name,
        state.get("ActiveState"),
        state.get("SubState"),
        state.get("MainPID"),
    )
    pid = state.get("MainPID", "0")
    if pid.isdigit() and int(pid) > 0:
        cmdline = host.run(f"cat /proc/{int(pid)}/cmdline")
        running = cmdline.stdout.rstrip("\0").split("\0") if cmdline.ok else None
        # argv[0] aside (`@` sets it); a shell that exec'd vLLM runs other words than ExecStart's own
        if running and running[1:] != argv[1:] and shell_script.shell_c_at(argv) is None:
            log.warning("the running command line differs from the unit's ExecStart (edited, not restarted?)")


def take_snapshot(server: ServerSettings, host: Host) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(redacted unit text, server.json, identity.json) for `server` on `host`."""
    cat_text = read_unit_text(host, server)
    found = secrets.Redactor(secrets.unit_salt(host.name, server.unit))
    redacted_unit = secrets.redact_unit_text(cat_text, found)
    secrets.REDACTOR.merge(found)  # a parse error below may quote the unit
    unit, env, argv, command = parse_service(cat_text, server.unit, host)
    snapshot, identity = build_server_json(unit, env, command, host, server, found)
    redacted_unit = found.scrub_known(redacted_unit)  # also values met in environment files
    try:
        if not server.local_unit_file:  # no systemd state to log for a unit file read as such
            _log_state(host, server.unit, argv)
    except HostError as err:
        log.info("could not read the unit's state: %s", err)
    for item in snapshot["unresolved"]:
        log.warning("unresolved %s: %s", item["what"], item["why"])
    for warning in snapshot["warnings"]:
        log.warning("the unit: %s", warning)
    return redacted_unit, snapshot, identity


def snapshot_server(
    server: ServerSettings,
    unit_out: str,
    server_out: str,
    identity_out: str,
    ssh_config_path: str | None = None,
) -> dict[str, Any]:
    """Snapshot the server and write the three outputs; errors come out with secrets scrubbed."""
    host = open_host(server, ssh_config_path)
    try:
        unit_text, snapshot, identity = take_snapshot(server, host)
    except (SnapshotError, HostError, OSError, ValueError) as err:
        raise SnapshotError(secrets.REDACTOR.scrub(str(err))) from None
    finally:
        host.close()
    _write(unit_out, unit_text)
    _write(server_out, _dump(snapshot))  # both redacted as structures: valid JSON whatever a secret is
    _write(identity_out, _dump(identity))
    log.info(
        "server %s serves %s as %s (identity %s)",
        snapshot["base_url"],
        snapshot["model"],
        snapshot["served_model_name"],
        snapshot["identity"],
    )
    return snapshot
