"""The shell follower (server/shell_script.py) against real bash: each script runs under `bash -c
SCRIPT NAME ARGS...` with `exec vllm` replaced by a probe that prints its argv, environment and
folder, and the follower must find the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from eagle3_pipeline.server.shell_script import commands_of, follow

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed to compare with")

ENV = {"X": "from-unit", "EMPTY": "", "SPACED": "  a   b  ", "HOME": "/home/svc", "KEEP": "1"}
PROBE = (
    "python3 -c 'import sys, os, json; "
    'print(json.dumps([sys.argv[1:], {k: os.environ.get(k) for k in ("X", "PORT", "NEW", "KEEP")}, '
    "os.getcwd()]))' vllm"
)


def _bash(script: str, name: str, args: list[str]) -> tuple[list[str], dict, str]:
    """What bash really runs: the probe's argv (vllm first), the variables it sees, its folder."""
    probe = script.replace("vllm serve", f"{PROBE} serve")
    env = {**ENV, "PATH": os.environ["PATH"]}
    out = subprocess.run(["bash", "-c", probe, name, *args], env=env, capture_output=True, text=True, cwd="/")
    argv, seen, cwd = json.loads(out.stdout.strip().splitlines()[-1])
    return argv, seen, cwd


def _ours(script: str, name: str, args: list[str]) -> tuple[list[str], dict, str]:
    run = follow(script, name, args, ENV, lambda words: words[:1] == ["vllm"], "bash -c script", "/")
    assert run.argv is not None, "no vllm command found"
    seen = {k: run.env.get(k) for k in ("X", "PORT", "NEW", "KEEP")}
    return run.argv, seen, run.cwd or "/"


CASES = [
    ('exec vllm serve "$@"', ["/m", "--port", "8001", "--api-key", "a b"]),
    ("exec vllm serve $@", ["/m", "--served-model-name", "two words"]),
    ('exec vllm serve "$*" "$1" ${2} "$0" "$#"', ["a b", "c"]),
    ('exec vllm serve "x$@y"', ["1", "2"]),
    ('exec vllm serve "$@" --port 1', []),
    ('model="$1"; shift; exec vllm serve "$model" "$@"', ["/m", "-tp", "2"]),
    ("set -- /other --port 9; exec vllm serve $@", ["/m"]),
    ('export X=hello; PORT=9 exec vllm serve --port "$PORT" x$X${UNSET_Y:-def}', []),
    ("X=override; exec vllm serve $X", []),
    ("NEW=not-exported; exec vllm serve $NEW", []),
    ("NEW=1; export NEW; unset KEEP; exec vllm serve", []),
    ("PORT=8123 NEW=2 vllm serve --port ${PORT:-0}", []),
    ("exec vllm serve $'a\\tb' \"\" '' $EMPTY \"$EMPTY\" a\\ b", []),
    ('exec vllm serve $SPACED "$SPACED" x${SPACED}y', []),
    ("exec vllm serve ${EMPTY:-fallback} ${EMPTY-kept} ${X:+alt} ${UNSET_Z+alt}", []),
    ("cd /tmp && exec vllm serve --config c.yaml 2>&1", []),
    ("cd /usr; cd lib; exec vllm serve ~ ~/x", []),
    ("# a comment\nset -e\nexport PORT=8500 # trailing comment\nexec vllm serve \\\n  --port $PORT", []),
    ('exec -a vllm-prod vllm serve "$@" 2>/dev/null </dev/null 3>&1', ["/m"]),
    ('true && exec vllm serve \'$X\' "\\$X" "a\\"b"', []),
]


@pytest.mark.parametrize(("script", "args"), CASES)
def test_follows_the_script_as_bash_runs_it(script: str, args: list[str]) -> None:
    assert _ours(script, "vllm-launch", args) == _bash(script, "vllm-launch", args)


def test_dollar_zero_is_the_name_after_the_script() -> None:
    script = 'exec vllm serve "$0"'
    assert _ours(script, "my-name", [])[0] == _bash(script, "my-name", [])[0] == ["vllm", "serve", "my-name"]


def test_what_cannot_be_known_is_unresolved_not_guessed() -> None:
    run = follow(
        "exec vllm serve $(cat /etc/args) --port $UNSET_PORT `hostname`",
        "n", [], {}, lambda w: w[:1] == ["vllm"], "bash -c script",
    )  # fmt: skip
    reasons = " ".join(u.why for u in run.unresolved)
    assert "$(cat /etc/args)" in reasons and "$UNSET_PORT" in reasons and "`hostname`" in reasons


def test_a_variable_set_from_an_unknown_stays_unknown_where_it_is_used() -> None:
    run = follow(
        'ARGS="$(cat /etc/vllm-args)"; exec vllm serve $ARGS', "n", [], {},
        lambda w: w[:1] == ["vllm"], "bash -c script",
    )  # fmt: skip
    assert any("$(cat /etc/vllm-args)" in u.why for u in run.unresolved)


def test_sourced_files_are_recorded() -> None:
    run = follow(
        "source /opt/venv/bin/activate && exec vllm serve /m", "n", [], {},
        lambda w: w[:1] == ["vllm"], "bash -c script",
    )  # fmt: skip
    assert run.sourced == ["/opt/venv/bin/activate"] and run.argv == ["vllm", "serve", "/m"]


def test_no_matching_command() -> None:
    run = follow("echo hello; sleep 1", "n", [], {}, lambda w: w[:1] == ["vllm"], "bash -c script")
    assert run.argv is None


def test_commands_as_written_keep_their_variables() -> None:
    assert commands_of("kill -s TERM $MAINPID; pkill -f 'vllm serve' && systemctl stop ${OTHER}") == [
        ["kill", "-s", "TERM", "$MAINPID"],
        ["pkill", "-f", "vllm serve"],
        ["systemctl", "stop", "$OTHER"],
    ]
