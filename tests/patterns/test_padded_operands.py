"""Jagged rows padded to [B, H, N, D]: HSTU's reference (``pytorch_hstu_mha``'s steps, fbgemm's jagged ops in two
pure-torch spellings) is fused with the padding skipped, proven by evaluating how the operands are padded; look-alikes
whose padding is not exactly zero, or whose padded rows the graph does not leave zero, are fused without it or not at
all. Compiled (AOT autograd, no Inductor) and compared in fp32 with eager in float64, every gradient included."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from gdpa_testing import INTERPRETING
from harness import reset
from hstu_reference import HSTUReferenceMHA, jagged_inputs, jagged_to_padded_dense, pad_by_gather, unpad_by_index
from test_soundness import compiled_vs_eager
from torch._dynamo.utils import counters

from gdpa_inductor.patterns.rewrite import rewrite_gdpa

N = 12
LENGTHS = [5, 12, 0, 9]
SKIPS_BOTH = "padded query rows and key columns skipped"
SKIPS_KEYS = "padded key columns skipped"
READS_QKV = "Q, K, V read from their jagged rows"
READS_KV = "; K, V read from their jagged rows"


def _masks_of(model: nn.Module, *inputs) -> list[str]:
    """The mask note of every fused block (a dry run of the pass on the graph Dynamo captures)."""
    notes = []

    def backend(gm, example_inputs):
        notes.extend(r.details.get("mask", "") for r in rewrite_gdpa(gm, example_inputs, dry_run=True) if r.matched)
        return gm.forward

    reset()
    torch.compile(model, backend=backend)(*inputs)
    return notes


class WithExtras(nn.Module):
    """The reference with its optional tensors passed by keyword, as HSTU's layers pass them."""

    def __init__(self, **kwargs):
        super().__init__()
        self.mha = HSTUReferenceMHA(N, **kwargs)

    def forward(self, q, k, v, offsets, num_targets, attn_scale):
        return self.mha(q, k, v, offsets, num_targets=num_targets, attn_scale=attn_scale)


def _inputs(seed: int = 0) -> tuple:
    return jagged_inputs(torch.Generator().manual_seed(seed), LENGTHS)


CASES = {
    "causal": dict(),
    "max_attn_len": dict(max_attn_len=3),
    "not_causal": dict(causal=False),
    "contextual": dict(contextual_seq_len=2),
}


@pytest.mark.parametrize("padding", ["gather", "custom_op"])
@pytest.mark.parametrize("case", CASES)
def test_hstu_reference_skips_its_padding(case, padding):
    model = HSTUReferenceMHA(N, padding=padding, **CASES[case])
    inputs = _inputs()
    notes = _masks_of(model, *inputs)
    assert len(notes) == 1 and SKIPS_BOTH in notes[0] and READS_QKV in notes[0], notes
    rewrites, err = compiled_vs_eager(model, *inputs)
    assert rewrites == 1
    assert err < 1e-5


@pytest.mark.parametrize("padding", ["gather", "custom_op"])
def test_hstu_reference_with_targets_and_attn_scale(padding):
    model = WithExtras(padding=padding)
    q, k, v, offsets = _inputs()
    gen = torch.Generator().manual_seed(3)
    num_targets = torch.tensor([2, 3, 0, 1])
    attn_scale = torch.rand(q.shape[0], generator=gen) + 0.1
    inputs = (q, k, v, offsets, num_targets, attn_scale)
    notes = _masks_of(model, *inputs)
    assert len(notes) == 1 and SKIPS_BOTH in notes[0] and "dense boolean mask" in notes[0], notes
    rewrites, err = compiled_vs_eager(model, *inputs)
    assert rewrites == 1
    assert err < 1e-5


