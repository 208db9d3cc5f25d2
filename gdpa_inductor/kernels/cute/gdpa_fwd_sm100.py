"""CuTe-DSL GDPA forward for Blackwell (sm_100a): O = act(scale · Q Kᵀ + bias) · post_scale · V.

Persistent: a grid of at most the CTAs the SMs hold at once (``num_ctas``, the launcher's from the device's SM count:
one an SM, two for 64-key tiles at D = 64; the build does not depend on it) walks the work tiles, (128-row query
tile, head, sample), in the static order of ``tile_schedule``: query tiles fastest, CTA c taking tiles c,
c + num_ctas, ...; under a band a head's query tiles last-first (the causal mask's longest first), in a varlen batch
the samples in ``rows``' order (the most work first) and the query tiles past a sample's queries skipped by every
warp without work. Six warps, each with one role, walk the same sequence, every pipeline's position and phase
carried from tile to tile:
- warps 0-3, the activation warps (one query row a thread): per key tile they load S from tensor memory
  (tcgen05.ld), apply the activation's fp32 form (``activation_math``, the scale folded into its first product),
  write P in the operands' dtype back over the first half of S's own columns (tcgen05.st) for the P·V matmul to
  read from tensor memory, ``_SCORE_CHUNK`` columns a step; at a tile's end they load O from tensor memory, scale
  it by ``post_scale``, store it to global memory from the registers (rows past Nq predicated off) and release O;
- warp 4, the MMA warp: per tile S_j = Q K_jᵀ into one of two S buffers in tensor memory, so that S_{j+1} is
  computed while the activation warps work on S_j, then O += P_j V_j with P from tensor memory (tcgen05 "TS" form);
- warp 5, the load warp: per tile Q into a ring of two stages (the next tile's Q loads while this one's matmuls
  read its own), then K_j and V_j by TMA into two rings of ``kv_stages`` shared-memory stages.
No softmax: no running max, no correction of O, no row sums, so no correction warps. Keys past Nk read as zeros
(TMA fills them); with ``mask_keys`` (Nk not a multiple of the key tile) the padded columns also give P = 0 by a
select per score, so a non-finite query cannot leak NaN through them (with finite queries their scores are 0 and
their values 0, so act(0) · 0 adds nothing even without the mask).

Tensor memory (``tmem_columns``: 512 columns with 128-key tiles, a power of two): S_0 at columns [0, tile_n), S_1 at
[tile_n, 2 tile_n), each holding its P in its first tile_n / 2 columns (16-bit pairs), O at [2 tile_n, 2 tile_n + Dv).
Synchronisation (mbarriers, ``cutlass.pipeline``): Q, K, V full/empty (TMA -> MMA), S full/empty (MMA ->
activation), P full/empty (activation -> MMA), O full (MMA -> epilogue) and O empty (epilogue -> MMA). The MMA warp
issues QK_{j+2} into the buffer of P_j only after PV_j, and tcgen05.mma instructions of one thread run in issue
order, so S never overwrites a P the tensor cores still read; this holds across tiles, the S and P rings running on.
A tile's first P·V (which overwrites O) waits for O empty, released by the activation warps once they have read the
previous tile's O; its first Q Kᵀ does not, so S_0 of tile t + 1 is computed while the epilogue of tile t runs (one O
buffer: the activation warps run both, so a second would not start the next tile's activation sooner).

Compile-time options:
- ``causal`` (bottom-right aligned: key j kept for query i iff j <= i + Nk - Nq) and ``window`` (a band around that
  diagonal, key j kept iff -left <= j - i - (Nk - Nq) <= right, the bounds run-time values from
  ``window_bounds.band_limits``): a query tile computes only the key tiles its band reaches (``band_tiles``), in
  order; the tiles wholly inside the band run unmasked, the edge ones select P = 0 per score (which also drops keys
  past Nk; each row keeps one run of columns, ``kept_columns``), a warp-uniform branch per tile choosing the path. A
  query tile whose band misses every key runs one wholly masked tile (O = 0).
- ``bias`` (the bias tensor's element type, the operands' 16-bit one or fp32): act(scale · S + bias), the bias
  broadcast to [Z, H, Nq, Nk] over its dims of one (stride 0) and read from global memory by the activation warps,
  32-bit words (two 16-bit values or one fp32) of their own row; S is then processed ``_BIAS_CHUNK`` columns at a
  time (S load, bias, activation, P store), so the bias adds no registers per score of the whole tile.
- ``varlen``: the tiles are (query tile, head, sample) of a varlen batch, the query tiles per head and sample those of
  its longest; each side's rows of a sample read through a TMA descriptor bounded at the sample's end
  (``ragged_rows``: ragged tiles read zeros), O stored from the registers with the rows past the sample's end
  predicated off. Tiles past a sample's queries are skipped; those of a sample without keys store O = 0 and run no
  matmul.
- ``q_stages``: two, so that the next tile's Q loads under this one's matmuls.

Compiled for sm_100a and checked on CPU (PTX, ptxas's report: no spills); it has not run on a Blackwell GPU.
"""
from __future__ import annotations

