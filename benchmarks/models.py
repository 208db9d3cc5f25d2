"""Whole models under backend="gdpa" against backend="inductor": the demo's training step (``demo-step``), the ranking
example's (``ranking``), and HSTU's reference attention (``hstu-reference``). GPU only.

    PYTHONPATH=$PWD python3 benchmarks/models.py <benchmark> [options]   # <benchmark> --help: what it measures
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import pathlib
import statistics
import time

import torch
import torch.nn.functional as F
import triton

import gdpa_inductor
from benchmarks.harness.cli import Benchmark, command_line, main
from benchmarks.harness.plotting import draw
from benchmarks.harness.results import run_meta, write_json
from gdpa_inductor.backend_comparison import time_step_ms
from gdpa_inductor.demo import DemoRecModel, _loss, make_batch

# ---- demo-step -------------------------------------------------------------------------------------------------------


SIZES = ((64, 256), (256, 512), (1024, 512))


MODES = ("default", "reduce-overhead")


def step_ms(model, batch, backend: str, mode: str) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend=backend, mode=None if mode == "default" else mode)
    return time_step_ms(compiled, batch, _loss, 1e-3, iters=20, repeats=5)


def demo_step_options(ap):
    ap.add_argument("--out", default="demo_step.json")


def run_demo_step(args):
    """The demo's training step under backend="gdpa" against "inductor", in the default mode and under CUDA graphs.

    The model is the demo's (``gdpa_inductor.demo.DemoRecModel``: HSTU-style silu attention with a relative bias, a
    causal mask and padding; PFFN with per-sample weights; PMA pooling), width 512, 4 heads, bf16, at three sizes (batch
    / longest history). A step is forward, backward and an SGD update (``backend_comparison.time_step_ms``: median of
    five rounds of the mean of 20 steps). Every provider runs in this one process, each compiled from its own copy of
    the same weights.

        PYTHONPATH=$PWD python3 benchmarks/models.py demo-step --out benchmarks/results/<run>/demo_step.json
    """
    rows = []
    meta = run_meta(dim=512, heads=4, dtype="bfloat16", units="ms per step", command=command_line(),
                    benchmark=args.benchmark)
    for batch_size, seq in SIZES:
        torch.manual_seed(0)
        model = DemoRecModel(512, 4, seeds=4, dff=64, max_len=seq).cuda().to(torch.bfloat16)
        batch = make_batch(batch_size, seq, 512, "cuda", torch.bfloat16)
        for mode in MODES:
            times = {backend: step_ms(model, batch, backend, mode) for backend in ("inductor", "gdpa")}
            rows.append(dict(batch=batch_size, seq=seq, mode=mode, inductor_ms=round(times["inductor"], 3),
                             gdpa_ms=round(times["gdpa"], 3), speedup=round(times["inductor"] / times["gdpa"], 3)))
            print(json.dumps(rows[-1]), flush=True)
    write_json(args.out, dict(meta=meta, rows=rows))


# ---- ranking ---------------------------------------------------------------------------------------------------------


EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ranking_pffn_pma.py"


def load_example():
    spec = importlib.util.spec_from_file_location("ranking_pffn_pma", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_length(example, args, max_len: int) -> dict:
    argv = ["--device", "cuda", "--batch", str(args.batch), "--seq", str(max_len), "--layers", str(args.layers),
            "--steps", str(args.steps)]
    report, comparison = example.main(argv)
    row = dict(batch=args.batch, max_len=max_len, layers=args.layers, fused=len(report.fused),
               loss_rel_diff=comparison.loss_rel_diff("gdpa"), speedup=comparison.speedup("gdpa"))
    for name, run in comparison.runs.items():
        row[name] = dict(step_ms=run.step_ms, compile_s=run.compile_s, losses=run.losses, error=run.error,
                         gdpa_kernels=run.gdpa_kernels)
    return row


def ranking_options(ap):
    ap.add_argument("--out", default="results/model")
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--lengths", default="256,512,1024")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)


def run_ranking(args):
    """Model-level benchmark: one training step of the ranking example under backend="gdpa" vs "inductor".

    The model is ``examples/ranking_pffn_pma.py`` unchanged (two layers of silu self-attention over a padded
    jagged history + PFFN with per-sample weights, PMA pooling, an MLP head; BCE loss), at a realistic size:
    B=1152 samples, H=4, D=128 (width 512), PFFN 256 per head, histories uniform in [1, N] for N = 256..1024.
    A step is forward, backward and an SGD update; both backends start from the same weights, train on the same
    batches (losses recorded side by side) and are timed in one process.

        PYTHONPATH=$PWD python3 benchmarks/models.py ranking --out benchmarks/results/<run>/model   # .json, .png
    """
    example = load_example()
    meta = run_meta(command=command_line(), model="examples/ranking_pffn_pma.py", heads=4, head_dim=128, dff=256,
                    dtype="bfloat16", benchmark=args.benchmark)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for max_len in map(int, args.lengths.split(",")):
        rows.append(bench_length(example, args, max_len))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("inductor", "gdpa")}), flush=True)
        # after every length: a run cut short keeps what it measured
        write_json(f"{args.out}.json", dict(meta=meta, rows=rows))
    draw(dict(meta=meta, rows=rows), f"{args.out}.png")


# ---- hstu-reference --------------------------------------------------------------------------------------------------


# the reference attention's heads and head dim
H, D = 4, 128
# rounds per shape; each backend's time is the median of its rounds
HSTU_ROUNDS = 5
HSTU_SHAPES = [  # (batch, max length, max_attn_len)
    (64, 1024, 0),
    (64, 1024, 256),
    (128, 512, 0),
    (32, 2048, 0),
]


def padded(x: torch.Tensor, offsets: torch.Tensor, n: int) -> torch.Tensor:
    """[L, H, D] jagged rows -> [B, H, N, D], zeros past each sample's length."""
    lengths = offsets[1:] - offsets[:-1]
    pos = torch.arange(n, device=x.device)[None, :]
    src = (offsets[:-1, None] + pos).clamp(max=x.shape[0] - 1)
    valid = (pos < lengths[:, None])[..., None, None]
    return (x[src] * valid).transpose(1, 2)


