"""`swiftlm bench peers`: one side-by-side Markdown table from the results.json files of several
engines run on the same workload (`bench serve` against swiftlm and llama.cpp's server,
`bench hf` for in-process transformers); benchmarks/peers/run_peer_table.sh makes all three.

Every number is recomputed from the records of each file with `report.summarize`, so the
definitions are those of `bench serve` (see report.py). One row per (concurrency, metric), one
column per engine; the best value of a row is bold. Files whose workload, seed, options or
request count differ are named in a warning above the table: their numbers do not compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftlm.bench.report import summarize
from swiftlm.bench.sender import RequestRecord

# Meta fields that must agree for the engines to have served the same requests.
SAME_WORKLOAD_KEYS = ("workload", "seed", "options", "requests")


def _ms(stat: str, metric: str) -> Callable[[Mapping[str, Any]], float | None]:
    return lambda s: None if s[f"{metric}_s"][stat] is None else s[f"{metric}_s"][stat] * 1000


def _mean_output(s: Mapping[str, Any]) -> float | None:
    return s["total_completion_tokens"] / s["num_ok"] if s["num_ok"] else None


# (row label, value from a summary, +1 when higher is better / -1 lower / 0 neither, format)
PEER_ROWS: tuple[tuple[str, Callable[[Mapping[str, Any]], float | None], int, str], ...] = (
    ("success rate", lambda s: s["success_rate"] if s["num_requests"] else None, +1, "{:.1%}"),
    ("output tok/s", lambda s: s["output_tokens_per_s"], +1, "{:.1f}"),
    ("requests/s", lambda s: s["requests_per_s"], +1, "{:.2f}"),
    ("latency p50 (ms)", _ms("p50", "latency"), -1, "{:.0f}"),
    ("latency p95 (ms)", _ms("p95", "latency"), -1, "{:.0f}"),
    ("TTFT p50 (ms)", _ms("p50", "ttft"), -1, "{:.0f}"),
    ("TTFT p95 (ms)", _ms("p95", "ttft"), -1, "{:.0f}"),
    ("mean TPOT (ms)", _ms("avg", "tpot"), -1, "{:.1f}"),
    ("output tokens / request", _mean_output, 0, "{:.1f}"),
)


@dataclass(frozen=True)
class PeerResult:
    """One engine's results: summaries by concurrency, recomputed from its records."""

    label: str
    path: str
    meta: Mapping[str, Any]
    summaries: Mapping[int, Mapping[str, Any]]
    chunk_counted: bool  # some successful request's tokens were counted from stream chunks


def load_result(path: str | Path, label: str) -> PeerResult:
    """Read a results.json written by `bench serve` or `bench hf`."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not a bench serve / bench hf results.json (no 'runs' list)")
    summaries: dict[int, Mapping[str, Any]] = {}
    chunk_counted = False
    for run in data["runs"]:
        records = [RequestRecord.from_dict(r) for r in run["records"]]
        summaries[int(run["concurrency"])] = summarize(records, float(run["summary"]["duration_s"]))
        chunk_counted |= any(r.ok and not r.usage_reported for r in records)
    return PeerResult(label, str(path), data.get("meta") or {}, summaries, chunk_counted)


def workload_mismatches(results: Sequence[PeerResult]) -> list[str]:
    """Lines naming the meta fields on which a result differs from the first one."""
    if not results:
        return []
    first, out = results[0], []
    for other in results[1:]:
        for key in SAME_WORKLOAD_KEYS:
            if other.meta.get(key) != first.meta.get(key):
                out.append(
                    f"{other.label} differs from {first.label} in {key}: "
                    f"{json.dumps(other.meta.get(key))} vs {json.dumps(first.meta.get(key))}"
                )
    return out


def _cells(values: Sequence[float | None], better: int, fmt: str) -> list[str]:
    known = [v for v in values if v is not None]
    best = (max(known) if better > 0 else min(known)) if known and better and len(known) > 1 else None
    cells = []
    for v in values:
        text = "-" if v is None else fmt.format(v)
        cells.append(f"**{text}**" if best is not None and v == best else text)
    return cells


def render_peer_table(results: Sequence[PeerResult], title: str = "Peer comparison") -> str:
    """The Markdown report: sources, warnings, the side-by-side table and its footnotes."""
    labels = [r.label + (" †" if r.chunk_counted else "") for r in results]
    lines = [
        f"# {title}",
        "",
        "| engine | file | model | workload | requests | extra body | time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.meta
        lines.append(
            f"| {r.label} | `{r.path}` | `{m.get('model', '?')}` | {m.get('workload', '?')} "
            f"| {m.get('requests', '?')} | `{json.dumps(m.get('extra_body', {}))}` | {m.get('time', '?')} |"
        )
    lines.append("")
    lines += [f"> warning: {w}" for w in workload_mismatches(results)]
    levels = sorted({c for r in results for c in r.summaries})
    lines += [
        "",
        "| concurrency | metric | " + " | ".join(labels) + " |",
        "|---:|---|" + "---:|" * len(results),
    ]
    for c in levels:
        summaries = [r.summaries.get(c) for r in results]
        for name, value, better, fmt in PEER_ROWS:
            values = [None if s is None else value(s) for s in summaries]
            lines.append(f"| {c} | {name} | " + " | ".join(_cells(values, better, fmt)) + " |")
        base = summaries[0]["output_tokens_per_s"] if summaries[0] else 0.0
        ratios = [None if s is None or not base else s["output_tokens_per_s"] / base for s in summaries]
        lines.append(
            f"| {c} | output tok/s vs {results[0].label} | "
            + " | ".join("-" if v is None else f"{v:.2f}x" for v in ratios)
            + " |"
        )
    lines += [
        "",
        "Latency and TTFT count from when a request was sent: `bench serve` runs a closed loop of "
        "CONCURRENCY clients; `bench hf` starts the clocks of a static batch when it starts (arrival "
        "`closed`, the same loop) or at t=0 (`at-once`, see its meta). TPOT = (latency - TTFT) / "
        "(output tokens - 1). Bold: the best of the row.",
    ]
    if any(r.chunk_counted for r in results):
        lines.append(
            "† Output tokens counted from streamed chunks (the server sent no usage): tokens that "
            "arrive merged into one chunk, or as empty text, are under-counted."
        )
    return "\n".join(lines) + "\n"


def peers_command(args: argparse.Namespace) -> int:
    """`swiftlm bench peers --results A.json B.json --labels a b [--output peers.md]`."""
    from swiftlm.bench.commands import UsageError

    labels = args.labels or [Path(p).parent.name or Path(p).stem for p in args.results]
    if len(labels) != len(args.results):
        raise UsageError(
            f"--labels names {len(labels)} engine(s) but --results gives {len(args.results)} file(s)"
        )
    try:
        results = [load_result(p, label) for p, label in zip(args.results, labels, strict=True)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"cannot read results: {exc}") from exc
    md = render_peer_table(results, args.title)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(md)
        print(f"wrote {args.output}", file=sys.stderr)
    print(md)
    return 0
