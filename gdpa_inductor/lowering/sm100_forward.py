"""Which dense forward calls the CuTe Blackwell forward (``GdpaFwdSm100``) takes on an sm_100 GPU: those its support
check covers, once the build the call would run has passed its first-use self-check against Triton on the device
(``self_check``). No Blackwell GPU has run the kernel in this project's tests, so no build serves a call unchecked."""

from __future__ import annotations

import torch

from ..kernels.activations import ActivationName
from . import self_check

# the check's shapes (Z, H, Hkv, Nq): query tiles of 128 rows, both ending part-way; the second with GQA
CHECK_SHAPES = ((2, 4, 4, 200), (1, 4, 2, 65))


def sm100_forward_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias, causal: bool,
                          activation: ActivationName) -> tuple[bool, str]:
    """(ok, reason) for the op's operands ([..., H, N, D], batch dims broadcasting): ``sm100_fwd_supported`` on their
    4-D views, then the self-check's verdict on the call's build."""
    from ..kernels.cute.fwd_support import sm100_fwd_supported
    from ..kernels.cute.gdpa_fwd import plan_dense_fwd_sm100
    from ..kernels.cute.operand_views import flatten_batch

    if q.dim() < 3 or k.dim() < 3 or v.dim() < 3:
        return False, "operands need [..., H, N, D]"
    if causal or bias is not None:
        # the kernel has both, but its first-use self-check runs the build of neither
        return False, "the CuTe Blackwell forward is self-checked without a causal mask or bias"
    (q4, k4, v4), _ = flatten_batch(q, k, v)
    ok, reason = sm100_fwd_supported(q4, k4, v4, bias, causal, activation)
    if not ok:
        return ok, reason
    plan = plan_dense_fwd_sm100(q4, k4, activation)
    return self_check.verdict(("forward", plan), lambda: forward_check(plan, q.device))


def may_take(q: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName) -> bool:
    """Whether the opaque op could run this call on the Blackwell forward, from what a compiled graph knows of it
    (its tensors may be fake: no data pointers): the machine, dtype, head dims, no mask or bias, and no failed
    verdict. Layouts and the verdict yet to come are the op's to check at run time (Triton where they fail)."""
    from ..kernels.cute.fwd_plan import SM100_HEAD_DIMS, plan_fwd_sm100
    from ..kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS, cute_dsl_available, on_sm100

    if not (cute_dsl_available() and on_sm100(q.device)) or causal or bias is not None:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or v.dtype != q.dtype or activation not in SUPPORTED_ACTIVATIONS:
        return False
    if q.shape[-1] != v.shape[-1] or q.shape[-1] not in SM100_HEAD_DIMS:
        return False
    # the graph may not know Nk's remainder: a build of either key mask failing sends the call to Triton
    keys = [("forward", plan_fwd_sm100(q.dtype, q.shape[-1], activation, mask_keys=mask)) for mask in (False, True)]
    return not any(self_check.failed(key) for key in keys)


def forward_check(plan, device: torch.device) -> self_check.Check:
    """The self-check of the Blackwell forward's build ``plan``: that build (not the one a call's shape would pick)
    against Triton's forward, on keys ending part-way through a key tile where the build masks them, else on
    whole tiles."""
    tile = plan.tile_n
    key_counts = (tile + tile // 2 + 5, tile // 2 + 13) if plan.mask_keys else (tile, 2 * tile)
    d = plan.head_dim

    def cases():
        gen = torch.Generator(device=device).manual_seed(2024)
        for (z, h, hkv, nq), nk in zip(CHECK_SHAPES, key_counts):
            q = torch.randn(z, h, nq, d, generator=gen, device=device, dtype=plan.dtype)
            k, v = (torch.randn(z, hkv, nk, d, generator=gen, device=device, dtype=plan.dtype) for _ in range(2))
            yield q, k, v, plan.activation, d**-0.5, 1.0, 0.01

    def candidate(q, k, v, activation, scale, post_scale, slope):
        from ..kernels.cute import gdpa_fwd

        return gdpa_fwd.gdpa_fwd_cute_sm100(q, k, v, activation, scale, post_scale, slope, plan=plan)

    def trusted(q, k, v, activation, scale, post_scale, slope):
        from ..kernels.triton import gdpa_fwd

        return gdpa_fwd.gdpa_fwd_triton(q, k, v, None, activation, scale, post_scale, False, slope)

    def exact(q, k, v, activation, scale, post_scale, slope):
        from ..kernels.reference import gdpa_reference

        return gdpa_reference(q, k, v, None, activation, scale, post_scale, False, slope)

    mask = "keys masked past Nk" if plan.mask_keys else "whole key tiles"
    variant = (f"the CuTe Blackwell forward ({str(plan.dtype).removeprefix('torch.')}, D={d}, {plan.activation}, "
               f"{plan.tile_n}-key tiles, {mask}, {plan.target})")
    return self_check.Check(variant, candidate, trusted, exact, cases)
