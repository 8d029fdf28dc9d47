"""ServerSnapshot: server.json parsed in one place, every key the snapshot writes a typed field, the file
as written kept in `raw`; dicts still taken where callers pass them (ServerSnapshot.of)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from eagle3_pipeline import secrets
from eagle3_pipeline.server_json import ServerSnapshot

UNITS = Path(__file__).resolve().parents[1] / "data" / "units"
FIELDS = {f.name for f in dataclasses.fields(ServerSnapshot)} - {"raw"}


def _corpus() -> list[dict]:
    return [json.loads(path.read_text())["server"] for path in sorted(UNITS.glob("*/expected.json"))]


def test_every_key_the_snapshot_writes_is_a_field_and_the_file_is_kept_as_written(tmp_path):
    servers = _corpus()
    assert servers
    for server in servers:
        assert set(server) <= FIELDS | {"python", "vllm_version"}
        (tmp_path / "server.json").write_text(json.dumps(server))
        snapshot = ServerSnapshot.load(tmp_path / "server.json")
        assert snapshot.raw == server
        listed = ("unresolved", "warnings")  # tuples in the frozen snapshot
        expected = {name: tuple(value) if name in listed else value for name, value in server.items()}
        assert {name: getattr(snapshot, name) for name in server} == expected


def test_the_fields_readers_use():
    server = {
        "model": "/models/kimi",
        "served_model_name": "kimi",
        "port": 8000,
        "max_model_len": 4096,
        "python": "/opt/vllm/bin/python",
        "args": {"--dtype": "bfloat16"},
        "later_key": 1,
    }
    snapshot = ServerSnapshot.from_json(server)
    assert snapshot.request_model == "kimi" and snapshot.python == "/opt/vllm/bin/python"
    assert snapshot.args == {"--dtype": "bfloat16"} and snapshot.env == {}
    assert snapshot.trust_remote_code is None and snapshot.vllm_version is None  # not in the file: unknown
    assert snapshot.stated(["model", "identity", "later_key"]) == {"model": "/models/kimi", "later_key": 1}
    assert ServerSnapshot.from_json({"model": "m"}).request_model == "m"  # vLLM's default name: the model
    assert ServerSnapshot.from_json({"served_model_name": ["a", "b"]}).request_model == "a"


def test_a_dict_is_still_taken_where_callers_pass_one():
    snapshot = ServerSnapshot.from_json({"model": "m"})
    assert ServerSnapshot.of(snapshot) is snapshot
    assert ServerSnapshot.of({"model": "m"}) == snapshot
    redactor, source = secrets.Redactor(), secrets.Redactor(salt="unit-salt")
    source.add("hunter2-secret-value")
    secrets.learn({"redaction": source.export()}, redactor)
    secrets.learn(ServerSnapshot.from_json({}), redactor)  # no redaction: nothing learnt, no error
    assert "hunter2-secret-value" not in redactor.scrub("token hunter2-secret-value")


def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path):
    (tmp_path / "server.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not an object"):
        ServerSnapshot.load(tmp_path / "server.json")
    with pytest.raises(OSError):
        ServerSnapshot.load(tmp_path / "absent.json")
