"""The OpenAI wire protocol: request validation, mapping to SamplingParams, the error envelope.

No model. The end-to-end tests run the real openai SDK and LangChain ChatOpenAI against a
dummy FastAPI app (through TestClient, no sockets) that uses the protocol models.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.testclient import TestClient
from pydantic import ValidationError

from swiftlm.engine.validation import RequestError, RequestLimits, validate_request
from swiftlm.sampling import SamplingParams
from swiftlm.server.completions.chat_protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    DeltaMessage,
    TokenLogprob,
    TopLogprob,
)
from swiftlm.server.completions.completion_protocol import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from swiftlm.server.completions.request_mapping import (
    chat_messages,
    completion_prompts,
    logit_bias_ids,
    sampling_params_from_chat,
    sampling_params_from_completion,
    template_kwargs,
    template_tools,
    thinking_enabled,
)
from swiftlm.server.completions.tokenizer_protocol import DetokenizeRequest, TokenizeRequest
from swiftlm.server.errors import (
    OpenAIError,
    bad_request,
    error_body,
    install_error_handlers,
    too_many_requests,
    unauthorized,
    validation_failure,
)
from swiftlm.server.protocol import ModelCard, ModelList, UsageInfo

QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [151645]}
USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **fields})


def error_paths(exc: ValidationError) -> list[str]:
    return [".".join(str(p) for p in e["loc"]) for e in exc.errors()]


# ---------------------------------------------------------------- request validation


def test_langchain_and_sdk_shaped_chat_request_is_accepted() -> None:
    # What ChatOpenAI(model=..., temperature=0.7, max_tokens=64, stream_usage=True,
    # extra_body={...}).stream(...) puts on the wire (extra_body merged into the top level).
    body = {
        "model": "qwen3",
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "temperature": 0.7,
        "max_completion_tokens": 64,
        "enable_thinking": False,
        "return_reasoning": False,
        "session_id": "conv-1",
        "top_k": 20,
        "messages": [
            {"content": "sys", "role": "system"},
            {"content": "hi", "role": "user"},
            {
                "content": None,
                "role": "assistant",
                "tool_calls": [
                    {"type": "function", "id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}
                ],
            },
            {"content": "r", "role": "tool", "tool_call_id": "c1"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "metadata": {"anything": "ignored"},
        "store": False,
    }
    req = ChatCompletionRequest.model_validate(body)
    assert req.stream and req.stream_options is not None and req.stream_options.include_usage
    assert (req.enable_thinking, req.return_reasoning, req.session_id, req.top_k) == (False, False, "conv-1", 20)
    assert req.messages[2].tool_calls is not None and req.messages[2].tool_calls[0].function.name == "f"
    assert req.max_completion_tokens == 64
    # The same through JSON parsing (how a route may validate by hand).
    assert ChatCompletionRequest.model_validate_json(json.dumps(body)) == req


def test_openai_sdk_typed_params_are_accepted() -> None:
    from openai.types.chat import ChatCompletionUserMessageParam, CompletionCreateParams

    message: ChatCompletionUserMessageParam = {"role": "user", "content": [{"type": "text", "text": "a"}]}
    params: CompletionCreateParams = {
        "model": "qwen3",
        "messages": [{"role": "developer", "content": "be brief"}, message],
        "logprobs": True,
        "top_logprobs": 3,
        "seed": 7,
        "stop": ["\n\n"],
        "logit_bias": {"151645": -100},
        "response_format": {"type": "text"},
        "presence_penalty": 0.5,
        "user": "u",
    }
    req = ChatCompletionRequest.model_validate(params)
    assert req.messages[0].role == "developer" and req.top_logprobs == 3 and req.stop == ["\n\n"]


def test_ints_are_floats_nulls_are_defaults_and_unknown_fields_are_ignored() -> None:
    req = chat(temperature=1, top_p=1, n=None, stream=None, stop=None, logprobs=None, frobnicate={"x": 1})
    assert req.temperature == 1.0 and isinstance(req.temperature, float)
    assert (req.n, req.stream, req.stop, req.logprobs) == (1, False, [], False)
    assert not hasattr(req, "frobnicate")
    assert chat(stop="END").stop == ["END"]


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"max_tokens": "12"}, "max_tokens"),
        ({"max_tokens": 12.0}, "max_tokens"),
        ({"max_completion_tokens": True}, "max_completion_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"n": "2"}, "n"),
        ({"seed": "7"}, "seed"),
        ({"messages": "hi"}, "messages"),
        ({"messages": {"role": "user", "content": "hi"}}, "messages"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"messages": [{"role": "user"}]}, "messages.0"),
        ({"stop": 5}, "stop"),
        ({"stop": [1, 2]}, "stop.0"),
        ({"logit_bias": {"5": "high"}}, "logit_bias.5"),
        ({"stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
        ({"enable_thinking": "false"}, "enable_thinking"),
        ({"chat_template_kwargs": {"enable_thinking": "false"}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ],
)
def test_wrong_types_are_rejected(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    assert path in error_paths(info.value)


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"messages": []}, "messages"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # requires logprobs
        ({"logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids.0"),
        ({"thinking_budget": -1}, "thinking_budget"),
        ({"session_id": ""}, "session_id"),
        ({"session_id": "x" * 257}, "session_id"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_out_of_range_values_are_rejected(fields: dict[str, Any], path: str) -> None:
    with pytest.raises(ValidationError) as info:
        chat(**fields)
    assert path in error_paths(info.value)


def test_content_parts_other_than_text_are_rejected_naming_the_type() -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://x"}}]
    with pytest.raises(ValidationError) as info:
        chat(messages=[{"role": "user", "content": parts}])
    assert error_paths(info.value) == ["messages.0.content"]
    assert "'image_url'" in info.value.errors()[0]["msg"]


def test_completion_request_shapes() -> None:
    for prompt in ("once upon", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        assert CompletionRequest.model_validate({"prompt": prompt}).prompt == prompt
    for bad in ([], [True], [1, "a"], 5, None, [[1], "a"]):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"prompt": bad})
    with pytest.raises(ValidationError, match="suffix is not supported"):
        CompletionRequest.model_validate({"prompt": "x", "suffix": "y"})
    assert CompletionRequest.model_validate({"prompt": "x", "suffix": ""}).suffix is None
    req = CompletionRequest.model_validate({"prompt": "x", "logprobs": 5, "echo": True, "top_k": -1})
    assert (req.logprobs, req.echo, req.max_tokens) == (5, True, 16)
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "logprobs": 21})
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "x", "logprobs": True})


def test_tokenize_and_detokenize_requests() -> None:
    assert TokenizeRequest.model_validate({"prompt": "hi"}).prompt == "hi"
    req = TokenizeRequest.model_validate({"messages": USER, "chat_template_kwargs": {"enable_thinking": False}})
    assert req.add_generation_prompt and not thinking_enabled(req, None)
    for bad in ({}, {"prompt": "hi", "messages": USER}, {"prompt": 5}):
        with pytest.raises(ValidationError):
            TokenizeRequest.model_validate(bad)
    assert DetokenizeRequest.model_validate({"tokens": [1, 2]}).tokens == [1, 2]
    with pytest.raises(ValidationError):
        DetokenizeRequest.model_validate({"tokens": ["1"]})


# ---------------------------------------------------------------- mapping


def test_max_tokens_precedence_chat() -> None:
    assert sampling_params_from_chat(chat(), 300, {}).max_tokens == 300
    assert sampling_params_from_chat(chat(max_new_tokens=7), 300, {}).max_tokens == 7
    assert sampling_params_from_chat(chat(max_new_tokens=7, max_tokens=8), 300, {}).max_tokens == 8
    both = chat(max_new_tokens=7, max_tokens=8, max_completion_tokens=9)
    assert sampling_params_from_chat(both, 300, {}).max_tokens == 9


def test_max_tokens_precedence_completion() -> None:
    def max_tokens(**fields: Any) -> int | None:
        req = CompletionRequest.model_validate({"prompt": "x", **fields})
        return sampling_params_from_completion(req, 300, {}).max_tokens

    assert max_tokens() == 16
    assert max_tokens(max_new_tokens=40) == 40
    assert max_tokens(max_tokens=5, max_new_tokens=40) == 5
    assert max_tokens(max_tokens=None) == 300
    assert max_tokens(max_tokens=None, max_new_tokens=40) == 40


def test_generation_defaults_fill_what_the_request_leaves_out() -> None:
    params = sampling_params_from_chat(chat(), 64, QWEN3_GENERATION)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.95, 20, 0.0)
    params = sampling_params_from_chat(chat(temperature=0, top_k=-1, min_p=0.1), 64, QWEN3_GENERATION)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.0, 0.95, 0, 0.1)
    assert sampling_params_from_chat(chat(), 64, {"do_sample": False, "temperature": 0.6}).greedy
    assert sampling_params_from_chat(chat(), 64, {}) == SamplingParams(max_tokens=64)


def test_sampling_fields_reach_sampling_params() -> None:
    req = chat(
        n=2,
        seed=3,
        stop=["a", ""],
        stop_token_ids=[7],
        min_tokens=2,
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        thinking_budget=32,
        logit_bias={"11": 5},
    )
    params = sampling_params_from_chat(req, 64, {})
    assert params == SamplingParams(
        n=2,
        seed=3,
        max_tokens=64,
        stop=("a",),
        stop_token_ids=(7,),
        min_tokens=2,
        ignore_eos=True,
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        thinking_budget=32,
        logit_bias={11: 5.0},
    )


def test_logprobs_mapping() -> None:
    assert sampling_params_from_chat(chat(), 8, {}).logprobs is None
    assert sampling_params_from_chat(chat(logprobs=False, top_logprobs=0), 8, {}).logprobs is None
    assert sampling_params_from_chat(chat(logprobs=True), 8, {}).logprobs == 0
    assert sampling_params_from_chat(chat(logprobs=True, top_logprobs=5), 8, {}).logprobs == 5
    completion = CompletionRequest.model_validate({"prompt": "x", "logprobs": 3})
    assert sampling_params_from_completion(completion, 8, {}).logprobs == 3


def test_user_errors_from_mapping_are_400s() -> None:
    with pytest.raises(OpenAIError) as info:
        sampling_params_from_chat(chat(n=5), 8, {}, max_n=4)
    assert (info.value.status, info.value.param) == (400, "n")
    with pytest.raises(OpenAIError, match="min_tokens 9 must not exceed max_tokens 8"):
        sampling_params_from_chat(chat(min_tokens=9), 8, {})
    limits = RequestLimits(vocab_size=100, max_model_len=64, block_size=16, num_usable_blocks=100)
    with pytest.raises(RequestError, match="stop_token_ids contains token id 100") as refused:
        validate_request([1], sampling_params_from_chat(chat(stop_token_ids=[100]), 8, {}), limits)
    assert refused.value.param == "stop_token_ids"


def test_logit_bias_keys() -> None:
    assert logit_bias_ids({"0": -100, "151935": 2.5}) == {0: -100.0, 151935: 2.5}
    assert logit_bias_ids(None) == {}
    for key in ("abc", "-1", "1.5", " 3", "", "٣"):
        with pytest.raises(OpenAIError, match="is not a token id") as info:
            logit_bias_ids({key: 1.0})
        assert (info.value.status, info.value.param) == (400, "logit_bias")
    limits = RequestLimits(vocab_size=10, max_model_len=64, block_size=16, num_usable_blocks=100)
    with pytest.raises(RequestError, match="outside the vocabulary; token ids run from 0 to 9") as refused:
        validate_request([1], SamplingParams(logit_bias=logit_bias_ids({"10": 1.0})), limits)
    assert refused.value.param == "logit_bias"
    with pytest.raises(OpenAIError, match="'abc'"):
        sampling_params_from_chat(chat(logit_bias={"abc": 1}), 8, {})


def test_thinking_fields_of_a_request() -> None:
    """The request's fields reach resolve_thinking's rows (the table itself: test_generation_request)."""
    off = {"enable_thinking": False}
    on = {"enable_thinking": True}
    assert thinking_enabled(chat(), None) is True
    assert thinking_enabled(chat(), {}) is True
    assert thinking_enabled(chat(), off) is False
    assert thinking_enabled(chat(chat_template_kwargs=on), off) is True
    assert thinking_enabled(chat(chat_template_kwargs=off), on) is False
    assert thinking_enabled(chat(enable_thinking=True, chat_template_kwargs=off), off) is True
    assert thinking_enabled(chat(enable_thinking=False, chat_template_kwargs=on), on) is False
    assert thinking_enabled(chat(chat_template_kwargs={"enable_thinking": None}), off) is False
    assert thinking_enabled(chat(enable_thinking=True), on, can_think=False) is False


def test_template_kwargs_merge() -> None:
    server = {"enable_thinking": True, "style": "server", "keep": 1}
    req = chat(chat_template_kwargs={"style": "request", "enable_thinking": True})
    assert template_kwargs(req, server, False) == {"enable_thinking": False, "style": "request", "keep": 1}
    assert template_kwargs(chat(), None, True) == {"enable_thinking": True}
    assert template_kwargs(chat(chat_template_kwargs={"enable_thinking": False}), None, True) == {"enable_thinking": True}


def test_chat_messages_normalisation() -> None:
    req = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "n"},
            {
                "role": "assistant",
                "content": None,
                "reasoning": "hmm",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    )
    assert chat_messages(req.messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb", "name": "n"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            "reasoning_content": "hmm",
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]


def test_template_tools_and_tool_choice_none() -> None:
    tools = [{"type": "function", "function": {"name": "f", "description": "d"}}]
    assert template_tools(chat(tools=tools)) == tools
    assert template_tools(chat(tools=tools, tool_choice="none")) is None
    assert template_tools(chat()) is None
    named = chat(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}})
    assert template_tools(named) == tools


def test_completion_prompts_and_context_check() -> None:
    def prompts(prompt: Any) -> list[Any]:
        return completion_prompts(CompletionRequest.model_validate({"prompt": prompt}))

    assert prompts("x") == ["x"]
    assert prompts(["x", "y"]) == ["x", "y"]
    assert prompts([1, 2]) == [[1, 2]]
    assert prompts([[1], [2, 3]]) == [[1], [2, 3]]
    with pytest.raises(OpenAIError, match="prompt 1 is empty"):
        prompts(["x", ""])
    # the context and vocabulary checks are the engine's one validation (``validate_request``)
    limits = RequestLimits(vocab_size=10, max_model_len=4096, block_size=16, num_usable_blocks=1000)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        validate_request(prompts([1, 50])[0], SamplingParams(), limits)
    validate_request([1] * 100, SamplingParams(max_tokens=None), limits)
    validate_request([1] * 100, SamplingParams(max_tokens=10), limits)
    with pytest.raises(RequestError, match="max_tokens 5000 exceeds the context window of 4096") as info:
        validate_request([1] * 100, SamplingParams(max_tokens=5000), limits)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "max_tokens")
    with pytest.raises(RequestError, match="fills the context window") as info:
        validate_request([1] * 4096, SamplingParams(max_tokens=None), limits)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "prompt")


# ---------------------------------------------------------------- serialisation


def test_exclude_none_keeps_content_and_drops_optional_fields() -> None:
    response = ChatCompletionResponse(
        model="qwen3",
        choices=[ChatCompletionChoice(index=0, message=ChatCompletionMessage(), finish_reason="stop")],
        usage=UsageInfo.of(10, 3, cached_tokens=8, reasoning_tokens=2),
    )
    data = json.loads(response.model_dump_json(exclude_none=True))
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": None}
    assert "system_fingerprint" not in data and "logprobs" not in data["choices"][0]
    assert data["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    message = ChatCompletionMessage.model_construct(content="hi", reasoning_content="why")
    assert json.loads(message.model_dump_json(exclude_none=True)) == {
        "role": "assistant",
        "content": "hi",
        "reasoning_content": "why",
    }


def test_chunks_and_legacy_completions_serialise_like_openai() -> None:
    chunk = ChatCompletionChunk(
        id="chatcmpl-1",
        created=1,
        model="qwen3",
        choices=[ChatCompletionChunkChoice(index=0, delta=DeltaMessage(content="Hel"))],
    )
    assert json.loads(chunk.model_dump_json(exclude_none=True)) == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "qwen3",
        "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}],
    }
    logprobs = ChoiceLogprobs(
        content=[TokenLogprob(token="a", logprob=-0.1, bytes=[97], top_logprobs=[TopLogprob(token="a", logprob=-0.1)])]
    )
    assert json.loads(logprobs.model_dump_json(exclude_none=True))["content"][0]["top_logprobs"] == [
        {"token": "a", "logprob": -0.1}
    ]
    completion = CompletionResponse(
        model="qwen3",
        choices=[
            CompletionChoice(
                index=0,
                text="ab",
                logprobs=CompletionLogprobs(
                    tokens=["a", "b"], token_logprobs=[None, -1.0], top_logprobs=[None, {"b": -1.0}], text_offset=[0, 1]
                ),
                finish_reason="length",
            )
        ],
    )
    data = json.loads(completion.model_dump_json(exclude_none=True))
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert data["choices"][0]["logprobs"]["token_logprobs"] == [None, -1.0]  # nulls inside lists are kept
    piece = CompletionChunk(model="qwen3", choices=[CompletionChoice(index=0, text="a")])
    assert json.loads(piece.model_dump_json(exclude_none=True))["choices"][0]["finish_reason"] is None
    models = ModelList(data=[ModelCard(id="qwen3", max_model_len=4096)])
    assert json.loads(models.model_dump_json(exclude_none=True))["data"][0]["object"] == "model"


# ---------------------------------------------------------------- the error envelope, end to end


def _sse(events: list[str]) -> StreamingResponse:
    async def body():  # type: ignore[no-untyped-def]
        for event in events:
            yield f"data: {event}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def _chat_stream(req: ChatCompletionRequest) -> StreamingResponse:
    common = {"id": "chatcmpl-s", "created": 1, "model": "qwen3"}
    deltas = [DeltaMessage(role="assistant", content=""), DeltaMessage(content="Hel"), DeltaMessage(content="lo")]
    chunks = [ChatCompletionChunk(**common, choices=[ChatCompletionChunkChoice(index=0, delta=d)]) for d in deltas]
    chunks.append(
        ChatCompletionChunk(
            **common, choices=[ChatCompletionChunkChoice(index=0, delta=DeltaMessage(), finish_reason="stop")]
        )
    )
    if req.stream_options is not None and req.stream_options.include_usage:
        chunks.append(ChatCompletionChunk(**common, choices=[], usage=UsageInfo.of(5, 2)))
    return _sse([c.model_dump_json(exclude_none=True) for c in chunks])


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.state.seen = []

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        app.state.seen.append((await request.json(), req))
        if req.user == "flood":
            raise too_many_requests(2.5)
        if req.user == "crash":
            raise RuntimeError("boom")
        if req.user == "stranger":
            raise unauthorized()
        params = sampling_params_from_chat(req, 100, QWEN3_GENERATION)
        try:  # the server's one validation, as ``ServerState.validate`` runs it
            validate_request([1], params, RequestLimits(151936, 4096, 16, 1000))
        except RequestError as exc:
            raise bad_request(str(exc), param=exc.param, code=exc.code) from exc
        if req.stream:
            return _chat_stream(req)
        message = ChatCompletionMessage(content="Hello", reasoning_content="thought" if req.return_reasoning else None)
        choices = [ChatCompletionChoice(index=i, message=message, finish_reason="stop") for i in range(params.n)]
        response = ChatCompletionResponse(model="qwen3", choices=choices, usage=UsageInfo.of(5, 2, 0, 1))
        return Response(response.model_dump_json(exclude_none=True), media_type="application/json")

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> Response:
        params = sampling_params_from_completion(req, 100, QWEN3_GENERATION)
        prompts = completion_prompts(req)
        choices = [
            CompletionChoice(index=i, text=" world", finish_reason="length") for i in range(len(prompts) * params.n)
        ]
        response = CompletionResponse(model="qwen3", choices=choices, usage=UsageInfo.of(1, params.max_tokens or 0))
        return Response(response.model_dump_json(exclude_none=True), media_type="application/json")

    return app


@pytest.fixture(scope="module")
def app() -> FastAPI:
    return make_app()


@pytest.fixture(scope="module")
def client(app: FastAPI) -> TestClient:
    return TestClient(app, raise_server_exceptions=False)


def assert_envelope(response: Any, status: int, type_: str) -> dict[str, Any]:
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == type_
    return body["error"]


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    error = assert_envelope(response, 400, "invalid_request_error")
    assert error["message"].startswith("could not parse JSON body")


def test_body_that_is_not_a_json_object_is_400(client: TestClient) -> None:
    error = assert_envelope(client.post("/v1/chat/completions"), 400, "invalid_request_error")
    assert error["message"] == "the request body is missing; send a JSON object"
    form = client.post("/v1/chat/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert "Content-Type: application/json" in assert_envelope(form, 400, "invalid_request_error")["message"]
    listed = client.post("/v1/chat/completions", json=[1])
    assert assert_envelope(listed, 400, "invalid_request_error")["message"].endswith("(got an array)")


def test_validation_error_names_the_field(client: TestClient) -> None:
    body = {"messages": [USER[0], {"role": "robot", "content": "hi"}]}
    error = assert_envelope(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error")
    assert error["param"] == "messages.1.role"
    assert error["message"].startswith("messages.1.role: Input should be 'system', 'user'")
    body = {"messages": USER, "temperature": "hot", "top_logprobs": 2}
    error = assert_envelope(client.post("/v1/chat/completions", json=body), 400, "invalid_request_error")
    assert error["param"] == "temperature"
    assert error["message"] == (
        "temperature: Input should be a valid number (got a string); "
        "top_logprobs: top_logprobs requires logprobs to be true"
    )


def test_mapping_errors_use_the_envelope(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "logit_bias": {"999999": 1}})
    error = assert_envelope(response, 400, "invalid_request_error")
    assert error["param"] == "logit_bias" and "outside the vocabulary" in error["message"]


def test_unknown_route_and_wrong_method(client: TestClient) -> None:
    error = assert_envelope(client.post("/v1/nope", json={}), 404, "invalid_request_error")
    assert error["message"] == "Invalid URL (POST /v1/nope)"
    response = client.get("/v1/chat/completions")
    assert_envelope(response, 405, "invalid_request_error")
    assert response.headers["allow"] == "POST"


def test_rate_limit_has_retry_after(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "user": "flood"})
    error = assert_envelope(response, 429, "rate_limit_exceeded")
    assert error["code"] == "rate_limit_exceeded"
    assert response.headers["retry-after"] == "3" and response.headers["retry-after-ms"] == "2500"


def test_unauthorized_is_openai_shaped(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "user": "stranger"})
    assert assert_envelope(response, 401, "invalid_request_error")["code"] == "invalid_api_key"


def test_unexpected_exception_is_500_and_the_app_keeps_answering(client: TestClient) -> None:
    response = client.post("/v1/chat/completions", json={"messages": USER, "user": "crash"})
    error = assert_envelope(response, 500, "server_error")
    assert "RuntimeError" in error["message"] and "boom" not in error["message"]
    again = client.post("/v1/chat/completions", json={"messages": USER})
    assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == "Hello"


def test_error_helpers() -> None:
    assert error_body("m", "t") == {"error": {"message": "m", "type": "t", "param": None, "code": None}}
    err = bad_request("bad", param="x")
    assert (err.status, err.type, err.body()["error"]["param"]) == (400, "invalid_request_error", "x")
    assert err.sse_event() == f"data: {json.dumps(err.body())}\n\n"
    assert too_many_requests().headers == {}
    try:
        ChatCompletionRequest.model_validate_json(b'{"messages": [}')
    except ValidationError as exc:
        assert validation_failure(exc.errors()).message.startswith("could not parse JSON body")


def test_openai_sdk_end_to_end(app: FastAPI, client: TestClient) -> None:
    import openai

    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)
    result = sdk.chat.completions.create(
        model="qwen3",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.2,
        n=2,
        extra_body={"enable_thinking": False, "top_k": 5, "session_id": "s"},
    )
    assert [c.message.content for c in result.choices] == ["Hello", "Hello"]
    assert result.usage is not None and result.usage.completion_tokens_details is not None
    assert result.usage.completion_tokens_details.reasoning_tokens == 1
    raw, req = app.state.seen[-1]
    assert raw["enable_thinking"] is False and (req.enable_thinking, req.top_k, req.n) == (False, 5, 2)

    stream = sdk.chat.completions.create(
        model="qwen3", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 7

    legacy = sdk.completions.create(model="qwen3", prompt=["a", "b"], n=2, max_tokens=3)
    assert len(legacy.choices) == 4 and legacy.usage is not None and legacy.usage.completion_tokens == 3

    with pytest.raises(openai.RateLimitError) as info:
        sdk.chat.completions.create(model="qwen3", messages=USER, user="flood")
    assert info.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model="qwen3", messages=USER, max_tokens="12")  # type: ignore[arg-type]
    assert bad.value.param == "max_tokens"


def test_langchain_chat_openai_end_to_end(app: FastAPI, client: TestClient) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model="qwen3",
        base_url="http://testserver/v1",
        api_key="k",
        http_client=client,
        max_retries=0,
        temperature=0.7,
        max_tokens=64,
        stream_usage=True,
        extra_body={"enable_thinking": False, "return_reasoning": False, "session_id": "conv-9"},
    )
    assert llm.invoke("hi").content == "Hello"
    raw, req = app.state.seen[-1]
    assert raw["max_completion_tokens"] == 64 and req.return_reasoning is False and req.session_id == "conv-9"
    text = "".join(str(chunk.content) for chunk in llm.stream("hi"))
    assert text == "Hello"
    raw, req = app.state.seen[-1]
    assert raw["stream"] is True and req.stream_options is not None and req.stream_options.include_usage
