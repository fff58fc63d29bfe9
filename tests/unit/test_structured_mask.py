"""The grammar bitmask in the sampler: constrained rows keep only allowed tokens, others are
untouched bit for bit; compile errors name the problem."""

from __future__ import annotations

import json

import pytest
import torch

from swiftlm.core.structured import StructuredOutput, from_vllm
from swiftlm.runner.sampler import Sampler, SamplingRow, _process_logits
from swiftlm.runner.structured import StructuredOutputError, allowed_tokens, apply_grammars, check
from swiftlm.sampling import SamplingParams


class FixedGrammar:
    """A grammar state that allows a fixed set of token ids."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed

    def fill_bitmask(self, row: torch.Tensor) -> None:
        words = [0] * row.numel()
        for t in self.allowed:
            words[t // 32] |= 1 << (t % 32)
        row.copy_(torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32))


def _row(params: SamplingParams, grammar=None) -> SamplingRow:
    return SamplingRow(params=params, prompt_token_ids=[1], output_token_ids=[], generator=None, grammar=grammar)


def test_unpacking_matches_bits() -> None:
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32, generator=gen)
    allowed = allowed_tokens(words, 170)  # 170 > 5 * 32: the ids past the mask are not allowed
    for r in range(3):
        for t in range(170):
            expect = t < 160 and (int(words[r, t // 32]) >> (t % 32)) & 1 == 1
            assert bool(allowed[r, t]) == expect


def test_constrained_rows_masked_others_bit_identical() -> None:
    vocab = 100
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    plain = SamplingParams(temperature=0.0)
    rows = [_row(plain), _row(plain, FixedGrammar([3, 64, 99])), _row(plain), _row(plain, FixedGrammar([7]))]
    x = _process_logits(logits, rows)
    assert torch.equal(x[0], logits[0]) and torch.equal(x[2], logits[2])
    for r, allowed in ((1, [3, 64, 99]), (3, [7])):
        finite = torch.isfinite(x[r]).nonzero().flatten().tolist()
        assert finite == allowed
        assert torch.equal(x[r, allowed], logits[r, allowed])
    out = Sampler()(logits, rows)
    assert out.token_ids[3] == 7 and out.token_ids[1] in (3, 64, 99)
    assert out.token_ids[0] == int(logits[0].argmax()) and out.token_ids[2] == int(logits[2].argmax())


def test_no_grammar_no_copy() -> None:
    logits = torch.randn(2, 50)
    rows = [_row(SamplingParams(temperature=0.0)), _row(SamplingParams(temperature=0.0))]
    assert _process_logits(logits, rows) is logits  # nothing applied: no work, no copy


def test_sampled_rows_never_leave_the_grammar() -> None:
    logits = torch.zeros(1, 64)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=40)
    for _ in range(50):
        assert Sampler()(logits, [_row(params, FixedGrammar([5, 33]))]).token_ids[0] in (5, 33)


def test_apply_grammars_touches_only_given_rows() -> None:
    x = torch.randn(3, 40)
    before = x.clone()
    apply_grammars(x, [1], [FixedGrammar([0, 39])])
    assert torch.equal(x[0], before[0]) and torch.equal(x[2], before[2])
    assert torch.isfinite(x[1]).nonzero().flatten().tolist() == [0, 39]


@pytest.mark.parametrize(
    ("so", "words"),
    [
        (StructuredOutput("json_schema", "{not json"), "not valid JSON"),
        (StructuredOutput("json_schema", json.dumps({"type": "strin"})), "strin"),
        (StructuredOutput("json_schema", json.dumps({"not": {"type": "string"}})), "not"),
        (StructuredOutput("regex", "(ab"), "unclosed group"),
        (StructuredOutput("grammar", "start: missing_rule"), "missing_rule"),
        (StructuredOutput("grammar", "root ::= ( \"a\"", grammar_syntax="gbnf"), "GBNF"),
        (StructuredOutput("tool_calls", json.dumps([{"name": "f", "parameters": {"type": "array"}}])), "object"),
    ],
)
def test_bad_constraints_name_the_problem(so: StructuredOutput, words: str) -> None:
    with pytest.raises(StructuredOutputError, match=words):
        check(so)


def test_good_constraints_compile() -> None:
    tools = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    for so in (
        StructuredOutput("json_object"),
        StructuredOutput("regex", "[a-z]{1,4}"),
        StructuredOutput("choice", json.dumps(["yes", "no"])),
        StructuredOutput("grammar", 'root ::= "yes" | "no"', grammar_syntax="gbnf"),
        StructuredOutput("tool_calls", json.dumps(tools), parallel=False),
    ):
        assert check(so)


def test_vllm_shapes() -> None:
    assert from_vllm({"json": {"type": "object"}}) == StructuredOutput("json_schema", '{"type": "object"}')
    assert from_vllm({"choice": ["a", "b"]}).kind == "choice"
    assert from_vllm({"grammar": 'root ::= "a"'}).grammar_syntax == "gbnf"
    assert SamplingParams(guided_decoding={"regex": "a+"}).structured_outputs == StructuredOutput("regex", "a+")
    with pytest.raises(ValueError, match="one of"):
        from_vllm({"regex": "a", "choice": ["a"]})
