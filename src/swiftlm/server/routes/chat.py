"""POST /v1/chat/completions: thinking, sessions, streaming and whole answers.

Reasoning reaches the client in both of the names clients read: ``reasoning`` (current vLLM) and
``reasoning_content`` (older vLLM, most clients), whole and in streamed deltas. With the server's
``reasoning_parser`` "none" the output is not split: ``<think>...</think>`` stays inline in
``content`` as the model wrote it and no reasoning field is sent, as vLLM without a parser.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import RequestOutput
from swiftlm.engine.async_engine import RequestStream
from swiftlm.server.auth import session_scope
from swiftlm.server.errors import OpenAIError, bad_request
from swiftlm.server.outputs import chat_logprobs, reasoning_token_count, usage_of, vllm_prompt_logprobs
from swiftlm.server.protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
    UsageInfo,
    new_id,
)
from swiftlm.server.request_mapping import (
    chat_messages,
    check_max_tokens,
    sampling_params_from_chat,
    template_kwargs,
    template_tools,
    thinking_enabled,
)
from swiftlm.server.state import ServerState, output_error, server_state, stream_failure
from swiftlm.server.streaming import EventStream
from swiftlm.text.chat_template import ChatTemplateError
from swiftlm.text.reasoning import ReasoningStreamParser, split_reasoning

router = APIRouter()


@dataclass(frozen=True, slots=True)
class _ChatTurn:
    """What one chat request resolved to before it reached the engine, and what recording the
    session's turn needs afterwards."""

    request: GenerationRequest
    messages: list[dict]  # the whole conversation (a session's transcript + the new messages)
    tools: list[dict] | None
    separate: bool  # the reasoning is split from the answer (thinking on, a reasoning parser)


def _prepare(state: ServerState, req: ChatCompletionRequest, raw: Request) -> _ChatTurn:
    engine = state.ready_engine()
    state.check_model(req.model)
    tokenizer = engine.tokenizer
    session_key = f"{session_scope(raw)}/{req.session_id}" if req.session_id else None
    messages = state.session_prompts.conversation(session_key, chat_messages(req.messages), reset=req.session_reset)
    defaults = state.config.default_chat_template_kwargs
    thinking = thinking_enabled(req, defaults, can_think=tokenizer.think_end_id is not None)
    tools = template_tools(req)
    kwargs = template_kwargs(req, defaults, thinking)
    try:
        prompt, ids = state.session_prompts.prompt(session_key, messages, kwargs, tools)
    except ChatTemplateError as exc:
        raise bad_request(f"the chat template could not render these messages: {exc}", param="messages") from exc
    room = engine.max_model_len - len(ids)
    params = sampling_params_from_chat(
        req, max(room, 1), tokenizer.generation_defaults, vocab_size=engine.engine.model.config.vocab_size,
        max_n=state.config.max_n,
    )
    check_max_tokens(params.max_tokens, len(ids), engine.max_model_len)
    request = GenerationRequest(
        request_id=new_id("chatcmpl-"), prompt_token_ids=ids, sampling_params=params, prompt=prompt,
        thinking=thinking, session_id=session_key, stream=req.stream, final_only=not req.stream,
    )
    return _ChatTurn(request, messages, tools, thinking and state.config.reasoning_parser != "none")


@router.post("/v1/chat/completions")
async def create_chat_completion(req: ChatCompletionRequest, raw: Request) -> Response:
    state = server_state(raw)
    turn = _prepare(state, req, raw)
    request = turn.request
    stream = state.submit(request)
    if request.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        engine = state.ready_engine()
        return EventStream(
            _stream_chat(state, req, turn, stream, include_usage), lambda: engine.abort(request.request_id)
        )
    try:
        out = await stream.final()
    except Exception as exc:
        raise stream_failure(exc) from exc
    if out.error:
        raise output_error(out.error)
    return Response(_whole_answer(state, req, turn, out).model_dump_json(exclude_none=True), media_type="application/json")


