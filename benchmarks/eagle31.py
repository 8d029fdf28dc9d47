"""EAGLE-3.1's options against plain EAGLE-3 on the demo: offline acceptance side by side.

The same draft (the demo config's train.*: 10 epochs, lr 1e-3; `--ttt-steps` TTT steps, 3 by default
where the demo trains 7, to fit a shared 2-core machine; the same seed and data order) is trained once
per variant, plain EAGLE-3 and each of draft.norm_before_fc, draft.fc_norm,
draft.norm_output (and norm_before_fc with norm_output), by the pipeline's own training, exported, and
measured by the pipeline's offline acceptance (validate/offline.py: the draft's own chain of guesses
against the target's argmax on held-out hidden states) for 3 draft tokens, as validate.num_speculative_tokens.

States: `--states DIR` reads a demo run's hidden states (results/demo/hidden_states/{train,validation}/,
with --vocab-map results/demo/draft/vocab_map.safetensors); without it they are made here the demo's
way, smaller: the demo target's replies to the sample's questions (sampled at the demo's temperature 0.6,
top_p 0.95, through the chat template that opens a thinking block; transformers, not vLLM: no server on
a shared 2-core machine), extracted by the pipeline's transformers backend. --seeds repeats every
variant with other seeds (init and data order), so the gaps can be set against seed-to-seed spread.

    .venv/bin/python benchmarks/eagle31.py                      # ~7 minutes on 2 cores (docs/training.md)
    .venv/bin/python benchmarks/eagle31.py --states results/demo/hidden_states \\
        --vocab-map results/demo/draft/vocab_map.safetensors
Prints one JSON line per variant and seed, then one summary line (means over seeds, gain over plain).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import torch
import yaml

from eagle3_pipeline.draft.export import export_checkpoint
from eagle3_pipeline.draft.train import TrainJob, main
from eagle3_pipeline.draft.vocab import build_vocab_map
from eagle3_pipeline.settings import DraftSettings, TrainSettings, section
from eagle3_pipeline.validate.offline import evaluate

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "eagle3": {},
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "norm_before_fc+norm_output": {"norm_before_fc": True, "norm_output": True},
}


def emit(**record) -> None:
    print(json.dumps(record), flush=True)  # noqa: T201


def demo_target() -> Path:
    """The demo's target: built by the demo (rule build_demo_target), else the tests' cached fit."""
    built = REPO / "resources" / "demo" / "target"
    if (built / "model.safetensors").exists():
        return built
    cached = sorted((REPO / ".pytest_cache" / "demo-target").glob("*/target/model.safetensors"))
    if not cached:
        sys.exit(
            "no demo target: build it (snakemake resources/demo/target/config.json) or run the tests once"
        )
    return cached[-1].parent


def sampled_traces(target: Path, rows: list[dict], max_tokens: int, seed: int) -> pl.DataFrame:
    """The target's replies as trace rows (generation's columns), sampled as the demo's generation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    out = []
    for i, row in enumerate(rows):
        turns = {t["from"]: t["value"] for t in row["conversations"]}
        messages = [{"role": "system", "content": turns["system"]}] if turns.get("system") else []
        messages.append({"role": "user", "content": turns["human"]})
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            reply = model.generate(
                torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=True, temperature=0.6, top_p=0.95
            )[0, len(ids) :].tolist()
        out.append(
            {
                "id": f"q{i:05d}",
                "shard": 0,
                "system": turns.get("system"),
                "question": turns["human"],
                "reasoning": None,
                "content": tokenizer.decode(reply),
                "prompt_token_ids": ids,
                "completion_token_ids": reply,
                "status": "ok",
            }
        )
    overrides = {
        "shard": pl.Int32,
        "prompt_token_ids": pl.List(pl.Int32),
        "completion_token_ids": pl.List(pl.Int32),
    }
    return pl.DataFrame(out, schema_overrides=overrides)


def make_states(
    target: Path, work: Path, train: int, validation: int, max_tokens: int
) -> dict[str, list[Path]]:
    """Hidden-state shards of the target's own replies (the pipeline's extraction, transformers backend)."""
    from eagle3_pipeline.demo.target import load_rows
    from eagle3_pipeline.hidden_states.extract import extract_shards
    from eagle3_pipeline.hidden_states.job import ShardJob
    from eagle3_pipeline.settings import HiddenStatesSettings

    rows = load_rows(REPO / "config" / "demo" / "sample.jsonl")
    shards = {}
    for split, chosen in (("train", rows[:train]), ("validation", rows[-validation:])):
        traces = work / f"{split}.parquet"
        sampled_traces(target, chosen, max_tokens, seed=len(split)).write_parquet(traces)
        shard = work / "hidden_states" / split / "shard-00000.safetensors"
        shard.parent.mkdir(parents=True, exist_ok=True)
        job = ShardJob(
            traces=traces,
            shard=0,
            target=target,
            output=shard,
            metadata=shard.with_suffix(".json"),
            work=work / f"extract-{split}",
        )
        extract_shards(HiddenStatesSettings(backend="transformers", max_seq_len=1024), [job])
        shards[split] = [shard]
    return shards


