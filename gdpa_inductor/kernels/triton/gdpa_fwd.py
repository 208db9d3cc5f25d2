"""Triton GDPA forward: O = act(scale * Q Kᵀ + bias) * post_scale · V, one program per query tile.

No softmax means no running max, no rescaling and no row sums: each key tile's P goes straight into the
second matmul. ``post_scale`` is applied once to the accumulator (it commutes with the matmul). Key tiles
that are entirely unmasked run without masks; the causal diagonal and the ragged last tile run masked.
Keys past Nk (only in the masked tiles) get P = 0, so they add nothing even where act(0) != 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..activations import ActivationName, get_activation
from ..common.layout import as_4d
from .activation_math import activate, fp32_factors
from .layout import block_dim, fit_tile, kernel_flags, launcher, strides4
from .tile_configs import FwdConfig, default_fwd_config, tile_capability, tma_fwd_config
from .tile_order import causal_key_tiles, query_tile_program

# Sizes vary call to call; specializing on them (==1, %16) would recompile per shape.
_RUNTIME_SIZES = ["H", "GROUP", "NQ", "NK"]


@triton.jit
def _fwd_tile(
    acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n,
    stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
    NQ, NK, scale, slope,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, EVEN_N: tl.constexpr,
    MASKED: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    if MASKED:
        kt = tl.load(kt_ptrs, mask=(offs_n[None, :] < NK) & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_ptrs, mask=(offs_n[:, None] < NK) & (offs_dv[None, :] < DV), other=0.0)
    else:
        kt = tl.load(kt_ptrs, mask=offs_d[:, None] < D, other=0.0)
        v = tl.load(v_ptrs, mask=offs_dv[None, :] < DV, other=0.0)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
    if HAS_BIAS:
        b_ptrs = b_base + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn
        s += tl.load(b_ptrs, mask=(offs_m[:, None] < NQ) & (offs_n[None, :] < NK), other=0.0).to(tl.float32)
    p = activate(s, slope, ACT, TANH_APPROX, PRECISE)
    # Only where it can matter: a padded key (loaded as zeros) meets a non-finite query as inf * 0 = NaN;
    # with EVEN_N there is none, and the extra select measured ~20% slower at short kv even unexecuted.
    if MASKED and not EVEN_N:
        p = tl.where(offs_n[None, :] < NK, p, 0.0)
    if MASKED and CAUSAL:
        p = tl.where(offs_n[None, :] <= offs_m[:, None] + (NK - NQ), p, 0.0)
    return tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def gdpa_fwd_kernel(
    Q, K, V, Bias, Out,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_bz, stride_bh, stride_bm, stride_bn,
    stride_oz, stride_oh, stride_om, stride_od,
    H, GROUP, NQ, NK, scale, post_scale, slope,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, EVEN_N: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale, post_scale, slope = fp32_factors(scale, post_scale, slope)
    pid_m, z, h, hk = query_tile_program(NQ, H, GROUP, BLOCK_M, CAUSAL)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + z * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < NQ) & (offs_d[None, :] < D), other=0.0)
    k_base = K + z * stride_kz + hk * stride_kh
    v_base = V + z * stride_vz + hk * stride_vh
    b_base = Bias + z * stride_bz + h * stride_bh

    full_end, hi = causal_key_tiles(pid_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)

    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for start_n in range(0, full_end, BLOCK_N):
        acc = _fwd_tile(
            acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, NQ, NK, scale, slope,
            ACT, HAS_BIAS, CAUSAL, EVEN_N, False, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV,
            TANH_APPROX, PRECISE, DOT_PRECISION,
        )
    for start_n in range(full_end, hi, BLOCK_N):
        acc = _fwd_tile(
            acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, NQ, NK, scale, slope,
            ACT, HAS_BIAS, CAUSAL, EVEN_N, True, D, DV, BLOCK_N, BLOCK_D, BLOCK_DV,
            TANH_APPROX, PRECISE, DOT_PRECISION,
        )
    acc = acc * post_scale

    o_ptrs = Out + z * stride_oz + h * stride_oh + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < NQ) & (offs_dv[None, :] < DV))


def gdpa_fwd_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    activation: ActivationName,
    scale: float,
    post_scale: float,
    causal: bool,
    negative_slope: float,
    config: FwdConfig | None = None,
    traced: bool = False,
) -> torch.Tensor:
    """Launches the forward kernel: the TMA one where ``tma_supported`` (unless a config is forced, or the call is
    ``traced`` into a compiled graph, which launches the pointer kernel itself), else the pointer kernel. Inputs are
    checked, non-empty, and on one device."""
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    h, nq, d = q.shape[-3:]
    hkv, nk, dv = v.shape[-3:]
    q4, k4, v4 = as_4d(q, batch), as_4d(k, batch), as_4d(v, batch)
    b4 = as_4d(bias.expand(*batch, h, nq, nk), batch) if bias is not None else None
    out = torch.empty((*batch, h, nq, dv), dtype=v.dtype, device=v.device)
    o4 = out.view(q4.shape[0], h, nq, dv)
    capability = tile_capability(v.device)
    if config is None and not traced:
        from .gdpa_fwd_tma import gdpa_fwd_tma
        from .tma_support import tma_supported

        if tma_supported(q4, k4, v4, b4):
            gdpa_fwd_tma(q4, k4, v4, o4, activation, scale, post_scale, causal, negative_slope,
                         fit_tile(tma_fwd_config(capability), nq, nk))
            return out
    cfg = fit_tile(config or default_fwd_config(d, dv, v.dtype, nk, bias is not None, capability=capability), nq, nk)
    grid = (triton.cdiv(nq, cfg.block_m) * q4.shape[0] * h,)
    launcher(gdpa_fwd_kernel, traced)[grid](
        q4, k4, v4, b4 if b4 is not None else q4, o4,
        *q4.stride(), *k4.stride(), *v4.stride(), *strides4(b4), *o4.stride(),
        h, h // hkv, nq, nk, float(scale), float(post_scale), float(negative_slope),
        ACT=get_activation(activation).name, HAS_BIAS=b4 is not None, CAUSAL=bool(causal),
        EVEN_N=nk % cfg.block_n == 0,
        D=d, DV=dv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_dim(d), BLOCK_DV=block_dim(dv),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **kernel_flags(v.dtype, v.device),
    )
    return out
