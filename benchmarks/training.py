"""Draft training speed: tokens/s and step time beside the step's FLOPs at this machine's matmul rate.

One run measures, side by side and for each torch thread count: square-matmul GFLOP/s in fp32 and
bf16 (the machine's ceiling for a FLOP-bound step), then full TTT training steps (target
distribution, draft forward over all steps, loss, backward, clip, AdamW) on a synthetic batch, in
fp32 and under bf16 autocast. For each it prints the step's forward+backward FLOPs, the time those
FLOPs would take at the measured matmul rate, and the measured step time: their ratio is the
fraction of the machine the training step uses.

FLOPs counted (2 per multiply-add; backward = 2x forward for trained matmuls, 1x for fc, whose input
needs no gradient; the target head once, no gradient; attention: a T x T block per step plus one
diagonal per earlier step, as the dense reference computes it; the linear-memory form computes half
the causal block but recomputes it in the backward pass).

`--memory` instead measures the peak memory and time of one training step (forward and backward over
`--ttt-steps` steps, one sequence of T tokens) for T = `--lengths`, with the linear-memory TTT attention
and with the dense reference side by side. Each point runs in its own process (torch's CPU allocator
is invisible to tracemalloc): the process's peak resident set (getrusage maxrss) after the step(s),
minus the same before the first step, is the step's peak memory; the time is that of a second, warm
step up to T = 2,048, of the only step beyond (minutes each on 2 cores). A
dense point whose projection from the previous length (x4 per doubling) exceeds `--max-dense-gb` is
not run and printed as skipped, with the projection.

`--census` runs the real training step (the path train.py runs: chunked loss, each TTT step
checkpointed, frozen tensors in bf16; and today's former path beside it: whole-batch fp32 targets and
logits, nothing checkpointed, the frozen embeddings in fp32, DDP's gradient buckets) at a reduced shape
on the CPU under bf16 autocast, records every tensor allocation and free, and replays them at the named
shape (`--shape kimi`: the Kimi-K2.5 example's width, vocabularies, 7 TTT steps and train.batch_tokens
16,384; benchmarks/memory_census.py explains the method). One JSON line per path with
`peak_gib_per_gpu`, its breakdown and the batch_tokens assumed, DDP's gradient buckets counted as
train.DDP_KWARGS configures them (Census.ddp_peak), and first one for train.py's path with train.fsdp
over `--gpus` processes (default 8): the step run on a bf16 copy of the draft as FSDP2's bf16 policy
gathers it (path fsdp_bf16), its timeline replayed with the fp32 weights, AdamW state and reduced
gradients sharded (Census.sharded_peak), beside it the same without the policy and DDP's; then the
demo shape tracked directly beside its replay from the reduced shape (a check of the method), and the
peak against T (the step alone, without DDP's buckets). `--draft deepseek_mla` takes the census with the
MLA draft (draft.architecture deepseek_mla: the Kimi target's q/kv LoRA 1,536 / 512, nope 128, rope 64,
values 128, 64 heads; memory_census.KIMI_MLA, replayed from REDUCED_MLA).

`--shape kimi` (without --census) runs one training step at the real Kimi-K2.5 draft shape (H 7,168,
64 heads of 128, MLP 18,432, vocabulary 163,840, draft vocabulary 32,000, T 10,240, 7 TTT steps, bf16
autocast, `--checkpointing` as train.activation_checkpointing) on
the first CUDA device and prints its peak GPU memory (torch.cuda.max_memory_allocated) and step time.

    .venv/bin/python benchmarks/training.py                       # demo shape (H 128, 2 x 64 heads)
    .venv/bin/python benchmarks/training.py --hidden 1024 --heads 8 --intermediate 2816 --vocab 32000
    .venv/bin/python benchmarks/training.py --memory              # H 256, 8 heads, T 1k..8k, 7 steps
    .venv/bin/python benchmarks/training.py --census --shape kimi # no GPU: peak per GPU, breakdown
    .venv/bin/python benchmarks/training.py --census --shape kimi --draft deepseek_mla  # the MLA draft's
    .venv/bin/python benchmarks/training.py --shape kimi          # needs a GPU (about 80 GB)
Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

import torch
from memory_census import (
    KIMI,
    KIMI_MLA,
    REDUCED,
    REDUCED_MLA,
    Census,
    Scaler,
    Shape,
    block_rows,
    census_blocks,
    gib,
    run_census,
)
from ttt_reference import target_distribution, ttt_attention_dense, ttt_loss

from eagle3_pipeline.draft.attention import ttt_attention
from eagle3_pipeline.draft.model import Eagle3Draft
from eagle3_pipeline.draft.train import DDP_KWARGS
from eagle3_pipeline.draft.ttt import Batch, chunked_ttt_loss, target_in_draft
from eagle3_pipeline.draft_config import DraftConfig

log = logging.getLogger("benchmarks.training")
# --attention: the form the draft trains with, or the dense reference (ttt_reference.py)
ATTENTION = {"linear": ttt_attention, "dense": ttt_attention_dense}


def emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def matmul_gflops(dtype: torch.dtype, n: int, seconds: float = 2.0) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e9


def step_flops(c: DraftConfig, batch: int, seq: int, steps: int) -> dict[str, float]:
    """Forward and backward FLOPs of one TTT training step on `batch` rows of `seq` tokens."""
    tokens = batch * seq
    h, q_width, kv_width = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
    )
    per_step = 2 * tokens * (2 * h * (q_width + 2 * kv_width) + q_width * h + 3 * h * c.intermediate_size)
    per_step += 2 * tokens * h * c.draft_vocab_size  # lm_head
    attention = sum(2 * 2 * tokens * q_width * (seq + k) for k in range(steps))  # QK^T and PV
    fc = 2 * tokens * 3 * c.target_hidden_size * h
    target_head = 2 * tokens * h * c.vocab_size
    forward = fc + steps * per_step + attention
    backward = fc + 2 * (steps * per_step + attention)
    return {"forward": forward + target_head, "backward": backward, "total": forward + backward + target_head}


def synthetic_batch(c: DraftConfig, batch: int, seq: int) -> Batch:
    generator = torch.Generator().manual_seed(0)
    return Batch(
        input_ids=torch.randint(0, c.vocab_size, (batch, seq), generator=generator),
        loss_mask=torch.ones(batch, seq, dtype=torch.bool),
        aux_hidden_states=torch.randn(batch, seq, 3 * c.target_hidden_size, generator=generator).bfloat16(),
        final_hidden_states=torch.randn(batch, seq, c.hidden_size, generator=generator).bfloat16(),
        has_final=torch.ones(batch, seq, dtype=torch.bool),
    )


def time_training(c: DraftConfig, batch: int, seq: int, steps: int, bf16: bool, repeats: int) -> float:
    """Median seconds per training step (after one warm-up step)."""
    torch.manual_seed(0)
    model = Eagle3Draft(c)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    lm_head = torch.randn(c.vocab_size, c.hidden_size)
    t2d = torch.ones(c.vocab_size, dtype=torch.bool)
    ids = torch.arange(c.draft_vocab_size)
    data = synthetic_batch(c, batch, seq)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        probs, in_draft = target_distribution(data.final_hidden_states, lm_head, t2d, ids)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()
        with autocast:
            logits = model(data.aux_hidden_states, data.input_ids, steps)
        loss, _ = ttt_loss(logits, data, probs, in_draft, 0.8)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def draft_shape(a: argparse.Namespace) -> DraftConfig:
    return DraftConfig(
        hidden_size=a.hidden, target_hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_attention_heads=a.heads, num_key_value_heads=a.heads, head_dim=a.head_dim or a.hidden // a.heads,
        rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=max(8192, a.seq), vocab_size=a.vocab,
        draft_vocab_size=a.draft_vocab or a.vocab,
    )  # fmt: skip


def training_loss(model: Eagle3Draft, data: Batch, head: dict, steps: int) -> torch.Tensor:
    """The loss as train.py computes it: in-draft mask, normed step outputs, chunked soft cross-entropy."""
    in_draft = target_in_draft(data.final_hidden_states, head["lm_head"], head["t2d"])
    hidden = model(data.aux_hidden_states, data.input_ids, steps, logits=False)
    return chunked_ttt_loss(hidden, model.lm_head.weight, data, head["target_head"], in_draft, 0.8)[0]


def reference_loss(model: Eagle3Draft, data: Batch, head: dict, steps: int) -> torch.Tensor:
    """The former path: [B, T, Vd] fp32 target probabilities and every step's logits."""
    frozen = head["lm_head"], head["t2d"], head["draft_ids"]
    probs, in_draft = target_distribution(data.final_hidden_states, *frozen)
    return ttt_loss(model(data.aux_hidden_states, data.input_ids, steps), data, probs, in_draft, 0.8)[0]


