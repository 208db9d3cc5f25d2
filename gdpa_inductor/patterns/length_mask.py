"""Proving that a padding mask is a length mask, so that padded rows and columns cost nothing.

A padded batch (HSTU's reference: jagged data padded to N) masks with ``valid = arange(N) < lengths[:, None]``,
broadcast to the scores as a key mask (``valid[:, None, None, :]``) or a query-and-key mask
(``valid[:, None, :, None] & valid[:, None, None, :]``). Such a mask keeps exactly the first
``clamp(lengths[b], 0, N)`` rows and/or columns of sample b, which the varlen op reads as per-sample valid
lengths (``seqused``) and skips the rest. Only structural forms are accepted: ``arange`` compared with ``<``
(or ``>`` reversed) against a 1-D integer tensor, dims added by ``unsqueeze``/``None`` indexing/``expand``,
conjunctions by ``&``/``logical_and``, and ``~``/``logical_not`` for the fill (drop) form. Axes are tracked
from the end, which is how broadcasting aligns them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import fx_nodes as fxn


@dataclass(frozen=True)
class LengthMask:
    lengths: fx.Node  # a 1-D integer tensor of the batch's valid lengths (offsets [B + 1] when ``offsets``)
    rows: bool  # masks query rows past the length
    cols: bool  # masks key columns past the length
    # Set when the lengths come from zero-padded operands (``padded_operands.py``), not from a mask: the block's
    # masks then stay in the op's bias.
    from_padding: bool = False
    offsets: bool = False
    rows_unread: bool = False  # nothing reads the block's output in the padded query rows
    # From padding: the nodes holding Q's, K's and V's jagged rows (``padded_operands.jagged_rows``), else None.
    jagged: tuple = (None, None, None)


@dataclass(frozen=True)
class _Atom:
    """True where the index along ``pos_axis`` is below ``lengths[index along batch_axis]``."""

    lengths: fx.Node
    pos_axis: int  # negative: from the end
    batch_axis: int
    span: object  # the arange's length (int or SymInt)


def length_mask(mask: fx.Node, keep_form: bool, scores: torch.Tensor) -> Optional[LengthMask]:
    """The length mask ``mask`` is (keep form: True keeps; fill form: True drops), for scores
    ``[B, H, Nq, Nk]``; None when it is not provably one."""
    if scores.dim() != 4:
        return None
    node = mask if keep_form else _negated(mask)
    atoms = _atoms(node) if node is not None else None
    if not atoms or len({a.lengths for a in atoms}) != 1:
        return None
    lengths = atoms[0].lengths
    b, nq, nk = scores.shape[0], scores.shape[-2], scores.shape[-1]
    if not statically_known_true(fxn.example(lengths).shape[0] == b):
        return None
    rows = cols = False
    for a in atoms:
        if a.batch_axis != -4:
            return None
        if a.pos_axis == -2 and statically_known_true(a.span == nq):
            rows = True
        elif a.pos_axis == -1 and statically_known_true(a.span == nk):
            cols = True
        else:
            return None
    if rows and not statically_known_true(nq == nk):
        return None
    return LengthMask(lengths, rows, cols)


def _negated(node: fx.Node) -> Optional[fx.Node]:
    if fxn.fn_or_method(node, (operator.invert, torch.logical_not), ("logical_not", "__invert__")):
        return node.args[0]
    return None


def _atoms(node) -> Optional[list[_Atom]]:
    if not fxn.is_tensor_node(node):
        return None
    if fxn.fn_or_method(node, (operator.and_, torch.logical_and, torch.bitwise_and),
                        ("logical_and", "bitwise_and", "__and__")):
        left, right = _atoms(node.args[0]), _atoms(node.args[1])
        return left + right if left is not None and right is not None else None
    if fxn.fn_or_method(node, (operator.lt, torch.lt), ("lt",)):
        return _comparison(node.args[0], node.args[1])
    if fxn.fn_or_method(node, (operator.gt, torch.gt), ("gt",)):
        return _comparison(node.args[1], node.args[0])
    moved = _moved_axes(node)
    if moved is not None:
        source, move = moved
        inner = _atoms(source)
        if inner is None:
            return None
        out = []
        for a in inner:
            pos, batch = move(a.pos_axis), move(a.batch_axis)
            if pos is None or batch is None:
                return None
            out.append(_Atom(a.lengths, pos, batch, a.span))
        return out
    return None


def _comparison(small, large) -> Optional[list[_Atom]]:
    """``small < large`` with small an arange along one axis and large a 1-D integer tensor along another."""
    position = _axis_of(small, _arange_span)
    batch = _axis_of(large, _lengths_vector)
    if position is None or batch is None or position[1] == batch[1]:
        return None
    (span, pos_axis), (lengths, batch_axis) = position, batch
    return [_Atom(lengths, pos_axis, batch_axis, span)]


def _arange_span(node):
    """n for ``torch.arange(n)`` / ``torch.arange(0, n)`` (step 1), else None."""
    if not (node.op == "call_function" and node.target is torch.arange):
        return None
    args = node.args
    if "step" in node.kwargs or "start" in node.kwargs or len(args) > 2:
        return None
    if len(args) == 2:
        if args[0] != 0:
            return None
        args = args[1:]
    n = args[0] if args else node.kwargs.get("end")
    return fxn.example(n) if isinstance(n, fx.Node) else n


def _lengths_vector(node):
    ev = fxn.example(node)
    if isinstance(ev, torch.Tensor) and ev.dim() == 1 and not ev.dtype.is_floating_point and ev.dtype != torch.bool:
        return node
    return None


def _axis_of(node, base):
    """(base value, axis from the end) for a 1-D ``base`` node with size-1 dims added around it."""
    value = base(node) if isinstance(node, fx.Node) else None
    if value is not None:
        return value, -1
    if not isinstance(node, fx.Node):
        return None
    moved = _moved_axes(node)
    if moved is None:
        return None
    source, move = moved
    inner = _axis_of(source, base)
    if inner is None:
        return None
    axis = move(inner[1])
    return None if axis is None else (inner[0], axis)


def _moved_axes(node: fx.Node):
    """(source, axis map) for ops that only add size-1 dims, broadcast or cast: an axis of the source
    (negative) maps to the output's (or None when it cannot be followed)."""
    if not fxn.is_tensor_node(node):
        return None
    src = node.args[0] if node.args else None
    if not fxn.is_tensor_node(src):
        return None
    rank_in, rank_out = fxn.example(src).dim(), fxn.example(node).dim()
    if fxn.fn_or_method(node, (), ("bool", "contiguous", "clone")) or (
        fxn.fn_or_method(node, (), ("to",)) and fxn.example(node).dtype in (torch.bool, *_INT_DTYPES)
    ):
        return src, lambda a: a
    if fxn.fn_or_method(node, (), ("expand",)) or fxn.fn_or_method(node, (torch.broadcast_to,), ("expand_as",)):
        return src, lambda a: a  # broadcasting keeps axes counted from the end
    if fxn.fn_or_method(node, (torch.unsqueeze,), ("unsqueeze",)):
        d = fxn.arg(node, 1, "dim")
        d = d if d >= 0 else d + rank_out
        return src, lambda a: _shift(a, rank_in, rank_out, [d])
    if node.op == "call_function" and node.target is operator.getitem:
        inserted = _none_positions(node.args[1], rank_in)
        if inserted is None:
            return None
        return src, lambda a: _shift(a, rank_in, rank_out, inserted)
    return None


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _shift(axis: int, rank_in: int, rank_out: int, inserted: list[int]) -> Optional[int]:
    """Axis (negative, of the input) after size-1 dims were inserted at output positions ``inserted``."""
    kept = [p for p in range(rank_out) if p not in inserted]
    if len(kept) != rank_in:
        return None
    return kept[axis + rank_in] - rank_out


def _none_positions(index, rank_in: int) -> Optional[list[int]]:
    """Output positions of the None entries of an index made of None, full slices and one Ellipsis."""
    items = index if isinstance(index, tuple) else (index,)
    full = slice(None, None, None)
    if not all(i is None or i == full or i is Ellipsis for i in items) or sum(i is Ellipsis for i in items) > 1:
        return None
    consumed = sum(i == full for i in items if i is not None and i is not Ellipsis)
    if consumed > rank_in:
        return None
    positions, p = [], 0
    for i in items:
        if i is None:
            positions.append(p)
            p += 1
        elif i is Ellipsis:
            p += rank_in - consumed
        else:
            p += 1
    return positions
