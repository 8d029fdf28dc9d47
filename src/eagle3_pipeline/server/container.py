"""vLLM in a container: `docker run` / `podman run` (also `container run`, nerdctl) read like the engine.

The official image `vllm/vllm-openai:TAG` runs its ENTRYPOINT with the words after the image as
arguments: `vllm serve` in recent tags (vLLM's docker/Dockerfile had `python3 -m
vllm.entrypoints.openai.api_server` until mid-2025; both read `--model M` and the same flags, and only
`vllm serve` accepts a positional model, so a unit that works with one was started by a new image).
`--entrypoint X` replaces it (`--entrypoint ""` clears it: the words after the image are the command);
any other image's entrypoint is unknown and reported, never guessed.

Read from the options: `-p/--publish [IP:][HOST:]CONTAINER[/PROTO]` (the port seen from the host),
`--network/--net host` (the container port is the host port), `-e/--env NAME=V` and `-e NAME` (taken
from the unit's environment), `--env-file` (docker's format: NAME=VALUE taken literally), `-v/--volume`
and `--mount type=bind` (container paths mapped back to host paths, to read `--config` and chat
template files and fingerprint the model), `-w/--workdir`.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field

from eagle3_pipeline.server.unit_syntax import Unresolved

ENGINES = ("docker", "podman", "nerdctl")
VLLM_IMAGE = re.compile(
    r"^(?:[^/\s]+/)*vllm-openai(?:-[A-Za-z0-9_.-]+)?(?::(?P<tag>[A-Za-z0-9_.-]+))?(?:@sha256:[0-9a-f]{64})?$"
)
_VERSION_TAG = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+|rc\d+)?)$")  # v0.10.1.1 too
# Options that take no value (docker and podman `run`); every other option takes one.
BOOLEAN_OPTIONS = frozenset(
    {
        "--detach", "--interactive", "--tty", "--init", "--privileged", "--publish-all", "--read-only",
        "--rm", "--sig-proxy", "--oom-kill-disable", "--no-healthcheck", "--disable-content-trust",
        "--quiet", "--help", "--replace", "--rmi", "--read-only-tmpfs", "--no-hosts", "--env-host",
        "--http-proxy", "--tls-verify", "--rootfs", "--passwd", "--no-hostname",
    }
)  # fmt: skip
SHORT_BOOLEANS = {"d": "--detach", "i": "--interactive", "t": "--tty", "P": "--publish-all", "q": "--quiet"}
SHORT_VALUED = {
    "e": "--env", "p": "--publish", "v": "--volume", "w": "--workdir", "u": "--user", "h": "--hostname",
    "m": "--memory", "l": "--label", "c": "--cpu-shares", "a": "--attach",
}  # fmt: skip
ALIASES = {"--net": "--network"}
# The engines' global options (before `run`) that take a value.
GLOBAL_VALUED = frozenset(
    {
        "--config", "-c", "--context", "-H", "--host", "-l", "--log-level", "--tlscacert", "--tlscert",
        "--tlskey", "--root", "--runroot", "--url", "--connection", "--cgroup-manager", "--storage-driver",
        "--storage-opt", "--events-backend", "--tmpdir", "--volumepath", "--conmon", "--runtime",
        "--module", "--identity", "--namespace", "-n", "--address", "-a", "--snapshotter", "--cni-path",
    }
)  # fmt: skip


@dataclass
class Port:
    """One `-p` mapping: host address ('' for all), host port (None: chosen by the engine), container
    port, protocol."""

    host_ip: str
    host_port: int | None
    container_port: int
    proto: str = "tcp"


@dataclass
class ContainerRun:
    """A parsed `docker run` / `podman run`: the image, what the container runs, and its options."""

    engine: str
    image: str
    args: list[str]
    entrypoint: str | None = None  # None: the image's own
    ports: list[Port] = field(default_factory=list)
    publish_all: bool = False
    network: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    env_files: list[str] = field(default_factory=list)
    mounts: list[tuple[str, str]] = field(default_factory=list)  # (host path, container path)
    workdir: str | None = None
    name: str | None = None  # `--name`: what an ExecStop= `docker stop NAME` of its own names
    unresolved: list[Unresolved] = field(default_factory=list)

    @property
    def official(self) -> bool:
        return bool(VLLM_IMAGE.match(self.image))

    def version(self) -> str | None:
        """vLLM's version from an official image tag such as v0.11.0; None for latest, nightly..."""
        match = VLLM_IMAGE.match(self.image)
        tag = match.group("tag") if match else None
        version = _VERSION_TAG.match(tag or "")
        return version.group(1) if version else None

    def command(self) -> list[str] | None:
        """The argv the container runs; None when the image's own entrypoint is unknown."""
        if self.entrypoint is None:
            if self.official:
                return ["vllm", "serve", *self.args]  # the image's ENTRYPOINT (see the module doc)
            return None
        return [self.entrypoint, *self.args] if self.entrypoint else list(self.args)

    def host_port(self, container_port: int) -> tuple[str | None, int | None, str | None]:
        """(host address, host port, why unknown) under which the host reaches container_port."""
        if self.network == "host":
            return None, container_port, None
        for port in self.ports:
            if port.container_port == container_port and port.proto == "tcp":
                if port.host_port is None:
                    return (
                        port.host_ip or None,
                        None,
                        f"-p {port.container_port}: the engine picks the host port",
                    )
                return port.host_ip or None, port.host_port, None
        if self.publish_all:
            return None, None, "--publish-all: the engine picks the host port"
        return (
            None,
            None,
            (
                f"container port {container_port} is not published (-p HOST:{container_port}) and the "
                "network is not host"
            ),
        )

    def host_path(self, container_path: str, cwd: str | None = None) -> str | None:
        """The host path of a file the container sees, through its bind mounts; None when it is in
        the image (or a named volume)."""
        path = posixpath.normpath(posixpath.join(cwd or self.workdir or "/", container_path))
        for source, target in sorted(self.mounts, key=lambda m: len(m[1]), reverse=True):
            target = posixpath.normpath(target)
            if path == target or path.startswith(target.rstrip("/") + "/"):
                return posixpath.normpath(source + path[len(target) :])
        return None

    def container_path(self, host_path: str) -> str | None:
        """Where the container sees a host path, through its bind mounts; None when none holds it."""
        path = posixpath.normpath(host_path)
        for source, target in sorted(self.mounts, key=lambda m: len(m[0]), reverse=True):
            source = posixpath.normpath(source)
            if path == source or path.startswith(source.rstrip("/") + "/"):
                return posixpath.normpath(target + path[len(source) :])
        return None


