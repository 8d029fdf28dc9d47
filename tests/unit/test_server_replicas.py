"""server.replicas without a server: the stable assignment, each replica's config, the config checks
and the identity comparison on real snapshots of unit files."""

from __future__ import annotations

import copy
import pickle
from collections import Counter
from pathlib import Path

import pytest
import yaml

from eagle3_pipeline.config import ConfigError, check_config
from eagle3_pipeline.server.remote import LocalHost
from eagle3_pipeline.server.replicas import (
    assigned_server,
    check_identity,
    fleet,
    identity_differences,
    identity_fields,
    resource_name,
    shard_caps,
)
from eagle3_pipeline.server.snapshot import take_snapshot
from eagle3_pipeline.server_json import ServerSnapshot
from eagle3_pipeline.servers import NAME_PATTERN, ReplicaError, replica_config, server_names
from eagle3_pipeline.settings import GenerationSettings, ServerSettings, section

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "config" / "schema.yaml"
SERVER_CFG = {
    "host": "local",
    "unit": "vllm.service",
    "unit_file": "/units/a.service",
    "base_url": None,
    "tunnel": False,
    "api_key_env": "KEY",
    "start_timeout_s": 60,
    "name": "main",
    "max_shard_jobs": 2,
    "replicas": [
        {"name": "b", "unit_file": "/units/b.service", "max_shard_jobs": 1},
        {"name": "gpu2", "host": "gpu2.example", "base_url": "http://gpu2:8000"},
    ],
}
SERVER = section(ServerSettings, SERVER_CFG)


def test_assignment_is_k_mod_n_and_balanced() -> None:
    names = server_names(SERVER)
    assert names == ["main", "b", "gpu2"]
    assigned = [assigned_server(k, names) for k in range(9)]
    assert assigned == ["main", "b", "gpu2"] * 3
    assert Counter(assigned_server(k, names) for k in range(1000)) == {"main": 334, "b": 333, "gpu2": 333}
    # stable: the same shard always goes to the same server while the list is the same
    assert [assigned_server(k, list(names)) for k in range(9)] == assigned
    assert assigned_server(5, ["main"]) == "main"


def test_a_replica_inherits_all_but_its_location() -> None:
    b = replica_config(SERVER, "b")
    assert b.unit_file == "/units/b.service" and b.unit == "vllm.service"
    assert b.api_key_env == "KEY" and b.start_timeout_s == 60
    assert b.base_url is None  # never the primary's URL
    assert (b.name, b.max_shard_jobs, b.replicas) == ("b", 1, ())  # its own, never the fleet's
    gpu2 = replica_config(SERVER, "gpu2")
    assert gpu2.host == "gpu2.example" and gpu2.base_url == "http://gpu2:8000"
    assert replica_config(SERVER, "main").unit_file == "/units/a.service"
    with pytest.raises(ReplicaError, match="no server named 'x'"):
        replica_config(SERVER, "x")
    assert shard_caps(SERVER) == {"main": 2, "b": 1, "gpu2": None}
    assert resource_name("b") == "vllm_b"


def test_the_fleet_places_each_replica_and_is_no_builtin_param() -> None:
    servers = fleet(SERVER, "results/r", "results/r/work")
    assert servers.names == ["main", "b", "gpu2"]
    main, b = servers.servers[0], servers.servers[1]
    assert main.primary and main.server_json == "results/r/server/server.json" and main.slots_dir is None
    assert b.server_json == "results/r/server/replicas/b/server.json"
    assert b.state_dir == "results/r/work/server/replicas/b"
    assert b.slots_dir == "results/r/work/generations/replica-slots/b"
    assert servers.for_shard(4).name == "b"
    # what keeps it out of Snakemake's params record: not a builtin type (and picklable for the script)
    assert not isinstance(servers, (dict, list, tuple, str, int, float, set, frozenset))
    assert pickle.loads(pickle.dumps(servers)) == servers


