"""Choosing one token per sampled row: temperature, top-k, top-p, min-p, then one inverse-transform
draw (``draw``), vectorised over the rows. ``runner.sampler`` calls ``sample_rows`` on its processed
logits (bias, bans, grammar masks and penalties applied).

Rows with top-k or top-p choose among candidate tokens, found without sorting the vocabulary where
that gives the same distribution: top-k rows take their k largest logits; top-p rows without a
top-k look for their nucleus among the ``NUCLEUS_CANDIDATES`` largest first and fall back to the
whole vocabulary only when those do not hold it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from swiftlm.runner.sampling_row import SamplingRow
from swiftlm.runner.top_logits import largest

_NUCLEUS_CANDIDATES = (1024, 32768)  # top-p-only rows look for their nucleus among these many tokens
_NUCLEUS_MARGIN = 1e-4  # rounding allowance when deciding that those tokens hold the nucleus


def column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """One value per row as an [R, 1] tensor with ``like``'s dtype and device."""
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)


def rows_of(x: torch.Tensor, index: Sequence[int]) -> torch.Tensor:
    """``x[index]`` for ascending row indices; ``x`` itself when that is every row. The result
    may alias ``x``: callers never modify it in place."""
    if len(index) == x.shape[0]:
        return x
    return x[torch.tensor(index, device=x.device)]


