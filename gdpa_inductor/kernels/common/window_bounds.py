"""The causal and window bounds of a varlen call as the kernels of both backends take them: the keys each query
keeps.

A key j is kept for query i of a sample with lengths (nq, nk) iff ``d = j - i - (nk - nq)`` satisfies
``-LEFT <= d <= RIGHT`` (causal: RIGHT = 0; no window: the bound is ``UNBOUNDED``).
"""

from __future__ import annotations

# Larger than any sequence, small enough that i + d stays inside int32.
UNBOUNDED = 1 << 30


def band_limits(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """(LEFT, RIGHT) for the kernels from the op's (left, right) window, -1 meaning unbounded."""
    left, right = window
    left = UNBOUNDED if left < 0 else left
    right = UNBOUNDED if right < 0 else right
    if causal:
        right = min(right, 0)
    return left, right
