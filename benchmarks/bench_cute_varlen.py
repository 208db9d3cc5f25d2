"""The varlen forward (or, with ``--backward``, forward+backward; with ``--causal``, under the causal mask; with
``--window W`` too, under HSTU's ``max_attn_len`` = W, ``window=(W, 0)``) on
the CuTe-DSL Hopper kernels vs the Triton varlen kernels vs the dense CuTe kernels on the padded batch vs
flash-attn-4's varlen kernels (softmax, where it imports), one process, Meta's jagged shapes (GPU only; needs
nvidia-cutlass-dsl, and flash-attn-4 for its provider).

B = 1152 samples, H = 4, D = Dv = 128 (``--head-dims``), bf16, self attention, gelu_tanh, lengths up to N in
{256, 512, 1024, 2048} at "sparsity" 1.0 (every sample full) and 0.5 (lengths uniform in [1, N]). Rates are TF/s
of the real tokens' work (2 · H · (D + Dv) · Σ n², causal Σ n(n + 1)/2, a window the kept pairs, the same for every
provider, the padded one included), each
provider's do_bench median over three rounds of rotated order after an untimed settle (``median_over_rounds``);
forward+backward counts 3.5x the forward's work and takes the gradients by ``torch.autograd.grad`` of one fixed
output gradient, the backward under the provider's backend as its forward (the kernels are chosen when each pass
runs). The CuTe varlen op is checked against the float64 reference on 8 samples first (the forward,
and with ``--backward`` dq, dk, dv), and each row records which kernels the "CuTe varlen" provider really ran
(``cute_varlen_runs``: a forced "cute" runs an uncovered varlen pass on Triton). ``--cu-k-copy`` gives the keys a
copy of the queries' cu_seqlens: equal offsets the kernels cannot know to be equal, so the CuTe kernels take the
causal mask as a band (``varlen_band``) instead of their aligned causal builds. The dense padded provider has no
window and is left out under one. ``--activation`` picks the activation; ``--log-n-bias`` adds sigmoid attention's
constant bias -log N (N the longest sample; a bf16 0-d tensor, as the varlen op takes it in q's dtype) to every
provider's scores but FA4's (softmax, no bias); ``--rel-bias`` HSTU's learned relative position bias instead, a bf16
tensor [1, H, N, N] shared by the samples (each reads its own [:n, :n]) that, with ``--backward``, takes its gradient
(dbias) in every GDPA provider's backward; the dense padded provider reads it over the whole padded batch.

    R=benchmarks/results/<run>
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --out $R/cute_varlen_fwd   # .json and .png
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --backward --out $R/cute_varlen
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --backward --head-dims 256,256 --out $R/cute_varlen_d256
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --causal --backward --out $R/cute_varlen_causal
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --causal --window 256 --backward \
        --out $R/cute_varlen_window256
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --activation sigmoid --log-n-bias --backward \
        --out $R/cute_varlen_sigmoid
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_varlen.py --activation silu --causal --rel-bias --backward \
        --out $R/cute_varlen_rel_bias
"""

from __future__ import annotations

import argparse
import datetime
import json
import math

import torch
import triton
from bench_cute_fwd import fa4_function  # beside this file
from bench_gdpa import SETTLE_MS, median_over_rounds, warm_up_gpu
from bench_varlen import lengths_for
from plotting import draw

import gdpa_inductor
from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.kernels.reference_varlen import gdpa_varlen_reference
from gdpa_inductor.lowering.dispatch import select_varlen_backward_impl, select_varlen_forward_impl

ACT, H = "gelu_tanh", 4
SHAPES = [(n, s) for n in (256, 512, 1024, 2048) for s in (1.0, 0.5)]
PROVIDERS = ("cute_varlen", "triton_varlen", "cute_padded", "fa4_varlen")


def _on(backend: str, fn):
    def run():
        saved = gdpa_inductor.config.backend
        gdpa_inductor.config.backend = backend
        try:
            return fn()
        finally:
            gdpa_inductor.config.backend = saved

    return run


def _qkv(t_or_bn, d, dv, **kw):
    return tuple(torch.randn(*t_or_bn, H, width, **kw) for width in (d, d, dv))


def cute_runs(q, k, v, cu, cu_k, backward: bool, causal: bool, window, act: str = ACT, bias=None) -> str:
    """Which kernels the varlen op runs under a forced "cute" for these operands (self attention over ``cu``,
    the keys' offsets ``cu_k``; a bias that requires grad wants dbias)."""
    call = (q, k, v, bias, causal, window, act, (cu, cu_k, None, None))
    bias_grad = bias is not None and bias.requires_grad

    def picks():
        fwd = select_varlen_forward_impl(*call)
        return f"{fwd} fwd + {select_varlen_backward_impl(*call, bias_grad)} bwd" if backward else f"{fwd} fwd"

    return _on("cute", picks)()


