"""From a request's structured-output fields to one ``StructuredOutput``, checked before the engine.

Fields read (at most one may be set): chat's ``response_format`` (``json_object``; ``json_schema``
with ``json_schema: {"name", "schema", "strict"}``; ``text`` is no constraint), vLLM's
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` and its newer
``structured_outputs`` object (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``),
llama.cpp's ``grammar`` (GBNF). A grammar is read as GBNF when it has ``::=`` rules, else as Lark.

The constraint is compiled here, in a worker thread with a time limit, so a bad one is a 400
naming the problem (never a hang, never a 500); the compiled grammar is cached for the engine.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from swiftlm.core.structured import StructuredOutput, from_vllm, grammar_syntax_of
from swiftlm.runner.structured import StructuredOutputError, check
from swiftlm.server.completions.sampling_protocol import BaseSamplingRequest
from swiftlm.server.errors import bad_request

COMPILE_TIME_LIMIT_S = 10.0


def structured_output(req: BaseSamplingRequest) -> StructuredOutput | None:
    """The request's constraint, compiled and checked; None when it has none. 400 otherwise."""
    found: list[tuple[str, StructuredOutput]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None and fmt.type != "text":
        found.append(("response_format", _response_format(fmt.type, fmt.json_schema)))
    if req.guided_json is not None:
        spec = req.guided_json if isinstance(req.guided_json, str) else json.dumps(req.guided_json)
        found.append(("guided_json", StructuredOutput("json_schema", spec)))
    if req.guided_regex is not None:
        found.append(("guided_regex", StructuredOutput("regex", req.guided_regex)))
    if req.guided_choice is not None:
        if not req.guided_choice:
            raise bad_request("guided_choice must list at least one string", param="guided_choice")
        found.append(("guided_choice", StructuredOutput("choice", json.dumps(req.guided_choice))))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", _grammar(req.guided_grammar)))
    if req.grammar is not None:
        found.append(("grammar", StructuredOutput("grammar", req.grammar, grammar_syntax="gbnf")))
    if req.structured_outputs is not None:
        try:
            so = from_vllm(req.structured_outputs)
        except ValueError as exc:
            raise bad_request(str(exc), param="structured_outputs") from exc
        if so is not None:
            found.append(("structured_outputs", so))
    if not found:
        return None
    if len(found) > 1:
        raise bad_request(f"give one structured output field, got {', '.join(name for name, _ in found)}")
    param, so = found[0]
    checked(so, param)
    return so


def tool_call_constraint(tools: list[dict[str, Any]], name: str | None, parallel: bool) -> StructuredOutput:
    """The constraint for ``tool_choice`` "required" (``name`` None: any of ``tools``) or a named
    function: one call (``parallel`` False) or more, in Qwen3's hermes format, whose arguments
    match the function's parameters. ``tools`` are OpenAI tools (``{"type": "function",
    "function": {...}}``) or bare function definitions. 400 for a tool without a name, non-object
    parameters, or a ``name`` no tool has."""
    functions = [t.get("function", t) if isinstance(t, dict) else {} for t in tools]
    for fn in functions:
        if not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise bad_request("every tool needs a function name", param="tools")
        params = fn.get("parameters")
        if params is not None and (not isinstance(params, dict) or params.get("type", "object") != "object"):
            raise bad_request(f"tool {fn['name']!r}: parameters must be a JSON schema of type object", param="tools")
    if name is not None:
        functions = [fn for fn in functions if fn["name"] == name]
        if not functions:
            raise bad_request(f"tool_choice names the function {name!r}, which is not among the tools", param="tool_choice")
    if not functions:
        raise bad_request("tool_choice required needs at least one tool", param="tools")
    spec = json.dumps([{"name": fn["name"], "parameters": fn.get("parameters") or {"type": "object"}} for fn in functions])
    so = StructuredOutput("tool_calls", spec, parallel=parallel)
    checked(so, "tools")
    return so


def checked(so: StructuredOutput, param: str | None = None, time_limit_s: float = COMPILE_TIME_LIMIT_S) -> None:
    """Compile ``so`` in a worker thread; a 400 when it fails or takes longer than ``time_limit_s``."""
    error: list[Exception] = []

    def run() -> None:
        try:
            check(so)
        except Exception as exc:  # reported below as a 400
            error.append(exc)

    worker = threading.Thread(target=run, name="grammar-compile", daemon=True)
    worker.start()
    worker.join(time_limit_s)
    if worker.is_alive():
        raise bad_request(f"the {param or 'grammar'} took longer than {time_limit_s:g}s to compile; simplify it", param=param)
    if error:
        exc = error[0]
        message = str(exc) if isinstance(exc, StructuredOutputError) else f"the {param or 'grammar'} cannot be compiled: {exc}"
        raise bad_request(message, param=param)


def _response_format(kind: str, json_schema: dict[str, Any] | None) -> StructuredOutput:
    if kind == "json_object":
        return StructuredOutput("json_object")
    schema = (json_schema or {}).get("schema")
    if schema is None:
        raise bad_request(
            'response_format json_schema needs json_schema: {"name": ..., "schema": {...}}', param="response_format"
        )
    return StructuredOutput("json_schema", json.dumps(schema))


def _grammar(text: str) -> StructuredOutput:
    return StructuredOutput("grammar", text, grammar_syntax=grammar_syntax_of(text))
