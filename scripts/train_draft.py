"""Train the EAGLE-3 draft; run by `accelerate launch` from rule train_draft (see draft/train.py)."""

import argparse
import logging
import sys

from eagle3_pipeline.draft.train import DRAFT_SHAPE_KEYS, TrainJob, main, split_shards


def parse_args(argv: list[str]) -> TrainJob:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--states", nargs="+", required=True, help="hidden_states/{train,validation}/shard-*.safetensors"
    )
    p.add_argument("--vocab-map", required=True, help="draft/vocab_map.safetensors")
    p.add_argument("--target", required=True, help="target weights folder (config.json, model.safetensors)")
    p.add_argument("--work", required=True, help="training state, for resume")
    p.add_argument("--weights", required=True, help="output: draft/trained/model.safetensors")
    p.add_argument("--history", required=True, help="output: draft/trained/history.json")
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--step-weight-decay", type=float, default=0.8)
    for key in DRAFT_SHAPE_KEYS:  # draft.head_dim etc.; left out: the default from the target
        p.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    for flag, kind in [("epochs", int), ("lr", float), ("warmup-ratio", float), ("weight-decay", float)]:
        p.add_argument(f"--{flag}", type=kind, required=True)
    for flag, kind in [("grad-clip", float), ("batch-tokens", int), ("seed", int), ("save-every-steps", int)]:
        p.add_argument(f"--{flag}", type=kind, required=True)
    a = p.parse_args(argv)
    train_shards, validation_shards = split_shards(a.states)
    train_keys = (
        "epochs",
        "lr",
        "warmup_ratio",
        "weight_decay",
        "grad_clip",
        "batch_tokens",
        "seed",
        "save_every_steps",
    )
    return TrainJob(
        train_shards=train_shards,
        validation_shards=validation_shards,
        vocab_map=a.vocab_map,
        target=a.target,
        draft={"ttt_steps": a.ttt_steps, "step_weight_decay": a.step_weight_decay}
        | {k: getattr(a, k) for k in DRAFT_SHAPE_KEYS if getattr(a, k) is not None},
        train={k: getattr(a, k) for k in train_keys},
        work=a.work,
        weights=a.weights,
        history=a.history,
        cpu_threads=a.threads,
    )


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    main(parse_args(sys.argv[1:]))
