"""The production serve check on a real systemd (the distribution's own, 252 on Debian 12, booted as
PID 1 of its own namespaces: support.real_systemd), reached through a real sshd that runs as one of
its units, with production a vLLM stand-in whose GPU is an exclusive lock (support.standin_vllm) under
a realistic unit (support.systemd_box): User=nobody, Environment= with a secret, EnvironmentFile=,
WorkingDirectory=, Restart=always, a worker process that outlives the main one, seconds to stop.

In every scenario production ends serving its own command, started by systemd (the check unit's
ExecStopPost) or left as it was, never two servers on the GPU at once (a server that finds the lock
held exits 1 and says so in its events), no record or env file left, and the secret nowhere but in
the processes' environment. Faults systemd cannot make by itself (a dropped link, an answer that
does not arrive, an old version, a refusal) come from small wrappers put first on the SSH session's
PATH around the real commands.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.systemd_box import SECRET, UNIT, RealBox, SystemdHost, wait

from eagle3_pipeline.server import check_unit
from eagle3_pipeline.server.draft_command import ServeCheckError, draft_argv, vllm_exec
from eagle3_pipeline.server.host_record import recover_leftover, serve_check_unit
from eagle3_pipeline.server.interrupts import Interrupted, interrupts_as_exceptions

pytestmark = [pytest.mark.systemd, pytest.mark.ssh]
DRAFT = "/srv/eagle3-draft-ckpt"
NOBODY = 65534


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    from eagle3_pipeline.server import host_record, remote

    monkeypatch.setattr(host_record, "POLL_S", 0.2)
    monkeypatch.setattr(remote, "TRANSPORT_BACKOFF_S", 0.1)


def _ssh_cfg(systemd_host: SystemdHost, **overrides) -> dict:
    return systemd_host.sshd.server_cfg(ssh=overrides)["ssh"]


@pytest.fixture
def host(systemd_host: SystemdHost):
    from eagle3_pipeline.server.remote import RemoteHost
    from eagle3_pipeline.settings import SshSettings, section

    remote_host = RemoteHost(
        "vllm-box", section(SshSettings, _ssh_cfg(systemd_host)), str(systemd_host.sshd.ssh_config)
    )
    yield remote_host
    remote_host.close()


@pytest.fixture
def wrappers(systemd_host: SystemdHost):
    """Write a wrapper around a real command on the SSH session's PATH; removed after the test."""
    made = []

    def wrap(name: str, script: str) -> None:
        path = systemd_host.sshd.bin_dir / name
        path.write_text(f"#!/bin/bash\n{script}\n")
        path.chmod(0o755)
        made.append(path)

    yield wrap
    for path in made:
        path.unlink(missing_ok=True)


def _argv(host) -> list[str]:
    cat = host.run(f"systemctl cat -- {UNIT}").stdout  # production as systemd merges it
    return draft_argv(vllm_exec(cat, UNIT), DRAFT, 3, False)


def _check(host, box: RealBox, **kwargs):
    kwargs.setdefault("verify", box.production_check())
    kwargs.setdefault("runtime_max_s", 120)
    kwargs.setdefault("sudo", False)
    return serve_check_unit(host, UNIT, _argv(host), record_dir=str(box.records), timeout_s=60,
                            draft_path=DRAFT, **kwargs)  # fmt: skip


def _start(box: RealBox) -> str:
    box.systemd.systemctl("start", UNIT)
    box.wait_production()
    return box.state()["InvocationID"]


def _production_is_back(box: RealBox, starts: int) -> None:
    """Production serves its own command, started `starts` times in all; nothing of the check left."""
    box.wait_production()
    assert "/models/kimi" in box.cmdline() and DRAFT not in box.cmdline()
    wait(lambda: box.check_units() == [], 30, "the check unit and its lease collected")
    assert len(box.starts()) == starts, box.events()
    box.gpu_held_by_one_server_at_a_time()
    assert not box.record.exists() and not list(box.records.glob("*.env"))
    journal = box.systemd.run("journalctl", "--no-pager", "-o", "cat", check=False).stdout
    assert SECRET not in journal and "hf_s3cr" not in journal


