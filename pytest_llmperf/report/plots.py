"""Figures of the HTML report, drawn with matplotlib and returned as SVG text to inline.

matplotlib is imported here only, and this module only from `report/html.py` when the HTML is written
(the `report` extra). Figures use matplotlib's object API (no pyplot: no global figure state), text
stays text in the SVG (`svg.fonttype: none`), and each figure gets its own id salt so the ids of
several SVGs inlined in one page do not collide.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

VERDICT_COLOURS = {"regressed": "#c62828", "improved": "#2e7d32", "pass": "#546e7a", "inconclusive": "#ef6c00"}


@dataclass
class Series:
    """One line: a target's benchmark at each batch size that ran, and where it ran out of memory."""

    label: str
    batch_sizes: list[int] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)
    lows: list[float] = field(default_factory=list)  # spread drawn around the median (25th percentile)
    highs: list[float] = field(default_factory=list)  # (75th percentile)
    oom: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


@dataclass
class Interval:
    """Baseline vs now of one metric at one batch size: the estimated ratio now/baseline with its 95% CI."""

    label: str
    ratio: float
    low: float
    high: float
    verdict: str
    bad_above: float | None  # the ratio beyond which it regresses (lower-is-better metrics)
    bad_below: float | None  # (higher-is-better metrics)


def _svg(fig: Figure, salt: str) -> str:
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # inline: no XML declaration or doctype


def _panel(ax, title: str, unit: str) -> None:
    """One panel's title, unit and grid; values from 0, so a change reads at its true size."""
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def _batch_axis(ax, sizes: Sequence[int]) -> None:
    sizes = sorted(set(sizes))
    if len(sizes) > 2 and min(sizes) > 0:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("batch size")


def sweep_figure(title: str, panels: Sequence[tuple[str, str, Sequence[Series]]], salt: str) -> str:
    """Panels side by side, each (metric label, unit, series): median and interquartile range per batch size;
    batch sizes that ran out of memory marked x at the top edge (failed ones marked !)."""
    fig = Figure(figsize=(4.2 * len(panels), 3.4))
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (label, unit, series) in zip(axes, panels):
        sizes: list[int] = []
        for i, s in enumerate(series):
            colour = f"C{i % 10}"
            if s.batch_sizes:
                ax.errorbar(
                    s.batch_sizes,
                    s.medians,
                    yerr=[[m - lo for m, lo in zip(s.medians, s.lows)], [hi - m for m, hi in zip(s.medians, s.highs)]],
                    marker="o",
                    markersize=4,
                    capsize=3,
                    linewidth=1.4,
                    color=colour,
                    label=s.label,
                )
            for marks, symbol, word in ((s.oom, "x", "oom"), (s.failed, "$!$", "error")):
                if marks:
                    ax.plot(
                        marks,
                        [0.97] * len(marks),
                        linestyle="none",
                        marker=symbol,
                        markersize=8,
                        color=colour,
                        transform=ax.get_xaxis_transform(),
                        clip_on=False,
                        label=f"{s.label}: {word}" if len(series) > 1 else word,
                    )
            sizes += s.batch_sizes + s.oom + s.failed
        if sizes:
            _batch_axis(ax, sizes)
        _panel(ax, label, unit)
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:
        fig.legend(
            handles,
            labels,
            loc="lower center",
            ncol=min(len(labels), 3),
            fontsize=8,
            bbox_to_anchor=(0.5, -0.02 - 0.05 * ((len(labels) - 1) // 3)),
        )
    fig.tight_layout(rect=(0, 0.1 + 0.05 * ((len(labels) - 1) // 3), 1, 1))
    return _svg(fig, salt)


def ratio_figure(title: str, intervals: Sequence[Interval], salt: str) -> str:
    """A forest plot: per row the estimated ratio now/baseline and its 95% CI, coloured by verdict, with the
    threshold on the bad side (1 + rtol, or 1/(1 + rtol) for higher-is-better metrics)."""
    fig = Figure(figsize=(7.5, 1.0 + 0.28 * len(intervals)))
    ax = fig.subplots()
    ys = list(range(len(intervals)))[::-1]
    for y, iv in zip(ys, intervals):
        colour = VERDICT_COLOURS.get(iv.verdict, "#546e7a")
        ax.errorbar(
            [iv.ratio],
            [y],
            xerr=[[iv.ratio - iv.low], [iv.high - iv.ratio]],
            marker="o",
            markersize=4,
            capsize=3,
            color=colour,
        )
        for bound in (iv.bad_above, iv.bad_below):
            if bound is not None:
                ax.plot([bound, bound], [y - 0.35, y + 0.35], color="#c62828", linewidth=1, linestyle=":")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(ys, [iv.label for iv in intervals], fontsize=8)
    ax.set_ylim(-0.7, len(intervals) - 0.3)
    ax.set_xlabel("estimated ratio now / baseline (the gate's estimate, 95% CI); red dotted: the regression threshold")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    for verdict, colour in VERDICT_COLOURS.items():
        ax.plot([], [], marker="o", linestyle="none", color=colour, label=verdict)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _svg(fig, salt)


def history_figure(
    title: str, labels: Sequence[str], panels: Sequence[tuple[str, str, str, dict[int, list[float | None]]]], salt: str
) -> str:
    """Per panel (metric, title, unit, batch size -> value per point), a line per batch size over the points
    (commits, oldest first); a benchmark with one point shows one point. Each line's SVG group has the id
    `<salt>-<metric>-bs<batch size>`, its markers the plotted points."""
    fig = Figure(figsize=(4.2 * len(panels), 3.2))
    fig.suptitle(title, fontsize=10)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    xs = list(range(len(labels)))
    for ax, (metric, label, unit, lines) in zip(axes, panels):
        for i, (bs, values) in enumerate(sorted(lines.items())):
            ax.plot(
                xs,
                [float("nan") if v is None else v for v in values],
                marker="o",
                markersize=4,
                color=f"C{i % 10}",
                label=f"bs {bs}",
                gid=f"{salt}-{metric}-bs{bs}",
            )
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=7)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        _panel(ax, label, unit)
    handles, names = axes[0].get_legend_handles_labels()
    if names:
        axes[-1].legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return _svg(fig, salt)
