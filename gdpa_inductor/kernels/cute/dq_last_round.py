"""dQ rounded inside the CuTe backward, by the last CTA of each head to finish (``GdpaBwdSm90``'s ``dq_last_round``).

With fp32 dQ sums the backward otherwise leaves a buffer that one more pass scales, permutes and rounds
(``bwd_results.dq_of_fragments``): 0.65 ms of a 14.8 ms forward and backward at 2048², B = 288, H = 4 (H100), a
read of the whole buffer from HBM. Here each CTA, once its last reduce-add into the buffer
is complete, counts itself in per head (one int32 per (sample, head), zero-filled); the CTA that counts last rounds
that head's sums while they are still in L2, with its two consumer warpgroups, whose tensor cores have nothing
left to do. The same CTA is not last for every head, so the work spreads over the SMs. It also leaves the sums and the
count zero behind it, so that the launcher keeps the buffer for the next call instead of zero-filling a fresh one
(``dq_workspace``).

Ordering: a CTA's reduce-adds (async proxy) are complete when its bulk wait returns; a proxy fence then orders them
before its release-acquire count at GPU scope, and the last CTA reads the sums after acquiring every count (its
threads after a CTA barrier with the counting thread and an acquire fence of their own), through L2 (``.cg``). Its
zeros reach the next call's reduce-adds across the kernel boundary.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .wgmma import pack_pair

# wgmma's accumulator (``common/dq_fragments.py``' comment): a warpgroup's thread 32 w + 4 g + t holds, per group
# of eight query columns j, the values c + 2 r at row (of dQᵀ, D) 16 w + 8 r + g and column 8 j + 2 t + c, which the
# kernel stores four at a time, a j's 128 threads in a row
GROUP_WORDS = 512
COLUMNS_PER_GROUP = 8
# tiles whose sums a thread loads before it rounds the first: one L2 round trip per this many
TILES_IN_FLIGHT = 2
# row-major sums (64-row tiles): 16-byte groups a thread loads before it rounds the first
GROUPS_IN_FLIGHT = 16


@cute.jit
def order_reduce_adds():
    """The dQ warp, each lane after waiting for its own bulk reduce-adds to complete (not only to be read): those
    writes ordered before the generic proxy's accesses (a proxy fence), then before whatever lane 0 does next."""
    cute.arch.fence_proxy("async.global")
    cute.arch.sync_warp()


@cute.jit
def count_arrival(count: cute.Pointer, arrivals: cutlass.Int32, last: cute.Tensor):
    """One thread, after ``order_reduce_adds``: this CTA counted in at ``count`` (release-acquire, GPU scope);
    ``last[0]`` = 1 where it was the ``arrivals``-th, else 0. The last leaves the count zero for the next call
    (``dq_workspace``): every CTA of the head has counted in."""
    before = cute.arch.atomic_add(count, cutlass.Int32(1), sem="acq_rel", scope="gpu")
    last[0] = cutlass.Int32(0)
    if before == arrivals - 1:
        last[0] = cutlass.Int32(1)
        cute.arch.inline_ptx("st.global.relaxed.gpu.b32 [{$r0}], {$r1};", read_only_args=[count, cutlass.Int32(0)])


@cute.jit
def _load_group(src: cute.Pointer, ok: cutlass.Boolean):
    """Four fp32 sums from L2 (``ld.global.cg``: never an L1 line this SM read before the other CTAs' adds), where
    ``ok``."""
    return cute.arch.inline_ptx(
        "ld.global.cg.v4.f32 { {$w0}, {$w1}, {$w2}, {$w3} }, [{$r0}];",
        write_only_types=[cutlass.Float32] * 4, read_only_args=[src], predicate=ok,
    )


@cute.jit
def _clear_group(dst: cute.Pointer, ok: cutlass.Boolean):
    """Zeros in place of four sums the thread has loaded and used, where ``ok``: the buffer left zeroed for the next
    call (``dq_workspace``) while its lines are still in L2. Stored once the loaded values are in use, not straight
    after the load: there the store to the same address held the thread until the load returned."""
    zero = cutlass.Int32(0)
    cute.arch.inline_ptx("st.global.v4.b32 [{$r0}], { {$r1}, {$r2}, {$r3}, {$r4} };",
                         read_only_args=[dst, zero, zero, zero, zero], predicate=ok)


