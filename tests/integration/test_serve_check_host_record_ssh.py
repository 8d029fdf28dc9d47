"""The serve check's state machine and host record, and the lifecycle's ownership, as operators run
them, over a real sshd: a unit still `activating`, a slow health-gated start, a kill between two
restore steps, two pipelines on one unit, a unit edited on disk, a check that fails before the draft
ran, a host in another language, a sudo user, a missing InvocationID.

systemctl and journalctl on the remote are tests/data/remote/systemctl-unit (its header says what it
models: ActiveState transitions, InvocationID, NeedDaemonReload, ExecStart, MainPID), with a real
process behind it; `sudo` is tests/data/remote/sudo (the `-n` contract, every call logged). SSH, the
files and their modes are real. The unit folders are under tmp_path, never the real /run.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from support.sshd import StandInUnit, kill_stand_in_unit

from eagle3_pipeline.ports import free_port
from eagle3_pipeline.server import host_record
from eagle3_pipeline.server.dropin import DROPIN_NAME, ServeCheckError, dropin_text, exec_start_with_draft
from eagle3_pipeline.server.host_record import DRAFT as DRAFT_PHASE
from eagle3_pipeline.server.host_record import draft_dropin, recover_leftover
from eagle3_pipeline.server.lifecycle import ensure_running, stop
from eagle3_pipeline.server.remote import HostError, RemoteHost
from eagle3_pipeline.server.unit import ExecCommand
from eagle3_pipeline.settings import ServerSettings, SshSettings, section

pytestmark = pytest.mark.ssh
DATA = Path(__file__).resolve().parents[1] / "data"
UNIT = "vllm.service"
PRODUCTION = "/usr/bin/vllm serve /models/kimi --port 8000"
DRAFT = "/srv/eagle3-draft-ckpt"
# The unit's process: an HTTP server answering /health and /v1/models from files; the words systemd
# would pass (the loaded ExecStart) are its arguments, so /proc/MAINPID/cmdline shows what "runs".
SERVER = (
    "import functools, http.server, sys\n"
    "port, folder = int(sys.argv[1]), sys.argv[2]\n"
    "handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)\n"
    "http.server.ThreadingHTTPServer(('127.0.0.1', port), handler).serve_forever()\n"
)


class Box(StandInUnit):
    """The stand-in's state, the unit folders and the record folder on the "host"."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.state, self.units, self.records = root / "state", root / "run-units", root / "run-eagle3"

    @property
    def dropin(self) -> Path:
        return self.units / f"{UNIT}.d" / DROPIN_NAME

    @property
    def record(self) -> Path:
        return self.records / f"{UNIT}.serve-check.json"

    def acts(self) -> list[str]:
        """systemctl calls that change something (reads left out)."""
        return [
            c.removeprefix("systemctl ")
            for c in self.calls()
            if c.startswith("systemctl") and not c.startswith(("systemctl show", "systemctl is-"))
        ]

    def sudo_calls(self) -> list[str]:
        path = self.state / "sudo-calls"
        return path.read_text().splitlines() if path.exists() else []

    def set(self, name: str, value: str) -> None:
        (self.state / name).write_text(value)

    def invocation(self) -> str:
        return (self.state / "invocation").read_text().strip()


