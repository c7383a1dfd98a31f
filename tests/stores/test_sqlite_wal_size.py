"""The SQLite store's write-ahead log does not keep the size a burst of traffic gave it:
once the burst is over (and whatever held the log's old pages let go), the writer
checkpoints and truncates it, without a further write and without a restart."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from backchannel.hub import Hub
from backchannel.stores.sqlite import SqliteStore
from backchannel.stores.sqlite.store import JOURNAL_SIZE_LIMIT
from backchannel.testing import eventually


def _wal(db: Path) -> int:
    try:
        return os.path.getsize(f"{db}-wal")
    except FileNotFoundError:
        return 0


async def test_the_log_a_burst_grew_shrinks_once_the_burst_is_over(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    async with Hub(SqliteStore(db)) as hub:
        await hub.create_team("t")
        for name in ("a", "b"):
            await hub.add_member("t", name)
        # another process reads meanwhile (a backup, the sqlite3 shell): no checkpoint
        # can reset the log while its snapshot lasts, so the burst grows the log
        reader = sqlite3.connect(db)
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()

        async def sender(k: int) -> None:
            for i in range(250):
                await hub.send("t", "a", "b", f"{k}-{i} " + "x" * 4000)

        await asyncio.gather(*(sender(k) for k in range(8)))
        grown = _wal(db)
        assert grown > 2 * JOURNAL_SIZE_LIMIT, grown  # the burst did grow it
        reader.execute("ROLLBACK")
        reader.close()
        await eventually(
            lambda: _wal(db) <= JOURNAL_SIZE_LIMIT,
            what="the log to shrink after the burst",
            within=15,
            show=lambda: _wal(db),
        )
        got = 0
        while batch := await hub.receive("t", "b", limit=500):
            await hub.ack("t", "b", [m.message.message_id for m in batch])
            got += len(batch)
        assert got == 2000
