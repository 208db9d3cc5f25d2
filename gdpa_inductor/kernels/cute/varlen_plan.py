"""The mask a varlen call runs in the CuTe kernels: none, the aligned causal mask, or a band around each sample's
diagonal whose bounds are run-time arguments."""

from __future__ import annotations

import torch

from ..common.window_bounds import band_limits
from .varlen_support import varlen_causal_support


def varlen_band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, window: tuple[int, int],
                rows: tuple) -> tuple[int, int] | None:
    """The (left, right) bounds of the band mask the CuTe varlen kernels run for a supported call (key j kept for
    query i of a sample iff ``-left <= j - i - (nk - nq) <= right``, ``band_limits``' values), or None where they
    run the plain kernels or the aligned causal ones (``varlen_causal_support``), which mask fewer tiles."""
    if tuple(window) == (-1, -1) and (not causal or varlen_causal_support(q, k, v, rows)[0]):
        return None
    return band_limits(causal, window)
