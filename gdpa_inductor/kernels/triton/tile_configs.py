"""The Triton kernels' tiles, warps and stages per call: each choice with the measurement behind it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layout import block_dim


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_fwd_config(d: int, dv: int, dtype: torch.dtype, kv_len: int, has_bias: bool = False) -> FwdConfig:
    """Tiles measured with benchmarks/tune.py triton (H200, bf16, D=128, gelu_tanh): 128x64 with 8 warps
    and 3 stages at kv=2048 (502 TF/s); with short kv (<= 512) the loop is too short to pipeline, and
    4 warps with 2 stages win (329 vs 256 TF/s at kv=256) although ptxas spills ~140 B/thread there
    (the spill-free 8-warp tile is the slower one). With a bias tile to load as well, that tile spills
    ~1.6 KB and drops to 63 TF/s; 64x64 with 4 warps gives 202-237 TF/s at kv=256-512."""
    width = max(block_dim(d), block_dim(dv))
    if dtype == torch.float32:
        return FwdConfig(64, 32 if width > 64 else 64, 4, 2)
    if width <= 64:
        return FwdConfig(128, 64, 4, 2)  # spill-free on sm_90a (tests/kernels/test_triton_compile_sm90.py)
    if width <= 128:
        if kv_len > 512:
            return FwdConfig(128, 64, 8, 3)
        return FwdConfig(64, 64, 4, 2) if has_bias else FwdConfig(128, 64, 4, 2)
    return FwdConfig(64, 64, 4, 2)


@dataclass(frozen=True)
class BwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_bwd_configs(d: int, dv: int, dtype: torch.dtype, kv_len: int) -> tuple[BwdConfig, BwdConfig]:
    """(dK/dV config, dQ config), measured with benchmarks/tune.py triton (H200, bf16, D=128): dK/dV
    64x128, 8 warps, 3 stages with dQ 128x64 was fastest from kv=512 to 2048 (268-348 TF/s); at kv=256
    with as many queries, smaller dK/dV tiles (32x64, 4 warps) give more programs (215 vs 206 TF/s).
    Fusing dQ into the dK/dV kernel (5 matmuls instead of 7) was measured and dropped: with tl.atomic_add
    it ran 2x slower at every shape (scalar fp32 atomics became the limit), and the TMA reduce-add
    (descriptor atomic_add) that FA3 uses for dQ does not exist in Triton 3.6."""
    width = max(block_dim(d), block_dim(dv))
    if dtype == torch.float32:
        return BwdConfig(32, 64, 4, 2), BwdConfig(64, 32, 4, 2)
    if width <= 64:
        # the spill-free pair on sm_90a at this width
        return BwdConfig(64, 64, 8, 2), BwdConfig(128, 64, 8, 2)
    if width <= 128:
        kv_cfg = BwdConfig(32, 64, 4, 3) if kv_len <= 256 else BwdConfig(64, 128, 8, 3)
        return kv_cfg, BwdConfig(128, 64, 8, 2)
    # D > 128: two [BLOCK_N, D] fp32 accumulators; 8 warps spill least (ptxas report)
    return BwdConfig(64, 64, 8, 2), BwdConfig(64, 32, 4, 2)


def default_varlen_fwd_config(d: int, dv: int, dtype: torch.dtype, max_kv_len: int) -> FwdConfig:
    """Measured on an H200 (bf16, D=128, kernel time): with sequences up to 512, most samples span only a few key
    tiles; 32-key tiles waste less on each sample's ragged last tile and three stages keep them fed (B=1152, max 256:
    0.29 ms vs 0.48 with the dense kernel's 128x64x2 at sparsity 0.5). The same tile wins up to 2048 at head width 128
    (HSTU's lengths in [N/2, N]: 0.149 vs 0.166 ms causal at N=1024, 0.192 vs 0.199 at 2048; B=1152 in [1, 1024]:
    2.02 vs 2.32 ms), but not at 4096 (0.68 vs 0.63 ms without a mask): longer ones use the dense kernel's tiles."""
    if dtype != torch.float32 and max(d, dv) <= 128 and (
            max_kv_len <= 512 or (block_dim(max(d, dv)) == 128 and max_kv_len <= 2048)):
        return FwdConfig(128, 32, 4, 3)
    return default_fwd_config(d, dv, dtype, max_kv_len)


def default_varlen_bwd_configs(d: int, dv: int, dtype: torch.dtype, max_kv_len: int) -> tuple[BwdConfig, BwdConfig]:
    """(dK/dV, dQ) tiles. Measured on an H200 (bf16, D=128, the two kernels' GPU time, ``benchmarks/tune.py
    varlen``): with sequences up to 512, 16x64 dK/dV tiles with three stages and 64x32 dQ tiles with three stages,
    4 warps each, beat the dense kernels' tiles (1.22 vs 1.37 ms at max 256, sparsity 0.5) and the 32x64 / 64x64
    two-stage pair (1.11 vs 1.16 ms there, 2.93 vs 2.97 at max 512). Past 512 at head width 128, 32x64 dK/dV tiles
    with the same dQ tiles beat the dense kernels' pair from 1024 to 4096 keys, causal or not (forward+backward, HSTU's
    lengths in [N/2, N]: 0.66 vs 0.83 ms causal at N=1024, 0.84 vs 0.97 at 2048; B=1152 in [1, 1024]: 9.5 vs 10.8)."""
    if dtype != torch.float32 and max(d, dv) <= 128 and max_kv_len <= 512:
        return BwdConfig(16, 64, 4, 3), BwdConfig(64, 32, 4, 3)
    if dtype != torch.float32 and block_dim(max(d, dv)) == 128 and max_kv_len <= 4096:
        return BwdConfig(32, 64, 4, 3), BwdConfig(64, 32, 4, 3)
    return default_bwd_configs(d, dv, dtype, max_kv_len)


# the TMA forward's tile (``gdpa_fwd_tma``)
TMA_CONFIG = FwdConfig(128, 64, 4, 2)
