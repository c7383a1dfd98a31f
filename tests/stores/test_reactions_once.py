"""A member's reaction with one emoji is in a message's history once, and the database
says so (migration 15, ``delivery_events_reaction``), not only the order in which the
hub's transactions happen to run: two recorded at the same moment on two connections
leave one line, and a database that already holds copies still migrates."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backchannel.hub import Hub
from backchannel.stores.base import SCHEMA_VERSION, Store
from backchannel.stores.postgres import PostgresStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, eventually_blocking

pytestmark = pytest.mark.timeout(90)

REACT = (
    "INSERT INTO delivery_events (team, id, message_id, member, at, event, detail) "
    "VALUES ('t', nextval('delivery_event_id'), %s, 'b', %s, 'reaction', '+1') "
    "ON CONFLICT DO NOTHING RETURNING 1"
)


async def _sent(hub: Hub) -> str:
    await hub.create_team("t", settings={"anchor_policy": "off"})
    await hub.add_member("t", "a")
    await hub.add_member("t", "b")
    return (await hub.send("t", "a", "b", "the report is due")).message_id


def _reactions(rows: list[Any]) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in rows]


@pytest.mark.postgres
async def test_the_same_reaction_on_two_connections_at_once_is_recorded_once(
    new_postgres_url: Callable[[], str],
) -> None:
    # two writers record the same reaction, neither having seen the other's: the second
    # waits for the first, then records nothing and says so (no row back, no error)
    url = new_postgres_url()
    async with Hub(PostgresStore(url), clock=FakeClock(), background=False) as hub:
        mid = await _sent(hub)
    first = psycopg.connect(url)
    second = psycopg.connect(url)
    answered: list[Any] = []
    try:
        assert first.execute(REACT, (mid, 1.0)).fetchone() == (1,)
        pid = second.info.backend_pid

        def react_too() -> None:
            answered.append(second.execute(REACT, (mid, 1.0)).fetchone())

        racer = threading.Thread(target=react_too)
        racer.start()

        def waiting_or_done() -> bool:
            if answered:
                return True
            with psycopg.connect(url, autocommit=True) as look:
                row = look.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
            return row is not None and row[0] == "Lock"

        eventually_blocking(waiting_or_done, what="the second insert to wait or finish")
        first.commit()
        racer.join(30)
        assert not racer.is_alive()
        second.commit()
    finally:
        first.close()
        second.close()
    assert answered == [None], "the second one is a repeat"
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT member, detail FROM delivery_events WHERE team = 't' AND message_id = %s "
            "AND event = 'reaction'",
            (mid,),
        ).fetchall()
    assert _reactions(rows) == [("b", "+1")]


@pytest.mark.postgres
async def test_two_hubs_reacting_at_once_answer_each_call_and_record_each_reaction_once(
    new_postgres_url: Callable[[], str],
) -> None:
    url = new_postgres_url()
    clock = FakeClock()
    async with (
        Hub(PostgresStore(url), clock=clock, background=False) as one,
        Hub(PostgresStore(url), clock=clock, background=False) as two,
    ):
        mid = await _sent(one)
        calls = [h.react("t", who, mid, e) for e in ("+1", "eyes") for who in ("a", "b")
                 for h in (one, two, one, two)]  # fmt: skip
        await asyncio.gather(*calls)
        status = await two.message_status("t", mid)
    got = [(h.member, h.detail) for h in status.history if h.event == "reaction"]
    assert sorted(got) == [("a", "+1"), ("a", "eyes"), ("b", "+1"), ("b", "eyes")]


# -- a database that holds copies from before migration 15 ----------------------------


def _store(kind: str, where: str) -> Store:
    return SqliteStore(Path(where)) if kind == "sqlite" else PostgresStore(where)


def _sql(kind: str, where: str, statements: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    """Run ``statements`` on the store's database directly; the last one's rows."""
    rows: list[Any] = []
    if kind == "sqlite":
        lite = sqlite3.connect(where, isolation_level=None)
        try:
            for sql, args in statements:
                rows = lite.execute(sql, args).fetchall()
        finally:
            lite.close()
        return rows
    with psycopg.connect(where, autocommit=True) as pg:
        for sql, args in statements:
            cur = pg.execute(sql.replace("?", "%s"), args)  # type: ignore[arg-type]
            rows = cur.fetchall() if cur.description else []
    return rows


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_a_database_holding_the_same_reaction_twice_migrates_keeping_the_first(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = (
        str(tmp_path / "hub.db")
        if kind == "sqlite"
        else request.getfixturevalue("new_postgres_url")()
    )
    clock = FakeClock()
    async with Hub(_store(kind, where), clock=clock, background=False) as hub:
        mid = await _sent(hub)
        reacted_at = clock.now()
        await hub.react("t", "b", mid, "+1")
        await hub.react("t", "a", mid, "+1")
    later = reacted_at + 9
    # what schema 14 allowed: the same reaction recorded again, beside other lines
    insert = (
        "INSERT INTO delivery_events (team, message_id, member, at, event, detail) "
        "VALUES ('t', ?, ?, ?, ?, ?)"
        if kind == "sqlite"
        else "INSERT INTO delivery_events (team, id, message_id, member, at, event, detail) "
        "VALUES ('t', nextval('delivery_event_id'), ?, ?, ?, ?, ?)"
    )
    _sql(kind, where, [
        ("DROP TABLE store_identity", ()),  # the migrations after 15, applied again
        ("DELETE FROM schema_migrations WHERE version = 25", ()),
        ("DROP INDEX jobs_timers_member_pending", ()),
        ("DELETE FROM schema_migrations WHERE version = 24", ()),
        ("DROP INDEX budgets_recent", ()),
        ("DELETE FROM schema_migrations WHERE version = 23", ()),
        ("DROP INDEX delegations_state", ()),
        ("DROP INDEX sessions_team_live", ()),
        ("DROP INDEX sessions_team_active", ()),
        ("DROP INDEX jobs_timers", ()),
        ("DROP INDEX jobs_timers_pending", ()),
        ("DROP INDEX jobs_timers_member", ()),
        *([("DROP INDEX jobs_timers_session", ())] if kind == "postgres" else []),
        ("DELETE FROM schema_migrations WHERE version = 22", ()),
        ("DROP INDEX deliveries_holder", ()),
        ("ALTER TABLE deliveries DROP COLUMN lease_holder", ()),
        ("DELETE FROM schema_migrations WHERE version = 21", ()),
        ("DROP INDEX delegations_team", ()),
        ("DROP INDEX delegations_caller", ()),
        ("DROP INDEX delegations_callee", ()),
        ("DELETE FROM schema_migrations WHERE version = 20", ()),
        ("DROP INDEX sessions_team", ()),
        ("DROP INDEX links_team", ()),
        ("DROP INDEX links_team_open", ()),
        ("DELETE FROM schema_migrations WHERE version = 19", ()),
        ("DROP TABLE a2a_claims", ()),
        ("DELETE FROM schema_migrations WHERE version = 18", ()),
        ("DROP TABLE push_circuits", ()),
        ("DELETE FROM schema_migrations WHERE version = 17", ()),
        ("ALTER TABLE teams DROP COLUMN feed_removed", ()),
        ("DELETE FROM schema_migrations WHERE version = 16", ()),
        ("DROP INDEX delivery_events_reaction", ()),
        ("DELETE FROM schema_migrations WHERE version = 15", ()),
        (insert, (mid, "b", later, "reaction", "+1")),
        (insert, (mid, "b", later, "reaction", "+1")),
        (insert, (mid, "b", later, "noted", "+1")),
    ])  # fmt: skip
    async with Hub(_store(kind, where), clock=clock, background=False) as hub:
        status = await hub.message_status("t", mid)
        lines = [(h.member, h.event, h.detail) for h in status.history if h.event != "queued"]
        assert lines == [("b", "reaction", "+1"), ("a", "reaction", "+1"), ("b", "noted", "+1")]
        first = next(h.at for h in status.history if h.event == "reaction")
        assert first == reacted_at, "the first one is kept"
        await hub.react("t", "b", mid, "+1")  # and it stays once
        again = await hub.message_status("t", mid)
        assert [h.event for h in again.history].count("reaction") == 2
    versions = _sql(kind, where, [("SELECT max(version) FROM schema_migrations", ())])
    assert versions[0][0] == SCHEMA_VERSION
