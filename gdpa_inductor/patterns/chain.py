"""The elementwise chain between the two matmuls of GDPA, read into a recipe for the fused op.

Walking back from P (the left operand of the second matmul) to S (the output of the first), every node
must have exactly one user (so neither S nor P is used elsewhere) and be one of: a scale (float, SymInt
or one-element tensor), an additive bias before the activation, one activation of the table (relu
followed by a square is relu_square; one written out in elementwise ops, ``composite_activation.py``, whose
nodes count as one), a causal mask (before the activation only when the fill value
makes the activation exactly 0), a dtype cast or copy, or a no-op dropout. Anything else stops the match
with the reason. Nothing here edits the graph.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..kernels.activations import ActivationName, get_activation
from . import fx_nodes as fxn
from .causal_mask import band_window, causal_mask_kind, constant_value
from .composite_activation import MAX_NODES, Composite, Refusal, find_composite, is_math


@dataclass
class ChainRecipe:
    activation: ActivationName = "identity"
    negative_slope: float = 0.01
    scale: float = 1.0
    post_scale: float = 1.0
    # Scales that are not Python floats (SymInt divisors, learned one-element tensors): applied to q before
    # the op (pre-activation) or to the output (post-activation); (value, divide) pairs.
    pre_factors: list[tuple[Any, bool]] = field(default_factory=list)
    post_factors: list[tuple[Any, bool]] = field(default_factory=list)
    # Floating tensors of one value per key after the activation ([..., 1, Nk]): (P ⊙ c) V = P (cᵀ ⊙ V), so they
    # scale V's rows; (value, divide) pairs.
    key_factors: list[tuple[Any, bool]] = field(default_factory=list)
    # Additive terms before the activation: (node or float, coefficient, factors): the coefficient is the sign
    # times the Python-number scales applied after the term; factors, the other scales after it (value, divide).
    bias_terms: list[tuple[Any, float, tuple]] = field(default_factory=list)
    causal: bool = False
    # A band around the diagonal, -left <= j - i <= right (both >= 0), proven by evaluating a constant mask.
    window: Optional[tuple[int, int]] = None
    # The masks the causal flag was proven from: (mask node, True if it marks the kept entries).
    causal_masks: list[tuple[fx.Node, bool]] = field(default_factory=list)
    mask_note: str = "none"
    # Fill values of causal masks before the activation, checked once the activation is known.
    pre_mask_fills: list[tuple[fx.Node, Any]] = field(default_factory=list)
    # Other boolean masks, (mask node, True if it marks the kept entries), fused as an additive
    # -finfo.max bias: exact for activations with act(-max) = act'(-max) = 0 (checked at the end).
    dense_masks: list[tuple[fx.Node, bool]] = field(default_factory=list)
    masks_inexact_as_bias: Optional[str] = None  # why the dense masks cannot be a -finfo.max bias
    nodes: list[fx.Node] = field(default_factory=list)  # the chain, from P back to S (exclusive)
    # Users of the chain (or of S) that read no value of it: dead ones, and ``x.expand_as(chain)`` of a shape the
    # scores' operands spell; the rewrite drops or re-points them (``detached_user``).
    detached_users: list[fx.Node] = field(default_factory=list)
    # Fill values given as tensors of one number (``torch.zeros_like(p)``), read as that number; the rewrite
    # erases them with the chain.
    constant_fills: list[fx.Node] = field(default_factory=list)


class ChainMismatch(Exception):
    """The chain is not GDPA (or not one we can fuse exactly); the message says why."""


def _other(node: fx.Node, cur: fx.Node) -> tuple[Any, int]:
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    if a is cur and b is not cur:
        return b, 1
    if b is cur and a is not cur:
        return a, 0
    raise ChainMismatch(f"{node.name}: both operands come from the chain")


def _scale_value(x: Any) -> Optional[Any]:
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Real):
        return float(x)
    if fxn.scalar_value(x) is not None or fxn.is_one_element_tensor(x):
        return x
    return None


def _fill_zeroes_activation(fill: Any, activation: ActivationName, slope: float, dtype: torch.dtype,
                            with_grad: bool = True) -> bool:
    """act(fill) == 0 exactly (no NaN) in the chain's dtype and in fp32 (what the kernels compute in), and with
    ``with_grad`` act'(fill) == 0 too.

    A fill before the activation that the op drops (a causal flag, skipped padding) needs only the value: the
    filled entries then add act(fill)·v = 0 in eager, and masked_fill's backward zeroes their gradient whatever
    act' is there. A mask the op adds as a -finfo.max bias is computed in the kernel, so act' must vanish too."""
    if not isinstance(fill, numbers.Real):
        return False
    act = get_activation(activation)
    for dt in {dtype if dtype.is_floating_point else torch.float32, torch.float32}:
        x = torch.tensor([float(fill)], dtype=dt)
        if not bool((act.torch_fn(x, slope) == 0).all()):
            return False
        if with_grad and not bool((act.torch_grad(x, slope) == 0).all()):
            return False
    return True


def read_chain(p: fx.Node, s: fx.Node) -> ChainRecipe:
    """The recipe for the chain from S (exclusive) to P (inclusive). Raises ChainMismatch."""
    steps: list[fx.Node] = []
    detached: list[fx.Node] = []
    composites: dict[fx.Node, Composite] = {}  # written-out activations, by their last node
    inner: set[fx.Node] = set()  # their other nodes
    grouped: set[fx.Node] = set()  # all their nodes
    refusals: list[Refusal] = []  # elementwise ops that read a value twice and are no activation
    cur = p
    while cur is not s:
        if not isinstance(cur, fx.Node) or cur.op not in ("call_function", "call_method"):
            raise ChainMismatch(f"{getattr(cur, 'name', cur)}: not an operation between the matmuls")
        readers = _value_readers(cur, detached, s.all_input_nodes, grouped, steps)
        if readers != 1:
            raise ChainMismatch(_refusal(cur, refusals, grouped)
                                or f"{cur.name}: the intermediate is also used elsewhere ({readers} users)")
        composite, refusal = (find_composite(cur) if fxn.activation_of(cur) is None and _reads_twice(cur)
                              else (None, None))
        if refusal is not None:
            refusals.append(refusal)
        if composite is not None:
            composites[cur] = composite
            inner.update(n for n in composite.members if n is not cur)
            grouped.update(composite.members)
            steps += reversed(composite.members)
            cur = composite.source
            continue
        steps.append(cur)
        cur = _chain_input(cur)
    readers = _value_readers(s, detached, s.all_input_nodes, grouped, steps)
    if readers != 1:
        raise ChainMismatch(_refusal(s, refusals, grouped)
                            or f"{s.name}: the scores are also used elsewhere ({readers} users)")

    recipe = ChainRecipe(nodes=steps, detached_users=detached)
    seen_activation = False
    seen_bias = False
    dtype = fxn.example(s).dtype
    # steps run from P back to S; interpret them from S forwards
    ordered = list(reversed(steps))
    i = 0
    while i < len(ordered):
        node = ordered[i]
        if node in inner:
            i += 1
            continue
        prev = ordered[i - 1] if i else s
        act = (composites[node].activation, 0.01) if node in composites else fxn.activation_of(node)
        if act is not None:
            if seen_activation:
                raise ChainMismatch(f"{node.name}: a second activation")
            seen_activation = True
            recipe.activation, recipe.negative_slope = act
            squared = fxn.SQUARED_ACTIVATIONS.get(act[0])
            if squared is not None and i + 1 < len(ordered) and fxn.is_square_of(ordered[i + 1], node):
                recipe.activation = squared
                i += 1
        elif fxn.is_passthrough(node) or fxn.is_noop_dropout(node):
            pass
        elif fxn.is_mul(node) or fxn.is_div(node):
            _read_product(node, prev, recipe, seen_activation, seen_bias)
        elif fxn.is_add(node) or fxn.is_sub(node):
            if seen_activation:
                raise ChainMismatch(f"{node.name}: an addition after the activation")
            other, pos = _other(node, prev)
            sign = -1.0 if fxn.is_sub(node) else 1.0
            if fxn.is_sub(node) and pos == 0:
                raise ChainMismatch(f"{node.name}: the scores are subtracted from something")
            alpha = fxn.arg(node, 2, "alpha", 1)
            if alpha != 1:
                raise ChainMismatch(f"{node.name}: add/sub with alpha")
            if isinstance(other, numbers.Real) and not isinstance(other, bool):
                recipe.bias_terms.append((float(other), sign, ()))
            elif fxn.is_tensor_node(other) and _same_shape(node, prev):
                recipe.bias_terms.append((other, sign, ()))
            else:
                raise ChainMismatch(f"{node.name}: added term is neither a number nor a bias of the scores' shape")
            seen_bias = True
        elif fxn.fn_or_method(node, (torch.masked_fill,), ("masked_fill",)) or fxn.fn_or_method(node, (torch.where,)):
            _read_mask(node, prev, recipe, seen_activation, dtype, s)
        else:
            raise ChainMismatch(f"{node.name}: unsupported op {_describe(node)} between the matmuls")
        i += 1
    if recipe.dense_masks and not _fill_zeroes_activation(-torch.finfo(dtype).max, recipe.activation,
                                                          recipe.negative_slope, dtype):
        # Decided by the pattern: a padding length mask is skipped (exact for any activation), any other
        # mask would be a -finfo.max bias, which is not exact here.
        recipe.masks_inexact_as_bias = (
            f"a non-causal mask with {recipe.activation}: only fused as a -finfo.max bias, which is not exact "
            "for this activation"
        )
    for node, fill in recipe.pre_mask_fills:
        if not _fill_zeroes_activation(fill, recipe.activation, recipe.negative_slope, dtype, with_grad=False):
            raise ChainMismatch(
                f"{node.name}: fill {fill!r} before {recipe.activation} does not give exactly 0 "
                "(e.g. act(-inf) is NaN for gelu/silu/hardswish; -finfo.max is exact)"
            )
    return recipe


# Copies and views a graph may leave unused (x-transformers keeps ``sim.clone()`` for its intermediates): dropping one
# changes nothing. An unused in-place method writes its input, so none is here.
DEAD_USERS = ("clone", "detach", "contiguous", "float", "half", "bfloat16", "to", "view", "reshape", "transpose",
              "permute", "unsqueeze", "squeeze", "expand")


def _value_readers(node: fx.Node, detached: list[fx.Node], sources: list[fx.Node], grouped: set[fx.Node],
                   chain: list[fx.Node]) -> int:
    """How many users of ``node`` read its values, the nodes of a written-out activation (``grouped``) counted as
    one, and a tensor of one number shaped like ``node`` that only the ``chain`` reads (a fill value) not at all;
    the others (``detached_user``) are appended to ``detached``."""
    readers, into_composite = 0, False
    for user in node.users:
        if user in grouped:
            into_composite = True
        elif fxn.reads_only_shape_of(user, node) and user.users and all(_fills(u, user, chain) for u in user.users):
            continue
        elif detached_user(user, node, sources):
            detached.append(user)
        else:
            readers += 1
    return readers + into_composite


def _fill_number(fill: fx.Node) -> Optional[float]:
    """The one number a tensor fill value holds at every entry: a ``shape_only_fill``, or a tensor computed from
    constants (``torch.tensor(c)``, ``torch.zeros(())``) whose entries are all equal; else None."""
    number = fxn.shape_only_fill(fill)
    if number is not None:
        return number
    value = constant_value(fill)
    if value is None or value.numel() == 0 or value.dtype.is_complex:
        return None
    first = value.reshape(-1)[0]
    if not bool(((value == first) | (value.isnan() & first.isnan())).all()):
        return None
    return float(first)


def _fills(node: fx.Node, value: fx.Node, chain: list[fx.Node]) -> bool:
    """``node``, a step of the chain, takes ``value`` as the fill of its mask and nothing else."""
    if node not in chain:
        return False
    if node.target in ("masked_fill", torch.masked_fill):
        args = [*node.args[:2], *(v for k, v in node.kwargs.items() if k != "value")]
        return value not in args
    if node.target is torch.where:
        return len(node.args) == 3 and node.args[0] is not value and (node.args[1] is value) != (node.args[2] is value)
    return False


def _refusal(node: fx.Node, refusals: list[Refusal], grouped: set[fx.Node]) -> Optional[str]:
    """Why ``node`` is read more than once, where every reader is within elementwise ops refused as an activation."""
    for refusal in refusals:
        if all(u in refusal.members or u in grouped for u in node.users):
            return refusal.reason
    return None


def _reads_twice(node: fx.Node) -> bool:
    """Whether some value is read twice within the elementwise math that ends at ``node`` (the cheap test before
    ``find_composite``, which evaluates)."""
    seen, reads, stack = set(), {}, [node]
    while stack and len(seen) < MAX_NODES:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        for a in cur.all_input_nodes:
            reads[a] = reads.get(a, 0) + 1
            if a.op in ("call_function", "call_method") and is_math(a):
                stack.append(a)
    return any(count > 1 for count in reads.values())


def detached_user(user: fx.Node, node: fx.Node, sources: list[fx.Node]) -> Optional[str]:
    """"dead": ``user`` is an unused copy or view (``DEAD_USERS``); "shape": ``user`` is ``x.expand_as(node)`` (x not
    ``node``), which reads only that shape, and ``shape_spelling`` can spell the shape from ``sources`` (the rewrite
    spells it out); None: ``user`` reads ``node``'s values, or may write them (an in-place method is never dropped)."""
    if not user.users and not user.kwargs and fxn.fn_or_method(user, (torch.clone,), DEAD_USERS):
        return "dead"
    if (fxn.fn_or_method(user, (), ("expand_as",)) and len(user.args) == 2 and user.args[1] is node
            and user.args[0] is not node and shape_spelling(node, sources) is not None):
        return "shape"
    return None


