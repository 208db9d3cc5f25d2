"""User-facing options.

``GDPA_INDUCTOR_BACKEND`` (environment) or ``gdpa_inductor.config.backend`` forces a kernel path:
- ``"auto"`` (default): on an sm_90 GPU with nvidia-cutlass-dsl, the CuTe-DSL backward (``kernels/cute``)
  where it covers the call; otherwise Triton on CUDA where it supports the case, the reference elsewhere;
- ``"triton"``: Triton or an error saying why not (on CPU it needs ``TRITON_INTERPRET=1``);
- ``"reference"``: always the pure-PyTorch path;
- ``"cute"``: the CuTe-DSL Hopper forward and backward or an error saying why not; what the CuTe kernels do
  not cover (varlen) runs as under ``"auto"``. Needs nvidia-cutlass-dsl and an sm_90 GPU. The CuTe forward
  is not the default: it is slower than the Triton forward at short key lengths (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from typing import Literal

Backend = Literal["auto", "triton", "reference", "cute"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "reference", "cute")

backend: Backend = os.environ.get("GDPA_INDUCTOR_BACKEND", "auto")
