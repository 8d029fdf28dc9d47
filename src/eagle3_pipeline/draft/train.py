"""Draft training: training-time test over the hidden-state shards, launched by accelerate.

    accelerate launch --cpu --num_processes 1 scripts/train_draft.py ...        # CPU, fp32 (the demo)
    accelerate launch --num_processes 1 scripts/train_draft.py ...              # one GPU, bf16 autocast
    accelerate launch --multi_gpu --num_processes 8 scripts/train_draft.py ...  # DDP over 8 GPUs

Each process reads its own share of the batches (data.rank_batches) and DDP averages gradients. The
training state (weights, optimiser, schedule, position in the epoch, history) is saved atomically under
the work folder every train.save_every_steps steps and at each epoch's end; a run started again with
the same inputs and settings resumes from it, and one with different ones starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from safetensors.torch import save_file

from eagle3_pipeline.draft.config import DraftConfig, draft_config_from_target, read_target_config
from eagle3_pipeline.draft.data import HiddenStateData, plan_batches
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.target import load_target_embed_and_head
from eagle3_pipeline.draft.ttt import STAT_ROWS, Batch, summarize, target_distribution, ttt_loss
from eagle3_pipeline.draft.vocab import draft_ids, load_vocab_map

log = logging.getLogger(__name__)

DRAFT_SHAPE_KEYS = ("head_dim", "num_attention_heads", "num_key_value_heads")  # config draft.*, None: default


@dataclass
class TrainJob:
    """Everything one training run reads and writes (the rule's inputs, params and outputs)."""

    train_shards: list[str]
    validation_shards: list[str]
    vocab_map: str
    target: str  # the target model folder
    draft: dict[str, Any]  # config draft.* (ttt_steps, step_weight_decay; the DRAFT_SHAPE_KEYS when set)
    train: dict[str, Any]  # config train.*
    work: str
    weights: str  # output: trained tensors
    history: str  # output: per-epoch metrics
    stop_after_steps: int | None = None  # stop (state saved) after this many steps: an interruption
    cpu_threads: int = 0  # torch threads on CPU (0: torch's default); see docs/training.md


@dataclass
class TrainState:
    """What a resumed run needs besides the model and optimiser tensors."""

    fingerprint: str
    epoch: int = 0
    batch_in_epoch: int = 0
    step: int = 0
    epoch_stats: list[list[float]] | None = None  # running training sums of the epoch under way
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Context:
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    head: dict[str, torch.Tensor]  # lm_head, t2d, draft_ids: the frozen target side of the loss
    job: TrainJob


def split_shards(paths: list[str]) -> tuple[list[str], list[str]]:
    """(train, validation) shard paths, by their split folder (hidden_states/{split}/shard-*.safetensors)."""
    train = [p for p in paths if Path(p).parent.name == "train"]
    validation = [p for p in paths if Path(p).parent.name == "validation"]
    other = sorted(set(paths) - set(train) - set(validation))
    if other or not train:
        raise ValueError(
            f"hidden-state shards must sit under train/ or validation/ (train: {len(train)}, other: {other})"
        )
    return train, validation


def build_model(job: TrainJob) -> tuple[Eagle3Draft, dict[str, torch.Tensor]]:
    """The draft (seeded init, target embeddings copied and frozen) and the frozen target head."""
    target_config = read_target_config(job.target)
    d2t, t2d = load_vocab_map(job.vocab_map)
    shape = {k: job.draft.get(k) for k in DRAFT_SHAPE_KEYS}
    config = draft_config_from_target(target_config, len(d2t), **shape)
    if config.draft_vocab_size != len(d2t) or len(t2d) != config.vocab_size:
        raise ValueError(
            f"{job.vocab_map} does not fit the target vocabulary ({config.vocab_size}); rebuild it"
        )
    set_seed(int(job.train["seed"]))
    model = Eagle3Draft(config)
    embed, lm_head = load_target_embed_and_head(job.target)
    model.embed_tokens.weight.data.copy_(embed.float())
    head = {"lm_head": lm_head, "t2d": t2d, "draft_ids": draft_ids(d2t)}
    return model, head


def build_optimizer(
    model: torch.nn.Module, train: dict[str, Any], total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable tensors; linear warmup then cosine decay to zero."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=float(train["lr"]), weight_decay=float(train["weight_decay"]))
    warmup = max(1, round(float(train["warmup_ratio"]) * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _forward(ctx: Context, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    batch = batch.to(ctx.accelerator.device)
    probs, in_draft = target_distribution(batch.final_hidden_states, **ctx.head)
    with ctx.accelerator.autocast():
        logits = model(batch.aux_hidden_states, batch.input_ids, int(ctx.job.draft["ttt_steps"]))
    return ttt_loss(logits, batch, probs, in_draft, float(ctx.job.draft["step_weight_decay"]))


def train_epoch(ctx: Context, data: HiddenStateData, state: TrainState) -> bool:
    """Train from state.batch_in_epoch to the epoch's end; False when stopped early (state saved)."""
    acc, train = ctx.accelerator, ctx.job.train
    batches = data.batches(int(train["seed"]), state.epoch, acc.process_index, acc.num_processes)
    stats = torch.tensor(state.epoch_stats) if state.epoch_stats else None
    ctx.model.train()
    for b in range(state.batch_in_epoch, len(batches)):
        loss, step_stats = _forward(ctx, ctx.model, data.collate(batches[b]))
        acc.backward(loss)
        acc.clip_grad_norm_(ctx.model.parameters(), float(train["grad_clip"]))
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad(set_to_none=True)
        stats = step_stats.cpu() if stats is None else stats + step_stats.cpu()
        state.step, state.batch_in_epoch, state.epoch_stats = state.step + 1, b + 1, stats.tolist()
        if acc.is_main_process and (state.step % 10 == 0 or b == 0):
            log.info(
                "epoch %d step %d loss %.4f lr %.2e",
                state.epoch,
                state.step,
                loss.item(),
                ctx.scheduler.get_last_lr()[0],
            )
        if state.step % int(train["save_every_steps"]) == 0 or state.step == ctx.job.stop_after_steps:
            save_state(ctx, state)
        if state.step == ctx.job.stop_after_steps:
            return False
    return True


@torch.no_grad()
def evaluate(ctx: Context, data: HiddenStateData) -> dict[str, Any] | None:
    """Validation loss, per-step and conditional accuracy over every process's share, summed.

    Runs the unwrapped model (no DDP collective in the forward), so processes may hold unequal shares.
    """
    acc = ctx.accelerator
    if len(data) == 0:
        return None
    model = acc.unwrap_model(ctx.model).eval()
    stats = torch.zeros(len(STAT_ROWS), int(ctx.job.draft["ttt_steps"]), device=acc.device)
    plan = plan_batches([s.length for s in data.samples], data.batch_tokens, seed=0, epoch=0)
    for batch in plan[acc.process_index :: acc.num_processes]:
        stats += _forward(ctx, model, data.collate(batch))[1]
    stats = acc.reduce(stats, reduction="sum")
    return summarize(stats, float(ctx.job.draft["step_weight_decay"]))


def _state_path(job: TrainJob) -> Path:
    return Path(job.work) / "state.pt"


def save_state(ctx: Context, state: TrainState) -> None:
    """Atomically write the training state (main process only)."""
    if not ctx.accelerator.is_main_process:
        return
    path = _state_path(ctx.job)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "state": asdict(state),
        "model": ctx.accelerator.unwrap_model(ctx.model).state_dict(),
        "optimizer": ctx.optimizer.state_dict(),
        "scheduler": ctx.scheduler.state_dict(),
    }
    torch.save(blob, path.with_suffix(".tmp"))
    os.replace(path.with_suffix(".tmp"), path)
    log.info("training state saved at step %d (%s)", state.step, path)


def load_state(ctx: Context, fingerprint: str) -> TrainState:
    """The saved state when it belongs to this run's inputs and settings, else a fresh one."""
    path = _state_path(ctx.job)
    if not path.exists():
        return TrainState(fingerprint)
    blob = torch.load(path, map_location="cpu", weights_only=False)
    if blob["state"]["fingerprint"] != fingerprint:
        log.warning("%s was saved for other inputs or settings: starting afresh", path)
        return TrainState(fingerprint)
    ctx.accelerator.unwrap_model(ctx.model).load_state_dict(blob["model"])
    ctx.optimizer.load_state_dict(blob["optimizer"])
    ctx.scheduler.load_state_dict(blob["scheduler"])
    state = TrainState(**blob["state"])
    log.info("resuming at epoch %d, step %d from %s", state.epoch, state.step, path)
    return state


def fingerprint(job: TrainJob) -> str:
    """Identity of what the training result depends on: settings and input files (name, size, mtime)."""
    files = [*job.train_shards, *job.validation_shards, job.vocab_map]
    stamp = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    settings = {k: v for k, v in job.train.items() if k != "save_every_steps"}
    text = json.dumps([stamp, job.draft, settings, job.target], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def save_outputs(ctx: Context, config: DraftConfig, history: list[dict[str, Any]]) -> None:
    """Trained tensors (checkpoint names, fp32) and history.json, written atomically."""
    model = ctx.accelerator.unwrap_model(ctx.model)
    weights, history_path = Path(ctx.job.weights), Path(ctx.job.history)
    weights.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.exported_state_dict().items()}
    save_file(tensors, str(weights) + ".tmp", metadata={"draft_config": json.dumps(config.to_dict())})
    os.replace(str(weights) + ".tmp", weights)
    history_path.write_text(json.dumps(history, indent=1) + "\n")


def main(job: TrainJob) -> bool:
    """Train (or resume) to the end; True when finished and the outputs are written."""
    use_gpu = torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in (
        "1",
        "true",
    )
    accelerator = Accelerator(cpu=not use_gpu, mixed_precision="bf16" if use_gpu else "no")
    if not use_gpu and job.cpu_threads > 0:
        torch.set_num_threads(job.cpu_threads)  # more threads than free cores slows OpenMP ops many-fold
    model, head = build_model(job)
    train_data = HiddenStateData(job.train_shards, int(job.train["batch_tokens"]))
    validation_data = HiddenStateData(job.validation_shards, int(job.train["batch_tokens"]))
    per_epoch = len(
        train_data.batches(int(job.train["seed"]), 0, accelerator.process_index, accelerator.num_processes)
    )
    optimizer, scheduler = build_optimizer(model, job.train, per_epoch * int(job.train["epochs"]))
    # the scheduler stays unprepared: accelerate's wrapper would step it once per process
    model, optimizer = accelerator.prepare(model, optimizer)
    head = {k: v.to(accelerator.device) for k, v in head.items()}
    ctx = Context(accelerator, model, optimizer, scheduler, head, job)
    state = load_state(ctx, fingerprint(job))
    log.info(
        "%d training samples, %d batches per epoch per process; %d validation samples",
        len(train_data),
        per_epoch,
        len(validation_data),
    )
    while state.epoch < int(job.train["epochs"]):
        if not train_epoch(ctx, train_data, state):
            return False
        train_stats = accelerator.reduce(
            torch.tensor(state.epoch_stats, device=accelerator.device), reduction="sum"
        )
        record = {"epoch": state.epoch, "step": state.step, "lr": scheduler.get_last_lr()[0]}
        record |= {
            "train": summarize(train_stats, float(job.draft["step_weight_decay"])),
            "validation": evaluate(ctx, validation_data),
        }
        log.info("epoch %d: %s", state.epoch, json.dumps(record))
        state.history.append(record)
        state.epoch, state.batch_in_epoch, state.epoch_stats = state.epoch + 1, 0, None
        save_state(ctx, state)
    if accelerator.is_main_process:
        save_outputs(ctx, accelerator.unwrap_model(model).config, state.history)
    accelerator.wait_for_everyone()
    return True
