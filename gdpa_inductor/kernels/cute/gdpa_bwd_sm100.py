"""CuTe-DSL GDPA backward for Blackwell (sm_100a): dQ, dK, dV (and dbias) of
O = post_scale · act(scale · Q Kᵀ + bias) · V, dense or varlen batches.

Persistent: a grid of at most one CTA an SM (``num_ctas``, the launcher's from the device's SM count; the build does
not depend on it) walks the work tiles, (128-key tile, head, sample), in the static order of ``tile_schedule``: key
tiles fastest, CTA c taking tiles c, c + num_ctas, ...; a head's key tiles first-first (under the causal mask the
first computes the most query tiles; last-first under a window without a right bound, ``band_key_tile``), in a varlen
batch the samples in ``rows``' order (the most work first) and the key tiles past a sample's keys, or of a sample
without queries, skipped by every warp. Per tile a CTA loops over 128-row query tiles (under a band only those it
reaches). Ten warps, each with one role, walk the same sequence, every pipeline's position and phase carried from
tile to tile:
- warp 9, the load warp: per tile Q_0 and dO_0, K and V, then Q_j and dO_j by TMA (Q and dO into rings of
  ``q_stages`` shared-memory stages);
- warp 8, the MMA warp, per query tile j, all tcgen05 MMAs with fp32 accumulators in tensor memory:
    Sᵀ = K Q_jᵀ and dPᵀ = V dO_jᵀ (both operands from shared memory),
    dV += Pᵀ dO_j (Pᵀ from tensor memory, over Sᵀ's own columns), dK += dSᵀ Q_j (dSᵀ from shared memory),
    dQ_j = dS K (the same shared-memory dS read as its transpose, into dPᵀ's columns);
- warps 0-3, the compute warps (one key row a thread): per query tile they load Sᵀ and dPᵀ from tensor memory 32
  columns at a time, compute Pᵀ = act(scale · Sᵀ) and dSᵀ = dPᵀ ∘ act'(scale · Sᵀ) / (act''s constant factor) by the
  activation's fp32 backward form (``activation_math.backward_form``), write Pᵀ in the operands' dtype back over Sᵀ
  (tcgen05.st) and dSᵀ to shared memory; at a tile's end they store dV · post_scale and dK · scale · post_scale ·
  factor to global memory from the registers (rows past Nk predicated off);
- warps 4-7, the dQ warps (one query row a thread): per query tile they load dQ_j from tensor memory and add it into
  an fp32 buffer with ``red.global.add.v4.f32`` (rows past Nq predicated off), unscaled: the host scales and rounds
  it once (``bwd_results.dq_of_sums``).
- ``causal`` (bottom-right aligned: key j kept for query i iff j <= i + Nk - Nq) and ``window`` (a band around that
  diagonal, bounds passed at launch): a key tile computes only the query tiles its band reaches (``band_tiles``), at
  least one, so dK and dV are always written; the tiles wholly inside the band run unmasked, the edge ones select
  P = dS = 0 outside each key row's kept queries (``kept_queries``: two compares a score), 16 scores a step (the two
  step variants at 32 would spill).
- ``bias`` (the operands' 16-bit dtype or fp32): read per score by the compute warps at their key and each query
  (consecutive threads, consecutive keys), 16 scores a step; with ``bias_grad`` each score's dS (without act''s
  constant factor and post_scale, as the Hopper backward's buffer holds it) is stored at (query, key) of a
  [Z, H, Nq, Nk] buffer that the host sums over the bias's broadcast dims.
- ``varlen``: the tiles are (128-key tile, head, sample) of a varlen batch, the key tiles per head and sample those
  of its longest; each side's rows of a sample read through TMA descriptors bounded at its end (``ragged_rows``),
  dQ, dK and dV written at the sample's rows; the tiles past a sample's keys, or of a sample without queries, are
  skipped (the launcher zeroes the gradients).
No softmax: no LSE, no rowsum(dO ∘ O). Keys and queries past the ends read as zeros (TMA fills them); with
``mask_queries`` (Nq not a multiple of the query tile) the padded query columns also give P = 0 and dS = 0 by a
select per score, so a non-finite key cannot leak through them; padded keys reach only rows that are not stored.

Tensor memory (``tmem_columns``: 512 columns at D = Dv of 64 and 128): Sᵀ at [0, 128) with Pᵀ in its first 64
columns (16-bit pairs), dPᵀ at [128, 256), shared with dQ (dQ_j is written once the compute warps have read dPᵀ_j,
and dPᵀ_{j+1} once the dQ warps have read dQ_j), dV at [256, 256 + Dv), dK after it.
Synchronisation (mbarriers, ``cutlass.pipeline``): K, V, Q, dO full/empty (TMA -> MMA), Sᵀ and dPᵀ full/empty (MMA
-> compute), P and dS full/empty (compute -> MMA), dQ full/empty (MMA -> dQ warps), dK/dV full (MMA -> epilogue)
and empty (epilogue -> MMA). The MMA warp issues Sᵀ_{j+1} over Pᵀ_j only after dV_j, and tcgen05.mma instructions of
one thread run in issue order, so Sᵀ never overwrites a Pᵀ the tensor cores still read; this holds across tiles, the
rings running on. K and V (one stage each: shared memory holds no second) are released at a tile's end, once its last
matmul is done, and only then load for the next tile; the load warp issues the next tile's Q_0 and dO_0 before them,
into the stages this tile's earlier query tiles freed. A tile's first dV and dK matmuls (which overwrite them) wait
for dK/dV empty, released by the compute warps once they have read the previous tile's; its first Sᵀ and dPᵀ do
not, so they are computed while that epilogue runs.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.memory import SmemAllocator, TmemAllocator

from ..common.window_bounds import UNBOUNDED
from .activation_math import BackwardForm
from .band_tiles import band_query_tiles, kept_queries, tile_limits, unmasked_query_tiles
from .gdpa_fwd_sm100 import _batched
from .ragged_rows import RAGGED_ROWS, ragged
from .tile_schedule import band_key_tile, key_tile_runs, tile_coords, tile_count

_ROWS = 128
_WARP = 32
# warp roles
_COMPUTE_WARPS = 4
_DQ_WARP0 = 4
_MMA_WARP = 8
_LOAD_WARP = 9
_GROUP_THREADS = 4 * _WARP
# named barriers (0 is the CTA-wide one): the tensor-memory address hand-over (compute, dQ and MMA warps), and the
# end of the compute and dQ warps' tensor-memory reads before it is freed
_TMEM_BARRIER = 1
_END_BARRIER = 2
# columns loaded from tensor memory at a time: 32 fp32 registers a thread
_CHUNK = 32
# tensor-memory column offsets of Sᵀ (and Pᵀ) and of dPᵀ (and dQ)
_S_OFFSET = 0
_DP_OFFSET = _ROWS
# shared memory a block may take on sm_100
_SMEM_LIMIT = 227 * 1024
# the kernel's layout parameters, in order (``GdpaBwdSm100._smem_layouts``' keys)
_LAYOUTS = ("k", "v", "q", "do", "dst", "kt", "qt", "dot", "ds", "p")


def tmem_columns(head_dim: int, head_dim_v: int) -> int:
    """Tensor-memory columns a CTA allocates: Sᵀ (with Pᵀ), dPᵀ (with dQ), dV and dK, rounded up to a power of two
    (tcgen05.alloc's rule); dQ fits in dPᵀ's columns for D up to 128."""
    assert head_dim <= _ROWS, "dQ shares dPᵀ's columns"
    used = 2 * _ROWS + head_dim_v + head_dim
    return max(32, 1 << (used - 1).bit_length())


def ds_offset(row, col):
    """Element offset of dSᵀ (``row`` a key, ``col`` a query) in its shared-memory tile: the K-major 128-byte
    swizzled layout of a 128x128 16-bit A operand (``make_smem_layout_a``): 64-column blocks of 128 rows, rows of 64
    elements, each 16-byte chunk's index XORed with the row's low three bits."""
    plain = (col // 64) * (_ROWS * 64) + row * 64 + col % 64
    return plain ^ ((row % 8) << 3)


class GdpaBwdSm100:
    """Compile-time parameters: element type, head dims of Q/K and of V (equal, 64 or 128), the activation's fp32
    backward form (``activation_math.backward_form(name, False)``), Q/dO stages, whether queries past Nq are
    masked (``mask_queries``), the band (``causal``, ``window``), ``varlen``, the bias tensor's element type
    (``bias``: None, the operands' dtype or Float32) and whether its gradient is written (``bias_grad``)."""

    def __init__(self, dtype, head_dim: int, head_dim_v: int, act_form: BackwardForm, q_stages: int = 1,
                 mask_queries: bool = True, causal: bool = False, window: bool = False, varlen: bool = False,
                 bias=None, bias_grad: bool = False):
        assert head_dim == head_dim_v and head_dim in (64, 128), "D = Dv of 64 or 128"
        self.dtype = dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v
        self.act_form = act_form
        self.tile_n = _ROWS
        self.tile_m = _ROWS
        self.q_stages = q_stages
        # a varlen sample's last query tile is ragged wherever its length falls
        self.mask_queries = mask_queries or varlen
        self.varlen = varlen
        self.causal = causal
        self.window = window
        self.band = causal or window
        assert bias is None or bias in (dtype, cutlass.Float32), "a bias in the operands' dtype or fp32"
        assert bias is not None or not bias_grad, "a bias gradient needs a bias"
        self.bias = bias
        self.bias_grad = bias_grad
        # scores per compute step: half as many under a band (two step variants and their bounds) or with a bias (its
        # values), which would otherwise spill at the 168 registers ptxas allows ten warps
        self.score_chunk = _CHUNK // 2 if self.band or bias is not None else _CHUNK
        self.threads = (_LOAD_WARP + 1) * _WARP
        self.dv_offset = 2 * _ROWS
        self.dk_offset = self.dv_offset + head_dim_v
        self.tmem_columns = tmem_columns(head_dim, head_dim_v)
        # Sᵀ, dPᵀ (dQ within it), dV and dK side by side within the allocation, which tcgen05.alloc caps at 512
        assert _DP_OFFSET + _ROWS == self.dv_offset and self.dk_offset + head_dim <= self.tmem_columns <= 512
        # (M, N, K) of each matmul
        self.s_tiler = (self.tile_n, self.tile_m, head_dim)
        self.dp_tiler = (self.tile_n, self.tile_m, head_dim_v)
        self.dv_tiler = (self.tile_n, head_dim_v, self.tile_m)
        self.dk_tiler = (self.tile_n, head_dim, self.tile_m)
        self.dq_tiler = (self.tile_m, head_dim, self.tile_n)

    def _tiled_mmas(self):
        """(Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, dV += Pᵀ dO with Pᵀ from tensor memory, dK += dSᵀ Q, dQ = dS K): the second
        operand of the last three and dS of dQ MN-major, the same shared memory as the K-major operands of the
        first two (and of dK for dS)."""
        one, k, mn, f32 = tcgen05.CtaGroup.ONE, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32
        make = sm100_utils.make_trivial_tiled_mma
        s = make(self.dtype, self.dtype, k, k, f32, one, self.s_tiler[:2])
        dp = make(self.dtype, self.dtype, k, k, f32, one, self.dp_tiler[:2])
        dv = make(self.dtype, self.dtype, k, mn, f32, one, self.dv_tiler[:2], tcgen05.OperandSource.TMEM)
        dk = make(self.dtype, self.dtype, k, mn, f32, one, self.dk_tiler[:2])
        dq = make(self.dtype, self.dtype, mn, mn, f32, one, self.dq_tiler[:2])
        return s, dp, dv, dk, dq

    def _smem_layouts(self, mmas):
        """Shared-memory layouts: each buffer's as loaded (K, V, Q, dO) or written (dSᵀ), and its second view as
        the MN-major operand of another matmul (Kᵀ, Qᵀ, dOᵀ, dS), which covers the same bytes."""
        s, dp, dv, dk, dq = mmas
        st = self.q_stages
        return dict(
            k=sm100_utils.make_smem_layout_a(s, self.s_tiler, self.dtype, 1),
            v=sm100_utils.make_smem_layout_a(dp, self.dp_tiler, self.dtype, 1),
            q=sm100_utils.make_smem_layout_b(s, self.s_tiler, self.dtype, st),
            do=sm100_utils.make_smem_layout_b(dp, self.dp_tiler, self.dtype, st),
            dst=sm100_utils.make_smem_layout_a(dk, self.dk_tiler, self.dtype, 1),
            kt=sm100_utils.make_smem_layout_b(dq, self.dq_tiler, self.dtype, 1),
            qt=sm100_utils.make_smem_layout_b(dk, self.dk_tiler, self.dtype, st),
            dot=sm100_utils.make_smem_layout_b(dv, self.dv_tiler, self.dtype, st),
            ds=sm100_utils.make_smem_layout_a(dq, self.dq_tiler, self.dtype, 1),
            p=sm100_utils.make_smem_layout_a(dv, self.dv_tiler, self.dtype, 1),
        )

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mdQ: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        scale: cutlass.Float32,
        post_scale: cutlass.Float32,
        slope: cutlass.Float32,
        num_ctas: cutlass.Int32,
        stream: cuda.CUstream,
        band_left: cutlass.Int32 | None = None,
        band_right: cutlass.Int32 | None = None,
        rows: cute.Tensor | None = None,
        num_n: cutlass.Int32 | None = None,
        mBias: cute.Tensor | None = None,
        mdBias: cute.Tensor | None = None,
    ):
        """mQ: (Nq, D, H, Z); mK: (Nk, D, H, Z); mV: (Nk, Dv, H, Z); mdO: (Nq, Dv, H, Z); mdQ: fp32 (Nq, D, H, Z),
        zeroed, summed into unscaled; mdK, mdV: like mK, mV; D, Dv contiguous. One head of K/V per query head (the
        launcher expands grouped heads). ``num_ctas``: the grid, at most the work tiles (the host's choice from the
        device's SM count, ``Sm100BwdPlan.grid``; the build does not depend on it). ``band_left``, ``band_right``: the
        band's bounds (``window``).
        Varlen: ``rows`` (5, B) int32, per sample in the order the tiles visit them (longest first): first query row,
        query count, first key row, key count, and the sample's index z; each side's Z is 1 (jagged rows) or B (a
        dense side, rows counted within sample z's block).
        ``num_n``: key tiles of the longest sample. dQ, dK and dV are written only at a sample's rows.
        ``mBias``: (Nq, Nk, Hb, Zb), keys contiguous, Hb 1 or H, Zb 1 or Z (broadcast dims of stride 0 read as any
        other); ``mdBias``: (Nq, Nk, H, Z) in the bias's dtype, dS (without act''s constant factor and post_scale) at
        every computed score, zero-filled by the launcher where none is."""
        q, k, v, do = mQ, mK, mV, mdO
        if cutlass.const_expr(self.varlen):
            q, k, v, do = ragged(q, 0), ragged(k, 0), ragged(v, 0), ragged(do, 0)
        q, k, v, do = _batched(q), _batched(k), _batched(v), _batched(do)
        mmas = self._tiled_mmas()
        s_mma, dp_mma = mmas[0], mmas[1]
        lay = self._smem_layouts(mmas)
        load = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tiles = {name: cute.select(lay[name], mode=[0, 1, 2]) for name in ("k", "v", "q", "do")}
        tma_k, tk = cute.nvgpu.make_tiled_tma_atom_A(load, k, tiles["k"], self.s_tiler, s_mma, (1, 1, 1, 1))
        tma_v, tv = cute.nvgpu.make_tiled_tma_atom_A(load, v, tiles["v"], self.dp_tiler, dp_mma, (1, 1, 1, 1))
        tma_q, tq = cute.nvgpu.make_tiled_tma_atom_B(load, q, tiles["q"], self.s_tiler, s_mma, (1, 1, 1, 1))
        tma_do, tdo = cute.nvgpu.make_tiled_tma_atom_B(load, do, tiles["do"], self.dp_tiler, dp_mma, (1, 1, 1, 1))
        self.bytes = {name: cute.size_in_bytes(self.dtype, t) for name, t in tiles.items()}

        @cute.struct
        class SharedStorage:
            k_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            v_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            q_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            do_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            s_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            dp_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            p_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            ds_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            dq_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            dkv_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_address: cutlass.Int32
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(lay["k"])], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(lay["v"])], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(lay["q"])], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(lay["do"])], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(lay["dst"])], 1024]

        self.shared_storage = SharedStorage
        self.smem_bytes = SharedStorage.size_in_bytes()
        assert self.smem_bytes <= _SMEM_LIMIT, f"{self.smem_bytes} bytes of shared memory"
        samples = mK.shape[3]
        if cutlass.const_expr(self.varlen):
            samples = rows.shape[1]
        else:
            num_n = cute.ceil_div(mK.shape[0], self.tile_n)
        self.kernel(
            *mmas, tma_k, tk, tma_v, tv, tma_q, tq, tma_do, tdo, mdQ, mdK, mdV, scale, post_scale, slope,
            (num_n, mK.shape[2], samples), mQ.shape[0], mK.shape[0], rows, band_left, band_right, mBias, mdBias,
            *(lay[name] for name in _LAYOUTS),
        ).launch(
            grid=[num_ctas, 1, 1],
            block=[self.threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        s_mma: cute.TiledMma,
        dp_mma: cute.TiledMma,
        dv_mma: cute.TiledMma,
        dk_mma: cute.TiledMma,
        dq_mma: cute.TiledMma,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_do: cute.CopyAtom,
        mdO: cute.Tensor,
        mdQ: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        scale: cutlass.Float32,
        post_scale: cutlass.Float32,
        slope: cutlass.Float32,
        tiles: tuple,
        nq_all: cutlass.Int32,
        nk_all: cutlass.Int32,
        rows: cute.Tensor | None,
        band_left: cutlass.Int32 | None,
        band_right: cutlass.Int32 | None,
        mBias: cute.Tensor | None,
        mdBias: cute.Tensor | None,
        k_smem: cute.ComposedLayout,
        v_smem: cute.ComposedLayout,
        q_smem: cute.ComposedLayout,
        do_smem: cute.ComposedLayout,
        dst_smem: cute.ComposedLayout,
        kt_smem: cute.ComposedLayout,
        qt_smem: cute.ComposedLayout,
        dot_smem: cute.ComposedLayout,
        ds_smem: cute.ComposedLayout,
        p_tmem: cute.ComposedLayout,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        band = (UNBOUNDED, 0)
        if cutlass.const_expr(self.window):
            band = (band_left, band_right)
        work = (tiles, nq_all, nk_all, rows, band)
        num_tiles = tile_count(*tiles)
        mmas = (s_mma, dp_mma, dv_mma, dk_mma, dq_mma)
        lay = dict(zip(_LAYOUTS, (k_smem, v_smem, q_smem, do_smem, dst_smem, kt_smem, qt_smem, dot_smem, ds_smem,
                                  p_tmem)))

        storage = SmemAllocator().allocate(self.shared_storage)
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        group = pipeline.CooperativeGroup(pipeline.Agent.Thread, _GROUP_THREADS)

        def tma_ring(barriers, stages, tx_count):
            return pipeline.PipelineTmaUmma.create(
                barrier_storage=barriers, num_stages=stages, producer_group=one, consumer_group=one,
                tx_count=tx_count, defer_sync=True,
            ).make_participants()

        def umma_to_threads(barriers):
            return pipeline.PipelineUmmaAsync.create(
                barrier_storage=barriers, num_stages=1, producer_group=one, consumer_group=group, defer_sync=True,
            ).make_participants()

        def threads_to_umma(barriers):
            return pipeline.PipelineAsyncUmma.create(
                barrier_storage=barriers, num_stages=1, producer_group=group, consumer_group=one, defer_sync=True,
            ).make_participants()

        # K and V: one stage each, released once a tile's last matmul reading them is done (tcgen05.commit)
        k_producer, k_consumer = tma_ring(storage.k_mbar.data_ptr(), 1, self.bytes["k"])
        v_producer, v_consumer = tma_ring(storage.v_mbar.data_ptr(), 1, self.bytes["v"])
        q_producer, q_consumer = tma_ring(storage.q_mbar.data_ptr(), self.q_stages, self.bytes["q"])
        do_producer, do_consumer = tma_ring(storage.do_mbar.data_ptr(), self.q_stages, self.bytes["do"])
        # Sᵀ_j, dPᵀ_j complete (tcgen05.commit) -> compute warps; read -> the MMA warp may write them again
        s_producer, s_consumer = umma_to_threads(storage.s_mbar.data_ptr())
        dp_producer, dp_consumer = umma_to_threads(storage.dp_mbar.data_ptr())
        # Pᵀ_j in tensor memory, dSᵀ_j in shared memory -> MMA; read by the matmuls (tcgen05.commit) -> free again
        p_producer, p_consumer = threads_to_umma(storage.p_mbar.data_ptr())
        ds_producer, ds_consumer = threads_to_umma(storage.ds_mbar.data_ptr())
        # dQ_j complete -> dQ warps; loaded -> its columns may take dPᵀ_{j+1}
        dq_producer, dq_consumer = umma_to_threads(storage.dq_mbar.data_ptr())
        # dK, dV full: a tile's last matmul complete -> epilogue; empty: the epilogue has read them -> the next
        # tile's first dV and dK matmuls may overwrite them
        dkv_producer, dkv_consumer = umma_to_threads(storage.dkv_mbar.data_ptr())
        tmem = TmemAllocator(
            storage.tmem_address.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=_TMEM_BARRIER,
                                                       num_threads=2 * _GROUP_THREADS + _WARP),
            allocator_warp_id=0,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1, 1), is_relaxed=True)

        sK = storage.sK.get_tensor(lay["k"].outer, swizzle=lay["k"].inner)
        sV = storage.sV.get_tensor(lay["v"].outer, swizzle=lay["v"].inner)
        sQ = storage.sQ.get_tensor(lay["q"].outer, swizzle=lay["q"].inner)
        sdO = storage.sdO.get_tensor(lay["do"].outer, swizzle=lay["do"].inner)
        sdSt = storage.sdS.get_tensor(lay["dst"].outer, swizzle=lay["dst"].inner)
        s_thr, dp_thr, dv_thr, dk_thr, dq_thr = (m.get_slice(0) for m in mmas)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1, 1))

        if warp_idx == _LOAD_WARP:
            # ---- LOAD: per tile K and V, then Q_j and dO_j ----
            for atom in (tma_k, tma_v, tma_q, tma_do):
                cpasync.prefetch_descriptor(atom)
            d, dv = self.head_dim, self.head_dim_v
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                n_blk, h, z, q0, nq, k0, nk, runs, first, count, _ = self._tile(tile, work)
                if runs:
                    # (TMA, RestM, RestK): the tiles of this head and sample
                    tKsK, tKgK = self._tma_part(tma_k, sK, s_thr.partition_A(
                        cute.flat_divide(self._sample(mK, h, z, k0, nk), (self.tile_n, d))))
                    tVsV, tVgV = self._tma_part(tma_v, sV, dp_thr.partition_A(
                        cute.flat_divide(self._sample(mV, h, z, k0, nk), (self.tile_n, dv))))
                    tQsQ, tQgQ = self._tma_part(tma_q, sQ, s_thr.partition_B(
                        cute.flat_divide(self._sample(mQ, h, z, q0, nq), (self.tile_m, d))))
                    tOsO, tOgO = self._tma_part(tma_do, sdO, dp_thr.partition_B(
                        cute.flat_divide(self._sample(mdO, h, z, q0, nq), (self.tile_m, dv))))
                    for j in cutlass.range(count, unroll=1):
                        handle = q_producer.acquire_and_advance()
                        cute.copy(tma_q, tQgQ[None, first + j, 0], tQsQ[None, handle.index],
                                  tma_bar_ptr=handle.barrier)
                        handle = do_producer.acquire_and_advance()
                        cute.copy(tma_do, tOgO[None, first + j, 0], tOsO[None, handle.index],
                                  tma_bar_ptr=handle.barrier)
                        if j == 0:
                            # K and V wait for the last tile's matmuls to release them; Q_0 and dO_0 load before,
                            # into stages the last tile's earlier query tiles freed (a running tile has count >= 1)
                            handle = k_producer.acquire_and_advance()
                            cute.copy(tma_k, tKgK[None, n_blk, 0], tKsK[None, handle.index],
                                      tma_bar_ptr=handle.barrier)
                            handle = v_producer.acquire_and_advance()
                            cute.copy(tma_v, tVgV[None, n_blk, 0], tVsV[None, handle.index],
                                      tma_bar_ptr=handle.barrier)
            # the MMA warp's last releases land before the CTA exits
            k_producer.tail()
            v_producer.tail()
            q_producer.tail()
            do_producer.tail()

        if warp_idx == _MMA_WARP:
            # ---- MMA: per tile, per query tile Sᵀ, dPᵀ, then dV, dK, dQ ----
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)

            def accumulator(thr, tiler, offset):
                return cute.make_tensor(tmem_ptr + offset,
                                        thr.make_fragment_C(thr.partition_shape_C(tiler[:2])).layout)

            tStS = accumulator(s_thr, self.s_tiler, _S_OFFSET)
            tdPtdP = accumulator(dp_thr, self.dp_tiler, _DP_OFFSET)
            tdVtdV = accumulator(dv_thr, self.dv_tiler, self.dv_offset)
            tdKtdK = accumulator(dk_thr, self.dk_tiler, self.dk_offset)
            tdQtdQ = accumulator(dq_thr, self.dq_tiler, _DP_OFFSET)
            p_frag = dv_thr.make_fragment_A(cute.make_tensor(tmem_ptr, lay["p"].outer))
            p_layout = p_frag[None, None, None, 0].layout
            tdVrP = cute.make_tensor(cute.recast_ptr(tmem_ptr + _S_OFFSET, dtype=self.dtype), p_layout)
            # the second views of K, Q, dO and dS: same bytes, MN-major layouts
            sKt = cute.make_tensor(cute.recast_ptr(sK.iterator, lay["kt"].inner), lay["kt"].outer)
            sQt = cute.make_tensor(cute.recast_ptr(sQ.iterator, lay["qt"].inner), lay["qt"].outer)
            sdOt = cute.make_tensor(cute.recast_ptr(sdO.iterator, lay["dot"].inner), lay["dot"].outer)
            sdS = cute.make_tensor(cute.recast_ptr(sdSt.iterator, lay["ds"].inner), lay["ds"].outer)
            # K and V have one stage each: their fragments are the same for every tile
            frags = (
                s_thr.make_fragment_A(sK)[None, None, None, 0],
                s_thr.make_fragment_B(sQ),
                dp_thr.make_fragment_A(sV)[None, None, None, 0],
                dp_thr.make_fragment_B(sdO),
                dv_thr.make_fragment_B(sdOt),
                dk_thr.make_fragment_A(sdSt)[None, None, None, 0],
                dk_thr.make_fragment_B(sQt),
                dq_thr.make_fragment_A(sdS)[None, None, None, 0],
                dq_thr.make_fragment_B(sKt)[None, None, None, 0],
                tdVrP,
            )
            accs = (tStS, tdPtdP, tdVtdV, tdKtdK, tdQtdQ)
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                _, _, _, _, _, _, _, runs, _, count, _ = self._tile(tile, work)
                if runs:
                    k_handle = k_consumer.wait_and_advance()
                    v_handle = v_consumer.wait_and_advance()
                    # the pipelines' positions and the MMAs' accumulate flags change in the steps: rebound here, as
                    # loop-carried locals
                    for j in cutlass.range(count, unroll=1):
                        mmas, held, q_consumer, do_consumer, s_producer, dp_producer, dq_producer = (
                            self._mma_scores(mmas, frags, accs, q_consumer, do_consumer, s_producer, dp_producer,
                                             dq_producer))
                        # the first query tile's dV and dK matmuls overwrite them: they wait for the epilogue to have
                        # read the last tile's (Sᵀ_0 and dPᵀ_0 are computed meanwhile)
                        dkv_producer.acquire(j > 0)
                        mmas, p_consumer, ds_consumer = self._mma_grads(mmas, frags, accs, j > 0, held, p_consumer,
                                                                        ds_consumer)
                    # K and V free for the next tile's loads, dK and dV complete, once every matmul issued so far
                    # is (tcgen05.commit tracks them all)
                    k_handle.release()
                    v_handle.release()
                    dkv_producer.current_handle().commit()
                    dkv_producer.advance()

        if warp_idx < _COMPUTE_WARPS:
            # ---- COMPUTE: per tile Pᵀ into tensor memory, dSᵀ into shared memory; then the dK, dV epilogue ----
            tmem.allocate(self.tmem_columns)
            tmem.relinquish_alloc_permit()
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            copies = self._score_copies(s_thr, tmem_ptr, tidx)
            ds_base = storage.sdS.data_ptr().toint()
            # dK's scale: dS's (``bwd_results._ds_factor``, as the host scales dQ)
            ds_scale = scale * post_scale * self.act_form.grad_factor
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                n_blk, h, z, q0, nq, k0, nk, runs, first, count, whole = self._tile(tile, work)
                if runs:
                    bias_rows, dbias_rows = None, None
                    if cutlass.const_expr(self.bias is not None):
                        bias_rows = self._rows_of(mBias, h % mBias.shape[2], z % mBias.shape[3], q0, broadcast=True)
                    if cutlass.const_expr(self.bias_grad):
                        dbias_rows = self._rows_of(mdBias, h, z, q0, broadcast=True)
                    for j in cutlass.range(count, unroll=1):
                        m_blk = first + j
                        s_handle = s_consumer.wait_and_advance()
                        dp_handle = dp_consumer.wait_and_advance()
                        p_handle = p_producer.acquire_and_advance()
                        ds_handle = ds_producer.acquire_and_advance()
                        step = (ds_base, m_blk, n_blk, nq, nk, band, bias_rows, dbias_rows, scale, slope, tidx)
                        if cutlass.const_expr(self.band):
                            if (m_blk < whole[0]) | (m_blk >= whole[1]):
                                self._scores_to_grads(copies, step, True)
                            else:
                                self._scores_to_grads(copies, step, False)
                        else:
                            self._scores_to_grads(copies, step, self.mask_queries)
                        cute.arch.fence_view_async_tmem_store()
                        p_handle.commit()
                        # Sᵀ and dPᵀ read: their columns may take dQ_j and the next query tile's Sᵀ
                        s_handle.release()
                        dp_handle.release()
                        # dSᵀ's shared-memory stores visible to the tensor cores' reads
                        cute.arch.fence_proxy("async.shared", space="cta")
                        ds_handle.commit()
                    dkv_handle = dkv_consumer.wait_and_advance()
                    dv_rows, dk_rows = self._rows_of(mdV, h, z, k0), self._rows_of(mdK, h, z, k0)
                    self._store_rows(dv_thr, self.dv_tiler, tmem_ptr + self.dv_offset, dv_rows, n_blk, nk,
                                     post_scale, tidx)
                    self._store_rows(dk_thr, self.dk_tiler, tmem_ptr + self.dk_offset, dk_rows, n_blk, nk, ds_scale,
                                     tidx)
                    # every dK and dV load of this thread waited on (tcgen05.wait::ld): the next tile may overwrite
                    # them
                    dkv_handle.release()
            # the MMA warp's last releases of P and dS (tcgen05.commit) land before the CTA exits
            p_producer.tail()
            ds_producer.tail()
            # every compute and dQ warp is done with the tensor memory: it may go
            cute.arch.barrier(barrier_id=_END_BARRIER, number_of_threads=2 * _GROUP_THREADS)
            tmem.free(tmem_ptr)

        if warp_idx >= _DQ_WARP0 and warp_idx < _MMA_WARP:
            # ---- dQ: each query tile's dQ from tensor memory, added into the fp32 sums at its tile's rows ----
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            row = tidx - _GROUP_THREADS
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                _, h, z, q0, nq, _, _, runs, first, count, _ = self._tile(tile, work)
                if runs:
                    dq_rows = self._rows_of(mdQ, h, z, q0)
                    for j in cutlass.range(count, unroll=1):
                        dq_handle = dq_consumer.wait_and_advance()
                        self._add_dq(dq_thr, tmem_ptr, dq_rows, first + j, nq, row)
                        dq_handle.release()
            cute.arch.barrier(barrier_id=_END_BARRIER, number_of_threads=2 * _GROUP_THREADS)

    @cute.jit
    def _tile(self, tile: cutlass.Int32, work: tuple):
        """What work tile ``tile`` (``tile_schedule``: key tiles first-first, the first computing the most query tiles
        under the causal mask, or under a window as ``band_key_tile`` orders them) is: (key tile, head, sample index
        z, first query row, query count, first key row, key count, whether it runs (varlen: its key tile holds keys
        of its sample, and the sample has queries), first query tile and query tile count, the whole query tiles
        [begin, end) among them). Every warp decodes the same tile to the same values, so all take or skip it
        together."""
        tiles, nq, nk, rows, band = work
        n_blk, h, rank = tile_coords(tile, tiles[0], tiles[1], False)
        if cutlass.const_expr(self.window):
            n_blk = band_key_tile(n_blk, tiles[0], band[1], cutlass.min, cutlass.max)
        q0, k0, z = 0, 0, rank
        runs = True
        if cutlass.const_expr(self.varlen):
            q0, nq, k0, nk, z = rows[0, rank], rows[1, rank], rows[2, rank], rows[3, rank], rows[4, rank]
            runs = key_tile_runs(n_blk, nq, nk, self.tile_n)
        # the query tiles this key tile computes, and the whole ones among them (no per-score mask)
        first, count = 0, cute.ceil_div(nq, self.tile_m)
        whole = (0, 0)
        if cutlass.const_expr(self.band):
            first, count = band_query_tiles(n_blk, nq, nk, band[0], band[1], self.tile_m, self.tile_n,
                                            cutlass.min, cutlass.max)
            whole = unmasked_query_tiles(n_blk, nq, nk, band[0], band[1], self.tile_m, self.tile_n,
                                         cutlass.min, cutlass.max)
        return n_blk, h, z, q0, nq, k0, nk, runs, first, count, whole

    @cute.jit
    def _sample(self, m: cute.Tensor, h: cutlass.Int32, z: cutlass.Int32, start, length):
        """The (rows, D) TMA coordinate tensor of head ``h`` and sample ``z``: the dense tensor's, or a varlen sample's
        ``length`` rows from ``start`` through the ragged descriptor (a side of one block has Z = 1, and every sample
        reads it)."""
        if cutlass.const_expr(not self.varlen):
            return m[None, None, (h, z)]
        rows = m[None, None, (h, z % m.shape[2][1], start + length)]
        return cute.domain_offset((RAGGED_ROWS - length, 0), rows)

    @cute.jit
    def _rows_of(self, m: cute.Tensor, h, z, start, broadcast: cutlass.Constexpr[bool] = False):
        """The (rows, D) global tensor of head ``h`` and sample ``z`` written by the dQ, dK and dV warps: the dense
        tensor's, or a varlen sample's from row ``start`` (a side of one block has Z = 1). ``broadcast``: a bias's
        (rows, keys), its samples' rows each from row 0 of sample ``z``'s block."""
        if cutlass.const_expr(not self.varlen or broadcast):
            return m[None, None, h, z]
        return cute.domain_offset((start, 0), m[None, None, h, z % m.shape[3]])

    def _tma_part(self, atom, s, g):
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 3), cute.group_modes(g, 0, 3))

    @cute.jit
    def _mma_scores(self, mmas, frags, accs, q_consumer, do_consumer, s_producer, dp_producer, dq_producer):
        """Sᵀ = K Q_jᵀ, then, once dQ_{j-1} is loaded (dQ and dPᵀ share columns), dPᵀ = V dO_jᵀ; each committed to
        the compute warps. Returns with the pipelines the handles ``_mma_grads`` releases or commits: Q_j's and
        dO_j's stages and dQ_j's columns."""
        s_mma, dp_mma, dv_mma, dk_mma, dq_mma = mmas
        tSrK, tSrQ, tdPrV, tdPrdO = frags[:4]
        tStS, tdPtdP = accs[:2]
        q_handle = q_consumer.wait_and_advance()
        s_handle = s_producer.acquire_and_advance()
        rQ = tSrQ[None, None, None, q_handle.index]
        for kb in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
            s_mma.set(tcgen05.Field.ACCUMULATE, kb != 0)
            cute.gemm(s_mma, tStS, tSrK[None, None, kb], rQ[None, None, kb], tStS)
        s_handle.commit()
        do_handle = do_consumer.wait_and_advance()
        dq_handle = dq_producer.acquire_and_advance()
        dp_handle = dp_producer.acquire_and_advance()
        rdO = tdPrdO[None, None, None, do_handle.index]
        for kb in cutlass.range_constexpr(cute.size(tdPrV, mode=[2])):
            dp_mma.set(tcgen05.Field.ACCUMULATE, kb != 0)
            cute.gemm(dp_mma, tdPtdP, tdPrV[None, None, kb], rdO[None, None, kb], tdPtdP)
        dp_handle.commit()
        return ((s_mma, dp_mma, dv_mma, dk_mma, dq_mma), (q_handle, do_handle, dq_handle), q_consumer, do_consumer,
                s_producer, dp_producer, dq_producer)

    @cute.jit
    def _mma_grads(self, mmas, frags, accs, accumulate, held, p_consumer, ds_consumer):
        """dV += Pᵀ dO_j once Pᵀ_j is written, then dK += dSᵀ Q_j and dQ_j = dS K once dSᵀ_j is; each operand's
        stage released (tcgen05.commit) once the matmuls reading it are done, dQ_j committed to the dQ warps.
        ``accumulate``: False for the first query tile; ``held``: ``_mma_scores``' handles."""
        s_mma, dp_mma, dv_mma, dk_mma, dq_mma = mmas
        tdVrdO, tdKrdS, tdKrQ, tdQrdS, tdQrK, tdVrP = frags[4:]
        tdVtdV, tdKtdK, tdQtdQ = accs[2:]
        q_handle, do_handle, dq_handle = held
        rdO = tdVrdO[None, None, None, do_handle.index]
        rQ = tdKrQ[None, None, None, q_handle.index]
        p_handle = p_consumer.wait_and_advance()
        for kb in cutlass.range_constexpr(cute.size(tdVrP, mode=[2])):
            if cutlass.const_expr(kb == 0):
                dv_mma.set(tcgen05.Field.ACCUMULATE, accumulate)
            else:
                dv_mma.set(tcgen05.Field.ACCUMULATE, True)
            cute.gemm(dv_mma, tdVtdV, tdVrP[None, None, kb], rdO[None, None, kb], tdVtdV)
        p_handle.release()
        do_handle.release()
        ds_handle = ds_consumer.wait_and_advance()
        for kb in cutlass.range_constexpr(cute.size(tdKrdS, mode=[2])):
            if cutlass.const_expr(kb == 0):
                dk_mma.set(tcgen05.Field.ACCUMULATE, accumulate)
            else:
                dk_mma.set(tcgen05.Field.ACCUMULATE, True)
            cute.gemm(dk_mma, tdKtdK, tdKrdS[None, None, kb], rQ[None, None, kb], tdKtdK)
        q_handle.release()
        for kb in cutlass.range_constexpr(cute.size(tdQrdS, mode=[2])):
            dq_mma.set(tcgen05.Field.ACCUMULATE, kb != 0)
            cute.gemm(dq_mma, tdQtdQ, tdQrdS[None, None, kb], tdQrK[None, None, kb], tdQtdQ)
        ds_handle.release()
        dq_handle.commit()
        return (s_mma, dp_mma, dv_mma, dk_mma, dq_mma), p_consumer, ds_consumer

    def _score_copies(self, s_thr, tmem_ptr, tidx):
        """The compute warps' tensor-memory copies of a query tile, ``score_chunk`` columns at a time: (Sᵀ/dPᵀ load, the
        chunked sources (LOAD, 1, 1, chunk) of Sᵀ and of dPᵀ, Pᵀ store, its chunked destinations seen as fp32 columns,
        the (key, query) coordinates of a thread's loaded registers). 32x32b copies: thread t holds key row t, its
        columns in order."""
        shape = self.s_tiler[:2]
        s_layout = s_thr.make_fragment_C(s_thr.partition_shape_C(shape)).layout
        chunk = cute.make_layout((self.tile_n, self.score_chunk))
        tStS_c = cute.logical_divide(cute.make_tensor(tmem_ptr, s_layout), chunk)
        s_load = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(self.score_chunk)), cutlass.Float32),
            tStS_c[(None, None), 0],
        ).get_slice(tidx)
        tScS = s_thr.partition_C(cute.make_identity_tensor(shape))
        tScS_c = cute.logical_divide(tScS, chunk)
        # Pᵀ's columns seen as fp32: two 16-bit values a column, ``score_chunk`` / 2 columns per chunk of scores
        p_cols = self.tile_m * self.dtype.width // 32
        p_chunk = self.score_chunk * self.dtype.width // 32
        p_layout = cute.composition(s_layout, cute.make_layout((self.tile_n, p_cols)))
        tStP_c = cute.logical_divide(cute.make_tensor(tmem_ptr, p_layout), cute.make_layout((self.tile_n, p_chunk)))
        p_store = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(p_chunk)), cutlass.Float32),
            tStP_c[(None, None), 0],
        ).get_slice(tidx)
        tdPtdP_c = cute.logical_divide(cute.make_tensor(tmem_ptr + _DP_OFFSET, s_layout), chunk)
        tScP = cute.make_tensor(tScS.iterator, cute.composition(tScS.layout, cute.make_layout((self.tile_n, p_cols))))
        tScP_c = cute.logical_divide(tScP, cute.make_layout((self.tile_n, p_chunk)))
        every = (None, None), None
        return (s_load, s_load.partition_S(tStS_c[every]), s_load.partition_S(tdPtdP_c[every]), p_store,
                p_store.partition_D(tStP_c[every]), s_load.partition_D(tScS_c[every]),
                p_store.partition_S(tScP_c[every]))

    @cute.jit
    def _scores_to_grads(self, copies, tile, masked: cutlass.Constexpr[bool]):
        """One query tile, ``score_chunk`` columns at a time: Sᵀ and dPᵀ from tensor memory, Pᵀ (operands' dtype) back
        over Sᵀ's first columns (a chunk's Pᵀ lands on columns already loaded), dSᵀ (without act''s constant
        factor) into shared memory, 16 bytes a store; ``masked``: scores of queries past Nq, and under a band those
        outside it, give P = dS = 0."""
        s_load, tLtS, tLtdP, p_store, tLtP, tLcS, tLcP = copies
        ds_base, m_blk, n_blk, nq, nk, band, bias_rows, dbias_rows, scale, slope, tidx = tile
        # the bias of this thread's key (a key past Nk reads the last one's: its gradients are never stored) and the
        # tile's queries (those past Nq read the last row: their P and dS are masked)
        key = n_blk * self.tile_n + tidx
        key_in = cutlass.min(key, nk - 1)
        q0 = m_blk * self.tile_m
        # this thread's key row keeps the queries [first, last]: below Nq, and within the band
        first, last = 0, nq - m_blk * self.tile_m - 1
        if cutlass.const_expr(self.band):
            limits = tile_limits(m_blk, n_blk, nq, nk, band[0], band[1], self.tile_m, self.tile_n)
            first, last = kept_queries(tidx, limits, self.window, last + 1, cutlass.min, cutlass.max)
        vector = 128 // self.dtype.width
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        for c in cutlass.range_constexpr(self.tile_m // self.score_chunk):
            rS = cute.make_rmem_tensor(tLcS[None, 0, 0, c].shape, cutlass.Float32)
            rdP = cute.make_rmem_tensor(tLcS[None, 0, 0, c].shape, cutlass.Float32)
            cute.copy(s_load, tLtS[None, 0, 0, c], rS)
            cute.copy(s_load, tLtdP[None, 0, 0, c], rdP)
            cute.arch.fence_view_async_tmem_load()
            rB = None
            if cutlass.const_expr(self.bias is not None):
                rB = cute.make_rmem_tensor(cute.make_layout(self.score_chunk), cutlass.Float32)
                for i in cutlass.range_constexpr(self.score_chunk):
                    rB[i] = cutlass.Float32(bias_rows[cutlass.min(q0 + c * self.score_chunk + i, nq - 1), key_in])
            for i in cutlass.range_constexpr(self.score_chunk):
                bias = None
                if cutlass.const_expr(self.bias is not None):
                    bias = rB[i]
                p, m = self.act_form.fn(rS[i], scale, slope, bias)
                if cutlass.const_expr(self.act_form.grad_offset == 1.0):
                    ds = cute.math.fma(rdP[i], m, rdP[i])
                else:
                    ds = rdP[i] * m
                if cutlass.const_expr(masked):
                    query = tLcS[None, 0, 0, c][i][1]
                    keep = (query >= first) & (query <= last)
                    p = p if keep else cutlass.Float32(0.0)
                    ds = ds if keep else cutlass.Float32(0.0)
                rS[i] = p
                rdP[i] = ds
            if cutlass.const_expr(self.bias_grad):
                # dS at this thread's key and each query below Nq: consecutive threads write consecutive keys
                for i in cutlass.range_constexpr(self.score_chunk):
                    query = q0 + c * self.score_chunk + i
                    if (query < nq) & (key < nk):
                        dbias_rows[query, key] = self.bias(rdP[i])
            rP = cute.make_rmem_tensor(tLcP[None, 0, 0, c].shape, cutlass.Float32)
            cute.make_tensor(cute.recast_ptr(rP.iterator, dtype=self.dtype), rS.layout).store(rS.load().to(self.dtype))
            cute.copy(p_store, rP, tLtP[None, 0, 0, c])
            r_ds = cute.make_rmem_tensor(cute.make_layout(self.score_chunk), self.dtype)
            r_ds.store(rdP.load().to(self.dtype))
            vectors = cute.make_layout(vector)
            for g in cutlass.range_constexpr(self.score_chunk // vector):
                offset = ds_offset(tidx, c * self.score_chunk + g * vector)
                dst = cute.make_ptr(self.dtype, ds_base + offset * (self.dtype.width // 8), cute.AddressSpace.smem,
                                    assumed_align=16)
                cute.copy(store, cute.make_tensor(r_ds.iterator + g * vector, vectors), cute.make_tensor(dst, vectors))

    def _acc_copy(self, thr, shape, acc_ptr, tidx):
        """The load of a (128 x N) fp32 accumulator at ``acc_ptr`` from tensor memory, ``_CHUNK`` columns at a time:
        (load, its sources (LOAD, 1, 1, chunk), the (row, column) coordinates of a thread's registers, same shape);
        32x32b loads: thread t holds row t, its columns in order."""
        chunk = cute.make_layout((shape[0], _CHUNK))
        acc = cute.make_tensor(acc_ptr, thr.make_fragment_C(thr.partition_shape_C(shape)).layout)
        acc_c = cute.logical_divide(acc, chunk)
        load = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(_CHUNK)), cutlass.Float32),
            acc_c[(None, None), 0],
        ).get_slice(tidx)
        coords = cute.logical_divide(thr.partition_C(cute.make_identity_tensor(shape)), chunk)
        return load, load.partition_S(acc_c[(None, None), None]), load.partition_D(coords[(None, None), None])

    @cute.jit
    def _add_dq(self, dq_thr, tmem_ptr, dq_rows, m_blk, nq, row):
        """dQ of query tile ``m_blk`` from tensor memory (thread ``row`` of the dQ warps holds that row) added into the
        fp32 sums ``dq_rows`` (the sample's), four values a ``red.global.add.v4.f32``; rows past its ``nq`` predicated
        off."""
        shape = self.dq_tiler[:2]
        dq_load, tLtQ, tLcQ = self._acc_copy(dq_thr, shape, tmem_ptr + _DP_OFFSET, row)
        gdQ = cute.local_tile(dq_rows, shape, (m_blk, 0))
        ok = row < nq - m_blk * self.tile_m
        for c in cutlass.range_constexpr(self.head_dim // _CHUNK):
            rQ = cute.make_rmem_tensor(tLcQ[None, 0, 0, c].shape, cutlass.Float32)
            cute.copy(dq_load, tLtQ[None, 0, 0, c], rQ)
            cute.arch.fence_view_async_tmem_load()
            for g in cutlass.range_constexpr(_CHUNK // 4):
                dst = cute.local_tile(gdQ, (1, 4), (row, c * (_CHUNK // 4) + g)).iterator
                cute.arch.inline_ptx(
                    "red.global.add.v4.f32 [{$r0}], { {$r1}, {$r2}, {$r3}, {$r4} };",
                    read_only_args=[dst, rQ[4 * g], rQ[4 * g + 1], rQ[4 * g + 2], rQ[4 * g + 3]], predicate=ok,
                )

    @cute.jit
    def _store_rows(self, thr, tiler, acc_ptr, out_rows, n_blk, nk, factor, tidx):
        """A (128 keys x D) accumulator · ``factor`` from tensor memory to global memory, ``_CHUNK`` columns at a
        time, to ``out_rows`` (the sample's), each thread its own key row (rows past its ``nk`` predicated off), in
        16-byte stores."""
        shape = tiler[:2]
        load, tLt, tLc = self._acc_copy(thr, shape, acc_ptr, tidx)
        # the thread's row as one product of its index and the row stride: the work tile's offset and the thread's
        # apart would be a loop invariant held in registers through every tile
        gOut = cute.domain_offset((n_blk * self.tile_n + tidx, 0), out_rows)
        valid = nk - n_blk * self.tile_n
        vector = 128 // self.dtype.width
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        for c in cutlass.range_constexpr(shape[1] // _CHUNK):
            r = cute.make_rmem_tensor(tLc[None, 0, 0, c].shape, cutlass.Float32)
            cute.copy(load, tLt[None, 0, 0, c], r)
            cute.arch.fence_view_async_tmem_load()
            r_out = cute.make_rmem_tensor(cute.make_layout(_CHUNK), self.dtype)
            r_out.store((cute.make_tensor(r.iterator, cute.make_layout(_CHUNK)).load() * factor).to(self.dtype))
            if tidx < valid:
                row = cute.local_tile(gOut, (1, _CHUNK), (0, c))
                vectors = cute.make_layout((vector, _CHUNK // vector))
                start = cute.make_ptr(self.dtype, row.iterator.toint(), cute.AddressSpace.gmem, assumed_align=16)
                cute.copy(store, cute.make_tensor(r_out.iterator, vectors), cute.make_tensor(start, vectors))
