"""User-facing options.

``GDPA_INDUCTOR_BACKEND`` (environment) or ``gdpa_inductor.config.backend`` forces a kernel path:
- ``"auto"`` (default): on an sm_90 GPU with nvidia-cutlass-dsl, the CuTe-DSL forward and backward
  (``kernels/cute``, dense and varlen) where they cover the call; otherwise Triton on CUDA where it supports the
  case, the reference elsewhere;
- ``"triton"``: Triton or an error saying why not (on CPU it needs ``TRITON_INTERPRET=1``);
- ``"reference"``: always the pure-PyTorch path;
- ``"cute"``: the CuTe-DSL Hopper forward and backward or an error saying why not; the varlen op takes the
  CuTe varlen kernels where they cover the call (windows and causal masks included, at D and Dv up to 128), and
  the varlen calls they do not cover (bias, masks past those head dims) run as under ``"auto"``. Needs
  nvidia-cutlass-dsl and an sm_90 GPU.

``GDPA_INDUCTOR_CACHE_DIR`` or ``gdpa_inductor.config.kernel_cache_dir``: where compiled CuTe-DSL kernels are
kept between processes (default ``~/.cache/gdpa_inductor``; the empty string or None keeps them in memory only).

``GDPA_CUTE_BWD_QUERY_TILE`` or ``gdpa_inductor.config.cute_bwd_query_tile``: the queries the CuTe backward steps
over at a time where it can choose (64 or 80; None, the default: its own choice, ``kernels/cute/gdpa_bwd.py``).

An assignment is checked when it is made (a ValueError or TypeError naming the option); a bad environment value is
reported by the first call that reads it.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Literal

Backend = Literal["auto", "triton", "reference", "cute"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "reference", "cute")
QUERY_TILES: tuple[int, ...] = (64, 80)
QUERY_TILE_ENV = "GDPA_CUTE_BWD_QUERY_TILE"

backend: Backend = os.environ.get("GDPA_INDUCTOR_BACKEND", "auto")
kernel_cache_dir: str = os.environ.get(
    "GDPA_INDUCTOR_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "gdpa_inductor")
)
# read once, here; a value other than 64 or 80 stays a string, which the backward reports by the variable's name
cute_bwd_query_tile: int | str | None = os.environ.get(QUERY_TILE_ENV)
if cute_bwd_query_tile in {str(t) for t in QUERY_TILES}:
    cute_bwd_query_tile = int(cute_bwd_query_tile)


class _CheckedOptions(types.ModuleType):
    """This module, with each assignment to an option checked."""

    def __setattr__(self, name: str, value) -> None:
        if name == "backend" and value not in BACKENDS:
            raise ValueError(f"gdpa_inductor.config.backend: expected one of {BACKENDS}; got {value!r}")
        if name == "cute_bwd_query_tile" and not (value is None or (type(value) is int and value in QUERY_TILES)):
            raise ValueError(f"gdpa_inductor.config.cute_bwd_query_tile: expected None or one of {QUERY_TILES}; got "
                             f"{value!r}")
        if name == "kernel_cache_dir" and not (value is None or isinstance(value, (str, os.PathLike))):
            raise TypeError(f"gdpa_inductor.config.kernel_cache_dir: expected a path (str) or None; got "
                            f"{type(value).__name__}")
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _CheckedOptions
