"""How Dynamo's torch-level FX graph spells the pieces of GDPA, normalised into a few kinds.

Dynamo keeps the user's spelling: ``q @ k`` is ``operator.matmul``, ``torch.matmul`` a function, ``x.matmul``
a method; ``nn.GELU("tanh")`` is inlined to ``torch._C._nn.gelu(x, approximate="tanh")``; and so on. Every
helper here answers one question about one node, from its target, arguments and ``example_value``.
"""

from __future__ import annotations

import numbers
import operator
import string
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..kernels.activations import ACTIVATIONS, ActivationName
from .mutation import changed_in_place, stale_readers, written

aten = torch.ops.aten


# Dynamo records a Python comparison on a tensor as the function (``operator.eq``) or, in some versions (torch
# 2.11 for ``buffer[...] == 0``), as the dunder method: both are read as the named method.
_DUNDER_METHODS = {"__eq__": "eq", "__ne__": "ne", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge"}


def method_name(node: fx.Node) -> Optional[str]:
    """A call_method's name, with comparison dunders read as their plain method; None for other nodes."""
    return _DUNDER_METHODS.get(node.target, node.target) if node.op == "call_method" else None


def fn_or_method(node: fx.Node, functions: tuple = (), methods: tuple = ()) -> bool:
    if node.op == "call_function":
        return node.target in functions
    if node.op == "call_method":
        return method_name(node) in methods
    return False


def example(node: Any) -> Any:
    """The fake tensor (or SymInt) a node produced during tracing, else the value itself."""
    if isinstance(node, fx.Node):
        return node.meta.get("example_value")
    return node


class StaleRead(Exception):
    """A node that reads a tensor after the graph changed it in place: its value is not computed from its inputs'."""


def call_node(node: fx.Node, args: tuple, kwargs: dict) -> Any:
    """What ``node`` computes on these concrete arguments (its own args and kwargs, evaluated). An in-place change
    works on a copy, so that the values given stay as they were made."""
    if node in stale_readers(node.graph, node):
        raise StaleRead(f"{node.name} reads a tensor after the graph changed it in place")
    target = written(node)
    if target is not None:
        if "out" in kwargs or not args or target is not node.args[0] or not isinstance(args[0], torch.Tensor):
            raise StaleRead(f"{node.name} changes a tensor in place")
        args = (args[0].clone(), *args[1:])
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    raise ValueError(f"{node.name}: a {node.op} node computes nothing")


def is_tensor_node(node: Any) -> bool:
    return isinstance(node, fx.Node) and isinstance(example(node), torch.Tensor)


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# ---- matmuls -------------------------------------------------------------------------------------------

MATMUL_FUNCTIONS = (operator.matmul, torch.matmul, torch.bmm, torch.Tensor.matmul, torch.Tensor.bmm)
MATMUL_METHODS = ("matmul", "bmm", "__matmul__")
EINSUM_FUNCTIONS = tuple(dict.fromkeys((torch.einsum, torch.functional.einsum)))  # one object today: anchor it once


def matmul_operands(node: fx.Node) -> Optional[tuple[fx.Node, fx.Node]]:
    """(a, b) for a node computing a @ b (operator, function, method or bmm); None otherwise."""
    if fn_or_method(node, MATMUL_FUNCTIONS, MATMUL_METHODS):
        a, b = node.args[0], node.args[1]
        if is_tensor_node(a) and is_tensor_node(b):
            return a, b
    return None


def einsum_operands(node: fx.Node) -> Optional[tuple[str, fx.Node, fx.Node]]:
    """(equation, a, b) for a two-operand einsum, an ellipsis spelled out as letters of its own
    (``explicit_equation``)."""
    if node.op == "call_function" and node.target in EINSUM_FUNCTIONS:
        args = node.args
        if len(args) == 2 and isinstance(args[1], (list, tuple)):
            args = (args[0], *args[1])
        if len(args) == 3 and isinstance(args[0], str) and is_tensor_node(args[1]) and is_tensor_node(args[2]):
            eq = explicit_equation(args[0].replace(" ", ""), [example(a).dim() for a in args[1:]])
            return (eq, args[1], args[2]) if eq is not None else None
    return None


def explicit_equation(eq: str, ranks: list[int]) -> Optional[str]:
    """``eq`` with each operand's ``...`` replaced by letters the equation does not use, aligned from the right
    as einsum broadcasts them (``'...id,...jd->...ij'`` on 4-D operands: ``'Aaid,Aajd->Aaij'``); None where the
    ellipsis is not one per operand and in an explicit output."""
    if "." not in eq:
        return eq
    if "->" not in eq:
        return None
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != len(ranks) or any(t.count("...") > 1 or "." in t.replace("...", "") for t in (*parts, out)):
        return None
    spans = [rank - len(t.replace("...", "")) if "..." in t else 0 for t, rank in zip(parts, ranks)]
    if min(spans) < 0 or ("..." in out) != any("..." in t for t in parts):
        return None
    free = [c for c in string.ascii_letters if c not in eq]
    letters = "".join(free[:max(spans)])

    def spell(term: str, span: int) -> str:
        return term.replace("...", letters[len(letters) - span:] if span else "")

    return ",".join(spell(t, n) for t, n in zip(parts, spans)) + "->" + spell(out, len(letters))


def transposed_source(node: fx.Node) -> Optional[fx.Node]:
    """x when node is x with its last two dims swapped (.transpose(-2, -1), .mT, .t(), permute)."""
    if not isinstance(node, fx.Node) or not is_tensor_node(node):
        return None
    rank = example(node).dim()
    if node.op == "call_function" and node.target is getattr:
        if node.args[1] == "mT" or (node.args[1] == "T" and rank == 2):
            return node.args[0]
        return None
    if fn_or_method(node, (torch.transpose,), ("transpose", "swapaxes", "swapdims")):
        dims = sorted(d % rank for d in node.args[1:3])
        if dims == [rank - 2, rank - 1]:
            return node.args[0]
    if fn_or_method(node, (torch.t,), ("t",)) and rank == 2:
        return node.args[0]
    if fn_or_method(node, (torch.permute,), ("permute",)):
        perm = node.args[1] if isinstance(node.args[1], (list, tuple)) else node.args[1:]
        perm = [p % rank for p in perm]
        if perm == [*range(rank - 2), rank - 1, rank - 2]:
            return node.args[0]
    return None


# ---- elementwise steps ------------------------------------------------------------------------------------


def scalar_value(x: Any) -> Optional[Any]:
    """A Python number, a SymInt/SymFloat, or a node producing one (shape arithmetic)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (numbers.Real, torch.SymInt, torch.SymFloat)):
        return x
    if isinstance(x, fx.Node) and isinstance(example(x), (torch.SymInt, torch.SymFloat, int, float)):
        return x
    return None


# Tensors of one number shaped like their first argument: (functions, methods, how to read the number from
# (args, kwargs)). They read that argument's shape, dtype and device, never its values.
_SHAPE_ONLY_FILLS = (
    ((torch.zeros_like,), ("new_zeros",), lambda args, kwargs: 0),
    ((torch.ones_like,), ("new_ones",), lambda args, kwargs: 1),
    ((torch.full_like,), (), lambda args, kwargs: args[1] if len(args) > 1 else kwargs.get("fill_value")),
    ((), ("new_full",), lambda args, kwargs: args[2] if len(args) > 2 else kwargs.get("fill_value")),
)


def shape_only_fill(node: Any) -> Optional[float]:
    """The number every element of ``node`` holds where it is ``torch.zeros_like(x)``, ``x.new_zeros(...)``,
    ``torch.full_like(x, c)``, ``x.new_full(..., c)`` (and the ``ones`` forms) with a plain number; else None."""
    if not isinstance(node, fx.Node) or not isinstance(example(node), torch.Tensor) or not node.args:
        return None
    for functions, methods, read in _SHAPE_ONLY_FILLS:
        if fn_or_method(node, functions, methods):
            value = read(node.args, node.kwargs)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                return None
            return float(value)
    return None


def reads_only_shape_of(user: fx.Node, node: fx.Node) -> bool:
    """``user`` reads nothing of ``node`` but its shape, dtype and device: a ``shape_only_fill`` of it, or
    ``x.expand_as(node)``."""
    if method_name(user) == "expand_as":
        return len(user.args) == 2 and user.args[1] is node and user.args[0] is not node and not user.kwargs
    return (shape_only_fill(user) is not None and user.args[0] is node
            and node not in (*user.args[1:], *user.kwargs.values()))


def broadcasts_into(small, large) -> bool:
    """Sizes ``small`` broadcast to ``large`` without growing it (aligned from the right; statically)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return len(small) <= len(large) and all(statically_known_true(a == 1) or statically_known_true(a == b)
                                            for a, b in zip(reversed(small), reversed(large)))


def is_one_element_tensor(x: Any) -> bool:
    ev = example(x)
    return isinstance(x, fx.Node) and isinstance(ev, torch.Tensor) and ev.dim() <= 1 and _numel_is_one(ev)


def _numel_is_one(t: torch.Tensor) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(t.numel() == 1)


def is_mul(node):
    return fn_or_method(node, (operator.mul, torch.mul, torch.Tensor.mul), ("mul", "__mul__", "mul_"))


def is_div(node):
    return fn_or_method(node, (operator.truediv, torch.div, torch.true_divide, torch.Tensor.div), ("div", "truediv"))


def is_add(node):
    return fn_or_method(node, (operator.add, torch.add, torch.Tensor.add), ("add", "__add__"))


def is_sub(node):
    return fn_or_method(node, (operator.sub, torch.sub, torch.Tensor.sub), ("sub", "__sub__"))


# Value-preserving steps: dtype casts (the fused op computes in fp32 and rounds P to V's dtype once) and copies.
PASSTHROUGH_METHODS = ("float", "half", "bfloat16", "to", "type", "type_as", "contiguous", "clone")


def is_passthrough(node: fx.Node) -> bool:
    if not fn_or_method(node, (), PASSTHROUGH_METHODS):
        return False
    ev = example(node)
    if not (isinstance(ev, torch.Tensor) and ev.dtype.is_floating_point):
        return False  # a cast to an integer or bool type changes the values
    if node.target == "to":
        # .to(dtype) / .to(device, dtype): a cast; anything carrying a non-dtype payload stays opaque
        return all(isinstance(a, (torch.dtype, torch.device, str)) for a in node.args[1:]) and set(
            node.kwargs
        ) <= {"dtype", "copy", "non_blocking", "device"}
    return True


def bool_cast_source(node: Any) -> Optional[fx.Node]:
    """m when ``node`` is a boolean tensor m cast to a floating dtype ({0, 1} values: ``m.float()``,
    ``m.to(dtype)``, ``m.type(dtype)``, ``m.type_as(x)``)."""
    if not isinstance(node, fx.Node) or not is_passthrough(node) or not is_tensor_node(node.args[0]):
        return None
    src = example(node.args[0])
    return node.args[0] if src.dtype == torch.bool else None


# Ops whose every output element comes from the same (broadcast) element of each tensor operand: such a value can
# be computed at a few coordinates from its operands at those coordinates alone.
ELEMENTWISE_FUNCTIONS = tuple(dict.fromkeys((
    operator.and_, operator.or_, operator.xor, operator.invert, operator.lt, operator.le, operator.gt, operator.ge,
    operator.eq, operator.ne, operator.add, operator.sub, operator.mul, operator.truediv, operator.neg,
    torch.logical_and, torch.logical_or, torch.logical_xor, torch.logical_not, torch.bitwise_and, torch.bitwise_or,
    torch.bitwise_not, torch.lt, torch.le, torch.gt, torch.ge, torch.eq, torch.ne, torch.add, torch.sub, torch.mul,
    torch.div, torch.neg,
)))
ELEMENTWISE_METHODS = (
    "__and__", "__or__", "__xor__", "__invert__", "logical_and", "logical_or", "logical_xor", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_not", "lt", "le", "gt", "ge", "eq", "ne", "add", "sub", "mul", "div",
    "neg", "masked_fill",
)
# Casts: a value in another dtype (``to`` and ``type_as`` may take a tensor that only names the dtype).
CAST_METHODS = ("float", "half", "bfloat16", "double", "bool", "int", "long", "to", "type_as")


def is_elementwise(node: fx.Node) -> bool:
    """Whether ``node`` computes each element from the same broadcast element of its tensor operands
    (``torch.where`` with its three operands, not its one-operand ``nonzero`` form)."""
    if node.op == "call_function" and node.target is torch.where:
        return len(node.args) + len(node.kwargs) == 3
    return fn_or_method(node, ELEMENTWISE_FUNCTIONS, ELEMENTWISE_METHODS)


def is_cast(node: fx.Node) -> bool:
    return fn_or_method(node, (), CAST_METHODS)


def is_expand(node: fx.Node) -> bool:
    return fn_or_method(node, (), ("expand", "expand_as"))


def is_noop_dropout(node: fx.Node) -> bool:
    if not fn_or_method(node, (F.dropout, torch.dropout, torch.nn.functional.dropout), ("dropout",)):
        return False
    p = arg(node, 1, "p", 0.5)
    training = arg(node, 2, "training", True) if node.target is not torch.dropout else arg(node, 2, "train", True)
    return (isinstance(p, numbers.Real) and p == 0) or training is False


def activation_of(node: fx.Node) -> Optional[tuple[ActivationName, float]]:
    """(activation name, negative_slope) when node applies one of the table's activations to args[0], as the
    table's FX spellings (``ActivationSpec.fx``) say."""
    for act in ACTIVATIONS.values():
        spelling = act.fx
        if not fn_or_method(node, spelling.functions, spelling.methods):
            continue
        if spelling.approximate is not None and arg(node, 1, "approximate", "none") != spelling.approximate:
            continue
        if spelling.reads_slope:
            s = arg(node, 1, "negative_slope", 0.01)
            return (act.name, float(s)) if isinstance(s, numbers.Real) else None
        return act.name, 0.01
    return None


# {activation: the activation it is when a square follows it} (relu then ** 2 is relu_square)
SQUARED_ACTIVATIONS: dict[str, ActivationName] = {
    a.fx.square_of: a.name for a in ACTIVATIONS.values() if a.fx.square_of is not None}


def is_square_of(node: fx.Node, inner: fx.Node) -> bool:
    """node computes inner ** 2 (pow, square, or inner * inner)."""
    if fn_or_method(node, (operator.pow, torch.pow), ("pow", "__pow__")):
        return node.args[0] is inner and node.args[1] == 2
    if fn_or_method(node, (torch.square,), ("square",)):
        return node.args[0] is inner
    if is_mul(node):
        return node.args[0] is inner and node.args[1] is inner
    return False


def is_module_state(node: fx.Node) -> bool:
    """Is this graph input (a placeholder or get_attr) a module's parameter or buffer? Graphs not from Dynamo (no
    source recorded) count every input as one, as they have no later calls."""
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    if source is None:
        return grapharg is None
    name = source.name() if callable(source.name) else source.name
    return "._buffers[" in name or "._parameters[" in name


# The key under which the pass keeps, for the length of one pass, the real value of a graph input that a proof may
# read (``rewrite._readable_inputs``); removed when the pass ends, so the compiled graph holds no tensor of it.
REAL_VALUE = "gdpa_real_value"


def real_value(node: fx.Node) -> Optional[torch.Tensor]:
    """The real value the pass recorded for this graph input, else None (also where the graph changes it in
    place: what a proof would read is not what every reader sees)."""
    value = node.meta.get(REAL_VALUE)
    if value is None or changed_in_place(node):
        return None
    return value


# Likewise, for a 1-D integer graph input (offsets or lengths of a padded batch), the number of jagged rows its real
# value describes read both ways (its last entry, its sum): what drawn offsets may add up to (``padded_operands``).
REAL_ROWS = "gdpa_real_rows"