def check(lengths, device, backward: bool, d: int, dv: int, causal: bool, window, cu_k_copy: bool, act: str = ACT,
          bias=None) -> dict:
    """Relative errors of the CuTe varlen op (bf16) vs the float64 reference on the first 8 samples: the output,
    and with ``backward`` each gradient (dbias too where ``bias`` is a tensor that requires grad)."""
    lens = lengths[:8]
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)]).to(device)
    cu_k = cu.clone() if cu_k_copy else cu
    t, longest = int(lens.sum()), int(lens.max())
    q, k, v = _qkv((t,), d, dv, device=device, dtype=torch.float64, requires_grad=True)
    low = [x.detach().bfloat16().requires_grad_() for x in (q, k, v)]
    wide = [q, k, v]
    if bias is not None and bias.numel() > 1:
        # these samples' longest is the bias's extent here
        bias = bias.detach()[..., :longest, :longest].contiguous().requires_grad_(bias.requires_grad)
        if bias.requires_grad:
            low.append(bias)
            wide.append(bias.detach().double().requires_grad_())
    bias64 = wide[3] if len(wide) > 3 else None if bias is None else bias.double()
    got = _on("cute", lambda: gdpa_varlen(*low[:3], cu, cu_k, longest, longest, activation=act, scale=d**-0.5,
                                          causal=causal, window=window, bias=bias))()
    want = gdpa_varlen_reference(*wide[:3], bias64, cu, cu, None, None, longest, longest, act, d**-0.5, 1.0, causal,
                                 window, 0.01)
    pairs = {"rel_err": (got, want)}
    if backward:
        dout = torch.randn_like(want)
        got_grads = _on("cute", lambda: torch.autograd.grad(got, low, dout.bfloat16()))()
        for name, g, w in zip(("dq", "dk", "dv", "dbias"), got_grads, torch.autograd.grad(want, wide, dout)):
            pairs[f"rel_err_{name}"] = (g, w)
    return {name: ((g.double() - w).norm() / w.norm()).item() for name, (g, w) in pairs.items()}


def _with_backward(fn, inputs):
    """``fn``'s forward, then its gradients for a fixed output gradient (made on the first call)."""
    dout = []

    def run():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        if not dout:
            dout.append(torch.randn_like(out))
        return torch.autograd.grad(out, inputs, dout[0])

    return run


def kept_pairs(lengths: torch.Tensor, causal: bool, window: tuple[int, int]) -> float:
    """(query, key) pairs the mask keeps over a self-attention batch of ``lengths``: row i of a sample keeps
    min(i + 1, W + 1) keys under causal with ``window`` (W, 0)."""
    n = lengths.double()
    if not causal:
        return float((n**2).sum())
    if window[0] < 0:
        return float((n * (n + 1) / 2).sum())
    w = window[0] + 1
    inside = torch.minimum(n, torch.full_like(n, w))
    return float((inside * (inside + 1) / 2 + (n - inside) * w).sum())


