"""`docker run` / `podman run` read the way the engine reads them: options, image, ports, env, mounts."""

from __future__ import annotations

import pytest

from eagle3_pipeline.server.container import Port, parse_publish, parse_run
from eagle3_pipeline.server.vllm_args import env_effects, parse_command


def _no_files(path: str) -> str:
    raise FileNotFoundError(path)


@pytest.mark.parametrize(
    ("spec", "ports"),
    [
        ("8000:8000", [Port("", 8000, 8000)]),
        ("127.0.0.1:8080:8000", [Port("127.0.0.1", 8080, 8000)]),
        ("8080:8000/udp", [Port("", 8080, 8000, "udp")]),
        ("8000", [Port("", None, 8000)]),
        ("127.0.0.1::8000", [Port("127.0.0.1", None, 8000)]),
        ("[::1]:8080:8000", [Port("::1", 8080, 8000)]),
        ("9000-9001:8000-8001", [Port("", 9000, 8000), Port("", 9001, 8001)]),
    ],
)
def test_publish_forms(spec: str, ports: list[Port]) -> None:
    assert parse_publish(spec) == ports


def test_publish_that_cannot_be_read() -> None:
    assert parse_publish("published=8080,target=8000") is None
    assert parse_publish("9000-9002:8000-8001") is None


def test_options_before_the_image() -> None:
    argv = ["docker", "--log-level", "warn", "container", "run", "-it", "-p8001:8000", "--rm", "--gpus",
            "all", "--ipc=host", "--mount", "type=bind,source=/srv/m,target=/models,readonly",
            "-w", "/models", "--publish=127.0.0.1:8002:8000", "vllm/vllm-openai:v0.11.0", "m", "--port",
            "8000"]  # fmt: skip
    run = parse_run(argv, {}, _no_files)
    assert run is not None and run.image == "vllm/vllm-openai:v0.11.0" and run.args == ["m", "--port", "8000"]
    assert run.host_port(8000) == (None, 8001, None)  # the first mapping of the port wins
    assert run.host_path("args.yaml") == "/srv/m/args.yaml" and run.host_path("/etc/x") is None
    assert run.version() == "0.11.0" and run.command() == ["vllm", "serve", "m", "--port", "8000"]


def test_environment_from_flags_and_env_file() -> None:
    files = {"/etc/vllm.env": "A=from-file\nB='quotes kept'\nPASSED\n# c\n"}
    argv = ["podman", "run", "--env-file", "/etc/vllm.env", "-e", "A=from-flag", "--env", "C",
            "-e", "MISSING", "vllm/vllm-openai"]  # fmt: skip
    run = parse_run(argv, {"C": "from-unit", "PASSED": "p"}, files.__getitem__)
    assert run is not None
    assert run.env == {"A": "from-flag", "B": "'quotes kept'", "PASSED": "p", "C": "from-unit"}


def test_entrypoint_override_and_reset() -> None:
    run = parse_run(["docker", "run", "--entrypoint", "", "img", "vllm", "serve", "m"], {}, _no_files)
    assert run is not None and run.command() == ["vllm", "serve", "m"]
    custom = parse_run(["docker", "run", "--entrypoint=/venv/bin/vllm", "img", "serve", "m"], {}, _no_files)
    assert custom is not None and custom.command() == ["/venv/bin/vllm", "serve", "m"]
    unknown = parse_run(["docker", "run", "img", "--model", "m"], {}, _no_files)
    assert unknown is not None and unknown.command() is None


def test_not_a_container() -> None:
    assert parse_run(["docker", "compose", "up"], {}, _no_files) is None
    assert parse_run(["/opt/vllm/bin/vllm", "serve", "m"], {}, _no_files) is None


def test_container_port_is_the_host_port_on_the_host_network() -> None:
    run = parse_run(["docker", "run", "--net", "host", "vllm/vllm-openai", "m", "--port", "9"], {}, _no_files)
    assert run is not None and run.host_port(9) == (None, 9, None)


def test_container_environment_replaces_the_units() -> None:
    argv = ["docker", "run", "-e", "A=1", "vllm/vllm-openai:v0.11.0", "m"]
    command = parse_command(argv, _no_files, "/", {"UNIT_ONLY": "x"})
    assert command.apply_env({"UNIT_ONLY": "x"}) == {"A": "1"}


def test_env_launcher_effects() -> None:
    words = ["/usr/bin/env", "-u", "X", "--unset=Y", "-i", "A=1", "B=2", "vllm", "serve", "m", "C=3"]
    assert env_effects(words) == ({"A": "1", "B": "2"}, ["X", "Y"], True)
    command = parse_command(
        ["env", "-u", "X", "A=1", "vllm", "serve", "m"], _no_files, "/", {"X": "1", "K": "k"}
    )
    assert command.apply_env({"X": "1", "K": "k"}) == {"K": "k", "A": "1"}
