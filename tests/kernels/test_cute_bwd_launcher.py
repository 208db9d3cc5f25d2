"""Which dQ sum the CuTe backward's launcher picks (no GPU needed): in place in the operands' dtype up to
four 128-key tiles, where the extra roundings stay below eager PyTorch's own error (tests/gpu check the
error on both sides of the boundary), fp32 beyond."""

from __future__ import annotations

import pytest

from gdpa_inductor.kernels.cute.gdpa_bwd import dq_direct


@pytest.mark.parametrize("num_keys, direct", [(1, True), (128, True), (129, True), (512, True), (513, False), (2048, False)])
def test_dq_direct_up_to_four_key_tiles(num_keys, direct):
    assert dq_direct(num_keys) is direct