@pytest.fixture
def box(sshd_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = Box(tmp_path, free_port())
    served = tmp_path / "served"
    for folder in (fake.state, fake.units, served / "v1"):
        folder.mkdir(parents=True)
    (served / "health").write_text("")
    (served / "v1" / "models").write_text(json.dumps({"data": [{"id": "kimi-k2"}]}))
    (fake.state / "exec").write_text(
        f'#!/bin/sh\nexec {sys.executable} -c {shlex.quote(SERVER)} {fake.port} {served} "$@"\n'
    )
    (fake.state / "exec").chmod(0o755)
    fake.set("production-exec", PRODUCTION)
    fake.set("argv", "")
    script = (DATA / "remote" / "systemctl-unit").read_text()
    script = script.replace("@STATE@", str(fake.state)).replace("@UNITS@", str(fake.units))
    sudo = (DATA / "remote" / "sudo").read_text().replace("@STATE@", str(fake.state))
    for name, text in (("systemctl", script), ("journalctl", script), ("sudo", sudo)):
        (sshd_server.bin_dir / name).write_text(text)
        (sshd_server.bin_dir / name).chmod(0o755)
    monkeypatch.setattr(host_record, "RESTORE_RETRY_S", 0.1)
    monkeypatch.setattr(host_record, "POLL_S", 0.2)
    yield fake
    kill_stand_in_unit(fake.state)
    for name in ("systemctl", "journalctl", "sudo", "cat"):
        (sshd_server.bin_dir / name).unlink(missing_ok=True)


def _ssh(sshd_server) -> SshSettings:
    return section(SshSettings, sshd_server.server_cfg()["ssh"])


@pytest.fixture
def host(sshd_server):
    remote = RemoteHost("vllm-box", _ssh(sshd_server), str(sshd_server.ssh_config))
    yield remote
    remote.close()


def _check(host, box: Box, sudo: bool = False, timeout_s: float = 60, **kwargs):
    exec_start = exec_start_with_draft(ExecCommand("", PRODUCTION), DRAFT, 3, False)
    return draft_dropin(
        host, UNIT, exec_start, record_dir=str(box.records), sudo=sudo, timeout_s=timeout_s,
        unit_dir=str(box.units), draft_path=DRAFT, **kwargs,
    )  # fmt: skip


def _start(host) -> None:
    assert host.run(f"systemctl start -- {UNIT}").ok


def _recover(host, box: Box, sudo: bool = False, **kwargs):
    return recover_leftover(
        host,
        UNIT,
        record_dir=str(box.records),
        sudo=sudo,
        timeout_s=60,
        unit_dirs=(str(box.units),),
        **kwargs,
    )


def test_the_record_is_written_first_and_removed_last(host, box):
    """Item 2: the record exists from before the drop-in until production is verified."""
    _start(host)
    with _check(host, box, verify=box.production_check()):
        record = json.loads(box.record.read_text())
        assert record["phase"] == DRAFT_PHASE and record["was_active"] is True
        assert record["owner"]["pid"] == os.getpid() and record["owner"]["start_ticks"]
        assert record["draft_invocation"] == box.invocation()
    assert not box.record.exists() and not box.dropin.exists() and box.mainpid_alive()


def test_a_kill_between_the_restore_steps_is_resumed_by_the_next_run(host, box):
    """Item 2: the drop-in is gone but production still runs the draft (the start failed, as after a
    lost connection); the record stays, and the next run restarts production and verifies it."""
    _start(host)
    with pytest.raises(ServeCheckError, match="record .* stays"), _check(host, box):
        box.set("fail-restart", "5")
    assert not box.dropin.exists() and box.record.exists()
    draft_invocation = box.invocation()  # the draft still runs
    assert DRAFT in Path(f"/proc/{(box.state / 'mainpid').read_text().strip()}/cmdline").read_text()
    box.set("fail-restart", "0")
    record = json.loads(box.record.read_text())
    record["owner"]["start_ticks"] = -1  # the killed run: its process is gone
    box.record.write_text(json.dumps(record))
    found = _recover(host, box, verify=box.production_check())
    assert [f["run"] for f in found] == [record["run"]]
    assert box.invocation() != draft_invocation and box.mainpid_alive() and not box.record.exists()
    assert DRAFT not in Path(f"/proc/{(box.state / 'mainpid').read_text().strip()}/cmdline").read_text()


def test_a_unit_still_activating_counts_as_running(host, box):
    """Item 4: production is loading (a health-gated start) when the check begins: it is restarted
    afterwards, never stopped."""
    box.set("start-delay", "2")
    assert host.run(f"systemctl start --no-block -- {UNIT}").ok
    assert host.run(f"systemctl show -p ActiveState -- {UNIT}").stdout.strip() == "ActiveState=activating"
    with _check(host, box, verify=box.production_check()):
        assert json.loads(box.record.read_text())["was_active"] is True
    assert f"stop -- {UNIT}" not in box.acts() and box.mainpid_alive()


def test_a_slow_restore_is_not_reissued(host, box):
    """Item 8: production's start takes longer than one try; the retry waits for it instead of
    issuing `restart` again (which would kill the load)."""
    _start(host)
    with _check(host, box, timeout_s=1, verify=box.production_check()):
        box.set("start-delay", "3")  # production's start, from here on, is slow
    restarts = [c for c in box.acts() if c.startswith("restart")]
    assert restarts == [f"restart -- {UNIT}", f"restart --no-block -- {UNIT}"]  # the draft's, production's
    assert box.mainpid_alive() and not box.record.exists()


def test_a_check_that_fails_before_the_draft_ran_restarts_nothing(host, box):
    """Item 9: the checkpoint's hash check fails after the drop-in was written: the drop-in is removed
    and reloaded, production is never restarted."""
    _start(host)
    before = box.invocation()

    def bad_checksum() -> None:
        raise ServeCheckError("model.safetensors differ from the local checkpoint")

    with pytest.raises(ServeCheckError, match="differ"), _check(host, box, before_restart=bad_checksum):
        pass
    assert box.acts()[-1] == "daemon-reload" and not any(
        c.startswith(("restart", "stop")) for c in box.acts()
    )
    assert box.invocation() == before and not box.dropin.exists() and not box.record.exists()


def test_a_unit_with_changes_on_disk_is_refused_untouched(host, box):
    """Item 7: NeedDaemonReload=yes: a restore would start the edited unit."""
    _start(host)
    box.set("need-reload", "yes")
    acts = box.acts()
    with pytest.raises(ServeCheckError, match="NeedDaemonReload=yes"), _check(host, box):
        pass
    assert box.acts() == acts and not box.dropin.exists() and not box.record.exists()


def test_two_pipelines_on_one_unit(host, box):
    """Item 6: a second check is refused while the first holds the unit, and its recovery refuses to
    "restore" the first's live check; a record whose process is gone is recovered."""
    _start(host)
    with _check(host, box, verify=box.production_check()) as run_id:
        with pytest.raises(ServeCheckError, match="another serve check holds"), _check(host, box):
            pass
        with pytest.raises(ServeCheckError, match="is still running"):
            _recover(host, box)
        assert box.dropin.exists() and json.loads(box.record.read_text())["run"] == run_id
    assert not box.record.exists()
    box.records.mkdir(exist_ok=True)
    other = {"unit": UNIT, "run": "r2", "phase": "draft", "was_active": True, "dropin": str(box.dropin),
             "owner": {"host": "another-login-node", "pid": 1, "start_ticks": 1}}  # fmt: skip
    box.record.write_text(json.dumps(other))
    with pytest.raises(ServeCheckError, match="ran on another machine"):
        _recover(host, box)


def test_a_sudo_user_reads_back_what_it_wrote_through_sudo(host, box):
    """Item 3: with server.ssh.sudo the drop-in is written 0600 through sudo; its recovery reads it
    through sudo too (a non-root SSH user cannot read it otherwise)."""
    _start(host)
    box.dropin.parent.mkdir(parents=True)
    box.dropin.write_text(dropin_text('"/usr/bin/vllm" "serve" "/draft"', "killed", True))
    box.dropin.chmod(0o600)
    found = _recover(host, box, sudo=True, verify=box.production_check())
    assert [f["run"] for f in found] == ["killed"]
    assert f"sudo -n cat -- {box.dropin}" in box.sudo_calls()
    with _check(host, box, sudo=True, verify=box.production_check()):
        assert oct(box.dropin.stat().st_mode & 0o777) == "0o600"
        assert oct(box.record.stat().st_mode & 0o777) == "0o644"  # no secret in it: readable
    assert any(c.startswith("sudo -n ln -- ") for c in box.sudo_calls())  # the lock, taken through sudo


def test_a_host_in_another_language(sshd_server, host, box):
    """Item 10: remote commands run with LC_ALL=C, and a missing file is told by exit status, not by
    the English "No such file": here `cat` answers in German whatever the locale."""
    (sshd_server.bin_dir / "cat").write_text(
        f'#!/bin/sh\necho "LC_ALL=$LC_ALL $*" >> {box.state}/locale\n'
        'for f; do [ "$f" = -- ] || [ -e "$f" ] || '
        '{ echo "cat: $f: Datei oder Verzeichnis nicht gefunden" >&2; exit 1; }; done\nexec /bin/cat "$@"\n'
    )
    (sshd_server.bin_dir / "cat").chmod(0o755)
    _start(host)
    assert _recover(host, box) == []  # nothing left: no error either
    with pytest.raises(FileNotFoundError):
        host.read_file("/nonexistent/unit.service")
    box.dropin.parent.mkdir(parents=True)
    box.dropin.write_text(dropin_text('"/usr/bin/vllm" "serve" "/draft"', "r3", True))
    assert [f["run"] for f in _recover(host, box, verify=box.production_check())] == ["r3"]
    reads = [line.split(" ", 1) for line in (box.state / "locale").read_text().splitlines()]
    assert {env for env, args in reads if args} == {"LC_ALL=C"}  # every file the pipeline read


# --- ownership (server.manage): who started the unit ---------------------------------------------


def _manage_cfg(sshd_server, box: Box, tmp_path: Path) -> tuple[ServerSettings, dict, Path]:
    values = sshd_server.server_cfg(manage=True, stop_after_generation=True, start_timeout_s=30,
                                    base_url=f"http://127.0.0.1:{box.port}")  # fmt: skip
    cfg = section(ServerSettings, values)
    server_json = {"served_model_name": "kimi-k2", "base_url": cfg.base_url}
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd_server.ssh_config.read_text())
    return cfg, server_json, tmp_path / "server-state"


