"""Speculative decoding without a model: the config, the n-gram proposer, the accept/resample rule
(chi-square against the standard rule's distribution), the seeded-generator rewind, auto-off."""

from __future__ import annotations

import pytest
import torch

from swiftlm.config import ConfigError, SpeculativeConfig
from swiftlm.core.request import Request, RequestStatus
from swiftlm.engine.speculation import NgramIndex, Speculator
from swiftlm.runner.sampler import Sampler, SamplingRow
from swiftlm.runner.spec_verify import GeneratorRewind, accepted_length
from swiftlm.sampling import SamplingParams


def chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """The p-value of Pearson's chi-square statistic (categories with expected count > 0)."""
    keep = expected > 0
    assert float(observed[~keep].sum()) == 0, "a category the rule gives probability 0 was observed"
    o, e = observed[keep].double(), expected[keep].double()
    stat = float(((o - e) ** 2 / e).sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


# -- the config --------------------------------------------------------------------------------
def test_config_defaults_follow_vllm() -> None:
    both = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert both is not None and (both.prompt_lookup_min, both.prompt_lookup_max) == (5, 5)
    only_max = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert only_max is not None and (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (4, 4)
    older = SpeculativeConfig.parse({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 2})
    assert older is not None and older.method == "ngram" and older.prompt_lookup_max == 2
    assert SpeculativeConfig.parse(None) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"method": "eagle", "num_speculative_tokens": 3}', "'eagle' is not supported; swiftlm supports 'ngram'"),
        ('{"method": "ngram"}', "needs num_speculative_tokens"),
        ('{"num_speculative_tokens": 3}', 'needs a "method"'),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be in [1, 16]"),
        ('{"method": "ngram", "num_speculative_tokens": "3"}', "must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         "prompt_lookup_min (4) must be >= 1 and at most prompt_lookup_max (2)"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_mx": 2}', "unknown speculative config keys"),
        ('{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3}', "draft models are not supported"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "min_acceptance_rate": 2}', "min_acceptance_rate"),
        ("[3]", "must be a JSON object"),
        ("{not json", "--speculative-config must be a JSON object"),
    ],
)
def test_bad_configs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.parse(spec)
    assert message in str(info.value)


# -- the proposer ------------------------------------------------------------------------------
def test_ngram_index_proposes_what_followed_the_latest_longest_match() -> None:
    index = NgramIndex(1, 3)
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7]
    # suffix (2, 6, 7) never occurred before; (6, 7) did, latest at 6..7: followed by 2, 6, 7
    assert index.propose(tokens, 3) == [2, 6, 7]
    tokens.append(8)  # the suffix (6, 7, 8) occurred at 1..3: followed by 9, 1, 6
    assert index.propose(tokens, 3) == [9, 1, 6]
    assert index.propose(tokens + [42], 3) == []  # 42 never occurred
    assert NgramIndex(2, 2).propose([1, 2, 3, 1], 2) == []  # only a 1-gram matches, below the minimum


def test_a_repeating_tail_repeats_in_the_proposal() -> None:
    assert NgramIndex(1, 2).propose([3, 4, 4, 4], 4) == [4, 4, 4, 4]
    assert NgramIndex(2, 2).propose([1, 2, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]


def _request(prompt: list[int], **params) -> Request:
    r = Request("r", prompt, SamplingParams(**params), arrival_time=0.0, eos_token_ids=frozenset({99}))
    r.status = RequestStatus.RUNNING
    r.num_computed_tokens = len(prompt) - 1
    return r


def test_drafts_are_cut_at_eos_and_at_the_length_limits() -> None:
    spec = Speculator(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=2), 64)
    r = _request([1, 2, 99, 5, 6, 1, 2], max_tokens=10)
    spec.propose([r])
    assert r.draft_token_ids == [99]  # what followed (1, 2) is EOS: the request would end there
    r = _request([1, 2, 3, 4, 5, 6, 1, 2], max_tokens=3)
    spec.propose([r])
    assert r.draft_token_ids == [3, 4]  # 2 drafts + the token after them = max_tokens
    r = _request([1, 2, 3, 4, 5, 6, 1, 2], num_speculative_tokens=1)
    spec.propose([r])
    assert r.draft_token_ids == [3]
    r = _request([1, 2, 3, 4, 5, 6, 1, 2], num_speculative_tokens=0)
    spec.propose([r])
    assert r.draft_token_ids == []
    r = _request(list(range(60)) + [0, 1], max_tokens=None)  # context window 64: 62 tokens, 1 draft
    spec.propose([r])
    assert r.draft_token_ids == [2]