def test_the_draft_serves_after_production_has_stopped_and_systemd_restores_production(host, real_box):
    box = real_box
    before = _start(box)
    with _check(host, box) as check:
        assert {check.name, f"{check_unit.lease_name(check.name)}.timer"} <= set(box.check_units())
        assert DRAFT in box.cmdline(check.name) and "--speculative-config" in box.cmdline(check.name)
        assert box.state()["ActiveState"] in ("inactive", "failed")
        check.still_serving()
        record = json.loads(box.record.read_text())
        assert record["phase"] == "running" and record["invocation_before"] == before
    events = box.events()
    (draft,) = box.starts(draft=True)
    production = box.starts()
    exits = [e for e in events if e["event"] == "exit"]
    # ordered: the draft after production's exit, production again after the draft's exit
    assert exits[0]["t"] < draft["t"] < exits[1]["t"] < production[1]["t"]
    # as production runs: the same user, the same secret byte for byte (a hash in the events)
    assert draft["uid"] == production[0]["uid"] == NOBODY
    assert draft["hf_token_sha256"] == production[0]["hf_token_sha256"] == _sha(SECRET)
    _production_is_back(box, starts=2)


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_production_not_running_before_stays_stopped(host, real_box):
    with _check(host, real_box) as check:
        assert DRAFT in real_box.cmdline(check.name)
    wait(lambda: real_box.check_units() == [], 30, "the check unit collected")
    assert real_box.starts() == [] and real_box.state()["ActiveState"] == "inactive"
    real_box.gpu_held_by_one_server_at_a_time()


def test_a_crashing_draft_with_restart_always_production(host, real_box):
    _start(real_box)
    real_box.set("draft-crashes")
    crashed = "stopped as it started|may not be the draft's"  # before or after it counted as running
    with pytest.raises(ServeCheckError, match=crashed), _check(host, real_box) as check:
        check.still_serving()
    _production_is_back(real_box, starts=2)


def test_the_time_limit_ends_the_check_and_systemd_restores_production(host, real_box):
    _start(real_box)
    with (
        pytest.raises(ServeCheckError, match="may not be the draft's"),
        _check(host, real_box, runtime_max_s=3) as check,
    ):
        wait(real_box.serving, 30, "production restored by systemd alone")
        check.still_serving()
    _production_is_back(real_box, starts=2)


def _pipeline_in_a_child(systemd_host: SystemdHost, box: RealBox, argv: list[str], lease_s: int):
    """Another pipeline (a process of its own) that starts a check and then hangs."""
    code = (
        "import json, sys, time\n"
        "from eagle3_pipeline.server import host_record\n"
        "from eagle3_pipeline.server.host_record import serve_check_unit\n"
        "from eagle3_pipeline.server.remote import RemoteHost\n"
        "from eagle3_pipeline.settings import SshSettings, section\n"
        "host_record.POLL_S = 0.2\n"
        "ssh, config, records, lease, argv = json.loads(sys.argv[1])\n"
        "host = RemoteHost('vllm-box', section(SshSettings, ssh), config)\n"
        "with serve_check_unit(host, 'vllm.service', argv, record_dir=records, sudo=False,\n"
        "                      runtime_max_s=3600, timeout_s=60, lease_s=lease):\n"
        "    print('checking', flush=True); time.sleep(600)\n"
    )
    args = [_ssh_cfg(systemd_host), str(systemd_host.sshd.ssh_config), str(box.records), lease_s, argv]
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(args)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "checking"
    return proc