def test_a_unit_still_loading_is_not_started_nor_stopped_by_the_pipeline(
    sshd_server, box, tmp_path, monkeypatch
):
    """Item 1: an operator's restart is still loading (activating, /health failing): `systemctl start`
    would be a no-op, so the pipeline does not count itself the starter and leaves it running."""
    cfg, server_json, state = _manage_cfg(sshd_server, box, tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    exec_script = (box.state / "exec").read_text().replace("exec ", "sleep 2; exec ", 1)
    (box.state / "exec").write_text(exec_script)
    box.set("start-delay", "2")
    RemoteHost("vllm-box", cfg.ssh, str(sshd_server.ssh_config)).run(f"systemctl start --no-block -- {UNIT}")
    ensure_running(server_json, cfg, state)
    assert json.loads((state / "ownership.json").read_text())["started_by_pipeline"] is False
    assert stop(server_json, cfg, state)["action"] == "left running" and box.mainpid_alive()
    assert f"start -- {UNIT}" not in box.acts()


def test_an_unknown_invocation_id_is_not_ours(sshd_server, box, tmp_path, monkeypatch):
    """Item 1: systemd shows no InvocationID (an old systemd, a failed show): the start cannot be told
    from another, so the unit is not stopped as the pipeline's."""
    cfg, server_json, state = _manage_cfg(sshd_server, box, tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    box.set("no-invocation", "")
    ensure_running(server_json, cfg, state)
    assert stop(server_json, cfg, state)["action"] == "left running" and box.mainpid_alive()


def test_proxyjump_uses_the_same_host_key_policy(sshd_server, tmp_path):
    """Item 11: the bastion of a ProxyJump is checked against known_hosts like the host itself (its
    name here, `localhost`, is not in known_hosts: refused under server.ssh.known_hosts: strict)."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host vllm-box\n  HostName 127.0.0.1\n  Port {sshd_server.port}\n  User {sshd_server.user}\n"
        f"  IdentityFile {sshd_server.user_key}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName localhost\n  Port {sshd_server.port}\n  User {sshd_server.user}\n"
        f"  IdentityFile {sshd_server.user_key}\n"
    )
    remote = RemoteHost("vllm-box", _ssh(sshd_server), str(config))
    try:
        with pytest.raises(HostError, match="localhost.*is not in"):
            remote.run("true")
    finally:
        remote.close()
