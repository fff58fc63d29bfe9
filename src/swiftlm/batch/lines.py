"""The lines of a Batch API input file: which can run, and the error of each that cannot.

One JSON object per line: ``{"custom_id": str, "method": "POST", "url": <the job's endpoint>,
"body": {...}}``. Blank lines are skipped (they are not requests). A line that is not such an
object gets an error in OpenAI's shape (``{"code", "message"}``) and goes to the error file; a
``custom_id`` seen before in the file is an error for every later line that repeats it. What the
body says is checked by the endpoint itself when the line runs (a 400 there is the line's
response, also in the error file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LineCheck:
    """Line ``index`` (0-based, blank lines not counted) of an input file; ``error`` is None
    when it can run. ``body_json`` is the body as JSON text ("" when there is none)."""

    index: int
    custom_id: str
    url: str
    body_json: str
    error: dict[str, str] | None


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def check_line(index: int, text: str, endpoint: str, seen: set[str]) -> LineCheck:
    """One line of the file, checked; ``seen`` collects the custom_ids so far."""
    try:
        item: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        return LineCheck(index, "", "", "", _error("invalid_json_line", f"line {index + 1} is not valid JSON: {exc}"))
    if not isinstance(item, dict):
        return LineCheck(index, "", "", "", _error("invalid_request", f"line {index + 1} must be a JSON object"))
    custom_id = item.get("custom_id")
    url = item.get("url") if isinstance(item.get("url"), str) else ""
    body = item.get("body")
    body_json = json.dumps(body) if isinstance(body, dict) else ""
    if not isinstance(custom_id, str) or not custom_id:
        return LineCheck(index, "", url, body_json, _error("missing_custom_id", f"line {index + 1} has no custom_id string"))

    def fail(code: str, message: str) -> LineCheck:
        return LineCheck(index, custom_id, url, body_json, _error(code, message))

    if custom_id in seen:
        return fail("duplicate_custom_id", f"the custom_id {custom_id!r} appears more than once in the file")
    seen.add(custom_id)
    method = item.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        return fail("invalid_method", f"line {index + 1}: method must be POST, got {method!r}")
    if url != endpoint:
        return fail("mismatched_endpoint", f"line {index + 1}: url {url!r} is not this batch's endpoint {endpoint!r}")
    if not isinstance(body, dict):
        return fail("invalid_body", f"line {index + 1}: body must be a JSON object")
    return LineCheck(index, custom_id, url, body_json, None)


def check_lines(text: str, endpoint: str) -> list[LineCheck]:
    """Every request line of an input file, in order."""
    seen: set[str] = set()
    lines = [line for line in text.splitlines() if line.strip()]
    return [check_line(i, line, endpoint, seen) for i, line in enumerate(lines)]
