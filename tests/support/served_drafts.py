"""What the served-check tests build on the demo target with the pipeline's own stage code: validation
questions from the bundled sample, the demo unit for a target, the target's own greedy replies as
traces, their hidden states and a draft trained and exported from them
(tests/integration/test_serve_check.py, test_speculators_serve.py).

Built once per session and shared by those tests (session fixtures, registered in tests/conftest.py):
`served_target` (a private copy of the demo target), `greedy_training_traces`, `trained_draft` (exported
in both formats) and `served_trained_draft` (that draft served by the serve check's own entry on the
held-out questions, greedy, one request at a time, with the server's log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[2]


def questions(count: int, skip: int = 0) -> list[dict]:
    from eagle3_pipeline.demo.target import load_rows

    rows = load_rows(REPO / "config/demo/sample.jsonl")[skip : skip + count]
    out = []
    for i, row in enumerate(rows):
        turns = {t["from"]: t["value"] for t in row["conversations"]}
        out.append(
            {
                "id": f"q{skip + i:04d}",
                "system": turns.get("system"),
                "question": turns["human"],
                "source": row.get("source"),
                "original_answer": turns.get("gpt"),
            }
        )
    return out


def write_unit(target: Path, path: Path) -> Path:
    from eagle3_pipeline.demo.target import render_unit

    template = (REPO / "config/demo/vllm-demo.service.in").read_text()
    path.write_text(render_unit(template, REPO, target, 18597))  # the check replaces the port
    return path


def greedy_traces(target: Path, asked: list[dict], max_new_tokens: int, batch: int = 1) -> pl.DataFrame:
    """The target's own greedy replies (transformers, fp32) as trace rows with token ids: faster here than
    vLLM on a loaded 2-core machine, and the same argmax the served target verifies against. `batch`
    questions are generated at once, left-padded: the 32 training replies came out token for token as
    generated one by one, in 18 s against 110 s (a padded batch's float sums could still flip a
    near-tied argmax; the greedy served-against-replay comparison is a diagnostic, never enforced)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    stops = set(eos if isinstance(eos, list) else [eos])
    prompts = []
    for q in asked:
        messages = ([{"role": "system", "content": q["system"]}] if q["system"] else []) + [
            {"role": "user", "content": q["question"]}
        ]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(prompt, add_special_tokens=False))
    completions: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        group = prompts[start : start + batch]
        width = max(map(len, group))
        pad = model.config.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
            )
        for row in out[:, width:].tolist():  # cut after the first stop token: what one alone returns
            end = next((i + 1 for i, token in enumerate(row) if token in stops), len(row))
            completions.append(row[:end])
    rows = []
    for q, ids, completion in zip(asked, prompts, completions, strict=True):
        rows.append(
            {
                "id": q["id"],
                "shard": 0,
                "system": q["system"],
                "question": q["question"],
                "reasoning": None,
                "content": tokenizer.decode(completion),
                "prompt_token_ids": ids,
                "completion_token_ids": completion,
                "status": "ok",
            }
        )
    return pl.DataFrame(
        rows,
        schema_overrides={
            "shard": pl.Int32,
            "prompt_token_ids": pl.List(pl.Int32),
            "completion_token_ids": pl.List(pl.Int32),
        },
    )


def extract(target: Path, traces: Path, shard: Path, layers: list | None = None) -> Path:
    """One hidden-state shard of the traces (the pipeline's extraction; `layers` as hidden_states.layers)."""
    from eagle3_pipeline.hidden_states.extract import extract_shards
    from eagle3_pipeline.hidden_states.job import ShardJob
    from eagle3_pipeline.settings import HiddenStatesSettings

    shard.parent.mkdir(parents=True, exist_ok=True)
    extract_shards(
        HiddenStatesSettings(
            backend="transformers", max_seq_len=1024, layers=tuple(layers) if layers else "auto"
        ),
        [
            ShardJob(
                traces=traces,
                shard=0,
                target=target,
                output=shard,
                metadata=shard.with_suffix(".json"),
                work=shard.parent / "extract-work",
            )
        ],
    )
    return shard


def train_draft(
    target: Path,
    traces: Path,
    work: Path,
    layers: list | None = None,
    epochs: int = 100,
    cpu_threads: int = 0,
    speculators: bool = False,
    early_epoch: int | None = None,
) -> Path:
    """Extraction, vocab map, training and export: the pipeline's stage code, small settings -> the
    EAGLE checkpoint folder (with `speculators`, work/speculators too, the target as its verifier; with
    `early_epoch`, that earlier epoch's weights exported too, to work/checkpoint-early)."""
    from eagle3_pipeline.draft.export import export_checkpoint
    from eagle3_pipeline.draft.train import TrainJob, main
    from eagle3_pipeline.draft.vocab import build_vocab_map
    from eagle3_pipeline.settings import DraftSettings, TrainSettings

    shard = extract(target, traces, work / "hidden_states" / "shard-00000.safetensors", layers)
    vocab_size = json.loads((target / "config.json").read_text())["vocab_size"]
    build_vocab_map([shard.with_suffix(".json")], vocab_size, 512, work / "vocab_map.safetensors")
    job = TrainJob(
        train_shards=[str(shard)],
        validation_shards=[],
        vocab_map=str(work / "vocab_map.safetensors"),
        target=str(target),
        draft=DraftSettings(draft_vocab_size=512, ttt_steps=3, step_weight_decay=0.8),
        train=TrainSettings(
            epochs=epochs,
            lr=3e-3,
            warmup_ratio=0.05,
            weight_decay=0.0,
            grad_clip=0.5,
            batch_tokens=2048,
            seed=0,
            save_every_steps=10_000,
        ),
        work=str(work / "train"),
        weights=str(work / "trained.safetensors"),
        history=str(work / "history.json"),
        cpu_threads=cpu_threads,
        **(
            {"checkpoint_epochs": [early_epoch], "checkpoints": [str(work / "early.safetensors")]}
            if early_epoch is not None
            else {}
        ),
    )
    assert main(job)
    if early_epoch is not None:
        early = work / "checkpoint-early"
        export_checkpoint(
            work / "early.safetensors", job.vocab_map, target / "config.json", shard.with_suffix(".json"),
            early / "config.json", early / "model.safetensors",
        )  # fmt: skip
    checkpoint = work / "checkpoint"
    export_checkpoint(
        job.weights,
        job.vocab_map,
        target / "config.json",
        shard.with_suffix(".json"),
        checkpoint / "config.json",
        checkpoint / "model.safetensors",
        **({"speculators_dir": work / "speculators"} if speculators else {}),
    )
    return checkpoint


