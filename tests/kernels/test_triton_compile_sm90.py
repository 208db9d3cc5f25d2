"""The Triton kernels compile for an H100 (sm_90a) without a GPU: cubin produced, the matmuls lowered to
wgmma, tanh.approx used for the half-precision activations, and register spills within a budget.

Each case is compiled once per run, by the first xdist worker that needs it, in a compile subprocess that
drives the package's own launchers as an H100 launch would (``triton_compile_reports``), and its report kept
on disk for the next run until the package's sources, Triton or what is measured change (``compile_reports``).
"""

from __future__ import annotations

import pytest
from triton_compile_reports import case_id

# (dtype, head dim, activation, variant, kv length). The launchers pick tiles by kv length (short kv: fewer
# warps and stages), so both regimes are compiled: bf16 over both activations and all variants at short kv;
# fp16 (the same code with another element type) at long kv, in the most register-hungry variant (bias
# with dBias).
CASES = [
    ("bf16", d, act, variant, 256)
    for d in (64, 128)
    for act in ("gelu", "silu")
    for variant in ("plain", "causal", "bias")
] + [("fp16", d, "gelu", "bias", 2048) for d in (64, 128)] + [
    # the varlen kernels (jagged q and kv): plain at long kv; HSTU's causal window at short kv
    ("bf16", 128, "silu", "varlen", 2048),
    ("bf16", 128, "silu", "varlen_window", 256),
    ("bf16", 64, "gelu", "varlen_window", 512),
    ("bf16", 128, "silu", "varlen_bias", 256),
    ("bf16", 128, "silu", "varlen_bias", 1024),
    # the TMA forward (Hopper; no bias): short and long kv, causal
    ("bf16", 128, "gelu_tanh", "tma", 256),
    ("bf16", 64, "silu", "tma_causal", 2048),
    ("fp16", 128, "silu", "tma", 2048),
    # fp32 keeps fp32 accuracy: no tanh.approx (its ~2^-11 error is a bf16-sized error)
    ("fp32", 64, "gelu_tanh", "plain", 256),
    ("fp32", 64, "silu", "plain", 256),
]
DENSE_KERNELS = {"gdpa_fwd_kernel", "gdpa_bwd_dkdv_kernel", "gdpa_bwd_dq_kernel"}
TMA_KERNELS = {"gdpa_fwd_tma_kernel", "gdpa_bwd_dkdv_kernel", "gdpa_bwd_dq_kernel"}
VARLEN_KERNELS = {"gdpa_varlen_fwd_kernel", "gdpa_varlen_bwd_dkdv_kernel", "gdpa_varlen_bwd_dq_kernel",
                  "varlen_zero_gaps_kernel"}
# kernels that only move rows: no matmul, no activation
ROW_KERNELS = {"varlen_zero_gaps_kernel"}
# Bytes of spill stores/loads per thread allowed per kernel. The tiles the launchers use are the fastest
# measured on an H200 (docs/benchmarks.md), and several of them spill a little under this Triton's ptxas
# (up to ~1.6 KB: the short-kv forward with a bias at D=128); spill-free tiles measured up to 29% slower.
# The budget catches the failure that matters: tiles whose accumulators no longer fit at all (e.g. a
# 4-warp 32x128 dK/dV tile spills 2.5 KB at D=128 and 11 KB at D=256).
SPILL_BUDGET = 2048


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sm90_compile(case, triton_reports, subtests):
    """One compile per case (seconds each); the properties are reported as separate subtests."""
    kernels = triton_reports.report({"case": list(case)})
    variant = case[3]
    expected = {"varlen": VARLEN_KERNELS, "tma": TMA_KERNELS}.get(variant.split("_")[0], DENSE_KERNELS)
    assert expected == set(kernels), sorted(kernels)
    for name, k in kernels.items():
        with subtests.test(f"{name}: cubin for sm_90a"):
            assert k["cubin_bytes"] > 0, "no cubin"
            assert k["target"] == "sm_90a"
        if name in ROW_KERNELS:
            with subtests.test(f"{name}: no spills, no matmul"):
                assert k["spill_stores"] == 0 and k["spill_loads"] == 0 and k["wgmma"] == 0
            continue
        if case[0] == "fp32":
            # The fp32 path is for accuracy: IEEE dots (no TF32, so no wgmma) on the half-precision tiles,
            # which spill there; what is checked is that no approximate special function is used.
            with subtests.test(f"{name}: no tanh.approx in fp32"):
                assert k["tanh_approx"] == 0, f"{case[2]} in fp32 must not use tanh.approx.f32"
            continue
        if name == "gdpa_fwd_tma_kernel":
            with subtests.test(f"{name}: TMA copies"):
                assert k["tma"] > 0, "no cp.async.bulk.tensor in the PTX: the descriptors are not lowered to TMA"
        with subtests.test(f"{name}: wgmma"):
            assert k["wgmma"] > 0, "no wgmma.mma_async in the PTX: the matmuls are not on Hopper's tensor-core path"
        with subtests.test(f"{name}: tanh.approx"):
            assert k["tanh_approx"] > 0, f"{case[2]} in half precision should use tanh.approx.f32"
        with subtests.test(f"{name}: spills within budget"):
            assert k["spill_stores"] <= SPILL_BUDGET and k["spill_loads"] <= SPILL_BUDGET, (
                f"{k['spill_stores']} B spill stores, {k['spill_loads']} B spill loads "
                f"({k['registers']} registers, {k['num_warps']} warps); budget {SPILL_BUDGET} B"
            )


@pytest.mark.parametrize("case", [("bf16", 64, "gelu", "bias", 256), ("bf16", 64, "gelu_tanh", "varlen_bias", 256)],
                         ids=case_id)
def test_float_arguments_typed_fp64_compute_in_fp32(case, triton_reports):
    """A compiled graph that launches a kernel itself passes its Python floats typed fp64 (Inductor's choice): the
    kernels convert them, so no score reaches the fp32-only tanh.approx as fp64."""
    kernels = triton_reports.report({"case": list(case), "fp64_floats": True})
    assert set(kernels) == {"varlen": VARLEN_KERNELS - ROW_KERNELS}.get(case[3].split("_")[0], DENSE_KERNELS)
    assert all(lines == [] for lines in kernels.values()), kernels
