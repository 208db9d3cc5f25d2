"""Which implementation runs a GDPA call, and why: the CuTe-DSL Hopper kernels where they support the case (on
sm_100 the Blackwell forward, dense or varlen, and dense backward, each build once self-checked on the device),
Triton where it supports the case, else the reference.

Every decision returns (name, reason) and is logged at debug level on the ``gdpa_inductor`` logger, so
"why did this not use the fused kernel?" always has an answer.
"""

from __future__ import annotations

import logging

import torch

from .. import config
from ..kernels.activations import ActivationName
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


def select_forward_impl(q, k, v, bias, causal: bool, activation: ActivationName) -> str:
    """The dense forward's path: see ``_cute_else_select``. On sm_100 "cute" is the Blackwell forward, where it
    covers the call and its build passed its first-use self-check (``sm100_forward``)."""

    def support(q, k, v, bias, causal, activation):
        from ..kernels.cute.fwd_support import cute_fwd_preferred, cute_fwd_support, on_sm100

        ok, reason = cute_fwd_support(q, k, v, bias, causal, activation)
        if not ok and on_sm100(q.device):
            from .sm100_forward import sm100_forward_support

            return sm100_forward_support(q, k, v, bias, causal, activation)
        if ok and config.backend == "auto":
            ok, reason = cute_fwd_preferred(q, k, v)
        return ok, reason

    return _cute_else_select(support, q, k, v, bias, causal, activation, "forward")


def select_backward_impl(q, k, v, bias, causal: bool, activation: ActivationName, bias_grad: bool = False,
                         dout: torch.Tensor | None = None) -> str:
    """The dense backward's path: see ``_cute_else_select``. ``bias_grad``: whether the call wants the bias's
    gradient; ``dout``: the output's gradient (None: one of the output's shape and dtype). On sm_100 "cute" is the
    Blackwell backward, where it covers the call and its build passed its first-use self-check
    (``sm100_backward``)."""

    def support(q, k, v, bias, causal, activation):
        from ..kernels.cute.bwd_support import cute_bwd_support
        from ..kernels.cute.fwd_support import on_sm100

        ok, reason = cute_bwd_support(q, k, v, bias, causal, activation, bias_grad)
        if not ok and on_sm100(q.device):
            from .sm100_backward import sm100_backward_support

            return sm100_backward_support(q, k, v, bias, causal, activation, bias_grad, dout)
        return ok, reason

    return _cute_else_select(support, q, k, v, bias, causal, activation, "backward")


def select_varlen_forward_impl(q, k, v, bias, causal: bool, window: tuple[int, int], activation: ActivationName,
                               rows: tuple) -> str:
    """The varlen forward's path: "cute" where the CuTe varlen forward covers the call (under "auto" where it is
    also preferred, and under "cute"; a case it does not cover runs as under "auto"), otherwise as
    ``select_impl``. ``rows``: the call's (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k). On sm_100 "cute" is
    the Blackwell forward, where it covers the call and its build passed its first-use self-check
    (``sm100_varlen_forward``)."""

    def support(q, k, v, bias, causal, window, activation, rows):
        from ..kernels.cute.fwd_support import on_sm100
        from ..kernels.cute.varlen_support import cute_varlen_fwd_preferred, cute_varlen_fwd_support

        ok, reason = cute_varlen_fwd_support(q, k, v, bias, causal, window, activation, rows)
        if not ok and on_sm100(q.device):
            from .sm100_varlen_forward import sm100_varlen_forward_support

            return sm100_varlen_forward_support(q, k, v, bias, causal, window, activation, rows)
        if ok and config.backend == "auto":
            ok, reason = cute_varlen_fwd_preferred(q, v)
        return ok, reason

    return _varlen_cute_else_select(support, q, k, v, bias, causal, window, activation, rows, "varlen forward")


