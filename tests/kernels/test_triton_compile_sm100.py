"""The Triton kernels compile for a B200 (sm_100a) without a GPU: cubin produced, the matmuls lowered to Blackwell's
tensor-core instructions (tcgen05.mma, accumulators in tensor memory), tanh.approx for the half-precision
activations, and register spills within the Hopper budget. No Blackwell GPU has run them: this is what a CPU can
check. On sm_100 the dispatch takes these kernels (the CuTe kernels are built for sm_90 only).

The compiles go through the same worker and report store as the sm_90a checks (``triton_compile_reports``), with
the case's target set to compute capability 10.0.
"""

from __future__ import annotations

import pytest
import torch
from test_triton_compile_sm90 import DENSE_KERNELS, SPILL_BUDGET, TMA_KERNELS, VARLEN_KERNELS
from triton_compile_reports import case_id

from gdpa_inductor.kernels.cute import fwd_support

# (dtype, head dim, activation, variant, kv length): each kernel family at short and long kv, with and without the
# masks and the bias, in both half-precision dtypes, and fp32 (IEEE dots: no tensor cores, no tanh.approx).
CASES = [
    ("bf16", 128, "silu", "plain", 256),
    ("bf16", 64, "gelu", "causal", 256),
    ("bf16", 128, "gelu", "bias", 256),
    ("fp16", 128, "gelu", "bias", 2048),
    ("bf16", 128, "silu", "varlen", 2048),
    ("bf16", 128, "silu", "varlen_window", 256),
    ("bf16", 128, "silu", "varlen_bias", 1024),
    ("bf16", 128, "gelu_tanh", "tma", 256),
    ("bf16", 64, "silu", "tma_causal", 2048),
    ("fp32", 64, "silu", "plain", 256),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sm100_compile(case, triton_reports, subtests):
    kernels = triton_reports.report({"case": list(case), "capability": 100})
    variant = case[3]
    expected = {"varlen": VARLEN_KERNELS, "tma": TMA_KERNELS}.get(variant.split("_")[0], DENSE_KERNELS)
    assert expected == set(kernels), sorted(kernels)
    for name, k in kernels.items():
        with subtests.test(f"{name}: cubin for sm_100a"):
            assert k["cubin_bytes"] > 0, "no cubin"
            assert k["target"] == "sm_100a"
        if case[0] == "fp32":
            with subtests.test(f"{name}: no tanh.approx in fp32"):
                assert k["tanh_approx"] == 0
            continue
        if name == "gdpa_fwd_tma_kernel":
            with subtests.test(f"{name}: TMA copies"):
                assert k["tma"] > 0, "no cp.async.bulk.tensor in the PTX"
        with subtests.test(f"{name}: tcgen05"):
            assert k["tcgen05_mma"] > 0 and k["wgmma"] == 0, (
                f"{k['tcgen05_mma']} tcgen05.mma, {k['wgmma']} wgmma: the matmuls are not on Blackwell's tensor cores")
        with subtests.test(f"{name}: tanh.approx"):
            assert k["tanh_approx"] > 0
        with subtests.test(f"{name}: spills within budget"):
            assert k["spill_stores"] <= SPILL_BUDGET and k["spill_loads"] <= SPILL_BUDGET, (
                f"{k['spill_stores']} B spill stores, {k['spill_loads']} B spill loads "
                f"({k['registers']} registers, {k['num_warps']} warps); budget {SPILL_BUDGET} B")


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
