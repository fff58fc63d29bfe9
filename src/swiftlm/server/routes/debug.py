"""GET /debug/kv (only with ``--enable-debug-endpoints``): the KV pool checked between engine
steps, for soak runs and operators: every block in use must belong to a live request or a session."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from swiftlm.server.openapi import error_responses
from swiftlm.server.state import server_state

router = APIRouter()


@router.get("/debug/kv", responses={200: {"description": "The KV pool's report (KVReport)"}, **error_responses(503)})
async def kv_report(raw: Request) -> JSONResponse:
    engine = server_state(raw).ready_engine()
    report = await engine.run_in_engine(lambda e: e.kv_report())
    return JSONResponse(dataclasses.asdict(report))
