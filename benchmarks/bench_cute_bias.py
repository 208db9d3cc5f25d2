"""Sigmoid attention with its -log n bias (a one-element bias) on the CuTe-DSL Hopper kernels against the Triton kernels
(which read the bias as a broadcast tensor), the CuTe kernels without the bias (what the bias costs them) and softmax
attention (SDPA; flash-attn-4 where it imports), one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl,
and flash-attn-4 for its provider).

Per shape: each provider's output checked against float64 at two samples first (relative error, printed), then the
forward, backward and forward+backward timed: each provider's do_bench median in three rounds of rotated order,
each provider first running untimed for 300 ms (``median_over_rounds``). The bias is an fp32 0-d tensor, as the
backend's rewrite passes sigmoid attention's -log n.

    PYTHONPATH=$PWD python3 benchmarks/bench_cute_bias.py --out benchmarks/results/<run>/cute_bias_sigmoid
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_bias.py --activation gelu_tanh \
        --out benchmarks/results/<run>/cute_bias_gelu_tanh
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from bench_cute_bwd import fresh_operands  # beside this file
from bench_cute_head_dims import _fa4, fa4_providers
from bench_gdpa import cute_bench_parser, rel_err, run_cute_bench, time_by_pass

from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

SHAPES = [(512, 512), (1024, 1024), (2048, 2048), (2048, 256)]


def providers(q, k, v, do, act, scale, post, bias, fa4):
    """name -> callable; names read "<provider>_<pass>[_variant]"."""
    qt, kt, vt = (t.detach().requires_grad_() for t in (q, k, v))

    # torch.autograd.grad: no .grad accumulation in the softmax providers' timings
    def sdpa_fb():
        torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, scale=scale), (qt, kt, vt), do)

    fns = {
        "cute_fwd": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, bias=bias),
        "cute_fwd_nobias": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
        "triton_fwd": lambda: gdpa_fwd_triton(q, k, v, bias, act, scale, post, False, 0.01),
        "sdpa_fwd": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
        "cute_bwd": lambda: gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, bias=bias),
        "cute_bwd_nobias": lambda: gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01),
        "triton_bwd": lambda: gdpa_bwd_triton(do, q, k, v, bias, act, scale, post, False, 0.01, False),
        "cute_fb": lambda: (gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, bias=bias),
                            gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, bias=bias)),
        "triton_fb": lambda: (gdpa_fwd_triton(q, k, v, bias, act, scale, post, False, 0.01),
                              gdpa_bwd_triton(do, q, k, v, bias, act, scale, post, False, 0.01, False)),
        "sdpa_fb": sdpa_fb,
    }
    return fns | fa4_providers(fa4, q, k, v, do, scale)


def check(q, k, v, act, scale, post, bias):
    """Relative errors against float64 of both GDPA forwards and of eager bf16, on two samples."""
    q, k, v = (t[:2] for t in (q, k, v))
    ref = gdpa_reference(q.double(), k.double(), v.double(), bias.double(), act, scale, post)
    eager = torch.sigmoid(q @ k.transpose(-2, -1) * scale + bias) * post @ v if act == "sigmoid" else None
    errs = dict(cute=rel_err(gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, bias=bias), ref),
                triton=rel_err(gdpa_fwd_triton(q, k, v, bias, act, scale, post, False, 0.01), ref))
    if eager is not None:
        errs["eager"] = rel_err(eager, ref)
    return errs


def timing(rows, batch, heads, d, act, settle_ms):
    fa4 = _fa4()
    for nq, nk in SHAPES:
        q = k = v = do = fns = None
        z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, d)
        scale, post = d**-0.5, 1.0
        bias = torch.tensor(-math.log(nk), device="cuda")
        row = dict(kind="time", d=d, z=z, heads=heads, nq=nq, nk=nk, errors=check(q, k, v, act, scale, post, bias))
        fwd_flops = 4.0 * z * heads * nq * nk * d
        flops = dict(fwd=fwd_flops, bwd=2.5 * fwd_flops, fb=3.5 * fwd_flops)
        fns = providers(q, k, v, do, act, scale, post, bias, fa4)
        rows.append(time_by_pass(row, fns, flops, settle_ms))


def main():
    ap = cute_bench_parser("sigmoid")
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    run_cute_bench(args, lambda rows: timing(rows, args.batch, args.heads, args.head_dim, args.activation,
                                             args.settle_ms), "bench_cute_bias", activation=args.activation)


if __name__ == "__main__":
    main()
