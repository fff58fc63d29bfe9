"""Sampler: turns one step's logits into one token per request, vectorised over the batch.

Pipeline for a batch of B rows over a vocabulary of V tokens (each stage runs only on the rows
that need it, and is skipped entirely when no row does):

    logits [B, V]
      -> + logit_bias, banned ids -> -inf, tokens a row's grammar does not allow -> -inf
      -> repetition penalty (prompt + output tokens), frequency / presence penalty (output tokens)
      == processed logits                      -> logprobs = log_softmax(processed)  (rows that ask)
      -> greedy rows: argmax
      -> sampled rows: / temperature -> top-k -> top-p -> min-p -> one inverse-transform draw (per-row seeds)
      -> forced rows: the forced id

Grammar rows skip the mask where that cannot change their result (``runner.grammar_rows``):
greedy and temperature-only rows choose from the unmasked logits and check the token against the
grammar (~1 us); only a refused row gets its mask (~0.05-1.3 ms a row) and chooses again. Top-k
rows keep only their first k allowed tokens when those are among their 4 k largest logits.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from swiftlm.runner.grammar_rows import (
    capped_by_top_k,
    checked_after,
    greedy_among_candidates,
    narrow_top_k_rows,
)
from swiftlm.runner.sampling_row import SamplingRow
from swiftlm.runner.structured import (
    allowed_ids,
    apply_grammars,
    fill_bitmasks,
    grammar_penalty,
)
from swiftlm.runner.top_logits import largest

_NUCLEUS_CANDIDATES = (1024, 32768)  # top-p-only rows look for their nucleus among these many tokens
_NUCLEUS_MARGIN = 1e-4  # rounding allowance when deciding that those tokens hold the nucleus
_SPARSE_MASK_WORDS = (
    1024  # a refused greedy row whose mask has at most this many nonzero words unpacks only those
)


@dataclass(slots=True)
class SamplerOutput:
    """``logprobs[i]`` is NaN and ``top_logprobs[i]`` is None for rows whose ``params.logprobs``
    is None; both fields are None when no row asked."""

    token_ids: list[int]  # [B]
    logprobs: list[float] | None  # [B]
    top_logprobs: list[list[tuple[int, float]] | None] | None  # [B] x k


class Sampler:
    """Chooses one token per row.

    Logprob semantics: the logprobs returned (sampled token and top-k) are
    ``log_softmax`` of the *processed* logits, i.e. after logit_bias, banned ids and the
    repetition / frequency / presence penalties, but *before* temperature, top-k, top-p and
    min-p. They therefore do not depend on the sampling temperature or truncation, greedy and
    sampled rows report on the same scale, and a banned token's logprob is -inf.

    Top-k keeps every token tied with the k-th largest logit (as vLLM); greedy ties go to the
    lowest token id. Seeded rows draw their randomness only from their own generator, over
    candidates in an order fixed by their own logits (logit descending, then id ascending), so a
    seeded request yields the same tokens alone or in any batch, even with tied bf16 logits.
    Rows without a generator draw from torch's default RNG.

    Grammar rows: the token is drawn from the grammar-masked logits. Rows without logprobs do it
    without the mask where they can. Greedy rows and rows sampled without top-k / top-p choose
    from the unmasked logits and keep the token if the grammar allows it (for min-p rows: it and
    the row's most likely token); else a greedy row takes the best allowed of its next 16
    candidates, and failing that, the mask is applied and the row chooses again. Greedy: the
    result is the masked argmax, ties included. Sampled: keeping an allowed draw and else drawing
    from the masked distribution is rejection sampling, whose result has exactly the masked
    distribution (min-p's set restricted to the allowed tokens is the masked row's min-p set when
    the most likely token is allowed). Top-k rows (k <= 64) look for the first k allowed tokens
    among their 4 k largest logits and keep only those: the masked row has the same candidates
    and logits, so the same token, seeded draws included; rows where that fails are masked
    first. Top-p-only rows are always masked first.
    """

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        batch, vocab = logits.shape  # [B, V]
        if batch != len(rows):
            raise ValueError(f"logits have {batch} rows but {len(rows)} sampling rows were given")
        device = logits.device
        checked = [i for i, r in enumerate(rows) if checked_after(r)]
        capped = [i for i, r in enumerate(rows) if capped_by_top_k(r)]
        x = _process_logits(logits, rows, checked + capped)  # [B, V] float32; a copy if anything was applied
        if capped and (outside := narrow_top_k_rows(x, rows, capped)):  # x: a copy, narrowed in place
            apply_grammars(
                x, outside, [g for i in outside if (g := rows[i].grammar) is not None]
            )  # x: a copy

        greedy = [i for i, r in enumerate(rows) if r.forced_token_id is None and r.params.greedy]
        sampled = [i for i, r in enumerate(rows) if r.forced_token_id is None and not r.params.greedy]
        forced = [i for i, r in enumerate(rows) if r.forced_token_id is not None]

        if len(greedy) == batch:  # fast path: the all-greedy batch is one argmax
            tokens = x.max(dim=-1).indices  # [B]; max is ~3x faster than argmax on CPU, same ties
        else:
            tokens = torch.empty(batch, dtype=torch.long, device=device)  # [B]
            if greedy:
                tokens[torch.tensor(greedy, device=device)] = _rows_of(x, greedy).max(dim=-1).indices
            if sampled:
                tokens[torch.tensor(sampled, device=device)] = _sample(x, rows, sampled)
            if forced:
                forced_ids = [t for r in rows if (t := r.forced_token_id) is not None]
                if not all(0 <= t < vocab for t in forced_ids):
                    raise ValueError(f"forced token ids {forced_ids} must be in [0, {vocab})")
                tokens[torch.tensor(forced, device=device)] = torch.tensor(forced_ids, device=device)

        token_ids: list[int] = tokens.tolist()
        if checked:
            _enforce_grammars(x, rows, checked, token_ids)  # checked rows want no logprobs: tokens stays
        logprobs, top_logprobs = _logprobs(x, rows, tokens)
        return SamplerOutput(token_ids=token_ids, logprobs=logprobs, top_logprobs=top_logprobs)


def plain_greedy(rows: Sequence[SamplingRow]) -> bool:
    """Whether every row's token is the plain argmax of its logits (the lowest id on ties) and nothing
    else is asked: greedy, not forced, no grammar, logit bias, banned ids, penalty or logprobs. Such a
    step may take a backend's one-pass pick (``Backend.greedy_pick``) instead of the sampler."""
    return all(
        r.params.greedy and r.forced_token_id is None and r.grammar is None and not r.params.logit_bias
        and not r.banned_token_ids and not _has_penalty(r) and r.params.logprobs is None
        for r in rows
    )


def drawn_on_device(rows: Sequence[SamplingRow], vocab: int) -> bool:
    """Whether ``sample_on_device`` can choose every row: greedy, or temperature (and min-p) alone,
    unseeded, with nothing that bans, forces, biases, penalises, constrains or reports."""
    return all(
        r.forced_token_id is None and r.grammar is None and not r.params.logit_bias and not r.banned_token_ids
        and not _has_penalty(r) and r.params.logprobs is None
        and (r.params.greedy or (r.generator is None and not 0 < r.params.top_k < vocab and r.params.top_p >= 1.0))
        for r in rows
    )


def sample_on_device(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """[B] the tokens ``Sampler`` chooses for rows that ``drawn_on_device`` allows, the same draws
    from the same generator state, without reading anything back from the device: a GPU can take
    the next step before this one's tokens reach the host."""
    x = logits.float()  # [B, V]
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    if len(greedy) == len(rows):
        return x.max(dim=-1).indices
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    tokens = torch.empty(len(rows), dtype=torch.long, device=x.device)  # [B]
    if greedy:
        tokens[torch.tensor(greedy, device=x.device)] = _rows_of(x, greedy).max(dim=-1).indices
    sub = [rows[i] for i in sampled]
    values = _rows_of(x, sampled) / _column([r.params.temperature for r in sub], x)  # [S, V]
    _apply_min_p(values, sub)
    wait = x.device.type == "cpu"  # a CPU's values are on the host already: the check costs nothing there
    tokens[torch.tensor(sampled, device=x.device)] = _draw(values, sub, wait=wait)
    return tokens


def _enforce_grammars(
    x: torch.Tensor, rows: Sequence[SamplingRow], checked: Sequence[int], token_ids: list[int]
) -> None:
    """For rows ``checked`` of the unmasked processed logits ``x`` [B, V]: keep ``token_ids[i]``
    when row i's grammar allows it (and, for sampled min-p rows, its most likely token), else
    choose again under the grammar's mask, writing the new id into ``token_ids``."""
    refused = []
    for i in checked:
        grammar, params = rows[i].grammar, rows[i].params
        assert grammar is not None  # checked_after
        ok = grammar.allows(token_ids[i])
        if ok and not params.greedy and params.min_p > 0.0:
            ok = grammar.allows(int(x[i].argmax()))
        if not ok:
            refused.append(i)
    if not refused:
        return
    greedy = [i for i in refused if rows[i].params.greedy]
    if greedy:
        unresolved = set(greedy_among_candidates(x, rows, greedy, token_ids))
        refused = [i for i in refused if i in unresolved or not rows[i].params.greedy]
    if refused:
        _choose_under_masks(x, rows, refused, token_ids)


def _choose_under_masks(
    x: torch.Tensor, rows: Sequence[SamplingRow], index: Sequence[int], token_ids: list[int]
) -> None:
    """Rows ``index`` (ascending) of ``x`` [B, V] choose their token again under their grammar's
    mask, written into ``token_ids``. A greedy row whose mask allows few tokens takes the largest
    logit among the allowed ids (ascending: ties go to the lowest id); the other rows add the
    mask's penalty to a copy of their logits and choose as before."""
    bitmask = fill_bitmasks([g for i in index if (g := rows[i].grammar) is not None], x.shape[1])  # [F, W]
    nonzero_words = (bitmask != 0).sum(dim=1).tolist()  # [F]
    dense = []
    for j, i in enumerate(index):
        if not (rows[i].params.greedy and nonzero_words[j] <= _SPARSE_MASK_WORDS):
            dense.append(j)
            continue
        ids = allowed_ids(bitmask[j], x.shape[1]).to(x.device)  # [A]
        token_ids[i] = int(ids[x[i, ids].max(dim=0).indices]) if ids.numel() else 0
    if not dense:
        return
    sub = [index[j] for j in dense]
    again = _rows_of(x, sub) + grammar_penalty(bitmask[dense].to(x.device), x.shape[1])  # [D, V]
    greedy = [j for j, i in enumerate(sub) if rows[i].params.greedy]
    sampled = [j for j, i in enumerate(sub) if not rows[i].params.greedy]
    chosen = torch.empty(len(sub), dtype=torch.long, device=x.device)  # [D]
    if greedy:
        chosen[torch.tensor(greedy, device=x.device)] = _rows_of(again, greedy).max(dim=-1).indices
    if sampled:
        chosen[torch.tensor(sampled, device=x.device)] = _sample(again, [rows[i] for i in sub], sampled)
    for i, t in zip(sub, chosen.tolist(), strict=True):
        token_ids[i] = t


def _process_logits(
    logits: torch.Tensor, rows: Sequence[SamplingRow], deferred: Sequence[int] = ()
) -> torch.Tensor:
    """Logit bias, bans, penalties and grammar masks (except for rows ``deferred``, whose grammar
    the caller handles), in float32. Returns ``logits`` itself when nothing applies and it is
    float32 already, else a copy (always a copy when a row has a grammar)."""
    vocab = logits.shape[1]
    device = logits.device
    bias = [(i, t, b) for i, r in enumerate(rows) for t, b in r.params.logit_bias.items()]
    bans = [(i, t) for i, r in enumerate(rows) for t in r.banned_token_ids]
    penalised = [i for i, r in enumerate(rows) if _has_penalty(r)]
    grammar_rows = [i for i, r in enumerate(rows) if r.grammar is not None and r.forced_token_id is None]
    skipped = set(deferred)
    constrained = [i for i in grammar_rows if i not in skipped]
    if not (bias or bans or penalised or grammar_rows):
        return logits.float()
    x = logits.to(torch.float32, copy=True)
    if bias:
        bad = [t for _, t, _ in bias if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"logit_bias token id {bad[0]} is outside the vocabulary of {vocab}")
        row_idx, tok_idx, values = zip(*bias, strict=True)
        x.index_put_(
            (torch.tensor(row_idx, device=device), torch.tensor(tok_idx, device=device)),
            torch.tensor(values, dtype=x.dtype, device=device),
            accumulate=True,
        )
    if bans:
        row_idx, tok_idx = zip(*bans, strict=True)
        x.index_put_(
            (torch.tensor(row_idx, device=device), torch.tensor(tok_idx, device=device)),
            torch.tensor(-math.inf, dtype=x.dtype, device=device),
        )
    if penalised:
        _apply_penalties(x, penalised, [rows[i] for i in penalised])
    if constrained:
        apply_grammars(x, constrained, [g for i in constrained if (g := rows[i].grammar) is not None])
    return x


def _has_penalty(row: SamplingRow) -> bool:
    """Whether a penalty is set and there is a token for it to act on."""
    p = row.params
    if p.repetition_penalty != 1.0 and (row.prompt_token_ids or row.output_token_ids):
        return True
    return (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and bool(row.output_token_ids)


def _apply_penalties(x: torch.Tensor, index: Sequence[int], rows: Sequence[SamplingRow]) -> None:
    """Repetition penalty over prompt + output tokens (HF / vLLM: positive logits are divided,
    others multiplied), then OpenAI frequency and presence penalties over output tokens, on
    rows ``index`` of ``x`` [B, V] in place. Only the tokens that occurred are read and written."""
    token_lists: list[list[int]] = []
    count_lists: list[list[int]] = []
    for row in rows:
        occurrences = Counter(row.output_token_ids)
        if row.params.repetition_penalty != 1.0:  # prompt-only tokens: repetition, count 0
            occurrences.update(dict.fromkeys(set(row.prompt_token_ids) - occurrences.keys(), 0))
        token_lists.append(list(occurrences.keys()))
        count_lists.append(list(occurrences.values()))
    # Pad each row by repeating its first token: a repeated token is written the same value twice.
    width = max(len(t) for t in token_lists)
    device, dtype = x.device, x.dtype
    ids = torch.tensor([t + t[:1] * (width - len(t)) for t in token_lists], device=device)  # [P, U]
    counts = torch.tensor([c + c[:1] * (width - len(c)) for c in count_lists], dtype=dtype, device=device)
    row_ids = torch.tensor(index, device=device).unsqueeze(1)  # [P, 1]

    repetition = _column([r.params.repetition_penalty for r in rows], x)  # [P, 1]
    frequency = _column([r.params.frequency_penalty for r in rows], x)  # [P, 1]
    presence = _column([r.params.presence_penalty for r in rows], x)  # [P, 1]
    logits = x[row_ids, ids]  # [P, U]
    logits = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits -= frequency * counts + presence * (counts > 0).to(dtype)
    x[row_ids, ids] = logits


def _column(values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
    """One value per row as an [R, 1] tensor with ``like``'s dtype and device."""
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)


def _rows_of(x: torch.Tensor, index: Sequence[int]) -> torch.Tensor:
    """``x[index]`` for ascending row indices; ``x`` itself when that is every row. The result
    may alias ``x``: callers never modify it in place."""
    if len(index) == x.shape[0]:
        return x
    return x[torch.tensor(index, device=x.device)]


def _sample(x: torch.Tensor, rows: Sequence[SamplingRow], index: Sequence[int]) -> torch.Tensor:
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
                _rows_of(x, group_index), [rows[i] for i in group_index]
            )
    return tokens


def _sample_vocabulary(x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Rows without top-k / top-p. ``x`` [R, V] is not modified; returns [R] token ids."""
    values = x / _column([r.params.temperature for r in rows], x)  # [R, V]
    _apply_min_p(values, rows)
    return _draw(values, rows)


def _sample_candidates(x: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Rows with top-k and / or top-p. ``x`` [R, V] is not modified; returns [R] token ids.

    Candidates are the tokens whose logit is >= a threshold: the k-th largest logit for top-k
    rows (ties at the k-th are all kept, as in vLLM), else a logit high enough for the
    candidates to hold the row's nucleus (see ``_nucleus_threshold``).
    """
    temperature = _column([r.params.temperature for r in rows], x)  # [R, 1]
    top_p = _column([r.params.top_p for r in rows], x)  # [R, 1]
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
    _apply_min_p(values, rows)
    return ids.gather(1, _draw(values, rows).unsqueeze(1)).squeeze(1)


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
        sub = _rows_of(x, scanned)  # [S, V]
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
            threshold[q], log_total[r] = _nucleus_threshold(_rows_of(sub, only_p), temperature[r], top_p[r])
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


def _apply_min_p(values: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Drop tokens whose probability is below min_p times the largest, in place on [R, W]."""
    min_p = [r.params.min_p for r in rows]
    if any(m > 0.0 for m in min_p):
        # prob < min_p * max_prob  <=>  logit < max_logit + log(min_p); log(0) = -inf keeps all.
        log_min_p = _column(min_p, values).log()  # [R, 1]
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


def _draw(values: torch.Tensor, rows: Sequence[SamplingRow], wait: bool = True) -> torch.Tensor:
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


def _logprobs(
    x: torch.Tensor, rows: Sequence[SamplingRow], tokens: torch.Tensor
) -> tuple[list[float] | None, list[list[tuple[int, float]] | None] | None]:
    """Sampled-token and top-k logprobs under the processed logits ``x`` [B, V], for rows that ask."""
    wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    if not wanted:
        return None, None
    logprobs = _rows_of(x, wanted).log_softmax(dim=-1)  # [W, V]
    chosen_ids = tokens[torch.tensor(wanted, device=x.device)].unsqueeze(1)  # [W, 1]
    chosen = logprobs.gather(1, chosen_ids).squeeze(1).tolist()  # [W]
    max_k = max(rows[i].params.logprobs or 0 for i in wanted)
    top_values: list[list[float]] = [[] for _ in wanted]
    top_ids: list[list[int]] = [[] for _ in wanted]
    if max_k > 0:
        top = logprobs.topk(max_k, dim=-1)  # [W, max_k], descending
        top_values, top_ids = top.values.tolist(), top.indices.tolist()

    sampled_lp: list[float] = [math.nan] * len(rows)
    top_lp: list[list[tuple[int, float]] | None] = [None] * len(rows)
    for j, i in enumerate(wanted):
        k = rows[i].params.logprobs or 0
        sampled_lp[i] = chosen[j]
        top_lp[i] = list(zip(top_ids[j][:k], top_values[j][:k], strict=True))
    return sampled_lp, top_lp
