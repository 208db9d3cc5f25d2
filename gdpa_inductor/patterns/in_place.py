"""In-place steps written out of place, before matching: ``s.mul_(c)``, ``s /= c``, ``p.masked_fill_(m, 0)``,
``p[m] = 0``, ``torch.sigmoid_(s)``, ``F.relu(s, inplace=True)`` on a tensor that shares its memory with nothing
read before the change become ``s.mul(c)``, ``s / c``, ``p.masked_fill(m, 0)``, ... and every later reader of the
tensor reads the new node. Functionalization (AOTAutograd) turns the graph into the same one; written so first,
the block between two matmuls is in the spellings the patterns read. A change made where the graph has turned
gradients off (or may run without them) stays in place: autograd does not record it, and out of place it would.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

from . import fx_nodes as fxn
from .mutation import forget, inplace_flag, inplace_index, same_memory_before, written

log = logging.getLogger("gdpa_inductor")

# Tensor methods written out of place as the method without its trailing "_" (or "__iadd__" as "__add__").
_METHODS = frozenset((
    "add_", "sub_", "mul_", "div_", "true_divide_", "masked_fill_", "clamp_", "clamp_min_", "clamp_max_",
    "sigmoid_", "relu_", "tanh_", "exp_", "neg_", "pow_", "abs_", "sqrt_", "rsqrt_", "square_", "reciprocal_",
    "tril_", "triu_", "logical_and_", "logical_or_", "logical_not_", "logical_xor_",
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__iand__", "__ior__", "__ixor__",
))
_OPERATORS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
              operator.itruediv: operator.truediv, operator.iand: operator.and_, operator.ior: operator.or_,
              operator.ixor: operator.xor}
_FUNCTIONS = {getattr(torch, name): getattr(torch, name[:-1]) for name in (
    "sigmoid_", "relu_", "tanh_", "exp_", "neg_", "abs_", "sqrt_", "rsqrt_", "square_", "reciprocal_", "clamp_",
    "clamp_min_", "clamp_max_") if hasattr(torch, name)}
# Deterministic activations with an ``inplace`` parameter: called with it False.
_INPLACE_PARAMETER = frozenset((F.relu, F.relu6, F.silu, F.hardswish, F.hardsigmoid, F.mish, F.selu, F.elu, F.celu,
                                F.leaky_relu, F.hardtanh, F.threshold))


def write_out_of_place(graph: fx.Graph) -> int:
    """Rewrites the graph's in-place steps that can be written out of place (module docstring); returns how many."""
    count = 0
    grad_mode = None  # the caller's until the graph sets it
    sets_grad_mode = any(n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in graph.nodes)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            grad_mode = bool(node.args[0]) if node.args else None
            continue
        target = written(node)
        if target is None or not _private(node, target):
            continue
        if grad_mode is False or grad_mode is None and sets_grad_mode:
            continue  # a change autograd does not record: out of place, the gradient would see it
        form = _out_of_place(node, target)
        if form is None:
            continue
        kind, fn, args, kwargs = form
        value = _fake_value(kind, fn, args, kwargs)
        ev = fxn.example(target)
        if not isinstance(value, torch.Tensor) or value.device != ev.device or not _same(value.shape, ev.shape):
            continue
        if not _same(value.stride(), ev.stride()):
            continue  # a later view of the result may need the tensor's own strides
        if value.dtype != ev.dtype and not (value.dtype.is_floating_point and ev.dtype.is_floating_point):
            continue
        with graph.inserting_before(node):
            new = graph.call_method(fn, args, kwargs) if kind == "method" else graph.call_function(fn, args, kwargs)
            new.meta.update({k: v for k, v in node.meta.items() if k != "example_value"})
            new.meta["example_value"] = value
            if value.dtype != ev.dtype:
                # in place, the result is computed in the promoted dtype and stored in the tensor's own
                new = graph.call_method("to", (new, ev.dtype))
                new.meta.update({k: v for k, v in node.meta.items() if k != "example_value"})
                new.meta["example_value"] = _fake_value("method", "to", (new.args[0], ev.dtype), {})
        order = {n: i for i, n in enumerate(graph.nodes)}
        for user in list(target.users):
            if order[user] > order[node]:
                user.replace_input_with(target, new)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        forget(graph)
        log.debug("gdpa: %s written out of place as %s", node.name, new.name)
        count += 1
    return count


