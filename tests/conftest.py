"""Shared setup for the CPU test suite.

Without a GPU the Triton kernels run under the Triton interpreter on CPU tensors. The interpreter is chosen
when ``@triton.jit`` decorates a function, so the environment variable has to be set here, before any test
module imports triton (``import torch`` alone does not import it). The CuTe compiles name their target (sm_90a)
themselves, but cutlass-dsl makes a compiled kernel callable only where the GPU it believes it runs on can run it:
read from CUTE_DSL_ARCH once, when first imported, else detected (Blackwell without a GPU). The tests that call
compiled kernels (``test_cute_kernel_args.py``) pose as Hopper here.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from gdpa_testing import gen, poison_empty  # noqa: E402,F401  (fixtures)
