"""``GET /v1/inbox/stream`` in the field, served by a hub on a real socket: a reader that
stops reading (its connection still open) or never acks holds only the stream's window,
and not for longer than the bound; a stream opened again sends all its name holds, past
one store read's page."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from backchannel.hub import Hub, Outgoing
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing.waiting import eventually, eventually_blocking
from backchannel.types import DeliveryState, MessageKind


def _hub(tmp_path: Path, lease: float = 60.0, **config: float) -> Hub:
    """A hub on the SQLite file ``hub.db`` in ``tmp_path`` (leases of ``lease`` seconds,
    and the ``config`` settings): a second one is another hub process on that store."""
    hub = Hub(SqliteStore(tmp_path / "hub.db"), lease_seconds=lease)
    for key, value in config.items():
        setattr(hub.config, key, value)
    return hub


@contextlib.asynccontextmanager
async def _server(hub: Hub) -> AsyncIterator[tuple[uvicorn.Server, str]]:
    """``hub`` serving the API on a real socket with the HTTP protocol ``backchannel
    serve`` uses: the server (its open connections and tasks) and its URL. The hub is
    closed after."""
    from backchannel.interfaces.guard import ConnectionLimits, guarded_protocol
    from backchannel.interfaces.http import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(hub, "admin"),
            host="127.0.0.1",
            port=0,
            log_level="error",
            http=guarded_protocol(ConnectionLimits()),
        )
    )
    serving = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started, what="the hub to listen")
        yield server, f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        await hub.close()


@contextlib.asynccontextmanager
async def _served(hub: Hub) -> AsyncIterator[str]:
    """``hub`` serving the API on a real socket: its URL. The hub is closed after."""
    async with _server(hub) as (_, url):
        yield url


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, lease: float = 60.0, **config: float
) -> AsyncIterator[tuple[Hub, str, dict[str, str]]]:
    """A hub on SQLite (leases of ``lease`` seconds, and the ``config`` settings)
    serving the API on a real socket: the hub, its URL, and the tokens of team ``t``'s
    members ``a`` and ``b``."""
    hub = _hub(tmp_path, lease, **config)
    async with _served(hub) as url:
        await hub.create_team("t")
        tokens = {m: (await hub.add_member("t", m))[1] for m in ("a", "b")}
        yield hub, url, tokens


async def _send(hub: Hub, n: int, text: str = "part") -> list[str]:
    """``n`` messages from ``a`` to ``b``; their ids, in send order."""
    done = await hub.send_many("t", "a", [Outgoing("b", f"{text} {i}") for i in range(n)])
    ids = []
    for r in done:
        assert not isinstance(r, Exception), r
        ids.append(r.message_id)
    return ids


async def _taken(url: str, token: str, want: int, within: float) -> list[dict[str, Any]]:
    """What another receiver of the member leases (``GET /v1/inbox``) until ``want``
    came, or ``within`` seconds passed (from a thread of its own)."""
    got: list[dict[str, Any]] = []
    headers = {"Authorization": f"Bearer {token}"}

    def take() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as c:

            def more() -> bool:
                r = c.get("/v1/inbox", params={"limit": 100, "wait": 0.2})
                got.extend(r.json()["messages"])
                return len(got) >= want

            with contextlib.suppress(AssertionError):
                eventually_blocking(
                    more, what=f"{want} messages for another receiver", within=within
                )

    await asyncio.to_thread(take)
    return got


async def _events(
    url: str,
    token: str,
    want: int,
    within: float,
    params: dict[str, Any] | None = None,
    last: str | None = None,
    got: list[tuple[str, Any]] | None = None,
) -> list[tuple[str, Any]]:
    """The events ``GET /v1/inbox/stream`` sends (``("message", (id, attempt))`` or
    ``("error", code)``), read until ``want`` came, an error, or ``within`` seconds
    (into ``got`` when given, as they come)."""
    headers = {"Authorization": f"Bearer {token}"}
    if last is not None:
        headers["Last-Event-ID"] = last
    got = [] if got is None else got
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as c:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                async with c.stream("GET", "/v1/inbox/stream", params=params) as r:
                    r.raise_for_status()
                    kind = ""
                    async for line in r.aiter_lines():
                        if line.startswith("event: "):
                            kind = line[7:]
                        elif line.startswith("data: "):
                            data = json.loads(line[6:])
                            if kind == "error":
                                got.append(("error", data["error"]["code"]))
                                break
                            got.append(("message", (data["message_id"], data["attempt"])))
                            if len(got) == want:
                                break
    return got


@pytest.mark.slow
async def test_a_stream_whose_reader_stopped_reading_gives_back_what_it_holds(
    tmp_path: Path,
) -> None:
    # a reader that stopped reading with its connection open (a hung process, a full
    # receive buffer): before, its stream kept every message it leased for the whole
    # lease (60 s), and another receiver of the member got none of them; now the stream
    # leases only its window (32 unacked), the write it cannot get into the reader ends
    # it after the write bound (1 s here), and all it held goes to the other receiver at
    # once, untried (attempt 1)
    async with _serving(tmp_path, stream_write_timeout=1.0) as (hub, url, tokens):
        ids = await _send(hub, 40, "x" * 200_000)
        host, port = url.removeprefix("http://").split(":")
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            reader.connect((host, int(port)))
            reader.sendall(
                f"GET /v1/inbox/stream HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer {tokens['b']}\r\n\r\n".encode()
            )

            async def leased_first() -> bool:  # by the stream, before the other receiver
                return (await hub.message_status("t", ids[0])).state.value == "leased"

            await eventually(leased_first, what="the stream to lease its first batch")
            got = await _taken(url, tokens["b"], 40, within=15)
        finally:
            reader.close()
        assert sorted(m["message_id"] for m in got) == sorted(ids)
        assert {m["attempt"] for m in got} == {1}


async def test_a_stream_holds_no_more_than_its_window_unacked(tmp_path: Path) -> None:
    # a stream whose reader reads but does not ack holds at most ``limit`` messages: the
    # others, and those sent later, go to the member's other receiver at once (before:
    # the stream leased every message the member got while it was open)
    async with _serving(tmp_path) as (hub, url, tokens):
        ids = await _send(hub, 10)
        params = {"limit": 4}
        seen: list[tuple[str, Any]] = []
        reading = asyncio.create_task(
            _events(url, tokens["b"], 99, within=30, params=params, got=seen)
        )
        try:
            await eventually(lambda: len(seen) >= 4, what="the stream to send its window")
            assert seen == [("message", (i, 1)) for i in ids[:4]]
            later = await _send(hub, 2, "later")
            got = await _taken(url, tokens["b"], 8, within=5)
            assert [m["message_id"] for m in got] == ids[4:] + later
            assert len(seen) == 4  # the reader was sent none of them
            # acked, the window has room again: the stream takes what comes next
            async with httpx.AsyncClient(base_url=url) as b:
                headers = {"Authorization": f"Bearer {tokens['b']}"}
                r = await b.post("/v1/inbox/ack", json={"message_ids": ids[:4]}, headers=headers)
                assert r.json()["acked"] == 4
            more = await _send(hub, 2, "after the acks")
            await eventually(lambda: len(seen) >= 6, what="the stream to lease again")
            assert seen[4:] == [("message", (i, 1)) for i in more]
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


async def test_a_stream_whose_messages_stay_unacked_for_their_lease_ends(
    tmp_path: Path,
) -> None:
    # a reader that reads but never acks (or a proxy that stopped forwarding): before,
    # its stream took each message again as its lease ended and sent it again, attempt
    # after attempt, until it was dead; now the stream ends with ``event: error`` before
    # the lease is out, and the message goes back to the inbox for the next receiver
    async with _serving(tmp_path, lease=2.0) as (hub, url, tokens):
        [mid] = await _send(hub, 1)
        got = await _events(url, tokens["b"], 99, within=8)
        assert got == [("message", (mid, 1)), ("error", "invalid_state")]
        again = await _taken(url, tokens["b"], 1, within=5)
        assert [(m["message_id"], m["attempt"]) for m in again] == [(mid, 2)]


async def test_a_stream_opened_again_sends_all_its_name_holds_page_by_page(
    tmp_path: Path,
) -> None:
    # a name that holds more than 1,000 messages (read from the store 7 at a time here):
    # before, the stream opened again sent the first 1,000 and the others waited out
    # their lease; now it sends each one it holds, once, in the order it leased them,
    # and from after the one Last-Event-ID names
    async with _serving(tmp_path, held_page=7) as (hub, url, tokens):
        ids = await _send(hub, 1005)
        for _ in range(2):  # leased to the stream's name (1,000 at most a lease)
            await hub.receive("t", "b", limit=1000, receive_id="rcv-many", fresh=True)
        params = {"receive_id": "rcv-many"}
        got = await _events(url, tokens["b"], 1005, within=30, params=params)
        assert got == [("message", (i, 1)) for i in ids]
        rest = await _events(url, tokens["b"], 504, within=30, params=params, last=ids[500])
        assert rest == [("message", (i, 1)) for i in ids[501:]]


async def test_a_stream_resumed_after_an_anchor_it_leased_last_sends_the_anchor(
    tmp_path: Path,
) -> None:
    # the stream's name leased "work" and then, in a later lease, a fired anchor; the
    # reader saw "work" (Last-Event-ID). Before, what the name held was put anchors
    # first (the anchor before "work"), so nothing came "after work" and the anchor
    # waited out its lease; now the anchor is sent
    async with _serving(tmp_path) as (hub, url, tokens):
        [work] = await _send(hub, 1, "work")
        name = "rcv-anchor"
        await hub.receive("t", "b", limit=10, receive_id=name, fresh=True)
        anchor = await hub.send(
            "t", "a", "b", "ANCHOR: back to task 3", kind=MessageKind.TIMER,
            meta={"intent": "anchor"},
        )  # fmt: skip
        await hub.receive("t", "b", limit=10, receive_id=name, fresh=True)
        params = {"receive_id": name}
        got = await _events(url, tokens["b"], 1, within=5, params=params, last=work)
        assert got == [("message", (anchor.message_id, 1))]


async def _cancelled(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel the readers a test started and wait for each to end."""
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _stalled_reader(url: str, token: str, params: str) -> socket.socket:
    """A reader of ``GET /v1/inbox/stream?{params}`` that takes nothing in (a hung
    process, a proxy that stopped forwarding), its connection open."""
    host, port = url.removeprefix("http://").split(":")
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect((host, int(port)))
    reader.sendall(
        f"GET /v1/inbox/stream?{params} HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    return reader


def _until_closed(reader: socket.socket, within: float) -> None:
    """Read what the hub wrote to ``reader`` until it closes the connection (the
    stream's end, its give-backs done), for at most ``within`` seconds."""
    reader.settimeout(within)
    while reader.recv(1 << 20):
        pass


class _HeldGiveBacks:
    """Holds back a hub's give-backs (its ``release``) until :attr:`go` is set:
    :attr:`entered` is set when the first one waits."""

    def __init__(self, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = asyncio.Event()
        self.go = asyncio.Event()
        release = hub.release

        async def held(*args: Any, **kwargs: Any) -> int:
            self.entered.set()
            await self.go.wait()
            return await release(*args, **kwargs)

        monkeypatch.setattr(hub, "release", held)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["on the same hub", "on another hub"])
async def test_a_stream_opened_again_before_the_old_one_gave_back_sends_each_message_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # a stream's reader stops taking anything in; its client opens the stream again
    # under the same receive_id (on the same hub, or on another hub on the same store)
    # before the old stream's end gives back what it held. Before, the new stream sent
    # those messages (a read: they stayed under the old lease) and the old one's
    # give-back then put them back in the queue: the next receive got each again, a
    # second time to the model. Now the new stream holds each under a lease of its own,
    # and the old one gives back only the leases it holds: nothing goes back
    async with _serving(tmp_path, stream_write_timeout=1.0) as (hub, url, tokens):
        held = _HeldGiveBacks(hub, monkeypatch)
        other = hub if where == "on the same hub" else _hub(tmp_path)
        async with contextlib.AsyncExitStack() as stack:
            again_url = url if other is hub else await stack.enter_async_context(_served(other))
            ids = await _send(hub, 32, "x" * 200_000)
            name = "rcv-again"
            reader = _stalled_reader(url, tokens["b"], f"receive_id={name}")
            try:
                await asyncio.wait_for(held.entered.wait(), 30)  # stalled, giving back
                got = await _events(again_url, tokens["b"], 32, 30, {"receive_id": name})
                assert got == [("message", (i, 1)) for i in ids]
                held.go.set()
                await asyncio.to_thread(_until_closed, reader, 30)
            finally:
                reader.close()
            states = [(await other.message_status("t", i)).state for i in ids]
            assert states == [DeliveryState.LEASED] * 32  # none went back to the queue
            async with httpx.AsyncClient(base_url=again_url) as b:
                headers = {"Authorization": f"Bearer {tokens['b']}"}
                r = await b.post("/v1/inbox/ack", json={"message_ids": ids}, headers=headers)
                assert r.json() == {"acked": 32, "not_held": []}


@pytest.mark.slow
async def test_a_stream_resumed_after_last_event_id_before_the_old_one_gave_back_keeps_what_was_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the old stream leased "seen" (one lease), then a window of big messages (a later
    # lease), and its reader stopped taking anything in; the client opens the stream
    # again with Last-Event-ID naming the first big one (it saw "seen" and that one).
    # The new stream sends the rest; the old one's give-back, held back until then,
    # must not put "seen" (nor the first big one) back in the queue: the reader has them
    async with _serving(tmp_path, stream_write_timeout=1.0) as (hub, url, tokens):
        held = _HeldGiveBacks(hub, monkeypatch)
        name = "rcv-resumed"
        [seen] = await _send(hub, 1, "seen")
        await hub.receive("t", "b", limit=1, receive_id=name, fresh=True)
        big = await _send(hub, 31, "x" * 200_000)
        reader = _stalled_reader(url, tokens["b"], f"receive_id={name}")
        try:
            await asyncio.wait_for(held.entered.wait(), 30)  # stalled, giving back
            params = {"receive_id": name}
            got = await _events(url, tokens["b"], 30, 30, params, last=big[0])
            assert got == [("message", (i, 1)) for i in big[1:]]
            held.go.set()
            await asyncio.to_thread(_until_closed, reader, 30)
        finally:
            reader.close()
        states = [(await hub.message_status("t", i)).state for i in [seen, *big]]
        assert states == [DeliveryState.LEASED] * 32  # none went back to the queue


async def test_a_stream_opened_under_the_name_of_one_still_open_supersedes_it(
    tmp_path: Path,
) -> None:
    # a stream whose reader is gone with its connection still open, and the stream its
    # client opened again under the same receive_id. Before, both leased the member's
    # messages into one window: a message the old one leased went to nobody and waited
    # out its lease. Now the new one supersedes the old one: the old one ends (with an
    # error saying why), the new one sends what the name held, then all that comes
    name = {"receive_id": "rcv-twice"}
    async with _serving(tmp_path) as (hub, url, tokens):
        [seen] = await _send(hub, 1, "seen by the old stream")
        old: list[tuple[str, Any]] = []
        new: list[tuple[str, Any]] = []
        reading = [asyncio.create_task(_events(url, tokens["b"], 99, 30, name, got=old))]
        try:
            await eventually(lambda: len(old) >= 1, what="the old stream to send")
            reading.append(asyncio.create_task(_events(url, tokens["b"], 99, 30, name, got=new)))
            await eventually(lambda: len(old) >= 2, what="the old stream to end")
            assert old == [("message", (seen, 1)), ("error", "invalid_state")]
            await eventually(lambda: len(new) >= 1, what="the new stream to send")
            later = await _send(hub, 3, "later")
            await eventually(lambda: len(new) >= 4, what="the new stream to send the rest")
            assert new == [("message", (i, 1)) for i in [seen, *later]]
        finally:
            await _cancelled(reading)


@pytest.mark.slow
async def test_a_stream_opened_again_on_another_hub_supersedes_the_one_still_open(
    tmp_path: Path,
) -> None:
    # the same on two hubs on one store: the old stream is not told by its hub, and
    # before it went on leasing the member's messages beside the new one. Now, at its
    # next look at its window (at the latest at its keep-alive), it sees the stream
    # opened again has sent what it sent, and ends; what it wrote after goes back to
    # the queue, and the new stream sends it: each message reaches the new reader once
    name = {"receive_id": "rcv-two-hubs"}
    async with _serving(tmp_path) as (hub, url, tokens), _served(_hub(tmp_path)) as again_url:
        [seen] = await _send(hub, 1, "seen by the old stream")
        old: list[tuple[str, Any]] = []
        new: list[tuple[str, Any]] = []
        reading = [asyncio.create_task(_events(url, tokens["b"], 99, 60, name, got=old))]
        try:
            await eventually(lambda: len(old) >= 1, what="the old stream to send")
            reading.append(
                asyncio.create_task(_events(again_url, tokens["b"], 99, 60, name, got=new))
            )
            await eventually(lambda: len(new) >= 1, what="the new stream to send again")
            [later] = await _send(hub, 1, "later")  # wakes the old stream's hub
            await eventually(
                lambda: ("error", "invalid_state") in old,
                what="the old stream to end",
                within=25,
            )
            await eventually(lambda: len(new) >= 2, what="the new stream to send the rest")
            assert [e[1][0] for e in new] == [seen, later]
            assert old[0] == ("message", (seen, 1))
            assert old[-1] == ("error", "invalid_state")
        finally:
            await _cancelled(reading)


async def test_a_streams_hold_on_its_name_dropped_unclosed_leaves_nothing(tmp_path: Path) -> None:
    # a stream whose body never ran (its client gone before the first write) never
    # closes its hold on its name: the hub holds it weakly, so streams opened under
    # names of their own and dropped so do not pile up in the hub
    hub = _hub(tmp_path)
    try:
        woken = asyncio.Event()
        hold = hub.open_stream("t", "b", "rcv-dropped", woken)
        dropped = weakref.ref(hold)
        del hold
        gc.collect()
        assert dropped() is None
        later = hub.open_stream("t", "b", "rcv-dropped", asyncio.Event())
        assert not woken.is_set()  # nothing was left to supersede
        hub.close_stream("t", "b", "rcv-dropped", later)
    finally:
        await hub.close()


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
async def test_a_stream_opened_again_on_another_hub_ends_the_old_one_at_once(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    # the old stream (its connection open, its reader gone) is on hub A, the stream
    # opened again under its name on hub B of the same store. Before, A's stream went on
    # (beside B's) until its next look at its window: at the latest its 15 s keep-alive,
    # nothing else waking it. Now B's resend wakes A at once through the store's wake-up
    # between hubs (PostgreSQL's NOTIFY: its fallback timer is off here; SQLite's look at
    # the file's version), and A's stream ends within a second or two
    if store == "sqlite":

        def make() -> Hub:
            return _hub(tmp_path)
    else:
        from backchannel.stores.postgres import PostgresStore

        db = request.getfixturevalue("new_postgres_url")()

        def make() -> Hub:
            return Hub(PostgresStore(db, fallback_interval=3600))

    name = {"receive_id": "rcv-told"}
    hub = make()
    async with _served(hub) as url:
        await hub.create_team("t")
        tokens = {m: (await hub.add_member("t", m))[1] for m in ("a", "b")}
        async with _served(make()) as again_url:
            [seen] = await _send(hub, 1, "seen by the old stream")
            old: list[tuple[str, Any]] = []
            new: list[tuple[str, Any]] = []
            reading = [asyncio.create_task(_events(url, tokens["b"], 99, 60, name, got=old))]
            try:
                await eventually(lambda: len(old) >= 1, what="the old stream to send")
                reading.append(
                    asyncio.create_task(_events(again_url, tokens["b"], 99, 60, name, got=new))
                )
                await eventually(lambda: len(new) >= 1, what="the new stream to send again")
                await eventually(
                    lambda: ("error", "invalid_state") in old,
                    what="the old stream to end",
                    within=3,
                )
                assert old == [("message", (seen, 1)), ("error", "invalid_state")]
                [later] = await _send(hub, 1, "later")
                await eventually(lambda: len(new) >= 2, what="the new stream to send the rest")
                assert new == [("message", (seen, 1)), ("message", (later, 1))]
            finally:
                await _cancelled(reading)


@pytest.mark.slow
async def test_a_stream_whose_reader_stopped_reading_closes_its_connection(
    tmp_path: Path,
) -> None:
    # a reader that takes nothing in, its connection open. Before, the stream ended after
    # its write bound and gave back what it held, but the connection stayed open for as
    # long as the reader kept it (the server's close waits for the bytes in its buffer
    # to be taken, which they never are): a socket and its buffers per dead reader. Now
    # the connection is cut when the stream ends
    hub = _hub(tmp_path, stream_write_timeout=1.0)
    async with _server(hub) as (server, url):
        await hub.create_team("t")
        tokens = {m: (await hub.add_member("t", m))[1] for m in ("a", "b")}
        ids = await _send(hub, 40, "x" * 200_000)
        reader = _stalled_reader(url, tokens["b"], "receive_id=rcv-stalled")
        try:
            # the stream leases first, or the other receiver may take everything before
            # it and leave it nothing to write (nothing then stalls, nothing is cut)
            await eventually(
                lambda: hub.holding("t", "b", "rcv-stalled", 40),
                what="the stalled stream to lease its first batch",
            )
            got = await _taken(url, tokens["b"], 40, within=15)
            assert sorted(m["message_id"] for m in got) == sorted(ids)
            state = server.server_state
            await eventually(
                lambda: not state.connections and not state.tasks,
                what="the stalled stream's connection to close",
                within=10,
                show=lambda: (len(state.connections), len(state.tasks)),
            )
            # the name is free: a stream opened under it is sent all that comes, once
            [later] = await _send(hub, 1, "later")
            params = {"receive_id": "rcv-stalled"}
            assert await _events(url, tokens["b"], 1, 10, params) == [("message", (later, 1))]
        finally:
            reader.close()


async def test_a_stream_whose_client_left_before_its_body_started_gives_back_its_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the client sent the request and left (or a proxy gave up on it) while the stream
    # leased its first batch: the response's body then never starts. Before, that batch
    # stayed leased to nobody for the whole lease (60 s) and came back as a second
    # attempt; now it goes back at once, untried
    from backchannel.member import MemberApi

    lease_first = MemberApi.stream_receive
    go = asyncio.Event()

    async def held_first(self: MemberApi, *args: Any, **kwargs: Any) -> Any:
        await go.wait()
        return await lease_first(self, *args, **kwargs)

    monkeypatch.setattr(MemberApi, "stream_receive", held_first)
    hub = _hub(tmp_path)
    async with _server(hub) as (server, url):
        await hub.create_team("t")
        tokens = {m: (await hub.add_member("t", m))[1] for m in ("a", "b")}
        ids = await _send(hub, 3)
        reader = _stalled_reader(url, tokens["b"], "receive_id=rcv-left")
        state = server.server_state
        await eventually(lambda: state.tasks, what="the stream's request to start")
        reader.close()
        await eventually(lambda: not state.connections, what="the server to see the client go")
        go.set()
        await eventually(lambda: not state.tasks, what="the stream's request to end")
        monkeypatch.setattr(MemberApi, "stream_receive", lease_first)
        got = await _taken(url, tokens["b"], 3, within=5)
        assert [(m["message_id"], m["attempt"]) for m in got] == [(i, 1) for i in ids]


@pytest.mark.parametrize("acked", [3, 1], ids=["all acked", "the last acked"])
async def test_a_stream_resumed_after_an_acked_message_sends_none_up_to_it(
    tmp_path: Path, acked: int
) -> None:
    # the reader saw three messages and acked all of them, or only the last (it works
    # on the others still), then reconnects with Last-Event-ID naming the last, which
    # its name no longer holds. Before, with only the last acked, the stream sent again
    # all the name held, the two the reader had seen with them; now it sends none of
    # the three, and what comes next, once; those not acked are still the name's
    async with _serving(tmp_path) as (hub, url, tokens):
        ids = await _send(hub, 3)
        params = {"receive_id": "rcv-acked"}
        got = await _events(url, tokens["b"], 3, 10, params)
        assert got == [("message", (i, 1)) for i in ids]
        headers = {"Authorization": f"Bearer {tokens['b']}"}
        async with httpx.AsyncClient(base_url=url, headers=headers) as b:
            r = await b.post("/v1/inbox/ack", json={"message_ids": ids[-acked:]})
            assert r.json()["acked"] == acked
            seen: list[tuple[str, Any]] = []
            reading = asyncio.create_task(
                _events(url, tokens["b"], 99, 30, params, last=ids[-1], got=seen)
            )
            try:
                [later] = await _send(hub, 1, "later")
                await eventually(lambda: seen, what="the stream to send what came next")
                [more] = await _send(hub, 1, "more")
                await eventually(lambda: len(seen) >= 2, what="the stream to send the next")
                assert seen == [("message", (later, 1)), ("message", (more, 1))]
            finally:
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
            rest = [*ids[: 3 - acked], later, more]
            r = await b.post("/v1/inbox/ack", json={"message_ids": rest})
            assert r.json()["acked"] == len(rest)


@pytest.mark.slow
async def test_a_stream_opened_again_on_another_hub_process_ends_the_old_one_at_once(
    tmp_path: Path,
) -> None:
    # the same with two ``backchannel serve`` processes on one SQLite file: the second
    # process's resend reaches the first through the file's version, which its writer
    # looks at every quarter second when idle
    from tests.conftest import start_server

    store = f"sqlite://{tmp_path / 'shared.db'}"
    one = start_server(tmp_path / "one", store)
    two = None
    try:
        two = start_server(tmp_path / "two", store)
        tokens = await asyncio.to_thread(one.team, "t", "a", "b")
        name = {"receive_id": "rcv-processes"}
        async with httpx.AsyncClient(base_url=one.url) as c:
            r = await c.post(
                "/v1/messages",
                json={"to": "b", "text": "seen by the old stream"},
                headers={"Authorization": f"Bearer {tokens['a']}"},
            )
            seen = r.json()["message_id"]
        old: list[tuple[str, Any]] = []
        new: list[tuple[str, Any]] = []
        reading = [asyncio.create_task(_events(one.url, tokens["b"], 99, 60, name, got=old))]
        try:
            await eventually(lambda: len(old) >= 1, what="the old stream to send")
            reading.append(
                asyncio.create_task(_events(two.url, tokens["b"], 99, 60, name, got=new))
            )
            await eventually(lambda: len(new) >= 1, what="the new stream to send again")
            await eventually(
                lambda: ("error", "invalid_state") in old, what="the old stream to end", within=3
            )
            assert old == [("message", (seen, 1)), ("error", "invalid_state")]
            assert new == [("message", (seen, 1))]
        finally:
            await _cancelled(reading)
    finally:
        if two is not None:
            two.stop()
        one.stop()