def local_unit(target: Path, path: Path):
    """The serve check's server settings for the demo unit serving `target` as a local process."""
    from eagle3_pipeline.settings import ServerSettings

    unit_file = str(write_unit(target, path))
    return ServerSettings(host="local", unit="vllm-demo.service", unit_file=unit_file, start_timeout_s=900)


@pytest.fixture(scope="session")
def served_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the shared demo target (fitted once: support.vllm_server) for the tests that
    start and stop their own servers on it."""
    from support.vllm_server import copy_demo_target

    return copy_demo_target(tmp_path_factory.mktemp("served-demo"))


@pytest.fixture(scope="session")
def greedy_training_traces(served_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target's greedy replies to the first 32 questions (128 tokens), computed once per session."""
    path = tmp_path_factory.mktemp("greedy") / "traces.parquet"
    greedy_traces(served_target, questions(32), 128, batch=32).write_parquet(path)
    return path


# The served draft's layers: NOT the 8-layer target's default (auto: [1, 3, 4]), so that every served
# check also shows that vLLM feeds the draft the layers it was trained on, in its own numbering (+1).
SERVED_LAYERS = [0, 2, 6]
# 40 epochs: offline acceptance at k = 3 on the 12 held-out questions 2.69 against 2.81 at 100 (the
# early epoch 1.14 and 1.06), measured on this machine in 60% of the training time
TRAINED_EPOCHS = 40
EARLY_EPOCH = 1  # 0-based: the second of the draft's TRAINED_EPOCHS, exported beside the last (a wrong draft)


@dataclass(frozen=True)
class TrainedDraft:
    eagle: Path  # the EAGLE-3 checkpoint folder (draft vocab 512 < the target's 1024: d2t in it)
    speculators: Path  # the same draft in the speculators format, the target as its verifier
    early: Path  # EARLY_EPOCH's weights exported the same way: the same shape, partly trained
    layers: list[int]  # SERVED_LAYERS, 0-based outputs of decoder layers


@pytest.fixture(scope="session")
def trained_draft(
    served_target: Path, greedy_training_traces: Path, tmp_path_factory: pytest.TempPathFactory
) -> TrainedDraft:
    """A draft trained on SERVED_LAYERS by the pipeline's stage code (TRAINED_EPOCHS), exported in both
    formats, with its EARLY_EPOCH exported too: one training for every served check."""
    work = tmp_path_factory.mktemp("trained-draft")
    # one thread: on a shared 2-core machine two OpenMP threads spin-wait for each other
    eagle = train_draft(
        served_target, greedy_training_traces, work, SERVED_LAYERS, epochs=TRAINED_EPOCHS, cpu_threads=1,
        speculators=True, early_epoch=EARLY_EPOCH,
    )  # fmt: skip
    return TrainedDraft(eagle, work / "speculators", work / "checkpoint-early", SERVED_LAYERS)


def held_out_questions() -> list[dict]:
    """The served checks' validation questions: 8, none of them trained on."""
    return questions(8, skip=300)


def greedy_sampling(max_tokens: int = 64):
    from eagle3_pipeline.generate.client import Sampling

    return Sampling(model="eagle3-demo-target", max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=0)


@dataclass(frozen=True)
class ServedDraft:
    result: dict  # run_local_checks' figures
    log: str  # the server's log (vLLM names the layers it feeds the draft)


@pytest.fixture(scope="session")
def served_trained_draft(
    served_target: Path, trained_draft: TrainedDraft, tmp_path_factory: pytest.TempPathFactory
) -> ServedDraft:
    """`trained_draft` served by what the rule's local check runs (`local_vllm.run_local_checks`: the
    demo unit's vLLM with `--speculative-config`), the check's server alone (no other k, no timing), on
    `held_out_questions`, greedy, concurrency 1 (the same batches as any other server measured that
    way, so drafts compare request by request); its figures as measured, before any comparison."""
    from support.requirements import require

    from eagle3_pipeline.settings import ValidateSettings
    from eagle3_pipeline.validate.local_vllm import run_local_checks
    from eagle3_pipeline.validate.spec_decode import ask

    require("vllm")
    state = tmp_path_factory.mktemp("served-trained")
    unit = local_unit(served_target, state / "vllm-demo.service")
    validate = ValidateSettings(num_speculative_tokens=3)
    sampling = greedy_sampling()
    result = run_local_checks(
        unit, validate, trained_draft.eagle, held_out_questions(), sampling, state,
        conclude=lambda measured: measured,
        ask=lambda url, group, level: ask(url, group, sampling, None, level, 600.0, 2),  # timing only: unused
        concurrency=1,
    )  # fmt: skip
    (state / "result.json").write_text(json.dumps(result, indent=1))
    return ServedDraft(result=result, log=(state / "serve-check.log").read_text())
