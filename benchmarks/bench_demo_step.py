"""The demo's training step under backend="gdpa" against "inductor", in the default mode and under CUDA graphs.

The model is the demo's (``gdpa_inductor.demo.DemoRecModel``: HSTU-style silu attention with a relative bias, a causal
mask and padding; PFFN with per-sample weights; PMA pooling), width 512, 4 heads, bf16, at three sizes (batch /
longest history). A step is forward, backward and an SGD update (``backend_comparison.time_step_ms``: median of five
rounds of the mean of 20 steps). Every provider runs in this one process, each compiled from its own copy of the
same weights.

    PYTHONPATH=$PWD python3 benchmarks/bench_demo_step.py --out benchmarks/results/<run>/demo_step.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import sys

import torch
import triton

from gdpa_inductor.backend_comparison import time_step_ms
from gdpa_inductor.demo import DemoRecModel, _loss, make_batch

SIZES = ((64, 256), (256, 512), (1024, 512))
MODES = ("default", "reduce-overhead")


def step_ms(model, batch, backend: str, mode: str) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend=backend, mode=None if mode == "default" else mode)
    return time_step_ms(compiled, batch, _loss, 1e-3, iters=20, repeats=5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo_step.json")
    args = ap.parse_args()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), dim=512, heads=4, dtype="bfloat16", units="ms per step",
                command=" ".join(["python3 benchmarks/bench_demo_step.py", *sys.argv[1:]]),
                benchmark="bench_demo_step")
    rows = []
    for batch_size, seq in SIZES:
        torch.manual_seed(0)
        model = DemoRecModel(512, 4, seeds=4, dff=64, max_len=seq).cuda().to(torch.bfloat16)
        batch = make_batch(batch_size, seq, 512, "cuda", torch.bfloat16)
        for mode in MODES:
            times = {backend: step_ms(model, batch, backend, mode) for backend in ("inductor", "gdpa")}
            rows.append(dict(batch=batch_size, seq=seq, mode=mode, inductor_ms=round(times["inductor"], 3),
                             gdpa_ms=round(times["gdpa"], 3), speedup=round(times["inductor"] / times["gdpa"], 3)))
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
