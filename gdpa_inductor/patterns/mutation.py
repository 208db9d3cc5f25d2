"""In-place changes in Dynamo's torch-level graph, which is not functional: ``k[..., 0] = 1`` (``operator.setitem``),
``s.mul_(c)``, ``x += y``, ``F.relu(x, inplace=True)`` change a tensor, and every view of it, for the nodes that read
it afterwards.

Two consequences for the pass. A proof that computes node values one by one sees each tensor as it was made, so a
node that reads a tensor after an in-place change is never evaluated (``stale_readers``). And the fused op reads its
inputs where the block's second matmul was, so a block whose inputs change in place between its first read and that
point is not rewritten (``changed_during``).
"""

from __future__ import annotations

import functools
import inspect
import operator
import weakref
from typing import Iterable, Optional

import torch
import torch.fx as fx

# Tensor methods and functions whose result shares memory with their first argument.
_VIEW_METHODS = frozenset((
    "view", "view_as", "reshape", "reshape_as", "as_strided", "transpose", "t", "permute", "expand", "expand_as",
    "unsqueeze", "squeeze", "flatten", "unflatten", "narrow", "select", "split", "split_with_sizes", "chunk",
    "tensor_split", "unbind", "diagonal", "movedim", "moveaxis", "swapaxes", "swapdims", "unfold", "contiguous",
    "detach", "real", "imag", "to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool",
    "cuda", "cpu", "__getitem__", "view_as_real", "view_as_complex", "alias", "requires_grad_", "squeeze_",
    "unsqueeze_", "transpose_", "t_", "as_strided_", "detach_",
))
_VIEW_FUNCTIONS = frozenset((
    operator.getitem, torch.reshape, torch.transpose, torch.permute, torch.t, torch.flatten, torch.unflatten,
    torch.squeeze, torch.unsqueeze, torch.narrow, torch.select, torch.split, torch.chunk, torch.tensor_split,
    torch.unbind, torch.movedim, torch.moveaxis, torch.swapaxes, torch.swapdims, torch.diagonal, torch.as_strided,
    torch.detach, torch.view_as_real, torch.view_as_complex,
))
_INPLACE_OPERATORS = frozenset((
    operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
    operator.imatmul,
))
_INPLACE_DUNDERS = frozenset(("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                              "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
                              "__imatmul__"))
# Methods that return their tensor itself where it already has the dtype and device asked for, else a copy.
_CONVERSIONS = frozenset(("to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool",
                          "cuda", "cpu"))
# Methods whose names end in "_" but that change no tensor's values.
_NOT_WRITES = frozenset(("requires_grad_", "retain_grad", "share_memory_", "squeeze_", "unsqueeze_", "transpose_",
                         "t_", "as_strided_", "detach_"))


def _schema(target):
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = getattr(target, "default", None)
    return getattr(target, "_schema", None)


def written(node: fx.Node) -> Optional[fx.Node]:
    """The tensor node ``node`` changes in place, else None."""
    first = node.args[0] if node.args else None
    if not isinstance(first, fx.Node):
        first = None
    if node.op == "call_method":
        name = node.target
        if name in _INPLACE_DUNDERS:
            return first
        if name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES:
            return first
        return None
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(node.kwargs.get("out"), fx.Node):
        return node.kwargs["out"]
    if inplace_flag(node):
        return first
    if target in _INPLACE_OPERATORS:
        return first if first is not None and isinstance(first.meta.get("example_value"), torch.Tensor) else None
    schema = _schema(target)
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
                return value if isinstance(value, fx.Node) else None
        return None
    name = getattr(target, "__name__", "")
    if _is_torch(target) and name.endswith("_") and not name.startswith("_") and name not in _NOT_WRITES:
        return first
    return None


def inplace_flag(node: fx.Node) -> bool:
    """Whether a call with an ``inplace`` parameter (``F.relu(x, True)``, ``F.hardtanh(x, -1, 1, inplace=True)``)
    passes True to it, by keyword or by position."""
    if node.kwargs.get("inplace") is True:
        return True
    index = inplace_index(node.target)
    return index is not None and index < len(node.args) and node.args[index] is True


@functools.lru_cache(maxsize=None)
def inplace_index(target) -> Optional[int]:
    """The position of ``target``'s ``inplace`` parameter, else None."""
    try:
        names = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("inplace") if "inplace" in names else None


def _is_torch(target) -> bool:
    """A torch function or Tensor method (``operator.and_`` also ends in "_" and writes nothing)."""
    module = getattr(target, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.") or getattr(target, "__qualname__", "").startswith(
        "TensorBase.")


