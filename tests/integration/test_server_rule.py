"""Rule snapshot_server through Snakemake in a scratch working directory: outputs, a rerun that changes
nothing, and no secret anywhere (outputs, logs, .snakemake metadata, Snakemake's own output)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support.workflow import workdir_run

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("hf_ruleSecretToken77", "sk-rule-api-key-78")
UNIT = f"""[Service]
Environment=HF_TOKEN={SECRETS[0]} MODEL=/models/rule
ExecStart=/opt/vllm/bin/vllm serve $MODEL --port 18535 --served-model-name rule-model --api-key {SECRETS[1]}
"""
TARGET = "results/srv/server/server.json"


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return workdir_run(workdir, "--configfile", "srv.yaml", "--cores", "1", *args, timeout=600)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "config").symlink_to(ROOT / "config")
    unit = tmp_path / "vllm.service"
    unit.write_text(UNIT)
    overrides = {
        "run": "srv",
        "demo": {"enabled": False},
        "server": {"unit": "vllm.service", "unit_file": str(unit)},
    }
    (tmp_path / "srv.yaml").write_text(yaml.safe_dump(overrides))
    return tmp_path


def _assert_no_secret(workdir: Path, *texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text
    for path in workdir.rglob("*"):
        if path.is_file() and path.name != "vllm.service":
            content = path.read_bytes()
            for secret in SECRETS:
                assert secret.encode() not in content, f"{secret} in {path}"


def test_rule_snapshot_server(workdir: Path) -> None:
    first = _snakemake(workdir, TARGET)
    assert first.returncode == 0, first.stderr[-4000:]
    out = workdir / "results" / "srv" / "server"
    before = {name: (out / name).read_bytes() for name in ("unit.service", "server.json", "identity.json")}
    assert b'"served_model_name": "rule-model"' in before["server.json"]

    again = _snakemake(workdir, TARGET)
    assert "Nothing to be done" in again.stdout + again.stderr

    forced = _snakemake(workdir, "--force", TARGET)
    assert forced.returncode == 0, forced.stderr[-4000:]
    assert {name: (out / name).read_bytes() for name in before} == before  # byte-identical: nothing stale
    _assert_no_secret(workdir, first.stdout, first.stderr, forced.stdout, forced.stderr)


def test_rule_failure_names_the_problem_without_secrets(workdir: Path) -> None:
    # a line without '=' is only a warning (systemd ignores it); a second ExecStart= without the empty
    # reset is refused, as systemd refuses to start such a Type=simple service
    second = f"ExecStart=/opt/vllm/bin/vllm serve /models/other --api-key {SECRETS[1]}\n"
    (workdir / "vllm.service").write_text(
        UNIT + f"Environment=OTHER_TOKEN={SECRETS[0]}x\nnot valid\n{second}"
    )
    result = _snakemake(workdir, TARGET)
    assert result.returncode != 0
    log = (workdir / "results" / "srv" / "logs" / "snapshot_server.log").read_text()
    assert "vllm.service: Service has more than one ExecStart= setting" in log
    _assert_no_secret(workdir, result.stdout, result.stderr)
