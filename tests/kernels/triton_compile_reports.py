"""Compile reports of the Triton kernels for sm_90a and sm_100a (``compile_reports`` keeps them, one compile per
case).

A case drives the package's own launchers (gdpa_fwd_triton, gdpa_bwd_triton, and the varlen ones, whose sample
schedule is built by its torch fallback on CPU tensors; a "schedule" case compiles the schedule's kernel) on CPU
tensors of a typical shape, with a stand-in driver that reports the case's target (sm_90 unless the spec says
``capability``), the launchers told that the tensors are on a GPU of that capability (their tiles and flags follow
it), and each kernel launch turned into a compile-only warmup: the kernels are therefore compiled with exactly the
block sizes, warps, stages, flags and argument specializations (16-byte alignment, unit strides) that a real launch
on an H100 (or a B200) would use.
The register report is the one Triton's own ptxas run prints (``knobs.nvidia.dump_ptxas_log``), so each kernel goes
through ptxas once.

The compiles run in the worker this file runs as a script, without TRITON_INTERPRET (the interpreter replaces
every @triton.jit function, so nothing could be compiled in the pytest process), with a Triton cache of its own:
a kernel found in a shared cache would skip ptxas and print no report.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER_ARGV = [sys.executable, str(Path(__file__).resolve())]
PACKAGE = Path(__file__).resolve().parents[2] / "gdpa_inductor"
BATCH, HEADS = 2, 4


def case_id(case) -> str:
    """A test id for a (dtype, head dim, activation, variant, kv length) case."""
    dtype, d, act, variant, kv_len = case
    return f"{dtype}-D{d}-{act}-{variant}-kv{kv_len}"


def report_fingerprint() -> str:
    """What every report depends on besides its case: the package's sources (the launchers choose the tiles),
    Triton's version (its compiler and ptxas) and this file (what is measured, and how)."""
    import triton

    h = hashlib.sha256(f"triton={triton.__version__} ".encode())
    for src in sorted(PACKAGE.rglob("*.py")):
        h.update(str(src.relative_to(PACKAGE)).encode())
        h.update(src.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:32]


def _pass_suffix(kwargs) -> str:
    """A dK/dV kernel launched for one of its two passes (``tile_configs.dkdv_passes``) is reported apart:
    ``<kernel>:dv`` and ``<kernel>:dk``."""
    with_dk, with_dv = kwargs.get("WITH_DK", True), kwargs.get("WITH_DV", True)
    return "" if with_dk and with_dv else ":dk" if with_dk else ":dv"


class _Compiles:
    """The kernels one case compiled, by name, and each compiled kernel's ptxas log, by its hash: a kernel that
    a previous case of this worker compiled comes from Triton's cache without a new log."""

    def __init__(self):
        self.kernels: dict = {}
        self.logs: dict[str, str] = {}

    def compile_only(self, kernel, args, grid, kwargs):
        from triton.runtime.jit import JITFunction

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            compiled = JITFunction.run(kernel, *args, grid=grid, warmup=True, **kwargs)
        if "Compiling entry function" in printed.getvalue():
            self.logs[compiled.hash] = printed.getvalue()
        self.kernels[kernel.__name__ + _pass_suffix(kwargs)] = compiled


