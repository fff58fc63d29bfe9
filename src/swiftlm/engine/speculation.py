"""Speculative decoding by prompt lookup: proposing draft tokens, and when a request stops proposing.

Before each step, every running request that decodes looks up its last n tokens (n from
``prompt_lookup_max`` down to ``prompt_lookup_min``) earlier in its own token stream (prompt and
output) and proposes the tokens that followed the latest such occurrence. The scheduler adds them
as extra query rows of the request (they count toward the token budget), the model computes
their KV and logits in the same forward, and ``runner.spec_verify`` decides how many are kept.

A draft is cut where the request could not go on: at its length limits (``max_tokens``, the
context window), after an end-of-sequence token, and where its grammar refuses a token or ends.
No draft (no match, or speculation off for the request) decodes one row as usual.

Acceptance is tracked per request: after every ``acceptance_window`` proposals, a rate of
accepted / proposed draft tokens below ``min_acceptance_rate`` pauses proposals for
``backoff_steps`` decode steps, four times longer on each consecutive failure (at most 16x), so a request
whose text does not repeat (or a model that disagrees with its drafts) soon decodes plainly.

The same pause follows when speculating does not pay for itself here: the engine reports how long
its decode steps take (``observe_step``), with and without drafts, per number of requests in the
step; a window whose tokens per verifying step (1 + accepted per proposal) fall short of how many
plain steps a verifying one costs is a failed window too, and it fails after 2 proposals already
(with every draft rejected, a 128-token request then verifies 4 drafts instead of 9: on a Zen3 VM
that took the cost from 5.2 % to none measurable, 1.003x, BENCHMARKS.md). On a CPU a verifying step leaves the
fused decode path (its rows attend as a chunk does), so on a small model it can cost 2-3 plain
steps: a modest acceptance rate that would pay on a GPU loses here, and this measures which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from swiftlm.config import SpeculativeConfig
from swiftlm.core.request import Request, RequestStatus
from swiftlm.runner.sampling_row import SamplingRow
from swiftlm.runner.spec_verify import GeneratorRewind, accepted_length

_MAX_BACKOFF_FACTOR = 16
_BACKOFF_GROWTH = 4  # each consecutive failed window multiplies the pause (up to _MAX_BACKOFF_FACTOR)
_EARLY_WINDOW = 2  # proposals after which a window that does not pay for its steps ends early
_COST_EMA = 0.2  # weight of a new step time in the running averages
_MAX_BATCH_KEY = 64  # step times are kept per number of requests in the step, up to this many


class NgramIndex:
    """For each n-gram (n in [low, high]) of a token stream, where the tokens after its latest
    occurrence start. Only occurrences followed by a token are indexed, so the stream's own
    suffix never matches itself. Updated incrementally as the stream grows."""

    __slots__ = ("low", "high", "_starts", "_indexed")

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self._starts: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before position _indexed - 1 are in _starts

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``tokens``: those after the latest earlier occurrence of its
        longest matching suffix. A continuation that runs into the end of the stream continues
        with the proposal itself (a repeating pattern repeats)."""
        end = len(tokens)
        # the n-grams ending at e = _indexed - 1 .. end - 2 (each followed by tokens[e + 1])
        for e in range(max(self._indexed - 1, 0), end - 1):
            for n in range(self.low, min(self.high, e + 1) + 1):
                self._starts[tuple(tokens[e - n + 1 : e + 1])] = e + 1
        self._indexed = end
        for n in range(min(self.high, end), self.low - 1, -1):
            start = self._starts.get(tuple(tokens[end - n :]))
            if start is not None:
                out: list[int] = []
                for i in range(k):  # position start + i of the stream followed by the proposal
                    p = start + i
                    out.append(tokens[p] if p < end else out[p - end])
                return out
        return []


@dataclass(slots=True)
class _RequestState:
    """One request's proposer: its n-gram index and its recent acceptance."""

    index: NgramIndex
    backoff: int
    steps: int = 0  # decode steps seen
    paused_until: int = 0
    window_proposals: int = 0
    window_drafted: int = 0
    window_accepted: int = 0
    rewind: GeneratorRewind | None = None  # this step's, for a seeded sampled request


