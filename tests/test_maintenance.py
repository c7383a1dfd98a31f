"""Scheduled maintenance on every store: a job that fails is set aside while the rest
goes on, timers due while the hub was stopped, a clock that steps back."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from backchannel.errors import ClockSkew, StoreError
from backchannel.hub import Hub
from backchannel.interfaces.http import create_app
from backchannel.stores.base import SCHEMA_VERSION, Store, Tx
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import InboxMessage


async def _team(hub: Hub, *members: str) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    for m in members:
        await hub.add_member("t", m)
        await hub.open_session("t", m, f"{m}-s")


async def _got(hub: Hub, member: str) -> list[InboxMessage]:
    got = await hub.receive("t", member, session=f"{member}-s", limit=500)
    if got:
        await hub.ack("t", member, [g.message.message_id for g in got])
    return got


async def _take(hub: Hub, member: str) -> list[str]:
    """The first line of each message the member's session receives (acked)."""
    return [g.message.text.splitlines()[0] for g in await _got(hub, member)]


async def _set_payload(hub: Hub, timer_id: int, **changes: object) -> None:
    def fn(tx: Tx) -> None:
        job = tx.get_job("t", timer_id)
        assert job is not None
        assert tx.reschedule_job(job.job_id, job.due_at, {**job.payload, **changes})

    await hub.store.transact(fn)


async def test_a_failing_job_is_set_aside_and_every_other_due_job_goes_on(
    make_store: Callable[[], Store], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    caplog.set_level(logging.WARNING, logger="backchannel.hub")
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b", "c")
        # due first: a timer with an intent this hub does not know (as a newer hub on the
        # same database might write), among good ones and a lease that runs out
        bad = await hub.set_timer("t", "a", "a-s", "anchor", 5, "the poisoned one")
        await _set_payload(hub, bad.timer_id, intent="ponder")
        await hub.set_timer("t", "b", "b-s", "anchor", 10, "b's task")
        await hub.set_timer("t", "c", "c-s", "anchor", 20, "c's task")
        sent = await hub.send("t", "a", "b", "hello")
        held = await hub.receive("t", "b", session="b-s", limit=10)
        assert [g.message.message_id for g in held] == [sent.message_id]
        clock.advance(60)

        await hub.maintain()

        assert await _take(hub, "c") == ["ANCHOR: c's task"]
        assert sorted(await _take(hub, "b")) == ["ANCHOR: b's task", "hello"]
        assert await _take(hub, "a") == []
        failing = hub.maintenance.failing()
        assert [(f.job_id, f.team, f.kind, f.failures) for f in failing] == [
            (bad.timer_id, "t", "timer", 1)
        ]
        assert "ponder" in failing[0].error
        logged = [r.getMessage() for r in caplog.records if str(bad.timer_id) in r.getMessage()]
        assert logged and "ponder" in logged[0] and "upgrade" in logged[0]
        assert [t.timer_id for t in await hub.list_timers("t", member="a")] == [bad.timer_id]

        # retried with backoff, not every pass; still failing, the count grows
        await hub.maintain()
        assert hub.maintenance.failing()[0].failures == 1
        clock.advance(failing[0].retry_at - clock.now())
        await hub.maintain()
        again = hub.maintenance.failing()
        assert again[0].failures == 2 and again[0].retry_at - clock.now() > 1.0

        # fixed, it goes through once, as it was set (its due time is its own, not the
        # time of its last retry)
        await _set_payload(hub, bad.timer_id, intent="anchor")
        clock.advance(again[0].retry_at - clock.now())
        await hub.maintain()
        fired = await _got(hub, "a")
        assert [g.message.text.splitlines()[0] for g in fired] == ["ANCHOR: the poisoned one"]
        assert fired[0].message.meta["due_at"] == bad.due_at
        assert hub.maintenance.failing() == []
        assert await hub.list_timers("t", member="a") == []
        clock.advance(3600)
        await hub.maintain()
        assert await _take(hub, "a") == []


async def test_a_timer_set_aside_after_failing_says_so_when_it_fires_late(
    make_store: Callable[[], Store],
) -> None:
    """A timer whose firing failed on time, fired late from its retry, says it was set
    aside and retried, not that the hub was not running (it was)."""
    clock = FakeClock()
    async with Hub(make_store(), clock=clock, background=False) as hub:
        await _team(hub, "a")
        bad = await hub.set_timer("t", "a", "a-s", "anchor", 5, "poisoned for a while")
        await _set_payload(hub, bad.timer_id, intent="ponder")
        clock.advance(5)
        await hub.maintain()  # on time, and it fails
        failing = hub.maintenance.failing()
        assert [f.failures for f in failing] == [1]
        await _set_payload(hub, bad.timer_id, intent="anchor")
        clock.advance(failing[0].retry_at - clock.now())
        await hub.maintain()
        fired = await _got(hub, "a")
        assert len(fired) == 1
        lines = fired[0].message.text.splitlines()
        assert lines[0] == "ANCHOR: poisoned for a while"
        assert "not running" not in fired[0].message.text
        assert "set aside after its firing failed (1 time)" in lines[1], lines
        assert fired[0].message.meta["late_seconds"] >= 5
        assert fired[0].message.meta["failures"] == 1

        # a timer due while the hub was not running still says so
        await hub.set_timer("t", "a", "a-s", "anchor", 5, "missed")
        clock.advance(60)
        await hub.maintain()
        (late,) = await _got(hub, "a")
        assert "the hub was not running when it was due" in late.message.text
        assert "failures" not in late.message.meta


async def test_health_says_degraded_while_a_job_is_set_aside() -> None:
    clock = FakeClock()
    async with Hub(MemoryStore(), clock=clock, background=False) as hub:
        app = create_app(hub, "admin-token")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://hub"
        ) as http:
            await _team(hub, "a")
            bad = await hub.set_timer("t", "a", "a-s", "anchor", 5, "poisoned")
            await _set_payload(hub, bad.timer_id, intent="ponder")
            clock.advance(5)
            await hub.maintain()
            assert (await http.get("/healthz")).json() == {"status": "degraded", "failing_jobs": 1}
            await hub.cancel_timer("t", "a", bad.timer_id)
            await hub.maintain()
            assert (await http.get("/healthz")).json() == {"status": "ok"}


