"""The Responses API's answers in OpenAI's shapes: the response object (as answered, stored and
retrieved), its ``output`` items (``reasoning``, ``message`` with ``output_text``,
``function_call``), ``usage``, a stream's events (``swiftlm.server.responses.stream``), and the
stored responses' routes' bodies. The requests: ``swiftlm.server.responses.protocol``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from swiftlm.server.protocol import _Response

Status = Literal["in_progress", "completed", "incomplete"]


class OutputText(_Response):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(_Response):
    type: Literal["message"] = "message"
    id: str
    status: Status = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class OutputFunctionCall(_Response):
    type: Literal["function_call"] = "function_call"
    id: str
    status: Status = "completed"
    call_id: str
    name: str
    arguments: str


class OutputReasoningText(_Response):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(_Response):
    type: Literal["reasoning"] = "reasoning"
    id: str
    status: Status = "completed"
    summary: list[Any] = Field(default_factory=list)
    content: list[OutputReasoningText]


OutputItem = Annotated[OutputMessage | OutputFunctionCall | OutputReasoning, Field(discriminator="type")]


class InputTokensDetails(_Response):
    cached_tokens: int = 0


class OutputTokensDetails(_Response):
    reasoning_tokens: int = 0


class ResponseUsage(_Response):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(_Response):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponseError(_Response):
    code: str
    message: str


class ResponseObject(_Response):
    """The response object, as answered, stored and retrieved (dumped with every field, nulls too)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=dict)
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class ResponseStreamEvent(BaseModel):
    """One server-sent event of a streamed response: ``type`` names it (``response.created``,
    ``response.output_text.delta``, ..., ``response.completed``, ``error``), ``sequence_number``
    counts the events from 0; the other fields are the event's own, as OpenAI sends them."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int


class ResponseDeleted(_Response):
    id: str
    object: Literal["response"] = "response"
    deleted: bool


class ResponseItemList(_Response):
    """GET /v1/responses/{id}/input_items: the input items the response was made from (this turn's)."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
