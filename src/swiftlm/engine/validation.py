"""Whether a request can ever run on this engine: the one check every front end's request passes,
once (``AsyncEngine.submit`` in the caller's thread, or ``Engine.add_request`` for ``LLM``).

Each refusal names the request field it is about (``param``) and, where OpenAI's API has one, its
error code, so the server answers the 400 a client of vLLM or OpenAI expects without checking the
same things again."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swiftlm.sampling import SamplingParams

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class RequestError(ValueError):
    """A request the engine refuses as given (the server answers 400 with ``param`` and ``code``).
    ``param`` "prompt" is the request's prompt, whatever the API calls it ("messages", "input")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The fixed facts of an engine a request is checked against."""

    vocab_size: int
    max_model_len: int
    block_size: int
    num_usable_blocks: int  # KV blocks in the pool
    speculative: bool = False  # speculative decoding is on


def validate_request(ids: Sequence[int], params: SamplingParams, limits: RequestLimits) -> None:
    """Raise RequestError if the request can never run within ``limits``."""
    if not ids:
        raise RequestError("the prompt is empty", param="prompt")
    vocab, max_len = limits.vocab_size, limits.max_model_len
    _check_ids(ids, vocab, "prompt")
    room = max_len - len(ids)
    if room <= 0:
        raise RequestError(
            f"the prompt has {len(ids)} tokens, which fills the context window of {max_len}; shorten it "
            "(at least one token must be left to generate)", param="prompt", code=CONTEXT_LENGTH_EXCEEDED,
        )
    if params.max_tokens is not None and params.max_tokens > room:
        raise RequestError(
            f"max_tokens {params.max_tokens} exceeds the context window of {max_len} minus the prompt's "
            f"{len(ids)} tokens; ask for at most {room}", param="max_tokens", code=CONTEXT_LENGTH_EXCEEDED,
        )
    need = -(-(len(ids) + (room if params.max_tokens is None else params.max_tokens)) // limits.block_size)
    if need > limits.num_usable_blocks:
        raise RequestError(
            f"the prompt and max_tokens need {need} KV blocks but the cache has only {limits.num_usable_blocks}; "
            "lower max_tokens or give the KV cache more memory", param="max_tokens",
        )
    _check_ids(params.stop_token_ids, vocab, "stop_token_ids")
    bad = next((t for t in params.logit_bias if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"logit_bias key {str(bad)!r} is outside the vocabulary; token ids run from 0 to {vocab - 1}",
                           param="logit_bias")
    if params.num_speculative_tokens and not limits.speculative:
        raise RequestError("num_speculative_tokens: speculative decoding is off in this engine (start it with "
                           "--speculative-config, or LLM(speculative_config=...))", param="num_speculative_tokens")


def _check_ids(token_ids: Iterable[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"{param} contains token id {bad}, outside the vocabulary of {vocab_size} tokens "
                           f"(ids 0 to {vocab_size - 1})", param=param)
