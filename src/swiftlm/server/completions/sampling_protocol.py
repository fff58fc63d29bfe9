"""What chat and legacy completions requests share: sampling, stopping, streaming, extensions
(``BaseSamplingRequest``), and the prompt logprobs either may ask for, in vLLM's shape.

The rules every request model follows (strict types, null as "not given", a nested ``extra_body``)
are ``swiftlm.server.protocol``'s.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field, StrictBool, StrictStr, model_validator

from swiftlm.server.protocol import Id, TokenId, _float, _int, _Request, _Response

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 4096  # each stop string: every generated token is checked against the tail of the text
MAX_LOGIT_BIAS = 2048  # entries of a logit_bias map (each is applied at every step)
MAX_TOP_LOGPROBS = 20


def _stop_list(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise ValueError("stop must be a string or a list of strings")
    return value


# A bare string or a list of up to 16 strings; always a list after validation.
Stop = Annotated[list[Annotated[StrictStr, Field(max_length=MAX_STOP_CHARS)]], BeforeValidator(_stop_list),
                 Field(max_length=MAX_STOP_STRINGS)]


class StreamOptions(_Request):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM: usage on every chunk


class BaseSamplingRequest(_Request):
    """Fields shared by chat and legacy completions: sampling, stopping, streaming, extensions.

    ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` left out fall back
    to the checkpoint's generation_config.json. ``top_k`` of -1 or 0 disables it.
    ``use_cache`` is accepted and changes nothing: prefix caching is always on and never changes
    results. ``clean_up_tokenization_spaces`` is accepted and changes nothing: Qwen3's tokenizer
    does not clean up spaces (its tokenizer_config says false), and swiftlm never does.
    ``best_of`` may be null, 1 or ``n`` (all of them the n samples returned); any other value is
    an error: vLLM's V1 engine dropped it, and swiftlm never generates samples it does not return.
    """

    reads_extra_body: ClassVar[bool] = True

    model: StrictStr | None = None
    n: _int(ge=1) = 1
    temperature: _float(ge=0.0, le=2.0) | None = None
    top_p: _float(gt=0.0, le=1.0) | None = None
    top_k: _int(ge=-1) | None = None
    min_p: _float(ge=0.0, le=1.0) | None = None
    repetition_penalty: _float(gt=0.0) | None = None
    presence_penalty: _float(ge=-2.0, le=2.0) = 0.0
    frequency_penalty: _float(ge=-2.0, le=2.0) = 0.0
    logit_bias: Annotated[dict[str, _float(ge=-100.0, le=100.0)], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    seed: _int(ge=-(2**63), le=2**64 - 1) | None = None
    max_tokens: _int(ge=1) | None = None
    max_new_tokens: _int(ge=1) | None = None  # extension: alias of max_tokens (HF's name)
    min_tokens: _int(ge=0) = 0
    stop: Stop = Field(default_factory=list)
    stop_token_ids: list[TokenId] = Field(default_factory=list)
    include_stop_str_in_output: StrictBool = False
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    stream: StrictBool = False
    stream_options: StreamOptions | None = None  # honoured only when stream is true
    user: StrictStr | None = None
    session_id: Id | None = None
    request_id: Id | None = None
    priority: _int(ge=-(2**31), le=2**31 - 1) = 0  # vLLM's: lower is served earlier (--scheduling-policy priority)
    use_cache: StrictBool | None = None
    cache: StrictBool | None = None  # false: not answered from, nor stored in, the response cache
    clean_up_tokenization_spaces: StrictBool | None = None
    best_of: _int(ge=1) | None = None
    prompt_logprobs: _int(ge=0, le=MAX_TOP_LOGPROBS) | None = None  # vLLM's: score the prompt too
    # swiftlm's, on a server started with --speculative-config: 0 turns speculation off for this
    # request, k caps its draft length at k (at most the server's); left out: the server's
    num_speculative_tokens: _int(ge=0) | None = None
    # structured output (swiftlm.server.completions.structured_mapping): vLLM's fields, llama.cpp's GBNF grammar
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None
    structured_outputs: dict[str, Any] | None = None
    grammar: StrictStr | None = None

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self) -> BaseSamplingRequest:
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs are not available with stream: true (as in vLLM); send stream: false")
        return self

    @model_validator(mode="after")
    def _best_of_is_n(self) -> BaseSamplingRequest:
        if self.best_of is not None and self.best_of not in (1, self.n):
            raise ValueError(
                f"best_of {self.best_of} is not supported (vLLM's V1 engine dropped it): leave it out, or set it "
                f"to n ({self.n}); to choose among samples, ask for n samples with logprobs and pick on the client"
            )
        return self


class PromptLogprob(_Response):
    """One token of a ``prompt_logprobs`` entry, as vLLM writes it (``rank``: 1 = most likely;
    null for a prompt token outside the top k, whose exact rank is not computed)."""

    logprob: float
    rank: int | None = None
    decoded_token: str


# vLLM's prompt_logprobs: per prompt token, None (the first) or {token id: PromptLogprob}
PromptLogprobs = list[dict[int, PromptLogprob] | None]
