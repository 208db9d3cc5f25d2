"""What the package costs the host: the CPU time of each GDPA op call in a compiled training step (``overhead``, GPU),
of the CuTe launchers up to their kernel call (``cute-launch``, CPU), and of the GDPA pass in a compile
(``pass-cost``, CPU).

    PYTHONPATH=$PWD python3 benchmarks/host.py <benchmark> [options]   # <benchmark> --help: what it measures
"""

from __future__ import annotations

import contextlib
import cProfile
import datetime
import functools
import importlib.util
import io
import json
import platform
import pstats
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch._functorch.config
import torch._inductor.config
import triton
import triton.language as tl

import gdpa_inductor
from benchmarks.harness.cli import Benchmark, command_line, main
from gdpa_inductor.demo import DemoRecModel, _loss, make_batch
from gdpa_inductor.kernels.cute import gdpa_bwd, gdpa_fwd, varlen_bwd, varlen_fwd
from gdpa_inductor.lowering.varlen_ops import sides
from gdpa_inductor.patterns import rewrite, softmax_free_attention

# ---- overhead --------------------------------------------------------------------------------------------------------


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


def overhead_options(ap):
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)


def run_overhead(args):
    """Host time per fused call: what each GDPA op call of a compiled training step costs the CPU.

    The demo's model (``gdpa_inductor.demo.DemoRecModel``: HSTU-style silu attention with a relative bias, a causal
    mask and padding; PFFN with per-sample weights; PMA pooling) is compiled with backend="gdpa", its fused blocks as
    calls of the opaque op (the path of dynamic shapes and of the CuTe kernels; with static shapes on the Triton path
    the compiled graph launches the kernels itself and makes no such call), and trained one step while every GDPA op
    call is recorded with its arguments. Each recorded call is then replayed alone, as the compiled code
    calls it (``torch.ops.gdpa.<op>.default``), and its host time measured: the mean over ``--calls`` calls of the time
    until the call returns, median of five rounds, the GPU drained between rounds so a full launch queue never stalls
    the host. Beside them, two references: an aten op (``torch.add``) and an empty Triton kernel's launch. A cProfile
    of each call (``--profile``) says where its host time goes.

    Then the same question inside compiled code: one fused block alone (a dense silu block and a length-masked varlen
    one, tiny shapes) compiled with backend="inductor", with backend="gdpa" as opaque op calls, and with backend="gdpa"
    launching the Triton kernels from the compiled graph; host time of a forward call (inference) and of a forward and
    backward call, with the compiled graph's own Python (guards, wrapper) included.

        PYTHONPATH=$PWD python3 benchmarks/host.py overhead [--batch 64 --seq 256] [--profile]
            [--out benchmarks/results/<run>/host_overhead.json]
    """
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
                    date=datetime.date.today().isoformat(), units="host us per call", command=command_line())
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


# ---- cute-launch -----------------------------------------------------------------------------------------------------


# the operands' shape and activation
B, H, N, D, ACT = 2, 4, 128, 128, "gelu_tanh"


def _no_gpu():
    """The launchers' CUDA queries answered without a GPU, and every compiled kernel a no-op."""
    torch.cuda.get_device_properties = lambda device: SimpleNamespace(multi_processor_count=132)
    torch.cuda.current_stream = lambda device=None: SimpleNamespace(cuda_stream=0)
    for module, name in ((gdpa_fwd, "compile_fwd"), (gdpa_bwd, "compile_bwd"), (varlen_fwd, "compile_fwd"),
                         (varlen_bwd, "compile_bwd")):
        setattr(module, name, lambda *args, **kwargs: (lambda *a, **k: None))


def median_us(fn, calls: int = 50, rounds: int = 5) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return sorted(times)[rounds // 2]


def run_cute_launch(args):
    """Host time of the CuTe launchers up to their kernel call, on a CPU (no GPU needed): each launcher runs on small
    CPU tensors with its compiled kernel replaced by a no-op, so what is timed is the Python around the call (operand
    conversion, buffers, the compile-cache lookup). Compare two checkouts by running this with each on PYTHONPATH.

        PYTHONPATH=$PWD python3 benchmarks/host.py cute-launch
    """
    _no_gpu()
    mk = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16)  # noqa: E731
    q, k, v, do = (mk(B, H, N, D) for _ in range(4))
    qj, kj, vj, doj = (mk(B * N, H, D) for _ in range(4))
    cu = torch.arange(0, (B + 1) * N, N, dtype=torch.int32)
    _, qs, ks, order = sides(qj, kj, cu, cu, None, None, N, N, False)
    out = SimpleNamespace(tensor=torch.empty_like(qj))
    cases = {
        "dense forward": lambda: gdpa_fwd.gdpa_fwd_cute(q, k, v, ACT, 0.1, 1.0, 0.01),
        "dense backward": lambda: gdpa_bwd.gdpa_bwd_cute(q, k, v, do, ACT, 0.1, 1.0, 0.01),
        "varlen forward": lambda: varlen_fwd.gdpa_varlen_fwd_cute(qs, ks, vj, out, order, ACT, 0.1, 1.0, 0.01),
        "varlen backward": lambda: varlen_bwd.gdpa_varlen_bwd_cute(doj, qs, ks, vj, order, ACT, 0.1, 1.0, 0.01),
    }
    print(json.dumps({name: round(median_us(fn), 1) for name, fn in cases.items()}))


