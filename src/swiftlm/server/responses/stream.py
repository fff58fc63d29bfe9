"""A streamed response as OpenAI's semantic events, made from the chat stream's chunks.

The chat route's stream (``swiftlm.server.routes.chat.stream_chat``) already splits the reasoning
from the answer, parses tool calls and records the session's turn; this reads its chunks back and
says the same thing in the Responses API's events, each ``event: <type>`` with a JSON ``data``
holding ``type`` and ``sequence_number`` (0, 1, 2, ... within the stream):

    response.created, response.in_progress
    per output item, in output order:
      reasoning:      output_item.added, content_part.added, reasoning_text.delta..., reasoning_text.done,
                      content_part.done, output_item.done
      message:        output_item.added, content_part.added, output_text.delta..., output_text.done,
                      content_part.done, output_item.done
      function_call:  output_item.added, function_call_arguments.delta, function_call_arguments.done,
                      output_item.done
    response.completed (response.incomplete when it ran into max_output_tokens)

A failure after the stream started is an ``error`` event followed by ``response.failed``. One item
is open at a time: a new kind of delta closes the open item first.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from swiftlm.server.protocol import UsageInfo, new_id
from swiftlm.server.responses.items import function_call_item, message_item, reasoning_item
from swiftlm.server.responses.objects import ResponseObject

# (output items, finish reason, usage) -> the final response object (stored by the caller)
Finish = Callable[[list[dict[str, Any]], str | None, UsageInfo], ResponseObject]


class ResponseEvents:
    """The events of one streamed response, numbered; ``items`` are its output items so far."""

    def __init__(self) -> None:
        self.sequence_number = 0
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _start(self, item: dict[str, Any]) -> list[str]:
        out = self.close()
        self.items.append(item)
        self._open = item
        out.append(self.event("response.output_item.added", output_index=len(self.items) - 1, item=item))
        part = _part(item)
        if part is not None:
            out.append(self._part_event("response.content_part.added", part))
        return out

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.items) - 1}

    def _part_event(self, kind: str, part: dict[str, Any]) -> str:
        return self.event(kind, **self._where(), content_index=0, part=part)

    def text(self, kind: str, delta: str) -> list[str]:
        """A piece of reasoning (``kind`` "reasoning") or of the answer's text ("message")."""
        out = []
        if self._open is None or self._open["type"] != kind:
            item = reasoning_item(new_id("rs_"), "", "in_progress") if kind == "reasoning" else \
                message_item(new_id("msg_"), "", "in_progress")
            out += self._start(item)
        assert self._open is not None
        self._open["content"][0]["text"] += delta
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        out.append(self.event(name, **self._where(), content_index=0, delta=delta, **extra))
        return out

    def call(self, call_id: str, name: str) -> list[str]:
        item = function_call_item(new_id("fc_"), {"id": call_id, "function": {"name": name, "arguments": ""}}, "in_progress")
        return self._start(item)

    def arguments(self, delta: str) -> list[str]:
        if self._open is None or self._open["type"] != "function_call" or not delta:
            return []
        self._open["arguments"] += delta
        return [self.event("response.function_call_arguments.delta", **self._where(), delta=delta)]

    def close(self) -> list[str]:
        """The done events of the open item, if any."""
        item, out = self._open, []
        if item is None:
            return out
        where = self._where()
        if item["type"] == "function_call":
            out.append(self.event("response.function_call_arguments.done", **where, name=item["name"],
                                  arguments=item["arguments"]))
        else:
            text = item["content"][0]["text"]
            if item["type"] == "reasoning":
                out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=text))
            else:
                out.append(self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]))
            out.append(self._part_event("response.content_part.done", item["content"][0]))
        item["status"] = "completed"
        out.append(self.event("response.output_item.done", output_index=where["output_index"], item=item))
        self._open = None
        return out


def _part(item: dict[str, Any]) -> dict[str, Any] | None:
    if item["type"] == "function_call":
        return None
    return {**item["content"][0], "text": ""}


async def response_events(chunks: AsyncIterator[str], start: ResponseObject, finish: Finish) -> AsyncIterator[str]:
    """The events of a streamed response from the chat stream's SSE ``chunks``; ``finish`` makes
    the final response object once the answer is whole."""
    events = ResponseEvents()
    begun = start.model_dump(mode="json", by_alias=True)
    yield events.event("response.created", response=begun)
    yield events.event("response.in_progress", response=begun)
    finish_reason: str | None = None
    usage: UsageInfo | None = None
    async for chunk in chunks:
        payload = chunk.removeprefix("data: ").strip()
        if payload == "[DONE]":
            continue
        data = json.loads(payload)
        if "error" in data:
            error = data["error"]
            for text in events.close():
                yield text
            yield events.event("error", code=str(error.get("code") or error.get("type") or "server_error"),
                               message=error.get("message", ""), param=error.get("param"))
            failed = {**begun, "status": "failed", "output": events.items,
                      "error": {"code": "server_error", "message": error.get("message", "")}}
            yield events.event("response.failed", response=failed)
            return
        if data.get("usage") is not None:
            usage = UsageInfo.model_validate(data["usage"])
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                for text in events.text("reasoning", delta["reasoning"]):
                    yield text
            if delta.get("content"):
                for text in events.text("message", delta["content"]):
                    yield text
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                started = events.call(call["id"], function.get("name") or "") if call.get("id") else []
                for text in started + events.arguments(function.get("arguments") or ""):
                    yield text
            if choice.get("finish_reason") is not None:
                finish_reason = choice["finish_reason"]
    for text in events.close():
        yield text
    if not any(item["type"] in ("message", "function_call") for item in events.items):
        for text in events.text("message", "")[:-1] + events.close():  # an empty answer: its item, no delta
            yield text
    final = finish(events.items, finish_reason, usage or UsageInfo())
    kind = "response.incomplete" if final.status == "incomplete" else "response.completed"
    yield events.event(kind, response=final.model_dump(mode="json", by_alias=True))