def test_the_pipeline_sigkilled_mid_check_production_back_within_the_lease(systemd_host, host, real_box):
    """No later run: the lease timer (6 s here, server.check_lease_s) stops the check unit, whose
    ExecStopPost starts production, though production has Environment= and is not enabled (the
    restore 252 never ran before: the env file was gone before the start could spawn)."""
    _start(real_box)
    proc = _pipeline_in_a_child(systemd_host, real_box, _argv(host), lease_s=6)
    time.sleep(3)  # renewed at least once (every 1.5 s): the lease counts from the last renewal
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    wait(real_box.serving, 60, "production back with no pipeline")
    outage = time.monotonic() - killed
    # the lease, the check unit's stop (0.5 s, its worker 0.8 s more), production's start (0.3 s)
    assert outage < 6 + 8, outage
    found = recover_leftover(host, UNIT, record_dir=str(real_box.records), sudo=False,
                             verify=real_box.production_check())  # fmt: skip
    assert len(found) == 1 and found[0]["was_active"]
    _production_is_back(real_box, starts=2)


@pytest.mark.parametrize("verb", ["start", "restart"])
def test_an_operator_starts_production_during_the_check(host, real_box, verb):
    """systemd stops the check unit first (Conflicts= with After=), then starts production; the check
    refuses its figures."""
    _start(real_box)
    with pytest.raises(ServeCheckError, match="may not be the draft's"), _check(host, real_box) as check:
        real_box.systemd.systemctl(verb, UNIT)  # the operator, blocking until production runs
        assert real_box.state(check.name)["ActiveState"] in ("inactive", "failed")  # or collected
        check.still_serving()
    _production_is_back(real_box, starts=2)


def test_systemd_run_refused_leaves_production_untouched(host, real_box, wrappers):
    before = _start(real_box)
    wrappers(
        "systemd-run",
        'case "$*" in *--unit=eagle3-serve-check-*-lease*) ;; *--unit=eagle3-serve-check-*) '
        'echo "Failed to start transient service unit: Access denied" >&2; exit 1;; esac\n'
        'exec /usr/bin/systemd-run "$@"',
    )
    with pytest.raises(ServeCheckError, match="Access denied"), _check(host, real_box):
        pass
    assert real_box.state()["InvocationID"] == before and real_box.starts(draft=True) == []
    _production_is_back(real_box, starts=1)


def test_systemd_run_whose_answer_never_arrives_is_read_again(systemd_host, real_box, wrappers):
    """The start reached systemd, its answer did not (a command timeout): systemd is read again, the
    check unit is ours, and it is never sent twice."""
    from eagle3_pipeline.server.remote import RemoteHost
    from eagle3_pipeline.settings import SshSettings, section

    _start(real_box)
    wrappers(
        "systemd-run",
        '/usr/bin/systemd-run "$@"; rc=$?\n'
        'case "$*" in *--unit=eagle3-serve-check-*-lease*) ;; *--unit=eagle3-serve-check-*) sleep 8;; esac\n'
        "exit $rc",
    )
    slow = RemoteHost("vllm-box", section(SshSettings, _ssh_cfg(systemd_host, command_timeout_s=3)),
                      str(systemd_host.sshd.ssh_config))  # fmt: skip
    try:
        with _check(slow, real_box) as check:
            check.still_serving()
    finally:
        slow.close()
    assert len(real_box.starts(draft=True)) == 1
    _production_is_back(real_box, starts=2)


def test_refusals_before_anything_changes(systemd_host, host, real_box, wrappers):
    """A systemd too old, a required env file missing: each named, before the lock, with production
    as it was."""
    before = _start(real_box)
    wrappers(
        "systemctl",
        '[ "$1" = --version ] && { echo "systemd 235 (235)"; exit 0; }\nexec /usr/bin/systemctl "$@"',
    )
    with (
        pytest.raises(ServeCheckError, match="systemd 235; the serve check needs 239"),
        _check(host, real_box),
    ):
        pass
    (systemd_host.sshd.bin_dir / "systemctl").unlink()
    gone = real_box.env_file.with_suffix(".gone")
    real_box.env_file.rename(gone)
    try:
        missing = f"EnvironmentFile={real_box.env_file} is missing"
        with pytest.raises(ServeCheckError, match=missing), _check(host, real_box):
            pass
    finally:
        gone.rename(real_box.env_file)
    assert real_box.state()["InvocationID"] == before and not real_box.record.exists()
    assert real_box.starts(draft=True) == [] and len(real_box.starts()) == 1


