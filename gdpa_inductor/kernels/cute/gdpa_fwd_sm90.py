"""CuTe-DSL GDPA forward for Hopper (sm_90a): O = act(scale · Q Kᵀ) · post_scale · V.

Persistent: one CTA per SM walks the (128-row query tile, head, sample) tiles, query tiles fastest, in a
static round robin (every tile costs the same in a dense batch); three warpgroups:
- a producer warpgroup that gives its registers away and issues the TMA loads: per tile the Q tile into a
  ring of two stages, then the K and V tiles into two rings of their own. It runs ahead into the next tile:
  its Q and first K/V tiles load while the consumers still work on the current one;
- two consumer warpgroups, 64 query rows each, one tiled MMA over both: S = Q Kᵀ by wgmma from shared
  memory, the activation on the fp32 accumulator, then O += P V by wgmma with P taken straight from
  registers (no shared-memory round trip for P). Each step issues S_{j+1} right before P_j V_j, so the
  activation of key tile j+1 runs while P_j V_j is on the tensor cores, and the steps run on across query
  tiles: S_0 of the next query tile goes with the last P·V of this one (with two key tiles, a tile alone
  left its first Q Kᵀ, first activation and last P·V exposed). With ``pingpong`` the two warpgroups also
  take turns issuing those matmuls (named barriers, FA3's scheme), so one's activation runs under the
  other's matmuls. The activation forms fold the scale into their constants, and in bf16 gelu_tanh and
  silu run two scores per instruction on bf16x2 registers, their last step writing P straight into the P·V
  operand (``activation_math.forward_form``).
No softmax: no running max, no rescale of O, no row sums. Keys past Nk read as zeros (TMA fills them), and with
``mask_keys`` (Nk not a multiple of the key tile, and every varlen sample) the last key tile's padded columns are
selected to P = 0, so a non-finite query cannot leak NaN from them; that ragged tile is the first a query tile
computes (the others follow in order), so it is the only one whose scores pay the select. The epilogue scales O
once, writes it to shared memory and stores it by TMA, which clips rows past Nq, the copy draining while the next
tile computes: each warpgroup its own 64 rows with ``split_store`` (neither waits for the other), else one copy of
the tile. With ``o_from_registers`` (head dims past 128, where shared memory has no room for an O tile) each
thread stores its accumulator values straight to global memory, rows past Nq predicated off.
With ``causal`` (Nk - Nq a whole number of 128-key tiles, Nk >= Nq; in a varlen batch in every sample) a query
tile computes only the key tiles up to its diagonal, the diagonal one first: it is the only one whose scores are
masked (key c of the tile kept for row r iff c <= r; that mask also drops keys past Nk), and the query tiles run
last-first, so the longest start first; the launcher's grid, coprime with the query tiles per head
(``persistent_grid``), hands every CTA each query tile position in turn.
With ``band`` (varlen; the causal mask at any Nk - Nq, sliding windows) key j is kept for query i of a sample iff
``-left <= j - i - (Nk - Nq) <= right``, the bounds runtime values: a query tile computes only the key tiles its
band reaches, in order, every step masked (the band's edges may cross any of them; a tile the band misses runs one
masked step, O = 0), and the query tiles run last-first as under ``causal``.
With ``varlen`` the tiles are (query tile, head, sample) of a varlen batch, samples in the order ``rows`` gives
(longest first), each side's rows of a sample read through a TMA descriptor bounded at the sample's end
(``ragged_rows``), so its ragged last tiles read zeros and its O stores are clipped there (or, from the
registers, predicated off past it); query tiles past a sample's length are skipped, and those of samples without
keys are stored as zeros after the main loop.
"""

from __future__ import annotations

from collections.abc import Callable

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from .activation_math import PackedForm, fma_bf16x2, pack_bf16x2, tanh_bf16x2
from .ragged_rows import ragged, sample_rows
from .wgmma import fresh_gemm, operand_a_like, store_operand_a

# wgmma's M per warpgroup
_WG_ROWS = 64
_WG_THREADS = 128

@cute.jit
def _tile_coords(tile: cutlass.Int32, num_m: cutlass.Int32, num_q_heads: cutlass.Int32, group: cutlass.Int32):
    """(query tile, query head, kv head, sample) of a tile index; query tiles fastest, so the tiles of one
    head run together and share its K/V in L2; query head h reads kv head h // group (GQA)."""
    h = tile // num_m % num_q_heads
    return tile % num_m, h, h // group, tile // num_m // num_q_heads


def _tma_part(atom, s, g):
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2))


