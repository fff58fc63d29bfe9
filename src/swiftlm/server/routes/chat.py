"""POST /v1/chat/completions: thinking, sessions, streaming and whole answers.

Reasoning reaches the client in both of the names clients read: ``reasoning`` (current vLLM) and
``reasoning_content`` (older vLLM, most clients), whole and in streamed deltas. With the server's
``reasoning_parser`` "none" the output is not split: ``<think>...</think>`` stays inline in
``content`` as the model wrote it and no reasoning field is sent, as vLLM without a parser.

Tool calls (``swiftlm.server.completions.tool_choice`` decides when they are parsed) are read from the answer
after the reasoning is split off: ``message.tool_calls`` holds them, ``content`` the rest (null
when nothing else was said), and ``finish_reason`` is "tool_calls" when calls were made and the
model stopped by itself ("length" stays "length"). Streamed, a call is sent when it closes: one
delta with its ``index``, ``id``, ``type`` and ``function.name`` (``arguments`` ""), then one with
the whole ``function.arguments`` (``swiftlm.text.tools``). A session records the calls with the
answer, so the next request carrying the tool results continues the session.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import RequestOutput
from swiftlm.frontend.answer import AnswerStream, read_answer
from swiftlm.frontend.input_processor import ChatInput
from swiftlm.frontend.text_stream import TextStream
from swiftlm.server.answer_cache.answers import (
    chat_answer_from_chunks,
    chat_hit_events,
)
from swiftlm.server.answer_cache.lookup import answer_from_cache, cache_use
from swiftlm.server.completions.chat_protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
)
from swiftlm.server.completions.outputs import (
    chat_logprobs,
    reasoning_token_count,
    usage_of,
    vllm_prompt_logprobs,
)
from swiftlm.server.completions.request_mapping import (
    chat_messages,
    check_prompt_chars,
    request_priority,
    sampling_params_from_chat,
    template_tools,
)
from swiftlm.server.completions.tool_choice import ToolPolicy, tool_policy
from swiftlm.server.errors import OpenAIError
from swiftlm.server.openapi import error_responses, json_or_stream
from swiftlm.server.operations.auth import request_caller
from swiftlm.server.protocol import UsageInfo, new_id
from swiftlm.server.state import ServerState, output_error, server_state, stream_failure
from swiftlm.server.streaming import EventStream
from swiftlm.text.tools import ToolDelta

router = APIRouter()


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """What one chat request resolved to before it reached the engine, and what recording the
    session's turn needs afterwards."""

    request: GenerationRequest
    messages: list[dict]  # the whole conversation (a session's transcript + the new messages)
    tools: list[dict] | None
    separate: bool  # the reasoning is split from the answer (thinking on, a reasoning parser)
    tool_policy: ToolPolicy  # whether tool calls are parsed from the answer, and how many
    thinking_label: str  # what the response reports: "on", "off", "auto:on", "auto:off"


def prepare_chat(state: ServerState, req: ChatCompletionRequest, raw: Request) -> ChatTurn:
    """The request's fields mapped (``completions.request_mapping``, ``tool_choice``), then the turn
    made by the input processor (``InputProcessor.chat_turn``: conversation, thinking, template,
    length, validation)."""
    engine = state.ready_engine()
    state.check_model(req.model)
    caller = request_caller(raw)
    new_messages = chat_messages(req.messages)
    check_prompt_chars([str(m.get("content") or "") for m in new_messages], engine.max_model_len, "messages")
    policy = tool_policy(req, state.config.tool_call_parser)
    chat = ChatInput(
        new_messages,
        sampling_params_from_chat(req, None, engine.tokenizer.generation_defaults, max_n=state.config.max_n),
        enable_thinking=req.enable_thinking, template_kwargs=req.chat_template_kwargs,
        reasoning_effort=req.reasoning_effort, tools=template_tools(req), tool_constraint=policy.constraint,
        session_id=f"{caller.scope}/{req.session_id}" if req.session_id else None, session_reset=req.session_reset,
    )
    turn = state.chat_turn(
        new_id("chatcmpl-"), chat, stream=req.stream, final_only=not req.stream,
        priority=request_priority(req.priority, state.scheduling_policy), background=caller.background,
    )
    choice = turn.thinking
    if choice.auto:
        state.metrics.thinking_auto.labels(state.model_name, "on" if choice.thinking else "off").inc()
    separate = choice.thinking and state.config.reasoning_parser != "none"
    return ChatTurn(turn.request, turn.messages, turn.tools, separate, policy, choice.label)


