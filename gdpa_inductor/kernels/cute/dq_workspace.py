"""The fp32 dQ sums and per-head counts of the CuTe backward that rounds dQ itself (``dq_last_round``), kept zeroed
between calls: the CTA that rounds a head's sums clears them and its count as it goes, so a buffer of the largest
size seen so far serves every later call on the same stream without the zero fill, a write of the whole buffer to
HBM (0.37 ms at 2048², B = 288, H = 4 on H100). The clearing stores cost most of that back inside the kernel: the
whole backward measured 0.4-3.5% faster by CUDA events, -2.2% to +1.0% by its kernels' times (H100).

A training step's backward holds this memory while it runs anyway, near the step's peak (the activations are still
saved); keeping it costs the forward of the next step that much, which ``release_dq_workspaces`` gives back. A
stream being captured into a CUDA graph gets a fresh zeroed buffer each time: its memory belongs to the graph.
"""

from __future__ import annotations

import torch

_WORKSPACES: dict[tuple, torch.Tensor] = {}


def _stream_key(device: torch.device) -> tuple:
    if device.type == "cuda":
        return (device.type, device.index, torch.cuda.current_stream(device).cuda_stream)
    return (device.type, device.index, None)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def zeroed_dq_sums(shape: tuple[int, ...], num_counts: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums, counts): an fp32 tensor of ``shape`` and ``num_counts`` int32, all zero, for one backward call on the
    current stream of ``device``, which must leave them zero again (``dq_last_round`` does)."""
    sums_numel = 1
    for size in shape:
        sums_numel *= size
    words = sums_numel + num_counts
    if _capturing(device):
        buffer = torch.zeros(words, dtype=torch.float32, device=device)
    else:
        key = _stream_key(device)
        buffer = _WORKSPACES.get(key)
        if buffer is None or buffer.numel() < words:
            # dropped first, so that the allocator may reuse its memory for the larger one
            _WORKSPACES.pop(key, None)
            buffer = torch.zeros(words, dtype=torch.float32, device=device)
            _WORKSPACES[key] = buffer
    sums = buffer[:sums_numel].view(shape)
    counts = buffer[sums_numel:words].view(torch.int32)
    return sums, counts


def release_dq_workspaces() -> None:
    """Frees the kept buffers (the next backward that rounds dQ itself allocates and zero-fills one again)."""
    _WORKSPACES.clear()
