"""Proving that a mask in the graph is the causal mask, so that it becomes the op's ``causal`` flag.

A mask is accepted only in forms whose value is known at compile time: ``torch.tril``/``torch.triu`` of
``torch.ones``, a lower-triangular buffer sliced to ``[:N, :N]`` (its value is read from the example
inputs), or a comparison of ``torch.arange`` rows and columns; through ``.bool()``, ``== 0`` / ``!= 0``,
``~`` and dtype casts. The scores must be square (Nq == Nk, statically), where top-left and the op's
bottom-right alignment agree. ``causal_mask_kind`` answers "keep" (True where j <= i), "drop" (True where
j > i) or None (not provably causal).
"""

from __future__ import annotations

import operator
from typing import Optional

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import fx_nodes as fxn


def causal_mask_kind(mask: fx.Node, scores: torch.Tensor) -> Optional[str]:
    nq, nk = scores.shape[-2], scores.shape[-1]
    if not statically_known_true(nq == nk):
        return None
    kind = _kind(mask, nq)
    # an evaluated value is the same square in every leading index, so it may also be expanded over them
    evaluated = kind is None
    kind = kind or _evaluated_kind(mask)
    if kind is None:
        return None
    ev = fxn.example(mask)
    if not isinstance(ev, torch.Tensor) or ev.dim() > scores.dim() or ev.dim() < 2:
        return None
    if not _leading_dims_broadcast(ev, scores, evaluated):
        return None
    if not (statically_known_true(ev.shape[-2] == nq) and statically_known_true(ev.shape[-1] == nk)):
        return None
    return kind


def buffers_read(mask: fx.Node) -> list[fx.Node]:
    """The graph inputs (module buffers, the caller's float masks) whose values a causal proof of ``mask`` read
    (``_buffer_value``): the proof holds only while they keep those values."""
    return [n for n in _upstream(mask, values_only=True)
            if n.op in ("placeholder", "get_attr") and _buffer_value(n) is not None]


def _upstream(node: fx.Node, values_only: bool = False):
    """``node`` and every node it reads, directly or not, each once; ``values_only``: not through a size read (a
    node whose value is not a tensor reads no tensor's values, ``fxn.reads_only_shape_of``)."""
    seen, stack = set(), [node]
    while stack:
        cur = stack.pop()
        if cur not in seen:
            seen.add(cur)
            yield cur
            if not values_only:
                stack.extend(cur.all_input_nodes)
            elif cur is node or isinstance(fxn.example(cur), torch.Tensor):
                stack.extend(i for i in cur.all_input_nodes if not fxn.reads_only_shape_of(cur, i))


def _flip(kind: Optional[str]) -> Optional[str]:
    return {"keep": "drop", "drop": "keep"}.get(kind)


def _kind(node, n) -> Optional[str]:
    if not isinstance(node, fx.Node):
        return None
    if fxn.is_passthrough(node) or fxn.fn_or_method(node, (torch.unsqueeze, torch.detach),
                                                    ("bool", "unsqueeze", "detach")):
        return _kind(node.args[0], n)  # leading size-1 dims are checked against the scores at the end
    if node.op == "call_function" and node.target is operator.getitem and _only_adds_leading_dims(node):
        return _kind(node.args[0], n)
    if fxn.fn_or_method(node, (operator.invert, torch.logical_not), ("logical_not", "__invert__")):
        return _flip(_kind(node.args[0], n))
    if fxn.fn_or_method(node, (operator.eq, torch.eq), ("eq",)) and node.args[1] == 0:
        return _flip(_kind(node.args[0], n))
    if fxn.fn_or_method(node, (operator.ne, torch.ne), ("ne",)) and node.args[1] == 0:
        return _kind(node.args[0], n)
    if fxn.fn_or_method(node, (operator.eq, torch.eq), ("eq",)) and node.args[1] == 1:
        return _kind(node.args[0], n)
    if (operand := _one_minus_operand(node)) is not None:  # HSTU: 1.0 - triu_mask.to(dtype), the complement
        return _flip(_kind(operand, n))
    if fxn.fn_or_method(node, (torch.tril, torch.triu), ("tril", "triu")):
        if not _is_ones(node.args[0]):
            return None
        diagonal = fxn.arg(node, 1, "diagonal", 0)
        is_tril = node.target in (torch.tril, "tril")
        if is_tril and diagonal == 0:
            return "keep"
        if not is_tril and diagonal == 1:
            return "drop"
        return None
    if (value := _buffer_value(node)) is not None:
        return _triangle_kind(value)
    if node.op == "call_function" and node.target is operator.getitem:
        return _kind(node.args[0], n) if _top_left_slice(node.args[1]) else None
    return _arange_compare_kind(node)


