"""CuTe-DSL GDPA backward for Hopper (sm_90a) at head dims past 128 (D or Dv of 256).

``GdpaBwdSm90`` keeps each warpgroup's dK and dV of its 64 keys in registers, (D + Dv) / 2 fp32 values a thread:
256 at D = Dv = 256, no room left for the scores. Here the two consumer warpgroups share one 64-key tile and split
every matmul between them instead (flash-attn's hdim-256 layout on Hopper):
- Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: each warpgroup 32 of the 64 queries of a step (wgmma N = 32);
- Pᵀ = act(scale · Sᵀ) and dSᵀ = dPᵀ ∘ act'(scale · Sᵀ) go to shared memory (stmatrix, two stages), since
  the next matmuls need all 64 queries of both;
- dV += Pᵀ dO and dK += dSᵀ Q: each warpgroup half of Dv and of D (both operands from shared memory), so a
  thread keeps (D + Dv) / 4 accumulator values: 128 at D = Dv = 256;
- dQ = dS K (dS read transposed from the same bytes): each warpgroup 64-column chunks of its half of D, handed
  chunk by chunk through its own shared-memory buffer to the dQ warp, which adds each by one TMA reduce-add (in
  fp32 into a buffer the caller casts, or in place in the operands' dtype over short key ranges).
One CTA per (64-key tile, head, sample); the producer warpgroup loads K and V once and Q and dO per query tile by
TMA (dO in one stage where two do not fit: 256/256). Keys and queries past the ends read as zeros and are masked
out of P and dS (the last query tile, and every tile of a CTA whose keys end early, in a masked copy of the loop).
No causal or band mask at these head dims. With ``varlen`` the CTAs are (key tile, head, sample) of a varlen batch,
each side's rows read and written through descriptors bounded at the sample's end (``ragged_rows``), as in
``GdpaBwdSm90``, whose prologue (``kernel``) this class shares.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, warp, warpgroup
from cutlass.memory import SmemAllocator

from .gdpa_bwd_sm90 import _WG_THREADS, GdpaBwdSm90, _smem_layout, _transposed
from .ragged_rows import ragged
from .wgmma import fresh_gemm
from .wide_bwd_plan import WideBwdPlan


class GdpaBwdWideSm90(GdpaBwdSm90):
    """Compile-time parameters: element type, head dims of Q/K and of V/dO (at least one above 128), the
    activation's backward form (``activation_math.BackwardForm``), dQ's sum dtype, varlen or dense, and a bias
    constant over the scores (``GdpaBwdSm90``'s ``score_offset``)."""

    def __init__(self, dtype, head_dim: int, head_dim_v: int, act_form, dq_dtype=cutlass.Float32,
                 varlen: bool = False, score_offset: bool = False):
        self.dtype = dtype
        self.dq_dtype = dq_dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v
        self.act_form = act_form
        self.num_mma_wg = 2
        self.threads = _WG_THREADS * (self.num_mma_wg + 1)
        self.regs_producer = 24
        self.regs_consumer = 240
        self.plan = WideBwdPlan.for_head_dims(head_dim, head_dim_v, dq_dtype.width // 8, dtype.width // 8)
        self.tile_n = self.plan.tile_n
        self.tile_m = self.plan.tile_m
        self.q_stages = self.plan.q_stages
        # both warpgroups' Pᵀ and dSᵀ of a step stored: the matmuls reading them may start (with two stages a
        # warpgroup writes a stage again only after passing the next step's barrier, which the other reaches once
        # its reads of that stage are done)
        self.barrier_pds = 1
        self.barrier_epi = 2
        # per consumer warpgroup: its sdQ buffer free (the dQ warp's copy has read it) / full (a dQ chunk stored)
        self.barrier_dq_empty = 3
        self.barrier_dq_full = self.barrier_dq_empty + self.num_mma_wg
        self.dq_warp = 1
        # with two dQ chunks a warpgroup, the second waits for the dQ warp's copy of the first to free the buffer:
        # handed over at the next step instead, once its Sᵀ and dPᵀ matmuls are issued, it finds the buffer free
        self.defer_last_dq = self.plan.dq_chunks > 1
        self.varlen = varlen
        # no bias tensor (``GdpaBwdSm90``'s ``score_bias``, ``bias_grad``): the launcher keeps such calls off it
        self.score_bias = False
        self.bias_grad = False
        self.causal = False
        self.band = False
        self.dq_pairs = False
        # 64-row query tiles: dQ tiles added by TMA from their shared-memory tiles (``GdpaBwdSm90``'s ``dq_flat``)
        self.dq_flat = False
        self.score_offset = score_offset

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
        stream: cuda.CUstream,
        rows: cute.Tensor | None = None,
        num_n: cutlass.Int32 | None = None,
        offset: cute.Tensor | None = None,
    ):
        """As ``GdpaBwdSm90.__call__`` without a mask, a bias tensor or dQ's last round (``kernel_args.WIDE_BWD_ARGS``;
        ``num_n``: 64-key tiles of the longest sample)."""
        if cutlass.const_expr(self.varlen):
            mQ, mK, mV, mdO, mdQ, mdK, mdV = (ragged(t, 0) for t in (mQ, mK, mV, mdO, mdQ, mdK, mdV))
        d, dv, plan = self.head_dim, self.head_dim_v, self.plan
        half = self.num_mma_wg
        # Q and dO are also dK's and dV's B operands (MN-major), split along D and Dv between the warpgroups; K is
        # dQ's, in chunks of dq_width columns a warpgroup; dK and dV are stored over K and V by halves of D and Dv
        q_smem = _smem_layout(self.dtype, (self.tile_m, d), self.q_stages, d // half)
        do_smem = _smem_layout(self.dtype, (self.tile_m, dv), plan.do_stages, dv // half)
        k_smem = _smem_layout(self.dtype, (self.tile_n, d), 1, plan.dq_width)
        v_smem = _smem_layout(self.dtype, (self.tile_n, dv), 1, dv // half)
        # (keys, queries): Pᵀ of stage s at 2s, dSᵀ at 2s + 1
        pds_smem = _smem_layout(self.dtype, (self.tile_n, self.tile_m), 2 * plan.pds_stages)
        # one buffer per warpgroup, seen together as one (queries, 2 dq_width) tile by the consumers' stores
        dq_smem = _smem_layout(self.dq_dtype, (self.tile_m, plan.dq_width), self.num_mma_wg)
        dq_tile_smem = _smem_layout(self.dq_dtype, (self.tile_m, half * plan.dq_width), 1, plan.dq_width)

        atoms = self._tma_atoms((mQ, mK, mV, mdO, mdQ, mdK, mdV), (q_smem, do_smem, k_smem, v_smem, dq_smem),
                                plan.dq_width)

        @cute.struct
        class SharedStorage:
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            q_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            do_mbar: cute.struct.MemRange[cutlass.Int64, plan.do_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(do_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(k_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(v_smem)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(pds_smem)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[self.dq_dtype, cute.cosize(dq_smem)], 1024]

        self.shared_storage = SharedStorage
        samples = mQ.shape[3]
        if cutlass.const_expr(self.varlen):
            samples = rows.shape[1]
        else:
            num_n = cute.ceil_div(mK.shape[0], self.tile_n)
        self.kernel(
            *atoms, scale, post_scale, slope, q_smem, do_smem, k_smem, v_smem, pds_smem, dq_smem, dq_tile_smem, num_n,
            mQ.shape[2], rows, None, None, offset, None, None, None, None, None, None, None, None,
        ).launch(
            grid=[num_n * mQ.shape[2] * samples, 1, 1],
            block=[self.threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.jit
    def _cta(
        self,
        cta: tuple,
        n_blk: cutlass.Int32,
        h: cutlass.Int32,
        z: cutlass.Int32,
        q0: cutlass.Int32,
        nq: cutlass.Int32,
        k0: cutlass.Int32,
        nk: cutlass.Int32,
        band: tuple,
        biases: tuple,
        rounding: tuple,
    ):
        """The CTA of key tile ``n_blk``, head ``h``, sample ``z`` (``GdpaBwdSm90._cta``'s arguments; ``cta``'s
        dS layout is the Pᵀ/dSᵀ stages here; ``biases`` and ``rounding`` are Nones: no bias tensor, dQ rounded by the
        caller)."""
        (tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_dk, mdK, tma_dv, mdV, tma_dq, mdQ, scale, post_scale, slope,
         q_smem, do_smem, k_smem, v_smem, pds_smem, dq_smem, dq_tile_smem, offset) = cta
        tidx, _, _ = cute.arch.thread_idx()
        d, dv, plan = self.head_dim, self.head_dim_v, self.plan
        num_m = cute.ceil_div(nq, self.tile_m)

        storage = SmemAllocator().allocate(self.shared_storage)
        kv_producer, kv_consumer, q_producer, q_consumer, do_producer, do_consumer, _, _ = self._pipelines(
            storage, plan.do_stages)
        sQ, sdO, sK, sV, sPdS, sdQ, sdQ_tile = self._smem_tensors(
            storage, (q_smem, do_smem, k_smem, v_smem, pds_smem, dq_smem, dq_tile_smem))
        (tQsQ, tQgQ, tdOsdO, tdOgdO, tKsK, tKgK, tVsV, tVgV, tdKsdK, tdKgdK, tdVsdV, tdVgdV, tdQsdQ,
         tdQgdQ) = self._tma_partitions(cta[:14], (sQ, sdO, sK, sV, sdQ), h, z, q0, nq, k0, nk, plan.dq_width)

        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1, 1), is_relaxed=True)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1, 1))

        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // _WG_THREADS)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp_idx == 0:
                self._load_tiles((tma_q, tma_do, tma_k, tma_v, None),
                                 (tQsQ, tQgQ, tdOsdO, tdOgdO, tKsK, tKgK, tVsV, tVgV, None, None),
                                 (kv_producer, q_producer, do_producer, None), n_blk, 0, num_m)
            if warp_idx == self.dq_warp:
                self._add_dq_chunks(tma_dq, tdQsdQ, tdQgdQ, num_m)
        else:
            cute.arch.setmaxregister_increase(self.regs_consumer)
            ctid = tidx - _WG_THREADS
            cwg = wg_idx - 1
            sdp_mma, dk_mma, dv_mma, dq_mma = self._tiled_mmas()
            sdp = sdp_mma.get_slice(ctid)
            dk_thr = dk_mma.get_slice(ctid)
            dv_thr = dv_mma.get_slice(ctid)
            dq = dq_mma.get_slice(ctid)
            sK0 = sK[None, None, 0]
            sV0 = sV[None, None, 0]
            # shared-memory operands through the warpgroup's first thread (uniform descriptors: GdpaBwdSm90._cta)
            wg_tid = cwg * _WG_THREADS
            sdp_wg, dk_wg, dv_wg, dq_wg = (mma.get_slice(wg_tid) for mma in (sdp_mma, dk_mma, dv_mma, dq_mma))
            tSrK = sdp_wg.make_fragment_A(sdp_wg.partition_A(sK0))
            tSrQ = sdp_wg.make_fragment_B(sdp_wg.partition_B(sQ))
            tPrV = sdp_wg.make_fragment_A(sdp_wg.partition_A(sV0))
            tPrdO = sdp_wg.make_fragment_B(sdp_wg.partition_B(sdO))
            tVrP = dv_wg.make_fragment_A(dv_wg.partition_A(sPdS))
            tVrdO = dv_wg.make_fragment_B(dv_wg.partition_B(_transposed(sdO)))
            tKrdS = dk_wg.make_fragment_A(dk_wg.partition_A(sPdS))
            tKrQ = dk_wg.make_fragment_B(dk_wg.partition_B(_transposed(sQ)))
            # dS as dQ's A operand: the (queries, keys) view of the same bytes, M-major
            tQrdS = dq_wg.make_fragment_A(dq_wg.partition_A(_transposed(sPdS)))
            chunk_cols = self.num_mma_wg * plan.dq_width
            tQrK = [
                dq_wg.make_fragment_B(
                    dq_wg.partition_B(cute.local_tile(_transposed(sK0), (chunk_cols, self.tile_n), (c, 0))))
                for c in range(plan.dq_chunks)
            ]
            # Pᵀ and dSᵀ registers to shared memory by stmatrix, in the (keys, queries) layout they were computed in
            pds_copy = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype), sdp_mma
            )
            pds_thr = pds_copy.get_slice(ctid)
            tPsPdS = pds_thr.partition_D(sPdS)
            tQsdQ = dq.partition_C(sdQ_tile[None, None, 0])

            acc_dv = dv_thr.make_fragment_C(dv_thr.partition_shape_C((self.tile_n, dv)))
            acc_dk = dk_thr.make_fragment_C(dk_thr.partition_shape_C((self.tile_n, d)))
            acc_dv.fill(0.0)
            acc_dk.fill(0.0)
            st_shape = sdp.partition_shape_C((self.tile_n, self.tile_m))
            # (key, query) of each accumulator value of Sᵀ
            tScS = sdp.partition_C(cute.make_identity_tensor((self.tile_n, self.tile_m)))
            valid_keys = nk - n_blk * self.tile_n
            valid_rows_last = nq - (num_m - 1) * self.tile_m
            ds_scale = scale * post_scale
            if cutlass.const_expr(self.act_form.grad_factor != 1.0):
                ds_scale = ds_scale * self.act_form.grad_factor
            act_grad_offset = self.act_form.grad_offset
            bias = None
            if cutlass.const_expr(self.score_offset):
                bias = offset[0]
            pds_threads = self.num_mma_wg * _WG_THREADS

            # the last dQ chunk of the previous step, handed over during this one (``defer_last_dq``)
            deferred = dq.make_fragment_C(dq.partition_shape_C((self.tile_m, chunk_cols)))
            handed = plan.dq_chunks - 1 if self.defer_last_dq else plan.dq_chunks

            kv_consumer.wait_and_advance()
            # every query tile but the last without the mask's compares and selects where this CTA's keys are all
            # in range
            m_unmasked = num_m - 1 if valid_keys >= self.tile_n else 0
            passes = [(False, 0, m_unmasked), (True, m_unmasked, num_m)]
            for pass_idx in cutlass.range_constexpr(len(passes)):
                masked, m_lo, m_hi = passes[pass_idx]
                for m in cutlass.range(m_lo, m_hi, unroll=1):
                    q_handle = q_consumer.wait_and_advance()
                    acc_s = sdp.make_fragment_C(st_shape)
                    warpgroup.fence()
                    fresh_gemm(sdp_mma, acc_s, tSrK, tSrQ[None, None, None, q_handle.index], False)
                    warpgroup.commit_group()
                    do_handle = do_consumer.wait_and_advance()
                    acc_dp = sdp.make_fragment_C(st_shape)
                    fresh_gemm(sdp_mma, acc_dp, tPrV, tPrdO[None, None, None, do_handle.index], False)
                    warpgroup.commit_group()
                    if cutlass.const_expr(self.defer_last_dq):
                        if m > 0:
                            self._hand_dq(deferred, tQsdQ, ds_scale, cwg)
                    warpgroup.wait_group(1)

                    p_acc = cute.make_rmem_tensor(acc_s.layout, cutlass.Float32)
                    if cutlass.const_expr(masked):
                        # keys past Nk and queries past Nq read as zeros: masked by a select per score, so a
                        # non-finite input cannot reach the sums through them
                        valid_rows = self.tile_m
                        if m == num_m - 1:
                            valid_rows = valid_rows_last
                        for i in cutlass.range_constexpr(cute.size(acc_s)):
                            y, g = self.act_form.fn(acc_s[i], scale, slope, bias)
                            keep = tScS[i][0] < valid_keys and tScS[i][1] < valid_rows
                            p_acc[i] = y if keep else cutlass.Float32(0.0)
                            acc_s[i] = g if keep else cutlass.Float32(0.0 - act_grad_offset)
                    else:
                        for i in cutlass.range_constexpr(cute.size(acc_s)):
                            p_acc[i], acc_s[i] = self.act_form.fn(acc_s[i], scale, slope, bias)
                    stage = m % plan.pds_stages
                    r_p = cute.make_fragment_like(p_acc, self.dtype)
                    r_p.store(p_acc.load().to(self.dtype))
                    cute.copy(pds_copy, pds_thr.retile(r_p), tPsPdS[None, None, None, 2 * stage])

                    warpgroup.wait_group(0)
                    for i in cutlass.range_constexpr(cute.size(acc_dp)):
                        if cutlass.const_expr(act_grad_offset == 1.0):
                            acc_dp[i] = cute.math.fma(acc_dp[i], acc_s[i], acc_dp[i])
                        else:
                            acc_dp[i] = acc_dp[i] * acc_s[i]
                    r_ds = cute.make_fragment_like(acc_dp, self.dtype)
                    r_ds.store(acc_dp.load().to(self.dtype))
                    cute.copy(pds_copy, pds_thr.retile(r_ds), tPsPdS[None, None, None, 2 * stage + 1])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier(barrier_id=self.barrier_pds, number_of_threads=pds_threads)

                    warpgroup.fence()
                    fresh_gemm(dv_mma, acc_dv, tVrP[None, None, None, 2 * stage],
                               tVrdO[None, None, None, do_handle.index], True)
                    warpgroup.commit_group()
                    fresh_gemm(dk_mma, acc_dk, tKrdS[None, None, None, 2 * stage + 1],
                               tKrQ[None, None, None, q_handle.index], True)
                    warpgroup.commit_group()
                    acc_dq = []
                    for c in cutlass.range_constexpr(plan.dq_chunks):
                        acc = deferred
                        if cutlass.const_expr(c < handed):
                            acc = dq.make_fragment_C(dq.partition_shape_C((self.tile_m, chunk_cols)))
                        fresh_gemm(dq_mma, acc, tQrdS[None, None, None, 2 * stage + 1], tQrK[c], False)
                        warpgroup.commit_group()
                        acc_dq.append(acc)
                    warpgroup.wait_group(plan.dq_chunks + 1)
                    do_handle.release()
                    warpgroup.wait_group(plan.dq_chunks)
                    q_handle.release()
                    for c in cutlass.range_constexpr(handed):
                        warpgroup.wait_group(plan.dq_chunks - 1 - c)
                        self._hand_dq(acc_dq[c], tQsdQ, ds_scale, cwg)
                    warpgroup.wait_group(0)

            if cutlass.const_expr(self.defer_last_dq):
                self._hand_dq(deferred, tQsdQ, ds_scale, cwg)

            # each warpgroup's halves of dV and dK
            self._store_dk_dv((acc_dk, dk_thr, sK0, tma_dk, tdKsdK, tdKgdK),
                              (acc_dv, dv_thr, sV0, tma_dv, tdVsdV, tdVgdV), ds_scale, post_scale, n_blk, warp_idx)

    @cute.jit
    def _add_dq_chunks(self, tma_dq: cute.CopyAtom, tdQsdQ: cute.Tensor, tdQgdQ: cute.Tensor, num_m: cutlass.Int32):
        """The dQ warp: per query tile and chunk, frees each warpgroup's sdQ buffer once its previous copy has read
        it, then adds the buffer into dQ (column block 2 c + w of the tile) once the warpgroup has filled it."""
        dq_threads = _WG_THREADS + 32
        halves = self.num_mma_wg
        for m in cutlass.range(0, num_m, unroll=1):
            for c in cutlass.range_constexpr(self.plan.dq_chunks):
                for w in cutlass.range_constexpr(halves):
                    cute.arch.cp_async_bulk_wait_group(halves - 1 - w, read=True)
                    cute.arch.barrier_arrive(barrier_id=self.barrier_dq_empty + w, number_of_threads=dq_threads)
                for w in cutlass.range_constexpr(halves):
                    cute.arch.barrier(barrier_id=self.barrier_dq_full + w, number_of_threads=dq_threads)
                    cute.copy(tma_dq, tdQsdQ[(None, w)], tdQgdQ[(None, m, halves * c + w)])
                    cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)

    def _tiled_mmas(self):
        """Sᵀ/dPᵀ (keys x queries, the queries split between the warpgroups), dK (keys x D) and dV (keys x Dv),
        D and Dv split, dQ (queries x a chunk of 2 dq_width columns, split); every operand from shared memory."""
        k_major, mn_major = OperandMajorMode.K, OperandMajorMode.MN
        split = (1, self.num_mma_wg, 1)
        sdp_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, cutlass.Float32, split,
            (self.tile_n, self.tile_m // self.num_mma_wg),
        )
        dk_mma, dv_mma = (
            sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, k_major, mn_major, cutlass.Float32, split,
                (self.tile_n, width // self.num_mma_wg),
            )
            for width in (self.head_dim, self.head_dim_v)
        )
        dq_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, mn_major, mn_major, cutlass.Float32, split, (self.tile_m, self.plan.dq_width),
        )
        return sdp_mma, dk_mma, dv_mma, dq_mma