from collections.abc import Callable

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.memory import SmemAllocator, TmemAllocator

from ..common.window_bounds import UNBOUNDED
from .band_tiles import band_key_tiles, kept_columns, tile_limits, unmasked_key_tiles
from .ragged_rows import RAGGED_ROWS, ragged
from .tile_schedule import has_rows, tile_coords, tile_count

_ROWS = 128
_WARP = 32
# warp roles
_ACT_WARPS = 4
_MMA_WARP = 4
_LOAD_WARP = 5
_ACT_THREADS = _ACT_WARPS * _WARP
# named barriers (0 is the CTA-wide one): the tensor-memory address hand-over (activation and MMA warps) and the
# activation warps' end before the tensor memory is freed
_TMEM_BARRIER = 1
_ACT_BARRIER = 2
# columns of O loaded from tensor memory at a time in the epilogue: 32 fp32 registers a thread
_EPI_COLUMNS = 32
# columns of S a bias-reading activation step takes at a time: 32 scores, 16 words of bias and 16 of P a thread
_BIAS_CHUNK = 32
# columns of S an activation step without a bias takes at a time: 64 scores and 32 words of P a thread, so that the
# tile loop's values fit beside them in registers
_SCORE_CHUNK = 64


def tmem_columns(tile_n: int, head_dim_v: int) -> int:
    """Tensor-memory columns a CTA allocates: two S buffers and O, rounded up to a power of two (tcgen05.alloc's
    rule; 512 at most)."""
    used = 2 * tile_n + head_dim_v
    return max(32, 1 << (used - 1).bit_length())


def _batched(t: cute.Tensor, swap: bool = False) -> cute.Tensor:
    """(N, D, H, Z, ...) -> (N, D, (H, Z, ...)), or with ``swap`` (D, N, (H, Z, ...)): one batch mode for the TMA
    atoms (a ragged operand's end-row mode joins it)."""
    a, b = (1, 0) if swap else (0, 1)
    rest = range(2, cute.rank(t))
    return cute.make_tensor(
        t.iterator,
        cute.make_layout((t.shape[a], t.shape[b], tuple(t.shape[i] for i in rest)),
                         stride=(t.stride[a], t.stride[b], tuple(t.stride[i] for i in rest))),
    )