def test_a_dbus_unit_is_refused(host, real_box):
    real_box.install("Type=dbus\nBusName=org.example.vllm\n")
    with pytest.raises(ServeCheckError, match="Type=dbus"), _check(host, real_box):
        pass
    assert real_box.starts() == [] and real_box.check_units() == []


def test_an_operator_dropin_sorting_after_any_name_of_ours(host, real_box):
    """The operator's `zzzz-` drop-in replaces ExecStart: the check serves the draft on THAT command
    (as systemd merges the unit), and production's folder is never written."""
    dropins = real_box.systemd.units / f"{UNIT}.d"
    dropins.mkdir()
    command = real_box.unit_text().split("ExecStart=", 1)[1].split("\n", 1)[0]
    (dropins / "zzzz-operator.conf").write_text(
        f"[Service]\nExecStart=\nExecStart={command.replace('/models/kimi', '/models/kimi-operator')}\n"
    )
    real_box.systemd.systemctl("daemon-reload")
    try:
        _start(real_box)
        files = {p: p.read_bytes() for p in real_box.systemd.units.rglob("*") if p.is_file()}
        with _check(host, real_box) as check:
            assert "/models/kimi-operator" in real_box.cmdline(check.name)
        assert {p: p.read_bytes() for p in real_box.systemd.units.rglob("*") if p.is_file()} == files
        _production_is_back(real_box, starts=2)
    finally:
        (dropins / "zzzz-operator.conf").unlink()
        dropins.rmdir()


def test_an_operator_saves_an_edit_during_the_check_without_reloading(host, real_box):
    """No daemon-reload is ever issued: production comes back on what systemd had loaded."""
    _start(real_box)
    unit_file = real_box.systemd.units / UNIT
    with _check(host, real_box):
        unit_file.write_text(unit_file.read_text().replace("/models/kimi", "/models/kimi-next"))
    assert real_box.state().get("ActiveState") == "active"
    assert "kimi-next" not in real_box.cmdline()
    _production_is_back(real_box, starts=2)
    assert "NeedDaemonReload=yes" in real_box.systemd.systemctl("show", "-p", "NeedDaemonReload", UNIT).stdout


def test_a_unit_with_unloaded_changes_is_refused_untouched(host, real_box):
    before = _start(real_box)
    unit_file = real_box.systemd.units / UNIT
    unit_file.write_text(unit_file.read_text() + "# edited\n")
    with pytest.raises(ServeCheckError, match="NeedDaemonReload=yes"), _check(host, real_box):
        pass
    assert real_box.state()["InvocationID"] == before and not real_box.record.exists()
    assert real_box.check_units() == []


def test_a_half_dead_connection_at_the_restore(host, real_box):
    """The SSH session dies while the draft serves: the restore reconnects and finishes."""
    _start(real_box)
    with _check(host, real_box):
        session = host.run("echo $PPID").stdout.strip()  # the sshd process serving this connection
        real_box.systemd.run("kill", "-9", session)
    _production_is_back(real_box, starts=2)


def test_sigterm_during_the_check(host, real_box):
    _start(real_box)
    with pytest.raises(Interrupted), interrupts_as_exceptions(), _check(host, real_box):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    _production_is_back(real_box, starts=2)


