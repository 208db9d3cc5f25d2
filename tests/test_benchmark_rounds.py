"""benchmarks/harness/timing.py's ``median_over_rounds``: the order each round times the providers in, the median it
reports, and a provider that fails (no GPU needed: do_bench is replaced by a recorder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness.timing import median_over_rounds  # noqa: E402


@pytest.fixture
def recorder(monkeypatch):
    calls: list[str] = []

    def fake_do_bench(fn, return_mode, **bench):
        assert return_mode == "median"
        name, ms = fn()
        calls.append(name)
        return ms

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    return calls


def _provider(name, times):
    it = iter(times)
    return lambda: (name, next(it))


@pytest.mark.parametrize("rounds", [1, 3, 4])
def test_each_round_rotates_the_order(recorder, rounds):
    fns = {n: _provider(n, [1.0] * rounds) for n in ("a", "b", "c")}
    median_over_rounds(fns, rounds=rounds)
    orders = [recorder[3 * r: 3 * r + 3] for r in range(rounds)]
    expected = [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]][:rounds]
    assert orders == expected


def test_reports_the_median_of_the_rounds(recorder):
    fns = {"a": _provider("a", [3.0, 1.0, 2.0]), "b": _provider("b", [9.0, 4.0, 5.0])}
    assert median_over_rounds(fns, rounds=3) == {"a": 2.0, "b": 5.0}


def test_a_failing_provider_gives_none_and_is_not_retried(recorder, capsys):
    def broken():
        recorder.append("broken")
        raise RuntimeError("no kernel for this shape")

    fns = {"ok": _provider("ok", [1.0, 2.0, 3.0]), "broken": broken}
    assert median_over_rounds(fns, rounds=3) == {"ok": 2.0, "broken": None}
    assert recorder.count("broken") == 1
    assert "broken failed: RuntimeError" in capsys.readouterr().out


def test_settle_runs_each_provider_untimed_before_its_timing(monkeypatch):
    """With ``settle_ms`` every timing of a provider comes right after untimed calls of that same provider (its
    own load sets the clocks, not its predecessor's); without it, nothing runs untimed."""
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)
    events: list[str] = []

    def fake_do_bench(fn, return_mode, **bench):
        events.append("timed")
        return 1.0

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    fns = {n: (lambda n=n: events.append(n)) for n in ("a", "b")}
    median_over_rounds(fns, rounds=2, settle_ms=2.0)
    timed_at = [i for i, e in enumerate(events) if e == "timed"]
    assert len(timed_at) == 4
    starts = [0] + [i + 1 for i in timed_at[:-1]]
    for start, end, name in zip(starts, timed_at, ["a", "b", "b", "a"]):
        assert len(events[start:end]) >= 5 and set(events[start:end]) == {name}, events[start:end]
    events.clear()
    median_over_rounds(fns, rounds=2)
    assert events == ["timed"] * 4
