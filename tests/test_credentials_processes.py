"""A token rotated, or its member or team removed, through one `backchannel serve`
process ends at once the requests that wait with it on another process on the same
store: a long-poll answers 401 (not 200 an hour later), an inbox stream, a team's event
stream and a dashboard stream end with ``event: error``. Two real processes on one
SQLite file, and on one PostgreSQL database."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from backchannel.testing import eventually_blocking
from tests.conftest import Server, start_server
from tests.helpers_credentials import delivery_state, revoke

#: Long enough for the stores' wake-up (SQLite polls every quarter second; PostgreSQL
#: notifies) and a loaded machine; far shorter than the 15 s a stream waited before it
#: looked at its token again, and the long-poll's wait.
PROMPTLY = 10.0


def _two_hubs(base: Path, store_url: str) -> list[Server]:
    """Two hubs on ``store_url`` sharing one admin token (as an operator copies
    ``admin.token`` to every host)."""
    token = "bca_" + secrets.token_urlsafe(32)
    servers: list[Server] = []
    try:
        for i in range(2):
            home = base / f"hub{i}"
            home.mkdir(parents=True)
            fd = os.open(home / "admin.token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
            servers.append(start_server(home, store_url))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def hubs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'shared.db'}"
    else:
        url = request.getfixturevalue("new_postgres_url")()
    a, b = _two_hubs(tmp_path, url)
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["rotate", "remove member", "remove team"])
def test_a_long_poll_on_another_process_ends_at_once(hubs: tuple[Server, Server], how: str) -> None:
    a, b = hubs
    tokens = a.team("crew", "lead", "worker")
    with b.client(tokens["lead"]) as lead:
        mid = lead.post("/v1/messages", json={"to": "worker", "text": "one"}).json()["message_id"]
    with b.client(tokens["worker"]) as worker:
        assert len(worker.get("/v1/inbox").json()["messages"]) == 1
    answer: dict[str, httpx.Response] = {}

    def poll() -> None:
        with b.client(tokens["worker"]) as old:
            answer["r"] = old.post("/v1/inbox/receive", json={"ack": [mid], "wait": 600})

    waiter = threading.Thread(target=poll, daemon=True)
    waiter.start()
    # the ack commits before the wait: once it shows, the poll waits on hub b
    eventually_blocking(
        lambda: delivery_state(b, tokens["lead"], mid) == "acked", what="the poll waits"
    )
    revoke(a, how)
    waiter.join(PROMPTLY)
    assert not waiter.is_alive(), f"the long-poll on the other process still waits ({how})"
    r = answer["r"]
    assert r.status_code == 401, r.text
    assert "rotated or its member removed" in r.json()["error"]["message"]


@contextlib.contextmanager
def _lines(hub: Server, token: str, path: str) -> Iterator[Iterator[str]]:
    """The lines of an event stream, read with a timeout shorter than a keep-alive's
    15 s: a stream that waits for its next look at the token times out instead."""
    auth = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=hub.url, headers=auth, timeout=PROMPTLY) as c,
        c.stream("GET", path) as resp,
    ):
        assert resp.status_code == 200, resp.read()
        yield resp.iter_lines()


def _error_event(lines: Iterator[str], until: Callable[[str], bool]) -> list[str]:
    """Lines up to and with the ``data`` of the first ``event: error``."""
    seen: list[str] = []
    for line in lines:
        seen.append(line)
        if until(line):
            break
    with contextlib.suppress(StopIteration):
        if seen and seen[-1] == "event: error":
            seen.append(next(lines))
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/inbox/stream", "/v1/teams/crew/events", "dashboard"])
def test_a_quiet_stream_on_another_process_ends_at_once(
    hubs: tuple[Server, Server], path: str
) -> None:
    a, b = hubs
    tokens = a.team("crew", "lead", "worker")
    if path == "dashboard":
        with b.client(tokens["worker"]) as c:
            r = c.post("/v1/dashboard/tickets", json={"team": "crew"})
            assert r.status_code in (200, 201), r.text
            ticket = r.json()["ticket"]
        path = f"/v1/dashboard/teams/crew/stream?ticket={ticket}"
    with _lines(b, tokens["worker"], path) as lines:
        assert next(lines) == ": connected"
        if "dashboard" in path:  # the first snapshot is read: the stream is set up
            next(line for line in lines if line == "event: snapshot")
        started = time.monotonic()
        revoke(a, "rotate")
        seen = _error_event(lines, lambda line: line == "event: error")
    assert seen[-2:-1] == ["event: error"] and "rotated" in seen[-1], seen
    assert time.monotonic() - started < PROMPTLY