def test_the_link_drops_before_and_after_the_draft_start_reaches_systemd(host, real_box, wrappers):
    """Before: systemd knows nothing, the start is sent again. After: systemd is read again, the check
    unit is ours, and it is never sent twice. Either way one draft start."""
    _start(real_box)
    # the first sshd above this command serves this connection: killed, the client's link drops
    drop = (
        "p=$$; while [ \"$p\" -gt 1 ]; do p=$(awk '{print $4}' /proc/$p/stat); "
        'case "$(cat /proc/$p/comm)" in sshd*) kill -9 "$p"; sleep 0.3; exit 255;; esac; done'
    )
    once = f'[ -e "$HOME/.dropped" ] || {{ touch "$HOME/.dropped"; {drop}; }}'
    for when, script in (
        ("before", f'{once}\nexec /usr/bin/systemd-run "$@"'),
        ("after", f'/usr/bin/systemd-run "$@"; rc=$?\n{once}\nexit $rc'),
    ):
        host.run('rm -f "$HOME/.dropped"')
        wrappers("systemd-run", f'case "$*" in *-lease*) exec /usr/bin/systemd-run "$@";; esac\n{script}')
        drafts = len(real_box.starts(draft=True))
        with _check(host, real_box) as check:
            check.still_serving()
        assert len(real_box.starts(draft=True)) == drafts + 1, when
        real_box.wait_production()
    host.run('rm -f "$HOME/.dropped"')
    _production_is_back(real_box, starts=3)


def test_the_check_units_settings_as_systemd_applied_them(real_box):
    """Each property read from production's `show`, translated (check_unit.PROPERTIES), given to a
    transient unit through `systemd-run -p`, reads back the same from that unit's `show`: for a unit
    that sets them and for one that sets none (systemd's defaults, display forms such as n/a)."""
    systemd = real_box.systemd
    settings = (
        "Nice=5\nUMask=0027\nOOMScoreAdjust=100\nKillSignal=SIGINT\nTimeoutStopSec=45s\nLimitNOFILE=4096:8192\n"
        "LimitMEMLOCK=infinity\nWorkingDirectory=-/srv/absent\nPrivateTmp=yes\nProtectSystem=full\n"
        "ProtectHome=read-only\nDelegate=yes\nKillMode=mixed\nCPUAffinity=0\nTasksMax=512\nNUMAPolicy=local\n"
        "ReadWritePaths=/var/tmp\nDeviceAllow=/dev/null rw\nDeviceAllow=/dev/zero r\nDevicePolicy=closed\n"
        "SupplementaryGroups=users\nMemoryMax=2G\nUnsetEnvironment=LANG\nPassEnvironment=TERM\n"
    )
    for name, extra in (("stock", ""), ("set", settings)):
        (systemd.units / f"eagle3-props-{name}.service").write_text(
            f"[Service]\nUser=nobody\nExecStart=/bin/sleep 600\n{extra}"
        )
    systemd.systemctl("daemon-reload")
    try:
        for name in ("stock", "set"):
            shown = check_unit.parse_show(
                systemd.systemctl(
                    "show", "-p", ",".join(check_unit.SHOWN), f"eagle3-props-{name}.service"
                ).stdout
            )
            properties = [a for s in check_unit.copied_properties(shown) for a in ("-p", s)]
            copy = f"eagle3-props-{name}-copy.service"
            res = systemd.run(
                "systemd-run", f"--unit={copy}", "--collect", *properties, "/bin/sleep", "600", check=False
            )
            assert res.returncode == 0, (name, res.stderr)
            copied = check_unit.parse_show(
                systemd.systemctl("show", "-p", ",".join(check_unit.SHOWN), copy).stdout
            )
            differ = {
                k: (shown.get(k), copied.get(k))
                for k in check_unit.SHOWN
                if sorted(shown.get(k, [])) != sorted(copied.get(k, [])) and k != "LoadState"
            }
            assert differ == {}, (name, differ)
            systemd.systemctl("stop", copy)
    finally:
        for name in ("stock", "set"):
            (systemd.units / f"eagle3-props-{name}.service").unlink()
        systemd.systemctl("daemon-reload")


