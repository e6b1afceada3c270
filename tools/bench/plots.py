"""PNG plots of bench runs with matplotlib's Agg canvas (object API: no pyplot global state, thread-safe)."""

from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gpubox.errors import MissingExtraError


@dataclass
class Plot:
    name: str
    png: bytes
    series: list[str]


def _axes(title: str, xlabel: str, ylabel: str) -> tuple[Any, Any]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("Bench plots", "bench", "matplotlib") from exc
    fig = Figure(figsize=(8, 4.8), dpi=100)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _finish(name: str, fig: Any, ax: Any) -> Plot:
    # the series are read back from the figure itself, so what is reported is what was drawn
    series = [str(line.get_label()) for line in ax.get_lines() if not str(line.get_label()).startswith("_")]
    series += [str(c.get_label()) for c in ax.containers if not str(c.get_label()).startswith("_")]
    if series:
        ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return Plot(name, buf.getvalue(), series)


def _x_axis(rows: list[dict[str, Any]]) -> tuple[str, str, str]:
    """Sweep over head_dim (the usual case) or, with a single head_dim, over seq_len."""
    if len({r["head_dim"] for r in rows}) > 1 or len({r["seq_len"] for r in rows}) <= 1:
        return "head_dim", "seq_len", "head dimension D"
    return "seq_len", "head_dim", "sequence length N"


def _series(rows: list[dict[str, Any]], value: str) -> tuple[dict[str, list[tuple[int, float]]], str]:
    x, other, xlabel = _x_axis(rows)
    several = len({r[other] for r in rows}) > 1
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if r.get(value) is None or not r["within_tolerance"]:
            continue
        label = r["backend"] + (f" {other[0].upper()}={r[other]}" if several else "")
        out[label].append((r[x], r[value]))
    return {k: sorted(v) for k, v in sorted(out.items())}, xlabel


def tflops_plot(
    rows: list[dict[str, Any]], title: str, earlier: list[dict[str, Any]] | None = None, earlier_label: str = "earlier"
) -> Plot:
    series, xlabel = _series(rows, "tflops")
    fig, ax = _axes(title, xlabel, "TFLOPS")
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    if earlier:
        for label, points in _series(earlier, "tflops")[0].items():
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker="x",
                linestyle="--",
                label=f"{label} ({earlier_label})",
            )
    return _finish("tflops_vs_earlier" if earlier else "tflops", fig, ax)


def speedup_plot(rows: list[dict[str, Any]], title: str, baseline: str) -> Plot:
    series, xlabel = _series([r for r in rows if r["backend"] != baseline], "speedup")
    fig, ax = _axes(title, xlabel, f"speedup vs {baseline}")
    ax.axhline(1.0, color="grey", linewidth=1, label="_baseline")
    for label, points in series.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    return _finish("speedup", fig, ax)


def device_plot(
    figures: list[dict[str, Any]],
    title: str,
    earlier: list[dict[str, Any]] | None = None,
    earlier_label: str = "earlier",
) -> Plot:
    """Measured share of the datasheet per figure (or raw values where no datasheet figure exists)."""
    runs = [("this run", figures)] + ([(earlier_label, earlier)] if earlier else [])
    names = [f["name"] for f in figures if f.get("measured") is not None]
    with_ratio = all(f.get("ratio") is not None for f in figures if f["name"] in names)
    fig, ax = _axes(title, "", "measured / datasheet" if with_ratio else "measured (GB/s, TFLOPS or GFLOPS)")
    width = 0.8 / len(runs)
    for i, (label, figs) in enumerate(runs):
        by_name = {f["name"]: f for f in figs}
        values = [(by_name.get(n) or {}).get("ratio" if with_ratio else "measured") or 0.0 for n in names]
        ax.bar([j + i * width for j in range(len(names))], values, width=width, label=label)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(names))], names, rotation=30, fontsize=8)
    return _finish("device_vs_earlier" if earlier else "device", fig, ax)
