"""Models, health, metrics, tokenizer endpoints and session management."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from swiftlm.server.completions.request_mapping import (
    chat_messages,
    check_token_ids,
    template_kwargs,
    template_tools,
    thinking_enabled,
)
from swiftlm.server.completions.tokenizer_protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from swiftlm.server.errors import bad_request, not_found
from swiftlm.server.openapi import error_responses
from swiftlm.server.operations.auth import session_scope
from swiftlm.server.protocol import HealthStatus, ModelCard, ModelList, SessionDeleted
from swiftlm.server.state import server_state
from swiftlm.text.chat_template import ChatTemplateError

router = APIRouter()


@router.get("/health", responses={200: {"model": HealthStatus}, 503: {"model": HealthStatus, "description": "Not ready"}})
async def health(raw: Request) -> Response:
    state = server_state(raw)
    if state.engine is None or state.shutting_down or not state.engine.is_running:
        status = "loading" if state.engine is None else "unavailable"
        return JSONResponse({"status": status}, status_code=503)
    if state.engine.engine.fatal_error is not None:  # an orchestrator should restart the process
        return JSONResponse({"status": "failed", "error": state.engine.engine.fatal_error}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics", response_class=PlainTextResponse, responses={200: {"description": "Prometheus metrics"}})
async def metrics(raw: Request) -> Response:
    state = server_state(raw)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/models", responses={200: {"model": ModelList}})
async def list_models(raw: Request) -> Response:
    """Every served name, each a card of the same model (``root``: the first name)."""
    state = server_state(raw)
    max_len = state.engine.max_model_len if state.engine is not None else None
    cards = [ModelCard(id=name, root=state.model_name, max_model_len=max_len) for name in state.model_names]
    return Response(ModelList(data=cards).model_dump_json(exclude_none=True), media_type="application/json")


@router.get("/v1/models/{model_id:path}", responses={200: {"model": ModelCard}, **error_responses(404)})
async def get_model(model_id: str, raw: Request) -> Response:
    state = server_state(raw)
    name = state.check_model(model_id)
    max_len = state.engine.max_model_len if state.engine is not None else None
    card = ModelCard(id=name, root=state.model_name, max_model_len=max_len)
    return Response(card.model_dump_json(exclude_none=True), media_type="application/json")


@router.post("/tokenize", responses={200: {"model": TokenizeResponse}, **error_responses(400, 404, 503)})
async def tokenize(req: TokenizeRequest, raw: Request) -> Response:
    state = server_state(raw)
    engine = state.ready_engine()
    state.check_model(req.model)
    tokenizer = engine.tokenizer
    if req.messages is not None:
        defaults = state.config.default_chat_template_kwargs
        messages = chat_messages(req.messages)
        thinking = thinking_enabled(
            req, defaults, can_think=tokenizer.think_end_id is not None,
            default_thinking=state.config.default_thinking, rules=state.thinking_rules, messages=messages,
        )
        kwargs = template_kwargs(req, defaults, thinking)
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=req.add_generation_prompt,
                tools=template_tools(req), **kwargs,
            )
        except ChatTemplateError as exc:
            raise bad_request(f"the chat template could not render these messages: {exc}", param="messages") from exc
        ids = tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))
    else:
        add = True if req.add_special_tokens is None else req.add_special_tokens
        ids = tokenizer.encode(req.prompt or "", add_special_tokens=add)
    strs = [s or "" for s in tokenizer.convert_ids_to_tokens(ids)] if req.return_token_strs else None
    body = TokenizeResponse(tokens=ids, count=len(ids), max_model_len=engine.max_model_len, token_strs=strs)
    return Response(body.model_dump_json(exclude_none=True), media_type="application/json")


@router.post("/detokenize", responses={200: {"model": DetokenizeResponse}, **error_responses(400, 404, 503)})
async def detokenize(req: DetokenizeRequest, raw: Request) -> Response:
    state = server_state(raw)
    engine = state.ready_engine()
    state.check_model(req.model)
    check_token_ids(req.tokens, engine.engine.model.config.vocab_size, "tokens")
    text = engine.tokenizer.decode(req.tokens, skip_special_tokens=False)
    return Response(DetokenizeResponse(prompt=text).model_dump_json(), media_type="application/json")


@router.delete("/v1/sessions/{session_id}", responses={200: {"model": SessionDeleted}, **error_responses(404, 503)})
async def close_session(session_id: str, raw: Request) -> Response:
    """Release a session's KV at once (it would otherwise expire after its TTL)."""
    state = server_state(raw)
    engine = state.ready_engine()
    key = f"{session_scope(raw)}/{session_id}"
    state.session_prompts.forget(key)
    if not await engine.close_session(key):
        raise not_found(f"no session '{session_id}' is open", param="session_id", code="session_not_found")
    return JSONResponse({"id": session_id, "object": "session", "deleted": True})
