"""A jagged block's padded output read back by an integer index of its rows is gathered from the op's own output (no
padded copy), for every index the read can take; any other read keeps the padded output. Compiled (AOT autograd, no
Inductor) against eager in float64, every gradient included."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import reset
from hstu_reference import jagged_inputs, pad_by_gather
from test_soundness import compiled_vs_eager

from gdpa_inductor.patterns.rewrite import rewrite_gdpa

N, H, DV = 12, 2, 8
LENGTHS = [5, 17, 0, 9]  # the 17 rows are cut to N by the padding


def _rows(lengths) -> torch.Tensor:
    return torch.cat([z * N + torch.arange(min(n, N)) for z, n in enumerate(lengths)])


INDEXES = {
    "valid_rows": lambda rows: rows,
    "every_position": lambda rows: torch.arange(len(LENGTHS) * N),  # padded positions read zeros
    "negative": lambda rows: rows - len(LENGTHS) * N,
    "int32": lambda rows: rows.int(),
    "two_dims": lambda rows: rows[: len(rows) // 2 * 2].view(-1, 2),
    "repeated_reversed": lambda rows: torch.cat([rows.flip(0), rows[:3]]),
}

READS = {
    # (how the padded output [B, H, N, Dv] is read, whether its rows are gathered from the op's output)
    "rows_of_h_dv": (lambda out, idx: out.transpose(1, 2).reshape(-1, H * DV)[idx], True),
    "rows_of_h_and_dv": (lambda out, idx: out.transpose(1, 2).reshape(-1, H, DV)[idx], True),
    "flatten_then_view": (lambda out, idx: out.transpose(1, 2).flatten(2, 3).view(-1, H * DV)[idx], True),
    "permute": (lambda out, idx: out.permute(0, 2, 1, 3).flatten(0, 1)[idx], True),
    "index_in_a_tuple": (lambda out, idx: out.transpose(1, 2).reshape(-1, H * DV)[(idx,)], True),
    "index_select": (lambda out, idx: out.transpose(1, 2).reshape(-1, H * DV).index_select(0, idx), True),
    "torch_index_select": (lambda out, idx: torch.index_select(out.transpose(1, 2).flatten(0, 1), 0, idx), True),
    "index_select_of_columns": (lambda out, idx: out.transpose(1, 2).reshape(-1, H * DV).index_select(
        1, idx % (H * DV)), False),
    # a reshape that copies: its rows are not the padded batch's
    "rows_without_transpose": (lambda out, idx: out.reshape(-1, H * DV)[idx], False),
    "second_reader": (lambda out, idx: out.transpose(1, 2).reshape(-1, H * DV)[idx] + out.mean(), False),
    "index_of_heads": (lambda out, idx: out.transpose(1, 2).reshape(-1, H * DV)[:, idx % (H * DV)], False),
}


class PaddedRowsRead(nn.Module):
    """Jagged q, k, v padded by a gather, causal silu attention, and the padded output read by ``read``."""

    def __init__(self, read):
        super().__init__()
        self.read = read

    def forward(self, q, k, v, offsets, idx):
        q, k, v = (pad_by_gather(x.reshape(x.shape[0], -1), offsets, N).view(-1, N, H, DV).transpose(1, 2)
                   for x in (q, k, v))
        s = torch.einsum("bhxa,bhya->bhxy", q, k)
        p = F.silu(s) / N * torch.tril(torch.ones(N, N, dtype=torch.bool))
        return self.read(torch.einsum("bhxy,bhyv->bhxv", p, v), idx)


def _rewritten_code(model: nn.Module, *inputs) -> str:
    codes = []

    def backend(gm, example_inputs):
        rewrite_gdpa(gm, example_inputs)
        codes.append(gm.code)
        return gm.forward

    reset()
    torch.compile(model, backend=backend)(*inputs)
    return "\n".join(codes)


def _inputs(index: str, seed: int = 3) -> tuple:
    q, k, v, offsets = jagged_inputs(torch.Generator().manual_seed(seed), LENGTHS, h=H, d=DV)
    return q, k, v, offsets, INDEXES[index](_rows(LENGTHS))


@pytest.mark.parametrize("index", INDEXES)
def test_rows_read_by_any_index_are_gathered_from_the_op(index):
    model = PaddedRowsRead(READS["rows_of_h_dv"][0])
    inputs = _inputs(index)
    code = _rewritten_code(model, *inputs)
    assert "varlen_fwd_direct" in code and "index_copy" not in code, code
    rewrites, err = compiled_vs_eager(model, *inputs)
    assert rewrites == 1
    assert err < 1e-5


@pytest.mark.parametrize("read", READS)
def test_only_reads_that_keep_the_rows_skip_the_padded_output(read):
    fn, direct = READS[read]
    model = PaddedRowsRead(fn)
    inputs = _inputs("valid_rows", seed=4)
    code = _rewritten_code(model, *inputs)
    assert "varlen_fwd_direct" in code, code
    assert ("index_copy" not in code) == direct, code
    rewrites, err = compiled_vs_eager(model, *inputs)
    assert rewrites == 1
    assert err < 1e-5


class RandomBlock(nn.Module):
    """``PaddedRowsRead`` with a drawn activation and mask (causal, a causal window, or none)."""

    def __init__(self, act, mask: str):
        super().__init__()
        self.act, self.mask = act, mask

    def forward(self, q, k, v, offsets, idx):
        q, k, v = (pad_by_gather(x.reshape(x.shape[0], -1), offsets, N).view(-1, N, H, DV).transpose(1, 2)
                   for x in (q, k, v))
        p = self.act(q @ k.transpose(-2, -1) * DV**-0.5) / N
        i = torch.arange(N)
        if self.mask == "causal":
            p = p * (i[:, None] >= i[None, :])
        elif self.mask == "window":
            p = p * ((i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] <= 3))
        return (p @ v).transpose(1, 2).reshape(-1, H * DV)[idx]


@pytest.mark.parametrize("seed", range(12))
def test_drawn_batches_and_indexes(seed):
    """Drawn lengths (empty samples, samples longer than N), indexes (padded positions, repeats, negative), an
    activation that is zero at zero and a mask: the read is gathered from the op's output and gives eager's values."""
    rng = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 2 * N, (3,), generator=rng).tolist()
    act = (F.silu, F.relu, F.gelu)[seed % 3]
    mask = ("causal", "window", "none")[seed // 3 % 3]
    q, k, v, offsets = jagged_inputs(rng, lengths, h=H, d=DV)
    idx = torch.randint(-3 * N, 3 * N, (int(torch.randint(1, 40, (1,), generator=rng)),), generator=rng)
    model = RandomBlock(act, mask)
    code = _rewritten_code(model, q, k, v, offsets, idx)
    assert "varlen_fwd_direct" in code and "index_copy" not in code, code
    rewrites, err = compiled_vs_eager(model, q, k, v, offsets, idx)
    assert rewrites == 1
    assert err < 1e-5
