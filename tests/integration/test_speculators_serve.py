"""vLLM serves the speculators-format export (draft/speculators/) as it serves the EAGLE one: the same
draft, trained by the pipeline's code on the demo target's own greedy replies, is served twice on the
same held-out questions, greedy, one request at a time: the EAGLE checkpoint by the pipeline's own served
check (the demo unit's vLLM with `--speculative-config`), the speculators folder by the demo unit's own
command with the folder as its model and no speculative flag at all (vLLM takes the verifier and the
speculative config from the folder: transformers_utils/config.py, maybe_override_with_speculators).
The acceptance per draft position must agree within noise.

vLLM reads the two folders through different code (llama_eagle3.py's config for the EAGLE one,
transformers_utils/configs/speculators/ for the other, whose defaults differ: norm_before_residual is
true there), so a field the speculators export failed to write, or wrote wrong, shows here. The figures
land in tmp_path/acceptance.json (docs/training.md quotes them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support.served_drafts import greedy_traces, local_unit, questions, train_draft
from support.vllm_server import DemoServer, demo_target_dir

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def train_and_export(target: Path, work: Path) -> tuple[Path, Path]:
    """The pipeline's stage code, small settings: greedy replies, extraction, vocab map, training, export
    in both formats -> (EAGLE checkpoint, speculators folder)."""
    greedy_traces(target, questions(24), 96).write_parquet(work / "traces.parquet")
    checkpoint = train_draft(
        target, work / "traces.parquet", work, epochs=30, cpu_threads=1, speculators=True
    )
    return checkpoint, work / "speculators"


def test_vllm_serves_the_speculators_format_with_the_eagle_formats_acceptance(tmp_path):
    import torch

    from eagle3_pipeline.generate.client import Sampling
    from eagle3_pipeline.ports import free_port
    from eagle3_pipeline.validate.serve_check import run_local_serve_check
    from eagle3_pipeline.validate.served import measure_by_source
    from eagle3_pipeline.validate.serving import measure

    torch.set_num_threads(1)  # a shared 2-core machine: two OpenMP threads spin-wait for each other
    target = demo_target_dir()
    eagle, speculators = train_and_export(target, tmp_path)
    server_cfg = local_unit(target, tmp_path / "vllm-demo.service")
    held_out = questions(8, skip=300)
    greedy = Sampling(model="eagle3-demo-target", max_tokens=64, temperature=0.0, top_p=1.0, seed=0)
    # concurrency 1: the same batches in both runs, so greedy drafts are comparable request by request
    eagle_served = run_local_serve_check(
        server_cfg, eagle, held_out, greedy, tmp_path / "eagle", 3, concurrency=1
    )
    server = DemoServer(speculators, free_port(), tmp_path / "speculators.log")  # the unit, --model FOLDER
    server.start()
    try:
        speculators_served = measure_by_source(
            lambda group: measure(server.base_url, group, greedy, concurrency=1), held_out
        )
    finally:
        server.stop()
    measured = {"eagle": eagle_served, "speculators": speculators_served}
    (tmp_path / "acceptance.json").write_text(json.dumps(measured, indent=1))

    a, b = measured["eagle"], measured["speculators"]
    assert a["answered"] == b["answered"] == len(held_out)
    assert a["acceptance_length"] > 1.5, a  # a draft that is accepted: the comparison can tell formats apart
    for position, (p, q) in enumerate(zip(a["per_position_rate"], b["per_position_rate"], strict=True)):
        noise = 3 * math.sqrt(max(p * (1 - p), 0.01) * 2 / min(a["drafts"], b["drafts"]))
        assert abs(p - q) <= noise, (
            f"position {position}: EAGLE format {p:.3f}, speculators {q:.3f} ({measured})"
        )
