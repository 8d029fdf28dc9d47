"""train.fsdp: the draft's trained tensors, their gradients and AdamW's state sharded over the
processes (FSDP2, torch.distributed.fsdp.fully_shard), instead of a full replica per process (DDP).

The whole draft is one FSDP unit: its one decoder layer runs once per TTT step, so a unit per layer
would be gathered and reduced seven times a step. The root unit keeps its tensors gathered from the
forward pass to the end of the backward pass (FSDP2's default for the root), which is what lets the
chunked loss read the draft's lm_head outside the forward call. Gradients are reduce-scattered at the
end of the backward pass; the optimiser step runs on each process's shard. The frozen embeddings are
left out (`ignored_params`): replicated, in the training dtype, never gathered.

Training in bf16 (GPUs), the gathered copy is bf16 (a MixedPrecisionPolicy: param_dtype bf16,
reduce_dtype fp32): the shards and AdamW stay fp32, the forward and backward pass run on bf16 weights
and make bf16 gradients, which are cast to fp32 for the reduce-scatter into the fp32 gradient shards.
Half the gathered bytes, and no per-matmul cast of fp32 weights under autocast; the trained numbers
differ from DDP's (fp32 weights cast per matmul) by bf16 rounding of the norms' weights and of the
gradients summed over the TTT steps. In fp32 (CPU) there is no policy: FSDP and DDP give the same
numbers up to the order of the reductions.

Not accelerate's FSDP plugin: accelerate enables it for GPU process groups only (MULTI_CPU is not in
its list, accelerate/state.py), and the same code path must run in the 2-process CPU test and on GPUs.

State files hold the full tensors either way, in one format (`full_state`): the trained tensors under
their checkpoint names and the optimiser's state_dict keyed as torch.optim keys it (the index of the
trained tensor), so a run can resume with train.fsdp switched on or off.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from eagle3_pipeline.draft.model import Eagle3Draft

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered whole, on the CPU of rank 0


def mixed_precision(compute_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """The policy for training in `compute_dtype` (None: fp32, no policy): weights gathered and
    gradients made in it, reduced and kept in fp32."""
    if compute_dtype is None or compute_dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)


def wrap_fsdp(
    model: Eagle3Draft, device: torch.device, compute_dtype: torch.dtype | None = None
) -> Eagle3Draft:
    """`model` (in place) as one FSDP2 unit over the default process group, on `device`; the frozen
    embeddings replicated; gathered in `compute_dtype` (the training dtype, None: fp32)."""
    model.to(device)
    # the mesh on the training device's type: FSDP2's default takes the machine's accelerator, which is
    # not the device of a CPU run (ACCELERATE_USE_CPU) on a machine with GPUs
    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    policy = mixed_precision(compute_dtype)
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params={model.embed_tokens.weight})
    return model


def is_fsdp(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def _trained_names(model: torch.nn.Module) -> list[str]:
    """The trained tensors' names in the optimiser's order (build_optimizer: model.parameters())."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def full_state(model: Eagle3Draft, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(trained tensors by checkpoint name, optimiser state_dict) whole. Sharded, a collective that
    every process calls; the full tensors land on the main process (the others get empty dicts)."""
    if not is_fsdp(model):
        return model.exported_state_dict(), optimizer.state_dict()
    tensors, optim = get_state_dict(model, optimizer, options=FULL)
    index = {name: i for i, name in enumerate(_trained_names(model))}
    tensors = {k: v for k, v in tensors.items() if not k.startswith("embed_tokens.")}
    optim = {
        "state": {index[name]: value for name, value in optim.get("state", {}).items()},
        "param_groups": [
            group | {"params": [index[name] for name in group["params"]]}
            for group in optim.get("param_groups", [])
        ],
    }
    return tensors, optim


def load_full_state(
    model: Eagle3Draft, optimizer: torch.optim.Optimizer, tensors: dict[str, Any], optim: dict[str, Any]
) -> None:
    """Load `full_state`'s dicts (every process holds them whole); sharded, each process keeps its
    shard. A collective when sharded."""
    if not is_fsdp(model):
        model.load_trained(tensors)
        optimizer.load_state_dict(optim)
        return
    names = _trained_names(model)
    missing = sorted(set(names) - set(tensors))
    unexpected = sorted(set(tensors) - {name for name, _ in model.named_parameters()})
    if missing or unexpected:
        raise ValueError(f"draft tensors missing: {missing}, unexpected: {unexpected}")
    by_name = {
        "state": {names[i]: value for i, value in optim["state"].items()},
        "param_groups": [
            group | {"params": [names[i] for i in group["params"]]} for group in optim["param_groups"]
        ],
    }
    options = StateDictOptions(full_state_dict=True, strict=False)  # the frozen embeddings are not in it
    set_state_dict(model, optimizer, model_state_dict=tensors, optim_state_dict=by_name, options=options)


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """The sharded model's tensors gathered for a while (no collective per forward call): for
    validation, where processes run unequal numbers of batches."""
    if not is_fsdp(model):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()