def test_low_acceptance_pauses_proposals_with_a_growing_backoff() -> None:
    cfg = SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=1,
                            acceptance_window=3, backoff_steps=4, min_acceptance_rate=0.5)
    spec = Speculator(cfg, 1000)
    r = _request([1, 2, 1], max_tokens=None)
    proposed = []
    for _ in range(30):
        spec.propose([r])
        proposed.append(bool(r.draft_token_ids))
        if r.draft_token_ids:
            spec.verify(r, r.draft_token_ids, [0] * (len(r.draft_token_ids) + 1))  # every draft rejected
    # 3 proposals, a pause of 4 steps (the last proposing one counted), 3 more, a pause 4x as long
    # (16), 3 more, then 64
    pattern = "".join("P" if p else "." for p in proposed)
    assert pattern == "PPP" + "." * 3 + "PPP" + "." * 15 + "PPP" + "." * 3
    assert spec.stats.num_drafts == sum(proposed) and spec.stats.num_accepted_tokens == 0


def test_acceptance_that_does_not_pay_for_its_steps_pauses_proposals() -> None:
    """Half the drafts accepted (2 tokens a verifying step) passes the rate floor, but when a
    verifying step costs 2.5 plain ones the window fails after 2 proposals; at a cost of 1.5 it goes on."""
    cfg = SpeculativeConfig(num_speculative_tokens=2, prompt_lookup_min=1, prompt_lookup_max=1,
                            acceptance_window=3, backoff_steps=4, min_acceptance_rate=0.2)
    for cost, paused in ((2.5, True), (1.5, False)):
        spec = Speculator(cfg, 1000)
        assert spec.verify_cost(1) is None  # nothing measured: only the rate floor applies
        spec.observe_step(1, 0.010, verified=False)
        spec.observe_step(1, 0.010 * cost, verified=True)
        assert spec.verify_cost(1) == pytest.approx(cost) and spec.verify_cost(2) is None
        r = _request([1, 2, 1], max_tokens=None)
        proposed = []
        for _ in range(6):
            spec.propose([r])
            proposed.append(bool(r.draft_token_ids))
            if r.draft_token_ids:  # the first draft accepted, the second not
                d = r.draft_token_ids
                spec.verify(r, d, [d[0], -1, -1][: len(d) + 1], batch=1)
        assert proposed[:2] == [True] * 2
        assert (not any(proposed[2:5])) if paused else all(proposed[2:6])


def test_acceptance_counts_by_position() -> None:
    spec = Speculator(SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1), 100)
    r = _request([1, 2])
    assert spec.verify(r, (5, 6, 7), [5, 6, 0, 9]) == 2
    assert spec.verify(r, (5, 6, 7), [5, 6, 7, 9]) == 3
    assert spec.verify(r, (5,), [4, 9]) == 0
    s = spec.stats
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 7, 5)
    assert s.accepted_per_position == [2, 2, 1]


# -- the accept / resample rule ----------------------------------------------------------------
def test_accepted_length() -> None:
    assert accepted_length([4], []) == 0
    assert accepted_length([1, 2, 3], [1, 2]) == 2
    assert accepted_length([1, 5, 3], [1, 2]) == 1
    assert accepted_length([7, 2, 3], [1, 2]) == 0