@router.post(
    "/v1/chat/completions",
    responses={**json_or_stream(ChatCompletionResponse, ChatCompletionChunk), **error_responses(400, 404, 429, 503)},
)
async def create_chat_completion(req: ChatCompletionRequest, raw: Request) -> Response:
    state = server_state(raw)
    turn = prepare_chat(state, req, raw)
    request = turn.request
    caller = request_caller(raw)
    use = cache_use(state, req, raw, "chat", request.sampling_params)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    hit = answer_from_cache(state, use, caller, request.stream, request.request_id, include_usage, chat_hit_events)
    if hit is not None:
        return hit
    state.admit(caller, len(request.prompt_token_ids))
    stream = state.submit(request, caller)
    extension = {"thinking": turn.thinking_label, **use.extension}
    if request.stream:
        engine = state.ready_engine()
        events = stream_chat(state, req, turn, stream, include_usage or use.key is not None, extension)
        events = use.record(events, chat_answer_from_chunks, include_usage, turn.thinking_label)
        return use.mark(EventStream(events, lambda: engine.abort(request.request_id)))
    try:
        out = await stream.final()
    except Exception as exc:
        raise stream_failure(exc) from exc
    if out.error:
        raise output_error(out.error)
    body = whole_answer(state, req, turn, out)
    body.swiftlm = extension
    text = body.model_dump_json(exclude_none=True)
    use.keep_json(text, turn.thinking_label)
    return use.mark(Response(text, media_type="application/json"))


def whole_answer(state: ServerState, req: ChatCompletionRequest, turn: ChatTurn, out: RequestOutput) -> ChatCompletionResponse:
    tokenizer = state.engine.tokenizer
    choices = []
    completion_tokens = reasoning_tokens = 0
    k = req.top_logprobs or 0
    for seq in out.outputs:
        answer = read_answer(seq.text, turn.separate, turn.tool_policy.parse, turn.tool_policy.parallel)
        content, calls = answer.content, answer.tool_calls
        if answer.errors:
            state.metrics.tool_call_parse_errors.labels(state.model_name).inc(answer.errors)
        reasoning = (answer.reasoning or None) if req.return_reasoning else None
        message = ChatCompletionMessage(
            content=content, reasoning=reasoning, reasoning_content=reasoning, tool_calls=_tool_calls(calls) or None
        )
        choices.append(
            ChatCompletionChoice(
                index=seq.index, message=message, logprobs=chat_logprobs(tokenizer, seq, k) if req.logprobs else None,
                finish_reason=_finish_reason(seq.finish_reason, bool(calls)), stop_reason=seq.stop_reason,
            )
        )
        completion_tokens += len(seq.token_ids)
        reasoning_tokens += reasoning_token_count(seq.token_ids, turn.request.thinking, tokenizer.think_end_id)
        if seq.index == 0 and turn.request.session_id is not None:
            state.session_prompts.record(
                turn.request.session_id, turn.messages, content or "", out.prompt_token_ids + seq.token_ids, turn.tools,
                tool_calls=calls,
            )
    state.metrics.observe_finished(out.metrics, len(out.prompt_token_ids), completion_tokens, out.outputs[0].finish_reason or "stop")
    return ChatCompletionResponse(
        id=turn.request.request_id, model=state.response_model(req.model), choices=choices,
        usage=usage_of(out, completion_tokens, reasoning_tokens),
        prompt_logprobs=None if req.prompt_logprobs is None or out.prompt_logprobs is None
        else vllm_prompt_logprobs(tokenizer, out.prompt_token_ids, out.prompt_logprobs, req.prompt_logprobs),
    )


