"""Sampler: seeds, filters, penalties, logprobs and forced tokens on small random logits."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from swiftlm.runner.sampler import Sampler, SamplerOutput, SamplingRow
from swiftlm.sampling import SamplingParams


def make_row(
    params: SamplingParams,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    banned: Sequence[int] = (),
    forced: int | None = None,
) -> SamplingRow:
    generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
    return SamplingRow(params, list(prompt), list(output), generator, list(banned), forced)


def run_steps(params: Sequence[SamplingParams], logits: Sequence[torch.Tensor]) -> list[list[int]]:
    """Decode len(logits) steps for a batch of requests; logits[step] is [len(params), V]."""
    rows = [make_row(p, prompt=[1, 2, 3]) for p in params]
    sampler = Sampler()
    for step_logits in logits:
        out = sampler(step_logits, rows)
        for row, token in zip(rows, out.token_ids, strict=True):
            row.output_token_ids.append(token)
    return [list(r.output_token_ids) for r in rows]


MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.2, top_k=5, seed=2),
    SamplingParams(top_p=0.9, min_p=0.05, repetition_penalty=1.3, frequency_penalty=0.5, seed=3),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.0, repetition_penalty=1.5, presence_penalty=1.0),
    SamplingParams(top_p=0.5, top_k=20, seed=1),
    SamplingParams(top_k=10),
    SamplingParams(top_p=0.9, temperature=0.7, seed=4),  # nucleus found among the 1024 largest
    SamplingParams(top_p=0.99999, min_p=0.01, seed=5),  # nucleus search falls back to the whole row
]


def test_seeded_rows_give_the_same_tokens_alone_and_in_a_batch() -> None:
    steps, vocab = 30, 3000
    test_rng = torch.Generator().manual_seed(0)
    # Rounded to bfloat16, as a bf16 model's logits are, so equal logits (ties) are common.
    logits = [
        (torch.randn(len(MIXED), vocab, generator=test_rng) * 3).bfloat16().float() for _ in range(steps)
    ]
    batched = run_steps(MIXED, logits)
    order = list(reversed(range(len(MIXED))))
    reordered = run_steps([MIXED[i] for i in order], [step[order] for step in logits])
    for i, params in enumerate(MIXED):
        if params.seed is None and not params.greedy:
            continue
        alone = run_steps([params], [step[i : i + 1] for step in logits])[0]
        assert batched[i] == alone, f"row {i}"
        assert reordered[order.index(i)] == alone, f"row {i} reordered"
    assert len(set(batched[1])) > 5  # really sampled
    assert batched[1] != batched[6]  # same seed, different settings: different streams


@pytest.mark.parametrize(
    ("params", "draws"),
    [
        (SamplingParams(seed=5, top_k=7), 1),
        (SamplingParams(seed=5, top_p=0.9, min_p=0.1), 1),
        (SamplingParams(seed=5, temperature=0.5), 1),
        (SamplingParams(seed=5, temperature=0.0), 0),
    ],
)
def test_seeded_generator_advances_one_draw_per_sampled_step(params: SamplingParams, draws: int) -> None:
    """A seeded row takes one number from its generator per sampled step (an inverse-transform draw),
    whatever its candidates and the other rows; a greedy or forced row takes none."""
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    rows = [make_row(SamplingParams(top_k=3)), make_row(params), make_row(params, forced=2)]
    Sampler()(logits, rows)
    reference = torch.Generator().manual_seed(5)
    torch.rand(draws, generator=reference)
    assert torch.equal(rows[1].generator.get_state(), reference.get_state())  # type: ignore[union-attr]
    assert torch.equal(rows[2].generator.get_state(), torch.Generator().manual_seed(5).get_state())  # type: ignore[union-attr]


def _sample_counts(params: SamplingParams, logits: torch.Tensor, draws: int) -> torch.Tensor:
    rows = [make_row(params) for _ in range(draws)]
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        out = Sampler()(logits.expand(draws, -1), rows)
    return torch.bincount(torch.tensor(out.token_ids), minlength=logits.shape[-1]).double()


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


LOGITS = torch.randn(1, 24, generator=torch.Generator().manual_seed(7)) * 2  # [1, V]


def test_temperature_sampling_matches_softmax() -> None:
    counts = _sample_counts(SamplingParams(temperature=0.7), LOGITS, 20000)
    probs = (LOGITS[0].double() / 0.7).softmax(-1)
    assert _chi_square(counts, probs) < 60.0  # df = 23; p(chi2 > 60) ~ 4e-5, and the draw is seeded


def test_seeded_rows_sample_the_right_distribution() -> None:
    rows = [make_row(SamplingParams(temperature=1.3, seed=s)) for s in range(4000)]
    out = Sampler()(LOGITS.expand(len(rows), -1), rows)
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=LOGITS.shape[-1]).double()
    assert _chi_square(counts, (LOGITS[0].double() / 1.3).softmax(-1)) < 60.0


@pytest.mark.parametrize("top_p", [1.0, 0.999])  # top-k alone, and top-p within the top-k
def test_top_k_never_samples_outside_the_k_largest(top_p: float) -> None:
    counts = _sample_counts(SamplingParams(top_k=5, top_p=top_p, temperature=1.5), LOGITS, 4000)
    allowed = set(LOGITS[0].topk(5).indices.tolist())
    assert set(counts.nonzero().flatten().tolist()) == allowed


def _nucleus(probs: torch.Tensor, top_p: float) -> list[int]:
    """Smallest set of most likely tokens whose mass reaches top_p, by hand."""
    order = sorted(range(len(probs)), key=lambda t: -float(probs[t]))
    kept, mass = [], 0.0
    for t in order:
        kept.append(t)
        mass += float(probs[t])
        if mass >= top_p:
            break
    return kept


@pytest.mark.parametrize("top_k", [0, 8])  # top-p alone, and renormalised within a top-k
def test_top_p_samples_the_renormalised_nucleus(top_k: int) -> None:
    counts = _sample_counts(SamplingParams(top_p=0.7, top_k=top_k, temperature=1.3), LOGITS, 8000)
    probs = (LOGITS[0].double() / 1.3).softmax(-1)
    if top_k:
        probs[probs < probs.topk(top_k).values[-1]] = 0.0
        probs /= probs.sum()
    nucleus = _nucleus(probs, 0.7)
    assert 2 < len(nucleus) < 24
    assert set(counts.nonzero().flatten().tolist()) == set(nucleus)
    renormalised = torch.zeros_like(probs)
    renormalised[nucleus] = probs[nucleus] / probs[nucleus].sum()
    assert _chi_square(counts, renormalised) < 40.0


@pytest.mark.parametrize(
    ("vocab", "scale", "draws"),
    [(3000, 4.0, 500), (40000, 1.5, 60), (3000, 0.5, 500)],  # nucleus in the 1024 / 32768 largest, or not
)
def test_top_p_over_a_large_vocabulary_stays_in_the_nucleus(vocab: int, scale: float, draws: int) -> None:
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(19)) * scale
    counts = _sample_counts(SamplingParams(top_p=0.8, temperature=1.0), logits, draws)
    probs = logits[0].double().softmax(-1)
    nucleus = set(_nucleus(probs, 0.8))
    sampled = set(counts.nonzero().flatten().tolist())
    assert sampled <= nucleus and len(sampled) > min(20, len(nucleus) // 2)
    if len(nucleus) > 1024:  # the fallback must reach beyond the 1024 largest
        assert sampled - set(logits[0].topk(1024).indices.tolist())


def test_top_p_mass_is_over_the_whole_vocabulary_not_the_candidates() -> None:
    # Five tokens hold 0.8 of the mass, 2995 others share 0.2: the nucleus for 0.79 is all five,
    # though the 1024 largest (holding ~0.87) would renormalise it to four.
    head = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.05]).log()
    tail = math.log(0.2 / 2995) + 0.01 * torch.randn(2995, generator=torch.Generator().manual_seed(23))
    logits = torch.cat([head, tail]).unsqueeze(0)  # [1, 3000]
    counts = _sample_counts(SamplingParams(top_p=0.79), logits, 2000)
    assert set(counts.nonzero().flatten().tolist()) == {0, 1, 2, 3, 4}


def test_ties_keep_the_lowest_id_for_greedy_and_all_tied_tokens_for_top_k() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0, 2.0]])
    assert Sampler()(logits, [make_row(SamplingParams(temperature=0.0))]).token_ids == [1]
    counts = _sample_counts(SamplingParams(top_k=2), logits, 600)
    assert set(counts.nonzero().flatten().tolist()) == {1, 2, 3}


def test_top_p_keeps_at_least_one_token() -> None:
    counts = _sample_counts(SamplingParams(top_p=1e-6), LOGITS, 100)
    assert counts[int(LOGITS[0].argmax())] == 100


def test_min_p_never_samples_below_the_threshold() -> None:
    counts = _sample_counts(SamplingParams(min_p=0.1, temperature=0.7), LOGITS, 4000)
    probs = (LOGITS[0].double() / 0.7).softmax(-1)
    allowed = set((probs >= 0.1 * probs.max()).nonzero().flatten().tolist())
    assert 1 < len(allowed) < 24
    assert set(counts.nonzero().flatten().tolist()) == allowed


def _processed_logprobs(out: SamplerOutput, row: int = 0) -> list[float]:
    assert out.top_logprobs is not None and out.top_logprobs[row] is not None
    by_id = dict(out.top_logprobs[row])
    return [by_id[t] for t in range(len(by_id))]


def _expected_logprobs(adjusted: list[float]) -> list[float]:
    return torch.tensor(adjusted, dtype=torch.float64).log_softmax(-1).tolist()


BASE = [2.0, -1.0, 0.5, -0.5, 1.5, 0.0]  # V = 6


@pytest.mark.parametrize(
    ("params", "banned", "adjusted"),
    [
        # prompt [0, 1], output [2, 2, 2, 4]: token 2 counted 3 times, token 4 once, 0/1/3/5 never.
        (SamplingParams(repetition_penalty=2.0), (), [2.0 / 2, -1.0 * 2, 0.5 / 2, -0.5, 1.5 / 2, 0.0]),
        (
            SamplingParams(repetition_penalty=0.5),
            (),
            [2.0 / 0.5, -1.0 * 0.5, 0.5 / 0.5, -0.5, 1.5 / 0.5, 0.0],
        ),
        (SamplingParams(frequency_penalty=0.5), (), [2.0, -1.0, 0.5 - 1.5, -0.5, 1.5 - 0.5, 0.0]),
        (SamplingParams(presence_penalty=-0.75), (), [2.0, -1.0, 0.5 + 0.75, -0.5, 1.5 + 0.75, 0.0]),
        (SamplingParams(logit_bias={3: 4.0, 0: -1.0}), (), [1.0, -1.0, 0.5, 3.5, 1.5, 0.0]),
        (SamplingParams(), (0, 4), [-math.inf, -1.0, 0.5, -0.5, -math.inf, 0.0]),
        (
            SamplingParams(
                logit_bias={3: 1.0, 0: -0.5},
                repetition_penalty=1.5,
                frequency_penalty=0.5,
                presence_penalty=0.25,
            ),
            (5,),
            # bias, ban, repetition over {0, 1, 2, 4}, then frequency * count + presence on {2, 4}
            [1.5 / 1.5, -1.0 * 1.5, 0.5 / 1.5 - 0.5 * 3 - 0.25, 0.5, 1.5 / 1.5 - 0.5 - 0.25, -math.inf],
        ),
    ],
)
def test_penalties_bias_and_bans_match_hand_computed_logprobs(
    params: SamplingParams, banned: tuple[int, ...], adjusted: list[float]
) -> None:
    logits = torch.tensor([BASE])
    before = logits.clone()
    row = make_row(params.with_updates(temperature=0.0, logprobs=6), [0, 1], [2, 2, 2, 4], banned)
    out = Sampler()(logits, [row])
    assert torch.equal(logits, before)  # the caller's tensor is untouched
    got, expected = _processed_logprobs(out), _expected_logprobs(adjusted)
    for g, e in zip(got, expected, strict=True):
        assert g == e if math.isinf(e) else g == pytest.approx(e, abs=1e-6)
    assert out.token_ids == [max(range(6), key=lambda t: adjusted[t])]


def test_greedy_is_argmax_with_log_softmax_logprobs() -> None:
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(3))
    ks = [5, 0, None, 20]
    rows = [make_row(SamplingParams(temperature=0.0, logprobs=k)) for k in ks]
    out = Sampler()(logits, rows)
    assert out.token_ids == logits.argmax(-1).tolist()
    expected = logits.double().log_softmax(-1)
    assert out.logprobs is not None and out.top_logprobs is not None
    for i, k in enumerate(ks):
        if k is None:
            assert math.isnan(out.logprobs[i]) and out.top_logprobs[i] is None
            continue
        assert out.logprobs[i] == pytest.approx(float(expected[i, out.token_ids[i]]), abs=1e-6)
        top = out.top_logprobs[i]
        assert top is not None and len(top) == k
        assert [t for t, _ in top] == expected[i].topk(k).indices.tolist()
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        for token, lp in top:
            assert lp == pytest.approx(float(expected[i, token]), abs=1e-6)


def test_no_logprobs_requested_returns_none() -> None:
    out = Sampler()(torch.randn(2, 10), [make_row(SamplingParams(temperature=0.0))] * 2)
    assert out.logprobs is None and out.top_logprobs is None


def test_logprobs_are_taken_before_temperature_and_truncation() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(5))
    params = SamplingParams(temperature=0.3, top_k=3, top_p=0.8, logprobs=2, seed=9)
    out = Sampler()(logits, [make_row(params)])
    assert out.logprobs is not None
    expected = logits[0].double().log_softmax(-1)
    assert out.logprobs[0] == pytest.approx(float(expected[out.token_ids[0]]), abs=1e-6)


def test_forced_token_is_returned_with_its_processed_logprob() -> None:
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(11))
    rows = [
        make_row(SamplingParams(temperature=0.0, logprobs=1, logit_bias={7: 3.0}), forced=7),
        make_row(SamplingParams(seed=4, logprobs=0, repetition_penalty=2.0), prompt=[12], forced=12),
        make_row(SamplingParams(temperature=0.0)),
    ]
    out = Sampler()(logits, rows)
    assert out.token_ids[:2] == [7, 12]
    assert out.token_ids[2] == int(logits[2].argmax())
    biased = logits[0].double().clone()
    biased[7] += 3.0
    penalised = logits[1].double().clone()
    penalised[12] = penalised[12] / 2 if penalised[12] > 0 else penalised[12] * 2
    assert out.logprobs is not None
    assert out.logprobs[0] == pytest.approx(float(biased.log_softmax(-1)[7]), abs=1e-6)
    assert out.logprobs[1] == pytest.approx(float(penalised.log_softmax(-1)[12]), abs=1e-6)
    assert math.isnan(out.logprobs[2])


def test_mixed_batch_matches_each_row_alone() -> None:
    logits = torch.randn(len(MIXED), 300, generator=torch.Generator().manual_seed(13)) * 2
    params = [p.with_updates(logprobs=3) for p in MIXED]
    histories = [([5, 6, 7], [8, 8, 9]) for _ in params]
    batch = Sampler()(logits, [make_row(p, *h) for p, h in zip(params, histories, strict=True)])
    for i, p in enumerate(params):
        if p.seed is None and not p.greedy:
            continue
        alone = Sampler()(logits[i : i + 1], [make_row(p, *histories[i])])
        assert batch.token_ids[i] == alone.token_ids[0]
        assert batch.logprobs is not None and alone.logprobs is not None
        assert batch.logprobs[i] == pytest.approx(alone.logprobs[0], abs=1e-6)


def test_logit_bias_outside_the_vocabulary_is_rejected() -> None:
    row = make_row(SamplingParams(logit_bias={10: 1.0}))
    with pytest.raises(ValueError, match="outside the vocabulary of 10"):
        Sampler()(torch.zeros(1, 10), [row])


def test_bfloat16_logits_are_sampled_in_float32_and_left_untouched() -> None:
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(17)).to(torch.bfloat16)
    before = logits.clone()
    rows = [
        make_row(SamplingParams(temperature=0.0, logprobs=0, logit_bias={3: 5.0})),
        make_row(SamplingParams(temperature=0.0)),
    ]
    out = Sampler()(logits, rows)
    assert torch.equal(logits, before)
    biased = logits[0].float().clone()
    biased[3] += 5.0
    assert out.token_ids == [int(biased.argmax()), int(logits[1].float().argmax())]
    assert out.logprobs is not None
    assert out.logprobs[0] == pytest.approx(float(biased.log_softmax(-1)[out.token_ids[0]]), abs=1e-6)


@pytest.mark.parametrize("vocab", [128 * 50, 1000])
def test_top_k_candidates_from_the_largest_logits_equal_the_threshold_scan(vocab: int) -> None:
    """The top-k fast path gives exactly the candidates of the threshold scan (values, ids,
    canonical order, counts), and declines rows whose k-th logit ties past k."""
    from swiftlm.runner.token_draw import _candidates, _top_k_candidates

    gen = torch.Generator().manual_seed(11)
    used = declined = 0
    for trial in range(20):
        x = torch.randn(6, vocab, generator=gen) * 3
        if trial % 2:
            x = x.to(torch.bfloat16).float()  # bf16 logits: ties are common
        rows = [
            SamplingRow(
                params=SamplingParams(temperature=1.0, top_k=1 + (7 * r + trial) % 40),
                prompt_token_ids=[],
                output_token_ids=[],
                generator=None,
            )
            for r in range(6)
        ]
        fast, fast_values, fast_ids = _top_k_candidates(x, rows, range(6))
        ks = torch.tensor([r.params.top_k for r in rows]).unsqueeze(1)
        threshold = x.sort(dim=-1, descending=True).values.gather(1, ks - 1)
        values, ids, counts = _candidates(x, threshold)
        for r in range(6):
            if r not in fast:
                assert int((x[r] >= threshold[r]).sum()) > rows[r].params.top_k  # a tie past k
                declined += 1
                continue
            used += 1
            f, c = fast.index(r), counts[r]
            assert c == rows[r].params.top_k
            assert torch.equal(fast_values[f, :c], values[r, :c]) and torch.equal(fast_ids[f, :c], ids[r, :c])
    assert used and declined


def test_one_draw_picks_only_columns_with_mass_and_column_0_of_an_empty_row() -> None:
    """The inverse-transform draw never lands on a column of probability 0 (before, between or after
    the others), even with uniforms at the ends of [0, 1); a row with no finite value picks column 0."""
    from swiftlm.runner.token_draw import draw as _draw

    values = torch.tensor([[-math.inf, 0.0, -math.inf, 1.0, -math.inf], [-math.inf] * 5])
    for u in (0.0, 0.5, 1.0 - 2.0**-24):
        row = make_row(SamplingParams(temperature=1.0, seed=1))
        row.generator = None
        torch.manual_seed(0)
        with torch.random.fork_rng():
            original = torch.Tensor.uniform_

            def fixed(self: torch.Tensor, *args: object, u: float = u, **kwargs: object) -> torch.Tensor:
                return self.fill_(u)

            torch.Tensor.uniform_ = fixed  # type: ignore[method-assign]
            try:
                got = _draw(values.clone(), [row, row]).tolist()
            finally:
                torch.Tensor.uniform_ = original  # type: ignore[method-assign]
        assert got[0] in (1, 3) and got[1] == 0, (u, got)
    lone = torch.full((1, 7), -math.inf)
    lone[0, 6] = 2.0
    assert _draw(lone, [make_row(SamplingParams(temperature=1.0))]).tolist() == [6]


def test_the_device_draw_is_the_samplers_draw() -> None:
    """``sample_on_device`` chooses what ``Sampler`` does from the same generator state (greedy,
    temperature and min-p rows mixed, unseeded), and refuses rows it cannot choose alone."""
    from swiftlm.runner.sampler import drawn_on_device, sample_on_device

    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(2)) * 3
    mixes = [
        [SamplingParams(temperature=t, min_p=m) for t, m in ((0.0, 0.0), (0.7, 0.0), (1.3, 0.1), (0.0, 0.0),
                                                           (0.9, 0.0), (2.0, 0.05))],
        [SamplingParams(temperature=0.8) for _ in range(6)],
        [SamplingParams(temperature=0.0) for _ in range(6)],
    ]
    for params in mixes:
        rows = [make_row(p) for p in params]
        for r in rows:
            r.generator = None
        assert drawn_on_device(rows, logits.shape[1])
        for seed in range(20):
            torch.manual_seed(seed)
            want = Sampler()(logits, rows).token_ids
            torch.manual_seed(seed)
            assert sample_on_device(logits, rows).tolist() == want
    refused = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0.7, top_p=0.9),
               SamplingParams(temperature=0.7, logprobs=1), SamplingParams(temperature=0.0, logit_bias={3: 1.0})]
    for p in refused:
        row = make_row(p)
        row.generator = None
        assert not drawn_on_device([row], logits.shape[1])
    assert not drawn_on_device([make_row(SamplingParams(temperature=0.7, seed=3))], logits.shape[1])
