"""The op's [..., H, N, D] operands and their bias seen as the kernels' [Z, H, N, D] batch (views where the
strides allow), for the support checks and the launchers alike."""

from __future__ import annotations

import torch

from ..common.layout import as_4d


def flatten_batch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """((q4, k4, v4), batch): the operands with their broadcast batch dims ``batch`` flattened into Z."""
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    return tuple(as_4d(t, batch) for t in (q, k, v)), batch


def bias_4d(bias: torch.Tensor | None, batch: tuple, num_queries: int) -> torch.Tensor | None:
    """The op's bias ([..., Hb, Nq or 1, Nk] broadcasting to [*batch, H, Nq, Nk]) with its batch dims flattened as
    the operands' (``as_4d``): Zb is 1 where it broadcasts over the whole batch; one element stays as it is. A bias
    of one row for every query (a key-padding bias) is seen as ``num_queries`` rows of stride 0: the kernels read
    it as any other (the backward's TMA takes the zero stride), and its gradient sums over them (``gdpa_bwd_cute``'s
    ``one_row_bias``)."""
    if bias is None or bias.numel() == 1:
        return bias
    b = bias.reshape((1,) * (len(batch) + 3 - bias.dim()) + tuple(bias.shape))
    b = b.reshape(1, *b.shape[-3:]) if all(n == 1 for n in b.shape[:-3]) else as_4d(b, batch)
    if b.shape[-2] == 1 and num_queries > 1:
        b = b.expand(*b.shape[:-2], num_queries, b.shape[-1])
    return b


def is_tensor_bias(bias) -> bool:
    """A bias read per score (not None, not one element)."""
    return bias is not None and bias.numel() != 1