def jagged(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[B, H, N, V] -> [L, H, V]: the rows ``rows`` (flat b * N + i indices of the valid positions)."""
    b, h, n, v = x.shape
    return x.transpose(1, 2).reshape(b * n, h, v)[rows]


def valid_attn_mask(n: int, max_attn_len: int, device) -> torch.Tensor:
    ids = torch.arange(n, device=device)
    dist = ids.view(n, 1) - ids.view(1, n)
    mask = torch.logical_or(torch.eye(n, device=device, dtype=torch.bool), dist > 0)
    if max_attn_len > 0:
        mask = torch.logical_and(mask, dist <= max_attn_len)
    return mask.view(1, n, n)


def hstu_mha(q, k, v, offsets, rows, n: int, max_attn_len: int, alpha: float):
    qp, kp, vp = (padded(t, offsets, n) for t in (q, k, v))
    attn = torch.einsum("bhxa,bhya->bhxy", qp, kp) * alpha
    attn = F.silu(attn) / n
    attn = attn * valid_attn_mask(n, max_attn_len, q.device).unsqueeze(1)
    return jagged(torch.einsum("bhxd,bhdv->bhxv", attn, vp), rows)


def make_inputs(b: int, n: int, device, gen: torch.Generator):
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    lengths[0] = n
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    rows = torch.cat([i * n + torch.arange(int(length)) for i, length in enumerate(lengths)])
    total = int(lengths.sum())
    qkv = [torch.randn(total, H, D, generator=gen).to(device, torch.bfloat16) for _ in range(3)]
    return qkv, offsets.to(device), rows.to(device)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach()).norm() / b.detach().norm().clamp_min(1e-30))


def hstu_shape(b: int, n: int, max_attn_len: int, gen: torch.Generator) -> dict:
    (q, k, v), offsets, rows = make_inputs(b, n, "cuda", gen)
    fn = functools.partial(hstu_mha, offsets=offsets, rows=rows, n=n, max_attn_len=max_attn_len, alpha=D ** -0.5)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dout = torch.randn(q.shape[0], H, D, generator=gen).to("cuda", torch.bfloat16)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = fn(*ref_leaves)
    ref.backward(dout.double())
    eager_err = rel_err(fn(q, k, v), ref)
    torch._dynamo.reset()  # explain reads this shape's own compile, not a recompile after the last shape's
    row = dict(batch=b, max_len=n, max_attn_len=max_attn_len, eager_bf16_out_err=eager_err,
               fused=[line.strip() for line in str(gdpa_inductor.explain(fn, q, k, v)).splitlines()[1:]])
    torch._dynamo.reset()
    steps = {}
    for backend in ("inductor", "gdpa"):
        compiled = torch.compile(fn, backend=backend)

        def step(compiled=compiled):
            for t in leaves:
                t.grad = None
            out = compiled(*leaves)
            out.backward(dout)
            return out

        out = step()
        errs = [rel_err(out, ref)] + [rel_err(t.grad, r.grad) for t, r in zip(leaves, ref_leaves)]
        steps[backend] = step
        row[backend] = dict(rel_err=errs)
    times = {backend: [] for backend in steps}
    latencies = {backend: [] for backend in steps}
    for r in range(HSTU_ROUNDS):  # rounds in alternating order: neither backend always runs first
        for backend in (list(steps) if r % 2 == 0 else list(reversed(steps))):
            times[backend].append(steps_back_to_back_ms(steps[backend]))
            latencies[backend].append(
                triton.testing.do_bench(steps[backend], warmup=10, rep=100, return_mode="median"))
    for backend in steps:
        row[backend]["ms"] = statistics.median(times[backend])
        row[backend]["latency_ms"] = statistics.median(latencies[backend])
        print(f"B={b} N={n} max_attn_len={max_attn_len} {backend}: {row[backend]['ms']:.3f} ms a step "
              f"({row[backend]['latency_ms']:.3f} ms alone), errors {row[backend]['rel_err']} "
              f"(eager bf16 out {eager_err:.2e})", flush=True)
    row["speedup"] = row["inductor"]["ms"] / row["gdpa"]["ms"]
    row["latency_speedup"] = row["inductor"]["latency_ms"] / row["gdpa"]["latency_ms"]
    print(f"  gdpa vs inductor: {row['speedup']:.2f}x a step, {row['latency_speedup']:.2f}x alone", flush=True)
    return row


def steps_back_to_back_ms(step, iters: int = 20) -> float:
    """The mean wall time of ``iters`` steps run one after another, as a training loop runs them (the host prepares
    a step while the GPU runs the one before), after two untimed steps."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def hstu_reference_options(ap):
    ap.add_argument("--out", default=None)


def run_hstu_reference(args):
    """HSTU attention as generative-recommenders' pure-PyTorch reference computes it, compiled by ``backend="gdpa"``
    and by ``backend="inductor"``: forward + backward, same process, same inputs.

    The model follows the reference's steps (written here, not imported): jagged q, k, v [L, H, D] padded to
    [B, H, N, D] (pure-torch gathers stand in for fbgemm's jagged_to_padded_dense), ``einsum`` scores times alpha,
    ``silu(.) / N``, times the reference's mask built from ``arange``, ``eye`` and comparisons (causal, optionally
    ``max_attn_len``), ``einsum`` with V, and back to jagged rows. Lengths are uniform in [N/2, N]; H = 4, D = 128,
    bf16. Both backends' outputs and q/k/v gradients are checked against float64 before timing. A step (forward and
    backward) is timed as a training loop runs it, 20 steps back to back (``ms``, the speed-up), and alone, with the
    L2 cache flushed before it (``triton.testing.do_bench``: ``latency_ms``); each the median of five rounds.

        PYTHONPATH=$PWD python3 benchmarks/models.py hstu-reference \\
            --out benchmarks/results/<run>/hstu_reference.json
    """
    gen = torch.Generator().manual_seed(0)
    rows_out = [hstu_shape(b, n, max_attn_len, gen) for b, n, max_attn_len in HSTU_SHAPES]
    if args.out:
        meta = run_meta(heads=H, head_dim=D, dtype="bfloat16", command=command_line(), benchmark=args.benchmark)
        write_json(args.out, dict(meta=meta, rows=rows_out))


BENCHMARKS = {
    "demo-step": Benchmark(run_demo_step, demo_step_options, writes="bench_demo_step"),
    "ranking": Benchmark(run_ranking, ranking_options, writes="bench_model"),
    "hstu-reference": Benchmark(run_hstu_reference, hstu_reference_options, writes="bench_hstu_reference"),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
