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

import numpy as np
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
from swiftlm.runner.token_draw import apply_min_p, column, draw, rows_of, sample_rows
from swiftlm.sampling import SamplingParams

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
                tokens[torch.tensor(greedy, device=device)] = rows_of(x, greedy).max(dim=-1).indices
            if sampled:
                tokens[torch.tensor(sampled, device=device)] = sample_rows(x, rows, sampled)
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
        tokens[torch.tensor(greedy, device=x.device)] = rows_of(x, greedy).max(dim=-1).indices
    sub = [rows[i] for i in sampled]
    values = rows_of(x, sampled) / column([r.params.temperature for r in sub], x)  # [S, V]
    apply_min_p(values, sub)
    wait = x.device.type == "cpu"  # a CPU's values are on the host already: the check costs nothing there
    tokens[torch.tensor(sampled, device=x.device)] = draw(values, sub, wait=wait)
    return tokens


def draw_columns(params: Sequence[SamplingParams], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the rows' ``params``, rows that ``drawn_on_device`` allows, what ``Backend.draw_tokens``
    reads: temperature [B] (0: greedy), log(min_p) [B] (-inf: none) and one uniform [B] per sampled
    row, drawn from torch's default generator in row order as ``sample_on_device`` draws them
    (greedy rows: 0)."""
    temperatures = [0.0 if p.greedy else p.temperature for p in params]
    temperature = torch.from_numpy(np.array(temperatures, dtype=np.float32))  # numpy: ~5x faster than a list
    log_min_p = torch.from_numpy(np.array([p.min_p for p in params], dtype=np.float32)).log()
    sampled = [i for i, t in enumerate(temperatures) if t != 0.0]
    if len(sampled) == len(params):
        uniform = torch.rand(len(params), dtype=torch.float32)
    else:
        uniform = torch.zeros(len(params), dtype=torch.float32)
        if sampled:
            uniform[torch.tensor(sampled)] = torch.rand(len(sampled), dtype=torch.float32)
    return temperature.to(device), log_min_p.to(device), uniform.to(device)


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
    again = rows_of(x, sub) + grammar_penalty(bitmask[dense].to(x.device), x.shape[1])  # [D, V]
    greedy = [j for j, i in enumerate(sub) if rows[i].params.greedy]
    sampled = [j for j, i in enumerate(sub) if not rows[i].params.greedy]
    chosen = torch.empty(len(sub), dtype=torch.long, device=x.device)  # [D]
    if greedy:
        chosen[torch.tensor(greedy, device=x.device)] = rows_of(again, greedy).max(dim=-1).indices
    if sampled:
        chosen[torch.tensor(sampled, device=x.device)] = sample_rows(again, [rows[i] for i in sub], sampled)
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

    repetition = column([r.params.repetition_penalty for r in rows], x)  # [P, 1]
    frequency = column([r.params.frequency_penalty for r in rows], x)  # [P, 1]
    presence = column([r.params.presence_penalty for r in rows], x)  # [P, 1]
    logits = x[row_ids, ids]  # [P, U]
    logits = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits -= frequency * counts + presence * (counts > 0).to(dtype)
    x[row_ids, ids] = logits


def _logprobs(
    x: torch.Tensor, rows: Sequence[SamplingRow], tokens: torch.Tensor
) -> tuple[list[float] | None, list[list[tuple[int, float]] | None] | None]:
    """Sampled-token and top-k logprobs under the processed logits ``x`` [B, V], for rows that ask."""
    wanted = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
    if not wanted:
        return None, None
    logprobs = rows_of(x, wanted).log_softmax(dim=-1)  # [W, V]
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