def test_two_pipelines_sharing_a_hostname_but_not_a_pid_namespace(systemd_host, host, real_box):
    """B runs in a PID namespace of its own (a container with host networking: same hostname): A's
    pid means nothing there, so B neither takes the lock nor "recovers" A's live check."""
    _start(real_box)
    with _check(host, real_box) as check:
        code = (
            "import json, sys\n"
            "from eagle3_pipeline.server.host_record import recover_leftover\n"
            "from eagle3_pipeline.server.remote import RemoteHost\n"
            "from eagle3_pipeline.settings import SshSettings, section\n"
            "ssh, config, records = json.loads(sys.argv[1])\n"
            "host = RemoteHost('vllm-box', section(SshSettings, ssh), config)\n"
            "recover_leftover(host, 'vllm.service', record_dir=records, sudo=False)\n"
        )
        args = json.dumps([_ssh_cfg(systemd_host), str(systemd_host.sshd.ssh_config), str(real_box.records)])
        b = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c", code, args],
                           capture_output=True, text=True)  # fmt: skip
        assert b.returncode != 0 and "another PID namespace" in b.stderr, b.stderr[-2000:]
        assert f"sudo systemctl stop {check.name}" in b.stderr  # how to recover by hand
        check.still_serving()  # A's check untouched
        with pytest.raises(ServeCheckError, match="another serve check holds"), _check(host, real_box):
            pass
    _production_is_back(real_box, starts=2)


def test_production_that_does_not_come_back_keeps_the_record(host, real_box):
    """Production fails as systemd starts it after the check (Restart=always until its start limit):
    the record stays and the error says what to run by hand."""
    _start(real_box)
    with pytest.raises(ServeCheckError) as info, _check(host, real_box):
        real_box.set("production-crashes")
    message = str(info.value)
    assert re.search("after the check unit stopped|not back as production", message), message
    assert "sudo systemctl stop eagle3-serve-check-" in message  # what to run by hand
    assert real_box.record.exists() and real_box.starts(draft=True)
    assert [e for e in real_box.events() if e["event"] == "crash" and not e["draft"]]  # systemd's restore ran
    real_box.gpu_held_by_one_server_at_a_time()


def test_a_sudo_user_writes_and_reads_through_sudo(host, real_box):
    """With server.ssh.sudo: the lock, the env file (0600: it holds the unit's secrets), systemd-run
    and the lease go through the real `sudo -n` (its log in the host's journal); the record (no
    secret) is world-readable."""
    _start(real_box)
    with _check(host, real_box, sudo=True):
        record = json.loads(real_box.record.read_text())
        assert oct(Path(record["env_file"]).stat().st_mode & 0o777) == "0o600"
        assert oct(real_box.record.stat().st_mode & 0o777) == "0o644"
    sudo_log = real_box.systemd.run("journalctl", "--no-pager", "-o", "cat", "_COMM=sudo", check=False).stdout
    for command in ("/usr/bin/ln -- ", "/usr/bin/systemd-run --unit=eagle3-serve-check-", "-lease.timer"):
        assert command in sudo_log, sudo_log[-3000:]
    _production_is_back(real_box, starts=2)


def test_a_sudo_user_without_the_rights_the_check_needs_is_told_the_line(host, real_box, wrappers):
    """sudo allows the SSH user systemctl but not systemd-run: refused before anything changes, with
    the sudoers line to add (sudo's own answer to `sudo -n -l CMD`, here for a user it does not know)."""
    before = _start(real_box)
    wrappers(
        "sudo", '[ "$2" = -l ] && case "$3" in */systemd-run|*/ln) exit 1;; esac\nexec /usr/bin/sudo "$@"'
    )
    with pytest.raises(ServeCheckError) as info, _check(host, real_box, sudo=True):
        pass
    assert "NOPASSWD: /usr/bin/systemd-run, /usr/bin/ln" in str(info.value), str(info.value)
    assert real_box.state()["InvocationID"] == before and not real_box.record.exists()


def _home(systemd_host: SystemdHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(systemd_host.sshd.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))  # fabric reads ~/.ssh/config, as in production


