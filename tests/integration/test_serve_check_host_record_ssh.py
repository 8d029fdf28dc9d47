"""Ownership of a server the pipeline starts (server.manage) and the serve check's host record, over a
real sshd, as operators' hosts behave: a health-gated start that outlives the SSH command timeout, a
link that drops on the way to `systemctl start` or on the way back, a job killed after sending the
start, a unit still `activating`, a missing InvocationID; a host in another language; ProxyJump.
(The serve check's scenarios run on a real systemd: test_serve_check_real_systemd.py.)

systemctl, systemd-run and journalctl on the remote are tests/data/remote/systemctl-unit (its header
says what it models), `sudo` is tests/data/remote/sudo. SSH, the files and their modes are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.standin_systemd import UNIT, Box
from support.standin_systemd import box as box  # noqa: F401 (fixtures)
from support.standin_systemd import fast_polls as fast_polls  # noqa: F401
from support.standin_systemd import host as host  # noqa: F401

from eagle3_pipeline.server import ownership, process_identity
from eagle3_pipeline.server.host_record import recover_leftover
from eagle3_pipeline.server.lifecycle import ensure_running, stop
from eagle3_pipeline.server.remote import HostError, RemoteHost
from eagle3_pipeline.settings import ServerSettings, SshSettings, section

pytestmark = pytest.mark.ssh
DRAFT = "/srv/eagle3-draft-ckpt"


def _ssh(sshd_server, **overrides) -> SshSettings:
    return section(SshSettings, sshd_server.server_cfg(ssh=overrides)["ssh"])


def _manage(sshd_server, box: Box, tmp_path: Path, monkeypatch, **ssh) -> tuple[ServerSettings, dict, Path]:
    values = sshd_server.server_cfg(manage=True, stop_after_generation=True, start_timeout_s=30,
                                    base_url=f"http://127.0.0.1:{box.port}", ssh=ssh)  # fmt: skip
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(sshd_server.ssh_config.read_text())
    monkeypatch.setenv("HOME", str(home))  # fabric reads ~/.ssh/config, as in production
    cfg = section(ServerSettings, values)
    return cfg, {"served_model_name": "kimi-k2", "base_url": cfg.base_url}, tmp_path / "server-state"


def _owner(state: Path) -> dict:
    return json.loads((state / "ownership.json").read_text())


def test_a_health_gated_start_outliving_the_ssh_timeout(sshd_server, box, tmp_path, monkeypatch):
    """The unit stays `activating` longer than server.ssh.command_timeout_s: the start is sent without
    waiting (`--no-block`), so it never times out, and the pipeline owns it and stops it after."""
    cfg, server_json, state = _manage(sshd_server, box, tmp_path, monkeypatch, command_timeout_s=1)
    box.set("start-delay", "3")
    ensure_running(server_json, cfg, state)
    owner = _owner(state)
    assert owner["started_by_pipeline"] is True and owner["invocation_id"] == box.invocation()
    assert "pending" not in owner and len(box.starts()) == 1
    assert stop(server_json, cfg, state)["action"] == "stopped" and not box.mainpid_alive()


@pytest.mark.parametrize("where", ["drop-start", "drop-after-start"])
def test_a_link_that_drops_on_the_way_to_the_start_or_back(sshd_server, box, tmp_path, monkeypatch, where):
    """Before: systemd, read again, never saw the start: sent again. After: it did: not sent again.
    Either way one start, owned by the pipeline."""
    cfg, server_json, state = _manage(sshd_server, box, tmp_path, monkeypatch)
    box.set(where, "1")
    ensure_running(server_json, cfg, state)
    assert len(box.starts()) == 1 and _owner(state)["invocation_id"] == box.invocation()
    assert stop(server_json, cfg, state)["action"] == "stopped"


def test_ownership_is_recorded_before_the_start_is_sent(sshd_server, host, box, tmp_path, monkeypatch):
    """A job killed right after sending the start leaves `pending` with the InvocationID before it: the
    next job's stop knows the start since then is the pipeline's."""
    cfg, server_json, state = _manage(sshd_server, box, tmp_path, monkeypatch)
    ownership.record_ownership(state, True, cfg, invocation_before=None, invocation_id=None, pending=True)
    assert host.run(f"systemctl start -- {UNIT}").ok  # what the killed job had sent
    assert stop(server_json, cfg, state)["action"] == "stopped" and not box.mainpid_alive()


def test_a_unit_still_loading_is_not_started_nor_stopped_by_the_pipeline(sshd_server, host, box, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    """An operator's start is still loading (activating): `systemctl start` would be a no-op, so the
    pipeline does not count itself the starter and leaves it running."""
    cfg, server_json, state = _manage(sshd_server, box, tmp_path, monkeypatch)
    box.set("start-delay", "2")
    assert host.run(f"systemctl start --no-block -- {UNIT}").ok
    ensure_running(server_json, cfg, state)
    assert _owner(state)["started_by_pipeline"] is False and len(box.starts()) == 1
    assert stop(server_json, cfg, state)["action"] == "left running" and box.mainpid_alive()


def test_an_unknown_invocation_id_is_not_ours(sshd_server, box, tmp_path, monkeypatch):
    """systemd shows no InvocationID (an old systemd): the start cannot be told from another."""
    cfg, server_json, state = _manage(sshd_server, box, tmp_path, monkeypatch)
    box.set("no-invocation")
    ensure_running(server_json, cfg, state)
    assert stop(server_json, cfg, state)["action"] == "left running" and box.mainpid_alive()


def test_a_host_in_another_language(sshd_server, host, box):
    """Remote commands run with LC_ALL=C, and a missing file is told by exit status, not by the English
    "No such file": here `cat` answers in German whatever the locale."""
    (sshd_server.bin_dir / "cat").write_text(
        f'#!/bin/sh\necho "LC_ALL=$LC_ALL $*" >> {box.state}/locale\n'
        'for f; do [ "$f" = -- ] || [ -e "$f" ] || '
        '{ echo "cat: $f: Datei oder Verzeichnis nicht gefunden" >&2; exit 1; }; done\nexec /bin/cat "$@"\n'
    )
    (sshd_server.bin_dir / "cat").chmod(0o755)
    try:
        assert recover_leftover(host, UNIT, record_dir=str(box.records), sudo=False) == []
        with pytest.raises(FileNotFoundError):
            host.read_file("/nonexistent/unit.service")
        record = {"unit": UNIT, "run": "r3", "phase": "locked", "was_active": False, "env_file": None,
                  "check_unit": "eagle3-serve-check-r3.service",
                  "owner": process_identity.identity() | {"start_ticks": -1}}  # fmt: skip
        box.record.write_text(json.dumps(record))
        assert [f["run"] for f in recover_leftover(host, UNIT, record_dir=str(box.records), sudo=False)] == [
            "r3"
        ]
        reads = [line.split(" ", 1) for line in (box.state / "locale").read_text().splitlines()]
        assert {env for env, args in reads if args} == {"LC_ALL=C"}  # every file the pipeline read
    finally:
        (sshd_server.bin_dir / "cat").unlink()


def test_proxyjump_uses_the_same_host_key_policy(sshd_server, tmp_path):
    """The bastion of a ProxyJump is checked against known_hosts like the host itself (its name here,
    `localhost`, is not in known_hosts: refused under server.ssh.known_hosts: strict)."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host vllm-box\n  HostName 127.0.0.1\n  Port {sshd_server.port}\n  User {sshd_server.user}\n"
        f"  IdentityFile {sshd_server.user_key}\n  ProxyJump bastion\n"
        f"Host bastion\n  HostName localhost\n  Port {sshd_server.port}\n  User {sshd_server.user}\n"
        f"  IdentityFile {sshd_server.user_key}\n"
    )
    remote_host = RemoteHost("vllm-box", _ssh(sshd_server), str(config))
    try:
        with pytest.raises(HostError, match="localhost.*is not in"):
            remote_host.run("true")
    finally:
        remote_host.close()
