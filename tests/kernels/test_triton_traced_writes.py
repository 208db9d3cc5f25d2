"""What Inductor takes each Triton kernel to write when a compiled graph launches it (``wrap_triton``).

Inductor reads a traced launch's writes from the kernel's Triton IR; a tensor it takes as written that is a graph
input (a saved tensor in a backward) is copied first, one more launch per call. The analysis runs on the CPU here
(Triton IR for sm_90, no GPU), on every launch of the dense and varlen ops, recorded rather than run: each kernel
must be seen to write its outputs and nothing else. It runs in one subprocess, as this file run as a script: Triton
IR is not made for the interpreter's kernels, which the test run's other tests use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

WRITES = {
    "gdpa_fwd_kernel": {"Out"},
    "gdpa_bwd_dkdv_kernel": {"DK", "DV_"},
    "gdpa_bwd_dq_kernel": {"DQ"},
    "varlen_schedule_kernel": {"Sched"},
    "varlen_zero_gaps_kernel": {"DQ", "DK", "DV_"},
    "gdpa_varlen_fwd_kernel": {"Out"},
    "gdpa_varlen_bwd_dkdv_kernel": {"DK", "DV_"},
    "gdpa_varlen_bwd_dq_kernel": {"DQ"},
}
BIAS_GRAD = {"gdpa_bwd_dkdv_kernel": {"DB"}, "gdpa_varlen_bwd_dkdv_kernel": {"DBias"}}
# (op, layout, causal, bias gradient)
CASES = [(op, layout, causal, bias_grad) for op, layout in (("dense", "dense"), ("varlen", "jagged"),
                                                            ("varlen", "padded"))
         for causal in (False, True) for bias_grad in (False, True)]


def _case_id(case) -> str:
    return "-".join(str(part) for part in case)


@pytest.fixture(scope="module")
def written() -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_each_kernel_writes_its_outputs_only(written, case):
    """Every kernel the op launches, and no other tensor than its outputs taken as written (the varlen kernels
    read the schedule, which a backward takes from its forward as graph inputs). Only jagged sides have rows no
    sample writes."""
    op, layout, _, bias_grad = case
    names = ([n for n in WRITES if n.startswith("gdpa_") and "varlen" not in n] if op == "dense"
             else [n for n in WRITES if "varlen" in n and (layout == "jagged" or "gaps" not in n)])
    expected = {name: sorted(WRITES[name] | (BIAS_GRAD.get(name, set()) if bias_grad else set())) for name in names}
    assert written[_case_id(case)] == expected


def _record_launches(case) -> dict[str, list[str]]:
    """The op's forward and backward on CPU tensors, every launch recorded, and Inductor's reading of what each
    launch writes."""
    import torch
    from torch._higher_order_ops.triton_kernel_wrap import identify_accessed_tensors

    from gdpa_inductor.kernels.triton import gdpa_bwd, gdpa_fwd, varlen_bwd, varlen_fwd, varlen_gaps, varlen_schedule
    from gdpa_inductor.lowering import varlen_ops

    recorded = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                recorded.append((self.kernel, {**dict(zip(self.kernel.arg_names, args)), **kwargs}))
            return launch

    for module in (gdpa_fwd, gdpa_bwd, varlen_fwd, varlen_bwd, varlen_gaps, varlen_schedule):
        module.launcher = lambda kernel, traced: Recorder(kernel)
    varlen_schedule.interpreting = lambda: True  # the one-launch schedule, on CPU tensors
    op, layout, causal, bias_grad = case
    torch.manual_seed(0)
    if op == "dense":
        q, k, v = (torch.randn(2, 2, 40, 64, dtype=torch.bfloat16) for _ in range(3))
        bias = torch.randn(2, 2, 40, 40, dtype=torch.bfloat16)
        out = gdpa_fwd.gdpa_fwd_triton(q, k, v, bias, "silu", 0.1, 1.0, causal, 0.01)
        gdpa_bwd.gdpa_bwd_triton(out, q, k, v, bias, "silu", 0.1, 1.0, causal, 0.01, bias_grad)
    else:
        if layout == "jagged":
            q, k, v = (torch.randn(30, 2, 64, dtype=torch.bfloat16) for _ in range(3))
            offsets = torch.tensor([0, 10, 30])
            rows = (offsets, offsets, None, None)
        else:
            q, k, v = (torch.randn(2, 20, 2, 64, dtype=torch.bfloat16) for _ in range(3))
            used = torch.tensor([7, 20])
            rows = (None, None, used, used)
        bias = torch.randn(2, 2, 20, 20, dtype=torch.bfloat16)
        params = ("silu", 0.1, 1.0, causal, (-1, -1), 0.01)
        scheduled = varlen_ops.sides(q, k, *rows, 20, 20, False)
        out = varlen_ops._forward_on("triton", False, q, k, v, bias, rows, 20, 20, params, scheduled=scheduled)
        varlen_ops._backward_on("triton", False, out, q, k, v, bias, rows, 20, 20, params, bias_grad,
                                scheduled=scheduled)
    written = {}
    for kernel, kwargs in recorded:
        kwargs = {name: kwargs[name] for name in kernel.arg_names if name in kwargs}
        found = identify_accessed_tensors(kernel, kwargs, {})
        written.setdefault(kernel.fn.__name__, set()).update(dep.name for dep in found.read_writes.writes)
    return {name: sorted(names) for name, names in written.items()}


def main() -> None:
    import triton
    from triton.backends.compiler import GPUTarget

    class Hopper:
        """Stands for the CUDA driver: Triton IR is made for sm_90."""

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    triton.runtime.driver.set_active(Hopper())
    print(json.dumps({_case_id(case): _record_launches(case) for case in CASES}))


if __name__ == "__main__":
    main()
