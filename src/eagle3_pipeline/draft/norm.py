"""RMSNorm as the draft uses it (its own module so that model.py and mla.py share it without a cycle)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Llama RMSNorm, computed in fp32 like vLLM's."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)
