"""Which grammar rows of a step can skip their grammar's mask, and the checks that let them.

A mask costs ~0.05-1.3 ms a row for Qwen3's vocabulary (most inside JSON strings); checking one
token against the grammar ~1 us. Each rule below gives exactly the token (or, for sampled rows,
exactly the distribution) that masking first would give; see ``Sampler``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from swiftlm.runner.sampling_row import SamplingRow
from swiftlm.runner.top_logits import largest

_GREEDY_CANDIDATES = 16  # a greedy grammar row whose argmax is refused checks this many next-best tokens
_TOP_K_CHECKED = 64  # sampled rows with a larger top-k are masked first


def checked_after(row: SamplingRow) -> bool:
    """Whether ``row``'s grammar can be checked on its chosen token instead of masking first
    (same result: see ``Sampler``): a grammar row, not forced, without logprobs (they are
    reported under the masked logits), greedy or sampled without top-k / top-p."""
    p = row.params
    if row.grammar is None or row.forced_token_id is not None or p.logprobs is not None:
        return False
    return p.greedy or (p.top_k <= 0 and p.top_p >= 1.0)


def capped_by_top_k(row: SamplingRow) -> bool:
    """Whether ``row`` is a sampled grammar row with top-k (k <= 64, no logprobs): its masked
    row's candidates are the first k allowed tokens in logit order, which ``narrow_top_k_rows``
    can often find without the mask."""
    p = row.params
    if row.grammar is None or row.forced_token_id is not None or p.logprobs is not None or p.greedy:
        return False
    return 0 < p.top_k <= _TOP_K_CHECKED


def narrow_top_k_rows(x: torch.Tensor, rows: Sequence[SamplingRow], index: Sequence[int]) -> list[int]:
    """Top-k rows ``index`` (ascending) of the processed logits ``x`` [B, V], in place: a row whose
    masked candidates are found among its ``4 k`` largest logits (walked in order, each checked
    against the grammar, until k are allowed) keeps only those candidates' logits (-inf elsewhere),
    untouched if they are its own top k. The masked row would have the same candidates with the
    same logits, so sampling gives the same token, seeded draws included. Returns the rows not
    settled so: they need their mask.

    Ties: the masked candidates are every allowed token whose logit is >= the k-th allowed one.
    All of them are among the walked logits when that logit is above the last walked one."""
    vocab = x.shape[1]
    ks = [min(rows[i].params.top_k, vocab) for i in index]
    width = min(4 * max(ks), vocab)
    values, ids = (t.tolist() for t in largest(x, index, width))
    unsettled = []
    for j, (i, k) in enumerate(zip(index, ks, strict=True)):
        grammar = rows[i].grammar
        assert grammar is not None  # capped_by_top_k
        allowed: list[int] = []  # positions in the walk
        for c in range(width):
            if len(allowed) >= k and values[j][c] < values[j][allowed[-1]]:
                break  # k allowed, and no tie with the k-th past here
            if grammar.allows(ids[j][c]):
                allowed.append(c)
        else:
            if len(allowed) < k or values[j][allowed[-1]] == values[j][width - 1]:
                unsettled.append(i)  # fewer than k allowed, or the k-th ties past the walk
                continue
        if allowed == list(range(len(allowed))) and (
            len(allowed) == width or values[j][len(allowed)] < values[j][k - 1]
        ):
            continue  # the row's own top-k (no tie past them) are allowed: nothing to change
        kept = torch.tensor([ids[j][c] for c in allowed], device=x.device)  # [k + ties]
        row_values = x[i, kept].clone()
        x[i].fill_(-math.inf)
        x[i, kept] = row_values
    return unsettled


def greedy_among_candidates(
    x: torch.Tensor, rows: Sequence[SamplingRow], index: Sequence[int], token_ids: list[int]
) -> list[int]:
    """For greedy grammar rows ``index`` whose argmax was refused: the masked argmax found among
    the row's ``_GREEDY_CANDIDATES`` largest logits, each checked against the grammar (~1 us),
    written into ``token_ids``. Returns the rows it could not settle: no candidate allowed, or
    the first allowed one ties with the last candidate (equal logits may continue past them)."""
    k = min(_GREEDY_CANDIDATES, x.shape[1])
    values, ids = (t.tolist() for t in largest(x, index, k))
    unresolved = []
    for j, i in enumerate(index):
        grammar = rows[i].grammar
        assert grammar is not None  # _checked_after
        first = next((c for c in range(k) if grammar.allows(ids[j][c])), None)
        if first is None or values[j][first] == values[j][k - 1]:
            unresolved.append(i)
            continue
        best = values[j][first]  # every token with this logit is among the candidates
        token_ids[i] = min(
            t
            for t, v in zip(ids[j][first:], values[j][first:], strict=True)
            if v == best and grammar.allows(t)
        )
    return unresolved
