"""Which implementation runs a GDPA call, and why: the CuTe-DSL Hopper kernels where they support the case,
Triton where it supports the case, else the reference.

Every decision returns (name, reason) and is logged at debug level on the ``gdpa_inductor`` logger, so
"why did this not use the fused kernel?" always has an answer.
"""

from __future__ import annotations

import logging

import torch

from .. import config
from ..kernels.triton.layout import interpreting

log = logging.getLogger("gdpa_inductor")

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TRITON_MAX_HEAD_DIM = 256


def triton_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, str]:
    if q.device.type != "cuda" and not interpreting():
        return False, f"device {q.device.type} (Triton needs CUDA, or TRITON_INTERPRET=1)"
    if q.dtype not in TRITON_DTYPES:
        return False, f"dtype {q.dtype} (Triton supports float16, bfloat16, float32)"
    if interpreting() and q.dtype == torch.bfloat16:
        return False, "bfloat16 under TRITON_INTERPRET (the interpreter computes bf16 wrongly)"
    d, dv = q.shape[-1], v.shape[-1]
    if max(d, dv) > TRITON_MAX_HEAD_DIM:
        return False, f"head dims ({d}, {dv}) above {TRITON_MAX_HEAD_DIM}"
    if q.numel() == 0 or k.numel() == 0 or v.numel() == 0:
        return False, "empty input"
    return True, "supported"


def select_forward_impl(q, k, v, bias, causal: bool, activation: str) -> str:
    """The dense forward's path: see ``_cute_else_select``."""
    from ..kernels.cute.gdpa_fwd import cute_fwd_preferred, cute_fwd_support

    def support(q, k, v, bias, causal, activation):
        ok, reason = cute_fwd_support(q, k, v, bias, causal, activation)
        if ok and config.backend == "auto":
            ok, reason = cute_fwd_preferred(q, k, v)
        return ok, reason

    return _cute_else_select(support, q, k, v, bias, causal, activation, "forward")


def select_backward_impl(q, k, v, bias, causal: bool, activation: str) -> str:
    """The dense backward's path: see ``_cute_else_select``."""
    from ..kernels.cute.gdpa_bwd import cute_bwd_support

    return _cute_else_select(cute_bwd_support, q, k, v, bias, causal, activation, "backward")


def select_varlen_forward_impl(q, k, v, bias, causal: bool, window: tuple[int, int], activation: str) -> str:
    """The varlen forward's path: "cute" where the CuTe varlen forward covers the call (under "auto" where it is
    also preferred, and under "cute"; a case it does not cover runs as under "auto"), otherwise as
    ``select_impl``."""
    from ..kernels.cute.varlen_fwd import cute_varlen_fwd_preferred, cute_varlen_fwd_support

    def support(q, k, v, bias, causal, window, activation):
        ok, reason = cute_varlen_fwd_support(q, k, v, bias, causal, window, activation)
        if ok and config.backend == "auto":
            ok, reason = cute_varlen_fwd_preferred(q, v)
        return ok, reason

    return _varlen_cute_else_select(support, q, k, v, bias, causal, window, activation, "varlen forward")


# The CuTe varlen backward measured level with the Triton varlen backward (H200, B=1152, H=4, D=128, gelu_tanh,
# lengths up to 128..2048 at sparsity 1.0 and 0.5: 0.80-1.30x the backward alone, f+b within 5% but at N <= 256,
# sparsity 0.5, 16% behind; twenty-second session, docs/benchmarks.md), so "auto" keeps Triton's and only "cute"
# takes it.
CUTE_VARLEN_BWD_BACKENDS = ("cute",)


def select_varlen_backward_impl(q, k, v, bias, causal: bool, window: tuple[int, int], activation: str) -> str:
    """The varlen backward's path: "cute" under a forced "cute" where the CuTe varlen backward covers the call,
    otherwise as ``select_impl`` ("auto" included: see ``CUTE_VARLEN_BWD_BACKENDS``)."""
    from ..kernels.cute.varlen_bwd import cute_varlen_bwd_support

    return _varlen_cute_else_select(cute_varlen_bwd_support, q, k, v, bias, causal, window, activation,
                                    "varlen backward", CUTE_VARLEN_BWD_BACKENDS)


def _varlen_cute_else_select(cute_support, q, k, v, bias, causal: bool, window: tuple[int, int], activation: str,
                             what: str, backends: tuple[str, ...] = ("auto", "cute")) -> str:
    if config.backend in backends:
        ok, reason = cute_support(q, k, v, bias, causal, window, activation)
        if ok:
            log.debug("gdpa %s: cute", what)
            return "cute"
        log.debug("gdpa %s: not cute (%s)", what, reason)
    return select_impl(q, k, v, bias, what)


def _cute_else_select(cute_support, q, k, v, bias, causal: bool, activation: str, what: str) -> str:
    """"cute" where ``cute_support`` says the CuTe-DSL Hopper kernel takes the call (under "auto" and "cute"; a
    ValueError under "cute" when it cannot), otherwise as ``select_impl``."""
    if config.backend in ("auto", "cute"):
        ok, reason = cute_support(q, k, v, bias, causal, activation)
        if ok:
            log.debug("gdpa %s: cute", what)
            return "cute"
        if config.backend == "cute":
            raise ValueError(f"gdpa_inductor.config.backend='cute' cannot run this call: {reason}")
        log.debug("gdpa %s: not cute (%s)", what, reason)
    return select_impl(q, k, v, bias, what)


def select_impl(q, k, v, bias, what: str) -> str:
    """Returns "triton" or "reference" for this call; raises ValueError when a forced path cannot run."""
    choice = config.backend
    if choice not in config.BACKENDS:
        raise ValueError(f"gdpa_inductor.config.backend: expected one of {config.BACKENDS}; got {choice!r}")
    if choice == "reference":
        log.debug("gdpa %s: reference (forced by config)", what)
        return "reference"
    ok, reason = triton_support(q, k, v, bias)
    if ok:
        log.debug("gdpa %s: triton", what)
        return "triton"
    if choice == "triton" and reason != "empty input":
        raise ValueError(f"gdpa_inductor.config.backend='triton' cannot run this call: {reason}")
    log.debug("gdpa %s: reference (%s)", what, reason)
    return "reference"
