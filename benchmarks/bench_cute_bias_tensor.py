"""A bias tensor over the scores (HSTU's relative bias, one [Nq, Nk] per sample shared by the heads, by default) on
the CuTe-DSL Hopper kernels against the Triton kernels (and the CuTe forward with Triton's backward, "_tritonbwd"), the
CuTe kernels without the bias, and softmax attention with the same bias as its additive mask (SDPA) and without one
(flash-attn-4 where it imports); forward, backward and forward+backward, each backward with and without the bias's
gradient ("_dbias"); one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its
provider).

Per shape: each GDPA provider's output and gradients checked against float64 at two samples first (relative error,
printed), then each pass timed: each provider's do_bench median in three rounds of rotated order, each provider first
running untimed for 300 ms (``median_over_rounds``).

    PYTHONPATH=$PWD python3 benchmarks/bench_cute_bias_tensor.py --out benchmarks/results/<run>/cute_bias_tensor
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from bench_cute_bwd import fresh_operands  # beside this file
from bench_cute_head_dims import _fa4, fa4_providers
from bench_gdpa import cute_bench_parser, rel_err, run_cute_bench, time_by_pass

from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

SHAPES = [(512, 512), (1024, 1024), (2048, 2048), (2048, 256)]
# the bias's leading dims: one [Nq, Nk] per sample shared by the heads (HSTU), per head shared by the samples
# (ALiBi-like), or per both
BIAS_KINDS = {"sample": lambda z, h: (z, 1), "head": lambda z, h: (1, h), "both": lambda z, h: (z, h)}


def providers(q, k, v, do, act, scale, post, bias, fa4):
    """name -> callable; names read "<provider>_<pass>[_variant]"."""
    qt, kt, vt, bt = (t.detach().requires_grad_() for t in (q, k, v, bias))

    def sdpa_fb(grad_bias=False):
        o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bt if grad_bias else bias, scale=scale)
        torch.autograd.grad(o, (qt, kt, vt, bt) if grad_bias else (qt, kt, vt), do)

    def cute_bwd(grad_bias=False):
        return gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, bias=bias, bias_grad=grad_bias)

    def triton_bwd(grad_bias=False):
        return gdpa_bwd_triton(do, q, k, v, bias, act, scale, post, False, 0.01, grad_bias)

    def cute_fwd():
        return gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, bias=bias)

    def triton_fwd():
        return gdpa_fwd_triton(q, k, v, bias, act, scale, post, False, 0.01)

    fns = {
        "cute_fwd": cute_fwd,
        "cute_fwd_nobias": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
        "triton_fwd": triton_fwd,
        "sdpa_fwd": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale),
        "cute_bwd": cute_bwd,
        "cute_bwd_dbias": lambda: cute_bwd(True),
        "cute_bwd_nobias": lambda: gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01),
        "triton_bwd": triton_bwd,
        "triton_bwd_dbias": lambda: triton_bwd(True),
        "cute_fb": lambda: (cute_fwd(), cute_bwd()),
        "cute_fb_dbias": lambda: (cute_fwd(), cute_bwd(True)),
        "cute_fb_tritonbwd": lambda: (cute_fwd(), triton_bwd()),
        "triton_fb": lambda: (triton_fwd(), triton_bwd()),
        "triton_fb_dbias": lambda: (triton_fwd(), triton_bwd(True)),
        "sdpa_fb": sdpa_fb,
        "sdpa_fb_dbias": lambda: sdpa_fb(True),
    }
    return fns | fa4_providers(fa4, q, k, v, do, scale)


def check(q, k, v, do, act, scale, post, bias):
    """Relative errors against float64 of both GDPA forwards and backwards (dq, dk, dv, dbias), on two samples."""
    q, k, v, do = (t[:2] for t in (q, k, v, do))
    bias = bias[:2] if bias.shape[0] > 1 else bias
    q64, k64, v64, b64 = (t.double() for t in (q, k, v, bias))
    ref = gdpa_reference(q64, k64, v64, b64, act, scale, post)
    grads = gdpa_reference_backward(do.double(), q64, k64, v64, b64, act, scale, post, bias_requires_grad=True)
    cute = gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, bias=bias, bias_grad=True)
    triton = gdpa_bwd_triton(do, q, k, v, bias, act, scale, post, False, 0.01, True)
    errors = dict(cute=rel_err(gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, bias=bias), ref),
                  triton=rel_err(gdpa_fwd_triton(q, k, v, bias, act, scale, post, False, 0.01), ref))
    for name, c, t, r in zip(("dq", "dk", "dv", "dbias"), cute, triton, grads):
        errors[f"{name}_cute"] = rel_err(c, r.reshape(c.shape))
        errors[f"{name}_triton"] = rel_err(t, r.reshape(t.shape))
    return errors


def timing(rows, batch, heads, d, act, kind, settle_ms):
    fa4 = _fa4()
    for nq, nk in SHAPES:
        q = k = v = do = bias = fns = None
        z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, d)
        bias = torch.randn(*BIAS_KINDS[kind](z, heads), nq, nk, device="cuda", dtype=torch.bfloat16)
        scale, post = d**-0.5, 1.0 / nk
        row = dict(kind="time", d=d, z=z, heads=heads, nq=nq, nk=nk, bias=kind,
                   errors=check(q, k, v, do, act, scale, post, bias))
        fwd_flops = 4.0 * z * heads * nq * nk * d
        flops = dict(fwd=fwd_flops, bwd=2.5 * fwd_flops, fb=3.5 * fwd_flops)
        fns = providers(q, k, v, do, act, scale, post, bias, fa4)
        rows.append(time_by_pass(row, fns, flops, settle_ms))


def main():
    ap = cute_bench_parser("silu")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--bias", choices=sorted(BIAS_KINDS), default="sample")
    args = ap.parse_args()
    run_cute_bench(args, lambda rows: timing(rows, args.batch, args.heads, args.head_dim, args.activation, args.bias,
                                             args.settle_ms), "bench_cute_bias_tensor", activation=args.activation)


if __name__ == "__main__":
    main()
