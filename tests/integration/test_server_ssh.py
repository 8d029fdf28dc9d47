"""The SSH path against a real sshd on 127.0.0.1: snapshot over SSH (systemctl on the remote PATH, and
the unit-file fallback where systemctl fails), strict host keys, auth failure, timeouts, quoting, and
the health-checked tunnel."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from eagle3_pipeline.server.remote import HostError, RemoteHost
from eagle3_pipeline.server.snapshot import SnapshotError, snapshot_server
from eagle3_pipeline.server.tunnel import Tunnel
from eagle3_pipeline.settings import ServerSettings, SshSettings, section

pytestmark = pytest.mark.ssh
DATA = Path(__file__).parents[1] / "data"
SECRETS = ("hf_remoteSecretToken42", "sk-remote-envfile-key-43", "sk-remote-cli-key-44")


@pytest.fixture
def remote_units(tmp_path: Path) -> Path:
    """A unit folder on the "remote" (same machine): unit + drop-in + EnvironmentFile + --config."""
    units = tmp_path / "units"
    (units / "vllm.service.d").mkdir(parents=True)
    (units / "vllm.service").write_text(
        "[Service]\n"
        f"Environment=HF_TOKEN={SECRETS[0]} MODEL=/models/remote-old\n"
        f"EnvironmentFile={tmp_path}/vllm.env\n"
        f"WorkingDirectory={tmp_path}\n"
        "ExecStart=/opt/vllm/bin/vllm serve ${MODEL} --config args.yaml --port 18530 \\\n"
        f"    --api-key {SECRETS[2]}\n"
    )
    (units / "vllm.service.d" / "override.conf").write_text("[Service]\nEnvironment=MODEL=/models/remote\n")
    (tmp_path / "vllm.env").write_text(f"VLLM_API_KEY={SECRETS[1]}\n")
    (tmp_path / "args.yaml").write_text("served-model-name: remote-model\nreasoning-parser: kimi_k2\n")
    return units


@pytest.fixture
def fake_systemctl(sshd_server, remote_units: Path):
    """Put the systemctl stand-in (a real shell script, test data) first on the remote PATH."""
    target = sshd_server.bin_dir / "systemctl"
    target.write_text((DATA / "remote" / "systemctl").read_text().replace("@UNITS@", str(remote_units)))
    target.chmod(0o755)
    yield target
    target.unlink()


def _ssh(values: dict) -> SshSettings:
    return section(SshSettings, values)


def _snapshot(sshd_server, cfg: dict, out: Path, ssh_config: Path | None = None) -> dict:
    return snapshot_server(
        section(ServerSettings, cfg),
        unit_out=str(out / "unit.service"),
        server_out=str(out / "server.json"),
        identity_out=str(out / "identity.json"),
        ssh_config_path=str(ssh_config or sshd_server.ssh_config),
    )


def _assert_no_secrets(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            for secret in SECRETS:
                assert secret not in text, f"{secret} leaked into {path}"


def test_snapshot_over_ssh_with_systemctl(sshd_server, fake_systemctl, tmp_path: Path) -> None:
    server = _snapshot(sshd_server, sshd_server.server_cfg(), tmp_path / "out")
    assert server["model"] == "/models/remote"  # the drop-in overrides the fragment
    assert server["served_model_name"] == "remote-model"  # from --config, read over SSH
    assert server["reasoning_parser"] == "kimi_k2"
    assert server["source_host"] == "vllm-box"
    assert server["base_url"] == "http://127.0.0.1:18530"
    assert server["env"]["VLLM_API_KEY"] == "<redacted>"  # from the EnvironmentFile, read over SSH
    assert server["unresolved"] == []
    unit_text = (tmp_path / "out" / "unit.service").read_text()
    assert "override.conf" in unit_text and "--api-key <redacted>" in unit_text
    _assert_no_secrets(tmp_path / "out")


def test_resnapshot_is_byte_identical(sshd_server, fake_systemctl, tmp_path: Path) -> None:
    _snapshot(sshd_server, sshd_server.server_cfg(), tmp_path / "a")
    _snapshot(sshd_server, sshd_server.server_cfg(), tmp_path / "b")
    for name in ("unit.service", "server.json", "identity.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_unit_file_fallback_without_systemctl(sshd_server, remote_units: Path, tmp_path: Path) -> None:
    """The remote's own systemctl fails (no systemd here): the unit file and drop-ins are read instead."""
    cfg = sshd_server.server_cfg(unit_file=str(remote_units / "vllm.service"))
    server = _snapshot(sshd_server, cfg, tmp_path / "out")
    assert server["model"] == "/models/remote"
    assert server["served_model_name"] == "remote-model"
    _assert_no_secrets(tmp_path / "out")


def test_no_systemctl_and_no_unit_file_says_what_to_set(sshd_server, tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="server.unit_file"):
        _snapshot(sshd_server, sshd_server.server_cfg(), tmp_path / "out")


