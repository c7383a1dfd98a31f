"""Several hubs on one store: each member's push delivery is owned by one hub at a time,
through a lease that moves on failover (driven here by a FakeClock)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backchannel.delivery.adapters import ADAPTERS, AdapterFactory
from backchannel.delivery.base import Adapter, AdapterContext, PermanentDeliveryError
from backchannel.delivery.dispatcher import Dispatcher
from backchannel.delivery.ownership import Ownership
from backchannel.hub import Hub
from backchannel.stores.base import Store, Tx
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, MemoryStore, eventually
from backchannel.types import InboxMessage
from tests.delivery.conftest_adapters import FAST_RETRY

# a lease and a scan period far beyond any test's run time: only the FakeClock moves
# leases, and scans happen when a test calls rescan()
LONG = 1000.0


@dataclass
class Pushed:
    got: list[tuple[str, str]] = field(default_factory=list)  # (hub name, text)

    def texts(self) -> list[str]:
        return [t for _, t in self.got]


class Recorder(Adapter):
    type = "record"

    def __init__(self, ctx: AdapterContext, pushed: Pushed, name: str) -> None:
        super().__init__(ctx)
        self.pushed, self.name = pushed, name
        self.retry = FAST_RETRY

    async def deliver(self, item: InboxMessage) -> str:
        self.pushed.got.append((self.name, item.message.text))
        return "recorded"


def _adapters(pushed: Pushed, name: str) -> dict[str, AdapterFactory]:
    return {**ADAPTERS, "record": lambda ctx: Recorder(ctx, pushed, name)}


@dataclass
class Gates:
    """Pushes that wait, per hub, until the test lets them end (as told: ``fail`` ends
    them with a permanent failure)."""

    started: list[tuple[str, str]] = field(default_factory=list)  # (hub name, text)
    open: dict[str, asyncio.Event] = field(default_factory=dict)
    fail: set[str] = field(default_factory=set)

    def gate(self, name: str) -> asyncio.Event:
        return self.open.setdefault(name, asyncio.Event())


class Gated(Adapter):
    type = "record"

    def __init__(self, ctx: AdapterContext, gates: Gates, name: str) -> None:
        super().__init__(ctx)
        self.gates, self.name = gates, name
        self.retry = FAST_RETRY

    async def deliver(self, item: InboxMessage) -> str:
        self.gates.started.append((self.name, item.message.text))
        await self.gates.gate(self.name).wait()
        if self.name in self.gates.fail:
            raise PermanentDeliveryError("the pane is gone")
        return "recorded"


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Store, Store]:
    """One store seen by two hubs: a shared in-memory store, two connections to one
    SQLite file (as two ``serve`` processes on one file have), or two to one PostgreSQL
    database."""
    if request.param == "memory":
        shared = MemoryStore()
        return shared, shared
    if request.param == "postgres":
        from backchannel.stores.postgres import PostgresStore

        url = request.getfixturevalue("new_postgres_url")()
        return PostgresStore(url), PostgresStore(url)
    return SqliteStore(tmp_path / "one.db"), SqliteStore(tmp_path / "one.db")


@asynccontextmanager
async def two_hubs(clock: FakeClock, stores: tuple[Store, Store]) -> AsyncIterator[tuple[Hub, Hub]]:
    """Two hubs on one store and one clock, with team ``t`` and push member ``p``."""
    a = Hub(stores[0], clock=clock, check_delivery=False)
    b = Hub(stores[1], clock=clock, check_delivery=False)
    async with a, b:
        await a.create_team("t", settings={"anchor_policy": "off"})
        await a.add_member("t", "p", delivery={"type": "record"})
        yield a, b


def _dispatcher(
    hub: Hub, pushed: Pushed, name: str, adapters: dict[str, AdapterFactory] | None = None
) -> Dispatcher:
    return Dispatcher(
        hub,
        adapters=adapters or _adapters(pushed, name),
        owner=name,
        ownership_s=LONG,
        rescan_s=LONG,
        wait_s=0.2,  # the hubs share a store but not their wake-ups
        grace_s=2.0,
    )


async def _owner(hub: Hub) -> str | None:
    row = await hub.store.read(lambda tx: tx.dispatch_owner("t", "p"))
    return row[0] if row else None


async def _history(hub: Hub, mid: str) -> list[tuple[str, str]]:
    return [(e.event, e.detail) for e in (await hub.message_status("t", mid)).history]


async def _pushed(pushed: Pushed, n: int) -> None:
    async def check() -> bool:
        return len(pushed.got) >= n

    await eventually(check, what=f"{n} pushes")


async def test_a_crashed_owners_member_moves_when_its_lease_runs_out(
    stores: tuple[Store, Store],
) -> None:
    clock = FakeClock()
    pushed = Pushed()
    async with two_hubs(clock, stores) as (a, b):
        sent = [(await a.send("t", "user", "p", f"m{i}", link=False)).message_id for i in range(3)]
        # hub "dead" owned p, leased m0 for a push, and died
        t0 = clock.now()
        assert await a.store.transact(lambda tx: tx.claim_dispatch("t", "p", "dead", t0, t0 + 10))
        got = await a.receive("t", "p", limit=1, owner="dead")
        assert [g.message.text for g in got] == ["m0"]

        d = _dispatcher(b, pushed, "b")
        await d.start()
        try:
            # the lease still runs: b serves nobody, and its receive would lease nothing
            assert d.status() == []
            assert await _owner(b) == "dead"
            assert await b.receive("t", "p", owner="b") == []
            clock.advance(10)  # the dead hub's lease runs out
            await d.rescan()
            assert await _owner(b) == "b"
            await _pushed(pushed, 3)
        finally:
            await d.stop()
        # the copy the dead hub held went out again first: order kept, nothing lost
        assert pushed.got == [("b", "m0"), ("b", "m1"), ("b", "m2")]
        assert ("released", "push delivery taken by b") in await _history(b, sent[0])
        assert (await b.message_status("t", sent[0])).deliveries[0].attempts == 2
        assert await _owner(b) is None, "a hub that stops gives its leases up"


async def test_a_graceful_stop_hands_over_at_once_and_order_is_kept(
    stores: tuple[Store, Store],
) -> None:
    clock = FakeClock()
    pushed = Pushed()
    async with two_hubs(clock, stores) as (a, b):
        da, db = _dispatcher(a, pushed, "a"), _dispatcher(b, pushed, "b")
        await da.start()
        await db.start()
        try:
            assert await _owner(a) == "a"
            assert [s.member for s in da.status()] == ["p"]
            assert db.status() == [], "one owner at a time"
            for i in range(5):
                await a.send("t", "user", "p", f"m{i}", link=False)
            await _pushed(pushed, 5)
            await da.stop()  # releases p at once: no waiting for the lease to run out
            await db.rescan()
            assert await _owner(b) == "b"
            for i in range(5, 10):
                await b.send("t", "user", "p", f"m{i}", link=False)
            await _pushed(pushed, 10)
        finally:
            await da.stop()
            await db.stop()
        assert pushed.texts() == [f"m{i}" for i in range(10)]
        assert {h for h, t in pushed.got if t < "m5"} == {"a"}
        assert {h for h, t in pushed.got if t >= "m5"} == {"b"}


async def test_a_hub_that_cannot_renew_stops_pushing_and_is_taken_over(
    stores: tuple[Store, Store],
) -> None:
    clock = FakeClock()
    pushed = Pushed()
    async with two_hubs(clock, stores) as (a, b):
        da = _dispatcher(a, pushed, "a")
        await da.start()
        db = _dispatcher(b, pushed, "b")
        try:
            # a renews nothing (as if its store were unreachable): once the push window
            # (3/4 of the lease) has passed, its worker stops before pushing anything
            clock.advance(LONG * 0.8)
            sent = await a.send("t", "user", "p", "x0", link=False)

            async def a_stopped() -> bool:
                return all(s.stopped_reason for s in da.status())

            await eventually(a_stopped, what="a's worker to stop")
            assert pushed.got == []
            # (it may have leased x0 before it noticed; if so, it keeps the copy leased)
            state = (await a.message_status("t", sent.message_id)).state.value
            assert state in ("queued", "leased"), state
            # b cannot take over before the lease runs out ...
            await db.start()
            assert await _owner(b) == "a"
            assert db.status() == []
            # ... and then does, pushing the copy a held
            clock.advance(LONG * 0.2)
            await db.rescan()
            await _pushed(pushed, 1)
            # a learns on its next scan that it lost p
            await da.rescan()
            assert da.status() == []
        finally:
            await da.stop()
            await db.stop()
        assert pushed.got == [("b", "x0")]
        assert await _owner(b) is None


async def test_receive_leases_only_for_the_owner_of_the_member(stores: tuple[Store, Store]) -> None:
    clock = FakeClock()
    async with two_hubs(clock, stores) as (a, b):
        now = clock.now()
        await a.send("t", "user", "p", "m0", link=False)
        assert await a.store.transact(lambda tx: tx.claim_dispatch("t", "p", "a", now, now + 5))
        assert await b.receive("t", "p", owner="b") == []
        clock.advance(5)
        # a's lease ran out but nobody took p: a may still lease (the store says it owns p)
        assert await b.store.transact(lambda tx: tx.claim_dispatch("t", "p", "b", now + 5, now + 9))
        # b took it: a leases nothing from now on, whatever a's clock says
        assert await a.receive("t", "p", owner="a") == []
        got = await b.receive("t", "p", owner="b")
        assert [g.message.text for g in got] == ["m0"]
        # a receive that names no owner (a pulling client) is not gated
        await a.send("t", "user", "p", "m1", link=False)
        assert [g.message.text for g in await a.receive("t", "p")] == ["m1"]


async def test_a_hub_that_renews_late_starts_again_with_the_copies_it_held(
    stores: tuple[Store, Store],
) -> None:
    clock = FakeClock()
    pushed = Pushed()
    async with two_hubs(clock, stores) as (a, _):
        da = _dispatcher(a, pushed, "a")
        await da.start()
        try:
            await a.send("t", "user", "p", "x0", link=False)
            await _pushed(pushed, 1)
            # past the push window with no renewal (a store outage, say): the worker stops
            clock.advance(LONG * 0.8)
            sent = await a.send("t", "user", "p", "x1", link=False)

            async def stopped() -> bool:
                return all(s.stopped_reason for s in da.status())

            await eventually(stopped, what="the worker to stop")
            # nobody took p meanwhile: the next scan renews, starts a worker again, and
            # first puts back any copy the stopped worker still held
            await da.rescan()
            await _pushed(pushed, 2)
            assert await _owner(a) == "a"
        finally:
            await da.stop()
        assert pushed.got == [("a", "x0"), ("a", "x1")]
        hist = await _history(a, sent.message_id)
        assert hist[-1][0] == "acked", hist


async def test_a_hub_that_lost_the_member_changes_none_of_its_copies(
    stores: tuple[Store, Store],
) -> None:
    """Every record a push worker makes on a copy (delivered, acked, dead, released) takes
    effect only while the store names its hub the owner, checked in the same transaction:
    a hub that was paused past its lease cannot touch a copy the new owner now holds."""
    clock = FakeClock()
    async with two_hubs(clock, stores) as (a, b):
        now = clock.now()
        mid = (await a.send("t", "user", "p", "m0", link=False)).message_id
        assert await a.store.transact(lambda tx: tx.claim_dispatch("t", "p", "a", now, now + 5))
        assert [g.message.text for g in await a.receive("t", "p", owner="a")] == ["m0"]
        clock.advance(5)

        def take_over(tx: Tx) -> list[str]:
            assert tx.claim_dispatch("t", "p", "b", now + 5, now + 10)
            return tx.requeue_leased("t", "p", now + 5, "push delivery taken by b")

        assert await b.store.transact(take_over) == [mid]
        assert [g.message.text for g in await b.receive("t", "p", owner="b")] == ["m0"]
        # a, paused mid-push, now records what it did: nothing of it takes effect
        assert await a.give_up("t", "p", mid, "the pane is gone", owner="a") is False
        assert await a.mark_delivered("t", "p", mid, "typed in", owner="a") is False
        assert (await a.ack("t", "p", [mid], owner="a")).not_held == (mid,)
        assert await a.release("t", "p", [mid], owner="a") == 0
        status = await b.message_status("t", mid)
        assert status.state.value == "leased"
        assert [e for e, _ in await _history(b, mid)] == ["queued", "leased", "released", "leased"]
        # the owner's own records do
        assert await b.mark_delivered("t", "p", mid, "typed in", owner="b") is True
        assert (await b.ack("t", "p", [mid], owner="b")).acked == (mid,)


@pytest.mark.parametrize("outcome", ["dead", "delivered"])
async def test_a_stale_owners_push_ending_late_leaves_the_new_owners_copy_alone(
    stores: tuple[Store, Store], outcome: str
) -> None:
    """Hub a is paused in the middle of a push until its lease has run out and b has
    taken the member over and begun pushing the copy again. When a's push then ends (a
    permanent failure, or done), a records nothing: the copy is b's, and neither dead
    (its sender told so) nor marked delivered while b pushes it."""
    clock = FakeClock()
    gates = Gates()
    async with two_hubs(clock, stores) as (a, b):
        da = _dispatcher(a, Pushed(), "a", {**ADAPTERS, "record": lambda c: Gated(c, gates, "a")})
        db = _dispatcher(b, Pushed(), "b", {**ADAPTERS, "record": lambda c: Gated(c, gates, "b")})
        await da.start()
        try:
            mid = (await a.send("t", "user", "p", "x0", link=False)).message_id
            await eventually(lambda: len(gates.started) == 1, what="a's push to begin")
            clock.advance(LONG)  # a is paused past its lease; b takes p over
            await db.start()
            assert await _owner(b) == "b"
            await eventually(lambda: len(gates.started) == 2, what="b's push to begin")
            assert gates.started == [("a", "x0"), ("b", "x0")]

            if outcome == "dead":
                gates.fail.add("a")
            gates.gate("a").set()

            async def a_stopped() -> bool:
                return all(s.state == "stopped" for s in da.status())

            await eventually(a_stopped, what="a's worker to stop")
            assert (await b.message_status("t", mid)).state.value == "leased"
            gates.gate("b").set()

            async def acked() -> bool:
                return (await b.message_status("t", mid)).state.value == "acked"

            await eventually(acked, what="b's push to be recorded")
        finally:
            await da.stop()
            await db.stop()
        events = [e for e, _ in await _history(b, mid)]
        assert "dead" not in events and events.count("delivered") == 1, events
        notices = await b.receive("t", "user", limit=10)
        assert [g.message.text for g in notices] == [], "the sender is told of no dead letter"


@pytest.mark.postgres
@pytest.mark.parametrize("claimer", ["b", "a"])
async def test_a_cancelled_receives_late_lease_holds_nothing_past_a_claim(
    new_postgres_url: Callable[[], str], claimer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a receive's lease runs on one of the store's threads and commits even
    if its caller was cancelled meanwhile (a push worker stopped on a lost lease). When it
    commits after a claim of the member (another hub's takeover, or this hub's worker
    started again, each putting back what the old worker held), it holds nothing: it
    leases nothing for a hub that no longer owns the member, and what it leased for this
    hub goes back to the queue at once, not when its lease ends, so the next worker
    pushes in send order."""
    from backchannel.stores.postgres import PostgresStore

    url = new_postgres_url()
    clock = FakeClock()
    slow = PostgresStore(url, pool_size=1)  # hub a's store: one connection, held below
    async with two_hubs(clock, (slow, PostgresStore(url))) as (a, b):
        sent = [(await a.send("t", "user", "p", f"m{i}", link=False)).message_id for i in range(2)]
        now = clock.now()
        assert await a.store.transact(lambda tx: tx.claim_dispatch("t", "p", "a", now, now + 5))
        submitted: list[object] = []
        real = slow.transact

        def counted(fn: Callable[[Tx], object]) -> object:
            submitted.append(fn)
            return real(fn)

        monkeypatch.setattr(slow, "transact", counted)
        gate = threading.Event()
        blocker = asyncio.ensure_future(slow.transact(lambda tx: gate.wait(10)))  # type: ignore[arg-type]
        recv = asyncio.ensure_future(a.receive("t", "p", limit=10, owner="a"))
        await eventually(lambda: len(submitted) == 2, what="the lease to wait for the connection")
        recv.cancel()
        await asyncio.wait({recv})
        assert recv.cancelled()
        # the claim commits first, on another connection; then the lease runs
        clock.advance(5)
        then = clock.now()

        def claim(tx: Tx) -> None:
            assert tx.claim_dispatch("t", "p", claimer, then, then + 5)
            tx.requeue_leased("t", "p", then, f"push delivery taken by {claimer}")

        await b.store.transact(claim)
        gate.set()
        await blocker
        await slow.transact(lambda tx: None)  # one thread: the lease has run by now

        async def queued() -> bool:
            states = [(await b.message_status("t", mid)).state.value for mid in sent]
            return states == ["queued", "queued"]

        await eventually(queued, what="the copies back in the queue")
        got = await (b if claimer == "b" else a).receive("t", "p", limit=10, owner=claimer)
        assert [g.message.text for g in got] == ["m0", "m1"]


