"""The serve check's own unit (check_unit.py) built from `systemctl show`, the lock owner's identity
(process_identity.py) and signal handling, without a host."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from eagle3_pipeline.server import check_unit, process_identity
from eagle3_pipeline.server.draft_command import ServeCheckError
from eagle3_pipeline.server.interrupts import Interrupted, deferred_interrupts, interrupts_as_exceptions
from eagle3_pipeline.validate.remote_checkpoint import unit_sandbox

SHOW = """Type=simple
User=vllm
Group=gpu
WorkingDirectory=/srv/vllm
Environment=HF_HOME=/cache "NOTE=two words" HF_TOKEN=hf_secretvalue
EnvironmentFiles=/etc/vllm/*.env (ignore_errors=yes)
EnvironmentFiles=/etc/vllm/base.env (ignore_errors=no)
LimitNOFILE=1048576
LimitNOFILESoft=65536
LimitMEMLOCK=infinity
CPUAffinity=0-63
NUMAPolicy=bind
NUMAMask=0-1
DeviceAllow=/dev/nvidiactl rw
DeviceAllow=/dev/nvidia0 rw
PrivateTmp=yes
TimeoutStopUSec=5min
Slice=
"""


def _argv(was_active: bool = True) -> list[str]:
    return check_unit.systemd_run_argv(
        "eagle3-serve-check-r1.service", "vllm.service", ["/usr/bin/vllm", "serve", "/m", "--port", "8000"],
        check_unit.parse_show(SHOW), was_active=was_active, runtime_max_s=3600.5,
        systemctl="/usr/bin/systemctl", own_env_file="/run/e3/r1.env",
    )  # fmt: skip


def _settings(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "-p"]


def test_the_check_unit_carries_what_production_applies():
    argv = _argv()
    settings = _settings(argv)
    assert argv[:4] == ["systemd-run", "--unit=eagle3-serve-check-r1.service", "--collect", "--no-block"]
    assert argv[argv.index("--") + 1 :] == ["/usr/bin/vllm", "serve", "/m", "--port", "8000"]
    for expected in ("Conflicts=vllm.service", "Restart=no", "RuntimeMaxSec=3600", "User=vllm", "Group=gpu",
                     "WorkingDirectory=/srv/vllm", "LimitNOFILE=65536:1048576", "LimitMEMLOCK=infinity",
                     "CPUAffinity=0-63", "NUMAPolicy=bind", "NUMAMask=0-1", "DeviceAllow=/dev/nvidiactl rw",
                     "DeviceAllow=/dev/nvidia0 rw", "PrivateTmp=yes", "TimeoutStopSec=5min"):  # fmt: skip
        assert expected in settings, expected
    assert not any(s.startswith("Slice=") for s in settings)  # empty: systemd's default, as production
    assert "After=vllm.service" in settings  # with Conflicts=, production's stop runs first, both ways
    files = [s for s in settings if s.startswith("EnvironmentFile=")]
    assert files == [
        "EnvironmentFile=-/run/e3/r1.env",
        "EnvironmentFile=-/etc/vllm/*.env",
        "EnvironmentFile=-/etc/vllm/base.env",
    ]  # ours first: production's files override it; each optional, so every ExecStopPost can spawn
    assert settings[-2:] == [
        "ExecStopPost=-+/usr/bin/systemctl --no-block start -- vllm.service",
        "ExecStopPost=-+/bin/rm -f -- /run/e3/r1.env",
    ]  # the restore first: the env file's removal never stands in its way
    assert "hf_secretvalue" not in " ".join(argv)  # Environment= values never on a command line


def test_show_display_forms_become_what_systemd_run_accepts():
    """A stock unit's `show` (systemd 252): n/a, !-paths, Delegate split in two, KillMode=process."""
    stock = check_unit.parse_show(
        "NUMAPolicy=n/a\nNUMAMask=\nWorkingDirectory=!/srv/maybe\nDelegate=yes\n"
        "DelegateControllers=cpu memory\nKillMode=process\nTimeoutStopUSec=1min 30s\nKillSignal=15\n"
    )
    settings = check_unit.copied_properties(stock)
    assert not any(s.startswith(("NUMAPolicy=", "NUMAMask=")) for s in settings)
    for expected in ("WorkingDirectory=-/srv/maybe", "Delegate=cpu memory", "KillMode=control-group",
                     "TimeoutStopSec=1min 30s", "KillSignal=15"):  # fmt: skip
        assert expected in settings, settings
    assert check_unit.copied_properties(check_unit.parse_show("KillMode=mixed\n")) == ["KillMode=mixed"]


def test_show_words_reads_systemds_quoting_not_shlexs():
    line = 'A=1 "B=two words" "C=hf_a\\$b\'c\\"d e\\\\f" "D=back\\slash\\n" E='
    assert check_unit.show_words(line) == [
        "A=1",
        "B=two words",
        "C=hf_a$b'c\"d e\\f",
        "D=back\\slash\\n",
        "E=",
    ]
    props = check_unit.parse_show('Environment="M=line one\nline two" N=1\nUser=x\n')
    assert check_unit.environment(props) == [("M", "line one\nline two"), ("N", "1")]


def test_a_literal_command_keeps_its_dollars():
    argv = check_unit.systemd_run_argv(
        "c.service", "vllm.service", ["/bin/x", "--key=$HOME", "a$$b"], {}, was_active=False,
        runtime_max_s=60, systemctl="systemctl", own_env_file=None, expand_environment=False,
    )  # fmt: skip
    assert argv[argv.index("--") + 1 :] == ["/bin/x", "--key=$$HOME", "a$$$$b"]
    assert not any(a.startswith("--expand-environment") for a in argv)  # 252 has no such option


def test_types_the_check_cannot_reproduce_are_named():
    assert "Type=dbus" in check_unit.unreproducible({"Type": ["dbus"]})
    assert check_unit.unreproducible({"Type": ["notify"]}) is None


def test_production_not_running_before_is_not_started_after():
    assert not any("start" in s for s in _settings(_argv(was_active=False)) if s.startswith("ExecStopPost="))


def test_environment_goes_to_a_file_systemd_reads_back_as_written():
    entries = check_unit.environment(check_unit.parse_show(SHOW))
    assert entries == [("HF_HOME", "/cache"), ("NOTE", "two words"), ("HF_TOKEN", "hf_secretvalue")]
    text = check_unit.env_file_text([*entries, ("Q", 'it\'s $HOME `x` \\ "q"'), ("M", "a\nb")])
    # single quotes: nothing expanded; with a single quote inside: double quotes, \ " $ ` escaped
    assert text.splitlines()[1:4] == ["NOTE='two words'", "HF_TOKEN='hf_secretvalue'",
                                      'Q="it\'s \\$HOME \\`x\\` \\\\ \\"q\\""']  # fmt: skip
    assert text.endswith("M='a\nb'\n")  # a quoted value may span lines in an env file


def test_unit_names_are_our_own():
    assert (
        check_unit.unit_name("20261205T060000-abcd1234")
        == "eagle3-serve-check-20261205T060000-abcd1234.service"
    )
    with pytest.raises(ServeCheckError):
        check_unit.unit_name("a/b")


def test_an_owner_in_another_pid_namespace_is_never_judged_gone():
    """Two pipelines in containers with host networking: same hostname, not the same PID namespace."""
    me = process_identity.identity()
    assert me["boot_id"] and me["pid_ns"].startswith("pid:[")
    assert process_identity.is_running(me) is True
    gone = me | {"start_ticks": -1}
    assert process_identity.is_running(gone) is False
    for other in (
        {"pid_ns": "pid:[1]"},
        {"boot_id": "another-boot"},
        {"host": "elsewhere"},
        {"pid_ns": None},
    ):
        assert process_identity.is_running(gone | other) is None  # cannot be proven gone
        assert process_identity.where_text(gone | other) != "is still running"


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare -p needs root")
def test_a_process_in_its_own_pid_namespace_cannot_judge_ours():
    code = (
        "import json, sys; from eagle3_pipeline.server import process_identity as p; "
        "print(json.dumps([p.is_running(json.loads(sys.argv[1])), p.identity()['pid_ns']]))"
    )
    me = process_identity.identity()
    command = ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c", code, json.dumps(me)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    running, their_ns = json.loads(out.stdout)
    assert running is None and their_ns != me["pid_ns"]


def test_sigterm_and_sigint_become_exceptions_then_handlers_are_put_back():
    before = signal.getsignal(signal.SIGTERM)
    for sig in (signal.SIGTERM, signal.SIGINT):
        with pytest.raises(Interrupted) as info, interrupts_as_exceptions():
            os.kill(os.getpid(), sig)
            signal.pause()
        assert info.value.signum == sig
    assert signal.getsignal(signal.SIGTERM) is before


def test_signals_during_the_restore_are_deferred():
    with deferred_interrupts() as received:
        os.kill(os.getpid(), signal.SIGTERM)  # would end the process without the deferral
    assert received == [signal.SIGTERM]


def test_unit_sandbox_reads_user_private_tmp_and_protect_home_after_dropins():
    cat = (
        "# /etc/systemd/system/v.service\n[Service]\nUser=vllm\nPrivateTmp=yes\nExecStart=/x\n"
        "# /etc/systemd/system/v.service.d/o.conf\n[Service]\nPrivateTmp=no\nProtectHome=read-only\n"
    )
    sandbox = unit_sandbox(cat, "v.service")
    assert (sandbox.user, sandbox.private_tmp, sandbox.protect_home) == ("vllm", False, "read-only")


def test_the_serve_check_rule_turns_sigterm_into_an_exception():
    """serve_check (the rule's entry) runs under interrupts_as_exceptions, also as a decorator."""
    from eagle3_pipeline.validate.serve_check import serve_check

    @interrupts_as_exceptions()
    def job() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()

    for _ in range(2):  # a fresh context per call
        with pytest.raises(Interrupted):
            job()
    assert hasattr(serve_check, "__wrapped__")


def test_the_property_table_in_docs_is_the_codes():
    """docs/server.md's table names every property check_unit reads from `systemctl show`, and no other."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "server.md").read_text()
    table = docs.split("### Production's settings as systemd applied them", 1)[1].split("\n\n", 2)[2]
    rows = [line.split("|")[1] for line in table.split("\n\n", 1)[0].splitlines()[2:]]
    named = set()
    for cell in rows:
        for name in re.findall(r"`([A-Za-z]+)`", cell):
            named.add(name)
        if "LimitX" in cell:
            named |= {f"Limit{x}{soft}" for x in check_unit.LIMITS for soft in ("", "Soft")}
    named -= {"LimitX", "LimitXSoft"}
    assert named == set(check_unit.SHOWN)
