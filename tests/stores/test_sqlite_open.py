"""Opening a new SQLite file that another process is opening too (two hubs started
together on one file): SQLite refuses the switch to WAL at once, without its busy
timeout, while the other holds the new file, so the store tries again until it can."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from backchannel.errors import StoreError
from backchannel.stores.sqlite import SqliteStore
from backchannel.stores.sqlite import store as sqlite_store


def _holder(path: Path) -> sqlite3.Connection:
    """Another process's connection: the new file, in its rollback journal, write-locked
    (what the first of two hubs holds for an instant while it sets the file up)."""
    path.touch(mode=0o600)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


async def test_a_new_file_locked_by_another_opener_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shared.db"
    holder = _holder(path)
    pauses: list[float] = []

    def pause(seconds: float) -> None:  # the store's retry: the other opener lets go
        pauses.append(seconds)
        if holder.in_transaction:
            holder.execute("COMMIT")

    monkeypatch.setattr(sqlite_store, "_pause", pause)
    store = SqliteStore(path)
    await store.open()
    try:
        assert pauses, "the first switch to WAL was refused while the file was held"
        assert await store.transact(lambda tx: tx.get_team("t")) is None
        probe = sqlite3.connect(path)
        assert probe.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        probe.close()
    finally:
        await store.close()
        holder.close()


async def test_a_file_held_too_long_is_an_error_that_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "held.db"
    holder = _holder(path)
    monkeypatch.setattr(sqlite_store, "_OPEN_WAIT", 0.05)
    try:
        with pytest.raises(StoreError, match="into WAL mode: another process holds it"):
            await SqliteStore(path).open()
    finally:
        holder.close()


async def test_a_file_that_is_no_database_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the pages of a database " * 200)
    path.chmod(0o600)
    monkeypatch.setattr(sqlite_store, "_pause", lambda s: pytest.fail("waited for a lock"))
    with pytest.raises(StoreError, match="is not a SQLite database, not a backchannel store"):
        await SqliteStore(path).open()


def test_a_file_system_where_wal_cannot_work_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite's "unix-none" file layer has no shared memory: SQLite keeps the old journal
    # mode and says no more, as on a file system that cannot map the WAL index
    path = tmp_path / "nowal.db"
    conn = sqlite3.connect(f"file:{path}?vfs=unix-none", uri=True, isolation_level=None)
    monkeypatch.setattr(sqlite_store, "_pause", lambda s: pytest.fail("waited for a lock"))
    try:
        with pytest.raises(StoreError, match=r"kept journal mode 'delete'.*local disk"):
            sqlite_store._into_wal(conn, path)
    finally:
        conn.close()
