"""The inputs of the Blackwell forward's first-use self-checks (``sm100_forward``, ``sm100_varlen_forward``): for
each build (``Sm100FwdPlan``), fresh random cases that exercise exactly its features. The causal mask runs at
Nq == Nk and at Nq != Nk both ways; a window with both sides bounded, with only its left side (the causal bound
folded in) and with only its right; a bias in every kind the build takes (its dtype: the operands' or fp32, full or
broadcast over dims, one element), of random values none of them zero, so that a build which drops it shows; a
varlen batch with an empty sample and lengths ending part-way through a tile, its sides jagged (two offsets tensors,
or one for both) or padded."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .sm100_kernels import CHECK_SHAPES, partial_tiles, whole_tiles

# the checks' activation parameters beside the build's activation: post_scale, negative slope
POST_SCALE, SLOPE = 1.0, 0.01

# (kind of bias, its dims) per build's bias: "" none; a 16-bit one the operands' dtype; "float32" fp32 or one element
DENSE_BIASES = {
    "": (None,),
    "16-bit": ("full", "over rows and columns", "one row for every query"),
    "float32": ("over rows and columns per sample", "one row for every query", "one element"),
}
VARLEN_BIASES = {
    "": (None,),
    "16-bit": ("full", "over rows and columns per head", "over rows and columns per sample"),
    "float32": ("full", "over rows and columns", "one element"),
}

# the varlen layouts: (query lengths, key lengths, heads, key heads, how the sides lie); key lengths None: one
# offsets tensor for both sides
VARLEN_LAYOUTS = (
    ((200, 0, 65), (198, 0, 77), 4, 4, "jagged"),
    ((130, 61), None, 4, 2, "jagged"),
    ((96, 0, 40), (130, 0, 77), 4, 2, "padded"),
)
# (causal, window) per layout of a window build: both sides bounded; the left only, under the causal mask; the right
WINDOWS = ((False, (40, 17)), (True, (33, -1)), (False, (-1, 9)))


def features(plan) -> list[str]:
    """The build's features, as the check's reasons name them."""
    named = [("causal", plan.causal), ("a window", plan.window), (f"a {plan.bias} bias", bool(plan.bias)),
             ("varlen", plan.varlen)]
    return [name for name, on in named if on]


def _bias_family(plan) -> str:
    return "float32" if plan.bias == "float32" else "16-bit" if plan.bias else ""


def _nonzero(shape: tuple, dtype: torch.dtype, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Random values of magnitude in [0.25, 1), either sign: none zero, in any dtype."""
    magnitude = torch.rand(shape, generator=gen, device=device) * 0.75 + 0.25
    sign = torch.randint(0, 2, shape, generator=gen, device=device) * 2 - 1
    return (magnitude * sign).to(dtype)


def _bias_dtype(plan, kind: str) -> torch.dtype:
    # one element is read as fp32 whatever its dtype: take the operands'
    return torch.float32 if plan.bias == "float32" and kind != "one element" else plan.dtype


def dense_cases(plan, device: torch.device) -> Iterator[tuple]:
    """(q, k, v, bias, activation, scale, post_scale, causal, negative slope) for a dense build: per
    ``CHECK_SHAPES`` entry (the second with GQA) keys ending part-way through a key tile where the build masks them,
    else whole tiles, and under ``causal`` one more case of Nq == Nk; as many cases as the build has kinds of
    bias, the shapes taken in turn."""
    gen = torch.Generator(device=device).manual_seed(2024)
    keys = partial_tiles(plan.tile_n) if plan.mask_keys else whole_tiles(plan.tile_n)
    if _bias_family(plan) == "16-bit":
        # a 16-bit bias is read in pairs of columns: Nk even
        keys = tuple(n + n % 2 for n in keys)
    first, second = CHECK_SHAPES
    sizes = [(first, first[3], keys[0]), (second, second[3], keys[1])]
    if plan.causal:
        sizes.append((first, keys[0], keys[0]))
    kinds = DENSE_BIASES[_bias_family(plan)]
    d = plan.head_dim
    for i in range(max(len(sizes), len(kinds))):
        (z, h, hkv, _), nq, nk = sizes[i % len(sizes)]
        q = torch.randn(z, h, nq, d, generator=gen, device=device, dtype=plan.dtype)
        k, v = (torch.randn(z, hkv, nk, d, generator=gen, device=device, dtype=plan.dtype) for _ in range(2))
        kind = kinds[i % len(kinds)]
        shape = {None: None, "full": (z, h, nq, nk), "over rows and columns": (nq, nk),
                 "one row for every query": (z, 1, 1, nk), "over rows and columns per sample": (z, 1, nq, nk),
                 "one element": (1,)}[kind]
        bias = None if shape is None else _nonzero(shape, _bias_dtype(plan, kind), gen, device)
        yield q, k, v, bias, plan.activation, d**-0.5, POST_SCALE, plan.causal, SLOPE


def varlen_cases(plan, device: torch.device) -> Iterator[tuple]:
    """(q, k, v, bias, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, activation,
    scale, post_scale, causal, window, negative slope) for a varlen build: each of ``VARLEN_LAYOUTS``, under a
    window build each with its ``WINDOWS`` entry; as many cases as the build has kinds of bias, the layouts taken in
    turn."""
    gen = torch.Generator(device=device).manual_seed(2024)
    kinds = VARLEN_BIASES[_bias_family(plan)]
    d = plan.head_dim
    for i in range(max(len(VARLEN_LAYOUTS), len(kinds))):
        q_lens, k_lens, h, hkv, how = VARLEN_LAYOUTS[i % len(VARLEN_LAYOUTS)]
        causal, window = WINDOWS[i % len(WINDOWS)] if plan.window else (plan.causal, (-1, -1))
        if how == "jagged":
            cu_q = _offsets(q_lens, device)
            cu_k = cu_q if k_lens is None else _offsets(k_lens, device)
            used_q = used_k = None
            q = torch.randn(sum(q_lens), h, d, generator=gen, device=device, dtype=plan.dtype)
            k, v = (torch.randn(int(cu_k[-1]), hkv, d, generator=gen, device=device, dtype=plan.dtype)
                    for _ in range(2))
            max_q, max_k = max(q_lens), max(k_lens or q_lens)
        else:
            cu_q = cu_k = None
            used_q, used_k = (torch.tensor(n, dtype=torch.int32, device=device) for n in (q_lens, k_lens))
            max_q, max_k = max(q_lens), max(k_lens)
            q = torch.randn(len(q_lens), max_q, h, d, generator=gen, device=device, dtype=plan.dtype)
            k, v = (torch.randn(len(k_lens), max_k, hkv, d, generator=gen, device=device, dtype=plan.dtype)
                    for _ in range(2))
        kind = kinds[i % len(kinds)]
        b = len(q_lens)
        shape = {None: None, "full": (b, h, max_q, max_k), "over rows and columns per head": (h, max_q, max_k),
                 "over rows and columns per sample": (b, 1, max_q, max_k), "over rows and columns": (max_q, max_k),
                 "one element": (1,)}[kind]
        bias = None if shape is None else _nonzero(shape, _bias_dtype(plan, kind), gen, device)
        yield (q, k, v, bias, cu_q, cu_k, used_q, used_k, max_q, max_k, plan.activation, d**-0.5, POST_SCALE, causal,
               window, SLOPE)


def _offsets(lengths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
