"""PNG plots of a `bench serve` run: latency CDF per concurrency, TTFT and throughput vs concurrency.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, no global backend),
so plotting is safe from any thread and leaves no state behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swiftlm.bench.client import RunResult
from swiftlm.bench.report import metric_values, percentile, summarize


def _figure(title: str, ncols: int = 1) -> tuple[Any, list[Any]]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "plots need matplotlib: pip install 'swiftlm[bench]' (or pass --no-plots)"
        ) from exc
    fig = Figure(figsize=(8 if ncols == 1 else 11, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(1, ncols, squeeze=False)[0])
    for ax in axes:
        ax.grid(True, alpha=0.35)
    if ncols == 1:
        axes[0].set_title(title)
    else:
        fig.suptitle(title)
    return fig, axes


def _concurrency_axis(ax: Any, levels: Sequence[int]) -> None:
    ax.set_xlabel("Concurrency (requests in flight)")
    if len(levels) > 1 and max(levels) / max(1, min(levels)) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(list(levels), [str(c) for c in levels])
    ax.minorticks_off()


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.4")


def plot_latency_cdf(runs: Sequence[RunResult], path: str | Path) -> Path:
    """Fraction of successful requests finished within x seconds, one line per concurrency."""
    fig, (ax,) = _figure("End-to-end latency CDF (successful requests)")
    drawn = False
    for run in runs:
        values = sorted(metric_values(run.records, "latency"))
        if not values:
            continue
        n = len(values)
        ax.step(
            [0.0, *values],
            [0.0, *((i + 1) / n for i in range(n))],
            where="post",
            label=f"concurrency {run.concurrency} (n={n}, p95 {percentile(values, 95):.3g} s)",
        )
        drawn = True
    ax.set_xlabel("End-to-end latency (s)")
    ax.set_ylabel("Fraction of requests finished")
    ax.set_ylim(0, 1.02)
    if drawn:
        ax.set_xlim(left=0)
        ax.legend(loc="lower right")
    else:
        _no_data(ax, "no successful requests")
    fig.savefig(path)
    return Path(path)


def plot_ttft_vs_concurrency(runs: Sequence[RunResult], path: str | Path) -> Path:
    """p50 and p95 time to first token (ms) against concurrency."""
    fig, (ax,) = _figure("Time to first token vs concurrency")
    points = [(run.concurrency, metric_values(run.records, "ttft")) for run in runs]
    points = [(c, v) for c, v in points if v]
    if points:
        levels = [c for c, _ in points]
        for q, marker in ((50, "o"), (95, "s")):
            ax.plot(levels, [percentile(v, q) * 1000 for _, v in points], marker=marker, label=f"p{q} TTFT")
        _concurrency_axis(ax, levels)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left")
    else:
        ax.set_xlabel("Concurrency (requests in flight)")
        _no_data(ax, "no TTFT measured (it needs --stream and successful requests)")
    ax.set_ylabel("Time to first token (ms)")
    fig.savefig(path)
    return Path(path)


def plot_throughput_vs_concurrency(runs: Sequence[RunResult], path: str | Path) -> Path:
    """Output tokens/s (left) and successful requests/s (right) against concurrency."""
    fig, (tok_ax, req_ax) = _figure("Throughput vs concurrency (successful requests)", ncols=2)
    levels = [run.concurrency for run in runs]
    summaries = [summarize(run.records, run.duration_s) for run in runs]
    for ax, key, label, color, marker in (
        (tok_ax, "output_tokens_per_s", "Output tokens per second", "tab:blue", "o"),
        (req_ax, "requests_per_s", "Requests per second", "tab:orange", "s"),
    ):
        ax.plot(levels, [s[key] for s in summaries], marker=marker, color=color, label=label)
        ax.set_title(label)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        if levels:
            _concurrency_axis(ax, levels)
            ax.legend(loc="upper left")
        else:
            _no_data(ax, "no runs")
    fig.savefig(path)
    return Path(path)


def write_plots(runs: Sequence[RunResult], out_dir: str | Path) -> list[Path]:
    """latency_cdf.png, ttft_vs_concurrency.png and throughput_vs_concurrency.png in `out_dir`."""
    out = Path(out_dir)
    return [
        plot_latency_cdf(runs, out / "latency_cdf.png"),
        plot_ttft_vs_concurrency(runs, out / "ttft_vs_concurrency.png"),
        plot_throughput_vs_concurrency(runs, out / "throughput_vs_concurrency.png"),
    ]
