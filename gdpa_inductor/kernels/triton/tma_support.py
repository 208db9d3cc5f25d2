"""Which calls the Triton forward's TMA variant takes (``gdpa_fwd_tma``); every other call takes the pointer kernel."""

from __future__ import annotations

import torch

from ..common.device import capability_major
from ..common.layout import tma_layout
from .layout import interpreting


def on_tma_gpu(device: torch.device) -> bool:
    """A CUDA device of compute capability 9 or later, outside the interpreter."""
    if device.type != "cuda" or interpreting():
        return False
    return capability_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def tma_supported(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether ``gdpa_fwd_tma`` runs this call ([Z, H, N, D] views; same device and dtype)."""
    d, dv = q4.shape[-1], v4.shape[-1]
    return (bias is None and q4.dtype in (torch.float16, torch.bfloat16)
            and all(x in (16, 32, 64, 128) for x in (d, dv))
            and all(tma_layout(x) for x in (q4, k4, v4)) and on_tma_gpu(q4.device))
