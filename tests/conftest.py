"""Shared setup for the CPU test suite.

Without a GPU the Triton kernels run under the Triton interpreter on CPU tensors. The interpreter is chosen
when ``@triton.jit`` decorates a function, so the environment variable has to be set here, before any test
module imports triton (``import torch`` alone does not import it).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from gdpa_testing import gen, poison_empty  # noqa: E402,F401  (fixtures)
