"""Item 13 of the production-safety round: units read as systemd and the shell read them (systemd's
conf-parser.c, load-fragment.c config_parse_exec and service_verify, env-file.c load_env_file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3_pipeline.server.container import parse_run
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import parse_service
from eagle3_pipeline.server.unit import UnitError, merge_unit, parse_environment_file


def _service(text: str, name: str = "vllm.service"):
    return parse_service(text, name, LocalHost())


def test_a_bash_c_script_gets_the_units_environment(tmp_path: Path):
    """`$VAR` inside the script is the shell's, from Environment= and EnvironmentFile= (systemd passes
    them); `${VAR}` is systemd's own. Neither is recorded as the literal text."""
    env_file = tmp_path / "vllm.env"
    env_file.write_text("PORT=8001\nTP=2\n")
    unit, env, argv, command = _service(
        f"[Service]\nEnvironment=MODEL_PATH=/models/kimi\nEnvironmentFile={env_file}\n"
        "ExecStart=/bin/bash -c 'exec vllm serve \"$MODEL_PATH\" --port ${PORT} -tp $TP'\n"
    )
    assert command.model == "/models/kimi"
    assert command.flags == {"--port": "8001", "--tensor-parallel-size": "2"}
    assert not command.unresolved


def test_a_login_shell_that_activates_a_virtualenv():
    """`bash -lc 'source /opt/venv/bin/activate && exec vllm serve ...'` (options clustered)."""
    _, _, _, command = _service(
        "[Service]\nExecStart=/bin/bash -lc "
        "'source /opt/venv/bin/activate && exec vllm serve /m --port 8002'\n"
    )
    assert command.found and command.model == "/m" and command.flags == {"--port": "8002"}
    assert command.launcher[-2:] == ["vllm", "serve"]


def test_a_four_part_image_tag_is_a_version():
    run = parse_run(
        ["docker", "run", "--gpus", "all", "vllm/vllm-openai:v0.10.1.1", "--model", "/m"], {}, None
    )
    assert run is not None and run.version() == "0.10.1.1"


def test_a_line_without_equals_is_ignored_with_a_warning():
    unit, _, argv, _ = _service("[Service]\nRestart always\nExecStart=/usr/bin/vllm serve /m\n")
    assert argv == ["/usr/bin/vllm", "serve", "/m"]
    assert unit.warnings == ["vllm.service:2: missing '=' in 'Restart always'; systemd ignores the line"]


@pytest.mark.parametrize(
    "text",
    [
        "[Service]\nExecStart=/usr/bin/vllm serve /m ; /bin/echo started\n",  # a lone `;`: two commands
        "# /etc/systemd/system/vllm.service\n[Service]\nExecStart=/usr/bin/vllm serve /a\n"
        "# /etc/systemd/system/vllm.service.d/override.conf\n[Service]\nExecStart=/usr/bin/vllm serve /b\n",
    ],
)
def test_two_commands_in_a_simple_service_are_refused_with_systemds_reason(text):
    with pytest.raises(
        UnitError, match="more than one ExecStart= setting, which is only allowed for Type=oneshot"
    ):
        _service(text)


def test_a_semicolon_in_a_oneshot_unit_separates_two_commands():
    unit = merge_unit(
        [("u.service", "[Service]\nType=oneshot\nExecStart=/bin/a x ; /bin/b 'y z'\n")], "u.service"
    )
    assert [c.words for c in unit.exec_start] == [["/bin/a", "x"], ["/bin/b", "y z"]]


def test_export_lines_in_an_environment_file_are_ignored():
    warnings: list[str] = []
    env = parse_environment_file("A=1\nexport B=2\nC='3 4'\n", warnings, "/etc/vllm.env")
    assert env == {"A": "1", "C": "3 4"}
    assert warnings == ["/etc/vllm.env:2: 'export B' is not a variable name; systemd ignores the line"]