def engine_at(argv: list[str]) -> int | None:
    """Index of the container engine word when argv runs `ENGINE [global options] [container] run`."""
    for i, word in enumerate(argv):
        if os.path.basename(word) not in ENGINES:
            continue
        k = i + 1
        while k < len(argv):
            if argv[k] == "run":
                return i
            if argv[k] in GLOBAL_VALUED:
                k += 2
            elif argv[k].startswith("-") or argv[k] == "container":
                k += 1
            else:
                return None
        return None
    return None


def parse_run(argv: list[str], unit_env: dict[str, str], read_file) -> ContainerRun | None:  # noqa: ANN001
    """Parse `ENGINE ... run [OPTIONS] IMAGE [ARGS]` found in argv; None when argv runs no container.

    Args:
        argv: the command line (launchers before the engine are allowed).
        unit_env: the unit's environment (what `-e NAME` passes through).
        read_file: reads a file on the host (for `--env-file`).
    """
    start = engine_at(argv)
    if start is None:
        return None
    engine = os.path.basename(argv[start])
    i = argv.index("run", start + 1) + 1
    options: list[tuple[str, str | bool]] = []
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        word = argv[i]
        i += 1
        if word == "--":
            break
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            name = ALIASES.get(name, name)
            if eq or name in BOOLEAN_OPTIONS:
                options.append((name, value if eq else True))
            elif i < len(argv):
                options.append((name, argv[i]))
                i += 1
            continue
        for k, letter in enumerate(word[1:], 1):  # a cluster such as -it or -p8000:8000
            if letter in SHORT_BOOLEANS:
                options.append((SHORT_BOOLEANS[letter], True))
                continue
            name = SHORT_VALUED.get(letter, f"-{letter}")
            rest = word[k + 1 :].removeprefix("=")
            if rest:
                options.append((name, rest))
            elif i < len(argv):
                options.append((name, argv[i]))
                i += 1
            break
    if i >= len(argv):
        return ContainerRun(
            engine, "", [], unresolved=[Unresolved("image", f"`{engine} run` names no image")]
        )
    run = ContainerRun(engine=engine, image=argv[i], args=argv[i + 1 :])
    _apply_options(run, options, unit_env, read_file)
    return run