class _OffsetClock:
    """The wall clock, ``offset`` seconds off (a host whose clock is not in sync)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("owner_off", "other_off"), [(0.0, 3.0), (-3.0, 0.0)], ids=["other-ahead", "owner-behind"]
)
async def test_hubs_whose_clocks_differ_never_take_a_live_owners_member(
    new_postgres_url: Callable[[], str], owner_off: float, other_off: float
) -> None:
    """Hubs on one PostgreSQL whose clocks differ by more than the push-delivery lease
    (but less than the skew that stops a hub from starting): the lease runs by the
    database's clock, so a hub ahead (or an owner behind) never sees the live owner's
    lease as run out, and one member is pushed by one hub, until that hub stops."""
    from backchannel.stores.postgres import PostgresStore

    url = new_postgres_url()
    pushed = Pushed()
    a = Hub(PostgresStore(url), clock=_OffsetClock(owner_off), check_delivery=False)
    b = Hub(PostgresStore(url), clock=_OffsetClock(other_off), check_delivery=False)
    async with a, b:
        await a.create_team("t", settings={"anchor_policy": "off"})
        await a.add_member("t", "p", delivery={"type": "record"})

        def dispatcher(hub: Hub, name: str) -> Dispatcher:
            # a 2 s lease, renewed every half second; the clocks are 3 s apart
            return Dispatcher(
                hub, adapters=_adapters(pushed, name), owner=name, ownership_s=2.0,
                rescan_s=LONG, wait_s=0.2, grace_s=2.0,
            )  # fmt: skip

        da, db = dispatcher(a, "a"), dispatcher(b, "b")
        await da.start()
        try:
            assert await _owner(a) == "a"
            await db.start()
            await db.rescan()
            assert await _owner(b) == "a", "b took the member from a live owner"
            assert db.status() == []
            for i in range(3):
                await a.send("t", "user", "p", f"m{i}", link=False)
            await _pushed(pushed, 3)
            await db.rescan()
            assert await _owner(b) == "a"
            await da.stop()  # a gives p up: b takes it on its next scan
            await db.rescan()
            assert await _owner(b) == "b"
            await b.send("t", "user", "p", "m3", link=False)
            await _pushed(pushed, 4)
        finally:
            await da.stop()
            await db.stop()
        assert pushed.got == [("a", "m0"), ("a", "m1"), ("a", "m2"), ("b", "m3")]


async def test_a_clock_stepped_back_does_not_keep_a_push_window_open(tmp_path: Path) -> None:
    """The wall clock stepped back an hour right after a hub claimed a member: its push
    window still ends after its part of the lease, not an hour later. Before, a hub that
    could not renew then (its store unreachable) went on pushing for an hour beside the
    hub that took the member over, both pushing the copies it held."""
    clock = _OffsetClock(0.0)
    async with Hub(SqliteStore(tmp_path / "bc.db"), clock=clock, check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery={"type": "record"})
        ownership = Ownership(hub, owner="a", lease_s=0.4)
        assert await ownership.claim([("t", "p")], running=()) == {("t", "p")}
        assert ownership.holds(("t", "p"))
        clock.offset -= 3600  # the wall clock is stepped back an hour

        def ended() -> bool:
            return not ownership.holds(("t", "p"))

        await eventually(ended, what="the push window to end", within=5)


LISTING_S = 4.0  # a listing of members on a busy store: longer than a 4 s lease's window (3 s)


@pytest.mark.slow
async def test_a_slow_listing_of_members_does_not_let_the_lease_run_out(
    stores: tuple[Store, Store], caplog: pytest.LogCaptureFixture
) -> None:
    """On a loaded store one listing of teams and members took seconds, and the lease was
    renewed only after it: the push window (3/4 of the lease) closed first, and the only
    hub there logged that its lease ran out and stopped pushing, again and again.
    Renewals go on while a listing is slow."""
    pushed = Pushed()
    async with Hub(stores[0], check_delivery=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "p", delivery={"type": "record"})
        d = Dispatcher(
            hub, adapters=_adapters(pushed, "a"), ownership_s=4.0, rescan_s=0.1, wait_s=0.2
        )
        listed = 0
        list_members = hub.list_members

        async def slow_list_members(team: str) -> object:
            nonlocal listed
            await asyncio.sleep(LISTING_S)  # the store is busy with other work
            listed += 1
            return await list_members(team)

        await d.start()
        try:
            worker = d._workers[("t", "p")]
            hub.list_members = slow_list_members  # type: ignore[method-assign]
            await eventually(lambda: listed >= 2, within=30, what="two slow listings")
            sent = await hub.send("t", "user", "p", "after", link=False)
            await _pushed(pushed, 1)
            assert pushed.texts() == ["after"]
            assert d._workers.get(("t", "p")) is worker, "the same worker pushes throughout"
            assert not worker.lost and worker.status.stopped_reason is None
            assert not [r for r in caplog.records if "ran out" in r.getMessage()]

            async def acked() -> bool:
                return (await hub.message_status("t", sent.message_id)).state.value == "acked"

            await eventually(acked, what="the push recorded")
        finally:
            await d.stop()
