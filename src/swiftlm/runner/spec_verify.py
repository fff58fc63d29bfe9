"""Verifying draft tokens: how many of a request's guessed tokens the model accepts, and what it emits.

A request with draft tokens d_1 .. d_k after its last token gets k + 1 sampled rows in one step:

    row j:      0        1         ...   k
    context:    tokens   + d_1     ...   + d_1 .. d_k
    samples:    t_0      t_1       ...   t_k          (t_j ~ p_j, the row's sampling distribution)

Each row is sampled exactly as plain decoding samples that position (temperature, top-k / top-p,
min-p, penalties over the output including d_1 .. d_j, logit bias, bans, grammar masks), so
p_j is plain decoding's distribution given that d_1 .. d_j were emitted.

The speculative-sampling rule accepts a draft token d ~ q with probability min(1, p(d) / q(d)) and
on rejection samples from (p - q)+, normalised. A prompt-lookup draft is deterministic: q is a
point mass on d, so the rule reads "accept with probability p(d); on rejection sample from p
with d removed, renormalised". Drawing t ~ p and accepting iff t == d is that rule exactly:
P(accept) = p(d), and given t != d, t is distributed as p restricted to the other tokens,
renormalised. So row j's sample is both the acceptance test of d_{j+1} and, when it fails, the
resampled token:

    accepted:  t_0 == d_1, ..., t_{a-1} == d_a, t_a != d_{a+1} (or a == k)
    emitted:   t_0 .. t_a  (a accepted drafts, then the correction, or the bonus token of row k)

Greedy rows (argmax) thus emit plain greedy decoding's tokens. A seeded row draws from the
request's generator in row order, as plain decoding would position by position, and
``GeneratorRewind`` sets the generator back to where the emitted rows left it: seeded requests
give plain decoding's tokens too (with structured outputs only the same distribution, since a
grammar row may draw again after the later rows drew).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def accepted_length(sampled: Sequence[int], drafts: Sequence[int]) -> int:
    """a: how many leading draft tokens equal the token sampled at the row before each. The
    request emits ``sampled[: a + 1]``. ``sampled``: [k + 1] token ids, ``drafts``: [k]."""
    assert len(sampled) == len(drafts) + 1, "one sampled row per draft token, and one more"
    a = 0
    while a < len(drafts) and sampled[a] == drafts[a]:
        a += 1
    return a


class GeneratorRewind:
    """A seeded request's rows share its generator: remembers its state after each row's draw
    (``hook(row)`` is that row's ``SamplingRow.on_draw``), so that ``rewind(a)`` can leave it
    after the last draw of an emitted row (0 .. a) and before any later one: the rejected rows'
    draws are given back, and the next step draws what plain decoding would."""

    __slots__ = ("generator", "_start", "_log")

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self._start = generator.get_state()
        self._log: list[tuple[int, torch.Tensor]] = []  # (row, state after its draw), in draw order

    def hook(self, row: int) -> Callable[[], None]:
        return lambda: self._log.append((row, self.generator.get_state()))

    def rewind(self, last_row: int) -> None:
        state = next((s for r, s in reversed(self._log) if r <= last_row), self._start)
        self.generator.set_state(state)
