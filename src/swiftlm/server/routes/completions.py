"""POST /v1/completions (legacy text completions): one or several prompts, text or token ids.

``echo`` with ``logprobs`` puts the prompt tokens first in each choice's ``logprobs`` (the first
token's logprob null), as lm-evaluation-harness's ``local-completions`` reads them to score a
continuation; with ``max_tokens: 0`` the prompt is scored and nothing generated. The prompt's
logprobs come from the forward pass that computes the prompt (``SamplingParams.prompt_logprobs``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import RequestOutput
from swiftlm.frontend.text_stream import TextStream
from swiftlm.server.answer_cache.answers import (
    completion_answer_from_chunks,
    completion_hit_events,
)
from swiftlm.server.answer_cache.lookup import answer_from_cache, cache_use
from swiftlm.server.completions.completion_protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from swiftlm.server.completions.outputs import (
    completion_logprobs,
    echo_logprobs,
    join_logprobs,
    vllm_prompt_logprobs,
)
from swiftlm.server.completions.request_mapping import (
    check_prompt_chars,
    completion_prompts,
    request_priority,
    sampling_params_from_completion,
)
from swiftlm.server.completions.sampling_protocol import PromptLogprobs
from swiftlm.server.openapi import error_responses, json_or_stream
from swiftlm.server.operations.auth import request_caller
from swiftlm.server.protocol import UsageInfo, new_id
from swiftlm.server.state import ServerState, output_error, server_state, stream_failure
from swiftlm.server.streaming import EventStream

router = APIRouter()


@router.post(
    "/v1/completions",
    responses={**json_or_stream(CompletionResponse, CompletionChunk), **error_responses(400, 404, 429, 503)},
)
async def create_completion(req: CompletionRequest, raw: Request) -> Response:
    state = server_state(raw)
    engine = state.ready_engine()
    state.check_model(req.model)
    tokenizer = engine.tokenizer
    request_id = new_id("cmpl-")
    caller = request_caller(raw)  # a Batch API line's is its job's owner, at background priority
    # scoped by the caller's key, as chat's and DELETE /v1/sessions/{id}'s
    session_key = f"{caller.scope}/{req.session_id}" if req.session_id else None
    prepared: list[GenerationRequest] = []
    prompts = completion_prompts(req)
    for prompt in prompts:  # each prompt has a context window of its own
        if isinstance(prompt, str):
            check_prompt_chars([prompt], engine.max_model_len, "prompt")
    priority = request_priority(req.priority, state.scheduling_policy)
    for i, prompt in enumerate(prompts):
        text, ids = state.inputs.text(prompt)
        room = engine.max_model_len - len(ids)
        params = sampling_params_from_completion(
            req, max(room, 1), tokenizer.generation_defaults, max_n=state.config.max_n
        )
        prepared.append(state.request(
            request_id if len(prompts) == 1 else f"{request_id}-p{i}", ids, params, "prompt", prompt=text,
            session_id=session_key, stream=req.stream, final_only=not req.stream, priority=priority,
            background=caller.background,
        ))
    use = cache_use(state, req, raw, "completions", prepared[0].sampling_params)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    hit = answer_from_cache(state, use, caller, req.stream, request_id, include_usage, completion_hit_events)
    if hit is not None:
        return hit
    state.admit(caller, sum(len(r.prompt_token_ids) for r in prepared))
    streams: list[TextStream] = []
    try:
        for request in prepared:
            streams.append(state.submit(request, caller))
    except Exception:
        for s in streams:
            engine.abort(s.request_id)
        raise
    n = prepared[0].sampling_params.n
    if req.stream:
        def close() -> None:
            for s in streams:
                engine.abort(s.request_id)

        events = _stream(state, req, request_id, streams, n, include_usage or use.key is not None, use.extension)
        return use.mark(EventStream(use.record(events, completion_answer_from_chunks, include_usage), close))
    try:
        outs = await asyncio.gather(*(s.final() for s in streams))
    except Exception as exc:
        raise stream_failure(exc) from exc
    choices = []
    prompt_tokens = completion_tokens = cached = 0
    for p, out in enumerate(outs):
        if out.error:
            raise output_error(out.error)
        prefix = (out.prompt or tokenizer.decode(out.prompt_token_ids)) if req.echo else ""
        echoed = _echoed_logprobs(state, req, out)
        scored = _vllm_prompt_logprobs(state, req, out)
        for seq in out.outputs:
            logprobs = None
            if req.logprobs is not None:
                logprobs = completion_logprobs(tokenizer, seq, req.logprobs, len(prefix))
                logprobs = join_logprobs(echoed, logprobs) if echoed is not None else logprobs
            choices.append(
                CompletionChoice(
                    index=p * n + seq.index, text=prefix + seq.text, logprobs=logprobs,
                    finish_reason=seq.finish_reason, stop_reason=seq.stop_reason, prompt_logprobs=scored,
                )
            )
            completion_tokens += len(seq.token_ids)
        prompt_tokens += len(out.prompt_token_ids)
        cached += out.num_cached_tokens
        state.metrics.observe_finished(out.metrics, len(out.prompt_token_ids), sum(len(s.token_ids) for s in out.outputs), out.outputs[0].finish_reason or "stop")
    usage = UsageInfo.of(prompt_tokens, completion_tokens, cached)
    body = CompletionResponse(id=request_id, model=state.response_model(req.model), choices=choices, usage=usage,
                              swiftlm=use.extension or None)
    text = body.model_dump_json(exclude_none=True)
    use.keep_json(text)
    return use.mark(Response(text, media_type="application/json"))


def _echoed_logprobs(state: ServerState, req: CompletionRequest, out: RequestOutput) -> CompletionLogprobs | None:
    """The prompt's part of an ``echo`` + ``logprobs`` choice (None for other requests)."""
    if not req.echo or req.logprobs is None or out.prompt_logprobs is None:
        return None
    return echo_logprobs(state.engine.tokenizer, out.prompt_token_ids, out.prompt_logprobs, req.logprobs)