# ---- pass-cost -------------------------------------------------------------------------------------------------------


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _models() -> dict:
    """name -> (model, batch, loss function), CPU sizes."""
    from gdpa_inductor import demo

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    hstu, ranking, sigmoid = (_example(n) for n in ("hstu_jagged", "ranking_pffn_pma", "sigmoid_transformer"))
    return {
        "demo": (demo.DemoRecModel(64, 4, seeds=4, dff=16, max_len=32),
                 demo.make_batch(4, 32, 64, "cpu", torch.float32), demo._loss),
        "hstu_jagged": (hstu.HSTU(1000, 16, dim=64), hstu.make_batch(4, 16, 1000, 128, "cpu", gen), hstu.loss_fn),
        "ranking_pffn_pma": (ranking.RankingModel(dim=64, dff=16),
                             ranking.make_batch(4, 16, 64, 64, "cpu", torch.float32, gen), ranking.loss_fn),
        "sigmoid_transformer": (sigmoid.SigmoidLM(256, 16, dim=64, heads=4, layers=4),
                                sigmoid.make_batch(4, 16, 256, "cpu", gen), sigmoid.loss_fn),
    }


class Timed:
    """Wraps ``module.name`` for the duration of a ``with``: its calls and their total seconds."""

    def __init__(self, module, name: str):
        self.module, self.name, self.calls, self.seconds = module, name, 0, 0.0

    def __enter__(self):
        self.original = getattr(self.module, self.name)

        @functools.wraps(self.original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return self.original(*args, **kwargs)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - t0

        setattr(self.module, self.name, timed)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.original)


def first_step_seconds(model, batch, loss_fn, backend: str) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    t0 = time.perf_counter()
    loss_fn(compiled, batch).backward()
    return time.perf_counter() - t0


def measure(name: str, spec: tuple) -> dict:
    model, batch, loss_fn = spec
    from torch._dynamo.utils import counters

    inductor_s = first_step_seconds(model, batch, loss_fn, "inductor")
    rewrites = counters["gdpa"]["rewrites"]
    with Timed(rewrite, "rewrite_gdpa") as pass_time, Timed(softmax_free_attention, "check_equivalent") as proofs:
        gdpa_s = first_step_seconds(model, batch, loss_fn, "gdpa")
    fused = counters["gdpa"]["rewrites"] - rewrites
    return dict(model=name, fused=fused, proofs=proofs.calls, inductor_compile_s=inductor_s, gdpa_compile_s=gdpa_s,
                pass_s=pass_time.seconds, proof_s=proofs.seconds,
                proof_ms_per_block=proofs.seconds / proofs.calls * 1e3 if proofs.calls else None)


def pass_cost_options(ap):
    ap.add_argument("--out", default=None, help="write the rows as JSON here")


def run_pass_cost(args):
    """What the GDPA pass adds to a model's compile: the time in the pass, and in the equivalence proof of each block.

    Each model is compiled with backend="gdpa" and with backend="inductor" in a fresh Dynamo state, with Inductor's
    compiled-graph caches off, and its first training step (forward and backward, where the compile happens) is timed,
    after one untimed compile of the first model (imports and first-use setup). During the gdpa compile the pass
    (``patterns.rewrite.rewrite_gdpa``) and every proof (``patterns.equivalence.check_equivalent``, one per candidate
    block the patterns accept) are timed as well. The models: the demo's, and the three examples', at their CPU sizes.

        PYTHONPATH=$PWD python3 benchmarks/host.py pass-cost [--out benchmarks/results/<run>/pass_cost.json]
    """
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    models = _models()
    measure(*next(iter(models.items())))  # warm-up: imports and first-use setup are no model's compile time
    rows = [measure(name, spec) for name, spec in models.items()]
    print("| model | blocks fused | proofs | Inductor compile s | gdpa compile s | pass s | proofs s | ms per proof |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        per = "—" if r["proof_ms_per_block"] is None else f"{r['proof_ms_per_block']:.0f}"
        print(f"| {r['model']} | {r['fused']} | {r['proofs']} | {r['inductor_compile_s']:.1f} "
              f"| {r['gdpa_compile_s']:.1f} | {r['pass_s']:.2f} | {r['proof_s']:.2f} | {per} |")
    if args.out:
        meta = dict(device=f"CPU ({platform.processor() or platform.machine()})", torch=torch.__version__,
                    date=datetime.date.today().isoformat(), units="seconds (first training step, compile included)",
                    command=command_line())
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")


BENCHMARKS = {
    "overhead": Benchmark(run_overhead, overhead_options),
    "cute-launch": Benchmark(run_cute_launch),
    "pass-cost": Benchmark(run_pass_cost, pass_cost_options),
}

if __name__ == "__main__":
    main(__doc__, BENCHMARKS)
