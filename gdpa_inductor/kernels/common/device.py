"""The GPU a call runs on, as the kernel choices ask about it."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]
