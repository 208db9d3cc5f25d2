"""What the GDPA pass adds to a model's compile: the time in the pass, and in the equivalence proof of each block.

Each model is compiled with backend="gdpa" and with backend="inductor" in a fresh Dynamo state, with Inductor's
compiled-graph caches off, and its first training step (forward and backward, where the compile happens) is timed,
after one untimed compile of the first model (imports and first-use setup). During the gdpa compile the pass
(``patterns.rewrite.rewrite_gdpa``) and every proof (``patterns.equivalence.check_equivalent``, one per candidate
block the patterns accept) are timed as well. The models: the demo's, and the three examples', at their CPU sizes.

    PYTHONPATH=$PWD python3 benchmarks/pass_cost.py [--out benchmarks/results/<run>/pass_cost.json]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import platform
import time
from pathlib import Path

import torch
import torch._functorch.config
import torch._inductor.config

import gdpa_inductor  # noqa: F401  (registers backend="gdpa")
from gdpa_inductor.patterns import rewrite, softmax_free_attention

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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
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
                    command="python3 benchmarks/pass_cost.py --out " + args.out)
        Path(args.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
