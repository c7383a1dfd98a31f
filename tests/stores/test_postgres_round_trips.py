"""How many network round trips a send, a receive and an ack take on PostgreSQL, counted
on the wire: a loopback relay between the hub and a real server counts, per connection,
each time the client speaks again after the server answered.

Every write of a team holds the team's lock until its ``COMMIT``, so one team's writes
go one at a time across all hubs, each for as many round trips as it makes under the
lock: the fewer, the more sends a team takes per second (bench/README.md). A send
begins, takes the lock and makes every read its checks need in one round trip
(``Tx.prefetch``), stores the message in a second, and commits (with its history and
budgets) in a third, whose pipeline wakes the other hubs after the ``COMMIT``. A write
whose answer nobody reads (a session row, a transcript event, a link's count, the
ledger cleared) goes in the round trip of the statement after it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from backchannel.hub import Hub
from backchannel.stores.postgres import PostgresStore

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

#: a send: BEGIN + lock + reads; the insert; history + COMMIT + NOTIFY after it
SEND = 3
#: a receive that leases: BEGIN + lock + reads; the lease; history + budgets + COMMIT
RECEIVE = 3
#: an ack: BEGIN + lock + the ack; history + COMMIT
ACK = 2
#: a turn's steps (a receive naming the session records what it handed over, so it
#: reads the session, its link and the context budget, and writes the transcript)
TURN = {"receive+ack": 6, "turn_start": 5, "agent_stop, one link": 7, "agent_stop, no link": 3}


class RoundTrips:
    """A TCP relay to ``target`` that counts round trips per connection it carries."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._lock = threading.Lock()
        self.trips: list[int] = []  # by connection, in the order they were accepted
        self._socks: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        where = f"127.0.0.1:{self.port}"
        return urlunsplit(
            parts._replace(netloc=f"{netloc[0]}@{where}" if len(netloc) == 2 else where)
        )

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                return
            upstream.settimeout(None)
            with self._lock:
                index = len(self.trips)
                self.trips.append(0)
                self._socks += [client, upstream]
            answered = [True]  # the server spoke since the client last did

            def up(src: socket.socket = client, dst: socket.socket = upstream, i: int = index,
                   answered: list[bool] = answered) -> None:  # fmt: skip
                with contextlib.suppress(OSError):
                    while data := src.recv(65536):
                        with self._lock:
                            if answered[0]:
                                self.trips[i] += 1
                                answered[0] = False
                        dst.sendall(data)

            def down(src: socket.socket = upstream, dst: socket.socket = client,
                     answered: list[bool] = answered) -> None:  # fmt: skip
                with contextlib.suppress(OSError):
                    while data := src.recv(65536):
                        with self._lock:
                            answered[0] = True
                        dst.sendall(data)

            threading.Thread(target=up, daemon=True).start()
            threading.Thread(target=down, daemon=True).start()

    @contextlib.contextmanager
    def counting(self) -> Iterator[list[int]]:
        """Inside, the round trips made; after, ``[n]``: the most made on one connection
        (a transaction runs on one; the listener's heartbeat on its own is not counted
        with it)."""
        with self._lock:
            before = list(self.trips)
        out: list[int] = []
        yield out
        with self._lock:
            now = list(self.trips)
        before += [0] * (len(now) - len(before))
        out.append(max(n - b for n, b in zip(now, before, strict=True)))

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._socks:
                with contextlib.suppress(OSError):
                    s.close()


@pytest.fixture
async def counted(new_postgres_url: Callable[[], str]) -> AsyncIterator[tuple[Hub, RoundTrips]]:
    url = new_postgres_url()
    parts = urlsplit(url)
    relay = RoundTrips((parts.hostname or "127.0.0.1", parts.port or 5432))
    store = PostgresStore(relay.url(url))
    await store.open()
    hub = Hub(store, background=False)  # no timers or scans of its own in between
    try:
        async with hub:
            await hub.create_team("t", settings={"anchor_policy": "off"})
            for name in ("a", "b"):
                await hub.add_member("t", name)
            await hub.send("t", "a", "b", "warm-up", link=False)  # the pool's connection
            await hub.ack("t", "b", [m.message.message_id for m in await hub.receive("t", "b")])
            yield hub, relay
    finally:
        await store.close()
        relay.close()


async def _least(relay: RoundTrips, times: int, op: Callable[[int], Awaitable[None]]) -> int:
    """The fewest round trips ``op`` took in ``times`` runs (a first run may open a
    connection of the pool; anything else running at once only adds)."""
    seen = []
    for i in range(times):
        with relay.counting() as trips:
            await op(i)
        seen.append(trips[0])
    return min(seen)


