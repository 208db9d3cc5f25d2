"""The causal forward (and with ``--backward`` the backward and forward+backward): the CuTe-DSL Hopper kernels vs
the Triton kernels vs softmax SDPA and flash-attn-4 (causal, where it imports), one process, same shapes (GPU only;
needs nvidia-cutlass-dsl, and flash-attn-4 for its provider).

B=1152 (fewer at long rows, so every shape has about the same tokens), H=4, D=Dv=128, bf16, gelu_tanh,
self-attention at Meta's lengths and two cross shapes with Nk - Nq a multiple of 128 (bottom-right aligned; SDPA's
``is_causal`` aligns top-left, so it runs on the square shapes only). Rates are TF/s of the kept pairs' work
(2 · (D + Dv) · Σ kept keys per query, the same for every provider); each provider's do_bench median over three
rounds of rotated order after an untimed settle (``median_over_rounds``). Each row first checks the CuTe kernel
against the float64 reference on two samples of the shape. The backward counts 2.5x and the forward+backward 3.5x
the forward's work; "CuTe f+b" is what the op runs under "auto", "mixed_fb" the Triton forward with the CuTe
backward; the backward rows check dq, dk and dv of both backwards against float64 on two samples.

    PYTHONPATH=$PWD python3 benchmarks/bench_cute_causal.py --out benchmarks/results/<run>/cute_causal_fwd
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_causal.py --backward --out benchmarks/results/<run>/cute_causal_bwd
"""

from __future__ import annotations

import argparse
import datetime
import json

import torch
import torch.nn.functional as F
import triton
from bench_cute_fwd import fa4_function  # beside this file
from bench_gdpa import SETTLE_MS, median_over_rounds, warm_up_gpu
from plotting import draw

from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import band_keep_mask, gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

ACT, H, D = "gelu_tanh", 4, 128
SHAPES = [(256, 256), (512, 512), (1024, 1024), (2048, 2048), (256, 512), (512, 1024)]


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def bench_shape(batch, nq, nk, fa4) -> dict:
    q = torch.randn(batch, H, nq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, H, nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale, post = D**-0.5, 1.0 / nk
    ref = gdpa_reference(q[:2].double(), k[:2].double(), v[:2].double(), None, ACT, scale, post, causal=True)
    row = dict(nq=nq, nk=nk, batch=batch, rel_err=_rel(gdpa_fwd_cute(q[:2], k[:2], v[:2], ACT, scale, post, 0.01,
                                                                      causal=True), ref),
               triton_rel_err=_rel(gdpa_fwd_triton(q[:2], k[:2], v[:2], None, ACT, scale, post, True, 0.01), ref))
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


def bench_backward_shape(batch, nq, nk, fa4) -> dict:
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
        row[f"{name}_rel_err"], row[f"{name}_triton_rel_err"] = _rel(c, r), _rel(t, r)
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

    # torch.autograd.grad, not .backward(): no adds into .grad (bench_cute_bwd.py)
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results/cute_causal", help="path prefix for the .json results and .png plot")
    parser.add_argument("--tokens", type=int, default=1152 * 512, help="query rows per shape (B = tokens / Nq)")
    parser.add_argument("--backward", action="store_true", help="the backward and forward+backward")
    args = parser.parse_args()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), benchmark="bench_cute_causal")
    warm_up_gpu(2.0)
    fa4 = fa4_function()
    rows = []
    for nq, nk in SHAPES:
        bench = bench_backward_shape if args.backward else bench_shape
        rows.append(bench(max(args.tokens // nq, 1), nq, nk, fa4))
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    with open(f"{args.out}.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    draw(dict(meta=meta, rows=rows), f"{args.out}.png")


if __name__ == "__main__":
    main()
