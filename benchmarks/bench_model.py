"""Model-level benchmark: one training step of the ranking example under backend="gdpa" vs "inductor".

The model is ``examples/ranking_pffn_pma.py`` unchanged (two layers of silu self-attention over a padded
jagged history + PFFN with per-sample weights, PMA pooling, an MLP head; BCE loss), at a realistic size:
B=1152 samples, H=4, D=128 (width 512), PFFN 256 per head, histories uniform in [1, N] for N = 256..1024.
A step is forward, backward and an SGD update; both backends start from the same weights, train on the same
batches (losses recorded side by side) and are timed in one process.

    PYTHONPATH=$PWD python3 benchmarks/bench_model.py --out benchmarks/results/<run>/model   # .json, .png
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pathlib
import sys

import torch
import triton
from plotting import draw  # beside this file

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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/model")
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--lengths", default="256,512,1024")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    example = load_example()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(),
                command=" ".join(["python3 benchmarks/bench_model.py", *sys.argv[1:]]),
                model="examples/ranking_pffn_pma.py", heads=4, head_dim=128, dff=256, dtype="bfloat16",
                benchmark="bench_model")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for max_len in map(int, args.lengths.split(",")):
        rows.append(bench_length(example, args, max_len))
        print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("inductor", "gdpa")}), flush=True)
        with open(f"{args.out}.json", "w") as f:  # after every length: a run cut short keeps what it measured
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
    draw(dict(meta=meta, rows=rows), f"{args.out}.png")


if __name__ == "__main__":
    main()
