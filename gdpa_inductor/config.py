"""User-facing options.

``GDPA_INDUCTOR_BACKEND`` (environment) or ``gdpa_inductor.config.backend`` forces a kernel path:
- ``"auto"`` (default): Triton on CUDA where it supports the case, the reference elsewhere;
- ``"triton"``: Triton or an error saying why not (on CPU it needs ``TRITON_INTERPRET=1``);
- ``"reference"``: always the pure-PyTorch path.
"""

from __future__ import annotations

import os
from typing import Literal

Backend = Literal["auto", "triton", "reference"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "reference")

backend: Backend = os.environ.get("GDPA_INDUCTOR_BACKEND", "auto")
