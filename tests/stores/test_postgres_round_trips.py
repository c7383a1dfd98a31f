"""How many network round trips a send, a receive and an ack take on PostgreSQL, counted
on the wire: a loopback relay between the hub and a real server counts, per connection,
each time the client speaks again after the server answered.

Every write of a team holds the team's lock until its ``COMMIT``, so one team's writes
go one at a time across all hubs, each for as many round trips as it makes under the
lock: the fewer, the more sends a team takes per second (bench/README.md). A send
begins, takes the lock and makes every read its checks need in one round trip
(``Tx.prefetch``), stores the message in a second, commits (with its history and
budgets) in a third, and wakes the other hubs after the commit in a fourth.
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

#: a send: BEGIN + lock + reads; the insert; history + COMMIT; NOTIFY after the commit
SEND = 4
#: a receive that leases: BEGIN + lock + reads; the lease; history + budgets + COMMIT
RECEIVE = 3
#: an ack: BEGIN + lock + the ack; history + COMMIT
ACK = 2


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


async def test_a_send_takes_four_round_trips(counted: tuple[Hub, RoundTrips]) -> None:
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
