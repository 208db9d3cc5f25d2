"""Argument checks for ``gdpa_varlen``: each error names the argument and the expectation."""

from __future__ import annotations

import numbers

import torch

from .kernels.activations import get_activation
from .kernels.reference_varlen import bias_shape
from .lowering.eager import plain_eager
from .validation import SUPPORTED_DTYPES, _check_flag, _check_real, broadcasts_to


def _check_rows(name: str, x: torch.Tensor, cu, seqused, heads_name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor; got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}: expected dtype float16, bfloat16, float32 or float64; got {x.dtype}")
    if cu is not None and x.dim() != 3:
        raise ValueError(f"{name}: with cu_seqlens, expected [total, {heads_name}, head_dim]; got shape "
                         f"{tuple(x.shape)}")
    if cu is None and x.dim() != 4:
        raise ValueError(f"{name}: without cu_seqlens, expected dense [B or 1, N, {heads_name}, head_dim]; got "
                         f"shape {tuple(x.shape)}")


def _described(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dim()}-D {t.dtype} tensor of shape {tuple(t.shape)}"
    return type(t).__name__


def _check_offsets(name: str, cu, device) -> None:
    """cu_seqlens: B + 1 offsets, int32 only (FlashAttention's convention, the kernels' index type)."""
    if cu is None:
        return
    expected = f"{name}: expected None or a 1-D int32 tensor of B + 1 offsets"
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() == 0:
        raise ValueError(f"{expected}; got {_described(cu)}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{expected}; got {_described(cu)} (convert with .to(torch.int32))")
    if cu.device != device:
        raise ValueError(f"{name}: expected the device of q ({device}); got {cu.device}")


def _check_lengths(name: str, t, device, length: int) -> None:
    """seqused: one length per sample; int64 too, as lengths tensors usually are."""
    if t is None:
        return
    expected = f"{name}: expected None or a 1-D int32 or int64 tensor of {length} lengths (one per sample)"
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise ValueError(f"{expected}; got {_described(t)}")
    if t.numel() != length:
        raise ValueError(f"{expected}; got {_described(t)}")
    if t.device != device:
        raise ValueError(f"{name}: expected the device of q ({device}); got {t.device}")
    if t.device.type == "cpu" and t.numel() and plain_eager(t) and int(t.min()) < 0:
        raise ValueError(f"{name}: expected non-negative lengths; got a minimum of {int(t.min())}")


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, activation, scale,
                      post_scale, window, negative_slope, seqused_q, seqused_k, bias=None,
                      causal=False) -> tuple[int, int]:
    """Returns the window as the op's (left, right), -1 meaning unbounded."""
    _check_rows("q", q, cu_seqlens_q, seqused_q, "H")
    _check_rows("k", k, cu_seqlens_k, seqused_k, "Hkv")
    _check_rows("v", v, cu_seqlens_k, seqused_k, "Hkv")
    _check_offsets("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_offsets("cu_seqlens_k", cu_seqlens_k, q.device)
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name}: expected the device of q ({q.device}); got {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: expected the dtype of q ({q.dtype}); got {t.dtype}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: expected head_dim {q.shape[-1]} (q's last dim); got {k.shape[-1]}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v: expected {tuple(k.shape[:-1])} + (Dv,) (k's rows and heads); got {tuple(v.shape)}")
    h, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or h % hkv:
        raise ValueError(f"q: expected a head count divisible by k's {hkv} heads; got {h}")
    batches = {name: cu.numel() - 1 for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k))
               if isinstance(cu, torch.Tensor)}
    for name, x, cu in (("q", q, cu_seqlens_q), ("k", k, cu_seqlens_k)):
        if cu is None and x.shape[0] != 1:
            batches[name] = x.shape[0]
    if len(set(batches.values())) > 1:
        raise ValueError(f"cu_seqlens_q/cu_seqlens_k: expected one batch size for q and k; got {batches}")
    batch = next(iter(batches.values()), 1)
    for name, used in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        _check_lengths(name, used, q.device, batch)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name}: expected a non-negative int (the longest sequence); got {value!r}")
    for name, cu, x, longest, used in (("cu_seqlens_q", cu_seqlens_q, q, max_seqlen_q, seqused_q),
                                       ("cu_seqlens_k", cu_seqlens_k, k, max_seqlen_k, seqused_k)):
        # Values are read only from CPU offsets that nothing traces (reading a CUDA one would synchronize).
        if cu is None or cu.device.type != "cpu" or not plain_eager(cu):
            continue
        lengths = cu[1:] - cu[:-1]
        if int(cu[0]) != 0 or int(cu[-1]) != x.shape[0] or bool((lengths < 0).any()):
            raise ValueError(f"{name}: expected non-decreasing offsets from 0 to {x.shape[0]} (rows of the "
                             f"tensor); got {cu.tolist()[:8]}...")
        if used is not None and used.device.type == "cpu" and plain_eager(used):
            lengths = torch.minimum(lengths, used.to(lengths.dtype))
        if lengths.numel() and int(lengths.max()) > longest:
            raise ValueError(f"max_seqlen: expected >= the longest sequence of {name} ({int(lengths.max())}); "
                             f"got {longest}")
    if bias is not None:
        _check_bias(bias, q, bias_shape(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, batch))
    get_activation(activation)
    _check_real("scale", scale)
    _check_real("post_scale", post_scale)
    _check_real("negative_slope", negative_slope)
    _check_flag("causal", causal)
    return _window(window)


def _check_bias(bias, q, full: tuple[int, ...]) -> None:
    if not isinstance(bias, torch.Tensor):
        raise ValueError(f"bias: expected a tensor or None; got {type(bias).__name__}")
    if bias.device != q.device or bias.dtype != q.dtype:
        raise ValueError(f"bias: expected q's device and dtype ({q.device}, {q.dtype}); "
                         f"got {bias.device}, {bias.dtype}")
    if not broadcasts_to(bias, full):
        raise ValueError(f"bias: expected a shape broadcastable to [B, H, max_seqlen_q, max_seqlen_k] = {list(full)} "
                         f"(a dense side's N for its max_seqlen); got {list(bias.shape)}")


def _window(window) -> tuple[int, int]:
    if window is None:
        return -1, -1
    if isinstance(window, numbers.Integral) and not isinstance(window, bool):
        sides = (int(window), int(window))
    elif isinstance(window, (tuple, list)) and len(window) == 2:
        sides = tuple(-1 if w is None else w for w in window)
    else:
        raise ValueError(f"window: expected None, an int or a (left, right) pair; got {window!r}")
    if not all(isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= -1 for w in sides):
        raise ValueError(f"window: expected non-negative sizes (None or -1: unbounded); got {window!r}")
    return int(sides[0]), int(sides[1])
