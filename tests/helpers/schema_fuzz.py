"""Schema fuzzing of a running server with schemathesis: every operation of its /openapi.json,
with cases generated from the schema (positive) and mutated away from it (negative).

Each case is sent once and judged by ``CHECKS``: no 5xx, a documented status code, a documented
content type, a body that matches the documented schema (each event of a stream too). A failed
check, a connection error or an answer slower than ``deadline_s`` is a ``Finding``; the run goes
on (no shrinking), so one run reports every kind of finding, each once per operation.
Used by tests/server/test_schema_fuzz.py (the CI form) and scripts/fuzz_api.py (the long form).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import hypothesis
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)


def nothing_to_negate(operation: schemathesis.APIOperation) -> bool:
    """Whether schemathesis can make no negative case of ``operation``: none of its parameters or
    body can be broken (no parameters and no body; or only path parameters whose value any string
    satisfies, as ``{batch_id}``). Hypothesis would then reject every draw up to its invalid-example
    limit (~460 draws, about 1 s each such operation here) before giving up as Unsatisfiable, with no
    case sent. The same rule schemathesis applies when it picks what a negative case breaks
    (``_draw_negated_locations``); False where that rule cannot be read (another version)."""
    try:
        from schemathesis.core.parameters import ParameterLocation
        from schemathesis.specs.openapi._hypothesis import can_negate_headers, can_negate_path_parameters
    except ImportError:
        return False
    for location in (ParameterLocation.PATH, ParameterLocation.HEADER, ParameterLocation.COOKIE,
                     ParameterLocation.QUERY):
        if not operation.get_parameter_set(location).schema["properties"]:
            continue
        if location == ParameterLocation.PATH and not can_negate_path_parameters(operation):
            continue
        if location.is_in_header and not can_negate_headers(operation, location):
            continue
        return False
    return not (operation.body and any(item.is_negatable for item in operation.body.items))


@dataclass(frozen=True, slots=True)
class Finding:
    operation: str
    mode: str
    title: str
    message: str
    reproduce: str

    def __str__(self) -> str:
        return f"{self.operation} [{self.mode}] {self.title}: {self.message[:600]}\n    {self.reproduce[:600]}"


@dataclass
class FuzzReport:
    cases: Counter[str] = field(default_factory=Counter)  # operation label -> cases sent
    statuses: defaultdict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    findings: list[Finding] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def summary(self) -> str:
        lines = []
        for label, count in sorted(self.cases.items()):
            statuses = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses[label].items()))
            lines.append(f"{count:6d}  {label}  ({statuses})")
        lines.append(f"{self.total:6d}  cases in all, {len(self.findings)} findings")
        return "\n".join(lines + [str(f) for f in self.findings])


def fuzz(
    base_url: str,
    max_examples: int,
    *,
    deadline_s: float = 10.0,
    time_limit_s: float | None = None,
    seed: int | None = None,
    headers: dict[str, str] | None = None,
) -> FuzzReport:
    """Fuzz every operation of ``base_url``'s /openapi.json with up to ``max_examples`` cases per
    operation and mode; stops starting new operations once ``time_limit_s`` has passed. ``seed``
    None: the same cases every run (each operation's test seeded by its own source)."""
    assert base_url.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")), "loopback only"
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=10)
    report = FuzzReport()
    seen: set[tuple[str, str]] = set()
    started = time.monotonic()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in MODES:
            if time_limit_s is not None and time.monotonic() - started > time_limit_s:
                return report
            if mode == GenerationMode.NEGATIVE and nothing_to_negate(operation):
                continue  # Unsatisfiable, after ~460 rejected draws

            def record(case: schemathesis.Case, title: str, message: str, mode: GenerationMode = mode) -> None:
                if (case.operation.label, title) in seen:
                    return
                seen.add((case.operation.label, title))
                try:
                    curl = case.as_curl_command()
                except Exception:  # a case that cannot be written as curl is still a finding
                    curl = repr(case.body)
                report.findings.append(Finding(case.operation.label, mode.value, title, message, curl))

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=max_examples, deadline=None, database=None, derandomize=seed is None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
            )
            def run(case: schemathesis.Case) -> None:
                report.cases[case.operation.label] += 1
                t0 = time.monotonic()
                try:
                    response = case.call(base_url=base_url, session=session, headers=headers, timeout=deadline_s)
                    report.statuses[case.operation.label][response.status_code] += 1
                    case.validate_response(response, checks=CHECKS)
                except FailureGroup as group:
                    for failure in group.exceptions:
                        record(case, failure.title, failure.message)
                except Failure as failure:
                    record(case, failure.title, failure.message)
                except requests.RequestException as exc:  # the server hung up or took too long
                    record(case, type(exc).__name__, str(exc))
                else:
                    if time.monotonic() - t0 > deadline_s:
                        record(case, "Deadline exceeded", f"answered after {time.monotonic() - t0:.1f} s")

            if seed is not None:
                run = hypothesis.seed(seed)(run)
            try:
                run()
            except hypothesis.errors.Unsatisfiable:  # nothing to mutate (no parameters, no body)
                pass
    return report
