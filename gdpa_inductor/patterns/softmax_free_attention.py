"""``SoftmaxFreeAttention``: O = act(scale · Q Kᵀ + bias) · post_scale · V, however the model writes it.

Anchored on the second matmul (``P @ V``), it walks back through the elementwise chain (``chain.py``) to
the first (``S = Q @ Kᵀ``). Both matmuls may be ``@``/``torch.matmul``/``Tensor.matmul``/``torch.bmm``
(heads folded into the batch) or a two-operand ``torch.einsum`` with heads inside the equation. The
operands are described as plans (a node, optionally permuted or with its last two dims swapped), so the
rewrite inserts only views. Self and cross attention, HSTU-style silu attention, sigmoid attention, PMA
(a batch-1 seed query broadcast by the matmul) and PFFN (per-sample weights through bmm/einsum) are all
this one pattern; the kind is only reported. FFNs whose weights are shared by the batch are not GDPA and
are left to Inductor's GEMMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..lowering.dispatch import TRITON_MAX_HEAD_DIM
from . import fx_nodes as fxn
from .causal_mask import _upstream, buffers_read
from .chain import ChainMismatch, ChainRecipe, _chain_input, read_chain
from .equivalence import check_equivalent
from .length_mask import LengthMask, length_mask
from .mutation import changed_during, stale_readers
from .padded_operands import padded_lengths

FUSABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The reason given for a matmul with no matmul feeding it through an elementwise chain (most matmuls).
NO_PAIR = "no matmul feeds it through an elementwise chain"
MAX_CHAIN = 24


@dataclass
class OperandPlan:
    node: fx.Node
    permute: Optional[list[int]] = None
    transpose_last: bool = False
    # a size-1 heads dim inserted at -3 (after the permutation): K and V without one, shared by the heads (MQA)
    shared_heads: bool = False

    def example(self) -> torch.Tensor:
        t = fxn.example(self.node)
        if self.permute is not None:
            t = t.permute(self.permute)
        if self.shared_heads:
            t = t.unsqueeze(-3)
        return t.transpose(-2, -1) if self.transpose_last else t

    @property
    def as_written(self) -> bool:
        """The node is the operand as the op reads it, up to a permutation or a transpose."""
        return not self.shared_heads


@dataclass
class GdpaMatch:
    pattern: str
    outer: fx.Node
    scores: fx.Node
    recipe: ChainRecipe
    q: OperandPlan
    k: OperandPlan
    v: OperandPlan
    out_permute: Optional[list[int]] = None
    kind: str = "attention"
    notes: list[str] = field(default_factory=list)
    # Set when every mask is a padding length mask: the rewrite then uses the varlen op with per-sample
    # valid lengths (padding skipped) instead of a dense -finfo.max bias.
    lengths: Optional[LengthMask] = None
    # Set when the causal flag was proven from the value of a module buffer or of a float graph input: (mask, True
    # if it marks the kept entries, that input). The rewrite passes both to an op that checks it when it runs.
    buffer_mask: Optional[tuple[fx.Node, bool, fx.Node]] = None

    @property
    def compute_dtype(self) -> torch.dtype:
        return fxn.example(self.scores).dtype

    def describe(self) -> dict:
        q, k, v = self.q.example(), self.k.example(), self.v.example()
        r = self.recipe
        return dict(
            kind=self.kind, activation=r.activation, q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
            dtype=str(self.compute_dtype).replace("torch.", ""), scale=r.scale, post_scale=r.post_scale,
            scale_factors=len(r.pre_factors), post_factors=len(r.post_factors), key_factors=len(r.key_factors),
            bias=len([t for t in r.bias_terms if isinstance(t[0], fx.Node)]) > 0 or any(
                not isinstance(t[0], fx.Node) for t in r.bias_terms), mask=self._mask_note(),
        )

    def _mask_note(self) -> str:
        if self.buffer_mask is not None and self.lengths is None:
            source = self.buffer_mask[2]
            what = "buffer" if fxn.is_module_state(source) else "graph input"
            return f"{self.recipe.mask_note}, read from {what} {source.name}: checked when it runs"
        window = f"band {self.recipe.window} + " if self.recipe.window is not None else ""
        if self.lengths is None:
            return f"{self.recipe.mask_note} (varlen op's window)" if window else self.recipe.mask_note
        skipped = " and ".join(w for w, on in (("query rows", self.lengths.rows), ("key columns", self.lengths.cols))
                               if on)
        causal = "causal + " if self.recipe.causal else ""
        if self.lengths.from_padding:
            source = f"{'offsets' if self.lengths.offsets else 'lengths'} {self.lengths.lengths.name}"
            masks = "" if self.recipe.mask_note == "none" else f"{self.recipe.mask_note}; "
            unread = " (their outputs unread)" if self.lengths.rows_unread else ""
            read = [name for name, x in zip("QKV", self.lengths.jagged) if x is not None]
            jagged = f"; {', '.join(read)} read from their jagged rows" if read else ""
            return (f"{masks}operands zero-padded past the {source}: padded {skipped} skipped{unread} "
                    f"(varlen op, per-sample lengths{jagged})")
        return f"{causal}{window}padding length mask: padded {skipped} skipped (varlen op, per-sample lengths)"


class SoftmaxFreeAttention:
    """act(scale · Q Kᵀ + bias) · post_scale · V through matmul/bmm/einsum; ``match`` returns
    (match or None, reason)."""

    name = "softmax_free_attention"

    def match(self, outer: fx.Node) -> tuple[Optional[GdpaMatch], str]:
        out_side = _output_side(outer)
        if out_side is None:
            return None, "not a matmul or two-operand einsum"
        if isinstance(out_side, str):
            return None, out_side
        p, v_plan, out_perm, p_letters = out_side
        scores = _find_scores(p)
        if scores is None:
            return None, NO_PAIR
        in_side = _scores_side(scores, p_letters)
        if isinstance(in_side, str):
            return None, in_side
        q_plan, k_plan = in_side
        q_plan = _peel_batch_broadcast(q_plan)
        k_plan, v_plan = _peel_blocked_kv_repeat(k_plan, v_plan)
        try:
            recipe = read_chain(p, scores) if p is not scores else _identity_recipe(scores)
        except ChainMismatch as e:
            return None, str(e)
        m = GdpaMatch(self.name, outer, scores, recipe, q_plan, k_plan, v_plan, out_perm)
        reason = _in_place_reason(m)
        if reason:
            return None, reason
        ok, reason = self.check(m)
        if not ok:
            return None, reason
        m.kind = _kind(m)
        m.lengths = _length_plan(m)
        ok, reason = _planned_and_proven(m)
        if not ok and m.lengths is not None:
            # skipping padding only makes the op faster: where the block with it is not proven, try it without
            m.lengths = None
            ok = _planned_and_proven(m)[0]
        if not ok:
            return None, reason
        return m, "matched"

    def first_matmul(self, outer: fx.Node) -> Optional[fx.Node]:
        """The matmul or einsum that feeds ``outer``'s P through an elementwise chain, matched or not."""
        out_side = _output_side(outer)
        if out_side is None or isinstance(out_side, str):
            return None
        return _find_scores(out_side[0])

    def check(self, m: GdpaMatch) -> tuple[bool, str]:
        """Whether the fused op computes exactly this subgraph (shapes, dtypes, devices)."""
        q, k, v = m.q.example(), m.k.example(), m.v.example()
        if _is_shared_weight(m.k.node) and not _static_eq(math.prod(q.shape[:-2]), 1):
            return False, "key/value are weights shared by the batch (an FFN): left to Inductor's GEMMs"
        if min(q.dim(), k.dim(), v.dim()) < 3:
            return False, "operands need a batch or head dim ([..., N, D])"
        dtype = m.compute_dtype
        if dtype not in FUSABLE_DTYPES:
            return False, f"dtype {dtype} is not fused (float16, bfloat16, float32)"
        if len({q.device, k.device, v.device}) != 1:
            return False, "operands on different devices"
        if q.device.type == "cuda" and not all(
            statically_known_true(x <= TRITON_MAX_HEAD_DIM) for x in (q.shape[-1], v.shape[-1])
        ):
            return False, f"head dims above {TRITON_MAX_HEAD_DIM} on CUDA: no fused kernel; Inductor's GEMMs win"
        if not _static_eq(k.shape[-3], v.shape[-3]):
            return False, "key and value head counts differ"
        for factor, _ in m.recipe.key_factors:
            c = fxn.example(factor)
            if not fxn.broadcasts_into(c.transpose(-2, -1).shape, v.shape):
                return False, f"{factor.name}: a factor per key that does not broadcast to V's rows without growing V"
        h, hkv = q.shape[-3], k.shape[-3]
        heads = fxn.example(m.scores).shape[-3] if fxn.example(m.scores).dim() >= 3 else h
        # The graph's own matmul already requires key heads == query heads or 1 at run time, unless the
        # heads were grouped by a repeat we peeled (then query heads = G * key heads); either way the op's
        # h % hkv == 0 holds whenever the original graph runs. Only a query broadcast over heads is refused.
        if not (_static_eq(h, heads) or (statically_known_true(hkv > 0) and statically_known_true(h % hkv == 0))):
            return False, f"query heads ({h}) broadcast against key heads ({hkv})"
        for a, b in _aligned(q.shape[:-3], k.shape[:-3], v.shape[:-3]):
            if not (_static_eq(a, b) or _static_eq(a, 1) or _static_eq(b, 1)):
                return False, "batch dims of q/k/v do not broadcast (provably)"
        return True, "ok"


