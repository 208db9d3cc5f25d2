"""Compile reports of the CuTe-DSL kernels (``compile_reports`` keeps them, one compile per build), each for its
target: sm_90a for the Hopper kernels, or the spec's ``target`` (the Blackwell kernels' sm_100a).

A build costs 3-5 s on an idle core: cutlass-dsl's IR generation and MLIR passes (about 2-3 s), then ptxas and,
for a few builds, nvdisasm on the PTX (about 1 s). ``report_fingerprint`` names what every report depends on;
``compile_report`` is what a build reports, made in the compile worker this file runs as a script (cutlass-dsl
reads its dump directory, where ``--keep-ptx`` writes the PTX, once, when first imported: the worker sets it before
importing it; the target is the compile's own option, named by each build: ``kernel_args.TARGET_ARCH`` or the
plan's ``target``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

TARGET = "sm_90a"
# the targets a spec may name (``spec["target"]``, default ``TARGET``)
TARGETS = ("sm_90a", "sm_100a")
WORKER_ARGV = [sys.executable, str(Path(__file__).resolve())]


def report_fingerprint() -> str:
    """What every report depends on besides its spec: the kernel sources and the versions compiling them
    (``source_fingerprint``, computed afresh so that this process's cached value is left alone), the targets,
    Triton (its ptxas and nvdisasm) and this file (what is measured, and how)."""
    import triton

    from gdpa_inductor.kernels.cute.compile_cache import source_fingerprint

    kernels = getattr(source_fingerprint, "__wrapped__", source_fingerprint)()
    h = hashlib.sha256(f"{kernels} {' '.join(TARGETS)} triton={triton.__version__} ".encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:32]


# --- what a build reports (the worker's side) ---

def plan_fields(plan) -> dict:
    """A plan (``FwdPlan``, ``BwdPlan``) as a spec carries it: the fields of its compile key, ``dtype`` by torch's
    name."""
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.compare}
    return fields | {"dtype": str(plan.dtype).removeprefix("torch.")}


def plan_of(spec: dict):
    """The plan ``spec`` names: ``build`` "fwd" (an ``FwdPlan``), "bwd" (a ``BwdPlan``), "fwd_sm100" (an
    ``Sm100FwdPlan``) or "bwd_sm100" (an ``Sm100BwdPlan``), ``plan`` its fields (``plan_fields``)."""
    import torch

    from gdpa_inductor.kernels.cute.bwd_plan import BwdPlan, Sm100BwdPlan
    from gdpa_inductor.kernels.cute.fwd_plan import FwdPlan, Sm100FwdPlan

    fields = dict(spec["plan"])
    plan_type = {"fwd": FwdPlan, "bwd": BwdPlan, "fwd_sm100": Sm100FwdPlan, "bwd_sm100": Sm100BwdPlan}[spec["build"]]
    return plan_type(**(fields | {"dtype": getattr(torch, fields["dtype"])}))


def compile_ptx(spec: dict) -> str:
    """The PTX of the build of ``spec``'s plan (``plan_of``): ``kernel_build.compile_fwd``, ``compile_bwd``,
    ``compile_fwd_sm100`` or ``compile_bwd_sm100``."""
    from gdpa_inductor.kernels.cute.kernel_build import compile_bwd, compile_bwd_sm100, compile_fwd, compile_fwd_sm100

    build = {"fwd": compile_fwd, "bwd": compile_bwd, "fwd_sm100": compile_fwd_sm100,
             "bwd_sm100": compile_bwd_sm100}[spec["build"]]
    return build(plan_of(spec), keep_ptx=True).artifacts.PTX


def ptxas_and_sass(ptx: str, workdir: str, sass: bool = True, target: str = TARGET) -> tuple[str, str | None]:
    """ptxas -v's report on ``ptx`` (Triton's ptxas for ``target``) and nvdisasm's SASS of the cubin it wrote (None
    without ``sass``: the disassembly is a sixth of a build's time, and most tests read the PTX alone)."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(int(re.fullmatch(r"sm_(\d+)a?", target).group(1))).path
    ptx_path, cubin_path = os.path.join(workdir, "k.ptx"), os.path.join(workdir, "k.cubin")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    log = subprocess.run([ptxas, "-v", f"--gpu-name={target}", ptx_path, "-o", cubin_path],
                         capture_output=True, text=True, check=True).stderr
    if not sass:
        return log, None
    sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", cubin_path],
                          capture_output=True, text=True, check=True).stdout
    return log, sass


