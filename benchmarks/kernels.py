"""The CuTe-DSL Hopper kernels, dense, against the Triton kernels and softmax attention: the forward (``fwd``), the
backward (``bwd``), other head dims (``head-dims``), the causal mask (``causal``) and how the backward sums dQ
(``dq-sums``). GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider.

    PYTHONPATH=$PWD python3 benchmarks/kernels.py <benchmark> [options]   # <benchmark> --help: what it measures
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F
import triton

from benchmarks.harness.checks import rel_err
from benchmarks.harness.cli import Benchmark, add_cute_options, main
from benchmarks.harness.operands import CHECK_CASES, META_SHAPES, fresh_operands
from benchmarks.harness.plotting import draw
from benchmarks.harness.providers import fa4_function, fa4_providers
from benchmarks.harness.results import run_meta, write_json
from benchmarks.harness.timing import SETTLE_MS, median_over_rounds, time_by_pass, warm_up_gpu
from gdpa_inductor.kernels.activations import get_activation
from gdpa_inductor.kernels.cute.bwd_plan import DQ_SUMS, BwdPlan, bwd_query_tile, dq_last_round_for
from gdpa_inductor.kernels.cute.bwd_support import bwd_supported
from gdpa_inductor.kernels.cute.fwd_plan import fwd_schedule, plan_fwd
from gdpa_inductor.kernels.cute.fwd_support import fwd_supported
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute, plan_dense_bwd
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute, plan_dense_fwd
from gdpa_inductor.kernels.cute.kernel_build import compile_bwd, compile_fwd
from gdpa_inductor.kernels.reference import band_keep_mask, gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

# ---- fwd -------------------------------------------------------------------------------------------------------------


def fwd_correctness(rows):
    torch.manual_seed(0)
    ok = True
    for act, dtype, z, h, hkv, nq, nk, d in CHECK_CASES:
        q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype)
        k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype)
        v = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype)
        scale, post = d**-0.5, 1.0 / nk
        supported, why = fwd_supported(q, k, v, None, False, act)
        ref = gdpa_reference(q.double(), k.double(), v.double(), None, act, scale, post)
        tri = rel_err(gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01), ref)
        err = rel_err(gdpa_fwd_cute(q, k, v, act, scale, post, 0.01), ref) if supported else float("nan")
        passed = supported and err <= 2 * tri + 1e-4
        ok &= passed
        row = dict(kind="check", act=act, dtype=str(dtype), z=z, h=h, hkv=hkv, nq=nq, nk=nk, d=d,
                   cute_err=err, triton_err=tri, passed=passed, why=why)
        rows.append(row)
        print(row, flush=True)
    # NaN/Inf inputs as in the Triton kernel (a non-finite query row must not leak into padded keys)
    q = torch.randn(1, 2, 130, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 200, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q[0, 0, 3, 5] = float("inf")
    a = gdpa_fwd_cute(q, k, v, "relu", 1.0, 1.0, 0.01)
    b = gdpa_fwd_triton(q, k, v, None, "relu", 1.0, 1.0, False, 0.01)
    same_nan = torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
    ok &= same_nan
    rows.append(dict(kind="check_nonfinite", same_nan_inf_pattern=same_nan))
    print("non-finite pattern equal:", same_nan, flush=True)
    return ok


def fwd_timing(rows, batch, heads, act):
    fa4 = fa4_function()
    for d in (128, 64):
        for nq, nk in META_SHAPES:
            q = torch.randn(batch, heads, nq, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, heads, nk, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            flops = 4.0 * batch * heads * nq * nk * d
            scale, post = d**-0.5, 1.0 / nk
            providers = {
                "cute": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                "triton": lambda: gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01),
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
            }
            if fa4 is not None:
                qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                providers["fa4"] = lambda: fa4(qb, kb, vb, softmax_scale=scale)
            row = dict(kind="fwd", d=d, nq=nq, nk=nk, batch=batch, heads=heads)
            for name, ms in median_over_rounds(providers, settle_ms=SETTLE_MS).items():
                if ms is not None:
                    row[name] = flops / ms * 1e-9
            for other in ("triton", "sdpa", "fa4"):
                if "cute" in row and other in row:
                    row[f"cute_vs_{other}"] = row["cute"] / row[other]
            rows.append(row)
            print({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def fwd_options(ap):
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--activation", default="gelu_tanh")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--out", default=None)


def run_fwd(args):
    """CuTe-DSL Hopper forward vs the Triton forward vs softmax SDPA (and flash-attn-4's SM90 forward when it
    imports), one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

    First a correctness sweep of the CuTe kernel against a float64 reference (every activation, ragged lengths,
    GQA, D in {64, 128}, fp16/bf16), next to the Triton kernel's error at the same inputs; then forward TF/s at
    Meta's shapes (B=1152, H=4; D=128 and D=64): each provider's do_bench median in three rounds of rotated order,
    each provider first running untimed for ``SETTLE_MS`` so the clocks settle to its own load, the median of those
    (``median_over_rounds``).

        PYTHONPATH=$PWD python3 benchmarks/kernels.py fwd --out benchmarks/results/<run>/cute_fwd   # .json, .png
    """
    rows = []
    t = time.time()
    compile_fwd(plan_fwd(torch.bfloat16, 128, args.activation))
    rows.append(dict(kind="compile_s", seconds=time.time() - t))
    print("compile", time.time() - t, flush=True)
    ok = True if args.skip_check else fwd_correctness(rows)
    print("CORRECT" if ok else "MISMATCH", flush=True)
    warm_up_gpu(3.0)
    fwd_timing(rows, args.batch, args.heads, args.activation)
    if args.out:
        results = dict(run_meta(benchmark=args.benchmark, activation=args.activation), rows=rows)
        write_json(args.out + ".json", results)
        draw(results, args.out + ".png")


# ---- bwd -------------------------------------------------------------------------------------------------------------


def bwd_correctness(rows):
    torch.manual_seed(0)
    cases = CHECK_CASES + [("gelu_tanh", torch.bfloat16, 2, 4, 4, 2048, 256, 128)]
    ok = True
    for act, dtype, z, h, hkv, nq, nk, d in cases:
        q = torch.randn(z, h, nq, d, device="cuda", dtype=dtype)
        k = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype)
        v = torch.randn(z, hkv, nk, d, device="cuda", dtype=dtype)
        do = torch.randn(z, h, nq, d, device="cuda", dtype=dtype)
        scale, post = d**-0.5, 1.0 / nk
        supported, why = bwd_supported(q, k, v, None, False, act)
        ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale, post)
        tri = gdpa_bwd_triton(do, q, k, v, None, act, scale, post, False, 0.01, False)
        got = gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01) if supported else (None,) * 3
        row = dict(kind="check", act=act, dtype=str(dtype), z=z, h=h, hkv=hkv, nq=nq, nk=nk, d=d, why=why)
        passed = supported
        for name, g, t, r in zip(("dq", "dk", "dv"), got, tri[:3], ref[:3]):
            te = rel_err(t, r)
            ce = rel_err(g, r) if g is not None else float("nan")
            row[f"{name}_cute"], row[f"{name}_triton"] = ce, te
            passed = passed and ce <= 2 * te + 1e-4
        row["passed"] = passed
        ok &= passed
        rows.append(row)
        print(row, flush=True)
    return ok


def bwd_tflops(ms, z, h, nq, nk, d, factor):
    return factor * 4 * z * h * nq * nk * d / ms / 1e9


def bwd_timing(rows, d, batch, act="gelu_tanh"):
    from_fa4 = fa4_function()
    h = 4
    for nq, nk in META_SHAPES:
        # the previous shape's tensors go before the allocator cache is emptied
        q = k = v = do = fns = qs = ks = vs = dos = qt = kt = vt = None
        z, q, k, v, do = fresh_operands(batch, h, nq, nk, d, d)
        scale, post = d**-0.5, 1.0 / nk
        row = dict(kind="time", d=d, z=z, nq=nq, nk=nk)
        fns = {
            "cute_bwd": lambda: gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01),
            "triton_bwd": lambda: gdpa_bwd_triton(do, q, k, v, None, act, scale, post, False, 0.01, False),
            "cute_fb": lambda: (gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                                gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01)),
            "triton_fb": lambda: (gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01),
                                  gdpa_bwd_triton(do, q, k, v, None, act, scale, post, False, 0.01, False)),
        }
        qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        dos = do.transpose(1, 2).contiguous()
        qt, kt, vt = (t.detach().requires_grad_() for t in (q, k, v))

        # torch.autograd.grad, not .backward(): gradients accumulated into .grad would add three elementwise
        # adds (dQ, dK, dV) to each call of the softmax providers after the first
        def sdpa_fb():
            o = F.scaled_dot_product_attention(qt, kt, vt)
            torch.autograd.grad(o, (qt, kt, vt), do)

        fns["sdpa_fb"] = sdpa_fb
        if from_fa4 is not None:
            def fa4_fb():
                o = from_fa4(qs, ks, vs)
                o = o[0] if isinstance(o, tuple) else o
                torch.autograd.grad(o, (qs, ks, vs), dos)
            fns["fa4_fb"] = fa4_fb
        for name, ms in median_over_rounds(fns, settle_ms=SETTLE_MS, warmup=25, rep=100).items():
            row[name] = None if ms is None else bwd_tflops(ms, z, h, nq, nk, d,
                                                        2.5 if name.endswith("bwd") else 3.5)
        rows.append(row)
        print(row, flush=True)


def bwd_options(ap):
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--activation", default="gelu_tanh", help="the GDPA providers' activation (Meta's: gelu_tanh)")


def run_bwd(args):
    """CuTe-DSL Hopper backward vs the Triton backward (and softmax SDPA / flash-attn-4 backward for reference),
    one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

    First a correctness sweep of the CuTe backward against float64 (every activation, ragged lengths, GQA,
    D in {64, 128}, fp16/bf16; dq, dk and dv each next to the Triton backward's error at the same inputs), then
    backward-only and forward+backward TF/s at Meta's shapes (H=4; D=128 and 64): each provider's do_bench median
    in three rounds of rotated order, each provider first running untimed for ``SETTLE_MS`` so the clocks settle to
    its own load, the median of those (``median_over_rounds``).

        PYTHONPATH=$PWD python3 benchmarks/kernels.py bwd --out benchmarks/results/<run>/cute_bwd   # .json, .png
    """
    rows = []
    t0 = time.time()
    compile_bwd(BwdPlan(torch.bfloat16, 128, 128, "gelu_tanh"))
    print(f"compile (fake operands) {time.time() - t0:.1f}s", flush=True)
    ok = True if args.skip_check else bwd_correctness(rows)
    print("correct:", ok, flush=True)
    if ok:
        warm_up_gpu(3.0)
        bwd_timing(rows, 128, args.batch, args.activation)
        bwd_timing(rows, 64, args.batch, args.activation)
    meta = run_meta(activation=args.activation, benchmark=args.benchmark)
    if args.out:
        write_json(args.out + ".json", dict(meta=meta, rows=rows))
        draw(dict(meta=meta, rows=rows), args.out + ".png")


# ---- head-dims -------------------------------------------------------------------------------------------------------


HEAD_DIMS = [(128, 128), (96, 96), (64, 128), (128, 64), (96, 128), (64, 96)]


HEAD_DIM_SHAPES = [(1024, 1024), (2048, 2048), (2048, 256)]


def head_dims_timing(rows, batch, heads, act, head_dims, passes, settle_ms):
    fa4 = fa4_function()
    for d, dv in head_dims:
        pingpong, split = fwd_schedule(d, dv)
        for nq, nk in HEAD_DIM_SHAPES:
            # the previous shape's tensors go before the allocator cache is emptied
            q = k = v = do = fns = None
            z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, dv)
            scale, post = d**-0.5, 1.0 / nk
            fwd_flops = 2.0 * z * heads * nq * nk * (d + dv)
            bwd_flops = 2.0 * z * heads * nq * nk * (3 * d + 2 * dv)
            qt, kt, vt = (t.detach().requires_grad_() for t in (q, k, v))

            # torch.autograd.grad, not .backward(): gradients accumulated into .grad would add three elementwise
            # adds (dQ, dK, dV) to each call of the softmax providers after the first
            def sdpa_fb():
                torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, scale=scale), (qt, kt, vt), do)

            other = dataclasses.replace(plan_dense_fwd(q, k, v, act), pingpong=not pingpong, split_store=not split)
            fns = {
                "cute_fwd": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                "cute_fwd_other": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, plan=other),
                "triton_fwd": lambda: gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01),
                "sdpa_fwd": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
                "cute_bwd": lambda: gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01),
                "triton_bwd": lambda: gdpa_bwd_triton(do, q, k, v, None, act, scale, post, False, 0.01, False),
                "cute_fb": lambda: (gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                                    gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01)),
                "sdpa_fb": sdpa_fb,
            }
            fns.update(fa4_providers(fa4, q, k, v, do, scale))
            fns = {name: fn for name, fn in fns.items() if name.split("_")[1] in passes}
            row = dict(kind="time", d=d, dv=dv, z=z, heads=heads, nq=nq, nk=nk, pingpong=pingpong, split_store=split)
            # provider names read "<provider>_<pass>[_variant]"
            flops = dict(fwd=fwd_flops, bwd=bwd_flops, fb=fwd_flops + bwd_flops)
            rows.append(time_by_pass(row, fns, flops, settle_ms))


def head_dims_options(ap):
    add_cute_options(ap, "gelu_tanh")
    ap.add_argument("--head-dims", default=",".join(f"{d}x{dv}" for d, dv in HEAD_DIMS), help="DxDv,...")
    ap.add_argument("--passes", default="fwd,bwd,fb", help="which of fwd, bwd, fb to time")


def run_head_dims(args):
    """CuTe-DSL Hopper kernels at D = 96 and Dv != D against the Triton kernels and softmax attention (SDPA, and
    flash-attn-4 where it takes the head dims), one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl,
    and flash-attn-4 for its provider). D = Dv = 128 runs first as the anchor.

    Per (D, Dv) and shape: the forward in the schedule ``fwd_schedule`` picks and in the other one (ping-pong and
    split O stores on or off), the backward, and forward+backward; each provider's do_bench median in three rounds of
    rotated order, each provider first running untimed for 300 ms so the clocks settle to its own load (the GPU
    runs at its power cap: without it a provider that follows a heavy forward+backward read 2-6% low), the median
    of those (``median_over_rounds``). FLOPs count D and Dv apart: the forward's two
    matmuls 2·N²·D and 2·N²·Dv, the backward's five 2·N²·(3D + 2Dv).

        R=benchmarks/results/<run>
        PYTHONPATH=$PWD python3 benchmarks/kernels.py head-dims --out $R/cute_head_dims   # .json and .png
        PYTHONPATH=$PWD python3 benchmarks/kernels.py head-dims --head-dims 128x128,256x256,128x256,256x128 \\
            --passes fwd --out $R/cute_d256_fwd
    """
    head_dims = [tuple(int(x) for x in hd.split("x")) for hd in args.head_dims.split(",")]
    rows = []
    warm_up_gpu(3.0)
    head_dims_timing(rows, args.batch, args.heads, args.activation, head_dims, args.passes.split(","), args.settle_ms)
    if args.out:
        results = dict(run_meta(benchmark=args.benchmark, activation=args.activation), rows=rows)
        write_json(args.out + ".json", results)
        draw(results, args.out + ".png")


# ---- causal ----------------------------------------------------------------------------------------------------------


# the causal benchmark's activation, heads and head dim
ACT, H, D = "gelu_tanh", 4, 128
CAUSAL_SHAPES = [(256, 256), (512, 512), (1024, 1024), (2048, 2048), (256, 512), (512, 1024)]


def causal_forward_shape(batch, nq, nk, fa4) -> dict:
    q = torch.randn(batch, H, nq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, H, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale, post = D**-0.5, 1.0 / nk
    ref = gdpa_reference(q[:2].double(), k[:2].double(), v[:2].double(), None, ACT, scale, post, causal=True)
    row = dict(nq=nq, nk=nk, batch=batch, rel_err=rel_err(gdpa_fwd_cute(q[:2], k[:2], v[:2], ACT, scale, post, 0.01,
                                                                         causal=True), ref),
               triton_rel_err=rel_err(gdpa_fwd_triton(q[:2], k[:2], v[:2], None, ACT, scale, post, True, 0.01), ref))
    kept = int(band_keep_mask(nq, nk, True, (-1, -1), "cpu").sum())
    flops = 2.0 * (D + D) * batch * H * kept
    providers = {
        "cute": lambda: gdpa_fwd_cute(q, k, v, ACT, scale, post, 0.01, causal=True),
        "triton": lambda: gdpa_fwd_triton(q, k, v, None, ACT, scale, post, True, 0.01),
    }
    if nq == nk:
        providers["sdpa"] = lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True)
    if fa4 is not None:
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        providers["fa4"] = lambda: fa4(qb, kb, vb, softmax_scale=scale, causal=True)
    for name, ms in median_over_rounds(providers, settle_ms=SETTLE_MS).items():
        if ms is not None:
            row[f"{name}_ms"] = ms
            row[name] = flops / ms * 1e-9
    for other in ("triton", "sdpa", "fa4"):
        if "cute" in row and other in row:
            row[f"cute_vs_{other}"] = row["cute"] / row[other]
    return row


def causal_backward_shape(batch, nq, nk, fa4) -> dict:
    torch.cuda.empty_cache()
    q, do = (torch.randn(batch, H, nq, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(batch, H, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale, post = D**-0.5, 1.0 / nk
    row = dict(nq=nq, nk=nk, batch=batch)
    two = (do[:2], q[:2], k[:2], v[:2])
    ref = gdpa_reference_backward(*(t.double() for t in two), None, ACT, scale, post, causal=True)
    cute = gdpa_bwd_cute(q[:2], k[:2], v[:2], do[:2], ACT, scale, post, 0.01, causal=True)
    tri = gdpa_bwd_triton(*two, None, ACT, scale, post, True, 0.01, False)
    for name, c, t, r in zip(("dq", "dk", "dv"), cute, tri, ref):
        row[f"{name}_rel_err"], row[f"{name}_triton_rel_err"] = rel_err(c, r), rel_err(t, r)
    kept = int(band_keep_mask(nq, nk, True, (-1, -1), "cpu").sum())
    flops = 2.0 * (D + D) * batch * H * kept

    def cute_fwd():
        return gdpa_fwd_cute(q, k, v, ACT, scale, post, 0.01, causal=True)

    def triton_fwd():
        return gdpa_fwd_triton(q, k, v, None, ACT, scale, post, True, 0.01)

    def cute_bwd():
        return gdpa_bwd_cute(q, k, v, do, ACT, scale, post, 0.01, causal=True)

    def triton_bwd():
        return gdpa_bwd_triton(do, q, k, v, None, ACT, scale, post, True, 0.01, False)

    providers = {"cute_bwd": cute_bwd, "triton_bwd": triton_bwd, "mixed_fb": lambda: (triton_fwd(), cute_bwd()),
                 "cute_fb": lambda: (cute_fwd(), cute_bwd()), "triton_fb": lambda: (triton_fwd(), triton_bwd())}
    qt, kt, vt = (t.detach().requires_grad_() for t in (q, k, v))

    # torch.autograd.grad, not .backward(): no adds into .grad (``bwd``)
    def sdpa_fb():
        o = F.scaled_dot_product_attention(qt, kt, vt, scale=scale, is_causal=True)
        torch.autograd.grad(o, (qt, kt, vt), do)

    if nq == nk:
        providers["sdpa_fb"] = sdpa_fb
    if fa4 is not None:
        qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        dos = do.transpose(1, 2).contiguous()

        def fa4_fb():
            o = fa4(qs, ks, vs, softmax_scale=scale, causal=True)
            torch.autograd.grad(o[0] if isinstance(o, tuple) else o, (qs, ks, vs), dos)

        providers["fa4_fb"] = fa4_fb
    for name, ms in median_over_rounds(providers, settle_ms=SETTLE_MS).items():
        if ms is not None:
            row[f"{name}_ms"] = ms
            row[name] = flops * (2.5 if name.endswith("bwd") else 3.5) / ms * 1e-9
    for mine, other in (("cute_bwd", "triton_bwd"), ("mixed_fb", "triton_fb"), ("cute_fb", "triton_fb"),
                        ("mixed_fb", "fa4_fb"), ("cute_fb", "fa4_fb"), ("cute_fb", "sdpa_fb")):
        if mine in row and other in row:
            row[f"{mine}_vs_{other}"] = row[mine] / row[other]
    return row


def causal_options(ap):
    ap.add_argument("--out", default="results/cute_causal", help="path prefix for the .json results and .png plot")
    ap.add_argument("--tokens", type=int, default=1152 * 512, help="query rows per shape (B = tokens / Nq)")
    ap.add_argument("--backward", action="store_true", help="the backward and forward+backward")


def run_causal(args):
    """The causal forward (and with ``--backward`` the backward and forward+backward): the CuTe-DSL Hopper kernels vs
    the Triton kernels vs softmax SDPA and flash-attn-4 (causal, where it imports), one process, same shapes (GPU
    only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

    B=1152 (fewer at long rows, so every shape has about the same tokens), H=4, D=Dv=128, bf16, gelu_tanh,
    self-attention at Meta's lengths and two cross shapes with Nk - Nq a multiple of 128 (bottom-right aligned; SDPA's
    ``is_causal`` aligns top-left, so it runs on the square shapes only). Rates are TF/s of the kept pairs' work
    (2 · (D + Dv) · Σ kept keys per query, the same for every provider); each provider's do_bench median over three
    rounds of rotated order after an untimed settle (``median_over_rounds``). Each row first checks the CuTe kernel
    against the float64 reference on two samples of the shape. The backward counts 2.5x and the forward+backward 3.5x
    the forward's work; "CuTe f+b" is what the op runs under "auto", "mixed_fb" the Triton forward with the CuTe
    backward; the backward rows check dq, dk and dv of both backwards against float64 on two samples.

        PYTHONPATH=$PWD python3 benchmarks/kernels.py causal --out benchmarks/results/<run>/cute_causal_fwd
        PYTHONPATH=$PWD python3 benchmarks/kernels.py causal --backward \\
            --out benchmarks/results/<run>/cute_causal_bwd
    """
    meta = run_meta(benchmark=args.benchmark)
    warm_up_gpu(2.0)
    fa4 = fa4_function()
    rows = []
    for nq, nk in CAUSAL_SHAPES:
        bench = causal_backward_shape if args.backward else causal_forward_shape
        rows.append(bench(max(args.tokens // nq, 1), nq, nk, fa4))
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    write_json(f"{args.out}.json", dict(meta=meta, rows=rows))
    draw(dict(meta=meta, rows=rows), f"{args.out}.png")


# ---- dq-sums ---------------------------------------------------------------------------------------------------------


def eager_dq(q, k, v, do, act, scale, post):
    q = q.detach().requires_grad_()
    (get_activation(act).torch_fn(q @ k.transpose(-2, -1) * scale, 0.01) * post @ v).backward(do)
    return q.grad


def dq_errors(rows):
    torch.manual_seed(0)
    z, h, nq, d = 2, 4, 512, 128
    for dtype in (torch.bfloat16, torch.float16):
        for act in ("silu", "gelu_tanh", "sigmoid", "relu"):
            for nk in (128, 256, 384, 512, 1024, 1536, 2048):
                q, do = (torch.randn(z, h, nq, d, device="cuda", dtype=dtype) for _ in range(2))
                k, v = (torch.randn(z, h, nk, d, device="cuda", dtype=dtype) for _ in range(2))
                scale, post = d**-0.5, 1.0 / nk
                ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale,
                                              post)[0]
                row = dict(kind="error", dtype=str(dtype), act=act, nk=nk,
                           eager=rel_err(eager_dq(q, k, v, do, act, scale, post), ref))
                for how in DQ_SUMS:
                    plan = summing_dq(q, k, v, act, how)
                    row[how] = rel_err(gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, plan=plan)[0], ref)
                rows.append(row)
                print(f"{row['dtype']:15s} {act:10s} nk={nk:5d} eager={row['eager']:.2e} "
                      + " ".join(f"{how}={row[how]:.2e}" for how in DQ_SUMS), flush=True)


def summing_dq(q, k, v, act, how):
    """The launcher's plan for the call with dQ summed ``how`` (one of ``DQ_SUMS``), the query tile and dQ's last
    round chosen for that sum as the planner would."""
    plan = plan_dense_bwd(q, k, v, act)
    d, dv, nq = q.shape[-1], v.shape[-1], q.shape[2]
    return dataclasses.replace(plan, dq_sums=how, dq_last_round=dq_last_round_for(how, d, dv),
                               query_tile=bwd_query_tile(how, d, dv, False, False, act, nq, plan.packed))


def dq_timing(rows, batch=1152, heads=4, d=128):
    for nq, nk in META_SHAPES[:3] + META_SHAPES[4:]:
        q, do = (torch.randn(batch, heads, nq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(batch, heads, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = 2.5 * 4 * batch * heads * nq * nk * d
        row = dict(kind="time", nq=nq, nk=nk)
        for how in DQ_SUMS:
            def run(plan=summing_dq(q, k, v, "silu", how), q=q, k=k, v=v, do=do, nk=nk):
                return gdpa_bwd_cute(q, k, v, do, "silu", d**-0.5, 1.0 / nk, 0.01, plan=plan)

            ms = triton.testing.do_bench(run, warmup=50, rep=300)
            row[f"{how}_tflops"] = flops / ms / 1e9
        rows.append(row)
        print(f"bwd {nq}x{nk}: " + ", ".join(f"{how} {row[f'{how}_tflops']:.0f} TF/s" for how in DQ_SUMS),
              flush=True)


DQ_HEAD_DIM_CASES = [(d, d, n) for d in (64, 96, 128) for n in (1280, 1536, 2048)] + [
    (128, 64, 2048), (64, 128, 2048), (96, 64, 2048)]


def dq_timing_by_head_dims(rows, heads=4, act="gelu_tanh"):
    """Past eight key tiles, which sum is faster at each (D, Dv) (``dq_sums_for``): fp32 and in place (the ceiling,
    past the error bound there), q = kv, the batch scaled to 288 x (2048 / N)², each sum's median of
    three rotated and settled rounds."""
    warm_up_gpu(3.0)
    for d, dv, n in DQ_HEAD_DIM_CASES:
        q = k = v = do = None
        torch.cuda.empty_cache()
        z = int(288 * (2048 / n) ** 2)
        q = torch.randn(z, heads, n, d, device="cuda", dtype=torch.bfloat16)
        do = torch.randn(z, heads, n, dv, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(z, heads, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(z, heads, n, dv, device="cuda", dtype=torch.bfloat16)
        fns = {how: (lambda plan=summing_dq(q, k, v, act, how): gdpa_bwd_cute(q, k, v, do, act, d**-0.5, 1.0 / n, 0.01,
                                                                              plan=plan))
               for how in DQ_SUMS}
        flops = 2.0 * z * heads * n * n * (3 * d + 2 * dv)
        row = dict(kind="time_head_dims", act=act, d=d, dv=dv, n=n, z=z)
        for how, ms in median_over_rounds(fns, settle_ms=SETTLE_MS, warmup=25, rep=100).items():
            row[f"{how}_tflops"] = None if ms is None else flops / ms / 1e9
        rows.append(row)
        print(row, flush=True)


def dq_sums_options(ap):
    ap.add_argument("--out", default=None, help="path prefix for the .json rows")
    ap.add_argument("--only-head-dims", action="store_true", help="only the timing by head dims")


def run_dq_sums(args):
    """How the CuTe backward should sum dQ over key tiles: in place in the operands' dtype, or in an fp32 buffer. GPU
    only (sm_90, needs nvidia-cutlass-dsl).

    For each number of 128-key tiles, dQ's relative error against float64 for each sum, next to eager PyTorch's own
    error at the same inputs (four activations, bf16 and fp16); then backward TF/s of each at Meta's shapes (B=1152,
    H=4, D=128, bf16, do_bench medians), and past eight key tiles at each pair of head dims (``--only-head-dims`` runs
    just that). ``DQ_DIRECT_MAX_KEY_TILES`` and ``dq_sums_for`` in kernels/cute/bwd_plan.py are chosen from these
    tables.

        PYTHONPATH=$PWD python3 benchmarks/kernels.py dq-sums --out benchmarks/results/<run>/dq_sums   # .json
    """
    rows = []
    if not args.only_head_dims:
        dq_errors(rows)
        dq_timing(rows)
    dq_timing_by_head_dims(rows)
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
        write_json(f"{args.out}.json", dict(meta=meta, rows=rows))


BENCHMARKS = {
    "fwd": Benchmark(run_fwd, fwd_options, writes="bench_cute_fwd"),
    "bwd": Benchmark(run_bwd, bwd_options, writes="bench_cute_bwd"),
    "head-dims": Benchmark(run_head_dims, head_dims_options, writes="bench_cute_head_dims"),
    "causal": Benchmark(run_causal, causal_options, writes="bench_cute_causal"),
    "dq-sums": Benchmark(run_dq_sums, dq_sums_options),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
