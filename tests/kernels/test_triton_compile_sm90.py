"""The Triton kernels compile for an H100 (sm_90a) without a GPU: cubin produced, the matmuls lowered to
wgmma, tanh.approx used for the half-precision activations, and register spills within a budget.

Each case runs in a subprocess without TRITON_INTERPRET (the interpreter replaces every @triton.jit
function, so nothing could be compiled in this process). The subprocess is this file run as a script. It
drives the package's own launchers (gdpa_fwd_triton, gdpa_bwd_triton, and the varlen ones, whose sample
schedule is built by its torch fallback on CPU tensors) on CPU tensors of a typical shape,
with a stand-in driver that reports an sm_90 target, and turns each kernel launch into a compile-only
warmup: the kernels are therefore compiled with exactly the block sizes, warps, stages, flags and argument
specializations (16-byte alignment, unit strides) that a real launch on an H100 would use. The register
report comes from the ptxas that Triton ships, run on the PTX with Triton's own ptxas flags.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

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
VARLEN_KERNELS = {"gdpa_varlen_fwd_kernel", "gdpa_varlen_bwd_dkdv_kernel", "gdpa_varlen_bwd_dq_kernel"}
BATCH, HEADS = 2, 4
# Bytes of spill stores/loads per thread allowed per kernel. The tiles the launchers use are the fastest
# measured on an H200 (docs/benchmarks.md), and several of them spill a little under this Triton's ptxas
# (up to ~1.6 KB: the short-kv forward with a bias at D=128); spill-free tiles measured up to 29% slower.
# The budget catches the failure that matters: tiles whose accumulators no longer fit at all (e.g. a
# 4-warp 32x128 dK/dV tile spills 2.5 KB at D=128 and 11 KB at D=256).
SPILL_BUDGET = 2048


def _case_id(case) -> str:
    dtype, d, act, variant, kv_len = case
    return f"{dtype}-D{d}-{act}-{variant}-kv{kv_len}"


def _compile_in_subprocess(case) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(case)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"compile subprocess failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_sm90_compile(case, subtests):
    """One compile per case (seconds each); the properties are reported as separate subtests."""
    kernels = _compile_in_subprocess(case)
    variant = case[3]
    expected = {"varlen": VARLEN_KERNELS, "tma": TMA_KERNELS}.get(variant.split("_")[0], DENSE_KERNELS)
    assert expected == set(kernels), sorted(kernels)
    for name, k in kernels.items():
        with subtests.test(f"{name}: cubin for sm_90a"):
            assert k["cubin_bytes"] > 0, "no cubin"
            assert k["target"] == "sm_90a"
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


def _compile_case(case) -> dict:
    """Runs in the subprocess: compiles every kernel the launchers start for ``case``; returns a report."""

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    from gdpa_inductor.kernels.triton import gdpa_bwd, gdpa_fwd, gdpa_fwd_tma, layout, varlen_bwd, varlen_fwd
    from gdpa_inductor.kernels.triton.varlen_layout import with_tensor
    from gdpa_inductor.kernels.triton.varlen_schedule import varlen_sides

    assert not layout.interpreting()
    dtype_name, d, activation, variant, seq_len = case
    capability = 90

    class SM90Driver:
        """Just what JITFunction.run asks of the driver before compiling."""

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

    triton.runtime.driver.set_active(SM90Driver())

    # The launchers choose TANH_APPROX from the tensors' device; the tensors here are CPU stand-ins for
    # CUDA ones.
    real_flags = layout.kernel_flags
    modules = (gdpa_fwd, gdpa_fwd_tma, gdpa_bwd, varlen_fwd, varlen_bwd)
    # The TMA forward is chosen only on a Hopper GPU; the "tma" cases stand the CPU tensors in for one.
    gdpa_fwd_tma.on_tma_gpu = lambda device: variant.startswith("tma")
    for module in modules:
        module.kernel_flags = lambda dtype, device: real_flags(dtype, torch.device("cuda"))

    compiled = {}
    for module in modules:
        for kernel in vars(module).values():
            if isinstance(kernel, JITFunction) and kernel.__name__.endswith("_kernel"):
                def compile_only(*args, grid, warmup, _kernel=kernel, **kwargs):
                    compiled[_kernel.__name__] = JITFunction.run(_kernel, *args, grid=grid, warmup=True, **kwargs)

                kernel.run = compile_only

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(0)
    if variant.startswith("varlen"):
        lengths = torch.tensor([seq_len, seq_len // 2, 1], dtype=torch.int32)
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
        total = int(cu[-1])
        q, k, v, dout = (torch.randn(total, HEADS, d, generator=gen).to(dtype) for _ in range(4))
        side, kside, order = varlen_sides(q, k, cu, cu, None, None, seq_len, seq_len, lengths.numel())
        params = (activation, d**-0.5, 1.0, variant == "varlen_window",
                  (64, 0) if variant == "varlen_window" else (-1, -1), 0.01)
        # a relative bias shared by the samples, with its gradient: one slice per sample (plain stores) at long
        # kv; at short kv a one-byte budget forces the grouped, atomic dBias path
        bias = torch.randn(HEADS, seq_len, seq_len, generator=gen).to(dtype) if variant == "varlen_bias" else None
        if seq_len <= 256:
            varlen_bwd.FULL_GRAD_BUFFER_BYTES = 1
        varlen_fwd.gdpa_varlen_fwd_triton(side, kside, v, bias, with_tensor(side, dout), order, *params)
        varlen_bwd.gdpa_varlen_bwd_triton(with_tensor(side, dout), side, kside, v, bias, order, *params,
                                          bias is not None)
        return _report(compiled, capability)
    q, k, v, dout = (torch.randn(BATCH, HEADS, seq_len, d, generator=gen).to(dtype) for _ in range(4))
    bias = torch.randn(BATCH, HEADS, seq_len, seq_len, generator=gen).to(dtype) if variant == "bias" else None
    args = (bias, activation, d**-0.5, 1.0, variant in ("causal", "tma_causal"), 0.01)
    gdpa_fwd.gdpa_fwd_triton(q, k, v, *args)
    gdpa_bwd.gdpa_bwd_triton(dout, q, k, v, *args, bias is not None)
    return _report(compiled, capability)


def _report(compiled: dict, capability: int) -> dict:
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    arch = sm_arch_from_capability(capability)
    report = {}
    for name, kernel in compiled.items():
        ptx = kernel.asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            # The flags Triton's own make_cubin passes (triton/backends/nvidia/compiler.py).
            cmd = [get_ptxas(capability).path, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={arch}",
                   src, "-o", os.path.join(tmp, "k.cubin")]
            log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        registers = re.findall(r"Used (\d+) registers", log)
        assert len(spills) == 1 and len(registers) == 1, log
        target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        report[name] = dict(
            cubin_bytes=len(kernel.asm["cubin"]),
            target=target,
            wgmma=ptx.count("wgmma.mma_async"),
            tanh_approx=ptx.count("tanh.approx.f32"),
            tma=ptx.count("cp.async.bulk.tensor"),
            spill_stores=int(spills[0][0]),
            spill_loads=int(spills[0][1]),
            registers=int(registers[0]),
            num_warps=kernel.metadata.num_warps,
        )
    return report


if __name__ == "__main__":
    print(json.dumps(_compile_case(tuple(json.loads(sys.argv[1])))))
