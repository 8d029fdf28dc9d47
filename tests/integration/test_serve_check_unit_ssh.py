"""The production serve check as operators' deployments meet it, over a real sshd: the draft in a
transient check unit of its own that conflicts production (never a write to production's unit), the
restore that systemd owns (ExecStopPost), and the scenarios of issue 35: Restart=always with a
crashing draft, an operator drop-in sorting after any name of ours, the link dropping before the
draft's start, an operator's unreloaded edit during the check, a half-dead connection at the restore,
the pipeline SIGKILLed, and two pipelines sharing a hostname but not a PID namespace.

In every scenario: production's unit files are byte-for-byte unchanged, no daemon-reload is issued,
production ends running its own command, and it is started at most once per check (never when the
draft did not start). systemd is tests/data/remote/systemctl-unit (its header says what it models).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.standin_systemd import UNIT, Box
from support.standin_systemd import box as box  # noqa: F401 (fixtures)
from support.standin_systemd import fast_polls as fast_polls  # noqa: F401
from support.standin_systemd import host as host  # noqa: F401

from eagle3_pipeline.server.dropin import ServeCheckError, draft_argv, vllm_exec
from eagle3_pipeline.server.host_record import recover_leftover, serve_check_unit
from eagle3_pipeline.server.interrupts import Interrupted, interrupts_as_exceptions

pytestmark = pytest.mark.ssh
DRAFT = "/srv/eagle3-draft-ckpt"


def _argv(host) -> list[str]:
    cat = host.run(f"systemctl cat -- {UNIT}").stdout  # production as systemd merges it
    return draft_argv(vllm_exec(cat, UNIT), DRAFT, 3, False)


def _check(host, box: Box, **kwargs):
    kwargs.setdefault("verify", box.production_check())
    return serve_check_unit(host, UNIT, _argv(host), record_dir=str(box.records), sudo=False,
                            timeout_s=30, runtime_max_s=120, draft_path=DRAFT, **kwargs)  # fmt: skip


def _start(host) -> None:
    assert host.run(f"systemctl start -- {UNIT}").ok


def _production_is_back(box: Box, files: dict[str, bytes], starts: int) -> None:
    """Issue 35's bar: files unchanged, no reload, production's own command, `starts` starts, each
    by systemd (the check unit's ExecStopPost), none by the pipeline."""
    assert box.unit_files() == files
    assert f"systemctl start --no-block -- {UNIT}" not in box.calls()
    assert not any("daemon-reload" in c for c in box.calls())
    assert len(box.starts()) == starts, box.calls()
    assert box.mainpid_alive() and DRAFT not in box.cmdline() and "/models/kimi" in box.cmdline()
    assert not box.record.exists() and not list(box.records.glob("*.env"))


def test_the_draft_runs_in_a_unit_of_its_own_and_systemd_restores_production(host, box):
    _start(host)
    files = box.unit_files()
    with _check(host, box) as check:
        (unit_dir,) = box.check_units()
        assert unit_dir.name == check.name and not box.mainpid_alive()  # conflicted away
        assert DRAFT in box.cmdline(unit_dir) and "--speculative-config" in box.cmdline(unit_dir)
        props = box.props(unit_dir)
        expected = [f"Conflicts={UNIT}", "Restart=no", "RuntimeMaxSec=120", "User=vllm", "CPUAffinity=0-3",
                    "WorkingDirectory=/srv/vllm", "LimitNOFILE=65536:1048576"]  # fmt: skip
        assert set(expected) <= set(props)
        assert props[-1].endswith(f"systemctl --no-block start -- {UNIT}")  # ExecStopPost, with +
        record = json.loads(box.record.read_text())
        assert record["phase"] == "running" and record["check_unit"] == check.name
        assert record["owner"]["pid_ns"] and record["owner"]["boot_id"]
        env = Path(record["env_file"]).read_text()
        assert (
            "HF_TOKEN='hf_standinsecret'" in env
            and oct(Path(record["env_file"]).stat().st_mode)[-3:] == "600"
        )
        check.still_serving()
    assert "hf_standinsecret" not in "".join(box.calls())  # never on a command line
    _production_is_back(box, files, starts=2)  # the test's start, then systemd's after the check


def test_production_not_running_before_stays_stopped(host, box):
    files = box.unit_files()
    with _check(host, box):
        pass
    assert box.starts() == [] and not box.mainpid_alive() and box.unit_files() == files
    assert not any(p.startswith("ExecStopPost=") and "start" in p for p in box.props(box.check_units()[0]))


def test_restart_always_with_a_crashing_draft(host, box):
    """The draft crashes as it starts; production has Restart=always. The check unit (Restart=no)
    stops, its ExecStopPost starts production once; the check says what happened."""
    box.set("restart-always")
    _start(host)
    files = box.unit_files()
    box.set("draft-crashes")
    crashed = "stopped as it started|may not be the draft's"  # before or after it counted as running
    with pytest.raises(ServeCheckError, match=crashed), _check(host, box) as check:
        deadline = time.monotonic() + 20
        while list(box.state.glob("transient/*")) and time.monotonic() < deadline:
            time.sleep(0.1)  # what the health wait sees: the check unit gone
        check.still_serving()
    _production_is_back(box, files, starts=2)


def test_an_operator_dropin_sorting_after_any_name_of_ours(host, box):
    """The operator's `zzzz-` drop-in replaces ExecStart: the check serves the draft on THAT command
    (as systemd merges the unit), and production's folder is never written."""
    dropins = box.units / f"{UNIT}.d"
    dropins.mkdir()
    (dropins / "zzzz-operator.conf").write_text(
        "[Service]\nExecStart=\nExecStart=/usr/bin/vllm serve /models/kimi-operator --port 8000\n"
    )
    _start(host)
    files = box.unit_files()
    with _check(host, box):
        served = box.cmdline(box.check_units()[0])
        assert "/models/kimi-operator" in served and DRAFT in served
    _production_is_back(box, files, starts=2)


def test_the_link_drops_before_the_draft_start_reaches_the_host(host, box):
    """systemd-run never reached systemd: read again, it is sent again; production stopped and
    started once. When it never gets through, production is never touched."""
    _start(host)
    files = box.unit_files()
    box.set("drop-run", "1")
    with _check(host, box):
        assert len(box.check_units()) == 1, (box.check_units(), box.calls())
    _production_is_back(box, files, starts=2)
    box.set("drop-run", "3")  # every try of START_ATTEMPTS
    invocation = box.invocation()
    with pytest.raises(ServeCheckError, match="never reached"), _check(host, box):
        pass
    assert box.invocation() == invocation and len(box.check_units()) == 1  # untouched
    _production_is_back(box, files, starts=2)


def test_the_link_drops_after_the_draft_start_reached_the_host(host, box):
    """The start got there, its answer did not: read again, the check unit is ours; never sent twice."""
    _start(host)
    files = box.unit_files()
    box.set("drop-after-run", "1")
    with _check(host, box):
        pass
    assert len(box.check_units()) == 1 and len([c for c in box.calls() if c.startswith("systemd-run")]) == 1
    _production_is_back(box, files, starts=2)


def test_an_operator_saves_an_edit_during_the_check_without_reloading(host, box):
    """No daemon-reload is ever issued: production comes back on what systemd had loaded, and the
    operator's edit waits for the operator's own reload."""
    _start(host)
    with _check(host, box):
        edited = (box.units / UNIT).read_text().replace("/models/kimi", "/models/kimi-next")
        (box.units / UNIT).write_text(edited)
        box.set("need-reload", "yes")
        box.set("disk-exec", "/usr/bin/vllm serve /models/kimi-next --broken-flag")
        files = box.unit_files()
    _production_is_back(box, files, starts=2)
    assert "kimi-next" not in box.cmdline() and (box.units / UNIT).read_text() == edited


def test_a_unit_with_unloaded_changes_is_refused_untouched(host, box):
    _start(host)
    box.set("need-reload", "yes")
    acts = box.acts()
    with pytest.raises(ServeCheckError, match="NeedDaemonReload=yes"), _check(host, box):
        pass
    assert box.acts() == acts and not box.record.exists() and box.check_units() == []


def test_a_half_dead_connection_at_the_restore(host, box):
    """The SSH session dies while the draft serves (its sshd killed: paramiko's SSHException or EOF
    on the next command): the restore reconnects on a fresh connection and finishes."""
    _start(host)
    files = box.unit_files()
    with _check(host, box):
        session = int(host.run("echo $PPID").stdout)  # the sshd process serving this connection
        os.kill(session, signal.SIGKILL)
    _production_is_back(box, files, starts=2)


def test_sigterm_during_the_check(host, box):
    _start(host)
    files = box.unit_files()
    with pytest.raises(Interrupted), interrupts_as_exceptions(), _check(host, box):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    _production_is_back(box, files, starts=2)


def _pipeline_in_a_child(sshd_server, box: Box, argv: list[str], runtime_max_s: int) -> subprocess.Popen:
    """Another pipeline (a process of its own) that starts a check and then hangs."""
    code = (
        "import json, sys, time\n"
        "from eagle3_pipeline.server import host_record\n"
        "from eagle3_pipeline.server.host_record import serve_check_unit\n"
        "from eagle3_pipeline.server.remote import RemoteHost\n"
        "from eagle3_pipeline.settings import SshSettings, section\n"
        "host_record.POLL_S = 0.2\n"
        "ssh, config, records, runtime, argv = json.loads(sys.argv[1])\n"
        "host = RemoteHost('vllm-box', section(SshSettings, ssh), config)\n"
        "with serve_check_unit(host, 'vllm.service', argv, record_dir=records, sudo=False,\n"
        "                      runtime_max_s=runtime, timeout_s=30):\n"
        "    print('checking', flush=True); time.sleep(600)\n"
    )
    args = [
        sshd_server.server_cfg()["ssh"],
        str(sshd_server.ssh_config),
        str(box.records),
        runtime_max_s,
        argv,
    ]
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "checking"
    return proc


def test_the_pipeline_sigkilled_mid_check(sshd_server, host, box):
    """Nothing can run in the killed process: the check unit's RuntimeMaxSec= ends it and systemd
    starts production; the next run finds the record of a provably dead owner and only tidies up."""
    _start(host)
    files = box.unit_files()
    proc = _pipeline_in_a_child(sshd_server, box, _argv(host), runtime_max_s=4)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while not box.mainpid_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert box.mainpid_alive() and len(box.starts()) == 2  # systemd's restore, with no pipeline
    found = recover_leftover(
        host, UNIT, record_dir=str(box.records), sudo=False, verify=box.production_check()
    )
    assert [f["check_unit"] for f in found] == [box.check_units()[0].name]
    _production_is_back(box, files, starts=2)


def test_two_pipelines_sharing_a_hostname_but_not_a_pid_namespace(sshd_server, host, box):
    """B runs in a PID namespace of its own (a container with host networking: same hostname): A's
    pid means nothing there, so B neither takes the lock nor "recovers" A's live check."""
    _start(host)
    with _check(host, box) as check:
        code = (
            "import json, sys\n"
            "from eagle3_pipeline.server.host_record import recover_leftover\n"
            "from eagle3_pipeline.server.remote import RemoteHost\n"
            "from eagle3_pipeline.settings import SshSettings, section\n"
            "ssh, config, records = json.loads(sys.argv[1])\n"
            "host = RemoteHost('vllm-box', section(SshSettings, ssh), config)\n"
            "recover_leftover(host, 'vllm.service', record_dir=records, sudo=False)\n"
        )
        args = json.dumps([sshd_server.server_cfg()["ssh"], str(sshd_server.ssh_config), str(box.records)])
        b = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c", code, args],
                           capture_output=True, text=True)  # fmt: skip
        assert b.returncode != 0 and "another PID namespace" in b.stderr, b.stderr[-2000:]
        assert f"sudo systemctl stop {check.name}" in b.stderr  # how to recover by hand
        check.still_serving()  # A's check untouched
        with pytest.raises(ServeCheckError, match="another serve check holds"), _check(host, box):
            pass
    assert len(box.starts()) == 2 and not box.record.exists()


def test_figures_taken_while_production_came_back_are_refused(host, box):
    """An operator starts production during the check: systemd stops the check unit (Conflicts=), so
    requests would reach production; the check refuses its figures and leaves production running."""
    _start(host)
    files = box.unit_files()
    with pytest.raises(ServeCheckError, match="may not be the draft's"), _check(host, box) as check:
        assert host.run(f"systemctl start -- {UNIT}").ok  # the operator
        check.still_serving()
    _production_is_back(box, files, starts=2)  # the test's start and the operator's, none of ours