def _vllm_prompt_logprobs(state: ServerState, req: CompletionRequest, out: RequestOutput) -> PromptLogprobs | None:
    if req.prompt_logprobs is None or out.prompt_logprobs is None:
        return None
    return vllm_prompt_logprobs(state.engine.tokenizer, out.prompt_token_ids, out.prompt_logprobs, req.prompt_logprobs)


async def _stream(
    state: ServerState, req: CompletionRequest, request_id: str, streams: list[TextStream], n: int, include_usage: bool,
    extension: dict | None = None,
) -> AsyncIterator[str]:
    tokenizer = state.engine.tokenizer
    created = int(time.time())
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(p: int, stream: TextStream) -> None:
        try:
            async for out in stream:
                await queue.put((p, out))
        except Exception as exc:
            await queue.put((p, exc))
        await queue.put((p, None))

    tasks = [asyncio.create_task(pump(p, s)) for p, s in enumerate(streams)]
    finals: dict[int, RequestOutput] = {}
    offsets: dict[int, int] = {}
    prompts: dict[int, RequestOutput] = {}  # prompt p -> the output that carried its prompt logprobs
    open_streams = len(streams)
    generated = 0
    generated_by: dict[int, int] = {}  # prompt p -> tokens generated for it (all n sequences)
    reasons: dict[int, str] = {}  # prompt p -> its first sequence's finish reason
    try:
        while open_streams:
            p, item = await queue.get()
            if item is None:
                open_streams -= 1
                continue
            if isinstance(item, BaseException):
                yield stream_failure(item).sse_event()
                break
            if item.error:
                yield output_error(item.error).sse_event()
                break
            choices = []
            if item.prompt_logprobs is not None:
                prompts[p] = item
            for seq in item.outputs:
                index = p * n + seq.index
                generated += len(seq.token_ids)
                generated_by[p] = generated_by.get(p, 0) + len(seq.token_ids)
                if seq.index == 0 and seq.finish_reason is not None:
                    reasons[p] = seq.finish_reason
                text = seq.text
                echoed = None
                if req.echo and index not in offsets:
                    prompt_text = item.prompt or tokenizer.decode(item.prompt_token_ids)
                    text = prompt_text + text
                    offsets[index] = len(prompt_text)
                    if p in prompts:
                        echoed = _echoed_logprobs(state, req, prompts[p])
                logprobs = None
                if req.logprobs is not None and seq.token_ids:
                    logprobs = completion_logprobs(tokenizer, seq, req.logprobs, offsets.get(index, 0))
                if echoed is not None:
                    logprobs = join_logprobs(echoed, logprobs)
                offsets[index] = offsets.get(index, 0) + len(seq.text)
                choices.append(CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason))
            body = CompletionChunk(id=request_id, created=created, model=state.response_model(req.model), choices=choices,
                                   swiftlm=extension or None)
            extension = None  # on the first chunk only
            yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
            if item.finished:
                finals[p] = item
        if len(finals) == len(streams):  # every prompt finished: counted as the whole answers are
            for p, out in finals.items():
                state.metrics.observe_finished(out.metrics, len(out.prompt_token_ids), generated_by.get(p, 0),
                                               reasons.get(p, "stop"))
        if include_usage and len(finals) == len(streams):
            usage = UsageInfo.of(
                sum(len(o.prompt_token_ids) for o in finals.values()),
                generated,
                sum(o.num_cached_tokens for o in finals.values()),
            )
            body = CompletionChunk(id=request_id, created=created, model=state.response_model(req.model), choices=[], usage=usage)
            yield f"data: {body.model_dump_json(exclude_none=True)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:
            t.cancel()
