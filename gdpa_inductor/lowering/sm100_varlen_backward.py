"""Which varlen backward calls the CuTe Blackwell backward (``GdpaBwdSm100`` with ``varlen``) takes on an sm_100 GPU,
as the varlen forward's are taken (``sm100_varlen_forward``): those ``sm100_varlen_bwd_support`` covers (the causal
mask and windows at any per-sample Nk - Nq, no bias), once the build the call would run has passed its first-use
self-check against Triton's varlen backward on the device (``self_check``: dq, dk and dv each, on the varlen
forward's check inputs). No Blackwell GPU has run the kernel in this project's tests, so no build serves a call
unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check, sm100_kernels


def sm100_varlen_backward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                                  window: tuple[int, int], activation: ActivationName,
                                  bias_grad: bool = False) -> tuple[bool, str]:
    """(ok, reason) for the varlen op's operands: ``sm100_varlen_bwd_support`` (no bias, so no bias gradient), then
    the self-check's verdict on the call's build."""
    from ..kernels.cute.varlen_bwd import plan_varlen_bwd_sm100
    from ..kernels.cute.varlen_support import sm100_varlen_bwd_support

    covered = sm100_varlen_bwd_support(q, k, v, bias, window, activation)
    return sm100_kernels.checked_support(
        "backward", covered, lambda: plan_varlen_bwd_sm100(q.dtype, q.shape[-1], activation, causal, window),
        varlen_backward_check, q.device)


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, window: tuple[int, int],
             activation: ActivationName) -> bool:
    """Whether the opaque op could run this varlen backward on the Blackwell kernel, from what a compiled graph knows
    of it (``sm100_kernels.may_take``; no bias, and a varlen build always masks its queries)."""
    from ..kernels.cute.bwd_plan import SM100_BWD_HEAD_DIMS
    from ..kernels.cute.varlen_bwd import plan_varlen_bwd_sm100

    if bias is not None:
        return False
    return sm100_kernels.may_take(
        "backward", q, v, bias, causal, activation, SM100_BWD_HEAD_DIMS,
        lambda masked: plan_varlen_bwd_sm100(q.dtype, q.shape[-1], activation, causal, window), masks=True)


def varlen_backward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell backward's varlen build ``plan``: that build, through the varlen op's glue
    (the sides, shared blocks, grouped heads), against Triton's varlen backward on the inputs of the varlen forward's
    check for the same masks (``sm100_forward_cases.varlen_cases``: jagged and padded sides, an empty sample, lengths
    ending part-way through tiles), each with a random output gradient."""
    from ..kernels.cute.fwd_plan import plan_fwd_sm100
    from .sm100_forward_cases import varlen_cases

    forward = plan_fwd_sm100(plan.dtype, plan.head_dim, plan.activation, causal=plan.causal, window=plan.window,
                             varlen=True)

    def cases():
        gen = torch.Generator(device=device).manual_seed(11)
        for q, *rest in varlen_cases(forward, device):
            yield torch.randn(q.shape, generator=gen, device=device, dtype=q.dtype), q, *rest

    def on(impl, dout, q, k, v, bias, cu_q, cu_k, used_q, used_k, max_q, max_k, *params):
        from . import varlen_ops

        return varlen_ops._backward_on(impl, False, dout, q, k, v, bias, (cu_q, cu_k, used_q, used_k), max_q, max_k,
                                       params, False, plan=plan if impl == "cute" else None)[:3]

    def exact(dout, q, k, v, bias, *rest):
        from ..kernels.reference_varlen import gdpa_varlen_reference_backward

        return gdpa_varlen_reference_backward(dout, q, k, v, bias, *rest, False)[:3]

    band = ("causal",) if plan.causal else ("a window",) if plan.window else ()
    name = sm100_kernels.variant("backward", plan, f"{plan.q_stages} Q/dO stages", "varlen", *band)
    return self_check.Check(name, lambda *args: on("cute", *args), lambda *args: on("triton", *args), exact,
                            cases, outputs=("dq", "dk", "dv"))
