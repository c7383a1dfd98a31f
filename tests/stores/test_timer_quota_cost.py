"""The timer quota is counted on every ``set_timer`` (``Tx.count_timers``): its cost
follows the member's pending timers, never the timers it set and saw fire or cancelled
(a busy agent sets one a turn, so a retention window holds a hundred thousand).

On SQLite the count is measured in virtual machine steps against a member with the same
pending timers and no history; on PostgreSQL the statement is run under EXPLAIN ANALYZE
with the history stored, before and after the table is analysed, and must read an index
of pending jobs alone and touch a few pages.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from backchannel.stores.sqlite import SqliteStore
from backchannel.types import Job, Session, SessionState

T0 = 1_000_000.0
HISTORY = 100_000
PENDING = 3
#: the indexes of pending jobs alone (their WHERE says ``state = 'pending'``)
PENDING_ONLY = {"jobs_timers_member_pending", "jobs_session_pending", "jobs_timers_pending"}


def _history_rows(team: str, member: str, session: str, n: int) -> list[tuple[object, ...]]:
    """``n`` finished timers of ``member``: every other one fired, the rest cancelled."""
    payload = f'{{"member": "{member}", "intent": "anchor", "note": "n"}}'
    return [
        (team, "timer", T0 + i, T0, session, payload, "done" if i % 2 else "cancelled", T0 + i)
        for i in range(n)
    ]


async def _sqlite_team(db: Path) -> list[str]:
    """A team where ``a`` holds PENDING timers and HISTORY finished ones, and ``s`` the
    same pending timers and no history; the statements ``count_timers`` runs for each."""
    seen: list[str] = []
    async with SqliteStore(db, on_statement=seen.append) as store:
        await store.transact(
            lambda tx: [
                tx.put_session(Session("t", f"{m}-s", m, SessionState.IDLE, T0, T0))
                for m in ("a", "s")
            ]
        )
        for m in ("a", "s"):
            for i in range(PENDING):
                job = Job("t", "timer", T0 + 60 + i, T0, f"{m}-s", {"member": m})
                await store.transact(lambda tx, j=job: tx.add_job(j))
        with sqlite3.connect(db) as conn:
            conn.executemany(
                "INSERT INTO jobs (team, kind, due_at, created_at, session_id, payload, "
                "state, done_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                _history_rows("t", "a", "a-s", HISTORY),
            )
        seen.clear()
        for m in ("a", "s"):
            assert await store.read(lambda tx, m=m: tx.count_timers("t", m, 100)) == PENDING
    counts = [sql for sql in seen if "count(*)" in sql and "kind = 'timer'" in sql]
    assert len(counts) == 2, seen
    return counts


def _steps(db: Path, sql: str) -> int:
    conn = sqlite3.connect(db)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    try:
        conn.set_progress_handler(count, 1)
        conn.execute(sql).fetchall()
    finally:
        conn.close()
    return steps


async def test_counting_timers_on_sqlite_reads_no_finished_timer(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    busy, fresh = await _sqlite_team(db)
    with sqlite3.connect(db) as conn:
        plan = [row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + busy)]
    assert any("jobs_timers_member_pending" in step for step in plan), plan
    busy_steps, fresh_steps = _steps(db, busy), _steps(db, fresh)
    assert busy_steps < fresh_steps * 1.5, (busy_steps, fresh_steps)
    # counting every timer of the member, which does read its history, shows the
    # measure can tell
    every = _steps(db, busy.replace("state = 'pending' AND ", "").replace("LIMIT 100", ""))
    assert every > busy_steps * 100, (every, busy_steps)


@pytest.mark.postgres
@pytest.mark.slow
async def test_counting_timers_on_postgres_reads_no_finished_timer(
    new_postgres_url: Callable[[], str],
) -> None:
    import psycopg

    from backchannel.stores.postgres import PostgresStore
    from backchannel.stores.postgres.tx import PgTx

    url = new_postgres_url()
    async with PostgresStore(url) as store:
        await store.transact(
            lambda tx: tx.put_session(Session("t", "a-s", "a", SessionState.IDLE, T0, T0))
        )
        for i in range(PENDING):
            job = Job("t", "timer", T0 + 60 + i, T0, "a-s", {"member": "a"})
            await store.transact(lambda tx, j=job: tx.add_job(j))

    def fill_and_explain() -> tuple[list[str], int]:
        sql = PgTx.count_timers_sql().replace("?", "%s")
        plans = []
        with psycopg.connect(url, autocommit=True) as conn:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO jobs (team, kind, due_at, created_at, session_id, payload, "
                    "state, done_at) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s)",
                    _history_rows("t", "a", "a-s", HISTORY),
                )
            # as a hub finds it before autovacuum analyses the table, and after
            for analyse in (False, True):
                if analyse:
                    conn.execute("ANALYZE jobs")
                rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", ("t", "a", 100))
                plans.append("\n".join(r[0] for r in rows))
            (n,) = conn.execute(sql, ("t", "a", 100)).fetchone()  # type: ignore[misc, arg-type]
        return plans, n

    plans, n = await asyncio.to_thread(fill_and_explain)
    assert n == PENDING
    for plan in plans:
        scans = re.findall(r"Scan using (\w+) on jobs", plan)
        assert scans and set(scans) <= PENDING_ONLY, plan
        assert "Seq Scan" not in plan, plan
        # the history is 100,000 rows: reading it would touch hundreds of pages
        hits = [int(h) for h in re.findall(r"shared hit=(\d+)", plan.split("Planning")[0])]
        assert max(hits) < 50, plan
