"""Overlapped steps (``async_scheduling``): the same tokens as serial steps, and the host preparing step
N+1 while step N runs on the device (proved from events, with a backend of fixed device time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from swiftlm import LLM, SamplingParams
from swiftlm.backends.fixed_time import FixedTimeBackend
from swiftlm.backends.torch import TorchBackend


def prompts(lengths: list[int], seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(0, 151643, (n,), generator=g).tolist()} for n in lengths]


def outputs(llm: LLM, batch: list[dict], params: SamplingParams | list[SamplingParams]) -> list[list[tuple]]:
    outs = llm.generate(batch, params, use_tqdm=False)
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs]


def assert_no_leaks(llm: LLM) -> None:
    report = llm.engine.kv_report()
    assert report.error is None and report.live_requests == 0
    assert report.blocks_free == report.blocks_usable - report.blocks_in_sessions


@pytest.fixture(scope="module")
def pair(tiny_tied_dir: Path) -> tuple[LLM, LLM]:
    kwargs = {"dtype": "float32", "max_num_seqs": 6, "max_num_batched_tokens": 48, "num_blocks": 40, "block_size": 8}
    return (LLM(str(tiny_tied_dir), async_scheduling=False, **kwargs),
            LLM(str(tiny_tied_dir), async_scheduling=True, **kwargs))


def test_overlap_is_on_where_asked(pair) -> None:
    serial, overlapped = pair
    assert not serial.engine.async_scheduling and overlapped.engine.async_scheduling


MIXES = {
    # greedy, lengths that end by max_tokens, by the context, by EOS (random weights: rare), chunked
    # prompts, more requests than seats and than blocks (preemption)
    "greedy": [SamplingParams(temperature=0.0, max_tokens=m) for m in (1, 2, 5, 9, 17, 30, 3, 12, 25, 40)],
    "seeded": [SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=s, max_tokens=20 + s, logprobs=2)
               for s in range(10)],
    "stops": [SamplingParams(temperature=0.0, max_tokens=24, stop=[" the", "a", "\n"], min_tokens=2)
              for _ in range(10)],
    "n": [SamplingParams(temperature=0.8, seed=3 + i, n=3, max_tokens=11) for i in range(10)],
    "serial-rows": [SamplingParams(temperature=0.0, max_tokens=14, repetition_penalty=1.3 if i % 2 else 1.0)
                    for i in range(10)],
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_overlapped_steps_give_the_serial_outputs(pair, mix: str) -> None:
    serial, overlapped = pair
    batch = prompts([3, 40, 7, 19, 64, 1, 33, 90, 12, 5], seed=11)
    params = MIXES[mix]
    want = outputs(serial, batch, params)
    got = outputs(overlapped, batch, params)
    assert got == want
    assert_no_leaks(overlapped)


def test_overlapped_steps_reach_the_context_limit_and_free_everything(tiny_tied_dir: Path) -> None:
    kwargs = {"dtype": "float32", "max_model_len": 40, "num_blocks": 24, "block_size": 4}
    batch = prompts([30, 35, 38, 10], seed=5)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=None)  # up to the context window
    want = outputs(LLM(str(tiny_tied_dir), async_scheduling=False, **kwargs), batch, params)
    llm = LLM(str(tiny_tied_dir), async_scheduling=True, **kwargs)
    assert outputs(llm, batch, params) == want
    assert [len(o[0][0]) for o in want] == [10, 5, 2, 30]
    assert_no_leaks(llm)


@pytest.mark.parametrize("ending", ["length", "stop"])
def test_sessions_and_prefix_hits_match_serial(tiny_tied_dir: Path, ending: str) -> None:
    """Turn 2 of a session reuses what turn 1 left, the same count either way: a turn that ends on a
    stop string keeps no KV of the step launched after its last token."""
    results = []
    for overlap in (False, True):
        llm = LLM(str(tiny_tied_dir), dtype="float32", async_scheduling=overlap, block_size=4)
        first = prompts([21], seed=2)[0]["prompt_token_ids"]
        params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
        if ending == "stop":  # a stop string from the middle of the free answer
            free = llm.generate([{"prompt_token_ids": first}], SamplingParams(temperature=0.0, max_tokens=40,
                                ignore_eos=True), use_tqdm=False)[0].outputs[0].text
            params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[free[len(free) // 2:][:2]])
        eng = llm.engine
        one = llm.generate([{"prompt_token_ids": first}], params, use_tqdm=False)[0]
        history = eng.session_tokens("s") or []
        from swiftlm.core.generation import GenerationRequest
        eng.add_request(GenerationRequest("t1", first, params, session_id="s", final_only=True))
        while eng.has_unfinished():
            eng.step()
        history = eng.session_tokens("s")
        kept = eng.kv.sessions.get("s").num_computed  # KV the session holds: never a dropped step's
        second = [*history, 1, 2, 3]
        eng.add_request(GenerationRequest("t2", second, params, session_id="s", final_only=True))
        outs = []
        while eng.has_unfinished():
            outs.extend(eng.step())
        last = outs[-1].outputs[0]
        assert one.outputs[0].finish_reason == ending  # and so does turn 1 of the session (same prompt)
        results.append((one.outputs[0].token_ids, history, kept, last.token_ids, outs[-1].num_cached_tokens))
        assert_no_leaks(llm)
    assert results[0] == results[1]
    assert results[1][4] > 0


@pytest.mark.parametrize("run_model", [True, False], ids=["model", "no-layers"])
def test_the_host_prepares_the_next_step_while_the_device_runs(tiny_tied_dir: Path, run_model: bool) -> None:
    """With a device step of 30 ms, the host's preparation of step N+1 starts before step N's device
    work ends (overlapped), and never does serially; every step takes the device its 30 ms."""
    seen: dict[bool, list[tuple[str, int, float]]] = {}
    for overlap in (False, True):
        backend = FixedTimeBackend(TorchBackend("cpu"), device_seconds=0.03, run_model=run_model)
        llm = LLM(str(tiny_tied_dir), dtype="float32", backend=backend, async_scheduling=overlap)
        events: list[tuple[str, int, float]] = []
        llm.engine.on_step_event = lambda kind, index, t, events=events: events.append((kind, index, t))
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        llm.generate(prompts([5, 9, 4], seed=1), params, use_tqdm=False)
        seen[overlap] = events
    for overlap, events in seen.items():
        at = {(kind, index): t for kind, index, t in events}
        steps = sorted(index for kind, index in at if kind == "device_end")
        early = [n for n in steps if ("prepare", n + 1) in at and at[("prepare", n + 1)] < at[("device_end", n)]]
        assert all(at[("device_end", n)] - at[("device_start", n)] >= 0.03 for n in steps)
        if overlap:
            assert len(early) >= len(steps) - 2, (early, steps)  # every step but the first and the last
        else:
            assert early == []


def test_a_failed_overlapped_step_fails_its_requests_alone(tiny_tied_dir: Path) -> None:
    """A forward that raises while the next step is already launched (it reads the failed step's tokens):
    the requests in it end with an error, the engine goes on, and no block leaks."""
    llm = LLM(str(tiny_tied_dir), dtype="float32", async_scheduling=True)
    eng = llm.engine
    calls = {"n": 0}

    def fail_third(kind: str, _logits: object) -> None:
        if kind == "forward":
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("boom")

    eng.runner.fault_hook = fail_third
    from swiftlm.core.generation import GenerationRequest

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    batch = prompts([5, 7], seed=4)
    for i, p in enumerate(batch):
        eng.add_request(GenerationRequest(f"a{i}", p["prompt_token_ids"], params, final_only=True))
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
    assert all("boom" in (finals[f"a{i}"].error or "") for i in range(2))
    eng.runner.fault_hook = None
    late = llm.generate([batch[0]], params, use_tqdm=False)[0]
    assert late.error is None and len(late.outputs[0].token_ids) == 6
    assert eng.stats().num_failed_steps == 1
    assert_no_leaks(llm)



def test_an_asynchronous_device_gives_the_serial_outputs_and_overlaps(tiny_tied_dir: Path) -> None:
    """A device whose launches return at once (as a GPU's): step N+1 is launched before step N's
    device time is up, reading its pending tokens from the device; the outputs are the serial ones."""
    params = [SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
              SamplingParams(temperature=0.8, max_tokens=9, ignore_eos=True)]
    batch = prompts([6, 11], seed=9)
    got = {}
    for overlap in (False, True):
        backend = FixedTimeBackend(TorchBackend("cpu"), device_seconds=0.02, asynchronous=True)
        ends: list[float] = []  # each launched step's end on the device's clock, in launch order
        launched = backend.step_launched

        def record(launched=launched, ends=ends):
            deadline = launched()
            ends.append(deadline.at)
            return deadline

        backend.step_launched = record
        llm = LLM(str(tiny_tied_dir), dtype="float32", backend=backend, async_scheduling=overlap)
        starts: list[float] = []
        llm.engine.on_step_event = lambda kind, index, t, starts=starts: starts.append(t) if kind == "device_start" else None
        torch.manual_seed(0)
        got[overlap] = outputs(llm, batch, params)
        ends = ends[-len(starts):]  # the generate call's steps (warm-up steps came before)
        early = sum(b < end for b, end in zip(starts[1:], ends, strict=False))  # launched while the last runs
        assert (early >= len(starts) - 2) if overlap else early == 0, (early, len(starts))
        assert_no_leaks(llm)
    assert got[True] == got[False]
