"""The engine's live requests: each request's sequences, and what each sequence has not reported yet.

A request of ``n`` sequences is one ``LiveRequest`` with ``n`` children (``core.request.Request``);
each child has an ``OutputStream`` of the token ids (and logprobs) made since its last report.
``collect`` turns the requests a step touched into ``RequestOutput`` deltas; a request leaves when
all its sequences have finished and been reported (``forget``). The counts ``num_serial`` and
``num_other_than_greedy`` are the engine's step-mode switches: while any live request needs its
previous token on the host, steps run serially; while every one is plain greedy, no sampling rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from swiftlm.core.outputs import CompletionOutput, RequestOutput
from swiftlm.core.request import Request
from swiftlm.runner.sampling_row import SamplingRow
from swiftlm.sampling import SamplingParams


@dataclass(slots=True)
class OutputStream:
    """Per-sequence output state: the tokens (and their logprobs) not reported yet."""

    request: Request
    parent_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[dict[int, float]] = field(default_factory=list)
    final_only: bool = False  # the request is reported once, at its end


@dataclass(slots=True)
class LiveRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]
    final_only: bool = False
    prompt_logprobs_sent: bool = False
    needs_host_tokens: bool = False  # its steps run serially (``needs_host_tokens``)
    plain_greedy: bool = False  # every token is the plain argmax (``plain_greedy``)
    plain_draw: bool = False  # every token the argmax or a draw at its temperature (``plain_draw``)


class LiveRequests:
    def __init__(self) -> None:
        self._requests: dict[str, LiveRequest] = {}
        self._streams: dict[int, OutputStream] = {}  # id(sequence) -> its stream
        self.num_serial = 0  # live requests whose steps must run serially
        self.num_other_than_greedy = 0  # live requests not plain greedy
        self.num_other_than_drawn = 0  # live requests not plain greedy or plain drawn

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def __bool__(self) -> bool:
        return bool(self._requests)

    def get(self, request_id: str) -> LiveRequest | None:
        return self._requests.get(request_id)

    def all(self) -> list[LiveRequest]:
        return list(self._requests.values())

    def sequences(self) -> list[Request]:
        return [child for live in self._requests.values() for child in live.children]

    def add(self, live: LiveRequest, stream_final_only: bool) -> None:
        """``stream_final_only``: its sequences report only at the end (the request's own
        ``final_only`` unless the front end must watch its text for stop strings)."""
        self._requests[live.request_id] = live
        for child in live.children:
            self._streams[id(child)] = OutputStream(child, live.request_id, final_only=stream_final_only)
        self.num_serial += live.needs_host_tokens
        self.num_other_than_greedy += not live.plain_greedy
        self.num_other_than_drawn += not live.plain_draw

    def stream(self, sequence: Request) -> OutputStream:
        return self._streams[id(sequence)]

    def collect(self, touched: Iterable[Request]) -> list[RequestOutput]:
        """One output delta for each request with news among the sequences a step touched."""
        by_parent: dict[str, list[Request]] = {}
        for request in touched:
            stream = self._streams.get(id(request))
            if stream is not None and (request.is_finished or not stream.final_only):  # else nothing to say yet
                by_parent.setdefault(stream.parent_id, []).append(request)
        outputs = []
        for parent_id, children in by_parent.items():
            live = self._requests.get(parent_id)
            if live is None:
                continue
            if live.final_only:
                if not all(c.is_finished for c in live.children):
                    continue  # tokens keep accumulating in the streams until the end
                children = live.children
            outputs.append(self.emit(live, children))
        return outputs

    def emit(self, live: LiveRequest, children: list[Request]) -> RequestOutput:
        """The delta of ``children`` (sequences of ``live``) since their last report; the request
        leaves once every sequence has finished."""
        completions = []
        for child in children:
            stream = self._streams[id(child)]
            logprobs = child.sampling_params.logprobs is not None
            completions.append(
                CompletionOutput(
                    index=child.index,
                    text="",
                    token_ids=stream.new_token_ids,
                    cumulative_logprob=child.cumulative_logprob if logprobs else None,
                    logprobs=stream.new_logprobs if logprobs else None,
                    finish_reason=child.finish_reason.value if child.finish_reason else None,
                    stop_reason=child.stop_reason,
                )
            )
            stream.new_token_ids, stream.new_logprobs = [], []
        finished = all(c.is_finished for c in live.children)
        lead = live.children[0]
        prompt_logprobs = None
        if not live.prompt_logprobs_sent and lead.prompt_logprobs is not None and not lead.needs_prompt_logprobs:
            prompt_logprobs, live.prompt_logprobs_sent = lead.prompt_logprobs, True
        error = next((c.error for c in children if c.error), None)
        if finished:
            self.forget(live)
        return RequestOutput(
            request_id=live.request_id,
            prompt=live.prompt,
            prompt_token_ids=live.prompt_token_ids,
            outputs=completions,
            finished=finished,
            num_cached_tokens=max(0, lead.num_cached_tokens),
            metrics=lead.metrics,
            error=error,
            prompt_logprobs=prompt_logprobs,
        )

    def forget(self, live: LiveRequest) -> None:
        """A request whose sequences have all finished leaves the engine."""
        del self._requests[live.request_id]
        self.num_serial -= live.needs_host_tokens
        self.num_other_than_greedy -= not live.plain_greedy
        self.num_other_than_drawn -= not live.plain_draw
        for c in live.children:
            self._streams.pop(id(c), None)


def plain_greedy(params: SamplingParams, budgeted: bool) -> bool:
    """Whether every token of a request is its logits' plain argmax (``runner.sampler.plain_greedy``
    for all its steps): greedy, and nothing that bans, forces, biases, penalises or reports."""
    return (params.greedy and not params.logit_bias and params.logprobs is None and params.min_tokens == 0
            and params.structured_outputs is None and not budgeted and params.repetition_penalty == 1.0
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0)


def plain_draw(params: SamplingParams, budgeted: bool) -> bool:
    """Whether every token of a request is its logits' argmax (greedy) or one draw after temperature
    and min-p alone (``runner.sampler.drawn_on_device`` for all its steps, with no top-k or top-p):
    unseeded, and nothing that bans, forces, biases, penalises, constrains or reports."""
    return ((params.greedy or (params.seed is None and params.top_k <= 0 and params.top_p >= 1.0))
            and not params.logit_bias and params.logprobs is None and params.min_tokens == 0
            and params.structured_outputs is None and not budgeted and params.repetition_penalty == 1.0
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0)


def needs_host_tokens(params: SamplingParams, budgeted: bool) -> bool:
    """Whether a request's next step needs its previous token on the host to be formed, so steps
    cannot overlap while it runs: a grammar (the next mask), penalties (the tokens so far), a
    thinking budget (forced tokens), prompt logprobs (which rows a recompute scores).
    Speculation turns overlap off for the whole engine (drafts come from the tokens)."""
    return (params.structured_outputs is not None or budgeted or params.prompt_logprobs is not None
            or params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


def sampling_row(request: Request) -> SamplingRow:
    """A live request's sampling row at this step: EOS banned until ``min_tokens`` (unless a grammar
    decides the end), the end of thinking forced once a thinking budget is spent (its start too if
    nothing was thought), the grammar while no token is forced."""
    params = request.sampling_params
    banned: tuple[int, ...] = ()
    constrained = request.grammar_active
    if request.num_output_tokens + request.num_pending < params.min_tokens and not constrained:  # the grammar says when to end
        banned = tuple(request.eos_token_ids)
    if request.thinking and not request.thinking_closed and not request.forced_tokens:
        budget = params.thinking_budget or 0
        if request.num_output_tokens >= budget:
            opened = request.num_output_tokens > 0
            request.forced_tokens.extend(request.think_end_ids if opened else
                                         (*request.think_start_ids, *request.think_end_ids))
    forced = request.forced_tokens.popleft() if request.forced_tokens else None
    return SamplingRow(params, request.prompt_token_ids, request.output_token_ids, request.generator,
                       banned_token_ids=banned, forced_token_id=forced,
                       grammar=request.grammar if constrained and forced is None else None)

