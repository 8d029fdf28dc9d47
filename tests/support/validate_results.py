"""A tiny finished results/{run}/ tree in the pipeline's formats: what the report reads.

Shapes follow the writers: server.json (snapshot_server), traces.parquet / stats.json (merge_traces),
history.json (draft/train.py: one record per epoch, `summarize` figures per split), offline.json and
serve_check.json (validate/offline.py and validate/serve_check.py), selection.json and
learning_curve.json (validate/selection.py, validate/learning_curve.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from eagle3_pipeline.validate.learning_curve import curve_record
from eagle3_pipeline.validate.matched import Z, compare_matched
from eagle3_pipeline.validate.selection import selection_record

UNIT = """# /etc/systemd/system/vllm.service
[Service]
Environment=HF_TOKEN=<redacted>
ExecStart=/usr/bin/vllm serve /models/kimi --port 8000 --api-key <redacted>
"""


def _summary(epoch: int, steps: int = 3) -> dict:
    acc = [min(0.9, 0.3 + 0.1 * epoch) * 0.9**k for k in range(steps)]
    return {
        "loss": 5.0 / (epoch + 1),
        "step_loss": [5.0 / (epoch + 1)] * steps,
        "step_accuracy": acc,
        "conditional_accuracy": acc,
        "simulated_acceptance_length": 1 + sum(acc),
        "tokens": 1000,
    }


def _acceptance(scale: float, steps: int = 3) -> dict:
    conditional = [scale * 0.9**k for k in range(steps)]
    lengths, run, total = [], 1.0, 1.0
    for c in conditional:
        run *= c
        total += run
        lengths.append(total)
    return {"conditional": conditional, "acceptance_length": lengths}


SOURCES = {"demo-chat": 1.9, "demo-code": 2.1, "demo-math": 2.6}


def write_finished_results(root: Path, baseline: bool = True) -> dict[str, Path]:
    """Write the report's inputs under root (a results/{run} folder); returns them by report key."""
    paths = {
        "unit": root / "server/unit.service",
        "server": root / "server/server.json",
        "stats": root / "traces/stats.json",
        "traces": root / "traces/traces.parquet",
        "history": root / "draft/trained/history.json",
        "offline": root / "validation/offline.json",
        "serve_check": root / "validation/serve_check.json",
    }
    if baseline:
        paths |= {
            "baseline_history": root / "baseline/draft/trained/history.json",
            "baseline_offline": root / "baseline/validation/offline.json",
            "baseline_serve_check": root / "baseline/validation/serve_check.json",
        }
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    paths["unit"].write_text(UNIT)
    paths["server"].write_text(
        json.dumps(
            {
                "model": "/models/kimi",
                "served_model_name": "kimi",
                "base_url": "http://gpu:8000",
                "tensor_parallel_size": 8,
                "max_model_len": 32768,
                "reasoning_parser": "kimi_k2",
                "args": {"--port": 8000, "--api-key": "<redacted>"},
                "env": {"HF_TOKEN": "<redacted>"},
                "unit": "vllm.service",
                "source_host": "gpu",
            }
        )
    )
    paths["stats"].write_text(
        json.dumps({"prompts": 12, "kept": 10, "dropped": {"empty": 2}, "train": 9, "validation": 1})
    )
    pl.DataFrame(
        {
            "id": [f"q{i}" for i in range(10)],
            "prompt_tokens": list(range(20, 30)),
            "completion_tokens": [100 + 30 * i for i in range(10)],
            "finish_reason": ["stop"] * 8 + ["length"] * 2,
            "reasoning": ["think " * (5 * i) for i in range(10)],
            "content": ["answer " * i for i in range(10)],
        }
    ).write_parquet(paths["traces"])
    for key, scale in (("", 0.8), ("baseline_", 0.5)):
        if not baseline and key:
            continue
        history = [
            {"epoch": e, "step": 10 * (e + 1), "lr": 1e-3, "train": _summary(e), "validation": _summary(e)}
            for e in range(4)
        ]
        paths[f"{key}history"].write_text(json.dumps(history))
        offline = {"reference": "target_argmax", "steps": 3, "anchors": 500, **_acceptance(scale)}
        offline["prefix_counts"] = [round(500 * r) for r in (0.75, 0.55, 0.35)]
        part = {"anchors": 250, **_acceptance(scale)}  # each slice: half the anchors, the same rates
        names = ("context 0-512", "context 512-2048", "thinking", "answer")
        offline["slices"] = {reference: dict.fromkeys(names, part) for reference in ("greedy", "sampled")}
        paths[f"{key}offline"].write_text(json.dumps(offline))
        served = _acceptance(scale * 0.95)
        figures = {
            "conditional": served["conditional"],
            "per_position_rate": [0.7, 0.5, 0.3],
            "acceptance_length": served["acceptance_length"][-1],
            "num_speculative_tokens": 3,
            "drafts": 100,
        }
        if not key:  # the trained run's check as serve_check.py writes it now; the baseline's as before
            replayed = [{"drafts": 100, "accepted_per_position": [60, 40, 25]}]
            # as serve_check.py writes it now: the sampled pair decides, the greedy one is a diagnostic
            figures["offline_comparison"] = compare_matched(figures, replayed, 0.02) | {
                "reference": "greedy",
                "enforced": False,
            }
            figures["ci95"] = [figures["acceptance_length"] - 0.1, figures["acceptance_length"] + 0.1]
            sampled = {"acceptance_length": 2.2, "per_position_rate": [0.62, 0.38, 0.27], "drafts": 90}
            figures["sampled"] = sampled | {"ci95": [2.05, 2.35]}
            figures["sampled_comparison"] = compare_matched(sampled, replayed, 0.02) | {
                "reference": "sampled",
                "enforced": True,
            }
            figures["by_source"] = {
                source: {"acceptance_length": length, "drafts": 30} for source, length in SOURCES.items()
            }
            figures["speedup"] = {
                "speedup": 1.8,
                "tokens_per_s_with_draft": 90.0,
                "tokens_per_s_without_draft": 50.0,
            }
        else:  # as serve_check.py wrote it before the matched comparison
            figures["offline_comparison"] = _comparison_before_matched(figures, offline, 0.15)
        paths[f"{key}serve_check"].write_text(json.dumps(figures))
    _write_curves(root, paths)
    return paths


