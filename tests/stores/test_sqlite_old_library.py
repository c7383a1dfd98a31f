"""An SQLite library older than 3.35 has no ``UPDATE … RETURNING``: there the store's ack
reads the copies' states first, and keeps the same contract."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from backchannel.stores.sqlite import SqliteStore
from backchannel.stores.sqlite import tx as sqlite_tx
from backchannel.testing.store_checks import check_ack, check_late_ack


async def test_ack_without_returning_keeps_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_tx, "RETURNING", False)
    seen: list[str] = []
    await check_ack(lambda: SqliteStore(tmp_path / "old.db", on_statement=seen.append))
    await check_late_ack(lambda: SqliteStore(tmp_path / "late.db", on_statement=seen.append))
    acks = [s for s in seen if "SET state = 'acked'" in s]
    assert acks and not any("RETURNING" in s for s in acks), acks[:2]


@pytest.mark.skipif(sqlite3.sqlite_version_info < (3, 35, 0), reason="no RETURNING here")
async def test_ack_is_one_statement_where_the_library_has_returning(tmp_path: Path) -> None:
    seen: list[str] = []
    await check_ack(lambda: SqliteStore(tmp_path / "new.db", on_statement=seen.append))
    acks = [s for s in seen if "SET state = 'acked'" in s]
    assert acks and all("RETURNING message_id" in s for s in acks), acks[:2]