async def stream_chat(
    state: ServerState, req: ChatCompletionRequest, turn: ChatTurn, stream: TextStream, include_usage: bool,
    extension: dict | None = None,
) -> AsyncIterator[str]:
    tokenizer = state.engine.tokenizer
    created = int(time.time())
    n = turn.request.sampling_params.n
    answers = [AnswerStream(turn.separate, turn.tool_policy.parse, turn.tool_policy.parallel) for _ in range(n)]
    token_ids: list[list[int]] = [[] for _ in range(n)]
    k = req.top_logprobs or 0

    def chunk(choices: list[ChatCompletionChunkChoice], usage: UsageInfo | None = None, ext: dict | None = None) -> str:
        body = ChatCompletionChunk(id=turn.request.request_id, created=created, model=state.response_model(req.model),
                                   choices=choices, usage=usage, swiftlm=ext)
        return f"data: {body.model_dump_json(exclude_none=True)}\n\n"

    yield chunk([ChatCompletionChunkChoice(index=i, delta=DeltaMessage(role="assistant", content="")) for i in range(n)],
                ext=extension)
    last = None
    previous = time.monotonic()
    try:
        async for out in stream:
            last = out
            now = time.monotonic()
            state.metrics.itl.labels(state.model_name).observe(now - previous)
            previous = now
            rounds: list[list[ChatCompletionChunkChoice]] = []  # one chunk per round, one delta per choice in each
            for seq in out.outputs:
                i = seq.index
                token_ids[i].extend(seq.token_ids)
                reasoning, items = answers[i].feed(seq.text, seq.finish_reason is not None)
                reasoning = (reasoning or None) if req.return_reasoning else None
                logprobs = chat_logprobs(tokenizer, seq, k) if req.logprobs and seq.token_ids else None
                if not items and reasoning is None and seq.finish_reason is None and logprobs is None:
                    continue
                deltas = [_delta(item) for item in items] or [DeltaMessage()]
                deltas[0].reasoning = deltas[0].reasoning_content = reasoning
                finish = _finish_reason(seq.finish_reason, bool(answers[i].tool_calls))
                for r, delta in enumerate(deltas):
                    last_delta = r == len(deltas) - 1
                    if r == len(rounds):
                        rounds.append([])
                    rounds[r].append(
                        ChatCompletionChunkChoice(
                            index=i, delta=delta, logprobs=logprobs if r == 0 else None,
                            finish_reason=finish if last_delta else None, stop_reason=seq.stop_reason if last_delta else None,
                        )
                    )
            for choices in rounds:
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
        errors = sum(a.errors for a in answers)
        if errors:
            state.metrics.tool_call_parse_errors.labels(state.model_name).inc(errors)
        if turn.request.session_id is not None:
            state.session_prompts.record(
                turn.request.session_id, turn.messages, answers[0].content, last.prompt_token_ids + token_ids[0],
                turn.tools, tool_calls=[call.to_openai() for call in answers[0].tool_calls],
            )
        if include_usage:
            yield chunk([], usage_of(last, completion_tokens, reasoning))
    yield "data: [DONE]\n\n"


def _finish_reason(finish_reason: str | None, made_calls: bool) -> str | None:
    """"tool_calls" when the model made calls and stopped by itself; else the engine's reason."""
    return "tool_calls" if made_calls and finish_reason == "stop" else finish_reason


def _tool_calls(calls: list[dict]) -> list[ToolCall]:
    return [
        ToolCall(id=c["id"], function=FunctionCall(name=c["function"]["name"], arguments=c["function"]["arguments"]))
        for c in calls
    ]


def _delta(item: ToolDelta) -> DeltaMessage:
    if item.index is None:
        return DeltaMessage(content=item.content)
    call = DeltaToolCall(
        index=item.index, id=item.id, type="function" if item.id is not None else None,
        function=DeltaFunctionCall(name=item.name, arguments=item.arguments),
    )
    return DeltaMessage(tool_calls=[call])
