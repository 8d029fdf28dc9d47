"""draft.init_from on the demo target: does training start where the starting draft ended?

A stand-in for "the demo's exported draft" is trained on the target's greedy replies to questions A
(`--start-epochs`), exported; then two drafts train on questions B at the same steps (`--epochs`): one
started from that export (draft.init_from, with B's own vocabulary map: the lm_head rows remapped), one
from scratch. All three are measured by the pipeline's offline check (validate/offline.py, k = 3, the
target's argmax) on held-out questions C; the starting draft through validate_offline_init's own path.

Traces are the shipped demo target's (tests/data/demo-target) greedy replies through transformers (no
server on a shared 2-core machine), extracted by the pipeline's transformers backend
(tests/support/served_drafts.py); `--work DIR` keeps them for a rerun.

    .venv/bin/python benchmarks/init_from.py            # ~12 minutes on a shared 2-core machine

Prints one JSON line per draft: acceptance length for k = 1..3, its question-level ci95, anchors.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.served_drafts import extract, greedy_traces, questions  # noqa: E402

from eagle3_pipeline.draft.export import export_checkpoint  # noqa: E402
from eagle3_pipeline.draft.train import TrainJob, main  # noqa: E402
from eagle3_pipeline.draft.vocab import build_vocab_map  # noqa: E402
from eagle3_pipeline.settings import DraftSettings, TrainSettings  # noqa: E402
from eagle3_pipeline.validate.offline import validate_offline, validate_starting_draft  # noqa: E402

TARGET = REPO / "tests" / "data" / "demo-target" / "target"
DRAFT = DraftSettings(draft_vocab_size=512, ttt_steps=3)


def states(work: Path, name: str, asked: list[dict], max_tokens: int) -> Path:
    """The target's greedy replies to `asked`, extracted: one hidden-state shard (kept in `work`)."""
    traces, shard = work / f"{name}.parquet", work / name / "shard-00000.safetensors"
    if not traces.exists():
        greedy_traces(TARGET, asked, max_tokens).write_parquet(traces)
    return shard if shard.exists() else extract(TARGET, traces, shard)


def train(work: Path, shard: Path, epochs: int, init_from: str | None = None) -> Path:
    """The pipeline's vocab map, training and export on one shard -> the EAGLE checkpoint folder."""
    vocab = work / "vocab_map.safetensors"
    work.mkdir(parents=True, exist_ok=True)
    target_vocab = json.loads((TARGET / "config.json").read_text())["vocab_size"]
    build_vocab_map([shard.with_suffix(".json")], target_vocab, DRAFT.draft_vocab_size, vocab)
    settings = TrainSettings(
        epochs=epochs, lr=3e-3, warmup_ratio=0.05, batch_tokens=2048, save_every_steps=10**4
    )
    job = TrainJob(
        train_shards=[str(shard)],
        validation_shards=[],
        vocab_map=str(vocab),
        target=str(TARGET),
        draft=DraftSettings(draft_vocab_size=DRAFT.draft_vocab_size, ttt_steps=3, init_from=init_from),
        train=settings,
        work=str(work / "train"),
        weights=str(work / "trained.safetensors"),
        history=str(work / "history.json"),
        cpu_threads=1,
    )
    assert main(job)
    folder = work / "checkpoint"
    metadata = shard.with_suffix(".json")
    export_checkpoint(
        job.weights,
        vocab,
        TARGET / "config.json",
        metadata,
        folder / "config.json",
        folder / "model.safetensors",
    )
    return folder


def emit(name: str, result: dict) -> None:
    lengths = [round(x, 3) for x in result["acceptance_length"]]
    record = {
        "draft": name,
        "acceptance_length": lengths,
        "ci95": result.get("ci95"),
        "anchors": result["anchors"],
    }
    print(json.dumps(record), flush=True)  # noqa: T201


def run(work: Path, start_epochs: int, epochs: int, max_tokens: int) -> None:
    a = states(work, "A", questions(48, 0), max_tokens)
    b = states(work, "B", questions(24, 48), max_tokens)
    c = [str(states(work, "C", questions(24, 72), max_tokens))]
    start = train(work / "start", a, start_epochs)
    tuned = train(work / "tuned", b, epochs, init_from=str(start))
    scratch = train(work / "scratch", b, epochs)
    offline = {"steps": 3, "num_speculative_tokens": 3}
    init = validate_starting_draft(start, TARGET, DRAFT, c, work / "init", work / "init.json", **offline)
    emit(f"start: A, {start_epochs} epochs", init)
    emit(
        f"init_from start, B, {epochs} epochs",
        validate_offline(tuned, TARGET, c, output_path=work / "t.json", **offline),
    )
    emit(
        f"scratch, B, {epochs} epochs",
        validate_offline(scratch, TARGET, c, output_path=work / "s.json", **offline),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="keep traces and states here (reused)")
    parser.add_argument("--start-epochs", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="init-from-"))
    run(work, args.start_epochs, args.epochs, args.max_tokens)
