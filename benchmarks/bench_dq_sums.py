"""How the CuTe backward should sum dQ over key tiles: in place in the operands' dtype, by pairs of key tiles
(fp32 within a cluster of two CTAs, then in place), or in an fp32 buffer. GPU only (sm_90, needs
nvidia-cutlass-dsl).

For each number of 128-key tiles, dQ's relative error against float64 for each sum that takes it (pairs: an
even number of tiles), next to eager PyTorch's own error at the same inputs (four activations, bf16 and fp16);
then backward TF/s of each at Meta's shapes (B=1152, H=4, D=128, bf16, do_bench medians), and past eight key
tiles at each pair of head dims (``--only-head-dims`` runs just that). ``DQ_DIRECT_MAX_KEY_TILES``
and ``dq_sums_for`` in kernels/cute/gdpa_bwd.py are chosen from these tables.

    PYTHONPATH=$PWD python3 benchmarks/bench_dq_sums.py --out benchmarks/results/<run>/dq_sums   # .json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
from bench_cute_fwd import META_SHAPES, _rel  # beside this file

from gdpa_inductor.kernels.activations import get_activation
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.reference import gdpa_reference_backward


def _eager_dq(q, k, v, do, act, scale, post):
    q = q.detach().requires_grad_()
    (get_activation(act).torch_fn(q @ k.transpose(-2, -1) * scale, 0.01) * post @ v).backward(do)
    return q.grad


def errors(rows):
    torch.manual_seed(0)
    z, h, nq, d = 2, 4, 512, 128
    for dtype in (torch.bfloat16, torch.float16):
        for act in ("silu", "gelu_tanh", "sigmoid", "relu"):
            for nk in (128, 256, 384, 512, 1024, 1536, 2048):
                q, do = (torch.randn(z, h, nq, d, device="cuda", dtype=dtype) for _ in range(2))
                k, v = (torch.randn(z, h, nk, d, device="cuda", dtype=dtype) for _ in range(2))
                scale, post = d**-0.5, 1.0 / nk
                ref = gdpa_reference_backward(do.double(), q.double(), k.double(), v.double(), None, act, scale,
                                              post)[0]
                row = dict(kind="error", dtype=str(dtype), act=act, nk=nk,
                           eager=_rel(_eager_dq(q, k, v, do, act, scale, post), ref))
                for how in _sums(nk):
                    row[how] = _rel(gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01, dq_sums=how)[0], ref)
                rows.append(row)
                print(f"{row['dtype']:15s} {act:10s} nk={nk:5d} eager={row['eager']:.2e} "
                      + " ".join(f"{how}={row[how]:.2e}" for how in _sums(nk)), flush=True)


def _sums(nk):
    """The sums that can take nk keys: pairs need an even number of key tiles."""
    return ("fp32", "in_place") + (("pairs",) if -(-nk // 128) % 2 == 0 else ())


def timing(rows, batch=1152, heads=4, d=128):
    for nq, nk in META_SHAPES[:3] + META_SHAPES[4:]:
        q, do = (torch.randn(batch, heads, nq, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(batch, heads, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = 2.5 * 4 * batch * heads * nq * nk * d
        row = dict(kind="time", nq=nq, nk=nk)
        for how in _sums(nk):
            def run(how=how, q=q, k=k, v=v, do=do, nk=nk):
                return gdpa_bwd_cute(q, k, v, do, "silu", d**-0.5, 1.0 / nk, 0.01, dq_sums=how)

            ms = triton.testing.do_bench(run, warmup=50, rep=300)
            row[f"{how}_tflops"] = flops / ms / 1e9
        rows.append(row)
        print(f"bwd {nq}x{nk}: " + ", ".join(f"{how} {row[f'{how}_tflops']:.0f} TF/s" for how in _sums(nk)),
              flush=True)


HEAD_DIM_CASES = [(d, d, n) for d in (64, 96, 128) for n in (1280, 1536, 2048)] + [
    (128, 64, 2048), (64, 128, 2048), (96, 64, 2048)]


def timing_by_head_dims(rows, heads=4, act="gelu_tanh"):
    """Past eight key tiles, which sum is faster at each (D, Dv) (``dq_sums_for``): fp32, pairs and in place
    (the ceiling, past the error bound there), q = kv, the batch scaled to 288 x (2048 / N)², each sum's median of
    three rotated and settled rounds."""
    from bench_gdpa import SETTLE_MS, median_over_rounds, warm_up_gpu

    warm_up_gpu(3.0)
    for d, dv, n in HEAD_DIM_CASES:
        q = k = v = do = None
        torch.cuda.empty_cache()
        z = int(288 * (2048 / n) ** 2)
        q = torch.randn(z, heads, n, d, device="cuda", dtype=torch.bfloat16)
        do = torch.randn(z, heads, n, dv, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(z, heads, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(z, heads, n, dv, device="cuda", dtype=torch.bfloat16)
        fns = {how: (lambda how=how: gdpa_bwd_cute(q, k, v, do, act, d**-0.5, 1.0 / n, 0.01, dq_sums=how))
               for how in ("fp32", "pairs", "in_place")}
        flops = 2.0 * z * heads * n * n * (3 * d + 2 * dv)
        row = dict(kind="time_head_dims", act=act, d=d, dv=dv, n=n, z=z)
        for how, ms in median_over_rounds(fns, settle_ms=SETTLE_MS, warmup=25, rep=100).items():
            row[f"{how}_tflops"] = None if ms is None else flops / ms / 1e9
        rows.append(row)
        print(row, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="path prefix for the .json rows")
    ap.add_argument("--only-head-dims", action="store_true", help="only the timing by head dims")
    args = ap.parse_args()
    rows = []
    if not args.only_head_dims:
        errors(rows)
        timing(rows)
    timing_by_head_dims(rows)
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
        with open(f"{args.out}.json", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
