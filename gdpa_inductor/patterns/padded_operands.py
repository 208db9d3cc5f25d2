"""Proving that the operands are a padded batch, so that the padding costs nothing.

Jagged rows padded to ``[B, N, ...]`` (fbgemm's ``jagged_to_padded_dense`` as HSTU's reference calls it, or any
pure-torch spelling of it) are exactly zero past each sample's length. Where K and V are, a padded key adds
``act(.) * 0 = 0`` to every output, so the op may skip it; where Q is too, a padded query row's scores are 0 and
the op writes zeros there, which ``equivalence.py`` checks the graph gives as well. Gradients at padded rows do
not matter: the padding is constant there, so nothing upstream receives them.

Established by evaluation, not by reading the spelling: each operand's subgraph is computed from drawn lengths
(as offsets ``[B + 1]`` or lengths ``[B]``, whichever integer tensor of the graph it reads) and random values for
everything else, and its rows past each drawn length must be exactly zero, for each draw. The drawn lengths add up
to the jagged rows the real offsets describe, and the evaluation runs on the CPU, so that a spelling that indexes
with them stays in range, or raises, and never faults a GPU.
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
    rows_unread: bool = False  # nothing reads the block's output past the lengths (it is unpadded to jagged rows)
    # For Q, K and V: the node holding the jagged rows the operand pads (``jagged_rows``), else None.
    jagged: tuple[Optional[fx.Node], Optional[fx.Node], Optional[fx.Node]] = (None, None, None)


def padded_lengths(q, k, v, out: Optional[fx.Node] = None) -> Optional[PaddedLengths]:
    """The lengths past which K and V (and Q, when ``rows``) are provably zero; ``q``, ``k``, ``v`` are the
    match's operand plans, read in the op's [B, H, N, D] layout, ``out`` the block's output in that layout (then
    ``rows_unread`` says whether what follows it reads its rows past the lengths)."""
    evs = [x.example() for x in (q, k, v)]
    if not all(isinstance(e, torch.Tensor) and e.dim() == 4 for e in evs):
        return None
    b, n = evs[1].shape[0], evs[1].shape[-2]
    if not (statically_known_true(evs[2].shape[0] == b) and statically_known_true(evs[2].shape[-2] == n)):
        return None
    for source, offsets in _candidates(k.node, b):
        budget = _jagged_rows(k.node, b, source, offsets)
        try:
            with concrete_mode():
                if not (_zero_past(k, source, offsets, n, budget) and _zero_past(v, source, offsets, n, budget)):
                    continue
                rows = (statically_known_true(evs[0].shape[0] == b) and statically_known_true(evs[0].shape[-2] == n)
                        and _zero_past(q, source, offsets, n, budget))
                unread = rows and out is not None and _rows_unread(out, source, offsets, n, budget)
        except Exception:  # noqa: BLE001  (a subgraph that cannot be evaluated proves nothing)
            continue
        jagged = (jagged_rows(q, source, offsets, n, budget) if rows else None,
                  jagged_rows(k, source, offsets, n, budget), jagged_rows(v, source, offsets, n, budget))
        return PaddedLengths(source, offsets, rows, True, unread, jagged)
    return None


def jagged_rows(plan, source: fx.Node, offsets: bool, n, budget: Optional[int]) -> Optional[fx.Node]:
    """The node X ``[L, ...]`` whose rows the operand pads, when it is exactly that: evaluated with X random (the only
    value the subgraph draws) and drawn lengths, the operand's position i < min(length, N) of sample b, as its
    ``[H, D]``, equals row ``offsets[b] + i`` of X, for each draw, one of them with samples longer than N (which the
    padding cuts to N). The fused op may then read X and the offsets in place of the padded copy."""
    if budget is None:
        return None
    n = hint(n)
    example = plan.example()
    batch, heads, dim = hint(example.shape[0]), hint(example.shape[1]), hint(example.shape[-1])
    found = None
    try:
        with concrete_mode():
            for draw in range(DRAWS + 1):
                lengths = draw_lengths(batch, n, seed=draw, budget=budget, longest=2 * n if draw == DRAWS else n)
                evaluation = _Evaluation(plan.node, source, _as_source(lengths, offsets, fxn.example(source)))
                value = evaluation.run()
                drawn = [x for x, val in evaluation.values.items() if x not in evaluation.depends
                         and isinstance(val, torch.Tensor) and val.is_floating_point()]
                if len(drawn) != 1 or (found is not None and drawn[0] is not found):
                    return None
                found = drawn[0]
                values = evaluation.values[found]
                if values.dim() == 0 or values[0].numel() != heads * dim or values.dtype != example.dtype:
                    return None
                if plan.permute is not None:
                    value = value.permute(plan.permute)
                if plan.transpose_last:
                    value = value.transpose(-2, -1)
                starts = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
                kept = lengths.clamp(max=n)
                pos = torch.arange(n)[None, :]
                valid = pos < kept[:, None]
                rows = (starts[:, None] + pos)[valid]
                if int(starts[-1] + lengths[-1]) > values.shape[0]:
                    return None
                want = values.reshape(values.shape[0], heads, dim)[rows]
                if not torch.equal(value.transpose(1, 2)[valid], want):
                    return None
    except Exception:  # noqa: BLE001  (a subgraph that cannot be evaluated proves nothing)
        return None
    return found


# Nodes followed from the block's output to the one that drops its padded rows (views, a transpose, the unpad).
MAX_UNPAD_STEPS = 6


def _rows_unread(out: fx.Node, source: fx.Node, offsets: bool, n, budget: Optional[int]) -> bool:
    """Whether the block's output ``out`` [B, H, N, Dv] reaches the rest of the graph only through a node whose value
    does not change when the output's rows past the lengths do (the jagged rows gathered back from the padded batch):
    along ``out``'s chain of single users, each node evaluated with those rows zero and random, for each draw."""
    ev = fxn.example(out)
    if not isinstance(ev, torch.Tensor) or ev.dim() != 4:
        return False
    chain, cur = [], out
    while len(chain) < MAX_UNPAD_STEPS and len(cur.users) == 1:
        cur = next(iter(cur.users))
        chain.append(cur)
    pairs = [_padding_variants(out, ev, source, offsets, hint(n), budget, draw) for draw in range(DRAWS)]
    for node in chain:
        try:
            values = [(zero.evaluate(node), noisy.evaluate(node)) for zero, noisy in pairs]
        except Exception:  # noqa: BLE001  (a consumer that cannot be evaluated reads the padding, as far as we know)
            return False
        if all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
               and torch.equal(a, b) for a, b in values):
            return True
    return False