def test_the_snapshot_step_finishes_a_killed_check_first(systemd_host, real_box, tmp_path, monkeypatch):
    """scripts/snapshot_server.py calls recover_leftover_check before reading the unit: a record
    whose owner is provably gone (same host, boot and PID namespace; its process gone) is finished."""
    from eagle3_pipeline.server import host_record, process_identity
    from eagle3_pipeline.settings import ServerSettings, section

    _home(systemd_host, tmp_path, monkeypatch)
    before = _start(real_box)
    record = {"unit": UNIT, "run": "killed", "phase": "running", "was_active": True, "draft_path": "/srv/d-x",
              "check_unit": "eagle3-serve-check-killed.service", "invocation_before": before,
              "env_file": None, "owner": process_identity.identity() | {"start_ticks": -1}}  # fmt: skip
    real_box.record.write_text(json.dumps(record))
    server = section(ServerSettings, systemd_host.sshd.server_cfg(host_state_dir=str(real_box.records)))
    found = host_record.recover_leftover_check(server)
    assert [f["run"] for f in found] == ["killed"] and not real_box.record.exists()
    assert real_box.state()["InvocationID"] == before and len(real_box.starts()) == 1  # nothing to start


def test_a_whole_remote_check_that_fails_leaves_production_as_it_was(systemd_host, real_box, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """run_remote_serve_check on the host side: the checkpoint copied to a private folder, the check
    unit started with the draft; the stand-in has no /metrics, so the measurement fails; production
    is back (by systemd), verified, and the checkpoint folder removed. (The measurement itself is
    tested against real vLLM in test_serve_check.py.)"""
    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.settings import ServerSettings, ValidateSettings, section
    from eagle3_pipeline.validate.production_check import run_remote_serve_check

    _home(systemd_host, tmp_path, monkeypatch)
    real_box.install(user=None)  # runs as the SSH user, who owns the checkpoint's private folder
    _start(real_box)
    base = tmp_path / "remote-base"
    server = section(ServerSettings, systemd_host.sshd.server_cfg(
        base_url=f"http://127.0.0.1:{real_box.port}", start_timeout_s=30, api_key_env="E3_NO_KEY",
        host_state_dir=str(real_box.records),
    ))  # fmt: skip
    validate = ValidateSettings(num_speculative_tokens=3, remote_dir=str(base), enforce_eager=False)
    server_json = {"served_model_name": "kimi-k2", "port": real_box.port, "base_url": server.base_url}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    with pytest.raises(Exception, match="metrics"):
        run_remote_serve_check(
            server, validate, server_json, ckpt, [{"id": "q", "system": None, "question": "hi"}],
            Sampling("kimi-k2", 8, 0.0, 1.0, None), tmp_path / "work",
        )  # fmt: skip
    (draft,) = real_box.starts(draft=True)
    assert str(base) in " ".join(draft["argv"])  # the draft from its private folder
    assert list(base.iterdir()) == []
    _production_is_back(real_box, starts=2)


def test_a_literal_dollar_reaches_the_draft_as_written(host, real_box):
    """Production's `:` prefix (no expansion): `$LITERAL` reaches the draft as written, though systemd
    expands `$VAR` in a transient unit's command; without the prefix `$VLLM_LOGGING_LEVEL` is expanded
    for both, as systemd does for production."""
    command = real_box.unit_text().split("ExecStart=", 1)[1].split("\n", 1)[0]
    real_box.install(f"ExecStart=\nExecStart=:{command} --tag $LITERAL\n")
    _start(real_box)
    with _check(host, real_box, expand_environment=False):
        pass
    (draft,) = real_box.starts(draft=True)
    assert "$LITERAL" in draft["argv"]
    assert "$LITERAL" in real_box.starts()[0]["argv"]
    real_box.install(f"ExecStart=\nExecStart={command} --tag $VLLM_LOGGING_LEVEL\n")
    with _check(host, real_box, expand_environment=True):
        pass
    assert "INFO" in real_box.starts(draft=True)[-1]["argv"]
    _production_is_back(real_box, starts=3)
