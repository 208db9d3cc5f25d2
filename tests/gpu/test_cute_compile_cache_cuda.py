"""The CuTe kernels' disk cache on the GPU: a second process loads the forward and backward that the first one
compiled (compiling again would fail: ``cute.compile`` is disabled in it) and computes the same results.
Skipped without an sm_90 GPU and nvidia-cutlass-dsl."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gdpa_inductor.kernels.cute.fwd_support import cute_dsl_available, on_sm90

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and on_sm90(torch.device("cuda")) and cute_dsl_available()),
        reason="needs an sm_90 GPU and nvidia-cutlass-dsl",
    ),
]

SCRIPT = r"""
import dataclasses, json, sys, time
import torch
import cutlass.cute as cute
from gdpa_inductor.kernels.cute.gdpa_bwd import gdpa_bwd_cute, plan_dense_bwd
from gdpa_inductor.kernels.cute.gdpa_fwd import gdpa_fwd_cute

if sys.argv[2] == "no-compile":
    def refuse(*args, **kwargs):
        raise AssertionError("compiled although the kernel is on disk")
    cute.compile = refuse
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(2, 4, 300, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
start = time.perf_counter()
out = gdpa_fwd_cute(q, k, v, "silu", 0.1, 1.0, 0.01)
# dQ summed in place (300 keys: the launcher's way) and in fp32, rounded by the kernel
plans = [dataclasses.replace(plan_dense_bwd(q, k, v, "silu"), dq_sums=s, dq_last_round=s == "fp32")
         for s in ("in_place", "fp32")]
grads = [gdpa_bwd_cute(q, k, v, do, "silu", 0.1, 1.0 / 300, 0.01, plan=plan) for plan in plans]
torch.cuda.synchronize()
seconds = time.perf_counter() - start
torch.save([out, *grads[0][:3], *grads[1][:3]], sys.argv[1])
print(json.dumps(dict(seconds=seconds)))
"""


def _run(tmp_path, name, mode):
    env = dict(os.environ, GDPA_INDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / f"{name}.pt"), mode], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), torch.load(tmp_path / f"{name}.pt")


def test_second_process_loads_the_compiled_kernels(tmp_path):
    first, want = _run(tmp_path, "first", "compile")
    assert len(list((tmp_path / "cache").rglob("*.o"))) == 3, "forward and the two backward forms on disk"
    second, got = _run(tmp_path, "second", "no-compile")
    print(f"first process {first['seconds']:.2f} s (compiles), second {second['seconds']:.2f} s (loads)")
    # forward, dk and dv are deterministic; dq's reduce-adds land in any order
    for i in (0, 2, 3, 5, 6):
        assert torch.equal(got[i], want[i]), i
    for i, tol in ((1, 1e-2), (4, 1e-3)):  # summed in bf16, in fp32
        assert ((got[i].double() - want[i].double()).norm() / want[i].double().norm()).item() < tol, i
