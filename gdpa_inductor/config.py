"""User-facing options.

``GDPA_INDUCTOR_BACKEND`` (environment) or ``gdpa_inductor.config.backend`` forces a kernel path:
- ``"auto"`` (default): Triton on CUDA where it supports the case, the reference elsewhere;
- ``"triton"``: Triton or an error saying why not (on CPU it needs ``TRITON_INTERPRET=1``);
- ``"reference"``: always the pure-PyTorch path;
- ``"cute"``: the CuTe-DSL Hopper forward (``kernels/cute``) or an error saying why not; everything the CuTe
  kernels do not cover yet (the backward, varlen) runs as under ``"auto"``. Needs nvidia-cutlass-dsl and an
  sm_90 GPU. Not the default: it is correct but not yet faster than the Triton forward
  (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from typing import Literal

Backend = Literal["auto", "triton", "reference", "cute"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "reference", "cute")

backend: Backend = os.environ.get("GDPA_INDUCTOR_BACKEND", "auto")