def shape_spelling(node: fx.Node, sources: list[fx.Node]) -> Optional[list]:
    """The node's shape from what stays in the graph: each size an int, or (source, dim) for a symbolic size that
    dim of one of ``sources`` has; None when a symbolic size is in none of them."""
    ev = fxn.example(node)
    if not isinstance(ev, torch.Tensor):
        return None
    spelled = []
    for size in ev.shape:
        if type(size) is int:
            spelled.append(size)
            continue
        found = next(((src, d) for src in sources for d, other in enumerate(_shape_of(src))
                      if type(other) is not int and statically_known_true(other == size)), None)
        if found is None:
            return None
        spelled.append(found)
    return spelled


def _shape_of(node: fx.Node) -> tuple:
    ev = fxn.example(node)
    return tuple(ev.shape) if isinstance(ev, torch.Tensor) else ()


def _chain_input(node: fx.Node) -> fx.Node:
    """The argument of an elementwise step that carries the scores."""
    if (fxn.activation_of(node) is not None or fxn.is_passthrough(node) or fxn.is_noop_dropout(node)) and (
        fxn.is_tensor_node(node.args[0])
    ):
        return node.args[0]  # single-input steps: never guess among other same-shape arguments
    if fxn.fn_or_method(node, (torch.where,)):
        cands = [a for a in node.args[1:3] if fxn.is_tensor_node(a) and not _is_bool(a)]
    else:
        cands = [a for a in node.args if fxn.is_tensor_node(a) and not _is_bool(a)]
    if not cands:
        raise ChainMismatch(f"{node.name}: no tensor operand")
    # the scores operand has the full scores shape; a bias may broadcast, a mask is boolean
    full = [a for a in cands if _same_shape(node, a)]
    pick = full or cands
    if len(pick) > 1 and not (fxn.is_square_of(node, pick[0])):
        # two full-shape operands: the chain is the one that is not a leaf input
        ops = [a for a in pick if a.op in ("call_function", "call_method")]
        pick = ops or pick
    return pick[0]


