"""An activation written out in elementwise ops that read their input more than once: ``s * torch.sigmoid(s)`` (silu),
``0.5 * s * (1 + torch.erf(s / math.sqrt(2)))`` (gelu), GPT-2's tanh formula (gelu_tanh), ``s * F.relu6(s + 3) / 6``
(hardswish).

Such a spelling is a small subgraph from one node X to a node Y whose every step is a pure elementwise function of X
and of numbers. It is taken for an activation of the table only where both agree, values and autograd's gradients,
NaN and infinity included, on a grid of inputs and the special ones (zero, kinks, overflow, ±inf, NaN), in float64
tightly and in the graph's dtype and fp32 in their NaN and infinity positions and to their rounding. Spellings that
differ anywhere on it are not GDPA here: ``clamp(s, min=0)`` has gradient 1 at 0 where relu has 0, and
``torch.where(s > 0, s, 0)`` is 0 at NaN where relu is NaN. The block's proof (``equivalence.py``) then evaluates the
chain as the graph computes it, as for any other block.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..kernels.activations import ACTIVATIONS, ActivationName
from . import fx_nodes as fxn

# Pure elementwise functions of their tensor operands and numbers beyond those the matcher already reads
# (``fx_nodes.is_elementwise``: arithmetic, comparisons, logic; the table's activation spellings; casts): what else a
# written-out activation is made of.
_MATH_FUNCTIONS = (
    operator.pow, torch.pow, torch.true_divide, torch.square, torch.tanh, torch.erf, torch.exp, torch.sqrt,
    torch.reciprocal, torch.abs, torch.clamp, torch.clamp_min, torch.clamp_max, torch.minimum, torch.maximum,
    torch.special.expit, torch.special.erf, torch.zeros_like, torch.ones_like, F.tanh, F.relu6, F.hardtanh,
    F.hardsigmoid, torch._C._nn.hardtanh, torch._C._nn.hardsigmoid,
)
_MATH_METHODS = (
    "pow", "square", "tanh", "erf", "exp", "sqrt", "reciprocal", "abs", "clamp", "clamp_min", "clamp_max", "truediv",
    "__add__", "__sub__", "__mul__", "__truediv__", "__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__neg__",
    "__pow__", "__rpow__",
)
# How far back from Y the search for X goes (nodes): written-out activations are a handful of ops.
MAX_NODES = 24


@dataclass(frozen=True)
class Refusal:
    """Elementwise ops (``members``) that read one value more than once and give no activation of the table."""

    reason: str
    members: frozenset[fx.Node]


@dataclass(frozen=True)
class Composite:
    """Y = act(X): ``members`` the subgraph's nodes (Y among them) in graph order, X its one tensor input."""

    activation: ActivationName
    root: fx.Node
    source: fx.Node
    members: tuple[fx.Node, ...]


def is_math(node: fx.Node) -> bool:
    """Whether ``node`` computes a pure elementwise function of its tensor operands and numbers."""
    if "out" in node.kwargs:
        return False
    return (fxn.is_elementwise(node) or fxn.is_passthrough(node) or fxn.activation_of(node) is not None
            or fxn.fn_or_method(node, _MATH_FUNCTIONS, _MATH_METHODS))


def _tensor_inputs(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(fxn.example(a), torch.Tensor)]


def _members(root: fx.Node, source: fx.Node) -> Optional[list[fx.Node]]:
    """The nodes on the paths from ``source`` to ``root``, when every tensor any of them reads is ``source`` or one of
    them; else None."""
    members, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node in members:
            continue
        if len(members) >= MAX_NODES or node.op not in ("call_function", "call_method") or not is_math(node):
            return None
        members.add(node)
        stack += [a for a in _tensor_inputs(node) if a is not source]
    return sorted(members, key=_position(root.graph))