@dataclass(slots=True)
class SpeculationStats:
    """Counters since start (vLLM's spec_decode metrics): verified drafts, their tokens, and the
    tokens accepted, also by position in the draft."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)


class Speculator:
    """The engine's prompt-lookup proposer and its per-request acceptance tracking."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.stats = SpeculationStats(accepted_per_position=[0] * config.num_speculative_tokens)
        # running averages of decode-step seconds by number of requests: without drafts, with some
        self._plain_s: dict[int, float] = {}
        self._verify_s: dict[int, float] = {}

    def observe_step(self, num_requests: int, seconds: float, verified: bool) -> None:
        """A decode step of ``num_requests`` requests (no prefill in it) took ``seconds``;
        ``verified``: some of them checked drafts."""
        key = min(num_requests, _MAX_BATCH_KEY)
        table = self._verify_s if verified else self._plain_s
        old = table.get(key)
        table[key] = seconds if old is None else old + _COST_EMA * (seconds - old)

    def verify_cost(self, num_requests: int) -> float | None:
        """How many plain decode steps a verifying step of ``num_requests`` requests costs, once
        both kinds have been seen (else None)."""
        key = min(num_requests, _MAX_BATCH_KEY)
        plain, verify = self._plain_s.get(key), self._verify_s.get(key)
        return verify / plain if plain and verify else None

    def propose(self, running: Sequence[Request]) -> None:
        """Set ``draft_token_ids`` of every running request for the coming step ([] for none)."""
        limit = self.config.disable_by_batch_size
        off = limit is not None and len(running) > limit
        for request in running:
            request.draft_token_ids = [] if off else self._propose(request)
        key = min(len(running), _MAX_BATCH_KEY)
        if key in self._verify_s and key not in self._plain_s:
            for request in running:  # one plain step at this batch size: a verifying step's cost is relative to it
                request.draft_token_ids = []

    def _propose(self, request: Request) -> list[int]:
        if request.status is not RequestStatus.RUNNING or request.num_tokens - request.num_computed_tokens != 1:
            return []  # prefilling: drafts only follow a request's last token
        k = self._draft_limit(request)
        if k <= 0:
            return []
        state = request.speculation
        if state is None:
            cfg = self.config
            state = request.speculation = _RequestState(
                NgramIndex(cfg.prompt_lookup_min or 1, cfg.prompt_lookup_max or 1), cfg.backoff_steps
            )
        state.steps += 1
        if state.steps < state.paused_until:
            return []
        drafts = state.index.propose(request.all_token_ids, k)
        for i, t in enumerate(drafts):
            if t in request.eos_token_ids:
                del drafts[i + 1 :]  # the request ends there
                break
        if drafts and request.grammar is not None:
            del drafts[request.grammar.valid_prefix(drafts) :]
        return drafts

    def _draft_limit(self, request: Request) -> int:
        """The most draft tokens this request may take now (0: none)."""
        params = request.sampling_params
        k = self.config.num_speculative_tokens
        if params.num_speculative_tokens is not None:
            k = min(k, params.num_speculative_tokens)
        if request.forced_tokens or (request.thinking and not request.thinking_closed):
            return 0  # tokens may be forced mid-draft (the thinking budget)
        if request.grammar is not None and not request.grammar_active:
            return 0  # the grammar starts after the reasoning: it cannot check drafts yet
        if params.max_tokens is not None:
            k = min(k, params.max_tokens - request.num_output_tokens - 1)
        return min(k, self.max_model_len - request.num_tokens - 1)

    def draft_rows(self, request: Request, first: SamplingRow, drafts: Sequence[int]) -> list[SamplingRow]:
        """The sampling rows of a request's draft positions, after ``first`` (its last real
        token's row, made by the engine): row j sees ``drafts[:j]`` as output already emitted."""
        params = request.sampling_params
        rewind = None
        if request.generator is not None and not params.greedy and first.forced_token_id is None:
            rewind = GeneratorRewind(request.generator)
            first.on_draw = rewind.hook(0)
        if request.speculation is not None:
            request.speculation.rewind = rewind
        rows = []
        for j in range(1, len(drafts) + 1):
            ahead = tuple(drafts[:j])
            early = request.num_output_tokens + j < params.min_tokens and not request.grammar_active
            rows.append(SamplingRow(
                params=params,
                prompt_token_ids=request.prompt_token_ids,
                output_token_ids=[*request.output_token_ids, *ahead],
                generator=request.generator,
                banned_token_ids=tuple(request.eos_token_ids) if early else (),
                grammar=first.grammar.ahead(ahead) if first.grammar is not None else None,
                on_draw=rewind.hook(j) if rewind is not None else None,
            ))
        return rows

    def verify(self, request: Request, drafts: Sequence[int], sampled: Sequence[int], batch: int = 1) -> int:
        """How many drafts the sampled rows accept (``spec_verify.accepted_length``); counts them,
        rewinds a seeded generator, and pauses the request's proposals if acceptance stays low or
        does not pay for the verifying steps of ``batch`` requests."""
        a = accepted_length(sampled, drafts)
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += len(drafts)
        stats.num_accepted_tokens += a
        for pos in range(a):
            stats.accepted_per_position[pos] += 1
        state = request.speculation
        if state is None:
            return a
        if state.rewind is not None:
            state.rewind.rewind(a)
            state.rewind = None
        state.window_proposals += 1
        state.window_drafted += len(drafts)
        state.window_accepted += a
        cost = self.verify_cost(batch)
        per_step = 1 + state.window_accepted / state.window_proposals  # tokens a verifying step emitted
        losing = cost is not None and per_step < cost
        # a window ends after acceptance_window proposals, or after _EARLY_WINDOW when it is losing
        if state.window_proposals >= self.config.acceptance_window or (losing and state.window_proposals >= _EARLY_WINDOW):
            base = self.config.backoff_steps
            if losing or state.window_accepted < self.config.min_acceptance_rate * state.window_drafted:
                state.paused_until = state.steps + state.backoff
                state.backoff = min(_BACKOFF_GROWTH * state.backoff, _MAX_BACKOFF_FACTOR * base)
            else:
                state.backoff = base
            state.window_proposals = state.window_drafted = state.window_accepted = 0
        return a