def _planned_and_proven(m: GdpaMatch) -> tuple[bool, str]:
    """The plans that depend on the block's length plan, then the proof that the fused op equals the block."""
    if (m.lengths is None or m.lengths.from_padding) and m.recipe.masks_inexact_as_bias:
        return False, m.recipe.masks_inexact_as_bias
    if m.recipe.window is not None and not _varlen_layout(m):
        return False, "a band mask needs [B, H, N, D] operands (the varlen op's windows)"
    ok, reason = _plan_buffer_mask(m)
    if not ok:
        return False, reason
    return _prove(m)


def _static_eq(a, b) -> bool:
    return statically_known_true(a == b)


def _aligned(*shapes):
    """Pairs of sizes aligned from the right, as broadcasting aligns them."""
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    for dims in zip(*padded):
        for i in range(len(dims)):
            for j in range(i + 1, len(dims)):
                yield dims[i], dims[j]


def _identity_recipe(scores: fx.Node) -> ChainRecipe:
    raise ChainMismatch("two matmuls with nothing between them: a matmul chain, not attention")


def _find_scores(p: fx.Node) -> Optional[fx.Node]:
    cur = p
    for _ in range(MAX_CHAIN):
        if not isinstance(cur, fx.Node):
            return None
        if fxn.matmul_operands(cur) is not None or fxn.einsum_operands(cur) is not None:
            return cur
        if cur.op not in ("call_function", "call_method"):
            return None
        try:
            cur = _chain_input(cur)
        except ChainMismatch:
            return None
    return None


