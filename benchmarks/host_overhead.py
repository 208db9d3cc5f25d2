"""Host time per fused call: what each GDPA op call of a compiled training step costs the CPU.

The demo's model (``gdpa_inductor.demo.DemoRecModel``: HSTU-style silu attention with a relative bias, a causal mask
and padding; PFFN with per-sample weights; PMA pooling) is compiled with backend="gdpa", its fused blocks as calls of
the opaque op (the path of dynamic shapes and of the CuTe kernels; with static shapes on the Triton path the compiled
graph launches the kernels itself and makes no such call), and trained one step while every GDPA op call is recorded
with its arguments. Each recorded call is then replayed alone, as the compiled code
calls it (``torch.ops.gdpa.<op>.default``), and its host time measured: the mean over ``--calls`` calls of the time
until the call returns, median of five rounds, the GPU drained between rounds so a full launch queue never stalls
the host. Beside them, two references: an aten op (``torch.add``) and an empty Triton kernel's launch. A cProfile
of each call (``--profile``) says where its host time goes.

Then the same question inside compiled code: one fused block alone (a dense silu block and a length-masked varlen
one, tiny shapes) compiled with backend="inductor", with backend="gdpa" as opaque op calls, and with backend="gdpa"
launching the Triton kernels from the compiled graph; host time of a forward call (inference) and of a forward and
backward call, with the compiled graph's own Python (guards, wrapper) included.

    PYTHONPATH=$PWD python3 benchmarks/host_overhead.py [--batch 64 --seq 256] [--profile]
        [--out benchmarks/results/<run>/host_overhead.json]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import functools
import io
import json
import pstats
import sys
import time

import torch
import triton
import triton.language as tl

import gdpa_inductor
from gdpa_inductor.demo import DemoRecModel, _loss, make_batch


@triton.jit
def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


def host_us(fn, calls: int) -> float:
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


def record_step_calls(batch: int, seq: int) -> list:
    """(op overload, args, kwargs) of every GDPA op call in one compiled training step of the demo's model, compiled
    to call the opaque ops (as dynamic shapes and the CuTe kernels do)."""
    from torch._library.custom_ops import CustomOpDef

    from gdpa_inductor.lowering import buffer_mask_ops, direct_launch, ops, varlen_ops

    torch.manual_seed(0)
    model = DemoRecModel(512, 4, seeds=4, dff=64, max_len=seq).to("cuda", torch.bfloat16)
    inputs = make_batch(batch, seq, 512, "cuda", torch.bfloat16)
    compiled = torch.compile(model, backend="gdpa")
    # compiled with the opaque op calls: with static shapes the graph would launch the Triton kernels itself
    with direct_launch.disabled():
        _loss(compiled, inputs).backward()
    calls, saved = [], []
    # the op's Python kernels, wrapped to record their arguments (the compiled code calls them through the dispatcher)
    for module in (ops, varlen_ops, buffer_mask_ops):
        for opdef in vars(module).values():
            if isinstance(opdef, CustomOpDef):
                for key, fn in list(opdef._backend_fns.items()):
                    def recording(*a, _fn=fn, _op=opdef._opoverload, **kw):
                        calls.append((_op, a, kw))
                        return _fn(*a, **kw)
                    saved.append((opdef, key, fn))
                    opdef._backend_fns[key] = recording
    try:
        _loss(compiled, inputs).backward()
    finally:
        for opdef, key, fn in saved:
            opdef._backend_fns[key] = fn
    return calls


def dense_block(q, k, v):
    return torch.nn.functional.silu(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5) @ v


def varlen_block(q, k, v, lengths):
    n = q.shape[-2]
    valid = torch.arange(n, device=q.device)[None, :] < lengths[:, None]
    p = torch.nn.functional.silu(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5) / n
    return torch.where(valid[:, None, :, None] & valid[:, None, None, :], p, 0.0) @ v


def backward_of(call, grad):
    call().backward(grad)


def compiled_block_rows(calls: int) -> dict:
    """Host µs per call of one compiled fused block: Inductor's own kernels, gdpa's opaque op, gdpa's direct launch."""
    from gdpa_inductor.lowering import direct_launch

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    lengths = torch.tensor([64, 40], device="cuda")
    rows = {}
    for block, args in (("dense", (q, k, v)), ("varlen", (q, k, v, lengths))):
        fn = dense_block if block == "dense" else varlen_block
        for provider in ("inductor", "gdpa opaque op", "gdpa direct launch"):
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=provider.split()[0], fullgraph=True)
            launch = direct_launch.disabled() if provider == "gdpa opaque op" else contextlib.nullcontext()
            with launch:
                compiled(*args).sum().backward()  # compiles forward and backward in this mode
                with torch.no_grad():
                    compiled(*args)
            call = functools.partial(compiled, *args)
            with torch.no_grad():
                fwd = host_us(call, calls)
            fwd_bwd = host_us(functools.partial(backward_of, call, torch.ones_like(q)), calls)
            for what, us in (("forward", fwd), ("forward + backward", fwd_bwd)):
                rows[f"compiled {block} block, {what}: {provider}"] = us
                print(f"compiled {block} block, {what}: {provider:20s} {us:8.1f} us", flush=True)
    return rows


def describe(func, args) -> str:
    shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
    return f"{func.name()} {shapes[:4]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    rows = {}
    a = torch.randn(64, device="cuda")
    rows["reference: torch.add"] = host_us(lambda: torch.add(a, a), args.calls)
    rows["reference: empty Triton kernel launch"] = host_us(lambda: _empty_kernel[(1,)](a, 64, BLOCK=64), args.calls)
    for func, op_args, op_kwargs in record_step_calls(args.batch, args.seq):
        name = describe(func, op_args)
        rows[name] = host_us(functools.partial(func, *op_args, **op_kwargs), args.calls)
        print(f"{name:80s} {rows[name]:8.1f} us", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                func(*op_args, **op_kwargs)
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
            print(text.getvalue())
    rows.update(compiled_block_rows(args.calls))
    for name, us in rows.items():
        print(f"{name:80s} {us:8.1f} us")
    if args.out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    backend=gdpa_inductor.config.backend, batch=args.batch, seq=args.seq,
                    date=datetime.date.today().isoformat(), units="host us per call",
                    command=" ".join(["python3 benchmarks/host_overhead.py", *sys.argv[1:]]))
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
