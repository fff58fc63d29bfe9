"""The output processor: the engine's token ids in, the caller's text out.

The engine core reports token ids, logprobs and why a sequence ended (an EOS or stop token, a
length, a grammar, an abort); it never decodes text. This module does, on the caller's side of
the engine (``LLM``'s thread, or the event loop reading an ``AsyncEngine`` stream), so the engine's
loop thread spends nothing on detokenising or on stop strings:

- incremental detokenisation (``swiftlm.text.detokenizer``), token by token while the caller
  streams, in one decode at the end when it waits for the whole answer and has no stop strings;
- stop strings (``swiftlm.text.stop``): when one completes, the sequence's text and token ids are
  cut there and the caller tells the engine to end it at that many tokens (``SequenceStop``, which
  also trims the KV a session keeps to the tokens the client saw). The engine may have generated a
  few tokens past the stop meanwhile; they are dropped here;
- ``n > 1`` fan-out: each sequence keeps its own state; a request is finished when all are;
- whole answers (``final_only``): deltas accumulate until the request finishes, then one output.

What the caller reads is exactly what the engine read before it stopped detokenising: the same
text deltas, token ids, logprobs, finish and stop reasons, for any split of tokens into steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import CompletionOutput, RequestOutput, SequenceStop
from swiftlm.text.detokenizer import IncrementalDetokenizer
from swiftlm.text.stop import StopStringMatcher
from swiftlm.text.tokenizer import Tokenizer


@dataclass(slots=True)
class _SequenceText:
    """One sequence's text state and, for whole answers, what it has not reported yet."""

    detokenizer: IncrementalDetokenizer
    stops: StopStringMatcher | None
    ended: bool = False  # finished, as the caller sees it (the engine may still be running it)
    num_tokens: int = 0  # token ids accepted so far
    cumulative_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    new_text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_logprobs: list[dict[int, float]] = field(default_factory=list)


