"""envs/pipeline.yaml and envs/vllm.yaml are what envs/conda_envs.py makes of the pins in envs/*.txt."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ENVS = Path(__file__).resolve().parents[2] / "envs"


def _generator():
    spec = importlib.util.spec_from_file_location("conda_envs", ENVS / "conda_envs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_conda_env_files_match_the_pins():
    for path, text in _generator().expected().items():
        assert path.read_text() == text, f"{path.name} is stale: run `make conda-envs`"


def test_every_pin_is_in_its_conda_env():
    generator = _generator()
    for name, (sources, *_) in generator.ENVIRONMENTS.items():
        pip = yaml.safe_load((ENVS / f"{name}.yaml").read_text())["dependencies"][-1]["pip"]
        for pin in (pin for source in sources for pin in generator.pins(source)):
            assert pin in pip or pin.removesuffix("+cpu") in pip, (name, pin)