def _output_side(outer: fx.Node):
    """(P, V plan, output permutation, P's einsum letters or None) for O = P @ V."""
    mm = fxn.matmul_operands(outer)
    if mm is not None:
        return mm[0], OperandPlan(mm[1]), None, None
    es = fxn.einsum_operands(outer)
    if es is None:
        return None
    eq, p, v = es
    parsed = _parse_output_einsum(eq)
    if parsed is None:
        return f"einsum {eq!r}: not P·V (one contraction over P's last dim)"
    v_perm, out_perm, p_letters, shared_heads = parsed
    return p, OperandPlan(v, permute=v_perm, shared_heads=shared_heads), out_perm, p_letters


def _parse_output_einsum(eq: str):
    if "->" not in eq or "." in eq:
        return None
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    p, v = parts
    if len(p) < 3 or len(set(p)) != len(p) or len(set(v)) != len(v):
        return None
    batch, n, m = p[:-2], p[-2], p[-1]
    extra = [c for c in v if c not in p]
    if len(extra) != 1 or m in out or n not in out or m not in v:
        return None
    e = extra[0]
    v_batch = _operand_batch(batch, v)
    if v_batch is None or sorted(v) != sorted(v_batch + m + e) or sorted(out) != sorted(batch + n + e):
        return None
    v_perm = [v.index(c) for c in v_batch + m + e]
    canonical = batch + n + e
    out_perm = [canonical.index(c) for c in out]
    return (None if v_perm == list(range(len(v))) else v_perm), (
        None if out_perm == list(range(len(out))) else out_perm
    ), p, v_batch != batch


