"""Slow and numerous clients against a real `backchannel serve`: half-sent requests are
answered 408 and closed at the deadline, and connections over the cap get 503 with
Retry-After, so ``/healthz`` always answers and the hub recovers by itself."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BIN, Server, start_server


def _address(srv: Server) -> tuple[str, int]:
    host, _, port = srv.url.removeprefix("http://").rpartition(":")
    return host, int(port)


def _read_until_closed(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's own
    timeout bounds the wait)."""
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    return got


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _json_body(raw: bytes) -> dict[str, object]:
    return dict(json.loads(raw.partition(b"\r\n\r\n")[2]))


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("quick") / "home"
    srv = start_server(home, None, "--header-timeout", "1", "--body-timeout", "1")
    yield srv
    srv.stop()


def test_a_half_sent_head_is_answered_408_and_closed(quick: Server) -> None:
    with socket.create_connection(_address(quick), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # no blank line: never ends
        raw = _read_until_closed(s)
    assert _status(raw) == 408
    err = _json_body(raw)["error"]
    assert isinstance(err, dict)
    assert err["code"] == "request_timeout"
    assert "head" in err["message"]
    assert httpx.get(f"{quick.url}/healthz").status_code == 200


def test_a_silent_connection_is_closed(quick: Server) -> None:
    with socket.create_connection(_address(quick), timeout=30) as s:
        assert _status(_read_until_closed(s)) == 408


def test_a_half_sent_body_is_answered_408_and_nothing_is_kept(quick: Server) -> None:
    tokens = quick.team("slow", "a", "b")
    body = json.dumps({"to": "b", "text": "never whole", "message_id": "slow-1"}).encode()
    with socket.create_connection(_address(quick), timeout=30) as s:
        s.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {tokens['a']}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        raw = _read_until_closed(s)
    assert _status(raw) == 408
    assert "body" in str(_json_body(raw)["error"])
    with quick.client(tokens["a"]) as a:
        assert a.get("/v1/messages/slow-1").status_code == 404


def test_a_kept_alive_connection_gets_a_new_deadline_per_request(quick: Server) -> None:
    with socket.create_connection(_address(quick), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = s.recv(65536)
        assert _status(first) == 200
        s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        raw = _read_until_closed(s)
    assert _status(raw) == 408


def _half_sent(
    address: tuple[str, int], n: int, stack: contextlib.ExitStack
) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = stack.enter_context(socket.create_connection(address, timeout=30))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def _healthz_raw(address: tuple[str, int]) -> bytes:
    with socket.create_connection(address, timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _read_until_closed(s)


@pytest.mark.slow
def test_connections_over_the_cap_get_503_with_retry_after_then_it_recovers(
    tmp_path: Path,
) -> None:
    srv = start_server(tmp_path / "home", None, "--max-connections", "20", "--header-timeout", "6")
    try:
        address = _address(srv)
        with contextlib.ExitStack() as stack:
            held = _half_sent(address, 20, stack)
            raw = _healthz_raw(address)
            assert _status(raw) == 503
            head = raw.partition(b"\r\n\r\n")[0].lower()
            assert b"\r\nretry-after: 1" in head
            err = _json_body(raw)["error"]
            assert isinstance(err, dict)
            assert err["code"] == "busy"
            # the held ones reach their deadline; then there is room again
            for s in held:
                assert _status(_read_until_closed(s)) == 408
        assert _status(_healthz_raw(address)) == 200
        assert srv.proc.poll() is None
    finally:
        srv.stop()


@pytest.mark.slow
def test_many_half_sent_requests_cannot_exhaust_open_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack as found, scaled down: more half-sent requests than the hub may open
    files. /healthz is answered (503, then 200 once the deadline clears them)."""
    limit = 256
    wrapper = tmp_path / "serve-limited"
    wrapper.write_text(f'#!/bin/sh\nulimit -n {limit}\nexec "{BIN}" "$@"\n')
    wrapper.chmod(0o755)
    import tests.conftest as conftest

    monkeypatch.setattr(conftest, "BIN", wrapper)  # serve under the lower limit
    srv = start_server(tmp_path / "home", None, "--header-timeout", "10")
    try:
        assert "connections capped at 96" in (srv.home / "serve.log").read_text()
        address = _address(srv)
        with contextlib.ExitStack() as stack:
            held = _half_sent(address, limit + 50, stack)
            # While the burst holds every descriptor, the event loop refuses new
            # connections at once (a reset, never a hang); within a second the ones
            # over the cap are let go and /healthz is answered 503 until the deadline.
            deadline = time.monotonic() + 8  # well inside the 10 s head deadline
            raw = b""
            while not raw and time.monotonic() < deadline:
                try:
                    raw = _healthz_raw(address)
                except ConnectionError:
                    time.sleep(0.05)
            assert raw, "/healthz never answered"
            assert _status(raw) == 503
            assert b"retry-after: 1" in raw.lower()
            for s in held:
                with contextlib.suppress(ConnectionError):
                    _read_until_closed(s)  # answered 408 or 503 and closed, or reset
        assert _status(_healthz_raw(address)) == 200
        assert srv.proc.poll() is None
    finally:
        srv.stop()