def one_step(model: Eagle3Draft, data: Batch, head: dict, steps: int, bf16: bool) -> float:
    """Seconds of one training step as train.py runs it: in-draft mask, forward over `steps`, loss,
    backward."""
    start = time.perf_counter()
    device = data.input_ids.device.type
    with torch.autocast(device, dtype=torch.bfloat16) if bf16 else nullcontext():
        loss = training_loss(model, data, head, steps)
    loss.backward()
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def frozen_head(c: DraftConfig, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """A random target head as train.build_model hands it over (lm_head, t2d, draft_ids, target_head)."""
    lm_head = torch.randn(c.vocab_size, c.hidden_size, dtype=dtype, device=device)
    ids = torch.arange(c.draft_vocab_size, device=device)
    t2d = torch.ones(c.vocab_size, dtype=torch.bool, device=device)
    return {"lm_head": lm_head, "t2d": t2d, "draft_ids": ids, "target_head": lm_head[ids]}


def census_setup(shape: Shape, path: str) -> Callable[[Census], Callable[[str], None]]:
    """The census's training step at `shape` (memory_census.run_census): path "training" is train.py's
    on a GPU (chunked loss, checkpointed steps, frozen tensors in bf16), "fsdp_bf16" the same under
    train.fsdp's mixed-precision policy (below), "former" the path before them.

    "fsdp_bf16" runs the step on a bf16 copy of the draft, as FSDP2 with MixedPrecisionPolicy(bf16,
    fp32) gathers it (draft/fsdp.py): bf16 gradients from the backward pass, cast to fp32 into the
    reduce-scatter's input, the fp32 result the gradients of the fp32 weights AdamW steps on, and the
    copy refreshed from them (the next step's gathering)."""

    def setup(census: Census) -> Callable[[str], None]:
        c = census_config(shape)
        torch.manual_seed(0)
        former = path == "former"
        model = Eagle3Draft(c, checkpointing=not former)
        model.embed_tokens.to(torch.float32 if former else torch.bfloat16)
        head = frozen_head(c, torch.bfloat16, torch.device("cpu"))
        data = synthetic_batch(c, 1, shape.seq)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=True)  # foreach: as on a GPU
        for p in model.parameters():
            census.track(p.data, "trainable" if p.requires_grad else "frozen")
        for tensor in head.values():
            census.track(tensor, "frozen")
        for tensor in vars(data).values():
            census.track(tensor, "batch")
        gathered = copy.deepcopy(model).to(torch.bfloat16) if path == "fsdp_bf16" else model
        computed = [p for p in gathered.parameters() if p.requires_grad]
        for p in computed:
            if gathered is not model:
                census.track(p.data, "gathered_weights")
            p.register_post_accumulate_grad_hook(lambda p: census.accumulated(p.grad))
        loss_of = reference_loss if former else training_loss

        def step(_: str) -> None:
            gc.collect()  # tensors in reference cycles are freed now, not at an arbitrary later point
            census.phase = "activations"
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(gathered, data, head, shape.steps)
            census.phase = "backward"
            loss.backward()
            del loss
            gc.collect()
            if gathered is not model:
                reduce_scatter(census, computed, trainable)
            census.phase = "optimizer_step"
            torch.nn.utils.clip_grad_norm_(trainable, 0.5)
            optimizer.step()
            for state in optimizer.state.values():
                for value in state.values():
                    if value.dim():
                        census.track(value, "optimizer_state")
            optimizer.zero_grad(set_to_none=True)
            if gathered is not model:
                with torch.no_grad():
                    for copy_, p in zip(computed, trainable, strict=True):
                        copy_.copy_(p)

        return step

    return setup


