"""Shared setup for the CPU test suite.

Without a GPU the Triton kernels run under the Triton interpreter on CPU tensors. The interpreter is chosen
when ``@triton.jit`` decorates a function, so the environment variable has to be set here, before any test
module imports triton (``import torch`` alone does not import it). Likewise cutlass-dsl reads its target
architecture once, when first imported: without a GPU it would target Blackwell, so the CuTe compile tests
set Hopper's here.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from gdpa_testing import gen, poison_empty  # noqa: E402,F401  (fixtures)
