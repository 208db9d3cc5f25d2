"""Biases over the scores on the CuTe-DSL Hopper kernels: a one-element bias (``scalar``, sigmoid attention's -log n),
a bias tensor (``tensor``, HSTU's relative bias), and what a one-element bias costs the CuTe kernels alone (``cost``).
GPU only; needs nvidia-cutlass-dsl, and flash-attn-4 for its provider.

    PYTHONPATH=$PWD python3 benchmarks/biases.py <benchmark> [options]   # <benchmark> --help: what it measures
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from benchmarks.harness.checks import rel_err
from benchmarks.harness.cli import Benchmark, add_cute_options, main
from benchmarks.harness.operands import fresh_operands
from benchmarks.harness.providers import fa4_function, fa4_providers
from benchmarks.harness.results import run_cute_bench
from benchmarks.harness.timing import median_over_rounds, time_by_pass, warm_up_gpu
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference, gdpa_reference_backward
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

# the shapes of ``scalar`` and ``tensor``
SHAPES = [(512, 512), (1024, 1024), (2048, 2048), (2048, 256)]


# ---- scalar ----------------------------------------------------------------------------------------------------------


def scalar_providers(q, k, v, do, act, scale, post, bias, fa4):
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


def scalar_check(q, k, v, act, scale, post, bias):
    """Relative errors against float64 of both GDPA forwards and of eager bf16, on two samples."""
    q, k, v = (t[:2] for t in (q, k, v))
    ref = gdpa_reference(q.double(), k.double(), v.double(), bias.double(), act, scale, post)
    eager = torch.sigmoid(q @ k.transpose(-2, -1) * scale + bias) * post @ v if act == "sigmoid" else None
    errs = dict(cute=rel_err(gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, bias=bias), ref),
                triton=rel_err(gdpa_fwd_triton(q, k, v, bias, act, scale, post, False, 0.01), ref))
    if eager is not None:
        errs["eager"] = rel_err(eager, ref)
    return errs


def scalar_timing(rows, batch, heads, d, act, settle_ms):
    fa4 = fa4_function()
    for nq, nk in SHAPES:
        q = k = v = do = fns = None
        z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, d)
        scale, post = d**-0.5, 1.0
        bias = torch.tensor(-math.log(nk), device="cuda")
        row = dict(kind="time", d=d, z=z, heads=heads, nq=nq, nk=nk,
                   errors=scalar_check(q, k, v, act, scale, post, bias))
        fwd_flops = 4.0 * z * heads * nq * nk * d
        flops = dict(fwd=fwd_flops, bwd=2.5 * fwd_flops, fb=3.5 * fwd_flops)
        fns = scalar_providers(q, k, v, do, act, scale, post, bias, fa4)
        rows.append(time_by_pass(row, fns, flops, settle_ms))


def scalar_options(ap):
    add_cute_options(ap, "sigmoid")
    ap.add_argument("--head-dim", type=int, default=128)


def run_scalar(args):
    """Sigmoid attention with its -log n bias (a one-element bias) on the CuTe-DSL Hopper kernels against the Triton
    kernels (which read the bias as a broadcast tensor), the CuTe kernels without the bias (what the bias costs them)
    and softmax attention (SDPA; flash-attn-4 where it imports), one process, same shapes, bf16 (GPU only; needs
    nvidia-cutlass-dsl, and flash-attn-4 for its provider).

    Per shape: each provider's output checked against float64 at two samples first (relative error, printed), then the
    forward, backward and forward+backward timed: each provider's do_bench median in three rounds of rotated order,
    each provider first running untimed for 300 ms (``median_over_rounds``). The bias is an fp32 0-d tensor, as the
    backend's rewrite passes sigmoid attention's -log n.

        PYTHONPATH=$PWD python3 benchmarks/biases.py scalar --out benchmarks/results/<run>/cute_bias_sigmoid
        PYTHONPATH=$PWD python3 benchmarks/biases.py scalar --activation gelu_tanh \\
            --out benchmarks/results/<run>/cute_bias_gelu_tanh
    """
    run_cute_bench(args, lambda rows: scalar_timing(rows, args.batch, args.heads, args.head_dim, args.activation,
                                                    args.settle_ms), activation=args.activation)


# ---- tensor ----------------------------------------------------------------------------------------------------------


# the bias's leading dims: one [Nq, Nk] per sample shared by the heads (HSTU), per head shared by the samples
# (ALiBi-like), or per both
BIAS_KINDS = {"sample": lambda z, h: (z, 1), "head": lambda z, h: (1, h), "both": lambda z, h: (z, h)}


def tensor_providers(q, k, v, do, act, scale, post, bias, fa4):
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


def tensor_check(q, k, v, do, act, scale, post, bias):
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


def tensor_timing(rows, batch, heads, d, act, kind, settle_ms):
    fa4 = fa4_function()
    for nq, nk in SHAPES:
        q = k = v = do = bias = fns = None
        z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, d)
        bias = torch.randn(*BIAS_KINDS[kind](z, heads), nq, nk, device="cuda", dtype=torch.bfloat16)
        scale, post = d**-0.5, 1.0 / nk
        row = dict(kind="time", d=d, z=z, heads=heads, nq=nq, nk=nk, bias=kind,
                   errors=tensor_check(q, k, v, do, act, scale, post, bias))
        fwd_flops = 4.0 * z * heads * nq * nk * d
        flops = dict(fwd=fwd_flops, bwd=2.5 * fwd_flops, fb=3.5 * fwd_flops)
        fns = tensor_providers(q, k, v, do, act, scale, post, bias, fa4)
        rows.append(time_by_pass(row, fns, flops, settle_ms))


def tensor_options(ap):
    add_cute_options(ap, "silu")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--bias", choices=sorted(BIAS_KINDS), default="sample")


def run_tensor(args):
    """A bias tensor over the scores (HSTU's relative bias, one [Nq, Nk] per sample shared by the heads, by default) on
    the CuTe-DSL Hopper kernels against the Triton kernels (and the CuTe forward with Triton's backward, "_tritonbwd"),
    the CuTe kernels without the bias, and softmax attention with the same bias as its additive mask (SDPA) and without
    one (flash-attn-4 where it imports); forward, backward and forward+backward, each backward with and without the
    bias's gradient ("_dbias"); one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and flash-attn-4
    for its provider).

    Per shape: each GDPA provider's output and gradients checked against float64 at two samples first (relative error,
    printed), then each pass timed: each provider's do_bench median in three rounds of rotated order, each provider
    first running untimed for 300 ms (``median_over_rounds``).

        PYTHONPATH=$PWD python3 benchmarks/biases.py tensor --out benchmarks/results/<run>/cute_bias_tensor
    """
    run_cute_bench(args, lambda rows: tensor_timing(rows, args.batch, args.heads, args.head_dim, args.activation,
                                                    args.bias, args.settle_ms), activation=args.activation)


# ---- cost ------------------------------------------------------------------------------------------------------------


COST_SHAPES = [(512, 512), (1024, 1024), (2048, 256)]


def run_cost(args):
    """What a one-element bias costs the CuTe-DSL Hopper kernels alone: each kernel without a bias, with a bias of 0
    and with sigmoid attention's -log Nk (the same build twice: the scores differ, the instructions do not), the six
    in one process, each one's do_bench median over three rounds of rotated order after 300 ms untimed
    (``median_over_rounds``). B=1152, H=4, D=128, bf16; TF/s (the backward counted at 2.5x the forward's work).

    ``scalar`` times the same kernels among Triton's, SDPA's and FA4's, whose loads come before them in the
    rotation; this one times nothing else (GPU only; needs nvidia-cutlass-dsl).

        PYTHONPATH=$PWD python3 benchmarks/biases.py cost
    """
    warm_up_gpu(2.0)
    for act in ("sigmoid", "gelu_tanh"):
        for nq, nk in COST_SHAPES:
            z, q, k, v, do = fresh_operands(1152, 4, nq, nk, 128, 128)
            s = 128**-0.5
            biases = {"nobias": None, "bias0": torch.tensor(0.0, device="cuda"),
                      "biaslog": torch.tensor(-math.log(nk), device="cuda")}
            fns = {f"bwd_{name}": lambda bias=bias: gdpa_bwd_cute(q, k, v, do, act, s, 1.0, 0.01, bias=bias)
                   for name, bias in biases.items()}
            fns |= {f"fwd_{name}": lambda bias=bias: gdpa_fwd_cute(q, k, v, act, s, 1.0, 0.01, bias=bias)
                    for name, bias in biases.items()}
            flops = 4.0 * z * 4 * nq * nk * 128
            res = median_over_rounds(fns, settle_ms=300, warmup=25, rep=100)
            print(act, nq, nk, {n: round(flops * (2.5 if n.startswith("bwd") else 1.0) / ms * 1e-9, 1)
                                for n, ms in res.items() if ms is not None}, flush=True)


BENCHMARKS = {
    "scalar": Benchmark(run_scalar, scalar_options, writes="bench_cute_bias"),
    "tensor": Benchmark(run_tensor, tensor_options, writes="bench_cute_bias_tensor"),
    "cost": Benchmark(run_cost),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