def _is_bool(node: Any) -> bool:
    ev = fxn.example(node)
    return isinstance(ev, torch.Tensor) and ev.dtype == torch.bool


def _broadcasts_to(mask: fx.Node, scores: fx.Node) -> bool:
    """The mask broadcasts to the scores without growing them."""
    return fxn.broadcasts_into(fxn.example(mask).shape, fxn.example(scores).shape)


def _constant_everywhere(mask: fx.Node, scores: fx.Node, value: bool) -> bool:
    """A mask computed from constants (``constant_value``) that holds ``value`` (as a truth value) at every entry
    and broadcasts to the scores without growing them."""
    if not (isinstance(mask, fx.Node) and fxn.is_tensor_node(mask) and _broadcasts_to(mask, scores)):
        return False
    found = constant_value(mask)
    if found is None or found.numel() == 0:
        return False
    truth = found != 0
    return bool(truth.all()) if value else not bool(truth.any())


def _is_row_factor(factor: fx.Node, scores: fx.Node) -> bool:
    """A floating tensor of one value per row of the scores: it broadcasts to them and its last dim is 1."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    ev = fxn.example(factor)
    return (ev.dtype.is_floating_point and ev.dim() >= 1 and statically_known_true(ev.shape[-1] == 1)
            and _broadcasts_to(factor, scores))


def _is_key_factor(factor: fx.Node, scores: fx.Node) -> bool:
    """A floating tensor of one value per key of the scores: it broadcasts to them and its second-last dim is 1."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    ev = fxn.example(factor)
    return (ev.dtype.is_floating_point and ev.dim() >= 2 and statically_known_true(ev.shape[-2] == 1)
            and _broadcasts_to(factor, scores))


