"""The benchmarks' plots, drawn one way for all of them.

Every benchmark that plots calls ``draw`` with the results it writes; the same call redraws a stored results file on
any machine (no GPU, no torch):

    python -m benchmarks.harness.plotting benchmarks/results/2026-11-24-h200/cute_bars.json \
        --out docs/plots/cute_bars_h200.png
    python -m benchmarks.harness.plotting benchmarks/results/*/cute_varlen*.json --out-dir /tmp/plots

A provider keeps one look in every plot (``PROVIDERS``: label, colour and, for a variant of a provider's run such as
the kernel without its bias, a hatch over that colour). Bars start at zero, the legend sits below the panels, and a
panel, or a bar, without a figure is left out rather than drawn empty.
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

OURS = "#1f77b4"
PADDED = "#17becf"
TRITON = "#9467bd"
INDUCTOR = "#7f7f7f"
EAGER = "#8c564b"
SDPA = "#2ca02c"
FA4 = "#ff7f0e"


@dataclass(frozen=True)
class Provider:
    label: str
    color: str
    hatch: str | None = None


# Everything this package runs is blue (hatched where it is a variant of the same kernels); the dense op on a
# padded batch is cyan, the other providers one colour each.
PROVIDERS: dict[str, Provider] = {
    "gdpa": Provider("GDPA op", OURS),
    "gdpa_kernel": Provider("CuTe forward kernel, called directly", OURS, "//"),
    "cute": Provider("CuTe kernels", OURS),
    "cute_other_schedule": Provider("CuTe kernels, the other forward schedule", OURS, "\\\\"),
    "cute_nobias": Provider("CuTe kernels without the bias", OURS, ".."),
    "cute_dbias": Provider("CuTe kernels with dbias", OURS, "xx"),
    "cute_varlen": Provider("CuTe varlen kernels", OURS),
    "varlen": Provider("gdpa_varlen", OURS),
    "varlen_padded_lengths": Provider("gdpa_varlen on the padded batch with lengths", OURS, "//"),
    "backend_gdpa": Provider('backend="gdpa"', OURS, "||"),
    "padded": Provider("dense op on the padded batch", PADDED),
    "cute_padded": Provider("dense CuTe kernels on the padded batch", PADDED),
    "triton": Provider("Triton kernels", TRITON),
    "triton_dbias": Provider("Triton kernels with dbias", TRITON, "xx"),
    "triton_varlen": Provider("Triton varlen kernels", TRITON),
    "inductor": Provider("Inductor", INDUCTOR),
    "eager": Provider("eager PyTorch", EAGER),
    "sdpa": Provider("SDPA (softmax)", SDPA),
    "sdpa_dbias": Provider("SDPA (softmax) with the bias's gradient", SDPA, "xx"),
    "fa4": Provider("flash-attn-4 (softmax)", FA4),
    "fa4_varlen": Provider("flash-attn-4 varlen (softmax)", FA4),
}


@dataclass(frozen=True)
class Ratio:
    """The figure printed above each group's first bar: the row's ``mine`` over the best of ``others`` that ran (or
    the row's own ``stored`` ratio); ``label`` says what it is in the panel's title."""

    label: str
    mine: str = ""
    others: tuple[str, ...] = ()
    stored: str = ""

    def __call__(self, row: dict) -> str | None:
        if self.stored:
            value = _value(row, self.stored)
        else:
            best = max((v for v in (_value(row, o) for o in self.others) if v is not None), default=None)
            mine = _value(row, self.mine)
            value = mine / best if best and mine is not None else None
        return None if value is None else f"{value:.2f}x"


def over(mine: str, *others: str, label: str) -> Ratio:
    return Ratio(label, mine, others)


@dataclass
class Panel:
    """Grouped bars: one group per row (``groups`` labels them), one bar per (row key, provider) of ``series`` that
    has a figure in the row."""

    title: str
    ylabel: str
    groups: list[str]
    rows: list[dict]
    series: list[tuple[str, str]]
    note: Ratio | None = None

    def has_data(self) -> bool:
        return any(_value(r, key) is not None for r in self.rows for key, _ in self.series)

    def slots(self) -> int:
        """The most bars in one of the panel's groups."""
        return max(sum(_value(r, k) is not None for k, _ in self.series) for r in self.rows)


@dataclass
class Chart:
    title: str
    panels: list[Panel]
    ncols: int = 1
    passes: dict[int, str] = field(default_factory=dict)  # panel index -> the pass it shows, for ``only_passes``


def _value(row: dict, key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def bar_chart(chart: Chart, path: str | Path | None = None):
    """Draws ``chart`` (its panels without data left out) and saves it to ``path``; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in chart.panels if p.has_data()]
    if not panels:
        raise ValueError(f"nothing to plot for {chart.title!r}")
    ncols = min(chart.ncols, len(panels))
    nrows = -(-len(panels) // ncols)
    bars = max(len(p.rows) * (p.slots() + 1) for p in panels)
    width = min(max(0.2 * bars + 1.5, 7.0), 15.0 / ncols)
    # side by side, a panel's width follows its number of groups, so that every bar has the same width
    ratios = [len(p.rows) for p in panels] if nrows == 1 else None
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.0 * nrows + 1.5), squeeze=False,
                             layout="constrained", width_ratios=ratios)
    legend: dict = {}
    for ax, panel in zip(axes.flat, panels):
        _draw_panel(ax, panel, legend)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(textwrap.fill(chart.title, int(11 * width * ncols), break_on_hyphens=False), fontsize=10)
    legend_rows = -(-len(legend) // 4)
    fig.legend(handles=list(legend.values()), loc="outside lower center", ncols=-(-len(legend) // legend_rows),
               fontsize=8, frameon=False)
    if path is not None:
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    return fig


def _draw_panel(ax, panel: Panel, legend: dict) -> None:
    from matplotlib.patches import Patch

    width = 0.8 / panel.slots()
    top = 0.0
    for j, row in enumerate(panel.rows):
        present = [(key, name) for key, name in panel.series if _value(row, key) is not None]
        for i, (key, name) in enumerate(present):
            look = PROVIDERS[name]
            value = _value(row, key)
            ax.bar(j + (i - (len(present) - 1) / 2) * width, value, width, color=look.color, hatch=look.hatch,
                   edgecolor="white", linewidth=0.4)
            top = max(top, value)
            legend.setdefault(look.label, Patch(facecolor=look.color, hatch=look.hatch, edgecolor="white",
                                                label=look.label))
        text = panel.note(row) if panel.note and present else None
        if text:
            ax.annotate(text, (j - (len(present) - 1) / 2 * width, _value(row, present[0][0])), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(panel.rows)), panel.groups, fontsize=8)
    ax.set_xlim(-0.6, len(panel.rows) - 0.4)
    ax.set_ylim(0, top * (1.12 if panel.note else 1.05))
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.set_title(panel.title + (f" (above the first bars: {panel.note.label})" if panel.note else ""), fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


# ---- the benchmarks' charts: results (as the scripts write them) -> Chart ----------------------------------------


def _meta(data: dict) -> dict:
    return data.get("meta", data)


def _shape(nq: int, nk: int) -> str:
    return f"{nq}²" if nq == nk else f"{nq}x{nk}"


def _batches(rows: Iterable[dict], batch="batch", nq="nq", nk="nk") -> str:
    """"B=1152" or, where the long shapes ran fewer samples, "B=1152 (288 at 2048²)"."""
    by_batch: dict[int, list[str]] = {}
    for r in rows:
        if batch in r:
            shapes = by_batch.setdefault(r[batch], [])
            if _shape(r[nq], r[nk]) not in shapes:
                shapes.append(_shape(r[nq], r[nk]))
    if not by_batch:
        return ""
    main = max(by_batch, key=lambda b: len(by_batch[b]))
    others = [f"{b} at {', '.join(s)}" for b, s in by_batch.items() if b != main]
    return f"B={main}" + (f" ({'; '.join(others)})" if others else "")


BEST_SOFTMAX = "op / best softmax"


def chart_cute_bars(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    series = [("gdpa", "gdpa"), ("cute_kernel", "gdpa_kernel"), ("triton", "triton"), ("inductor", "inductor"),
              ("sdpa", "sdpa"), ("fa4", "fa4")]
    panels = []
    for kind, d, what, ylabel in (("fwd", 128, "forward, D=128", "TF/s"),
                                  ("fb", 128, "forward+backward, D=128", "TF/s (3.5x the forward's FLOPs)"),
                                  ("fwd", 64, "forward, D=64", "TF/s")):
        sel = [r for r in rows if r["kind"] == kind and r["d"] == d]
        # the kernel called directly is timed in the forward only
        shown = [s for s in series if kind == "fwd" or s[0] != "cute_kernel"]
        panels.append(Panel(what, ylabel, [_shape(r["nq"], r["nk"]) for r in sel], sel, shown,
                            Ratio(BEST_SOFTMAX, stored="gdpa_vs_best_softmax")))
    timed = [r for r in rows if r["kind"] in ("fwd", "fb")]
    heads = timed[0].get("heads", 4) if timed else 4
    inductor = "; Inductor on fewer samples at long rows (rates per FLOP)" if meta.get("all_providers") else ""
    return Chart(f"GDPA op vs softmax attention, {meta['device']}: bf16 {meta.get('activation', 'gelu_tanh')}, "
                 f"H={heads}, {_batches(timed)}, shapes q×kv{inductor}", panels)


def chart_gdpa(data: dict) -> Chart:
    meta = _meta(data)
    by_shape: dict[tuple[int, int], dict] = {}
    for r in data["rows"]:
        row = by_shape.setdefault((r["q_len"], r["kv_len"]), {})
        row[f"{r['provider']}_fwd"] = r["fwd_tflops"]
        row[f"{r['provider']}_fb"] = r["fwd_bwd_tflops"]
    labels = [_shape(*s) for s in by_shape]
    rows = list(by_shape.values())
    panels = [Panel(what, ylabel, labels, rows, [(f"{p}_{ps}", p) for p in ("gdpa", "eager", "inductor", "sdpa")],
                    over(f"gdpa_{ps}", f"inductor_{ps}", label="op / Inductor"))
              for ps, what, ylabel in (("fwd", "forward", "TF/s"),
                                       ("fb", "forward+backward", "TF/s (3.5x the forward's FLOPs)"))]
    return Chart(f"GDPA op vs the same math in eager PyTorch and under Inductor, and softmax SDPA, {meta['device']}: "
                 "bf16 gelu_tanh, B=1152, H=4, D=128, shapes q×kv; eager and Inductor on fewer samples at long rows "
                 "(rates per FLOP)", panels)


def chart_cute_fwd(data: dict) -> Chart:
    meta, rows = _meta(data), [r for r in data["rows"] if r.get("kind") == "fwd"]
    series = [("cute", "cute"), ("triton", "triton"), ("sdpa", "sdpa"), ("fa4", "fa4")]
    panels = []
    for d in (128, 64):
        sel = [r for r in rows if r["d"] == d]
        panels.append(Panel(f"forward, D={d}", "TF/s", [_shape(r["nq"], r["nk"]) for r in sel], sel, series,
                            over("cute", "sdpa", "fa4", label="CuTe / best softmax")))
    heads = rows[0].get("heads", 4) if rows else 4
    return Chart(f"CuTe forward kernel vs Triton and softmax attention, {meta['device']}: bf16 "
                 f"{meta.get('activation', 'gelu_tanh')}, H={heads}, {_batches(rows)}, shapes q×kv", panels)


def chart_cute_bwd(data: dict) -> Chart:
    meta, rows = _meta(data), [r for r in data["rows"] if r.get("kind") == "time"]
    panels = []
    for d in (128, 64):
        sel = [r for r in rows if r["d"] == d]
        labels = [_shape(r["nq"], r["nk"]) for r in sel]
        panels.append(Panel(f"backward, D={d}", "TF/s (2.5x the forward's FLOPs)", labels, sel,
                            [("cute_bwd", "cute"), ("triton_bwd", "triton")],
                            over("cute_bwd", "triton_bwd", label="CuTe / Triton")))
        panels.append(Panel(f"forward+backward, D={d}", "TF/s (3.5x the forward's FLOPs)", labels, sel,
                            [("cute_fb", "cute"), ("triton_fb", "triton"), ("sdpa_fb", "sdpa"), ("fa4_fb", "fa4")],
                            over("cute_fb", "sdpa_fb", "fa4_fb", label="CuTe / best softmax")))
    return Chart(f"CuTe backward kernel vs Triton and softmax attention, {meta['device']}: bf16 "
                 f"{meta.get('activation', 'gelu_tanh')}, H=4, {_batches(rows, 'z')}, shapes q×kv", panels, ncols=2)


PASS_NAMES = {"fwd": "forward", "bwd": "backward", "fb": "forward+backward"}


def _pass_panels(rows, labels, series_by_pass: dict[str, list[tuple[str, str]]], notes: dict[str, Ratio],
                 units: dict[str, str]) -> tuple[list[Panel], dict[int, str]]:
    panels = [Panel(PASS_NAMES[ps], units[ps], labels, rows, series, notes.get(ps))
              for ps, series in series_by_pass.items()]
    return panels, dict(enumerate(series_by_pass))


def chart_cute_head_dims(data: dict) -> Chart:
    meta, rows = _meta(data), [r for r in data["rows"] if r.get("kind") == "time"]
    labels = [f"{r['d']}/{r['dv']}\n{_shape(r['nq'], r['nk'])}" for r in rows]
    panels, passes = _pass_panels(rows, labels, {
        "fwd": [("cute_fwd", "cute"), ("cute_fwd_other", "cute_other_schedule"), ("triton_fwd", "triton"),
                ("sdpa_fwd", "sdpa"), ("fa4_fwd", "fa4")],
        "bwd": [("cute_bwd", "cute"), ("triton_bwd", "triton")],
        "fb": [("cute_fb", "cute"), ("sdpa_fb", "sdpa"), ("fa4_fb", "fa4")],
    }, notes={"fwd": over("cute_fwd", "sdpa_fwd", "fa4_fwd", label="CuTe / best softmax"),
              "bwd": over("cute_bwd", "triton_bwd", label="CuTe / Triton"),
              "fb": over("cute_fb", "sdpa_fb", "fa4_fb", label="CuTe / best softmax")},
        units={"fwd": "TF/s, 2·N²·(D+Dv) FLOPs", "bwd": "TF/s, 2·N²·(3D+2Dv) FLOPs", "fb": "TF/s, 2·N²·(4D+3Dv) FLOPs"})
    heads = rows[0].get("heads", 4) if rows else 4
    return Chart(f"CuTe kernels by head dims (D/Dv) and shape (q×kv), {meta['device']}: bf16 "
                 f"{meta.get('activation', 'gelu_tanh')}, H={heads}, {_batches(rows, 'z')}", panels, passes=passes)


def chart_cute_causal(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    labels = [f"{_shape(r['nq'], r['nk'])}\nB={r['batch']}" for r in rows]
    best_other = "CuTe / best other"
    panels = [
        Panel("causal forward", "TF/s (kept pairs' work)", labels, rows,
              [("cute", "cute"), ("triton", "triton"), ("sdpa", "sdpa"), ("fa4", "fa4")],
              over("cute", "triton", "sdpa", "fa4", label=best_other)),
        Panel("causal backward", "TF/s (kept pairs' work, 2.5x)", labels, rows,
              [("cute_bwd", "cute"), ("triton_bwd", "triton")], over("cute_bwd", "triton_bwd", label="CuTe / Triton")),
        Panel("causal forward+backward", "TF/s (kept pairs' work, 3.5x)", labels, rows,
              [("cute_fb", "cute"), ("triton_fb", "triton"), ("sdpa_fb", "sdpa"), ("fa4_fb", "fa4")],
              over("cute_fb", "triton_fb", "sdpa_fb", "fa4_fb", label=best_other)),
    ]
    query_rows = {r["batch"] * r["nq"] for r in rows}
    rows_text = f"B·Nq = {query_rows.pop():,} query rows" if len(query_rows) == 1 else _batches(rows)
    return Chart(f"Causal attention (bottom-right aligned), {meta['device']}: bf16 gelu_tanh, H=4, D=128, "
                 f"{rows_text}, shapes q×kv; SDPA (top-left aligned) on the square shapes only", panels)


def _bias_chart(data: dict, series_by_pass, what: str) -> Chart:
    meta, rows = _meta(data), [r for r in data["rows"] if r.get("kind") == "time"]
    labels = [_shape(r["nq"], r["nk"]) for r in rows]
    units = {"fwd": "TF/s", "bwd": "TF/s (2.5x the forward's FLOPs)", "fb": "TF/s (3.5x the forward's FLOPs)"}
    notes = {ps: over(f"cute_{ps}", f"triton_{ps}", label="CuTe / Triton, same bias") for ps in series_by_pass}
    panels, passes = _pass_panels(rows, labels, series_by_pass, notes, units)
    r0 = rows[0] if rows else {}
    return Chart(f"{what}, {meta['device']}: bf16 {meta.get('activation', '')}, H={r0.get('heads', 4)}, "
                 f"D={r0.get('d', 128)}, {_batches(rows, 'z')}, shapes q×kv", panels, passes=passes)


def chart_cute_bias(data: dict) -> Chart:
    return _bias_chart(data, {
        "fwd": [("cute_fwd", "cute"), ("cute_fwd_nobias", "cute_nobias"), ("triton_fwd", "triton"),
                ("sdpa_fwd", "sdpa"), ("fa4_fwd", "fa4")],
        "bwd": [("cute_bwd", "cute"), ("cute_bwd_nobias", "cute_nobias"), ("triton_bwd", "triton")],
        "fb": [("cute_fb", "cute"), ("triton_fb", "triton"), ("sdpa_fb", "sdpa"), ("fa4_fb", "fa4")],
    }, "A one-element bias, -log Nk, on every score (sigmoid attention's); SDPA and flash-attn-4: softmax without it")


def chart_cute_bias_tensor(data: dict) -> Chart:
    rows = [r for r in data["rows"] if r.get("kind") == "time"]
    per = rows[0].get("bias", "sample") if rows else "sample"
    return _bias_chart(data, {
        "fwd": [("cute_fwd", "cute"), ("cute_fwd_nobias", "cute_nobias"), ("triton_fwd", "triton"),
                ("sdpa_fwd", "sdpa"), ("fa4_fwd", "fa4")],
        "bwd": [("cute_bwd", "cute"), ("cute_bwd_dbias", "cute_dbias"), ("cute_bwd_nobias", "cute_nobias"),
                ("triton_bwd", "triton"), ("triton_bwd_dbias", "triton_dbias")],
        "fb": [("cute_fb", "cute"), ("cute_fb_dbias", "cute_dbias"), ("triton_fb", "triton"),
               ("triton_fb_dbias", "triton_dbias"), ("sdpa_fb", "sdpa"), ("sdpa_fb_dbias", "sdpa_dbias"),
               ("fa4_fb", "fa4")],
    }, f"A bias tensor, one [Nq, Nk] per {per}, on the scores; SDPA takes it as its additive mask, flash-attn-4 "
       "(softmax) runs without it")


def chart_varlen(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    labels = [f"N≤{r['max_len']}\ns={r['sparsity']}" for r in rows]
    names = {"varlen": "varlen", "padded_lengths": "varlen_padded_lengths", "backend_gdpa": "backend_gdpa",
             "padded": "padded", "inductor": "inductor"}
    panels = []
    for what, title in (("fwd_graph", "forward, GPU time (CUDA graph)"),
                        ("fwd_bwd_graph", "forward+backward, GPU time (CUDA graph)"),
                        ("fwd", "forward, launched from Python"),
                        ("fwd_bwd", "forward+backward, launched from Python")):
        speed = []
        for r in rows:
            base = _value(r, f"inductor_{what}_ms")
            speed.append({key: base / r[f"{key}_{what}_ms"] for key in names
                          if base and _value(r, f"{key}_{what}_ms")})
        # the backend's compiled backward does not capture into a CUDA graph: it is launch-timed only
        series = [(key, name) for key, name in names.items() if key != "backend_gdpa" or "graph" not in what]
        panels.append(Panel(title, "speed-up over Inductor", labels, speed, series))
    return Chart(f"Jagged batches, {meta['device']}: bf16 {meta.get('activation', 'gelu_tanh')}, "
                 f"B={rows[0]['batch']}, H={meta.get('heads', 4)}, D={meta.get('head_dim', 128)}, lengths all N "
                 "(s=1.0) or uniform in [1, N] (s=0.5); speed over Inductor on the padded module (1.0)",
                 panels, ncols=2)


def chart_cute_varlen(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    what = "forward+backward" if data.get("backward") else "forward"
    d, dv = meta.get("head_dims", [128, 128])
    mask = ", causal" if meta.get("causal") else ""
    window = meta.get("window", [-1, -1])
    if window[0] >= 0:
        mask += f", window of {window[0]} keys (max_attn_len)"
    act = meta.get("activation", "gelu_tanh")
    if meta.get("log_n_bias"):
        act += ", bias -log N"
    if meta.get("rel_bias"):
        act += ", relative bias [1, H, N, N]" + (" and its gradient" if data.get("backward") else "")
    series = [("cute_varlen", "cute_varlen"), ("triton_varlen", "triton_varlen"), ("cute_padded", "cute_padded"),
              ("fa4_varlen", "fa4_varlen")]
    unit = "TF/s, real tokens' work" + (" (3.5x)" if data.get("backward") else "")
    panels = []
    for sparsity, title in ((1.0, "every sample N long"), (0.5, "lengths uniform in [1, N]")):
        sel = [r for r in rows if r["sparsity"] == sparsity]
        panels.append(Panel(title, unit, [f"N≤{r['max_len']}" for r in sel], sel, series,
                            over("cute_varlen", "triton_varlen", label="CuTe / Triton")))
    fa4 = "flash-attn-4: softmax" + (" without the bias" if "bias" in act else "")
    return Chart(f"Jagged self-attention, {what}{mask}, {meta['device']}: bf16 {act}, B={rows[0]['batch']}, H=4, "
                 f"D={d}, Dv={dv}; {fa4}", panels, ncols=2)


def chart_model(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    step = [{"inductor": r["inductor"]["step_ms"], "gdpa": r["gdpa"]["step_ms"], "speedup": r.get("speedup")}
            for r in rows]
    panel = Panel("forward, backward and SGD update", "ms (lower is better)",
                  [f"N≤{r['max_len']}" for r in rows], step, [("gdpa", "backend_gdpa"), ("inductor", "inductor")],
                  Ratio("speed-up over Inductor", stored="speedup"))
    r0 = rows[0]
    return Chart(f"Training step of {meta.get('model', 'the model')}, {meta['device']}: B={r0['batch']}, "
                 f"{r0['layers']} layers, H={meta.get('heads', 4)}, D={meta.get('head_dim', 128)}, bf16, lengths "
                 "uniform in [1, N]", [panel])


def chart_hstu_reference(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    step = [{"inductor": r["inductor"]["ms"], "gdpa": r["gdpa"]["ms"], "speedup": r.get("speedup")} for r in rows]
    labels = [f"B={r['batch']}, N≤{r['max_len']}" + (f", window {r['max_attn_len']}" if r["max_attn_len"] else "")
              for r in rows]
    panel = Panel("forward and backward, steps back to back", "ms a step (lower is better)", labels, step,
                  [("gdpa", "backend_gdpa"), ("inductor", "inductor")],
                  Ratio("speed-up over Inductor", stored="speedup"))
    return Chart(f"HSTU's reference attention, {meta['device']}: H={meta['heads']}, D={meta['head_dim']}, bf16, "
                 "lengths uniform in [N/2, N]", [panel])


def chart_demo_step(data: dict) -> Chart:
    meta, rows = _meta(data), data["rows"]
    panels = []
    for mode in ("default", "reduce-overhead"):
        sel = [{"inductor": r["inductor_ms"], "gdpa": r["gdpa_ms"], "speedup": r["speedup"]}
               for r in rows if r["mode"] == mode]
        labels = [f"B={r['batch']}, N≤{r['seq']}" for r in rows if r["mode"] == mode]
        title = "default mode" if mode == "default" else 'mode="reduce-overhead" (CUDA graphs)'
        panels.append(Panel(title, "ms per step (lower is better)", labels, sel,
                            [("gdpa", "backend_gdpa"), ("inductor", "inductor")],
                            Ratio("speed-up over Inductor", stored="speedup")))
    return Chart(f"Training step of the demo's model, {meta['device']}: width {meta['dim']}, {meta['heads']} heads, "
                 "bf16, lengths uniform in [1, N]", panels, ncols=2)


CHARTS: dict[str, Callable[[dict], Chart]] = {
    "bench_cute_bars": chart_cute_bars,
    "bench_gdpa": chart_gdpa,
    "bench_cute_fwd": chart_cute_fwd,
    "bench_cute_bwd": chart_cute_bwd,
    "bench_cute_head_dims": chart_cute_head_dims,
    "bench_cute_causal": chart_cute_causal,
    "bench_cute_bias": chart_cute_bias,
    "bench_cute_bias_tensor": chart_cute_bias_tensor,
    "bench_varlen": chart_varlen,
    "bench_cute_varlen": chart_cute_varlen,
    "bench_model": chart_model,
    "bench_hstu_reference": chart_hstu_reference,
    "bench_demo_step": chart_demo_step,
}


def benchmark_of(data: dict) -> str:
    """The benchmark that wrote ``data``: its ``benchmark`` field, else the ``bench_*.py`` script its command names,
    else what its rows hold."""
    meta = _meta(data)
    if "benchmark" in meta:
        return meta["benchmark"]
    named = re.search(r"\b(bench_\w+)\.py", meta.get("command", ""))
    if named and named.group(1) in CHARTS:
        return named.group(1)
    rows = data.get("rows", [])
    if not isinstance(rows, list):
        raise ValueError("no plot for these results (rows by name: a table)")
    keys = set().union(*(r.keys() for r in rows))
    if "backward" in data:
        return "bench_cute_varlen"
    if {"cute_ms", "cute_bwd_ms"} & keys:
        return "bench_cute_causal"
    if "dv" in keys and {"cute_fwd", "cute_bwd", "cute_fb"} & keys:
        return "bench_cute_head_dims"
    if "cute_fwd_nobias" in keys:
        return "bench_cute_bias_tensor" if "bias" in keys else "bench_cute_bias"
    if {"cute_bwd", "triton_bwd"} <= keys:
        return "bench_cute_bwd"
    if "cute" in keys:
        return "bench_cute_fwd"
    raise ValueError("no plot for these results (keys: " + ", ".join(sorted(keys)[:12]) + ")")


def chart_of(data: dict, only_passes: Iterable[str] | None = None) -> Chart:
    chart = CHARTS[benchmark_of(data)](data)
    if only_passes is not None:
        keep = set(only_passes)
        chart.panels = [p for i, p in enumerate(chart.panels) if chart.passes.get(i, "") in keep]
    return chart


def draw(data: dict, path: str | Path, only_passes: Iterable[str] | None = None):
    """Plots results as a benchmark script writes them ({"meta": ..., "rows": [...]}, or the meta's fields beside
    "rows") into ``path``."""
    return bar_chart(chart_of(data, only_passes), path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Redraw the plot of stored benchmark results.")
    ap.add_argument("results", nargs="+", help="results .json files, as the benchmark scripts write them")
    ap.add_argument("--out", help="the .png to write (one results file only); default: beside the .json")
    ap.add_argument("--out-dir", help="write <name>.png there")
    ap.add_argument("--passes", help="only these passes' panels, e.g. fwd,bwd (charts with a panel per pass)")
    args = ap.parse_args(argv)
    if args.out and len(args.results) > 1:
        ap.error("--out takes one results file; use --out-dir for several")
    for name in args.results:
        source = Path(name)
        out = Path(args.out) if args.out else (Path(args.out_dir) if args.out_dir else source.parent) / (
            source.stem + ".png")
        try:
            draw(json.loads(source.read_text()), out, args.passes.split(",") if args.passes else None)
        except ValueError as e:
            raise SystemExit(f"{name}: {e}") from None
        print(out)


if __name__ == "__main__":
    main()
