"""The report's head-to-head page (validate/report_head_to_head.py): the MLA and Llama drafts side by side
from validation/head_to_head.json, every acceptance figure with its interval, the paired difference in
words, and the Llama draft's reason for not being served."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_pipeline.demo.head_to_head import LLAMA_NOT_SERVED
from eagle3_pipeline.validate.report_head_to_head import difference_text, head_to_head_page, rows


def result(difference: float = -0.08, ci95: tuple[float, float] = (-0.17, 0.03)) -> dict:
    def draft(arch: str, length: float, ci: list[float], kv: int, epoch: int) -> dict:
        return {
            "architectures": [arch],
            "parameters": 656_000 if "Deepseek" in arch else 443_000,
            "kv_cache_bytes_per_token": kv,
            "offline": {"acceptance_length": length, "ci95": ci},
            "selection": {"chosen_epoch": epoch, "epochs": 8},
        }

    mla = draft("Eagle3DeepseekV3ForCausalLM", 1.83, [1.74, 1.92], 1152, 8)
    mla["served"] = {
        "acceptance_length": 1.84,
        "ci95": [1.61, 2.03],
        "sampled_acceptance_length": 1.58,
        "sampled_ci95": [1.50, 1.70],
        "questions": 13,
    }
    llama = draft("LlamaForCausalLMEagle3", 1.92, [1.79, 2.01], 512, 7)
    llama["served"] = {"reason": LLAMA_NOT_SERVED}
    return {
        "num_speculative_tokens": 3,
        "same_states": "both drafts trained, selected and measured on the main draft's hidden states",
        "deepseek_mla": mla,
        "llama": llama,
        "offline_difference_mla_minus_llama": {
            "questions": 13,
            "difference": difference,
            "ci95": list(ci95),
            "draws": 2000,
            "seed": 0,
        },
    }


def test_rows_give_every_acceptance_figure_with_its_interval() -> None:
    table = dict(rows(result()))
    assert table["offline acceptance length at k = 3 [95% CI]"] == ["1.83 [1.74, 1.92]", "1.92 [1.79, 2.01]"]
    sampled = table["served by vLLM, at the generation's sampling, 13 questions [95% CI]"]
    assert sampled == ["1.58 [1.50, 1.70]", LLAMA_NOT_SERVED]
    greedy = table["served by vLLM, greedy, 13 questions [95% CI]"]
    assert greedy[0] == "1.84 [1.61, 2.03]" and greedy[1].startswith("not served")
    assert table["epoch shipped (by offline acceptance)"][1] == "epoch 7 of 8 (counted from 1)"
    assert table["KV cache per token and layer (bf16)"] == ["1,152 B", "512 B"]


def test_difference_text_says_what_the_interval_says() -> None:
    assert "-0.080 [-0.170, +0.030]" in difference_text(result()) and "no measurable" in difference_text(
        result()
    )
    assert "MLA draft is accepted more" in difference_text(result(0.2, (0.1, 0.3)))
    # a lower bound that two decimals would print as +0.00 keeps its sign
    assert "+0.099 [+0.005, +0.192]" in difference_text(result(0.0992, (0.0049, 0.1923)))
    assert "Llama draft is accepted more" in difference_text(result(-0.2, (-0.3, -0.1)))


def test_page_is_written_from_the_json(tmp_path: Path) -> None:
    source = tmp_path / "head_to_head.json"
    source.write_text(json.dumps(result()))
    page = tmp_path / "head_to_head.html"
    head_to_head_page(source, page)
    text = page.read_text()
    assert "<h2>Head-to-head: MLA draft against a Llama draft on the same states</h2>" in text
    assert "1.58 [1.50, 1.70]" in text and "1.92 [1.79, 2.01]" in text
    assert "No common block size" in text  # the Llama draft's reason, escaped but present
    # a draft without a serve check or a selection file (older JSON) still renders
    older = result()
    del older["deepseek_mla"]["served"], older["deepseek_mla"]["selection"]
    source.write_text(json.dumps(older))
    head_to_head_page(source, page)
    assert "not served (validate.serve_check: false)" in page.read_text()
