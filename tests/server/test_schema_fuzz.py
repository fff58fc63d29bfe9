"""Schema fuzzing (schemathesis) of the real server on 127.0.0.1: every operation of
/openapi.json, with generated and mutated (negative) cases, must answer without a 5xx, with a
documented status and content type, and a body (each event of a stream too) that matches the
documented schema. The long form is scripts/fuzz_api.py; what it found is pinned down in
test_schema_fuzz_findings.py.

Generation stays cheap: the server's context window is 128 tokens (so no answer is longer) and
n at most 4; the cases are the same every run (derandomized)."""

from __future__ import annotations

import time

import httpx
import pytest

from swiftlm.config import ServerConfig
from tests.helpers.schema_fuzz import fuzz

# per operation and mode (an operation with a body or a query: twice that, with a path only: once),
# and the fewest cases a run must send: the CI form, then the slow form (the long form is
# scripts/fuzz_api.py)
FORMS = [pytest.param(4, 100, id="ci"), pytest.param(10, 200, id="full", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    config = ServerConfig(enable_debug_endpoints=True, max_n=4)
    return start_server(tiny_tied_dir, config, max_model_len=128)


@pytest.mark.parametrize(("examples", "min_cases"), FORMS)
def test_every_operation_survives_schema_fuzzing(server, examples: int, min_cases: int) -> None:
    t0 = time.monotonic()
    # the full form about 22 s on an idle 2-core machine, the CI form about 12 s: the time limit (a
    # runaway guard; past it, operations go unfuzzed and the test fails) leaves a loaded one room
    report = fuzz(server.base_url, examples, deadline_s=10.0, time_limit_s=300.0)
    print(report.summary(), f"\n{time.monotonic() - t0:.1f} s")
    operations = {f"{m.upper()} {p}" for p, item in _paths(server).items() for m in item}
    assert set(report.cases) == operations, "an operation was not fuzzed"
    assert report.total >= min_cases, report.summary()
    assert not report.findings, "\n".join(map(str, report.findings))
    server.assert_no_leaks()


def _paths(server) -> dict:
    return httpx.get(server.base_url + "/openapi.json", timeout=10).json()["paths"]