def _padding_variants(out: fx.Node, ev: torch.Tensor, source: fx.Node, offsets: bool, n: int,
                      budget: Optional[int], draw: int) -> tuple[_Evaluation, _Evaluation]:
    """Two evaluations of what follows ``out`` for one draw of the lengths: its rows past them zero, or not."""
    b, h, _, dv = hint(ev.shape)
    lengths = draw_lengths(b, n, seed=draw, budget=budget)
    gen = torch.Generator().manual_seed(11 + draw)
    past = (torch.arange(n)[None, :] >= lengths[:, None])[:, None, :, None]
    # rank-one values (cheap at full size), distinct along every axis
    kept = torch.randn(b, 1, n, 1, generator=gen) * torch.randn(1, h, 1, dv, generator=gen)
    noise = torch.randn(b, 1, n, 1, generator=gen).abs() + 1.0
    source_value = _as_source(lengths, offsets, fxn.example(source))
    variants = []
    for padding in (torch.zeros(()), noise):
        evaluation = _Evaluation(out, source, source_value)
        evaluation.values[out] = torch.where(past, padding, kept).to(ev.dtype)
        variants.append(evaluation)
    return variants[0], variants[1]


def _jagged_rows(node: fx.Node, b, source: fx.Node, offsets: bool) -> Optional[int]:
    """What the drawn lengths add up to, as real offsets end at the last jagged row: the rows the source's real value
    describes (a graph input's, recorded by the pass), else the fewest rows of a floating input the operand reads
    that is not batch-major (the jagged values [L, ...] or a weight: at most L, so that no drawn offset passes the
    values); None when neither is known."""
    real = source.meta.get(fxn.REAL_ROWS)
    if real is not None:
        return real[0] if offsets else real[1]
    rows = [hint(fxn.example(cur).shape[0]) for cur in _upstream(node, values_only=True)
            if cur.op in ("placeholder", "get_attr") and fxn.is_tensor_node(cur)
            and fxn.example(cur).is_floating_point() and fxn.example(cur).dim() >= 1
            and not statically_known_true(fxn.example(cur).shape[0] == b)]
    return min(rows) if rows else None


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


