"""The output processor: the engine's token ids -> the caller's text, the same however the tokens
arrive (one a step, several a step, or past a stop string the engine had not seen)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import CompletionOutput, RequestOutput
from swiftlm.frontend.output_processor import OutputProcessor, RequestText
from swiftlm.sampling import SamplingParams

PIECES = {1: "He", 2: "llo", 3: " wor", 4: "ld", 5: "!", 6: " Bye", 7: "\n", 9: "<eos>"}
EOS = 9


class PieceTokenizer:
    """Each id is one piece of text; the EOS id is special (left out unless asked for)."""

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return "".join(PIECES[i] for i in ids if not (skip_special_tokens and i == EOS))


def engine_outputs(tokens: list[int], split: list[int], finish: str | None, stop_reason=None,
                   n: int = 1) -> list[RequestOutput]:
    """What the engine reports for ``tokens`` in steps of ``split`` tokens, the last one finished."""
    outs, at = [], 0
    for k, size in enumerate(split):
        last = k == len(split) - 1
        chunk = tokens[at:at + size]
        at += size
        seqs = [CompletionOutput(index=i, text="", token_ids=list(chunk),
                                 logprobs=[{t: -0.5 * t} for t in chunk],
                                 finish_reason=finish if last else None, stop_reason=stop_reason if last else None)
                for i in range(n)]
        outs.append(RequestOutput("r", None, [7], seqs, finished=last))
    return outs


def read(params: SamplingParams, outs: list[RequestOutput], final_only: bool = False):
    text = RequestText(GenerationRequest("r", [7], params, final_only=final_only), PieceTokenizer())
    got, stops = [], []
    for out in outs:
        o, s = text.process(out)
        stops.extend(s)
        if o is not None:
            got.append(o)
        if text.finished:
            break
    seq = {}
    for o in got:
        for c in o.outputs:
            acc = seq.setdefault(c.index, {"text": "", "ids": [], "lp": [], "finish": None, "reason": None})
            acc["text"] += c.text
            acc["ids"] += c.token_ids
            acc["lp"] += c.logprobs or []
            acc["finish"], acc["reason"] = c.finish_reason, c.stop_reason
    return seq, stops, got


@pytest.mark.parametrize("split", [[1] * 8, [3, 3, 2], [8]])
def test_a_stop_string_cuts_the_same_wherever_the_steps_split(split: list[int]) -> None:
    """The stop string " wor" completes on token 3: text "Hello", ids [1, 2, 3]; the tokens the
    engine made after it are dropped, and the engine is told to stop at 3 tokens."""
    params = SamplingParams(stop=["wor"], logprobs=0, max_tokens=8)
    seq, stops, got = read(params, engine_outputs([1, 2, 3, 4, 5, 6, 7, 6], split, "length"))
    assert seq[0] == {"text": "Hello ", "ids": [1, 2, 3], "lp": [{1: -0.5}, {2: -1.0}, {3: -1.5}],
                      "finish": "stop", "reason": "wor"}
    assert got[-1].finished and got[-1].outputs[0].cumulative_logprob == -3.0
    assert [(s.index, s.num_output_tokens, s.stop_reason) for s in stops] == [(0, 3, "wor")]


@pytest.mark.parametrize("split", [[1] * 6, [2, 4], [6]])
@pytest.mark.parametrize("final_only", [False, True])
def test_the_eos_token_is_reported_not_decoded(split: list[int], final_only: bool) -> None:
    params = SamplingParams(skip_special_tokens=False)
    seq, stops, got = read(params, engine_outputs([1, 2, 3, 4, 5, EOS], split, "stop", EOS), final_only)
    assert seq[0]["text"] == "Hello world!" and seq[0]["ids"][-1] == EOS and seq[0]["reason"] == EOS
    assert stops == [] and (len(got) == 1) == (final_only or len(split) == 1)


def test_a_whole_answer_with_n_2_is_one_output_once_both_end() -> None:
    params = SamplingParams(n=2, stop=["!"])
    seq, stops, got = read(params, engine_outputs([1, 2, 5, 6], [1, 1, 1, 1], "length", n=2), final_only=True)
    assert len(got) == 1 and got[0].finished
    assert [seq[i]["text"] for i in (0, 1)] == ["Hello", "Hello"]
    assert [(s.index, s.num_output_tokens) for s in stops] == [(0, 3), (1, 3)]


def test_the_processor_forgets_a_request_it_ended() -> None:
    proc = OutputProcessor(PieceTokenizer())
    proc.add(GenerationRequest("r", [7], SamplingParams(stop=["llo"])))
    outs = engine_outputs([1, 2, 3, 4], [1, 1, 1, 1], "length")
    texts, stops = proc.process(outs[:2])
    assert [t.finished for t in texts] == [False, True] and len(stops) == 1
    assert proc.process(outs[2:]) == ([], [])  # what the engine made after the stop: dropped
