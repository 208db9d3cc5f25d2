"""The wide-head backward's shared-memory plan (no GPU, no cutlass-dsl needed): every head-dim pair with 256 that
the CuTe kernels take fits Hopper's 227 KiB per CTA, in fp32 and in-place dQ sums, with two Q stages always; two
Pᵀ/dSᵀ stages, and two dO stages where they fit; dQ handed over in 64-column chunks (narrower
halves of D in one chunk)."""

from __future__ import annotations

import itertools

import pytest

from gdpa_inductor.kernels.cute.wide_bwd_plan import SMEM_BYTES, WideBwdPlan

HEAD_DIMS = (64, 96, 128, 256)
WIDE_PAIRS = [(d, dv) for d, dv in itertools.product(HEAD_DIMS, HEAD_DIMS) if max(d, dv) == 256]


@pytest.mark.parametrize("dq_bytes", [4, 2], ids=["fp32", "in_place"])
@pytest.mark.parametrize("d, dv", WIDE_PAIRS)
def test_every_wide_pair_fits(d, dv, dq_bytes):
    plan = WideBwdPlan.for_head_dims(d, dv, dq_bytes)
    assert plan.smem_bytes(d, dv, dq_bytes) <= SMEM_BYTES
    assert plan.q_stages == 2 and plan.pds_stages == 2
    assert plan.dq_width * 2 * plan.dq_chunks == d and plan.dq_width <= 64
    # a second dO stage is taken wherever it fits
    if plan.do_stages == 1:
        wider = WideBwdPlan(2, plan.dq_width, plan.dq_chunks)
        assert wider.smem_bytes(d, dv, dq_bytes) > SMEM_BYTES


def test_256_by_256_takes_one_do_stage():
    """At D = Dv = 256 with fp32 dQ: K, V, two Q stages, one dO stage, two Pᵀ/dSᵀ stages and two 16 KiB dQ
    buffers are 224 KiB."""
    plan = WideBwdPlan.for_head_dims(256, 256, 4)
    assert (plan.do_stages, plan.pds_stages, plan.dq_width, plan.dq_chunks) == (1, 2, 64, 2)
    assert plan.smem_bytes(256, 256, 4) == 224 * 1024


def test_too_wide_is_refused_by_name():
    with pytest.raises(ValueError, match=r"head dims \(512, 512\) do not fit"):
        WideBwdPlan.for_head_dims(512, 512, 4)
