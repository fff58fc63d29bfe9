"""The grammar bitmask in the sampler: constrained rows keep only allowed tokens, others are
untouched bit for bit; compile errors name the problem."""

from __future__ import annotations

import json

import pytest
import torch

from swiftlm.core.structured import StructuredOutput, from_vllm
from swiftlm.runner.sampler import Sampler, SamplingRow, _process_logits
from swiftlm.runner.structured import (
    StructuredOutputError,
    allowed_ids,
    allowed_tokens,
    apply_grammars,
    check,
)
from swiftlm.runner.top_logits import largest
from swiftlm.sampling import SamplingParams


class FixedGrammar:
    """A grammar state that allows a fixed set of token ids."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed = allowed
        self.masks = 0  # how many masks were filled

    def allows(self, token_id: int) -> bool:
        return token_id in self.allowed

    def fill_bitmask(self, row: torch.Tensor) -> None:
        self.masks += 1
        words = [0] * row.numel()
        for t in self.allowed:
            words[t // 32] |= 1 << (t % 32)
        row.copy_(torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32))


def _row(params: SamplingParams, grammar=None) -> SamplingRow:
    return SamplingRow(
        params=params, prompt_token_ids=[1], output_token_ids=[], generator=None, grammar=grammar
    )


def test_unpacking_matches_bits() -> None:
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 5), dtype=torch.int32, generator=gen)
    allowed = allowed_tokens(words, 170)  # 170 > 5 * 32: the ids past the mask are not allowed
    for r in range(3):
        for t in range(170):
            expect = t < 160 and (int(words[r, t // 32]) >> (t % 32)) & 1 == 1
            assert bool(allowed[r, t]) == expect


def test_allowed_ids_are_the_set_bits_ascending() -> None:
    gen = torch.Generator().manual_seed(4)
    words = torch.randint(-(2**31), 2**31 - 1, (2, 6), dtype=torch.int32, generator=gen)
    words[1, 1:5] = 0  # a sparse row
    for r in range(2):
        expect = allowed_tokens(words[r : r + 1], 180)[0].nonzero().flatten().tolist()
        assert allowed_ids(words[r], 180).tolist() == expect
    assert allowed_ids(torch.zeros(6, dtype=torch.int32), 180).numel() == 0


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


def test_checked_greedy_rows_equal_masked_argmax_and_mask_only_when_refused() -> None:
    gen = torch.Generator().manual_seed(2)
    vocab = 300
    greedy = SamplingParams(temperature=0.0)
    for trial in range(40):
        logits = torch.randn(6, vocab, generator=gen)
        grammars = []
        for r in range(6):
            allowed = torch.randperm(vocab, generator=gen)[: 1 + trial % 50].tolist()
            if r % 2 == 0:
                allowed.append(int(logits[r].argmax()))  # half the rows: the argmax is allowed
            grammars.append(FixedGrammar(sorted(set(allowed))))
        rows = [_row(greedy, g) for g in grammars]
        out = Sampler()(logits, rows)
        for r, g in enumerate(grammars):
            masked = torch.full((vocab,), -float("inf"))
            masked[g.allowed] = logits[r, g.allowed]
            assert out.token_ids[r] == int(masked.argmax())
            top = logits[r].topk(16).indices.tolist()
            if any(t in g.allowed for t in top[:15]):  # the 16th is the cut: ties may go past it
                assert g.masks == 0  # the argmax or one of the next-best candidates settled it
            elif top[15] not in g.allowed:
                assert g.masks == 1


@pytest.mark.parametrize("vocab", [128 * 40, 128 * 40 + 3])
def test_largest_holds_every_logit_above_the_kth(vocab: int) -> None:
    gen = torch.Generator().manual_seed(6)
    x = (torch.randn(5, vocab, generator=gen) * 4).round()  # many ties
    values, ids = (t.tolist() for t in largest(x, [0, 2, 4], 16))
    for j, r in enumerate((0, 2, 4)):
        assert values[j] == x[r].topk(16).values.tolist()
        assert [float(x[r, t]) for t in ids[j]] == values[j]
        above = set((x[r] > values[j][-1]).nonzero().flatten().tolist())
        assert above <= set(ids[j])


def test_checked_greedy_rows_with_tied_logits_take_the_lowest_allowed_id() -> None:
    """Logits rounded to one decimal tie often: the candidates' ties at the cut, and ties among
    them, must still give the masked argmax (lowest id among the allowed maxima)."""
    gen = torch.Generator().manual_seed(5)
    vocab = 200
    greedy = SamplingParams(temperature=0.0)
    for trial in range(60):
        logits = (torch.randn(4, vocab, generator=gen) * 3).round() / 10 * (1 + trial % 3)
        grammars = [
            FixedGrammar(sorted(torch.randperm(vocab, generator=gen)[: 2 + 7 * r].tolist())) for r in range(4)
        ]
        out = Sampler()(logits, [_row(greedy, g) for g in grammars])
        for r, g in enumerate(grammars):
            masked = torch.full((vocab,), -float("inf"))
            masked[g.allowed] = logits[r, g.allowed]
            assert out.token_ids[r] == int(masked.argmax())  # argmax: the first maximal index


@pytest.mark.parametrize("min_p", [0.0, 0.3])
def test_checked_sampled_rows_have_the_masked_distribution(min_p: float) -> None:
    """Temperature-only rows (with and without min-p) skip the mask when the draw is allowed; the
    tokens they produce still follow softmax over the allowed tokens (min-p applied after masking)."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 3.0, -1.0]])  # token 6 most likely, refused
    allowed = [0, 1, 2, 4, 5]
    params = SamplingParams(temperature=0.8, min_p=min_p)
    masked = torch.full((8,), -float("inf"))
    masked[allowed] = logits[0, allowed] / 0.8
    probs = masked.softmax(-1)
    if min_p > 0:
        probs = torch.where(probs >= min_p * probs.max(), probs, torch.zeros(()))
        probs = probs / probs.sum()
    draws = 6000
    counts = torch.zeros(8)
    grammar = FixedGrammar(allowed)
    for _ in range(draws):
        counts[Sampler()(logits, [_row(params, grammar)]).token_ids[0]] += 1
    assert counts[[3, 6, 7]].sum() == 0
    expected = probs * draws
    assert float((counts - expected).abs().max()) < 4 * float((expected * (1 - probs)).sqrt().max()) + 1
    if min_p > 0:
        assert grammar.masks == draws  # the most likely token is refused: every draw needs the mask
    else:
        assert 0 < grammar.masks < draws  # allowed draws were kept without a mask


