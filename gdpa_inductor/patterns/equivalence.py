"""Proof by evaluation: a matched block is rewritten only if the fused op's recipe gives what the graph gives.

The spelling of a block (``chain.py``, ``causal_mask.py``, ``length_mask.py``) only proposes a recipe. Before
the rewrite, ``check_equivalent`` evaluates both on the same concrete values and refuses where they differ:

* the graph: the elementwise chain from S to P, node by node with the graph's own targets and in the graph's
  dtypes, on random scores;
* the recipe: what the op computes from it: ``act(scale · S + bias)`` in fp32 with the bias built as the rewrite
  builds it (in the compute dtype, each dense mask a ``-finfo.max`` term), then ``post_scale``, the causal flag and
  the skipped padding as zeros (a causal mask read from a buffer as the mask itself: the op checks the buffer
  when it runs, ``lowering/buffer_mask_ops.py``).

The operands of the chain (biases, masks, scale factors, lengths) are computed from the graph's own subgraphs:
shape-only ones (``arange``, ``ones``/``tril``, comparisons) from the sizes, others from random graph inputs. No
value of a graph input is read (a module buffer can change after the compile): floating inputs are random normal,
integer ones random among the sampled coordinates and N, with 0 and N among them, boolean ones random with an
all-False and an all-True row.
A floating value derived from a floating input is drawn at random directly (the recipe reads such a bias or factor
as it is, whatever its value). A value too large to compute whole (a [B, 1, N, N] padding mask of a large batch) is
drawn (a graph input) or computed (an elementwise op, a cast, an expand of smaller values) at the sampled coordinates
alone.
Two draws of the scores (mixed signs, then positive) on a sample of the scores'
coordinates (all of them up to 1024 per axis; the first and last batch and head index) are compared: NaN and
infinity where the graph has them, and finite values within the rounding of the compute dtype.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx as fx

from ..kernels.activations import get_activation
from . import fx_nodes as fxn

# Per-axis sample of the scores' coordinates: every index up to this length; beyond it, both ends.
MAX_AXIS_SAMPLE = 1024
# A subgraph value larger than this is not computed (bytes): a bias is drawn at random instead, and a mask the
# recipe reads for its structure is then unproven.
MAX_VALUE_BYTES = 1 << 29
# Rounding allowed between the graph (compute dtype, op by op) and the recipe (fp32), in units of the compute
# dtype's epsilon times the magnitude of the terms: errors of a wrong recipe are of the size of the terms.
ROUNDING_ULPS = 16.0


class Unprovable(Exception):
    """The block could not be evaluated (an unbacked size, an operation that fails on concrete values)."""


def check_equivalent(m) -> tuple[bool, str]:
    """(True, "ok") when the recipe of ``m`` (a ``GdpaMatch``) computes the block's P exactly as the graph does
    on every draw; else (False, why)."""
    try:
        with concrete_mode():
            return _Proof(m).run()
    except Unprovable as e:
        return False, f"not proven equal to the graph: {e}"
    except Exception as e:  # noqa: BLE001  (a block that cannot be evaluated is never rewritten)
        return False, f"not proven equal to the graph: evaluating it raised {type(e).__name__}: {e}"


def concrete_mode():
    from contextlib import ExitStack

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    stack = ExitStack()
    stack.enter_context(unset_fake_temporarily())
    stack.enter_context(torch.no_grad())
    return stack


def hint(x: Any) -> Any:
    """A concrete Python value for a size, a shape or a number (a SymInt by its hint)."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        value = x.node.hint
        if value is None:
            raise Unprovable("a size with no hint (data-dependent)")
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(x)](value)
    if isinstance(x, torch.Size):
        return torch.Size(hint(s) for s in x)
    if isinstance(x, (list, tuple)):
        return type(x)(hint(s) for s in x)
    return x


def _axis_sample(n: int, leading: bool) -> torch.Tensor:
    if leading:
        return torch.tensor(sorted({0, n - 1}))
    if n <= MAX_AXIS_SAMPLE:
        return torch.arange(n)
    head = MAX_AXIS_SAMPLE * 3 // 4
    return torch.cat([torch.arange(head), torch.arange(n - (MAX_AXIS_SAMPLE - head), n)])


