"""From engine outputs to OpenAI response pieces: reasoning split, logprobs, usage."""

from __future__ import annotations

from collections.abc import Sequence

from swiftlm.core.outputs import CompletionOutput, RequestOutput
from swiftlm.server.completions.chat_protocol import ChoiceLogprobs, TokenLogprob, TopLogprob
from swiftlm.server.completions.completion_protocol import CompletionLogprobs
from swiftlm.server.completions.sampling_protocol import PromptLogprob, PromptLogprobs
from swiftlm.server.protocol import UsageInfo
from swiftlm.text.tokenizer import Tokenizer


def reasoning_token_count(token_ids: Sequence[int], thinking: bool, think_end_id: int | None) -> int:
    """Output tokens spent thinking: through ``</think>``, or all of them if it never closed."""
    if not thinking or think_end_id is None:
        return 0
    try:
        return token_ids.index(think_end_id) + 1
    except ValueError:
        return len(token_ids)


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def top_entries(step: dict[int, float], k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely tokens of a step (its dict holds the sampled token and the top k)."""
    return sorted(step.items(), key=lambda item: -item[1])[:k]


def chat_logprobs(tokenizer: Tokenizer, seq: CompletionOutput, k: int) -> ChoiceLogprobs | None:
    if seq.logprobs is None:
        return None
    content = []
    for token_id, step in zip(seq.token_ids, seq.logprobs, strict=False):
        top = [
            TopLogprob(token=(t := token_text(tokenizer, tid)), logprob=lp, bytes=list(t.encode()))
            for tid, lp in top_entries(step, k)
        ]
        text = token_text(tokenizer, token_id)
        content.append(TokenLogprob(token=text, logprob=step[token_id], bytes=list(text.encode()), top_logprobs=top))
    return ChoiceLogprobs(content=content)


def completion_logprobs(tokenizer: Tokenizer, seq: CompletionOutput, k: int, offset: int) -> CompletionLogprobs | None:
    if seq.logprobs is None:
        return None
    out = CompletionLogprobs()
    for token_id, step in zip(seq.token_ids, seq.logprobs, strict=False):
        text = token_text(tokenizer, token_id)
        out.tokens.append(text)
        out.token_logprobs.append(step[token_id])
        out.top_logprobs.append({token_text(tokenizer, t): lp for t, lp in top_entries(step, k)})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def echo_logprobs(
    tokenizer: Tokenizer, prompt_token_ids: Sequence[int], prompt_logprobs: Sequence[dict[int, float] | None], k: int
) -> CompletionLogprobs:
    """The prompt's part of an ``echo`` completion's legacy ``logprobs``: every prompt token, its
    logprob (null for the first: nothing predicts it) and the top ``k``; text offsets from 0, each
    token's text appended to the one before."""
    out = CompletionLogprobs()
    offset = 0
    for token_id, step in zip(prompt_token_ids, prompt_logprobs, strict=True):
        text = token_text(tokenizer, token_id)
        out.tokens.append(text)
        out.token_logprobs.append(None if step is None else step[token_id])
        out.top_logprobs.append(
            None if step is None else {token_text(tokenizer, t): lp for t, lp in top_entries(step, k)}
        )
        out.text_offset.append(offset)
        offset += len(text)
    return out


def join_logprobs(first: CompletionLogprobs, then: CompletionLogprobs | None) -> CompletionLogprobs:
    """``first``'s tokens followed by ``then``'s (the echoed prompt, then the completion)."""
    if then is None:
        return first
    return CompletionLogprobs(
        tokens=first.tokens + then.tokens,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        top_logprobs=first.top_logprobs + then.top_logprobs,
        text_offset=first.text_offset + then.text_offset,
    )


def vllm_prompt_logprobs(
    tokenizer: Tokenizer, prompt_token_ids: Sequence[int], prompt_logprobs: Sequence[dict[int, float] | None], k: int
) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs`` response field: per prompt token None (the first) or token id ->
    {logprob, rank, decoded_token} for the prompt token and the top ``k``. A rank is known for the
    top ``k`` only (a prompt token outside them has none)."""
    out: PromptLogprobs = []
    for token_id, step in zip(prompt_token_ids, prompt_logprobs, strict=True):
        if step is None:
            out.append(None)
            continue
        top = top_entries(step, k)
        ranks = {tid: r for r, (tid, _) in enumerate(top, start=1)}
        entry = {token_id: PromptLogprob(logprob=step[token_id], rank=ranks.get(token_id),
                                         decoded_token=token_text(tokenizer, token_id))}
        for tid, lp in top:
            entry.setdefault(tid, PromptLogprob(logprob=lp, rank=ranks[tid], decoded_token=token_text(tokenizer, tid)))
        out.append(entry)
    return out


def usage_of(out: RequestOutput, completion_tokens: int, reasoning_tokens: int = 0) -> UsageInfo:
    return UsageInfo.of(len(out.prompt_token_ids), completion_tokens, out.num_cached_tokens, reasoning_tokens)
