"""The Triton kernels compile for a B200 (sm_100a) without a GPU, with the tiles the launchers choose for it
(``tile_configs``, compute capability 10): cubin produced, the matmuls lowered to Blackwell's tensor-core instructions
(tcgen05.mma, accumulators in tensor memory; no wgmma), tanh.approx for the half-precision activations, and no
register spill: zero bytes of local-memory spill stores and loads.
No Blackwell GPU has run these kernels or measured these tiles: this is what a CPU can check. On sm_100 the dispatch
takes these kernels for every call the self-checked CuTe Blackwell kernels do not take.

The cases cover every branch of the sm_100 tile choices for each kernel family the dispatch can start: the dense
forward (head dims up to 64; up to 128 at short kv with and without a bias, and at long kv; the wider ones up to 256),
the TMA forward, both dense backward kernels (dK/dV with dBias, and dQ), the varlen forward and backward (short and
long kv, the causal window, a shared bias with its dBias), the varlen sample schedule (no matmul; 16 warps), and
fp32 (IEEE dots: no tensor cores, no tanh.approx). Above head width 128 in half precision the dK/dV kernel runs as a
dV pass and a dK pass (``tile_configs.dkdv_passes``), each reported apart, in every variant that compiles on its own
(dense with dBias and causal; varlen with a shared bias and with the causal window). The compiles go through
the same worker and report store as the sm_90a checks (``triton_compile_reports``), with the case's target set to
compute capability 10.0: the launchers choose the tiles for it.
"""

from __future__ import annotations

import pytest
import torch
from test_triton_compile_sm90 import DENSE_KERNELS, ROW_KERNELS, TMA_KERNELS, VARLEN_KERNELS
from triton_compile_reports import case_id

from gdpa_inductor.kernels.cute import fwd_support

# (dtype, head dim, activation, variant, kv length); for the schedule, the last is the number of samples.
CASES = [
    # dense, head dims up to 64
    ("bf16", 64, "gelu", "causal", 256),
    # dense, head dims up to 128: short kv without and with a bias, long kv causal
    ("bf16", 128, "silu", "plain", 256),
    ("bf16", 128, "gelu", "bias", 256),
    ("bf16", 128, "gelu_tanh", "causal", 2048),
    # the wider head dims the dispatch sends to Triton (up to 256): dK/dV as two passes
    ("bf16", 256, "silu", "bias", 2048),
    ("bf16", 192, "gelu_tanh", "causal", 2048),
    # varlen: long and short kv, the causal window, a shared bias; wide heads with both
    ("bf16", 128, "silu", "varlen", 2048),
    ("bf16", 128, "silu", "varlen_window", 256),
    ("fp16", 128, "gelu_tanh", "varlen_bias", 1024),
    ("fp16", 256, "silu", "varlen_bias", 1024),
    ("bf16", 256, "gelu_tanh", "varlen_window", 256),
    # the TMA forward (one tile for half precision, head dims up to 128)
    ("bf16", 128, "gelu_tanh", "tma", 256),
    # the varlen sample schedule (16 warps from 1024 samples on)
    ("bf16", 128, "silu", "schedule", 1152),
    # fp32
    ("fp32", 128, "gelu", "bias", 2048),
    ("fp32", 256, "silu", "causal", 256),
    ("fp32", 128, "silu", "varlen_window", 256),
]
SCHEDULE_KERNELS = {"varlen_schedule_kernel"}
DKDV_KERNELS = {"gdpa_bwd_dkdv_kernel", "gdpa_varlen_bwd_dkdv_kernel"}


def _expected(case) -> set[str]:
    dtype, d, _, variant, _ = case
    family = variant.split("_")[0]
    kernels = {"varlen": VARLEN_KERNELS, "tma": TMA_KERNELS, "schedule": SCHEDULE_KERNELS}.get(family, DENSE_KERNELS)
    if dtype != "fp32" and d > 128:
        # no tile carries both accumulators spill-free at this width: a dV pass, then a dK pass
        passes = {f"{name}:{part}" for name in kernels & DKDV_KERNELS for part in ("dv", "dk")}
        kernels = (kernels - DKDV_KERNELS) | passes
    return kernels


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sm100_compile(case, triton_reports, subtests):
    kernels = triton_reports.report({"case": list(case), "capability": 100})
    assert _expected(case) == set(kernels), sorted(kernels)
    for name, k in kernels.items():
        with subtests.test(f"{name}: cubin for sm_100a"):
            assert k["cubin_bytes"] > 0, "no cubin"
            assert k["target"] == "sm_100a"
        with subtests.test(f"{name}: no spills"):
            assert k["spill_stores"] == 0 and k["spill_loads"] == 0, (
                f"{k['spill_stores']} B spill stores, {k['spill_loads']} B spill loads "
                f"({k['registers']} registers, {k['num_warps']} warps)")
        if name in SCHEDULE_KERNELS | ROW_KERNELS:
            with subtests.test(f"{name}: no matmul"):
                assert k["tcgen05_mma"] == 0 and k["wgmma"] == 0
            continue
        if case[0] == "fp32":
            with subtests.test(f"{name}: no tanh.approx, no tensor cores in fp32"):
                assert k["tanh_approx"] == 0 and k["tcgen05_mma"] == 0 and k["wgmma"] == 0
            continue
        if name == "gdpa_fwd_tma_kernel":
            with subtests.test(f"{name}: TMA copies"):
                assert k["tma"] > 0, "no cp.async.bulk.tensor in the PTX"
        with subtests.test(f"{name}: tcgen05"):
            assert k["tcgen05_mma"] > 0 and k["wgmma"] == 0, (
                f"{k['tcgen05_mma']} tcgen05.mma, {k['wgmma']} wgmma: the matmuls are not on Blackwell's tensor cores")
        with subtests.test(f"{name}: tanh.approx"):
            assert k["tanh_approx"] > 0


@pytest.mark.parametrize("major, hopper", [(9, True), (10, False), (12, False)])
def test_the_cute_kernels_are_for_hopper_only(monkeypatch, major, hopper):
    """On a Blackwell GPU (compute capability 10 or 12) the CuTe Hopper kernels are refused with the reason, so the
    dispatch takes these Triton kernels; on sm_100 alone a dense forward may take the CuTe Blackwell forward once its
    build passes its self-check (tests/lowering/test_sm100_forward.py)."""
    monkeypatch.setattr(fwd_support, "cute_dsl_available", lambda: True)
    monkeypatch.setattr(fwd_support, "capability_major", lambda index: major)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ok, reason = fwd_support.machine_support(torch.device("cuda", 0))
    assert ok == hopper
    assert hopper or reason == "the CuTe kernel is built for sm_90 (Hopper)"
    assert fwd_support.on_sm100(torch.device("cuda", 0)) == (major == 10)
