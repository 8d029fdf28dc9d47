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

import pytest
from support.served_drafts import greedy_sampling, held_out_questions
from support.vllm_server import DemoServer

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def test_vllm_serves_the_speculators_format_with_the_eagle_formats_acceptance(
    trained_draft, served_trained_draft, tmp_path
):
    """The EAGLE checkpoint's figures are support.served_drafts' `served_trained_draft` (the draft trained
    and served once per session, also checked by test_serve_check.py); the speculators folder is served
    here on the same questions, greedy, one request at a time."""
    from eagle3_pipeline.ports import free_port
    from eagle3_pipeline.validate.served_figures import measure_by_source
    from eagle3_pipeline.validate.spec_decode import measure

    held_out, greedy = held_out_questions(), greedy_sampling()
    eagle_served = served_trained_draft.result
    server = DemoServer(
        trained_draft.speculators, free_port(), tmp_path / "speculators.log"
    )  # --model FOLDER
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
