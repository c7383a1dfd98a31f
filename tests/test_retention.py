"""Retention: maintenance removes acked and dead messages past their age, never a message
someone is still waiting for, so a year of traffic does not pile up in the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from backchannel.errors import InvalidRequest, UnknownMessage
from backchannel.hub import Hub, Outgoing
from backchannel.stores.base import Store
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, MemoryStore
from backchannel.types import SendResult

HOUR = 3600.0


async def _team(hub: Hub) -> None:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    for m in ("a", "b"):
        await hub.add_member("t", m)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_old_acked_messages_go_and_waiting_ones_stay(
    kind: str, tmp_path: Path, clock: FakeClock
) -> None:
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "hub.db")
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        old = [(await hub.send("t", "a", "b", f"old {i}")).message_id for i in range(3)]
        got = await hub.receive("t", "b", limit=2)
        await hub.ack("t", "b", [g.message.message_id for g in got])
        clock.advance(HOUR / 2)
        await hub.maintain()
        for mid in old:  # not old enough yet
            await hub.message_status("t", mid)

        clock.advance(HOUR)
        recent = (await hub.send("t", "a", "b", "recent")).message_id
        await hub.maintain()
        for mid in old[:2]:
            with pytest.raises(UnknownMessage):
                await hub.message_status("t", mid)
        # the third was never received: it is kept however old, and still delivered
        assert (await hub.message_status("t", old[2])).state.value == "queued"
        got = await hub.receive("t", "b", limit=10)
        assert [g.message.message_id for g in got] == [old[2], recent]


async def test_retention_runs_every_few_minutes_not_every_tick(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        mid = (await hub.send("t", "a", "b", "x")).message_id
        [g] = await hub.receive("t", "b")
        await hub.ack("t", "b", [g.message.message_id])
        clock.advance(HOUR - 100)
        await hub.maintain()  # a pass runs: nothing is old enough; the next is in 300 s
        clock.advance(150)
        await hub.maintain()  # old enough now, but no pass is due
        assert (await hub.message_status("t", mid)).state.value == "acked"
        clock.advance(150)
        await hub.maintain()  # the pass is due
        with pytest.raises(UnknownMessage):
            await hub.message_status("t", mid)


async def test_keeping_everything_and_bad_settings(clock: FakeClock) -> None:
    async with Hub(MemoryStore(), clock=clock, background=False, retention_seconds=None) as hub:
        await _team(hub)
        mid = (await hub.send("t", "a", "b", "kept")).message_id
        [g] = await hub.receive("t", "b")
        await hub.ack("t", "b", [g.message.message_id])
        clock.advance(400 * 86400)
        await hub.maintain()
        assert (await hub.message_status("t", mid)).state.value == "acked"
    with pytest.raises(InvalidRequest, match="retention_seconds must be positive"):
        Hub(MemoryStore(), retention_seconds=0)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_wait_timer_longer_than_the_retention_still_quotes_the_reply(
    kind: str, tmp_path: Path, clock: FakeClock
) -> None:
    """A wait timer notes its target's reply as it is sent (its id, time and the start of
    its text): when the timer fires after retention took the acked reply, it still tells
    its session that the peer replied, and what."""
    store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "hub.db")
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        for m in ("a", "b"):
            await hub.open_session("t", m, f"{m}-s")
        await hub.set_timer("t", "a", "a-s", "wait", 10 * HOUR, "did b answer?", target="b")
        reply = (await hub.send("t", "b", "a", "the answer is 42")).message_id
        got = await hub.receive("t", "a", session="a-s", limit=10)
        await hub.ack("t", "a", [g.message.message_id for g in got])
        clock.advance(2 * HOUR)
        await hub.maintain()
        with pytest.raises(UnknownMessage):  # retention took it
            await hub.message_status("t", reply)

        clock.advance(8 * HOUR)
        await hub.maintain()
        got = await hub.receive("t", "a", session="a-s", limit=10)
        [breadcrumb] = [g.message for g in got if g.message.kind.value == "timer"]
        assert "b has replied" in breadcrumb.text and "the answer is 42" in breadcrumb.text
        assert breadcrumb.meta["reply_message_id"] == reply


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    """A new store of ``kind`` (memory, sqlite, or postgres on a database of its own)."""
    if kind == "postgres":
        from backchannel.stores.postgres import PostgresStore

        return PostgresStore(request.getfixturevalue("new_postgres_url")())
    return MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "hub.db")


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_feed_reader_misses_nothing_when_retention_takes_the_newest_events(
    kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """A message that waited past the retention and was then acked owns the newest
    history events; when retention takes it, a feed reader (``tail --after``, the
    dashboard) whose cursor is on those events still sees every later event."""
    store = _store(kind, tmp_path, request)
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        old = (await hub.send("t", "a", "b", "waited long")).message_id
        clock.advance(2 * HOUR)
        [got] = await hub.receive("t", "b")
        await hub.ack("t", "b", [got.message.message_id])
        seen = await hub.feed("t")
        assert seen[-1].event.message_id == old and seen[-1].event.event == "acked"
        cursor = seen[-1].cursor
        clock.advance(2 * HOUR)
        await hub.maintain()  # retention takes the old message and its history
        with pytest.raises(UnknownMessage):
            await hub.message_status("t", old)
        new = (await hub.send("t", "a", "b", "after the pass")).message_id
        later = await hub.feed("t", after=cursor)
        assert [(i.event.message_id, i.event.event) for i in later] == [(new, "queued")]
        assert all(i.cursor > cursor for i in later)


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_feed_reader_misses_nothing_when_another_team_is_removed(
    kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """Removing a team takes its history with it; a reader of another team's feed, whose
    own last events retention took, still sees every later event of its team."""
    store = _store(kind, tmp_path, request)
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        await hub.create_team("x", settings={"anchor_policy": "off"})
        for m in ("a", "b"):
            await hub.add_member("x", m)
        await hub.send("x", "a", "b", "x, early")  # x's history comes first ...
        old = (await hub.send("t", "a", "b", "waited long")).message_id
        clock.advance(2 * HOUR)
        [got] = await hub.receive("t", "b")
        await hub.ack("t", "b", [got.message.message_id])
        cursor = (await hub.feed("t"))[-1].cursor
        clock.advance(2 * HOUR)
        await hub.send("x", "a", "b", "x, late")  # ... and last
        await hub.maintain()  # retention takes t's old message, not x's late one
        with pytest.raises(UnknownMessage):
            await hub.message_status("t", old)
        await hub.remove_team("x")
        new = (await hub.send("t", "a", "b", "after the removal")).message_id
        later = await hub.feed("t", after=cursor)
        assert [(i.event.message_id, i.event.event) for i in later] == [(new, "queued")]
        assert all(i.cursor > cursor for i in later)


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_message_acked_after_waiting_past_the_retention_is_kept_a_retention_more(
    kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """Retention counts from when a message was done with, not from when it was sent: a
    message acked after a long wait keeps its status and history (its sender can see it
    was delivered; a feed reader polling now sees its ack) for the retention period."""
    store = _store(kind, tmp_path, request)
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        old = (await hub.send("t", "a", "b", "waited long")).message_id
        clock.advance(2 * HOUR)
        [got] = await hub.receive("t", "b")
        await hub.ack("t", "b", [got.message.message_id])
        await hub.maintain()  # a pass right after the ack
        assert (await hub.message_status("t", old)).state.value == "acked"
        events = [(i.event.message_id, i.event.event) for i in await hub.feed("t")]
        assert events == [(old, "queued"), (old, "leased"), (old, "acked")]
        clock.advance(HOUR / 2)
        await hub.maintain()
        assert (await hub.message_status("t", old)).state.value == "acked"
        clock.advance(HOUR)
        await hub.maintain()  # a retention after the ack: now it goes
        with pytest.raises(UnknownMessage):
            await hub.message_status("t", old)


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_a_pass_gets_past_more_waiting_messages_of_one_moment_than_a_batch(
    kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """Retention reads messages a batch (500) at a time, oldest first. When more than a
    batch that must stay (still waiting) were all created at one moment (a batch send,
    a frozen clock), a pass goes on past them to the messages after, instead of reading
    the same batch again and again and never reaching the rest."""
    store = _store(kind, tmp_path, request)
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        await hub.add_member("t", "c")
        waiting = await hub.send_many(
            "t", "a", [Outgoing("b", f"waiting {i}", link=False) for i in range(600)]
        )
        done = await hub.send_many(
            "t", "a", [Outgoing("c", f"done {i}", link=False) for i in range(3)]
        )
        clock.advance(1)
        done.append(await hub.send("t", "a", "c", "done later", link=False))
        moments = {
            (await hub.message_status("t", r.message_id)).message.created_at
            for r in [*waiting, *done[:3]]
            if isinstance(r, SendResult)
        }
        assert len(moments) == 1, "the batch is one moment"
        got = await hub.receive("t", "c", limit=10)
        assert len(got) == 4
        await hub.ack("t", "c", [g.message.message_id for g in got])

        clock.advance(2 * HOUR)
        await hub.maintain()  # one pass
        for r in done:
            assert isinstance(r, SendResult)
            with pytest.raises(UnknownMessage):
                await hub.message_status("t", r.message_id)
        assert await hub.pending("t", "b") == 600, "what still waits is kept"


@pytest.mark.parametrize(
    "kind", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
async def test_retention_takes_a_removed_messages_events_out_of_the_feed(
    kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """A message retention removed leaves nothing in the team's feed (``tail``, the
    dashboard) on any store: its events go with it, and the events kept keep their
    cursors."""
    store = _store(kind, tmp_path, request)
    async with Hub(store, clock=clock, background=False, retention_seconds=HOUR) as hub:
        await _team(hub)
        old = (await hub.send("t", "a", "b", "old")).message_id
        [got] = await hub.receive("t", "b")
        await hub.ack("t", "b", [got.message.message_id])
        waiting = (await hub.send("t", "a", "b", "still waiting")).message_id
        before = [(i.cursor, i.event.message_id, i.event.event) for i in await hub.feed("t")]
        assert {mid for _, mid, _ in before} == {old, waiting}
        clock.advance(2 * HOUR)
        await hub.maintain()
        with pytest.raises(UnknownMessage):
            await hub.message_status("t", old)
        after = [(i.cursor, i.event.message_id, i.event.event) for i in await hub.feed("t")]
        assert after == [e for e in before if e[1] == waiting]
        assert all(i.message is not None for i in await hub.feed("t"))