def _seeded_row(params: SamplingParams, seed: int, grammar=None) -> SamplingRow:
    return SamplingRow(
        params=params,
        prompt_token_ids=[1],
        output_token_ids=[],
        generator=torch.Generator().manual_seed(seed),
        grammar=grammar,
    )


def _masked_first(logits: torch.Tensor, allowed: list[int], params: SamplingParams, seed: int) -> int:
    masked = torch.full_like(logits, -float("inf"))
    masked[0, allowed] = logits[0, allowed]
    return Sampler()(masked, [_seeded_row(params, seed)]).token_ids[0]


def test_top_k_rows_give_the_masked_first_token_and_mask_only_when_needed() -> None:
    """A seeded top-k (+ top-p) row gives the token that masking first gives: its own top k all
    allowed (untouched), its first k allowed found among its 4 k largest (narrowed), or not
    (masked first)."""
    gen = torch.Generator().manual_seed(7)
    vocab = 400
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.9, seed=1)
    outcomes = {"own": 0, "narrowed": 0, "masked": 0}
    for trial in range(60):
        logits = torch.randn(1, vocab, generator=gen)
        order = logits[0].argsort(descending=True).tolist()
        others = torch.randperm(vocab, generator=gen)[: 10 + 20 * (trial % 3)].tolist()
        allowed = sorted(set(others + (order[:8] if trial % 2 == 0 else order[:3])))
        grammar = FixedGrammar(allowed)
        got = Sampler()(logits, [_seeded_row(params, trial, grammar)]).token_ids[0]
        assert got == _masked_first(logits, allowed, params, trial) and got in allowed
        found = sum(t in allowed for t in order[:32]) >= 8  # the first 8 allowed within 4 k = 32
        assert grammar.masks == (0 if found else 1)
        own = set(order[:8]) <= set(allowed)
        outcomes["own" if own else "narrowed" if found else "masked"] += 1
    assert min(outcomes.values()) > 0, outcomes


