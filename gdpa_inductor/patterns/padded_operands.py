"""Proving that the operands are a padded batch, so that the padding costs nothing.

Jagged rows padded to ``[B, N, ...]`` (fbgemm's ``jagged_to_padded_dense`` as HSTU's reference calls it, or any
pure-torch spelling of it) are exactly zero past each sample's length. Where K and V are, a padded key adds
``act(.) * 0 = 0`` to every output, so the op may skip it; where Q is too, a padded query row's scores are 0 and
the op writes zeros there, which ``equivalence.py`` checks the graph gives as well. Gradients at padded rows do
not matter: the padding is constant there, so nothing upstream receives them.

Established by evaluation, not by reading the spelling: each operand's subgraph is computed from drawn lengths
(as offsets ``[B + 1]`` or lengths ``[B]``, whichever integer tensor of the graph it reads) and random values for
everything else, and its rows past each drawn length must be exactly zero, for each draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import fx_nodes as fxn
from .causal_mask import _upstream
from .equivalence import MAX_VALUE_BYTES, Unprovable, concrete_mode, hint

# Integer tensors tried as the source of the lengths, nearest the graph's inputs first.
MAX_CANDIDATES = 4
DRAWS = 2


@dataclass(frozen=True)
class PaddedLengths:
    source: fx.Node  # a 1-D integer tensor: offsets [B + 1] or lengths [B]
    offsets: bool
    rows: bool  # Q is zero past the lengths
    cols: bool  # K and V are


def padded_lengths(q, k, v) -> Optional[PaddedLengths]:
    """The lengths past which K and V (and Q, when ``rows``) are provably zero; ``q``, ``k``, ``v`` are the
    match's operand plans, read in the op's [B, H, N, D] layout."""
    evs = [x.example() for x in (q, k, v)]
    if not all(isinstance(e, torch.Tensor) and e.dim() == 4 for e in evs):
        return None
    b, n = evs[1].shape[0], evs[1].shape[-2]
    if not (statically_known_true(evs[2].shape[0] == b) and statically_known_true(evs[2].shape[-2] == n)):
        return None
    for source, offsets in _candidates(k.node, b):
        try:
            with concrete_mode():
                if not (_zero_past(k, source, offsets, n) and _zero_past(v, source, offsets, n)):
                    continue
                rows = (statically_known_true(evs[0].shape[0] == b) and statically_known_true(evs[0].shape[-2] == n)
                        and _zero_past(q, source, offsets, n))
        except Exception:  # noqa: BLE001  (a subgraph that cannot be evaluated proves nothing)
            continue
        return PaddedLengths(source, offsets, rows, True)
    return None


def _candidates(node: fx.Node, b) -> list[tuple[fx.Node, bool]]:
    found = []
    for cur in _upstream(node, values_only=True):
        ev = fxn.example(cur)
        if not (isinstance(ev, torch.Tensor) and ev.dim() == 1 and not ev.dtype.is_floating_point
                and ev.dtype != torch.bool and not ev.dtype.is_complex):
            continue
        if statically_known_true(ev.shape[0] == b + 1):
            found.append((cur, True))
        elif statically_known_true(ev.shape[0] == b):
            found.append((cur, False))
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    found.sort(key=lambda c: order.get(c[0], 0))
    return found[:MAX_CANDIDATES]


def _zero_past(plan, source: fx.Node, offsets: bool, n) -> bool:
    n = hint(n)
    batch = hint(plan.example().shape[0])
    for draw in range(DRAWS):
        lengths = draw_lengths(batch, n, seed=draw)
        value = _Evaluation(plan.node, source, _as_source(lengths, offsets, fxn.example(source))).run()
        if plan.permute is not None:
            value = value.permute(plan.permute)
        if plan.transpose_last:
            value = value.transpose(-2, -1)
        past = torch.arange(n, device=value.device)[None, :] >= lengths.to(value.device)[:, None]
        rows = value.transpose(1, 2)[past]
        if rows.numel() == 0 or bool((rows != 0).any()):
            return False
    return True


def draw_lengths(batch: int, n: int, seed: int) -> torch.Tensor:
    """Per-sample lengths in [0, n], with an empty and a full sample and some in between."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, n + 1, (batch,), generator=gen)
    if batch >= 2:
        lengths[0], lengths[-1] = 0, n
    if batch >= 3:
        lengths[1] = max(1, n // 2) if n >= 2 else 0
    return lengths


def _as_source(lengths: torch.Tensor, offsets: bool, ev: torch.Tensor) -> torch.Tensor:
    value = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]) if offsets else lengths
    return value.to(device=ev.device, dtype=ev.dtype)


class _Evaluation:
    """The operand's value with ``source`` set: floating values that do not depend on it are drawn at random, the
    rest computed with the graph's own targets."""

    def __init__(self, operand: fx.Node, source: fx.Node, source_value: torch.Tensor):
        self.operand, self.source = operand, source
        self.values: dict[fx.Node, Any] = {source: source_value}
        order = {n: i for i, n in enumerate(operand.graph.nodes)}
        self.depends = {source}
        for cur in sorted(_upstream(operand), key=order.__getitem__):
            if any(a in self.depends for a in cur.all_input_nodes):
                self.depends.add(cur)
        self.gen = torch.Generator().manual_seed(7)

    def run(self) -> torch.Tensor:
        stack = [self.operand]
        while stack:  # post-order without recursion
            cur = stack[-1]
            if cur in self.values:
                stack.pop()
                continue
            pending = [] if self._leaf(cur) else [a for a in cur.all_input_nodes if a not in self.values]
            if pending:
                stack.extend(pending)
                continue
            self.values[cur] = self._value(cur)
            stack.pop()
        return self.values[self.operand]

    def _leaf(self, node: fx.Node) -> bool:
        ev = fxn.example(node)
        return node.op in ("placeholder", "get_attr") or not isinstance(ev, torch.Tensor) or (
            ev.dtype.is_floating_point and node not in self.depends)

    def _value(self, node: fx.Node) -> Any:
        ev = fxn.example(node)
        if not isinstance(ev, torch.Tensor):
            if ev is None:
                raise Unprovable(f"{node.name}: no example value")
            return hint(ev)
        shape = hint(ev.shape)
        if ev.element_size() * _numel(shape) > MAX_VALUE_BYTES:
            raise Unprovable(f"{node.name} is too large to evaluate")
        if ev.dtype.is_floating_point and node not in self.depends:
            return torch.randn(shape, generator=self.gen).to(device=ev.device, dtype=ev.dtype)
        if node.op in ("placeholder", "get_attr"):
            raise Unprovable(f"{node.name}: a non-floating input other than the lengths")
        args = fx.node.map_arg(node.args, self.values.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, self.values.__getitem__)
        return fxn.call_node(node, args, kwargs)


def _numel(shape) -> int:
    total = 1
    for s in shape:
        total *= int(s)
    return total
