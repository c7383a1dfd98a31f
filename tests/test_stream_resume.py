"""Resuming an event stream over a real socket, against ``backchannel serve``: a client
that reconnects with the cursor it last saw (``Last-Event-ID``, ``after``) sees every
event once, and a cursor the hub cannot honour is refused, saying why and what to do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backchannel.testing.waiting import eventually
from tests.conftest import Server

#: seconds a read may wait: far below a keep-alive's 15 s, so a stream that shows
#: nothing more fails the test instead of hanging it
PROMPTLY = 10.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from tests.conftest import start_server

    s = start_server(tmp_path_factory.mktemp("resume") / "home")
    yield s
    s.stop()


def _send(srv: Server, token: str, to: str, text: str) -> str:
    with srv.client(token) as c:
        r = c.post("/v1/messages", json={"to": to, "text": text})
        assert r.status_code == 201, r.text
        return str(r.json()["message_id"])


def _cursors_until(
    srv: Server, token: str, path: str, marker: str, headers: dict[str, str] | None = None
) -> list[int]:
    """The ``id:`` of every ``traffic`` event of the stream at ``path`` up to and with
    the first about message ``marker``."""
    auth = {"Authorization": f"Bearer {token}", **(headers or {})}
    seen: list[int] = []
    with (
        httpx.Client(base_url=srv.url, headers=auth, timeout=PROMPTLY) as c,
        c.stream("GET", path) as resp,
    ):
        assert resp.status_code == 200, resp.read()
        cursor = None
        for line in resp.iter_lines():
            if line.startswith("id: "):
                cursor = int(line[4:])
            elif line.startswith("data: ") and cursor is not None:
                seen.append(cursor)
                if json.loads(line[6:]).get("message_id") == marker:
                    return seen
                cursor = None
    raise AssertionError(f"the stream ended before message {marker}: {seen}")


def test_team_events_resume_after_last_event_id(srv: Server) -> None:
    """An ``EventSource`` reconnects to the URL it first opened (``after=0``) with the
    id of the last event it saw in ``Last-Event-ID``: the stream goes on after it, and
    nothing it saw comes again."""
    tokens = srv.team("resume", "a", "b")
    first = _send(srv, tokens["a"], "b", "one")
    _send(srv, tokens["a"], "b", "two")
    path = "/v1/teams/resume/events?after=0"
    before = _cursors_until(srv, tokens["a"], path, first)
    seen = before[-1]
    marker = _send(srv, tokens["a"], "b", "three")
    again = _cursors_until(srv, tokens["a"], path, marker, {"Last-Event-ID": str(seen)})
    assert again and min(again) > seen, (seen, again)
    assert again == sorted(set(again))


def _ticket(srv: Server, token: str, team: str) -> str:
    with srv.client(token) as c:
        r = c.post("/v1/dashboard/tickets", json={"team": team})
        assert r.status_code in (200, 201), r.text
        return str(r.json()["ticket"])


@pytest.mark.parametrize("last_id", ["zz", "-1", "1.5", str(2**63), "9" * 60])
@pytest.mark.parametrize("stream", ["events", "dashboard"])
def test_a_last_event_id_that_is_no_cursor_is_refused(
    srv: Server, stream: str, last_id: str
) -> None:
    """Ignored, such a header would start the stream over from ``after`` and show the
    client again all it saw; it is refused, naming the header and the way out."""
    team = f"garbled-{uuid.uuid4().hex[:8]}"
    tokens = srv.team(team, "a")
    if stream == "events":
        path = f"/v1/teams/{team}/events"
    else:
        path = f"/v1/dashboard/teams/{team}/stream?ticket={_ticket(srv, tokens['user'], team)}"
    with (
        srv.client(tokens["user"]) as c,
        c.stream("GET", path, headers={"Last-Event-ID": last_id}) as r,
    ):
        assert r.status_code == 422, r.status_code  # not a stream that starts over
        error = json.loads(r.read())["error"]
    assert error["code"] == "invalid_request"
    assert "Last-Event-ID" in error["message"] and "?after=" in error["message"]


def test_the_sdk_raises_the_error_a_team_stream_ends_with(srv: Server) -> None:
    """A member's ``team_events`` ends with ``event: error`` when its token is rotated:
    the SDK raises that error (the hub's words: sign in again), not a failure to read
    the error's JSON as traffic."""
    from backchannel import errors
    from backchannel.client import connect_sync

    tokens = srv.team("rotated", "a", "b")
    marker = _send(srv, tokens["a"], "b", "watched")
    with connect_sync(srv.url, tokens["a"]) as client:
        events = iter(client.team_events())
        assert next(events).message_id == marker
        with srv.client() as admin:
            admin.post("/v1/teams/rotated/members/a/token").raise_for_status()
        with pytest.raises(errors.BackchannelError) as caught:
            next(events)
    assert caught.value.code == "unauthorized" and "rotated" in caught.value.message


@pytest.mark.parametrize("how", ["after", "Last-Event-ID"])
@pytest.mark.parametrize("stream", ["events", "dashboard"])
def test_a_cursor_past_the_newest_event_is_refused(srv: Server, stream: str, how: str) -> None:
    """A cursor this store never sent (it was restored from a backup or reset since
    the client saw it) would give a stream that stays empty, the new events numbered
    below it: it is refused, naming the parameter and the newest cursor."""
    team = f"ahead-{uuid.uuid4().hex[:8]}"
    tokens = srv.team(team, "a", "b")
    marker = _send(srv, tokens["a"], "b", "one")
    if stream == "events":
        path = f"/v1/teams/{team}/events"
    else:
        path = f"/v1/dashboard/teams/{team}/stream?ticket={_ticket(srv, tokens['user'], team)}"
    newest = _cursors_until(srv, tokens["user"], path, marker)[-1]
    ahead = newest + 1_000_000
    sep = "&" if "?" in path else "?"
    url, headers = (
        (f"{path}{sep}after={ahead}", {})
        if how == "after"
        else (path, {"Last-Event-ID": str(ahead)})
    )
    with srv.client(tokens["user"]) as c, c.stream("GET", url, headers=headers) as r:
        assert r.status_code == 422, r.status_code  # not a stream that stays empty
        error = json.loads(r.read())["error"]
    assert error["code"] == "invalid_request"
    assert how in error["message"] and f"?after={newest}" in error["message"]


async def test_the_sdk_stream_goes_on_across_a_restarted_serve(tmp_path: Path) -> None:
    """``team_events(reconnect_within=...)`` opens the stream again, with
    ``Last-Event-ID``, while ``serve`` is stopped and started again under it: it shows
    every event of the team once, in order, the same a fresh stream from 0 shows."""
    from backchannel.client import connect
    from tests.conftest import free_port, start_server

    port = free_port()
    home = tmp_path / "home"
    first = start_server(home, port=port)
    tokens = first.team("restarts", "a", "b")
    seen: list[tuple[int, str | None]] = []
    try:
        async with connect(first.url, tokens["user"]) as client:

            async def read() -> None:
                async for t in client.team_events(reconnect_within=30):
                    seen.append((t.cursor, t.message_id))

            reader = asyncio.create_task(read())
            before = _send(first, tokens["a"], "b", "before the restart")
            await eventually(lambda: any(m == before for _, m in seen), what="the first event")
            first.stop()
            again = start_server(home, port=port)
            try:
                after = _send(again, tokens["a"], "b", "after the restart")
                await eventually(lambda: any(m == after for _, m in seen), what="a later event")
                assert not reader.done(), reader
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                whole = _cursors_until(again, tokens["user"], "/v1/teams/restarts/events", after)
            finally:
                again.stop()
    finally:
        first.stop()
    cursors = [c for c, _ in seen]
    assert cursors == whole[: len(cursors)], (cursors, whole)  # none twice, none lost


async def test_the_sdk_stream_gives_up_after_its_bound(tmp_path: Path) -> None:
    from backchannel import errors
    from backchannel.client import connect
    from tests.conftest import start_server

    srv = start_server(tmp_path / "home")
    tokens = srv.team("gone", "a", "b")
    marker = _send(srv, tokens["a"], "b", "one")
    try:
        async with connect(srv.url, tokens["user"]) as client:
            events = aiter(client.team_events(reconnect_within=1))
            got = await anext(events)
            while got.message_id != marker:
                got = await anext(events)
            srv.stop()
            with pytest.raises(errors.PeerError) as caught:
                await asyncio.wait_for(anext(events), 30)
    finally:
        srv.stop()
    assert "within 1 s" in caught.value.message
    assert "after=" in caught.value.message


def test_a_stream_resumed_after_removed_events_says_so_first(tmp_path: Path) -> None:
    """Retention removed events after the cursor a client resumes from: the stream's
    first event says which (``skipped``, its id the last removed), so the client reads
    the team's state again; the SDK raises it as ``EventsSkipped``."""
    import time

    from backchannel import errors
    from backchannel.client import connect_sync
    from backchannel.stores.sqlite import SqliteStore
    from tests.conftest import start_server

    srv = start_server(tmp_path / "home")
    try:
        tokens = srv.team("kept", "a", "b")
        first = _send(srv, tokens["a"], "b", "read and acked")
        with srv.client(tokens["b"]) as c:
            got = c.get("/v1/inbox", params={"wait": 0}).json()
            ids = [m["message_id"] for m in got["messages"]]
            assert ids == [first], got
            c.post("/v1/inbox/ack", json={"message_ids": ids}).raise_for_status()
        path = "/v1/teams/kept/events"
        later = _send(srv, tokens["a"], "b", "still waiting")
        # the first message's queued, leased and acked, then the later one's queued
        seen = _cursors_until(srv, tokens["user"], path, later)[:-1]

        async def compact() -> int:
            store = SqliteStore(srv.home / "backchannel.db")
            await store.open()
            try:
                gone, _ = await store.transact(lambda tx: tx.compact(time.time() + 1, None, 100))
                return gone
            finally:
                await store.close()

        assert asyncio.run(compact()) == 1  # the acked message, with its history
        auth = {"Authorization": f"Bearer {tokens['user']}", "Last-Event-ID": str(seen[0])}
        with (
            httpx.Client(base_url=srv.url, headers=auth, timeout=PROMPTLY) as c,
            c.stream("GET", path) as resp,
        ):
            assert resp.status_code == 200
            lines = []
            for line in resp.iter_lines():
                lines.append(line)
                if line.startswith("data: "):
                    break
        assert lines[-3:] == [
            "event: skipped",
            f"id: {seen[-1]}",
            lines[-1],
        ], lines
        error = json.loads(lines[-1][6:])["error"]
        assert (error["code"], error["after"], error["through"]) == (
            "events_skipped",
            seen[0],
            seen[-1],
        )
        with connect_sync(srv.url, tokens["user"]) as client:
            with pytest.raises(errors.EventsSkipped) as caught:
                next(iter(client.team_events(after=seen[0])))
            assert caught.value.details["through"] == seen[-1]
            # going on after the removed ones: what came later, nothing skipped
            assert next(iter(client.team_events(after=seen[-1]))).message_id == later
    finally:
        srv.stop()