# A mask computed from static sizes alone is evaluated up to this many elements per node.
MAX_EVALUATED_ELEMENTS = 1 << 24
# Targets whose values are not a function of their arguments: a subgraph with one is never evaluated.
_NONDETERMINISTIC = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial", "poisson", "exponential",
                     "empty")


def band_window(mask: fx.Node, scores: torch.Tensor) -> Optional[tuple[str, tuple[int, int]]]:
    """("keep" or "drop", (left, right)) when a mask computed from constants (``constant_value``) over square
    scores is, in its keep form, the band ``-left <= j - i <= right`` around the diagonal (HSTU's
    ``max_attn_len``: ``(max_attn_len, 0)``), the same in every leading index; else None."""
    nq, nk = scores.shape[-2], scores.shape[-1]
    if type(nq) is not int or nq != nk or nq < 2:
        return None
    value = constant_value(mask)
    if value is None or value.dim() < 2 or tuple(value.shape[-2:]) != (nq, nk) or value.dim() > scores.dim():
        return None
    if not _leading_dims_broadcast(value, scores, True):
        return None
    squares = value.reshape(-1, nq, nk)
    if (squares != squares[0]).any():
        return None
    for kind, keep in (("keep", squares[0] != 0), ("drop", squares[0] == 0)):
        offsets = torch.arange(nk, device=keep.device)[None, :] - torch.arange(nq, device=keep.device)[:, None]
        if not keep.any():
            continue
        left, right = int(-offsets[keep].min()), int(offsets[keep].max())
        if left < 0 or right < 0:
            continue
        if torch.equal(keep, (offsets >= -left) & (offsets <= right)):
            return kind, (left, right)
    return None


def _leading_dims_broadcast(mask: torch.Tensor, scores: torch.Tensor, expanded: bool) -> bool:
    """The mask's leading dims are 1 or, with ``expanded``, the scores' own (aligned from the right)."""
    if expanded:
        return fxn.broadcasts_into(mask.shape[:-2], scores.shape[:-2])
    return all(statically_known_true(n == 1) for n in mask.shape[:-2])


def _evaluated_kind(mask: fx.Node) -> Optional[str]:
    """The kind of a mask that reads no graph input and has static sizes (HSTU builds its causal mask from
    ``arange``, ``eye``, comparisons and ``logical_or``): every call of this graph computes the same value, so
    the value is computed here and read as ``_triangle_kind`` reads a buffer's."""
    value = constant_value(mask)
    return _triangle_kind(value) if value is not None and value.dim() >= 2 else None


