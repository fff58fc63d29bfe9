"""Answers in and out of the response cache: one stored form (the whole, non-streamed body)
for both ways of asking.

- A whole miss is stored as the body it answered with (``stored_answer``).
- A streamed miss is stored as the whole body its chunks add up to (``chat_answer_from_chunks``,
  ``completion_answer_from_chunks``): per choice the content (text), reasoning and tool calls
  joined, logprobs in order, the last finish and stop reasons, the usage chunk's usage.
- A whole hit answers the stored body with a new ``id`` and ``created`` (``whole_hit``).
- A streamed hit replays it as chunks (``chat_hit_events``, ``completion_hit_events``): the role,
  then per choice its reasoning, its content in one delta, each tool call (its name, then its
  arguments), the finish reason; the usage chunk when ``stream_options.include_usage`` asks.
  The content bytes are those of the miss; only the cut into chunks differs.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

_NOT_STORED = ("id", "created", "swiftlm")


def _dump(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def stored_answer(body: dict[str, Any], thinking: str | None = None) -> dict[str, Any]:
    """What the cache keeps of a whole response body (everything but its id, time and extension)."""
    answer = {k: v for k, v in body.items() if k not in _NOT_STORED}
    if thinking is not None:
        answer["thinking"] = thinking
    return answer


def hit_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The miss's usage with every prompt token counted as cached."""
    if usage is None:
        return None
    details = dict(usage.get("prompt_tokens_details") or {})
    details["cached_tokens"] = usage.get("prompt_tokens", 0)
    return {**usage, "prompt_tokens_details": details}


def hit_extension(answer: dict[str, Any]) -> dict[str, Any]:
    ext: dict[str, Any] = {"cache": "hit", "computed_tokens": 0}
    if "thinking" in answer:
        ext["thinking"] = answer["thinking"]
    return ext


def whole_hit(answer: dict[str, Any], request_id: str) -> str:
    body = {"id": request_id, "created": int(time.time())}
    body.update({k: v for k, v in answer.items() if k != "thinking"})
    body["usage"] = hit_usage(answer.get("usage"))
    body["swiftlm"] = hit_extension(answer)
    return _dump({k: v for k, v in body.items() if v is not None})


