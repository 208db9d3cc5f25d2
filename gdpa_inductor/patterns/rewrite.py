"""The GDPA pass over Dynamo's torch-level FX graph: find, check, rewrite, count, report.

``rewrite_gdpa(gm, example_inputs)`` runs an Inductor ``PatternMatcherPass`` whose anchors are the matmul-like
nodes (every candidate second matmul); its extra check asks each GDPA pattern for a match, and its handler
replaces the matched subgraph with ``torch.ops.gdpa.attention_fwd_direct_v1`` (``lowering/direct_launch.py``;
plus the views, casts and non-float scale factors the recipe needs). Subgraphs of higher-order ops (activation
checkpointing) are visited too. Every candidate is reported (matched with its parameters, or rejected with
the reason) to the ``gdpa_inductor`` logger and to the returned list; ``dry_run`` only reports. The
backend counts the rewrites of each graph it compiles (``counters["gdpa"]["rewrites"]``).
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx
from torch._inductor.pattern_matcher import (
    Arg,
    CallFunction,
    CallMethod,
    Match,
    PatternMatcherPass,
    register_graph_pattern,
)

from ..lowering import buffer_mask_ops, direct_launch, ops, varlen_ops  # noqa: F401  (register torch.ops.gdpa.*)
from . import fx_nodes as fxn
from .chain import shape_spelling
from .in_place import write_out_of_place
from .output_rows import read_rows_directly
from .softmax_free_attention import NO_PAIR, GdpaMatch, OperandPlan, SoftmaxFreeAttention

log = logging.getLogger("gdpa_inductor")

PATTERNS = (SoftmaxFreeAttention(),)


@dataclass
class CandidateReport:
    graph: str
    node: str
    matched: bool
    reason: str
    details: Optional[dict] = None
    # A refused block's first matmul (the scores), reported with the block rather than on its own.
    scores: Optional[str] = None

    def __str__(self) -> str:
        where = f"{self.graph}:{self.node}"
        if not self.matched:
            with_scores = f" (scores {self.scores})" if self.scores else ""
            return f"  rejected  {where}{with_scores}: {self.reason}"
        d = self.details or {}
        return (f"  FUSED     {where}: {d.get('kind')}, activation={d.get('activation')}, q{d.get('q')} "
                f"k{d.get('k')} v{d.get('v')} {d.get('dtype')}, scale={d.get('scale'):.4g}"
                f"{' (+tensor/SymInt factors)' if d.get('scale_factors') else ''}, "
                f"post_scale={d.get('post_scale'):.4g}{' (+tensor/SymInt factors)' if d.get('post_factors') else ''}"
                f"{', a factor per key on V' if d.get('key_factors') else ''}"
                f", bias={'yes' if d.get('bias') else 'no'}, mask={d.get('mask')}")


# The second matmul in every spelling Dynamo keeps: the anchors of the pass. What lies behind an anchor (the
# elementwise chain and the first matmul, in any of their spellings) is read by the patterns' ``match``.
_ANCHORS = (
    CallFunction(fxn.MATMUL_FUNCTIONS, Arg(), Arg()),
    CallMethod(fxn.MATMUL_METHODS, Arg(), Arg()),
    CallFunction(fxn.EINSUM_FUNCTIONS, Arg(), Arg(), Arg()),
    CallFunction(fxn.EINSUM_FUNCTIONS, Arg(), Arg()),  # einsum(eq, [a, b]): the list is one argument
)


def _readable_inputs(placeholders: list[fx.Node], example_inputs: Sequence[Any]) -> dict[fx.Node, torch.Tensor]:
    """The graph inputs whose compile-time values a causal proof may read: module state (a causal buffer, a
    parameter), and float tensors the caller passes (a {0, 1} mask computed by another graph). Either can change
    without a recompile, so a proof that read one is checked again when the op runs (``buffer_mask_ops``)."""
    from torch._subclasses.fake_tensor import is_fake

    readable = {}
    for p, x in zip(placeholders, example_inputs):
        if isinstance(x, torch.Tensor) and not is_fake(x) and (fxn.is_module_state(p) or x.is_floating_point()):
            readable[p] = x
    return readable


# A 1-D integer input longer than this is not read as offsets or lengths.
MAX_ROW_COUNT_ENTRIES = 1 << 16


def _row_counts(placeholders: list[fx.Node], example_inputs: Sequence[Any]) -> dict[fx.Node, tuple[int, int]]:
    """(last entry, sum) of each short 1-D integer input: the jagged rows it describes as offsets or as lengths. Read
    only to size drawn offsets (``padded_operands``), never to decide what a proof concludes."""
    from torch._subclasses.fake_tensor import is_fake

    counts = {}
    for p, x in zip(placeholders, example_inputs):
        if (isinstance(x, torch.Tensor) and not is_fake(x) and x.dim() == 1 and 0 < x.numel() <= MAX_ROW_COUNT_ENTRIES
                and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool):
            counts[p] = (int(x[-1]), int(x.sum()))
    return counts


def rewrite_gdpa(gm: fx.GraphModule, example_inputs: Sequence[Any] = (), dry_run: bool = False,
                 graph_name: str = "graph") -> list[CandidateReport]:
    if not dry_run:
        direct_launch.register()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    readable = _readable_inputs(placeholders, example_inputs)
    for node, value in readable.items():
        node.meta[fxn.REAL_VALUE] = value
    for node, rows in _row_counts(placeholders, example_inputs).items():
        node.meta[fxn.REAL_ROWS] = rows
    try:
        reports = _GdpaPass(gm, dry_run, graph_name).run()
    finally:
        for node in placeholders:
            node.meta.pop(fxn.REAL_VALUE, None)
            node.meta.pop(fxn.REAL_ROWS, None)
    for name, sub in list(gm.named_children()):
        if isinstance(sub, fx.GraphModule):
            reports += _GdpaPass(sub, dry_run, f"{graph_name}.{name}").run()
    return reports


class _GdpaPass:
    """One application of the pass to one graph, through Inductor's ``PatternMatcherPass`` (as Inductor's
    own pre-grad passes and ``b2b_gemm`` do): the anchors are registered graph patterns, ``_check`` is their
    extra check (it runs the GDPA patterns and records every candidate's verdict) and ``_fuse`` their
    handler. A dry run records and never applies."""

    def __init__(self, gm: fx.GraphModule, dry_run: bool, graph_name: str):
        self.gm, self.dry_run, self.graph_name = gm, dry_run, graph_name
        self.written_out_of_place = write_out_of_place(gm.graph)
        self.reports: list[tuple[int, CandidateReport]] = []
        self.claimed: set[fx.Node] = set()  # nodes of matched blocks (in a dry run they stay in the graph)
        self.consumed: set[str] = set()
        self.fusable: dict[fx.Node, Optional[GdpaMatch]] = {}
        self.pending: Optional[GdpaMatch] = None  # the block ``_check`` accepted, for ``_fuse``
        self.position = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.matcher = PatternMatcherPass(pass_name="gdpa_pre_grad")
        for anchor in _ANCHORS:
            register_graph_pattern(anchor, extra_check=self._check, pass_dict=self.matcher)(self._fuse)

    def run(self) -> list[CandidateReport]:
        if self.matcher.apply(self.gm) and not self.dry_run or self.written_out_of_place:
            self.gm.graph.lint()
            self.gm.recompile()
        # A block's first matmul is a candidate too, and was reported as unpaired: the block's report covers it.
        paired = {r.scores for _, r in self.reports if r.scores}
        return [r for _, r in sorted(self.reports, key=lambda pr: pr[0])
                if r.matched or (r.node not in self.consumed and not (r.node in paired and r.reason == NO_PAIR))]

    def _report(self, node: fx.Node, matched: bool, reason: str, details: Optional[dict] = None,
                scores: Optional[fx.Node] = None) -> None:
        self.reports.append((self.position[node], CandidateReport(
            self.graph_name, node.name, matched, reason, details, scores.name if scores is not None else None)))
        if matched:
            log.debug("gdpa: %s:%s fused: %s", self.graph_name, node.name, details)
        else:
            log.debug("gdpa: %s:%s not fused: %s", self.graph_name, node.name, reason)

    def _block_at(self, node: fx.Node) -> tuple[Optional[GdpaMatch], str]:
        """The GDPA block whose second matmul is ``node``, or why there is none. The patterns visit anchors
        last to first, so a block whose first matmul is another block's second matmul is refused here: the
        earlier block is fused on its own (as it would be in graph order), never swallowed as a Q operand."""
        match, reason = None, "no pattern"
        for pattern in PATTERNS:
            match, reason = pattern.match(node)
            if match is not None:
                break
        if match is not None and self._fusable(match.scores):
            return None, "its first matmul is the second matmul of another GDPA block, fused on its own"
        return match, reason

    def _fusable(self, node: fx.Node) -> bool:
        if node not in self.fusable:
            self.fusable[node] = None  # a cycle is impossible in a DAG; this only guards the recursion
            if fxn.matmul_operands(node) is not None or fxn.einsum_operands(node) is not None:
                self.fusable[node] = self._block_at(node)[0]
        return self.fusable[node] is not None

    def _check(self, pm_match: Match) -> bool:
        node = pm_match.output_node()
        match, reason = self._block_at(node)
        if match is not None and ({match.scores, *match.recipe.nodes} & self.claimed):
            match, reason = None, "overlaps a GDPA block fused before it"
        if match is None:
            self._report(node, False, reason, scores=_first_matmul(node))
            return False
        if self.dry_run:
            self._record(match)
            return False
        self.pending = match
        return True

    def _fuse(self, pm_match: Match, *args, **kwargs) -> None:
        match, self.pending = self.pending, None
        try:
            _replace(self.gm.graph, match)
        except Exception as e:  # the graph is unchanged; never break the user's compile
            reason = f"rewrite failed ({type(e).__name__}: {e}); left unfused"
            self._report(match.outer, False, reason)
            log.debug("gdpa: %s:%s %s", self.graph_name, match.outer.name, reason, exc_info=True)
            return
        self._record(match)

    def _record(self, match: GdpaMatch) -> None:
        self._report(match.outer, True, "matched", match.describe())
        self.consumed.add(match.scores.name)
        self.claimed.update({match.outer, match.scores, *match.recipe.nodes})


def _first_matmul(node: fx.Node) -> Optional[fx.Node]:
    """The first matmul of the block whose second matmul is ``node``, whatever refused the block; else None."""
    for pattern in PATTERNS:
        scores = pattern.first_matmul(node)
        if scores is not None:
            return scores
    return None


# ---- building the replacement ------------------------------------------------------------------------


class _Builder:
    """Inserts nodes before the anchor, giving each an example_value (run on the inputs' fake values in
    the fake mode that produced them); ``rollback`` removes everything it inserted."""

    def __init__(self, graph: fx.Graph, anchor: fx.Node, fake_mode):
        self.graph, self.anchor, self.mode = graph, anchor, fake_mode
        self.created: list[fx.Node] = []
        # (padded output, the op's jagged output, offsets, B, N) where the block ran on jagged rows
        self.padded_output: Optional[tuple] = None

    def emit(self, kind: str, target, args, kwargs=None) -> fx.Node:
        with self.graph.inserting_before(self.anchor):
            if kind == "method":
                node = self.graph.call_method(target, args, kwargs or {})
            else:
                node = self.graph.call_function(target, args, kwargs or {})
        self.created.append(node)

        def ev(a):
            return fxn.example(a) if isinstance(a, fx.Node) else a

        fargs = torch.fx.node.map_aggregate(node.args, ev)
        fkwargs = torch.fx.node.map_aggregate(node.kwargs, ev)
        with self.mode:
            if kind == "method":
                node.meta["example_value"] = getattr(fargs[0], target)(*fargs[1:], **fkwargs)
            else:
                node.meta["example_value"] = target(*fargs, **fkwargs)
        return node

    def rollback(self) -> None:
        for node in reversed(self.created):
            self.graph.erase_node(node)
        self.created.clear()


def _operand(b: _Builder, plan: OperandPlan, dtype: torch.dtype, factors=()) -> fx.Node:
    n = plan.node
    if plan.permute is not None:
        n = b.emit("method", "permute", (n, *plan.permute))
    if plan.shared_heads:
        n = b.emit("method", "unsqueeze", (n, -3))
    if plan.transpose_last:
        n = b.emit("method", "transpose", (n, -2, -1))
    for value, divide in factors:
        n = b.emit("function", operator.truediv if divide else operator.mul, (n, value))
    if fxn.example(n).dtype != dtype:
        n = b.emit("method", "to", (n, dtype))
    return n


def _bias(b: _Builder, m: GdpaMatch, dtype: torch.dtype, with_masks: bool = True) -> Optional[fx.Node]:
    """The bias terms summed, plus (``with_masks``) each dense mask as a ``-finfo.max`` term."""
    total: Optional[fx.Node] = None
    constant = 0.0
    for term, coef, factors in m.recipe.bias_terms:
        if isinstance(term, fx.Node):
            if abs(coef) != 1.0:
                term = b.emit("function", operator.mul, (term, abs(coef)))
            for value, divide in factors:
                term = b.emit("function", operator.truediv if divide else operator.mul, (term, value))
            if total is None:
                total = term if coef > 0 else b.emit("function", operator.neg, (term,))
            else:
                total = b.emit("function", operator.add if coef > 0 else operator.sub, (total, term))
        else:
            constant += coef * term
    for mask, keep_form in m.recipe.dense_masks if with_masks else ():
        big = -torch.finfo(dtype).max
        term = b.emit("function", torch.where, (mask, 0.0, big) if keep_form else (mask, big, 0.0))
        term = b.emit("method", "to", (term, dtype))
        total = term if total is None else b.emit("function", operator.add, (total, term))
    if constant != 0.0 and total is None:
        # at least fp32, as eager adds a Python number to a bf16 tensor: -log(512) rounded to bf16 would shift
        # every score by 0.012 (the op's kernels read a bias of any float dtype)
        device = fxn.example(m.scores).device
        const_dtype = torch.promote_types(dtype, torch.float32)
        return b.emit("function", torch.full, ((), constant), {"dtype": const_dtype, "device": device})
    if constant != 0.0:
        total = b.emit("function", operator.add, (total, constant))
    if total is not None and fxn.example(total).dtype != dtype:
        total = b.emit("method", "to", (total, dtype))
    return total


def _varlen_padded(b: _Builder, m: GdpaMatch, q: fx.Node, k: fx.Node, v: fx.Node, dtype: torch.dtype) -> fx.Node:
    """The block on the varlen op, which reads [B, N, H, D] views: over a padded batch with a length mask, the
    valid lengths (which the op clamps to N, as ``arange(N) < lengths`` does), and the padding is never visited;
    with a band mask, its window. A bias keeps its padded [.., N, N] coordinates, which are the varlen op's
    per-sample ones."""
    r, plan = m.recipe, m.lengths
    bias = _bias(b, m, dtype, with_masks=plan is None or plan.from_padding)
    seqused_q, seqused_k = _seqused(b, plan)
    left, right = r.window if r.window is not None else (-1, -1)
    qt, kt, vt = (b.emit("method", "transpose", (x, 1, 2)) for x in (q, k, v))
    out = _varlen_op(b, (qt, kt, vt, bias, None, None, seqused_q, seqused_k, 0, 0, r.activation, float(r.scale),
                         float(r.post_scale), bool(r.causal), left, right, float(r.negative_slope)))
    return b.emit("method", "transpose", (out, 1, 2))


def _varlen_jagged(b: _Builder, m: GdpaMatch, dtype: torch.dtype) -> fx.Node:
    """The block on the varlen op reading K and V (and Q where its padded rows are skipped) from the jagged rows they
    pad (``LengthMask.jagged``), with offsets from the plan's lengths and each sample's rows used cut to N as the
    padding cuts them: no padded copy is read, and the gradients reach the jagged rows directly. A jagged output
    goes back to the padded batch, zeros past the lengths (where the graph's are zero or unread). The op clamps
    offsets past the rows (not a valid batch) to them, so that it never reads past the tensors."""
    r, plan = m.recipe, m.lengths
    jq, jk, jv = plan.jagged
    n = int(m.k.example().shape[-2])
    k, v = _jagged(b, jk, m.k.example(), dtype), _jagged(b, jv, m.v.example(), dtype)
    # the op clamps the offsets to the rows and cuts each length to N itself: no converted copies to launch
    raw = _offsets(b, plan)
    if jq is None:
        q = _operand(b, m.q, dtype, r.pre_factors)
        q, cu_q = b.emit("method", "transpose", (q, 1, 2)), None
    else:
        q, cu_q = _jagged(b, jq, m.q.example(), dtype, r.pre_factors), raw
    left, right = r.window if r.window is not None else (-1, -1)
    out = _varlen_op(b, (q, k, v, _bias(b, m, dtype), cu_q, raw, None, None, n, n, r.activation, float(r.scale),
                         float(r.post_scale), bool(r.causal), left, right, float(r.negative_slope)))
    if jq is None:
        return b.emit("method", "transpose", (out, 1, 2))
    offsets = b.emit("method", "clamp", (raw, 0, _size(b, k, 0)))
    return _padded_output(b, out, offsets, int(m.q.example().shape[0]), n)


def _varlen_op(b: _Builder, args: tuple) -> fx.Node:
    """The varlen op's output; its other outputs are the schedule its backward reuses."""
    found = b.emit("function", torch.ops.gdpa.varlen_fwd_direct_v4.default, args)
    return b.emit("function", operator.getitem, (found, 0))


def _jagged(b: _Builder, rows: fx.Node, like: torch.Tensor, dtype: torch.dtype, factors=()) -> fx.Node:
    """``rows`` [L, ...] as the op's jagged [L, H, D] for an operand read as ``like`` [B, H, N, D]."""
    x = b.emit("method", "reshape", (rows, -1, int(like.shape[1]), int(like.shape[-1])))
    for value, divide in factors:
        x = b.emit("function", operator.truediv if divide else operator.mul, (x, value))
    if fxn.example(x).dtype != dtype:
        x = b.emit("method", "to", (x, dtype))
    return x


def _offsets(b: _Builder, plan) -> fx.Node:
    """The plan's lengths as int64 offsets [B + 1]."""
    if plan.offsets:
        return b.emit("method", "to", (plan.lengths, torch.int64))
    ends = b.emit("method", "cumsum", (plan.lengths, 0))
    return b.emit("function", torch.nn.functional.pad, (b.emit("method", "to", (ends, torch.int64)), (1, 0)))


def _padded_output(b: _Builder, out: fx.Node, offsets: fx.Node, batch: int, n: int) -> fx.Node:
    """Jagged ``out`` [L, H, Dv] as [B, H, N, Dv]: row ``offsets[z] + i`` at position i of sample z for i < N, zeros
    elsewhere. Rows with no place (past N, or outside the offsets) go to one extra row that is dropped, so that the
    backward gathers the output's gradient rather than adding it up."""
    ex = fxn.example(out)
    rows = ex.shape[0] if isinstance(ex.shape[0], int) else b.emit("function", torch.ops.aten.sym_size.int, (out, 0))
    t = b.emit("function", torch.arange, (rows,), {"device": ex.device})
    # searched in the whole offsets: Inductor's CUDA lowering of searchsorted (torch 2.11) reads a sliced
    # sequence from its storage's first element
    after = b.emit("function", torch.searchsorted, (offsets, t), {"right": True})
    sample = b.emit("function", operator.sub, (after, 1))
    clamped = b.emit("method", "clamp", (sample, 0, batch - 1))
    pos = b.emit("function", operator.sub, (t, b.emit("function", operator.getitem, (offsets, clamped))))
    placed = b.emit("function", operator.and_, (
        b.emit("function", operator.and_, (b.emit("function", operator.lt, (pos, n)),
                                           b.emit("function", operator.ge, (pos, 0)))),
        b.emit("function", operator.lt, (sample, batch))))
    at = b.emit("function", operator.add, (b.emit("function", operator.mul, (clamped, n)), pos))
    dest = b.emit("function", torch.where, (placed, at, batch * n))
    full = b.emit("method", "new_zeros", (out, (batch * n + 1, int(ex.shape[1]), int(ex.shape[2]))))
    full = b.emit("method", "index_copy", (full, 0, dest, out))
    full = b.emit("function", operator.getitem, (full, slice(None, batch * n, None)))
    full = b.emit("method", "view", (full, batch, n, int(ex.shape[1]), int(ex.shape[2])))
    padded = b.emit("method", "transpose", (full, 1, 2))
    b.padded_output = (padded, out, offsets, batch, n)
    return padded


def _size(b: _Builder, node: fx.Node, dim: int):
    """``node``'s size along ``dim``: an int, or a node reading it where it is symbolic."""
    size = fxn.example(node).shape[dim]
    return size if isinstance(size, int) else b.emit("function", torch.ops.aten.sym_size.int, (node, dim))


def _seqused(b: _Builder, plan, n=None) -> tuple[Optional[fx.Node], Optional[fx.Node]]:
    """(seqused_q, seqused_k): the plan's lengths (from offsets when it reads them), clamped to N as int32 where ``n``
    is given; as the graph has them for the varlen op, which clamps them itself."""
    if plan is None:
        return None, None
    lengths = plan.lengths
    if plan.offsets:
        ends = b.emit("function", operator.getitem, (lengths, slice(1, None, None)))
        starts = b.emit("function", operator.getitem, (lengths, slice(None, -1, None)))
        lengths = b.emit("function", operator.sub, (ends, starts))
    if n is not None:
        lengths = b.emit("method", "clamp", (lengths, 0, n))
        lengths = b.emit("method", "to", (lengths, torch.int32))
    return (lengths if plan.rows else None), (lengths if plan.cols else None)


def _buffer_masked(b: _Builder, m: GdpaMatch, q: fx.Node, k: fx.Node, v: fx.Node, dtype: torch.dtype) -> fx.Node:
    """A causal mask read from a module buffer or a float graph input: the op gets the mask (keep form) and that
    source, and runs causal while the source holds it; a padding length mask goes with it as per-sample lengths."""
    r, plan = m.recipe, m.lengths
    mask, keep_form, buffer = m.buffer_mask
    multiplier = mask if keep_form else b.emit("function", torch.logical_not, (mask,))
    seqused_q, seqused_k = _seqused(b, plan, _size(b, k, -2))
    with_masks = plan is None or plan.from_padding
    return b.emit("function", torch.ops.gdpa.attention_buffer_mask_fwd_v1.default,
                  (q, k, v, _bias(b, m, dtype, with_masks=with_masks), seqused_q, seqused_k, multiplier, buffer,
                   r.activation, float(r.scale), float(r.post_scale), float(r.negative_slope)))


def _fused(b: _Builder, m: GdpaMatch, dtype: torch.dtype) -> fx.Node:
    """The fused op's call for the block, in the op's [B, H, N, Dv] layout."""
    r = m.recipe
    if (m.buffer_mask is None and m.lengths is not None and m.lengths.from_padding
            and m.lengths.jagged[1] is not None and _static(m) and not r.key_factors):
        return _varlen_jagged(b, m, dtype)
    q = _operand(b, m.q, dtype, r.pre_factors)
    k = _operand(b, m.k, dtype)
    # a factor per key scales V's rows: (P ⊙ c) V = P (cᵀ ⊙ V)
    v = _operand(b, m.v, dtype, [(b.emit("method", "transpose", (c, -1, -2)), divide) for c, divide in r.key_factors])
    if m.buffer_mask is not None:
        return _buffer_masked(b, m, q, k, v, dtype)
    if m.lengths is not None or r.window is not None:
        return _varlen_padded(b, m, q, k, v, dtype)
    return b.emit("function", torch.ops.gdpa.attention_fwd_direct_v1.default,
                  (q, k, v, _bias(b, m, dtype), r.activation, float(r.scale), float(r.post_scale), bool(r.causal),
                   float(r.negative_slope)))


def _build(b: _Builder, m: GdpaMatch) -> fx.Node:
    r = m.recipe
    out = _fused(b, m, m.compute_dtype)
    for value, divide in r.post_factors:
        out = b.emit("function", operator.truediv if divide else operator.mul, (out, value))
    if m.out_permute is not None:
        out = b.emit("method", "permute", (out, *m.out_permute))
    want = fxn.example(m.outer)
    if fxn.example(out).dtype != want.dtype:
        out = b.emit("method", "to", (out, want.dtype))
    if fxn.example(out).shape != want.shape:
        raise ValueError(f"replacement shape {tuple(fxn.example(out).shape)} != {tuple(want.shape)}")
    return out


def _static(m: GdpaMatch) -> bool:
    """Whether the padded batch's sizes (B, H, N, D of each operand) are plain ints, as the jagged path builds them."""
    return all(isinstance(s, int) for x in (m.q, m.k, m.v) for s in x.example().shape)


def _replace(graph: fx.Graph, m: GdpaMatch) -> None:
    """Builds the fused subgraph; only once it is complete (and has the original's shape and dtype)
    are the original nodes replaced. On any error the graph is left exactly as it was."""
    b = _Builder(graph, m.outer, fxn.example(m.scores).fake_mode)
    try:
        out = _build(b, m)
    except Exception:
        b.rollback()
        raise
    dead = [m.outer, *m.recipe.nodes, m.scores]  # each node's only user precedes it here
    for fill in dict.fromkeys(m.recipe.constant_fills):
        if any(i in dead for i in fill.all_input_nodes):  # shaped like a chain node: erased before it
            if not all(u in dead for u in fill.users):
                b.rollback()
                raise ValueError(f"{fill.name}: a fill value shaped like the block is read outside it")
            dead.insert(max(dead.index(u) for u in fill.users) + 1, fill)
    for user in dict.fromkeys(m.recipe.detached_users):
        _detach(graph, user, m.scores.all_input_nodes)
    m.outer.replace_all_uses_with(out)
    inputs = {i for n in dead for i in n.all_input_nodes} - set(dead)
    for node in dead:
        graph.erase_node(node)
    for node in inputs:
        _erase_if_dead(graph, node)
    if b.padded_output is not None and b.padded_output[0] is out:
        padded, jagged, offsets, batch, n = b.padded_output
        read = read_rows_directly(padded, jagged, offsets, batch, n, lambda anchor: _Builder(graph, anchor, b.mode))
        if read is not None:
            _erase_if_dead(graph, read)


def _detach(graph: fx.Graph, user: fx.Node, sources: list[fx.Node]) -> None:
    """Drops a dead user of the block, or re-points ``x.expand_as(block node)`` to ``x.expand(its shape)``, each
    symbolic size read from the scores' operands (``sources``)."""
    if not user.users:
        graph.erase_node(user)
        return
    sizes = []
    with graph.inserting_before(user):
        for size in shape_spelling(user.args[1], sources):
            if isinstance(size, tuple):
                src, dim = size
                node = graph.call_function(torch.ops.aten.sym_size.int, (src, dim))
                node.meta["example_value"] = fxn.example(src).shape[dim]
                size = node
            sizes.append(size)
        expand = graph.call_method("expand", (user.args[0], *sizes))
    expand.meta.update(user.meta)
    user.replace_all_uses_with(expand)
    graph.erase_node(user)


def _erase_if_dead(graph: fx.Graph, node: fx.Node) -> None:
    if node.graph is not graph or node.users or node.op not in ("call_function", "call_method"):
        return
    if node.is_impure():
        return
    inputs = list(node.all_input_nodes)
    graph.erase_node(node)
    for inp in inputs:
        _erase_if_dead(graph, inp)