def _apply_options(run: ContainerRun, options, unit_env: dict[str, str], read_file) -> None:  # noqa: ANN001
    env_from_flags: dict[str, str] = {}
    for name, value in options:
        text = value if isinstance(value, str) else ""
        if name == "--publish":
            port = parse_publish(text)
            if port is None:
                run.unresolved.append(Unresolved("port", f"cannot read the port mapping -p {text!r}"))
            else:
                run.ports.extend(port)
        elif name == "--publish-all":
            run.publish_all = value is True or text == "true"
        elif name == "--network":
            run.network = text
        elif name == "--env":
            key, eq, val = text.partition("=")
            if eq:
                env_from_flags[key] = val
            elif key in unit_env:
                env_from_flags[key] = unit_env[key]  # -e NAME passes the engine's own variable on
        elif name == "--env-file":
            run.env_files.append(text)
        elif name == "--volume":
            source, _, rest = text.partition(":")
            target = rest.partition(":")[0]
            if source.startswith("/") and target:
                run.mounts.append((source, target))
        elif name == "--mount":
            fields = dict(part.partition("=")[::2] for part in text.split(","))
            source = fields.get("source") or fields.get("src") or ""
            target = fields.get("target") or fields.get("destination") or fields.get("dst") or ""
            if fields.get("type", "volume") == "bind" and source.startswith("/") and target:
                run.mounts.append((source, target))
        elif name == "--workdir":
            run.workdir = text
        elif name == "--name":
            run.name = text
        elif name == "--entrypoint":
            run.entrypoint = text
    for path in run.env_files:
        try:
            run.env.update(parse_env_file(read_file(path), unit_env))
        except (OSError, UnicodeDecodeError) as err:
            run.unresolved.append(Unresolved(f"--env-file {path}", f"cannot read it ({err})"))
    run.env.update(env_from_flags)  # -e wins over --env-file, as in docker


def parse_publish(value: str) -> list[Port] | None:
    """`-p [IP:][HOST:]CONTAINER[/PROTO]` (ranges allowed) -> ports; None when it cannot be read."""
    spec, _, proto = value.partition("/")
    ip = ""
    if spec.startswith("["):  # [::1]:8080:8000
        ip, _, spec = spec[1:].partition("]")
        spec = spec.removeprefix(":")
    parts = spec.split(":")
    if len(parts) == 3 and not ip:
        ip, parts = parts[0], parts[1:]
    if len(parts) == 1:
        parts = ["", parts[0]]
    if len(parts) != 2:
        return None
    host, container = (_port_range(p) for p in parts)
    if container is None or (parts[0] and (host is None or len(host) != len(container))):
        return None
    hosts: list[int | None] = list(host) if parts[0] and host else [None] * len(container)
    return [Port(ip, h, c, proto or "tcp") for h, c in zip(hosts, container, strict=True)]


def _port_range(text: str) -> list[int] | None:
    low, dash, high = text.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()):
        return None
    return list(range(int(low), int(high or low) + 1))


def parse_env_file(text: str, unit_env: dict[str, str]) -> dict[str, str]:
    """docker's `--env-file`: NAME=VALUE lines taken literally (no quotes, no expansion), a bare NAME
    passed on from the engine's environment, `#` comments and blank lines skipped."""
    env = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, eq, value = line.partition("=")
        name = name.strip()
        if eq:
            env[name] = value
        elif name in unit_env:
            env[name] = unit_env[name]
    return env
