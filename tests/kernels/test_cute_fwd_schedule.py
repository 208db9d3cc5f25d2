"""The CuTe forward's schedule and K/V stages per head dims and call (no GPU needed): the plain dense D = Dv = 64
forward takes ping-pong with split O stores and three K/V stages (measured faster on H100), the causal, varlen and
biased forwards at D = 64 keep one shared store and two stages, and ``compile_fwd`` hands the kernel what its plan
says (the kernel class replaced by a recorder, so nothing is compiled)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gdpa_inductor.kernels.cute import compile_cache, gdpa_fwd_sm90
from gdpa_inductor.kernels.cute.fwd_plan import fwd_kv_stages, fwd_schedule, plan_fwd
from gdpa_inductor.kernels.cute.kernel_build import compile_fwd


@pytest.mark.parametrize(
    "d, dv, plain, schedule, stages",
    [
        (64, 64, True, (True, True), 3),
        (64, 64, False, (False, False), 2),
        (64, None, True, (True, True), 3),
        (128, 128, True, (True, True), 2),
        (128, 128, False, (True, True), 2),
        (96, 96, True, (True, True), 2),
        (64, 96, True, (False, False), 2),
        (96, 64, False, (False, False), 2),
        (64, 128, True, (True, True), 2),
        (256, 256, True, (True, True), 2),
    ],
)
def test_schedule_and_stages_per_head_dims(d, dv, plain, schedule, stages):
    assert fwd_schedule(d, dv, plain) == schedule
    assert fwd_kv_stages(d, dv, plain) == stages


class _Built(Exception):
    pass


@pytest.fixture
def recorded(monkeypatch):
    """compile_fwd's kernel arguments, recorded by a stand-in for GdpaFwdSm90 that stops the build there."""
    seen = {}

    def record(*args, **kwargs):
        seen.update(kwargs)
        raise _Built

    monkeypatch.setattr(gdpa_fwd_sm90, "GdpaFwdSm90", record)
    monkeypatch.setattr(compile_cache, "_MEMORY", {})
    monkeypatch.setattr("gdpa_inductor.config.kernel_cache_dir", "")
    return seen


@pytest.mark.parametrize(
    "d, flags, pingpong, stages",
    [
        (64, {}, True, 3),
        (64, dict(mask_keys=False), True, 3),
        (64, dict(causal=True), False, 2),
        (64, dict(varlen=True), False, 2),
        (64, dict(varlen=True, band=True), False, 2),
        (64, dict(score_offset=True), False, 2),
        (64, dict(score_bias=True), False, 2),
        (64, dict(pingpong=False, split_store=False), False, 3),
        (128, {}, True, 2),
        (128, dict(causal=True), True, 2),
    ],
)
def test_compile_fwd_hands_the_kernel_its_schedule(recorded, d, flags, pingpong, stages):
    pytest.importorskip("cutlass")
    schedule = {name: flags[name] for name in ("pingpong", "split_store") if name in flags}
    call = {name: value for name, value in flags.items() if name not in schedule}
    plan = dataclasses.replace(plan_fwd(torch.bfloat16, d, "gelu_tanh", **call), **schedule)
    with pytest.raises(_Built):
        compile_fwd(plan)
    assert (recorded["pingpong"], recorded["split_store"], recorded["kv_stages"]) == (pingpong, pingpong, stages)
