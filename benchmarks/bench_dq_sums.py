"""How the CuTe backward should sum dQ over key tiles: in place in the operands' dtype, by pairs of key tiles
(fp32 within a cluster of two CTAs, then in place), or in an fp32 buffer. GPU only (sm_90, cutlass-dsl staged
with ../shared/device/stage-cute-dsl.sh).

For each number of 128-key tiles, dQ's relative error against float64 for each sum that takes it (pairs: an
even number of tiles), next to eager PyTorch's own error at the same inputs (four activations, bf16 and fp16);
then backward TF/s of each at Meta's shapes (B=1152, H=4, D=128, bf16, do_bench medians).
``DQ_DIRECT_MAX_KEY_TILES`` and ``dq_sums_for`` in kernels/cute/gdpa_bwd.py are chosen from this table.

    PYTHONPATH=$PWD python3 benchmarks/bench_dq_sums.py --out results/dq_sums
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="path prefix for the .json rows")
    args = ap.parse_args()
    rows = []
    errors(rows)
    timing(rows)
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
        with open(f"{args.out}.json", "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
