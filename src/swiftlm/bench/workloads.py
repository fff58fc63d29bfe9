"""Seeded benchmark workloads, built locally and sized in real tokens.

A workload is a list of `BenchRequest`s. Every request's text is generated from word lists in
`text_gen` (English, with a share of Chinese), sized with the caller's token counter (pass the
served model's tokenizer length function; without one a ~4-characters-per-token estimate is used).
Sizes count the text the request carries, not the chat template around it.

Workloads (``name``: what it stresses):

- ``qa``: short questions (10-40 tokens), Q&A preset, 64 output tokens.
- ``summary``: ~1,000-token articles to summarise, content sampling, 128 output tokens.
- ``code``: a coding task (20-320 tokens, mostly code context), content preset, 256 tokens.
- ``chat``: multi-turn conversations sent with ``session_id``. A turn's request carries only the
  messages it adds (system + user for turn 0, user after that): the client prepends the
  conversation so far, including the assistant's *actual* replies, so it runs the turns of one
  conversation in order (and different conversations concurrently).
- ``shared-prefix``: one long system prompt (``prefix_len`` tokens) shared by many short questions.
- ``random``: completions with set input / output lengths (``ignore_eos`` so lengths are fixed).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from swiftlm.bench import text_gen
from swiftlm.bench.text_gen import TokenCounter, estimate_tokens, fit_pieces, pad_to

WORKLOAD_NAMES = ("qa", "summary", "code", "chat", "shared-prefix", "random")

# Token ranges of the generated text, per workload: each text's length is drawn from its range and
# the text is at most that long, a few tokens short at worst (or its question alone, if longer).
QA_INPUT_TOKENS = (10, 40)
SUMMARY_INPUT_TOKENS = (900, 1100)
CODE_INPUT_TOKENS = (20, 320)
CHAT_SYSTEM_TOKENS = (30, 60)
CHAT_TURN_TOKENS = (8, 60)
SHARED_PREFIX_QUESTION_TOKENS = (8, 32)


@dataclass(frozen=True)
class SamplingPreset:
    """Sampling settings the reference deployment recommends for one scenario."""

    name: str
    temperature: float
    max_tokens: int
    top_p: float | None = None
    repetition_penalty: float | None = None

    def sampling(self) -> dict[str, Any]:
        fields = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
        }
        return {k: v for k, v in fields.items() if v is not None}


PRESETS: Mapping[str, SamplingPreset] = MappingProxyType(
    {
        "qa": SamplingPreset("qa", temperature=0.2, top_p=0.75, max_tokens=64),
        "content": SamplingPreset(
            "content", temperature=0.6, top_p=0.9, repetition_penalty=1.15, max_tokens=256
        ),
        "chat": SamplingPreset("chat", temperature=0.5, max_tokens=128),
    }
)

# Preset and max_tokens each workload uses unless the options override them.
_WORKLOAD_DEFAULTS: Mapping[str, tuple[str | None, int | None]] = MappingProxyType(
    {
        "qa": ("qa", 64),
        "summary": ("content", 128),
        "code": ("content", 256),
        "chat": ("chat", 128),
        "shared-prefix": ("qa", 64),
        "random": (None, None),
    }
)


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload. `messages` are (role, content) pairs for kind "chat";
    `prompt` is the text for kind "completion". `input_tokens` counts the text this request adds."""

    kind: Literal["chat", "completion"]
    max_tokens: int
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    turn: int = 0
    conversation_id: int = 0
    input_tokens: int = 0

    def __post_init__(self) -> None:
        if self.kind == "chat" and (not self.messages or self.prompt is not None):
            raise ValueError("a chat request needs messages and no prompt")
        if self.kind == "completion" and (self.prompt is None or self.messages):
            raise ValueError("a completion request needs a prompt and no messages")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass(frozen=True)
