"""vLLM command lines: launchers, flag forms, --config precedence."""

from __future__ import annotations

import pytest

from eagle3_pipeline.server.unit import UnitError, merge_unit, split_words
from eagle3_pipeline.server.unit_syntax import unit_lines
from eagle3_pipeline.server.vllm_args import find_vllm, parse_command, parse_flags, parse_length


def _read(files: dict[str, str]):
    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    return read


def test_launchers() -> None:
    assert find_vllm(["vllm", "serve", "m"])[1] == ["m"]
    assert find_vllm(["/x/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])[1] == [
        "--model",
        "m",
    ]
    assert find_vllm(["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"])[1] == ["m"]
    assert find_vllm(["sh", "-c", "cd /x && vllm serve m --port 1 | tee log"])[1] == ["m", "--port", "1"]
    assert find_vllm(["/usr/bin/env", "A=1", "vllm", "serve", "m"])[2] == {"A": "1"}
    assert find_vllm(["/opt/start.sh"]) is None


def test_flag_forms() -> None:
    model, flags, stray = parse_flags(
        ["m", "--trust-remote-code", "--max_model_len=4k", "-tp", "2", "--no-enforce-eager", "--seed", "-5",
         "--served-model-name", "a", "b", "--hf-token", "--port", "1"],
        positional_model=True,
    )  # fmt: skip
    assert model == "m" and stray == []
    assert flags == {
        "--trust-remote-code": True,
        "--max-model-len": "4k",
        "--tensor-parallel-size": "2",
        "--enforce-eager": False,
        "--seed": "-5",
        "--served-model-name": ["a", "b"],
        "--hf-token": True,
        "--port": "1",
    }


def test_boolean_before_positional_model() -> None:
    model, flags, _ = parse_flags(["--trust-remote-code", "org/model"], positional_model=True)
    assert model == "org/model" and flags == {"--trust-remote-code": True}


def test_config_file_precedence() -> None:
    files = {"/srv/args.yaml": "model: from-yaml\nport: 1\nmax-model-len: 2048\nenforce_eager: true\n"}
    cmd = parse_command(["vllm", "serve", "--config", "args.yaml", "--port", "2"], _read(files), "/srv")
    assert cmd.model == "from-yaml"
    assert cmd.flags["--port"] == "2" and cmd.flags["--max-model-len"] == "2048"
    assert cmd.flags["--enforce-eager"] is True
    cli_model = parse_command(["vllm", "serve", "cli-model", "--config", "/srv/args.yaml"], _read(files), "/")
    assert cli_model.model == "cli-model"


def test_unreadable_config_is_reported_not_guessed() -> None:
    cmd = parse_command(["vllm", "serve", "m", "--config", "nope.yaml"], _read({}), "/srv")
    assert [u.what for u in cmd.unresolved] == ["--config"]


@pytest.mark.parametrize("text,value", [("4096", 4096), ("32k", 32000), ("32K", 32768), ("1M", 1048576)])
def test_lengths(text: str, value: int) -> None:
    assert parse_length(text) == value


def test_quotes_and_escapes() -> None:
    # `\ ` is no systemd escape: kept verbatim in the word (relaxed, with a warning); `\s` is a space
    words = split_words(r"""a "b c" 'd e' f\ g f\sg "h\"i" """, "t")
    assert words == ["a", "b c", "d e", "f\\ g", "f g", 'h"i']
    with pytest.raises(UnitError, match="unbalanced"):
        split_words('a "b', "t")


def test_continuation_with_comment_lines() -> None:
    text = "ExecStart=/bin/a \\\n# skipped\n  --x 1 \\\n; skipped too\n  --y 2\nUser=u\n"
    # the continued lines joined as systemd joins them (each backslash a space), comments skipped
    assert [" ".join(line.split()) for _, line in unit_lines(text)] == [
        "ExecStart=/bin/a --x 1 --y 2",
        "User=u",
    ]


def test_dropin_resets() -> None:
    unit = merge_unit(
        [
            ("a", "[Service]\nExecStart=/a\nEnvironmentFile=/e1\n"),
            ("b", "[Service]\nExecStart=\nExecStart=/b\n"),
        ],
        "x.service",
    )
    assert [c.raw for c in unit.exec_start] == ["/b"] and unit.environment_files == [("/e1", False)]


def test_a_line_without_equals_is_ignored_with_a_warning_naming_file_and_line() -> None:
    unit = merge_unit([("f.service", "[Service]\nUser=x\nnot an assignment\n")], "f.service")
    assert unit.user == "x" and unit.warnings == [
        "f.service:3: missing '=' in 'not an assignment'; systemd ignores the line"
    ]
    with pytest.raises(UnitError, match="unbalanced"):
        merge_unit([("f.service", "[Service]\nExecStart=/x 'open\n")], "f.service")


def test_wrapper_script_unknown_variable_is_reported() -> None:
    script = '#!/bin/sh\ncd "$HOME"\nexec /opt/v/bin/vllm serve "$MODEL" --port "$PORT" "$@"\n'
    cmd = parse_command(["/srv/run.sh", "--seed", "1"], _read({"/srv/run.sh": script}), "/", {"MODEL": "m"})
    assert cmd.model == "m" and cmd.flags == {"--port": "", "--seed": "1"}
    assert [u.why for u in cmd.unresolved] == ["$PORT is not set by the unit or the script"]


def test_non_shell_executable_is_not_read_as_a_script() -> None:
    cmd = parse_command(["/srv/bin"], _read({"/srv/bin": "\x7fELF binary vllm serve m"}), "/")
    assert not cmd.found and cmd.model is None


@pytest.mark.parametrize(
    "flag",
    [
        "--monokernel",
        "--checkpoint-prepare-on-startup",
        "--enable-extensible-kv-cache",
        "--shuffle-safetensors-files",
    ],
)
def test_a_boolean_flag_of_033_or_034_before_the_model_takes_no_value(flag) -> None:
    # the table is the union over the supported releases (vllm_compat checks it against each wheel)
    command = parse_command(["vllm", "serve", flag, "/models/m", "--port", "8000"], _read({}), None)
    assert command.model == "/models/m" and command.flags[flag] is True
