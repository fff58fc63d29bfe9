"""A vs B: metric values, the relative change (B - A) / A, bootstrap confidence intervals, and
`--fail-if` checks such as ``p95_latency>+5%``.

Metric names: ``{stat}_{latency|ttft|tpot}`` with stat in mean (or avg), min, max, p50, p90, p95,
p99 (seconds, successful requests); ``success_rate``; ``requests_per_s``; ``output_tokens_per_s``.

Confidence intervals are percentile bootstraps (seeded). Per-request metrics resample request
records, pooled over a side's rounds. Rate metrics (per second of wall time) have no per-request
value, so they resample whole rounds; with fewer than two rounds a side they get no interval.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from swiftlm.bench.client import RunResult
from swiftlm.bench.report import metric_values

STATS = ("mean", "min", "max", "p50", "p90", "p95", "p99")
PER_REQUEST = ("latency", "ttft", "tpot")
RATE_METRICS = ("requests_per_s", "output_tokens_per_s")
METRIC_NAMES = tuple(f"{s}_{m}" for m in PER_REQUEST for s in STATS) + ("success_rate", *RATE_METRICS)
HIGHER_IS_BETTER = frozenset({"success_rate", *RATE_METRICS})
DEFAULT_METRICS = (
    "mean_latency",
    "p50_latency",
    "p95_latency",
    "p99_latency",
    "mean_ttft",
    "p95_ttft",
    "mean_tpot",
    "p95_tpot",
    "success_rate",
    "requests_per_s",
    "output_tokens_per_s",
)


def canonical_metric(name: str) -> str:
    """`name` with "avg_" spelled "mean_"; raises ValueError for names not in METRIC_NAMES."""
    name = name.strip().lower()
    name = "mean_" + name[4:] if name.startswith("avg_") else name
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRIC_NAMES)}")
    return name


def _stat_fn(stat: str) -> Callable[[np.ndarray], np.ndarray]:
    """A function of a 2-D array reducing each row; linear-interpolation percentiles, as report.py."""
    if stat == "mean":
        return lambda x: x.mean(axis=-1)
    if stat in ("min", "max"):
        return lambda x: getattr(x, stat)(axis=-1)
    q = float(stat[1:])
    return lambda x: np.percentile(x, q, axis=-1)


def _request_values(rounds: Sequence[RunResult], metric: str) -> np.ndarray:
    records = [r for run in rounds for r in run.records]
    if metric == "success_rate":
        return np.array([1.0 if r.ok else 0.0 for r in records])
    return np.array(metric_values(records, metric.split("_", 1)[1]), dtype=float)


def _round_totals(rounds: Sequence[RunResult], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, duration) per round of a rate metric."""
    num = [
        sum(1 if metric == "requests_per_s" else (r.completion_tokens or 0) for r in run.records if r.ok)
        for run in rounds
    ]
    return np.array(num, dtype=float), np.array([run.duration_s for run in rounds], dtype=float)


def metric_value(rounds: Sequence[RunResult], metric: str) -> float | None:
    """The value of `metric` over all `rounds` of one side (None when there is nothing to measure)."""
    metric = canonical_metric(metric)
    if metric in RATE_METRICS:
        num, dur = _round_totals(rounds, metric)
        return float(num.sum() / dur.sum()) if dur.sum() > 0 else None
    values = _request_values(rounds, metric)
    if values.size == 0:
        return None
    return float(
        _stat_fn("mean" if metric == "success_rate" else metric.split("_", 1)[0])(values[None, :])[0]
    )


def _bootstrap(
    values: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """`n_boot` values of `stat` over resamples (with replacement) of `values`, in memory-bounded chunks."""
    out = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(1, values.size))
    for lo in range(0, n_boot, chunk):
        hi = min(n_boot, lo + chunk)
        out[lo:hi] = stat(values[rng.integers(0, values.size, size=(hi - lo, values.size))])
    return out


def _bootstrap_side(
    rounds: Sequence[RunResult], metric: str, n_boot: int, rng: np.random.Generator
) -> np.ndarray | None:
    if metric in RATE_METRICS:
        num, dur = _round_totals(rounds, metric)
        if len(rounds) < 2:
            return None
        idx = rng.integers(0, len(rounds), size=(n_boot, len(rounds)))
        return num[idx].sum(axis=1) / dur[idx].sum(axis=1)
    values = _request_values(rounds, metric)
    if values.size == 0:
        return None
    return _bootstrap(
        values, _stat_fn("mean" if metric == "success_rate" else metric.split("_", 1)[0]), n_boot, rng
    )


@dataclass(frozen=True)
class Comparison:
    """One metric for A and B; `change` = (B - A) / A, with its confidence interval."""

    metric: str
    a: float | None
    b: float | None
    change: float | None
    ci_low: float | None
    ci_high: float | None

    @property
    def higher_is_better(self) -> bool:
        return self.metric in HIGHER_IS_BETTER


