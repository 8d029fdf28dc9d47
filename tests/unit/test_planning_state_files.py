"""planning.state_files: the training state files a disk cap holds: two for each draft trained, each the
draft's trained fp32 weights and AdamW's two moments, of the draft's own architecture."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from support.disk_cap import DEMO_CONFIG, SCHEMA, kimi_settings

from eagle3_pipeline.config import check_config
from eagle3_pipeline.planning.state_files import (
    STATE_FILE_OVERHEAD,
    drafts_trained,
    parse_time_state_bytes,
    state_file_bytes,
    state_files_at_once,
)
from eagle3_pipeline.settings import build_settings


def test_the_kimi_example_state_file_is_the_trained_tensors_and_adamw():
    settings = kimi_settings()
    kimi = {"hidden_size": 7168, "num_attention_heads": 64, "intermediate_size": 18432, "vocab_size": 163840}
    kimi |= {"kv_lora_rank": 512}
    # fc 3H x H, q/k/v 2H x 8,192 each, o 8,192 x H, MLP 3 x H x 18,432, lm_head 32,000 x H, 4 norms
    parameters = 3 * 7168**2 + 2 * 7168 * 3 * 8192 + 8192 * 7168 + 3 * 7168 * 18432 + 32000 * 7168 + 4 * 7168
    assert state_file_bytes(settings.draft, kimi) == 12 * parameters + STATE_FILE_OVERHEAD  # 14.3 GB
    # no weights: an upper bound
    assert parse_time_state_bytes(settings, 7168) >= state_file_bytes(settings.draft, kimi)


@pytest.mark.parametrize("architecture", ["auto", "llama", "deepseek_mla"])
def test_a_state_file_counts_the_trained_tensors_of_the_drafts_architecture(architecture):
    """On a DeepseekV3 (Kimi) target the draft is MLA (auto) or Llama: each state file is 12 bytes per
    trained parameter of the draft actually built (hidden-state files are the target's, whatever the
    draft)."""
    import torch

    from eagle3_pipeline.draft.model import Eagle3Draft
    from eagle3_pipeline.draft_config import draft_config_from_target
    from eagle3_pipeline.settings import DraftSettings

    kimi = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 64, "vocab_size": 163840}
    kimi |= {"intermediate_size": 18432, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128}
    kimi |= {"qk_rope_head_dim": 64, "v_head_dim": 128, "num_key_value_heads": 64}
    draft = DraftSettings(architecture=architecture)
    config = draft_config_from_target(kimi, draft.draft_vocab_size, architecture=architecture)
    with torch.device("meta"):
        trained = sum(p.numel() for p in Eagle3Draft(config).parameters() if p.requires_grad)
    assert state_file_bytes(draft, kimi) == 12 * trained + STATE_FILE_OVERHEAD
    mla = state_file_bytes(DraftSettings(architecture="deepseek_mla"), kimi)
    assert mla < state_file_bytes(DraftSettings(architecture="llama"), kimi)  # 10.8 against 13.7 GB


def test_each_draft_walks_its_own_windows_and_the_cap_holds_its_state_files():
    from eagle3_pipeline.planning.windows import DraftWindows

    windows = [[["a", "c"], ["b", "d"]], [["c", "d"], ["a", "b"]]]
    main = DraftWindows.main(windows)
    point = DraftWindows.point(windows, ["a", "b", "c", "d"], 2, 4)
    assert [main.count(e) for e in (0, 1)] == [2, 2] and [point.count(e) for e in (0, 1)] == [2, 1]
    assert main.shards(1, 0) == ["c", "d"] and point.shards(1, 0) == ["a", "b", "a", "b"]
    # its only window of epoch 1 shares the plan's second
    assert point.reading(1, 0) is None and point.reading(1, 1) == 0 and main.reading(1, 0) == 0
    # it starts from its own previous window, across epochs, and ends in its own last one
    assert point.previous(0, 0) is None and point.previous(0, 1) == (0, 0) and point.previous(1, 0) == (0, 1)
    assert point.last() == (1, 0) and main.last() == (1, 1)
    assert point.shard_lists() == [[["a", "a"], ["b", "b"]], [["a", "b", "a", "b"]]]

    demo = build_settings(check_config(yaml.safe_load(DEMO_CONFIG.read_text()), SCHEMA))
    assert demo.validate.learning_curve == (0.5, 1.0)  # the point of 2 of 4 shards and the main draft
    assert drafts_trained(demo) == 2 and state_files_at_once(demo) == 4
    alone = replace(demo, validate=replace(demo.validate, learning_curve=()))
    assert drafts_trained(alone) == 1 and state_files_at_once(alone) == 2
