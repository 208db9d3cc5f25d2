"""Argument checks for the public GDPA functions: each error names the argument and the expectation."""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass

import torch

from .kernels.activations import ActivationName, get_activation

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class GdpaShapes:
    batch: tuple[int, ...]
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_head_dim: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads if self.kv_heads else 1

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.heads, self.q_len, self.v_head_dim)


def gdpa_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> GdpaShapes:
    """Shapes of a checked call (no validation: call ``check_gdpa_args`` first)."""
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    return GdpaShapes(batch, q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1])


def broadcasts_to(t: torch.Tensor, target: tuple) -> bool:
    """Whether ``t`` broadcasts to exactly ``target`` (no more dims, no dim that grows the target)."""
    if t.dim() > len(target):
        return False
    try:
        return tuple(torch.broadcast_shapes(t.shape, target)) == tuple(target)
    except RuntimeError:
        return False


def _check_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real number (float or int); got {type(value).__name__}")
    try:
        as_float = float(value)
    except OverflowError:  # an int past float's range
        as_float = math.inf
    # x - x is 0 exactly for a finite x (nan and inf give nan); unlike math.isfinite, it also takes the symbolic
    # floats torch.compile traces from shapes (where it simplifies to 0).
    if as_float - as_float != 0:
        raise ValueError(f"{name}: expected a finite number (not nan or inf); got {value!r}")
    return as_float


def _check_flag(name: str, value) -> None:
    """A Python bool or a numpy bool; ints and strings are refused, as they are usually a misplaced argument."""
    if isinstance(value, (bool, torch.SymBool)):  # SymBool: a shape comparison under torch.compile
        return
    numpy = sys.modules.get("numpy")  # a numpy bool can only come from an imported numpy
    if numpy is not None and isinstance(value, numpy.bool_):
        return
    got = (f"a {value.dtype} tensor of shape {tuple(value.shape)} (pass bool(t))" if isinstance(value, torch.Tensor)
           else f"{value!r} ({type(value).__name__})")
    raise ValueError(f"{name}: expected a bool (True or False); got {got}")


def check_gdpa_args(
    query, key, value, *, activation: ActivationName, scale, post_scale, bias: torch.Tensor | None, negative_slope,
    causal=False,
) -> GdpaShapes:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor; got {type(t).__name__}")
        if t.dim() < 3:
            raise ValueError(
                f"{name}: expected at least 3 dims [..., heads, seq, head_dim]; got shape {tuple(t.shape)}"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: expected dtype float16, bfloat16, float32 or float64; got {t.dtype}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise ValueError(f"bias: expected a torch.Tensor or None; got {type(bias).__name__}")
    tensors = [("key", key), ("value", value)] + ([("bias", bias)] if bias is not None else [])
    for name, t in tensors:
        if t.device != query.device:
            raise ValueError(f"{name}: expected the device of query ({query.device}); got {t.device}")
        if t.dtype != query.dtype:
            raise ValueError(f"{name}: expected the dtype of query ({query.dtype}); got {t.dtype}")
    get_activation(activation)
    _check_real("scale", scale)
    _check_real("post_scale", post_scale)
    _check_real("negative_slope", negative_slope)
    _check_flag("causal", causal)

    if key.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"key: expected head_dim {query.shape[-1]} (query's last dim); "
            f"got {key.shape[-1]} (shape {tuple(key.shape)})"
        )
    if value.shape[-2] != key.shape[-2] or value.shape[-3] != key.shape[-3]:
        raise ValueError(
            f"value: expected [..., {key.shape[-3]}, {key.shape[-2]}, Dv] (key's heads and length); "
            f"got {tuple(value.shape)}"
        )
    h, hkv = query.shape[-3], key.shape[-3]
    if (hkv == 0 and h != 0) or (hkv and h % hkv):
        raise ValueError(f"query: expected a head count divisible by key's {hkv} heads; got {h} heads")
    try:
        shapes = gdpa_shapes(query, key, value)
    except RuntimeError:
        raise ValueError(
            f"key/value: expected batch dims that broadcast against query's {tuple(query.shape[:-3])}; "
            f"got {tuple(key.shape[:-3])} and {tuple(value.shape[:-3])}"
        ) from None
    if bias is not None:
        target = (*shapes.batch, h, shapes.q_len, shapes.kv_len)
        if not broadcasts_to(bias, target):
            raise ValueError(f"bias: expected a shape that broadcasts to {target}; got {tuple(bias.shape)}")
    return shapes
