"""What extraction will cost, from a config alone, before anything runs: `make cost CONFIG=path`.

Prints one JSON object: the plan's counts (engine starts, extraction passes, tokens, the disk's
high-water mark) and GPU hours between two stated throughput assumptions. The counts follow the
workflow's own rules (rules/common.smk, rules/hidden_states.smk):

- vllm backend: one engine job (serve_extraction_engine) per run uncapped (and one for the
  baseline's traces, after the main draft's GPU jobs), one per epoch and window under
  `hidden_states.max_disk_gb`; the same under a cluster profile (`--profile`, `make cost
  PROFILE=profiles/slurm`), where each engine job and its extraction jobs are one submission (a
  Snakemake service group); transformers backend: one target load per extraction job (shard, epoch).
- extraction passes: 1 uncapped, `train.epochs` under a cap (each epoch extracts every window again).
- tokens: every pass over every sample, `tokens_low` with completions of `--completion-tokens` on
  average, `tokens` (the upper bound, budget.py's) with every completion as long as
  `generation.max_tokens`, both capped at `hidden_states.max_seq_len`.
- disk_peak_bytes: budget.on_disk_at_once on the upper bound (a shard counted once, plus the part
  being packed), plus the engine's staging window.

GPU hours = GPUs x (starts x start time + tokens / prefill throughput), low with the fast assumptions
and the low token count, high with the slow ones and the upper bound. Training is not included.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eagle3_pipeline import budget
from eagle3_pipeline.hidden_states import vllm_backend
from eagle3_pipeline.settings import Settings

# Stated assumptions (override on the command line). Kimi-K2.5 on 8 H100/H200, TP 8: prefill of a
# 32 B-active MoE at ~64 GFLOP/token; 20,000 tokens/s is ~25% of the GPUs' dense bf16 peak, 10,000 half
# that. An engine start loads ~600 GB from local NVMe, profiles and warms up: 5 to 10 minutes.
DEFAULT_ASSUMPTIONS = {
    "completion_tokens": 3000,  # mean completion (docs/cluster.md); the upper bound uses max_tokens
    "prompt_tokens": budget.DEFAULT_PROMPT_TOKENS,
    "tokens_per_s_fast": 20000.0,
    "tokens_per_s_slow": 10000.0,
    "start_s_fast": 300.0,
    "start_s_slow": 600.0,
}


def plan_counts(settings: Settings, hidden_size: int) -> dict[str, Any]:
    """Shards, windows, passes and engine starts of a config (the workflow's rules, no DAG built)."""
    from eagle3_pipeline.config import shard_ids

    shards = len(shard_ids(settings.dataset.num_samples, settings.dataset.shard_size))
    window = budget.capped_window_shards(settings, hidden_size)
    epochs = settings.train.epochs
    windows = math.ceil(shards / window) if window else 0
    passes = epochs if window else 1
    baseline = settings.validate.baseline and not window
    jobs = shards * passes + (shards if baseline else 0)
    vllm = settings.hidden_states.backend == "vllm"
    starts = (epochs * windows if window else 1 + baseline) if vllm else jobs
    return {
        "shards": shards,
        "window_shards": window,
        "windows": windows,
        "extraction_passes": passes,
        "extraction_jobs": jobs,
        "baseline": baseline,
        "engine_starts": starts,
    }


def profile_executor(profile: str | Path | None) -> str:
    """The executor a workflow profile names (its config.yaml's `executor`; `local` without one)."""
    if profile is None:
        return "local"
    import yaml

    data = yaml.safe_load((Path(profile) / "config.yaml").read_text()) or {}
    return str(data.get("executor") or "local")


def estimate(
    settings: Settings, hidden_size: int, gpus: int | None = None, **assumptions: float
) -> dict[str, Any]:
    """The cost JSON (see the module docstring). The plan is the same on every executor: the engine
    is a job of its own, grouped with its extraction jobs, locally and on a cluster alike."""
    stated = {**DEFAULT_ASSUMPTIONS, **{k: v for k, v in assumptions.items() if v is not None}}
    counts = plan_counts(settings, hidden_size)
    hs, samples = settings.hidden_states, settings.dataset.num_samples
    upper = budget.estimate_from_settings(settings, hidden_size, int(stated["prompt_tokens"]))
    per_sample_low = min(stated["prompt_tokens"] + stated["completion_tokens"], hs.max_seq_len)
    passes = counts["extraction_passes"]
    baseline_share = (1 - settings.traces.validation_fraction) if counts["baseline"] else 0.0
    scale = passes + baseline_share  # the baseline extracts its train split once, beside the main pass
    tokens_low = int(samples * per_sample_low * scale)
    tokens_high = int(upper.tokens * scale)
    peak, _ = budget.on_disk_at_once(settings, upper)
    vllm = hs.backend == "vllm"
    if gpus is None:
        gpus = int(hs.vllm.tensor_parallel_size or 1) if vllm else 1
    staging = 0
    if vllm:
        step = hs.vllm.max_num_batched_tokens or max(hs.max_seq_len + 1, hs.batch_tokens)
        window_tokens = hs.vllm.max_in_flight_tokens or 2 * step
        # staged states stay in the engine's window until the writer reads them (back-pressure): the
        # staging folder holds at most one window
        staging = window_tokens * vllm_backend.staging_bytes_per_token(hidden_size)
    starts = counts["engine_starts"]

    def hours(tokens: int, per_s: float, start_s: float) -> float:
        return round(gpus * (starts * start_s + tokens / per_s) / 3600, 1)

    return {
        "engine_starts": starts,
        "extraction_passes": passes,
        "tokens": tokens_high,
        "tokens_low": tokens_low,
        "disk_peak_bytes": peak + staging,
        "gpu_hours_low": hours(tokens_low, stated["tokens_per_s_fast"], stated["start_s_fast"]),
        "gpu_hours_high": hours(tokens_high, stated["tokens_per_s_slow"], stated["start_s_slow"]),
        "gpus": gpus,
        "backend": hs.backend,
        "plan": counts,
        "staging_bytes": staging,
        "hidden_size": hidden_size,
        "assumptions": stated,
    }


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3_pipeline.hidden_states.cost",
        description="Print the extraction cost of a config as one JSON object (make cost CONFIG=path).",
    )
    parser.add_argument("config", help="the run's config file (e.g. config/examples/kimi-k2.5-8gpu.yaml)")
    parser.add_argument(
        "--hidden-size", type=int, help="the target's, if neither its config.json nor target.hidden_size"
    )
    parser.add_argument(
        "--gpus", type=int, help="GPUs the engine holds (default: hidden_states.vllm.tensor_parallel_size)"
    )
    for name, value in DEFAULT_ASSUMPTIONS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, help=f"default {value:g}")
    parser.add_argument(
        "--profile", help="the workflow profile the run uses (e.g. profiles/slurm): its executor is printed"
    )
    parser.add_argument("--schema", default=str(budget.REPO_ROOT / "config" / "schema.yaml"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import yaml

    from eagle3_pipeline.config import check_config
    from eagle3_pipeline.settings import build_settings

    args = _parse(sys.argv[1:] if argv is None else argv)
    settings = build_settings(check_config(yaml.safe_load(Path(args.config).read_text()), args.schema))
    hidden_size = budget.cli_hidden_size(settings, args.hidden_size, "the extraction cost")
    assumptions = {name: getattr(args, name) for name in DEFAULT_ASSUMPTIONS}
    result = estimate(settings, hidden_size, args.gpus, **assumptions)
    result["executor"] = profile_executor(args.profile)  # the same plan: one engine job per scope
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
