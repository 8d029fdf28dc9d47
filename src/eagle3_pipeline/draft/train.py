"""Draft training: training-time test over the hidden-state shards, launched by accelerate.

    accelerate launch --cpu --num_processes 1 -m eagle3_pipeline.draft JOB.json        # CPU, fp32 (demo)
    accelerate launch --num_processes 1 -m eagle3_pipeline.draft JOB.json              # one GPU, bf16
    accelerate launch --multi_gpu --num_processes 8 -m eagle3_pipeline.draft JOB.json  # DDP over 8 GPUs

The job file is draft/job.py's (written by the rules' thin scripts; eagle3_pipeline.launch).

Each process reads its own share of the batches (data.rank_batches) and DDP averages gradients (with
train.fsdp the draft is sharded over the processes instead: draft/fsdp.py). The
training state (trained weights, optimiser, schedule, position in the epoch, the epoch's training sums
over all processes, history; not the frozen embeddings, which are the target's) is saved atomically
under the work folder every train.save_every_steps steps and at each epoch's end; a run started again
with the same inputs and settings resumes from it, and one with different ones starts afresh.

Memory (docs/training.md): the frozen embeddings and target lm_head are held in the training dtype
(bf16 on GPU); the loss never holds logits for the whole batch (ttt.chunked_ttt_loss); with
train.activation_checkpointing each TTT step's activations are recomputed in the backward pass.

Under a disk cap (hidden_states.max_disk_gb) one job trains one window of shards of one epoch
(`main_window`): it starts from the previous window's state file, trains over the window's batches,
evaluates on the window's validation states (summed over the epoch's windows), and writes its state
file; the learning-rate schedule spans every window of every epoch (draft/window_batches.py). `finish`
turns the last state into the trained weights and history.

With validate.select_every_epochs the weights after each kept epoch (job.checkpoint_epochs) are
written under the work folder as that epoch ends, before the state that says it ended, and linked into
the job's outputs at the end (validate/selection.py chooses among them); a run that starts afresh
clears them first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, set_seed

from eagle3_pipeline import io
from eagle3_pipeline.draft.data import HiddenStateData, plan_batches
from eagle3_pipeline.draft.fsdp import full_state, gathered, load_full_state, wrap_fsdp
from eagle3_pipeline.draft.init_files import checkpoint_files
from eagle3_pipeline.draft.init_from import start_training_from
from eagle3_pipeline.draft.job import TrainJob, draft_identity, draft_shape, train_identity
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.target import load_target_embed_and_head
from eagle3_pipeline.draft.ttt import STAT_ROWS, Batch, chunked_ttt_loss, summarize, target_in_draft
from eagle3_pipeline.draft.vocab import draft_ids, load_vocab_map
from eagle3_pipeline.draft.window_batches import order_key, total_steps
from eagle3_pipeline.draft_config import DraftConfig, draft_config_from_target, read_target_config
from eagle3_pipeline.settings import TrainSettings

log = logging.getLogger(__name__)

# gradients as views into DDP's buckets: no second copy of the trained tensors' gradients (the memory
# census, benchmarks/training.py --census, models DDP's buckets from this)
DDP_KWARGS = DistributedDataParallelKwargs(gradient_as_bucket_view=True)


@dataclass
class TrainState:
    """What a resumed run needs besides the model and optimiser tensors."""

    fingerprint: str
    epoch: int = 0
    batch_in_epoch: int = 0
    step: int = 0
    # running training sums of the epoch under way: this process's in memory, all processes' in a file
    # (restored on the main process; the others restart theirs at zeros: `_restore`)
    epoch_stats: list[list[float]] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    validation_stats: list[list[float]] | None = None  # windowed: validation sums of the epoch's windows
    carried_stats: list[list[float]] | None = None  # windowed: training sums of the epoch's earlier windows


@dataclass
class Context:
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    head: dict[str, torch.Tensor]  # lm_head, t2d, target_head: the frozen target side of the loss
    job: TrainJob


def build_model(
    job: TrainJob, frozen_dtype: torch.dtype | None = None
) -> tuple[Eagle3Draft, dict[str, torch.Tensor]]:
    """The draft (seeded init, target embeddings copied and frozen) and the frozen target head: lm_head
    [V, H] (the in-draft mask), t2d, draft_ids, and target_head = lm_head[draft_ids] [Vd, H] (the loss's
    targets).

    frozen_dtype: the embeddings' and heads' dtype (the training dtype: bf16 on GPU); None keeps the
    embeddings in fp32 and the head as the target stores it.
    """
    target_config = read_target_config(job.target)
    d2t, t2d = load_vocab_map(job.vocab_map)
    config = draft_config_from_target(target_config, len(d2t), **draft_shape(job.draft))
    if config.draft_vocab_size != len(d2t) or len(t2d) != config.vocab_size:
        raise ValueError(
            f"{job.vocab_map} does not fit the target vocabulary ({config.vocab_size}); rebuild it"
        )
    set_seed(job.train.seed)
    model = Eagle3Draft(config, checkpointing=job.train.activation_checkpointing)
    embed, lm_head = load_target_embed_and_head(job.target)
    model.embed_tokens.to(frozen_dtype or torch.float32).weight.data.copy_(embed)
    lm_head = lm_head if frozen_dtype is None else lm_head.to(frozen_dtype)
    ids = draft_ids(d2t)
    head = {"lm_head": lm_head, "t2d": t2d, "draft_ids": ids, "target_head": lm_head[ids]}
    return model, head


def build_optimizer(
    model: torch.nn.Module, train: TrainSettings, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable tensors; linear warmup then cosine decay to zero."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
    warmup = max(1, round(train.warmup_ratio * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def prepare(
    accelerator: Accelerator, model: Eagle3Draft, job: TrainJob, total_steps: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """(model, optimiser, schedule) ready to train: DDP through accelerate, or with train.fsdp over more
    than one process the draft sharded (draft/fsdp.py) before the optimiser is built on its shards.
    The scheduler stays unprepared: accelerate's wrapper would step it once per process."""
    if job.train.fsdp and accelerator.num_processes > 1:
        compute_dtype = _frozen_dtype(accelerator)  # bf16 on GPUs: gathered in bf16, reduced in fp32
        model = wrap_fsdp(model, accelerator.device, compute_dtype)
        optimizer, scheduler = build_optimizer(model, job.train, total_steps)
        log.info(
            "FSDP: trained tensors, gradients and AdamW state sharded over %d processes, gathered in %s",
            accelerator.num_processes,
            compute_dtype or torch.float32,
        )
        return model, optimizer, scheduler
    optimizer, scheduler = build_optimizer(model, job.train, total_steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer, scheduler


def _forward(ctx: Context, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, stats) of one batch: ttt.chunked_ttt_loss over the draft's normed step outputs."""
    batch = batch.to(ctx.accelerator.device)
    head = ctx.head
    in_draft = target_in_draft(batch.final_hidden_states, head["lm_head"], head["t2d"])
    draft = ctx.accelerator.unwrap_model(model)
    with ctx.accelerator.autocast():
        # through the (DDP-)wrapped module's forward: DDP's gradient hooks expect a forward call
        steps, decay = ctx.job.draft.ttt_steps, ctx.job.draft.step_weight_decay
        hidden = model(batch.aux_hidden_states, batch.input_ids, steps, logits=False)
        return chunked_ttt_loss(hidden, draft.lm_head.weight, batch, head["target_head"], in_draft, decay)


def train_epoch(ctx: Context, data: HiddenStateData, state: TrainState, order: int | None = None) -> bool:
    """Train from state.batch_in_epoch to the end of `data`'s batches (in the order of `order`, default
    the epoch); False when stopped early (state saved).

    Afterwards every process holds its sums in state.epoch_stats (zeros where it trained no batch: a run
    resumed from a state saved on the last batch), so every process joins the reduction that follows."""
    acc, train = ctx.accelerator, ctx.job.train
    key = state.epoch if order is None else order
    batches = data.batches(train.seed, key, acc.process_index, acc.num_processes)
    if state.epoch_stats is None:
        state.epoch_stats = _zero_stats(ctx.job.draft.ttt_steps)
    stats = torch.tensor(state.epoch_stats)
    ctx.model.train()
    for b in range(state.batch_in_epoch, len(batches)):
        loss, step_stats = _forward(ctx, ctx.model, data.collate(batches[b]))
        acc.backward(loss)
        acc.clip_grad_norm_(ctx.model.parameters(), train.grad_clip)
        ctx.optimizer.step()
        ctx.scheduler.step()
        ctx.optimizer.zero_grad(set_to_none=True)
        stats = stats + step_stats.cpu()
        state.step, state.batch_in_epoch, state.epoch_stats = state.step + 1, b + 1, stats.tolist()
        if acc.is_main_process and (state.step % 10 == 0 or b == 0):
            log.info(
                "epoch %d step %d loss %.4f lr %.2e",
                state.epoch,
                state.step,
                loss.item(),
                ctx.scheduler.get_last_lr()[0],
            )
        if state.step % train.save_every_steps == 0 or state.step == ctx.job.stop_after_steps:
            save_state(ctx, _with_total_stats(ctx, state))
        if state.step == ctx.job.stop_after_steps:
            return False
    return True


@torch.no_grad()
def validation_sums(ctx: Context, data: HiddenStateData) -> torch.Tensor | None:
    """Validation statistics summed over every process's share (None without validation samples).

    Runs the unwrapped model (no DDP collective in the forward; a sharded one gathered beforehand), so
    processes may hold unequal shares.
    """
    acc = ctx.accelerator
    if len(data) == 0:
        return None
    model = acc.unwrap_model(ctx.model).eval()
    stats = torch.zeros(len(STAT_ROWS), ctx.job.draft.ttt_steps, device=acc.device)
    plan = plan_batches([s.length for s in data.samples], data.batch_tokens, seed=0, epoch=0)
    with gathered(model):  # sharded (train.fsdp): gathered once, so unequal shares need no collective
        for batch in plan[acc.process_index :: acc.num_processes]:
            stats += _forward(ctx, model, data.collate(batch))[1]
    return acc.reduce(stats, reduction="sum")


def evaluate(ctx: Context, data: HiddenStateData) -> dict[str, Any] | None:
    """Validation loss, per-step and conditional accuracy over every process's share, summed."""
    stats = validation_sums(ctx, data)
    return None if stats is None else summarize(stats, ctx.job.draft.step_weight_decay)


def _zero_stats(ttt_steps: int) -> list[list[float]]:
    """Training sums before any batch: [len(STAT_ROWS), ttt_steps] zeros, the shape of a batch's stats."""
    return [[0.0] * ttt_steps for _ in STAT_ROWS]


def _with_total_stats(ctx: Context, state: TrainState) -> TrainState:
    """`state` with the epoch's training sums of every process (a collective: every process calls it),
    as a state file holds them: a resumed run restores them on the main process alone (`_restore`)."""
    acc = ctx.accelerator
    if acc.num_processes == 1 or state.epoch_stats is None:
        return state
    total = acc.reduce(torch.tensor(state.epoch_stats, device=acc.device), reduction="sum")
    return replace(state, epoch_stats=total.cpu().tolist())


def _state_path(job: TrainJob) -> Path:
    return Path(job.work) / "state.pt"


def save_state(ctx: Context, state: TrainState, path: Path | None = None) -> None:
    """Atomically write the training state (main process only; every process calls it, a sharded
    state is gathered), to the work folder by default: what a resume needs, the trained tensors but not
    the frozen embeddings (the target's, loaded anew)."""
    tensors, optimizer = full_state(ctx.accelerator.unwrap_model(ctx.model), ctx.optimizer)
    if not ctx.accelerator.is_main_process:
        return
    path = _state_path(ctx.job) if path is None else Path(path)
    if ctx.job.window is not None:
        # under a disk cap at most two state files exist (planning.state_files.STATE_FILES_AT_ONCE): the
        # previous window's (this job's input) and this window's latest, so the last one goes first; killed
        # before the new one is in place, the window starts again from the previous window's file
        _state_path(ctx.job).unlink(missing_ok=True)
    blob = {
        "state": asdict(state),
        "model": tensors,
        "optimizer": optimizer,
        "scheduler": ctx.scheduler.state_dict(),
    }
    io.write_torch(blob, path)
    log.info("training state saved at step %d (%s)", state.step, path)


def _restore(ctx: Context, blob: dict[str, Any]) -> TrainState:
    """Load a state file's tensors; -> its TrainState. The file's epoch sums are every process's
    (reduced once before the save): the main process carries them on and the others restart theirs at
    zeros of the same shape, so the reduction at the epoch's (or window's) end counts them once, and
    every process holds sums (or none) alike, even when no batch of the epoch is left to train."""
    load_full_state(ctx.accelerator.unwrap_model(ctx.model), ctx.optimizer, blob["model"], blob["optimizer"])
    ctx.scheduler.load_state_dict(blob["scheduler"])
    state = TrainState(**blob["state"])
    if ctx.accelerator.is_main_process or state.epoch_stats is None:
        return state
    return replace(state, epoch_stats=[[0.0] * len(row) for row in state.epoch_stats])


def load_state(ctx: Context, fingerprint: str) -> TrainState:
    """The saved state when it belongs to this run's inputs and settings, else a fresh one."""
    path = _state_path(ctx.job)
    if not path.exists():
        return TrainState(fingerprint)
    blob = torch.load(path, map_location="cpu", weights_only=False)
    if blob["state"]["fingerprint"] != fingerprint:
        log.warning("%s was saved for other inputs or settings: starting afresh", path)
        return TrainState(fingerprint)
    state = _restore(ctx, blob)
    log.info("resuming at epoch %d, step %d from %s", state.epoch, state.step, path)
    return state


def fingerprint(job: TrainJob) -> str:
    """Identity of what the training result depends on: settings and input files (name, size, mtime)."""
    files = [*job.train_shards, *job.validation_shards, job.vocab_map]
    files += checkpoint_files(job.draft.init_from) if job.draft.init_from else []  # the starting draft
    if job.window is not None:  # the window's place and the state it starts from
        files += [f for f in (job.window.plan, job.window.previous) if f]
    stamp = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    if job.window is not None:
        stamp.append(("window", job.window.epoch, job.window.window, job.window.windows))
    identity = [stamp, draft_identity(job.draft), train_identity(job.train), job.target]
    if job.checkpoint_epochs:  # a resume keeps the epochs it kept: another choice starts afresh
        identity.append(job.checkpoint_epochs)
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def save_outputs(ctx: Context, config: DraftConfig, history: list[dict[str, Any]]) -> None:
    """Trained tensors (checkpoint names, fp32) and history.json, written atomically by the main process
    (every process calls it: a sharded draft is gathered)."""
    tensors, _ = full_state(ctx.accelerator.unwrap_model(ctx.model), ctx.optimizer)
    if ctx.accelerator.is_main_process:
        write_outputs(tensors, ctx.job, config, history)


def write_weights(trained: dict[str, torch.Tensor], config: DraftConfig, path: str | Path) -> None:
    """Trained tensors (checkpoint names, fp32) with the draft's config, as export_draft reads them."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in trained.items()}
    io.write_safetensors(tensors, path, metadata={"draft_config": json.dumps(config.to_dict())})


def write_outputs(
    trained: dict[str, torch.Tensor], job: TrainJob, config: DraftConfig, history: list[dict[str, Any]]
) -> None:
    """The trained tensors and history.json of `job`, written atomically; the kept epochs' weights
    linked from the work folder into their outputs."""
    write_weights(trained, config, job.weights)
    io.write_json(history, job.history, indent=1)
    for epoch, output in zip(job.checkpoint_epochs, job.checkpoints, strict=True):
        kept = _epoch_path(job, epoch)
        if not kept.exists():
            raise FileNotFoundError(
                f"{kept}: the weights of epoch {epoch} were not kept; delete {job.work} and rerun"
            )
        with io.atomic_path(output) as tmp:
            try:
                os.link(kept, tmp)  # no second copy of a large draft
            except OSError:
                shutil.copyfile(kept, tmp)


def _epoch_path(job: TrainJob, epoch: int) -> Path:
    return Path(job.work) / "epochs" / f"epoch-{epoch:03d}.safetensors"


def keep_epoch(ctx: Context, epoch: int) -> None:
    """The weights after `epoch` under the work folder, when it is a kept one (every process calls it:
    a sharded draft is gathered; the main process writes)."""
    if epoch not in ctx.job.checkpoint_epochs:
        return
    model = ctx.accelerator.unwrap_model(ctx.model)
    tensors, _ = full_state(model, ctx.optimizer)
    if ctx.accelerator.is_main_process:
        write_weights(tensors, model.config, _epoch_path(ctx.job, epoch))
        log.info("weights of epoch %d kept (%s)", epoch, _epoch_path(ctx.job, epoch))


def clear_kept_epochs(ctx: Context, state: TrainState) -> None:
    """A run starting afresh drops the kept weights of an earlier one (main process)."""
    if ctx.accelerator.is_main_process and state.step == 0 and state.epoch == 0:
        shutil.rmtree(Path(ctx.job.work) / "epochs", ignore_errors=True)


def _accelerator(job: TrainJob) -> Accelerator:
    use_gpu = torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "").lower() not in (
        "1",
        "true",
    )
    if not use_gpu and job.cpu_threads > 0:
        torch.set_num_threads(job.cpu_threads)  # more threads than free cores slows OpenMP ops many-fold
    return Accelerator(
        cpu=not use_gpu, mixed_precision="bf16" if use_gpu else "no", kwargs_handlers=[DDP_KWARGS]
    )


def _frozen_dtype(accelerator: Accelerator) -> torch.dtype | None:
    """The frozen tensors' dtype: bf16 under bf16 mixed precision (GPU), else as loaded (CPU, fp32)."""
    return torch.bfloat16 if accelerator.mixed_precision == "bf16" else None


def main(job: TrainJob) -> bool:
    """Train (or resume) to the end; True when finished and the outputs are written."""
    if job.window is not None:
        return main_window(job)
    accelerator = _accelerator(job)
    model, head = build_model(job, _frozen_dtype(accelerator))
    start_training_from(model, job.draft.init_from, head["draft_ids"], job.train_shards[0])  # draft.init_from
    train_data = HiddenStateData(job.train_shards, job.train.batch_tokens)
    validation_data = HiddenStateData(job.validation_shards, job.train.batch_tokens)
    per_epoch = len(
        train_data.batches(job.train.seed, 0, accelerator.process_index, accelerator.num_processes)
    )
    model, optimizer, scheduler = prepare(accelerator, model, job, per_epoch * job.train.epochs)
    head = {k: v.to(accelerator.device) for k, v in head.items()}
    ctx = Context(accelerator, model, optimizer, scheduler, head, job)
    state = load_state(ctx, fingerprint(job))
    clear_kept_epochs(ctx, state)
    log.info(
        "%d training samples, %d batches per epoch per process; %d validation samples",
        len(train_data),
        per_epoch,
        len(validation_data),
    )
    while state.epoch < job.train.epochs:
        if not train_epoch(ctx, train_data, state):
            return False
        train_stats = accelerator.reduce(
            torch.tensor(state.epoch_stats, device=accelerator.device), reduction="sum"
        )
        record = {"epoch": state.epoch, "step": state.step, "lr": scheduler.get_last_lr()[0]}
        record |= {
            "train": summarize(train_stats, job.draft.step_weight_decay),
            "validation": evaluate(ctx, validation_data),
        }
        log.info("epoch %d: %s", state.epoch, json.dumps(record))
        state.history.append(record)
        keep_epoch(ctx, state.epoch)  # before the state that says the epoch ended
        state.epoch, state.batch_in_epoch, state.epoch_stats = state.epoch + 1, 0, None
        save_state(ctx, state)
    save_outputs(ctx, accelerator.unwrap_model(model).config, state.history)
    accelerator.wait_for_everyone()
    return True


def _start_window(ctx: Context, job: TrainJob, fingerprint_: str) -> TrainState:
    """Resume this window from the work folder when it was interrupted, else start from the previous
    window's state file (or afresh for the first window of the first epoch)."""
    state = load_state(ctx, fingerprint_)
    if state.step or state.batch_in_epoch or job.window is None or not job.window.previous:
        return state
    blob = torch.load(job.window.previous, map_location="cpu", weights_only=False)
    state = _restore(ctx, blob)
    state.fingerprint = fingerprint_
    # the earlier windows' training sums are all processes' (reduced): carried apart from this window's
    state.carried_stats, state.epoch_stats = state.epoch_stats, None
    log.info("window starts from %s (epoch %d, step %d)", job.window.previous, state.epoch, state.step)
    return state


def main_window(job: TrainJob) -> bool:
    """Train one window of one epoch, from the previous window's state; write this window's state.

    The window's batches are those of its shards alone, in an order seeded by (epoch, window). After
    them the window's validation samples are evaluated and summed into the epoch's validation figures;
    the epoch's history record is written by its last window. True when the state file is written.
    """
    window = job.window
    if window is None:
        raise ValueError("main_window needs job.window")
    accelerator = _accelerator(job)
    model, head = build_model(job, _frozen_dtype(accelerator))
    if not window.previous:  # draft.init_from: the first window starts from it, the others from a state
        start_training_from(model, job.draft.init_from, head["draft_ids"], job.train_shards[0])
    train_data = HiddenStateData(job.train_shards, job.train.batch_tokens)
    validation_data = HiddenStateData(job.validation_shards, job.train.batch_tokens)
    model, optimizer, scheduler = prepare(
        accelerator, model, job, total_steps(window.plan, accelerator.num_processes)
    )
    head = {k: v.to(accelerator.device) for k, v in head.items()}
    ctx = Context(accelerator, model, optimizer, scheduler, head, job)
    state = _start_window(ctx, job, fingerprint(job))
    clear_kept_epochs(ctx, state)
    if state.epoch != window.epoch:
        raise ValueError(
            f"{window.previous} ends in epoch {state.epoch}, not {window.epoch}: delete the draft/windows "
            "state files and rerun snakemake"
        )
    order = order_key(window.epoch, window.window)
    check_planned_batches(
        window.plan,
        window.epoch,
        window.window,
        len(train_data.batches(job.train.seed, order)),
        window.shards,
    )
    log.info(
        "epoch %d window %d/%d: %d training samples (%d batches per process), %d validation samples",
        window.epoch,
        window.window + 1,
        window.windows,
        len(train_data),
        len(train_data.batches(job.train.seed, order, accelerator.process_index, accelerator.num_processes)),
        len(validation_data),
    )
    if len(train_data) and not train_epoch(ctx, train_data, state, order):
        return False
    validation = validation_sums(ctx, validation_data)
    if validation is not None:
        summed = (
            validation
            if state.validation_stats is None
            else validation.cpu() + torch.tensor(state.validation_stats)
        )
        state.validation_stats = summed.cpu().tolist()
    # this window's sums, all processes, added to the earlier windows': a collective, so the branch is
    # decided on what every process shares (train_epoch leaves sums on every process, zeros included)
    if len(train_data):
        window_stats = accelerator.reduce(torch.tensor(state.epoch_stats, device=accelerator.device), "sum")
        carried = torch.tensor(state.carried_stats) if state.carried_stats else 0
        state.epoch_stats = (window_stats.cpu() + carried).tolist()
    else:
        state.epoch_stats = state.carried_stats
    state.carried_stats = None
    if window.window == window.windows - 1:
        decay = job.draft.step_weight_decay
        train_stats = torch.tensor(state.epoch_stats) if state.epoch_stats else None
        record = {"epoch": state.epoch, "step": state.step, "lr": scheduler.get_last_lr()[0]}
        record |= {
            "train": None if train_stats is None else summarize(train_stats, decay),
            "validation": None
            if state.validation_stats is None
            else summarize(torch.tensor(state.validation_stats), decay),
        }
        log.info("epoch %d: %s", state.epoch, json.dumps(record))
        state.history.append(record)
        keep_epoch(ctx, state.epoch)
        state.epoch, state.epoch_stats, state.validation_stats = state.epoch + 1, None, None
    state.batch_in_epoch = 0
    save_state(ctx, state, Path(window.state))
    accelerator.wait_for_everyone()
    return True


def check_planned_batches(
    plan_path: str | Path, epoch: int, window: int, batches: int, shards: list[str]
) -> None:
    """The window's shards (ids) are those the plan assigned it, and its batches (all processes) are
    those plan_windows counted for it, on which the learning-rate schedule's length rests.

    Raises:
        ValueError: they differ (the stored states are not the lengths the traces gave, or the window's
            states are not the plan's shards).
    """
    plan = json.loads(Path(plan_path).read_text())
    if sorted(shards) != sorted(plan["windows"][epoch][window]):
        raise ValueError(
            f"epoch {epoch} window {window}: states of shards {sorted(shards)}, but {plan_path} assigned "
            f"{plan['windows'][epoch][window]} to it (was train.seed or dataset.num_samples changed after "
            "the plan?) Delete the draft/windows folder and rerun snakemake"
        )
    planned = plan["batches"][epoch][window]
    if planned != batches:
        raise ValueError(
            f"epoch {epoch} window {window}: {batches} batches from the stored hidden states, but "
            f"{plan_path} planned {planned} from the traces' token ids, so the learning-rate schedule "
            "would not end where planned; were the traces or hidden_states.max_seq_len changed after the "
            "plan? Delete the draft/windows folder and rerun snakemake"
        )


def finish(job: TrainJob, state_path: str | Path) -> None:
    """The trained weights and history.json from the last window's state file (no training)."""
    model, _ = build_model(job)
    blob = torch.load(state_path, map_location="cpu", weights_only=False)
    model.load_trained(blob["model"])
    write_outputs(model.exported_state_dict(), job, model.config, blob["state"]["history"])
    log.info("trained draft written from %s (%d epochs)", state_path, len(blob["state"]["history"]))
