"""Settings the disk budget's and the disk cap's unit tests plan with: a small capped config (the demo's
shape, its target not built yet) and the production example as written."""

from __future__ import annotations

from pathlib import Path

import yaml

from eagle3_pipeline.config import check_config
from eagle3_pipeline.settings import Settings, build_settings, section

REPO = Path(__file__).resolve().parents[2]
KIMI_CONFIG = REPO / "config" / "examples" / "kimi-k2.5-8gpu.yaml"
SCHEMA = REPO / "config" / "schema.yaml"
DEMO_CONFIG = REPO / "config" / "config.yaml"


def kimi_settings() -> Settings:
    """The production example (config/examples/kimi-k2.5-8gpu.yaml), checked."""
    return build_settings(check_config(yaml.safe_load(KIMI_CONFIG.read_text()), SCHEMA))


def capped(
    cap_gb: float | None, shard_size: int = 64, max_seq_len: int = 2048, pack_slots: int = 4
) -> Settings:
    """512 samples of the demo's target (hidden size 128, built later by its rule) in shards of
    `shard_size`, 3 epochs, under hidden_states.max_disk_gb `cap_gb` (None: uncapped)."""
    hidden_states = {"max_seq_len": max_seq_len, "dtype": "bfloat16", "max_disk_gb": cap_gb}
    return section(
        Settings,
        {
            "dataset": {"path": "d.jsonl", "num_samples": 512, "shard_size": shard_size},
            "generation": {"max_tokens": 2048},
            "hidden_states": {**hidden_states, "pack_slots": pack_slots},
            "train": {"epochs": 3},
            "target": {"model": "/absent"},
            "demo": {"enabled": True},
        },
    )
