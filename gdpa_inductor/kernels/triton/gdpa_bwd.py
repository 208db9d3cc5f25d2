"""Triton GDPA backward. Nothing N×N is read: S is recomputed from Q and K.

Two kernels, no softmax pre-pass (no LSE, no rowsum(dO∘O)):
- ``gdpa_bwd_dkdv_kernel``: one program per (key tile, batch, kv head); it loops over the query heads
  of its GQA group and over query tiles, accumulating dK and dV in registers (no atomics), and writes
  dBias = dS when the bias needs a gradient.
- ``gdpa_bwd_dq_kernel``: one program per (query tile, batch, head); loops over key tiles for dQ.
Transposed tiles (Sᵀ = K Qᵀ) keep every matmul in the natural operand order. post_scale and scale are
applied once per output tile. A gradient whose input was broadcast (a PMA seed query, a bias shared over
batch or heads) is accumulated with atomics in fp32 and summed to the input's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..activations import ActivationName, get_activation
from ..common.layout import as_4d
from .activation_math import activate_and_grad, fp32_factors
from .layout import block_dim, fit_tile, grad_buffer, kernel_flags, launcher, strides4
from .tile_configs import BwdConfig, default_bwd_configs, dkdv_passes, tile_capability
from .tile_order import causal_key_tiles, query_tile_program

# Sizes vary call to call; specializing on them (==1, %16) would recompile per shape.
_RUNTIME_SIZES = ["H", "HKV", "GROUP", "NQ", "NK"]


@triton.jit
def _store_grad(ptrs, value, mask, ATOMIC: tl.constexpr):
    if ATOMIC:
        tl.atomic_add(ptrs, value, mask=mask)
    else:
        tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _dkdv_tile(
    dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv, start_m,
    stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn, stride_dbm, stride_dbn,
    NQ, NK, scale, post_scale, slope,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr, DB_ATOMIC: tl.constexpr,
    CAUSAL: tl.constexpr, MASKED: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WITH_DK: tl.constexpr, WITH_DV: tl.constexpr,
):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < NQ
    qt = tl.load(q_base + offs_m[None, :] * stride_qm + offs_d[:, None] * stride_qd,
                 mask=m_ok[None, :] & (offs_d[:, None] < D), other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                 mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    st = tl.dot(k, qt, input_precision=DOT_PRECISION) * scale
    if HAS_BIAS:
        st += tl.load(b_base + offs_m[None, :] * stride_bm + offs_n[:, None] * stride_bn,
                      mask=m_ok[None, :] & (offs_n[:, None] < NK), other=0.0).to(tl.float32)
    pt, dact = activate_and_grad(st, slope, ACT, TANH_APPROX, PRECISE)
    if MASKED:
        # Padded queries load as zeros, but a non-finite key makes their score inf * 0 = NaN.
        keep = m_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[:, None] <= offs_m[None, :] + (NK - NQ))
        pt = tl.where(keep, pt, 0.0)
        dact = tl.where(keep, dact, 0.0)
    if WITH_DV:
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
    if WITH_DK:
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dst = dpt * dact
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PRECISION)
        if BIAS_GRAD:
            db_ptrs = db_base + offs_m[None, :] * stride_dbm + offs_n[:, None] * stride_dbn
            _store_grad(db_ptrs, dst * post_scale, m_ok[None, :] & (offs_n[:, None] < NK), DB_ATOMIC)
    return dk, dv


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def gdpa_bwd_dkdv_kernel(
    Q, K, V, Bias, DO, DK, DV_, DB,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_bz, stride_bh, stride_bm, stride_bn,
    stride_doz, stride_doh, stride_dom, stride_dod,
    stride_dkz, stride_dkh, stride_dkn, stride_dkd,
    stride_dvz, stride_dvh, stride_dvn, stride_dvd,
    stride_dbz, stride_dbh, stride_dbm, stride_dbn,
    HKV, GROUP, NQ, NK, scale, post_scale, slope,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    DB_ATOMIC: tl.constexpr, DK_ATOMIC: tl.constexpr, DV_ATOMIC: tl.constexpr, CAUSAL: tl.constexpr,
    EVEN_M: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WITH_DK: tl.constexpr, WITH_DV: tl.constexpr,
):
    scale, post_scale, slope = fp32_factors(scale, post_scale, slope)
    num_n = tl.cdiv(NK, BLOCK_N)
    pid = tl.program_id(0)
    pid_n = pid % num_n
    zh = pid // num_n
    z = (zh // HKV).to(tl.int64)
    hk = zh % HKV

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_ok = offs_n < NK
    k = tl.load(K + z * stride_kz + hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=n_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    v = tl.load(V + z * stride_vz + hk * stride_vh + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                mask=n_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    if CAUSAL:
        # query i sees key j iff i >= j - (NK - NQ); rows from `full` on see the whole key tile
        lo = tl.maximum(pid_n * BLOCK_N - (NK - NQ), 0) // BLOCK_M * BLOCK_M
        full = tl.maximum((pid_n + 1) * BLOCK_N - 1 - (NK - NQ), 0)
        full_start = tl.minimum(tl.cdiv(full, BLOCK_M) * BLOCK_M, tl.cdiv(NQ, BLOCK_M) * BLOCK_M)
    else:
        lo = 0
        full_start = 0
    # a ragged last query tile runs masked
    full_end = tl.maximum(NQ // BLOCK_M * BLOCK_M, full_start)

    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + z * stride_qz + h * stride_qh
        do_base = DO + z * stride_doz + h * stride_doh
        b_base = Bias + z * stride_bz + h * stride_bh
        db_base = DB + z * stride_dbz + h * stride_dbh
        # Masked loops are compiled only where they can run (their registers slow the whole kernel).
        if CAUSAL:
            for start_m in range(lo, full_start, BLOCK_M):
                dk, dv = _dkdv_tile(
                    dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv, start_m,
                    stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn, stride_dbm, stride_dbn,
                    NQ, NK, scale, post_scale, slope, ACT, HAS_BIAS, BIAS_GRAD, DB_ATOMIC,
                    CAUSAL, True, D, DV, BLOCK_M, TANH_APPROX, PRECISE, DOT_PRECISION, WITH_DK, WITH_DV,
                )
        for start_m in range(full_start, full_end, BLOCK_M):
            dk, dv = _dkdv_tile(
                dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv, start_m,
                stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn, stride_dbm, stride_dbn,
                NQ, NK, scale, post_scale, slope, ACT, HAS_BIAS, BIAS_GRAD, DB_ATOMIC,
                CAUSAL, False, D, DV, BLOCK_M, TANH_APPROX, PRECISE, DOT_PRECISION, WITH_DK, WITH_DV,
            )
        if not EVEN_M:
            for start_m in range(full_end, NQ, BLOCK_M):
                dk, dv = _dkdv_tile(
                    dk, dv, k, v, q_base, do_base, b_base, db_base, offs_n, offs_d, offs_dv, start_m,
                    stride_qm, stride_qd, stride_dom, stride_dod, stride_bm, stride_bn, stride_dbm, stride_dbn,
                    NQ, NK, scale, post_scale, slope, ACT, HAS_BIAS, BIAS_GRAD, DB_ATOMIC,
                    CAUSAL, True, D, DV, BLOCK_M, TANH_APPROX, PRECISE, DOT_PRECISION, WITH_DK, WITH_DV,
                )

    dk = dk * (scale * post_scale)
    dv = dv * post_scale
    dk_ptrs = DK + z * stride_dkz + hk * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    dv_ptrs = DV_ + z * stride_dvz + hk * stride_dvh + offs_n[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd
    if WITH_DK:
        _store_grad(dk_ptrs, dk, n_ok[:, None] & (offs_d[None, :] < D), DK_ATOMIC)
    if WITH_DV:
        _store_grad(dv_ptrs, dv, n_ok[:, None] & (offs_dv[None, :] < DV), DV_ATOMIC)


@triton.jit
def _dq_tile(
    dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n,
    stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn,
    NQ, NK, scale, slope,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_ok = offs_n < NK
    kt = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                 mask=n_ok[None, :] & (offs_d[:, None] < D), other=0.0)
    vt = tl.load(v_base + offs_n[None, :] * stride_vn + offs_dv[:, None] * stride_vd,
                 mask=n_ok[None, :] & (offs_dv[:, None] < DV), other=0.0)
    s = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
    if HAS_BIAS:
        s += tl.load(b_base + offs_m[:, None] * stride_bm + offs_n[None, :] * stride_bn,
                     mask=(offs_m[:, None] < NQ) & n_ok[None, :], other=0.0).to(tl.float32)
    p, dact = activate_and_grad(s, slope, ACT, TANH_APPROX, PRECISE)
    dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
    ds = dp * dact
    if MASKED:
        # Padded keys load as zeros, but a non-finite query makes their score inf * 0 = NaN.
        keep = n_ok[None, :]
        if CAUSAL:
            keep = keep & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))
        ds = tl.where(keep, ds, 0.0)
    return tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PRECISION)


@triton.jit(do_not_specialize=_RUNTIME_SIZES)
def gdpa_bwd_dq_kernel(
    Q, K, V, Bias, DO, DQ,
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_bz, stride_bh, stride_bm, stride_bn,
    stride_doz, stride_doh, stride_dom, stride_dod,
    stride_dqz, stride_dqh, stride_dqm, stride_dqd,
    H, GROUP, NQ, NK, scale, post_scale, slope,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, Q_ATOMIC: tl.constexpr, CAUSAL: tl.constexpr,
    EVEN_N: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    TANH_APPROX: tl.constexpr, PRECISE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale, post_scale, slope = fp32_factors(scale, post_scale, slope)
    pid_m, z, h, hk = query_tile_program(NQ, H, GROUP, BLOCK_M, CAUSAL)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < NQ
    q = tl.load(Q + z * stride_qz + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + z * stride_doz + h * stride_doh + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                 mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    k_base = K + z * stride_kz + hk * stride_kh
    v_base = V + z * stride_vz + hk * stride_vh
    b_base = Bias + z * stride_bz + h * stride_bh

    full_end, hi = causal_key_tiles(pid_m, NQ, NK, BLOCK_M, BLOCK_N, CAUSAL)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, full_end, BLOCK_N):
        dq = _dq_tile(
            dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n,
            stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, NQ, NK, scale, slope,
            ACT, HAS_BIAS, CAUSAL, False, D, DV, BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION,
        )
    if CAUSAL or not EVEN_N:
        for start_n in range(full_end, hi, BLOCK_N):
            dq = _dq_tile(
                dq, q, do, k_base, v_base, b_base, offs_m, offs_d, offs_dv, start_n,
                stride_kn, stride_kd, stride_vn, stride_vd, stride_bm, stride_bn, NQ, NK, scale, slope,
                ACT, HAS_BIAS, CAUSAL, True, D, DV, BLOCK_N, TANH_APPROX, PRECISE, DOT_PRECISION,
            )
    dq = dq * (scale * post_scale)
    dq_ptrs = DQ + z * stride_dqz + h * stride_dqh + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd
    _store_grad(dq_ptrs, dq, m_ok[:, None] & (offs_d[None, :] < D), Q_ATOMIC)


def gdpa_bwd_triton(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    activation: ActivationName,
    scale: float,
    post_scale: float,
    causal: bool,
    negative_slope: float,
    bias_requires_grad: bool,
    configs: tuple[BwdConfig, BwdConfig] | None = None,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launches both backward kernels; returns (dq, dk, dv, dbias or None), contiguous, in the inputs'
    shapes and dtypes. ``traced``: the launches go into a compiled graph (``layout.launcher``)."""
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    h, nq, d = q.shape[-3:]
    hkv, nk, dv_dim = v.shape[-3:]
    q4, k4, v4 = as_4d(q, batch), as_4d(k, batch), as_4d(v, batch)
    zb = q4.shape[0]
    do4 = as_4d(dout, batch)
    b4 = as_4d(bias.expand(*batch, h, nq, nk), batch) if bias is not None else None
    kv_cfg, q_cfg = configs or default_bwd_configs(d, dv_dim, v.dtype, nk, capability=tile_capability(v.device))
    kv_cfg, q_cfg = fit_tile(kv_cfg, nq, nk), fit_tile(q_cfg, nq, nk)
    dq_buf = grad_buffer(q, (zb, h, nq, d), batch)
    dk_buf = grad_buffer(k, (zb, hkv, nk, d), batch)
    dv_buf = grad_buffer(v, (zb, hkv, nk, dv_dim), batch)
    db_buf = None
    if bias is not None and bias_requires_grad:
        db_buf = grad_buffer(bias, (zb, h, nq, nk), batch, sparse_writes=causal)
    db4 = db_buf.view4d if db_buf is not None else None

    common = dict(
        D=d, DV=dv_dim, BLOCK_D=block_dim(d), BLOCK_DV=block_dim(dv_dim), CAUSAL=bool(causal),
        HAS_BIAS=b4 is not None, ACT=get_activation(activation).name,
        **kernel_flags(v.dtype, v.device),
    )
    scalars = (nq, nk, float(scale), float(post_scale), float(negative_slope))
    bias_arg = b4 if b4 is not None else q4
    for cfg, with_dk, with_dv in dkdv_passes(kv_cfg):
        launcher(gdpa_bwd_dkdv_kernel, traced)[(triton.cdiv(nk, cfg.block_n) * zb * hkv,)](
            q4, k4, v4, bias_arg, do4, dk_buf.view4d, dv_buf.view4d, db4 if db4 is not None else q4,
            *q4.stride(), *k4.stride(), *v4.stride(), *strides4(b4), *do4.stride(),
            *dk_buf.view4d.stride(), *dv_buf.view4d.stride(), *strides4(db4),
            hkv, h // hkv, *scalars,
            BIAS_GRAD=db4 is not None, DB_ATOMIC=db_buf is not None and db_buf.atomic,
            DK_ATOMIC=dk_buf.atomic, DV_ATOMIC=dv_buf.atomic, EVEN_M=nq % cfg.block_m == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WITH_DK=with_dk, WITH_DV=with_dv,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common,
        )
    launcher(gdpa_bwd_dq_kernel, traced)[(triton.cdiv(nq, q_cfg.block_m) * zb * h,)](
        q4, k4, v4, bias_arg, do4, dq_buf.view4d,
        *q4.stride(), *k4.stride(), *v4.stride(), *strides4(b4), *do4.stride(), *dq_buf.view4d.stride(),
        h, h // hkv, *scalars,
        Q_ATOMIC=dq_buf.atomic, EVEN_N=nk % q_cfg.block_n == 0, BLOCK_M=q_cfg.block_m, BLOCK_N=q_cfg.block_n,
        num_warps=q_cfg.num_warps, num_stages=q_cfg.num_stages, **common,
    )
    return dq_buf.finish(), dk_buf.finish(), dv_buf.finish(), db_buf.finish() if db_buf is not None else None
