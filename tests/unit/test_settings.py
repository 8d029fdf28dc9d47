"""The typed settings against config/schema.yaml: every key in both, every default written once."""

from __future__ import annotations

import dataclasses
import pickle
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_pipeline.config import check_config
from eagle3_pipeline.settings import (
    RuntimeOnly,
    ServerSettings,
    Settings,
    as_params,
    build_settings,
    runtime_only,
    schema_defaults,
    section,
)

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "config" / "schema.yaml"


def _walk(schema: dict[str, Any], cls: type, where: str) -> list[str]:
    """Every mismatch between a schema object and a settings dataclass, recursing into sections."""
    problems = []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types = typing.get_type_hints(cls)
    properties = schema["properties"]
    name = cls.__name__
    problems += [f"{where}.{k}: in the schema, not a field of {name}" for k in properties if k not in fields]
    problems += [f"{where}.{k}: a field of {name}, not in the schema" for k in fields if k not in properties]
    for key in properties.keys() & fields.keys():
        sub, f = properties[key], fields[key]
        if dataclasses.is_dataclass(types[key]):  # a section: its keys and defaults
            problems += _walk(sub, types[key], f"{where}.{key}")
            continue
        item = typing.get_args(types[key])[:1]
        if item and dataclasses.is_dataclass(item[0]):  # a list of sections (server.replicas)
            problems += _walk(sub["items"], item[0], f"{where}.{key}[]")
        if "default" not in sub:
            if f.default is not dataclasses.MISSING:
                problems.append(f"{where}.{key}: required in the schema, defaulted in {cls.__name__}")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, tuple):
            default = list(default)
        if default != sub["default"] or type(default) is bool is not type(sub["default"]):
            problems.append(f"{where}.{key}: schema default {sub['default']!r}, field default {default!r}")
    return problems


def test_every_schema_key_is_a_field_with_the_schema_default():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert _walk(schema, Settings, "config") == []


def test_a_default_written_in_a_section_is_refused_as_a_second_copy():
    @dataclasses.dataclass(frozen=True)
    @schema_defaults("server.ssh")
    class Ssh:
        sudo: bool

    assert Ssh().sudo is True  # the schema's default

    class Written:
        __annotations__ = {"sudo": bool}
        sudo = False

    with pytest.raises(TypeError, match=r"Written.sudo: its default belongs in config/schema.yaml"):
        schema_defaults("server.ssh")(Written)

    class Unknown:
        __annotations__ = {"sudoers": bool}

    with pytest.raises(TypeError, match=r"no key server.ssh.sudoers in config/schema.yaml"):
        schema_defaults("server.ssh")(Unknown)


@pytest.mark.parametrize("path", ["config/config.yaml", "config/examples/kimi-k2.5-8gpu.yaml"])
def test_settings_build_from_the_shipped_configs(path, tmp_path, monkeypatch):
    config = yaml.safe_load((REPO / path).read_text())
    config["dataset"]["path"] = str(REPO / "config/demo/sample.jsonl")  # the Kimi example's is remote
    config["target"]["model"] = str(tmp_path)  # no config.json: layers are not checked
    settings = build_settings(check_config(config, SCHEMA))
    assert settings.dataset.path == config["dataset"]["path"]
    assert settings.server.ssh.connect_timeout_s == config["server"]["ssh"]["connect_timeout_s"]
    assert as_params(settings.server)["ssh"] == config["server"]["ssh"]  # round trip to builtins
    assert as_params(settings.generation) == config["generation"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.train.lr = 1.0  # type: ignore[misc]


def test_a_partial_section_takes_the_schema_defaults_and_refuses_unknown_keys():
    server = section(ServerSettings, {"host": "gpu-box", "ssh": {"sudo": False}})
    assert server.start_timeout_s == 1800 and server.ssh.connect_timeout_s == 10 and not server.ssh.sudo
    with pytest.raises(TypeError, match="start_timeout"):
        section(ServerSettings, {"start_timeout": 5})


def test_runtime_values_are_not_params_snakemake_records():
    from snakemake.persistence import UNREPRESENTABLE, PersistenceBase

    server = section(ServerSettings, {})
    knobs = runtime_only(server=as_params(server, "start_timeout_s"))
    assert isinstance(knobs, RuntimeOnly)
    assert knobs.section("server", {"unit": "u"}) == {"unit": "u", "start_timeout_s": 1800}
    assert knobs.section("generation") == {}
    # the check Snakemake applies to each param before recording it (persistence._params)
    assert PersistenceBase._serialize_param_builtin(None, knobs) is UNREPRESENTABLE
    assert PersistenceBase._serialize_param_builtin(None, {"unit": "u"}) == repr({"unit": "u"})
    assert pickle.loads(pickle.dumps(knobs)) == knobs  # how script: hands params to the script
