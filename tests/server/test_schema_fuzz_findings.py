"""What schema fuzzing (test_schema_fuzz.py, scripts/fuzz_api.py) found, each pinned down:
a 5xx on bad input, and places where /openapi.json said something other than what the server does."""

from __future__ import annotations

import httpx
import pytest

from swiftlm.config import ServerConfig


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    return start_server(tiny_tied_dir, ServerConfig(), max_model_len=128)


@pytest.fixture(scope="module")
def document(server) -> dict:
    return httpx.get(server.base_url + "/openapi.json", timeout=10).json()


def _bad_request(r: httpx.Response, words: str) -> None:
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body", [b"\xd3\xa0\xff", b"[" * 100_000 + b"]" * 100_000, b"{", b"\xef\xbb\xbf{}x"])
def test_a_batch_body_that_is_not_json_is_400_not_500(server, body: bytes) -> None:
    r = httpx.post(server.v1 + "/batches", content=body, headers={"content-type": "application/json"}, timeout=30)
    _bad_request(r, "not valid JSON")


def test_the_document_says_validation_errors_are_400_in_openais_envelope(document) -> None:
    envelope = document["components"]["schemas"]["ErrorResponse"]
    assert envelope["required"] == ["error"]
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "422" not in responses, f"{method} {path}"
            if "requestBody" in operation or operation.get("parameters"):
                schema = responses["400"]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, f"{method} {path}"
            if path not in ("/health", "/metrics"):
                assert "401" in responses, f"{method} {path}"


def test_the_document_describes_answers_streams_and_hand_parsed_bodies(document) -> None:
    schemas = document["components"]["schemas"]
    # a response model's wrap serializer once read as "any object"
    assert "data" in schemas["ModelList"]["properties"]
    assert schemas["ChatCompletionResponse"]["required"] == ["model", "choices"]
    for path in ("/v1/chat/completions", "/v1/completions"):
        content = document["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}
        assert "[DONE]" in str(content["text/event-stream"]["schema"])
    body = document["paths"]["/v1/batches"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/BatchCreateRequest"}
    assert {"input_file_id", "input", "endpoint", "completion_window", "metadata"} <= set(
        schemas["BatchCreateRequest"]["properties"]
    )
    assert document["paths"]["/metrics"]["get"]["responses"]["200"]["content"] == {
        "text/plain": {"schema": {"type": "string"}}
    }
    assert "data" not in str(document["paths"]["/health"]["get"]["responses"]["503"])  # a HealthStatus, not an error
    assert schemas["TextContentPart"]["required"] == ["type", "text"]  # a part without a type is refused


def test_docs_pages_stay_off(server) -> None:
    assert httpx.get(server.base_url + "/docs", timeout=10).status_code == 404
    assert httpx.get(server.base_url + "/redoc", timeout=10).status_code == 404
