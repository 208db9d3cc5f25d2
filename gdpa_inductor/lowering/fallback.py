"""A kernel path that cannot import, compile or launch hands the call to the next one: CuTe, then Triton, then the
reference. The failure is logged once, as a warning with its reason, and that path is not tried again for calls of
the same kind (device, dtypes, head dims, activation, masks, bias) in this process. A path that
``gdpa_inductor.config.backend`` forces raises instead, and so does running out of GPU memory (the next path
needs more of it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from .. import config
from ..kernels.activations import ActivationName
from .dispatch import select_impl

log = logging.getLogger("gdpa_inductor")
T = TypeVar("T")

# (path, kind of call) -> why that path failed
_failed: dict[tuple, str] = {}


def call_kind(what: str, q: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, activation: ActivationName,
              causal: bool, *masks) -> tuple:
    """What a kernel variant depends on, beyond sizes: calls of one kind share their compiled kernels."""
    return (what, q.device.type, q.dtype, q.shape[-1], v.shape[-1], None if bias is None else bias.dtype,
            activation, causal, *masks)


def run(impl: str, kind: tuple, run_path: Callable[[str], T], operands: tuple) -> T:
    """``run_path(impl)``, or ``run_path`` of the first later path that runs. ``operands``: the call's
    (q, k, v, bias), for the choice after CuTe."""

    def next_path(failed: str) -> str:
        return select_impl(*operands, kind[0]) if failed == "cute" else "reference"

    while True:
        reason = _failed.get((impl, kind))
        if reason is None:
            try:
                return run_path(impl)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:
                if impl == "reference" or config.backend == impl:
                    raise
                reason = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                _failed[(impl, kind)] = reason
                log.warning("gdpa %s: the %s kernel failed (%s); calls like this one run on %s from now on",
                            kind[0], impl, reason, next_path(impl))
        impl = next_path(impl)