def reduce_scatter(census: Census, computed: list[torch.Tensor], trainable: list[torch.Tensor]) -> None:
    """FSDP2's reduction after the backward pass (foreach_reduce), as the census replays it: every bf16
    gradient cast into the fp32 input of the reduce-scatter, the bf16 ones freed, the result (a shard
    per process; whole here, scaled by Census.sharded_peak) the fp32 weights' gradients."""
    census.phase = "reduce"
    inputs = [p.grad.float() for p in computed]
    for tensor in inputs:
        census.track(tensor, "reduce_scatter")
    for p in computed:
        p.grad = None
    for p, tensor in zip(trainable, inputs, strict=True):
        p.grad = tensor.clone()
        census.track(p.grad, "sharded_grads")
    del inputs
    gc.collect()


def census_config(shape: Shape) -> DraftConfig:
    """The draft at a census shape (Llama, or MLA with Kimi-K2's YaRN rope when shape.mla is set)."""
    mla = {}
    if shape.mla is not None:
        names = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        yarn = {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096}
        yarn |= {"beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
        mla = dict(zip(names, shape.mla, strict=True)) | {"rope_scaling": yarn}
    return DraftConfig(
        hidden_size=shape.hidden, target_hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads, num_key_value_heads=shape.heads, head_dim=shape.head_dim,
        rms_norm_eps=1e-6, rope_theta=1e4, max_position_embeddings=shape.seq, vocab_size=shape.vocab,
        draft_vocab_size=shape.draft_vocab, **mla,
    )  # fmt: skip


def census_peak(
    shape: Shape, path: str, target: Shape | None, phases: tuple[str, ...] = ()
) -> tuple[int, dict[str, int], list[str]]:
    """Peak live bytes of a training step at `target` replayed from `shape` (target None: `shape` itself,
    tracked directly, the training code's own block sizes)."""
    return census_of(shape, path, target).peak(phases)


def census_of(shape: Shape, path: str, target: Shape | None) -> Census:
    """The census of a training step run at `shape`, its sizes replayed at `target` (None: as run)."""
    if target is None:
        census = Census(None)
        run_census(census, census_setup(shape, path))
        return census
    census = Census(Scaler(shape, target, block_rows(target)))
    with census_blocks():
        run_census(census, census_setup(shape, path))
    return census


def census(a: argparse.Namespace) -> None:
    """The --census lines (see the module docstring)."""
    torch.set_num_threads(a.threads_memory)
    mla = a.draft == "deepseek_mla"
    named, reduced = (KIMI_MLA, REDUCED_MLA) if mla else (KIMI, REDUCED)
    target = replace(named, seq=a.batch_tokens or named.seq)
    ddp = census_of(reduced, "training", target)
    # train.fsdp over the example's GPUs, gathered in bf16 (draft/fsdp.py's policy); beside it the
    # same without a policy (weights gathered in fp32, as before the policy) and DDP's figure
    sharded, sharded_parts = census_of(reduced, "fsdp_bf16", target).sharded_peak(a.gpus)
    emit(
        {"measure": "train_step_census", "path": "training_fsdp", "gpus": a.gpus, "draft": a.draft}
        | {"shape": a.shape, "batch_tokens": target.seq, "peak_gib_per_gpu": gib(sharded)}
        | {"mixed_precision": "bf16 gathered, fp32 reduced"}
        | {"fp32_gathered_peak_gib_per_gpu": gib(ddp.sharded_peak(a.gpus)[0])}
        | {"ddp_peak_gib_per_gpu": gib(ddp.ddp_peak(DDP_KWARGS.gradient_as_bucket_view)[0])}
        | {"breakdown_gib": {k: gib(v) for k, v in sorted(sharded_parts.items(), key=lambda kv: -kv[1])}}
    )
    for path in ("training", "former"):
        tracked = ddp if path == "training" else census_of(reduced, path, target)
        # DDP as train.py configures it (train.DDP_KWARGS: gradients as bucket views); the former path
        # without bucket views: its buckets a second fp32 copy of the gradients
        bucket_view = path == "training" and DDP_KWARGS.gradient_as_bucket_view
        peak, parts, largest = tracked.ddp_peak(bucket_view)
        emit(
            {"measure": "train_step_census", "path": path, "shape": a.shape, "batch_tokens": target.seq}
            | {"ddp": {"gradient_as_bucket_view": bucket_view}}
            | {
                "draft": a.draft,
                "mla": target.mla,
                "ttt_steps": target.steps,
                "hidden": target.hidden,
                "heads": target.heads,
            }
            | {"head_dim": target.head_dim, "intermediate": target.intermediate, "vocab": target.vocab}
            | {"draft_vocab": target.draft_vocab, "peak_gib_per_gpu": gib(peak)}
            | {"breakdown_gib": {k: gib(v) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}}
            | {"largest_at_peak": largest}  # census-shape [dims] with their replayed size
        )
    demo = Shape(hidden=128, heads=2, head_dim=64, intermediate=384, vocab=1024, draft_vocab=1024, seq=1024,
                 steps=7)  # fmt: skip
    demo = replace(demo, head_dim=16, mla=(96, 64, 32, 16, 32)) if mla else demo
    tracked = census_peak(demo, "training", None)[0]
    replayed = census_peak(reduced, "training", demo)[0]
    emit({"measure": "train_step_census_check", "shape": "demo", "batch_tokens": demo.seq}
         | {"tracked_peak_mib": round(tracked / 2**20, 2)}
         | {"replayed_peak_mib": round(replayed / 2**20, 2)})  # fmt: skip
    for seq in [int(t) for t in a.lengths.split(",")]:
        at = replace(target, seq=seq)
        peak, parts, _ = census_peak(reduced, "training", at, ("activations", "backward"))
        fixed = sum(parts.get(k, 0) for k in ("trainable", "grads", "optimizer_state", "frozen"))
        emit({"measure": "train_step_census_by_length", "shape": a.shape, "seq": seq}
             | {"forward_backward_peak_gib": gib(peak), "beyond_weights_gib": gib(peak - fixed)})  # fmt: skip


def trainable_bytes(shape: Shape) -> int:
    """fp32 bytes of the draft's trained tensors at `shape` (the model built on the meta device)."""
    with torch.device("meta"):
        model = Eagle3Draft(census_config(shape))
    return 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def memory_point(a: argparse.Namespace) -> None:
    """In this process: one training step of `a.attention` at T = a.seq (and a second, warm one timed,
    up to T = 2,048); print the peak memory (maxrss growth) and the timed step's seconds."""
    torch.set_num_threads(a.threads_memory)
    torch.manual_seed(0)
    c = draft_shape(a)
    model = Eagle3Draft(c, attention=ATTENTION[a.attention], checkpointing=a.checkpointing)
    head = frozen_head(c, torch.float32, torch.device("cpu"))
    data = synthetic_batch(c, 1, a.seq)
    before = maxrss_mb()
    seconds = one_step(model, data, head, a.ttt_steps, bf16=False)
    if a.seq <= 2048:  # a second, warm step where it is cheap; minutes per step past that on 2 cores
        seconds = one_step(model, data, head, a.ttt_steps, bf16=False)
    emit(
        {"measure": "train_step_memory", "attention": a.attention, "seq": a.seq, "ttt_steps": a.ttt_steps}
        | {"checkpointing": a.checkpointing}
        | {"hidden": a.hidden, "heads": a.heads, "threads": a.threads_memory}
        | {"peak_step_mb": round(maxrss_mb() - before, 1), "peak_rss_mb": round(maxrss_mb(), 1)}
        | {"step_s": round(seconds, 2)}
    )


def memory_table(a: argparse.Namespace, argv: list[str]) -> None:
    """One subprocess per (T, attention); dense points skipped past --max-dense-gb (projected)."""
    previous_dense: tuple[int, float] | None = None  # (T, peak step MB) of the last dense point
    for seq in [int(t) for t in a.lengths.split(",")]:
        for attention in ("linear",) if a.linear_only else ("linear", "dense"):
            if attention == "dense" and previous_dense is not None:
                projected = previous_dense[1] * (seq / previous_dense[0]) ** 2
                if projected > a.max_dense_gb * 1024:
                    emit({"measure": "train_step_memory", "attention": "dense", "seq": seq, "skipped": True}
                         | {"projected_peak_step_mb": round(projected)})  # fmt: skip
                    continue
            point = ["--point", "--attention", attention, "--seq", str(seq)]
            point += ["--checkpointing"] if a.checkpointing and attention == "linear" else []
            command = [sys.executable, __file__, *argv, *point]
            out = subprocess.run(command, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                emit({"measure": "train_step_memory", "attention": attention, "seq": seq, "failed": True}
                     | {"returncode": out.returncode, "stderr_tail": out.stderr[-500:]})  # fmt: skip
                continue
            record = json.loads(out.stdout.strip().splitlines()[-1])
            emit(record)
            if attention == "dense":
                previous_dense = (seq, record["peak_step_mb"])


def kimi_step(a: argparse.Namespace) -> None:
    """One training step at the Kimi-K2.5 draft shape on the first CUDA device (see the docstring)."""
    if not torch.cuda.is_available():
        raise SystemExit("--shape kimi needs a CUDA device")
    device = torch.device("cuda")
    a.hidden, a.heads, a.head_dim, a.intermediate = 7168, 64, 128, 18432
    a.vocab, a.draft_vocab, a.seq = 163840, 32000, a.kimi_seq
    c = draft_shape(a)
    torch.manual_seed(0)
    model = Eagle3Draft(c, attention=ATTENTION[a.attention], checkpointing=a.checkpointing).to(device)
    model.embed_tokens.to(torch.bfloat16)  # frozen tensors in the training dtype, as train.py holds them
    head = frozen_head(c, torch.bfloat16, device)
    data = synthetic_batch(c, 1, a.seq).to(device)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = [one_step(model, data, head, a.ttt_steps, bf16=True) for _ in range(3)]
    emit(
        {"measure": "kimi_train_step", "attention": a.attention, "seq": a.seq, "ttt_steps": a.ttt_steps}
        | {"hidden": 7168, "heads": 64, "head_dim": 128, "device": torch.cuda.get_device_name()}
        | {"static_mb": round(base / 2**20), "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20)}
        | {"step_s": [round(t, 3) for t in times]}
    )


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--draft-vocab", type=int, default=None, help="default: the whole vocabulary")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--matmul-n", type=int, default=1024)
    p.add_argument("--threads", default="1,2", help="torch thread counts to compare (comma-separated)")
    p.add_argument("--head-dim", type=int, default=None, help="default: hidden / heads")
    p.add_argument("--memory", action="store_true", help="peak memory and time per step against T")
    p.add_argument("--lengths", default="1024,2048,4096,8192", help="--memory: the T measured")
    p.add_argument("--max-dense-gb", type=float, default=8.0, help="--memory: skip dense points past this")
    p.add_argument("--threads-memory", type=int, default=1, help="--memory: torch threads per point")
    p.add_argument("--point", action="store_true", help=argparse.SUPPRESS)  # one --memory point
    p.add_argument("--attention", choices=tuple(ATTENTION), default="linear")
    p.add_argument("--shape", choices=["kimi"], default=None, help="kimi: one step at Kimi-K2.5's shape")
    p.add_argument("--kimi-seq", type=int, default=10240)
    p.add_argument("--checkpointing", action="store_true", help="checkpoint each TTT step (train.* key)")
    p.add_argument("--linear-only", action="store_true", help="--memory: skip the dense reference")
    p.add_argument("--census", action="store_true", help="peak memory per GPU at --shape, without a GPU")
    p.add_argument("--batch-tokens", type=int, default=None, help="--census: default the example's 16,384")
    p.add_argument("--gpus", type=int, default=8, help="--census: processes train.fsdp shards over")
    p.add_argument("--draft", choices=["llama", "deepseek_mla"], default="llama", help="--census: the draft")
    a = p.parse_args(argv)
    if a.census:
        if a.shape != "kimi":
            raise SystemExit("--census needs --shape kimi")
        return census(a)
    if a.draft != "llama":
        raise SystemExit("--draft deepseek_mla is measured by --census only (--census --shape kimi)")
    if a.point:
        return memory_point(a)
    if a.memory:
        return memory_table(a, argv)
    if a.shape == "kimi":
        return kimi_step(a)
    c = draft_shape(a)
    flops = step_flops(c, a.batch, a.seq, a.ttt_steps)
    tokens = a.batch * a.seq
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        rates = {
            name: matmul_gflops(dtype, a.matmul_n)
            for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16)]
        }
        emit({"measure": "matmul_gflops", "n": a.matmul_n, "threads": threads, **rates})
        for precision, bf16 in [("fp32", False), ("bf16_autocast", True)]:
            seconds = time_training(c, a.batch, a.seq, a.ttt_steps, bf16, a.repeats)
            at_rate = flops["total"] / (rates["bf16" if bf16 else "fp32"] * 1e9)
            shape = {"hidden": a.hidden, "heads": a.heads, "intermediate": a.intermediate}
            shape |= {"vocab": a.vocab, "draft_vocab": c.draft_vocab_size}
            record = {"measure": "train_step", "precision": precision, "threads": threads, "shape": shape}
            record |= {"batch": a.batch, "seq": a.seq, "ttt_steps": a.ttt_steps, "tokens_per_step": tokens}
            record |= {"step_s": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 1)}
            record |= {"step_gflop": round(flops["total"] / 1e9, 2), "flop_bound_step_s": round(at_rate, 4)}
            emit(record | {"fraction_of_matmul_rate": round(at_rate / seconds, 3)})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    main(sys.argv[1:])
