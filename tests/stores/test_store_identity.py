"""A store's identity: kept in the store (``store_identity``, made once by migration 25),
the same for every hub that opens it however it reaches it, another for every other
store (a copy included). The claims of Claude Code inbox files name a store by it."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from backchannel.delivery.inbox_file import (
    StoreMark,
    _claim_of,
    _key,
    _presence_file,
    claim_inbox,
    held_elsewhere,
    store_mark,
)
from backchannel.errors import StoreError
from backchannel.files import private_dirs
from backchannel.stores.base import Store
from backchannel.stores.sqlite import SqliteStore
from backchannel.testing import MemoryStore


async def _identity(store: Store) -> str:
    async with store:
        assert store.identity
        return store.identity


async def test_every_opening_of_one_store_has_its_identity(
    make_store: Callable[[], Store],
) -> None:
    """Opened again (a restart, another hub) a store has the identity it was given when
    it was made; a memory store is its own, one per object."""
    store = make_store()
    first = await _identity(store)
    if isinstance(store, MemoryStore):
        assert first != await _identity(make_store())
        return
    if isinstance(store, SqliteStore):
        again: Store = SqliteStore(store.path)
    else:
        from backchannel.stores.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        again = PostgresStore(store._dsn)
    assert await _identity(again) == first
    assert await _identity(make_store()) != first, "another store, another identity"


async def test_a_sqlite_file_under_two_paths_is_one_store_and_a_copy_another(
    tmp_path: Path,
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    db = tmp_path / "real" / "hub.db"
    one = await _identity(SqliteStore(db))
    assert await _identity(SqliteStore(tmp_path / "link" / "hub.db")) == one
    shutil.copy(db, tmp_path / "copy.db")  # the same id inside, another file
    assert await _identity(SqliteStore(tmp_path / "copy.db")) != one
    a, b = SqliteStore(db), SqliteStore(tmp_path / "copy.db")
    async with a, b:
        assert store_mark(a).key != store_mark(b).key


async def test_a_store_whose_identity_row_was_removed_says_so(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "hub.db"
    await _identity(SqliteStore(db))
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM store_identity")
    with pytest.raises(StoreError, match=r"lost its identity.*store_identity"):
        await _identity(SqliteStore(db))


async def test_a_claim_naming_the_store_by_where_it_is_is_still_this_stores(
    tmp_path: Path,
) -> None:
    """The previous version named a store in a claim by a hash of where it is. Such a
    claim of this store's member is this store's (made to name its identity at the next
    write), even while the previous version's hub of this store still holds the presence
    file of that key; another member's still holds the file."""
    db = tmp_path / "hub.db"
    path = tmp_path / "teams" / "t" / "inboxes" / "r.json"
    old = StoreMark(_key(f"sqlite://{db.resolve()}"), "the old hub")
    assert claim_inbox(path, "t", "r", old) is None  # written by the previous version
    private_dirs(_presence_file(old.key).parent)
    fd = os.open(_presence_file(old.key), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # that hub still serving
        store = SqliteStore(db)
        async with store:
            mark = store_mark(store)
            assert mark.key != old.key and old.key in mark.legacy
            assert held_elsewhere(path, mark) is None
            assert claim_inbox(path, "t", "x", mark) == ("t", "r")
            assert claim_inbox(path, "t", "r", mark) is None
            assert json.loads(_claim_of(path).read_text())["store"] == mark.key
    finally:
        os.close(fd)