def bench_shape(batch, max_len, sparsity, gen, fa4, backward: bool, d: int, dv: int, causal: bool,
                window=(-1, -1), cu_k_copy: bool = False, act: str = ACT, log_n_bias: bool = False,
                rel_bias: bool = False) -> dict:
    lengths = lengths_for(batch, max_len, sparsity, gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).cuda()
    cu_k = cu.clone() if cu_k_copy else cu
    total = int(lengths.sum())
    scale = d**-0.5
    # the varlen op takes a bias in q's dtype
    bias = torch.tensor(-math.log(max_len), device="cuda", dtype=torch.bfloat16) if log_n_bias else None
    if rel_bias:
        bias = torch.randn(1, H, max_len, max_len, device="cuda", dtype=torch.bfloat16).requires_grad_(backward)
    flops = 2.0 * H * (d + dv) * kept_pairs(lengths, causal, window) * (3.5 if backward else 1.0)
    row = dict(max_len=max_len, sparsity=sparsity, batch=batch, tokens=total, head_dims=[d, dv], causal=causal,
               window=list(window), cu_k_copy=cu_k_copy, activation=act, log_n_bias=log_n_bias, rel_bias=rel_bias,
               **check(lengths, "cuda", backward, d, dv, causal, window, cu_k_copy, act, bias))
    q, k, v = _qkv((total,), d, dv, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
    qp, kp, vp = (torch.randn(batch, H, max_len, width, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
                  for width in (d, d, dv))
    row["cute_varlen_runs"] = cute_runs(q, k, v, cu, cu_k, backward, causal, window, act, bias)

    def varlen():
        return gdpa_varlen(q, k, v, cu, cu_k, max_len, max_len, activation=act, scale=scale, causal=causal,
                           window=window, bias=bias)

    # name: (the backend the whole call runs under, its backward included: the kernels are chosen when each pass
    # runs; the forward; its differentiable inputs)
    learned = (bias,) if rel_bias else ()
    calls = {
        "cute_varlen": ("cute", varlen, (q, k, v, *learned)),
        "triton_varlen": ("triton", varlen, (q, k, v, *learned)),
    }
    if tuple(window) == (-1, -1):
        calls["cute_padded"] = ("cute", lambda: gdpa(qp, kp, vp, activation=act, scale=scale, causal=causal,
                                                     bias=bias), (qp, kp, vp, *learned))
    if fa4 is not None:
        fa4_window = tuple(None if w < 0 else w for w in window)

        def fa4_call():
            return fa4(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len,
                       softmax_scale=scale, causal=causal, **({} if fa4_window == (None, None) else
                                                              dict(window_size=fa4_window)))

        try:
            _with_backward(fa4_call, (q, k, v))() if backward else fa4_call()
            calls["fa4_varlen"] = ("auto", fa4_call, (q, k, v))
        except Exception as e:  # an FA4 build without this mask on sm_90 is left out, with its reason
            row["fa4_varlen_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    providers = {name: _on(backend, fn) for name, (backend, fn, _) in calls.items()}
    if backward:
        # the forwards alone too, in the same rounds: a backward's time is its f+b's less its forward's
        providers = {**{f"{name}_fwd": fn for name, fn in providers.items()},
                     **{name: _on(backend, _with_backward(fn, inputs))
                        for name, (backend, fn, inputs) in calls.items()}}
    for name, ms in median_over_rounds(providers, settle_ms=SETTLE_MS).items():
        if ms is not None:
            row[f"{name}_ms"] = ms
            row[name] = flops / ms * 1e-9
    for name in PROVIDERS:
        if backward and f"{name}_ms" in row and f"{name}_fwd_ms" in row:
            row[f"{name}_bwd_ms"] = row[f"{name}_ms"] - row[f"{name}_fwd_ms"]
        row.pop(f"{name}_fwd", None)
    for other in ("triton_varlen", "cute_padded", "fa4_varlen"):
        if "cute_varlen" in row and other in row:
            row[f"cute_varlen_vs_{other}"] = row["cute_varlen"] / row[other]
        if "cute_varlen_bwd_ms" in row and f"{other}_bwd_ms" in row:
            row[f"cute_varlen_bwd_vs_{other}"] = row[f"{other}_bwd_ms"] / row["cute_varlen_bwd_ms"]
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="results/cute_varlen", help="path prefix for the .json results and .png plot")
    parser.add_argument("--batch", type=int, default=1152)
    parser.add_argument("--backward", action="store_true", help="time forward+backward")
    parser.add_argument("--shapes", default=None,
                        help="max_len:sparsity pairs, comma-separated (default: N in 256..2048 at 1.0 and 0.5)")
    parser.add_argument("--head-dims", default="128,128", help="D,Dv")
    parser.add_argument("--causal", action="store_true", help="the causal mask in every sample")
    parser.add_argument("--window", type=int, default=None,
                        help="with --causal: HSTU's max_attn_len, window=(W, 0)")
    parser.add_argument("--cu-k-copy", action="store_true",
                        help="the keys' cu_seqlens a copy of the queries' (the CuTe kernels then run a band)")
    parser.add_argument("--activation", default=ACT)
    parser.add_argument("--log-n-bias", action="store_true", help="sigmoid attention's bias -log N on the scores")
    parser.add_argument("--rel-bias", action="store_true",
                        help="HSTU's learned relative bias [1, H, N, N] (with --backward, its gradient too)")
    args = parser.parse_args()
    if args.window is not None and not args.causal:
        parser.error("--window needs --causal (HSTU's max_attn_len)")
    window = (-1, -1) if args.window is None else (args.window, 0)
    d, dv = (int(x) for x in args.head_dims.split(","))
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), head_dims=[d, dv], causal=args.causal, window=list(window),
                cu_k_copy=args.cu_k_copy, activation=args.activation, log_n_bias=args.log_n_bias,
                rel_bias=args.rel_bias, benchmark="bench_cute_varlen")
    warm_up_gpu(2.0)
    fa4 = fa4_function("flash_attn_varlen_func")
    gen = torch.Generator().manual_seed(0)
    rows = []
    shapes = SHAPES if args.shapes is None else [
        (int(n), float(sp)) for n, sp in (pair.split(":") for pair in args.shapes.split(","))]
    for max_len, sparsity in shapes:
        rows.append(bench_shape(args.batch, max_len, sparsity, gen, fa4, args.backward, d, dv, args.causal, window,
                                args.cu_k_copy, args.activation, args.log_n_bias, args.rel_bias))
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    results = dict(meta=meta, backward=args.backward, rows=rows)
    with open(f"{args.out}.json", "w") as f:
        json.dump(results, f, indent=1)
    draw(results, f"{args.out}.png")


if __name__ == "__main__":
    main()