def extract_report(ptx: str, log: str, sass: str | None) -> dict:
    """The counts the compile tests assert on, from the PTX, ptxas's ``-v`` report and the SASS (its counts None
    where it was not disassembled, so that a test reading them fails instead of seeing zeros)."""
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not spills:
        raise ValueError(f"ptxas -v reported no spill line:\n{log[-2000:]}")
    return dict(
        target=re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1),
        wgmma=ptx.count("wgmma.mma_async"),
        wgmma_any=ptx.count("wgmma"),
        tcgen05_mma=len(re.findall(r"\btcgen05\.mma\b", ptx)),
        tcgen05_ld=len(re.findall(r"\btcgen05\.ld\b", ptx)),
        tcgen05_st=len(re.findall(r"\btcgen05\.st\b", ptx)),
        tcgen05_alloc=len(re.findall(r"\btcgen05\.alloc\b", ptx)),
        tcgen05_dealloc=len(re.findall(r"\btcgen05\.dealloc\b", ptx)),
        tmem_alloc_columns=_alloc_columns(ptx),
        tcgen05_commit=len(re.findall(r"\btcgen05\.commit\b", ptx)),
        tcgen05_wait_ld=ptx.count("tcgen05.wait::ld"),
        tcgen05_wait_st=ptx.count("tcgen05.wait::st"),
        st_global_v4=len(re.findall(r"\bst\.global\.v4\.", ptx)),
        registers=max((int(n) for n in re.findall(r"Used (\d+) registers", log)), default=None),
        mbarrier_init=len(re.findall(r"mbarrier\.init", ptx)),
        tma_loads=len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::cta\.global", ptx)),
        tma_stores=len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared::cta", ptx)),
        tma_reduce=len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
        bulk_reduce=len(re.findall(r"cp\.reduce\.async\.bulk\.global", ptx)),
        wgmma_n80=len(re.findall(r"wgmma\.mma_async\S*m64n80k16", ptx)),
        st_global=len(re.findall(r"\bst\.global\.", ptx)),
        stmatrix=ptx.count("stmatrix"),
        ldmatrix=ptx.count("ldmatrix"),
        red_v2_f32=len(re.findall(r"red\.global\.add\.v2\.f32", ptx)),
        red_v4_f32=len(re.findall(r"red\.global\.add\.v4\.f32", ptx)),
        st_shared_v4=len(re.findall(r"\bst\.shared\.v4\.", ptx)),
        count_acq_rel=len(re.findall(r"\batom\.global\.acq_rel(?:\.gpu)?\.add", ptx)),
        ld_global_cg_v4=ptx.count("ld.global.cg.v4.f32"),
        proxy_fence_global=ptx.count("fence.proxy.async.global"),
        count_reset=ptx.count("st.global.relaxed.gpu.b32"),
        zero_stores=len(re.findall(r"st\.global\.v4\.b32 \[%rd\d+\], \{ 0, 0, 0, 0 \}", ptx)),
        tma_5d=len(re.findall(r"cp\.(?:reduce\.)?async\.bulk\.tensor\.5d", ptx)),
        ld_global_s32=len(re.findall(r"\bld\.global\.\S*[bsu]32", ptx)),
        setmaxnreg=ptx.count("setmaxnreg."),
        tanh_approx=ptx.count("tanh.approx.f32"),
        tanh_approx_bf16x2=ptx.count("tanh.approx.bf16x2"),
        fma_bf16x2=ptx.count("fma.rn.bf16x2"),
        selp_f32=ptx.count("selp.f32"),
        add_f32=len(re.findall(r"\badd\.(?:rn\.)?(?:ftz\.)?f32", ptx)),
        mul_f32=len(re.findall(r"\bmul\.(?:rn\.)?(?:ftz\.)?f32", ptx)),
        fma_f32=len(re.findall(r"\bfma\.rn\.(?:ftz\.)?f32", ptx)),
        ld_global_32=len(re.findall(r"\bld\.global\.\S*[bf]32", ptx)),
        ld_global_pairs=len(re.findall(r"\bld\.global\.v2\.b16", ptx)),
        spill_stores=sum(int(s) for s, _ in spills),
        spill_loads=sum(int(x) for _, x in spills),
        wgmma_serialized="wgmma.mma_async instructions are serialized" in log,
        st_async=len(re.findall(r"\bst\.async\.shared::cluster\.mbarrier::complete_tx::bytes", ptx)),
        cluster_arrives=len(re.findall(r"\bmbarrier\.arrive\.release\.cluster\.shared::cluster", ptx)),
        named_barrier_arrives=len(re.findall(r"\bbarrier\.(?:cta\.)?arrive|\bbar\.arrive", ptx)),
        grid_size_reads=ptx.count("%nctaid.x"),
        sass_r2ur=None if sass is None else len(re.findall(r"\bR2UR\b", sass)),
        sass_sts128=None if sass is None else len(re.findall(r"\bSTS\.128\b", sass)),
    )


def _alloc_columns(ptx: str) -> int | None:
    """The column count of the PTX's one tcgen05.alloc (a register set by a mov just before it), else None."""
    found = re.search(r"mov\.b32\s+(%r\d+), (\d+);\s*\n(?:.*\n){0,3}?\s*tcgen05\.alloc\S*\s+\[[^]]+\], \1;", ptx)
    return int(found.group(2)) if found else None


def compile_report(spec: dict, workdir: str) -> dict:
    """The build's counts (``extract_report``), its SASS disassembled where ``spec["sass"]`` asks, and the
    deprecation warnings raised while it was built (``deprecations``: an API that a pinned cutlass-dsl still has
    but a later one may not)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeprecationWarning)
            ptx = compile_ptx(spec)
        log, sass = ptxas_and_sass(ptx, workdir, spec.get("sass", True), spec.get("target", TARGET))
    finally:
        _clear_dumps(workdir)
    deprecations = sorted({f"{w.message} ({Path(w.filename).name}:{w.lineno})" for w in caught
                           if issubclass(w.category, DeprecationWarning)})
    return {**extract_report(ptx, log, sass), "deprecations": deprecations}


def _clear_dumps(workdir: str) -> None:
    """The PTX cutlass-dsl dumped for the build just reported (``--keep-ptx``): read from memory, not needed."""
    for name in os.listdir(workdir):
        if name.endswith((".ptx", ".cubin")):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(workdir, name))


def main() -> None:
    """The compile worker: cutlass-dsl's own settings (kept files, compiler options) would change what is
    measured, so only ours are set, before the imports (cutlass-dsl reads them there)."""
    for name in [k for k in os.environ if k.startswith("CUTE_DSL_")]:
        del os.environ[name]
    os.environ.update(CUTE_DSL_DUMP_DIR=os.getcwd())
    import torch  # noqa: F401
    from compile_reports import serve  # this file's folder leads sys.path when it runs as a script

    from gdpa_inductor.kernels.cute import kernel_build  # noqa: F401

    serve(compile_report)


if __name__ == "__main__":
    main()