@cute.jit
def _permute(a: cutlass.Int32, b: cutlass.Int32, selector: cutlass.Int32) -> cutlass.Int32:
    return cute.arch.inline_ptx(
        "prmt.b32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[cutlass.Int32], read_only_args=[a, b, selector]
    )


@cute.jit
def _store_pair(dst: cute.Pointer, lo: cutlass.Int32, hi: cutlass.Int32, ok: cutlass.Boolean):
    cute.arch.inline_ptx("st.global.v2.b32 [{$r0}], { {$r1}, {$r2} };", read_only_args=[dst, lo, hi], predicate=ok)


@cute.jit
def _load_run(held: cute.Tensor, src: cute.Pointer, start: cutlass.Int32, total: cutlass.Int32):
    """A thread's ``GROUPS_IN_FLIGHT`` groups of four sums from word ``start`` of ``src`` on (256 threads' groups in
    a row each time; those before word ``total``) into ``held``."""
    for u in cutlass.range_constexpr(GROUPS_IN_FLIGHT):
        at = start + u * 256 * 4
        v = _load_group(src + at, at < total)
        for e in cutlass.range_constexpr(4):
            held[u * 4 + e] = v[e]


@cute.jit
def round_rows(sums: cute.Pointer, out: cute.Pointer, total: cutlass.Int32, factor: cutlass.Float32,
               tid: cutlass.Int32, element: cutlass.Constexpr):
    """A head's dQ (``out``: ``total`` values in ``element`` from the pointer on, rows of D one after another) =
    ``factor`` x its fp32 sums in the same order (``sums``), rounded once, by 256 threads (``tid``: 0..255), each
    loading 16 bytes and storing 8 at a time, a warp's 32 in a row."""
    held = cute.make_rmem_tensor(cute.make_layout(GROUPS_IN_FLIGHT * 4), cutlass.Float32)
    step = GROUPS_IN_FLIGHT * 256 * 4
    _load_run(held, sums, tid * 4, total)
    for start in cutlass.range(tid * 4, total, step, unroll=1):
        for u in cutlass.range_constexpr(GROUPS_IN_FLIGHT):
            at = start + u * 256 * 4
            _store_pair(out + at, pack_pair(held[4 * u] * factor, held[4 * u + 1] * factor, element),
                        pack_pair(held[4 * u + 2] * factor, held[4 * u + 3] * factor, element), at < total)
            _clear_group(sums + at, at < total)
        _load_run(held, sums, start + step, total)


@cute.jit
def _store_chunk(dst: cute.Pointer, chunk, ok: cutlass.Boolean):
    cute.arch.inline_ptx(
        "st.global.v4.b32 [{$r0}], { {$r1}, {$r2}, {$r3}, {$r4} };",
        read_only_args=[dst, chunk[0], chunk[1], chunk[2], chunk[3]], predicate=ok,
    )


@cute.jit
def _load_tiles(held: cute.Tensor, src: cute.Pointer, m0: cutlass.Int32, num_tiles: cutlass.Int32,
                tile_m: cutlass.Constexpr, head_dim: cutlass.Constexpr):
    """A thread's values of tiles ``m0`` on (``TILES_IN_FLIGHT`` of them, those before ``num_tiles``) into ``held``,
    from its first value of the head's sums at ``src``."""
    groups = tile_m * head_dim // 2 // GROUP_WORDS
    for i in cutlass.range_constexpr(TILES_IN_FLIGHT):
        for j in cutlass.range_constexpr(groups):
            v = _load_group(src + ((m0 + i) * tile_m * head_dim + j * GROUP_WORDS), m0 + i < num_tiles)
            for e in cutlass.range_constexpr(4):
                held[(i * groups + j) * 4 + e] = v[e]


