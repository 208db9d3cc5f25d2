"""CuTe-DSL Hopper backward vs the Triton backward (and softmax SDPA / flash-attn-4 backward for reference),
one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

First a correctness sweep of the CuTe backward against float64 (every activation, ragged lengths, GQA,
D in {64, 128}, fp16/bf16; dq, dk and dv each next to the Triton backward's error at the same inputs), then
backward-only and forward+backward TF/s at Meta's shapes (H=4; D=128 and 64): each provider's do_bench median
in three rounds of rotated order, each provider first running untimed for ``SETTLE_MS`` so the clocks settle to
its own load, the median of those (``median_over_rounds``).

    PYTHONPATH=$PWD python3 benchmarks/bench_cute_bwd.py --out benchmarks/results/<run>/cute_bwd   # .json, .png
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from bench_cute_fwd import CHECK_CASES, META_SHAPES, _rel  # beside this file
from bench_gdpa import SETTLE_MS, median_over_rounds, warm_up_gpu
from plotting import draw

from gdpa_inductor.kernels.cute.gdpa_bwd import bwd_supported, compile_bwd, gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton


def correctness(rows):
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
            te = _rel(t, r)
            ce = _rel(g, r) if g is not None else float("nan")
            row[f"{name}_cute"], row[f"{name}_triton"] = ce, te
            passed = passed and ce <= 2 * te + 1e-4
        row["passed"] = passed
        ok &= passed
        rows.append(row)
        print(row, flush=True)
    return ok


def tflops(ms, z, h, nq, nk, d, factor):
    return factor * 4 * z * h * nq * nk * d / ms / 1e9


def fresh_operands(batch, heads, nq, nk, d, dv, device="cuda"):
    """(z, q, k, v, do) in bf16 from an emptied allocator cache (the previous shape's blocks are of other sizes);
    a quarter of the batch past 1024² so every shape fits."""
    torch.cuda.empty_cache()
    z = batch if nq * nk <= 1024 * 1024 else batch // 4

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    return z, randn(z, heads, nq, d), randn(z, heads, nk, d), randn(z, heads, nk, dv), randn(z, heads, nq, dv)


def timing(rows, d, batch, act="gelu_tanh"):
    from_fa4 = None
    try:
        from flash_attn.cute.interface import flash_attn_func as from_fa4
    except Exception as e:  # noqa: BLE001
        print("flash-attn-4 unavailable:", repr(e)[:200])
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
            row[name] = None if ms is None else tflops(ms, z, h, nq, nk, d, 2.5 if name.endswith("bwd") else 3.5)
        rows.append(row)
        print(row, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--activation", default="gelu_tanh", help="the GDPA providers' activation (Meta's: gelu_tanh)")
    args = ap.parse_args()
    rows = []
    t0 = time.time()
    compile_bwd(torch.bfloat16, 128, "gelu_tanh")
    print(f"compile (fake operands) {time.time() - t0:.1f}s", flush=True)
    ok = True if args.skip_check else correctness(rows)
    print("correct:", ok, flush=True)
    if ok:
        warm_up_gpu(3.0)
        timing(rows, 128, args.batch, args.activation)
        timing(rows, 64, args.batch, args.activation)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), activation=args.activation, benchmark="bench_cute_bwd")
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        draw(dict(meta=meta, rows=rows), args.out + ".png")


if __name__ == "__main__":
    main()