class PaddedBlock(nn.Module):
    """q, k, v padded from jagged rows by a gather, then one of several blocks; ``variant`` picks a look-alike."""

    def __init__(self, variant: str):
        super().__init__()
        self.variant = variant
        self.total = sum(LENGTHS)
        self.rab = nn.Parameter(torch.randn(2, N, N))
        self.shift = nn.Parameter(torch.randn(2, N, 8))

    def _pad(self, x, offsets, fill=0.0):
        total, h, d = x.shape
        if fill == 0.0:
            dense = pad_by_gather(x.reshape(total, h * d), offsets, N)
        else:
            dense = jagged_to_padded_dense(x.reshape(total, h * d), [offsets], [N], fill)
        return dense.view(-1, N, h, d).transpose(1, 2)

    def forward(self, q, k, v, offsets):
        fill = 0.5 if self.variant == "nonzero_padding_value" else 0.0
        q, k, v = (self._pad(x, offsets, fill) for x in (q, k, v))
        if self.variant == "shifted_keys":
            k = k + self.shift
        if self.variant == "reversed_rows":  # zero past the lengths, but not the jagged rows in their order
            lengths = (offsets[1:] - offsets[:-1])[:, None]
            pos = torch.arange(N)[None, :]
            order = torch.where(pos < lengths, lengths - 1 - pos, pos)
            k = torch.gather(k, 2, order[:, None, :, None].expand_as(k))
        s = q @ k.transpose(-2, -1)
        if self.variant == "sigmoid":
            p = torch.sigmoid(s)
        elif self.variant == "causal_sigmoid":
            p = torch.sigmoid(s) * torch.tril(torch.ones(N, N, dtype=torch.bool))
        elif self.variant == "causal_silu_rab":
            p = F.silu(s + self.rab) * torch.tril(torch.ones(N, N, dtype=torch.bool))
        elif self.variant == "band_relu_rab":
            i, j = torch.arange(N)[:, None], torch.arange(N)[None, :]
            p = F.relu((s + self.rab).masked_fill((i - j).abs() > 1, 0.0))
        elif self.variant in ("causal_silu_rab_unpadded", "causal_sigmoid_unpadded"):
            act = F.silu if self.variant.startswith("causal_silu") else torch.sigmoid
            p = act(s + self.rab) * torch.tril(torch.ones(N, N, dtype=torch.bool))
            out = (p @ v).transpose(1, 2).flatten(2, 3)
            return unpad_by_index(out, offsets, int(self.total))
        else:
            p = F.silu(s) / N
        return p @ v


@pytest.mark.parametrize("variant, skipped, reads", [
    ("silu", SKIPS_BOTH, READS_QKV),
    ("sigmoid", SKIPS_KEYS, READS_KV),  # sigmoid(0) = 1/2: a padded query row's output is not zero
    ("causal_sigmoid", None, None),  # causal needs both skipped
    ("causal_silu_rab", None, None),  # silu(rab) at a padded query row is not zero
    ("band_relu_rab", None, None),  # the band reaches a valid key from the first padded row: relu(rab) there
    # the same, but the output goes back to jagged rows: what the padded rows hold is never read
    ("causal_silu_rab_unpadded", SKIPS_BOTH + " (their outputs unread)", READS_QKV),
    ("causal_sigmoid_unpadded", SKIPS_BOTH + " (their outputs unread)", READS_QKV),
    ("nonzero_padding_value", None, None),
    ("shifted_keys", None, None),  # K is not zero past the lengths
    ("reversed_rows", SKIPS_BOTH, None),  # K is zero there, but its rows are not the jagged ones in order
])
def test_padding_is_skipped_only_where_proven(variant, skipped, reads):
    model = PaddedBlock(variant)
    inputs = _inputs(1)
    notes = _masks_of(model, *inputs)
    assert len(notes) == 1, notes
    if skipped is None:
        assert "zero-padded" not in notes[0], notes
    else:
        assert skipped in notes[0] and (SKIPS_BOTH in skipped or SKIPS_BOTH not in notes[0]), notes
    if reads is None:
        assert "jagged rows" not in notes[0], notes
    else:
        assert reads in notes[0], notes
    rewrites, err = compiled_vs_eager(model, *inputs)
    assert rewrites == 1
    assert err < 1e-5


def test_lengths_from_a_lengths_tensor():
    """The lengths may be what the graph reads (a [B] tensor) rather than offsets."""

    class FromLengths(nn.Module):
        def forward(self, q, k, v, lengths):
            valid = (torch.arange(N)[None, :] < lengths[:, None])[:, None, :, None]
            q, k, v = (x * valid for x in (q, k, v))
            return (F.silu(q @ k.transpose(-2, -1)) / N) @ v

    gen = torch.Generator().manual_seed(2)
    inputs = (*(torch.randn(4, 2, N, 8, generator=gen) for _ in range(3)), torch.tensor(LENGTHS))
    notes = _masks_of(FromLengths(), *inputs)
    assert len(notes) == 1 and "past the lengths" in notes[0] and SKIPS_BOTH in notes[0], notes
    rewrites, err = compiled_vs_eager(FromLengths(), *inputs)
    assert rewrites == 1
    assert err < 1e-5


