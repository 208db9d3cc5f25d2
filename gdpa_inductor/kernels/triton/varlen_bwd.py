"""Triton varlen GDPA backward: the dense backward's two kernels (``gdpa_bwd.py``) over per-sample rows.

- dK/dV: one program per (key tile, kv head, sample), looping over its GQA group's query heads and over the
  query tiles that see the key tile (causal and window bounds from ``varlen_bounds``).
- dQ: one program per (query tile, head, sample), looping over the key tiles it sees.
Programs past a sample's length exit; samples run longest first. A dense side shared by the batch (PMA's
seed queries) gets a per-sample gradient buffer, summed afterwards (no atomics).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..activations import ActivationName, get_activation
from ..common.varlen_rows import VarlenSide, with_tensor
from ..common.window_bounds import UNBOUNDED, band_limits
from .activation_math import activate_and_grad, fp32_factors
from .layout import FULL_GRAD_BUFFER_BYTES, block_dim, fit_tile, kernel_flags, launcher
from .tile_configs import default_varlen_bwd_configs, dkdv_passes, tile_capability
from .varlen_bounds import band_keep, key_span, query_span
from .varlen_fwd import bias_view
from .varlen_gaps import zero_gaps
from .varlen_schedule import LEN_K, LEN_Q, ORDER, START_K, START_Q, program_work

_RUNTIME_SIZES = ["B", "HKV", "GROUP", "MAX_N", "LEFT", "RIGHT"]


@triton.jit
def _dkdv_tile(
    dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv, start_m,
    stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn, stride_dbm, stride_dbn,
    nq, nk, LEFT, RIGHT, scale, post_scale, slope,
    ACT: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    DB_ATOMIC: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WITH_DK: tl.constexpr, WITH_DV: tl.constexpr,
):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    qt_ptrs = q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd
    do_ptrs = do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod
    if MASKED:
        qt = tl.load(qt_ptrs, mask=(offs_m[None, :] < nq) & (offs_d[:, None] < D), other=0.0)
        do = tl.load(do_ptrs, mask=(offs_m[:, None] < nq) & (offs_dv[None, :] < DV), other=0.0)
    else:
        qt = tl.load(qt_ptrs, mask=offs_d[:, None] < D, other=0.0)
        do = tl.load(do_ptrs, mask=offs_dv[None, :] < DV, other=0.0)
    st = tl.dot(k, qt, input_precision=DOT_PRECISION) * scale
    in_sample = (offs_n[:, None] < nk) & (offs_m[None, :] < nq)
    if HAS_BIAS:
        st += tl.load(b_base + offs_n[:, None] * stride_bn + offs_m[None, :] * stride_bm, mask=in_sample,
                      other=0.0).to(tl.float32)
    pt, dact = activate_and_grad(st, slope, ACT, TANH_APPROX, PRECISE)
    if MASKED:
        keep = band_keep(offs_m[None, :], offs_n[:, None], nq, nk, LEFT, RIGHT)
        pt = tl.where(keep, pt, 0.0)
        dact = tl.where(keep, dact, 0.0)
    if WITH_DV:
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    if WITH_DK:
        dst = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION) * dact
        if BIAS_GRAD:  # dBias = dS: written where the sample has scores; padding stays 0
            db_ptrs = db_base + offs_n[:, None] * stride_dbn + offs_m[None, :] * stride_dbm
            if DB_ATOMIC:
                tl.atomic_add(db_ptrs, dst * post_scale, mask=in_sample, sem="relaxed")
            else:
                tl.store(db_ptrs, (dst * post_scale).to(db_base.dtype.element_ty), mask=in_sample)
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def gdpa_varlen_bwd_dkdv_kernel(
    Q, K, V, Bias, DO, DK, DV_, DBias, Sched, B,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_dob, stride_dom, stride_doh, stride_dod,
    stride_dkb, stride_dkn, stride_dkh, stride_dkd,
    stride_dvb, stride_dvn, stride_dvh, stride_dvd,
    stride_dbb, stride_dbh, stride_dbm, stride_dbn,
    HKV, GROUP, MAX_N, LEFT, RIGHT, DB_GROUPS, scale, post_scale, slope,
    ACT: tl.constexpr, RIGHT_BOUNDED: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    DB_ATOMIC: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WITH_DK: tl.constexpr, WITH_DV: tl.constexpr,
):
    scale, post_scale, slope = fp32_factors(scale, post_scale, slope)
    pid_n, hk, rank = program_work(MAX_N, BLOCK_N, HKV)
    z = tl.load(Sched + ORDER * B + rank).to(tl.int64)
    nq = tl.load(Sched + LEN_Q * B + rank)
    nk = tl.load(Sched + LEN_K * B + rank)
    q_row0 = tl.load(Sched + START_Q * B + rank).to(tl.int64)
    k_row0 = tl.load(Sched + START_K * B + rank).to(tl.int64)
    n0 = pid_n * BLOCK_N
    if n0 < nk:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        n_ok = offs_n < nk
        k = tl.load(K + z * stride_kb + (k_row0 + offs_n[:, None]) * stride_kn + hk * stride_kh
                    + offs_d[None, :] * stride_kd, mask=n_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        v = tl.load(V + z * stride_vb + (k_row0 + offs_n[:, None]) * stride_vn + hk * stride_vh
                    + offs_dv[None, :] * stride_vd, mask=n_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        n_last = tl.minimum(n0 + BLOCK_N, nk) - 1
        lo, full_lo, full_hi, hi = query_span(n0, n_last, nq, nk, LEFT, RIGHT, BLOCK_M)
        for g in range(GROUP):
            h = hk * GROUP + g
            q_base = Q + z * stride_qb + q_row0 * stride_qm + h * stride_qh
            do_base = DO + z * stride_dob + q_row0 * stride_dom + h * stride_doh
            b_base = Bias + z * stride_bb + h * stride_bh
            db_base = DBias + (z % DB_GROUPS) * stride_dbb + h * stride_dbh
            if RIGHT_BOUNDED:  # causal or a right window edge: masked query tiles before the complete ones
                for start_m in range(lo, full_lo, BLOCK_M):
                    dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv,
                                        start_m, stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn,
                                        stride_dbm, stride_dbn, nq, nk, LEFT, RIGHT, scale, post_scale, slope,
                                        ACT, True, HAS_BIAS, BIAS_GRAD, DB_ATOMIC, D, DV, BLOCK_M,
                                        TANH_APPROX, PRECISE, DOT_PRECISION, WITH_DK, WITH_DV)
            for start_m in range(full_lo, full_hi, BLOCK_M):
                dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv,
                                    start_m, stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn,
                                    stride_dbm, stride_dbn, nq, nk, LEFT, RIGHT, scale, post_scale, slope,
                                    ACT, False, HAS_BIAS, BIAS_GRAD, DB_ATOMIC, D, DV, BLOCK_M,
                                    TANH_APPROX, PRECISE, DOT_PRECISION, WITH_DK, WITH_DV)
            for start_m in range(full_hi, hi, BLOCK_M):
                dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv,
                                    start_m, stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn,
                                    stride_dbm, stride_dbn, nq, nk, LEFT, RIGHT, scale, post_scale, slope,
                                    ACT, True, HAS_BIAS, BIAS_GRAD, DB_ATOMIC, D, DV, BLOCK_M,
                                    TANH_APPROX, PRECISE, DOT_PRECISION, WITH_DK, WITH_DV)
        dk = dk * (scale * post_scale)
        dv = dv * post_scale
        if WITH_DK:
            tl.store(DK + z * stride_dkb + (k_row0 + offs_n[:, None]) * stride_dkn + hk * stride_dkh
                     + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
                     mask=n_ok[:, None] & (offs_d[None, :] < D))
        if WITH_DV:
            tl.store(DV_ + z * stride_dvb + (k_row0 + offs_n[:, None]) * stride_dvn + hk * stride_dvh
                     + offs_dv[None, :] * stride_dvd, dv.to(DV_.dtype.element_ty),
                     mask=n_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _dq_tile(
    dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn, stride_kd, stride_vn, stride_vd,
    stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope,
    ACT: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_N: tl.constexpr, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kt_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    vt_ptrs = v_base + offs_n[None, :] * stride_vn + offs_dv[:, None] * stride_vd
    if MASKED:
        kt = tl.load(kt_ptrs, mask=(offs_n[None, :] < nk) & (offs_d[:, None] < D), other=0.0)
        vt = tl.load(vt_ptrs, mask=(offs_n[None, :] < nk) & (offs_dv[:, None] < DV), other=0.0)
    else:
        kt = tl.load(kt_ptrs, mask=offs_d[:, None] < D, other=0.0)
        vt = tl.load(vt_ptrs, mask=offs_dv[:, None] < DV, other=0.0)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
    if HAS_BIAS:
        s += tl.load(b_base + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn,
                     mask=(offs_m[:, None] < nq) & (offs_n[None, :] < nk), other=0.0).to(tl.float32)
    p, dact = activate_and_grad(s, slope, ACT, TANH_APPROX, PRECISE)
    ds = tl.dot(do, vt, input_precision=DOT_PRECISION) * dact
    if MASKED:
        ds = tl.where(band_keep(offs_m[:, None], offs_n[None, :], nq, nk, LEFT, RIGHT), ds, 0.0)
    return tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def gdpa_varlen_bwd_dq_kernel(
    Q, K, V, Bias, DO, DQ, Sched, B,
    stride_qb, stride_qm, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_bb, stride_bh, stride_bm, stride_bn,
    stride_dob, stride_dom, stride_doh, stride_dod,
    stride_dqb, stride_dqm, stride_dqh, stride_dqd,
    HKV, GROUP, MAX_N, LEFT, RIGHT, scale, post_scale, slope,
    ACT: tl.constexpr, LEFT_BOUNDED: tl.constexpr, HAS_BIAS: tl.constexpr, D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale, post_scale, slope = fp32_factors(scale, post_scale, slope)
    pid_m, h, rank = program_work(MAX_N, BLOCK_M, HKV * GROUP)
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
        m_ok = offs_m < nq
        q = tl.load(Q + z * stride_qb + (q_row0 + offs_m[:, None]) * stride_qm + h * stride_qh
                    + offs_d[None, :] * stride_qd, mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        do = tl.load(DO + z * stride_dob + (q_row0 + offs_m[:, None]) * stride_dom + h * stride_doh
                     + offs_dv[None, :] * stride_dod, mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        k_base = K + z * stride_kb + k_row0 * stride_kn + hk * stride_kh
        v_base = V + z * stride_vb + k_row0 * stride_vn + hk * stride_vh
        b_base = Bias + z * stride_bb + h * stride_bh
        m_last = tl.minimum(m0 + BLOCK_M, nq) - 1
        lo, full_lo, full_hi, hi = key_span(m0, m_last, nq, nk, LEFT, RIGHT, BLOCK_N)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if LEFT_BOUNDED:
            for start_n in range(lo, full_lo, BLOCK_N):
                dq = _dq_tile(dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn,
                              stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope,
                              ACT, True, HAS_BIAS, D, DV, BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION)
        for start_n in range(full_lo, full_hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn,
                          stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope,
                          ACT, False, HAS_BIAS, D, DV, BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION)
        for start_n in range(full_hi, hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n, stride_kn,
                          stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, nq, nk, LEFT, RIGHT, scale, slope,
                          ACT, True, HAS_BIAS, D, DV, BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION)
        dq = dq * (scale * post_scale)
        tl.store(DQ + z * stride_dqb + (q_row0 + offs_m[:, None]) * stride_dqm + h * stride_dqh
                 + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty),
                 mask=m_ok[:, None] & (offs_d[None, :] < D))


def _grad_buffer(side: VarlenSide, like: torch.Tensor) -> tuple[VarlenSide, torch.Tensor]:
    """(where the kernel writes, what to sum it into): a dense side shared by several samples gets one
    slice per sample. A dense side's buffer is zero-filled (rows past a padded sample's length are never written);
    a jagged side's is not: ``varlen_gaps.zero_gaps`` zeroes the rows no sample writes."""
    if not side.jagged and like.shape[0] == 1 and side.batch > 1:
        full = torch.zeros((side.batch, *like.shape[1:]), dtype=torch.float32, device=like.device)
        return with_tensor(side, full), full
    if side.jagged:
        # contiguous, as the op's fake says; empty_like of each operand, so that a graph does not merge the buffers
        buf = torch.empty_like(like, memory_format=torch.contiguous_format)
    else:
        buf = torch.zeros(like.shape, dtype=like.dtype, device=like.device)
    return with_tensor(side, buf), buf


