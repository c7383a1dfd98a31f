"""The push dispatcher when the store goes away between a push and its record: the push
happened, so the worker records it once the store is back, before it pushes anything
else. Left leased, the copy would come back when its lease ran out and be pushed a
second time, after the messages sent later."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from backchannel.delivery.adapters import ADAPTERS
from backchannel.delivery.base import Adapter, AdapterContext
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.hub import Hub
from backchannel.stores.postgres import PostgresStore
from backchannel.testing import eventually
from backchannel.types import InboxMessage
from tests.delivery.conftest_adapters import FAST_RETRY
from tests.stores.test_postgres_hubs import Proxy

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

OUTAGE_S = 5.0  # how long the database host is away after the first push


@dataclass
class Cut:
    """Pushes recorded in order; the first push takes the database away for a moment."""

    proxy: Proxy
    outage_s: float = OUTAGE_S
    got: list[str] = field(default_factory=list)
    back: threading.Event = field(default_factory=threading.Event)
    back_at: float = 0.0
    pushed_at: list[float] = field(default_factory=list)

    def push(self, text: str) -> None:
        self.got.append(text)
        self.pushed_at.append(time.monotonic())
        if len(self.got) == 1:
            self.proxy.down()  # the push is done; recording it will fail
            timer = threading.Timer(self.outage_s, self._up)
            timer.daemon = True
            timer.start()

    def _up(self) -> None:
        self.proxy.up()
        self.back_at = time.monotonic()
        self.back.set()


@dataclass
class Recorded:
    got: list[str] = field(default_factory=list)


class RecAdapter(Adapter):
    type = "rec"

    def __init__(self, ctx: AdapterContext, pushed: Recorded) -> None:
        super().__init__(ctx)
        self.pushed = pushed
        self.retry = FAST_RETRY
        self.attempt_timeout = FAST_RETRY.timeout

    async def deliver(self, item: InboxMessage) -> str:
        self.pushed.got.append(item.message.text)
        return "pushed"


class CutAdapter(Adapter):
    type = "cut"

    def __init__(self, ctx: AdapterContext, cut: Cut) -> None:
        super().__init__(ctx)
        self.cut = cut
        self.retry = FAST_RETRY
        self.attempt_timeout = FAST_RETRY.timeout

    async def deliver(self, item: InboxMessage) -> str:
        self.cut.push(item.message.text)
        return "pushed"


async def test_a_push_whose_record_failed_is_recorded_when_the_store_is_back_not_pushed_again(
    new_postgres_url: Callable[[], str],
) -> None:
    url = new_postgres_url()
    parts = urlsplit(url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    cut = Cut(proxy)
    store = PostgresStore(proxy.url(url), connect_timeout=2, fallback_interval=0.5)
    # a short lease: a copy left leased comes back (and is pushed again) within seconds
    async with Hub(store, lease_seconds=1.0, check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery={"type": "cut"})
        sent = [
            (await hub.send("t", "user", "p", f"m{i}", link=False)).message_id for i in range(5)
        ]
        d = Dispatcher(
            hub,
            adapters={**ADAPTERS, "cut": lambda ctx: CutAdapter(ctx, cut)},
            rescan_s=0.5,
            wait_s=0.5,
        )
        await d.start()
        try:

            async def all_acked() -> bool:
                if not cut.back.is_set():
                    return False
                try:
                    states = [(await hub.message_status("t", m)).state.value for m in sent]
                except Exception:  # the store is still coming back
                    return False
                return all(s == "acked" for s in states)

            await eventually(all_acked, within=40, what="every copy acked", show=lambda: cut.got)
        finally:
            await d.stop()
            proxy.down()
    assert cut.got == [f"m{i}" for i in range(5)], "each message pushed once, in send order"


@pytest.mark.slow
async def test_after_a_long_outage_pushing_resumes_within_seconds_of_the_store_coming_back(
    new_postgres_url: Callable[[], str],
) -> None:
    """The worker tries again to record a push while the store is away, less and less
    often; once the store is back the next try must come soon, not after a pause that
    grew through a long outage (it grew to 16 s, then 30 s, pushing nothing meanwhile)."""
    url = new_postgres_url()
    parts = urlsplit(url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    cut = Cut(proxy, outage_s=24.0)
    store = PostgresStore(proxy.url(url), connect_timeout=2, fallback_interval=0.5)
    async with Hub(store, lease_seconds=30.0, check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery={"type": "cut"})
        for i in range(3):
            await hub.send("t", "user", "p", f"m{i}", link=False)
        d = Dispatcher(
            hub,
            adapters={**ADAPTERS, "cut": lambda ctx: CutAdapter(ctx, cut)},
            rescan_s=0.5,
            wait_s=0.5,
        )
        await d.start()
        try:
            await eventually(lambda: len(cut.got) >= 3, within=60, what="every message pushed",
                             show=lambda: cut.got)  # fmt: skip
        finally:
            await d.stop()
            proxy.down()
    assert cut.got == ["m0", "m1", "m2"]
    resumed = cut.pushed_at[1] - cut.back_at
    assert resumed < 5.0, f"the next push came {resumed:.1f} s after the store was back"


SYNC = b"S\x00\x00\x00\x04"  # the frontend's Sync message


class CommitCut(Proxy):
    """A proxy that, once armed, loses the connection of the first transaction that
    commits a lease: the ``COMMIT`` reaches PostgreSQL (which applies it), its answer
    never reaches the hub, which learns only that the outcome is unknown."""

    def __init__(self, host: str, port: int) -> None:
        self.armed = False
        self.fired = threading.Event()
        super().__init__(host, port)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target, timeout=5)
            upstream.settimeout(None)
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pipe_in, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe_in(self, client: socket.socket, upstream: socket.socket) -> None:
        committing = False
        try:
            while data := client.recv(65536):
                upstream.sendall(data)
                # a lease's history rows ("leased", "attempt 1") are written with its COMMIT,
                # and the pipeline ends with a Sync message
                if self.armed and b"leased" in data and b"attempt " in data:
                    self.armed, committing = False, True
                if committing and data.endswith(SYNC):
                    client.shutdown(socket.SHUT_RDWR)  # the answer is lost on the way
                    self.fired.set()
                    return
        except OSError:
            pass


async def test_a_lease_whose_commit_answer_was_lost_does_not_let_later_messages_overtake(
    new_postgres_url: Callable[[], str],
) -> None:
    """The connection is lost while a worker's lease commits: the lease is applied, the
    worker hears only that its receive failed. The copies it leased must go out before
    the messages sent after them, not when their lease runs out."""
    url = new_postgres_url()
    parts = urlsplit(url)
    proxy = CommitCut(parts.hostname or "127.0.0.1", parts.port or 5432)
    pushed = Recorded()
    store = PostgresStore(proxy.url(url), connect_timeout=2, fallback_interval=0.5)
    async with Hub(store, lease_seconds=1.0, check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery={"type": "rec"})
        d = Dispatcher(
            hub,
            adapters={**ADAPTERS, "rec": lambda ctx: RecAdapter(ctx, pushed)},
            rescan_s=0.5,
            wait_s=0.5,
        )
        await d.start()
        sent: list[str] = []
        try:
            for i in range(3):
                sent.append((await hub.send("t", "user", "p", f"m{i}", link=False)).message_id)
            await eventually(lambda: len(pushed.got) >= 3, what="the first pushes")
            proxy.armed = True
            for i in range(3, 6):
                sent.append((await hub.send("t", "user", "p", f"m{i}", link=False)).message_id)
            await eventually(proxy.fired.is_set, what="a lease's commit answer lost")
            for i in range(6, 9):
                sent.append((await hub.send("t", "user", "p", f"m{i}", link=False)).message_id)

            async def all_acked() -> bool:
                states = [(await hub.message_status("t", m)).state.value for m in sent]
                return all(s == "acked" for s in states)

            await eventually(all_acked, within=40, what="every copy acked", show=lambda: pushed.got)
        finally:
            # the relay first: a store thread still waiting on the connection whose answer
            # was lost (a test that failed or timed out) then fails instead of holding the
            # dispatcher's stop, and the test's teardown, without end
            proxy.down()
            await d.stop()
    assert pushed.got == [f"m{i}" for i in range(9)], "each message pushed once, in send order"


@pytest.mark.slow
async def test_a_worker_idle_through_a_long_outage_pushes_soon_after_the_store_is_back(
    new_postgres_url: Callable[[], str],
) -> None:
    """A worker waiting for messages when the store went away tried again less and less
    often (its pause doubled up to 30 s); once the store was back, the next message for
    its member waited out that pause, though the push lease had been renewed long
    before. The dispatcher wakes its pausing workers when it sees the store back."""
    url = new_postgres_url()
    parts = urlsplit(url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    pushed = Recorded()
    store = PostgresStore(proxy.url(url), connect_timeout=1, fallback_interval=0.5)
    async with Hub(store, check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery={"type": "rec"})
        d = Dispatcher(
            hub,
            adapters={**ADAPTERS, "rec": lambda ctx: RecAdapter(ctx, pushed)},
            rescan_s=0.5,
            wait_s=0.5,
            ownership_s=120.0,  # the lease outlasts the outage: the worker keeps its member
        )
        await d.start()
        try:
            worker = d._workers[("t", "p")]
            proxy.down()
            await eventually(
                lambda: worker.outage.pause >= 16.0,
                within=60,
                what="the worker's pause to grow through the outage",
            )
            proxy.up()
            back_at = time.monotonic()

            async def sent() -> bool:
                try:
                    await hub.send("t", "user", "p", "after", link=False, message_id="after")
                except Exception:  # the store's pool is still reconnecting
                    return False
                return True

            await eventually(sent, within=20, what="a send once the store is back")
            await eventually(lambda: pushed.got == ["after"], within=40, what="the push")
            resumed = time.monotonic() - back_at
            assert d._workers.get(("t", "p")) is worker
        finally:
            await d.stop()
            proxy.down()
    assert resumed < 6.0, f"pushed {resumed:.1f} s after the store was back"
