"""Triton varlen GDPA forward: one program per (query tile, head, sample), work following real tokens.

Each side of a call is described per sample by a start row and a length (``VarlenSide``): a jagged
``[total, H, D]`` tensor has its offsets there, a dense ``[B or 1, N, H, D]`` tensor a per-sample stride
(0 when shared: PMA's seed queries), and padded batches can pass their valid lengths. Programs beyond a
sample's length exit at once; samples are visited longest first (the schedule's order), so the long ones start
early and the short ones fill the gaps at the end. Key tiles outside the causal mask or the window are
never loaded (``varlen_bounds``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..activations import ActivationName, get_activation
from ..common.varlen_rows import VarlenSide
from ..common.window_bounds import UNBOUNDED, band_limits
from .activation_math import activate, fp32_factors
from .layout import block_dim, fit_tile, kernel_flags, launcher
from .tile_configs import default_varlen_fwd_config, tile_capability
from .varlen_bounds import band_keep, key_span
from .varlen_schedule import LEN_K, LEN_Q, ORDER, START_K, START_Q, program_work

_RUNTIME_SIZES = ["B", "H", "GROUP", "MAX_NQ", "LEFT", "RIGHT"]


@triton.jit
def _fwd_tile(
    acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn, stride_kd, stride_vn, stride_vd,
    stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope,
    ACT: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_N: tl.constexpr, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd
    if MASKED:
        kt = tl.load(kt_ptrs, mask=(offs_n[None, :] < nk) & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_ptrs, mask=(offs_n[:, None] < nk) & (offs_dv[None, :] < DV), other=0.0)
    else:
        kt = tl.load(kt_ptrs, mask=offs_d[:, None] < D, other=0.0)
        v = tl.load(v_ptrs, mask=offs_dv[None, :] < DV, other=0.0)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
    if HAS_BIAS:
        s += tl.load(b_base + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn,
                     mask=(offs_m[:, None] < nq) & (offs_n[None, :] < nk), other=0.0).to(tl.float32)
    p = activate(s, slope, ACT, TANH_APPROX, PRECISE)
    if MASKED:
        p = tl.where(band_keep(offs_m[:, None], offs_n[None, :], nq, nk, LEFT, RIGHT), p, 0.0)
    return tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def gdpa_varlen_fwd_kernel(
    Q, K, V, Bias, Out, Sched, B,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_ob, stride_om, stride_oh, stride_od,
    H, GROUP, MAX_NQ, LEFT, RIGHT, scale, post_scale, slope,
    ACT: tl.constexpr, LEFT_BOUNDED: tl.constexpr, HAS_BIAS: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale, post_scale, slope = fp32_factors(scale, post_scale, slope)
    pid_m, h, rank = program_work(MAX_NQ, BLOCK_M, H)
    z = tl.load(Sched + ORDER * B + rank).to(tl.int64)
    nq = tl.load(Sched + LEN_Q * B + rank)
    nk = tl.load(Sched + LEN_K * B + rank)
    q_row0 = tl.load(Sched + START_Q * B + rank).to(tl.int64)
    k_row0 = tl.load(Sched + START_K * B + rank).to(tl.int64)
    m0 = pid_m * BLOCK_M
    if m0 < nq:
        hk = h // GROUP
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q_base = Q + z * stride_qb + q_row0 * stride_qm + h * stride_qh
        q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                    mask=(offs_m[:, None] < nq) & (offs_d[None, :] < D), other=0.0)
        k_base = K + z * stride_kb + k_row0 * stride_kn + hk * stride_kh
        v_base = V + z * stride_vb + k_row0 * stride_vn + hk * stride_vh
        b_base = Bias + z * stride_bb + h * stride_bh

        m_last = tl.minimum(m0 + BLOCK_M, nq) - 1
        lo, full_lo, full_hi, hi = key_span(m0, m_last, nq, nk, LEFT, RIGHT, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        if LEFT_BOUNDED:  # only a window's left edge puts masked tiles before the complete ones
            for start_n in range(lo, full_lo, BLOCK_N):
                acc = _fwd_tile(acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn,
                                stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale,
                                slope, ACT, True, HAS_BIAS, D, DV,
                                BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            acc = _fwd_tile(acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn, stride_kd,
                            stride_vn, stride_vd, stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope, ACT,
                            False, HAS_BIAS, D, DV,
                            BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION)
        for start_n in range(full_hi, hi, BLOCK_N):
            acc = _fwd_tile(acc, q, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn, stride_kd,
                            stride_vn, stride_vd, stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope, ACT,
                            True, HAS_BIAS, D, DV,
                            BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION)
        acc = acc * post_scale
        o_ptrs = (Out + z * stride_ob + q_row0 * stride_om + h * stride_oh
                  + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od)
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < nq) & (offs_dv[None, :] < DV))


def bias_view(bias: torch.Tensor | None, q: VarlenSide, k: VarlenSide) -> tuple[torch.Tensor | None, tuple]:
    """The bias as ``[B, H, max_q, max_k]`` (a view: broadcast dims get stride 0) and its four strides."""
    if bias is None:
        return None, (0, 0, 0, 0)
    b4 = bias.expand(q.batch, q.tensor.shape[-2], q.max_len, k.max_len)
    return b4, tuple(b4.stride())


def gdpa_varlen_fwd_triton(q: VarlenSide, k: VarlenSide, v: torch.Tensor, bias: torch.Tensor | None, out: VarlenSide,
                           schedule: torch.Tensor, activation: ActivationName, scale: float, post_scale: float,
                           causal: bool, window: tuple[int, int], negative_slope: float, config=None,
                           traced: bool = False) -> None:
    """Writes the forward into ``out.tensor`` (rows past a sample's length are left as they are); ``schedule``: the
    sides' (``varlen_schedule.varlen_sides``). ``traced``: the launch goes into a compiled graph
    (``layout.launcher``)."""
    h, d = q.tensor.shape[-2:]
    hkv, dv = v.shape[-2:]
    left, right = band_limits(causal, window)
    cfg = fit_tile(config or default_varlen_fwd_config(d, dv, v.dtype, k.max_len,
                                                    capability=tile_capability(v.device)), q.max_len, k.max_len)
    grid = (triton.cdiv(q.max_len, cfg.block_m) * h * q.batch,)
    b4, b_strides = bias_view(bias, q, k)
    launcher(gdpa_varlen_fwd_kernel, traced)[grid](
        q.tensor, k.tensor, v, b4 if b4 is not None else v, out.tensor, schedule, q.batch,
        *q.strides(), *k.strides(), *k.strides_of(v), *b_strides, *out.strides(),
        h, h // hkv, q.max_len, left, right, float(scale), float(post_scale), float(negative_slope),
        ACT=get_activation(activation).name, LEFT_BOUNDED=left != UNBOUNDED, HAS_BIAS=b4 is not None,
        D=d, DV=dv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_dim(d), BLOCK_DV=block_dim(dv),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **kernel_flags(v.dtype, v.device),
    )