def _whole_answer(state: ServerState, req: ChatCompletionRequest, turn: _ChatTurn, out: RequestOutput) -> ChatCompletionResponse:
    tokenizer = state.engine.tokenizer
    choices = []
    completion_tokens = reasoning_tokens = 0
    k = req.top_logprobs or 0
    for seq in out.outputs:
        reasoning, content = split_reasoning(seq.text, turn.separate)
        reasoning = (reasoning or None) if req.return_reasoning else None
        message = ChatCompletionMessage(content=content, reasoning=reasoning, reasoning_content=reasoning)
        choices.append(
            ChatCompletionChoice(
                index=seq.index, message=message, logprobs=chat_logprobs(tokenizer, seq, k) if req.logprobs else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            )
        )
        completion_tokens += len(seq.token_ids)
        reasoning_tokens += reasoning_token_count(seq.token_ids, turn.request.thinking, tokenizer.think_end_id)
        if seq.index == 0 and turn.request.session_id is not None:
            state.session_prompts.record(
                turn.request.session_id, turn.messages, content, out.prompt_token_ids + seq.token_ids, turn.tools
            )
    state.metrics.observe_finished(out.metrics, len(out.prompt_token_ids), completion_tokens, out.outputs[0].finish_reason or "stop")
    return ChatCompletionResponse(
        id=turn.request.request_id, model=state.response_model(req.model), choices=choices,
        usage=usage_of(out, completion_tokens, reasoning_tokens),
        prompt_logprobs=None if req.prompt_logprobs is None or out.prompt_logprobs is None
        else vllm_prompt_logprobs(tokenizer, out.prompt_token_ids, out.prompt_logprobs, req.prompt_logprobs),
    )


async def _stream_chat(
    state: ServerState, req: ChatCompletionRequest, turn: _ChatTurn, stream: RequestStream, include_usage: bool
) -> AsyncIterator[str]:
    tokenizer = state.engine.tokenizer
    created = int(time.time())
    n = turn.request.sampling_params.n
    parsers = [ReasoningStreamParser(turn.separate) for _ in range(n)]
    token_ids: list[list[int]] = [[] for _ in range(n)]
    contents = [""] * n
    k = req.top_logprobs or 0

    def chunk(choices: list[ChatCompletionChunkChoice], usage: UsageInfo | None = None) -> str:
        body = ChatCompletionChunk(id=turn.request.request_id, created=created, model=state.response_model(req.model), choices=choices, usage=usage)
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

    yield chunk([ChatCompletionChunkChoice(index=i, delta=DeltaMessage(role="assistant", content="")) for i in range(n)])
    last = None
    previous = time.monotonic()
    try:
        async for out in stream:
            last = out
            now = time.monotonic()
            state.metrics.itl.labels(state.model_name).observe(now - previous)
            previous = now
            choices = []
            for seq in out.outputs:
                i = seq.index
                token_ids[i].extend(seq.token_ids)
                reasoning, content = parsers[i].feed(seq.text)
                if seq.finish_reason is not None:
                    tail_reasoning, tail_content = parsers[i].finish()
                    reasoning, content = reasoning + tail_reasoning, content + tail_content
                contents[i] += content
                reasoning = (reasoning or None) if req.return_reasoning else None
                delta = DeltaMessage(content=content or None, reasoning=reasoning, reasoning_content=reasoning)
                logprobs = chat_logprobs(tokenizer, seq, k) if req.logprobs and seq.token_ids else None
                if delta.content is None and delta.reasoning_content is None and seq.finish_reason is None and logprobs is None:
                    continue
                choices.append(
                    ChatCompletionChunkChoice(
                        index=i, delta=delta, logprobs=logprobs, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason
                    )
                )
            if choices:
                yield chunk(choices)
    except Exception as exc:  # failures after the stream started travel as an error event
        yield stream_failure(exc).sse_event()
        yield "data: [DONE]\n\n"
        return
    if last is not None and last.error:
        error: OpenAIError = output_error(last.error)
        yield error.sse_event()
    elif last is not None:
        completion_tokens = sum(len(t) for t in token_ids)
        reasoning = sum(reasoning_token_count(t, turn.request.thinking, tokenizer.think_end_id) for t in token_ids)
        state.metrics.observe_finished(last.metrics, len(last.prompt_token_ids), completion_tokens, "stop")
        if turn.request.session_id is not None:
            state.session_prompts.record(
                turn.request.session_id, turn.messages, contents[0], last.prompt_token_ids + token_ids[0], turn.tools
            )
        if include_usage:
            yield chunk([], usage_of(last, completion_tokens, reasoning))
    yield "data: [DONE]\n\n"
