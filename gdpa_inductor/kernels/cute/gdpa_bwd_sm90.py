"""CuTe-DSL GDPA backward for Hopper (sm_90a): dQ, dK, dV of O = post_scale · act(scale · Q Kᵀ) · V.

One CTA per (128-key tile, head, sample), looping over 64-row query tiles; three warpgroups:
- a producer warpgroup that gives its registers away and issues TMA loads: K and V once, then Q and dO
  tiles into two-stage rings;
- two consumer warpgroups, 64 keys each, computing the transposed scores so that P and dS come out of the
  first two matmuls already in the register layout the next ones take as their A operand:
    Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (wgmma, shared memory),
    Pᵀ = act(scale · Sᵀ), dSᵀ = dPᵀ ∘ act'(scale · Sᵀ) (the activation runs while dPᵀ is on the tensor cores),
    dV += Pᵀ dO and dK += dSᵀ Q (wgmma with the A operand from registers),
    dQ = dS K one query tile late (dS through shared memory, three stages: it spans both warpgroups' keys),
    each warpgroup half of D into its own shared-memory buffer. A warpgroup waits only for the other's dS of
    the previous tile, so the two need not meet every tile, and the second starts half a tile behind the
    first: one's activation runs while the other's matmuls keep the tensor cores busy. Without ``dq_late``
    the two meet each tile once both have stored dS and compute that tile's dQ (two stages), which is faster
    where dQ is summed in place in the operands' dtype;
- a dQ warp (in the producer warpgroup) that adds each warpgroup's half-tile into dQ by one TMA reduce-add
  (no per-thread atomics), in fp32 into a buffer the caller casts, or over short key ranges in the operands'
  dtype straight into dQ (``dq_dtype``). The consumers only wait for their buffer to be free and signal it
  full: neither waits for the other's dQ or for the copy;
No softmax: no LSE, no rowsum(dO ∘ O) pass. 5 matmuls per tile, nothing N×N leaves the chip. The epilogue
scales dK and dV, writes them over the K and V tiles in shared memory and stores them by TMA. Keys and queries
past the ends read as zeros (TMA fills them) and are masked out of P and dS, so non-finite inputs cannot leak
through padding; tiles with nothing to mask run a copy of the loop without the mask.
With ``causal`` (the bottom-right aligned mask, Nk - Nq a whole number of 128-key tiles; in a varlen batch in every
sample) a CTA starts at the first query tile that sees one of its keys and masks only the two 64-row tiles across its
diagonal, run first through the masked copy of the loop; the tiles before it add nothing to its dK and dV, nor it
to their dQ.
With ``band`` (varlen; the causal mask at any Nk - Nq, sliding windows) key j is kept for query i of a sample iff
``-left <= j - i - (Nk - Nq) <= right``, the bounds runtime values: a CTA runs the query tiles its keys' band reaches,
every one masked, and a CTA whose keys no query sees exits at once (dK and dV stay zero).
With ``varlen`` the CTAs are (key tile, head, sample) of a varlen batch, samples in the order ``rows`` gives
(longest first), each side's rows of a sample read, stored and reduce-added through TMA descriptors bounded at the
sample's end (``ragged_rows``); a CTA past its sample's keys, or of a sample without queries, exits at once.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup
from cutlass.memory import SmemAllocator
from cutlass.tensor_utils import LayoutEnum

from .activation_math import PackedBackwardForm, fma_bf16x2, widen_bf16x2
from .dq_last_round import count_arrival, order_reduce_adds, round_fragments, round_rows
from .ragged_rows import ragged, sample_rows
from .wgmma import fresh_gemm, operand_a_like, operand_pairs, pack_operand_a, pack_pair, store_operand_a

_WG_ROWS = 64
_WG_THREADS = 128


def _smem_layout(dtype, shape, stages: int, major_size: int | None = None):
    """Swizzled row-major shared-memory layout of ``shape`` x ``stages``. ``major_size`` narrows the
    swizzle atom so the same bytes also read as the transposed (MN-major) operand of a warpgroup that
    owns only part of the contiguous mode."""
    major = shape[1] if major_size is None else major_size
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, major), dtype
    )
    return cute.tile_to_shape(atom, (*shape, stages), order=(0, 1, 2))


def _transposed(t: cute.Tensor) -> cute.Tensor:
    """The same shared memory with its first two modes swapped."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


def _split_offset(crd: tuple, strides: tuple) -> tuple:
    """A flat coordinate's offset along flat ``strides``, split into (the part along static strides, an int; the
    coordinate's values along the dynamic ones; the part along those)."""
    static = sum(c * st for c, st in zip(crd, strides) if isinstance(st, int))
    dynamic = [(c, st) for c, st in zip(crd, strides) if not isinstance(st, int)]
    offset = 0
    for c, st in dynamic:
        offset = offset + c * st if c else offset
    return static, tuple(c for c, _ in dynamic), offset


