"""Unit classes read as systemd reads them (issue 35, item 4): environment files (systemd's
src/basic/env-file.c), EnvironmentFile= globs and `-`, ExecStart prefixes (config_parse_exec),
WorkingDirectory= (`~`, relative paths), ExecStart words written back, and what the snapshot cannot
read listed as unresolved instead of vLLM's defaults."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import build_server_json, parse_service
from eagle3_pipeline.server.unit import (
    command_argv,
    env_file_assignments,
    merge_unit,
    parse_environment_file,
    split_exec_prefixes,
)
from eagle3_pipeline.server.unit_syntax import extract_words, unit_lines
from eagle3_pipeline.settings import ServerSettings


def _service(text: str, name: str = "vllm.service"):
    return parse_service(text, name, LocalHost())


def _server_json(text: str) -> dict:
    unit, env, _, command = _service(text)
    return build_server_json(unit, env, command, LocalHost(), ServerSettings())[0]


# -- environment files --------------------------------------------------------------------------------

ENV_FILE_CASES = [
    ('A="one\ntwo"\n', {"A": "one\ntwo"}),  # a double-quoted value spans lines
    ("A='x \\n y'\n", {"A": "x \\n y"}),  # single quotes: literal
    ('A="a\\"b\\\\c\\$d\\`e\\qf"\n', {"A": 'a"b\\c$d`e\\qf'}),  # `\` escapes only " \ $ `
    ('A="first \\\nsecond"\n', {"A": "first second"}),  # an escaped newline is eaten
    ("A=bare \\\nnext\n", {"A": "bare next"}),  # a bare value continues after `\`
    ("A=trailing   \n", {"A": "trailing"}),  # trailing blanks of a bare value dropped
    ("  A = spaced\n", {"A": "spaced"}),
    ("A=\n", {"A": ""}),
    ('A="x"y\n', {"A": "xy"}),
    ("# c\n; c\nA=1 # not a comment\n", {"A": "1 # not a comment"}),
    ("A=1\r\nB=2\r\n", {"A": "1", "B": "2"}),
    ("A=1\nA=2\n", {"A": "2"}),  # the last wins
    ("A=no-newline-at-end", {"A": "no-newline-at-end"}),
    ("export B=2\nC=3\n", {"C": "3"}),  # `export B` is not a variable name
    ("just words\nD=4\n", {"D": "4"}),  # a line without `=` is dropped
]


@pytest.mark.parametrize(("text", "expected"), ENV_FILE_CASES)
def test_environment_file_as_systemd_reads_it(text: str, expected: dict) -> None:
    assert parse_environment_file(text) == expected


BASH_AGREES = [c for c in ENV_FILE_CASES if "#" not in c[0] and "\r" not in c[0] and "export" not in c[0]]
BASH_AGREES = [c for c in BASH_AGREES if "words" not in c[0] and " = " not in c[0] and "qf" not in c[0]]
BASH_AGREES = [c for c in BASH_AGREES if "bare \\\n" not in c[0]]  # bash ends the value at the blank


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to compare with")
@pytest.mark.parametrize(("text", "expected"), BASH_AGREES)
def test_environment_file_values_match_bash_where_the_syntaxes_agree(
    text: str, expected: dict, tmp_path: Path
):
    """systemd's env files follow the shell's quoting: sourcing the same file in bash gives the same
    values (for the lines bash reads the same way)."""
    path = tmp_path / "vllm.env"
    path.write_text(text)
    names = " ".join(expected)
    script = f'set -a; . {path}; for n in {names}; do printf "%s\\0" "${{!n}}"; done'
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"]}
    )
    assert dict(zip(expected, out.stdout.split("\0")[:-1], strict=True)) == expected


def test_environment_file_names_the_line_it_ignores() -> None:
    warnings: list[str] = []
    parse_environment_file('A="x\ny"\nexport B=2\n', warnings, "/etc/v.env")
    assert warnings == ["/etc/v.env:3: 'export B' is not a variable name; systemd ignores the line"]
    assert env_file_assignments('A="x\ny"\nB=1\n') == [(1, "A", "x\ny"), (3, "B", "1")]


def test_environment_file_glob_loads_every_match_in_order(tmp_path: Path) -> None:
    (tmp_path / "env.d").mkdir()
    (tmp_path / "env.d" / "20-b.env").write_text("PORT=8002\nB=b\n")
    (tmp_path / "env.d" / "10-a.env").write_text("PORT=8001\nA=a\n")
    (tmp_path / "env.d" / "30-c.txt").write_text("PORT=9\n")
    (tmp_path / "with space").mkdir()
    (tmp_path / "with space" / "x.env").write_text("SPACED=yes\n")
    unit, env, argv, _ = _service(
        f"[Service]\nEnvironmentFile={tmp_path}/env.d/*.env\nEnvironmentFile=-{tmp_path}/none/*.env\n"
        f"EnvironmentFile={tmp_path}/with space/?.env\nExecStart=/usr/bin/vllm serve /m --port ${{PORT}}\n"
    )
    assert env == {"PORT": "8002", "A": "a", "B": "b", "SPACED": "yes"}
    assert argv[-1] == "8002" and not unit.unresolved


def test_a_required_glob_matching_nothing_is_unresolved(tmp_path: Path) -> None:
    unit, _, _, _ = _service(
        f"[Service]\nEnvironmentFile={tmp_path}/*.env\nExecStart=/usr/bin/vllm serve /m\n"
    )
    assert [u.why for u in unit.unresolved] == ["no file matches it; systemd would not start"]


def test_a_missing_optional_file_is_fine_and_a_relative_one_is_ignored(tmp_path: Path) -> None:
    unit, env, _, _ = _service(
        f"[Service]\nEnvironmentFile=-{tmp_path}/missing.env\nEnvironmentFile=relative.env\n"
        "ExecStart=/usr/bin/vllm serve /m\n"
    )
    assert env == {} and not unit.unresolved
    assert unit.warnings == [
        "EnvironmentFile= in vllm.service: path 'relative.env' is not absolute; systemd ignores it"
    ]


# -- ExecStart prefixes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "prefixes", "rest"),
    [
        ("-@:+/bin/x", "-@:+", "/bin/x"),
        ("!!-/bin/x", "!!-", "/bin/x"),
        ("@!!:/bin/x", "@!!:", "/bin/x"),
        ("+!/bin/x", "+", "!/bin/x"),  # `+` and `!` exclude each other: the rest is the path
        ("!!!/bin/x", "!!", "!/bin/x"),
        ("--/bin/x", "-", "-/bin/x"),  # each at most once
        ("|/bin/x", "|", "/bin/x"),
    ],
)
def test_exec_prefixes_in_any_combination(value: str, prefixes: str, rest: str) -> None:
    command = split_exec_prefixes(value)
    assert (command.prefixes, command.raw) == (prefixes, rest)


@pytest.mark.parametrize("prefixes", ["@", "-@", "@-", "!!@", "+@:", ":-@"])
def test_argv0_word_is_not_searched_for_vllm(prefixes: str) -> None:
    """`@/opt/venv/bin/vllm vllm-prod serve ...`: vllm runs with argv[0] = vllm-prod."""
    _, _, argv, command = _service(
        f"[Service]\nExecStart={prefixes}/opt/venv/bin/vllm vllm-prod serve /m --port 8001\n"
    )
    assert argv == ["/opt/venv/bin/vllm", "serve", "/m", "--port", "8001"]
    assert command.found and command.model == "/m" and command.flags == {"--port": "8001"}


def test_program_words_keep_argv0_out_and_words_keep_it_in() -> None:
    unit = merge_unit(
        [("u.service", "[Service]\nExecStart=@/usr/bin/python3 py -m vllm.entrypoints.openai.api_server\n")],
        "u.service",
    )
    command = unit.exec_start[0]
    assert command.words == ["/usr/bin/python3", "py", "-m", "vllm.entrypoints.openai.api_server"]
    assert command.program_words() == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]


# -- the shell inside ExecStart -----------------------------------------------------------------------


def test_bash_c_positional_parameters_and_script_assignments() -> None:
    unit, env, _, command = _service(
        "[Service]\nEnvironment=PORT=1 VLLM_LOGGING_LEVEL=INFO\n"
        "ExecStart=/bin/bash -c 'export VLLM_LOGGING_LEVEL=DEBUG; PORT=8001; "
        'exec vllm serve "$1" --port $PORT "${@:2}"\' launcher /m -tp 2\n'
    )
    assert command.model == "/m" and command.flags["--port"] == "8001"
    assert env["VLLM_LOGGING_LEVEL"] == "DEBUG" and env["PORT"] == "8001"  # the script overrides the unit
    assert any("${@:2}" in u.why for u in command.unresolved)  # not followed: reported, not guessed


def test_bash_c_dollar_at_takes_the_words_after_the_name() -> None:
    _, _, _, command = _service(
        "[Service]\nExecStart=/bin/sh -c 'exec vllm serve \"$@\"' sh /m --served-model-name 'a b' -tp 4\n"
    )
    assert command.model == "/m"
    assert command.flags == {"--served-model-name": ["a b"], "--tensor-parallel-size": "4"}


def test_an_assignment_before_the_command_reaches_vllm_only() -> None:
    _, env, _, command = _service(
        "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=0\n"
        "ExecStart=/bin/bash -c 'CUDA_VISIBLE_DEVICES=0,1 vllm serve /m'\n"
    )
    assert command.env == {"CUDA_VISIBLE_DEVICES": "0,1"} and env["CUDA_VISIBLE_DEVICES"] == "0,1"


# -- working directory and relative paths --------------------------------------------------------------


def test_relative_config_and_template_are_read_against_working_directory(tmp_path: Path) -> None:
    (tmp_path / "args.yaml").write_text("port: 8005\ntensor-parallel-size: 2\n")
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    server = _server_json(
        f"[Service]\nWorkingDirectory={tmp_path}\nExecStart=/usr/bin/vllm serve /m --config args.yaml "
        "--chat-template t.jinja\n"
    )
    assert (server["port"], server["tensor_parallel_size"]) == (8005, 2)
    assert server["unresolved"] == []


def test_a_cd_in_the_script_moves_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "args.yaml").write_text("port: 8006\n")
    server = _server_json(
        f"[Service]\nExecStart=/bin/bash -c 'cd {tmp_path} && exec vllm serve /m --config args.yaml'\n"
    )
    assert server["port"] == 8006


def test_working_directory_home_without_user_is_roots(tmp_path: Path) -> None:
    unit, _, _, command = _service("[Service]\nWorkingDirectory=~\nExecStart=/usr/bin/vllm serve /m\n")
    assert command.cwd == "/root"


def test_working_directory_home_of_a_user_from_the_user_database() -> None:
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    home = subprocess.run(["getent", "passwd", user], capture_output=True, text=True).stdout.split(":")[5]
    _, _, _, command = _service(
        f"[Service]\nUser={user}\nWorkingDirectory=~\nExecStart=/usr/bin/vllm serve m\n"
    )
    assert command.cwd == home


def test_an_unreadable_config_leaves_port_and_tp_unresolved_not_defaulted() -> None:
    server = _server_json(
        "[Service]\nUser=eagle3-no-such-user\nWorkingDirectory=~\n"
        "ExecStart=/usr/bin/vllm serve /m --config cfg.yaml\n"
    )
    assert server["port"] is None and server["tensor_parallel_size"] is None and server["base_url"] is None
    what = [u["what"] for u in server["unresolved"]]
    assert {"WorkingDirectory=", "--config", "--port", "--tensor-parallel-size"} <= set(what)


def test_defaults_stand_when_every_source_was_read() -> None:
    server = _server_json("[Service]\nExecStart=/usr/bin/vllm serve /m\n")
    assert (server["port"], server["tensor_parallel_size"]) == (8000, 1)


# -- quoted words, as systemd reads them -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "word"),
    [
        (
            r'"{%% for m in messages %%}{{ m.content }}\n{%% endfor %%}"',
            "{% for m in messages %}{{ m.content }}\n{% endfor %}",
        ),
        (r'"a\"b\\c"', 'a"b\\c'),
        (r'"tab\there"', "tab\there"),
        ('"%%h"', "%h"),
        ('"$VAR"', "$VAR"),
        ('";"', ";"),
        ('""', ""),
        (r'"x\x01y"', "x\x01y"),
    ],
)
def test_a_quoted_word_reads_back_as_the_word_systemd_runs(written: str, word: str) -> None:
    """Double quotes group, C escapes decode (`\\n` keeps an inline chat template on one line), `%%` is
    a literal percent, `$VAR` is left for systemd, an empty word and a quoted `;` stay words."""
    line = f"ExecStart=-/usr/bin/vllm serve --chat-template {written}"
    ((_, logical),) = unit_lines(line)
    command = split_exec_prefixes(logical.split("=", 1)[1])
    words = extract_words(command.raw, "test", relax=False)
    unit = merge_unit([("u.service", f"[Service]\n{line}\n")], "u.service")
    assert command.prefixes == "-" and words[-1].replace("%%", "%") == word
    assert unit.exec_start[0].words[-1] == word


def test_command_lines_split_only_at_a_lone_unquoted_semicolon_each_with_its_prefixes() -> None:
    unit = merge_unit(
        [("u.service", "[Service]\nType=oneshot\nExecStart=-/bin/a ';' \"x;\" \\; ; @/bin/b bee y\n")],
        "u.service",
    )
    assert [(c.prefixes, c.words) for c in unit.exec_start] == [
        ("-", ["/bin/a", ";", "x;", ";"]),
        ("@", ["/bin/b", "bee", "y"]),
    ]


def test_scripts_that_run_scripts_are_followed(tmp_path: Path) -> None:
    """`bash -c 'exec ./start.sh "$@"'` in WorkingDirectory, the script run by `bash FILE` (no
    shebang needed), its exports and positional parameters carried through each level."""
    (tmp_path / "start.sh").write_text('export VLLM_X=outer\nexec bash inner.sh --port "$1"\n')
    (tmp_path / "inner.sh").write_text(
        'set -e\nnvidia-smi -L || true\nexec vllm serve /models/nested "$@" --served-model-name "$VLLM_X"\n'
    )
    _, env, _, command = _service(
        f"[Service]\nWorkingDirectory={tmp_path}\nExecStart=/bin/bash -c 'exec ./start.sh \"$@\"' x 8009\n"
    )
    assert command.model == "/models/nested"
    assert command.flags == {"--port": "8009", "--served-model-name": ["outer"]}
    assert env["VLLM_X"] == "outer"


def test_a_binary_after_the_shell_is_not_taken_for_a_script(tmp_path: Path) -> None:
    _, _, _, command = _service("[Service]\nExecStart=/bin/sh -c '/bin/true; exec vllm serve /m'\n")
    assert command.found and command.model == "/m"


def test_a_script_extending_path_leaves_the_defaults_standing() -> None:
    """`export PATH=/opt/venv/bin:$PATH` reads systemd's own $PATH; an unknown elsewhere in the script
    does not make vLLM's flags unknown."""
    server = _server_json(
        "[Service]\nExecStart=/bin/bash -c "
        "'export PATH=/opt/venv/bin:$PATH; echo $(date); exec vllm serve /m'\n"
    )
    assert (server["port"], server["tensor_parallel_size"]) == (8000, 1) and server["unresolved"] == []
    assert server["env"]["PATH"] == "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def test_an_unknown_in_the_vllm_line_makes_the_defaults_unknown() -> None:
    server = _server_json("[Service]\nExecStart=/bin/bash -c 'exec vllm serve /m $(cat /etc/vllm.args)'\n")
    assert server["port"] is None and server["tensor_parallel_size"] is None


