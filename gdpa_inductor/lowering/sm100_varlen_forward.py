"""Which varlen forward calls the CuTe Blackwell forward (``GdpaFwdSm100`` with ``varlen``) takes on an sm_100 GPU,
as the dense ones are taken (``sm100_forward``): those ``sm100_varlen_fwd_support`` covers (the causal mask and
windows at any per-sample Nk - Nq, a bias), once the build the call would run has passed its first-use self-check
against Triton's varlen forward on the device (``self_check``; the inputs in ``sm100_forward_cases``). No Blackwell
GPU has run the kernel in this project's tests, so no build serves a call unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check, sm100_kernels
from .sm100_forward import bias_dtype_taken


def sm100_varlen_forward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                                 window: tuple[int, int], activation: ActivationName,
                                 rows: tuple) -> tuple[bool, str]:
    """(ok, reason) for the varlen op's operands and ``rows`` (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    ``sm100_varlen_fwd_support``, then the self-check's verdict on the call's build."""
    from ..kernels.cute.varlen_fwd import plan_varlen_fwd_sm100
    from ..kernels.cute.varlen_support import sm100_varlen_fwd_support

    covered = sm100_varlen_fwd_support(q, k, v, bias, causal, window, activation, rows)
    return sm100_kernels.checked_support(
        "forward", covered, lambda: plan_varlen_fwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias),
        varlen_forward_check, q.device)


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, window: tuple[int, int],
             activation: ActivationName) -> bool:
    """Whether the opaque op could run this varlen forward on the Blackwell kernel, from what a compiled graph knows
    of it (``sm100_kernels.may_take``; a varlen build always masks its keys)."""
    from ..kernels.cute.fwd_plan import SM100_HEAD_DIMS
    from ..kernels.cute.varlen_fwd import plan_varlen_fwd_sm100

    if not bias_dtype_taken(q, bias):
        return False
    return sm100_kernels.may_take(
        "forward", q, v, bias, causal, activation, SM100_HEAD_DIMS,
        lambda masked: plan_varlen_fwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias), masks=True)


def varlen_forward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell forward's varlen build ``plan``: that build, through the varlen op's glue
    (the sides, the output), against Triton's varlen forward on ``sm100_forward_cases.varlen_cases``."""
    from .sm100_forward_cases import features, varlen_cases

    def on(impl, q, k, v, bias, cu_q, cu_k, used_q, used_k, max_q, max_k, *params):
        from . import varlen_ops

        return varlen_ops._forward_on(impl, False, q, k, v, bias, (cu_q, cu_k, used_q, used_k), max_q, max_k,
                                      params, plan=plan if impl == "cute" else None,
                                      ctas=sm100_kernels.CHECK_CTAS if impl == "cute" else None)

    def exact(q, k, v, bias, *rest):
        from ..kernels.reference_varlen import gdpa_varlen_reference

        return gdpa_varlen_reference(q, k, v, bias, *rest)

    name = sm100_kernels.variant("forward", plan, f"{plan.tile_n}-key tiles", *features(plan))
    return self_check.Check(name, lambda *args: on("cute", *args), lambda *args: on("triton", *args), exact,
                            lambda: varlen_cases(plan, device))