def compare(
    rounds_a: Sequence[RunResult],
    rounds_b: Sequence[RunResult],
    metrics: Sequence[str] = DEFAULT_METRICS,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[Comparison]:
    """Each metric for A and B, the relative change and a bootstrap `confidence` interval of it."""
    rng = np.random.default_rng(seed)
    tail = (1.0 - confidence) / 2 * 100
    out = []
    for metric in dict.fromkeys(canonical_metric(m) for m in metrics):
        a, b = metric_value(rounds_a, metric), metric_value(rounds_b, metric)
        change = (b - a) / a if a is not None and b is not None and a != 0 else None
        low = high = None
        boot_a, boot_b = (
            _bootstrap_side(rounds_a, metric, n_boot, rng),
            _bootstrap_side(rounds_b, metric, n_boot, rng),
        )
        if change is not None and boot_a is not None and boot_b is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(boot_a != 0, (boot_b - boot_a) / boot_a, np.nan)
            if np.isfinite(rel).any():
                low, high = (float(v) for v in np.nanpercentile(rel, [tail, 100 - tail]))
        out.append(Comparison(metric, a, b, change, low, high))
    return out


_CHECK = re.compile(r"^\s*([A-Za-z0-9_]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Check:
    """Fail when the relative change of `metric` is above (">") or below ("<") `threshold`."""

    metric: str
    op: str
    threshold: float  # a fraction: +5% is 0.05
    text: str


def parse_check(expr: str) -> Check:
    """ "p95_latency>+5%" -> Check("p95_latency", ">", 0.05, ...); raises ValueError with the form."""
    m = _CHECK.match(expr)
    if not m:
        raise ValueError(
            f"cannot parse --fail-if {expr!r}: write METRIC>+N% or METRIC<-N%, e.g. p95_latency>+5%"
        )
    return Check(canonical_metric(m.group(1)), m.group(2), float(m.group(3)) / 100.0, expr.strip())


@dataclass(frozen=True)
class CheckResult:
    check: Check
    passed: bool
    message: str


def evaluate_checks(
    comparisons: Sequence[Comparison], checks: Sequence[Check], mode: str = "point"
) -> list[CheckResult]:
    """Judge each check on the point estimate of the change (mode "point"), or only when the whole
    confidence interval is past the threshold (mode "ci"; the point estimate where there is no
    interval). A check whose metric could not be measured fails."""
    if mode not in ("point", "ci"):
        raise ValueError(f"mode must be 'point' or 'ci', got {mode!r}")
    by_metric: Mapping[str, Comparison] = {c.metric: c for c in comparisons}
    results = []
    for check in checks:
        comp = by_metric.get(check.metric)
        if comp is None or comp.change is None:
            results.append(
                CheckResult(
                    check, False, f"FAIL {check.text}: {check.metric} could not be measured on both sides"
                )
            )
            continue
        use_ci = mode == "ci" and comp.ci_low is not None and comp.ci_high is not None
        value = (comp.ci_low if check.op == ">" else comp.ci_high) if use_ci else comp.change
        violated = value > check.threshold if check.op == ">" else value < check.threshold
        basis = "CI bound" if use_ci else "change"
        results.append(
            CheckResult(
                check,
                not violated,
                f"{'FAIL' if violated else 'pass'} {check.text}: "
                f"{basis} {value:+.2%} (A {_fmt(comp.metric, comp.a)}, B {_fmt(comp.metric, comp.b)})",
            )
        )
    return results


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 when every check passed, 1 otherwise."""
    return 0 if all(r.passed for r in results) else 1


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric == "success_rate":
        return f"{value:.2%}"
    if metric in RATE_METRICS:
        return f"{value:.2f}"
    return f"{value * 1000:.1f} ms"


def render_ab_markdown(
    comparisons: Sequence[Comparison], results: Sequence[CheckResult], meta: Mapping[str, object]
) -> str:
    lines = ["# swiftlm bench ab", ""] + [f"- {k}: `{v}`" for k, v in meta.items()]
    lines += ["", "| metric | A | B | change (B vs A) | 95% CI | better |", "|---|---:|---:|---:|---|---|"]
    for c in comparisons:
        change = "-" if c.change is None else f"{c.change:+.2%}"
        ci = "-" if c.ci_low is None else f"[{c.ci_low:+.2%}, {c.ci_high:+.2%}]"
        better = "-"
        if c.change is not None and c.change != 0:
            better = "B" if (c.change > 0) == c.higher_is_better else "A"
            if c.ci_low is not None and c.ci_low <= 0 <= c.ci_high:
                better += " (not significant)"
        lines.append(
            f"| {c.metric} | {_fmt(c.metric, c.a)} | {_fmt(c.metric, c.b)} | {change} | {ci} | {better} |"
        )
    if results:
        lines += ["", "## Checks", ""] + [f"- {r.message}" for r in results]
    return "\n".join(lines) + "\n"