def test_a_working_directory_with_an_unresolved_specifier_is_unknown() -> None:
    unit, _, _, command = _service("[Service]\nWorkingDirectory=%h/vllm\nExecStart=/usr/bin/vllm serve m\n")
    assert command.cwd is None and any("%h" in u.why for u in unit.unresolved)


def test_a_variable_from_the_managers_environment_leaves_the_defaults_unknown() -> None:
    server = _server_json(
        "[Service]\nPassEnvironment=VLLM_ARGS\nExecStart=/usr/bin/vllm serve /m $VLLM_ARGS\n"
    )
    assert server["port"] is None and server["tensor_parallel_size"] is None


def test_an_expanded_word_keeps_its_dollars_literal() -> None:
    line = 'ExecStart="/usr/bin/vllm" "serve" "--chat-template" "{{ \'$$HOME\' }}"'  # `$$`: a literal `$`
    unit = merge_unit([("u.service", f"[Service]\n{line}\n")], "u.service")
    argv = command_argv(unit.exec_start[0], {"HOME": "/root"}, [])
    assert argv[-1] == "{{ '$HOME' }}"


def test_su_c_runs_its_string_in_a_shell() -> None:
    _, _, _, command = _service("[Service]\nExecStart=/bin/su - vllm -c 'exec vllm serve /m --port 8010'\n")
    assert command.found and command.model == "/m" and command.flags == {"--port": "8010"}


