"""Host time per call of the GDPA ops, and where it goes (the varlen op at Meta's shortest jagged shapes).

A launch-timed call costs the host's time until its last kernel launch plus that kernel's GPU time, so at
short sequences the host's dispatch decides the measured speed. This prints microseconds of host time per
call for each layer of the varlen call (validation, the custom op with and without autograd, the schedule
launch, the forward launch) and for the dense op, the same calls launch-timed and replayed from a CUDA graph
(the GPU's time alone), then a cProfile of the full call. ``--backend`` picks the kernels (``config.backend``:
"cute" for the CuTe-DSL kernels, "triton"); ``--max-len``/``--sparsity`` the jagged shape (lengths all N at
1.0, uniform in [1, N] below).

    PYTHONPATH=$PWD python3 benchmarks/host_overhead.py [--backend cute] [--max-len 128 --sparsity 1.0]
        [--out benchmarks/results/<run>/host_overhead.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import triton
from bench_varlen import lengths_for  # beside this file

import gdpa_inductor
from gdpa_inductor import gdpa, gdpa_varlen
from gdpa_inductor.lowering import ops, varlen_ops
from gdpa_inductor.lowering.varlen_ops import _sides, varlen_fwd
from gdpa_inductor.validation_varlen import check_varlen_args

H, D, N, BATCH, ACT = 4, 128, 256, 1152, "gelu_tanh"


def host_us(fn, calls: int = 200) -> float:
    """Median over 5 rounds of the mean host time per call; the GPU is drained between rounds so that a
    full launch queue never stalls the host."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--backend", default="auto", choices=gdpa_inductor.config.BACKENDS)
    parser.add_argument("--max-len", type=int, default=N)
    parser.add_argument("--sparsity", type=float, default=0.5)
    args = parser.parse_args()
    gdpa_inductor.config.backend = args.backend
    n = args.max_len
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    lengths = lengths_for(BATCH, n, args.sparsity, gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).to(dev)
    total = int(lengths.sum())
    mk = lambda *s, g=False: torch.randn(*s, device=dev, dtype=torch.bfloat16, requires_grad=g)  # noqa: E731
    q, k, v = mk(total, H, D), mk(total, H, D), mk(total, H, D)
    qg, kg, vg = mk(total, H, D, g=True), mk(total, H, D, g=True), mk(total, H, D, g=True)
    qd, kd, vd = mk(BATCH, H, n, D, g=True), mk(BATCH, H, n, D, g=True), mk(BATCH, H, n, D, g=True)
    op_args = (None, cu, cu, None, None, n, n, ACT, D**-0.5, 1.0, False, -1, -1, 0.01)

    def call(a, b, c):
        return gdpa_varlen(a, b, c, cu, cu, n, n, activation=ACT, scale=D**-0.5)

    pieces = {
        "validation": lambda: check_varlen_args(q, k, v, cu, cu, n, n, activation=ACT, scale=1.0, post_scale=1.0,
                                                window=None, negative_slope=0.01, seqused_q=None, seqused_k=None),
        "schedule launch (_sides)": lambda: _sides(q, k, v, cu, cu, None, None, n, n),
        "forward_impl (launches only)": lambda: varlen_ops.forward_impl(q, k, v, *op_args),
        "op .default, no grad (compiled code)": lambda: torch.ops.gdpa.varlen_fwd_v2.default(q, k, v, *op_args),
        "custom op, no grad": lambda: varlen_fwd(q, k, v, *op_args),
        "custom op, grad": lambda: varlen_fwd(qg, kg, vg, *op_args),
        "gdpa_varlen, no grad": lambda: call(q, k, v),
        "gdpa_varlen, grad": lambda: call(qg, kg, vg),
        "gdpa (dense), grad": lambda: gdpa(qd, kd, vd, activation=ACT, scale=D**-0.5),
        "dense custom op, grad": lambda: ops.attention_fwd(qd, kd, vd, None, ACT, D**-0.5, 1.0, False, 0.01),
    }
    rows = {name: host_us(fn) for name, fn in pieces.items()}
    launch = dict(warmup=5, rep=60, return_mode="median")
    rows["do_bench gdpa_varlen, grad (ms)"] = triton.testing.do_bench(lambda: call(qg, kg, vg), **launch)
    rows["do_bench gdpa_varlen, no grad (ms)"] = triton.testing.do_bench(lambda: call(q, k, v), **launch)
    rows["do_bench_cudagraph gdpa_varlen (ms)"] = triton.testing.do_bench_cudagraph(
        lambda: call(q, k, v), rep=60, return_mode="median")
    rows["do_bench gdpa dense, grad (ms)"] = triton.testing.do_bench(
        lambda: gdpa(qd, kd, vd, activation=ACT, scale=D**-0.5), **launch)
    qn, kn, vn = (t.detach() for t in (qd, kd, vd))
    rows["do_bench gdpa dense, no grad (ms)"] = triton.testing.do_bench(
        lambda: gdpa(qn, kn, vn, activation=ACT, scale=D**-0.5), **launch)
    rows["do_bench_cudagraph gdpa dense (ms)"] = triton.testing.do_bench_cudagraph(
        lambda: gdpa(qn, kn, vn, activation=ACT, scale=D**-0.5), rep=60, return_mode="median")
    for name, value in rows.items():
        print(f"{name:40s} {value:9.3f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(200):
        call(qg, kg, vg)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, backend=args.backend, max_len=n, sparsity=args.sparsity,
                           device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__),
                      f, indent=1)


if __name__ == "__main__":
    main()
