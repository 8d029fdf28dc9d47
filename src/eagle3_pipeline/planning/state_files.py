"""The training state files a disk cap holds beside the hidden states: how many are on disk at once
and what one weighs.

Under hidden_states.max_disk_gb, training in windows keeps the previous window's state file and the
current one's (STATE_FILES_AT_ONCE, draft/train.py) for each draft trained: the main draft and each
validate.learning_curve point (`state_files_at_once`). One file is the draft's trained fp32 weights and
AdamW's two fp32 moments (`state_file_bytes`: 14.3 GB for the Kimi-K2.5 example's draft, a Llama draft
of SpecForge's shape since it sets draft.head_dim; 10.8 GB for the MLA draft `draft.architecture: auto`
gives that target without a head size), its shape the draft's own (draft_config.py), known when the
workflow is parsed (`parse_time_state_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3_pipeline.config import shard_ids
from eagle3_pipeline.draft_config import NUM_AUX_LAYERS, DraftConfig, draft_config_from_target
from eagle3_pipeline.planning.variants import Variants
from eagle3_pipeline.settings import DRAFT_ATTENTION_KEYS, DraftSettings, Settings
from eagle3_pipeline.target_shape import DEMO_TARGET_SHAPE, TargetShape

STATE_FILES_AT_ONCE = 2  # per draft trained: the previous window's state file and the current one's
STATE_BYTES_PER_PARAMETER = 12  # fp32 weights + AdamW's exp_avg and exp_avg_sq (fp32)
STATE_FILE_OVERHEAD = 10**6  # schedule, position, history: well under a megabyte


def drafts_trained(settings: Settings) -> int:
    """Drafts trained on the main draft's states, each with its own training state files: the main
    draft and every validate.learning_curve point trained apart (the point of every shard is the main
    draft itself; planning/variants.py). Under a cap they train on the same windows."""
    shards = shard_ids(settings.dataset.num_samples, settings.dataset.shard_size)
    return 1 + len(Variants.from_settings(settings, shards, "").curve)


def drafts_note(settings: Settings) -> str:
    """Why there are more than STATE_FILES_AT_ONCE state files, in a few words ("" when there are not)."""
    points = drafts_trained(settings) - 1
    if not points:
        return ""
    return (
        f" ({STATE_FILES_AT_ONCE} for each of {points + 1} drafts: the main draft and {points} "
        f"validate.learning_curve point{'s' if points > 1 else ''})"
    )


def state_files_at_once(settings: Settings) -> int:
    """Training state files on disk at once: STATE_FILES_AT_ONCE for each draft trained (drafts_trained)."""
    return STATE_FILES_AT_ONCE * drafts_trained(settings)


def state_file_bytes(draft: DraftSettings, model_config: Mapping[str, Any]) -> int:
    """Bytes of one training state file for the draft (config draft.*) of the target whose parsed
    config.json is `model_config`: STATE_BYTES_PER_PARAMETER per trained parameter, plus
    STATE_FILE_OVERHEAD (the frozen embeddings are not in it: draft/train.py)."""
    shape = {k: getattr(draft, k) for k in DRAFT_ATTENTION_KEYS}
    c = draft_config_from_target(
        dict(model_config), draft.draft_vocab_size, **shape, architecture=draft.architecture
    )
    h = c.hidden_size
    parameters = NUM_AUX_LAYERS * c.target_hidden_size * h  # fc
    parameters += _attention_parameters(c)
    parameters += 3 * h * c.intermediate_size + c.draft_vocab_size * h + 4 * h  # MLP, lm_head, 4 norms
    return STATE_BYTES_PER_PARAMETER * parameters + STATE_FILE_OVERHEAD


def _attention_parameters(c: DraftConfig) -> int:
    """Trained parameters of the draft's attention (a DraftConfig `c`), whose inputs are 2H wide:
    Llama's q/k/v and o (draft/model.py), or MLA's q LoRA (or q), the latent kv with its rope part,
    their norms, kv_b and o (draft/mla.py)."""
    h = c.hidden_size
    if c.architecture != "deepseek_mla":
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        return 2 * h * (q + 2 * kv) + q * h
    heads, rq, rkv = c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank
    q_width = heads * (c.qk_nope_head_dim + c.qk_rope_head_dim)
    q = 2 * h * rq + rq + rq * q_width if rq else 2 * h * q_width
    kv = 2 * h * (rkv + c.qk_rope_head_dim) + rkv + rkv * heads * (c.qk_nope_head_dim + c.v_head_dim)
    return q + kv + heads * c.v_head_dim * h


def parse_time_state_bytes(settings: Settings, hidden_size: int) -> int:
    """One training state file's bytes when the workflow is parsed: from the target's config.json, the
    demo's shape, or (no weights yet) an upper bound from the hidden size (an MLP 4 x hidden wide)."""
    path = Path(settings.target.model) / "config.json"
    if path.exists():
        model_config = TargetShape.load(path).text
        try:
            return state_file_bytes(settings.draft, model_config)
        except (KeyError, TypeError, ValueError):  # not a shape the draft reads: the bound below
            pass
    elif settings.demo.enabled:
        return state_file_bytes(settings.draft, DEMO_TARGET_SHAPE)
    bound = {"hidden_size": hidden_size, "num_attention_heads": max(1, hidden_size // 128)}
    bound["intermediate_size"] = 4 * hidden_size
    bound["vocab_size"] = settings.draft.draft_vocab_size
    return state_file_bytes(settings.draft, bound)
