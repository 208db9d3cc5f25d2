"""Jagged batches: the varlen op against the padded dense op and Inductor on the padded module (``op``), and the
CuTe-DSL varlen kernels against the Triton varlen kernels, the dense CuTe kernels on the padded batch and flash-attn-4's
varlen kernels (``kernels``). GPU only; ``kernels`` needs nvidia-cutlass-dsl, and flash-attn-4 for its provider.

    PYTHONPATH=$PWD python3 benchmarks/varlen.py <benchmark> [options]   # <benchmark> --help: what it measures
"""

from __future__ import annotations

import json
import math
import types

import torch
import torch.nn.functional as F
import triton

import gdpa_inductor
from benchmarks.harness.cli import Benchmark, UsageError, command_line, main
from benchmarks.harness.operands import lengths_for
from benchmarks.harness.plotting import draw
from benchmarks.harness.providers import fa4_function
from benchmarks.harness.results import run_meta, write_csv, write_json
from benchmarks.harness.timing import SETTLE_MS, median_over_rounds, warm_up_gpu
from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.kernels.reference_varlen import gdpa_varlen_reference
from gdpa_inductor.lowering.dispatch import select_varlen_backward_impl, select_varlen_forward_impl

# both benchmarks' activation (``kernels``: its default) and heads; D: the head dim of ``op``
ACT, H, D = "gelu_tanh", 4, 128

# ---- op --------------------------------------------------------------------------------------------------------------


SCALE, POST = D**-0.5, 1.0
INDUCTOR_SLICE = 64


def padded_module(q, k, v, lengths):
    """HSTU-style padded attention as a user writes it: [B, H, N, D] with a validity mask built from the
    lengths, applied after the activation."""
    n = q.shape[-2]
    valid = torch.arange(n, device=q.device)[None, :] < lengths[:, None]
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    p = F.gelu(q @ k.transpose(-2, -1) * SCALE, approximate="tanh") * POST
    return torch.where(mask, p, 0.0) @ v


def timed(fn, backward: bool, inputs, dout, graph: bool) -> float:
    """Milliseconds per call: launched from Python as a user would (``graph=False``: the host's dispatch
    cost included, which bounds short calls), or replayed from a CUDA graph (the GPU's time alone)."""
    def run():
        out = fn()
        if backward:
            torch.autograd.grad(out, inputs, dout)

    if graph:
        return triton.testing.do_bench_cudagraph(run, rep=60, return_mode="median")
    return triton.testing.do_bench(run, warmup=5, rep=60, return_mode="median")


def check_varlen(lengths, device) -> float:
    """Relative error of the varlen op (bf16) vs the float64 reference on the first 8 samples."""
    lens = lengths[:8]
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)]).to(device)
    t = int(lens.sum())
    q, k, v = (torch.randn(t, H, D, device=device, dtype=torch.float64) for _ in range(3))
    got = gdpa_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu, int(lens.max()), int(lens.max()),
                      activation=ACT, scale=SCALE, post_scale=POST)
    longest = int(lens.max())
    want = gdpa_varlen_reference(q, k, v, None, cu, cu, None, None, longest, longest, ACT, SCALE, POST, False,
                                 (-1, -1), 0.01)
    return ((got.double() - want).norm() / want.norm()).item()


