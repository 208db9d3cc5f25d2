"""benchmarks/harness/plotting.py: the charts it builds from the stored results, and how it draws them (no GPU: made-up
rows and the results files under benchmarks/results)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import plotting  # noqa: E402

RESULTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob("*/*.json"))
# results that are tables only: the dQ sums' errors, the host's time per call, the pass's compile time, the HSTU
# step's launches, host and GPU time by package, and its host floor
TABLES_ONLY = {"dq_sums.json", "dq_sums_head_dims.json", "host_overhead.json", "hstu_launches_ab.json",
               "hstu_host_floor.json", "pass_cost.json"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _plotted() -> list[tuple[Path, dict]]:
    return [(p, _load(p)) for p in RESULTS if p.name not in TABLES_ONLY]


def test_every_stored_result_has_a_chart_or_is_a_table():
    assert RESULTS, "no stored results found"
    for path in RESULTS:
        if path.name in TABLES_ONLY:
            with pytest.raises(ValueError, match="no plot"):
                plotting.benchmark_of(_load(path))
        else:
            assert plotting.benchmark_of(_load(path)) in plotting.CHARTS, path


def test_every_series_key_is_one_the_benchmarks_write():
    # A misspelt key would draw nothing and go unnoticed: each series must have figures in some stored result.
    defined: dict[str, set[tuple[str, str]]] = {}
    found: dict[str, set[tuple[str, str]]] = {}
    for _, data in _plotted():
        name = plotting.benchmark_of(data)
        for panel in plotting.chart_of(data).panels:
            for key, provider in panel.series:
                assert provider in plotting.PROVIDERS, (name, provider)
                defined.setdefault(name, set()).add((panel.title, key))
                if any(plotting._value(r, key) is not None for r in panel.rows):
                    found.setdefault(name, set()).add((panel.title, key))
    for name, series in defined.items():
        assert series <= found.get(name, set()), f"{name}: never in the results: {sorted(series - found[name])}"


def test_providers_in_one_chart_look_different():
    for path, data in _plotted():
        looks: dict[tuple[str, str | None], str] = {}
        for panel in plotting.chart_of(data).panels:
            for key, provider in panel.series:
                if not any(plotting._value(r, key) is not None for r in panel.rows):
                    continue
                look = plotting.PROVIDERS[provider]
                other = looks.setdefault((look.color, look.hatch), look.label)
                assert other == look.label, f"{path.name}: {other!r} and {look.label!r} look the same"


def test_the_op_keeps_one_colour_and_softmax_its_own():
    ours = {plotting.PROVIDERS[n].color for n in ("gdpa", "cute", "cute_varlen", "varlen", "backend_gdpa")}
    assert ours == {plotting.OURS}
    assert plotting.PROVIDERS["fa4"].color == plotting.PROVIDERS["fa4_varlen"].color != plotting.OURS
    assert plotting.PROVIDERS["sdpa"].color not in (plotting.OURS, plotting.FA4)


def _made_up_chart() -> plotting.Chart:
    rows = [dict(a=100.0, b=80.0, c=50.0), dict(a=120.0, c=60.0), dict(a=90.0, b=30.0, c=None)]
    return plotting.Chart("made up", [
        plotting.Panel("with data", "TF/s", ["x", "y", "z"], rows, [("a", "cute"), ("b", "triton"), ("c", "sdpa")],
                       plotting.over("a", "b", "c", label="CuTe / best other")),
        plotting.Panel("without data", "TF/s", ["x"], [dict(a=None)], [("a", "cute")]),
    ])


def test_a_drawn_chart_starts_at_zero_and_keeps_its_legend_off_the_bars(tmp_path):
    path = tmp_path / "chart.png"
    fig = plotting.bar_chart(_made_up_chart(), path)
    assert path.stat().st_size > 0
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 1, "the panel without data is left out"
    ax = axes[0]
    assert ax.get_ylim()[0] == 0
    assert ax.get_ylim()[1] >= 120
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert legend.y1 <= ax.get_window_extent().y0, "the legend sits below the axes"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["CuTe kernels", "Triton kernels", "SDPA (softmax)"]
    notes = sorted(t.get_text() for t in ax.texts)
    assert notes == ["1.25x", "2.00x", "3.00x"]


def test_a_missing_figure_leaves_no_gap_in_its_group():
    fig = plotting.bar_chart(_made_up_chart())
    ax = next(ax for ax in fig.axes if ax.get_visible())
    centres = sorted(round(p.get_x() + p.get_width() / 2, 6) for p in ax.patches)
    # group y has two bars, centred on its tick; groups x and z three
    assert [c for c in centres if 0.5 < c < 1.5] == pytest.approx([1 - 0.8 / 6, 1 + 0.8 / 6])
    assert len(centres) == 3 + 2 + 2


def test_benchmark_of_reads_the_field_then_the_command():
    assert plotting.benchmark_of(dict(benchmark="bench_model", rows=[])) == "bench_model"
    data = dict(meta=dict(command="python3 benchmarks/bench_varlen.py --quick"), rows=[])
    assert plotting.benchmark_of(data) == "bench_varlen"


def test_the_command_line_redraws_a_stored_result(tmp_path):
    source = next(p for p in RESULTS if p.name == "cute_bars.json")
    out = tmp_path / "bars.png"
    plotting.main([str(source), "--out", str(out)])
    assert out.stat().st_size > 0
    with pytest.raises(SystemExit, match="no plot"):
        plotting.main([str(next(p for p in RESULTS if p.name == "dq_sums.json")), "--out-dir", str(tmp_path)])


def test_passes_pick_the_panels():
    data = _load(next(p for p in RESULTS if p.name == "cute_head_dims.json"))
    chart = plotting.chart_of(data, only_passes=["fwd", "bwd"])
    assert [p.title for p in chart.panels] == ["forward", "backward"]
