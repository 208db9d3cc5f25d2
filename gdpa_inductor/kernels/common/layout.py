"""Tensor layouts both backends' launchers read: operands as 4-D [Z, H, N, D] views, and whether TMA can read
one."""

from __future__ import annotations

import math

import torch


def as_4d(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """x [..., H, N, D] broadcast to [*batch, H, N, D] and flattened to [Z, H, N, D] (a view unless
    the broadcast pattern cannot be flattened, which copies)."""
    z = math.prod(batch)
    return x.expand(*batch, *x.shape[-3:]).reshape(z, *x.shape[-3:])


def tma_layout(x: torch.Tensor) -> bool:
    """TMA reads rows of 16-byte multiples from 16-byte-aligned addresses; a broadcast (stride-0) dim is
    left to the pointer kernel."""
    size = x.element_size()
    return (x.stride(-1) == 1 and x.data_ptr() % 16 == 0
            and all(s > 0 and (s * size) % 16 == 0 for s in x.stride()[:-1]))