def _zero_past(plan, source: fx.Node, offsets: bool, n, budget: Optional[int]) -> bool:
    n = hint(n)
    batch = hint(plan.example().shape[0])
    for draw in range(DRAWS):
        lengths = draw_lengths(batch, n, seed=draw, budget=budget)
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


def draw_lengths(batch: int, n: int, seed: int, budget: Optional[int] = None,
                 longest: Optional[int] = None) -> torch.Tensor:
    """Per-sample lengths in [0, n], with an empty and a full sample and some in between; with a ``budget`` (the
    jagged rows), adding up to it where they can (the last samples filled first, the first kept empty), so that
    offsets end at the last row as real ones do. ``longest`` (above n) draws samples longer than the padding too."""
    gen = torch.Generator().manual_seed(seed)
    top = n if longest is None else longest
    lengths = torch.randint(0, top + 1, (batch,), generator=gen)
    first = 1 if batch >= 2 else 0
    if batch >= 2:
        lengths[0], lengths[-1] = 0, top
    if batch >= 3:
        lengths[1] = max(1, n // 2) if n >= 2 else 0
    if budget is not None:
        target = min(budget, (batch - first) * top)
        total = int(lengths.sum())
        if total > target:
            lengths = lengths * target // total
        deficit = target - int(lengths.sum())
        for i in reversed(range(first, batch)):
            add = min(top - int(lengths[i]), deficit)
            lengths[i] += add
            deficit -= add
    return lengths


def _as_source(lengths: torch.Tensor, offsets: bool, ev: torch.Tensor) -> torch.Tensor:
    value = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]) if offsets else lengths
    return value.to(dtype=ev.dtype)


_CPU = torch.device("cpu")


def _on_cpu(x: Any) -> Any:
    return _CPU if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("cuda")) else x


class _Evaluation:
    """The operand's value with ``source`` set: floating values that do not depend on it are drawn at random, the
    rest computed with the graph's own targets. On the CPU, whatever device the graph names: an index a drawn value
    puts out of range raises there, where on a GPU it would end the process's CUDA context."""

    def __init__(self, operand: fx.Node, source: fx.Node, source_value: torch.Tensor):
        self.operand, self.source = operand, source
        self.values: dict[fx.Node, Any] = {source: source_value}
        order = {n: i for i, n in enumerate(operand.graph.nodes)}
        self.depends = {source}
        for cur in sorted(_upstream(operand), key=order.__getitem__):
            if any(a in self.depends for a in cur.all_input_nodes):
                self.depends.add(cur)
        self.gen = torch.Generator().manual_seed(7)

    def evaluate(self, node: fx.Node) -> Any:
        """``node``'s value, reusing what earlier evaluations computed (its upstream must be ``operand``'s or
        follow from it)."""
        order = {n: i for i, n in enumerate(node.graph.nodes)}
        for cur in sorted(_upstream(node), key=order.__getitem__):
            if any(a in self.depends for a in cur.all_input_nodes):
                self.depends.add(cur)
        self.operand = node
        return self.run()

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
            return torch.randn(shape, generator=self.gen).to(dtype=ev.dtype)
        if node.op in ("placeholder", "get_attr"):
            raise Unprovable(f"{node.name}: a non-floating input other than the lengths")
        if node.op == "call_method" and node.target == "cuda":
            return self.values[node.args[0]]
        args = fx.node.map_aggregate(fx.node.map_arg(node.args, self.values.__getitem__), _on_cpu)
        kwargs = fx.node.map_aggregate(fx.node.map_arg(node.kwargs, self.values.__getitem__), _on_cpu)
        value = fxn.call_node(node, args, kwargs)
        if isinstance(value, torch.Tensor) and value.device != _CPU:
            raise Unprovable(f"{node.name} left the CPU")
        return value


def _numel(shape) -> int:
    total = 1
    for s in shape:
        total *= int(s)
    return total
