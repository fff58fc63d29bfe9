"""The connection layer: a client sending its headers (or body) a byte at a time is cut off at
the receive deadline (408 in OpenAI's envelope, or a close), a silent connection too; connections
beyond the limit get a 503; idle keep-alive connections close; the server keeps serving."""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest

from swiftlm.config import ServerConfig

DEADLINE_S = 1.5
MAX_CONNECTIONS = 4
# how late a timer may fire on a loaded machine (two test workers on two cores); far short of what
# a timer that never fires, or one reset by every byte, would take (the answer waits 30 s at most)
LATE_S = 10.0


@pytest.fixture(scope="module")
def server(start_server, tiny_tied_dir):
    config = ServerConfig(request_receive_timeout_s=DEADLINE_S, timeout_keep_alive_s=1.0,
                          max_concurrent_connections=MAX_CONNECTIONS, enable_batch_api=False)
    return start_server(tiny_tied_dir, config)


def _connect(server) -> socket.socket:
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _answered(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server has answered (or closed) within ``wait_s``."""
    return bool(select.select([sock], [], [], wait_s)[0])


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
    start = time.monotonic()  # before the connection opens, so before the server's deadline starts
    sock = _connect(server)
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: " + b"a" * 100
    for byte in request:  # uvicorn alone would reset its timer on every one of these
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        if _answered(sock, 1.0) or time.monotonic() - start > DEADLINE_S + LATE_S:  # one byte per second
            break
    answer = _read_all(sock)
    closed_at = time.monotonic() - start
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert "did not arrive within" in error["message"] and error["type"] == "invalid_request_error"
    assert DEADLINE_S - 0.05 <= closed_at < DEADLINE_S + LATE_S + 1, closed_at
    _alive(server)


def test_a_body_a_byte_at_a_time_is_cut_off(server) -> None:
    start = time.monotonic()
    sock = _connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{")
    while not _answered(sock, 0.25) and time.monotonic() - start < DEADLINE_S + LATE_S:  # a byte every 0.25 s
        try:
            sock.send(b" ")
        except (BrokenPipeError, ConnectionResetError):
            break
    answer = _read_all(sock)
    elapsed = time.monotonic() - start
    sock.close()
    assert b" 200 " not in answer[:20]
    assert DEADLINE_S - 0.05 <= elapsed < DEADLINE_S + LATE_S, elapsed
    _alive(server)


def test_a_silent_connection_is_closed(server) -> None:
    start = time.monotonic()
    sock = _connect(server)
    answer = _read_all(sock)  # never sends a byte
    elapsed = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert DEADLINE_S - 0.05 <= elapsed < DEADLINE_S + LATE_S, elapsed
    sock.close()


def test_connections_beyond_the_limit_get_503(server) -> None:
    # the server accepts connections in the order they were made: the held ones before the request's
    held = [_connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        r = httpx.get(server.v1 + "/models", timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "Too many open connections" in r.json()["error"]["message"]
    finally:
        for sock in held:
            sock.close()
    # the closed connections free their places once the server has seen them go (on a loaded
    # machine, not necessarily before the next connection arrives)
    deadline = time.monotonic() + 30
    while httpx.get(server.v1 + "/models", timeout=30).status_code == 503:
        assert time.monotonic() < deadline, "the closed connections still count against the limit"
        time.sleep(0.05)
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
    rest = _read_all(sock)  # idle now: closed after timeout_keep_alive (1 s), with no 408
    assert b"408" not in rest and time.monotonic() - start < 1.0 + LATE_S
    sock.close()
