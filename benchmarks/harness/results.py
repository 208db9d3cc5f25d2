"""The results files: a run's device, versions and date beside its rows, written as .json (and .csv), and plotted."""

from __future__ import annotations

import csv
import datetime
import json
from collections.abc import Callable

import torch
import triton

from .plotting import draw
from .timing import warm_up_gpu


def run_meta(**fields) -> dict:
    """The device, the versions and the date of this run, then ``fields``."""
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), **fields)


def write_json(path: str, data) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def write_csv(path: str, rows: list[dict], fieldnames: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)


def run_cute_bench(args, run: Callable[[list], None], **meta) -> None:
    """A CuTe benchmark's run after ``add_cute_options``: warms the GPU up, ``run(rows)`` and writes the rows with
    the device, the versions, the date, ``args.benchmark`` and ``meta`` to ``--out``.json, and their plot to
    ``--out``.png."""
    rows = []
    warm_up_gpu(3.0)
    run(rows)
    if args.out:
        meta = run_meta(benchmark=args.benchmark) | meta
        write_json(args.out + ".json", dict(meta, rows=rows))
        draw(dict(meta, rows=rows), args.out + ".png")