def select_varlen_backward_impl(q, k, v, bias, causal: bool, window: tuple[int, int], activation: ActivationName,
                                rows: tuple, bias_grad: bool = False) -> str:
    """The varlen backward's path: "cute" where the CuTe varlen backward covers the call (under "auto" and "cute";
    a case it does not cover runs as under "auto"), otherwise as ``select_impl``. ``rows``: as for the forward;
    ``bias_grad``: whether the call wants the bias's gradient (a bias tensor's, in the CuTe backward).

    Under "auto" support alone decides (the forward also asks ``cute_varlen_fwd_preferred``): the CuTe varlen
    backward was faster than Triton's in every case measured. On H200 (``varlen.py kernels --backward``, B=1152,
    H=4, D=128, bf16 gelu_tanh, lengths up to 256 to 2048, all full or uniform in [1, N]; docs/benchmarks.md) the
    backward alone ran 1.13-1.94x as fast as Triton's varlen backward, 1.20-2.22x under the causal mask."""

    def support(q, k, v, bias, causal, window, activation, rows):
        from ..kernels.cute.fwd_support import on_sm100
        from ..kernels.cute.varlen_support import cute_varlen_bwd_support

        ok, reason = cute_varlen_bwd_support(q, k, v, bias, causal, window, activation, rows, bias_grad)
        if not ok and on_sm100(q.device):
            from .sm100_varlen_backward import sm100_varlen_backward_support

            return sm100_varlen_backward_support(q, k, v, bias, causal, window, activation, rows, bias_grad)
        return ok, reason

    return _varlen_cute_else_select(support, q, k, v, bias, causal, window, activation, rows, "varlen backward")


def _varlen_cute_else_select(cute_support, q, k, v, bias, causal: bool, window: tuple[int, int],
                             activation: ActivationName, rows: tuple, what: str) -> str:
    if _asks_cute(q, what):
        ok, reason = _checked(cute_support, q, k, v, bias, causal, window, activation, rows)
        if ok:
            log.debug("gdpa %s: cute", what)
            return "cute"
        log.debug("gdpa %s: not cute (%s)", what, reason)
    return select_impl(q, k, v, bias, what)


def _cute_else_select(cute_support, q, k, v, bias, causal: bool, activation: ActivationName, what: str) -> str:
    """"cute" where ``cute_support`` says the CuTe-DSL Hopper kernel takes the call (under "auto" and "cute"; a
    ValueError under "cute" when it cannot), otherwise as ``select_impl``."""
    if _asks_cute(q, what):
        ok, reason = _checked(cute_support, q, k, v, bias, causal, activation)
        if ok:
            log.debug("gdpa %s: cute", what)
            return "cute"
        if config.backend == "cute":
            raise ValueError(f"gdpa_inductor.config.backend='cute' cannot run this call: {reason}")
        log.debug("gdpa %s: not cute (%s)", what, reason)
    return select_impl(q, k, v, bias, what)


def _checked(cute_support, *args) -> tuple[bool, str]:
    """A support check that cannot run (a CuTe module that fails to import) says no, with why."""
    try:
        return cute_support(*args)
    except Exception as e:
        return False, f"the CuTe support check failed ({type(e).__name__}: {e})"


def on_cuda(q: torch.Tensor) -> bool:
    """Whether the call's tensors are CUDA tensors, the only ones the CuTe kernels take."""
    return q.device.type == "cuda"


def _asks_cute(q: torch.Tensor, what: str) -> bool:
    """Whether the CuTe support check runs: under "cute", and under "auto" for CUDA tensors only (the kernels need
    an sm_90 GPU; the check's modules import Triton and cutlass-dsl, which a CPU call should not load)."""
    if config.backend == "auto" and not on_cuda(q):
        log.debug("gdpa %s: not cute (device %s)", what, q.device.type)
        return False
    return config.backend in ("auto", "cute")


def select_impl(q, k, v, bias, what: str) -> str:
    """Returns "triton" or "reference" for this call; raises ValueError when a forced path cannot run."""
    choice = config.backend
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
