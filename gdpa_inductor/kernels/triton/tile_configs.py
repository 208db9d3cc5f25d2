"""The Triton kernels' tiles, warps and stages per call: each choice with the measurement behind it.

Each choice takes the compute capability (major) of the GPU the kernel is compiled for, from ``tile_capability``
(the one place the launchers, and the launches a compiled graph makes through them, read it). Hopper's tiles (9) were
measured on an H200 and serve every GPU but sm_100 (10). The sm_100 tiles were chosen to compile for sm_100a without
register spills (``tests/kernels/test_triton_compile_sm100.py``), with shapes from Triton's fused-attention tutorial;
none was run or measured on a Blackwell GPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..common.device import capability_major
from .layout import block_dim, interpreting

HOPPER, BLACKWELL = 9, 10


def tile_capability(device: torch.device) -> int:
    """The compute capability (major) the launchers choose tiles for: the tensors' GPU's; Hopper's (the tiles
    measured) for CPU tensors and under the interpreter, where no GPU is asked."""
    if device.type != "cuda" or interpreting():
        return HOPPER
    return capability_major(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_fwd_config(d: int, dv: int, dtype: torch.dtype, kv_len: int, has_bias: bool = False, *,
                       capability: int) -> FwdConfig:
    """Tiles measured with benchmarks/tune.py triton (H200, bf16, D=128, gelu_tanh): 128x64 with 8 warps
    and 3 stages at kv=2048 (502 TF/s); with short kv (<= 512) the loop is too short to pipeline, and
    4 warps with 2 stages win (329 vs 256 TF/s at kv=256) although ptxas spills ~140 B/thread there
    (the spill-free 8-warp tile is the slower one). With a bias tile to load as well, that tile spills
    ~1.6 KB and drops to 63 TF/s; 64x64 with 4 warps gives 202-237 TF/s at kv=256-512."""
    width = max(block_dim(d), block_dim(dv))
    if capability == BLACKWELL:
        return _blackwell_fwd_config(width, dtype, kv_len, has_bias)
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
    """A backward kernel's tiles. ``dv_pass``: dK/dV only: dV is computed by a pass of its own with these tiles,
    then dK (and dBias) by a second pass with the others, so that each carries one accumulator."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dv_pass: BwdConfig | None = None


def dkdv_passes(kv_cfg: BwdConfig) -> tuple[tuple[BwdConfig, bool, bool], ...]:
    """The dK/dV kernel's launches for a tile choice: (tiles, computes dK, computes dV) each; one launch computing
    both unless the choice has a ``dv_pass``."""
    if kv_cfg.dv_pass is None:
        return ((kv_cfg, True, True),)
    return (kv_cfg.dv_pass, False, True), (kv_cfg, True, False)


def default_bwd_configs(d: int, dv: int, dtype: torch.dtype, kv_len: int, *,
                        capability: int) -> tuple[BwdConfig, BwdConfig]:
    """(dK/dV config, dQ config), measured with benchmarks/tune.py triton (H200, bf16, D=128): dK/dV
    64x128, 8 warps, 3 stages with dQ 128x64 was fastest from kv=512 to 2048 (268-348 TF/s); at kv=256
    with as many queries, smaller dK/dV tiles (32x64, 4 warps) give more programs (215 vs 206 TF/s).
    Fusing dQ into the dK/dV kernel (5 matmuls instead of 7) was measured and dropped: with tl.atomic_add
    it ran 2x slower at every shape (scalar fp32 atomics became the limit), and the TMA reduce-add
    (descriptor atomic_add) that FA3 uses for dQ does not exist in Triton 3.6."""
    width = max(block_dim(d), block_dim(dv))
    if capability == BLACKWELL:
        return _blackwell_bwd_configs(block_dim(d), block_dim(dv), dtype)
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


def default_varlen_fwd_config(d: int, dv: int, dtype: torch.dtype, max_kv_len: int, *, capability: int) -> FwdConfig:
    """Measured on an H200 (bf16, D=128, kernel time): with sequences up to 512, most samples span only a few key
    tiles; 32-key tiles waste less on each sample's ragged last tile and three stages keep them fed (B=1152, max 256:
    0.29 ms vs 0.48 with the dense kernel's 128x64x2 at sparsity 0.5). The same tile wins up to 2048 at head width 128
    (HSTU's lengths in [N/2, N]: 0.149 vs 0.166 ms causal at N=1024, 0.192 vs 0.199 at 2048; B=1152 in [1, 1024]:
    2.02 vs 2.32 ms), but not at 4096 (0.68 vs 0.63 ms without a mask): longer ones use the dense kernel's tiles."""
    if dtype != torch.float32 and max(d, dv) <= 128 and max_kv_len <= 512:
        return FwdConfig(128, 32, 4, 3)  # also spill-free on sm_100a
    if capability == BLACKWELL and dtype != torch.float32 and max(block_dim(d), block_dim(dv)) <= 128:
        return FwdConfig(128, 64, 8, 2)  # the dense kernel's 3 stages spill here on sm_100a; 2 do not
    if capability == BLACKWELL and dtype != torch.float32:
        return FwdConfig(64, 64, 8, 2)  # the dense kernel's 4 warps spill here with a bias or a window; 8 do not
    if dtype != torch.float32 and block_dim(max(d, dv)) == 128 and max_kv_len <= 2048:
        return FwdConfig(128, 32, 4, 3)
    return default_fwd_config(d, dv, dtype, max_kv_len, capability=capability)