def op_shape(batch: int, max_len: int, sparsity: float, device, gen) -> dict:
    lengths = lengths_for(batch, max_len, sparsity, gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).to(device)
    total = int(lengths.sum())
    row = dict(max_len=max_len, sparsity=sparsity, batch=batch, tokens=total,
               varlen_rel_err=check_varlen(lengths, device))
    mk = lambda *shape: torch.randn(*shape, device=device, dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    q, k, v = mk(total, H, D), mk(total, H, D), mk(total, H, D)
    dout = torch.randn(total, H, D, device=device, dtype=torch.bfloat16)
    used = lengths.to(device)
    qp, kp, vp = mk(batch, max_len, H, D), mk(batch, max_len, H, D), mk(batch, max_len, H, D)
    dp = torch.randn(batch, max_len, H, D, device=device, dtype=torch.bfloat16)
    providers = {
        "varlen": (lambda: gdpa_varlen(q, k, v, cu, cu, max_len, max_len, activation=ACT, scale=SCALE,
                                       post_scale=POST), (q, k, v), dout, 1.0),
        "padded_lengths": (lambda: gdpa_varlen(qp, kp, vp, None, None, max_len, max_len, activation=ACT, scale=SCALE,
                                               post_scale=POST, seqused_q=used, seqused_k=used),
                           (qp, kp, vp), dp, 1.0),
        "padded": (lambda: gdpa(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), activation=ACT,
                                scale=SCALE, post_scale=POST), (qp, kp, vp), dp.transpose(1, 2), 1.0),
    }
    b_ind = min(batch, INDUCTOR_SLICE)
    qi, ki, vi = (t[:b_ind].transpose(1, 2).detach().requires_grad_() for t in (qp, kp, vp))
    compiled = torch.compile(padded_module)
    providers["inductor"] = (lambda: compiled(qi, ki, vi, used[:b_ind]), (qi, ki, vi), dp[:b_ind].transpose(1, 2),
                             batch / b_ind)
    for name, (fn, inputs, d, factor) in providers.items():
        for backward in (False, True):
            for graph in (False, True):
                key = f"{name}_{'fwd_bwd' if backward else 'fwd'}{'_graph' if graph else ''}_ms"
                row[key] = timed(fn, backward, inputs, d, graph) * factor
    # The same module through backend="gdpa" (its length mask becomes the varlen op's per-sample lengths),
    # compiled from its own copy of the code so that its Dynamo cache is apart from Inductor's. Launch-timed
    # only: its compiled backward did not capture into a CUDA graph.
    own_code = padded_module.__code__.replace(co_name="padded_module_gdpa")
    via_backend = torch.compile(types.FunctionType(own_code, padded_module.__globals__), backend="gdpa")
    qb, kb, vb = (t.transpose(1, 2) for t in (qp, kp, vp))
    torch._dynamo.utils.counters.clear()
    via_backend(qb, kb, vb, used)
    row["backend_rewrites"] = torch._dynamo.utils.counters["gdpa"]["rewrites"]
    for backward in (False, True):
        key = f"backend_gdpa_{'fwd_bwd' if backward else 'fwd'}_ms"
        row[key] = timed(lambda: via_backend(qb, kb, vb, used), backward, (qp, kp, vp), dp.transpose(1, 2), False)
    return row


def op_options(ap):
    ap.add_argument("--out", default="results/varlen")
    ap.add_argument("--quick", action="store_true", help="a small batch and two lengths")


def run_op(args):
    """Jagged GDPA: the varlen op vs the padded dense op vs Inductor on the padded module (Meta's jagged shapes).

    B = 1152 samples, H = 4, D = 128, bf16, self attention, lengths up to N in {256, 512, 1024, 2048} at
    "sparsity" 1.0 (every sample full) and 0.5 (lengths uniform in [1, N]). Providers, one process:
    - ``varlen``: ``gdpa_varlen`` on the jagged tokens (work follows the real tokens);
    - ``padded_lengths``: ``gdpa_varlen`` on the padded [B, N, H, D] batch with per-sample valid lengths
      (``seqused``), what a padded model can be rewritten to;
    - ``padded``: the dense op ``gdpa`` on the padded [B, H, N, D] batch (every padded row and column computed);
    - ``inductor``: the padded module as users write it (``where(mask, act(QKᵀ·s)·post, 0) @ V`` with the
      validity mask built from the lengths), compiled by Inductor. Its N×N intermediates do not fit at B=1152,
      so it runs on a slice of the batch and its time is scaled to the whole batch (the padded work per sample
      is the same for every sample);
    - ``backend_gdpa``: that module compiled with ``backend="gdpa"`` at the full batch (the length mask
      becomes the varlen op's per-sample lengths; ``backend_rewrites`` counts the rewrite).
    The varlen op is checked against the float64 reference on 8 samples before timing. Each time is taken
    twice (do_bench medians): launched from Python (triton.testing.do_bench:
    includes the host's per-call dispatch, about 0.17 ms through the eager fast path, which bounds the shortest
    calls) and replayed from a CUDA graph
    (do_bench_cudagraph: the GPU's time, as under torch.compile's CUDA graphs). ``--quick``: a small grid.

        PYTHONPATH=$PWD python3 benchmarks/varlen.py op --out benchmarks/results/<run>/varlen   # .json, .csv, .png
    """
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    batch, lens = (128, (256, 1024)) if args.quick else (1152, (256, 512, 1024, 2048))
    rows = []
    for max_len in lens:
        for sparsity in (1.0, 0.5):
            row = op_shape(batch, max_len, sparsity, device, gen)
            rows.append(row)
            torch.cuda.empty_cache()
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    for row in rows:
        if row["sparsity"] < 1.0:
            full = next(r for r in rows if r["max_len"] == row["max_len"] and r["sparsity"] == 1.0)
            for what in ("fwd", "fwd_bwd", "fwd_graph", "fwd_bwd_graph"):
                row[f"varlen_{what}_vs_own_full"] = row[f"varlen_{what}_ms"] / full[f"varlen_{what}_ms"]
                row[f"padded_over_varlen_{what}"] = row[f"padded_{what}_ms"] / row[f"varlen_{what}_ms"]
                row[f"inductor_over_varlen_{what}"] = row[f"inductor_{what}_ms"] / row[f"varlen_{what}_ms"]
            for what in ("fwd", "fwd_bwd"):
                row[f"inductor_over_backend_gdpa_{what}"] = row[f"inductor_{what}_ms"] / row[f"backend_gdpa_{what}_ms"]
    meta = run_meta(command=command_line(), activation=ACT, heads=H, head_dim=D, dtype="bfloat16",
                    benchmark=args.benchmark)
    write_json(f"{args.out}.json", dict(meta=meta, rows=rows))
    write_csv(f"{args.out}.csv", rows, sorted({k for r in rows for k in r}))
    draw(dict(meta=meta, rows=rows), f"{args.out}.png")


