"""The Responses API: POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

A response is a chat turn (``swiftlm.server.routes.chat``: thinking, tools, structured output,
sessions, rate limits) over the whole conversation: the stored conversation of
``previous_response_id`` (``swiftlm.server.responses.store``), then this request's input items, with
``instructions`` as the system message first. A stored response's chain of turns shares one KV
session (named by the chain's first response, scoped by the API key), so a turn that continues the
last one computes only its new tokens; when the session is gone (evicted, expired, a restart) the
conversation is rendered fresh from the stored items. ``store: false`` keeps nothing and uses no
session. Ids of responses that do not exist, have expired or belong to another key are a 404.

With the response cache on (``--response-cache``), a deterministic response is answered from it like
a chat completion (``swiftlm.server.answer_cache.lookup``), keyed by the chat request it becomes (the whole
conversation, instructions and tools included), whole or streamed, and stored as usual when
``store`` is true; a turn that continues a stored chain (``previous_response_id`` with ``store``)
bypasses the cache, since its turn must reach the chain's session.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from swiftlm.core.outputs import RequestOutput
from swiftlm.server.answer_cache.answers import (
    chat_answer_from_chunks,
    chat_hit_events,
    hit_usage,
    nothing_to_abort,
    replayed,
)
from swiftlm.server.answer_cache.lookup import cache_use, lookup
from swiftlm.server.errors import not_found, service_unavailable
from swiftlm.server.openapi import error_responses, json_or_stream
from swiftlm.server.operations.auth import request_caller, session_scope
from swiftlm.server.protocol import UsageInfo, new_id
from swiftlm.server.responses.items import (
    chat_request,
    input_items,
    items_to_messages,
    output_items,
    response_object,
)
from swiftlm.server.responses.objects import (
    ResponseDeleted,
    ResponseItemList,
    ResponseObject,
    ResponseStreamEvent,
)
from swiftlm.server.responses.protocol import ResponsesRequest
from swiftlm.server.responses.store import ResponseStore, StoredResponse
from swiftlm.server.responses.stream import response_events
from swiftlm.server.routes.chat import prepare_chat, stream_chat, whole_answer
from swiftlm.server.state import ServerState, output_error, server_state, stream_failure
from swiftlm.server.streaming import EventStream

router = APIRouter()
SESSION_PREFIX = "responses."  # chat session ids of response chains: "responses.<first response id>"


def _store(state: ServerState) -> ResponseStore:
    if state.responses is None:
        raise service_unavailable("The Responses API's store is not open.")
    return state.responses


def _stored(state: ServerState, raw: Request, response_id: str, param: str | None = None) -> StoredResponse:
    found = _store(state).get(session_scope(raw), response_id)
    if found is None:
        raise not_found(f"No response with id '{response_id}' (it never existed, expired, was deleted, or belongs "
                        "to another API key).", param=param)
    return found


@router.post(
    "/v1/responses",
    responses={**json_or_stream(ResponseObject, ResponseStreamEvent), **error_responses(400, 404, 429, 503)},
)
async def create_response(req: ResponsesRequest, raw: Request) -> Response:
    state = server_state(raw)
    owner = session_scope(raw)
    previous = _stored(state, raw, req.previous_response_id, "previous_response_id") if req.previous_response_id else None
    response_id = new_id("resp_")
    created_at = int(time.time())
    items = input_items(req.input)
    history = [*(previous.messages if previous else []), *items_to_messages(items)]
    instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
    chain = previous.chain if previous else response_id
    chat = chat_request(req, instructions + history, SESSION_PREFIX + chain if req.store else None)
    turn = prepare_chat(state, chat, raw)
    turn = dataclasses.replace(turn, request=dataclasses.replace(turn.request, request_id=response_id))
    model = state.response_model(req.model)

    def finish(output: list[dict[str, Any]], finish_reason: str | None, usage: UsageInfo) -> ResponseObject:
        final = response_object(req, response_id, model, created_at=created_at, output=output,
                                finish_reason=finish_reason, usage=usage)
        if req.store:
            body = final.model_dump(mode="json", by_alias=True)
            _store(state).put(StoredResponse(response_id, owner, created_at, chain, body, items,
                                             history + items_to_messages(body["output"])))
        return final

    caller = request_caller(raw)
    # the cache keys the chat request (the whole conversation); a turn that continues a stored
    # chain bypasses it, since that turn must reach the chain's session
    use = cache_use(state, req, raw, "responses", turn.request.sampling_params, key_body=chat,
                    continues_session=bool(req.store and previous))
    cached = lookup(use)
    if cached is not None:  # a hit: the stored chat answer as this response, computing nothing
        state.admit(caller, 0)
        hit = dataclasses.replace(use, status="hit")
        if req.stream:
            start = response_object(req, response_id, model, created_at=created_at)
            events = response_events(replayed(chat_hit_events(cached, response_id, True)), start, finish)
            return hit.mark(EventStream(events, nothing_to_abort))
        choice = cached["choices"][0]
        message = choice["message"]
        final = finish(output_items(message.get("reasoning"), message.get("content"), message.get("tool_calls") or []),
                       choice.get("finish_reason"), UsageInfo.model_validate(hit_usage(cached.get("usage")) or {}))
        return hit.mark(Response(final.model_dump_json(by_alias=True), media_type="application/json"))
    state.admit(caller, len(turn.request.prompt_token_ids))
    stream = state.submit(turn.request, caller)
    if req.stream:
        engine = state.ready_engine()
        start = response_object(req, response_id, model, created_at=created_at)
        chunks = use.record(stream_chat(state, chat, turn, stream, include_usage=True), chat_answer_from_chunks, True,
                            turn.thinking_label)
        events = response_events(chunks, start, finish)
        return use.mark(EventStream(events, lambda: engine.abort(response_id)))
    try:
        out: RequestOutput = await stream.final()
    except Exception as exc:
        raise stream_failure(exc) from exc
    if out.error:
        raise output_error(out.error)
    answer = whole_answer(state, chat, turn, out)
    use.keep(answer.model_dump(mode="json", exclude_none=True), turn.thinking_label)
    choice = answer.choices[0]
    message = choice.message
    calls = [call.model_dump(exclude_none=True) for call in message.tool_calls or []]
    final = finish(output_items(message.reasoning, message.content, calls), choice.finish_reason, answer.usage or UsageInfo())
    return use.mark(Response(final.model_dump_json(by_alias=True), media_type="application/json"))


@router.get("/v1/responses/{response_id}", response_model=ResponseObject, responses=error_responses(404))
async def retrieve_response(response_id: str, raw: Request) -> Response:
    found = _stored(server_state(raw), raw, response_id)
    return Response(ResponseObject.model_validate(found.body).model_dump_json(by_alias=True), media_type="application/json")


@router.delete("/v1/responses/{response_id}", response_model=ResponseDeleted, responses=error_responses(404))
async def delete_response(response_id: str, raw: Request) -> ResponseDeleted:
    state = server_state(raw)
    if not _store(state).delete(session_scope(raw), response_id):
        _stored(state, raw, response_id)  # raises its 404
    return ResponseDeleted(id=response_id, deleted=True)


@router.get("/v1/responses/{response_id}/input_items", response_model=ResponseItemList,
            responses=error_responses(400, 404))
async def list_input_items(
    response_id: str, raw: Request, limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc", after: str | None = None,
) -> ResponseItemList:
    """The items this response was made from (its own input, not the earlier turns'), ``order``
    by position ("desc", OpenAI's default: the last first), ``limit`` at a time after ``after``."""
    found = _stored(server_state(raw), raw, response_id)
    items = found.input_items if order == "asc" else found.input_items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return ResponseItemList(data=page, first_id=page[0]["id"] if page else None,
                            last_id=page[-1]["id"] if page else None, has_more=len(items) > limit)