def train_and_measure(
    target: Path,
    shards: dict[str, list[Path]],
    vocab_map: Path,
    options: dict,
    seed: int,
    ttt_steps: int,
    work: Path,
) -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    train = {k: config["train"][k] for k in ("epochs", "lr", "warmup_ratio", "weight_decay", "grad_clip")}
    train |= {"batch_tokens": 2048, "seed": seed, "save_every_steps": 100_000}
    draft = {"ttt_steps": ttt_steps, "step_weight_decay": config["draft"]["step_weight_decay"]} | options
    job = TrainJob(
        train_shards=[str(p) for p in shards["train"]],
        validation_shards=[],
        vocab_map=str(vocab_map),
        target=str(target),
        draft=section(DraftSettings, draft),
        train=section(TrainSettings, train),
        work=str(work / "train"),
        weights=str(work / "trained.safetensors"),
        history=str(work / "history.json"),
        cpu_threads=1,
    )
    start = time.monotonic()
    assert main(job)
    seconds = time.monotonic() - start
    checkpoint = work / "checkpoint"
    metadata = shards["train"][0].with_suffix(".json")
    export_checkpoint(job.weights, vocab_map, target / "config.json", metadata, checkpoint / "config.json",
                      checkpoint / "model.safetensors")  # fmt: skip
    offline = evaluate(checkpoint, target, shards["validation"], steps=3, device="cpu")
    anchors = offline["anchors"]
    return {
        "acceptance_length": round(offline["acceptance_length"][-1], 4),  # tau with 3 draft tokens
        "per_position": [round(c / anchors, 4) for c in offline["prefix_counts"]],  # steps 0..i all right
        "anchors": anchors,
        "train_s": round(seconds, 1),
    }


def main_cli() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--states", type=Path, help="a demo run's hidden_states folder (train/, validation/)")
    parser.add_argument("--vocab-map", type=Path, help="with --states: the run's draft/vocab_map.safetensors")
    parser.add_argument("--questions", type=int, default=128, help="training questions (states made here)")
    parser.add_argument("--validation", type=int, default=16, help="held-out questions (states made here)")
    parser.add_argument("--max-tokens", type=int, default=192, help="reply length (states made here)")
    parser.add_argument("--ttt-steps", type=int, default=3, help="draft.ttt_steps (the demo: 7)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS)[:4], choices=list(VARIANTS))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)  # a shared 2-core machine
    target = demo_target()
    with tempfile.TemporaryDirectory(prefix="eagle31-") as tmp:
        work = Path(tmp)
        if args.states:
            shards = {
                s: sorted((args.states / s).glob("shard-*.safetensors")) for s in ("train", "validation")
            }
            vocab_map = args.vocab_map
        else:
            shards = make_states(target, work, args.questions, args.validation, args.max_tokens)
            vocab_map = work / "vocab_map.safetensors"
            vocab = json.loads((target / "config.json").read_text())["vocab_size"]
            build_vocab_map([p.with_suffix(".json") for p in shards["train"]], vocab, 32000, vocab_map)
        results: dict[str, list[dict]] = {}
        for seed in range(args.seeds):
            for name in args.variants:
                measured = train_and_measure(
                    target, shards, vocab_map, VARIANTS[name], seed, args.ttt_steps, work / f"{name}-{seed}"
                )
                results.setdefault(name, []).append(measured)
                emit(variant=name, seed=seed, **measured)
    plain = statistics.mean(r["acceptance_length"] for r in results.get("eagle3", [{"acceptance_length": 0}]))
    summary = {}
    for name, runs in results.items():
        mean = statistics.mean(r["acceptance_length"] for r in runs)
        spread = statistics.pstdev(r["acceptance_length"] for r in runs) if len(runs) > 1 else None
        summary[name] = {
            "acceptance_length": round(mean, 4),
            "seed_sd": spread,
            "vs_eagle3": round(mean / plain, 4) if plain else None,
        }
    emit(summary=summary, target=str(target), states=str(args.states or "made here"), seeds=args.seeds)


if __name__ == "__main__":
    main_cli()