class GdpaFwdSm90:
    """Compile-time parameters: element type, head dims of Q/K and of V/O, the activation's forward form
    (``activation_math.forward_form``: an fp32 form per score, or a PackedForm on bf16x2 pairs), key tile,
    number of K/V stages, and the schedule: ping-pong, split O stores, the mask of keys past Nk."""

    def __init__(
        self, dtype, head_dim: int, head_dim_v: int, activation: Callable | PackedForm, tile_n: int = 128,
        kv_stages: int = 2, pingpong: bool = True, split_store: bool = False, mask_keys: bool = True,
        q_stages: int = 2, o_from_registers: bool = False, varlen: bool = False, causal: bool = False,
        band: bool = False, score_offset: bool = False, score_bias: bool = False,
    ):
        self.dtype = dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v
        self.activation = activation
        # a packed form gives act(scale · x) / (scale / 2): O takes the factor once
        self.packed = isinstance(activation, PackedForm)
        self.num_mma_wg = 2
        self.tile_m = _WG_ROWS * self.num_mma_wg
        self.tile_n = tile_n
        self.kv_stages = kv_stages
        # two Q stages: the next query tile's Q loads while this one's last Q Kᵀ still reads its stage (one
        # where two do not fit: D = 256)
        self.q_stages = q_stages
        # O stored straight from the accumulator registers (rows past Nq predicated off), where shared memory
        # has no room for an O tile
        self.o_from_registers = o_from_registers
        # per-sample rows (``varlen``): each side's rows of sample z start at its own row and run its own length,
        # read through ragged TMA descriptors (``ragged_rows``); O is stored by TMA, which clips the sample's end,
        # or from the registers with the rows past it predicated off
        self.varlen = varlen
        self.pingpong = pingpong
        # each consumer warpgroup stores its own 64 rows of O (neither waits for the other at the tile's end),
        # or both store one 128-row tile together
        self.split_store = split_store
        # keys past Nk (Nk not a multiple of the key tile) masked to P = 0 in the ragged last key tile, which each
        # query tile computes first (``_key_tile_at``); without it no step pays the select
        self.mask_keys = mask_keys
        # bottom-right aligned causal mask, on the diagonal key tile only: it needs that tile to hold the diagonal
        # of the whole query tile (key tiles as tall as query tiles, Nk - Nq a multiple of them; varlen: in every
        # sample)
        assert not (causal and tile_n != self.tile_m), "causal: 128-key tiles"
        self.causal = causal
        # a band around each varlen sample's diagonal, bounds given at run time: every step masked, so it needs no
        # alignment of the diagonal with the tiles
        assert not band or (varlen and not causal), "a band: varlen batches, in place of the aligned causal mask"
        self.band = band
        # a bias constant over the scores (one element, read by the kernel): act(scale · S + bias), folded into the
        # fp32 forms' first product (the packed forms round the shifted score to bf16 first, which cancels in
        # 1 + tanh(u) where a negative bias moves the scores: the launcher gives a bias the fp32 forms)
        assert not (score_offset and self.packed), "a bias: the fp32 forms"
        self.score_offset = score_offset
        # a bias over the scores' rows and columns (relative-position or ALiBi-like, one per head and sample or
        # broadcast over either), in the operands' dtype: each thread reads its own scores' values from global
        # memory, two to a 32-bit load, once the step's scores are in (``_load_bias``), and the fp32 forms take each
        # into their first product as the one-element bias; in a varlen batch it is indexed by the positions within
        # each sample (HSTU's relative bias over a jagged or padded batch)
        assert not (score_bias and (self.packed or score_offset)), "a bias tensor: fp32 forms"
        self.score_bias = score_bias
        # whether a query tile's first step is masked (and so comes first: ``_key_tile_at``)
        self.masks_first_step = mask_keys or causal or band
        self.threads = _WG_THREADS * (self.num_mma_wg + 1)
        # the producer keeps 24 registers so the consumers can take 240 (24·128 + 240·256 <= 64K)
        self.regs_producer = 24
        self.regs_consumer = 240
        # the O store's named barrier: one per consumer warpgroup with split stores (ids 1, 2)
        self.store_barrier_base = 1
        # one named barrier per consumer warpgroup: its turn to issue matmuls (ping-pong)
        self.schedule_barrier_base = 3

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
        offset: cute.Tensor | None = None,
        mBias: cute.Tensor | None = None,
    ):
        """mQ: (Nq, D, H, Z); mK: (Nk, D, Hkv, Z); mV: (Nk, Dv, Hkv, Z); mO: (Nq, Dv, H, Z); D, Dv contiguous.
        ``num_ctas``: the persistent grid (at most the number of tiles; one CTA per SM fits).
        Varlen: ``rows`` (5, B) int32, per sample in the order the tiles visit them: first query row, query
        count, first key row, key count, and the sample's index z; each side's Z is 1 (jagged rows) or B (a
        dense side: rows counted within sample z's own block; 1 for a block all samples share). ``num_m``:
        query tiles of the longest sample. ``band_left``, ``band_right``: the band's bounds (``band``). ``offset``: the
        one-element bias (``score_offset``) in fp32. ``mBias``: the bias tensor (``score_bias``), its 16-bit values
        seen as int32 pairs: (Nq, Nk / 2, Hb, Zb) with the pairs contiguous, Hb 1 or H, Zb 1 or Z."""
        # V as (Dv, N, Hkv, Z): the B operand of P·V, contiguous along its N mode (Dv)
        v = cute.make_tensor(
            mV.iterator,
            cute.make_layout((mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
                             stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3])),
        )
        q, k, o = mQ, mK, mO
        if cutlass.const_expr(self.varlen):
            q, k, o, v = ragged(q, 0), ragged(k, 0), ragged(o, 0), ragged(v, 1)
        d, dv = self.head_dim, self.head_dim_v
        q_smem = sm90_utils.make_smem_layout_a(
            LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_n, d), self.dtype, self.q_stages
        )
        self.o_rows = _WG_ROWS if self.split_store else self.tile_m
        o_smem = sm90_utils.make_smem_layout_a(
            LayoutEnum.ROW_MAJOR, (self.o_rows, self.tile_n, dv), self.dtype, self.tile_m // self.o_rows
        )
        k_smem = sm90_utils.make_smem_layout_b(
            LayoutEnum.ROW_MAJOR, (self.tile_m, self.tile_n, d), self.dtype, self.kv_stages
        )
        v_smem = sm90_utils.make_smem_layout_b(
            LayoutEnum.COL_MAJOR, (self.tile_m, dv, self.tile_n), self.dtype, self.kv_stages
        )
        q_tile = cute.slice_(q_smem, (None, None, 0))
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tq = cpasync.make_tiled_tma_atom(load, q, q_tile, (self.tile_m, d))
        tma_k, tk = cpasync.make_tiled_tma_atom(load, k, cute.slice_(k_smem, (None, None, 0)), (self.tile_n, d))
        tma_v, tv = cpasync.make_tiled_tma_atom(load, v, cute.slice_(v_smem, (None, None, 0)), (dv, self.tile_n))
        tma_o, to = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), o, cute.slice_(o_smem, (None, None, 0)), (self.o_rows, dv)
        )
        self.q_bytes = cute.size_in_bytes(self.dtype, q_tile)
        self.k_bytes = cute.size_in_bytes(self.dtype, cute.slice_(k_smem, (None, None, 0)))
        self.v_bytes = cute.size_in_bytes(self.dtype, cute.slice_(v_smem, (None, None, 0)))

        @cute.struct
        class OperandStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            k_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            v_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(k_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(v_smem)], 1024]

        @cute.struct
        class SharedStorage:
            operands: OperandStorage
            sO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(o_smem)], 1024]

        self.shared_storage = OperandStorage if self.o_from_registers else SharedStorage
        if cutlass.const_expr(not self.varlen):
            num_m = cute.ceil_div(q.shape[0], self.tile_m)
        self.kernel(
            tma_q, tq, tma_k, tk, tma_v, tv, tma_o, o if self.o_from_registers else to,
            scale, post_scale, slope, q_smem, k_smem, v_smem, o_smem, num_m, q.shape[2], q.shape[2] // k.shape[2],
            rows, band_left, band_right, offset, mBias,
        ).launch(
            grid=[num_ctas, 1, 1],
            block=[self.threads, 1, 1],
            smem=self.shared_storage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        tma_o: cute.CopyAtom,
        mO: cute.Tensor,
        scale: cutlass.Float32,
        post_scale: cutlass.Float32,
        slope: cutlass.Float32,
        q_smem: cute.ComposedLayout,
        k_smem: cute.ComposedLayout,
        v_smem: cute.ComposedLayout,
        o_smem: cute.ComposedLayout,
        num_m: cutlass.Int32,
        num_q_heads: cutlass.Int32,
        group: cutlass.Int32,
        rows: cute.Tensor | None,
        band_left: cutlass.Int32 | None,
        band_right: cutlass.Int32 | None,
        offset: cute.Tensor | None,
        mBias: cute.Tensor | None,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        d, dv = self.head_dim, self.head_dim_v
        nq, nk = mQ.shape[0], mK.shape[0]
        num_tiles = num_m * num_q_heads * mQ.shape[3]
        if cutlass.const_expr(self.varlen):
            num_tiles = num_m * num_q_heads * rows.shape[1]
        n_tiles = cute.ceil_div(nk, self.tile_n)
        work = (num_tiles, num_ctas, num_m, num_q_heads, group, rows, nq, nk, (band_left, band_right))

        storage = SmemAllocator().allocate(self.shared_storage)
        sO = None
        if cutlass.const_expr(not self.o_from_registers):
            sO = storage.sO.get_tensor(o_smem.outer, swizzle=o_smem.inner)
            storage = storage.operands
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * _WG_THREADS // 32)
        q_producer, q_consumer = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.q_mbar.data_ptr(), num_stages=self.q_stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=self.q_bytes, defer_sync=True,
        ).make_participants()
        # K and V in separate rings: the consumers take K_{j+1} before V_j
        k_producer, k_consumer = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.k_mbar.data_ptr(), num_stages=self.kv_stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=self.k_bytes, defer_sync=True,
        ).make_participants()
        v_producer, v_consumer = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.v_mbar.data_ptr(), num_stages=self.kv_stages, producer_group=one_thread,
            consumer_group=consumer_warps, tx_count=self.v_bytes, defer_sync=True,
        ).make_participants()

        sQ = storage.sQ.get_tensor(q_smem.outer, swizzle=q_smem.inner)
        sK = storage.sK.get_tensor(k_smem.outer, swizzle=k_smem.inner)
        sV = storage.sV.get_tensor(v_smem.outer, swizzle=v_smem.inner)

        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1, 1), is_relaxed=True)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1, 1))

        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // _WG_THREADS)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp_idx == 0:
                cpasync.prefetch_descriptor(tma_q)
                cpasync.prefetch_descriptor(tma_k)
                cpasync.prefetch_descriptor(tma_v)
                for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                    m_blk, h, hk, z, q0, nq_z, k0, nk_z = self._work(tile, work)
                    if self._has_rows(m_blk, nq_z, nk_z):
                        gQ = self._rows_of(mQ, h, z, q0, nq_z, 0)
                        gK = self._rows_of(mK, hk, z, k0, nk_z, 0)
                        gV = self._rows_of(mV, hk, z, k0, nk_z, 1)
                        tQsQ, tQgQ = _tma_part(tma_q, sQ, cute.local_tile(gQ, (self.tile_m, d), (None, 0)))
                        tKsK, tKgK = _tma_part(tma_k, sK, cute.local_tile(gK, (self.tile_n, d), (None, 0)))
                        tVsV, tVgV = _tma_part(tma_v, sV, cute.local_tile(gV, (dv, self.tile_n), (0, None)))
                        handle = q_producer.acquire_and_advance()
                        cute.copy(tma_q, tQgQ[(None, m_blk)], tQsQ[(None, handle.index)], tma_bar_ptr=handle.barrier)
                        first_kt, n_tiles_z = self._key_tiles(n_tiles, nk_z, m_blk, nq_z, work)
                        for j in cutlass.range(n_tiles_z, unroll=1):
                            jk = self._key_tile_at(j, n_tiles_z, first_kt)
                            handle = k_producer.acquire_and_advance()
                            cute.copy(tma_k, tKgK[(None, jk)], tKsK[(None, handle.index)], tma_bar_ptr=handle.barrier)
                            handle = v_producer.acquire_and_advance()
                            cute.copy(tma_v, tVgV[(None, jk)], tVsV[(None, handle.index)], tma_bar_ptr=handle.barrier)
        else:
            cute.arch.setmaxregister_increase(self.regs_consumer)
            qk_mma, pv_mma = self._tiled_mmas()
            ctid = tidx - _WG_THREADS
            qk_thr = qk_mma.get_slice(ctid)
            pv_thr = pv_mma.get_slice(ctid)
            # shared-memory operands through the warpgroup's first thread (a warp-uniform index: their descriptors
            # stay in uniform registers, as in the backward)
            wg_tid = (wg_idx - 1) * _WG_THREADS
            qk_wg, pv_wg = qk_mma.get_slice(wg_tid), pv_mma.get_slice(wg_tid)
            tSrQ = qk_wg.make_fragment_A(qk_wg.partition_A(sQ))
            tSrK = qk_wg.make_fragment_B(qk_wg.partition_B(sK))
            tOrV = pv_wg.make_fragment_B(pv_wg.partition_B(sV))
            acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((self.tile_m, dv)))
            s_shape = qk_thr.partition_shape_C((self.tile_m, self.tile_n))
            tScS = qk_thr.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
            tOsO_mma = None
            if cutlass.const_expr(self.o_from_registers):
                tOsO_mma = pv_thr
            elif cutlass.const_expr(self.split_store):
                o_thr = self._tiled_mma_pv(1).get_slice(ctid % _WG_THREADS)
                tOsO_mma = o_thr.partition_C(sO[None, None, wg_idx - 1])
            else:
                tOsO_mma = pv_thr.partition_C(sO[None, None, 0])
            o_scale = post_scale
            consts = None
            if cutlass.const_expr(self.packed):
                o_scale = post_scale * (0.5 * scale)
                consts = self.activation.constants(scale)
            acc_s = qk_thr.make_fragment_C(s_shape)
            r_p = operand_a_like(acc_s, pv_mma, self.dtype)
            # packed forms: x and tanh(u) per pair of scores, held until P_j V_j has read P_j
            pairs = cute.make_rmem_tensor((cute.size(acc_s) // 2, 2), cutlass.Int32)
            # a bias tensor: the step's values, two to a register (read before its matmuls were issued, they made
            # ptxas spill ~550 bytes)
            bias_regs = None
            if cutlass.const_expr(self.score_bias):
                bias_regs = cute.make_rmem_tensor((cute.size(acc_s) // 2,), cutlass.Int32)

            first = self._next_busy(bidx, work)
            if self._has_work(first, num_tiles):
                if cutlass.const_expr(self.pingpong):
                    # the first consumer warpgroup takes the first turn
                    if wg_idx == 1:
                        cute.arch.barrier_arrive(
                            barrier_id=self.schedule_barrier_base, number_of_threads=2 * _WG_THREADS
                        )
                # The steps run across query tiles: S_0 of the next tile is issued with the last P·V of this one,
                # so its activation runs under that matmul (with two key tiles, a tile alone left the first Q Kᵀ,
                # the first activation and the last P·V exposed). Here, S_0 of this CTA's first tile.
                q_handle = q_consumer.wait_and_advance()
                k_handle = k_consumer.wait_and_advance()
                warpgroup.fence()
                fresh_gemm(
                    qk_mma, acc_s, tSrQ[None, None, None, q_handle.index], tSrK[None, None, None, k_handle.index],
                    False,
                )
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                k_handle.release()
                self._load_bias(bias_regs, mBias, tScS, first, 0, work, self.masks_first_step)
                self._activate(acc_s, pairs, tScS, self._first_limit(first, work), scale, slope, consts, offset,
                               bias_regs)
                self._write_p(acc_s, pairs, r_p)
                for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
                    m_blk, h, _, z, q0, nq_z, _, nk_z = self._work(tile, work)
                    if self._has_rows(m_blk, nq_z, nk_z):
                        first_kt, n_tiles_z = self._key_tiles(n_tiles, nk_z, m_blk, nq_z, work)
                        acc_o.fill(0.0)
                        rQ = tSrQ[None, None, None, q_handle.index]
                        # step j: S_{j+1} = Q K_{j+1}ᵀ and O += P_j V_j issued back to back, act(S_{j+1}) under
                        # P_j V_j; only the first key tile (the ragged one) is masked, so these steps are not (but
                        # in a band)
                        for j in cutlass.range(n_tiles_z - 1, unroll=1):
                            k_handle = k_consumer.wait_and_advance()
                            v_consumer, v_handle = self._issue_pair(
                                v_consumer, qk_mma, pv_mma, acc_s, acc_o, r_p, rQ,
                                tSrK[None, None, None, k_handle.index], tOrV, wg_idx,
                            )
                            warpgroup.wait_group(1)
                            k_handle.release()
                            limit = self._step_limit(m_blk, first_kt + j + 1, nq_z, nk_z, work)
                            self._load_bias(bias_regs, mBias, tScS, tile, j + 1, work, self.band)
                            self._activate(acc_s, pairs, tScS, limit, scale, slope, consts, offset, bias_regs)
                            warpgroup.wait_group(0)
                            v_handle.release()
                            self._write_p(acc_s, pairs, r_p)
                        # every Q Kᵀ of this tile is done: the producer may load the tile after next's Q
                        q_handle.release()
                        # the last P·V with S_0 of the next query tile. Past the last tile that Q Kᵀ still runs, on
                        # the last Q and K tiles (nothing loads over them any more): a conditional matmul would keep
                        # the old scores alive through this step (registers).
                        following = self._next_busy(tile + num_ctas, work)
                        has_next = following < num_tiles
                        if has_next:
                            q_handle = q_consumer.wait_and_advance()
                            k_handle = k_consumer.wait_and_advance()
                        v_consumer, v_handle = self._issue_pair(
                            v_consumer, qk_mma, pv_mma, acc_s, acc_o, r_p, tSrQ[None, None, None, q_handle.index],
                            tSrK[None, None, None, k_handle.index], tOrV, wg_idx,
                        )
                        warpgroup.wait_group(1)
                        if has_next:
                            k_handle.release()
                        self._load_bias(bias_regs, mBias, tScS, following, 0, work, self.masks_first_step)
                        self._activate(acc_s, pairs, tScS, self._first_limit(following, work), scale, slope, consts,
                                       offset, bias_regs)
                        warpgroup.wait_group(0)
                        v_handle.release()
                        self._write_p(acc_s, pairs, r_p)
                        r_o = cute.make_fragment_like(acc_o, self.dtype)
                        r_o.store((acc_o.load() * o_scale).to(self.dtype))
                        gO = self._rows_of(mO, h, z, q0, nq_z, 0)
                        if cutlass.const_expr(self.o_from_registers):
                            self._store_o_from_registers(r_o, tOsO_mma, gO, m_blk, nq_z)
                        else:
                            self._store_o(r_o, tOsO_mma, tma_o, sO, gO, m_blk, warp_idx, wg_idx)
            if cutlass.const_expr(self.varlen):
                self._store_keyless_tiles(acc_o, tOsO_mma, tma_o, sO, mO, work, warp_idx, wg_idx)
            if warp_idx % 4 == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _work(self, tile: cutlass.Int32, work: tuple):
        """(query tile, query head, kv head, sample, first query row, query count, first key row, key count)
        of a tile index: the rows from ``rows`` by the tile's rank (varlen), else every sample's whole tensor."""
        num_tiles, num_ctas, num_m, num_q_heads, group, rows, nq, nk, _ = work
        m_blk, h, hk, z = _tile_coords(tile, num_m, num_q_heads, group)
        m_blk = self._query_tile(m_blk, num_m)
        q0, k0 = 0, 0
        if cutlass.const_expr(self.varlen):
            rank = z
            q0, nq, k0, nk, z = rows[0, rank], rows[1, rank], rows[2, rank], rows[3, rank], rows[4, rank]
        return m_blk, h, hk, z, q0, nq, k0, nk

    @cute.jit
    def _query_tile(self, position: cutlass.Int32, num_m: cutlass.Int32):
        """The query tile at ``position`` of a head's ``num_m``: in order, or with ``causal`` last-first (the
        query tiles with the most key tiles first; in a varlen batch the positions of tiles past a shorter sample's
        end come first, and are skipped)."""
        if cutlass.const_expr(self.causal or self.band):
            return num_m - 1 - position
        return position

    @cute.jit
    def _has_rows(self, m_blk: cutlass.Int32, nq: cutlass.Int32, nk: cutlass.Int32):
        """Whether query tile ``m_blk`` of a sample of ``nq`` queries and ``nk`` keys runs through the main loop
        (always, but in varlen batches: not past the sample's queries, nor without keys, whose O tiles are
        stored as zeros after it: a K/V tile wholly past its sample's end is no TMA load)."""
        if cutlass.const_expr(not self.varlen):
            return True
        return (m_blk * self.tile_m < nq) & (nk > 0)

    @cute.jit
    def _has_work(self, tile: cutlass.Int32, num_tiles: cutlass.Int32):
        """Whether this CTA has a tile at all (in a dense batch every CTA has one: the grid is at most the tiles)."""
        if cutlass.const_expr(not self.varlen):
            return True
        return tile < num_tiles

    @cute.jit
    def _next_busy(self, tile: cutlass.Int32, work: tuple):
        """The first of ``tile``, ``tile`` + the grid, ... that runs through the main loop (``_has_rows``), or the
        tile count."""
        if cutlass.const_expr(not self.varlen):
            return tile
        num_tiles, num_ctas, num_m, num_q_heads, group, rows, nq, nk, _ = work
        last_rank = rows.shape[1] - 1
        t = tile
        empty = t < num_tiles
        while empty:
            rank = cutlass.min(t // num_m // num_q_heads, last_rank)
            empty = (t < num_tiles) & (
                (self._query_tile(t % num_m, num_m) * self.tile_m >= rows[1, rank]) | (rows[3, rank] == 0)
            )
            if empty:
                t = t + num_ctas
        return t

    @cute.jit
    def _key_tiles(self, n_tiles: cutlass.Int32, nk: cutlass.Int32, m_blk: cutlass.Int32, nq: cutlass.Int32,
                   work: tuple):
        """(first, count) of the key tiles query tile ``m_blk`` of a sample of ``nq`` queries and ``nk`` keys
        computes: all ``n_tiles`` in a dense batch, up to its diagonal one with ``causal``; at least one in a varlen
        batch, so a sample without keys still runs one (fully masked: O = 0); with ``band`` those its band reaches
        (``_band_tiles``)."""
        if cutlass.const_expr(self.band):
            return self._band_tiles(m_blk, nq, nk, work[8])
        if cutlass.const_expr(self.causal):
            return 0, m_blk + (nk - nq) // self.tile_n + 1
        if cutlass.const_expr(not self.varlen):
            return 0, n_tiles
        return 0, cutlass.max(cute.ceil_div(nk, self.tile_n), 1)

    def _band_tiles(self, m_blk, nq, nk, band: tuple):
        """(first, count) of the key tiles that the band (``band``: its left and right bounds) of query tile
        ``m_blk`` reaches in a sample of ``nq`` queries and ``nk`` > 0 keys: from the tile of the first row's first
        kept key to that of the last row's last, at least one (a band that misses every key runs one masked step
        on a tile of the sample)."""
        left, right = band
        row0 = m_blk * self.tile_m
        lo = cutlass.max(row0 + (nk - nq) - left, 0)
        hi = cutlass.min(row0 + self.tile_m - 1 + (nk - nq) + right, nk - 1)
        first = cutlass.min(lo // self.tile_n, cute.ceil_div(nk, self.tile_n) - 1)
        return first, cutlass.max(cutlass.max(hi, 0) // self.tile_n - first + 1, 1)

    def _band_limit(self, m_blk, n_blk, nq, nk, band: tuple):
        """What ``_kept`` tests on key tile ``n_blk`` of query tile ``m_blk`` in a band: (keys of the tile within
        the sample, then the least and the greatest column - row a kept score has), as key j = n0 + c is kept for
        query i = m0 + r iff -left <= j - i - (nk - nq) <= right."""
        left, right = band
        shift = n_blk * self.tile_n - m_blk * self.tile_m - (nk - nq)
        return nk - n_blk * self.tile_n, 0 - left - shift, right - shift

    def _step_limit(self, m_blk, n_blk, nq, nk, work: tuple):
        """The mask of a step after a query tile's first: none (those steps are whole key tiles), or in a band its
        tile's (``_band_limit``)."""
        if self.band:
            return self._band_limit(m_blk, n_blk, nq, nk, work[8])
        return None

    @cute.jit
    def _key_tile_at(self, j: cutlass.Int32, n_tiles: cutlass.Int32, first: cutlass.Int32):
        """The key tile of step ``j`` of ``n_tiles``: with ``mask_keys`` the ragged last tile first (``causal``: the
        diagonal one), then the others in order, so that only the first step's scores are masked; with ``band`` in
        order from ``first``; else in order."""
        if cutlass.const_expr(self.band):
            return first + j
        if cutlass.const_expr(not self.masks_first_step):
            return j
        return (j + n_tiles - 1) % n_tiles

    @cute.jit
    def _first_limit(self, tile: cutlass.Int32, work: tuple):
        """Keys in range in the first key tile ``tile`` computes, the ragged last one (``_key_tile_at``; a tile
        index past the last reads the last sample; unused by the causal mask); with ``band`` that tile's
        ``_band_limit``."""
        num_tiles, num_ctas, num_m, num_q_heads, group, rows, nq, nk, band = work
        if cutlass.const_expr(self.band):
            m_blk, _, _, _, _, nq_z, _, nk_z = self._work(cutlass.min(tile, num_tiles - 1), work)
            first, _ = self._band_tiles(m_blk, nq_z, nk_z, band)
            return self._band_limit(m_blk, first, nq_z, nk_z, band)
        n_tiles = cute.ceil_div(nk, self.tile_n)
        if cutlass.const_expr(self.varlen):
            nk = rows[3, cutlass.min(tile // num_m // num_q_heads, rows.shape[1] - 1)]
            n_tiles = cutlass.max(cute.ceil_div(nk, self.tile_n), 1)
        return nk - (n_tiles - 1) * self.tile_n

    @cute.jit
    def _rows_of(self, m: cute.Tensor, h: cutlass.Int32, z: cutlass.Int32, start: cutlass.Int32,
                 length: cutlass.Int32, row_mode: int):
        """The (rows, D) or (D, rows) (``row_mode``) tensor of head ``h``, sample ``z``: the sample's ``length``
        rows from ``start`` through the ragged descriptor (varlen: a side of one block has Z = 1, and every
        sample reads it), else the dense tensor's."""
        if cutlass.const_expr(not self.varlen):
            return m[None, None, h, z]
        return sample_rows(m, h, z, start, length, row_mode)

    @cute.jit
    def _store_keyless_tiles(self, acc_o, tOsO_mma, tma_o, sO, mO, work: tuple, warp_idx, wg_idx):
        """Varlen: O = 0 into this CTA's query tiles of samples without keys (the main loop skips them)."""
        num_tiles, num_ctas, num_m, num_q_heads, group, rows, nq, nk, _ = work
        bidx, _, _ = cute.arch.block_idx()
        r_o = cute.make_fragment_like(acc_o, self.dtype)
        r_o.fill(0.0)
        for tile in cutlass.range(bidx, num_tiles, num_ctas, unroll=1):
            m_blk, h, _, z, q0, nq_z, _, nk_z = self._work(tile, work)
            if (m_blk * self.tile_m < nq_z) & (nk_z == 0):
                gO = self._rows_of(mO, h, z, q0, nq_z, 0)
                if cutlass.const_expr(self.o_from_registers):
                    self._store_o_from_registers(r_o, tOsO_mma, gO, m_blk, nq_z)
                else:
                    self._store_o(r_o, tOsO_mma, tma_o, sO, gO, m_blk, warp_idx, wg_idx)

    @cute.jit
    def _store_o(self, r_o, tOsO_mma, tma_o, sO, gO, m_blk, warp_idx, wg_idx):
        """O into shared memory once the previous TMA store has read it, then one TMA store, left to drain while
        the next tile computes: per warpgroup of its 64 rows (``split_store``), or of the whole tile. ``gO``: the
        (rows, Dv) tensor of the tile's head and sample."""
        dv = self.head_dim_v
        barrier, threads, stage, tile, issuer = (
            self.store_barrier_base, self.num_mma_wg * _WG_THREADS, 0, m_blk, warp_idx == _WG_THREADS // 32
        )
        if cutlass.const_expr(self.split_store):
            stage = wg_idx - 1
            barrier, threads, tile, issuer = (
                self.store_barrier_base + stage, _WG_THREADS, m_blk * self.num_mma_wg + stage, warp_idx % 4 == 0
            )
        if issuer:
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        cute.arch.barrier(barrier_id=barrier, number_of_threads=threads)
        cute.autovec_copy(r_o, tOsO_mma)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=barrier, number_of_threads=threads)
        if issuer:
            tOsO, tOgO = _tma_part(tma_o, sO, cute.local_tile(gO, (self.o_rows, dv), (None, 0)))
            cute.copy(tma_o, tOsO[(None, stage)], tOgO[(None, tile)])
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def _store_o_from_registers(self, r_o, pv_thr, gO, m_blk, nq):
        """O straight from the registers into global memory, rows past the sample's ``nq`` queries (dense: O's
        rows) predicated off. ``gO``: the (rows, Dv) tensor of the tile's head and sample (varlen: seen through the
        ragged descriptor's layout, rows counted from the sample's first)."""
        shape = (self.tile_m, self.head_dim_v)
        tOgO = pv_thr.partition_C(cute.local_tile(gO, shape, (m_blk, 0)))
        tOcO = pv_thr.partition_C(cute.make_identity_tensor(shape))
        if cutlass.const_expr(not self.varlen):
            nq = gO.shape[0]
        valid_rows = nq - m_blk * self.tile_m
        for i in cutlass.range_constexpr(cute.size(r_o)):
            if tOcO[i][0] < valid_rows:
                tOgO[i] = r_o[i]

    @cute.jit
    def _schedule_wait(self, wg_idx):
        """Waits for this consumer warpgroup's turn to issue its matmuls: while one warpgroup's pair runs on
        the tensor cores, the other computes its activation (FA3's ping-pong)."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier(barrier_id=self.schedule_barrier_base + wg_idx - 1, number_of_threads=2 * _WG_THREADS)

    @cute.jit
    def _schedule_pass(self, wg_idx):
        """Hands the turn to the next consumer warpgroup."""
        if cutlass.const_expr(self.pingpong):
            cute.arch.barrier_arrive(
                barrier_id=self.schedule_barrier_base + wg_idx % self.num_mma_wg, number_of_threads=2 * _WG_THREADS
            )

    @cute.jit
    def _issue_pair(self, v_consumer, qk_mma, pv_mma, acc_s, acc_o, r_p, rQ, rK, tOrV, wg_idx):
        """Issues S = Q Kᵀ and O += P V back to back (in this warpgroup's turn under ping-pong); returns the V
        pipeline (its read position moved: the caller rebinds it as a loop-carried local) and V's handle, to
        release once P·V is done."""
        self._schedule_wait(wg_idx)
        warpgroup.fence()
        fresh_gemm(qk_mma, acc_s, rQ, rK, False)
        warpgroup.commit_group()
        v_handle = v_consumer.wait_and_advance()
        fresh_gemm(pv_mma, acc_o, r_p, tOrV[None, None, None, v_handle.index], True)
        warpgroup.commit_group()
        self._schedule_pass(wg_idx)
        return v_consumer, v_handle

    @cute.jit
    def _load_bias(self, bias_regs, mBias, tScS, tile: cutlass.Int32, step: cutlass.Int32, work: tuple, masked: bool):
        """Reads the bias tensor's values of step ``step`` of tile ``tile`` into ``bias_regs``, two neighbouring
        columns to a register (``mBias`` holds the 16-bit values' pairs; a tile index past the last reads the last
        tile: that step's scores are computed, never used), right before the step's activation. Rows past Nq read
        the last row's (their O is never stored); on a masked step (``masked``)
        pairs past Nk read nothing (their P is 0): every read is in range. Nothing without ``score_bias``."""
        if cutlass.const_expr(self.score_bias):
            num_tiles, nk = work[0], work[7]
            m_blk, h, _, z, _, nq_z, _, nk_z = self._work(cutlass.min(tile, num_tiles - 1), work)
            first_kt, n_tiles_z = self._key_tiles(cute.ceil_div(nk, self.tile_n), nk_z, m_blk, nq_z, work)
            row0 = m_blk * self.tile_m
            col0 = self._key_tile_at(step, n_tiles_z, first_kt) * self.tile_n
            pairs = mBias[None, None, h % mBias.shape[2], z % mBias.shape[3]]
            for i in cutlass.range_constexpr(cute.size(bias_regs)):
                coord = tScS[2 * i]
                row, col = cutlass.min(row0 + coord[0], nq_z - 1), col0 + coord[1]
                if cutlass.const_expr(self.varlen):
                    # the tile past the last one may be of a sample without queries
                    row = cutlass.max(row, 0)
                if cutlass.const_expr(masked):
                    bias_regs[i] = cutlass.Int32(0)
                    if col < nk_z:
                        bias_regs[i] = pairs[row, col // 2]
                else:
                    bias_regs[i] = pairs[row, col // 2]

    @cute.jit
    def _activate(self, acc_s, pairs, tScS, limit, scale, slope, consts, offset, bias_regs):
        """P = act(scale · S): in place for an fp32 form; for a packed form, per pair of scores x in bf16x2 and
        tanh(u(x)) into ``pairs`` (``_write_p`` finishes P). With ``mask_keys``, columns at or past ``limit``
        (keys past Nk; None: a full key tile, no select) give P = 0, by a select per score (an ``if`` would
        carry the whole fragment through both branches, and that register pressure makes ptxas serialize every
        wgmma of the kernel); a packed form selects its input, as its act(0) = 0. With ``causal`` the first step's
        mask is the diagonal tile's instead (``_kept``). ``offset``: the one-element bias (``score_offset``, fp32 forms
        only), added in each form's first product (masked scores still give P = 0); read here at each step, not
        held across the loop, where it made the band forward spill. ``bias_regs``: the step's values of the bias
        tensor (``score_bias``, ``_load_bias``), each in its score's first product like the one element."""
        if cutlass.const_expr(self.packed):
            for i in cutlass.range_constexpr(cute.size(acc_s) // 2):
                x0, x1 = acc_s[2 * i], acc_s[2 * i + 1]
                if cutlass.const_expr(self.masks_first_step and limit is not None):
                    x0 = x0 if self._kept(tScS[2 * i], limit) else cutlass.Float32(0.0)
                    x1 = x1 if self._kept(tScS[2 * i + 1], limit) else cutlass.Float32(0.0)
                x = pack_bf16x2(x0, x1)
                pairs[i, 0] = x
                pairs[i, 1] = tanh_bf16x2(self.activation.argument(x, consts))
        else:
            bias = None
            if cutlass.const_expr(self.score_offset):
                bias = offset[0]
            masked = self.masks_first_step and limit is not None
            values = None
            if cutlass.const_expr(self.score_bias):
                values = cute.recast_tensor(bias_regs, self.dtype)
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                if cutlass.const_expr(self.score_bias):
                    bias = cutlass.Float32(values[i])
                p = self.activation(acc_s[i], scale, slope, bias)
                if cutlass.const_expr(masked):
                    p = p if self._kept(tScS[i], limit) else cutlass.Float32(0.0)
                acc_s[i] = p

    @cute.jit
    def _kept(self, coord, limit):
        """Whether the first step keeps the score at tile coordinate (row, column): the columns below ``limit``
        (keys within Nk), or with ``causal`` those on or left of the diagonal (the diagonal key tile sits at the
        query tile's own rows shifted by Nk - Nq, a whole number of tiles; it also drops keys past Nk); with
        ``band``, on every step, the keys within Nk whose column - row is within the band (``_band_limit``)."""
        if cutlass.const_expr(self.band):
            valid, least, greatest = limit
            diff = coord[1] - coord[0]
            return (coord[1] < valid) & (diff >= least) & (diff <= greatest)
        if cutlass.const_expr(self.causal):
            return coord[1] <= coord[0]
        return coord[1] < limit

    @cute.jit
    def _write_p(self, acc_s, pairs, r_p):
        """P into the P·V operand registers once the previous P·V has read them: a conversion of the fp32
        form's values, or a packed form's P = x + x tanh(u), two scores per instruction."""
        if cutlass.const_expr(self.packed):
            # the operand seen through the accumulator's layout, two bf16 per 32-bit register
            r_p32 = cute.recast_tensor(cute.make_tensor(r_p.iterator, acc_s.layout), cutlass.Int32)
            for i in cutlass.range_constexpr(cute.size(acc_s) // 2):
                r_p32[i] = fma_bf16x2(pairs[i, 0], pairs[i, 1], pairs[i, 0])
        else:
            store_operand_a(acc_s, r_p)

    def _tiled_mma_pv(self, warpgroups: int):
        """O += P V with P from registers, ``warpgroups`` consumer warpgroups of 64 rows each."""
        return sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.MN,
            cutlass.Float32, (warpgroups, 1, 1), (_WG_ROWS, self.head_dim_v), warpgroup.OperandSource.RMEM,
        )

    def _tiled_mmas(self):
        """(S = Q Kᵀ from shared memory, O += P V with P from registers), one wgmma atom per consumer
        warpgroup; the matmuls run on fresh atoms (``fresh_gemm``), these give the partitions."""
        qk_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, OperandMajorMode.K, OperandMajorMode.K,
            cutlass.Float32, (self.num_mma_wg, 1, 1), (_WG_ROWS, self.tile_n),
        )
        return qk_mma, self._tiled_mma_pv(self.num_mma_wg)
