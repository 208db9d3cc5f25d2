"""What the dispatch of the CuTe Blackwell kernels shares between the forwards (``sm100_forward``,
``sm100_varlen_forward``) and the backwards (``sm100_backward``, ``sm100_varlen_backward``): on an sm_100 GPU a
kernel takes a call its support check covers, once the build the call would run has passed its first-use self-check
against Triton on the device (``self_check``). No Blackwell GPU has run these kernels in this project's tests, so no
build serves a call unchecked."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from ..kernels.activations import ActivationName
from . import self_check

# the check's shapes (Z, H, Hkv, Nq): query tiles of 128 rows, both ending part-way; the second with GQA
CHECK_SHAPES = ((2, 4, 4, 200), (1, 4, 2, 65))
NOT_DENSE = (False, "operands need [..., H, N, D]")
# the persistent kernels' grid in their checks: fewer CTAs than tiles, so that each walks several (the pipelines'
# phases and the accumulators' hand-over carried from tile to tile)
CHECK_CTAS = 3


def partial_tiles(tile: int) -> tuple[int, int]:
    """Two lengths, one per check shape, each ending part-way through a ``tile``-long tile."""
    return tile + tile // 2 + 5, tile // 2 + 13


def whole_tiles(tile: int) -> tuple[int, int]:
    """Two lengths, one per check shape, each a whole number of ``tile``-long tiles."""
    return tile, 2 * tile


def dense_views(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *others: torch.Tensor):
    """((q4, k4, v4, *others4), batch): the op's [..., H, N, D] operands (``others``: of the output's shape) with
    their broadcast batch dims ``batch`` flattened into Z; None where one has fewer than 3 dims."""
    from ..kernels.common.layout import as_4d
    from ..kernels.cute.operand_views import flatten_batch

    if any(t.dim() < 3 for t in (q, k, v, *others)):
        return None
    views, batch = flatten_batch(q, k, v)
    return (*views, *(as_4d(t, batch) for t in others)), batch


def checked_support(direction: str, covered: tuple[bool, str], plan: Callable[[], object],
                    make_check: Callable[[object, torch.device], self_check.Check],
                    device: torch.device) -> tuple[bool, str]:
    """(ok, reason): the kernel's support check's ``covered``, then the self-check's verdict on the call's build
    ``plan()`` (its check ``make_check(build, device)``, run at the build's first use)."""
    if not covered[0]:
        return covered
    build = plan()
    return self_check.verdict((direction, build), lambda: make_check(build, device))


def may_take(direction: str, q: torch.Tensor, v: torch.Tensor, bias, causal: bool, activation: ActivationName,
             head_dims: tuple[int, ...], plan_of: Callable[[bool], object], masks: bool = False) -> bool:
    """Whether the opaque op could run this call on the Blackwell ``direction`` kernel, from what a compiled graph
    knows of it (its tensors may be fake: no data pointers): the machine, dtype, head dims (``head_dims``), no mask
    or bias unless the kernel takes them (``masks``), and no failed verdict (``plan_of(masked)``: the build with or
    without its tile mask). Layouts and the verdict yet to come are the op's to check at run time (Triton where they
    fail)."""
    from ..kernels.cute.fwd_support import SUPPORTED_ACTIVATIONS, cute_dsl_available, on_sm100

    if not (cute_dsl_available() and on_sm100(q.device)) or ((causal or bias is not None) and not masks):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or v.dtype != q.dtype or activation not in SUPPORTED_ACTIVATIONS:
        return False
    if q.shape[-1] != v.shape[-1] or q.shape[-1] not in head_dims:
        return False
    # the graph may not know the lengths' remainders: a build of either mask failing sends the call to Triton
    return not any(self_check.failed((direction, plan_of(masked))) for masked in (False, True))


def random_cases(plan, device: torch.device, query_counts: tuple[int, int], key_counts: tuple[int, int],
                 grad: bool, post_scale: float = 1.0) -> Iterator[tuple]:
    """The check's inputs for the build ``plan`` (its dtype, head dim and activation): per ``CHECK_SHAPES`` entry,
    fresh random q, k, v (and with ``grad`` dout, first) of those query and key counts, then the activation, scale,
    ``post_scale`` and negative slope."""
    gen = torch.Generator(device=device).manual_seed(2024)
    d = plan.head_dim
    for (z, h, hkv, _), nq, nk in zip(CHECK_SHAPES, query_counts, key_counts):
        q = torch.randn(z, h, nq, d, generator=gen, device=device, dtype=plan.dtype)
        k, v = (torch.randn(z, hkv, nk, d, generator=gen, device=device, dtype=plan.dtype) for _ in range(2))
        params = (plan.activation, d**-0.5, post_scale, 0.01)
        if grad:
            yield torch.randn(z, h, nq, d, generator=gen, device=device, dtype=plan.dtype), q, k, v, *params
        else:
            yield q, k, v, *params


def variant(direction: str, plan, *details: str) -> str:
    """The build's name in the check's reasons: the kernel, dtype, head dim, activation, ``details``, target."""
    return (f"the CuTe Blackwell {direction} ({str(plan.dtype).removeprefix('torch.')}, D={plan.head_dim}, "
            f"{plan.activation}, {', '.join(details)}, {plan.target})")