class RequestText:
    """The text side of one request: feed it the engine's outputs for the request, in order."""

    def __init__(self, request: GenerationRequest, tokenizer: Tokenizer) -> None:
        params = request.sampling_params
        self.request = request
        self.final_only = request.final_only
        # a whole answer with no stop string to watch is decoded once, at its end
        self._decode_at_end = request.final_only and not params.stop
        self._wants_logprobs = params.logprobs is not None
        self._seqs = [
            _SequenceText(
                IncrementalDetokenizer(tokenizer, request.prompt_token_ids, params.skip_special_tokens),
                StopStringMatcher(params.stop, params.include_stop_str_in_output) if params.stop else None,
            )
            for _ in range(params.n)
        ]
        # sequence 0's accepted token ids, where a session may need trimming to them (``_stop_of``)
        self._session_ids: list[int] | None = [] if request.session_id is not None else None
        self._prompt_logprobs: list[dict[int, float] | None] | None = None
        self._error: str | None = None
        self.finished = False

    def process(self, out: RequestOutput) -> tuple[RequestOutput | None, list[SequenceStop]]:
        """The caller's output for one engine output (None: nothing to report yet, e.g. a whole
        answer still running) and the sequences a stop string ended, which the caller must stop in
        the engine (``Engine.stop_sequence``) before it reports the finished request."""
        if self.finished:
            return None, []
        stops: list[SequenceStop] = []
        reported: list[int] = []
        for delta in out.outputs:
            seq = self._seqs[delta.index]
            if seq.ended:
                continue  # a stop string ended it: what the engine made after it is dropped
            kept = seq.num_tokens
            ended = self._take(seq, delta)
            if delta.index == 0 and self._session_ids is not None:
                self._session_ids.extend(delta.token_ids[:seq.num_tokens - kept])
            if ended:
                stops.append(self._stop_of(delta.index, seq))
            reported.append(delta.index)
        if out.prompt_logprobs is not None:
            self._prompt_logprobs = out.prompt_logprobs
        self._error = out.error or self._error
        self.finished = out.finished or all(s.ended for s in self._seqs)
        if self.final_only and not self.finished:
            return None, stops
        indices = range(len(self._seqs)) if self.final_only else reported
        completions = [self._report(i, self._seqs[i]) for i in indices]
        prompt_logprobs, self._prompt_logprobs = self._prompt_logprobs, None
        return RequestOutput(
            request_id=out.request_id, prompt=out.prompt, prompt_token_ids=out.prompt_token_ids,
            outputs=completions, finished=self.finished, num_cached_tokens=out.num_cached_tokens,
            metrics=out.metrics, error=self._error, extra=out.extra, prompt_logprobs=prompt_logprobs,
        ), stops

    def _take(self, seq: _SequenceText, delta: CompletionOutput) -> bool:
        """Accept a sequence's new tokens; True when a stop string ended it in them."""
        tokens = delta.token_ids
        # an EOS or stop token ends the sequence unread: it is reported, never decoded
        decoded = len(tokens) - (delta.finish_reason == "stop" and isinstance(delta.stop_reason, int))
        kept = len(tokens)
        stopped = False
        if self._decode_at_end:
            if decoded:
                seq.new_text += seq.detokenizer.add_tokens(tokens[:decoded])
        else:
            for j in range(decoded):
                text = seq.detokenizer.add(tokens[j])
                if seq.stops is not None:
                    text, stopped = seq.stops.feed(text)
                seq.new_text += text
                if stopped:
                    kept = j + 1
                    break
        new = tokens[:kept]
        seq.num_tokens += kept
        seq.new_token_ids.extend(new)
        if delta.logprobs is not None:
            chosen = delta.logprobs[:kept]
            seq.new_logprobs.extend(chosen)
            for token, logprobs in zip(new, chosen, strict=True):
                seq.cumulative_logprob += logprobs[token]
        if stopped:
            assert seq.stops is not None
            seq.ended, seq.finish_reason, seq.stop_reason = True, "stop", seq.stops.matched_stop
            return True
        if delta.finish_reason is not None:
            seq.ended, seq.finish_reason, seq.stop_reason = True, delta.finish_reason, delta.stop_reason
            if delta.finish_reason in ("stop", "length"):
                seq.new_text += self._final_text(seq)
        return False

    @staticmethod
    def _final_text(seq: _SequenceText) -> str:
        """What the detokenizer and the stop matcher still hold when a sequence ends by itself."""
        tail = seq.detokenizer.flush()
        stops = seq.stops
        if stops is None:
            return tail
        tail = stops.feed(tail)[0]
        return tail if stops.stopped else tail + stops.flush()

    def _stop_of(self, index: int, seq: _SequenceText) -> SequenceStop:
        request = self.request
        with_session = index == 0 and self._session_ids is not None
        return SequenceStop(
            request_id=request.request_id, index=index, num_output_tokens=seq.num_tokens,
            stop_reason=seq.stop_reason, session_id=request.session_id if with_session else None,
            token_ids=(*request.prompt_token_ids, *self._session_ids) if with_session else (),
        )

    def _report(self, index: int, seq: _SequenceText) -> CompletionOutput:
        out = CompletionOutput(
            index=index, text=seq.new_text, token_ids=seq.new_token_ids,
            cumulative_logprob=seq.cumulative_logprob if self._wants_logprobs else None,
            logprobs=seq.new_logprobs if self._wants_logprobs else None,
            finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
        )
        seq.new_text, seq.new_token_ids, seq.new_logprobs = "", [], []
        return out


class OutputProcessor:
    """``RequestText`` for many requests at once (``LLM``, which drives the engine itself)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._requests: dict[str, RequestText] = {}

    def add(self, request: GenerationRequest) -> None:
        self._requests[request.request_id] = RequestText(request, self.tokenizer)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def process(self, outputs: list[RequestOutput]) -> tuple[list[RequestOutput], list[SequenceStop]]:
        """The callers' outputs for one engine step's, and the sequences to stop in the engine."""
        texts: list[RequestOutput] = []
        stops: list[SequenceStop] = []
        for out in outputs:
            request = self._requests.get(out.request_id)
            if request is None:
                continue  # ended already (a stop string), or not this processor's
            text, ended = request.process(out)
            stops.extend(ended)
            if request.finished:
                del self._requests[out.request_id]
            if text is not None:
                texts.append(text)
        return texts, stops
