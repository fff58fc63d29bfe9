"""The server with speculative decoding: the same answer as without it, the spec_decode counters on
/metrics, the per-request ``num_speculative_tokens`` field on chat and the Responses API (and its 400 on a
server without it)."""

from __future__ import annotations

import httpx

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}


def _chat(server, **fields) -> httpx.Response:
    body = {"model": server.model, "messages": [{"role": "user", "content": "say it again and again"}],
            "max_tokens": 24, "temperature": 0, "enable_thinking": False, "ignore_eos": True, **fields}
    return httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "_total"))


def test_speculating_server_answers_the_same_and_counts(start_server, tiny_tied_dir) -> None:
    plain = start_server(tiny_tied_dir)
    spec = start_server(tiny_tied_dir, speculative_config=SPEC)
    want = _chat(plain).json()["choices"][0]["message"]["content"]
    assert _chat(spec).json()["choices"][0]["message"]["content"] == want
    drafts = _metric(spec, "swiftlm:spec_decode_num_drafts")
    accepted = _metric(spec, "swiftlm:spec_decode_num_accepted_tokens")
    assert drafts > 0 and accepted > 0 and _metric(spec, "swiftlm:spec_decode_num_draft_tokens") >= accepted
    off = _chat(spec, extra_body={"num_speculative_tokens": 0})
    assert off.json()["choices"][0]["message"]["content"] == want
    assert _metric(spec, "swiftlm:spec_decode_num_drafts") == drafts  # that request proposed nothing
    refused = _chat(plain, num_speculative_tokens=2)
    assert refused.status_code == 400 and "speculative decoding is off" in refused.json()["error"]["message"]
    # the Responses API takes the same field
    response = {"model": spec.model, "input": "say it again and again", "max_output_tokens": 8, "temperature": 0,
                "enable_thinking": False, "store": False, "num_speculative_tokens": 0}
    assert httpx.post(spec.v1 + "/responses", json=response, timeout=60).status_code == 200
    assert _metric(spec, "swiftlm:spec_decode_num_drafts") == drafts
    refused = httpx.post(plain.v1 + "/responses", json={**response, "model": plain.model, "num_speculative_tokens": 2}, timeout=60)
    assert refused.status_code == 400 and "speculative decoding is off" in refused.json()["error"]["message"]
    spec.assert_no_leaks()
