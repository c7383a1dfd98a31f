"""A store written by an older release, opened by this one: every version the
user may come from migrates with its rows, and what was in flight finishes as promised.
Each older store is made as that release left it: the schema of its version only (its
migrations applied, the later ones not), holding the rows of a store this release
filled, in the columns that version has."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from backchannel.hub import Hub
from backchannel.stores import postgres
from backchannel.stores.base import SCHEMA_VERSION, Store
from backchannel.stores.postgres import PostgresStore
from backchannel.stores.sqlite import MIGRATIONS, SqliteStore
from backchannel.testing import FakeClock
from backchannel.types import MessageKind

pytestmark = pytest.mark.timeout(60)


async def _fill(store: Store, clock: FakeClock) -> dict[str, str]:
    """A store with a message queued, one leased, one acked, one dead (and its notice to
    the sender), a pending anchor timer; returns the members' tokens."""
    async with Hub(store, clock=clock, background=False, max_attempts=1) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        tokens = {m: (await hub.add_member("t", m))[1] for m in ("a", "b", "c")}
        for m in ("a", "b", "c"):
            await hub.open_session("t", m, f"{m}-s")
        await hub.send("t", "a", "c", "acked", message_id="acked")
        await hub.send("t", "a", "c", "dead", message_id="dead")
        got = await hub.receive("t", "c", session="c-s", limit=1)
        await hub.ack("t", "c", [got[0].message.message_id])
        assert len(await hub.receive("t", "c", session="c-s", limit=1)) == 1
        clock.advance(61)
        await hub.maintain()  # "dead" ran out of its one attempt: the sender is told
        await hub.send("t", "a", "b", "leased", message_id="leased")
        await hub.send("t", "a", "b", "queued", message_id="queued")
        assert len(await hub.receive("t", "b", session="b-s", limit=1)) == 1
        await hub.set_timer("t", "a", "a-s", "anchor", 300, "back to the report")
    return tokens


def _as_of(source: Path, dest: Path, version: int) -> None:
    """``dest``: the schema of ``version`` holding ``source``'s rows (the columns that
    version has; tables it does not have yet are left out)."""
    conn = sqlite3.connect(dest, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
        )
        for v in range(1, version + 1):
            for statement in MIGRATIONS[v - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations VALUES (?, 0)", (v,))
        conn.execute("ATTACH ? AS new", (str(source),))
        tables = conn.execute(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' "
            "AND name != 'schema_migrations'"
        ).fetchall()
        for (table,) in tables:
            old = [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]
            now = {r[1] for r in conn.execute(f"PRAGMA new.table_info({table})")}
            cols = ", ".join(c for c in old if c in now)
            conn.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM new.{table}")
        if 2 <= version < 11:  # jobs came with migration 2, a timer's noted reply with 11
            conn.execute("UPDATE main.jobs SET payload = json_remove(payload, '$.reply')")
        conn.execute("DETACH new")
    finally:
        conn.close()


def _pg_as_of(source: str, dest: str, version: int) -> None:
    """The PostgreSQL :func:`_as_of`: ``dest`` (an empty database) at ``version`` with
    ``source``'s rows; its sequences start past every copied id."""
    with psycopg.connect(source) as src, psycopg.connect(dest) as dst:
        dst.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for v in range(1, version + 1):
            dst.execute(postgres.MIGRATIONS[v - 1].encode())
            dst.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (v,))
        columns = "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        order = "ORDER BY ordinal_position"
        tables = dst.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_name != 'schema_migrations'"
        ).fetchall()
        for (table,) in tables:
            now = {r[0] for r in src.execute(columns, (table,))}
            cols = ", ".join(r[0] for r in dst.execute(columns + order, (table,)) if r[0] in now)
            with (
                src.cursor().copy(f"COPY {table} ({cols}) TO STDOUT") as out,
                dst.cursor().copy(f"COPY {table} ({cols}) FROM STDIN") as into,
            ):
                for data in out:
                    into.write(data)
        if 2 <= version < 11:
            dst.execute("UPDATE jobs SET payload = payload - 'reply'")
        dst.execute(
            "SELECT setval(quote_ident(relname), 1000000) FROM pg_class "
            "WHERE relkind = 'S' AND relnamespace = 'public'::regnamespace"
        )


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("version", [1, 2, 5, 8, 10, 11, 12, 14, 15])
async def test_a_store_of_an_older_release_migrates_and_keeps_its_promises(
    tmp_path: Path, version: int, kind: str, request: pytest.FixtureRequest
) -> None:
    clock = FakeClock()
    old_store: Callable[[], Store]
    if kind == "sqlite":
        old = tmp_path / f"v{version}.db"
        tokens = await _fill(SqliteStore(tmp_path / "now.db"), clock)
        _as_of(tmp_path / "now.db", old, version)

        def old_store() -> Store:
            return SqliteStore(old)

    else:
        new_url: Callable[[], str] = request.getfixturevalue("new_postgres_url")
        now_url, old_url = new_url(), new_url()
        tokens = await _fill(PostgresStore(now_url), clock)
        _pg_as_of(now_url, old_url, version)

        def old_store() -> Store:
            return PostgresStore(old_url)

    async with Hub(old_store(), clock=clock, background=False) as hub:
        for m, token in tokens.items():
            member = await hub.authenticate(token)
            assert member is not None and member.name == m, "a token still works"
        clock.advance(301)  # past the lease of "leased" and the timer's due time
        await hub.maintain()
        await hub.maintain()
        seen: dict[str, list[str]] = {}
        for m in ("a", "b", "c"):
            for _ in range(3):
                got = await hub.receive("t", m, session=f"{m}-s", limit=100)
                if got:
                    await hub.ack("t", m, [g.message.message_id for g in got])
                seen.setdefault(m, []).extend(
                    g.message.message_id
                    if g.message.kind is not MessageKind.TIMER
                    else g.message.text.split("\n")[0]
                    for g in got
                )
                clock.advance(61)
                await hub.maintain()
    assert sorted(seen["b"]) == ["leased", "queued"], seen  # each once, the lease back
    assert seen["c"] == [], seen  # acked and dead are not delivered again
    timers = [t for t in seen["a"] if t.startswith("ANCHOR")]
    notices = [t for t in seen["a"] if not t.startswith("ANCHOR")]
    assert len(notices) == 1, f"the dead letter's notice, once: {seen}"
    # jobs came with migration 2: a store before it had no timers to fire
    assert timers == (["ANCHOR: back to the report"] if version >= 2 else []), seen
    if kind == "sqlite":
        conn = sqlite3.connect(old)
        try:
            reached = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]
            states = dict(conn.execute("SELECT message_id, state FROM deliveries"))
        finally:
            conn.close()
    else:
        with psycopg.connect(old_url) as pg:
            reached = pg.execute("SELECT max(version) FROM schema_migrations").fetchone()[0]
            states = dict(pg.execute("SELECT message_id, state FROM deliveries").fetchall())
    assert reached == SCHEMA_VERSION
    assert states["dead"] == "dead" and states["acked"] == "acked", states
