"""The report's head-to-head page (the Kimi-family demo, rules/demo_head_to_head.smk): the MLA draft
against the Llama draft trained on the same hidden states, from validation/head_to_head.json
(demo/head_to_head.py), every acceptance figure with its 95% question-level interval.

A page of its own (report/head_to_head.html, category "4. Validation"), written by rule head_to_head
beside the JSON: the report's other pages (validate/report.py, report_front.py) do not read it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from eagle3_pipeline import io
from eagle3_pipeline.validate.report import PAGE

TITLE = "Head-to-head: MLA draft against a Llama draft on the same states"
DRAFTS = (("deepseek_mla", "MLA draft (deepseek_mla)"), ("llama", "Llama draft (same states)"))


def figure_text(value: float | None, ci95: list[float] | None) -> str:
    """`1.83 [1.74, 1.92]`, the interval left out when there is none; "not measured" without a value."""
    if value is None:
        return "not measured"
    return f"{value:.2f}" + (f" [{ci95[0]:.2f}, {ci95[1]:.2f}]" if ci95 else "")


def _served(record: dict[str, Any], sampled: bool) -> str:
    served = record.get("served") or {}
    if "reason" in served:
        return served["reason"] if sampled else "not served (the row above says why)"
    if not served:
        return "not served (validate.serve_check: false)"
    if sampled:
        return figure_text(served.get("sampled_acceptance_length"), served.get("sampled_ci95"))
    return figure_text(served.get("acceptance_length"), served.get("ci95"))


def _selection(record: dict[str, Any]) -> str:
    selection = record.get("selection")
    if not selection:
        return "the last epoch"
    return f"epoch {selection['chosen_epoch']} of {selection['epochs']} (counted from 1)"


def rows(result: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The table's rows: a label, then one cell per draft (MLA, Llama)."""
    k = result["num_speculative_tokens"]
    drafts = [result[key] for key, _ in DRAFTS]
    questions = next(
        (d["served"]["questions"] for d in drafts if (d.get("served") or {}).get("questions")), None
    )
    asked = f", {questions} questions" if questions else ""
    return [
        ("exported as", [", ".join(d.get("architectures") or []) for d in drafts]),
        (
            f"offline acceptance length at k = {k} [95% CI]",
            [figure_text(d["offline"]["acceptance_length"], d["offline"]["ci95"]) for d in drafts],
        ),
        (f"served by vLLM, at the generation's sampling{asked} [95% CI]", [_served(d, True) for d in drafts]),
        (f"served by vLLM, greedy{asked} [95% CI]", [_served(d, False) for d in drafts]),
        ("epoch shipped (by offline acceptance)", [_selection(d) for d in drafts]),
        ("parameters (d2t/t2d left out)", [f"{d['parameters']:,}" for d in drafts]),
        ("KV cache per token and layer (bf16)", [f"{d['kv_cache_bytes_per_token']:,} B" for d in drafts]),
    ]


def difference_text(result: dict[str, Any]) -> str:
    """The paired difference in words, with its interval and what it says (three decimals: a bound near 0
    decides the verdict, and two would print +0.00 for a difference the interval holds above it)."""
    paired = result["offline_difference_mla_minus_llama"]
    if paired.get("difference") is None:
        return "MLA minus Llama, paired by question: no question measured by both drafts."
    low, high = paired["ci95"]
    if low > 0:
        verdict = "the MLA draft is accepted more"
    elif high < 0:
        verdict = "the Llama draft is accepted more"
    else:
        verdict = "no measurable difference at this size (the interval holds 0)"
    return (
        f"MLA minus Llama, offline at k = {result['num_speculative_tokens']}, paired by question: "
        f"{paired['difference']:+.3f} [{low:+.3f}, {high:+.3f}] tokens per target step (95% bootstrap "
        f"interval over the {paired['questions']} validation questions, {paired.get('draws')} draws): "
        f"{verdict}."
    )


def head_to_head_page(head_to_head_path: str | Path, output: str | Path) -> None:
    """HTML: the two drafts side by side, the paired difference, and why the Llama draft is not served."""
    result = json.loads(Path(head_to_head_path).read_text())
    header = "".join(f"<th>{html.escape(name)}</th>" for _, name in DRAFTS)
    body_rows = "".join(
        f"<tr><th>{html.escape(label)}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
        for label, cells in rows(result)
    )
    body = (
        f"<p>{html.escape(result.get('same_states', ''))}; only the attention differs.</p>"
        f"<table><tr><th></th>{header}</tr>{body_rows}</table>"
        f"<p><b>{html.escape(difference_text(result))}</b></p>"
    )
    io.write_text(PAGE.format(title=TITLE, body=body), output)