async def test_a_clock_stepped_back_loses_nothing_and_fires_nothing_twice(
    make_store: Callable[[], Store],
) -> None:
    """Each hub keeps the time by its own clock (hubs keep theirs in sync). One stepped
    back an hour: a timer that fired does not fire again, a lease given before the step
    comes back once (its length from the step: the next test), and a reply sent after
    the step is one the wait timer set before it hears of."""
    clock = FakeClock()
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b")
        await hub.set_timer("t", "a", "a-s", "anchor", 10, "back to the report")
        await hub.set_timer("t", "a", "a-s", "wait", 20, "b's numbers", target="b")
        sent = await hub.send("t", "a", "b", "count the lines")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
        clock.advance(15)
        await hub.maintain()
        assert await _take(hub, "a") == ["ANCHOR: back to the report"]

        clock.set(clock.now() - 3600)  # the wall clock is stepped back an hour
        await hub.send("t", "b", "a", "1,204 lines")  # dated before the wait timer was set
        await hub.maintain()
        assert [t.splitlines()[0] for t in await _take(hub, "a")] == ["1,204 lines"]
        clock.advance(3600 + 10)  # the clock is back where it was, and the wait is due
        await hub.maintain()
        got = [g.message.text for g in await _got(hub, "a")]
        assert len(got) == 1 and got[0].startswith("WAIT: b's numbers"), got
        assert "b has replied since you set this timer" in got[0], got
        clock.advance(30)
        await hub.maintain()
        again = await hub.receive("t", "b", session="b-s", limit=10)
        assert [g.message.message_id for g in again] == [sent.message_id]
        await hub.ack("t", "b", [sent.message_id])
        clock.advance(3600)
        await hub.maintain()
        assert await _take(hub, "a") == [] and await _take(hub, "b") == []


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def same_database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A factory of stores on one database, for a hub stopped and started again (the
    memory store: the same object, which outlives its hub)."""
    if request.param == "memory":
        memory = MemoryStore()
        return lambda: memory
    if request.param == "postgres":
        from backchannel.stores.postgres import PostgresStore

        url = request.getfixturevalue("new_postgres_url")()
        return lambda: PostgresStore(url)
    return lambda: SqliteStore(tmp_path / "hub.db")


async def test_hundreds_of_timers_due_while_the_hub_was_stopped_fire_once_in_order(
    same_database: Callable[[], Store],
) -> None:
    """More timers fell due while the hub was stopped than maintenance fires in one
    transaction: back up, each fires once, in the order they were due, marked late."""
    clock = FakeClock()
    count = 450
    async with Hub(same_database(), clock=clock, background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off", "max_timers": 1000})
        for m in ("a", "b"):
            await hub.add_member("t", m)
            await hub.open_session("t", m, f"{m}-s")
        for i in range(count):  # due in turn, a's and b's interleaved
            member = "ab"[i % 2]
            await hub.set_timer("t", member, f"{member}-s", "anchor", 60 + i, f"n{i:03}")
    clock.advance(86400)
    async with Hub(same_database(), clock=clock, background=False) as hub:
        await hub.maintain()
        fired = {m: await _got(hub, m) for m in ("a", "b")}
        for m, got in fired.items():
            notes = [g.message.text.splitlines()[0] for g in got]
            mine = [f"ANCHOR: n{i:03}" for i in range(count) if "ab"[i % 2] == m]
            assert notes == mine
            assert all("late by" in g.message.text for g in got)
        await hub.maintain()
        assert await _take(hub, "a") == [] and await _take(hub, "b") == []
        assert await hub.list_timers("t") == []


async def test_retention_keeps_an_old_message_a_receive_holds_a_lease_on(
    make_store: Callable[[], Store],
) -> None:
    """A message older than the retention period that a receive leased (it waited that
    long for its recipient) is kept while the lease runs, comes back when it runs out,
    and is kept a retention period from its ack."""
    clock = FakeClock()
    day = 86400.0
    hub = Hub(make_store(), clock=clock, background=False, lease_seconds=60, retention_seconds=day)
    async with hub:
        await _team(hub, "a", "b", "c")
        old = await hub.send("t", "a", "b", "the old one")
        done = await hub.send("t", "a", "c", "taken at once")
        await hub.receive("t", "c", session="c-s", limit=5)
        await hub.ack("t", "c", [done.message_id])
        clock.advance(3 * day)
        held = await hub.receive("t", "b", session="b-s", limit=5)
        assert [g.message.message_id for g in held] == [old.message_id]
        assert await hub.compact(clock.now() - day) == 1, "only the one acked long ago"
        clock.advance(61)
        await hub.maintain()  # the lease ran out (and retention ran): it comes back
        back = await hub.receive("t", "b", session="b-s", limit=5)
        assert [g.message.text for g in back] == ["the old one"]
        await hub.compact(clock.now() - day)
        await hub.ack("t", "b", [old.message_id])
        assert await hub.compact(clock.now() - day) == 0
        assert (await hub.message_status("t", old.message_id)).state.value == "acked"
        clock.advance(day + 1)
        assert await hub.compact(clock.now() - day) == 1


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_database_restored_from_an_older_backup_under_a_running_hub_is_named(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The database is put back to an older schema (restored from an older backup) while
    the hub runs: maintenance, and every other call, fails with an error that says so
    and what to do (restart the hub, which migrates it), not a missing column."""
    from tests.test_timers import _downgrade

    clock = FakeClock()
    if kind == "sqlite":
        where = str(tmp_path / "hub.db")
        store: Store = SqliteStore(where)
    else:
        from backchannel.stores.postgres import PostgresStore

        where = request.getfixturevalue("new_postgres_url")()
        store = PostgresStore(where)
    async with Hub(store, clock=clock, background=False) as hub:
        await _team(hub, "a", "b")
        await hub.set_timer("t", "a", "a-s", "wait", 60, "b's answer", target="b")
        _downgrade(kind, where)
        clock.advance(61)
        calls: list[Callable[[], Awaitable[object]]] = [
            hub.maintain,
            lambda: hub.send("t", "b", "a", "the answer"),
        ]
        for call in calls:
            with pytest.raises(StoreError) as caught:
                await call()
            text = str(caught.value)
            assert "schema version 10" in text, text
            assert f"this backchannel opened it at {SCHEMA_VERSION}" in text, text
            assert "restart" in text and "older backup" in text, text
    again = SqliteStore(where) if kind == "sqlite" else PostgresStore(where)
    async with Hub(again, clock=clock, background=False) as hub:
        await hub.maintain()  # started again: migrated, and the timer fires
        assert [t.split(":")[0] for t in await _take(hub, "a")] == ["WAIT"]