def test_top_k_row_with_ties_at_the_kth_keeps_every_tied_allowed_token() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 3.0, 1.0, 0.0, 3.0]])  # k = 3 cuts through the tie at 3.0
    for allowed in ([0, 1, 2, 3, 4, 6], [0, 2, 3, 4], [1, 3, 4, 5]):
        for seed in range(30):
            grammar = FixedGrammar(allowed)
            params = SamplingParams(temperature=2.0, top_k=3, seed=seed)
            got = Sampler()(logits, [_seeded_row(params, seed, grammar)]).token_ids[0]
            assert got == _masked_first(logits, allowed, params, seed)


@pytest.mark.parametrize("extra", [{"top_k": 20}, {"top_p": 0.9}, {"top_k": 20, "top_p": 0.9}])
def test_masked_truncated_rows_sample_among_finite_logits_only(extra: dict) -> None:
    """A masked row with fewer finite logits than its top-k (or nucleus candidates) picks one of them,
    with the one draw of a sampled step."""
    logits = torch.randn(1, 5000, generator=torch.Generator().manual_seed(8))
    row = _seeded_row(SamplingParams(temperature=1.0, seed=3, **extra), 3, FixedGrammar([10, 20, 4000]))
    assert Sampler()(logits, [row]).token_ids[0] in (10, 20, 4000)
    reference = torch.Generator().manual_seed(3)
    torch.empty(1).uniform_(generator=reference)
    assert torch.equal(row.generator.get_state(), reference.get_state())


def test_top_p_rows_and_logprob_rows_are_masked_first() -> None:
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    g1, g2 = FixedGrammar(list(range(64))), FixedGrammar(list(range(64)))
    Sampler()(
        logits,
        [
            _row(SamplingParams(temperature=1.0, top_p=0.9), g1),
            _row(SamplingParams(temperature=0.0, logprobs=2), g2),
        ],
    )
    assert g1.masks == 1 and g2.masks == 1  # every token allowed, but these rows cannot skip the mask


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
        (StructuredOutput("grammar", 'root ::= ( "a"', grammar_syntax="gbnf"), "GBNF"),
        (
            StructuredOutput("tool_calls", json.dumps([{"name": "f", "parameters": {"type": "array"}}])),
            "object",
        ),
    ],
)
def test_bad_constraints_name_the_problem(so: StructuredOutput, words: str) -> None:
    with pytest.raises(StructuredOutputError, match=words):
        check(so)


def test_good_constraints_compile() -> None:
    tools = [
        {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    ]
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
    assert SamplingParams(guided_decoding={"regex": "a+"}).structured_outputs == StructuredOutput(
        "regex", "a+"
    )
    with pytest.raises(ValueError, match="one of"):
        from_vllm({"regex": "a", "choice": ["a"]})


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.5),
    ],
)
def test_a_grammar_that_allows_nothing_does_not_break_the_batch(params: SamplingParams) -> None:
    """(The engine stops such a request when the grammar refuses the token.) Its neighbour is
    sampled as usual."""
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(9))
    out = Sampler()(logits, [_row(params, FixedGrammar([])), _row(SamplingParams(temperature=0.0))])
    assert out.token_ids[1] == int(logits[1].argmax())
