"""One row of a sampling step: the request's parameters, tokens and constraints at this step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from swiftlm.runner.structured import GrammarState
from swiftlm.sampling import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    """One row of the batch: one request at this step.

    ``generator`` is the request's own generator when ``params.seed`` is set (a host generator:
    over device logits its draws are made on the host and copied). A sampled step draws one uniform from it (one inverse-transform draw), a greedy or forced
    step none, whatever else is in the batch.
    ``banned_token_ids`` get logit -inf (the engine uses it for EOS while ``min_tokens`` is not
    reached). ``forced_token_id`` is returned as the token, with its logprob under the processed
    logits. ``grammar``: the request's structured-output state; tokens it does not allow get
    logit -inf (before temperature, top-k, top-p). Rows without one cost nothing. ``on_draw``,
    if set, is called each time the row has drawn from ``generator`` (speculative decoding uses it
    to rewind a seeded generator past the rows it rejects).
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None
    banned_token_ids: Sequence[int] = ()
    forced_token_id: int | None = None
    grammar: GrammarState | None = None
    on_draw: Callable[[], None] | None = None


class PlainRows(Sequence[SamplingRow]):
    """The rows of requests that sample as they stand (nothing banned, forced or constrained: a
    step where every live request is plain greedy or plain drawn), built only if read: such a
    step's tokens are mostly chosen without reading its rows (``Backend.greedy_pick``,
    ``Backend.draw_tokens``). ``requests``: the sampling requests in row order (the list may be
    filled after this is made)."""

    __slots__ = ("_requests",)

    def __init__(self, requests: list) -> None:
        self._requests = requests

    def __len__(self) -> int:
        return len(self._requests)

    def params(self) -> list[SamplingParams]:
        """Each row's sampling parameters, without building the rows."""
        return [r.sampling_params for r in self._requests]

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._requests)))]
        r = self._requests[index]
        return SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids, r.generator)