def _config(server: dict) -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["server"].update(copy.deepcopy(server))
    config["dataset"]["path"] = str(ROOT / "config" / "demo" / "sample.jsonl")
    return config


def test_replicas_config_is_validated() -> None:
    replicas = [{"name": "b", "unit_file": "/u/b.service"}]
    checked = check_config(_config({"replicas": replicas}), SCHEMA)
    assert checked["server"]["name"] == "main" and checked["server"]["max_shard_jobs"] is None
    with pytest.raises(ConfigError, match=r"'server.replicas.0.name'.*'B-1' is not allowed"):
        check_config(_config({"replicas": [{"name": "B-1"}]}), SCHEMA)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['port'\] under 'server.replicas.0'"):
        check_config(_config({"replicas": [{"name": "b", "port": 8001}]}), SCHEMA)
    with pytest.raises(ConfigError, match="'name' is a required property"):
        check_config(_config({"replicas": [{"unit_file": "/u/b.service"}]}), SCHEMA)
    with pytest.raises(ConfigError, match="the name 'main' is used twice"):
        check_config(_config({"replicas": [{"name": "main", "unit_file": "/u/b.service"}]}), SCHEMA)
    with pytest.raises(ConfigError, match="'b' names the same server as 'main'"):
        check_config(_config({"replicas": [{"name": "b"}]}), SCHEMA)  # no location of its own
    with pytest.raises(ConfigError, match="max_shard_jobs"):
        check_config(_config({"max_shard_jobs": 0}), SCHEMA)


def test_the_name_pattern_is_the_schemas() -> None:
    server = yaml.safe_load(SCHEMA.read_text())["properties"]["server"]["properties"]
    assert server["name"]["pattern"] == NAME_PATTERN
    assert server["replicas"]["items"]["properties"]["name"]["pattern"] == NAME_PATTERN
    assert server["replicas"]["items"]["properties"]["unit"]["pattern"] == server["unit"]["pattern"]


def _snapshot(folder: Path, model: Path, port: int, extra: str = "") -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    unit = folder / "vllm.service"
    unit.write_text(
        f"[Service]\nExecStart=/opt/vllm/bin/vllm serve {model} --port {port} --max-model-len 4096 "
        f"--served-model-name m --reasoning-parser kimi_k2 {extra}\n"
    )
    _, server, identity = take_snapshot(ServerSettings(unit_file=str(unit)), LocalHost())
    return identity_fields(identity, ServerSnapshot.from_json(server))


def _model(folder: Path, config: str = '{"hidden_size": 128}') -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(b"w" * 100)
    return folder


def test_identical_replicas_pass_even_at_another_path_and_port(tmp_path: Path) -> None:
    primary = _snapshot(tmp_path / "a", _model(tmp_path / "m1"), 8000)
    copy_elsewhere = _snapshot(tmp_path / "b", _model(tmp_path / "copy" / "m1"), 8001, "-tp 2")
    assert identity_differences(primary, copy_elsewhere) == []
    check_identity("b", primary, copy_elsewhere)


@pytest.mark.parametrize(
    ("extra", "config", "field"),
    [
        ("--max-model-len 2048", None, "max_model_len"),
        ("--reasoning-parser deepseek_r1", None, "reasoning_parser"),
        ("--dtype float16", None, "flags"),
        ("", '{"hidden_size": 256}', "model_files"),
    ],
)
def test_a_replica_that_differs_is_refused_naming_the_field(tmp_path, extra, config, field) -> None:
    primary = _snapshot(tmp_path / "a", _model(tmp_path / "m1"), 8000)
    other = _model(tmp_path / "m2", config) if config else tmp_path / "m1"
    replica = _snapshot(tmp_path / "b", other, 8001, extra)
    assert [d[0] for d in identity_differences(primary, replica)] == [field]
    refused = rf"replica 'gpu1' does not serve what the primary serves \({field}:"
    with pytest.raises(ReplicaError, match=refused):
        check_identity("gpu1", primary, replica)