class GdpaFwdSm100:
    """Compile-time parameters: element type, head dims of Q/K and of V/O (equal, 64 or 128), the activation's fp32
    forward form (``activation_math.forward_form(name, False)``), key tile, K/V stages, whether keys past Nk
    are masked (``mask_keys``), the band (``causal``, ``window``), the bias tensor's element type (``bias``: None,
    the operands' dtype or Float32), ``varlen`` and the Q stages (``q_stages``: two let the next tile's Q load
    early)."""

    def __init__(self, dtype, head_dim: int, head_dim_v: int, activation: Callable, tile_n: int = 128,
                 kv_stages: int = 2, mask_keys: bool = True, causal: bool = False, window: bool = False,
                 bias=None, varlen: bool = False, q_stages: int = 2):
        assert head_dim == head_dim_v and head_dim in (64, 128), "D = Dv of 64 or 128"
        assert tile_n in (64, 128), "key tiles of 64 or 128"
        assert bias is None or bias in (dtype, cutlass.Float32), "a bias in the operands' dtype or fp32"
        self.dtype = dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v
        self.activation = activation
        self.tile_m = _ROWS
        self.tile_n = tile_n
        self.kv_stages = kv_stages
        self.q_stages = q_stages
        # a varlen sample's last key tile is ragged wherever its length falls
        self.mask_keys = mask_keys or varlen
        self.causal = causal
        self.window = window
        self.band = causal or window
        self.bias = bias
        self.varlen = varlen
        # columns of S per activation step: the whole tile, or with a bias chunks of it (registers)
        self.chunk = _BIAS_CHUNK if bias is not None else min(_SCORE_CHUNK, tile_n)
        # 16-bit bias values two to a 32-bit word
        self.bias_per_word = 1 if bias is None else 32 // bias.width
        self.threads = (_LOAD_WARP + 1) * _WARP
        # two S buffers at columns 0 and tile_n, then O; P lives in each S buffer's first columns
        self.o_offset = 2 * tile_n
        self.tmem_columns = tmem_columns(tile_n, head_dim_v)
        assert self.tmem_columns <= 512
        self.qk_tiler = (self.tile_m, tile_n, head_dim)
        self.pv_tiler = (self.tile_m, head_dim_v, tile_n)

    def _tiled_mmas(self):
        """(S = Q Kᵀ, both operands from shared memory, K-major; O += P V, P from tensor memory, V MN-major)."""
        one = tcgen05.CtaGroup.ONE
        qk = sm100_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K, cutlass.Float32, one, self.qk_tiler[:2],
        )
        pv = sm100_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN, cutlass.Float32, one,
            self.pv_tiler[:2], tcgen05.OperandSource.TMEM,
        )
        return qk, pv

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        scale: cutlass.Float32,
        post_scale: cutlass.Float32,
        slope: cutlass.Float32,
        num_ctas: cutlass.Int32,
        stream: cuda.CUstream,
        rows: cute.Tensor | None = None,
        num_m: cutlass.Int32 | None = None,
        band_left: cutlass.Int32 | None = None,
        band_right: cutlass.Int32 | None = None,
        mBias: cute.Tensor | None = None,
    ):
        """mQ: (Nq, D, H, Z); mK: (Nk, D, Hkv, Z); mV: (Nk, Dv, Hkv, Z); mO: (Nq, Dv, H, Z); D, Dv contiguous; H a
        multiple of Hkv (query head h reads kv head h // (H / Hkv)). ``num_ctas``: the grid, at most the work tiles
        (the host's choice from the device's SM count, ``fwd_plan.persistent_grid``; the build does not depend on it).
        Varlen: ``rows`` (5, B) int32, per sample in the order the tiles visit them (longest first): first query row,
        query count, first key row, key count, and the sample's index z; each side's Z is 1 (jagged rows) or B (a
        dense side, rows counted within sample z's block).
        ``num_m``: query tiles of the longest sample. ``band_left``, ``band_right``: the band's bounds (``window``).
        ``mBias``: the bias as 32-bit words (two 16-bit values, or one fp32), (Nq, words a row, Hb, Zb), the words
        contiguous, Hb 1 or H, Zb 1 or Z (broadcast dims of stride 0 read as any other)."""
        q, k, v = mQ, mK, mV
        if cutlass.const_expr(self.varlen):
            q, k, v = ragged(q, 0), ragged(k, 0), ragged(v, 0)
        q, k = _batched(q), _batched(k)
        o = mO if self.varlen else _batched(mO)
        # V as (Dv, N, (Hkv, Z)): the B operand of P·V, contiguous along its N mode (Dv)
        v = _batched(v, swap=True)
        qk_mma, pv_mma = self._tiled_mmas()
        q_smem = sm100_utils.make_smem_layout_a(qk_mma, self.qk_tiler, self.dtype, self.q_stages)
        k_smem = sm100_utils.make_smem_layout_b(qk_mma, self.qk_tiler, self.dtype, self.kv_stages)
        p_tmem = sm100_utils.make_smem_layout_a(pv_mma, self.pv_tiler, self.dtype, 1)
        v_smem = sm100_utils.make_smem_layout_b(pv_mma, self.pv_tiler, self.dtype, self.kv_stages)
        load = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        q_tile = cute.select(q_smem, mode=[0, 1, 2])
        k_tile = cute.select(k_smem, mode=[0, 1, 2])
        v_tile = cute.select(v_smem, mode=[0, 1, 2])
        tma_q, tq = cute.nvgpu.make_tiled_tma_atom_A(load, q, q_tile, self.qk_tiler, qk_mma, (1, 1, 1, 1))
        tma_k, tk = cute.nvgpu.make_tiled_tma_atom_B(load, k, k_tile, self.qk_tiler, qk_mma, (1, 1, 1, 1))
        tma_v, tv = cute.nvgpu.make_tiled_tma_atom_B(load, v, v_tile, self.pv_tiler, pv_mma, (1, 1, 1, 1))
        self.q_bytes = cute.size_in_bytes(self.dtype, q_tile)
        self.k_bytes = cute.size_in_bytes(self.dtype, k_tile)
        self.v_bytes = cute.size_in_bytes(self.dtype, v_tile)

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            k_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            v_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            s_mbar: cute.struct.MemRange[cutlass.Int64, 2 * 2]
            p_mbar: cute.struct.MemRange[cutlass.Int64, 2 * 2]
            o_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_address: cutlass.Int32
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(k_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(v_smem)], 1024]

        self.shared_storage = SharedStorage
        samples = mQ.shape[3]
        if cutlass.const_expr(self.varlen):
            samples = rows.shape[1]
        else:
            num_m = cute.ceil_div(mQ.shape[0], self.tile_m)
        self.kernel(
            qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, scale, post_scale, slope,
            q_smem, k_smem, p_tmem, v_smem, (num_m, mQ.shape[2], samples), mQ.shape[2] // mK.shape[2], mQ.shape[0],
            mK.shape[0], rows, band_left, band_right, mBias,
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
        qk_mma: cute.TiledMma,
        pv_mma: cute.TiledMma,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        mO: cute.Tensor,
        scale: cutlass.Float32,
        post_scale: cutlass.Float32,
        slope: cutlass.Float32,
        q_smem: cute.ComposedLayout,
        k_smem: cute.ComposedLayout,
        p_tmem: cute.ComposedLayout,
        v_smem: cute.ComposedLayout,
        tiles: tuple,
        group: cutlass.Int32,
        nq_all: cutlass.Int32,
        nk_all: cutlass.Int32,
        rows: cute.Tensor | None,
        band_left: cutlass.Int32 | None,
        band_right: cutlass.Int32 | None,
        mBias: cute.Tensor | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        band = (UNBOUNDED, 0)
        if cutlass.const_expr(self.window):
            band = (band_left, band_right)
        work = (tiles, group, nq_all, nk_all, rows, band)
        num_tiles = tile_count(*tiles)

        storage = SmemAllocator().allocate(self.shared_storage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        act_threads = pipeline.CooperativeGroup(pipeline.Agent.Thread, _ACT_THREADS)
        # Q of the next tile loads into the other stage while this tile's matmuls still read its own
        q_producer, q_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.q_mbar.data_ptr(), num_stages=self.q_stages, producer_group=one_thread,
            consumer_group=one_thread, tx_count=self.q_bytes, defer_sync=True,
        ).make_participants()
        # K and V in rings of their own: the MMA warp takes K_{j+1} before V_j
        k_producer, k_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.k_mbar.data_ptr(), num_stages=self.kv_stages, producer_group=one_thread,
            consumer_group=one_thread, tx_count=self.k_bytes, defer_sync=True,
        ).make_participants()
        v_producer, v_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.v_mbar.data_ptr(), num_stages=self.kv_stages, producer_group=one_thread,
            consumer_group=one_thread, tx_count=self.v_bytes, defer_sync=True,
        ).make_participants()
        # S_j complete (tcgen05.commit) -> activation; S buffer read and P written -> MMA may reuse it
        s_producer, s_consumer = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.s_mbar.data_ptr(), num_stages=2, producer_group=one_thread,
            consumer_group=act_threads, defer_sync=True,
        ).make_participants()
        # P_j in tensor memory -> MMA; P_j V_j complete (tcgen05.commit) -> its columns may take the next P
        p_producer, p_consumer = pipeline.PipelineAsyncUmma.create(
            barrier_storage=storage.p_mbar.data_ptr(), num_stages=2, producer_group=act_threads,
            consumer_group=one_thread, defer_sync=True,
        ).make_participants()
        # O full: a tile's last P·V complete -> epilogue; O empty: the epilogue has read O -> the next tile's first
        # P·V may overwrite it
        o_producer, o_consumer = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.o_mbar.data_ptr(), num_stages=1, producer_group=one_thread,
            consumer_group=act_threads, defer_sync=True,
        ).make_participants()
        tmem = TmemAllocator(
            storage.tmem_address.ptr,
            barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=_TMEM_BARRIER, num_threads=_ACT_THREADS + _WARP),
            allocator_warp_id=0,
        )
        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1, 1), is_relaxed=True)

        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sK = storage.sK.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sV = storage.sV.get_tensor(v_smem.outer, swizzle=v_smem.inner)
        qk_thr = qk_mma.get_slice(0)
        pv_thr = pv_mma.get_slice(0)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1, 1))

        if warp_idx == _LOAD_WARP:
            # ---- LOAD: per tile Q, then K_j and V_j of the key tiles first, first + 1, ... ----
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
            d, dv = self.head_dim, self.head_dim_v
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                m_blk, h, z, q0, nq, k0, nk, _, runs, first, count, _ = self._tile(tile, work)
                if runs:
                    hk = h // group
                    # (TMA, RestM, RestK) and the like: the tiles of this head and sample
                    tQsQ, tQgQ = self._tma_part(tma_q, sQ, qk_thr.partition_A(
                        cute.flat_divide(self._sample(mQ, h, z, q0, nq, 0), (self.tile_m, d))))
                    tKsK, tKgK = self._tma_part(tma_k, sK, qk_thr.partition_B(
                        cute.flat_divide(self._sample(mK, hk, z, k0, nk, 0), (self.tile_n, d))))
                    tVsV, tVgV = self._tma_part(tma_v, sV, pv_thr.partition_B(
                        cute.flat_divide(self._sample(mV, hk, z, k0, nk, 1), (dv, self.tile_n))))
                    handle = q_producer.acquire_and_advance()
                    cute.copy(tma_q, tQgQ[None, m_blk, 0], tQsQ[None, handle.index], tma_bar_ptr=handle.barrier)
                    for j in cutlass.range(count, unroll=1):
                        handle = k_producer.acquire_and_advance()
                        cute.copy(tma_k, tKgK[None, first + j, 0], tKsK[None, handle.index],
                                  tma_bar_ptr=handle.barrier)
                        handle = v_producer.acquire_and_advance()
                        cute.copy(tma_v, tVgV[None, 0, first + j], tVsV[None, handle.index],
                                  tma_bar_ptr=handle.barrier)
            # the MMA warp's last releases land before the CTA exits
            q_producer.tail()
            k_producer.tail()
            v_producer.tail()

        if warp_idx == _MMA_WARP:
            # ---- MMA: per tile S_j = Q K_jᵀ, then O += P_{j-1} V_{j-1} ----
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            tSrQ = qk_thr.make_fragment_A(sQ)
            tSrK = qk_thr.make_fragment_B(sK)
            tOrV = pv_thr.make_fragment_B(sV)
            s_layout = qk_thr.make_fragment_C(qk_thr.partition_shape_C(self.qk_tiler[:2])).layout
            tOtO = cute.make_tensor(
                tmem_ptr + self.o_offset,
                pv_thr.make_fragment_C(pv_thr.partition_shape_C(self.pv_tiler[:2])).layout,
            )
            p_layout = pv_thr.make_fragment_A(cute.make_tensor(tmem_ptr, p_tmem.outer))[None, None, None, 0].layout
            qk = (qk_mma, tSrK, s_layout, tmem_ptr)
            pv = (pv_mma, tOrV, tOtO, p_layout, tmem_ptr)
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                _, _, _, _, _, _, _, _, runs, _, count, _ = self._tile(tile, work)
                if runs:
                    q_handle = q_consumer.wait_and_advance()
                    rQ = tSrQ[None, None, None, q_handle.index]
                    # the pipelines' positions and the MMAs' accumulate flag change in the helpers: rebound here, as
                    # loop-carried locals
                    qk_mma, k_consumer, s_producer = self._mma_qk((qk_mma, *qk[1:]), rQ, k_consumer, s_producer)
                    # S_0 is computed while the epilogue still reads the last tile's O; its first P·V waits for it
                    o_handle = o_producer.acquire_and_advance()
                    for j in cutlass.range(1, count, unroll=1):
                        qk_mma, k_consumer, s_producer = self._mma_qk((qk_mma, *qk[1:]), rQ, k_consumer, s_producer)
                        pv_mma, p_consumer, v_consumer = self._mma_pv((pv_mma, *pv[1:]), j > 1, p_consumer,
                                                                      v_consumer)
                    # Q's stage is free once the tile's last Q Kᵀ is done (tcgen05.commit)
                    q_handle.release()
                    pv_mma, p_consumer, v_consumer = self._mma_pv((pv_mma, *pv[1:]), count > 1, p_consumer,
                                                                  v_consumer)
                    # O complete once every matmul issued so far is (tcgen05.commit tracks them all)
                    o_handle.commit()

        if warp_idx < _ACT_WARPS:
            # ---- ACTIVATION: per tile P_j = act(scale · S_j + bias) into tensor memory; then the epilogue ----
            tmem.allocate(self.tmem_columns)
            tmem.relinquish_alloc_permit()
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            copies = self._score_copies(qk_thr, tmem_ptr, tidx)
            for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                m_blk, h, z, q0, nq, _, nk, rows_here, runs, first, count, whole = self._tile(tile, work)
                if runs:
                    bias_rows = None
                    if cutlass.const_expr(self.bias is not None):
                        bias_rows = mBias[None, None, h % mBias.shape[2], z % mBias.shape[3]]
                    for j in cutlass.range(count, unroll=1):
                        n_blk = first + j
                        s_handle = s_consumer.wait_and_advance()
                        base = tmem_ptr + s_handle.index * self.tile_n
                        step = (base, n_blk, m_blk, nq, nk, band, bias_rows, scale, slope, tidx)
                        if cutlass.const_expr(self.band):
                            if (n_blk < whole[0]) | (n_blk >= whole[1]):
                                self._activate_tile(copies, step, True)
                            else:
                                self._activate_tile(copies, step, False)
                        else:
                            self._activate_tile(copies, step, self.mask_keys)
                        # P_j's columns were free before it was written: S_j's commit tracks every matmul the MMA
                        # warp issued before Q K_jᵀ, the P·V that read P_{j-2} there among them; the wait keeps the
                        # ring's count
                        p_handle = p_producer.acquire_and_advance()
                        cute.arch.fence_view_async_tmem_store()
                        p_handle.commit()
                        s_handle.release()
                    o_handle = o_consumer.wait_and_advance()
                    self._store_o(pv_thr, tmem_ptr, mO, m_blk, h, z, q0, nq, post_scale, tidx, False)
                    # every O load of this thread waited on (tcgen05.wait::ld): the next tile may overwrite O
                    o_handle.release()
                if cutlass.const_expr(self.varlen):
                    # a sample without keys: O = 0, no matmul
                    if rows_here & (nk == 0):
                        self._store_o(pv_thr, None, mO, m_blk, h, z, q0, nq, post_scale, tidx, True)
            # the MMA warp's last releases of P (tcgen05.commit) land before the CTA exits
            p_producer.tail()
            # every activation warp has read O: the tensor memory may go
            cute.arch.barrier(barrier_id=_ACT_BARRIER, number_of_threads=_ACT_THREADS)
            tmem.free(tmem_ptr)

    @cute.jit
    def _tile(self, tile: cutlass.Int32, work: tuple):
        """What work tile ``tile`` (``tile_schedule``) is: (query tile, head, sample index z, first query row, query
        count, first key row, key count, whether the query tile holds rows of its sample, whether it runs the
        matmuls (rows and keys), first key tile and key tile count, the whole key tiles [begin, end) among them).
        Every warp decodes the same tile to the same values, so all take or skip it together."""
        tiles, group, nq, nk, rows, band = work
        m_blk, h, rank = tile_coords(tile, tiles[0], tiles[1], self.band)
        q0, k0, z = 0, 0, rank
        if cutlass.const_expr(self.varlen):
            q0, nq, k0, nk, z = rows[0, rank], rows[1, rank], rows[2, rank], rows[3, rank], rows[4, rank]
        rows_here, runs = True, True
        if cutlass.const_expr(self.varlen):
            rows_here = has_rows(m_blk, nq, self.tile_m)
            runs = rows_here & (nk > 0)
        # the key tiles this query tile computes, and the whole ones among them (no per-score mask)
        first, count = 0, cute.ceil_div(nk, self.tile_n)
        whole = (0, 0)
        if cutlass.const_expr(self.band):
            first, count = band_key_tiles(m_blk, nq, nk, band[0], band[1], self.tile_m, self.tile_n,
                                          cutlass.min, cutlass.max)
            whole = unmasked_key_tiles(m_blk, nq, nk, band[0], band[1], self.tile_m, self.tile_n,
                                       cutlass.min, cutlass.max)
        return m_blk, h, z, q0, nq, k0, nk, rows_here, runs, first, count, whole

    @cute.jit
    def _sample(self, m: cute.Tensor, h: cutlass.Int32, z: cutlass.Int32, start, length,
                row_mode: cutlass.Constexpr[int]):
        """The (rows, D) or (D, rows) (``row_mode``) TMA coordinate tensor of head ``h`` and sample ``z``: the dense
        tensor's, or a varlen sample's ``length`` rows from ``start`` through the ragged descriptor (a side of one
        block has Z = 1, and every sample reads it)."""
        if cutlass.const_expr(not self.varlen):
            return m[None, None, (h, z)]
        rows = m[None, None, (h, z % m.shape[2][1], start + length)]
        shift = (RAGGED_ROWS - length, 0) if row_mode == 0 else (0, RAGGED_ROWS - length)
        return cute.domain_offset(shift, rows)

    def _tma_part(self, atom, s, g):
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 3), cute.group_modes(g, 0, 3))

    def _score_copies(self, qk_thr, tmem_ptr, tidx):
        """The activation warps' tensor-memory copies of ``chunk`` columns of a key tile: (S load, P store, S's
        chunk layout, P's chunk layout seen as fp32 columns, the (row, key) coordinates of a thread's S registers and
        of its P registers, keys counted from the chunk's first). 32x32b copies: thread t holds row t, its columns in
        order (``tests/kernels/test_cute_compile_sm100.py`` checks it). Chunk c's S starts ``c · chunk`` columns into
        the S buffer, its P ``c · chunk / 2`` (16-bit pairs): never past S's columns already loaded."""
        s_full = qk_thr.make_fragment_C(qk_thr.partition_shape_C(self.qk_tiler[:2])).layout
        s_layout = cute.composition(s_full, cute.make_layout((self.tile_m, self.chunk)))
        tScS_full = qk_thr.partition_C(cute.make_identity_tensor(self.qk_tiler[:2]))
        tScS = cute.make_tensor(tScS_full.iterator,
                                cute.composition(tScS_full.layout, cute.make_layout((self.tile_m, self.chunk))))
        # P's columns seen as fp32: two 16-bit values a column
        p_cols = self.chunk * self.dtype.width // 32
        p_layout = cute.composition(s_full, cute.make_layout((self.tile_m, p_cols)))
        tScP = cute.make_tensor(tScS_full.iterator,
                                cute.composition(tScS_full.layout, cute.make_layout((self.tile_m, p_cols))))
        s_load = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), cutlass.Float32),
            cute.make_tensor(tmem_ptr, s_layout),
        ).get_slice(tidx)
        p_store = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(max(p_cols // 2, 16))),
                                cutlass.Float32),
            cute.make_tensor(tmem_ptr, p_layout),
        ).get_slice(tidx)
        return s_load, p_store, s_layout, p_layout, s_load.partition_D(tScS), p_store.partition_S(tScP)

    def _o_copy(self, pv_thr, tmem_ptr, tidx):
        """The epilogue's load of O from tensor memory, ``_EPI_COLUMNS`` columns at a time: (O load, its sources
        (LOAD, 1, 1, chunk), the (row, column) coordinates of a thread's registers, same shape); thread t holds row t,
        its columns in order."""
        shape = self.pv_tiler[:2]
        chunk = cute.make_layout((self.tile_m, _EPI_COLUMNS))
        tOtO = cute.make_tensor(
            tmem_ptr + self.o_offset, pv_thr.make_fragment_C(pv_thr.partition_shape_C(shape)).layout
        )
        tOtO_c = cute.logical_divide(tOtO, chunk)
        o_load = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(_EPI_COLUMNS)), cutlass.Float32),
            tOtO_c[(None, None), 0],
        ).get_slice(tidx)
        tOcO_c = cute.logical_divide(pv_thr.partition_C(cute.make_identity_tensor(shape)), chunk)
        return o_load, o_load.partition_S(tOtO_c[(None, None), None]), o_load.partition_D(tOcO_c[(None, None), None])

    @cute.jit
    def _mma_qk(self, qk: tuple, rQ, k_consumer, s_producer):
        """S = Q Kᵀ of the next key tile into the next S buffer, committed to the activation warps."""
        qk_mma, tSrK, s_layout, tmem_ptr = qk
        k_handle = k_consumer.wait_and_advance()
        s_handle = s_producer.acquire_and_advance()
        tStS = cute.make_tensor(tmem_ptr + s_handle.index * self.tile_n, s_layout)
        rK = tSrK[None, None, None, k_handle.index]
        for kb in cutlass.range_constexpr(cute.size(rQ, mode=[2])):
            qk_mma.set(tcgen05.Field.ACCUMULATE, kb != 0)
            cute.gemm(qk_mma, tStS, rQ[None, None, kb], rK[None, None, kb], tStS)
        s_handle.commit()
        k_handle.release()
        return qk_mma, k_consumer, s_producer

    @cute.jit
    def _mma_pv(self, pv: tuple, accumulate, p_consumer, v_consumer):
        """O += P V of the oldest key tile whose P is written (``accumulate``: False for the first); P's stage is
        released (tcgen05.commit) once the matmul has read it."""
        pv_mma, tOrV, tOtO, p_layout, tmem_ptr = pv
        p_handle = p_consumer.wait_and_advance()
        v_handle = v_consumer.wait_and_advance()
        # P_j sits in S_j's buffer, whose stage index it shares (both rings advance once a key tile)
        tOrP = cute.make_tensor(cute.recast_ptr(tmem_ptr + p_handle.index * self.tile_n, dtype=self.dtype), p_layout)
        rV = tOrV[None, None, None, v_handle.index]
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            if cutlass.const_expr(kb == 0):
                pv_mma.set(tcgen05.Field.ACCUMULATE, accumulate)
            else:
                pv_mma.set(tcgen05.Field.ACCUMULATE, True)
            cute.gemm(pv_mma, tOtO, tOrP[None, None, kb], rV[None, None, kb], tOtO)
        v_handle.release()
        p_handle.release()
        return pv_mma, p_consumer, v_consumer

    @cute.jit
    def _activate_tile(self, copies: tuple, tile: tuple, masked: cutlass.Constexpr[bool]):
        """P = act(scale · S + bias) of one key tile, S read from and P written to tensor memory ``chunk`` columns
        at a time (the P store's wait is the caller's); with ``masked`` the scores ``_kept`` drops give P = 0."""
        s_load, p_store, s_layout, p_layout, tLcS, tLcP = copies
        base, n_blk, m_blk, nq, nk, band, bias_rows, scale, slope, tidx = tile
        p_cols = self.chunk * self.dtype.width // 32
        # the bounds ``_kept`` compares a score's key column with, on this tile
        limits = tile_limits(m_blk, n_blk, nq, nk, band[0], band[1], self.tile_m, self.tile_n)
        for c in cutlass.range_constexpr(self.tile_n // self.chunk):
            col0 = c * self.chunk
            words = self._load_bias(bias_rows, m_blk, n_blk, col0, nq, nk, tidx)
            rS = cute.make_rmem_tensor(tLcS.shape, cutlass.Float32)
            cute.copy(s_load, s_load.partition_S(cute.make_tensor(base + col0, s_layout)), rS)
            cute.arch.fence_view_async_tmem_load()
            self._activate(rS, tLcS, col0, limits, scale, slope, words, masked)
            rP = cute.make_rmem_tensor(tLcP.shape, cutlass.Float32)
            cute.make_tensor(cute.recast_ptr(rP.iterator, dtype=self.dtype), rS.layout).store(
                rS.load().to(self.dtype)
            )
            cute.copy(p_store, rP, p_store.partition_D(cute.make_tensor(base + c * p_cols, p_layout)))

    @cute.jit
    def _load_bias(self, bias_rows, m_blk, n_blk, col0, nq, nk, tidx):
        """The bias of this thread's row (rows past Nq read the last row's: their O is never stored) over ``chunk``
        columns from ``col0`` of key tile ``n_blk``, as 32-bit words; with ``mask_keys`` words past Nk read nothing
        (their P is 0), so every read is in range. None without a bias."""
        words = None
        if cutlass.const_expr(self.bias is not None):
            per = self.bias_per_word
            word_type = cutlass.Float32 if per == 1 else cutlass.Int32
            words = cute.make_rmem_tensor((self.chunk // per,), word_type)
            row = cutlass.min(m_blk * self.tile_m + tidx, nq - 1)
            start = n_blk * self.tile_n + col0
            for i in cutlass.range_constexpr(self.chunk // per):
                if cutlass.const_expr(self.mask_keys):
                    words[i] = word_type(0)
                    if start + i * per < nk:
                        words[i] = bias_rows[row, start // per + i]
                else:
                    words[i] = bias_rows[row, start // per + i]
        return words

    @cute.jit
    def _activate(self, rS, tLcS, col0, limits, scale, slope, words, masked: cutlass.Constexpr[bool]):
        """P = act(scale · S + bias) in place, the bias (``words``, as ``_load_bias`` read them) in each form's first
        product; with ``masked`` the scores ``_kept`` drops give P = 0 (a select per score: a branch would carry the
        whole row through both paths)."""
        values = None
        if cutlass.const_expr(self.bias is not None):
            values = words if self.bias_per_word == 1 else cute.recast_tensor(words, self.dtype)
        span = None
        if cutlass.const_expr(masked and self.band):
            # the thread's row (tLcS: its row, the chunk's columns in order) keeps one run of columns
            span = kept_columns(limits, tLcS[0][0], cutlass.min)
        for i in cutlass.range_constexpr(cute.size(rS)):
            bias = None
            if cutlass.const_expr(self.bias is not None):
                bias = cutlass.Float32(values[i])
            p = self.activation(rS[i], scale, slope, bias)
            if cutlass.const_expr(masked):
                p = p if self._kept(tLcS[i][1] + col0, limits, span) else cutlass.Float32(0.0)
            rS[i] = p

    @cute.jit
    def _kept(self, col, limits, span):
        """Whether the score in column ``col`` of the thread's row is kept: its key within Nk (``limits[0]``: keys of
        the tile within it) and, under a band, its column within the row's ``span`` (``kept_columns``; causal alone
        has no lower bound). The column is a constant of the unrolled loop, the bounds values of the tile."""
        if cutlass.const_expr(not self.band):
            return col < limits[0]
        if cutlass.const_expr(not self.window):
            return col <= span[1]
        return (col >= span[0]) & (col <= span[1])

    @cute.jit
    def _store_o(self, pv_thr, tmem_ptr, mO, m_blk, h, z, q0, nq, post_scale, tidx, zeros: cutlass.Constexpr[bool]):
        """O · post_scale from tensor memory (``zeros``: O = 0, no tensor memory) to global memory,
        ``_EPI_COLUMNS`` columns at a time, each thread its own row (rows past the sample's ``nq`` queries predicated
        off): a 32x32b load gives thread t of the activation warps row t of the tile, its columns in order, so each
        chunk is one contiguous run of the row (16-byte stores). Varlen: the sample's rows start at ``q0``."""
        o_load, tLtO, tLcO = None, None, None
        if cutlass.const_expr(not zeros):
            o_load, tLtO, tLcO = self._o_copy(pv_thr, tmem_ptr, tidx)
        if cutlass.const_expr(self.varlen):
            rows = cute.domain_offset((q0, 0), mO[None, None, h, z % mO.shape[3]])
        else:
            rows = mO[None, None, (h, z)]
        gO = cute.local_tile(rows, self.pv_tiler[:2], (m_blk, 0))
        valid = nq - m_blk * self.tile_m
        # 16-byte stores: O's rows start 16-byte aligned (the support check's TMA layout rules; the fake tensors leave
        # the strides' divisibility unknown)
        vector = 128 // self.dtype.width
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        for c in cutlass.range_constexpr(self.head_dim_v // _EPI_COLUMNS):
            r_out = cute.make_rmem_tensor(cute.make_layout(_EPI_COLUMNS), self.dtype)
            if cutlass.const_expr(zeros):
                r_out.fill(0.0)
            else:
                rO = cute.make_rmem_tensor(tLcO[None, 0, 0, c].shape, cutlass.Float32)
                cute.copy(o_load, tLtO[None, 0, 0, c], rO)
                cute.arch.fence_view_async_tmem_load()
                r_out.store((cute.make_tensor(rO.iterator, cute.make_layout(_EPI_COLUMNS)).load() * post_scale).to(
                    self.dtype))
            if tidx < valid:
                row = cute.local_tile(gO, (1, _EPI_COLUMNS), (tidx, c))
                vectors = cute.make_layout((vector, _EPI_COLUMNS // vector))
                start = cute.make_ptr(self.dtype, row.iterator.toint(), cute.AddressSpace.gmem, assumed_align=16)
                cute.copy(store, cute.make_tensor(r_out.iterator, vectors), cute.make_tensor(start, vectors))