def _same_shape(a: fx.Node, b: fx.Node) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    ea, eb = fxn.example(a), fxn.example(b)
    if ea.dim() != eb.dim():
        return False
    return all(statically_known_true(x == y) for x, y in zip(ea.shape, eb.shape))


def _read_product(node, prev, recipe: ChainRecipe, after_activation: bool, seen_bias: bool):
    other, pos = _other(node, prev)
    divide = fxn.is_div(node)
    if divide and pos == 0:
        raise ChainMismatch(f"{node.name}: the scores divide something")
    if divide and fxn.arg(node, 2, "rounding_mode", None) is not None:
        raise ChainMismatch(f"{node.name}: division with rounding")
    if after_activation and fxn.is_tensor_node(other) and not fxn.is_one_element_tensor(other):
        # A bool mask, or a {0,1} float one (HSTU multiplies by a float tril): causal becomes the flag, any
        # other boolean mask a -max bias; a float tensor that is not provably causal could hold anything.
        if not divide and _constant_everywhere(other, node, True):
            return  # times a constant mask of ones (HSTU's non-causal mask: the diagonal or any other entry)
        if causal_mask_kind(other, fxn.example(node)) == "keep":
            recipe.causal, recipe.mask_note = True, "causal (multiply after the activation)"
            recipe.causal_masks.append((other, True))
            return
        band = None if divide else band_window(other, fxn.example(node))
        if band is not None and band[0] == "keep" and recipe.window is None:
            recipe.window = band[1]
            recipe.mask_note = f"band {band[1]} around the diagonal (multiply after the activation)"
            return
        mask = other if _is_bool(other) else fxn.bool_cast_source(other)
        if mask is not None and not divide and _broadcasts_to(mask, node):
            recipe.dense_masks.append((mask, True))
            recipe.mask_note = "dense boolean mask (as a bias)"
            return
        if _is_row_factor(other, node):
            # (P ⊙ a) V = a ⊙ (P V) for a factor a constant along the keys: the op's output rows are scaled
            recipe.post_factors.append((other, divide))
            return
        if _is_key_factor(other, node):
            recipe.key_factors.append((other, divide))
            return
        raise ChainMismatch(f"{node.name}: multiplied by a tensor that is neither a scalar, a boolean mask nor "
                            "one factor per query row or per key")
    value = _scale_value(other)
    if value is None:
        raise ChainMismatch(f"{node.name}: multiplied by a tensor that is neither a scalar nor a causal mask")
    if not after_activation and seen_bias and not isinstance(value, float) and any(
            not isinstance(term, fx.Node) for term, _, _ in recipe.bias_terms):
        raise ChainMismatch(f"{node.name}: a tensor or symbolic scale applied after a constant bias")
    # c · (S + b) = c·S + c·b: the bias terms so far take the factor with the scores
    if isinstance(value, float):
        factor = 1.0 / value if divide else value
        if after_activation:
            recipe.post_scale *= factor
        else:
            recipe.scale *= factor
            recipe.bias_terms = [(term, coef * factor, fs) for term, coef, fs in recipe.bias_terms]
    else:
        (recipe.post_factors if after_activation else recipe.pre_factors).append((value, divide))
        if not after_activation:
            recipe.bias_terms = [(term, coef, (*fs, (value, divide))) for term, coef, fs in recipe.bias_terms]