class GdpaBwdSm90:
    """Compile-time parameters: element type, head dims of Q/K and of V/dO, and the activation's backward
    form (``activation_math.BackwardForm``)."""

    def __init__(
        self, dtype, head_dim: int, head_dim_v: int, act_form, dq_dtype=cutlass.Float32,
        q_stages: int = 2, dq_late: bool = True, varlen: bool = False, causal: bool = False,
        band: bool = False, score_offset: bool = False, score_bias: bool = False, bias_grad: bool = False,
        dbias_atomic: bool = False, tile_m: int = 64, dq_last_round: bool = False,
    ):
        self.dtype = dtype
        self.dq_dtype = dq_dtype
        self.head_dim = head_dim
        self.head_dim_v = head_dim_v
        self.act_form = act_form
        # a packed form (``activation_math.PackedBackwardForm``): the query tiles without a mask run on bf16x2 pairs
        # (P' = P / (scale / 2), dS packed by one fma per pair); masked tiles take the form's fp32 twin
        self.packed = isinstance(act_form, PackedBackwardForm)
        assert not self.packed or (dtype is cutlass.BFloat16 and not (score_offset or score_bias)), \
            "packed backward forms: bf16, no bias"
        self.num_mma_wg = 2
        self.tile_n = _WG_ROWS * self.num_mma_wg  # keys per CTA
        # queries per step: 64, or 80 (flash-attn's tile at D = 128: a fifth more work per step for the K and V
        # operands each matmul reads again from shared memory, and a fifth fewer steps)
        assert tile_m in (64, 80), "query tiles of 64 or 80 rows"
        self.tile_m = tile_m
        # 80 rows make no whole number of 64-row wgmma tiles, so dQ is computed transposed (dQᵀ = Kᵀ dSᵀ, each
        # warpgroup half of D) and each warpgroup stores its fp32 half, in the accumulator's own order (16-byte
        # stores, no bank conflicts), into one shared-memory buffer the two fill in turn, which the dQ warp adds by
        # one 1-D bulk reduce-add into a buffer that ``bwd_results.dq_of_fragments`` permutes, scales and casts. One
        # buffer of half a tile leaves room for three dS stages. Each thread's own red.global.add.v4.f32 of its
        # values, with no buffer at all, took about 12.3 ms of kernel time against 11.7 (H200, 2048², B = 288,
        # gelu_tanh)
        self.dq_flat = tile_m % _WG_ROWS != 0
        assert not self.dq_flat or (head_dim == self.num_mma_wg * _WG_ROWS and dq_dtype is cutlass.Float32 and dq_late
                                    and not (varlen or causal or band or score_bias)), \
            "80-row query tiles: D = 128, fp32 dQ sums one tile late of a dense batch, no mask, no bias tensor"
        # the last CTA of each head to finish rounds the head's fp32 sums into dQ (``dq_last_round``), in place of
        # the caller's pass over the buffer
        self.dq_last_round = dq_last_round
        assert not dq_last_round or (dq_dtype is cutlass.Float32 and not varlen), \
            "dQ rounded in the kernel: of a dense batch's fp32 sums"
        self.q_stages = q_stages
        self.threads = _WG_THREADS * (self.num_mma_wg + 1)
        self.regs_producer = 24
        self.regs_consumer = 240
        # dS of query tile m is in stage m % ds_stages; its dQ is computed one tile later, so a warpgroup waits
        # for the other's dS of the previous tile, never for the other to catch up with this one. Three stages
        # and three barriers per warpgroup: with two Q stages neither warpgroup can run two tiles ahead (the
        # producer loads tile m + 2 only once both have released tile m), so a named barrier never gets a
        # second arrival before its wait and a stage is never overwritten while read.
        # Without ``dq_late`` the two warpgroups meet once per tile, once both have stored their dS, and compute
        # that tile's dQ: two stages, one named barrier (flash-attn's schedule; faster where dQ is summed in
        # place, in the operands' dtype, measured at D=128).
        self.dq_late = dq_late
        self.ds_stages = 3 if dq_late else 2
        assert q_stages < self.ds_stages or not dq_late, "a warpgroup must not get ds_stages tiles ahead of the other"
        # per warpgroup and dS stage: the warpgroup's half of that stage written
        self.barrier_ds = 1
        self.barrier_epi = self.barrier_ds + self.num_mma_wg * self.ds_stages
        # per consumer warpgroup: its sdQ buffer free (the dQ warp's copy has read it) / full (dQ stored)
        self.barrier_dq_empty = self.barrier_epi + 1
        self.barrier_dq_full = self.barrier_dq_empty + self.num_mma_wg
        # once: the second warpgroup starts when the first has stored its first dS
        self.barrier_offset = self.barrier_dq_full + self.num_mma_wg
        # once (``dq_last_round``): the dQ warp has counted this CTA in, and the consumers may read whether it was last
        self.barrier_dq_counted = self.barrier_offset + 1
        self.dq_warp = 1
        # per-sample rows (``varlen``): a CTA per (key tile, head, sample) of a varlen batch, each side's rows of
        # its sample read and written through TMA descriptors bounded at the sample's end (``ragged_rows``)
        self.varlen = varlen
        # bottom-right aligned causal mask (Nk - Nq a whole number of key tiles; varlen: in every sample): a CTA
        # starts at the first query tile that sees one of its keys, and only the two 64-row tiles across its
        # diagonal are masked
        self.causal = causal
        # a band around each varlen sample's diagonal, bounds given at run time: every query tile masked, so it
        # needs no alignment of the diagonal with the tiles
        assert not band or (varlen and not causal), "a band: varlen batches, in place of the aligned causal mask"
        self.band = band
        # a bias constant over the scores, read by the kernel (``GdpaFwdSm90``'s ``score_offset``)
        self.score_offset = score_offset
        # a bias tensor over the scores' rows and columns: the producer loads each query tile's (64 queries x 128
        # keys) by TMA into one shared-memory stage laid out as dS's, and each consumer thread reads its own values
        # of Sᵀ by ldmatrix.trans (the inverse of dS's stmatrix.trans), 16 registers a tile. One stage: at D = 128
        # with fp32 dQ sums two do not fit in 227 KB; the tile is read at the top of the step and freed at once,
        # so the next one loads while the rest of the step's matmuls run. In a varlen batch the tiles are at the
        # positions within each sample; rows and keys past the sample's ends read the bias's padding, which the
        # masked copy of the loop selects away as it does their scores
        assert not (score_bias and score_offset), "a bias tensor: no one element as well"
        self.score_bias = score_bias
        self.bias_stages = 1
        # dBias = post_scale · act'-factor · dS: the dQ warp stores each dS tile, once both warpgroups have used it
        # for dQ, from shared memory by TMA into a [Z, H, Nq, Nk] buffer the launcher sums over the bias's
        # broadcast dims (a stage is written again only after the dQ warp has seen that store read); in a varlen
        # batch [B, H, bias rows, bias columns], each sample's dS at its positions (zeros past its ends)
        assert not bias_grad or score_bias, "a bias gradient: of a bias tensor"
        self.bias_grad = bias_grad
        # or (``dbias_atomic``) each consumer thread adds its dS values (as rounded for the matmuls) in fp32, two
        # neighbouring queries a ``red.global.add.v2.f32``, into a zero-filled fp32 (Nk, Nq, Hb, Zb) tensor of the
        # bias's own size (Nk and Nq padded to whole tiles, queries contiguous): no dS buffer of every sample and head,
        # no sum over it, and the adds of the CTAs sharing a bias tile meet in L2
        assert not dbias_atomic or bias_grad, "dbias added atomically: of a bias gradient"
        self.dbias_atomic = dbias_atomic
        self.ds_store = bias_grad and not dbias_atomic

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
        band_left: cutlass.Int32 | None = None,
        band_right: cutlass.Int32 | None = None,
        offset: cute.Tensor | None = None,
        mBias: cute.Tensor | None = None,
        mdBias: cute.Tensor | None = None,
        mdQ_out: cute.Tensor | None = None,
        dq_count: cute.Tensor | None = None,
    ):
        """mQ: (Nq, D, H, Z); mdO: (Nq, Dv, H, Z); mK, mdK: (Nk, D, H, Z); mV, mdV: (Nk, Dv, H, Z); D and Dv
        contiguous, K/V already expanded to the query heads; mdQ: (Nq, D, H, Z) in ``dq_dtype``,
        zero-initialized, receives dQ.
        Varlen: ``rows`` (5, B) int32 as ``GdpaFwdSm90.__call__`` takes it (per sample, in the order the CTAs
        visit them: first query row, query count, first key row, key count, the sample's index z); each tensor's
        Z is 1 (jagged rows, or one block every sample reads) or B; ``num_n``: key tiles of the longest sample.
        dK and dV of rows no CTA writes (past a sample's keys, samples without queries, keys no query's band sees)
        keep what they held. ``band_left``, ``band_right``: the band's bounds (``band``). ``offset``: the
        one-element bias (``score_offset``) in fp32. ``mBias``: the bias tensor (``score_bias``), (Nq, Nk, Hb, Zb)
        in the operands' dtype, Nk contiguous, Hb 1 or H and Zb 1 or Z; ``mdBias``: (Nq, Nk, H, Z), receives
        dS (``bias_grad``) where a CTA computes it (not in the tiles a causal CTA skips); with ``dbias_atomic`` fp32
        (Nk, Nq, Hb, Zb), Nq contiguous, both padded to whole tiles, zero-filled, receives the sum of dS over the
        samples and heads sharing each of its values. ``mdQ_out`` (``dq_last_round``): (Nq, D, H, Z) in the operands'
        dtype, receives dQ, and ``dq_count``: (Z·H,) int32, zero-filled, one count per (sample, head); mdQ is then
        the fp32 sums' buffer (80-row tiles: its rows whole tiles), rows of D one after another, as are dQ's; the
        kernel leaves it and the counts zero again (``dq_workspace``)."""
        if cutlass.const_expr(self.varlen):
            mQ, mK, mV, mdO, mdQ, mdK, mdV = (ragged(t, 0) for t in (mQ, mK, mV, mdO, mdQ, mdK, mdV))
        d, dv = self.head_dim, self.head_dim_v
        q_smem = _smem_layout(self.dtype, (self.tile_m, d), self.q_stages)
        do_smem = _smem_layout(self.dtype, (self.tile_m, dv), self.q_stages)
        # K is also dQ's B operand, split along D between the warpgroups
        k_smem = _smem_layout(self.dtype, (self.tile_n, d), 1, d // self.num_mma_wg)
        v_smem = _smem_layout(self.dtype, (self.tile_n, dv), 1)
        ds_smem = _smem_layout(self.dtype, (self.tile_m, self.tile_n), self.ds_stages, _WG_ROWS)
        # one buffer per warpgroup, each half of D, added into dQ by its own copy; the consumers store into
        # the same bytes seen as one (queries, D) tile, swizzle atoms no wider than a half
        dq_smem = _smem_layout(self.dq_dtype, (self.tile_m, d // self.num_mma_wg), self.num_mma_wg)
        dq_tile_smem = _smem_layout(self.dq_dtype, (self.tile_m, d), 1, d // self.num_mma_wg)
        bias_smem = _smem_layout(self.dtype, (self.tile_m, self.tile_n), self.bias_stages, _WG_ROWS)

        atoms = self._tma_atoms((mQ, mK, mV, mdO, mdQ, mdK, mdV), (q_smem, do_smem, k_smem, v_smem, dq_smem),
                                d // self.num_mma_wg)
        bias_atoms = self._bias_tma_atoms(mBias, mdBias, bias_smem, ds_smem)

        bias_words = cute.cosize(bias_smem) if self.score_bias else 8
        # the swizzled stages 1024-byte aligned; those a build does not use 16 (80-row tiles leave 2 KB spare)
        bias_align = 1024 if self.score_bias else 16
        # dq_flat: one half-tile in the accumulators' order, which the warpgroups fill in turn
        dq_words = self.tile_m * d // self.num_mma_wg if self.dq_flat else cute.cosize(dq_smem)

        @cute.struct
        class SharedStorage:
            kv_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            q_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            do_mbar: cute.struct.MemRange[cutlass.Int64, self.q_stages * 2]
            bias_mbar: cute.struct.MemRange[cutlass.Int64, self.bias_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(q_smem)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(do_smem)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(k_smem)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(v_smem)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(ds_smem)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[self.dq_dtype, dq_words], 1024]
            dq_last: cute.struct.MemRange[cutlass.Int32, 1]
            sBias: cute.struct.Align[cute.struct.MemRange[self.dtype, bias_words], bias_align]

        self.shared_storage = SharedStorage
        samples = mQ.shape[3]
        if cutlass.const_expr(self.varlen):
            samples = rows.shape[1]
        else:
            num_n = cute.ceil_div(mK.shape[0], self.tile_n)
        self.kernel(
            *atoms, scale, post_scale, slope, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, dq_tile_smem, num_n,
            mQ.shape[2], rows, band_left, band_right, offset, *bias_atoms, bias_smem, mdQ_out, dq_count,
            mdQ if self.dq_last_round else None,
        ).launch(
            grid=[num_n * mQ.shape[2] * samples, 1, 1],
            block=[self.threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    @cute.kernel
    def kernel(
        self,
        tma_q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_do: cute.CopyAtom,
        mdO: cute.Tensor,
        tma_k: cute.CopyAtom,
        mK: cute.Tensor,
        tma_v: cute.CopyAtom,
        mV: cute.Tensor,
        tma_dk: cute.CopyAtom,
        mdK: cute.Tensor,
        tma_dv: cute.CopyAtom,
        mdV: cute.Tensor,
        tma_dq: cute.CopyAtom,
        mdQ: cute.Tensor,
        scale: cutlass.Float32,
        post_scale: cutlass.Float32,
        slope: cutlass.Float32,
        q_smem: cute.ComposedLayout,
        do_smem: cute.ComposedLayout,
        k_smem: cute.ComposedLayout,
        v_smem: cute.ComposedLayout,
        ds_smem: cute.ComposedLayout,
        dq_smem: cute.ComposedLayout,
        dq_tile_smem: cute.ComposedLayout,
        num_n: cutlass.Int32,
        num_heads: cutlass.Int32,
        rows: cute.Tensor | None,
        band_left: cutlass.Int32 | None,
        band_right: cutlass.Int32 | None,
        offset: cute.Tensor | None,
        tma_bias: cute.CopyAtom | None,
        mBias: cute.Tensor | None,
        tma_dbias: cute.CopyAtom | None,
        mdBias: cute.Tensor | None,
        bias_smem: cute.ComposedLayout | None,
        mdQ_out: cute.Tensor | None,
        dq_count: cute.Tensor | None,
        mdQ_sums: cute.Tensor | None,
    ):
        bidx, _, _ = cute.arch.block_idx()
        # key tiles fastest: the CTAs of one head run together and share its Q and dO in L2
        n_blk = bidx % num_n
        h = bidx // num_n % num_heads
        z = bidx // num_n // num_heads
        nq = mQ.shape[0]
        nk = mK.shape[0]
        cta = (tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_dk, mdK, tma_dv, mdV, tma_dq, mdQ, scale, post_scale,
               slope, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, dq_tile_smem, offset)
        biases = (tma_bias, mBias, tma_dbias, mdBias, bias_smem)
        # mdQ_sums: the sums' buffer itself (mdQ is the TMA's view of it)
        rounding = (mdQ_out, dq_count, num_n, num_heads, mdQ_sums)
        if cutlass.const_expr(self.varlen):
            # z is the sample's rank in ``rows``; CTAs past its keys, or of a sample without queries, have nothing
            rank = z
            q0, nq, k0, nk, z = rows[0, rank], rows[1, rank], rows[2, rank], rows[3, rank], rows[4, rank]
            band = (band_left, band_right)
            if cutlass.const_expr(self.band):
                first_row, last_row = self._band_rows(n_blk, nq, nk, band)
                if (n_blk * self.tile_n < nk) & (nq > 0) & (first_row <= last_row):
                    self._cta(cta, n_blk, h, z, q0, nq, k0, nk, band, biases, rounding)
            else:
                if (n_blk * self.tile_n < nk) & (nq > 0):
                    self._cta(cta, n_blk, h, z, q0, nq, k0, nk, band, biases, rounding)
        else:
            self._cta(cta, n_blk, h, z, 0, nq, 0, nk, (band_left, band_right), biases, rounding)

    def _band_rows(self, n_blk, nq, nk, band: tuple):
        """(first, last) query row that the band (``band``: its left and right bounds) lets see a key of key tile
        ``n_blk`` of a sample of ``nq`` queries and ``nk`` keys (query i sees key j iff j - (nk - nq) - right <= i
        <= j - (nk - nq) + left); first > last where none does."""
        left, right = band
        n0 = n_blk * self.tile_n
        last_key = cutlass.min(n0 + self.tile_n, nk) - 1
        return cutlass.max(n0 - (nk - nq) - right, 0), cutlass.min(last_key - (nk - nq) + left, nq - 1)

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
        """The CTA of key tile ``n_blk``, head ``h``, sample ``z`` (its queries from row ``q0``, ``nq`` of them;
        its keys from ``k0``, ``nk``; rows 0 and the tensors' own lengths in a dense batch). ``cta``: the kernel's
        TMA atoms with their tensors, scalars, shared-memory layouts and one-element bias, in its argument order;
        ``biases``: the bias tensor's and dBias's TMA atoms with their tensors and the bias tile's layout; ``band``:
        the band's bounds (``band``; else Nones); ``rounding``: dQ, the counts, key tiles, heads and the sums'
        buffer (``dq_last_round``)."""
        (tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_dk, mdK, tma_dv, mdV, tma_dq, mdQ, scale, post_scale, slope,
         q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, dq_tile_smem, offset) = cta
        tma_bias, mBias, tma_dbias, mdBias, bias_smem = biases
        tidx, _, _ = cute.arch.thread_idx()
        d, dv = self.head_dim, self.head_dim_v
        num_m = cute.ceil_div(nq, self.tile_m)
        # causal: the first query row that sees this CTA's first key (a multiple of 128: Nk - Nq is one), so the
        # query tiles before it are skipped and only the two across the diagonal need the mask; a CTA whose
        # keys are all left of the diagonal (a negative row) sees every query
        diag_row, m_first = 0, 0
        if cutlass.const_expr(self.causal):
            diag_row = n_blk * self.tile_n - (nk - nq)
            m_first = cutlass.max(diag_row, 0) // self.tile_m
        # band: the query tiles from the first to the last row that sees one of this CTA's keys (one at least:
        # the kernel runs no CTA without)
        m_end = num_m
        if cutlass.const_expr(self.band):
            first_row, last_row = self._band_rows(n_blk, nq, nk, band)
            m_first = first_row // self.tile_m
            m_end = last_row // self.tile_m + 1

        storage = SmemAllocator().allocate(self.shared_storage)
        (kv_producer, kv_consumer, q_producer, q_consumer, do_producer, do_consumer, bias_producer,
         bias_consumer) = self._pipelines(storage, self.q_stages)
        sQ, sdO, sK, sV, sdS, sdQ, sdQ_tile = self._smem_tensors(
            storage, (q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, dq_tile_smem))
        (tQsQ, tQgQ, tdOsdO, tdOgdO, tKsK, tKgK, tVsV, tVgV, tdKsdK, tdKgdK, tdVsdV, tdVgdV, tdQsdQ,
         tdQgdQ) = self._tma_partitions(cta[:14], (sQ, sdO, sK, sV, sdQ), h, z, q0, nq, k0, nk, d // self.num_mma_wg)
        sBias = storage.sBias.get_tensor(bias_smem.outer, swizzle=bias_smem.inner)
        tBsB, tBgB, tDBsdS, tDBgDB = self._bias_partitions((tma_bias, mBias, tma_dbias, mdBias), sBias, sdS, h, z)

        pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1, 1), is_relaxed=True)
        pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1, 1))

        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg_idx = cute.arch.make_warp_uniform(tidx // _WG_THREADS)

        if wg_idx == 0:
            cute.arch.setmaxregister_decrease(self.regs_producer)
            if warp_idx == 0:
                self._load_tiles((tma_q, tma_do, tma_k, tma_v, tma_bias),
                                 (tQsQ, tQgQ, tdOsdO, tdOgdO, tKsK, tKgK, tVsV, tVgV, tBsB, tBgB),
                                 (kv_producer, q_producer, do_producer, bias_producer), n_blk, m_first, m_end)
            if warp_idx == self.dq_warp:
                if cutlass.const_expr(self.dq_flat):
                    self._add_dq_fragments(cute.local_tile(mdQ[None, None, h, z], (self.tile_m, d), (None, 0)),
                                           storage.sdQ.data_ptr(), m_first, m_end)
                else:
                    self._add_dq_tiles(tma_dq, tdQsdQ, tdQgdQ, m_first, m_end, (tma_dbias, tDBsdS, tDBgDB), n_blk)
                if cutlass.const_expr(self.dq_last_round):
                    _, dq_count, num_n, num_heads, _ = rounding
                    order_reduce_adds()
                    if cute.arch.lane_idx() == 0:
                        count_arrival(dq_count.iterator + (z * num_heads + h), num_n,
                                      storage.dq_last.get_tensor(cute.make_layout(1)))
                    cute.arch.barrier_arrive(barrier_id=self.barrier_dq_counted,
                                             number_of_threads=self.num_mma_wg * _WG_THREADS + 32)
        else:
            cute.arch.setmaxregister_increase(self.regs_consumer)
            ctid = tidx - _WG_THREADS
            sdp_mma, dk_mma, dv_mma, dq_mma = self._tiled_mmas()
            sdp = sdp_mma.get_slice(ctid)
            dk_thr = dk_mma.get_slice(ctid)
            dv_thr = dv_mma.get_slice(ctid)
            dq = dq_mma.get_slice(ctid)
            sK0 = sK[None, None, 0]
            sV0 = sV[None, None, 0]
            # A shared-memory operand depends on the thread's warpgroup only: partitioned through its first thread,
            # a warp-uniform index, ptxas keeps each k-block's descriptor in uniform registers. Through the thread's
            # own index it built them in ordinary registers, 64-bit adds and two moves to uniform registers per
            # wgmma: 130 of the loop's 804 instructions per query tile (2048², gelu_tanh)
            wg_tid = (wg_idx - 1) * _WG_THREADS
            sdp_wg, dk_wg, dv_wg = sdp_mma.get_slice(wg_tid), dk_mma.get_slice(wg_tid), dv_mma.get_slice(wg_tid)
            dq_wg = dq_mma.get_slice(wg_tid)
            tSrK = sdp_wg.make_fragment_A(sdp_wg.partition_A(sK0))
            tSrQ = sdp_wg.make_fragment_B(sdp_wg.partition_B(sQ))
            tPrV = sdp_wg.make_fragment_A(sdp_wg.partition_A(sV0))
            tPrdO = sdp_wg.make_fragment_B(sdp_wg.partition_B(sdO))
            tVrdO = dv_wg.make_fragment_B(dv_wg.partition_B(_transposed(sdO)))
            tKrQ = dk_wg.make_fragment_B(dk_wg.partition_B(_transposed(sQ)))
            if cutlass.const_expr(self.dq_flat):
                tQrK = dq_wg.make_fragment_A(dq_wg.partition_A(_transposed(sK0)))
                tQrdS = dq_wg.make_fragment_B(dq_wg.partition_B(sdS))
            else:
                tQrdS = dq_wg.make_fragment_A(dq_wg.partition_A(sdS))
                tQrK = dq_wg.make_fragment_B(dq_wg.partition_B(_transposed(sK0)))
            # dSᵀ registers to dS in shared memory by stmatrix.trans (8x8 blocks, transposed on the way)
            ds_copy = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), sdp_mma
            )
            tdSsdS = ds_copy.get_slice(ctid).partition_D(_transposed(sdS))
            # the bias tile's values of this thread's Sᵀ scores, transposed on the way as dS is on its way out
            bias_copy = cute.make_tiled_copy_C(
                cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype), sdp_mma
            )
            tBsB_ld = bias_copy.get_slice(ctid).partition_S(_transposed(sBias))
            if cutlass.const_expr(self.dq_flat):
                # this thread's groups of four values in the buffer: 16 bytes each, a group's 128 threads in a row
                groups = self.tile_m * d // self.num_mma_wg // _WG_THREADS // 4
                tQsdQ = cute.make_tensor(
                    cute.make_ptr(cutlass.Float32, (storage.sdQ.data_ptr() + ctid % _WG_THREADS * 4).toint(),
                                  cute.AddressSpace.smem, assumed_align=16),
                    cute.make_layout((4, groups), stride=(1, 4 * _WG_THREADS)),
                )
            else:
                tQsdQ = dq.partition_C(sdQ_tile[None, None, 0])
            cwg = wg_idx - 1

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
            packed_c = None
            dv_scale = post_scale
            if cutlass.const_expr(self.packed):
                packed_c = self.act_form.constants(scale)
                dv_scale = post_scale * scale * 0.5
            bias = None
            if cutlass.const_expr(self.score_offset):
                bias = offset[0]
            gdB = None
            if cutlass.const_expr(self.dbias_atomic):
                gdB = mdBias[None, None, h % mdBias.shape[2], z % mdBias.shape[3]]
            ds_threads = self.num_mma_wg * _WG_THREADS

            kv_consumer.wait_and_advance()
            # half a tile behind the first warpgroup (2048², H200, one A/B run: gelu_tanh 471 -> 477, silu
            # 476 -> 486 TF/s)
            if cutlass.const_expr(self.dq_late):
                if cwg == 1:
                    cute.arch.barrier(barrier_id=self.barrier_offset, number_of_threads=ds_threads)
            # Query tiles that need no mask (every tile but the last, when this CTA's keys are all in range) run
            # through a copy of the loop without the mask's compares and selects (2048², gelu_tanh, H200:
            # 461 -> 481 TF/s); causal, the diagonal's two tiles run first through a third, masked copy. The
            # consumers count query tiles from the CTA's first (m below is the tile's index minus m_first), so the
            # loop tests what it tests without the mask; the loop runs at the edge of the registers (ptxas spills
            # 60 bytes of the causal fp32-sum gelu_tanh build, a few reloads per query tile)
            num_rel, diag0 = num_m, 0
            if cutlass.const_expr(self.causal):
                num_rel = num_m - m_first
                # key c of this CTA is kept for row r of tile m iff c <= r + 64 m + diag0
                diag0 = m_first * self.tile_m - diag_row
            m_unmasked = num_rel - 1 if valid_keys >= self.tile_n else 0
            # (masked, first tile, end) per copy of the loop, in the order the tiles run
            passes = [(False, 0, m_unmasked), (True, m_unmasked, num_rel)]
            if cutlass.const_expr(self.causal):
                diag_end = 0
                if diag_row >= 0:
                    diag_end = cutlass.min(self.tile_n // self.tile_m, num_rel)
                m_unmasked = cutlass.max(m_unmasked, diag_end)
                passes = [(True, 0, diag_end), (False, diag_end, m_unmasked), (True, m_unmasked, num_rel)]
            if cutlass.const_expr(self.band):
                num_rel = m_end - m_first
                passes = [(True, 0, num_rel)]
            for pass_idx in cutlass.range_constexpr(len(passes)):
                masked, m_lo, m_hi = passes[pass_idx]
                score_c = None
                if cutlass.const_expr(self.packed and masked):
                    score_c = tuple(widen_bf16x2(w) for w in packed_c)
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
                    warpgroup.wait_group(1)
                    r_bias = cute.make_rmem_tensor(acc_s.layout, self.dtype)
                    if cutlass.const_expr(self.score_bias):
                        bias_handle = bias_consumer.wait_and_advance()
                        cute.copy(bias_copy, tBsB_ld[None, None, None, bias_handle.index], bias_copy.retile(r_bias))
                        # ptxas issues the stage's arrive right after the ldmatrix instructions, before they have
                        # read it (even when the release comes after the values' use): the next tile's TMA then
                        # overwrote tiles still being read (H200: wrong dQ, dK, dV at D = 64, varying from run to
                        # run). The fence waits for the reads (MEMBAR.ALL.CTA) and orders them before the async
                        # proxy's writes; measured free (2048², silu: 476 against 479 TF/s)
                        cute.arch.fence_proxy("async.shared", space="cta")
                        bias_handle.release()

                    # Pᵀ into the dV operand; act' kept in acc_s for dS. With 80-row tiles each pair is rounded as
                    # soon as computed: fp32 Pᵀ beside Sᵀ and dPᵀ does not fit beside their accumulators (in the
                    # 64-row builds that made ptxas spill in five of them)
                    r_p = operand_a_like(acc_s, dv_mma, self.dtype)
                    p_pairs = operand_pairs(acc_s, r_p)
                    p_layout = cute.make_layout(2) if self.dq_flat else acc_s.layout
                    p_acc = cute.make_rmem_tensor(p_layout, cutlass.Float32)
                    if cutlass.const_expr(masked):
                        # keys past Nk (last key tile) and queries past Nq (last query tile) read as zeros:
                        # masked so a non-finite input cannot reach the sums through them, by a select per score
                        # (a branch per score made ptxas keep its predicate in a register and test it per score)
                        if cutlass.const_expr(self.band):
                            # key c of this CTA is kept for query row r of this tile iff least <= c - r <= greatest
                            # (and both are within the sample)
                            row0 = (m + m_first) * self.tile_m
                            valid_rows = nq - row0
                            shift = n_blk * self.tile_n - row0 - (nk - nq)
                            least, greatest = 0 - band[0] - shift, band[1] - shift
                        else:
                            valid_rows = self.tile_m
                            if m == num_rel - 1:
                                valid_rows = valid_rows_last
                        if cutlass.const_expr(self.causal):
                            # key c of this CTA is kept for query row r of this tile iff c <= r + diag; for rows
                            # before Nq that also keeps c before Nk (the last key tile is always a diagonal one)
                            diag = m * self.tile_m + diag0
                        if cutlass.const_expr(self.dq_flat):
                            # 80-row tiles: the masked tile (one per CTA) waits for dPᵀ and turns each act' into dS
                            # at once; act' of every score beside dPᵀ, Pᵀ and the mask's compares did not fit the
                            # registers (ptxas spilled and serialized every wgmma of the kernel)
                            warpgroup.wait_group(0)
                        for i in cutlass.range_constexpr(cute.size(acc_s)):
                            y, g = self._act(acc_s[i], scale, slope, bias, r_bias, i, score_c)
                            if cutlass.const_expr(self.band):
                                diff = tScS[i][0] - tScS[i][1]
                                keep = (tScS[i][0] < valid_keys and tScS[i][1] < valid_rows and diff >= least
                                        and diff <= greatest)
                            elif cutlass.const_expr(self.causal):
                                keep = tScS[i][1] < valid_rows and tScS[i][0] <= tScS[i][1] + diag
                            else:
                                keep = tScS[i][0] < valid_keys and tScS[i][1] < valid_rows
                            p_acc[self._p_slot(i)] = y if keep else cutlass.Float32(0.0)
                            acc_s[i] = g if keep else cutlass.Float32(0.0 - act_grad_offset)
                            if cutlass.const_expr(self.dq_flat):
                                acc_dp[i] = self._ds(acc_dp[i], acc_s[i])
                                if cutlass.const_expr(i % 2 == 1):
                                    p_pairs[i // 2] = pack_pair(p_acc[0], p_acc[1], self.dtype)
                    elif cutlass.const_expr(self.packed):
                        # P' straight into the dV operand, m kept as bf16x2 for dS
                        m_pairs = cute.make_rmem_tensor(cute.make_layout(cute.size(acc_s) // 2), cutlass.Int32)
                        for j in cutlass.range_constexpr(cute.size(acc_s) // 2):
                            p_pairs[j], m_pairs[j] = self.act_form.pair(
                                pack_pair(acc_s[2 * j], acc_s[2 * j + 1], self.dtype), packed_c)
                    else:
                        for i in cutlass.range_constexpr(cute.size(acc_s)):
                            p_acc[self._p_slot(i)], acc_s[i] = self.act_form.fn(acc_s[i], scale, slope,
                                                                                self._score_bias(bias, r_bias, i))
                            if cutlass.const_expr(self.dq_flat and i % 2 == 1):
                                p_pairs[i // 2] = pack_pair(p_acc[0], p_acc[1], self.dtype)
                    packed_tile = self.packed and not masked
                    if cutlass.const_expr(not (self.dq_flat or packed_tile)):
                        store_operand_a(p_acc, r_p)

                    r_ds = operand_a_like(acc_dp, dk_mma, self.dtype)
                    if cutlass.const_expr(packed_tile):
                        # dS = dP (m + 1) from dP rounded to bf16, a pair per instruction, into dK's operand
                        warpgroup.wait_group(0)
                        ds_pairs = operand_pairs(acc_dp, r_ds)
                        for j in cutlass.range_constexpr(cute.size(acc_dp) // 2):
                            dp = pack_pair(acc_dp[2 * j], acc_dp[2 * j + 1], self.dtype)
                            ds_pairs[j] = fma_bf16x2(dp, m_pairs[j], dp)
                    else:
                        if cutlass.const_expr(not (masked and self.dq_flat)):
                            warpgroup.wait_group(0)
                            for i in cutlass.range_constexpr(cute.size(acc_dp)):
                                acc_dp[i] = self._ds(acc_dp[i], acc_s[i])
                        pack_operand_a(acc_dp, r_ds)
                    stage = m % self.ds_stages
                    cute.copy(ds_copy, ds_copy.retile(cute.make_tensor(r_ds.iterator, acc_dp.layout)),
                              tdSsdS[None, None, None, stage])
                    if cutlass.const_expr(self.dbias_atomic):
                        self._add_dbias(cute.make_tensor(r_ds.iterator, acc_dp.layout), sdp.partition_C(
                            cute.local_tile(gdB, (self.tile_n, self.tile_m), (n_blk, m + m_first))))

                    warpgroup.fence()
                    fresh_gemm(dv_mma, acc_dv, r_p, tVrdO[None, None, None, do_handle.index], True)
                    warpgroup.commit_group()

                    cute.arch.fence_proxy("async.shared", space="cta")
                    # the dS stage this tile's dQ matmul reads
                    dq_stage = stage
                    if cutlass.const_expr(self.dq_late):
                        cute.arch.barrier_arrive(
                            barrier_id=self.barrier_ds + self.ds_stages * cwg + stage, number_of_threads=ds_threads
                        )
                        if m == 0:
                            if cwg == 0:
                                cute.arch.barrier_arrive(barrier_id=self.barrier_offset, number_of_threads=ds_threads)
                        # dQ of the previous tile (at the first, of a stage not yet written: computed, never stored)
                        dq_stage = (m + self.ds_stages - 1) % self.ds_stages
                        if m > 0:
                            cute.arch.barrier(
                                barrier_id=self.barrier_ds + self.ds_stages * (1 - cwg) + dq_stage,
                                number_of_threads=ds_threads,
                            )
                    else:
                        # a stage is written again two tiles on, after both warpgroups passed this barrier once more,
                        # each having waited for its dQ matmul of this tile
                        cute.arch.barrier(barrier_id=self.barrier_ds, number_of_threads=ds_threads)
                    acc_dq = self._dq_gemm(dq_mma, dq, tQrdS[None, None, None, dq_stage], tQrK)
                    warpgroup.commit_group()
                    fresh_gemm(dk_mma, acc_dk, r_ds, tKrQ[None, None, None, q_handle.index], True)
                    warpgroup.commit_group()
                    warpgroup.wait_group(2)
                    do_handle.release()
                    warpgroup.wait_group(1)
                    if cutlass.const_expr(self.dq_late):
                        if m > 0:
                            self._hand_dq(acc_dq, tQsdQ, ds_scale, cwg)
                    else:
                        self._hand_dq(acc_dq, tQsdQ, ds_scale, cwg)
                    warpgroup.wait_group(0)
                    q_handle.release()

            if cutlass.const_expr(self.dq_late):
                last = (num_rel - 1) % self.ds_stages
                cute.arch.barrier(
                    barrier_id=self.barrier_ds + self.ds_stages * (1 - cwg) + last, number_of_threads=ds_threads
                )
                warpgroup.fence()
                acc_dq = self._dq_gemm(dq_mma, dq, tQrdS[None, None, None, last], tQrK)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                self._hand_dq(acc_dq, tQsdQ, ds_scale, cwg)

            self._store_dk_dv((acc_dk, dk_thr, sK0, tma_dk, tdKsdK, tdKgdK),
                              (acc_dv, dv_thr, sV0, tma_dv, tdVsdV, tdVgdV), ds_scale, dv_scale, n_blk, warp_idx)
            if cutlass.const_expr(self.dq_last_round):
                mdQ_out, mdQ_sums = rounding[0], rounding[4]
                cute.arch.barrier(barrier_id=self.barrier_dq_counted,
                                  number_of_threads=self.num_mma_wg * _WG_THREADS + 32)
                if storage.dq_last.get_tensor(cute.make_layout(1))[0] != 0:
                    cute.arch.fence_acq_rel_gpu()
                    if cutlass.const_expr(self.dq_flat):
                        # the Q stages, free once both warpgroups are past their last tile
                        round_fragments(mdQ_sums[None, None, h, z], mdQ_out[None, None, h, z], nq, ds_scale, ctid,
                                        storage.sQ.data_ptr(), self.barrier_epi, self.tile_m, d, self.dtype)
                    else:
                        round_rows(mdQ_sums[None, None, h, z].iterator, mdQ_out[None, None, h, z].iterator, nq * d,
                                   ds_scale, ctid, self.dtype)

    def _tma_atoms(self, tensors: tuple, layouts: tuple, dq_cols: int) -> tuple:
        """The TMA atoms with their tensors, in the kernel's argument order: loads of Q and dO tiles, of K and V
        tiles, stores of dK and dV over the K and V tiles, the reduce-add of dQ tiles ``dq_cols`` wide. ``tensors``:
        (Q, K, V, dO, dQ, dK, dV); ``layouts``: the Q, dO, K, V and dQ shared-memory layouts. Sets the loads'
        transaction bytes."""
        mQ, mK, mV, mdO, mdQ, mdK, mdV = tensors
        q_smem, do_smem, k_smem, v_smem, dq_smem = layouts
        d, dv = self.head_dim, self.head_dim_v
        load = cpasync.CopyBulkTensorTileG2SOp()
        store = cpasync.CopyBulkTensorTileS2GOp()
        one = (None, None, 0)
        tma_q, tq = cpasync.make_tiled_tma_atom(load, mQ, cute.slice_(q_smem, one), (self.tile_m, d))
        tma_do, tdo = cpasync.make_tiled_tma_atom(load, mdO, cute.slice_(do_smem, one), (self.tile_m, dv))
        tma_k, tk = cpasync.make_tiled_tma_atom(load, mK, cute.slice_(k_smem, one), (self.tile_n, d))
        tma_v, tv = cpasync.make_tiled_tma_atom(load, mV, cute.slice_(v_smem, one), (self.tile_n, dv))
        tma_dk, tdk = cpasync.make_tiled_tma_atom(store, mdK, cute.slice_(k_smem, one), (self.tile_n, d))
        tma_dv, tdv = cpasync.make_tiled_tma_atom(store, mdV, cute.slice_(v_smem, one), (self.tile_n, dv))
        # dq_flat: the dQ warp adds into dQ's buffer by 1-D bulk reduces, through its own tensor
        tma_dq, tdq = None, mdQ
        if cutlass.const_expr(not self.dq_flat):
            tma_dq, tdq = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(cpasync.ReductionOp.ADD), mdQ, cute.slice_(dq_smem, one),
                (self.tile_m, dq_cols),
            )
        self.q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(q_smem, one))
        self.do_bytes = cute.size_in_bytes(self.dtype, cute.slice_(do_smem, one))
        self.kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(k_smem, one)) + cute.size_in_bytes(
            self.dtype, cute.slice_(v_smem, one)
        )
        return tma_q, tq, tma_do, tdo, tma_k, tk, tma_v, tv, tma_dk, tdk, tma_dv, tdv, tma_dq, tdq

    def _bias_tma_atoms(self, mBias, mdBias, bias_smem, ds_smem) -> tuple:
        """(load of bias tiles, its tensor, store of dS tiles into dBias, its tensor), Nones where the kernel has
        no bias tensor or no bias gradient (``dbias_atomic``: no store, dBias itself); sets the bias load's
        transaction bytes."""
        one = (None, None, 0)
        tile = (self.tile_m, self.tile_n)
        tma_bias, tBias, tma_dbias, tdBias = None, None, None, None
        if cutlass.const_expr(self.score_bias):
            tma_bias, tBias = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), mBias, cute.slice_(bias_smem, one), tile)
            self.bias_bytes = cute.size_in_bytes(self.dtype, cute.slice_(bias_smem, one))
        if cutlass.const_expr(self.ds_store):
            tma_dbias, tdBias = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileS2GOp(), mdBias, cute.slice_(ds_smem, one), tile)
        if cutlass.const_expr(self.dbias_atomic):
            tdBias = mdBias
        return tma_bias, tBias, tma_dbias, tdBias

    def _bias_partitions(self, atoms: tuple, sBias: cute.Tensor, sdS: cute.Tensor, h, z) -> tuple:
        """The TMA partitions (shared, global) of the bias tiles of head ``h``, sample ``z`` (its broadcast dims
        read at 0) and of dS into dBias, by (query tile, key tile); Nones where the kernel has none."""
        tma_bias, mBias, tma_dbias, mdBias = atoms
        no_cluster = cute.make_layout(1)
        tile = (self.tile_m, self.tile_n)
        tBsB, tBgB, tDBsdS, tDBgDB = None, None, None, None
        if cutlass.const_expr(self.score_bias):
            gBias = cute.local_tile(mBias[None, None, h % mBias.shape[2], z % mBias.shape[3]], tile, (None, None))
            tBsB, tBgB = cpasync.tma_partition(tma_bias, 0, no_cluster, cute.group_modes(sBias, 0, 2),
                                               cute.group_modes(gBias, 0, 2))
        if cutlass.const_expr(self.ds_store):
            gdBias = cute.local_tile(mdBias[None, None, h, z], tile, (None, None))
            tDBsdS, tDBgDB = cpasync.tma_partition(tma_dbias, 0, no_cluster, cute.group_modes(sdS, 0, 2),
                                                   cute.group_modes(gdBias, 0, 2))
        return tBsB, tBgB, tDBsdS, tDBgDB

    @cute.jit
    def _add_dbias(self, ds: cute.Tensor, tdB: cute.Tensor):
        """The thread's dSᵀ values (``ds``: as rounded for dK's and dQ's matmuls, in the accumulator's layout) added
        in fp32 into dBias at ``tdB`` (their places, partitioned as the accumulator), the two neighbouring queries of
        each pair by one ``red.global.add.v2.f32``. The offsets along modes of static stride go into the
        instruction's immediate, so the thread keeps one address per value of the other modes (two: its rows r and
        r + 8 of the wgmma accumulator), which ptxas otherwise hoisted and spilled."""
        words = cute.recast_tensor(ds, cutlass.Int32)
        # a pair's two 16-bit values (the first in the low half) widened to fp32 registers lo, hi: bf16 by its bits
        widen = (".reg .b32 lo, hi; shl.b32 lo, {$r1}, 16; and.b32 hi, {$r1}, 0xffff0000; "
                 if self.dtype is cutlass.BFloat16 else
                 ".reg .b16 l16, h16; .reg .f32 lo, hi; mov.b32 {l16, h16}, {$r1}; cvt.f32.f16 lo, l16; "
                 "cvt.f32.f16 hi, h16; ")
        strides = cute.flatten(tdB.layout.stride)
        assert strides[0] == 1, "a pair's two queries must be neighbours in dBias (its queries contiguous)"
        rows = {}
        for i in cutlass.range_constexpr(0, cute.size(ds), 2):
            crd = cute.flatten(cute.idx2crd(i, tdB.layout.shape))
            static, row, offset = _split_offset(crd, strides)
            rows.setdefault(row, tdB.iterator + offset)
            cute.arch.inline_ptx(
                f"{{ {widen}red.global.add.v2.f32 [{{$r0}}+{static * 4}], {{lo, hi}}; }}",
                read_only_args=[rows[row], words[i // 2]],
            )

    def _p_slot(self, i: int) -> int:
        """Where score ``i``'s P waits to be rounded: its own register, or (``dq_flat``) one of a pair's two."""
        return i % 2 if self.dq_flat else i

    def _ds(self, dp: cutlass.Float32, grad: cutlass.Float32) -> cutlass.Float32:
        """dSᵀ (without act''s constant factor) of a score from its dPᵀ and the m of its act' (``BackwardForm``)."""
        if cutlass.const_expr(self.act_form.grad_offset == 1.0):
            return cute.math.fma(dp, grad, dp)
        return dp * grad

    def _act(self, x: cutlass.Float32, scale: cutlass.Float32, slope: cutlass.Float32, offset, r_bias: cute.Tensor,
             i: int, score_c):
        """(p, m) of score ``i`` (``x``) of the thread's Sᵀ by the fp32 form, or a packed form's fp32 twin
        (``score_c``: its constants widened), whose p is P'."""
        if cutlass.const_expr(self.packed):
            return self.act_form.score(x, score_c)
        return self.act_form.fn(x, scale, slope, self._score_bias(offset, r_bias, i))

    def _score_bias(self, offset, r_bias: cute.Tensor, i: int):
        """The bias of score ``i`` of the thread's Sᵀ: its value of the bias tile (``score_bias``), else the one
        element (or None)."""
        return cutlass.Float32(r_bias[i]) if self.score_bias else offset

    def _pipelines(self, storage, do_stages: int) -> tuple:
        """Producer and consumer of the K/V load (one stage), of the Q ring, of the dO ring (``do_stages``) and of
        the bias tiles (``score_bias``; else Nones), in that order, flat (the DSL threads a loop's state through
        names unpacked from a flat tuple)."""
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        consumer_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * _WG_THREADS // 32)

        def ring(barriers, stages, tx_count):
            return pipeline.PipelineTmaAsync.create(
                barrier_storage=barriers, num_stages=stages, producer_group=one_thread,
                consumer_group=consumer_warps, tx_count=tx_count, defer_sync=True,
            ).make_participants()

        bias = (None, None)
        if self.score_bias:
            bias = ring(storage.bias_mbar.data_ptr(), self.bias_stages, self.bias_bytes)
        return (*ring(storage.kv_mbar.data_ptr(), 1, self.kv_bytes),
                *ring(storage.q_mbar.data_ptr(), self.q_stages, self.q_bytes),
                *ring(storage.do_mbar.data_ptr(), do_stages, self.do_bytes), *bias)

    def _smem_tensors(self, storage, layouts: tuple) -> tuple:
        """(sQ, sdO, sK, sV, sdS, sdQ, sdQ_tile) over the shared storage, in ``layouts``' order (sdQ_tile: the dQ
        buffers seen as one tile)."""
        fields = (storage.sQ, storage.sdO, storage.sK, storage.sV, storage.sdS, storage.sdQ, storage.sdQ)
        return tuple(f.get_tensor(lay.outer, swizzle=lay.inner) for f, lay in zip(fields, layouts))

    def _tma_partitions(self, atoms: tuple, smem: tuple, h, z, q0, nq, k0, nk, dq_cols: int) -> tuple:
        """The TMA partitions (shared, global) of Q, dO, K, V, dK, dV and dQ (tiles ``dq_cols`` wide) of head
        ``h``, sample ``z`` (rows as ``_cta`` takes them); ``atoms``: ``_tma_atoms``' tuple, ``smem``: sQ, sdO, sK,
        sV and sdQ."""
        tma_q, mQ, tma_do, mdO, tma_k, mK, tma_v, mV, tma_dk, mdK, tma_dv, mdV, tma_dq, mdQ = atoms
        sQ, sdO, sK, sV, sdQ = smem
        d, dv = self.head_dim, self.head_dim_v
        gQ = cute.local_tile(self._rows_of(mQ, h, z, q0, nq), (self.tile_m, d), (None, 0))
        gdO = cute.local_tile(self._rows_of(mdO, h, z, q0, nq), (self.tile_m, dv), (None, 0))
        gK = cute.local_tile(self._rows_of(mK, h, z, k0, nk), (self.tile_n, d), (None, 0))
        gV = cute.local_tile(self._rows_of(mV, h, z, k0, nk), (self.tile_n, dv), (None, 0))
        gdK = cute.local_tile(self._rows_of(mdK, h, z, k0, nk), (self.tile_n, d), (None, 0))
        gdV = cute.local_tile(self._rows_of(mdV, h, z, k0, nk), (self.tile_n, dv), (None, 0))
        no_cluster = cute.make_layout(1)

        def part(atom, s, g):
            return cpasync.tma_partition(atom, 0, no_cluster, cute.group_modes(s, 0, 2), cute.group_modes(g, 0, 2))

        dq_parts = (None, None)
        if cutlass.const_expr(not self.dq_flat):
            gdQ = cute.local_tile(self._rows_of(mdQ, h, z, q0, nq), (self.tile_m, dq_cols), (None, None))
            dq_parts = part(tma_dq, sdQ, gdQ)
        return (*part(tma_q, sQ, gQ), *part(tma_do, sdO, gdO), *part(tma_k, sK, gK), *part(tma_v, sV, gV),
                *part(tma_dk, sK, gdK), *part(tma_dv, sV, gdV), *dq_parts)

    @cute.jit
    def _load_tiles(self, atoms: tuple, parts: tuple, producers: tuple, n_blk: cutlass.Int32, m_first: cutlass.Int32,
                    m_end: cutlass.Int32):
        """The producer warp: K and V of key tile ``n_blk`` once, then Q, dO and the bias tile (``score_bias``) of
        query tiles ``m_first`` to ``m_end`` into their rings."""
        tma_q, tma_do, tma_k, tma_v, tma_bias = atoms
        tQsQ, tQgQ, tdOsdO, tdOgdO, tKsK, tKgK, tVsV, tVgV, tBsB, tBgB = parts
        kv_producer, q_producer, do_producer, bias_producer = producers
        for atom in (tma_q, tma_do, tma_k, tma_v):
            cpasync.prefetch_descriptor(atom)
        if cutlass.const_expr(self.score_bias):
            cpasync.prefetch_descriptor(tma_bias)
        handle = kv_producer.acquire_and_advance()
        cute.copy(tma_k, tKgK[(None, n_blk)], tKsK[(None, 0)], tma_bar_ptr=handle.barrier)
        cute.copy(tma_v, tVgV[(None, n_blk)], tVsV[(None, 0)], tma_bar_ptr=handle.barrier)
        for m in cutlass.range(m_first, m_end, unroll=1):
            handle = q_producer.acquire_and_advance()
            cute.copy(tma_q, tQgQ[(None, m)], tQsQ[(None, handle.index)], tma_bar_ptr=handle.barrier)
            handle = do_producer.acquire_and_advance()
            cute.copy(tma_do, tdOgdO[(None, m)], tdOsdO[(None, handle.index)], tma_bar_ptr=handle.barrier)
            if cutlass.const_expr(self.score_bias):
                handle = bias_producer.acquire_and_advance()
                cute.copy(tma_bias, tBgB[(None, m, n_blk)], tBsB[(None, handle.index)], tma_bar_ptr=handle.barrier)

    @cute.jit
    def _store_dk_dv(self, dk: tuple, dv: tuple, ds_scale: cutlass.Float32, dv_scale: cutlass.Float32,
                     n_blk: cutlass.Int32, warp_idx: cutlass.Int32):
        """The consumers' epilogue: dV and dK (``dv``, ``dk``: accumulator, its MMA thread slice, the V or K
        tile, the TMA store with its partitions) scaled (by ``dv_scale``, ``ds_scale``) over the V and K tiles, then
        one TMA store each."""
        acc_dk, dk_thr, sK0, tma_dk, tdKsdK, tdKgdK = dk
        acc_dv, dv_thr, sV0, tma_dv, tdVsdV, tdVgdV = dv
        r_dv = cute.make_fragment_like(acc_dv, self.dtype)
        r_dv.store((acc_dv.load() * dv_scale).to(self.dtype))
        r_dk = cute.make_fragment_like(acc_dk, self.dtype)
        r_dk.store((acc_dk.load() * ds_scale).to(self.dtype))
        cute.arch.barrier(barrier_id=self.barrier_epi, number_of_threads=self.num_mma_wg * _WG_THREADS)
        cute.autovec_copy(r_dv, dv_thr.partition_C(sV0))
        cute.autovec_copy(r_dk, dk_thr.partition_C(sK0))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=self.barrier_epi, number_of_threads=self.num_mma_wg * _WG_THREADS)
        if warp_idx == _WG_THREADS // 32:
            cute.copy(tma_dv, tdVsdV[(None, 0)], tdVgdV[(None, n_blk)])
            cute.copy(tma_dk, tdKsdK[(None, 0)], tdKgdK[(None, n_blk)])
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def _rows_of(self, m: cute.Tensor, h: cutlass.Int32, z: cutlass.Int32, start: cutlass.Int32,
                 length: cutlass.Int32):
        """The (rows, D) tensor of head ``h``, sample ``z``: varlen, the sample's ``length`` rows from ``start``
        (``ragged_rows``), else the dense tensor's."""
        if cutlass.const_expr(not self.varlen):
            return m[None, None, h, z]
        return sample_rows(m, h, z, start, length, 0)

    @cute.jit
    def _hand_dq(self, acc_dq: cute.Tensor, tQsdQ: cute.Tensor, ds_scale: cutlass.Float32, slot: cutlass.Int32):
        """A half of a dQ tile into sdQ buffer ``slot`` once the dQ warp has freed it; then signalled full. Scaled
        here where dQ is summed in its own dtype; fp32 sums are scaled by the cast that rounds them
        (``bwd_results.dq_of_sums``), which spares the loop a multiply per score (32 of its ~720 instructions per
        query tile at D = 128)."""
        dq_threads = _WG_THREADS + 32
        r_dq = acc_dq
        if cutlass.const_expr(self.dq_dtype != cutlass.Float32):
            r_dq = cute.make_fragment_like(acc_dq, self.dq_dtype)
            r_dq.store((acc_dq.load() * ds_scale).to(self.dq_dtype))
        cute.arch.barrier(barrier_id=self.barrier_dq_empty + slot, number_of_threads=dq_threads)
        if cutlass.const_expr(self.dq_flat):
            # the accumulator's values in their register order, four to a group (``tQsdQ``'s layout)
            r_dq = cute.make_tensor(acc_dq.iterator, cute.make_layout(tQsdQ.shape))
        cute.autovec_copy(r_dq, tQsdQ)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier_arrive(barrier_id=self.barrier_dq_full + slot, number_of_threads=dq_threads)

    @cute.jit
    def _add_dq_fragments(self, gdQ: cute.Tensor, sdQ: cute.Pointer, m_first: cutlass.Int32, m_end: cutlass.Int32):
        """The dQ warp with ``dq_flat``: per query tile from ``m_first``, per warpgroup in turn, frees the one buffer
        once the previous add has read it, then, once the warpgroup has filled it, adds it into its half of the
        tile's block of dQ's buffer (``gdQ``: its (rows, D) tiles; rows of D values in a row, so a tile is one
        block of words) by one 1-D bulk reduce-add (``cp.reduce.async.bulk``, issued by one lane)."""
        dq_threads = _WG_THREADS + 32
        half = self.tile_m * self.head_dim // self.num_mma_wg
        lane = cute.arch.lane_idx()
        for m in cutlass.range(m_first, m_end, unroll=1):
            for w in cutlass.range_constexpr(self.num_mma_wg):
                if lane == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                cute.arch.barrier_arrive(barrier_id=self.barrier_dq_empty + w, number_of_threads=dq_threads)
                cute.arch.barrier(barrier_id=self.barrier_dq_full + w, number_of_threads=dq_threads)
                if lane == 0:
                    cute.arch.inline_ptx(
                        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{$r0}], [{$r1}], {$r2};",
                        read_only_args=[gdQ[None, None, m].iterator + w * half, sdQ, cutlass.Int32(half * 4)],
                    )
                    cute.arch.cp_async_bulk_commit_group()
        # dq_last_round: complete, not only read, before this CTA counts itself in
        if lane == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=not self.dq_last_round)

    @cute.jit
    def _add_dq_tiles(
        self, tma_dq: cute.CopyAtom, tdQsdQ: cute.Tensor, tdQgdQ: cute.Tensor, m_first: cutlass.Int32,
        num_m: cutlass.Int32, dbias: tuple, n_blk: cutlass.Int32,
    ):
        """The dQ warp: per query tile from ``m_first``, frees each warpgroup's sdQ buffer once its previous copy
        has read it, then adds the buffer into dQ once the warpgroup has filled it. With ``bias_grad`` it then stores
        the tile's dS (both warpgroups' halves are in: each computed its dQ from them) into dBias (``dbias``: the TMA
        store with its partitions; key tile ``n_blk``), and frees a buffer only once every earlier copy has read its
        shared memory, the dS stage included: a warpgroup writes that stage again only after it has waited for a
        buffer freed later."""
        tma_dbias, tDBsdS, tDBgDB = dbias
        dq_threads = _WG_THREADS + 32
        halves = self.num_mma_wg
        for m in cutlass.range(m_first, num_m, unroll=1):
            for w in cutlass.range_constexpr(halves):
                cute.arch.cp_async_bulk_wait_group(0 if self.ds_store else halves - 1 - w, read=True)
                cute.arch.barrier_arrive(barrier_id=self.barrier_dq_empty + w, number_of_threads=dq_threads)
            for w in cutlass.range_constexpr(halves):
                cute.arch.barrier(barrier_id=self.barrier_dq_full + w, number_of_threads=dq_threads)
                cute.copy(tma_dq, tdQsdQ[(None, w)], tdQgdQ[(None, m, w)])
                cute.arch.cp_async_bulk_commit_group()
            if cutlass.const_expr(self.ds_store):
                cute.copy(tma_dbias, tDBsdS[(None, (m - m_first) % self.ds_stages)], tDBgDB[(None, m, n_blk)])
                cute.arch.cp_async_bulk_commit_group()
        # dq_last_round: complete, not only read, before this CTA counts itself in
        cute.arch.cp_async_bulk_wait_group(0, read=not self.dq_last_round)

    @cute.jit
    def _dq_gemm(self, dq_mma: cute.TiledMma, dq: cute.ThrMma, ds: cute.Tensor, k: cute.Tensor) -> cute.Tensor:
        """A fresh dQ accumulator of the thread (``dq``: its slice of ``dq_mma``) with the dQ matmul of dS stage
        ``ds`` and K (``k``) issued: dQ = dS K, or with ``dq_flat`` dQᵀ = Kᵀ dSᵀ (queries as the columns)."""
        if cutlass.const_expr(self.dq_flat):
            acc = dq.make_fragment_C(dq.partition_shape_C((self.head_dim, self.tile_m)))
            fresh_gemm(dq_mma, acc, k, ds, False)
        else:
            acc = dq.make_fragment_C(dq.partition_shape_C((self.tile_m, self.head_dim)))
            fresh_gemm(dq_mma, acc, ds, k, False)
        return acc

    def _tiled_mmas(self):
        """Sᵀ/dPᵀ (keys x queries, both operands from shared memory), dK (keys x D) and dV (keys x Dv), A
        from registers, dQ (queries x D, D split between the warpgroups)."""
        k_major, mn_major = OperandMajorMode.K, OperandMajorMode.MN
        sdp_mma = sm90_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, cutlass.Float32, (self.num_mma_wg, 1, 1),
            (_WG_ROWS, self.tile_m),
        )
        dk_mma, dv_mma = (
            sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, k_major, mn_major, cutlass.Float32, (self.num_mma_wg, 1, 1),
                (_WG_ROWS, width), warpgroup.OperandSource.RMEM,
            )
            for width in (self.head_dim, self.head_dim_v)
        )
        if self.dq_flat:
            dq_mma = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, mn_major, k_major, cutlass.Float32, (self.num_mma_wg, 1, 1),
                (self.head_dim // self.num_mma_wg, self.tile_m),
            )
        else:
            dq_mma = sm90_utils.make_trivial_tiled_mma(
                self.dtype, self.dtype, k_major, mn_major, cutlass.Float32, (1, self.num_mma_wg, 1),
                (self.tile_m, self.head_dim // self.num_mma_wg),
            )
        return sdp_mma, dk_mma, dv_mma, dq_mma