def sample_rows(x: torch.Tensor, rows: Sequence[SamplingRow], index: Sequence[int]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then one draw for each row in ``index`` (ascending) of
    the processed logits ``x`` [B, V]. Returns [len(index)] token ids.

    Rows with top-k or top-p sample among candidate tokens, in a canonical order (logit
    descending, then token id ascending) that does not depend on the batch, even with equal
    logits; the other rows sample over the whole vocabulary in token id order.
    """
    vocab = x.shape[1]
    truncated = [0 < rows[i].params.top_k < vocab or rows[i].params.top_p < 1.0 for i in index]
    tokens = torch.empty(len(index), dtype=torch.long, device=x.device)  # [S]
    for want in (True, False):
        group = [j for j in range(len(index)) if truncated[j] == want]
        if group:
            group_index = [index[j] for j in group]
            sample = _sample_candidates if want else _sample_vocabulary
            tokens[torch.tensor(group, device=x.device)] = sample(
                rows_of(x, group_index), [rows[i] for i in group_index]
            )
    return tokens


def _sample_vocabulary(x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Rows without top-k / top-p. ``x`` [R, V] is not modified; returns [R] token ids."""
    values = x / column([r.params.temperature for r in rows], x)  # [R, V]
    apply_min_p(values, rows)
    return draw(values, rows)


def _sample_candidates(x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Rows with top-k and / or top-p. ``x`` [R, V] is not modified; returns [R] token ids.

    Candidates are the tokens whose logit is >= a threshold: the k-th largest logit for top-k
    rows (ties at the k-th are all kept, as in vLLM), else a logit high enough for the
    candidates to hold the row's nucleus (see ``_nucleus_threshold``).
    """
    temperature = column([r.params.temperature for r in rows], x)  # [R, 1]
    top_p = column([r.params.top_p for r in rows], x)  # [R, 1]
    values, ids, counts, log_total = _all_candidates(x, rows, temperature, top_p)  # [R, M] ...
    values.div_(temperature)
    if bool((top_p < 1.0).any()):
        # Keep the smallest prefix whose mass reaches top_p (the first token: mass_before 0). The
        # mass is renormalised over the top-k candidates, or taken over the whole row without top-k.
        log_norm = values.logsumexp(dim=-1, keepdim=True)  # [R, 1]
        log_norm = torch.where(torch.isnan(log_total), log_norm, log_total)
        probs = (values - log_norm).exp()  # [R, M]
        mass_before = probs.cumsum(dim=-1) - probs  # [R, M]: mass of the candidates before each
        values.masked_fill_((mass_before >= top_p) & (top_p < 1.0), -math.inf)  # rounding: keep top_p 1
    apply_min_p(values, rows)
    return ids.gather(1, draw(values, rows).unsqueeze(1)).squeeze(1)


def _all_candidates(
    x: torch.Tensor, rows: Sequence[SamplingRow], temperature: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, list[int], torch.Tensor]:
    """Every row's candidates: values and ids [R, M] in canonical order (value descending, id
    ascending; padded with -inf and id 0), each row's count, and [R, 1] the log of the whole
    row's mass after temperature for top-p-only rows (NaN for top-k rows). Top-k rows come from
    ``_top_k_candidates`` where it can; the rest from a threshold scan of their logits."""
    n, vocab, device = x.shape[0], x.shape[1], x.device
    by_k = [j for j, r in enumerate(rows) if 0 < r.params.top_k < vocab]
    fast, fast_values, fast_ids = _top_k_candidates(x, rows, by_k)
    settled = set(fast)
    scanned = [j for j in range(n) if j not in settled]  # tied top-k rows and top-p-only rows
    log_total = torch.full((n, 1), math.nan, dtype=x.dtype, device=device)  # [R, 1]
    counts = [rows[j].params.top_k for j in range(n)]
    parts = [(fast, fast_values, fast_ids)]
    if scanned:
        sub = rows_of(x, scanned)  # [S, V]
        threshold = torch.empty(len(scanned), 1, dtype=x.dtype, device=device)  # [S, 1]
        tied = [i for i, j in enumerate(scanned) if 0 < rows[j].params.top_k < vocab]
        only_p = [i for i, j in enumerate(scanned) if not 0 < rows[j].params.top_k < vocab]
        if tied:
            k = torch.tensor([rows[scanned[i]].params.top_k for i in tied], device=device).unsqueeze(
                1
            )  # [T, 1]
            threshold[torch.tensor(tied, device=device)] = largest(sub, tied, int(k.max()))[0].gather(
                1, k - 1
            )
        if only_p:
            q = torch.tensor(only_p, device=device)
            r = torch.tensor([scanned[i] for i in only_p], device=device)
            threshold[q], log_total[r] = _nucleus_threshold(rows_of(sub, only_p), temperature[r], top_p[r])
        # A row with fewer than k finite logits (a grammar mask, bans) takes only those as
        # candidates, not its whole vocabulary of -inf.
        threshold.clamp_min_(torch.finfo(x.dtype).min)
        sub_values, sub_ids, sub_counts = _candidates(sub, threshold)  # [S, M'] each
        parts.append((scanned, sub_values, sub_ids))
        for j, c in zip(scanned, sub_counts, strict=True):
            counts[j] = c
    width = max(part_values.shape[1] for index, part_values, _ in parts if index)
    values = torch.full((n, width), -math.inf, dtype=x.dtype, device=device)  # [R, M]
    ids = torch.zeros(n, width, dtype=torch.long, device=device)  # [R, M]
    for index, part_values, part_ids in parts:
        if index:
            at = torch.tensor(index, device=device)
            values[at, : part_values.shape[1]] = part_values
            ids[at, : part_ids.shape[1]] = part_ids
    return values, ids, counts, log_total


def _top_k_candidates(
    x: torch.Tensor, rows: Sequence[SamplingRow], index: Sequence[int]
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """For top-k rows ``index`` of ``x`` [R, V]: the candidates of those whose k-th logit is finite
    and above the next (no tie runs past k), taken from their k + 1 largest logits (~1 ms for 16
    rows of 152k, against ~8 ms for topk and a scan of every logit). Returns those rows and their
    candidates as ``_candidates`` gives them: values and ids [F, K] in canonical order (value
    descending, id ascending; past each row's k: -inf, id 0)."""
    device = x.device
    if not index:
        return [], x.new_empty(0, 1), torch.zeros(0, 1, dtype=torch.long, device=device)
    ks = [rows[j].params.top_k for j in index]
    width = max(ks) + 1  # <= V: every row has top_k < V
    top_values, top_ids = largest(x, index, width)  # [G, W], descending
    k = torch.tensor(ks, device=device).unsqueeze(1)  # [G, 1]
    kth = top_values.gather(1, k - 1)  # [G, 1]
    clean = ((top_values.gather(1, k) < kth) & torch.isfinite(kth)).squeeze(1).tolist()  # [G]
    keep = [g for g, c in enumerate(clean) if c]
    if not keep:
        return [], x.new_empty(0, 1), torch.zeros(0, 1, dtype=torch.long, device=device)
    at = torch.tensor(keep, device=device)
    k, columns = k[at], torch.arange(width - 1, device=device)  # [F, 1], [K]
    values = top_values[at, :-1].masked_fill(columns >= k, -math.inf)  # [F, K]
    ids = top_ids[at, :-1].masked_fill(columns >= k, 0)  # [F, K]
    # Canonical order: ids ascending, then a stable sort by value descending.
    ids, by_id = ids.sort(dim=-1)
    values, order = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
    return [index[g] for g in keep], values, ids.gather(1, order)


def _nucleus_threshold(
    x: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For top-p rows without top-k, [R, V]: a logit threshold [R, 1] whose candidates hold each
    row's nucleus, and log of the row's total mass after temperature [R, 1]. The threshold is
    the n-th largest logit for the first n in ``_NUCLEUS_CANDIDATES`` whose n largest tokens hold
    top_p of the mass, else -inf (the whole row: a full sort, for near-uniform rows only)."""
    vocab, device = x.shape[1], x.device
    log_total = (x / temperature).logsumexp(dim=-1, keepdim=True)  # [R, 1]
    threshold = torch.full_like(log_total, -math.inf)  # [R, 1]
    todo = torch.arange(x.shape[0], device=device)  # rows whose nucleus is not yet bracketed
    for n in _NUCLEUS_CANDIDATES:
        if n >= vocab or todo.numel() == 0:
            break
        largest = x[todo].topk(n, dim=-1).values  # [T, n], descending
        held = (largest / temperature[todo] - log_total[todo]).exp().sum(dim=-1)  # [T]
        found = held >= top_p[todo].squeeze(1) + _NUCLEUS_MARGIN  # [T]
        threshold[todo[found]] = largest[found, -1:]
        todo = todo[~found]
    return threshold, log_total


def _candidates(x: torch.Tensor, threshold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Tokens with ``x >= threshold`` per row, as values and ids [R, M] in canonical order
    (value descending, id ascending; padded with -inf), and each row's count."""
    n, device = x.shape[0], x.device
    if bool((threshold <= torch.finfo(x.dtype).min).all()):  # whole rows (nuclei no bounded top-k held)
        counts = (x >= threshold).sum(dim=-1).tolist()  # the finite logits: -inf ones sort last, as padding
        values, ids = x.sort(dim=-1, descending=True, stable=True)  # ties keep ascending ids
        return values, ids, counts
    row, token = (x >= threshold).nonzero(as_tuple=True)  # [C] each, ids ascending within a row
    counts = torch.bincount(row, minlength=n)  # [R]
    # Slot of each kept token within its row: its index minus where its row starts.
    slot = torch.arange(token.numel(), device=device) - (counts.cumsum(0) - counts)[row]  # [C]
    width = max(int(counts.max()), 1)  # a row with every logit -inf has no candidate: it picks id 0
    values = torch.full((n, width), -math.inf, dtype=x.dtype, device=device)  # [R, M]
    ids = torch.zeros(n, width, dtype=torch.long, device=device)  # [R, M]
    values[row, slot] = x[row, token]
    ids[row, slot] = token
    values, order = values.sort(dim=-1, descending=True, stable=True)  # ties keep ascending ids
    return values, ids.gather(1, order), counts.tolist()


def apply_min_p(values: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Drop tokens whose probability is below min_p times the largest, in place on [R, W]."""
    min_p = [r.params.min_p for r in rows]
    if any(m > 0.0 for m in min_p):
        # prob < min_p * max_prob  <=>  logit < max_logit + log(min_p); log(0) = -inf keeps all.
        log_min_p = column(min_p, values).log()  # [R, 1]
        values.masked_fill_(values < values.amax(dim=-1, keepdim=True) + log_min_p, -math.inf)


def _draw_uniform(out: torch.Tensor, generator: torch.Generator | None) -> None:
    """``out`` filled with U[0, 1) draws from ``generator`` (None: torch's default RNG). A request's
    generator lives on the host (requests are built before any device is known): over device logits
    the draws are made there and copied, so a seed gives the same draws, and the same tokens for the
    same logits, on every device."""
    if generator is None or generator.device.type == out.device.type:
        out.uniform_(generator=generator)
    else:
        out.copy_(torch.empty(out.shape, dtype=out.dtype).uniform_(generator=generator))


def draw(values: torch.Tensor, rows: Sequence[SamplingRow], wait: bool = True) -> torch.Tensor:
    """One draw per row by inverse transform: column c of ``values`` [R, W] (unnormalised
    log-probabilities, -inf for columns out of the running) with probability p_c. Each row takes one
    uniform u (from its own generator when seeded) and the first column whose cumulative mass, in
    column order, exceeds u times the row's total: one exp and one cumulative sum over the row, and
    one random number, where a race of exponentials needs a random number and two logarithms per
    column. A row with no finite value picks column 0. ``wait=False``: the rare rounding case is
    resolved without reading anything back from the device (a pass more, always). Modifies
    ``values``; returns [R]."""
    n, width = values.shape
    top = values.amax(dim=-1, keepdim=True)  # [R, 1]
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row of -inf: no NaN below
    cdf = values.sub_(top).exp_().cumsum_(dim=-1)  # [R, W]: running mass, flat over the columns out of it
    uniform = torch.empty(n, 1, dtype=values.dtype, device=values.device)  # [R, 1]
    if all(r.generator is None for r in rows):
        uniform.uniform_()
    else:
        for j, row in enumerate(rows):  # a seeded row draws one number a step, in any batch
            _draw_uniform(uniform[j], row.generator)
            if row.on_draw is not None:
                row.on_draw()
    total = cdf[:, -1:]  # [R, 1]
    chosen = torch.searchsorted(cdf, uniform * total, right=True).squeeze(1)  # [R]: first column with cdf > u * total
    if not wait or bool((chosen >= width).any()):  # u * total rounded up to the total: the last column with mass
        last = width - 1 - (cdf.diff(dim=-1, prepend=torch.zeros_like(total)) > 0).flip(-1).int().argmax(dim=-1)
        last = torch.where(total.squeeze(1) > 0, last, torch.zeros_like(last))
        chosen = torch.where(chosen < width, chosen, last)
    return chosen
