"""Build the embedded demo's target: tokenizer, fitted tiny Llama, and the systemd unit serving it.

Everything is written into a temporary sibling folder and renamed into place at the end, so an
interrupted build leaves no half-written target behind.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaForCausalLM

from eagle3_pipeline import io
from eagle3_pipeline.demo.fit import (
    RECIPE,
    FitOptions,
    build_examples,
    fit,
    model_config,
    synthesise_reasoning,
)
from eagle3_pipeline.demo.kimi import build_kimi_target
from eagle3_pipeline.demo.tokenizer import save_tokenizer, train_tokenizer
from eagle3_pipeline.settings import DemoSettings

logger = logging.getLogger(__name__)

SERVED_MODEL_NAME = "eagle3-demo-target"
UNIT_PLACEHOLDERS = ("@REPO@", "@TARGET@", "@PORT@")


def load_rows(sample_path: str | Path) -> list[dict]:
    """Read the sample's JSON lines; raise naming the file and line when a row is not in its schema."""
    rows = []
    for number, line in enumerate(Path(sample_path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["conversations"]
            ok = all(t["from"] in ("system", "human", "gpt") and isinstance(t["value"], str) for t in turns)
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(f"{sample_path}:{number}: not a conversations row ({error})") from error
        if not ok:
            raise ValueError(
                f"{sample_path}:{number}: turns need 'from' in system/human/gpt and a 'value' string"
            )
        rows.append(row)
    if not rows:
        raise ValueError(f"{sample_path}: no rows; the demo target is fitted on this sample")
    return rows


def _tokenizer_texts(rows: list[dict]) -> list[str]:
    texts = [turn["value"] for row in rows for turn in row["conversations"]]
    for row in rows:
        turns = row["conversations"]
        texts += [
            synthesise_reasoning(q["value"], a["value"]) for q, a in zip(turns, turns[1:], strict=False)
        ]
    return texts


def build_target(
    rows: list[dict], out_dir: Path, demo: DemoSettings, options: FitOptions = RECIPE
) -> dict[str, float]:
    """Train the tokenizer, fit the model and save both (plus generation_config.json) into ``out_dir``:
    the tiny Llama, or with demo.family kimi the Kimi-family model (demo/kimi.py)."""
    if demo.family == "kimi":
        return build_kimi_target(rows, _tokenizer_texts(rows), out_dir, demo, options)
    tokenizer = train_tokenizer(_tokenizer_texts(rows))
    examples = build_examples(rows, tokenizer, demo.seed)
    logger.info("%d examples, %d tokens", len(examples), sum(len(ids) for ids, _ in examples))
    torch.manual_seed(demo.seed)
    model = LlamaForCausalLM(model_config(tokenizer))
    figures = fit(model, examples, tokenizer.pad_token_id, demo, options)
    logger.info("fit: %s", figures)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    (out_dir / "fit.json").write_text(json.dumps({**figures, "examples": len(examples)}, indent=2) + "\n")
    return figures


def render_unit(template: str, repo: Path, target_dir: Path, port: int) -> str:
    """Fill the unit template's @REPO@, @TARGET@ and @PORT@ (``${}`` is systemd's own syntax)."""
    missing = [p for p in UNIT_PLACEHOLDERS if p not in template]
    if missing:
        raise ValueError(
            f"unit template lacks placeholder(s) {missing}; see config/demo/vllm-demo.service.in"
        )
    text = template.replace("@REPO@", str(repo)).replace("@TARGET@", str(target_dir))
    return text.replace("@PORT@", str(port))


def build_demo_target(
    sample_path: str | Path,
    unit_template_path: str | Path,
    target_dir: str | Path,
    unit_path: str | Path,
    demo: DemoSettings,
    options: FitOptions = RECIPE,
    repo: str | Path | None = None,
) -> dict[str, float]:
    """Build the demo target into ``target_dir`` and its systemd unit into ``unit_path``.

    Args:
        sample_path: The sample in open-perfectblend's schema (config/demo/sample.jsonl).
        unit_template_path: The unit template with @REPO@, @TARGET@ and @PORT@ placeholders.
        target_dir: Where the model and tokenizer go (replaced whole, atomically).
        unit_path: Where the rendered unit goes.
        demo: The demo.* settings: the unit's port (127.0.0.1), the fit's CPU budget and seed.
        options: How the model is fitted beyond those (FitOptions).
        repo: The repository root the unit runs from (default: the current directory).

    Returns:
        The fit's figures.
    """
    target_dir = Path(target_dir).absolute()
    rows = load_rows(sample_path)
    unit = render_unit(
        Path(unit_template_path).read_text(), Path(repo or Path.cwd()).absolute(), target_dir, demo.port
    )
    target_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in target_dir.parent.glob(f".{target_dir.name}.*"):  # left by a killed build
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target_dir.name}.", dir=target_dir.parent))
    try:
        figures = build_target(rows, work, demo, options)
        old = target_dir.with_name(f".{target_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if target_dir.exists():
            target_dir.rename(old)
        work.rename(target_dir)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    io.write_text(unit, unit_path)
    logger.info("demo target in %s, unit %s", target_dir, unit_path)
    return figures
