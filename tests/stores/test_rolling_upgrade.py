"""Two hub versions on one store during a rolling upgrade: a newer backchannel migrates
the SQLite file while this one still runs. What this one would write next could be
misread by the newer schema (a column it does not fill, an index it does not know), so
every write from then on fails with an error that names the newer version and the way
out, and nothing of it is stored."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from backchannel.errors import StoreError
from backchannel.hub import Hub
from backchannel.stores.base import SCHEMA_VERSION
from backchannel.stores.postgres import LISTENER_NAME, PostgresStore
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock, eventually

pytestmark = pytest.mark.timeout(60)


def _migrate_ahead(path: Path) -> None:
    """What a newer backchannel's next migration does to the file: change the schema and
    record the version, in one write transaction, from another connection."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ALTER TABLE deliveries ADD COLUMN priority INTEGER NOT NULL DEFAULT 0")
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)",
            (SCHEMA_VERSION + 1,),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


async def test_a_hub_whose_sqlite_file_a_newer_backchannel_migrated_stops_writing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hub.db"
    async with Hub(SqliteStore(path), clock=FakeClock(), background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "a")
        await hub.add_member("t", "b")
        await hub.send("t", "a", "b", "before the upgrade")
        _migrate_ahead(path)
        messages, deliveries = _count(path, "messages"), _count(path, "deliveries")
        for call in (
            lambda: hub.send("t", "a", "b", "after the upgrade"),
            lambda: hub.receive("t", "b", session="b-s", limit=10),
        ):
            with pytest.raises(StoreError) as caught:
                await call()
            text = str(caught.value)
            assert f"schema version {SCHEMA_VERSION + 1}" in text, text
            assert "newer backchannel" in text and "nothing was stored" in text, text
            assert "upgrade" in text and "stop this hub" in text, text
        assert _count(path, "messages") == messages
        assert _count(path, "deliveries") == deliveries
        conn = sqlite3.connect(path)
        try:
            states = [r[0] for r in conn.execute("SELECT state FROM deliveries")]
        finally:
            conn.close()
        assert states == ["queued"], "the older hub leased nothing after the migration"


@pytest.mark.postgres
async def test_a_postgres_hub_told_a_newer_backchannel_migrated_stops_writing(
    new_postgres_url: Callable[[], str],
) -> None:
    # what a newer release's migrate does (it is this release's migrate, with one more
    # migration): change the schema, record the version, announce it, in one transaction
    url = new_postgres_url()
    async with Hub(PostgresStore(url), clock=FakeClock(), background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "a")
        await hub.add_member("t", "b")
        await hub.send("t", "a", "b", "before the upgrade")
        with psycopg.connect(url) as pg, pg.transaction():
            pg.execute("ALTER TABLE deliveries ADD COLUMN priority integer NOT NULL DEFAULT 0")
            pg.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
            pg.execute("SELECT pg_notify('backchannel', %s)", (f"schema:{SCHEMA_VERSION + 1}",))
        refused: list[str] = []

        async def refuses() -> bool:
            try:
                await hub.send("t", "a", "b", "after the upgrade", message_id="after")
            except StoreError as exc:
                refused.append(str(exc))
                return True
            return False

        await eventually(refuses, what="the hub refuses to write", within=10)
        text = refused[-1]
        assert f"schema version {SCHEMA_VERSION + 1}" in text, text
        assert "newer backchannel" in text and "stop this hub" in text, text
        with pytest.raises(StoreError):
            await hub.receive("t", "b", session="b-s", limit=10)
        with psycopg.connect(url) as pg:
            rows = pg.execute("SELECT d.state FROM deliveries d ORDER BY seq").fetchall()
        # a send the hub took before it heard of the migration may be stored; one it
        # refused is not, and nothing was leased once it had
        assert [r[0] for r in rows].count("leased") == 0


@pytest.mark.postgres
async def test_a_postgres_migration_announces_the_version_it_reached(
    new_postgres_url: Callable[[], str],
) -> None:
    url = new_postgres_url()
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN backchannel")
        async with Hub(PostgresStore(url), clock=FakeClock(), background=False):
            pass
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [f"schema:{SCHEMA_VERSION}"]


@pytest.mark.postgres
async def test_a_postgres_hub_whose_listener_missed_the_notice_learns_of_it_on_reconnect(
    new_postgres_url: Callable[[], str],
) -> None:
    # the listener's connection drops while a newer release migrates: the notice goes to
    # nobody, and the listener, connected again, reads the version from the table (the
    # migration holds schema_migrations until it commits, so the read comes after it)
    url = new_postgres_url()
    async with Hub(PostgresStore(url), clock=FakeClock(), background=False) as hub:
        await hub.create_team("t", settings={"anchor_policy": "off"})
        await hub.add_member("t", "a")
        await hub.add_member("t", "b")
        with (
            psycopg.connect(url) as pg,
            psycopg.connect(url, autocommit=True) as watch,
            pg.transaction(),
        ):
            pg.execute("LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE")
            pg.execute("ALTER TABLE deliveries ADD COLUMN priority integer DEFAULT 0")
            pg.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
            gone = [
                r[0]
                for r in pg.execute(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (LISTENER_NAME,),
                )
            ]
            assert gone, "the hub's listener was connected"

            def listener_back() -> bool:
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND NOT pid = ANY(%s)",
                    (LISTENER_NAME, gone),
                ).fetchone()
                return bool(row and row[0])

            # connected again before the migration commits, which sends no notice
            await eventually(listener_back, what="the listener connected again")
        refused: list[str] = []

        async def refuses() -> bool:
            try:
                await hub.send("t", "a", "b", "after the upgrade", message_id="after")
            except StoreError as exc:
                refused.append(str(exc))
                return True
            return False

        await eventually(refuses, what="the hub refuses to write", within=10)
        assert f"schema version {SCHEMA_VERSION + 1}" in refused[-1], refused[-1]
