"""Providers more than one benchmark times: the GDPA math as a user writes it, and flash-attn-4's kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdpa_math(q, k, v, scale, post_scale, activation):
    """What a user writes today: the same math as plain torch ops."""
    s = q @ k.transpose(-2, -1) * scale
    if activation == "gelu_tanh":
        p = F.gelu(s, approximate="tanh")
    else:
        p = getattr(F, activation)(s)
    return (p * post_scale) @ v


def fa4_function(name: str = "flash_attn_func"):
    """flash-attn-4's ``name`` from its interface (its SM90 kernels on Hopper), or None where it does not
    import."""
    try:
        from flash_attn.cute import interface
    except Exception as e:  # not staged, or no SM90 build
        print("flash-attn-4 unavailable:", type(e).__name__, e, flush=True)
        return None
    return getattr(interface, name)


def fa4_providers(fa4, q, k, v, do, scale) -> dict:
    """flash-attn-4's forward and forward+backward on [Z, H, N, D] operands (its layout is [Z, N, H, D]; the
    gradients through torch.autograd.grad), or nothing where it is not staged."""
    if fa4 is None:
        return {}
    qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    dos = do.transpose(1, 2).contiguous()

    def fa4_fb():
        o = fa4(qs, ks, vs, softmax_scale=scale)
        torch.autograd.grad(o[0] if isinstance(o, tuple) else o, (qs, ks, vs), dos)

    return {"fa4_fwd": lambda: fa4(qs.detach(), ks.detach(), vs.detach(), softmax_scale=scale), "fa4_fb": fa4_fb}