def default_varlen_bwd_configs(d: int, dv: int, dtype: torch.dtype, max_kv_len: int, *,
                               capability: int) -> tuple[BwdConfig, BwdConfig]:
    """(dK/dV, dQ) tiles. Measured on an H200 (bf16, D=128, the two kernels' GPU time, ``benchmarks/tune.py
    varlen``): with sequences up to 512, 16x64 dK/dV tiles with three stages and 64x32 dQ tiles with three stages,
    4 warps each, beat the dense kernels' tiles (1.22 vs 1.37 ms at max 256, sparsity 0.5) and the 32x64 / 64x64
    two-stage pair (1.11 vs 1.16 ms there, 2.93 vs 2.97 at max 512). Past 512 at head width 128, 32x64 dK/dV tiles
    with the same dQ tiles beat the dense kernels' pair from 1024 to 4096 keys, causal or not (forward+backward, HSTU's
    lengths in [N/2, N]: 0.66 vs 0.83 ms causal at N=1024, 0.84 vs 0.97 at 2048; B=1152 in [1, 1024]: 9.5 vs 10.8)."""
    if capability == BLACKWELL:
        return _blackwell_varlen_bwd_configs(block_dim(d), block_dim(dv), dtype)
    if dtype != torch.float32 and max(d, dv) <= 128 and max_kv_len <= 512:
        return BwdConfig(16, 64, 4, 3), BwdConfig(64, 32, 4, 3)
    if dtype != torch.float32 and block_dim(max(d, dv)) == 128 and max_kv_len <= 4096:
        return BwdConfig(32, 64, 4, 3), BwdConfig(64, 32, 4, 3)
    return default_bwd_configs(d, dv, dtype, max_kv_len, capability=capability)


# the TMA forward's tile (``gdpa_fwd_tma``) on Hopper
TMA_CONFIG = FwdConfig(128, 64, 4, 2)


def tma_fwd_config(capability: int) -> FwdConfig:
    """The TMA forward's tile (half precision, head dims up to 128: ``tma_support``)."""
    return TMA_CONFIG  # on sm_100 too: spill-free for sm_100a (tests/kernels/test_triton_compile_sm100.py)


# sm_100 (B200, GB200): none of these tiles was run or measured on a Blackwell GPU. Each compiles for sm_100a with its
# matmuls on tcgen05.mma and no register spill (tests/kernels/test_triton_compile_sm100.py; Hopper's dK/dV tiles spill
# there). The backward's shapes are those of Triton's fused-attention tutorial (32 queries by 128 keys for dK/dV, 128
# queries by 32 keys for dQ); its forward tiles are 128 queries by 64 or more keys.


def _blackwell_fwd_config(width: int, dtype: torch.dtype, kv_len: int, has_bias: bool) -> FwdConfig:
    if dtype == torch.float32:
        # fp32 dots run on FMAs with their operands in registers: small tiles (8 warps above D=128), spill-free
        return FwdConfig(32, 32, 8 if width > 128 else 4, 2)
    if width <= 64:
        return FwdConfig(128, 64, 8, 2)  # spill-free on sm_100a (Hopper's 4 warps spill at long kv)
    if width <= 128:
        if kv_len > 512:
            return FwdConfig(128, 64, 8, 3)  # Hopper's tile, spill-free on sm_100a
        # Hopper's tiles, spill-free on sm_100a
        return FwdConfig(64, 64, 4, 2) if has_bias else FwdConfig(128, 64, 4, 2)
    return FwdConfig(64, 64, 4, 2)  # Hopper's tile, spill-free on sm_100a up to D=256


def _blackwell_bwd_configs(d_width: int, dv_width: int, dtype: torch.dtype) -> tuple[BwdConfig, BwdConfig]:
    width = max(d_width, dv_width)
    if dtype == torch.float32:
        warps = 8 if width > 128 else 4  # fp32 (FMA) dots, as in the forward
        return BwdConfig(16, 32, warps, 2), BwdConfig(32, 16, warps, 2)
    if width <= 128:
        # spill-free on sm_100a with causal masks and dBias; the dK/dV tile spills with two or three stages
        return BwdConfig(32, 128, 8, 1), BwdConfig(128, 32, 8, 2)
    # D or Dv > 128: no tile carrying both fp32 accumulators compiles spill-free on sm_100a (16x64 spills 40-132 B at
    # 256), so dV and dK run as two passes; the dV pass recomputes S only (5 matmuls instead of 4, where halving the
    # head dim per program would recompute S and dP: 6). Each pass's tile follows its own accumulator's width (a
    # narrow one on the wide tile lets ptxas settle on 128 registers, and spill)
    dk_tiles = BwdConfig(16, 64, 8, 1) if d_width > 128 else BwdConfig(32, 128, 8, 1)
    dv_tiles = BwdConfig(32, 128, 8, 1) if dv_width > 128 else BwdConfig(64, 128, 8, 1)
    return dataclasses.replace(dk_tiles, dv_pass=dv_tiles), BwdConfig(64, 32, 4, 2)


def _blackwell_varlen_bwd_configs(d_width: int, dv_width: int, dtype: torch.dtype) -> tuple[BwdConfig, BwdConfig]:
    if dtype == torch.float32:
        # the dense fp32 tiles, with 8 warps at every width: with 4 the varlen kernels spill on sm_100a
        return BwdConfig(16, 32, 8, 2), BwdConfig(32, 16, 8, 2)
    if max(d_width, dv_width) > 128:
        return _blackwell_bwd_configs(d_width, dv_width, dtype)
    # spill-free on sm_100a; 64-key tiles waste less on each sample's ragged last tile; the dQ tile is Hopper's
    return BwdConfig(32, 64, 8, 1), BwdConfig(64, 32, 4, 3)