def test_an_env_file_this_user_cannot_read_is_unknown_not_missing(tmp_path: Path) -> None:
    class NoRead(LocalHost):
        def read_file(self, path: str) -> str:
            raise PermissionError(f"{path}: permission denied")

    unit, _, _, _ = parse_service(
        "[Service]\nEnvironmentFile=-/etc/vllm/secret.env\nExecStart=/usr/bin/vllm serve /m\n",
        "v.service",
        NoRead(),
    )
    assert [u.why for u in unit.unresolved] == [
        "cannot be read here (/etc/vllm/secret.env: permission denied): its variables are unknown"
    ]


@pytest.mark.parametrize(
    ("argv", "reach"),
    [
        (["/usr/bin/vllm", "serve", "/m"], True),
        (["/bin/bash", "-c", 'exec vllm serve "$@"', "name", "/m"], True),
        (["/bin/bash", "-c", 'source /v/bin/activate && exec vllm serve /m "$@"', "n"], True),
        (["/bin/bash", "-c", "exec vllm serve /m --port 1", "n"], False),  # its own flags: no "$@"
        (["/bin/bash", "-c", 'exec vllm serve "$1"', "n", "/m"], False),
        (["/usr/bin/python3", "-m", "http.server"], False),
    ],
)
def test_appended_words_reach_vllm_only_through_dollar_at(argv: list[str], reach: bool) -> None:
    from eagle3_pipeline.server.vllm_find import appended_words_reach_vllm

    assert appended_words_reach_vllm(argv, LocalHost().read_file) is reach