def _same(a, b) -> bool:
    """Sizes or strides provably equal, symbolic ones included (no guard is added)."""
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _private(node: fx.Node, target: fx.Node) -> bool:
    """Whether ``target`` is a tensor the graph made and nothing read up to ``node`` shares its memory: a view of it
    taken before the change would see the change, a graph input keeps it."""
    if target.op not in ("call_function", "call_method") or node.kwargs.get("out") is not None:
        return False
    ev = fxn.example(target)
    if not isinstance(ev, torch.Tensor) or isinstance(ev, torch.nn.Parameter) or written(target) is not None:
        return False
    if same_memory_before(node, target):
        return False
    key = _storage(ev)
    if key is None:
        return False
    for other in target.graph.nodes:
        if other is node:
            return True
        if other is not target and key in _storages(fxn.example(other)):
            return False
    return False


def _out_of_place(node: fx.Node, target: fx.Node) -> Optional[tuple[str, Any, tuple, dict]]:
    """(kind, target, args, kwargs) of the out-of-place call, else None."""
    if node.args[:1] != (target,):
        return None
    if node.op == "call_method" and node.target in _METHODS:
        name = node.target.replace("__i", "__", 1) if node.target.startswith("__i") else node.target[:-1]
        return "method", name, node.args, dict(node.kwargs)
    if node.op != "call_function":
        return None
    if node.target in _OPERATORS:
        return "function", _OPERATORS[node.target], node.args, dict(node.kwargs)
    if node.target in _FUNCTIONS:
        return "function", _FUNCTIONS[node.target], node.args, dict(node.kwargs)
    if node.target in _INPLACE_PARAMETER and inplace_flag(node):
        index = inplace_index(node.target)
        args, kwargs = list(node.args), dict(node.kwargs)
        if "inplace" in kwargs:
            kwargs["inplace"] = False
        else:
            args[index] = False
        return "function", node.target, tuple(args), kwargs
    if node.target is operator.setitem and len(node.args) == 3 and not node.kwargs:
        return _masked_fill(target, *node.args[1:])
    return None


def _masked_fill(target: fx.Node, index: Any, value: Any) -> Optional[tuple[str, Any, tuple, dict]]:
    """``t[m] = c`` with m a boolean tensor of t's shape and c one number: ``t.masked_fill(m, c)``."""
    mask = fxn.example(index) if isinstance(index, fx.Node) else None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        return None
    if not _same(mask.shape, fxn.example(target).shape):
        return None
    number = fxn.example(value) if isinstance(value, fx.Node) else value
    if isinstance(number, torch.Tensor) and number.dim() != 0 or not isinstance(number, (int, float, torch.Tensor)):
        return None
    return "method", "masked_fill", (target, index, value), {}


def _fake_value(kind: str, fn: Any, args: tuple, kwargs: dict) -> Any:
    def ev(a):
        return fxn.example(a) if isinstance(a, fx.Node) else a

    fargs = fx.node.map_aggregate(args, ev)
    fkwargs = fx.node.map_aggregate(kwargs, ev)
    mode = getattr(fargs[0], "fake_mode", None)
    if mode is None:
        return None
    try:
        with mode:
            return getattr(fargs[0], fn)(*fargs[1:], **fkwargs) if kind == "method" else fn(*fargs, **fkwargs)
    except Exception:  # noqa: BLE001  (a call that cannot be made out of place stays in place)
        return None


def _storage(value: Any) -> Optional[StorageWeakRef]:
    try:
        return StorageWeakRef(value.untyped_storage())
    except Exception:  # noqa: BLE001  (a tensor without plain storage is never taken as private)
        return None


def _storages(value: Any) -> set:
    values = value if isinstance(value, (tuple, list)) else (value,)
    return {s for v in values if isinstance(v, torch.Tensor) and (s := _storage(v)) is not None}