def test_unit_name_is_quoted(sshd_server, fake_systemctl, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    cfg = sshd_server.server_cfg(unit=f"x.service; touch {marker}; $(touch {marker})")
    with pytest.raises(SnapshotError, match="No files found"):
        _snapshot(sshd_server, cfg, tmp_path / "out")
    assert not marker.exists()


def test_unknown_host_key_is_refused_with_how_to_trust(sshd_server, fake_systemctl, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cfg = sshd_server.server_cfg(ssh={"known_hosts_file": str(empty)})
    with pytest.raises(SnapshotError) as info:
        _snapshot(sshd_server, cfg, tmp_path / "out")
    message = str(info.value)
    assert "not in" in message and "ssh-keyscan -p" in message and "accept_new" in message
    assert "SHA256:" in message or "ssh-ed25519" in message
    assert empty.read_text() == ""  # nothing was trusted
    assert not (tmp_path / "out").exists()


def test_accept_new_records_the_key_then_strict_accepts(sshd_server, fake_systemctl, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    cfg = sshd_server.server_cfg(ssh={"known_hosts_file": str(known), "known_hosts": "accept_new"})
    _snapshot(sshd_server, cfg, tmp_path / "a")
    assert sshd_server.host_public_key.split()[1] in known.read_text()
    strict = sshd_server.server_cfg(ssh={"known_hosts_file": str(known)})
    assert _snapshot(sshd_server, strict, tmp_path / "b")["model"] == "/models/remote"


def test_changed_host_key_is_refused(sshd_server, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    from support.sshd import keygen

    public = keygen(other).split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd_server.port} {public[0]} {public[1]}\n")
    ssh = _ssh(sshd_server.server_cfg(ssh={"known_hosts_file": str(known)})["ssh"])
    host = RemoteHost("vllm-box", ssh, str(sshd_server.ssh_config))
    with pytest.raises(HostError, match="does not match"):
        host.run("true")


def test_auth_failure_is_clear(sshd_server, tmp_path: Path) -> None:
    from support.sshd import keygen

    stranger = tmp_path / "stranger"
    keygen(stranger)
    config = sshd_server.write_ssh_config(tmp_path / "ssh_config", stranger)
    host = RemoteHost("vllm-box", _ssh(sshd_server.server_cfg()["ssh"]), str(config))
    start = time.monotonic()
    with pytest.raises(HostError, match="authentication .* failed"):
        host.run("true")
    assert time.monotonic() - start < 5 + 10  # connect_timeout_s plus slack: it must not hang


def test_silent_port_times_out_within_the_timeout(tmp_path: Path) -> None:
    """A port that accepts TCP but never sends an SSH banner (a black hole) ends within the timeout."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        ssh = {"known_hosts_file": str(tmp_path / "kh"), "connect_timeout_s": 2, "command_timeout_s": 5}
        host = RemoteHost(f"nobody@127.0.0.1:{port}", _ssh(ssh))
        start = time.monotonic()
        with pytest.raises(HostError, match="2 s"):
            host.run("true")
        assert time.monotonic() - start < 2 + 5


def test_command_timeout(sshd_server) -> None:
    ssh = dict(sshd_server.server_cfg()["ssh"], command_timeout_s=1)
    host = RemoteHost("vllm-box", _ssh(ssh), str(sshd_server.ssh_config))
    with pytest.raises(HostError, match="timed out"):
        host.run("sleep 30")
    host.close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_tunnel_is_rebuilt_when_it_dies(sshd_server, tmp_path: Path) -> None:
    """Forward to a real HTTP server on the "remote"; kill the SSH transport; url() rebuilds it."""
    (tmp_path / "health").write_text("")
    handler = lambda *a, **k: _Quiet(*a, directory=str(tmp_path), **k)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 18531), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    tunnel = Tunnel(
        "vllm-box", _ssh(sshd_server.server_cfg()["ssh"]), 18531, ssh_config_path=str(sshd_server.ssh_config)
    )
    try:
        url = tunnel.url()
        assert tunnel.alive()
        tunnel.host.connection.transport.close()  # the SSH connection drops
        assert not tunnel.alive()
        assert tunnel.url() == url
        assert tunnel.alive() and tunnel.rebuilds == 1
    finally:
        tunnel.close()
        httpd.shutdown()
        httpd.server_close()


def test_server_json_has_no_timestamps(sshd_server, fake_systemctl, tmp_path: Path) -> None:
    _snapshot(sshd_server, sshd_server.server_cfg(), tmp_path / "out")
    server = json.loads((tmp_path / "out" / "server.json").read_text())
    assert not any("time" in key or "date" in key for key in server)
    shutil.rmtree(tmp_path / "out")


def test_refused_port_fails_fast_and_clearly(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again when the block ends: nothing listens
    ssh = {"known_hosts_file": str(tmp_path / "kh"), "connect_timeout_s": 3}
    with pytest.raises(HostError, match=f"127.0.0.1:{port}"):
        RemoteHost(f"nobody@127.0.0.1:{port}", _ssh(ssh)).run("true")


OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
KNOWN_HOSTS_BEFORE = (
    "# fleet keys, managed by hand: keep this comment\n"
    f"@cert-authority *.example.com {OTHER_KEY} ca\n"
    "@revoked * ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl old\n"
    "\n"
    f"|1|JfKTdBh7rNbXkVAQCRp4OQoPfmI=|USECr3SWf1JUPsms5AqfD5QfxkM= {OTHER_KEY}\n"
    f"other.example.com,10.0.0.9 {OTHER_KEY}"
)  # no final newline: the appended line must not glue onto it


@pytest.mark.parametrize("hashed", [False, True])
def test_accept_new_appends_one_line_and_keeps_the_file(sshd_server, tmp_path: Path, hashed: bool) -> None:
    """OpenSSH's accept-new: the new key's line is appended; comments, @cert-authority and @revoked
    lines and every other byte stay as they were (paramiko's save_host_keys would rewrite the file)."""
    known = tmp_path / "known_hosts"
    known.write_text(KNOWN_HOSTS_BEFORE)
    config = sshd_server.ssh_config
    if hashed:
        config = tmp_path / "ssh_config"
        config.write_text(sshd_server.ssh_config.read_text() + "  HashKnownHosts yes\n")
    ssh = sshd_server.server_cfg(ssh={"known_hosts_file": str(known), "known_hosts": "accept_new"})["ssh"]
    host = RemoteHost("vllm-box", _ssh(ssh), str(config))
    try:
        assert host.run("echo hi").stdout == "hi\n"
    finally:
        host.close()
    after = known.read_text()
    assert after.startswith(KNOWN_HOSTS_BEFORE + "\n")
    added = after[len(KNOWN_HOSTS_BEFORE) + 1 :]
    assert added.count("\n") == 1 and added.endswith("\n")
    entry, key_type, key = added.split()
    assert f"{key_type} {key}" == sshd_server.host_public_key
    assert entry.startswith("|1|") if hashed else entry == f"[127.0.0.1]:{sshd_server.port}"
    strict = RemoteHost("vllm-box", _ssh(dict(ssh, known_hosts="strict")), str(config))
    try:
        assert strict.run("true").ok  # the appended line is one that both paramiko and OpenSSH read
    finally:
        strict.close()
    assert known.read_text() == after


def test_revoked_host_key_is_refused_even_with_accept_new(sshd_server, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * {sshd_server.host_public_key}\n")
    ssh = sshd_server.server_cfg(ssh={"known_hosts_file": str(known), "known_hosts": "accept_new"})["ssh"]
    with pytest.raises(HostError, match="@revoked"):
        RemoteHost("vllm-box", _ssh(ssh), str(sshd_server.ssh_config)).run("true")
    assert known.read_text() == f"@revoked * {sshd_server.host_public_key}\n"


def test_tunnel_waits_for_a_server_that_starts_after_it_opens(sshd_server) -> None:
    """While vLLM loads its port refuses connections: the tunnel must outlive those refusals, and
    /health polled through it must see the server once it listens."""
    from support.http_endpoint import ScriptedEndpoint

    from eagle3_pipeline.ports import free_port
    from eagle3_pipeline.server.health import check_health, wait_healthy

    port = free_port()  # nothing listens there yet
    tunnel = Tunnel(
        "vllm-box", _ssh(sshd_server.server_cfg()["ssh"]), port, ssh_config_path=str(sshd_server.ssh_config)
    )
    started: list[ScriptedEndpoint] = []
    try:
        url = tunnel.url()
        for _ in range(3):
            assert not check_health(url, timeout_s=2)  # refused on the remote side: reported as down
        assert tunnel.refused >= 3
        starter = threading.Timer(2.0, lambda: started.append(ScriptedEndpoint(port).start()))
        starter.start()
        wait_healthy(url, 20)  # polls through the tunnel, which the refusals did not kill
        starter.join()
        assert tunnel.rebuilds == 0
    finally:
        tunnel.close()
        for endpoint in started:
            endpoint.stop()


def test_tunnel_follows_a_restarting_server_and_a_dropped_connection(sshd_server) -> None:
    from support.http_endpoint import ScriptedEndpoint

    from eagle3_pipeline.server.health import check_health, wait_healthy

    first = ScriptedEndpoint().start()
    port = first.port
    tunnel = Tunnel(
        "vllm-box", _ssh(sshd_server.server_cfg()["ssh"]), port, ssh_config_path=str(sshd_server.ssh_config)
    )
    second = None
    try:
        url = tunnel.url()
        assert check_health(url)
        first.stop()  # the server goes down (a restart) ...
        assert not check_health(url, timeout_s=2)
        second = ScriptedEndpoint(port).start()  # ... and comes back on the same port
        wait_healthy(url, 20)
        tunnel.host.connection.transport.close()  # then the SSH connection drops
        wait_healthy(url, 20)  # the next request through the tunnel rebuilds it
        assert tunnel.rebuilds == 1 and tunnel.url() == url
    finally:
        tunnel.close()
        if second is not None:
            second.stop()