def _operand_batch(batch: str, letters: str) -> Optional[str]:
    """The batch letters a K or V operand carries: all of them, or all but the heads' (the last; MQA: one K and V
    shared by the heads); else None."""
    if all(c in letters for c in batch):
        return batch
    if len(batch) >= 2 and batch[-1] not in letters and all(c in letters for c in batch[:-1]):
        return batch[:-1]
    return None


def _scores_side(scores: fx.Node, p_letters: Optional[str]):
    """(q plan, k plan) for S = Q Kᵀ, or a reason string."""
    mm = fxn.matmul_operands(scores)
    if mm is not None:
        a, b = mm
        src = fxn.transposed_source(b)
        return OperandPlan(a), (OperandPlan(src) if src is not None else OperandPlan(b, transpose_last=True))
    es = fxn.einsum_operands(scores)
    if es is None:
        return "scores are not a matmul"
    eq, a, b = es
    if "->" not in eq:
        return f"einsum {eq!r}: implicit output"
    ins, out = eq.split("->")
    A, B = ins.split(",")
    if len(out) < 3 or len(set(A)) != len(A) or len(set(B)) != len(B):
        return f"einsum {eq!r}: needs a batch or head index"
    batch, n, m = out[:-2], out[-2], out[-1]
    contracted = (set(A) & set(B)) - set(out)
    if len(contracted) != 1 or n not in A or n in B or m not in B or m in A:
        return f"einsum {eq!r}: not a single contraction Q·Kᵀ with the scores' last two dims"
    d = contracted.pop()
    k_batch = _operand_batch(batch, B)
    if sorted(A) != sorted(batch + n + d) or k_batch is None or sorted(B) != sorted(k_batch + m + d):
        return f"einsum {eq!r}: operands do not share the batch/head indices"
    if p_letters is not None and len(p_letters) != len(out):
        return f"einsum {eq!r}: the output einsum reads the scores with another rank"
    q_perm = [A.index(c) for c in batch + n + d]
    k_perm = [B.index(c) for c in k_batch + m + d]
    return (OperandPlan(a, None if q_perm == list(range(len(A))) else q_perm),
            OperandPlan(b, None if k_perm == list(range(len(B))) else k_perm, shared_heads=k_batch != batch))


def _peel_batch_broadcast(plan: OperandPlan) -> OperandPlan:
    """A query that is ``seed.expand(B, ...)`` or ``seed.repeat(B, 1, ...)`` of a batch-1 seed (PMA): the op
    broadcasts the seed itself, so the repeat's copy disappears and dQ is reduced over the batch in-kernel."""
    node = plan.node
    if plan.permute is not None or plan.transpose_last or not plan.as_written:
        return plan
    if not fxn.fn_or_method(node, (), ("expand", "repeat")):
        return plan
    src = node.args[0]
    sizes = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
    src_ev, out_ev = fxn.example(src), fxn.example(node)
    if not isinstance(src_ev, torch.Tensor) or src_ev.dim() != out_ev.dim() or src_ev.dim() < 3:
        return plan
    # only leading (batch) dims may grow, from size 1; heads, length and width stay as they are
    for i, (a, b) in enumerate(zip(src_ev.shape, out_ev.shape)):
        if i >= src_ev.dim() - 3:
            if not _static_eq(a, b):
                return plan
        elif not (_static_eq(a, b) or _static_eq(a, 1)):
            return plan
    if node.target == "repeat" and not all(
        _static_eq(s, 1) or _static_eq(src_ev.shape[i], 1) for i, s in enumerate(sizes)
    ):
        return plan
    return OperandPlan(src)


def _blocked_repeat_source(plan: OperandPlan):
    """(source, group) when the plan is ``x.repeat_interleave(G, dim=heads)`` of an int G."""
    node = plan.node
    if plan.permute is not None or plan.transpose_last or not plan.as_written:
        return None
    if not fxn.fn_or_method(node, (torch.repeat_interleave,), ("repeat_interleave",)):
        return None
    src, repeats = node.args[0], fxn.arg(node, 1, "repeats")
    dim = fxn.arg(node, 2, "dim")
    ev = fxn.example(node)
    if fxn.scalar_value(repeats) is None or not isinstance(dim, int) or not isinstance(ev, torch.Tensor):
        return None
    if ev.dim() < 3 or dim % ev.dim() != ev.dim() - 3:
        return None
    return src, repeats


