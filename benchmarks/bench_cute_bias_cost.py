"""What a one-element bias costs the CuTe-DSL Hopper kernels alone: each kernel without a bias, with a bias of 0 and
with sigmoid attention's -log Nk (the same build twice: the scores differ, the instructions do not), the six in
one process, each one's do_bench median over three rounds of rotated order after 300 ms untimed
(``median_over_rounds``). B=1152, H=4, D=128, bf16; TF/s (the backward counted at 2.5x the forward's work).

``bench_cute_bias.py`` times the same kernels among Triton's, SDPA's and FA4's, whose loads come before them in the
rotation; this one times nothing else (GPU only; needs nvidia-cutlass-dsl).

    PYTHONPATH=$PWD python3 benchmarks/bench_cute_bias_cost.py
"""

from __future__ import annotations

import math

import torch
from bench_cute_bwd import fresh_operands  # beside this file
from bench_gdpa import median_over_rounds, warm_up_gpu

from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute

SHAPES = [(512, 512), (1024, 1024), (2048, 256)]


def main():
    warm_up_gpu(2.0)
    for act in ("sigmoid", "gelu_tanh"):
        for nq, nk in SHAPES:
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


if __name__ == "__main__":
    main()
