"""Structured output: a ``StructuredOutput`` compiled to an llguidance grammar, per-request matchers
and the token bitmask the sampler applies.

llguidance (a Rust grammar engine with one dependency-free wheel) was chosen over xgrammar, whose
Linux wheel pulls in ``triton``, a large GPU-oriented package. Measured here (BENCHMARKS.md),
xgrammar fills a mask 7-13x faster but compiles a schema ~17x slower (30-50 ms); the sampler
avoids most masks (``runner.grammar_rows``), so llguidance's cost stays small. Grammar text is built once per
``StructuredOutput.key`` (a bounded LRU); building the llguidance tokenizer (~1.5 s for Qwen3's
vocabulary) happens once per engine, on the first constrained request.

JSON is compact: no whitespace between tokens (``whitespace_flexible: false``), so an answer can
never run away in spaces or newlines.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import llguidance
import torch
import torch.nn.functional as F

from swiftlm.core.structured import StructuredOutput
from swiftlm.text.tokenizer import Tokenizer

_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
_CACHE_SIZE = 256
if sys.byteorder != "little":  # grammar_penalty reads the bitmask's int32 words as bytes
    raise ImportError("structured output needs a little-endian machine")


class StructuredOutputError(ValueError):
    """A constraint that cannot be compiled: invalid schema, unsupported feature, bad regex or
    grammar. The message names the problem (the server answers 400)."""


def _json_schema_text(spec: str) -> dict[str, Any]:
    try:
        schema = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise StructuredOutputError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, dict | bool):
        raise StructuredOutputError("a JSON schema must be a JSON object")
    return schema if isinstance(schema, dict) else ({} if schema else {"not": {}})


def _lark_string(text: str) -> str:
    return json.dumps(text)


def tool_calls_lark(functions: list[dict[str, Any]], parallel: bool) -> str:
    """A Lark grammar for Qwen3's hermes calls: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``,
    one (``parallel`` False) or several separated by "\\n", each naming one of ``functions`` and
    carrying arguments that match its ``parameters`` schema."""
    if not functions:
        raise StructuredOutputError("tool_calls needs at least one function")
    alternatives = []
    for i, fn in enumerate(functions):
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise StructuredOutputError("every tool needs a non-empty function name")
        params = fn.get("parameters") or {"type": "object"}
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise StructuredOutputError(f"tool {name!r}: parameters must be a JSON schema of type object")
        schema = {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
            "x-guidance": _JSON_OPTIONS,
        }
        alternatives.append(f"call_{i}: %json {json.dumps(schema)}")
    names = " | ".join(f"call_{i}" for i in range(len(functions)))
    lines = [
        "start: calls",
        "calls: call" if not parallel else 'calls: call ("\\n" call)*',
        # the tags are Qwen3's added tokens: llguidance matches them as tokens (<name>), never as text
        'call: <tool_call> "\\n" body "\\n" </tool_call>',
        f"body: {names}",
        *alternatives,
    ]
    return "\n".join(lines)


def grammar_text(so: StructuredOutput) -> str:
    """The llguidance grammar for ``so`` (not yet checked: see ``check``)."""
    try:
        if so.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(
                _json_schema_text(so.spec), defaults=_JSON_OPTIONS
            )
        if so.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=_JSON_OPTIONS)
        if so.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(so.spec)
        if so.kind == "choice":
            choices = json.loads(so.spec)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise StructuredOutputError("choice must be a non-empty list of strings")
            return llguidance.LLMatcher.grammar_from_lark(
                "start: " + " | ".join(_lark_string(c) for c in choices)
            )
        if so.kind == "grammar":
            if so.grammar_syntax == "gbnf":
                return llguidance.grammar_from("gbnf", so.spec)
            return llguidance.LLMatcher.grammar_from_lark(so.spec)
        functions = json.loads(so.spec)
        if not isinstance(functions, list):
            raise StructuredOutputError("tool_calls needs a list of function definitions")
        return llguidance.LLMatcher.grammar_from_lark(tool_calls_lark(functions, so.parallel))
    except StructuredOutputError:
        raise
    except ValueError as exc:  # json.JSONDecodeError, GBNF conversion, non-object schema
        raise StructuredOutputError(f"the {so.kind.replace('_', ' ')} cannot be compiled: {exc}") from exc


class _Cache:
    """A bounded LRU of checked grammar texts by ``StructuredOutput.key``; thread-safe."""

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._items: OrderedDict[tuple[str, str, str, bool], str] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, so: StructuredOutput) -> str:
        with self._lock:
            if so.key in self._items:
                self._items.move_to_end(so.key)
                return self._items[so.key]
        text = grammar_text(so)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text)
        if is_error:
            raise StructuredOutputError(
                f"the {so.kind.replace('_', ' ')} is not supported: {messages[0].strip()}"
            )
        with self._lock:
            self._items[so.key] = text
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return text


_grammars = _Cache()


def check(so: StructuredOutput) -> str:
    """Compile and check ``so`` (cached); raise StructuredOutputError naming the problem."""
    return _grammars.get(so)


class GrammarState:
    """One request's position in its grammar. ``accept`` advances it by a sampled token;
    ``done`` says it has ended (accepted, or refused a token): the request must stop.

    ``ahead(tokens)`` is a view of the position after ``tokens`` more (speculative decoding's draft
    tokens, not yet accepted), sharing the matcher: its ``allows`` and ``fill_bitmask`` answer for
    that position and leave the matcher where it was (llguidance's rollback)."""

    __slots__ = ("matcher", "_ahead")

    def __init__(self, matcher: llguidance.LLMatcher, ahead: tuple[int, ...] = ()) -> None:
        self.matcher = matcher
        self._ahead = ahead

    def accept(self, token_id: int) -> bool:
        assert not self._ahead, "a view ahead of the matcher cannot accept tokens"
        return self.matcher.consume_token(token_id)

    def ahead(self, tokens: tuple[int, ...]) -> GrammarState:
        return GrammarState(self.matcher, self._ahead + tokens)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` the grammar accepts from here, up to and including one that
        ends it (the state is not changed)."""
        n = self.matcher.validate_tokens([*self._ahead, *tokens]) - len(self._ahead)
        consumed = 0
        with self._advanced():
            for t in tokens[: max(n, 0)]:
                if not self.matcher.consume_token(t):
                    break
                consumed += 1
                if self.matcher.is_stopped():
                    break
            self.matcher.rollback(consumed)
        return consumed

    def allows(self, token_id: int) -> bool:
        """Whether the grammar allows ``token_id`` next (the state is not changed; ~1 us)."""
        return self.matcher.validate_tokens([*self._ahead, token_id]) == len(self._ahead) + 1

    @property
    def done(self) -> bool:
        return self.matcher.is_stopped() or self.matcher.is_error()

    def fill_bitmask(self, row: torch.Tensor) -> None:
        """Write the allowed tokens into ``row`` (int32, contiguous, ``ceil(V / 32)`` words)."""
        with self._advanced():
            self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    @contextlib.contextmanager
    def _advanced(self) -> Iterator[None]:
        """The matcher moved over this view's tokens ahead for the block, then back."""
        if self._ahead and not self.matcher.consume_tokens(list(self._ahead)):
            raise StructuredOutputError("draft tokens ahead of the grammar were not valid")
        try:
            yield
        finally:
            if self._ahead:
                self.matcher.rollback(len(self._ahead))


class GrammarCompiler:
    """Per engine: the llguidance tokenizer for the model's vocabulary (built on first use; the
    model's vocabulary may be larger than the tokenizer's: the extra ids are never allowed), and
    new ``GrammarState``s."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll is None:
                eos = list(self._tokenizer.eos_token_ids) or None
                self._ll = llguidance.LLTokenizer(
                    self._tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=eos
                )
            return self._ll

    def new_state(self, so: StructuredOutput) -> GrammarState:
        matcher = llguidance.LLMatcher(self.ll_tokenizer, check(so), log_level=0)
        if matcher.is_error():
            raise StructuredOutputError(
                f"the {so.kind.replace('_', ' ')} cannot be compiled: {matcher.get_error()}"
            )
        return GrammarState(matcher)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack a bitmask [G, W] int32 (bit ``t % 32`` of word ``t // 32`` set: token t allowed) into
    a bool tensor [G, vocab_size]; ids past the mask's 32 * W are not allowed."""
    return grammar_penalty(bitmask, vocab_size) == 0


def allowed_ids(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The allowed token ids, ascending, of one bitmask row ``words`` [W] int32; only the nonzero
    words are unpacked, so a grammar position that allows few tokens costs little."""
    nonzero = words.nonzero().squeeze(1)  # [N] word indices
    bits = (words[nonzero].unsqueeze(1) >> torch.arange(32, dtype=torch.int32)) & 1  # [N, 32]
    ids = (nonzero.unsqueeze(1) * 32 + torch.arange(32))[bits.bool()]  # [A], ascending
    return ids[ids < vocab_size]


def grammar_penalty(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bitmask [G, W] int32 as an additive penalty [G, vocab_size] float32: 0 where allowed,
    -inf where not (ids past 32 * W too). The int32 words are read as little-endian bytes, byte k
    of word w holding tokens 32 w + 8 k .. 32 w + 8 k + 7, and each byte is looked up in a
    [256, 8] table: on 16 rows of Qwen3's vocabulary ~1.5 ms, against ~13 ms for unpacking the bits
    with shifts and a masked scatter."""
    g = bitmask.shape[0]
    table = _byte_penalties(bitmask.device)
    penalty = F.embedding(bitmask.contiguous().view(torch.uint8).long(), table).view(g, -1)  # [G, 32 W]
    width = penalty.shape[1]
    if width >= vocab_size:
        return penalty[:, :vocab_size]
    pad = torch.full((g, vocab_size - width), -float("inf"), device=bitmask.device)
    return torch.cat([penalty, pad], dim=1)


@functools.cache
def _byte_penalties(device: torch.device) -> torch.Tensor:
    """[256, 8] float32: entry [b, i] is 0 when bit i of byte b is set, else -inf."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.where(bits.bool(), 0.0, -float("inf")).to(device)


def fill_bitmasks(states: list[GrammarState], vocab_size: int) -> torch.Tensor:
    """The allowed tokens of each state, [G, W] int32 (``bitmask_words(vocab_size)`` words a row)."""
    bitmask = torch.empty(len(states), bitmask_words(vocab_size), dtype=torch.int32)  # [G, W]
    for j, state in enumerate(states):
        state.fill_bitmask(bitmask[j])
    return bitmask


def apply_grammars(x: torch.Tensor, index: list[int], states: list[GrammarState]) -> None:
    """Set to -inf, in place, the logits ``x`` [B, V] of tokens that row ``index[j]``'s grammar
    ``states[j]`` does not allow. Other rows are not touched.

    The masks are filled here, after the forward, and only for rows that need one (the sampler
    checks a greedy row's token first). Filling them on a worker thread during the forward
    measured no faster on 2 cores (decode at batch 16: 0.73-0.83x of unconstrained with the
    thread, 0.79x without; llguidance's parallel executor 0.70x): the cores are busy with the
    forward. Inside JSON strings a mask takes ~0.7 ms a row."""
    vocab = x.shape[1]
    bitmask = fill_bitmasks(states, vocab)
    penalty = grammar_penalty(bitmask.to(x.device), vocab)  # [G, V]
    if index == list(range(x.shape[0])):
        x.add_(penalty)  # every row constrained, in order: no gather
    else:
        x.index_add_(0, torch.tensor(index, device=x.device), penalty)
