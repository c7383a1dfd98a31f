"""Two hub versions on one store during a rolling upgrade: a newer backchannel migrates
the SQLite file while this one still runs. What this one would write next could be
misread by the newer schema (a column it does not fill, an index it does not know), so
every write from then on fails with an error that names the newer version and the way
out, and nothing of it is stored."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from backchannel.errors import StoreError
from backchannel.hub import Hub
from backchannel.stores.base import SCHEMA_VERSION
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import FakeClock

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