def parse_events(event: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of one or more ``data: ...`` SSE events (``[DONE]`` left out)."""
    for line in event.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


# ---------------------------------------------------------------- chat


def chat_answer_from_chunks(chunks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    choices: dict[int, dict[str, Any]] = {}
    answer: dict[str, Any] = {"object": "chat.completion"}
    for chunk in chunks:
        answer["model"] = chunk.get("model", answer.get("model"))
        if chunk.get("usage") is not None:
            answer["usage"] = chunk["usage"]
        if chunk.get("swiftlm", {}).get("thinking") is not None:
            answer["thinking"] = chunk["swiftlm"]["thinking"]
        for part in chunk.get("choices", ()):
            choice = choices.setdefault(part["index"], {"index": part["index"], "message": {"role": "assistant"}})
            message, delta = choice["message"], part.get("delta", {})
            for name in ("content", "reasoning", "reasoning_content"):
                if delta.get(name) is not None:
                    message[name] = message.get(name, "") + delta[name]
            for call in delta.get("tool_calls") or ():
                calls = message.setdefault("tool_calls", [])
                while len(calls) <= call["index"]:
                    calls.append({"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
                slot = calls[call["index"]]
                slot["id"] = call.get("id") or slot["id"]
                function = call.get("function") or {}
                slot["function"]["name"] = function.get("name") or slot["function"]["name"]
                slot["function"]["arguments"] += function.get("arguments") or ""
            if part.get("logprobs"):
                logprobs = choice.setdefault("logprobs", {"content": []})
                logprobs["content"].extend(part["logprobs"].get("content") or [])
            for name in ("finish_reason", "stop_reason"):
                if part.get(name) is not None:
                    choice[name] = part[name]
    for choice in choices.values():
        message = choice["message"]
        message.setdefault("content", None)
        if message.get("tool_calls") and not message["content"]:
            message["content"] = None
        choice.setdefault("finish_reason", None)
    answer["choices"] = [choices[i] for i in sorted(choices)]
    return answer


def chat_hit_events(answer: dict[str, Any], request_id: str, include_usage: bool) -> Iterator[str]:
    created = int(time.time())
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": answer.get("model")}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        return f"data: {_dump({**head, 'choices': choices, **extra})}\n\n"

    choices = answer.get("choices", [])
    yield event([{"index": c["index"], "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                 for c in choices], swiftlm=hit_extension(answer))
    for choice in choices:
        i, message = choice["index"], choice["message"]
        reasoning = message.get("reasoning_content")
        if reasoning:
            yield event([{"index": i, "delta": {"reasoning": reasoning, "reasoning_content": reasoning},
                          "finish_reason": None}])
        if message.get("content"):
            part: dict[str, Any] = {"index": i, "delta": {"content": message["content"]}, "finish_reason": None}
            if choice.get("logprobs") is not None:
                part["logprobs"] = choice["logprobs"]
            yield event([part])
        for n, call in enumerate(message.get("tool_calls") or ()):
            header = {"index": n, "id": call["id"], "type": "function",
                      "function": {"name": call["function"]["name"], "arguments": ""}}
            yield event([{"index": i, "delta": {"tool_calls": [header]}, "finish_reason": None}])
            arguments = {"index": n, "function": {"arguments": call["function"]["arguments"]}}
            yield event([{"index": i, "delta": {"tool_calls": [arguments]}, "finish_reason": None}])
        last = {"index": i, "delta": {}, "finish_reason": choice.get("finish_reason")}
        if choice.get("stop_reason") is not None:
            last["stop_reason"] = choice["stop_reason"]
        yield event([last])
    if include_usage:
        yield event([], usage=hit_usage(answer.get("usage")))
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------- legacy completions


def completion_answer_from_chunks(chunks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    choices: dict[int, dict[str, Any]] = {}
    answer: dict[str, Any] = {"object": "text_completion"}
    for chunk in chunks:
        answer["model"] = chunk.get("model", answer.get("model"))
        if chunk.get("usage") is not None:
            answer["usage"] = chunk["usage"]
        for part in chunk.get("choices", ()):
            choice = choices.setdefault(part["index"], {"index": part["index"], "text": "", "finish_reason": None})
            choice["text"] += part.get("text", "")
            if part.get("logprobs") is not None:
                logprobs = choice.setdefault(
                    "logprobs", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
                )
                for name in logprobs:
                    logprobs[name].extend(part["logprobs"].get(name) or [])
            for name in ("finish_reason", "stop_reason"):
                if part.get(name) is not None:
                    choice[name] = part[name]
    answer["choices"] = [choices[i] for i in sorted(choices)]
    return answer


def completion_hit_events(answer: dict[str, Any], request_id: str, include_usage: bool) -> Iterator[str]:
    head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": answer.get("model")}
    for n, choice in enumerate(answer.get("choices", [])):
        extra = {"swiftlm": hit_extension(answer)} if n == 0 else {}
        yield f"data: {_dump({**head, 'choices': [choice], **extra})}\n\n"
    if include_usage:
        yield f"data: {_dump({**head, 'choices': [], 'usage': hit_usage(answer.get('usage'))})}\n\n"
    yield "data: [DONE]\n\n"


async def recorded(
    events: AsyncIterator[str], keep: Callable[[list[dict[str, Any]]], None], include_usage: bool
) -> AsyncIterator[str]:
    """``events`` passed through, their chunks collected; when the stream ends normally (no error
    event) ``keep(chunks)`` stores them. The usage chunk is held back unless the client asked
    for it (the cache asks for it always, to store the usage)."""
    chunks: list[dict[str, Any]] = []
    failed = False
    try:
        async for event in events:
            parsed = list(parse_events(event))
            failed = failed or any("error" in p for p in parsed)
            chunks.extend(parsed)
            if not include_usage and parsed and all(not p.get("choices") and p.get("usage") for p in parsed):
                continue
            yield event
    finally:  # a client that left closes this stream early: close the one it wraps too
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    if not failed and chunks:
        keep(chunks)


async def replayed(events: Iterable[str]) -> AsyncIterator[str]:
    """A stored answer's events as the stream a response sends."""
    for event in events:
        yield event


def nothing_to_abort() -> None:
    """A replayed answer has no engine request to abort when its stream closes."""