def _aliased(node: fx.Node) -> Optional[fx.Node]:
    """The node whose memory ``node``'s result shares, else None (a written node aliases what it writes)."""
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if first is None:
        return None
    if written(node) is first:
        return first
    if node.op == "call_method" and node.target in _VIEW_METHODS:
        return None if node.target in _CONVERSIONS and _converted(node, first) else first
    if node.op == "call_function":
        name = getattr(node.target, "__name__", None)
        if node.target in _VIEW_FUNCTIONS or (isinstance(name, str) and name in _VIEW_METHODS
                                              and getattr(node.target, "__qualname__", "").startswith("TensorBase.")):
            return first
        schema = _schema(node.target)
        if schema is not None and any(r.alias_info is not None for r in schema.returns):
            return first
    return None


def _converted(node: fx.Node, first: fx.Node) -> bool:
    """Whether a conversion's result has another dtype or device than its tensor: then it is a copy."""
    out, src = node.meta.get("example_value"), first.meta.get("example_value")
    return (isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor)
            and (out.dtype != src.dtype or out.device != src.device))


class _Analysis:
    def __init__(self, graph: fx.Graph):
        self.count = len(graph.nodes)
        parent: dict[fx.Node, fx.Node] = {}

        def root(n: fx.Node) -> fx.Node:
            while parent.get(n, n) is not n:
                n = parent[n]
            return n

        for node in graph.nodes:
            a = _aliased(node)
            if a is not None:
                parent[root(node)] = root(a)
        classes: dict[fx.Node, list[fx.Node]] = {}
        for node in graph.nodes:
            classes.setdefault(root(node), []).append(node)
        position = {n: i for i, n in enumerate(graph.nodes)}
        self.writes: list[tuple[fx.Node, frozenset[fx.Node]]] = []  # (writing node, the class it changes)
        stale: set[fx.Node] = set()
        for node in graph.nodes:
            target = written(node)
            if target is None:
                continue
            members = frozenset(classes[root(target)])
            self.writes.append((node, members))
            for member in members:
                if member is node:
                    continue  # the write's own result is the tensor after the change
                stale.update(u for u in member.users if u is not node and position[u] > position[node])
        self.stale = frozenset(stale)
        self.changed = frozenset(n for _, members in self.writes for n in members)
        self.position = position


_CACHE: "weakref.WeakKeyDictionary[fx.Graph, _Analysis]" = weakref.WeakKeyDictionary()


def _analysis(graph: fx.Graph, *nodes: fx.Node) -> _Analysis:
    """The graph's analysis, made again once the pass has changed the graph (its node count, or a node asked about
    that it does not know)."""
    found = _CACHE.get(graph)
    if found is None or found.count != len(graph.nodes) or any(n not in found.position for n in nodes):
        found = _CACHE[graph] = _Analysis(graph)
    return found


def stale_readers(graph: fx.Graph, *nodes: fx.Node) -> frozenset[fx.Node]:
    """The nodes that read a tensor after an in-place change of it (or of a view of it); ``nodes``: those the caller
    asks about (the analysis is made again if it does not know them)."""
    return _analysis(graph, *nodes).stale


def changed_in_place(node: fx.Node) -> bool:
    """Whether the graph changes ``node``'s tensor (or a view of it) in place anywhere."""
    return node in _analysis(node.graph, node).changed


def changed_during(region: Iterable[fx.Node], last: fx.Node, reads: Iterable[fx.Node]) -> Optional[fx.Node]:
    """A node that changes in place a tensor of ``reads`` (what the block reads, directly or not) after the first node
    of ``region`` (the block's nodes) and before ``last`` (where the fused op will read its inputs), other than a
    change of a tensor only the block reads; else None."""
    region = frozenset(region)
    analysis = _analysis(last.graph, last, *region)
    start = min(analysis.position[n] for n in region)
    end = analysis.position[last]
    reads = frozenset(reads)
    for node, members in analysis.writes:
        if not start < analysis.position[node] < end or not members & reads:
            continue
        if node in region and members <= region:
            continue
        return node
    return None


def same_memory_before(node: fx.Node, target: fx.Node) -> bool:
    """Whether a node up to ``node`` other than ``target`` and ``node`` shares ``target``'s memory (a view of it, or
    what it is a view of)."""
    analysis = _analysis(node.graph, node, target)
    end = analysis.position[node]
    for _, members in analysis.writes:
        if target in members:
            return any(m is not target and m is not node and analysis.position[m] <= end for m in members)
    return False


def forget(graph: fx.Graph) -> None:
    """Drops the graph's analysis after a change that keeps its node count."""
    _CACHE.pop(graph, None)