def test_the_vllm_version_counts_when_both_are_known() -> None:
    base = {"model": "m", "model_files": None, "vllm_version": "0.32.0"}
    assert identity_differences(base, {**base, "vllm_version": "0.31.0"}) == [
        ("vllm_version", "0.32.0", "0.31.0")
    ]
    assert identity_differences(base, {**base, "vllm_version": None}) == []
    # a hub id (no file fingerprint): the model name itself must match
    assert identity_differences(base, {**base, "model": "other"}) == [("model", "m", "other")]


def test_one_servers_outage_fails_only_the_shards_sent_to_it(tmp_path: Path) -> None:
    """Shards 0 and 2 go to `main`, 1 and 3 to `b`; with `b` down (its endpoint stopped: the port
    refuses; server.manage false), its shard job fails and writes nothing while main's finish; with `b`
    back, the rerun finishes it. (A mid-shard outage keeps the journal: test_generate_client.)"""
    import json

    import polars as pl
    from support.http_endpoint import ScriptedEndpoint

    from eagle3_pipeline.generate import generate_shard
    from eagle3_pipeline.prompts import PROMPT_SCHEMA
    from eagle3_pipeline.server.health import ServerError

    main, b = ScriptedEndpoint().start(), ScriptedEndpoint().start()
    server = {"host": "local", "unit": "vllm.service", "manage": False, "start_timeout_s": 2,
              "api_key_env": "E3_NO_KEY", "base_url": main.base_url, "name": "main",
              "replicas": [{"name": "b", "base_url": b.base_url}]}  # fmt: skip
    servers = fleet(section(ServerSettings, server), str(tmp_path / "results"), str(tmp_path / "work"))
    for place, endpoint in zip(servers.servers, (main, b), strict=True):
        Path(place.server_json).parent.mkdir(parents=True, exist_ok=True)
        Path(place.server_json).write_text(json.dumps(
            {"base_url": endpoint.base_url, "served_model_name": "demo", "identity": "ident"}
        ))  # fmt: skip
    frame = pl.DataFrame(
        {"id": [f"id{i}" for i in range(4)], "source": ["s"] * 4, "row": list(range(4)), "turn": [0] * 4,
         "system": [None] * 4, "question": [f"q{i}" for i in range(4)], "original_answer": ["a"] * 4},
        schema=PROMPT_SCHEMA,
    )  # fmt: skip
    prompts = tmp_path / "prompts.parquet"
    frame.write_parquet(prompts)
    generation = GenerationSettings(max_tokens=16, concurrency=2, global_concurrency=2, retries=1,
                                    request_timeout_s=10)  # fmt: skip

    def run(shard: int) -> Path:
        out = tmp_path / f"shard-{shard}.parquet"
        generate_shard(str(prompts), str(out), servers.primary.server_json, servers.primary.settings,
                       generation, str(tmp_path / f"j{shard}.jsonl"), str(tmp_path / "work" / "server"),
                       shard, replica=servers.for_shard(shard))  # fmt: skip
        return out

    endpoints = [main]
    try:
        b.stop()  # an outage of b
        assert pl.read_parquet(run(0))["status"].to_list() == ["ok"] * 4
        with pytest.raises(ServerError, match=f"{b.base_url}/health does not answer"):
            run(1)
        assert not (tmp_path / "shard-1.parquet").exists()
        assert pl.read_parquet(run(2))["status"].to_list() == ["ok"] * 4
        assert sum(main.requests.values()) == 8 and not b.requests
        back = ScriptedEndpoint(port=b.port).start()  # b is back, on its port
        endpoints.append(back)
        assert pl.read_parquet(run(1))["status"].to_list() == ["ok"] * 4
        assert sum(back.requests.values()) == 4
    finally:
        for endpoint in endpoints:
            endpoint.stop()