class _Proof:
    def __init__(self, m):
        self.m = m
        self.recipe = m.recipe
        scores = fxn.example(m.scores)
        self.dtype = scores.dtype
        self.device = scores.device
        self.shape = hint(scores.shape)
        self.gen = torch.Generator(device=self.device).manual_seed(0)
        self.values: dict[fx.Node, Any] = {}
        self.sampled_values: dict[fx.Node, torch.Tensor] = {}
        self.float_data: dict[fx.Node, bool] = {}
        rank = len(self.shape)
        self.sample = [_axis_sample(n, i < rank - 2).to(self.device) for i, n in enumerate(self.shape)]

    # ---- the two sides ----

    def run(self) -> tuple[bool, str]:
        ok, why = self._zero_rows_give_zero()
        if not ok:
            return False, why
        for positive in (False, True):
            s = torch.randn(self._sampled_shape(), generator=self.gen, device=self.device, dtype=torch.float32)
            s = (s.abs() + 0.25 if positive else 2.0 * s).to(self.dtype)
            padded_rows, padded_cols = self._padding()
            if padded_cols is not None:  # a zero row of Q or K gives zero scores
                s = s.masked_fill(padded_cols | padded_rows, 0.0)
            graph_p = self._graph_p(s)
            recipe_p, magnitude = self._recipe_p(s)
            if padded_cols is not None:  # V is zero there (or the row's output is not read): any finite P adds nothing
                unread = padded_cols | padded_rows if self.m.lengths.rows_unread else padded_cols
                graph_p = torch.where(unread & graph_p.isfinite(), recipe_p.to(graph_p.dtype), graph_p)
            ok, why = _agree(graph_p, recipe_p, magnitude, self.dtype)
            if not ok:
                return False, f"the fused op would differ from the graph ({why})"
        return True, "ok"

    def _sampled_shape(self) -> tuple[int, ...]:
        return tuple(len(ix) for ix in self.sample)

    def _graph_p(self, s: torch.Tensor) -> torch.Tensor:
        chain = {self.m.scores: s}
        for node in reversed(self.recipe.nodes):
            args = fx.node.map_arg(node.args, lambda a: self._chain_operand(a, chain))
            kwargs = fx.node.map_arg(node.kwargs, lambda a: self._chain_operand(a, chain))
            chain[node] = fxn.call_node(node, args, kwargs)
        out = chain[self.recipe.nodes[0]] if self.recipe.nodes else s
        if tuple(out.shape) != self._sampled_shape():
            raise Unprovable(f"the chain's result has shape {tuple(out.shape)}, not the scores'")
        return out

    def _chain_operand(self, a: fx.Node, chain: dict) -> Any:
        if a in chain:
            return chain[a]
        return self.sampled(a) if isinstance(fxn.example(a), torch.Tensor) else self.value(a)

    def _recipe_p(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r = self.recipe
        z = s.float()
        for value, divide in r.pre_factors:
            z = _apply(z, self.scalar(value), divide)
        z = z * r.scale
        magnitude = z.abs()
        bias = self._bias()
        if bias is not None:
            z = z + bias.float()
            magnitude = magnitude + self._bias_magnitude()
        act = get_activation(r.activation)
        p = act.torch_fn(z, r.negative_slope)
        if r.activation == "relu_square":
            magnitude = magnitude * (magnitude + 1.0)
        p = p * r.post_scale
        post = torch.full((), abs(r.post_scale), device=self.device)
        for value, divide in r.post_factors + r.key_factors:
            factor = self.scalar(value)
            p = _apply(p, factor, divide)
            post = _apply(post, torch.as_tensor(factor, device=self.device).abs().float(), divide)
        keep = self._kept()
        if keep is not None:
            p = torch.where(keep, p, torch.zeros((), device=self.device))
        if self.m.buffer_mask is not None:
            mask, keep_form, _ = self.m.buffer_mask
            value = self.sampled(mask)
            p = p * (value if keep_form else ~value).to(p.dtype)
        return p, (magnitude + 1.0) * post

    def _bias(self) -> Optional[torch.Tensor]:
        """The bias as the rewrite's ``_bias`` builds it: node terms summed in the compute dtype, each dense mask
        a -finfo.max term, the constant last."""
        r, dtype = self.recipe, self.dtype
        total, constant = None, 0.0
        for term, coef, factors in r.bias_terms:
            if isinstance(term, fx.Node):
                value = self.sampled(term)
                if abs(coef) != 1.0:
                    value = value * abs(coef)
                for factor, divide in factors:
                    value = _apply_as_graph(value, self.scalar(factor), divide)
                total = (value if coef > 0 else -value) if total is None else (
                    total + value if coef > 0 else total - value)
            else:
                constant += coef * term
        if self.m.lengths is None or self.m.lengths.from_padding:
            big = -torch.finfo(dtype).max
            for mask, keep_form in r.dense_masks:
                mask_value = self.sampled(mask)
                term = torch.where(mask_value, 0.0, big) if keep_form else torch.where(mask_value, big, 0.0)
                term = term.to(dtype)
                total = term if total is None else total + term
        if constant != 0.0 and total is None:
            return torch.full((), constant, dtype=torch.promote_types(dtype, torch.float32), device=self.device)
        if constant != 0.0:
            total = total + constant
        if total is not None and total.dtype != dtype:
            total = total.to(dtype)
        return total

    def _bias_magnitude(self) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for term, coef, factors in self.recipe.bias_terms:
            value = self.sampled(term) if isinstance(term, fx.Node) else torch.tensor(float(term))
            value = value.float().abs().to(self.device) * abs(coef)
            for factor, divide in factors:
                value = _apply(value, torch.as_tensor(self.scalar(factor), device=self.device).abs().float(), divide)
            total = total + value
        return total

    def _kept(self) -> Optional[torch.Tensor]:
        """Where the op computes P at all (the causal flag, the padding it skips); None: everywhere."""
        rows, cols = self.sample[-2], self.sample[-1]
        keep = None
        if self.recipe.causal and self.m.buffer_mask is None:
            keep = cols[None, :] <= rows[:, None]
        if self.recipe.window is not None:
            left, right = self.recipe.window
            offsets = cols[None, :] - rows[:, None]
            band = (offsets >= -left) & (offsets <= right)
            keep = band if keep is None else keep & band
        plan = self.m.lengths
        if plan is not None:
            n = self.shape[-1]
            lengths = self._padding_lengths() if plan.from_padding else (
                self.value(plan.lengths).clamp(0, n)[self.sample[0]].to(self.device))
            shape = (-1,) + (1,) * (len(self.shape) - 1)
            valid = torch.ones(self._sampled_shape(), dtype=torch.bool, device=self.device)
            if plan.rows:
                valid = valid & (rows[:, None] < lengths.view(shape))
            if plan.cols:
                valid = valid & (cols[None, :] < lengths.view(shape))
            keep = valid if keep is None else keep & valid
        return keep

    def _zero_rows_give_zero(self) -> tuple[bool, str]:
        """For zero-padded operands, at every coordinate at once: scores of 0 (a zero row of Q or K) must give a finite
        P, and, where padded query rows are skipped and their outputs read, P = 0 below the diagonal (the keys a
        padded row i can meet are those before the length, j < len <= i), whatever the bias and masks there."""
        plan = self.m.lengths
        if plan is None or not plan.from_padding:
            return True, "ok"
        p = self._graph_p(torch.zeros(self._sampled_shape(), dtype=self.dtype, device=self.device))
        if not bool(p.isfinite().all()):
            return False, "the fused op would differ from the graph (a zero score gives NaN or infinity)"
        below = self.sample[-1][None, :] < self.sample[-2][:, None]
        if plan.rows and not plan.rows_unread and bool((p.masked_select(below.expand_as(p)) != 0).any()):
            return False, "the fused op would differ from the graph (a zero query row does not give P = 0)"
        return True, "ok"

    def _padding_lengths(self) -> torch.Tensor:
        """Lengths of the sampled batch entries for operands zero-padded past them: partial ones, so that both
        the kept and the padded coordinates are compared."""
        n = self.shape[-1]
        picks = [max(1, n // 2), max(1, n - 1), max(1, n // 3)]
        return torch.tensor([min(p, n) for p in picks[:len(self.sample[0])]], device=self.device)

    def _padding(self) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(padded query rows, padded key columns) as masks over the sampled scores when the operands are
        zero-padded (the rows' mask all False unless Q is); (None, None) otherwise."""
        plan = self.m.lengths
        if plan is None or not plan.from_padding:
            return None, None
        lengths = self._padding_lengths().view((-1,) + (1,) * (len(self.shape) - 1))
        rows, cols = self.sample[-2], self.sample[-1]
        padded_cols = (cols[None, :] >= lengths).expand(self._sampled_shape())
        padded_rows = (rows[:, None] >= lengths).expand(self._sampled_shape()) if plan.rows else torch.zeros_like(
            padded_cols)
        return padded_rows, padded_cols

    # ---- the graph's values ----

    def scalar(self, x: Any) -> Any:
        if isinstance(x, fx.Node):
            return self.sampled(x) if isinstance(fxn.example(x), torch.Tensor) else self.value(x)
        return hint(x)

    def sampled(self, node: fx.Node) -> torch.Tensor:
        """The value of an operand of the chain at the sampled coordinates (it broadcasts to the scores); a
        floating input's value is drawn at those coordinates alone."""
        if node in self.sampled_values:
            return self.sampled_values[node]
        ev = fxn.example(node)
        shape = hint(ev.shape)
        offset = len(self.shape) - len(shape)
        if offset < 0:
            raise Unprovable(f"{node.name} has more dims than the scores")
        if any(size not in (1, self.shape[d + offset]) for d, size in enumerate(shape)):
            raise Unprovable(f"{node.name} does not broadcast to the scores")
        sampled_shape = [1 if size == 1 else len(self.sample[d + offset]) for d, size in enumerate(shape)]
        number = fxn.shape_only_fill(node)
        if number is not None:  # a tensor of one number shaped like its input: whatever that input holds
            self.sampled_values[node] = torch.full(sampled_shape, number, dtype=ev.dtype, device=self.device)
            return self.sampled_values[node]
        too_large = _numel(shape) * ev.element_size() > MAX_VALUE_BYTES
        if node not in self.values and (self._is_float_data(node) or (
                too_large and node.op in ("placeholder", "get_attr"))):
            value = self._draw(ev, sampled_shape)
        elif node not in self.values and too_large and (
                fxn.is_elementwise(node) or fxn.is_cast(node) or fxn.is_expand(node)):
            value = self._sampled_op(node, sampled_shape)
        else:
            value = self.value(node)
            for d, size in enumerate(shape):
                if size != 1:
                    value = value.index_select(d, self.sample[d + offset].to(value.device))
        self.sampled_values[node] = value.to(self.device)
        return self.sampled_values[node]

    def _sampled_op(self, node: fx.Node, sampled_shape: list[int]) -> torch.Tensor:
        """An elementwise op (a cast, an expand) too large to compute whole, at the sampled coordinates alone: from
        its operands there, each of which broadcasts to it and so to the scores."""
        if fxn.is_expand(node):
            return self.sampled(node.args[0]).expand(sampled_shape)
        if fxn.is_cast(node):
            return self.sampled(node.args[0]).to(fxn.example(node).dtype).expand(sampled_shape)

        def operand(a):
            return self.sampled(a) if fxn.is_tensor_node(a) else self.value(a)

        args = fx.node.map_arg(node.args, operand)
        kwargs = fx.node.map_arg(node.kwargs, operand)
        return fxn.call_node(node, args, kwargs).expand(sampled_shape)

    def value(self, node: Any) -> Any:
        if not isinstance(node, fx.Node):
            return hint(node)
        if node in self.values:
            return self.values[node]
        ev = fxn.example(node)
        if not isinstance(ev, torch.Tensor):
            if ev is None:
                raise Unprovable(f"{node.name}: no example value")
            value = hint(ev)  # a size or a number: Dynamo guards on it, or it is symbolic with a hint
        elif node.op in ("placeholder", "get_attr") or self._is_float_data(node):
            value = self._draw(ev)
        else:
            shape = hint(ev.shape)
            if _numel(shape) * ev.element_size() > MAX_VALUE_BYTES:
                raise Unprovable(f"{node.name} is too large to evaluate ({tuple(shape)})")
            args = fx.node.map_arg(node.args, self.value)
            kwargs = fx.node.map_arg(node.kwargs, self.value)
            value = fxn.call_node(node, args, kwargs)
        self.values[node] = value
        return value

    def _is_float_data(self, node: fx.Node) -> bool:
        """A floating value that depends on a floating graph input (or is one): drawn, not computed."""
        stack = [node]
        while stack:  # post-order without recursion: the path back to the inputs can be the whole model
            cur = stack[-1]
            if cur in self.float_data:
                stack.pop()
                continue
            ev = fxn.example(cur)
            if not (isinstance(ev, torch.Tensor) and ev.dtype.is_floating_point):
                self.float_data[cur] = False
            elif cur.op in ("placeholder", "get_attr"):
                self.float_data[cur] = True
            else:
                pending = [a for a in cur.all_input_nodes if a not in self.float_data]
                if pending:
                    stack.extend(pending)
                    continue
                self.float_data[cur] = any(self.float_data[a] for a in cur.all_input_nodes)
            stack.pop()
        return self.float_data[node]

    def _draw(self, ev: torch.Tensor, shape=None) -> torch.Tensor:
        shape = hint(ev.shape) if shape is None else shape
        if _numel(shape) * 8 > MAX_VALUE_BYTES:
            raise Unprovable(f"an input of shape {tuple(shape)} is too large to draw")
        device = ev.device
        gen = self.gen if device == self.device else torch.Generator(device=device).manual_seed(1)
        if ev.dtype.is_floating_point or ev.dtype.is_complex:
            return torch.randn(shape, generator=gen, device=device).to(ev.dtype)
        if ev.dtype == torch.bool:
            value = torch.rand(shape, generator=gen, device=device) < 0.5
            if value.dim() >= 2 and value.shape[-2] >= 2:
                value[..., 0, :] = False
                value[..., 1, :] = True
            return value
        # lengths and positions land on sampled coordinates, so that a boundary they set is compared
        n = max(self.shape[-1], 1)
        choices = torch.cat([self.sample[-1].cpu(), torch.tensor([n])])
        picks = torch.randint(0, len(choices), shape, generator=torch.Generator().manual_seed(2))
        value = choices[picks].to(device)
        flat = value.view(-1)
        if flat.numel() >= 2:
            flat[0], flat[1] = 0, n
        return value.to(ev.dtype)


def _numel(shape) -> int:
    total = 1
    for s in shape:
        total *= int(s)
    return total


def _apply_as_graph(x: torch.Tensor, factor: Any, divide: bool) -> torch.Tensor:
    """x times (or over) the factor as the rewrite's graph computes it: in the operands' own dtypes."""
    return x / factor if divide else x * factor


def _apply(x: torch.Tensor, factor: Any, divide: bool) -> torch.Tensor:
    if isinstance(factor, torch.Tensor):
        factor = factor.float()
    return x / factor if divide else x * factor


def _agree(graph_p: torch.Tensor, recipe_p: torch.Tensor, magnitude: torch.Tensor,
           dtype: torch.dtype) -> tuple[bool, str]:
    """NaN and infinity where the graph has them; elsewhere within the compute dtype's rounding of the terms."""
    g, r = graph_p.double(), recipe_p.double()
    if not torch.equal(g.isnan(), r.isnan()):
        where = "the fused op" if bool((r.isnan() & ~g.isnan()).any()) else "the graph"
        return False, f"NaN where {'the graph has none' if where == 'the fused op' else 'the fused op has none'}"
    inf_g, inf_r = g.isinf(), r.isinf()
    if not torch.equal(inf_g, inf_r) or not torch.equal(g[inf_g], r[inf_r]):
        return False, "infinities differ"
    finite = ~(g.isnan() | inf_g)
    eps = torch.finfo(dtype).eps
    allowed = ROUNDING_ULPS * eps * (magnitude.double().expand_as(g) + g.abs())
    error = (g - r).abs()
    bad = finite & (error > allowed)
    if bool(bad.any()):
        worst = float(error[bad].max())
        return False, f"{int(bad.sum())} of {g.numel()} sampled entries differ, by up to {worst:.3g}"
    return True, "ok"