def _read_mask(node, prev, recipe: ChainRecipe, after_activation: bool, dtype, s):
    out_ev = fxn.example(node)
    if node.target in ("masked_fill", torch.masked_fill):
        mask, fill, keep_form = node.args[1], node.args[2], False
    else:
        cond, a, b = node.args[0], node.args[1], node.args[2]
        if a is prev:
            mask, fill, keep_form = cond, b, True
        elif b is prev:
            mask, fill, keep_form = cond, a, False
        else:
            raise ChainMismatch(f"{node.name}: torch.where without the scores")
    if isinstance(fill, fx.Node):
        number = _fill_number(fill)
        if number is None:
            raise ChainMismatch(f"{node.name}: mask fill value is a tensor")
        recipe.constant_fills.append(fill)
        fill = number
    if _constant_everywhere(mask, node, keep_form):
        return  # the mask keeps every entry: nothing is filled
    kind = causal_mask_kind(mask, out_ev)
    wanted = "keep" if keep_form else "drop"
    band = band_window(mask, out_ev) if kind != wanted else None
    if band is not None and band[0] == wanted and recipe.window is None:
        if after_activation and not (isinstance(fill, numbers.Real) and float(fill) == 0.0):
            raise ChainMismatch(f"{node.name}: masked after the activation with {fill!r}, not 0")
        if not after_activation:
            recipe.pre_mask_fills.append((node, fill))
        recipe.window = band[1]
        recipe.mask_note = f"band {band[1]} around the diagonal"
        return
    if kind != wanted:
        if not (_is_bool(mask) and _broadcasts_to(mask, node)):
            raise ChainMismatch(f"{node.name}: mask is neither provably causal nor a boolean tensor")
        if after_activation and not (isinstance(fill, numbers.Real) and float(fill) == 0.0):
            raise ChainMismatch(f"{node.name}: masked after the activation with {fill!r}, not 0")
        if not after_activation:
            recipe.pre_mask_fills.append((node, fill))
        recipe.dense_masks.append((mask, keep_form))
        recipe.mask_note = "dense boolean mask (as a bias)"
        return
    if after_activation:
        if not (isinstance(fill, numbers.Real) and float(fill) == 0.0):
            raise ChainMismatch(f"{node.name}: masked after the activation with {fill!r}, not 0")
        recipe.mask_note = "causal (zero fill after the activation)"
    else:
        recipe.pre_mask_fills.append((node, fill))
        recipe.mask_note = f"causal (fill {fill!r} before the activation)"
    recipe.causal = True
    recipe.causal_masks.append((mask, keep_form))


def _describe(node: fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))