def _peel_blocked_kv_repeat(k: OperandPlan, v: OperandPlan) -> tuple[OperandPlan, OperandPlan]:
    """Blocked GQA written as ``repeat_interleave(G, dim=heads)`` on both K and V: the op reads the
    Hkv heads itself (query head h uses kv head h // G, exactly the repeat's mapping), so no copy."""
    rk, rv = _blocked_repeat_source(k), _blocked_repeat_source(v)
    if rk is None or rv is None or not _static_eq(fxn.example(rk[1]), fxn.example(rv[1])):
        return k, v
    return OperandPlan(rk[0]), OperandPlan(rv[0])


def _in_place_reason(m: GdpaMatch) -> str:
    """Why in-place changes in the graph keep the block from being rewritten, or "": a change of what the block
    reads between its first read and the fused op's, or a read of the block (or of the views that lead from its
    operands to it) that comes after a change of the tensor read."""
    region = (m.scores, *m.recipe.nodes, m.outer)
    upstream = set(_upstream(m.outer))
    changer = changed_during(region, m.outer, upstream)
    if changer is not None:
        return f"{changer.name} changes in place a tensor the block reads, before the fused op would read it"
    stale = stale_readers(m.outer.graph, *region)
    if not stale:
        return ""
    readers = set(region)
    frontier = [m.q.node, m.k.node, m.v.node]
    while frontier:  # the views from each operand to the block
        for user in frontier.pop().users:
            if user in upstream and user not in readers:
                readers.add(user)
                frontier.append(user)
    hit = sorted(n.name for n in readers & stale)
    return f"{hit[0]} reads a tensor after the graph changed it in place" if hit else ""


def _is_shared_weight(node: fx.Node) -> bool:
    """A parameter (possibly viewed/expanded): the same weights for every sample."""
    cur = node
    while isinstance(cur, fx.Node) and fxn.fn_or_method(
        cur, (torch.transpose,), ("transpose", "t", "expand", "unsqueeze", "view", "reshape", "permute")
    ):
        cur = cur.args[0]
    if not isinstance(cur, fx.Node):
        return False
    if cur.op == "get_attr":
        return True
    return isinstance(fxn.real_value(cur), torch.nn.Parameter)


def _prove(m: GdpaMatch) -> tuple[bool, str]:
    """``check_equivalent``, and where lengths read from zero-padded operands are what fails it (padded query rows
    the graph does not leave zero, where its output there is read: an activation nonzero at 0, a bias), the block
    with fewer of them skipped."""
    ok, reason = check_equivalent(m)
    plan = m.lengths
    if ok or plan is None or not plan.from_padding:
        return ok, reason
    m.lengths = None
    if plan.rows and not plan.rows_unread and not m.recipe.causal and m.recipe.window is None:
        m.lengths = LengthMask(plan.lengths, False, True, from_padding=True, offsets=plan.offsets,
                               jagged=(None, *plan.jagged[1:]))
        if check_equivalent(m)[0]:
            return True, "ok"
        m.lengths = None
    return check_equivalent(m)


def _length_plan(m: GdpaMatch) -> Optional[LengthMask]:
    """The padding length mask when the varlen op computes this block exactly: every mask a length mask of
    one lengths tensor (a bias is read at its padded coordinates), 4-D operands whose batch is the lengths'
    (or 1 for the query), and with causal, both rows and columns masked (per-sample square, where the
    alignments agree). Without such masks, the lengths past which the operands are zero-padded."""
    r = m.recipe
    if not r.dense_masks:
        return _padded_plan(m)
    scores = fxn.example(m.scores)
    found = [length_mask(mask, keep, scores) for mask, keep in r.dense_masks]
    if any(f is None for f in found) or len({f.lengths for f in found}) != 1:
        return _padded_plan(m)
    plan = LengthMask(found[0].lengths, any(f.rows for f in found), any(f.cols for f in found))
    q, k, v = m.q.example(), m.k.example(), m.v.example()
    if not _varlen_layout(m):
        return None
    if fxn.example(plan.lengths).device != q.device:
        return None
    b = fxn.example(plan.lengths).shape[0]
    if not (_static_eq(k.shape[0], b) and _static_eq(v.shape[0], b)):
        return None
    if not (_static_eq(q.shape[0], b) or (_static_eq(q.shape[0], 1) and not plan.rows)):
        return None
    if (r.causal or r.window is not None) and not (plan.rows and plan.cols):
        return None
    return plan


