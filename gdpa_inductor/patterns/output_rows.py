"""Rows of a jagged block's padded output that the graph reads back by index, gathered from the op's own output.

Where the fused op ran on jagged rows, the rewrite puts its output back into the padded batch (zeros, then an
``index_copy``) for the graph's later nodes. Models that unpad right away (``out.transpose(1, 2).reshape(B * N, E)
[rows]``, as HSTU's reference does) then only read some of those rows back. Each such read is answered from the
op's output instead: position ``z * N + i`` of the padded batch is row ``offsets[z] + i`` where ``i`` is below the
sample's length, and zero elsewhere, so the padded copy, its zeros and the gradient's gather from it are not made.
The read must be a chain of views of the padded output that lays its rows out unchanged (checked on meta tensors,
which follow views as the real ones do) and then one integer index along the rows.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Callable, Optional

import torch
import torch.fx as fx

from . import fx_nodes as fxn

# ops that may return a view of their input; whether one did is checked on meta tensors, not assumed
_VIEW_METHODS = {"transpose", "permute", "view", "reshape", "flatten", "unflatten", "contiguous"}
_VIEW_FUNCTIONS = {torch.transpose, torch.permute, torch.reshape, torch.flatten}


def read_rows_directly(padded: fx.Node, jagged: fx.Node, offsets: fx.Node, batch: int, n: int,
                       make_builder: Callable) -> Optional[fx.Node]:
    """Answers the one index read of ``padded`` ([B, H, N, Dv], the op's output ``jagged`` [L, H, Dv] placed by
    ``offsets``) from ``jagged``. ``make_builder(anchor)`` gives a node builder inserting before ``anchor``.
    Returns the read, now without users, where it was replaced; the graph is unchanged where it was not."""
    found = _index_read(padded, batch, n)
    if found is None:
        return None
    read, index, rest = found
    rows = fxn.example(jagged).shape[0]
    if isinstance(rows, int) and rows == 0:
        return None
    b = make_builder(read)
    try:
        new = _gather(b, jagged, offsets, index, rest, batch, n)
        if fxn.example(new).shape != fxn.example(read).shape or fxn.example(new).dtype != fxn.example(read).dtype:
            raise ValueError("the gathered rows differ from the read in shape or dtype")
    except Exception:
        b.rollback()
        return None
    read.replace_all_uses_with(new)
    return read


def _index_read(padded: fx.Node, batch: int, n: int) -> Optional[tuple[fx.Node, fx.Node, tuple[int, ...]]]:
    """(the read, its index, the shape of a row) where ``padded``'s one use is a chain of views laying out its rows
    unchanged ([B * N, ...] over [B, N, H, Dv]) and then an integer index of those rows; else None."""
    ex = fxn.example(padded)
    if not all(isinstance(s, int) for s in ex.shape):
        return None
    h, dv = ex.shape[1], ex.shape[3]
    root = torch.empty(batch * n, h, dv, device="meta")
    value = root.view(batch, n, h, dv).transpose(1, 2)
    node = padded
    while True:
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        index = _row_index(user, node, value.dim())
        if index is not None:
            break
        value = _apply_view(user, node, value)
        if value is None:
            return None
        node = user
    if value._base is not root or value.storage_offset() != 0 or not value.is_contiguous():
        return None
    if value.shape[0] != batch * n or math.prod(value.shape[1:]) != h * dv:
        return None
    idx = fxn.example(index)
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.int64, torch.int32):
        return None
    return user, index, tuple(int(s) for s in value.shape[1:])


def _row_index(user: fx.Node, node: fx.Node, dims: int) -> Optional[fx.Node]:
    """The index tensor where ``user`` reads rows of ``node`` by it (``node[idx]``, ``index_select`` along dim 0)."""
    if not user.args or user.args[0] is not node:
        return None
    if user.target is operator.getitem:
        index = user.args[1]
        index = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    elif (user.op == "call_method" and user.target == "index_select") or user.target is torch.index_select:
        args = dict(zip(("input", "dim", "index"), user.args), **user.kwargs)
        index = args.get("index") if args.get("dim") in (0, -dims) else None
    else:
        return None
    return index if isinstance(index, fx.Node) else None


def _apply_view(user: fx.Node, node: fx.Node, value: torch.Tensor) -> Optional[torch.Tensor]:
    """``user`` applied to the meta ``value`` standing for ``node``, where it is a view op of ``node`` alone with
    constant arguments; else None."""
    if user.op == "call_method" and user.target in _VIEW_METHODS and user.args and user.args[0] is node:
        fn = getattr(value, user.target)
        args = user.args[1:]
    elif user.op == "call_function" and user.target in _VIEW_FUNCTIONS and user.args and user.args[0] is node:
        fn = functools.partial(user.target, value)
        args = user.args[1:]
    else:
        return None
    if _has_node(args) or _has_node(user.kwargs):
        return None
    try:
        out = fn(*args, **user.kwargs)
    except Exception:
        return None
    want = fxn.example(user)
    if not isinstance(want, torch.Tensor) or tuple(want.shape) != tuple(out.shape):
        return None
    return out


def _has_node(args) -> bool:
    found = []
    torch.fx.node.map_aggregate(args, lambda a: found.append(a) if isinstance(a, fx.Node) else None)
    return bool(found)


def _gather(b, jagged: fx.Node, offsets: fx.Node, index: fx.Node, rest: tuple[int, ...], batch: int,
            n: int) -> fx.Node:
    """Rows ``index`` of the padded batch, read from ``jagged``: a negative index counts from the end, as indexing
    does; a position past its sample's length reads zero."""
    total = batch * n
    if fxn.example(index).dtype != torch.int64:
        index = b.emit("method", "to", (index, torch.int64))
    at = b.emit("function", torch.where, (b.emit("function", operator.lt, (index, 0)),
                                          b.emit("function", operator.add, (index, total)), index))
    sample = b.emit("function", operator.floordiv, (at, n))
    pos = b.emit("function", operator.sub, (at, b.emit("function", operator.mul, (sample, n))))
    start = b.emit("function", operator.getitem, (offsets, sample))
    end = b.emit("function", operator.getitem, (offsets, b.emit("function", operator.add, (sample, 1))))
    valid = b.emit("function", operator.lt, (pos, b.emit("function", operator.sub, (end, start))))
    rows = fxn.example(jagged).shape[0]
    last = rows - 1 if isinstance(rows, int) else b.emit(
        "function", operator.sub, (b.emit("function", torch.ops.aten.sym_size.int, (jagged, 0)), 1))
    src = b.emit("method", "clamp", (b.emit("function", operator.add, (start, pos)), 0, last))
    flat = b.emit("method", "reshape", (jagged, -1, *rest))
    gathered = b.emit("function", operator.getitem, (flat, src))
    for _ in rest:
        valid = b.emit("method", "unsqueeze", (valid, -1))
    return b.emit("function", torch.where, (valid, gathered, 0.0))