class WorkloadOptions:
    """Knobs of the workloads; each applies to the workloads named in its comment."""

    zh_ratio: float = 0.2  # share of Chinese texts (all but code and random)
    input_len: int = 256  # random
    output_len: int = 128  # random
    range_ratio: float = 0.0  # random: lengths drawn from [len * (1 - r), len * (1 + r)]
    ignore_eos: bool = True  # random
    turns: int = 4  # chat: turns per conversation
    prefix_len: int = 1000  # shared-prefix: tokens of the shared system prompt
    preset: str | None = None  # replaces the workload's preset (sampling and max_tokens)
    max_tokens: int | None = None  # replaces max_tokens

    def __post_init__(self) -> None:
        if not 0.0 <= self.zh_ratio <= 1.0:
            raise ValueError(f"zh_ratio must be in [0, 1], got {self.zh_ratio}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise ValueError(f"range_ratio must be in [0, 1), got {self.range_ratio}")
        if self.input_len < 1 or self.output_len < 1 or self.turns < 1 or self.prefix_len < 1:
            raise ValueError("input_len, output_len, turns and prefix_len must be at least 1")
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass(frozen=True)
class _Context:
    rng: random.Random
    count: TokenCounter
    options: WorkloadOptions
    sampling: Mapping[str, Any]
    max_tokens: int

    def lang(self) -> str:
        return "zh" if self.rng.random() < self.options.zh_ratio else "en"

    def prose(self, target: int, lang: str) -> str:
        """Running prose (cut at a word) of at most `target` tokens."""
        make = text_gen.zh_sentence if lang == "zh" else text_gen.en_sentence
        return fit_pieces(lambda: make(self.rng), target, self.count)

    def with_context(self, text: str, target: int, lang: str, after: bool = False) -> str:
        """`text` with whole sentences of prose before it (or after it) so the whole is at most
        `target` tokens and close to it."""
        room = target - self.count(text)
        if room < 1:
            return text
        context = text_gen.fit_sentences(self.rng, room, self.count, lang)
        sep = "" if lang == "zh" else " "
        joined = ((text + sep + context) if after else (context + sep + text)).strip()
        return joined if self.count(joined) <= target else text


def _sampling_for(name: str, options: WorkloadOptions) -> tuple[dict[str, Any], int | None]:
    preset_name, max_tokens = _WORKLOAD_DEFAULTS[name]
    if options.preset is not None:
        preset_name, max_tokens = options.preset, PRESETS[options.preset].max_tokens
    sampling = PRESETS[preset_name].sampling() if preset_name else {}
    if options.max_tokens is not None:
        max_tokens = options.max_tokens
    return sampling, max_tokens


def _chat(ctx: _Context, text: str, conversation_id: int, system: str | None = None) -> BenchRequest:
    messages = ((("system", system),) if system else ()) + (("user", text),)
    tokens = sum(ctx.count(content) for _, content in messages)
    return BenchRequest(
        "chat",
        ctx.max_tokens,
        messages=messages,
        sampling=ctx.sampling,
        conversation_id=conversation_id,
        input_tokens=tokens,
    )


def _qa(ctx: _Context, n: int) -> list[BenchRequest]:
    out = []
    for i in range(n):
        lang = ctx.lang()
        text = ctx.with_context(text_gen.question(ctx.rng, lang), ctx.rng.randint(*QA_INPUT_TOKENS), lang)
        out.append(_chat(ctx, text, i))
    return out


def _summary(ctx: _Context, n: int) -> list[BenchRequest]:
    out = []
    for i in range(n):
        lang = ctx.lang()
        head = (
            "请用三句话总结下面的文章。\n\n"
            if lang == "zh"
            else "Summarize the following article in three sentences.\n\n"
        )
        target = ctx.rng.randint(*SUMMARY_INPUT_TOKENS)
        out.append(_chat(ctx, head + ctx.prose(target - ctx.count(head), lang), i))
    return out


def _code(ctx: _Context, n: int) -> list[BenchRequest]:
    out = []
    for i in range(n):
        text = f"Write a Python function that {ctx.rng.choice(text_gen.CODE_TASKS)}. Include type hints and a docstring."
        target = ctx.rng.randint(*CODE_INPUT_TOKENS)
        room = target - ctx.count(text) - 12
        if room > 8 and ctx.rng.random() < 0.8:
            code = fit_pieces(
                lambda: text_gen.code_line(ctx.rng, ctx.rng.choice((0, 1, 1, 2))), room, ctx.count
            )
            text += f"\nIt goes into this module:\n```python\n{code}```"
        out.append(_chat(ctx, text, i))
    return out


def _conversations(ctx: _Context, n: int, session_prefix: str, seed: int) -> list[BenchRequest]:
    out: list[BenchRequest] = []
    conv = 0
    while len(out) < n:
        lang = ctx.lang()
        company = ctx.rng.choice(text_gen.EN_NOUNS).title() + " Ltd"
        system = ctx.with_context(
            f"You are a friendly customer-service assistant for {company}. Answer briefly and politely.",
            ctx.rng.randint(*CHAT_SYSTEM_TOKENS),
            "en",
            after=True,
        )
        session_id = f"{session_prefix}-{seed}-{conv}"
        for turn in range(min(ctx.options.turns, n - len(out))):
            ask = text_gen.question if turn == 0 else text_gen.follow_up
            text = ctx.with_context(ask(ctx.rng, lang), ctx.rng.randint(*CHAT_TURN_TOKENS), lang)
            request = _chat(ctx, text, conv, system if turn == 0 else None)
            out.append(dataclasses.replace(request, session_id=session_id, turn=turn))
        conv += 1
    return out


def _shared_prefix(ctx: _Context, n: int) -> list[BenchRequest]:
    head = "You are the support assistant of a hardware shop. Answer only from the manual below.\n\n"
    system = head + ctx.prose(ctx.options.prefix_len - ctx.count(head), "en")
    out = []
    for i in range(n):
        lang = ctx.lang()
        text = ctx.with_context(
            text_gen.question(ctx.rng, lang), ctx.rng.randint(*SHARED_PREFIX_QUESTION_TOKENS), lang
        )
        out.append(_chat(ctx, text, i, system))
    return out


def _random(ctx: _Context, n: int) -> list[BenchRequest]:
    opts, out = ctx.options, []
    sampling = {**ctx.sampling, **({"ignore_eos": True} if opts.ignore_eos else {})}

    def draw(length: int) -> int:
        return ctx.rng.randint(
            max(1, int(length * (1 - opts.range_ratio))), max(1, int(length * (1 + opts.range_ratio)))
        )

    for i in range(n):
        target = draw(opts.input_len)
        prompt = pad_to(ctx.prose(target, "en"), target, ctx.count)
        max_tokens = opts.max_tokens if opts.max_tokens is not None else draw(opts.output_len)
        out.append(
            BenchRequest(
                "completion",
                max_tokens,
                prompt=prompt,
                sampling=sampling,
                conversation_id=i,
                input_tokens=ctx.count(prompt),
            )
        )
    return out


def build_workload(
    name: str,
    num_requests: int,
    seed: int = 0,
    count_tokens: TokenCounter | None = None,
    options: WorkloadOptions | None = None,
    session_prefix: str = "bench",
) -> list[BenchRequest]:
    """`num_requests` requests of workload `name`, the same for the same seed and options.

    For ``chat`` the requests are the turns of consecutive conversations (the last one may be cut
    short); `session_prefix` starts their session ids, so separate runs can keep sessions apart.
    """
    if name not in WORKLOAD_NAMES:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOAD_NAMES)}")
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    options = options or WorkloadOptions()
    sampling, max_tokens = _sampling_for(name, options)
    ctx = _Context(
        random.Random(f"{name}:{seed}"),
        count_tokens or estimate_tokens,
        options,
        MappingProxyType(sampling),
        max_tokens or 1,
    )
    builders: dict[str, Callable[[_Context, int], list[BenchRequest]]] = {
        "qa": _qa,
        "summary": _summary,
        "code": _code,
        "shared-prefix": _shared_prefix,
        "random": _random,
        "chat": lambda c, k: _conversations(c, k, session_prefix, seed),
    }
    return builders[name](ctx, num_requests)
