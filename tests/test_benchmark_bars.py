"""``benchmarks/op.py bars``: the bars it checks against a run's rows, the ratios it derives from a row, and the
correctness check each shape passes before it is timed (no GPU needed: rows are made up, the check runs the op's
reference path on CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import op as bars_mod  # noqa: E402
from benchmarks.harness.operands import META_SHAPES  # noqa: E402

N_BARS = 1 + 2 * len(META_SHAPES) + sum(nk == 256 for _, nk in META_SHAPES) + 1


def _row(kind, d, nq, nk, **rates):
    return bars_mod.with_ratios(dict(kind=kind, d=d, nq=nq, nk=nk, **rates))


def rows_meeting_every_bar():
    rows = []
    for nq, nk in META_SHAPES:
        rows.append(_row("fwd", 128, nq, nk, gdpa=700.0, sdpa=600.0, fa4=500.0))
        rows.append(_row("fb", 128, nq, nk, gdpa=600.0, sdpa=500.0, fa4=550.0))
        rows.append(_row("fwd", 64, nq, nk, gdpa=300.0, sdpa=280.0, fa4=250.0))
    rows[-1]["gdpa"] = 460.0  # D=64 at 2048x256: the best shape
    return rows


def _missed(bars):
    return sorted((b["bar"], b["shape"]) for b in bars if not b["met"])


def test_rows_that_clear_every_bar_meet_all_of_them():
    bars = bars_mod.check_bars(rows_meeting_every_bar())
    assert len(bars) == N_BARS == 20
    assert _missed(bars) == []
    d64 = [b for b in bars if b["bar"].startswith("D=64")]
    assert [(b["shape"], b["value"]) for b in d64] == [("2048x256", 460.0)]


def test_ratios_are_over_the_faster_softmax_provider():
    row = _row("fwd", 128, 512, 512, gdpa=630.0, sdpa=610.0, fa4=500.0)
    assert row["gdpa_vs_best_softmax"] == pytest.approx(630 / 610)
    assert row["gdpa_vs_fa4"] == pytest.approx(630 / 500)
    assert "gdpa_vs_fa4" not in _row("fwd", 128, 512, 512, gdpa=630.0, sdpa=610.0)
    assert "gdpa_vs_best_softmax" not in _row("fwd", 128, 512, 512, sdpa=610.0, fa4=500.0)


@pytest.mark.parametrize(
    "kind, d, shape, rates, missed",
    [
        ("fb", 128, (2048, 2048), dict(gdpa=574.0, sdpa=500.0, fa4=550.0),
         [("D=128 forward+backward / best softmax", "2048x2048")]),
        # over FA4 by 1.25x, over SDPA by less than 1.05x: the best softmax provider is SDPA
        ("fwd", 128, (256, 256), dict(gdpa=400.0, sdpa=385.0, fa4=300.0),
         [("D=128 forward / best softmax", "256x256")]),
        ("fwd", 128, (1024, 256), dict(gdpa=500.0, sdpa=450.0, fa4=410.0),
         [("D=128 forward / flash-attn-4", "1024x256")]),
        ("fwd", 128, (2048, 2048), dict(gdpa=619.0, sdpa=560.0, fa4=580.0),
         [("D=128 forward TF/s", "2048x2048")]),
        ("fwd", 64, (2048, 256), dict(gdpa=449.0, sdpa=280.0, fa4=250.0),
         [("D=64 forward TF/s (best shape)", "2048x256")]),
    ],
)
def test_one_figure_short_of_its_bar_misses_that_bar_only(kind, d, shape, rates, missed):
    rows = [r for r in rows_meeting_every_bar() if (r["kind"], r["d"], (r["nq"], r["nk"])) != (kind, d, shape)]
    rows.append(_row(kind, d, *shape, **rates))
    assert _missed(bars_mod.check_bars(rows)) == missed


def test_without_flash_attn_4_its_bars_fail_and_sdpa_is_the_best_softmax():
    rows = [{k: v for k, v in r.items() if not k.startswith("fa4") and k != "gdpa_vs_fa4"}
            for r in rows_meeting_every_bar()]
    rows = [bars_mod.with_ratios(r) for r in rows]
    bars = bars_mod.check_bars(rows)
    assert _missed(bars) == sorted(("D=128 forward / flash-attn-4", f"{nq}x{nk}") for nq, nk in META_SHAPES
                                   if nk == 256)
    assert all(b["value"] is None for b in bars if not b["met"])


def test_a_shape_that_was_not_timed_fails_its_bars():
    rows = [r for r in rows_meeting_every_bar() if (r["d"], r["nq"], r["nk"]) != (128, 512, 512)]
    assert _missed(bars_mod.check_bars(rows)) == [("D=128 forward / best softmax", "512x512"),
                                                   ("D=128 forward+backward / best softmax", "512x512")]


def _operands(dtype=torch.float32):
    torch.manual_seed(0)
    q, do = (torch.randn(2, 2, 33, 16, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(2, 2, 40, 16, dtype=dtype) for _ in range(2))
    return q, k, v, do


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
def test_the_shape_check_passes_the_op(act):
    errs = bars_mod.check_shape(*_operands(), act, 0.25, 1 / 40)
    assert errs["passed"], errs
    assert set(errs) == {f"{n}_{w}" for n in ("o", "dq", "dk", "dv") for w in ("op", "eager")} | {"passed"}


def test_the_shape_check_fails_an_op_off_by_one_percent(monkeypatch):
    real = bars_mod.gdpa
    monkeypatch.setattr(bars_mod, "gdpa", lambda *a, **kw: real(*a, **kw) * 1.01)
    errs = bars_mod.check_shape(*_operands(), "gelu_tanh", 0.25, 1 / 40)
    assert not errs["passed"]
    assert errs["o_op"] > 100 * errs["o_eager"]


@pytest.mark.parametrize("z, nq, nk, budget, kept", [(8, 32, 32, 2 * 4 * 32 * 32 * 2, 2), (8, 32, 32, 1 << 30, 8),
                                                     (8, 64, 64, 100, 1)])
def test_inductor_runs_on_the_samples_whose_scores_fit_the_budget(monkeypatch, z, nq, nk, budget, kept):
    monkeypatch.setattr(bars_mod, "NxN_BUDGET", budget)
    q, do = torch.randn(z, 4, nq, 16), torch.randn(z, 4, nq, 16)
    k, v = torch.randn(z, 4, nk, 16), torch.randn(z, 4, nk, 16)
    parts = bars_mod.inductor_operands(q, k, v, do)
    assert [t.shape[0] for t in parts] == [kept] * 4
    assert torch.equal(parts[0], q[:kept]) and torch.equal(parts[3], do[:kept])