def _processed(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The distribution the sampler draws from: temperature, then the top-k tokens renormalised."""
    x = logits / temperature
    kth = x.topk(top_k).values[-1]
    return torch.where(x >= kth, x, torch.tensor(-float("inf"))).softmax(-1)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_k=6), SamplingParams(temperature=1.3, top_k=10)])
def test_sampled_verification_has_the_standard_rule_distribution(params: SamplingParams) -> None:
    """Two draft tokens d1, d2 with a fixed p at each row: the emitted (first, second) pairs must
    follow the point-mass rule: accept d1 with p0(d1), else a token from p0 without d1,
    renormalised; after an accepted d1 the same at row 1 (accepting d2 also emits the bonus row,
    not tracked here)."""
    vocab, n = 12, 30_000
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, vocab, generator=g) * 1.5
    d1, d2 = int(logits[0].argmax()), int(logits[1].topk(2).indices[1])  # a likely and a less likely draft
    p0, p1 = (_processed(logits[j], params.temperature, params.top_k) for j in range(2))
    rows = [SamplingRow(params, [1], [], None) for _ in range(2 * n)]
    tokens = Sampler()(logits.repeat(n, 1), rows).token_ids  # [2 n]: rows 2 i and 2 i + 1 are trial i
    observed = torch.zeros(vocab + 1, vocab)  # [first emitted, second emitted or "none" (index vocab)]
    for i in range(n):
        sampled = tokens[2 * i : 2 * i + 2] + [0]  # the bonus row's token does not matter here
        a = accepted_length(sampled, [d1, d2])
        emitted = sampled[: a + 1]
        if a == 0:
            observed[vocab, emitted[0]] += 1
        else:
            observed[emitted[1] if a == 1 else d2, emitted[0]] += 1
    # the standard rule with q a point mass: residual (p - q)+ renormalised
    residual0 = p0.clone()
    residual0[d1] = 0
    residual0 /= residual0.sum()
    expected = torch.zeros(vocab + 1, vocab)
    expected[vocab] = (1 - p0[d1]) * residual0 * n  # rejected at row 0
    residual1 = p1.clone()
    residual1[d2] = 0
    residual1 /= residual1.sum()
    expected[:vocab, d1] = p0[d1] * (1 - p1[d2]) * residual1 * n  # accepted d1, rejected d2
    expected[d2, d1] += p0[d1] * p1[d2] * n  # both accepted
    assert chi_square_p(observed.flatten(), expected.flatten()) > 1e-3


def test_rewind_gives_back_the_draws_of_rejected_rows() -> None:
    """Rows sharing a seeded generator, then a rewind to row a: the generator is where drawing rows
    0..a alone would have left it, and those rows drew the same tokens."""
    params = SamplingParams(temperature=1.0, top_k=8, seed=3)
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    plain = torch.Generator().manual_seed(3)
    alone = [Sampler()(logits[j : j + 1], [SamplingRow(params, [], [], plain)]).token_ids[0] for j in range(2)]
    shared = torch.Generator().manual_seed(3)
    rewind = GeneratorRewind(shared)
    rows = [SamplingRow(params, [], [], shared, on_draw=rewind.hook(j)) for j in range(4)]
    together = Sampler()(logits, rows).token_ids
    assert together[:2] == alone
    rewind.rewind(1)
    assert torch.equal(shared.get_state(), plain.get_state())


# -- the edges: the serve flag, the metrics ----------------------------------------------------
def test_serve_flag_reaches_the_engine_config(capsys: pytest.CaptureFixture[str]) -> None:
    from swiftlm.cli import build_configs, build_parser, main

    flag = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
    engine, _ = build_configs(build_parser().parse_args(["serve", "m", "--speculative-config", flag]))
    assert engine.speculative == SpeculativeConfig(3, prompt_lookup_max=4, prompt_lookup_min=2)
    assert build_configs(build_parser().parse_args(["serve", "m"]))[0].speculative is None
    assert main(["serve", "m", "--speculative-config", '{"method": "medusa", "num_speculative_tokens": 3}']) == 2
    assert "'medusa' is not supported; swiftlm supports 'ngram'" in capsys.readouterr().err


def test_metrics_expose_the_speculation_counters() -> None:
    from swiftlm.engine.engine import EngineStats
    from swiftlm.server.operations.metrics import ServerMetrics

    stats = EngineStats(1, 0, 0.1, 0, 0, 0, 0, 0, spec_num_drafts=4, spec_num_draft_tokens=12,
                        spec_num_accepted_tokens=7, spec_accepted_per_position=(4, 2, 1))
    text = ServerMetrics("m", lambda: stats).render().decode()
    for line in ('swiftlm:spec_decode_num_drafts_total{model_name="m"} 4.0',
                 'swiftlm:spec_decode_num_draft_tokens_total{model_name="m"} 12.0',
                 'swiftlm:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0',
                 'swiftlm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0'):
        assert line in text, text


def test_the_request_field_reaches_the_sampling_params() -> None:
    from swiftlm.server.completions.chat_protocol import ChatCompletionRequest
    from swiftlm.server.completions.request_mapping import sampling_params_from_chat

    def mapped(body: dict) -> int | None:
        req = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})
        return sampling_params_from_chat(req, 16, None).num_speculative_tokens

    assert mapped({}) is None
    assert mapped({"num_speculative_tokens": 0}) == 0
    assert mapped({"extra_body": {"num_speculative_tokens": 2}}) == 2
    with pytest.raises(ValueError):
        mapped({"num_speculative_tokens": -1})


def _decoding(scheduler, kv, n: int, prompt_len: int = 6) -> list[Request]:
    """``n`` requests admitted, prefilled and given one output token (the engine's update)."""
    from swiftlm.core.schedule import SchedulerOutput

    requests = [Request(f"r{i}", list(range(10 * i, 10 * i + prompt_len)), SamplingParams(max_tokens=50), 0.0)
                for i in range(n)]
    for r in requests:
        scheduler.add_request(r)
    plan: SchedulerOutput = scheduler.schedule()
    assert [s.num_new_tokens for s in plan.scheduled] == [prompt_len] * n
    for s in plan.scheduled:
        s.request.num_computed_tokens += s.num_new_tokens
        s.request.append_output(1)
    return requests


def test_draft_rows_share_the_budget_after_one_token_for_every_decode() -> None:
    from swiftlm.cache.kv_manager import KVCacheManager
    from swiftlm.config import SchedulerConfig
    from swiftlm.engine.scheduler import Scheduler

    kv = KVCacheManager(64, 4)
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=8), kv)
    requests = _decoding(scheduler, kv, 3, prompt_len=2)
    for r in requests:
        r.draft_token_ids = [7, 8, 9, 10]
    plan = scheduler.schedule()
    # r0: 1 + 4 drafts (room 8 - 1 - 2 kept for the others); r1: 1 + 1 of the 3 left; r2: its token
    assert [(s.num_new_tokens, s.draft_token_ids) for s in plan.scheduled] == [(1, (7, 8, 9, 10)), (1, (7,)), (1, ())]
    assert plan.num_tokens == 8
    assert all(len(s.request.block_ids) * 4 >= s.request.num_computed_tokens + s.num_rows for s in plan.scheduled)


def test_drafts_never_take_blocks_that_are_not_free() -> None:
    from swiftlm.cache.kv_manager import KVCacheManager
    from swiftlm.config import SchedulerConfig
    from swiftlm.engine.scheduler import Scheduler

    kv = KVCacheManager(5, 4)  # 4 usable blocks: two requests of 7 tokens hold 2 each, none left
    scheduler = Scheduler(SchedulerConfig(), kv)
    requests = _decoding(scheduler, kv, 2)
    for r in requests:
        r.draft_token_ids = [7, 8, 9]
    plan = scheduler.schedule()
    assert [s.draft_token_ids for s in plan.scheduled] == [(), ()] and not plan.preempted