def _position(graph: fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


def find_composite(root: fx.Node) -> tuple[Optional[Composite], Optional[Refusal]]:
    """(``root`` as a written-out activation of the table, None): the nearest X for which the nodes from X to
    ``root`` are pure elementwise math that read X at least twice and are read by nothing else, and agree with the
    activation (``matches``). (None, why) where such nodes agree with no activation; (None, None) where there are
    none."""
    if root.op not in ("call_function", "call_method") or not is_math(root):
        return None, None
    refused = None
    position = _position(root.graph)
    ancestors, stack = set(), [root]
    while stack and len(ancestors) < MAX_NODES:
        node = stack.pop()
        for a in _tensor_inputs(node):
            if a not in ancestors:
                ancestors.add(a)
                if a.op in ("call_function", "call_method") and is_math(a):
                    stack.append(a)
    for source in sorted(ancestors, key=position, reverse=True):
        members = _members(root, source)
        if members is None:
            continue
        reads = sum(1 for m in members for a in m.all_input_nodes if a is source)
        inner = set(members) - {root}
        if reads < 2 or any(u not in inner and u is not root for m in inner for u in m.users):
            continue
        example = fxn.example(source)
        if not (isinstance(example, torch.Tensor) and example.dtype.is_floating_point):
            continue
        numbers = [a for m in members for a in m.all_input_nodes if a is not source and a not in members]
        if numbers:
            # a value the program computes (math.pi read through a tensor under dynamic shapes) may differ next call
            refused = refused or Refusal(f"{root.name}: the elementwise ops from {source.name} read {numbers[0].name},"
                                         " a number the program computes when it runs", frozenset(members))
            continue
        activation = matches(members, root, source, example.dtype)
        if activation is not None:
            return Composite(activation, root, source, tuple(members)), None
        refused = refused or Refusal(
            f"{root.name}: the elementwise ops from {source.name} read it {reads} times and are no activation of the "
            "table (their values or gradients differ from every one's, NaN and infinity included)", frozenset(members))
    return None, refused


def _probe_values(dtype: torch.dtype) -> torch.Tensor:
    grid = torch.linspace(-12.0, 12.0, 2401, dtype=torch.float64)
    special = [0.0, 1e-30, 1e-8, 1e-3, 0.5, 1.0, 2.5, 3.0, 5.0, 8.0, 20.0, 50.0, 88.0, 89.0, 100.0, 700.0, 710.0,
               1e3, 1e4, 1e30, 1e300, math.inf]
    x = torch.cat([grid, torch.tensor(special + [-v for v in special] + [math.nan], dtype=torch.float64)])
    return x.to(dtype)


def _evaluate(members, root, source, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().requires_grad_()
    values = {source: x}
    for node in members:
        args = fx.node.map_arg(node.args, values.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
        values[node] = fxn.call_node(node, args, kwargs)
    y = values[root]
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y), allow_unused=True)
    return y.detach(), grad if grad is not None else torch.zeros_like(x)


def _agree(a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, tolerance: float) -> bool:
    if a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    inf = a.isinf() | b.isinf()
    if not torch.equal(a[inf], b[inf]):
        return False
    finite = ~(inf | a.isnan())
    a, b, scale = a[finite].double(), b[finite].double(), x[finite].double().abs() + 1.0
    return bool(((a - b).abs() <= tolerance * scale * scale).all())


def matches(members, root, source, dtype: torch.dtype) -> Optional[ActivationName]:
    """The table's activation whose values and gradients the subgraph gives on the probe values, or None."""
    with torch.enable_grad():
        try:
            computed = {dt: _evaluate(members, root, source, _probe_values(dt))
                        for dt in dict.fromkeys((torch.float64, torch.float32, dtype))}
        except Exception:  # noqa: BLE001  (a spelling that fails on concrete values is not an activation)
            return None
        for act in ACTIVATIONS.values():
            if act.name in ("identity", "leaky_relu"):
                continue
            if all(_same_as(act, dt, *computed[dt]) for dt in computed):
                return act.name
    return None


def _same_as(act, dtype: torch.dtype, value: torch.Tensor, grad: torch.Tensor) -> bool:
    x = _probe_values(dtype).requires_grad_()
    want = act.torch_fn(x, 0.01)
    (want_grad,) = torch.autograd.grad(want, x, torch.ones_like(want))
    # float64 decides the function; the narrower dtypes, where it overflows or loses its precision
    tolerance = 1e-9 if dtype == torch.float64 else 64.0 * torch.finfo(dtype).eps
    return (_agree(value, want.detach(), x.detach(), tolerance)
            and _agree(grad, want_grad, x.detach(), tolerance))