@cute.jit
def round_fragments(
    sums: cute.Tensor, out: cute.Tensor, num_queries: cutlass.Int32, factor: cutlass.Float32, tid: cutlass.Int32,
    stage: cute.Pointer, barrier_id: cutlass.Int32, tile_m: cutlass.Constexpr, head_dim: cutlass.Constexpr,
    element: cutlass.Constexpr,
):
    """A head's dQ (``out``: (Nq, D) in ``element``, D contiguous) = ``factor`` x its fp32 sums (``sums``: (rows, D),
    whole ``tile_m``-row tiles, each tile's dQᵀ per warpgroup half of D in the accumulators' order), rounded once, by
    the 256 threads of two warpgroups (``tid``: 0..255; warpgroup ``tid // 128`` the half of D its own matmuls held),
    through ``TILES_IN_FLIGHT`` tiles of rows in shared memory at ``stage`` (1024-byte aligned, free), the threads
    meeting at named barrier ``barrier_id``.
    Per group j a thread loads its four values (16 contiguous bytes: its two query columns at D rows r = 0, 1),
    rounds them into two pairs, swaps one with the thread of the neighbouring D row (lane ^ 4) and stores two words
    of adjacent D in one query row into the staged rows (16-byte chunks swizzled by the row, so that a warp's eight
    rows of one chunk fall in distinct banks); the rows then leave in 16-byte chunks, a warp's 32 over two whole
    rows. The next tiles' sums load while the staged rows are stored."""
    half_words = tile_m * head_dim // 2
    groups = half_words // GROUP_WORDS
    row_words = head_dim // 2
    row_chunks = head_dim // 8
    tile_chunks = tile_m * row_chunks
    half = tid // 128
    lane = tid % 32
    warp = tid % 128 // 32
    row_group = lane // 4
    pair = lane % 4
    odd = row_group % 2
    # the odd row keeps its second column's pair and sends the first
    keep_second = cutlass.Int32(0) - odd
    # prmt's byte choices: (kept, received) halves in D's order, the received first in the odd row
    selector_lo = cutlass.Int32(0x5410) + odd * (0x1054 - 0x5410)
    selector_hi = cutlass.Int32(0x7632) + odd * (0x3276 - 0x7632)
    chunk_r0 = half * (row_chunks // 2) + 2 * warp
    staged = cute.make_tensor(
        cute.make_ptr(cutlass.Int32, stage.toint(), cute.AddressSpace.smem, assumed_align=1024),
        cute.make_layout(TILES_IN_FLIGHT * tile_m * row_words),
    )
    row_stride = out.layout((1, 0))
    src_head = sums.iterator + half * half_words + tid % 128 * 4
    num_tiles = cute.ceil_div(num_queries, tile_m)
    held = cute.make_rmem_tensor(cute.make_layout(TILES_IN_FLIGHT * groups * 4), cutlass.Float32)
    _load_tiles(held, src_head, 0, num_tiles, tile_m, head_dim)
    for m0 in cutlass.range(0, num_tiles, TILES_IN_FLIGHT, unroll=1):
        for i in cutlass.range_constexpr(TILES_IN_FLIGHT):
            for j in cutlass.range_constexpr(groups):
                k = (i * groups + j) * 4
                first = pack_pair(held[k] * factor, held[k + 2] * factor, element)
                second = pack_pair(held[k + 1] * factor, held[k + 3] * factor, element)
                _clear_group(src_head + ((m0 + i) * tile_m * head_dim + j * GROUP_WORDS), m0 + i < num_tiles)
                swap = (first ^ second) & keep_second
                kept = first ^ swap
                received = cute.arch.shuffle_sync_bfly(second ^ swap, 4)
                row = COLUMNS_PER_GROUP * j + 2 * pair + odd
                word = i * tile_m * row_words + row * row_words + row_group // 2
                staged[word + (chunk_r0 ^ row % 8) * 4] = _permute(kept, received, selector_lo)
                staged[word + ((chunk_r0 + 1) ^ row % 8) * 4] = _permute(kept, received, selector_hi)
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=256)
        _load_tiles(held, src_head, m0 + TILES_IN_FLIGHT, num_tiles, tile_m, head_dim)
        for c in cutlass.range_constexpr(TILES_IN_FLIGHT * tile_chunks // 256):
            flat = c * 256 + tid
            i = flat // tile_chunks
            row = flat % tile_chunks // row_chunks
            chunk = flat % row_chunks
            src = i * tile_m * row_words + row * row_words + (chunk ^ row % 8) * 4
            words = cute.make_tensor(staged.iterator + src, cute.make_layout(4)).load()
            query = (m0 + i) * tile_m + row
            _store_chunk(out.iterator + (query * row_stride + chunk * 8), words, query < num_queries)
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=256)