def _padded_plan(m: GdpaMatch) -> Optional[LengthMask]:
    """Lengths past which K and V (and Q: then rows too) are zero, proven by ``padded_operands``; with causal or a
    band, only when Q is padded as well (per-sample square)."""
    if not _varlen_layout(m) or not all(x.as_written for x in (m.q, m.k, m.v)):
        return None
    found = padded_lengths(m.q, m.k, m.v, m.outer)
    if found is None or fxn.example(found.source).device != m.q.example().device:
        return None
    if (m.recipe.causal or m.recipe.window is not None) and not found.rows:
        return None
    return LengthMask(found.source, found.rows, found.cols, from_padding=True, offsets=found.offsets,
                      rows_unread=found.rows_unread, jagged=_jagged_sides(m, found))


def _jagged_sides(m: GdpaMatch, found) -> tuple:
    """Which operands the op reads from their jagged rows: K and V together, and Q with them where its padded rows
    are skipped and it is scaled only by numbers (a tensor factor has the padded layout); every side whose rows are
    skipped, or none."""
    jq, jk, jv = found.jagged
    if jk is None or jv is None or not _same_rows(jk, jv):
        return (None, None, None)
    if not found.rows:
        return (None, jk, jv)
    if jq is None or not _same_rows(jq, jk) or any(fxn.is_tensor_node(value) for value, _ in m.recipe.pre_factors):
        return (None, None, None)
    return (jq, jk, jv)


def _same_rows(a: fx.Node, b: fx.Node) -> bool:
    """Two jagged tensors with one row count, so that one set of offsets, clamped to it, stays within both."""
    return statically_known_true(fxn.example(a).shape[0] == fxn.example(b).shape[0])


def _varlen_layout(m: GdpaMatch) -> bool:
    """4-D operands and output in the scores' layout: what the varlen op reads as [B, N, H, D] views."""
    q, k, v = m.q.example(), m.k.example(), m.v.example()
    return min(q.dim(), k.dim(), v.dim()) == 4 and m.out_permute is None


def _plan_buffer_mask(m: GdpaMatch) -> tuple[bool, str]:
    """Sets ``m.buffer_mask`` when the causal flag rests on a graph input's value (a buffer, a float mask)."""
    read = [(mask, keep, buffers_read(mask)) for mask, keep in m.recipe.causal_masks]
    from_buffers = [r for r in read if r[2]]
    if not from_buffers:
        return True, "ok"
    if len(read) != 1 or len(from_buffers[0][2]) != 1 or m.recipe.window is not None:
        return False, "a causal mask read from a graph input together with another causal or band mask"
    mask, keep, (buffer,) = from_buffers[0]
    if fxn.example(mask).requires_grad:
        return False, "a causal mask read from a graph input that requires grad (the op gives it no gradient)"
    m.buffer_mask = (mask, keep, buffer)
    return True, "ok"


def _kind(m: GdpaMatch) -> str:
    q, k = m.q.example(), m.k.example()
    r = m.recipe
    parts = []
    if q.dim() >= 4 and _static_eq(math.prod(q.shape[:-3]), 1) and not _static_eq(math.prod(k.shape[:-3]), 1):
        parts.append("PMA (broadcast seed queries)")
    elif m.k.transpose_last and q.dim() == 3:
        parts.append("PFFN (per-sample weights)")
    elif r.activation == "silu" and (r.post_scale != 1.0 or r.post_factors):
        parts.append("HSTU-style silu attention")
    elif r.activation == "sigmoid":
        parts.append("sigmoid attention")
    else:
        parts.append("attention")
    if not _static_eq(q.shape[-3], k.shape[-3]):
        parts.append("GQA")
    return ", ".join(parts)