async def test_a_lease_that_cannot_come_back_is_set_aside_and_everything_else_goes_on(
    make_store: Callable[[], Store],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One expired lease whose return raises (forced here on its row, in the store's own
    transaction class): every other lease comes back and every due job fires; the one
    is set aside with backoff, named in the log and by /healthz, tried again, and comes
    back once when it goes through."""
    clock = FakeClock()
    caplog.set_level(logging.WARNING, logger="backchannel.hub")
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b", "c")
        poisoned = await hub.send("t", "a", "b", "the poisoned one")
        fine = await hub.send("t", "a", "c", "c's message")
        await hub.set_timer("t", "c", "c-s", "anchor", 40, "c's task")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
        assert len(await hub.receive("t", "c", session="c-s", limit=10)) == 1

        tx_class: type[Tx] = await hub.store.transact(type)
        real = tx_class.transition

        def transition(self: Tx, team: str, message_id: str, member: str, **kw: object) -> bool:
            if message_id == poisoned.message_id:
                raise RuntimeError("the poisoned row")
            return real(self, team, message_id, member, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(tx_class, "transition", transition)
        clock.advance(60)
        next_due = await hub.maintain()

        assert sorted(await _take(hub, "c")) == ["ANCHOR: c's task", "c's message"]
        failing = hub.maintenance.failing_leases()
        assert [(f.team, f.message_id, f.member, f.failures) for f in failing] == [
            ("t", poisoned.message_id, "b", 1)
        ]
        assert "the poisoned row" in failing[0].error
        assert next_due is not None and next_due > clock.now(), "no busy loop on the one"
        logged = [r.getMessage() for r in caplog.records if poisoned.message_id in r.getMessage()]
        assert logged and "the poisoned row" in logged[0] and "set aside" in logged[0]
        app = create_app(hub, "admin-token")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://hub"
        ) as http:
            health = (await http.get("/healthz")).json()
            assert health == {"status": "degraded", "failing_leases": 1}, health

        # retried with backoff, not every pass; still failing, the count grows
        await hub.maintain()
        assert hub.maintenance.failing_leases()[0].failures == 1
        clock.advance(failing[0].retry_at - clock.now())
        await hub.maintain()
        again = hub.maintenance.failing_leases()
        assert again[0].failures == 2 and again[0].retry_at - clock.now() > 1.0

        # the row mended, it comes back once
        monkeypatch.undo()
        clock.advance(again[0].retry_at - clock.now())
        await hub.maintain()
        back = await hub.receive("t", "b", session="b-s", limit=10)
        assert [g.message.message_id for g in back] == [poisoned.message_id]
        await hub.ack("t", "b", [poisoned.message_id])
        assert hub.maintenance.failing_leases() == []
        assert (await hub.message_status("t", fine.message_id)).state.value == "acked"
        clock.advance(3600)
        await hub.maintain()
        assert await _take(hub, "b") == [] and await _take(hub, "c") == []


async def test_a_lease_given_before_the_clock_stepped_back_runs_its_length_from_the_step(
    make_store: Callable[[], Store],
) -> None:
    """The wall clock stepped back an hour while messages were leased: each lease runs
    its own length again from the step (not an hour more), a lease given after the step
    runs as given, and each copy comes back once."""
    clock = FakeClock()
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b", "c")
        short = await hub.send("t", "a", "b", "the short lease")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
        long = await hub.send("t", "a", "c", "the long lease")
        got = await hub.receive("t", "c", session="c-s", limit=10, lease_seconds=600)
        assert [g.message.message_id for g in got] == [long.message_id]
        await hub.maintain()
        clock.advance(10)

        clock.set(clock.now() - 3600)  # the wall clock is stepped back an hour
        after = await hub.send("t", "a", "b", "leased after the step")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
        next_due = await hub.maintain()
        assert next_due is not None and next_due <= clock.now() + 30, next_due - clock.now()
        assert await hub.receive("t", "b", session="b-s", limit=10) == []

        clock.advance(30)
        await hub.maintain()
        back = await hub.receive("t", "b", session="b-s", limit=10)
        assert sorted(g.message.message_id for g in back) == sorted(
            [short.message_id, after.message_id]
        )
        assert await hub.receive("t", "c", session="c-s", limit=10) == []
        await hub.ack("t", "b", [g.message.message_id for g in back])
        clock.advance(570)
        await hub.maintain()
        again = await hub.receive("t", "c", session="c-s", limit=10)
        assert [g.message.message_id for g in again] == [long.message_id]
        await hub.ack("t", "c", [long.message_id])
        clock.advance(3600)
        await hub.maintain()
        assert await _take(hub, "b") == [] and await _take(hub, "c") == []


async def test_a_hub_started_after_the_clock_stepped_back_restarts_the_leases_before_it(
    same_database: Callable[[], Store],
) -> None:
    """The hub was stopped with a message leased, the clock stepped back an hour, the hub
    started again: the lease runs its length from the start, not an hour more."""
    clock = FakeClock()
    async with Hub(same_database(), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b")
        sent = await hub.send("t", "a", "b", "leased before the step")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
    clock.set(clock.now() - 3600)
    async with Hub(same_database(), clock=clock, background=False, lease_seconds=30) as hub:
        await hub.maintain()
        clock.advance(30)
        await hub.maintain()
        back = await hub.receive("t", "b", session="b-s", limit=10)
        assert [g.message.message_id for g in back] == [sent.message_id]


class _OffsetClock:
    """The wall clock, ``offset`` seconds off (a host whose clock is not in sync)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


async def test_a_lease_given_before_the_clock_stepped_forward_is_not_taken_back(
    make_store: Callable[[], Store], caplog: pytest.LogCaptureFixture
) -> None:
    """The wall clock stepped an hour forward while b worked on a leased message (the
    boot clock did not move): the lease is not taken for run out, so no receive gets the
    message again, and b's ack settles it at its first attempt. On PostgreSQL the hub's
    clock is then an hour off the database's and leases go by the database's clock."""
    caplog.set_level(logging.WARNING, logger="backchannel.hub")
    clock = _OffsetClock(0.0)
    async with Hub(make_store(), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b")
        sent = await hub.send("t", "a", "b", "work on this")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
        await hub.maintain()

        clock.offset += 3600  # the wall clock is stepped forward an hour
        next_due = await hub.maintain()
        assert await hub.receive("t", "b", session="b-s", limit=10) == []
        if hub.maintenance.skew == 0.0:  # no database clock: the lease ran again from now
            assert next_due is not None and next_due >= clock.now() + 29, next_due - clock.now()
            assert "leases given before the clock stepped forward" in caplog.text
        assert (await hub.ack("t", "b", [sent.message_id])).acked == (sent.message_id,)
        status = await hub.message_status("t", sent.message_id)
        assert status.state.value == "acked" and status.deliveries[0].attempts == 1


def _database_steps_too(hub: Hub, clock: _OffsetClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database runs on the hub's host (PostgreSQL): its clock steps with the hub's,
    so the hub is not off the database's clock after a step."""
    read = hub.store.database_time

    async def stepped() -> float | None:
        t = await read()
        return None if t is None else t + clock.offset

    monkeypatch.setattr(hub.store, "database_time", stepped)


async def _due_in(hub: Hub, clock: _OffsetClock, timer_id: int) -> float:
    (timer,) = [t for t in await hub.list_timers("t") if t.timer_id == timer_id]
    return timer.due_at - clock.now()


async def test_a_step_forward_fires_no_timer_early(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock stepped an hour forward a minute after a 10-minute anchor was set
    (the boot clock did not move): the timer keeps its 10 minutes as the boot clock
    measures them and does not fire at the next pass. Before, every timer due within the
    hour fired at once, each a model turn nobody asked for yet."""
    clock = _OffsetClock(0.0)
    async with Hub(make_store(), clock=clock, background=False) as hub:
        _database_steps_too(hub, clock, monkeypatch)
        await _team(hub, "a")
        timer = await hub.set_timer("t", "a", "a-s", "anchor", 600, "back to task 3")
        await hub.maintain()

        clock.offset += 3600  # the wall clock is stepped forward an hour
        await hub.maintain()
        assert not hub.maintenance.skewed
        assert await _take(hub, "a") == [], "the timer fired an hour early"
        assert 590 < await _due_in(hub, clock, timer.timer_id) <= 600


async def test_a_step_back_delays_no_timer(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock stepped an hour back right after a 2-second wait timer was set:
    the timer still fires about 2 seconds later, not an hour and 2 seconds (an agent
    waiting on a peer's reply would sit unwoken for the hour); a timer set after the
    step keeps its own time."""
    clock = _OffsetClock(0.0)
    async with Hub(make_store(), clock=clock, background=False) as hub:
        _database_steps_too(hub, clock, monkeypatch)
        await _team(hub, "a", "b")
        timer = await hub.set_timer("t", "a", "a-s", "wait", 2, "did b answer?", target="b")
        await hub.maintain()

        clock.offset -= 3600  # the wall clock is stepped back an hour
        after = await hub.set_timer("t", "b", "b-s", "anchor", 600, "set after the step")
        await hub.maintain()
        assert not hub.maintenance.skewed
        assert await _due_in(hub, clock, timer.timer_id) <= 2
        assert 590 < await _due_in(hub, clock, after.timer_id) <= 600
        deadline = time.monotonic() + 10
        got: list[str] = []
        while not got and time.monotonic() < deadline:
            await hub.maintain()
            got = await _take(hub, "a")
        assert len(got) == 1 and "did b answer?" in "".join(got), got


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_hubs_on_one_host_move_a_timer_once_for_one_step(
    kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two hubs on one store and one host both see the wall clock step an hour forward:
    a timer set before the step moves by the hour once, not once a hub (it would fire
    an hour late)."""
    if kind == "postgres":
        from backchannel.stores.postgres import PostgresStore

        url = request.getfixturevalue("new_postgres_url")()
        make: Callable[[], Store] = lambda: PostgresStore(url)  # noqa: E731
    else:
        make = lambda: SqliteStore(tmp_path / "one.db")  # noqa: E731
    clock = _OffsetClock(0.0)
    async with Hub(make(), clock=clock, background=False) as first:
        _database_steps_too(first, clock, monkeypatch)
        await _team(first, "a")
        async with Hub(make(), clock=clock, background=False) as second:
            _database_steps_too(second, clock, monkeypatch)
            timer = await first.set_timer("t", "a", "a-s", "anchor", 600, "back to task 3")
            await first.maintain()
            await second.maintain()

            clock.offset += 3600  # the host's wall clock is stepped forward an hour
            await first.maintain()
            await second.maintain()
            assert not first.maintenance.skewed and not second.maintenance.skewed
            assert 590 < await _due_in(first, clock, timer.timer_id) <= 600


async def test_a_step_forward_grants_no_extra_pair_budget(
    make_store: Callable[[], Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two agents spent their pair budget; the wall clock stepped an hour forward: the
    window still has its hour as the boot clock measures it, so nothing more passes
    between them, before maintenance saw the step as after. Before, the step ended the
    window and they had a full budget again."""
    from backchannel.errors import BudgetExhausted

    clock = _OffsetClock(0.0)
    async with Hub(make_store(), clock=clock, background=False) as hub:
        _database_steps_too(hub, clock, monkeypatch)
        await hub.create_team("t", settings={"anchor_policy": "off", "pair_budget": 2})
        for m in ("a", "b", "c"):
            await hub.add_member("t", m)
        await hub.send("t", "a", "b", "one", link=False)
        await hub.send("t", "b", "a", "two", link=False)
        await hub.send("t", "a", "c", "another pair's window, spent later", link=False)
        with pytest.raises(BudgetExhausted):
            await hub.send("t", "a", "b", "three", link=False)
        await hub.maintain()

        clock.offset += 3600  # the wall clock is stepped forward an hour
        with pytest.raises(BudgetExhausted) as exc:
            await hub.send("t", "a", "b", "three, before maintenance saw the step", link=False)
        assert 3500 < exc.value.details["resets_at"] - clock.now() <= 3600
        await hub.maintain()
        assert not hub.maintenance.skewed
        with pytest.raises(BudgetExhausted) as exc:
            await hub.send("t", "a", "b", "three, after the step", link=False)
        resets = exc.value.details["resets_at"]
        assert 3500 < resets - clock.now() <= 3600, resets - clock.now()
        # a's pair with c: its window, begun before the step, goes on (moved once)
        await hub.send("t", "c", "a", "an answer in the same window", link=False)
        await hub.maintain()
        ac = {b["key"]: b for b in await hub.list_budgets("t")}["pair:a|c"]
        assert ac["used"] == 2, ac
        assert 3500 < ac["resets_at"] - clock.now() <= 3600, ac["resets_at"] - clock.now()


@pytest.mark.postgres
async def test_a_hub_whose_clock_is_ahead_of_the_database_takes_no_live_lease_back(
    new_postgres_url: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    """Hubs on one PostgreSQL give and return leases each by its own clock: one a minute
    ahead would return the others' live leases early, and the message be handed twice.
    Such a hub refuses to start (named, with the way out); one a little off starts and
    says so; one whose clock jumps ahead while it runs returns leases by the database's
    clock, and /healthz says degraded."""
    from backchannel.stores.postgres import PostgresStore

    url = new_postgres_url()
    caplog.set_level(logging.WARNING, logger="backchannel.hub")
    hub_a = Hub(PostgresStore(url), clock=_OffsetClock(0.0), background=False, lease_seconds=30)
    async with hub_a as a:
        await _team(a, "x", "y")
        with pytest.raises(ClockSkew) as caught:
            await Hub(PostgresStore(url), clock=_OffsetClock(60.0), background=False).start()
        text = str(caught.value)
        assert "ahead of the database's" in text and "NTP" in text, text
        assert 59 < caught.value.details["skew"] < 61

        async with Hub(PostgresStore(url), clock=_OffsetClock(-2.5), background=False):
            said = [r.getMessage() for r in caplog.records if "behind" in r.getMessage()]
            assert said and "2." in said[0], said

        ahead = _OffsetClock(0.0)
        async with Hub(PostgresStore(url), clock=ahead, background=False, lease_seconds=30) as b:
            sent = await a.send("t", "x", "y", "once only")
            held = await a.receive("t", "y", session="y-s", limit=10)
            assert [g.message.message_id for g in held] == [sent.message_id]
            ahead.offset = 60.0  # b's host's clock jumps a minute ahead
            await b.maintain()
            assert await b.receive("t", "y", session="y-s", limit=10) == []
            assert b.maintenance.skewed and 59 < b.maintenance.skew < 61
            app = create_app(b, "admin-token")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://hub"
            ) as http:
                health = (await http.get("/healthz")).json()
                assert health["status"] == "degraded" and 59 < health["clock_skew"] < 61
            assert (await a.message_status("t", sent.message_id)).state.value == "leased"
            await a.ack("t", "y", [sent.message_id])

            ahead.offset = 0.0  # in sync again
            await b.maintain()
            assert not b.maintenance.skewed
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://hub"
            ) as http:
                assert (await http.get("/healthz")).json() == {"status": "ok"}


def _immutable(files: list[Path], on: bool) -> None:
    """The files read-only even for root (``chattr``), as a store whose disk was
    remounted read-only for a moment; skips where the file system cannot."""
    done = subprocess.run(
        ["chattr", "+i" if on else "-i", *map(str, files)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot make files immutable here: {done.stderr.decode().strip()}")


async def test_a_store_read_only_for_a_moment_sets_nothing_aside(tmp_path: Path) -> None:
    """The SQLite file cannot be written for a while (three maintenance passes): every
    pass fails as the store's failure, retried in a second, not as bad rows set aside
    with a backoff that keeps growing; once it can be written again the expired lease
    comes back and the due timer fires at once, each once."""
    clock = FakeClock()
    where = tmp_path / "hub.db"
    async with Hub(SqliteStore(where), clock=clock, background=False, lease_seconds=30) as hub:
        await _team(hub, "a", "b")
        await hub.set_timer("t", "a", "a-s", "anchor", 40, "the note")
        sent = await hub.send("t", "a", "b", "hello")
        assert len(await hub.receive("t", "b", session="b-s", limit=10)) == 1
        files = [Path(f"{where}{suffix}") for suffix in ("", "-wal", "-shm")]
        _immutable(files, True)
        try:
            for _ in range(3):
                clock.advance(60)
                with pytest.raises(StoreError, match=r"readonly|read-only|I/O"):
                    await hub.maintain()
                assert hub.maintenance.failing() == []
                assert hub.maintenance.failing_leases() == []
        finally:
            _immutable(files, False)
        await hub.maintain()
        back = await hub.receive("t", "b", session="b-s", limit=10)
        assert [g.message.message_id for g in back] == [sent.message_id]
        assert await _take(hub, "a") == ["ANCHOR: the note"]
        await hub.ack("t", "b", [sent.message_id])
        clock.advance(3600)
        await hub.maintain()
        assert await _take(hub, "a") == [] and await _take(hub, "b") == []
