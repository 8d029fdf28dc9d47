"""The Kimi-family demo's head-to-head: the MLA draft against a Llama draft trained on the same states.

Both drafts are trained, selected and measured by the same rules on the same hidden states (the main
draft's; rules/demo_head_to_head.smk): only the attention differs. This writes what the two offline
checks, the MLA draft's serve check and the two exported configs say, side by side, with the
difference of their acceptance paired by question (a bootstrap over the validation questions, as the
report's intervals are question-level), and each draft's KV cache per token.

The Llama draft is not served: vLLM 0.32's CPU build cannot hold a standard-attention draft's KV cache
beside an MLA target's (their block sizes have nothing in common; LLAMA_NOT_SERVED quotes the error).
On CUDA both drafts serve beside the target (benchmarks, docs/demo.md).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from safetensors import safe_open

from eagle3_pipeline import io
from eagle3_pipeline.draft_config import read_checkpoint_config
from eagle3_pipeline.validate.headline import selection_figures

LLAMA_NOT_SERVED = (
    "not served: vLLM 0.32's CPU build refuses a standard-attention draft beside an MLA target "
    '("ValueError: No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])"); '
    "its offline figures are measured on the same validation states as the MLA draft's"
)
BOOTSTRAP_DRAWS = 2000


def kv_bytes_per_token(draft_json: dict[str, Any], dtype_bytes: int = 2) -> int:
    """The draft's KV cache per token and layer in bf16 (from its exported config.json): the latent and the
    rope key for MLA, keys and values for every KV head for a Llama layer."""
    if draft_json.get("kv_lora_rank"):
        return (int(draft_json["kv_lora_rank"]) + int(draft_json["qk_rope_head_dim"])) * dtype_bytes
    heads = int(draft_json.get("num_key_value_heads") or draft_json["num_attention_heads"])
    head_dim = int(
        draft_json.get("head_dim") or draft_json["hidden_size"] // draft_json["num_attention_heads"]
    )
    return 2 * heads * head_dim * dtype_bytes


def parameters(checkpoint_dir: Path) -> int:
    """Trained parameters in the exported checkpoint (d2t/t2d, the vocabulary map, left out)."""
    with safe_open(str(checkpoint_dir / "model.safetensors"), "pt") as f:
        return sum(_numel(f, k) for k in f.keys() if k not in ("d2t", "t2d"))  # noqa: SIM118 (a handle)


def _numel(handle: Any, key: str) -> int:
    count = 1
    for size in handle.get_slice(key).get_shape():
        count *= int(size)
    return count


def question_lengths(offline: dict[str, Any], k: int) -> dict[str, tuple[int, float]]:
    """Per validation question: (anchors, accepted tokens summed over its anchors at k draft tokens),
    from offline.json's per_sample counts [anchors, first 1..steps guesses right]."""
    out = {}
    for qid, (anchors, *prefix) in offline.get("per_sample", {}).items():
        if anchors:
            out[qid] = (int(anchors), float(sum(prefix[:k])))
    return out


def paired_difference(mla: dict[str, Any], llama: dict[str, Any], k: int, seed: int = 0) -> dict[str, Any]:
    """Acceptance length at k, MLA minus Llama, over the questions both measured, with a 95% bootstrap
    interval that resamples questions (the two drafts' anchors are the same tokens)."""
    a, b = question_lengths(mla, k), question_lengths(llama, k)
    ids = sorted(set(a) & set(b))
    if not ids:
        return {"questions": 0, "difference": None, "ci95": None}

    def diff(sample: list[str]) -> float:
        anchors = sum(a[q][0] for q in sample)
        return (sum(a[q][1] for q in sample) - sum(b[q][1] for q in sample)) / anchors

    rng = random.Random(seed)
    draws = sorted(diff([rng.choice(ids) for _ in ids]) for _ in range(BOOTSTRAP_DRAWS))
    low, high = draws[int(0.025 * BOOTSTRAP_DRAWS)], draws[int(0.975 * BOOTSTRAP_DRAWS) - 1]
    return {
        "questions": len(ids),
        "difference": round(diff(ids), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "draws": BOOTSTRAP_DRAWS,
        "seed": seed,
    }


def _offline_figures(offline: dict[str, Any], k: int) -> dict[str, Any]:
    lengths = offline.get("acceptance_length") or []
    intervals = offline.get("ci95") or []
    return {
        "acceptance_length": lengths[k - 1] if len(lengths) >= k else None,
        "ci95": intervals[k - 1] if len(intervals) >= k else None,
        "acceptance_length_by_k": lengths,
        "anchors": offline.get("anchors"),
    }


def _draft(
    checkpoint_config: Path, offline_path: Path, k: int, selection_path: str | Path | None = None
) -> dict[str, Any]:
    config = read_checkpoint_config(checkpoint_config.parent).stated
    draft = {
        "checkpoint": str(checkpoint_config.parent),
        "architectures": config.get("architectures"),
        "parameters": parameters(checkpoint_config.parent),
        "kv_cache_bytes_per_token": kv_bytes_per_token(config),
        "offline": _offline_figures(json.loads(offline_path.read_text()), k),
    }
    if selection_path:
        chosen = selection_figures(json.loads(Path(selection_path).read_text()))
        draft["selection"] = {"chosen_epoch": chosen["chosen_epoch"], "epochs": chosen["epochs"]}
    return draft


def _served_figures(serve_check: dict[str, Any]) -> dict[str, Any]:
    """The MLA draft served by vLLM: greedy and at the generation's sampling, each with its 95%
    question-level interval (serve_check.json's own)."""
    sampled = serve_check.get("sampled") or {}
    return {
        "acceptance_length": serve_check.get("acceptance_length"),
        "ci95": serve_check.get("ci95"),
        "sampled_acceptance_length": sampled.get("acceptance_length"),
        "sampled_ci95": sampled.get("ci95"),
        "questions": serve_check.get("questions"),
    }


def compare(
    mla_config: str | Path,
    mla_offline: str | Path,
    llama_config: str | Path,
    llama_offline: str | Path,
    k: int,
    output_path: str | Path,
    mla_served: str | Path | None = None,
    mla_selection: str | Path | None = None,
    llama_selection: str | Path | None = None,
) -> dict[str, Any]:
    """Write validation/head_to_head.json: both drafts' figures at k draft tokens and their difference
    (with the selection files, the epoch each draft shipped)."""
    mla = _draft(Path(mla_config), Path(mla_offline), k, mla_selection)
    llama = _draft(Path(llama_config), Path(llama_offline), k, llama_selection)
    if mla_served:
        mla["served"] = _served_figures(json.loads(Path(mla_served).read_text()))
    llama["served"] = {"reason": LLAMA_NOT_SERVED}
    result = {
        "num_speculative_tokens": k,
        "same_states": "both drafts trained, selected and measured on the main draft's hidden states",
        "deepseek_mla": mla,
        "llama": llama,
        "offline_difference_mla_minus_llama": paired_difference(
            json.loads(Path(mla_offline).read_text()), json.loads(Path(llama_offline).read_text()), k
        ),
    }
    io.write_json(result, output_path, indent=2)
    return result
