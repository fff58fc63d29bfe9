"""Our chat template rendering must be byte-identical to transformers' apply_chat_template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swiftlm.text.chat_template import ChatTemplate, ChatTemplateError
from swiftlm.text.tokenizer import Tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city. 返回摄氏温度。",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. 'Zürich' or <Paris>"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# (id, messages, tools, add_generation_prompt)
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, bool]] = [
    (
        "system_user",
        [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Hi!"}],
        None,
        True,
    ),
    ("plain_user", [{"role": "user", "content": "What is 2+2?"}], None, True),
    (
        "multi_turn_reasoning_content",
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two plus two.\nThat is four."},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
        True,
    ),
    (
        "inline_think",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "<think>\nEasy one.\n</think>\n\nParis."},
            {"role": "user", "content": "And of Italy?"},
        ],
        None,
        True,
    ),
    (
        "tools_given",
        [
            {"role": "system", "content": "You can use tools."},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        [WEATHER_TOOL, TIME_TOOL],
        True,
    ),
    (
        "tool_call_dict_arguments",
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call("c1", "get_weather", {"city": "Oslo"})],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": '{"temp": -3}'},
        ],
        [WEATHER_TOOL],
        True,
    ),
    (
        "tool_call_string_arguments",
        [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "Weather in Zürich, in fahrenheit?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [_call("c1", "get_weather", '{"city": "Zürich", "unit": "fahrenheit"}')],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "41F"},
            {"role": "assistant", "content": "It is 41F in Zürich."},
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER_TOOL],
        True,
    ),
    (
        "two_tool_results_in_a_row",
        [
            {"role": "user", "content": "Weather and time in Tokyo?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "I need both tools.",
                "tool_calls": [
                    _call("c1", "get_weather", {"city": "Tokyo"}),
                    _call("c2", "get_time", '{"tz": "Asia/Tokyo"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny, 20C"},
            {"role": "tool", "tool_call_id": "c2", "content": "14:05"},
        ],
        [WEATHER_TOOL, TIME_TOOL],
        True,
    ),
    (
        "last_message_assistant",
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!", "reasoning_content": "The user wants a greeting."},
        ],
        None,
        False,
    ),
    (
        "chinese_and_emoji",
        [
            {"role": "system", "content": "你是一个乐于助人的助手。🤖"},
            {"role": "user", "content": "用一句话介绍北京 🇨🇳👨‍👩‍👧‍👦👍🏽"},
            {"role": "assistant", "content": "北京是中国的首都。🏯"},
            {"role": "user", "content": "再说一句 😀"},
        ],
        None,
        True,
    ),
    (
        "think_switches_in_user_text",
        [
            {"role": "user", "content": "/think How many r's in strawberry?"},
            {"role": "assistant", "content": "<think>\nCount them.\n</think>\n\nThree."},
            {"role": "user", "content": "Now answer quickly: 7*6? /no_think"},
        ],
        None,
        True,
    ),
    (
        "system_in_the_middle",
        [
            {"role": "user", "content": "Hello"},
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Good morning"},
        ],
        None,
        True,
    ),
]

THINKING_MODES = [True, False, None]  # None: enable_thinking not passed at all


@pytest.fixture(scope="module")
def hf_tokenizer(qwen3_tokenizer_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


def _kwargs(thinking: bool | None) -> dict[str, Any]:
    return {} if thinking is None else {"enable_thinking": thinking}


@pytest.mark.parametrize("thinking", THINKING_MODES, ids=["think", "no_think", "unset"])
@pytest.mark.parametrize(
    ("messages", "tools", "add_generation_prompt"),
    [c[1:] for c in CONVERSATIONS],
    ids=[c[0] for c in CONVERSATIONS],
)
def test_matches_transformers(
    qwen3_tokenizer: Tokenizer,
    hf_tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    thinking: bool | None,
) -> None:
    expected = hf_tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        **_kwargs(thinking),
    )
    ours = qwen3_tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tools=tools, **_kwargs(thinking)
    )
    assert ours == expected
    assert qwen3_tokenizer.encode(ours) == hf_tokenizer.encode(expected, add_special_tokens=False)


def test_thinking_off_prompt_ends_with_empty_think_block(qwen3_tokenizer: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert qwen3_tokenizer.apply_chat_template(messages, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert qwen3_tokenizer.apply_chat_template(messages, enable_thinking=True).endswith(
        "<|im_start|>assistant\n"
    )


def test_tools_json_keeps_non_ascii_and_html(qwen3_tokenizer: Tokenizer) -> None:
    text = qwen3_tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[WEATHER_TOOL])
    assert "返回摄氏温度" in text and "<Paris>" in text and "Zürich" in text


def test_content_none_renders_as_empty_string(qwen3_tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    # transformers drops content=None and Qwen3's template then fails; we render it like "".
    call = _call("c1", "get_weather", {"city": "Oslo"})
    with_none = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": None},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
    ]
    with_empty = [dict(m, content=m["content"] or "") for m in with_none]
    with_empty[1].pop("reasoning_content")
    expected = hf_tokenizer.apply_chat_template(with_empty, tokenize=False, add_generation_prompt=True)
    assert qwen3_tokenizer.apply_chat_template(with_none) == expected
    assert with_none[1]["content"] is None  # the caller's messages are not modified


def test_content_parts_are_joined_with_newlines(qwen3_tokenizer: Tokenizer, hf_tokenizer: Any) -> None:
    parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Line one."}, {"type": "text", "text": "Line two."}],
        },
    ]
    joined = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Line one.\nLine two."},
    ]
    expected = hf_tokenizer.apply_chat_template(joined, tokenize=False, add_generation_prompt=True)
    assert qwen3_tokenizer.apply_chat_template(parts) == expected


def test_non_text_content_part_is_rejected(qwen3_tokenizer: Tokenizer) -> None:
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    with pytest.raises(ChatTemplateError, match="image_url"):
        qwen3_tokenizer.apply_chat_template([{"role": "user", "content": [image]}])


def test_reasoning_alias_fields(qwen3_tokenizer: Tokenizer) -> None:
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    via_reasoning = [base[0], dict(base[1], reasoning="because")]
    via_content = [base[0], dict(base[1], reasoning_content="because")]
    rendered = qwen3_tokenizer.apply_chat_template(via_reasoning, add_generation_prompt=False)
    assert rendered == qwen3_tokenizer.apply_chat_template(via_content, add_generation_prompt=False)
    assert "<think>\nbecause\n</think>\n\na" in rendered


def test_template_globals_and_filters() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{{ m | tojson(indent=1, sort_keys=true) }}{% if loop.first %}{% break %}"
        "{% endif %}{% endfor %}|{{ eos_token }}|{{ strftime_now('%Y') | length }}|{{ bos_token is defined }}",
        {"eos_token": "<|im_end|>", "bos_token": None},
    )
    out = template.render([{"role": "user", "content": "é<"}, {"role": "user", "content": "never"}])
    assert out == '{\n "content": "é<",\n "role": "user"\n}|<|im_end|>|4|False'
    # keyword arguments override special tokens, as in transformers
    assert template.render([{"role": "user", "content": "x"}], eos_token="E").split("|")[1] == "E"


def test_raise_exception_gives_clear_error() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first message must be user"):
        template.render([{"role": "assistant", "content": "x"}])


def test_empty_conversation_is_rejected(qwen3_tokenizer: Tokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="empty"):
        qwen3_tokenizer.apply_chat_template([])


def test_sandbox_blocks_attribute_escape() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "user", "content": "x"}])
