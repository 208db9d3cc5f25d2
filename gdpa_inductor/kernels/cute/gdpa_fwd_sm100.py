"""CuTe-DSL GDPA forward for Blackwell (sm_100a): O = act(scale · Q Kᵀ) · post_scale · V, dense batches.

One CTA per (128-row query tile, head, sample); six warps, each with one role:
- warps 0-3, the activation warps (one query row a thread): per key tile they load S from tensor memory
  (tcgen05.ld), apply the activation's fp32 form (``activation_math``, the scale folded into its first product),
  write P in the operands' dtype back over the first half of S's own columns (tcgen05.st) for the P·V matmul to
  read from tensor memory, and at the end load O from tensor memory, scale it by ``post_scale`` and store it to
  global memory from the registers (rows past Nq predicated off);
- warp 4, the MMA warp: S_j = Q K_jᵀ into one of two S buffers in tensor memory, so that S_{j+1} is computed
  while the activation warps work on S_j, then O += P_j V_j with P from tensor memory (tcgen05 "TS" form);
- warp 5, the load warp: Q once, then K_j and V_j by TMA into two rings of ``kv_stages`` shared-memory stages.
No softmax: no running max, no correction of O, no row sums, so no correction warps. Keys past Nk read as zeros
(TMA fills them); with ``mask_keys`` (Nk not a multiple of the key tile) the padded columns also give P = 0 by a
select per score, so a non-finite query cannot leak NaN through them (with finite queries their scores are 0 and
their values 0, so act(0) · 0 adds nothing even without the mask).

Tensor memory (``tmem_columns``: 512 columns with 128-key tiles, a power of two): S_0 at columns [0, tile_n), S_1 at
[tile_n, 2 tile_n), each holding its P in its first tile_n / 2 columns (16-bit pairs), O at [2 tile_n, 2 tile_n + Dv).
Synchronisation (mbarriers, ``cutlass.pipeline``): Q, K, V full/empty (TMA -> MMA), S full/empty (MMA ->
activation), P full/empty (activation -> MMA), O full (MMA -> epilogue). The MMA warp issues QK_{j+2} into the
buffer of P_j only after PV_j, and tcgen05.mma instructions of one thread run in issue order, so S never
overwrites a P the tensor cores still read.
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


def tmem_columns(tile_n: int, head_dim_v: int) -> int:
    """Tensor-memory columns a CTA allocates: two S buffers and O, rounded up to a power of two (tcgen05.alloc's
    rule; 512 at most)."""
    used = 2 * tile_n + head_dim_v
    return max(32, 1 << (used - 1).bit_length())


def _batched(t: cute.Tensor, swap: bool = False) -> cute.Tensor:
    """(N, D, H, Z) -> (N, D, (H, Z)), or with ``swap`` (D, N, (H, Z)): one batch mode for the TMA atoms."""
    a, b = (1, 0) if swap else (0, 1)
    return cute.make_tensor(
        t.iterator,
        cute.make_layout((t.shape[a], t.shape[b], (t.shape[2], t.shape[3])),
                         stride=(t.stride[a], t.stride[b], (t.stride[2], t.stride[3]))),
    )


class GdpaFwdSm100:
    """Compile-time parameters: element type, head dims of Q/K and of V/O (equal, 64 or 128), the activation's fp32
    forward form (``activation_math.forward_form(name, False)``), key tile, K/V stages, and whether keys past Nk
    are masked (``mask_keys``)."""

    def __init__(self, dtype, head_dim: int, head_dim_v: int, activation: Callable, tile_n: int = 128,
                 kv_stages: int = 2, mask_keys: bool = True):
        assert head_dim == head_dim_v and head_dim in (64, 128), "D = Dv of 64 or 128"
        assert tile_n in (64, 128), "key tiles of 64 or 128"
        self.dtype = dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v
        self.activation = activation
        self.tile_m = _ROWS
        self.tile_n = tile_n
        self.kv_stages = kv_stages
        self.mask_keys = mask_keys
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
        stream: cuda.CUstream,
    ):
        """mQ: (Nq, D, H, Z); mK: (Nk, D, Hkv, Z); mV: (Nk, Dv, Hkv, Z); mO: (Nq, Dv, H, Z); D, Dv contiguous; H a
        multiple of Hkv (query head h reads kv head h // (H / Hkv))."""
        q, k, o = _batched(mQ), _batched(mK), _batched(mO)
        # V as (Dv, N, (Hkv, Z)): the B operand of P·V, contiguous along its N mode (Dv)
        v = _batched(mV, swap=True)
        qk_mma, pv_mma = self._tiled_mmas()
        q_smem = sm100_utils.make_smem_layout_a(qk_mma, self.qk_tiler, self.dtype, 1)
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
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2]
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
        num_m = cute.ceil_div(q.shape[0], self.tile_m)
        self.kernel(
            qk_mma, pv_mma, tma_q, tq, tma_k, tk, tma_v, tv, o, scale, post_scale, slope,
            q_smem, k_smem, p_tmem, v_smem, mQ.shape[2] // mK.shape[2],
        ).launch(
            grid=[num_m, mQ.shape[2], mQ.shape[3]],
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
        group: cutlass.Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_blk, h, z = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        hk = h // group
        nk = mK.shape[0]
        n_tiles = cute.ceil_div(nk, self.tile_n)

        storage = SmemAllocator().allocate(self.shared_storage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        act_threads = pipeline.CooperativeGroup(pipeline.Agent.Thread, _ACT_THREADS)
        q_producer, q_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.q_mbar.data_ptr(), num_stages=1, producer_group=one_thread,
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
            # ---- LOAD: Q once, then K_j and V_j ----
            cpasync.prefetch_descriptor(tma_q)
            cpasync.prefetch_descriptor(tma_k)
            cpasync.prefetch_descriptor(tma_v)
            d, dv = self.head_dim, self.head_dim_v
            # (TMA, RestM, RestK, (H, Z)) and the like: the tiles of every head and sample
            tQsQ, tQgQ = self._tma_part(tma_q, sQ, qk_thr.partition_A(
                cute.flat_divide(mQ, (self.tile_m, d))))
            tKsK, tKgK = self._tma_part(tma_k, sK, qk_thr.partition_B(
                cute.flat_divide(mK, (self.tile_n, d))))
            tVsV, tVgV = self._tma_part(tma_v, sV, pv_thr.partition_B(
                cute.flat_divide(mV, (dv, self.tile_n))))
            handle = q_producer.acquire_and_advance()
            cute.copy(tma_q, tQgQ[None, m_blk, 0, (h, z)], tQsQ[None, handle.index], tma_bar_ptr=handle.barrier)
            for j in cutlass.range(n_tiles, unroll=1):
                handle = k_producer.acquire_and_advance()
                cute.copy(tma_k, tKgK[None, j, 0, (hk, z)], tKsK[None, handle.index], tma_bar_ptr=handle.barrier)
                handle = v_producer.acquire_and_advance()
                cute.copy(tma_v, tVgV[None, 0, j, (hk, z)], tVsV[None, handle.index], tma_bar_ptr=handle.barrier)
            # the MMA warp's last releases land before the CTA exits
            k_producer.tail()
            v_producer.tail()

        if warp_idx == _MMA_WARP:
            # ---- MMA: S_j = Q K_jᵀ, then O += P_{j-1} V_{j-1} ----
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            tSrQ = qk_thr.make_fragment_A(sQ)
            tSrK = qk_thr.make_fragment_B(sK)
            tOrV = pv_thr.make_fragment_B(sV)
            s_layout = qk_thr.make_fragment_C(qk_thr.partition_shape_C(self.qk_tiler[:2])).layout
            tOtO = cute.make_tensor(
                tmem_ptr + self.o_offset, pv_thr.make_fragment_C(pv_thr.partition_shape_C(self.pv_tiler[:2])).layout
            )
            p_layout = pv_thr.make_fragment_A(cute.make_tensor(tmem_ptr, p_tmem.outer))[None, None, None, 0].layout
            # Q stays for the whole CTA: never released
            rQ = tSrQ[None, None, None, q_consumer.wait_and_advance().index]
            qk = (qk_mma, tSrK, s_layout, tmem_ptr)
            pv = (pv_mma, tOrV, tOtO, p_layout, tmem_ptr)
            # the pipelines' positions and the MMAs' accumulate flag change in the helpers: rebound here, as
            # loop-carried locals
            qk_mma, k_consumer, s_producer = self._mma_qk(qk, rQ, k_consumer, s_producer)
            for j in cutlass.range(1, n_tiles, unroll=1):
                qk_mma, k_consumer, s_producer = self._mma_qk((qk_mma, *qk[1:]), rQ, k_consumer, s_producer)
                pv_mma, p_consumer, v_consumer = self._mma_pv((pv_mma, *pv[1:]), j > 1, p_consumer, v_consumer)
            pv_mma, p_consumer, v_consumer = self._mma_pv((pv_mma, *pv[1:]), n_tiles > 1, p_consumer, v_consumer)
            # O complete once every matmul issued so far is (tcgen05.commit tracks them all)
            o_producer.acquire_and_advance().commit()

        if warp_idx < _ACT_WARPS:
            # ---- ACTIVATION: P_j = act(scale · S_j) into tensor memory; then the epilogue ----
            tmem.allocate(self.tmem_columns)
            tmem.relinquish_alloc_permit()
            tmem.wait_for_alloc()
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            s_load, p_store, s_layout, p_layout, tLcS, tLcP = self._score_copies(qk_thr, tmem_ptr, tidx)
            for j in cutlass.range(n_tiles, unroll=1):
                s_handle = s_consumer.wait_and_advance()
                base = tmem_ptr + s_handle.index * self.tile_n
                rS = cute.make_rmem_tensor(tLcS.shape, cutlass.Float32)
                cute.copy(s_load, s_load.partition_S(cute.make_tensor(base, s_layout)), rS)
                cute.arch.fence_view_async_tmem_load()
                self._activate(rS, tLcS, nk - j * self.tile_n, scale, slope)
                rP = cute.make_rmem_tensor(tLcP.shape, cutlass.Float32)
                cute.make_tensor(cute.recast_ptr(rP.iterator, dtype=self.dtype), rS.layout).store(
                    rS.load().to(self.dtype)
                )
                p_handle = p_producer.acquire_and_advance()
                cute.copy(p_store, rP, p_store.partition_D(cute.make_tensor(base, p_layout)))
                cute.arch.fence_view_async_tmem_store()
                p_handle.commit()
                s_handle.release()
            o_handle = o_consumer.wait_and_advance()
            self._store_o(pv_thr, tmem_ptr, mO, m_blk, h, z, post_scale, tidx)
            o_handle.release()
            # the MMA warp's last releases of P (tcgen05.commit) land before the CTA exits
            p_producer.tail()
            # every activation warp has read O: the tensor memory may go
            cute.arch.barrier(barrier_id=_ACT_BARRIER, number_of_threads=_ACT_THREADS)
            tmem.free(tmem_ptr)

    def _tma_part(self, atom, s, g):
        return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 3), cute.group_modes(g, 0, 3))

    def _score_copies(self, qk_thr, tmem_ptr, tidx):
        """The activation warps' tensor-memory copies of a key tile: (S load, P store, S's layout, P's layout seen as
        fp32 columns, the (row, key) coordinates of a thread's S registers and of its P registers). 32x32b copies:
        thread t holds row t, its columns in order (``tests/kernels/test_cute_compile_sm100.py`` checks it)."""
        s_layout = qk_thr.make_fragment_C(qk_thr.partition_shape_C(self.qk_tiler[:2])).layout
        tScS = qk_thr.partition_C(cute.make_identity_tensor(self.qk_tiler[:2]))
        # P's columns seen as fp32: two 16-bit values a column
        p_cols = self.tile_n * self.dtype.width // 32
        p_layout = cute.composition(s_layout, cute.make_layout((self.tile_m, p_cols)))
        tScP = cute.make_tensor(tScS.iterator, cute.composition(tScS.layout, cute.make_layout((self.tile_m, p_cols))))
        s_load = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), cutlass.Float32),
            cute.make_tensor(tmem_ptr, s_layout),
        ).get_slice(tidx)
        p_store = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(p_cols // 2)), cutlass.Float32),
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
    def _activate(self, rS, tLcS, limit, scale, slope):
        """P = act(scale · S) in place; with ``mask_keys``, columns at or past ``limit`` (keys past Nk) give P = 0
        (a select per score: a branch would carry the whole row through both paths)."""
        for i in cutlass.range_constexpr(cute.size(rS)):
            p = self.activation(rS[i], scale, slope, None)
            if cutlass.const_expr(self.mask_keys):
                p = p if tLcS[i][1] < limit else cutlass.Float32(0.0)
            rS[i] = p

    @cute.jit
    def _store_o(self, pv_thr, tmem_ptr, mO, m_blk, h, z, post_scale, tidx):
        """O · post_scale from tensor memory to global memory, ``_EPI_COLUMNS`` columns at a time, each thread its
        own row (rows past Nq predicated off): a 32x32b load gives thread t of the activation warps row t of the
        tile, its columns in order, so each chunk is one contiguous run of the row (16-byte stores)."""
        o_load, tLtO, tLcO = self._o_copy(pv_thr, tmem_ptr, tidx)
        gO = cute.local_tile(mO[None, None, (h, z)], self.pv_tiler[:2], (m_blk, 0))
        valid = mO.shape[0] - m_blk * self.tile_m
        # 16-byte stores: O's rows start 16-byte aligned (the support check's TMA layout rules; the fake tensors leave
        # the strides' divisibility unknown)
        vector = 128 // self.dtype.width
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        for c in cutlass.range_constexpr(self.head_dim_v // _EPI_COLUMNS):
            rO = cute.make_rmem_tensor(tLcO[None, 0, 0, c].shape, cutlass.Float32)
            cute.copy(o_load, tLtO[None, 0, 0, c], rO)
            cute.arch.fence_view_async_tmem_load()
            r_out = cute.make_rmem_tensor(cute.make_layout(_EPI_COLUMNS), self.dtype)
            r_out.store((cute.make_tensor(rO.iterator, cute.make_layout(_EPI_COLUMNS)).load() * post_scale).to(
                self.dtype))
            if tidx < valid:
                row = cute.local_tile(gO, (1, _EPI_COLUMNS), (tidx, c))
                vectors = cute.make_layout((vector, _EPI_COLUMNS // vector))
                start = cute.make_ptr(self.dtype, row.iterator.toint(), cute.AddressSpace.gmem, assumed_align=16)
                cute.copy(store, cute.make_tensor(r_out.iterator, vectors), cute.make_tensor(start, vectors))
