"""Memory census of one draft training step, taken at a small shape and replayed at a named one.

The real training step (target in-draft mask, draft forward over the TTT steps, loss, backward, clip,
AdamW) runs on the CPU at a reduced shape whose sizes are all distinct (REDUCED), under a
TorchDispatchMode that sees every tensor each op allocates and a weak reference that sees it freed
(torch keeps one Python object per storage). Each allocation's dimensions are named by their size
(T, H, 2H, 3H, I, nh, hd, nh*hd, V, Vd and the three block sizes, which the census sets to distinct
small values; for an MLA draft the q/kv LoRA ranks, the nope/rope/value head sizes and their sums and
per-head products instead of hd and nh*hd), so the same timeline can be replayed with every
dimension at the named shape's size: the peak of that replay is the step's peak of live tensor bytes
at the named shape, and the tensors live at that moment give its breakdown.
Loops over blocks run more often at the real shape than in the census; their live set per iteration
is what counts and is replayed at the real block size.
The largest block of causal attention scores reaches the last key (its key dimension is replayed
as T).

What it does not see: the CUDA caching allocator's rounding and fragmentation, cuBLAS/NCCL workspaces
and the CUDA context (together a few GiB on a GPU), and collectives' buffers, which the replays add
where known: DDP's gradient buckets (`ddp_peak`: allocated whole when DDP wraps the model and live
throughout; with gradient_as_bucket_view each gradient is copied into its bucket once accumulated and
the bucket view replaces it, without it the gradients stay beside the buckets) and FSDP's gathered
weights, gradients and reduce-scatter buffers (`sharded_peak`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from eagle3_pipeline.draft import attention, ttt

GIB = 2**30


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    seq: int  # tokens of the batch: one sample of train.batch_tokens (rows x longest <= batch_tokens)
    steps: int
    # an MLA draft (draft.architecture deepseek_mla): (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    # qk_rope_head_dim, v_head_dim); head_dim is then the rope's size, as in DraftConfig
    mla: tuple[int, int, int, int, int] | None = None


# the Kimi-K2.5 example (config/examples/kimi-k2.5-8gpu.yaml): target width and vocabulary, draft.*
# (64 heads of 128, 32,000 draft ids, 7 TTT steps) and train.batch_tokens
KIMI = Shape(7168, 64, 128, 18432, 163840, 32000, 16384, 7)
# every named size distinct (and none of them a size that is not named: 5 stat rows, <= 7 steps, hd/2,
# nor a multiple of the attention block's rows, which a block's causal keys can be)
REDUCED = Shape(hidden=40, heads=3, head_dim=16, intermediate=46, vocab=200, draft_vocab=72, seq=67, steps=7)
# the Kimi-K2.5 example with an MLA draft (its target's own attention): q/kv LoRA 1,536 / 512, nope 128,
# rope 64, values 128, 64 heads
KIMI_MLA = replace(KIMI, head_dim=64, mla=(1536, 512, 128, 64, 128))
# REDUCED with MLA sizes that keep every named size distinct (qk 23, kv_a 34, kv_b 25, nh*qk 69, nh*v 30,
# nh*kv_b 75; none a multiple of 11, none in T's slack, rope/2 = 4 unnamed)
REDUCED_MLA = replace(REDUCED, head_dim=8, mla=(29, 26, 15, 8, 10))
CENSUS_BLOCKS = {"attention": 11, "loss": 13, "head": 17}  # rows per block in the census run
SEQ_SLACK = 12  # sizes T - SEQ_SLACK..T are T less a few rows (a step's counted rows: T - 2 - k)


def block_rows(shape: Shape) -> dict[str, int]:
    """Rows per block that the training code uses at `shape` (with its constants as they are)."""
    return {
        "attention": attention.block_size(1, shape.heads, shape.seq),
        "loss": min(shape.seq, ttt.chunk_rows(shape.draft_vocab)),  # a chunk holds at most every row
        "head": min(shape.seq, ttt.HEAD_CHUNK_ROWS),
    }


def symbols(shape: Shape, blocks: dict[str, int]) -> dict[str, int]:
    h = shape.hidden
    named = {
        "H": h, "2H": 2 * h, "3H": 3 * h, "I": shape.intermediate, "nh": shape.heads, "V": shape.vocab,
        "Vd": shape.draft_vocab, "Ca": blocks["attention"], "Cl": blocks["loss"], "Ch": blocks["head"],
    }  # fmt: skip
    if shape.mla is None:
        return named | {"hd": shape.head_dim, "q": shape.heads * shape.head_dim}
    rq, rkv, dn, dr, dv = shape.mla
    mla = {"rq": rq, "rkv": rkv, "dn": dn, "dr": dr, "dv": dv, "qk": dn + dr, "kv_a": rkv + dr}
    mla |= {"kv_b": dn + dv, "nh_qk": shape.heads * (dn + dr), "nh_v": shape.heads * dv}
    return named | mla | {"nh_kv_b": shape.heads * (dn + dv)}


class Scaler:
    """Tensor shapes at the census shape -> bytes at the named shape."""

    def __init__(self, census: Shape, target: Shape, target_blocks: dict[str, int]) -> None:
        small, large = symbols(census, CENSUS_BLOCKS), symbols(target, target_blocks)
        if len(set(small.values()) | {census.seq}) != len(small) + 1:
            raise ValueError(f"census sizes are not distinct: {small}, T {census.seq}")
        rows = CENSUS_BLOCKS["attention"]
        if any(size % rows == 0 for name, size in small.items() if name != "Ca"):
            raise ValueError(f"a census size is a multiple of the attention block's {rows} rows: {small}")
        self.by_size = {small[name]: large[name] for name in small}
        self.census, self.target = census, target

    def dims(self, shape: tuple[int, ...]) -> list[int]:
        seq, attention_rows = self.census.seq, CENSUS_BLOCKS["attention"]
        out = []
        for d in shape:
            if d in self.by_size:
                out.append(self.by_size[d])
            elif seq - SEQ_SLACK <= d <= seq:
                out.append(self.target.seq - (seq - d))
            elif attention_rows in shape and attention_rows < d < seq:
                out.append(self.target.seq)  # a block's causal keys: the last block's, T
            else:
                out.append(d)
        return out

    def nbytes(self, tensor: torch.Tensor, storage_bytes: int) -> int:
        own = tensor.numel() * tensor.element_size()
        scaled = math.prod(self.dims(tuple(tensor.shape))) * tensor.element_size()
        return scaled if own in (0, storage_bytes) else round(scaled * storage_bytes / own)


class Census(TorchDispatchMode):
    """Every storage allocated by an op while active, with its size at the named shape, its label (the
    phase it was allocated in, relabelled later) and the order of allocations and frees."""

    def __init__(self, scaler: Scaler | None) -> None:
        super().__init__()
        self.scaler = scaler
        self.phase = "setup"
        self.sizes: dict[int, int] = {}
        self.labels: dict[int, str] = {}
        self.shapes: dict[int, tuple[str, tuple[int, ...]]] = {}  # dtype and shape at the census shape
        # (+1 | -1, key, phase): allocated, freed; (0, key, phase): a gradient accumulated into its tensor
        self.events: list[tuple[int, int, str]] = []
        self._keys: dict[int, int] = {}  # storage data_ptr -> key, while alive
        self._next = 0

    def track(self, tensor: torch.Tensor, label: str | None = None) -> None:
        tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor (FSDP2's shards): its local tensor
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer in self._keys or storage.nbytes() == 0:
            if label and pointer in self._keys:
                self.labels[self._keys[pointer]] = label
            return
        key, self._next = self._next, self._next + 1
        size = storage.nbytes()
        self.sizes[key] = size if self.scaler is None else self.scaler.nbytes(tensor, size)
        self.labels[key] = label or self.phase
        self.shapes[key] = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        self._keys[pointer] = key
        self.events.append((1, key, self.phase))
        weakref.finalize(storage, self._free, pointer, key)

    def accumulated(self, grad: torch.Tensor) -> None:
        """`grad` is now its tensor's .grad (a post-accumulate-grad hook): labelled "grads", and the moment
        marked, when DDP copies it into its bucket (ddp_peak)."""
        self.track(grad, "grads")
        self.events.append((0, self._keys[grad.untyped_storage().data_ptr()], self.phase))

    def _free(self, pointer: int, key: int) -> None:
        if self._keys.get(pointer) == key:
            del self._keys[pointer]
        self.events.append((-1, key, self.phase))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                self.track(tensor)
        return out

    def peak(self, phases: tuple[str, ...] = ()) -> tuple[int, dict[str, int], list[str]]:
        """(peak live bytes, bytes by label at that moment, its ten largest tensors described); with
        `phases`, the peak while one of them runs."""
        live = best = best_at = 0
        for at, (sign, key, phase) in enumerate(self.events):
            live += sign * self.sizes[key]
            if live > best and (not phases or phase in phases):
                best, best_at = live, at
        alive = self._alive(best_at)
        breakdown: dict[str, int] = {}
        for key in alive:
            breakdown[self.labels[key]] = breakdown.get(self.labels[key], 0) + self.sizes[key]
        return best, breakdown, self._largest(alive)

    def _alive(self, at: int, dropped: frozenset[int] = frozenset()) -> set[int]:
        """Keys live just after event `at` (less `dropped`, those gone at their accumulation)."""
        alive: set[int] = set()
        for sign, key, _ in self.events[: at + 1]:
            if sign > 0:
                alive.add(key)
            elif sign < 0 or (sign == 0 and key in dropped):
                alive.discard(key)
        return alive

    def _largest(self, alive: set[int]) -> list[str]:
        return [
            f"{self.labels[k]} {self.shapes[k][0]}{list(self.shapes[k][1])}: {gib(self.sizes[k])} GiB"
            for k in sorted(alive, key=lambda k: -self.sizes[k])[:10]
        ]

    def ddp_peak(self, bucket_view: bool) -> tuple[int, dict[str, int], list[str]]:
        """(peak live bytes, bytes by label then, its ten largest tensors) of the same step under DDP:
        its gradient buckets ("ddp_buckets", as many bytes as the trained tensors, fp32) live from the
        wrap onwards; with `bucket_view` (DistributedDataParallel's gradient_as_bucket_view) a gradient
        is copied into its bucket as soon as it is accumulated and the bucket's view replaces it (the
        step's zero_grad sets .grad to None, so each step accumulates a fresh tensor first), without it
        the gradients live beside the buckets."""
        buckets = sum(size for key, size in self.sizes.items() if self.labels[key] == "trainable")
        dropped = {key for sign, key, _ in self.events if sign == 0} if bucket_view else set()
        gone: set[int] = set()
        live = best = best_at = 0
        for at, (sign, key, _) in enumerate(self.events):
            if sign == 0 and key in dropped:
                live, gone = live - self.sizes[key], gone | {key}
            elif sign and key not in gone:
                live += sign * self.sizes[key]
            if live > best:
                best, best_at = live, at
        alive = self._alive(best_at, frozenset(dropped))
        breakdown = {"ddp_buckets": buckets}
        for key in alive:
            breakdown[self.labels[key]] = breakdown.get(self.labels[key], 0) + self.sizes[key]
        return best + buckets, breakdown, self._largest(alive)

    def sharded_peak(self, gpus: int) -> tuple[int, dict[str, int]]:
        """(peak live bytes, bytes by label at that moment) of the same step under train.fsdp over `gpus`
        processes (draft/fsdp.py: the draft one FSDP unit). Each process holds 1/gpus of the trained
        weights and of AdamW's state throughout, and the weights gathered whole besides
        ("gathered_weights") from the forward pass to the end of the backward pass. A census run with
        a gathered copy of its own (training.py's "fsdp_bf16": bf16 weights, FSDP2's mixed-precision
        policy) has its gradients whole (bf16) while the backward pass makes them, their fp32 copy
        whole ("reduce_scatter", the collective's input) and 1/gpus of the result ("sharded_grads")
        for the optimiser step. One without (fp32, no policy) is given a gathered copy of its trained
        weights' size, its gradients whole until the optimiser step and 1/gpus in it."""
        own_copy = "gathered_weights" in self.labels.values()
        gathered = 0 if own_copy else sum(s for k, s in self.sizes.items() if self.labels[k] == "trainable")

        def factor(label: str, phase: str) -> float:
            if label in ("trainable", "optimizer_state", "sharded_grads"):
                return 1 / gpus
            if label == "gathered_weights":  # resharded after the backward pass, gathered at the forward
                return 1.0 if phase in ("activations", "backward") else 0.0
            return 1 / gpus if label == "grads" and phase == "optimizer_step" else 1.0

        live: dict[str, int] = {}
        best, breakdown = 0, {}
        for sign, key, phase in self.events:
            label = self.labels[key]
            live[label] = live.get(label, 0) + sign * self.sizes[key]
            parts = {name: round(size * factor(name, phase)) for name, size in live.items()}
            parts = {name: size for name, size in parts.items() if size}
            if gathered and phase in ("activations", "backward"):
                parts["gathered_weights"] = gathered
            total = sum(parts.values())
            if total > best:
                best, breakdown = total, parts
        return best, breakdown


@contextmanager
def census_blocks() -> Iterator[None]:
    """The training code's block sizes set to CENSUS_BLOCKS for the census run."""
    saved = attention.BLOCK_ELEMENTS, attention.MIN_BLOCK_ROWS
    saved_loss = ttt.LOSS_CHUNK_ELEMENTS, ttt.HEAD_CHUNK_ROWS
    attention.BLOCK_ELEMENTS, attention.MIN_BLOCK_ROWS = 1, CENSUS_BLOCKS["attention"]
    ttt.LOSS_CHUNK_ELEMENTS = CENSUS_BLOCKS["loss"] * REDUCED.draft_vocab
    ttt.HEAD_CHUNK_ROWS = CENSUS_BLOCKS["head"]
    try:
        yield
    finally:
        attention.BLOCK_ELEMENTS, attention.MIN_BLOCK_ROWS = saved
        ttt.LOSS_CHUNK_ELEMENTS, ttt.HEAD_CHUNK_ROWS = saved_loss


def run_census(census: Census, setup: Callable[[Census], Callable[[str], None]], steps: int = 2) -> None:
    """`setup(census)` builds the model, optimiser and batch (registering them) and returns a function
    that runs one training step, setting census.phase as it goes; run `steps` of them tracked."""
    step = setup(census)
    with census:
        for _ in range(steps):
            step("forward")


def gib(n: float) -> float:
    return round(n / GIB, 2)