def _finish(buf: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return buf.sum(0, keepdim=True).to(like.dtype) if buf.shape[0] != like.shape[0] else buf


class _BiasGrad:
    """Where the dK/dV kernel writes dBias = dS. A bias per sample gets a buffer of its full [B, H, max_q, max_k]
    shape (each entry written once). A bias shared by the samples (a relative position bias) gets G slices,
    sample z adding into slice z % G: one slice per sample (plain stores) when that fits in the budget,
    else as many as fit, with low-contention atomics, instead of every sample adding into one [H, max_q,
    max_k] tensor. Zero-filled: scores outside a sample (padding, zero-length samples) have no gradient."""

    def __init__(self, bias: torch.Tensor, b4: torch.Tensor):
        batch, per_sample = b4.shape[0], max(1, b4[0].numel() * 4)
        self.shared = b4.stride(0) == 0 and batch > 1
        self.groups = max(1, min(batch, FULL_GRAD_BUFFER_BYTES // per_sample)) if self.shared else batch
        self.atomic = self.groups < batch
        self.buf = torch.zeros((self.groups, *b4.shape[1:]), dtype=torch.float32, device=b4.device)
        self.bias = bias

    def result(self) -> torch.Tensor:
        buf = self.buf.sum(0, keepdim=True) if self.shared else self.buf
        return buf.sum_to_size(self.bias.shape).to(self.bias.dtype)


def gdpa_varlen_bwd_triton(dout: VarlenSide, q: VarlenSide, k: VarlenSide, v: torch.Tensor,
                           bias: torch.Tensor | None, schedule: torch.Tensor, activation: ActivationName, scale: float,
                           post_scale: float, causal: bool, window: tuple[int, int], negative_slope: float,
                           bias_requires_grad: bool, configs=None, traced: bool = False) -> tuple:
    """(dq, dk, dv, dbias or None). ``traced``: the launches go into a compiled graph (``layout.launcher``)."""
    h, d = q.tensor.shape[-2:]
    hkv, dv_dim = v.shape[-2:]
    left, right = band_limits(causal, window)
    kv_cfg, q_cfg = configs or default_varlen_bwd_configs(d, dv_dim, v.dtype, k.max_len,
                                                            capability=tile_capability(v.device))
    kv_cfg, q_cfg = fit_tile(kv_cfg, q.max_len, k.max_len), fit_tile(q_cfg, q.max_len, k.max_len)
    dq_side, dq = _grad_buffer(q, q.tensor)
    dk_side, dk = _grad_buffer(k, k.tensor)
    dv_side, dv = _grad_buffer(k, v)
    zero_gaps(schedule, q.batch, dq if q.jagged else None, dk if k.jagged else None, dv if k.jagged else None,
              traced)
    common = dict(
        ACT=get_activation(activation).name, D=d, DV=dv_dim,
        BLOCK_D=block_dim(d), BLOCK_DV=block_dim(dv_dim), **kernel_flags(v.dtype, v.device),
    )
    b4, b_strides = bias_view(bias, q, k)
    db = _BiasGrad(bias, b4) if b4 is not None and bias_requires_grad else None
    rows = (schedule, q.batch)
    strides = (*q.strides(), *k.strides(), *k.strides_of(v), *b_strides, *dout.strides())
    scalars = (float(scale), float(post_scale), float(negative_slope))
    bias_arg = b4 if b4 is not None else v
    for cfg, with_dk, with_dv in dkdv_passes(kv_cfg):
        launcher(gdpa_varlen_bwd_dkdv_kernel, traced)[(triton.cdiv(k.max_len, cfg.block_n) * hkv * k.batch,)](
            q.tensor, k.tensor, v, bias_arg, dout.tensor, dk_side.tensor, dv_side.tensor,
            db.buf if db is not None else v, *rows, *strides, *dk_side.strides(), *dv_side.strides(),
            *(db.buf.stride() if db is not None else (0, 0, 0, 0)), hkv, h // hkv, k.max_len, left, right,
            db.groups if db is not None else 1, *scalars,
            RIGHT_BOUNDED=right != UNBOUNDED, HAS_BIAS=b4 is not None, BIAS_GRAD=db is not None,
            DB_ATOMIC=db is not None and db.atomic, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            WITH_DK=with_dk, WITH_DV=with_dv, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common,
        )
    launcher(gdpa_varlen_bwd_dq_kernel, traced)[(triton.cdiv(q.max_len, q_cfg.block_m) * h * q.batch,)](
        q.tensor, k.tensor, v, bias_arg, dout.tensor, dq_side.tensor, *rows,
        *strides, *dq_side.strides(), hkv, h // hkv, q.max_len, left, right, *scalars,
        LEFT_BOUNDED=left != UNBOUNDED, HAS_BIAS=b4 is not None, BLOCK_M=q_cfg.block_m, BLOCK_N=q_cfg.block_n,
        num_warps=q_cfg.num_warps, num_stages=q_cfg.num_stages, **common,
    )
    dbias = db.result() if db is not None else None
    return _finish(dq, q.tensor), _finish(dk, k.tensor), _finish(dv, v), dbias
