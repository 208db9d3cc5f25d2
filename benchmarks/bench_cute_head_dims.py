"""CuTe-DSL Hopper kernels at D = 96 and Dv != D against the Triton kernels and softmax attention (SDPA, and
flash-attn-4 where it takes the head dims), one process, same shapes, bf16 (GPU only; needs nvidia-cutlass-dsl, and
flash-attn-4 for its provider). D = Dv = 128 runs first as the anchor.

Per (D, Dv) and shape: the forward in the schedule ``fwd_schedule`` picks and in the other one (ping-pong and
split O stores on or off), the backward, and forward+backward; each provider's do_bench median in three rounds of
rotated order, each provider first running untimed for 300 ms so the clocks settle to its own load (the GPU
runs at its power cap: without it a provider that follows a heavy forward+backward read 2-6% low), the median
of those (``median_over_rounds``). FLOPs count D and Dv apart: the forward's two
matmuls 2·N²·D and 2·N²·Dv, the backward's five 2·N²·(3D + 2Dv).

    R=benchmarks/results/<run>
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_head_dims.py --out $R/cute_head_dims   # .json and .png
    PYTHONPATH=$PWD python3 benchmarks/bench_cute_head_dims.py --head-dims 128x128,256x256,128x256,256x128 \
        --passes fwd --out $R/cute_d256_fwd
"""

from __future__ import annotations

import datetime
import json

import torch
import torch.nn.functional as F
import triton
from bench_cute_bwd import fresh_operands  # beside this file
from bench_gdpa import cute_bench_parser, time_by_pass, warm_up_gpu
from plotting import draw

from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute
from gdpa_inductor.kernels.cute.gdpa_fwd import fwd_schedule, gdpa_fwd_cute
from gdpa_inductor.kernels.triton.gdpa_bwd import gdpa_bwd_triton
from gdpa_inductor.kernels.triton.gdpa_fwd import gdpa_fwd_triton

HEAD_DIMS = [(128, 128), (96, 96), (64, 128), (128, 64), (96, 128), (64, 96)]
SHAPES = [(1024, 1024), (2048, 2048), (2048, 256)]


def _fa4():
    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception as e:  # noqa: BLE001 - not staged, or no SM90 build
        print("flash-attn-4 unavailable:", repr(e)[:200], flush=True)
        return None
    return flash_attn_func


def fa4_providers(fa4, q, k, v, do, scale) -> dict:
    """flash-attn-4's forward and forward+backward on [Z, H, N, D] operands (its layout is [Z, N, H, D]; the
    gradients through torch.autograd.grad), or nothing where it is not staged."""
    if fa4 is None:
        return {}
    qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dos = do.transpose(1, 2).contiguous()

    def fa4_fb():
        o = fa4(qs, ks, vs, softmax_scale=scale)
        torch.autograd.grad(o[0] if isinstance(o, tuple) else o, (qs, ks, vs), dos)

    return {"fa4_fwd": lambda: fa4(qs.detach(), ks.detach(), vs.detach(), softmax_scale=scale), "fa4_fb": fa4_fb}


def timing(rows, batch, heads, act, head_dims, passes, settle_ms):
    fa4 = _fa4()
    for d, dv in head_dims:
        pingpong, split = fwd_schedule(d, dv)
        for nq, nk in SHAPES:
            # the previous shape's tensors go before the allocator cache is emptied
            q = k = v = do = fns = None
            z, q, k, v, do = fresh_operands(batch, heads, nq, nk, d, dv)
            scale, post = d**-0.5, 1.0 / nk
            fwd_flops = 2.0 * z * heads * nq * nk * (d + dv)
            bwd_flops = 2.0 * z * heads * nq * nk * (3 * d + 2 * dv)
            qt, kt, vt = (t.detach().requires_grad_() for t in (q, k, v))

            # torch.autograd.grad, not .backward(): gradients accumulated into .grad would add three elementwise
            # adds (dQ, dK, dV) to each call of the softmax providers after the first
            def sdpa_fb():
                torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, scale=scale), (qt, kt, vt), do)

            fns = {
                "cute_fwd": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                "cute_fwd_other": lambda: gdpa_fwd_cute(q, k, v, act, scale, post, 0.01, pingpong=not pingpong,
                                                        split_store=not split),
                "triton_fwd": lambda: gdpa_fwd_triton(q, k, v, None, act, scale, post, False, 0.01),
                "sdpa_fwd": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),
                "cute_bwd": lambda: gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01),
                "triton_bwd": lambda: gdpa_bwd_triton(do, q, k, v, None, act, scale, post, False, 0.01, False),
                "cute_fb": lambda: (gdpa_fwd_cute(q, k, v, act, scale, post, 0.01),
                                    gdpa_bwd_cute(q, k, v, do, act, scale, post, 0.01)),
                "sdpa_fb": sdpa_fb,
            }
            fns.update(fa4_providers(fa4, q, k, v, do, scale))
            fns = {name: fn for name, fn in fns.items() if name.split("_")[1] in passes}
            row = dict(kind="time", d=d, dv=dv, z=z, heads=heads, nq=nq, nk=nk, pingpong=pingpong, split_store=split)
            # provider names read "<provider>_<pass>[_variant]"
            flops = dict(fwd=fwd_flops, bwd=bwd_flops, fb=fwd_flops + bwd_flops)
            rows.append(time_by_pass(row, fns, flops, settle_ms))


def main():
    ap = cute_bench_parser("gelu_tanh")
    ap.add_argument("--head-dims", default=",".join(f"{d}x{dv}" for d, dv in HEAD_DIMS), help="DxDv,...")
    ap.add_argument("--passes", default="fwd,bwd,fb", help="which of fwd, bwd, fb to time")
    args = ap.parse_args()
    head_dims = [tuple(int(x) for x in hd.split("x")) for hd in args.head_dims.split(",")]
    rows = []
    warm_up_gpu(3.0)
    timing(rows, args.batch, args.heads, args.activation, head_dims, args.passes.split(","), args.settle_ms)
    if args.out:
        results = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                       date=datetime.date.today().isoformat(), benchmark="bench_cute_head_dims",
                       activation=args.activation, rows=rows)
        with open(args.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
        draw(results, args.out + ".png")


if __name__ == "__main__":
    main()
