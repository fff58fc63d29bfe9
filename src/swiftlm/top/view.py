"""One frame of ``swiftlm top``: the figures as rich tables."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from swiftlm.top.window import Figures


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction * 100:.1f} %"


def _bytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


def _grid(title: str, rows: list[tuple[str, str]]) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column(justify="right", style="bold")
    for name, value in rows:
        table.add_row(name, value)
    return Panel(table, title=title, title_align="left", expand=True)


def frame(url: str, f: Figures, problem: str | None = None) -> RenderableType:
    """The whole view; ``problem``: why the newest scrape failed (the figures are the last good ones)."""
    span = "since start (one scrape)" if f.span_s is None else f"last {f.span_s:.{1 if f.span_s < 10 else 0}f} s"
    head = Text.assemble(("swiftlm top ", "bold cyan"), (url, "underline"), f"  models: {', '.join(f.models) or 'n/a'}",
                         f"  window: {span}")
    refused = f"{f.refused:.0f}"
    if f.refused_by_reason:
        refused += " (" + ", ".join(f"{r} {v:.0f}" for r, v in sorted(f.refused_by_reason.items())) + ")"
    requests = _grid("requests", [
        ("running", _num(f.running)), ("waiting", _num(f.waiting)), ("refused", refused),
        ("finished", _num(f.finished_per_s, " /s", 2)), ("output", _num(f.output_tok_per_s, " tok/s", 1)),
    ])
    latency = _grid("latency", [
        ("TTFT p50", _ms(f.ttft_p50)), ("TTFT p95", _ms(f.ttft_p95)),
        ("ITL p50", _ms(f.itl_p50)), ("ITL p95", _ms(f.itl_p95)),
    ])
    batch = "off" if f.batch_queued is None else (
        f"{f.batch_queued:.0f} queued, {f.batch_running:.0f} running, {_num(f.batch_done)} done")
    cache = _grid("cache", [
        ("KV cache use", _pct(f.kv_cache_usage)), ("prefix-cache hits", _pct(f.prefix_hit_rate)),
        ("sessions", _num(f.sessions)), ("batch lines", batch),
    ])
    b = f.backend
    plan = f"{b.get('backend', '?')} backend on {b.get('device', '?')}, {b.get('dtype', '?')}, quant {b.get('quantization', '?')}" if b else "n/a"
    device_rows = [
        ("backend", plan), ("threads", _num(f.threads)), ("process CPU", _num(f.cpu_percent, " %", 0)),
        ("resident memory", _bytes(f.rss_bytes)),
    ]
    for gpu in f.gpus:
        device_rows.append((f"GPU {gpu.index} {gpu.name}", f"{_pct(gpu.utilization)} busy, "
                            f"{_bytes(gpu.memory_used)} / {_bytes(gpu.memory_total)}, "
                            f"{_num(gpu.power_w, ' W')}, {_num(gpu.temperature_c, ' C')}"))
    panels = [requests, latency, cache, _grid("device", device_rows)]
    tail = Text(f"last scrape failed: {problem} (retrying)", style="bold red") if problem else None
    return _Frame(head, panels, tail)


class _Frame:
    """The panels two by two, or one under the other on a terminal narrower than ``WIDE``."""

    WIDE = 110

    def __init__(self, head: Text, panels: list[Panel], tail: Text | None) -> None:
        self.head, self.panels, self.tail = head, panels, tail

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        columns = 2 if options.max_width >= self.WIDE else 1
        grid = Table.grid(expand=True)
        for _ in range(columns):
            grid.add_column(ratio=1)
        for i in range(0, len(self.panels), columns):
            grid.add_row(*self.panels[i:i + columns])
        yield self.head
        yield grid
        if self.tail is not None:
            yield self.tail