async def test_a_send_takes_three_round_trips(counted: tuple[Hub, RoundTrips]) -> None:
    hub, relay = counted

    async def send(i: int) -> None:
        await hub.send("t", "a", "b", f"hello {i}", link=False)

    async def send_with_id(i: int) -> None:  # the replay check reads the message too
        await hub.send("t", "a", "b", f"again {i}", message_id=f"client-{i}", link=False)

    assert await _least(relay, 3, send) <= SEND
    assert await _least(relay, 3, send_with_id) <= SEND
    got = await hub.receive("t", "b", limit=100)
    assert sorted(m.message.text for m in got) == sorted(
        [f"hello {i}" for i in range(3)] + [f"again {i}" for i in range(3)]
    )


async def test_a_receive_and_an_ack_take_three_and_two(counted: tuple[Hub, RoundTrips]) -> None:
    hub, relay = counted
    leased: list[str] = []

    async def receive(i: int) -> None:
        await hub.send("t", "a", "b", f"for the lease {i}", link=False)
        with relay.counting() as trips:
            got = await hub.receive("t", "b", limit=10)
        assert [m.message.text for m in got] == [f"for the lease {i}"]
        leased.append(got[0].message.message_id)
        seen.append(trips[0])

    seen: list[int] = []
    for i in range(3):
        await receive(i)
    assert min(seen) <= RECEIVE

    async def ack(i: int) -> None:
        assert (await hub.ack("t", "b", [leased[i]])).acked == (leased[i],)

    assert await _least(relay, 3, ack) <= ACK


async def _turns(counted: tuple[Hub, RoundTrips]) -> dict[str, int]:
    """The fewest round trips each step of a turn took, over three turns: the input it
    received and acked, the turn's start, and its end with the closing text crossing one
    link or none."""
    hub, relay = counted
    for name in ("c", "d"):
        await hub.add_member("t", name)
    for s in ("a-s", "b-s", "c-s", "d-s"):
        await hub.open_session("t", s[0], s)
    # a and b linked (a's send in a turn opens it); c alone
    await hub.report_event("t", "a", "a-s", "turn_start")
    await hub.send("t", "a", "b", "let's talk", sender_session="a-s")
    await hub.report_event("t", "a", "a-s", "agent_stop", "")
    for m in ("a", "b"):
        if got := await hub.receive("t", m, session=f"{m}-s", limit=100):
            await hub.ack("t", m, [g.message.message_id for g in got])
    seen: dict[str, list[int]] = {}

    async def count(step: str, op: Awaitable[object]) -> None:
        with relay.counting() as trips:
            await op
        seen.setdefault(step, []).append(trips[0])

    for i in range(3):
        await hub.send("t", "d", "b", f"note {i}", link=False)
        with relay.counting() as trips:
            got = await hub.receive("t", "b", session="b-s", limit=10)
            await hub.ack("t", "b", [g.message.message_id for g in got])
        seen.setdefault("receive+ack", []).append(trips[0])
        assert [g.message.text for g in got] == [f"note {i}"]
        await count("turn_start", hub.report_event("t", "b", "b-s", "turn_start", f"note {i}"))
        await count(
            "agent_stop, one link",
            hub.report_event("t", "b", "b-s", "agent_stop", f"my view, round {i}"),
        )
        got = await hub.receive("t", "a", session="a-s", limit=10)
        assert [g.message.text for g in got] == [f"[From b] my view, round {i}"]
        await hub.ack("t", "a", [g.message.message_id for g in got])
        await hub.report_event("t", "c", "c-s", "turn_start")
        await count(
            "agent_stop, no link", hub.report_event("t", "c", "c-s", "agent_stop", f"done {i}")
        )
    return {step: min(n) for step, n in seen.items()}


async def test_a_turns_steps_take_as_many_round_trips_as_pinned(
    counted: tuple[Hub, RoundTrips],
) -> None:
    got = await _turns(counted)
    assert got == TURN, got


async def test_a_wake_up_that_fails_after_the_commit_fails_no_send(
    counted: tuple[Hub, RoundTrips], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``NOTIFY`` rides in the ``COMMIT``'s pipeline: when it fails there (here a
    division by zero the server raises; in life a full notification queue, or the
    connection lost after the commit), the send was committed and is answered as such,
    the message is delivered, and the next send goes through on a fresh connection."""
    from backchannel.stores.postgres import transaction

    hub, _ = counted
    monkeypatch.setattr(
        transaction, "_NOTIFY", transaction._NOTIFY.replace("AS p", "AS p WHERE 1 / 0 = 1")
    )
    sent = await hub.send("t", "a", "b", "committed, unannounced", link=False)
    monkeypatch.undo()
    again = await hub.send("t", "a", "b", "and the next one", link=False)
    got = await hub.receive("t", "b", limit=10)
    assert [m.message.message_id for m in got] == [sent.message_id, again.message_id]