# ---- kernels ---------------------------------------------------------------------------------------------------------


KERNEL_SHAPES = [(n, s) for n in (256, 512, 1024, 2048) for s in (1.0, 0.5)]
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


def kernels_shape(batch, max_len, sparsity, gen, fa4, backward: bool, d: int, dv: int, causal: bool,
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


def kernels_options(ap):
    ap.add_argument("--out", default="results/cute_varlen", help="path prefix for the .json results and .png plot")
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--backward", action="store_true", help="time forward+backward")
    ap.add_argument("--shapes", default=None,
                    help="max_len:sparsity pairs, comma-separated (default: N in 256..2048 at 1.0 and 0.5)")
    ap.add_argument("--head-dims", default="128,128", help="D,Dv")
    ap.add_argument("--causal", action="store_true", help="the causal mask in every sample")
    ap.add_argument("--window", type=int, default=None, help="with --causal: HSTU's max_attn_len, window=(W, 0)")
    ap.add_argument("--cu-k-copy", action="store_true",
                    help="the keys' cu_seqlens a copy of the queries' (the CuTe kernels then run a band)")
    ap.add_argument("--activation", default=ACT)
    ap.add_argument("--log-n-bias", action="store_true", help="sigmoid attention's bias -log N on the scores")
    ap.add_argument("--rel-bias", action="store_true",
                    help="HSTU's learned relative bias [1, H, N, N] (with --backward, its gradient too)")


def run_kernels(args):
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
    provider's scores but FA4's (softmax, no bias); ``--rel-bias`` HSTU's learned relative position bias instead, a
    bf16 tensor [1, H, N, N] shared by the samples (each reads its own [:n, :n]) that, with ``--backward``, takes its
    gradient (dbias) in every GDPA provider's backward; the dense padded provider reads it over the whole padded batch.

        R=benchmarks/results/<run>
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --out $R/cute_varlen_fwd   # .json and .png
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --backward --out $R/cute_varlen
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --backward --head-dims 256,256 \\
            --out $R/cute_varlen_d256
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --causal --backward --out $R/cute_varlen_causal
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --causal --window 256 --backward \\
            --out $R/cute_varlen_window256
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --activation sigmoid --log-n-bias --backward \\
            --out $R/cute_varlen_sigmoid
        PYTHONPATH=$PWD python3 benchmarks/varlen.py kernels --activation silu --causal --rel-bias --backward \\
            --out $R/cute_varlen_rel_bias
    """
    if args.window is not None and not args.causal:
        raise UsageError("--window needs --causal (HSTU's max_attn_len)")
    window = (-1, -1) if args.window is None else (args.window, 0)
    d, dv = (int(x) for x in args.head_dims.split(","))
    meta = run_meta(head_dims=[d, dv], causal=args.causal, window=list(window), cu_k_copy=args.cu_k_copy,
                    activation=args.activation, log_n_bias=args.log_n_bias, rel_bias=args.rel_bias,
                    benchmark=args.benchmark)
    warm_up_gpu(2.0)
    fa4 = fa4_function("flash_attn_varlen_func")
    gen = torch.Generator().manual_seed(0)
    rows = []
    shapes = KERNEL_SHAPES if args.shapes is None else [
        (int(n), float(sp)) for n, sp in (pair.split(":") for pair in args.shapes.split(","))]
    for max_len, sparsity in shapes:
        rows.append(kernels_shape(args.batch, max_len, sparsity, gen, fa4, args.backward, d, dv, args.causal, window,
                                  args.cu_k_copy, args.activation, args.log_n_bias, args.rel_bias))
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    results = dict(meta=meta, backward=args.backward, rows=rows)
    write_json(f"{args.out}.json", results)
    draw(results, f"{args.out}.png")


BENCHMARKS = {
    "op": Benchmark(run_op, op_options, writes="bench_varlen"),
    "kernels": Benchmark(run_kernels, kernels_options, writes="bench_cute_varlen"),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
