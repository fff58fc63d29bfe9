"""The Responses API over chat: input items <-> chat messages, a ResponsesRequest as the chat
request that runs it, and the response object from the chat answer.

Items as chat messages: a ``message`` item is a message of its role (text parts joined with
"\\n"); ``function_call`` items join the assistant message just before them as its ``tool_calls``
(or make one with empty content); a ``function_call_output`` is a ``tool`` message; a
``reasoning`` item becomes the ``reasoning_content`` of the assistant message that follows. The
answer's output items map back the same way, so a stored conversation read back as messages equals
the conversation the chat session recorded, and the session extends it (``swiftlm.text.session_prompt``).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from swiftlm.server.completions.chat_protocol import ChatCompletionRequest
from swiftlm.server.errors import bad_request, validation_failure
from swiftlm.server.protocol import UsageInfo, new_id
from swiftlm.server.responses.objects import ResponseObject
from swiftlm.server.responses.protocol import InputItem, ResponsesRequest

_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def input_items(value: str | list[InputItem]) -> list[dict[str, Any]]:
    """The request's input as stored items, each with an id (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "id": new_id("msg_"), "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": value}]}]
    out = []
    for item in value:
        plain = item.model_dump(exclude_none=True, by_alias=True)
        plain.setdefault("id", new_id(_ID_PREFIX[plain["type"]]))
        if plain["type"] == "message" and isinstance(plain["content"], str):
            part = "output_text" if plain["role"] == "assistant" else "input_text"
            plain["content"] = [{"type": part, "text": plain["content"]}]
        out.append(plain)
    return out


def _text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for stored items (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    assistant: dict[str, Any] | None = None  # the message function calls join

    def new_assistant(content: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
        messages.append(message)
        return message

    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning.append("\n".join(part["text"] for part in item.get("content") or item.get("summary") or []))
        elif kind == "message" and item["role"] == "assistant":
            assistant = new_assistant(_text(item["content"]))
        elif kind == "message":
            messages.append({"role": item["role"], "content": _text(item["content"])})
            assistant = None
        elif kind == "function_call":
            if assistant is None:
                assistant = new_assistant("")
            assistant.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}}
            )
        else:  # function_call_output
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
            assistant = None
    return messages


def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]], session_id: str | None) -> ChatCompletionRequest:
    """The chat request that answers ``req`` over the whole conversation ``messages``."""
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "seed": req.seed,
        "num_speculative_tokens": req.num_speculative_tokens,
        "enable_thinking": req.enable_thinking, "chat_template_kwargs": req.chat_template_kwargs,
        "reasoning_effort": req.reasoning.effort if req.reasoning else None,
        "parallel_tool_calls": req.parallel_tool_calls, "user": req.user, "session_id": session_id,
        "stream": req.stream, "stream_options": {"include_usage": True} if req.stream else None,
    }
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude_none=True, exclude={"type"})} for tool in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise bad_request('text.format json_schema needs a "schema" (a JSON schema object)', param="text.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}}
    elif fmt is not None:
        body["response_format"] = {"type": fmt.type}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_failure(list(exc.errors())) from exc


# ---------------------------------------------------------------- output


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def function_call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    """An output item for a chat tool call (OpenAI's chat shape: id, function.name, function.arguments)."""
    return {"type": "function_call", "id": item_id, "status": status, "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"]}


def output_items(reasoning: str | None, content: str | None, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answer's items: its reasoning (when there is any), its message (when it said something
    or made no call), then one item per call."""
    items = [reasoning_item(new_id("rs_"), reasoning)] if reasoning else []
    if content or not calls:
        items.append(message_item(new_id("msg_"), content or ""))
    items += [function_call_item(new_id("fc_"), call) for call in calls]
    return items


def response_object(
    req: ResponsesRequest, response_id: str, model: str, *, created_at: int | None = None,
    output: list[dict[str, Any]] | None = None, finish_reason: str | None = None, usage: UsageInfo | None = None,
) -> ResponseObject:
    """The response object for ``req``: in progress while ``usage`` is None, else completed, or
    incomplete when the answer ran into ``max_output_tokens`` (or the context window)."""
    status = "in_progress" if usage is None else "incomplete" if finish_reason == "length" else "completed"
    fmt = req.text.format if req.text and req.text.format else None
    return ResponseObject.model_validate({
        "id": response_id, "created_at": created_at or int(time.time()), "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": model,
        "output": output or [], "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning.model_dump() if req.reasoning else {"effort": None, "summary": None},
        "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
        "text": {"format": fmt.model_dump(exclude_none=True, by_alias=True) if fmt else {"type": "text"}},
        "tool_choice": (req.tool_choice if isinstance(req.tool_choice, str) else req.tool_choice.model_dump())
        if req.tool_choice is not None else "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or []],
        "usage": None if usage is None else _usage(usage), "user": req.user, "metadata": req.metadata or {},
    })


def _usage(usage: UsageInfo) -> dict[str, Any]:
    prompt, completion = usage.prompt_tokens_details, usage.completion_tokens_details
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": prompt.cached_tokens if prompt else 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": completion.reasoning_tokens if completion else 0},
        "total_tokens": usage.total_tokens,
    }