def test_compiled_with_inductor():
    model = HSTUReferenceMHA(N)
    inputs = _inputs()
    reset()
    got = torch.compile(model, backend="gdpa")(*inputs)
    assert counters["gdpa"]["rewrites"] == 1
    torch.testing.assert_close(got, model(*inputs), rtol=1e-5, atol=1e-6)


class RowsUnpadded(nn.Module):
    """The benchmark's spelling: padded by a gather, and back to jagged rows through a [L] index of flat b * N + i
    positions that the caller computes (no proof can read it)."""

    def forward(self, q, k, v, offsets, rows):
        q, k, v = (pad_by_gather(x.reshape(x.shape[0], -1), offsets, N).view(-1, N, 2, 8).transpose(1, 2)
                   for x in (q, k, v))
        s = torch.einsum("bhxa,bhya->bhxy", q, k)
        p = F.silu(s) / N * torch.tril(torch.ones(N, N, dtype=torch.bool))
        out = torch.einsum("bhxy,bhyv->bhxv", p, v)
        return out.transpose(1, 2).reshape(-1, 16)[rows]


def _rows_inputs(lengths: list[int], seed: int) -> tuple:
    q, k, v, offsets = jagged_inputs(torch.Generator().manual_seed(seed), lengths)
    rows = torch.cat([z * N + torch.arange(min(n, N)) for z, n in enumerate(lengths)])
    return q, k, v, offsets, rows


def test_samples_longer_than_the_padding_are_cut_as_it_cuts_them():
    """A sample of 17 rows padded to N = 12 keeps its first 12: the op reads the jagged rows with the rows used cut
    to N, and the rows past N get no gradient."""
    inputs = _rows_inputs([5, 17, 0, 9], seed=4)
    notes = _masks_of(RowsUnpadded(), *inputs)
    assert len(notes) == 1 and READS_QKV in notes[0], notes
    rewrites, err = compiled_vs_eager(RowsUnpadded(), *inputs)
    assert rewrites == 1
    assert err < 1e-5


def test_jagged_rows_of_another_total_in_one_compiled_model():
    """Batches of other jagged totals (a recompile with the total symbolic) keep reading the jagged rows."""
    reset()
    model = RowsUnpadded()
    compiled = torch.compile(model, backend="gdpa")
    for seed, lengths in enumerate(([5, 12, 0, 9], [3, 7, 12, 1], [8, 8, 8, 8])):
        inputs = _rows_inputs(lengths, seed)
        got = compiled(*inputs)
        torch.testing.assert_close(got, model(*inputs), rtol=1e-5, atol=1e-6)
    assert counters["gdpa"]["rewrites"] >= 2


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_offsets_past_the_rows_are_clamped_to_them(backend, monkeypatch):
    """Offsets describing more rows than q, k, v hold (not a valid batch): the op clamps them to the rows (the
    Triton kernels' schedule, the reference's slices), so that on a GPU it never reads past the tensors."""
    from gdpa_inductor import config
    from gdpa_inductor.kernels import reference_varlen
    from gdpa_inductor.lowering import varlen_ops

    if backend == "triton" and not INTERPRETING:
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    monkeypatch.setattr(config, "backend", backend)
    seen = []
    sides, index = varlen_ops.sides, reference_varlen._Rows.index

    def scheduled(q, k, *rest):
        found = sides(q, k, *rest)
        seen.extend((int((side.starts + side.lengths).max()), x.shape[0])
                    for side, x in ((found[1], q), (found[2], k)) if side.jagged)
        return found

    def sliced(self, x, z):
        found = index(self, x, z)
        if self.offsets is not None:
            seen.append((found[0].stop, x.shape[0]))
        return found

    monkeypatch.setattr(varlen_ops, "sides", scheduled)
    monkeypatch.setattr(reference_varlen._Rows, "index", sliced)
    q, k, v, offsets = _rows_inputs([5, 12, 0, 9], seed=5)[:4]
    rows = torch.cat([z * N + torch.arange(min(n, N)) for z, n in enumerate([5, 12, 0, 9])])
    reset()
    compiled = torch.compile(RowsUnpadded(), backend="gdpa")
    compiled(q, k, v, offsets, rows)  # compiled on a valid batch: the jagged rows are read in place
    seen.clear()
    got = compiled(q, k, v, torch.tensor([0, 5, 17, 17, 40]), rows)  # 40 > the 26 rows
    assert counters["gdpa"]["rewrites"] == 1 and seen
    assert all(end <= total for end, total in seen), seen
    assert bool(got.isfinite().all())
