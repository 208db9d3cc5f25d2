"""Which varlen backward calls the CuTe Blackwell backward (``GdpaBwdSm100`` with ``varlen``) takes on an sm_100 GPU,
as the varlen forward's are taken (``sm100_varlen_forward``): those ``sm100_varlen_bwd_support`` covers (the causal
mask and windows at any per-sample Nk - Nq, a bias and its gradient), once the build the call would run has passed
its first-use self-check against Triton's varlen backward on the device (``self_check``: dq, dk, dv and dbias each, on
the varlen forward's check inputs). No Blackwell GPU has run the kernel in this project's tests, so no build serves a
call unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check, sm100_kernels


def sm100_varlen_backward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                                  window: tuple[int, int], activation: ActivationName, rows: tuple,
                                  bias_grad: bool = False) -> tuple[bool, str]:
    """(ok, reason) for the varlen op's operands and ``rows``: ``sm100_varlen_bwd_support``, then the self-check's
    verdict on the call's build."""
    from ..kernels.cute.varlen_bwd import plan_varlen_bwd_sm100
    from ..kernels.cute.varlen_support import sm100_varlen_bwd_support

    covered = sm100_varlen_bwd_support(q, k, v, bias, bias_grad, window, activation, rows)
    return sm100_kernels.checked_support(
        "backward", covered,
        lambda: plan_varlen_bwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias, bias_grad),
        varlen_backward_check, q.device)


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, window: tuple[int, int],
             activation: ActivationName) -> bool:
    """Whether the opaque op could run this varlen backward on the Blackwell kernel, from what a compiled graph knows
    of it (``sm100_kernels.may_take``; a varlen build always masks its queries, and the graph does not know whether
    a bias tensor's gradient is wanted: a failed build with or without it sends the call to Triton)."""
    from ..kernels.cute.bwd_plan import SM100_BWD_HEAD_DIMS
    from ..kernels.cute.varlen_bwd import plan_varlen_bwd_sm100
    from .sm100_forward import bias_dtype_taken

    if not bias_dtype_taken(q, bias):
        return False
    grads = (False, True) if bias is not None and bias.numel() != 1 else (False,)
    return all(sm100_kernels.may_take(
        "backward", q, v, bias, causal, activation, SM100_BWD_HEAD_DIMS,
        lambda masked, grad=grad: plan_varlen_bwd_sm100(q.dtype, q.shape[-1], activation, causal, window, bias,
                                                        grad), masks=True) for grad in grads)


def varlen_backward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell backward's varlen build ``plan``: that build, through the varlen op's glue
    (the sides, shared blocks, grouped heads), against Triton's varlen backward on the inputs of the varlen forward's
    check for the same masks (``sm100_forward_cases.varlen_cases``: jagged and padded sides, an empty sample, lengths
    ending part-way through tiles, each kind of bias the build takes), each with a random output gradient; a build
    writing the bias's gradient skips one element's bias, which has none. The kernel runs on
    ``sm100_kernels.CHECK_CTAS`` CTAs, each walking several tiles."""
    from ..kernels.cute.fwd_plan import plan_fwd_sm100
    from .sm100_forward_cases import varlen_cases

    forward = plan_fwd_sm100(plan.dtype, plan.head_dim, plan.activation, causal=plan.causal, window=plan.window,
                             bias=plan.bias, varlen=True)
    grads = 4 if plan.bias_grad else 3

    def cases():
        gen = torch.Generator(device=device).manual_seed(11)
        for q, k, v, bias, *rest in varlen_cases(forward, device):
            if plan.bias_grad and bias.numel() == 1:
                continue
            yield torch.randn(q.shape, generator=gen, device=device, dtype=q.dtype), q, k, v, bias, *rest

    def on(impl, dout, q, k, v, bias, cu_q, cu_k, used_q, used_k, max_q, max_k, *params):
        from . import varlen_ops

        cute = impl == "cute"
        return varlen_ops._backward_on(impl, False, dout, q, k, v, bias, (cu_q, cu_k, used_q, used_k), max_q, max_k,
                                       params, plan.bias_grad, plan=plan if cute else None,
                                       ctas=sm100_kernels.CHECK_CTAS if cute else None)[:grads]

    def exact(dout, q, k, v, bias, *rest):
        from ..kernels.reference_varlen import gdpa_varlen_reference_backward

        return gdpa_varlen_reference_backward(dout, q, k, v, bias, *rest, plan.bias_grad)[:grads]

    extra = (("causal",) if plan.causal else ("a window",) if plan.window else ()) + (
        (f"{plan.bias} bias",) if plan.bias else ()) + (("its gradient",) if plan.bias_grad else ())
    name = sm100_kernels.variant("backward", plan, f"{plan.q_stages} Q/dO stages", "varlen", *extra)
    return self_check.Check(name, lambda *args: on("cute", *args), lambda *args: on("triton", *args), exact,
                            cases, outputs=("dq", "dk", "dv", "dbias")[:grads])