def constant_value(node: fx.Node) -> Optional[torch.Tensor]:
    """The value of ``node`` when it is computed from constants alone: no graph input, no random or uninitialized
    values, static sizes of at most ``MAX_EVALUATED_ELEMENTS`` elements; else None. A tensor read only for its
    shape (``m.expand_as(s)``, ``torch.ones_like(s)``) counts as its shape."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    needed, shaped = set(), {}
    stack = [node]
    while stack:
        cur = stack.pop()
        if cur in needed:
            continue
        if cur.op not in ("call_function", "call_method"):
            return None
        name = cur.target if isinstance(cur.target, str) else getattr(cur.target, "__name__", str(cur.target))
        if any(word in name for word in _NONDETERMINISTIC):
            return None
        ev = fxn.example(cur)
        if isinstance(ev, torch.Tensor):
            if not _static_and_small(ev):
                return None
        elif not isinstance(ev, (int, float, bool, tuple)) or isinstance(ev, torch.SymInt):
            return None
        needed.add(cur)
        for inp in cur.all_input_nodes:
            if fxn.reads_only_shape_of(cur, inp):
                shape_of = fxn.example(inp)
                if not isinstance(shape_of, torch.Tensor) or not _static_and_small(shape_of):
                    return None
                shaped[inp] = shape_of
            else:
                stack.append(inp)
    values: dict[fx.Node, object] = {}
    try:
        with unset_fake_temporarily(), torch.no_grad():
            for inp, like in shaped.items():
                if inp not in needed:
                    values[inp] = torch.empty(tuple(like.shape), dtype=like.dtype, device=like.device)
            for cur in (n for n in node.graph.nodes if n in needed):  # graph order: inputs before their users
                values[cur] = fxn.call_node(cur, fx.node.map_arg(cur.args, values.__getitem__),
                                            fx.node.map_arg(cur.kwargs, values.__getitem__))
    except Exception:  # noqa: BLE001  (a subgraph that cannot be evaluated proves nothing)
        return None
    value = values[node]
    return value if isinstance(value, torch.Tensor) else None


def _static_and_small(value: torch.Tensor) -> bool:
    return all(type(n) is int for n in value.shape) and value.numel() <= MAX_EVALUATED_ELEMENTS


def _one_minus_operand(node: fx.Node) -> Optional[fx.Node]:
    """x when ``node`` is ``1 - x``: ``operator.sub(1, x)``, ``torch.sub(1, x)``, ``torch.rsub(x, 1)``,
    ``x.__rsub__(1)``; else None. (With x a {0, 1} mask, 1 - x is its complement.)"""
    if len(node.args) != 2 or node.kwargs:
        return None
    if fxn.fn_or_method(node, (operator.sub, torch.sub)) and node.args[0] == 1:
        return node.args[1] if isinstance(node.args[1], fx.Node) else None
    if fxn.fn_or_method(node, (torch.rsub,), ("__rsub__", "rsub")) and node.args[1] == 1:
        return node.args[0] if isinstance(node.args[0], fx.Node) else None
    return None


def _only_adds_leading_dims(node: fx.Node) -> bool:
    """x[None, None] / x[None, None, :, :]: new leading dims only (the last two stay whole)."""
    index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    return any(i is None for i in index) and all(i is None or i == slice(None) for i in index)


def _is_ones(node) -> bool:
    return isinstance(node, fx.Node) and fxn.fn_or_method(node, (torch.ones, torch.ones_like), ())


def _buffer_value(node: fx.Node) -> Optional[torch.Tensor]:
    """The value the pass recorded for a graph input (``fxn.real_value``: module state, the caller's float tensors)
    or of a get_attr, else None. A parameter's value changes as it trains: never taken as a mask's."""
    value = fxn.real_value(node)
    if value is None and node.op == "get_attr":
        value = _get_attr(node)
    if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter) or value.dim() < 2:
        return None
    return value


def _triangle_kind(value: torch.Tensor) -> Optional[str]:
    """"keep" for a lower-triangular {0, 1} square (tril of ones), "drop" for its complement (triu(ones, 1)),
    the same square in every leading index."""
    squares = value.reshape(-1, *value.shape[-2:])
    square = squares[0]
    if square.shape[-1] != square.shape[-2] or (squares != square).any() or not ((square == 0) | (square == 1)).all():
        return None
    tril = torch.ones_like(square, dtype=torch.bool).tril()
    if torch.equal(square != 0, tril):
        return "keep"
    if torch.equal(square != 0, ~tril):
        return "drop"
    return None


def _top_left_slice(index) -> bool:
    """x[:a, :b] / x[..., :a, :b] / x[0, :a, :b]: a top-left corner of the last two dims, which keeps a causal
    (top-left aligned) mask causal."""
    index = index if isinstance(index, tuple) else (index,)
    if len(index) < 2:
        return False
    for i in index[:-2]:
        if not (isinstance(i, slice) and i == slice(None, None, None)) and i != 0:
            return False
    return all(isinstance(s, slice) and s.start in (None, 0) and s.step in (None, 1) for s in index[-2:])


def _get_attr(node: fx.Node):
    obj = node.graph.owning_module
    for part in node.target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _arange_axis(node) -> Optional[str]:
    """'row' for arange(n)[:, None] (or .unsqueeze(-1)/.view(-1, 1)), 'col' for arange(n)[None, :] or arange(n)."""
    ev = fxn.example(node)
    src = node
    while isinstance(src, fx.Node) and not fxn.fn_or_method(src, (torch.arange,), ()):
        if src.op == "call_function" and src.target is operator.getitem or fxn.fn_or_method(
            src, (torch.unsqueeze,), ("unsqueeze", "view", "reshape")
        ):
            src = src.args[0]
        else:
            return None
    if not isinstance(src, fx.Node):
        return None
    args = dict(zip(("start", "end", "step") if len(src.args) > 1 else ("end",), src.args))
    if set(args) & set(src.kwargs):
        return None
    args.update(src.kwargs)
    if args.get("start", 0) != 0 or args.get("step", 1) != 1 or not isinstance(ev, torch.Tensor):
        return None
    if ev.dim() == 1:
        return "col"
    if ev.dim() == 2 and statically_known_true(ev.shape[1] == 1):
        return "row"
    if ev.dim() == 2 and statically_known_true(ev.shape[0] == 1):
        return "col"
    return None


_COMPARE = {operator.ge: "ge", operator.le: "le", operator.gt: "gt", operator.lt: "lt",
            torch.ge: "ge", torch.le: "le", torch.gt: "gt", torch.lt: "lt"}


def _arange_compare_kind(node: fx.Node) -> Optional[str]:
    op = _COMPARE.get(node.target) if node.op == "call_function" else (
        fxn.method_name(node) if fxn.method_name(node) in ("ge", "le", "gt", "lt") else None
    )
    if op is None:
        return None
    a, b = _arange_axis(node.args[0]), _arange_axis(node.args[1])
    # keep j <= i: row >= col, col <= row; drop j > i: row < col, col > row
    table = {("row", "col", "ge"): "keep", ("col", "row", "le"): "keep",
             ("row", "col", "lt"): "drop", ("col", "row", "gt"): "drop"}
    return table.get((a, b, op))
