"""The CuTe kernels' plans (kernels/cute/fwd_plan.py, bwd_plan.py), without a GPU: the forward's schedule and tiles per
head dims and call, the backward's way of summing dQ, query tile and dQ's last round per call, each combination a
build cannot take refused by name, and plans as the compile key: equal, hashable and cached alike whatever their
``reason`` says."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gdpa_inductor.config
from gdpa_inductor.kernels.cute.bwd_plan import BwdPlan, plan_bwd
from gdpa_inductor.kernels.cute.fwd_plan import FwdPlan, plan_fwd

BF16, FP16 = torch.bfloat16, torch.float16


@pytest.mark.parametrize("d, dv, flags, schedule, stages, tiles", [
    (64, 64, {}, (True, True), 3, (128, 2, False)),
    (64, None, dict(causal=True), (False, False), 2, (128, 2, False)),
    (64, 64, dict(varlen=True), (False, False), 2, (128, 2, False)),
    (64, 64, dict(score_offset=True), (False, False), 2, (128, 2, False)),
    (64, 96, {}, (False, False), 2, (128, 2, False)),
    (96, 96, {}, (True, True), 2, (128, 2, False)),
    (128, 64, dict(score_bias=True), (True, True), 2, (128, 2, False)),
    (128, 128, dict(causal=True), (True, True), 2, (128, 2, False)),
    (128, 256, {}, (True, True), 2, (64, 1, True)),
    (256, 128, dict(varlen=True), (True, True), 2, (64, 1, True)),
    (256, 256, {}, (True, True), 2, (64, 1, True)),
])
def test_fwd_plan_schedule_and_tiles_per_head_dims(d, dv, flags, schedule, stages, tiles):
    """Ping-pong with split O stores from D + Dv = 192 on (and for the plain D = Dv = 64 batch, with three K/V
    stages); past head dims of 128, 64-key tiles, one Q stage and O stored from the registers."""
    plan = plan_fwd(BF16, d, "silu", dv, **flags)
    assert plan.head_dim_v == (d if dv is None else dv)
    assert (plan.pingpong, plan.split_store) == schedule and plan.kv_stages == stages
    assert (plan.tile_n, plan.q_stages, plan.o_from_registers) == tiles
    assert plan.reason


@pytest.mark.parametrize("flags, mask_keys", [
    (dict(mask_keys=False), False), (dict(mask_keys=True), True), (dict(mask_keys=False, varlen=True), True),
    (dict(mask_keys=True, causal=True), False), (dict(mask_keys=False, varlen=True, causal=True), False),
])
def test_fwd_plan_masks_keys_past_nk_unless_the_diagonal_does(flags, mask_keys):
    """A varlen batch always masks its last key tile's columns; under the causal mask the diagonal's covers them."""
    assert plan_fwd(BF16, 128, "silu", **flags).mask_keys is mask_keys


@pytest.mark.parametrize("dtype, flags, packed", [
    (BF16, {}, True), (BF16, dict(causal=True, varlen=True, band=True), True), (FP16, {}, False),
    (BF16, dict(score_offset=True), False), (BF16, dict(score_bias=True), False),
])
def test_fwd_plan_packed_forms_for_bf16_without_a_bias(dtype, flags, packed):
    assert plan_fwd(dtype, 128, "gelu_tanh", **flags).packed is packed


@pytest.mark.parametrize("fields, message", [
    (dict(dtype=torch.float32), "the CuTe forward is built for fp16 or bf16"),
    (dict(activation="no_such_activation"), "activation: expected one of"),
    (dict(band=True), "band=True needs varlen=True"),
])
def test_fwd_plan_refuses_what_no_build_takes(fields, message):
    with pytest.raises(ValueError, match=message):
        FwdPlan(**(dict(dtype=BF16, head_dim=128, head_dim_v=128, activation="silu") | fields))


def _bwd_plan(**fields) -> BwdPlan:
    fields = dict(dtype=BF16, head_dim=128, activation="silu") | fields
    fields.setdefault("head_dim_v", fields["head_dim"])
    return BwdPlan(**fields)


@pytest.mark.parametrize("fields, message", [
    (dict(dtype=torch.float32), r"the CuTe backward is built for fp16 or bf16, got torch.float32"),
    (dict(activation="no_such_activation"), r"activation: expected one of .*; got 'no_such_activation'"),
    (dict(dq_sums="bf16"), r"dq_sums must be one of \('in_place', 'fp32'\), got 'bf16'"),
    (dict(dq_sums="pairs"), r"dq_sums must be one of \('in_place', 'fp32'\), got 'pairs'"),
    (dict(band=True), r"band=True needs varlen=True"),
    (dict(bias_grad=True), r"bias_grad=True needs score_bias=True"),
    (dict(score_bias=True, dbias_atomic=True), r"dbias_atomic=True needs bias_grad=True"),
    (dict(score_bias=True, score_offset=True), r"score_bias=True takes no one-element bias"),
    (dict(query_tile=96), r"query_tile must be one of \(64, 80\), got 96"),
    (dict(dq_last_round=True, dq_sums="in_place"), r"dq_last_round=True needs dq_sums='fp32', a dense batch and D, "
                                                   r"Dv <= 128"),
    (dict(dq_last_round=True, varlen=True), r"dq_last_round=True needs dq_sums='fp32', a dense batch"),
    (dict(dq_last_round=True, head_dim_v=256), r"dq_last_round=True needs dq_sums='fp32', a dense batch"),
    *[(dict(query_tile=80) | change, r"query_tile=80 needs dq_sums='fp32', D = Dv = 128, no mask")
      for change in (dict(dq_sums="in_place"), dict(causal=True), dict(varlen=True), dict(score_bias=True),
                     dict(head_dim_v=64), dict(activation="gelu"))],
    *[(dict(head_dim=256, head_dim_v=128) | change, r"wide-head backward \(D=256, Dv=128\) takes no mask and no "
                                                    "bias tensor")
      for change in (dict(causal=True), dict(varlen=True, band=True), dict(score_bias=True))],
])
def test_bwd_plan_refuses_what_no_build_takes(fields, message):
    with pytest.raises(ValueError, match=message):
        _bwd_plan(**fields)


@pytest.mark.parametrize("fields", [
    {}, dict(dq_sums="in_place"), dict(query_tile=80), dict(dq_last_round=True, query_tile=80),
    dict(score_bias=True, bias_grad=True, dbias_atomic=True), dict(varlen=True, band=True, score_offset=True),
    dict(head_dim=256, head_dim_v=128, varlen=True, score_offset=True), dict(head_dim=64, causal=True),
])
def test_bwd_plan_takes_the_combinations_its_builds_have(fields):
    assert isinstance(_bwd_plan(**fields), BwdPlan)


@pytest.mark.parametrize("fields, wide, key_tile, dq_late, packed", [
    (dict(), False, 128, True, True), (dict(dq_sums="in_place"), False, 128, False, True),
    (dict(dq_sums="in_place", head_dim=64), False, 128, True, True), (dict(dtype=FP16), False, 128, True, False),
    (dict(varlen=True, band=True), False, 128, True, False), (dict(score_offset=True), False, 128, True, False),
    (dict(head_dim_v=256), True, 64, True, False), (dict(head_dim=256), True, 64, True, False),
])
def test_bwd_plan_kernel_tiles_and_forms(fields, wide, key_tile, dq_late, packed):
    """The wide-head kernel past head dims of 128 (64-key CTAs); dQ one query tile late but in place at D = Dv = 128;
    the packed bf16x2 form for bf16 gelu_tanh without a bias or the band, in narrow heads."""
    plan = _bwd_plan(activation="gelu_tanh", **fields)
    assert (plan.wide, plan.key_tile, plan.dq_late, plan.packed) == (wide, key_tile, dq_late, packed)


def _plan_bwd(num_queries, num_keys, dtype=BF16, d=128, dv=None, activation="silu", **flags):
    return plan_bwd(dtype, d, activation, dv, num_queries=num_queries, num_keys=num_keys, **flags)


@pytest.mark.parametrize("call, dq_sums, query_tile, last_round", [
    (dict(num_queries=2048, num_keys=1024), "in_place", 64, False),
    (dict(num_queries=2048, num_keys=1025), "fp32", 80, True),
    (dict(num_queries=2047, num_keys=2048), "fp32", 64, True),
    (dict(num_queries=4096, num_keys=4096, activation="relu"), "fp32", 80, True),
    (dict(num_queries=2048, num_keys=2048, activation="sigmoid"), "fp32", 64, True),
    (dict(num_queries=2048, num_keys=2048, activation="gelu_tanh"), "fp32", 80, True),
    (dict(num_queries=2048, num_keys=2048, activation="gelu_tanh", dtype=FP16), "fp32", 64, True),
    (dict(num_queries=2048, num_keys=2048, activation="gelu"), "fp32", 64, True),
    (dict(num_queries=2048, num_keys=2048, causal=True), "fp32", 64, True),
    (dict(num_queries=2048, num_keys=2048, score_bias=True), "fp32", 64, True),
    (dict(num_queries=2048, num_keys=2048, d=96), "fp32", 64, True),
    (dict(num_queries=2048, num_keys=2048, varlen=True), "fp32", 64, False),
    (dict(num_queries=2048, num_keys=1024, varlen=True, band=True), "in_place", 64, False),
    (dict(num_queries=2048, num_keys=512, d=256, dv=128), "in_place", 64, False),
    (dict(num_queries=2048, num_keys=513, d=256, dv=128), "fp32", 64, False),
])
def test_plan_bwd_chooses_dq_sums_query_tile_and_last_round(monkeypatch, call, dq_sums, query_tile, last_round):
    """dQ in place up to eight key tiles (64 keys past head dims of 128), else in fp32, rounded by the kernel in a
    dense batch of narrow heads; 80-query steps in their measured cases from 2048 queries on."""
    monkeypatch.setattr(gdpa_inductor.config, "cute_bwd_query_tile", None)
    plan = _plan_bwd(**call)
    assert (plan.dq_sums, plan.query_tile, plan.dq_last_round) == (dq_sums, query_tile, last_round)
    assert ("in place" if dq_sums == "in_place" else "in fp32") in plan.reason


@pytest.mark.parametrize("wanted, query_tile", [(80, 80), (64, 64)])
def test_plan_bwd_takes_the_configured_query_tile_in_its_cases(monkeypatch, wanted, query_tile):
    monkeypatch.setattr(gdpa_inductor.config, "cute_bwd_query_tile", wanted)
    assert _plan_bwd(100, 2048).query_tile == query_tile
    assert _plan_bwd(100, 2048, causal=True).query_tile == 64


def test_plan_bwd_passes_the_bias_gradient_through():
    plan = _plan_bwd(256, 256, score_bias=True, bias_grad=True, dbias_atomic=True)
    assert plan.score_bias and plan.bias_grad and plan.dbias_atomic


PLANS = [
    lambda: plan_fwd(BF16, 128, "silu"), lambda: plan_fwd(FP16, 64, "relu", 128, causal=True),
    lambda: plan_fwd(BF16, 256, "gelu_tanh", varlen=True, band=True, score_offset=True),
    lambda: _plan_bwd(2048, 2048), lambda: _plan_bwd(100, 300, varlen=True, band=True),
    lambda: _plan_bwd(512, 512, d=256, dv=128, activation="gelu_tanh"),
]


@pytest.mark.parametrize("make", PLANS, ids=range(len(PLANS)))
def test_plans_are_compile_keys_whatever_their_reason(make):
    """Two plans of one call are equal and hash alike, one key of a dict, with any ``reason`` (which no repr
    shows: the disk cache names files by it); a plan is frozen, and another build is another key."""
    plan, again = make(), dataclasses.replace(make())
    assert plan == again and hash(plan) == hash(again) and plan is not again
    reworded = dataclasses.replace(plan, reason="another account")
    assert reworded == plan and hash(reworded) == hash(plan) and repr(reworded) == repr(plan)
    assert "reason" not in repr(plan) and plan.reason
    assert {plan: "built", again: "built again", reworded: "built once more"} == {plan: "built once more"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.head_dim = 96
    other = (dataclasses.replace(plan, pingpong=not plan.pingpong) if isinstance(plan, FwdPlan)
             else dataclasses.replace(plan, dtype=FP16 if plan.dtype == BF16 else BF16))
    assert other != plan and len({plan, other}) == 2
