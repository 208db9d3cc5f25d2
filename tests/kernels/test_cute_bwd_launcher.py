"""Which dQ sum the CuTe backward's launcher picks (no GPU needed): in place in the operands' dtype up to
eight 128-key tiles, where the extra roundings keep the error within 1.5x eager PyTorch's own (tests/gpu check
the error on both sides of the boundary against the 2x bound), fp32 beyond."""

from __future__ import annotations

import pytest

from gdpa_inductor.kernels.cute.gdpa_bwd import dq_direct


@pytest.mark.parametrize(
    "num_keys, direct", [(1, True), (128, True), (129, True), (1024, True), (1025, False), (2048, False)]
)
def test_dq_direct_up_to_eight_key_tiles(num_keys, direct):
    assert dq_direct(num_keys) is direct
