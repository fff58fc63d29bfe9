"""``InputProcessor.chat_turn``: what a chat turn resolves to, for every front end (no model).

The server's chat route and ``LLM.chat`` both form their turns here; these tests hold the decisions
that used to live in the route: the length the context leaves, a tool constraint (and its conflict
with a response format), the automatic thinking budget, the fields a refusal names, one validation.
"""

from __future__ import annotations

import pytest

from swiftlm.core.structured import StructuredOutput
from swiftlm.engine.validation import RequestError
from swiftlm.frontend.input_processor import ChatDefaults, ChatInput, InputProcessor
from swiftlm.sampling import SamplingParams
from swiftlm.text.session_prompt import SessionPrompts
from swiftlm.text.thinking_rules import ThinkingRules
from swiftlm.text.tokenizer import Tokenizer

MAX_MODEL_LEN = 512
HELLO = [{"role": "user", "content": "hello"}]
CALLS = StructuredOutput("tool_calls", '[{"name": "f", "parameters": {"type": "object"}}]')


def processor(tokenizer: Tokenizer, defaults: ChatDefaults | None = None) -> tuple[InputProcessor, list]:
    checked: list = []
    inputs = InputProcessor(tokenizer, SessionPrompts(tokenizer, lambda sid: None),
                            lambda ids, params: checked.append((list(ids), params)), MAX_MODEL_LEN, defaults)
    return inputs, checked


def test_a_turn_without_max_tokens_may_fill_the_context(qwen3_tokenizer: Tokenizer) -> None:
    inputs, checked = processor(qwen3_tokenizer)
    turn = inputs.chat_turn("r1", ChatInput(HELLO, SamplingParams(max_tokens=None), enable_thinking=False))
    request = turn.request
    assert request.sampling_params.max_tokens == MAX_MODEL_LEN - len(request.prompt_token_ids)
    assert request.prompt_token_ids == inputs.chat(HELLO, False).token_ids and not request.thinking
    assert checked == [(request.prompt_token_ids, request.sampling_params)]  # validated once, as sent
    given = inputs.chat_turn("r2", ChatInput(HELLO, SamplingParams(max_tokens=7), enable_thinking=False))
    assert given.request.sampling_params.max_tokens == 7


def test_a_tool_constraint_becomes_the_grammar_and_conflicts_with_a_response_format(qwen3_tokenizer: Tokenizer) -> None:
    inputs, checked = processor(qwen3_tokenizer)
    turn = inputs.chat_turn("r1", ChatInput(HELLO, SamplingParams(), tool_constraint=CALLS))
    assert turn.request.sampling_params.structured_outputs == CALLS
    both = ChatInput(HELLO, SamplingParams(structured_outputs=StructuredOutput("json_object")), tool_constraint=CALLS)
    with pytest.raises(RequestError) as refused:
        inputs.chat_turn("r2", both)
    assert refused.value.param == "tool_choice" and len(checked) == 1


def test_automatic_thinking_gets_the_default_budget_and_a_chosen_one_does_not(qwen3_tokenizer: Tokenizer) -> None:
    rules = ThinkingRules(on_words=("prove",), default=False)
    inputs, _ = processor(qwen3_tokenizer, ChatDefaults(thinking="auto", thinking_rules=rules, auto_thinking_budget=64))
    proof = [{"role": "user", "content": "prove it"}]
    auto_on = inputs.chat_turn("r1", ChatInput(proof, SamplingParams()))
    assert auto_on.thinking.auto and auto_on.thinking.thinking and auto_on.request.thinking
    assert auto_on.request.sampling_params.thinking_budget == 64
    auto_off = inputs.chat_turn("r2", ChatInput(HELLO, SamplingParams()))
    assert auto_off.thinking.auto and not auto_off.thinking.thinking
    assert auto_off.request.sampling_params.thinking_budget is None
    chosen = inputs.chat_turn("r3", ChatInput(proof, SamplingParams(), enable_thinking=True))
    assert not chosen.thinking.auto and chosen.request.sampling_params.thinking_budget is None


def test_refusals_name_their_field(qwen3_tokenizer: Tokenizer) -> None:
    inputs, checked = processor(qwen3_tokenizer)
    with pytest.raises(RequestError) as thinking:  # "auto" where the front end has no rules to decide by
        inputs.chat_turn("r1", ChatInput(HELLO, SamplingParams(), enable_thinking="auto"))
    assert thinking.value.param == "enable_thinking"
    with pytest.raises(RequestError) as template:  # nothing for the template to render
        inputs.chat_turn("r2", ChatInput([], SamplingParams()))
    assert template.value.param == "messages"
    with pytest.raises(RequestError):  # min_tokens past what the context leaves
        inputs.chat_turn("r3", ChatInput(HELLO, SamplingParams(max_tokens=None, min_tokens=MAX_MODEL_LEN)))
    assert checked == []  # nothing refused reached the validation