def _comparison_before_matched(served: dict, offline: dict, tolerance: float) -> dict:
    """offline_comparison as serve_check.py wrote it before the matched comparison: served against
    offline.json's prefix rates per position, binomial errors of both (the report still reads it)."""
    drafts, anchors = served["drafts"], offline["anchors"]
    positions = []
    for i, (rate, count) in enumerate(
        zip(served["per_position_rate"], offline["prefix_counts"], strict=False)
    ):
        offline_rate = count / anchors
        variance = offline_rate * (1 - offline_rate)
        allowed = tolerance + Z * math.sqrt(variance / drafts + variance / anchors)
        difference = rate - offline_rate
        positions.append({"position": i, "served": rate, "offline": offline_rate, "difference": difference,
                          "allowed": allowed, "agree": abs(difference) <= allowed})  # fmt: skip
    return {"agree": all(p["agree"] for p in positions), "tolerance": tolerance, "z": Z, "drafts": drafts,
            "anchors": anchors, "positions": positions}  # fmt: skip


def _write_curves(root: Path, paths: dict[str, Path]) -> None:
    """selection.json and learning_curve.json (validate.select_every_epochs, validate.learning_curve),
    through the writers' own builders."""
    paths["selection"] = root / "validation/selection.json"
    paths["learning_curve"] = root / "validation/learning_curve.json"
    candidates = [
        {"epoch": e, "step": 10 * (e + 1), "train_loss": 5.0 / (e + 1), "validation_loss": 5.5 / (e + 1)}
        | _acceptance(0.6 + 0.07 * min(e, 2) - 0.03 * max(0, e - 2))  # acceptance peaks at epoch 2
        | {"anchors": 500}
        for e in range(4)
    ]
    paths["selection"].write_text(json.dumps(selection_record(candidates, 3, 1)))
    points = [
        {"fractions": [k / 4], "shards": k, "training_tokens": 1000 * k, "epoch": 3}
        | _acceptance(0.5 + 0.1 * k)
        for k in (1, 2, 4)
    ]
    for point in points:
        point["mean_accepted_length"] = point["acceptance_length"][2]
    paths["learning_curve"].write_text(json.dumps(curve_record(points, 3)))
