"""The Kimi-family demo's head-to-head (demo/head_to_head.py): KV cache per token from the exported
configs, acceptance read from offline.json's per-question counts, the paired difference and its interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_pipeline.demo.head_to_head import (
    LLAMA_NOT_SERVED,
    compare,
    kv_bytes_per_token,
    paired_difference,
    question_lengths,
)


def test_kv_cache_per_token_at_kimi_shape_matches_the_issue() -> None:
    # Kimi-K2.5: a latent of 512 and a rope key of 64 (about 1.1 KiB in bf16) against 64 heads of 128
    mla = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 64, "hidden_size": 7168}
    llama = {"num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128, "hidden_size": 7168}
    assert kv_bytes_per_token(mla) == 1152
    assert kv_bytes_per_token(llama) == 32 * 1024
    # the demo's Llama draft: 2 heads of 64
    assert kv_bytes_per_token({"num_attention_heads": 2, "head_dim": 64, "hidden_size": 128}) == 512


def offline(per_sample: dict[str, list[int]]) -> dict:
    return {"per_sample": per_sample, "acceptance_length": [1.5, 1.8, 2.0], "ci95": [[1, 2]] * 3}


def test_question_lengths_sum_the_first_k_prefix_counts() -> None:
    # [anchors, first 1, first 2, first 3 right]: 10 anchors, 6 + 3 + 1 accepted at k = 3, 6 + 3 at k = 2
    counts = offline({"a": [10, 6, 3, 1], "empty": [0, 0, 0, 0]})
    assert question_lengths(counts, 3) == {"a": (10, 10.0)}
    assert question_lengths(counts, 2) == {"a": (10, 9.0)}


def test_paired_difference_is_the_pooled_difference_with_a_question_bootstrap() -> None:
    mla = offline({"q1": [10, 8, 6, 4], "q2": [20, 10, 5, 2], "q3": [10, 5, 2, 1]})
    llama = offline(
        {"q1": [10, 6, 3, 1], "q2": [20, 8, 4, 1], "q3": [10, 5, 1, 0], "only_llama": [5, 5, 5, 5]}
    )
    result = paired_difference(mla, llama, 3)
    # pooled over the shared questions: (18 + 17 + 8) - (10 + 13 + 6) = 14 more tokens over 40 anchors
    assert result["questions"] == 3 and result["difference"] == pytest.approx(14 / 40)
    low, high = result["ci95"]
    assert low <= result["difference"] <= high and low > 0  # every question favours the MLA draft here
    assert paired_difference(mla, offline({}), 3)["difference"] is None


def test_compare_writes_both_drafts_side_by_side(tmp_path: Path) -> None:
    def draft(name: str, config: dict, per_sample: dict) -> tuple[Path, Path]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        save_file(
            {"fc.weight": torch.zeros(4, 6), "d2t": torch.zeros(8, dtype=torch.long)},
            folder / "model.safetensors",
        )
        (folder / "offline.json").write_text(json.dumps(offline(per_sample)))
        return folder / "config.json", folder / "offline.json"

    mla_config, mla_offline = draft(
        "mla",
        {"architectures": ["Eagle3DeepseekV3ForCausalLM"], "kv_lora_rank": 512, "qk_rope_head_dim": 64},
        {"q": [10, 8, 6, 4]},
    )
    llama_config, llama_offline = draft(
        "llama",
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "num_attention_heads": 2,
            "head_dim": 64,
            "hidden_size": 128,
        },
        {"q": [10, 6, 3, 1]},
    )
    served = tmp_path / "serve_check.json"
    served.write_text(
        json.dumps(
            {
                "acceptance_length": 2.1,
                "ci95": [1.8, 2.4],
                "sampled": {"acceptance_length": 1.9, "ci95": [1.7, 2.1]},
                "questions": 1,
            }
        )
    )
    out = tmp_path / "head_to_head.json"
    result = compare(mla_config, mla_offline, llama_config, llama_offline, 3, out, mla_served=served)
    assert json.loads(out.read_text()) == result
    assert result["deepseek_mla"]["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
    assert result["deepseek_mla"]["parameters"] == 24  # d2t is the vocabulary map, not a parameter
    assert result["deepseek_mla"]["offline"]["acceptance_length"] == 2.0
    assert result["deepseek_mla"]["served"] == {
        "acceptance_length": 2.1,
        "ci95": [1.8, 2.4],
        "sampled_acceptance_length": 1.9,
        "sampled_ci95": [1.7, 2.1],
        "questions": 1,
    }
    assert "selection" not in result["llama"]  # no selection file given
    # with the selection files: the epoch each draft shipped, counted from 1
    selection = tmp_path / "selection.json"
    selection.write_text(
        json.dumps({"chosen": {"epoch": 6, "acceptance_length": 2.0}, "candidates": [{}] * 8})
    )
    result = compare(
        mla_config,
        mla_offline,
        llama_config,
        llama_offline,
        3,
        out,
        mla_selection=selection,
        llama_selection=selection,
    )
    assert result["deepseek_mla"]["selection"] == {"chosen_epoch": 7, "epochs": 8}
    assert result["llama"]["served"] == {"reason": LLAMA_NOT_SERVED}
    assert result["llama"]["kv_cache_bytes_per_token"] == 512
    assert result["offline_difference_mla_minus_llama"]["difference"] == pytest.approx((18 - 10) / 10)
