"""Train the EAGLE-3 draft; run by `accelerate launch` from rule train_draft, or, under a disk cap, from
rule train_draft_window for one window of one epoch (--window-*; see draft/train.py)."""

import argparse
import sys

from eagle3_pipeline.draft.train import DRAFT_SHAPE_KEYS, TrainJob, WindowJob, main, split_shards
from eagle3_pipeline.logs import setup_logging


def parse_args(argv: list[str]) -> TrainJob:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--states", nargs="+", required=True, help="hidden_states/{train,validation}/shard-*.safetensors"
    )
    p.add_argument("--vocab-map", required=True, help="draft/vocab_map.safetensors")
    p.add_argument("--target", required=True, help="target weights folder (config.json, model.safetensors)")
    p.add_argument("--work", required=True, help="training state, for resume")
    p.add_argument("--weights", default="", help="output: draft/trained/model.safetensors")
    p.add_argument("--history", default="", help="output: draft/trained/history.json")
    p.add_argument("--window", type=int, nargs=3, metavar=("EPOCH", "WINDOW", "WINDOWS"), help="windowed")
    p.add_argument("--window-plan", help="windowed: draft/windows/plan.json")
    p.add_argument("--window-previous", default="", help="windowed: the previous window's state, if any")
    p.add_argument("--window-state", help="windowed output: this window's state")
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
    if a.window is None and not (a.weights and a.history):
        p.error("--weights and --history are required (or --window with --window-plan/--window-state)")
    if a.window is not None and not (a.window_plan and a.window_state):
        p.error("--window needs --window-plan and --window-state")
    window = None
    if a.window is not None:
        epoch, index, windows = a.window
        window = WindowJob(epoch, index, windows, a.window_plan, a.window_previous or None, a.window_state)
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
        window=window,
    )


if __name__ == "__main__":
    setup_logging(None, "train_draft")  # stderr is the job's log (the rule redirects it)
    main(parse_args(sys.argv[1:]))
