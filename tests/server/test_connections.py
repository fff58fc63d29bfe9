"""The connection layer: a client sending its headers (or body) a byte at a time is cut off at
the receive deadline (408 in OpenAI's envelope, or a close), a silent connection too; connections
beyond the limit get a 503; idle keep-alive connections close; the server keeps serving."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from swiftlm.config import ServerConfig

DEADLINE_S = 1.5
MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    config = ServerConfig(request_receive_timeout_s=DEADLINE_S, timeout_keep_alive_s=1.0,
                          max_concurrent_connections=MAX_CONNECTIONS, enable_batch_api=False)
    return start_server(tiny_tied_dir, config)


def _connect(server) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _alive(server) -> None:
    body = {"model": server.model, "prompt": "x", "max_tokens": 2}
    assert httpx.post(server.v1 + "/completions", json=body, timeout=30).status_code == 200


def test_headers_a_byte_a_second_get_408_at_the_deadline(server) -> None:
    sock = _connect(server)
    start = time.monotonic()
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 100
    closed_at = None
    for byte in request:  # uvicorn alone would reset its timer on every one of these
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(1.0)  # one byte per second
        if time.monotonic() - start > DEADLINE_S + 3:
            break
    answer = _read_all(sock)
    closed_at = time.monotonic() - start
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert "did not arrive within" in error["message"] and error["type"] == "invalid_request_error"
    assert closed_at < DEADLINE_S + 3.5
    _alive(server)


def test_a_body_a_byte_at_a_time_is_cut_off(server) -> None:
    sock = _connect(server)
    start = time.monotonic()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{")
    for _ in range(int((DEADLINE_S + 2) / 0.25)):
        try:
            sock.send(b" ")
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.25)
    answer = _read_all(sock)
    elapsed = time.monotonic() - start
    sock.close()
    assert b" 200 " not in answer[:20]
    assert elapsed < DEADLINE_S + 3
    _alive(server)


def test_a_silent_connection_is_closed(server) -> None:
    sock = _connect(server)
    start = time.monotonic()
    answer = _read_all(sock)  # never sends a byte
    assert time.monotonic() - start < DEADLINE_S + 2
    assert answer.startswith(b"HTTP/1.1 408 ")
    sock.close()


def test_connections_beyond_the_limit_get_503(server) -> None:
    held = [_connect(server) for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.2)
    try:
        r = httpx.get(server.v1 + "/models", timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "Too many open connections" in r.json()["error"]["message"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    _alive(server)


def test_idle_keep_alive_connections_close_and_reused_ones_work(server) -> None:
    sock = _connect(server)
    for _ in range(2):  # two requests on one connection: the deadline re-arms for each
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")).split(b":")[1])
        while len(body) < length:
            body += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 ") and json.loads(body)["object"] == "list"
    start = time.monotonic()
    rest = _read_all(sock)  # idle now: closed after timeout_keep_alive, with no 408
    assert b"408" not in rest and time.monotonic() - start < 3
    sock.close()
