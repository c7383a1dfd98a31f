"""The PostgreSQL listener's heartbeat: its settings, and how it tells a server that is
slow from one that is frozen.

A heartbeat (``SELECT 1`` on the listener's connection) that goes unanswered for
``frozen_after`` seconds does not prove the server frozen: one backend starved of CPU, or
the hub's own process stalled, leaves it unanswered too while the server runs and the
requests in flight would complete. The hub then opens a fresh connection: a server that
completes its handshake is alive, and nothing is cut. A frozen one (every process
stopped) does not, and the requests in flight are answered 503 within a bound.

The slow server is made deterministically: only the listener's own backend is stopped
(SIGSTOP), while a transaction of the hub waits on a team lock a test session holds."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from backchannel.config import open_store
from backchannel.errors import InvalidRequest, StoreError
from backchannel.stores.postgres import LISTENER_NAME, PostgresStore
from backchannel.stores.postgres.store import FROZEN_AFTER, HEARTBEAT_EVERY, probe_wait
from backchannel.stores.postgres.transaction import _lock_key
from backchannel.testing import eventually
from tests.conftest import BIN
from tests.pg_harness import PgServer
from tests.stores.test_postgres_restart import own_server  # noqa: F401 (a fixture)

EVERY = 0.5
AFTER = 2.0


def _listener_pid(conn: psycopg.Connection[tuple[int]], other_than: int = 0) -> int | None:
    """The pid of the listener's backend (one other than ``other_than``: a stopped backend
    stays listed until it runs again)."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
        "AND datname = current_database() AND pid <> %s",
        (LISTENER_NAME, other_than),
    ).fetchone()
    return row[0] if row else None


def test_the_heartbeat_settings_are_checked_with_the_way_out() -> None:
    url = "postgresql://u:secret@127.0.0.1:1/db"
    for every, after, says in [
        (0.05, 10.0, "heartbeat_every 0.05 s is too short"),
        (2.0, 0.5, "frozen_after 0.5 s is too short"),
        (float("nan"), 10.0, "heartbeat_every must be a positive number"),
        (2.0, -1.0, "frozen_after must be a positive number"),
    ]:
        with pytest.raises(ValueError, match=says):
            PostgresStore(url, heartbeat_every=every, frozen_after=after)
    with pytest.raises(InvalidRequest, match=r"--pg-frozen-after 0\.5 s is too short.*at least 1"):
        open_store(url, pg_frozen_after=0.5)
    with pytest.raises(InvalidRequest, match="--pg-heartbeat applies only to a PostgreSQL store"):
        open_store("memory://", pg_heartbeat=1.0)
    store = open_store(url, pg_heartbeat=EVERY, pg_frozen_after=AFTER)
    assert isinstance(store, PostgresStore)
    assert (store._heartbeat_every, store._frozen_after) == (EVERY, AFTER)
    default = open_store(url)
    assert isinstance(default, PostgresStore)
    assert (default._heartbeat_every, default._frozen_after) == (HEARTBEAT_EVERY, FROZEN_AFTER)


def test_serve_refuses_a_frozen_after_that_cannot_work(tmp_path: Path) -> None:
    r = subprocess.run(
        [str(BIN), "serve", "--port", "0", "--store", "postgresql://u:pw@127.0.0.1:1/db",
         "--pg-frozen-after", "0.1"],
        env={**os.environ, "BACKCHANNEL_HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "--pg-frozen-after 0.1 s is too short" in " ".join(r.stderr.split())


@pytest.mark.parametrize(
    ("refusal", "runs"),
    [
        ("connection failed: FATAL:  sorry, too many clients already", True),
        ('connection failed: FATAL:  password authentication failed for user "u"', True),
        ("connection timeout expired", False),
        ("connection failed: Connection refused", False),
    ],
)
def test_a_server_that_refuses_the_probe_in_words_runs(
    monkeypatch: pytest.MonkeyPatch, refusal: str, runs: bool
) -> None:
    # a live server at its max_connections refuses the fresh connection, but answers
    def connect(*args: object, **kwargs: object) -> None:
        raise psycopg.OperationalError(refusal)

    store = PostgresStore("postgresql://u:pw@127.0.0.1:1/db", frozen_after=AFTER)
    monkeypatch.setattr(psycopg, "connect", connect)
    assert store._answers() is runs


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(120)
async def test_a_live_server_slow_to_answer_the_heartbeat_cuts_nothing(
    own_server: PgServer,  # noqa: F811
) -> None:
    url = own_server.new_database()
    store = PostgresStore(url, heartbeat_every=EVERY, frozen_after=AFTER)
    await store.open()
    try:
        with psycopg.connect(url, autocommit=True) as holder:
            first = await eventually(
                lambda: _listener_pid(holder), what="the listener's backend", within=20
            )
            holder.execute("SELECT pg_advisory_lock(%s)", (_lock_key("slow"),))
            waiting = store.transact(lambda tx: tx.session_counts("slow"))

            def waits_on_the_lock() -> bool:
                row = holder.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'backchannel' AND wait_event_type = 'Lock'"
                ).fetchone()
                return bool(row and row[0])

            await eventually(waits_on_the_lock, what="the hub's transaction on the lock")
            os.kill(first, signal.SIGSTOP)  # the listener's backend answers nothing now
            try:
                # past frozen_after the hub asks a new connection, which the server
                # answers: it replaces the listener's connection and cuts nothing
                await eventually(
                    lambda: _listener_pid(holder, other_than=first),
                    what="a new listener connection",
                    within=AFTER + probe_wait(AFTER) + 20,
                )
            finally:
                os.kill(first, signal.SIGCONT)
            assert not waiting.done(), waiting
            assert not store._frozen
            holder.execute("SELECT pg_advisory_unlock(%s)", (_lock_key("slow"),))
            assert await asyncio.wait_for(waiting, 30) is not None  # committed, not cut
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(120)
async def test_a_frozen_server_is_cut_after_the_set_wait_not_the_default(
    own_server: PgServer,  # noqa: F811
) -> None:
    url = own_server.new_database()
    store = PostgresStore(url, heartbeat_every=EVERY, frozen_after=AFTER)
    await store.open()
    try:
        with own_server.frozen():
            started = time.monotonic()
            in_flight = store.transact(lambda tx: tx.session_counts("frozen"))
            with pytest.raises(StoreError, match="stopped answering") as got:
                # the default waits FROZEN_AFTER (10 s) before it even asks
                await asyncio.wait_for(in_flight, FROZEN_AFTER + 30)
            took = time.monotonic() - started
        assert took < FROZEN_AFTER, (took, got.value)
        assert f"no answer in {AFTER:g} s" in str(got.value)
        # thawed: it serves again
        await eventually(lambda: not store._frozen, what="the listener back", within=30)

        async def serves() -> bool:
            try:
                await store.transact(lambda tx: tx.session_counts("frozen"))
            except StoreError:
                return False
            return True

        await eventually(serves, what="a transaction after the thaw", within=30)
    finally:
        await store.close()
