"""Tiles and stages of the wide-head CuTe backward (``GdpaBwdWideSm90``), chosen by shared-memory bytes; plain
Python, so the launcher and the CPU tests read them without cutlass-dsl."""

from __future__ import annotations

import dataclasses

# Hopper's shared memory per CTA (227 KiB), less what the mbarriers and the 1 KiB alignment of each buffer take
SMEM_BYTES = 227 * 1024 - 1024


@dataclasses.dataclass(frozen=True)
class WideBwdPlan:
    """64 keys per CTA and 64 queries per step (``tile_n``, ``tile_m``); Q in ``q_stages``, dO in
    ``do_stages``, Pᵀ and dSᵀ in ``pds_stages`` stages (two: a warpgroup writes a stage again only after the
    next step's barrier, which the other passes once done reading it); dQ handed to the dQ warp in ``dq_chunks``
    chunks of ``dq_width`` columns per warpgroup."""

    do_stages: int
    dq_width: int
    dq_chunks: int
    tile_n: int = 64
    tile_m: int = 64
    q_stages: int = 2
    pds_stages: int = 2

    @classmethod
    def for_head_dims(cls, head_dim: int, head_dim_v: int, dq_bytes: int, elem_bytes: int = 2) -> WideBwdPlan:
        """The plan for head dims D and Dv, dQ summed in ``dq_bytes``-byte values: two dO stages where they fit."""
        dq_width = min(64, head_dim // 2)
        for do_stages in (2, 1):
            plan = cls(do_stages, dq_width, head_dim // (2 * dq_width))
            if plan.smem_bytes(head_dim, head_dim_v, dq_bytes, elem_bytes) <= SMEM_BYTES:
                return plan
        raise ValueError(f"head dims ({head_dim}, {head_dim_v}) do not fit the wide-head backward's shared memory")

    def smem_bytes(self, head_dim: int, head_dim_v: int, dq_bytes: int, elem_bytes: int = 2) -> int:
        """Shared-memory bytes of the buffers: K, V, the Q and dO stages, Pᵀ/dSᵀ and the two dQ buffers."""
        kv = self.tile_n * (head_dim + head_dim_v) * elem_bytes
        q_do = self.tile_m * (self.q_stages * head_dim + self.do_stages * head_dim_v) * elem_bytes
        pds = 2 * self.pds_stages * self.tile_n * self.tile_m * elem_bytes
        dq = 2 * self.tile_m * self.dq_width * dq_bytes
        return kv + q_do + pds + dq
