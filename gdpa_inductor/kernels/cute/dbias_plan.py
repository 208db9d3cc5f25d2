"""How the CuTe backward sums a bias tensor's gradient: in a buffer of every (sample, head)'s dS or by fp32 adds
at the bias's size, chosen by speed where the device's free memory holds it."""

from __future__ import annotations

import torch

from .bwd_plan import KEY_TILE, QUERY_TILE
from .kernel_args import TMA_COLUMNS, padded


def spare_device_bytes(device: torch.device) -> int:
    """Bytes the caching allocator could still hand out on ``device``: the driver's free memory and the blocks the
    allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


# How the CuTe backward sums dbias: each CTA stores its dS tiles into a buffer of every (sample, head)'s dS, summed
# over the bias's broadcast dims afterwards ("buffer"), or adds them in fp32 into a tensor of the bias's own size
# ("atomic", ``GdpaBwdSm90``'s ``dbias_atomic``).
DBIAS_SUMS = ("buffer", "atomic")


def bias_leading_dims(bias_shape) -> tuple[int, int]:
    """(Zb, Hb) of a bias of ``bias_shape`` ([Zb, Hb, rows, columns] or fewer leading dims)."""
    return ((1, 1) + tuple(bias_shape[:-2]))[-2:]


def preferred_dbias_sums(bias_shape, num_samples: int, varlen: bool) -> str:
    """How dbias is summed where memory allows (one of ``DBIAS_SUMS``): atomically for a varlen batch's bias shared by
    its samples (HSTU's relative bias: the buffer holds every sample at the longest's size, zero-filled; H200, causal
    silu, B = 1152, H = 4, forward+backward with dbias 1.13-1.63x faster), stored otherwise: a dense batch's buffer
    holds only real scores and needs no fill where every tile is written, and there forward+backward with the adds
    measured 5% slower (512²), level (1024²) and 37% slower (2048², its fp32 sums past L2; a bias per sample, 1024²:
    19% slower)."""
    return "atomic" if varlen and bias_leading_dims(bias_shape)[0] < num_samples else "buffer"


def dbias_buffer_bytes(sums: str, num_samples: int, num_heads: int, bias: torch.Tensor) -> int:
    """Bytes of the tensor the CuTe backward sums dbias in (``sums``: one of ``DBIAS_SUMS``): a dS buffer of every
    (sample, head) in the bias's dtype, or the fp32 sums at the bias's size, rows and columns padded to whole tiles."""
    rows, cols = bias.shape[-2:]
    if sums == "atomic":
        zb, hb = bias_leading_dims(bias.shape)
        return zb * hb * padded(cols, KEY_TILE) * padded(rows, QUERY_TILE) * 4
    return num_samples * num_heads * rows * padded(cols, TMA_COLUMNS) * bias.element_size()


def dbias_sums_for(num_samples: int, num_heads: int, bias: torch.Tensor, varlen: bool = False,
                   spare: int | None = None) -> tuple[str | None, str]:
    """(way, reason): how the CuTe backward sums dbias of ``bias`` over ``num_samples`` x ``num_heads`` CTAs' dS.
    ``preferred_dbias_sums``' way where its tensor (``dbias_buffer_bytes``) takes at most half of what the device
    can still allocate, else the other where that one does, else None and why: then Triton's backward runs, which
    adds dbias by atomics into at most 1 GiB of slices. A dS buffer of every (sample, head) is the backward's
    largest tensor (a varlen batch's holds every sample at the longest's size: 39 GB for HSTU at B = 1152, N = 2048,
    H = 4), which a caller may not have budgeted for. ``spare``: the bytes to hold it against (None:
    ``spare_device_bytes`` of a CUDA bias; a bias elsewhere runs no CuTe kernel, and takes the preferred way)."""
    first = preferred_dbias_sums(bias.shape, num_samples, varlen)
    ways = (first, *(w for w in DBIAS_SUMS if w != first))
    if spare is None:
        if bias.device.type != "cuda":
            return first, ""
        spare = spare_device_bytes(bias.device)
    needs = [dbias_buffer_bytes(w, num_samples, num_heads, bias) for w in ways]
    for way, need in zip(ways, needs):
        if 2 * need <= spare:
            return way, ""
    sizes = ", ".join(f"{w} {n / 2**30:.1f} GiB" for w, n in zip(ways, needs))
    return None, (f"the CuTe backward's tensors for dbias ({sizes}) each take more than half the memory the device "
                  f"can still allocate ({spare / 2**30:.1f} GiB)")


def dbias_way(num_samples: int, num_heads: int, bias: torch.Tensor, varlen: bool) -> str:
    """The launchers' way of summing dbias: the one ``dbias_sums_for`` finds fits (what dispatch checked; a direct
    call that skipped the check: the buffer)."""
    return dbias_sums_for(num_samples, num_heads, bias, varlen)[0] or "buffer"
