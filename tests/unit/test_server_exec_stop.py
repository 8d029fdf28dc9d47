"""ExecStop=/ExecStopPost= that reach beyond the unit's own processes are warned about in
server.json (server/exec_stop.py)."""

from __future__ import annotations

import pytest

from eagle3_pipeline.server.exec_stop import kill_targets, reach_warnings
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.snapshot import build_server_json, parse_service
from eagle3_pipeline.server.unit import merge_unit
from eagle3_pipeline.settings import ServerSettings


def _warnings(stop_lines: str, container: set[str] | None = None) -> list[str]:
    unit = merge_unit(
        [("v.service", f"[Service]\nExecStart=/usr/bin/vllm serve /m\n{stop_lines}")], "v.service"
    )
    return reach_warnings(unit.exec_stop, "v.service", container or set())


@pytest.mark.parametrize(
    "line",
    [
        "ExecStop=/usr/bin/pkill -f 'vllm serve'",
        "ExecStop=/usr/bin/killall python3",
        "ExecStop=/bin/kill -9 1234",
        "ExecStop=/bin/kill -- -1",
        "ExecStopPost=/bin/sh -c 'kill $(cat /run/other.pid)'",
        "ExecStopPost=/bin/bash -c 'sleep 1; systemctl stop vllm-b.service'",
        "ExecStopPost=-/usr/bin/fuser -k /dev/nvidia0",
        "ExecStop=/usr/bin/sudo -n /usr/bin/pkill vllm",
        "ExecStop=/usr/bin/docker stop vllm-other",
        "ExecStopPost=/usr/bin/systemctl isolate rescue.target",
        "ExecStop=/usr/bin/timeout 10 pkill -f vllm",
        "ExecStopPost=/usr/bin/nvidia-smi --gpu-reset -i 0",
    ],
)
def test_commands_that_reach_beyond_the_unit_are_warned(line: str) -> None:
    warnings = _warnings(line + "\n")
    assert len(warnings) == 1 and warnings[0].startswith(line.split("=")[0] + "= runs `")


@pytest.mark.parametrize(
    "line",
    [
        "ExecStop=/bin/kill -s TERM $MAINPID",
        "ExecStop=/bin/kill -TERM ${MAINPID}",
        "ExecStop=/bin/kill $MAINPID",
        "ExecStop=/usr/bin/systemctl stop v.service",
        "ExecStop=/usr/bin/docker stop vllm-own",
        "ExecStopPost=/bin/rm -f /run/vllm/ready",
        "ExecStopPost=/usr/bin/curl -s -X POST http://127.0.0.1:9000/notify",
    ],
)
def test_commands_on_the_units_own_processes_pass(line: str) -> None:
    assert _warnings(line + "\n", {"vllm-own"}) == []


def test_kill_targets_follow_kills_syntax() -> None:
    assert kill_targets(["-9", "1234"]) == ["1234"]
    assert kill_targets(["-s", "TERM", "$MAINPID"]) == ["$MAINPID"]
    assert kill_targets(["-9", "-1"]) == ["-1"]  # after the signal, -1 is every process
    assert kill_targets(["--", "-42"]) == ["-42"]


def test_the_warning_reaches_server_json_and_an_empty_assignment_resets() -> None:
    text = (
        "[Service]\nExecStart=/usr/bin/vllm serve /m\nExecStop=/usr/bin/pkill -f vllm\n"
        "ExecStopPost=/usr/bin/pkill -f other\nExecStop=\n"
    )
    unit, env, _, command = parse_service(text, "v.service", LocalHost())
    server = build_server_json(unit, env, command, LocalHost(), ServerSettings())[0]
    assert [w.split("`")[1] for w in server["warnings"]] == ["/usr/bin/pkill -f other"]
