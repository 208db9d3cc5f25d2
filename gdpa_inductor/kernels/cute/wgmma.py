"""wgmma helpers shared by the CuTe-DSL Hopper kernels: k-block loops on a fresh MMA atom, and the fp32
accumulator seen as the register A operand of the next matmul."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup


@cute.jit
def operand_a_like(acc: cute.Tensor, pv_mma: cute.TiledMma, dtype: cutlass.Constexpr) -> cute.Tensor:
    """Registers for P as the register A operand of the P·V wgmma, in the input dtype.

    For 16-bit inputs a thread's accumulator values of an m64nN tile are exactly its A-operand values of the
    m64k16 blocks along N: values (2 cols, 2 row halves, N/8 col groups) regroup as k-blocks of 2 col groups
    each. Only the layout changes, no data moves between threads.
    """
    c = acc.layout
    a_vals = pv_mma.tv_layout_A.shape[1]
    k_blocks = cute.size(c, mode=[0]) // cute.size(a_vals)
    operand_layout = cute.make_layout(
        (a_vals, c.shape[1], (c.shape[2], k_blocks)),
        stride=(c.stride[0], c.stride[1], (c.stride[2], cute.size(a_vals, mode=[2]) * c.stride[0][2])),
    )
    return cute.make_rmem_tensor(operand_layout, dtype)


@cute.jit
def store_operand_a(acc: cute.Tensor, operand: cute.Tensor):
    """Converts the fp32 accumulator into the operand registers, seen through the accumulator's layout."""
    cute.make_tensor(operand.iterator, acc.layout).store(acc.load().to(operand.element_type))


@cute.jit
def pack_operand_a(acc: cute.Tensor, operand: cute.Tensor):
    """``store_operand_a`` by one ``cvt.rn`` per pair of values in inline PTX: a register tensor written once and
    read by two consumers (the stmatrix store of dS, then the dK matmul) had its conversion repeated for the second,
    which the compiler cannot do to inline PTX (16 instructions per query tile of the backward at D = 128)."""
    pairs = operand_pairs(acc, operand)
    for i in cutlass.range_constexpr(cute.size(acc) // 2):
        pairs[i] = pack_pair(acc[2 * i], acc[2 * i + 1], operand.element_type)


def operand_pairs(acc: cute.Tensor, operand: cute.Tensor) -> cute.Tensor:
    """The operand registers seen through the accumulator's layout as 32-bit words: word i holds its values 2 i
    (low half) and 2 i + 1."""
    return cute.recast_tensor(cute.make_tensor(operand.iterator, acc.layout), cutlass.Int32)


@cute.jit
def pack_pair(lo: cutlass.Float32, hi: cutlass.Float32, dtype: cutlass.Constexpr) -> cutlass.Int32:
    """Two fp32 values rounded to 16 bits by one ``cvt.rn``, ``lo`` in the low half."""
    kind = "bf16x2" if cutlass.const_expr(dtype == cutlass.BFloat16) else "f16x2"
    return cute.arch.inline_ptx(
        f"cvt.rn.{kind}.f32 {{$w0}}, {{$r0}}, {{$r1}};", write_only_types=[cutlass.Int32], read_only_args=[hi, lo],
    )


@cute.jit
def fresh_gemm(
    tiled_mma: cute.TiledMma, acc: cute.Tensor, a: cute.Tensor, b: cute.Tensor, accumulate: cutlass.Constexpr
):
    """acc (+)= a · b over the k-blocks, on a fresh atom (its ACCUMULATE field is rebound per k-block)."""
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, accumulate)
    for kb in cutlass.range_constexpr(cute.size(a, mode=[2])):
        cute.gemm(atom, acc, a[None, None, kb], b[None, None, kb], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
