"""Host time of the CuTe launchers up to their kernel call, on a CPU (no GPU needed): each launcher runs on small CPU
tensors with its compiled kernel replaced by a no-op, so what is timed is the Python around the call (operand
conversion, buffers, the compile-cache lookup). Compare two checkouts by running this with each on PYTHONPATH.

    PYTHONPATH=$PWD python3 benchmarks/cute_launch_host_cpu.py
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch

from gdpa_inductor.kernels.cute import gdpa_bwd, gdpa_fwd, varlen_bwd, varlen_fwd
from gdpa_inductor.lowering.varlen_ops import _sides

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


def main():
    _no_gpu()
    mk = lambda *shape: torch.randn(*shape, dtype=torch.bfloat16)  # noqa: E731
    q, k, v, do = (mk(B, H, N, D) for _ in range(4))
    qj, kj, vj, doj = (mk(B * N, H, D) for _ in range(4))
    cu = torch.arange(0, (B + 1) * N, N, dtype=torch.int32)
    _, qs, ks, order = _sides(qj, kj, vj, cu, cu, None, None, N, N)
    out = SimpleNamespace(tensor=torch.empty_like(qj))
    cases = {
        "dense forward": lambda: gdpa_fwd.gdpa_fwd_cute(q, k, v, ACT, 0.1, 1.0, 0.01),
        "dense backward": lambda: gdpa_bwd.gdpa_bwd_cute(q, k, v, do, ACT, 0.1, 1.0, 0.01),
        "varlen forward": lambda: varlen_fwd.gdpa_varlen_fwd_cute(qs, ks, vj, out, order, ACT, 0.1, 1.0, 0.01),
        "varlen backward": lambda: varlen_bwd.gdpa_varlen_bwd_cute(doj, qs, ks, vj, order, ACT, 0.1, 1.0, 0.01),
    }
    print(json.dumps({name: round(median_us(fn), 1) for name, fn in cases.items()}))


if __name__ == "__main__":
    main()