def compile_case(case, compiles: _Compiles, capability: int = 90) -> dict:
    """Compiles every kernel the launchers start for ``case`` on a GPU of ``capability`` (90: H100, 100: B200);
    returns a report per kernel."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    from gdpa_inductor.kernels.common.varlen_rows import with_tensor
    from gdpa_inductor.kernels.triton import (
        gdpa_bwd,
        gdpa_fwd,
        gdpa_fwd_tma,
        layout,
        tma_support,
        varlen_bwd,
        varlen_fwd,
        varlen_gaps,
        varlen_schedule,
    )
    from gdpa_inductor.kernels.triton.varlen_schedule import varlen_sides

    assert not layout.interpreting()
    dtype_name, d, activation, variant, seq_len = case

    class SM90Driver:
        """Just what JITFunction.run asks of the driver before compiling."""

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

    triton.runtime.driver.set_active(SM90Driver())

    # The launchers choose TANH_APPROX and the tiles from the tensors' device; the tensors here are CPU stand-ins
    # for CUDA ones.
    real_flags = layout.kernel_flags
    modules = (gdpa_fwd, gdpa_fwd_tma, gdpa_bwd, varlen_fwd, varlen_bwd)
    # The TMA forward is chosen only on a Hopper GPU; the "tma" cases stand the CPU tensors in for one.
    tma_support.on_tma_gpu = lambda device: variant.startswith("tma")
    for module in modules:
        module.kernel_flags = lambda dtype, device: real_flags(dtype, torch.device("cuda"))
        if hasattr(module, "tile_capability"):
            module.tile_capability = lambda device: capability // 10

    compiles.kernels = {}
    for module in (*modules, varlen_gaps, varlen_schedule):
        for kernel in vars(module).values():
            if isinstance(kernel, JITFunction) and kernel.__name__.endswith("_kernel"):
                def compile_only(*args, grid, warmup, _kernel=kernel, **kwargs):
                    compiles.compile_only(_kernel, args, grid, kwargs)

                kernel.run = compile_only

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(0)
    if variant == "schedule":
        # the varlen sample schedule of ``seq_len`` jagged samples (the kernel a CUDA call launches; CPU tensors
        # otherwise take the torch ops)
        cu = torch.arange(seq_len + 1, dtype=torch.int32)
        q = torch.randn(seq_len, HEADS, d, generator=gen).to(dtype)
        varlen_schedule.interpreting = lambda: True
        try:
            varlen_sides(q, q, cu, cu, None, None, 1, 1, seq_len)
        finally:
            varlen_schedule.interpreting = layout.interpreting
        return _report(compiles, capability)
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
        full_grad_buffer_bytes = varlen_bwd.FULL_GRAD_BUFFER_BYTES
        if seq_len <= 256:
            varlen_bwd.FULL_GRAD_BUFFER_BYTES = 1
        try:
            varlen_fwd.gdpa_varlen_fwd_triton(side, kside, v, bias, with_tensor(side, dout), order, *params)
            varlen_bwd.gdpa_varlen_bwd_triton(with_tensor(side, dout), side, kside, v, bias, order, *params,
                                              bias is not None)
        finally:
            varlen_bwd.FULL_GRAD_BUFFER_BYTES = full_grad_buffer_bytes
        return _report(compiles, capability)
    q, k, v, dout = (torch.randn(BATCH, HEADS, seq_len, d, generator=gen).to(dtype) for _ in range(4))
    bias = torch.randn(BATCH, HEADS, seq_len, seq_len, generator=gen).to(dtype) if variant == "bias" else None
    args = (bias, activation, d**-0.5, 1.0, variant in ("causal", "tma_causal"), 0.01)
    gdpa_fwd.gdpa_fwd_triton(q, k, v, *args)
    gdpa_bwd.gdpa_bwd_triton(dout, q, k, v, *args, bias is not None)
    return _report(compiles, capability)


def _ptxas_log(ptx: str, capability: int) -> str:
    """ptxas -v on ``ptx`` with the flags Triton's own make_cubin passes (triton/backends/nvidia/compiler.py):
    for a kernel whose compile printed no log (a Triton without ``dump_ptxas_log``)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(capability).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
               f"--gpu-name={sm_arch_from_capability(capability)}", src, "-o", os.path.join(tmp, "k.cubin")]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stderr


def _report(compiles: _Compiles, capability: int) -> dict:
    report = {}
    for name, kernel in compiles.kernels.items():
        ptx = kernel.asm["ptx"]
        log = compiles.logs.get(kernel.hash) or _ptxas_log(ptx, capability)
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        registers = re.findall(r"Used (\d+) registers", log)
        assert len(spills) == 1 and len(registers) == 1, log
        target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
        report[name] = dict(
            cubin_bytes=len(kernel.asm["cubin"]),
            target=target,
            wgmma=ptx.count("wgmma.mma_async"),
            tcgen05_mma=len(re.findall(r"\btcgen05\.mma\b", ptx)),
            tanh_approx=ptx.count("tanh.approx.f32"),
            tma=ptx.count("cp.async.bulk.tensor"),
            spill_stores=int(spills[0][0]),
            spill_loads=int(spills[0][1]),
            registers=int(registers[0]),
            num_warps=kernel.metadata.num_warps,
        )
    return report


def fp64_float_report(compiles: _Compiles, capability: int) -> dict:
    """Each kernel of the case compiled again with its float arguments typed fp64, as the code Inductor emits for a
    kernel a compiled graph launches itself passes Python floats: per kernel, the lines of its Triton IR that
    compute in fp64 (conversions to fp32 aside)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report = {}
    for name, kernel in compiles.kernels.items():
        src = kernel.src
        signature = {k: "fp64" if t == "fp32" else t for k, t in src.signature.items()}
        if signature == src.signature:  # a kernel that only moves rows: no float to type
            continue
        ttir = _ttir(ASTSource(src.fn, signature, src.constants, src.attrs), GPUTarget("cuda", capability, 32),
                     dict(num_warps=kernel.metadata.num_warps, num_stages=kernel.metadata.num_stages))
        report[name] = [line.strip() for line in ttir.splitlines()
                        if "f64" in line and "arith.truncf" not in line and "tt.func" not in line]
    return report


def _ttir(src, target, options: dict) -> str:
    """The Triton IR ``triton.compile`` makes of ``src`` (its first stage), without the later stages and ptxas,
    which cost most of a compile and which the fp64 report does not read."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    options = backend.parse_options(options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    stages = {}
    backend.add_stages(stages, options, src.language)
    return str(stages["ttir"](module, {"target": target, **options.__dict__}))


def main() -> None:
    """The compile worker: a Triton cache of its own (in its working directory, removed when it stops) and
    ptxas's log printed for every compile, set before Triton is imported."""
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_CACHE_DIR"] = os.path.join(os.getcwd(), "triton_cache")
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    import torch  # noqa: F401
    import triton  # noqa: F401
    from compile_reports import serve  # this file's folder leads sys.path when it runs as a script

    compiles = _Compiles()

    def compile_spec(spec, workdir):
        report = compile_case(tuple(spec["case"]), compiles, spec.get("capability", 90))
        if spec.get("fp64_floats"):
            return fp64_float_report(compiles, spec.get("capability", 90))
        return report

    serve(compile_spec)


if __name__ == "__main__":
    main()
