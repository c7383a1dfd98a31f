"""The SQLite writer keeps what every send reads (teams, members, budgets, a member's
active sessions, a pair's open link) across transactions, and writes the delivery
history once per commit. These tests attack the ways such a cache goes wrong: another
process writing the same file, a transaction that fails after writing, a job that fails
in a batch of good ones, a read of the history inside the transaction that wrote it,
and a hub that lives long enough to see many pairs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from backchannel.errors import AlreadyExists
from backchannel.stores.base import Tx
from backchannel.stores.sqlite import SqliteStore
from backchannel.stores.sqlite import tx as sqlite_tx
from backchannel.types import (
    Budget,
    DeliveryEvent,
    Link,
    LinkState,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Session,
    SessionState,
    Team,
)


async def _setup(store: SqliteStore) -> None:
    def fn(tx: Tx) -> None:
        tx.insert_team(Team("t", 0.0))
        for name in ("a", "b"):
            tx.insert_member(Member("t", name, MemberKind.LLM, 0.0, f"h-{name}"))

    await store.transact(fn)


def _session(sid: str, state: SessionState) -> Session:
    return Session("t", sid, "a", state, 0.0, 0.0)


def _link(state: LinkState = LinkState.OPEN) -> Link:
    return Link("t", "l1", "a", "s1", "b", None, 10, 0.0, state=state)


def _message(mid: str) -> Message:
    return Message("t", mid, "a", "b", "hi", MessageKind.DIRECT, 0.0, "fp")


async def test_another_process_writing_the_file_is_seen(tmp_path: Path) -> None:
    db = tmp_path / "hub.db"
    hub, other = SqliteStore(db), SqliteStore(db)
    await hub.open()
    await other.open()
    try:
        await _setup(hub)

        lives: list[list[str]] = []

        def read(tx: Tx) -> tuple[Budget | None, list[Session], Link | None]:
            lives.append([s.session_id for s in tx.list_sessions("t", "a", which="live")])
            return (
                tx.get_budget("t", "pair:a|b"),
                tx.list_sessions("t", "a", which="active", limit=2),
                tx.find_open_link("t", "b", "a"),
            )

        assert await hub.transact(read) == (None, [], None)  # read, and kept

        def write(tx: Tx) -> None:
            tx.put_budget(Budget("t", "pair:a|b", 0.0, used=3))
            tx.put_session(_session("s1", SessionState.ACTIVE))
            tx.insert_link(_link())

        await other.transact(write)
        budget, sessions, link = await hub.transact(read)
        assert budget is not None and budget.used == 3
        assert [s.session_id for s in sessions] == ["s1"]
        assert link is not None and link.link_id == "l1"

        def close(tx: Tx) -> None:
            tx.update_link(_link(LinkState.CLOSED))
            tx.put_session(_session("s1", SessionState.EXITED))
            tx.put_budget(Budget("t", "pair:a|b", 0.0, used=4))

        await other.transact(close)
        budget, sessions, link = await hub.transact(read)
        assert budget is not None and budget.used == 4
        assert (sessions, link) == ([], None)
        assert lives == [[], ["s1"], ["s1"]]  # exited: live still, not active

        await other.transact(lambda tx: tx.put_session(_session("s1", SessionState.TERMINATED)))
        await hub.transact(read)
        assert lives[-1] == []
    finally:
        await other.close()
        await hub.close()


async def test_own_writes_are_read_back_in_the_same_and_later_transactions(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "hub.db")
    await store.open()
    try:
        await _setup(store)

        def fn(tx: Tx) -> tuple[int, int, bool]:
            assert tx.list_sessions("t", "a", which="active", limit=2) == []
            assert tx.find_open_link("t", "a", "b") is None
            tx.put_session(_session("s1", SessionState.ACTIVE))
            tx.insert_link(_link())
            tx.put_budget(Budget("t", "pair:a|b", 0.0, used=1))
            b = tx.get_budget("t", "pair:a|b")
            return (
                len(tx.list_sessions("t", "a", which="active", limit=2)),
                b.used if b else 0,
                tx.find_open_link("t", "a", "b") is not None,
            )

        assert await store.transact(fn) == (1, 1, True)

        def later(tx: Tx) -> tuple[int, bool]:
            tx.update_link(_link(LinkState.CLOSED))
            return (
                len(tx.list_sessions("t", "a", which="active", limit=2)),
                tx.find_open_link("t", "a", "b") is None,
            )

        assert await store.transact(later) == (1, True)

        def ended(tx: Tx) -> tuple[int, int, int]:
            before = len(tx.list_sessions("t", "a", which="live"))
            tx.put_session(_session("s1", SessionState.TERMINATED))
            return (
                before,
                len(tx.list_sessions("t", "a", which="live")),
                len(tx.list_sessions("t", "a", which="all")),
            )

        assert await store.transact(ended) == (1, 0, 1)
        assert await store.transact(lambda tx: tx.list_sessions("t", "a", which="live")) == []
    finally:
        await store.close()


async def test_a_failed_transaction_leaves_nothing_cached(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "hub.db")
    await store.open()
    try:
        await _setup(store)

        def fails(tx: Tx) -> None:
            assert tx.get_budget("t", "pair:a|b") is None
            tx.put_budget(Budget("t", "pair:a|b", 0.0, used=9))
            tx.put_session(_session("s1", SessionState.ACTIVE))
            tx.insert_link(_link())
            tx.insert_message(_message("m1"), [Recipient("b")])
            raise RuntimeError("the send is refused after its writes")

        with pytest.raises(RuntimeError):
            await store.transact(fails)

        def read(tx: Tx) -> tuple[Budget | None, list[Session], Link | None, list[DeliveryEvent]]:
            return (
                tx.get_budget("t", "pair:a|b"),
                tx.list_sessions("t", "a", which="active", limit=2),
                tx.find_open_link("t", "a", "b"),
                tx.history("t", "m1"),
            )

        assert await store.transact(read) == (None, [], None, [])
    finally:
        await store.close()


async def test_a_failing_job_in_a_batch_takes_only_its_own_history(tmp_path: Path) -> None:
    """Jobs queued together commit together; one that fails (here a duplicate message
    id) is undone alone, its buffered history with it."""
    store = SqliteStore(tmp_path / "hub.db")
    await store.open()
    try:
        await _setup(store)
        await store.transact(lambda tx: tx.insert_message(_message("m0"), [Recipient("b")]))

        def insert(mid: str) -> Callable[[Tx], None]:
            def fn(tx: Tx) -> None:
                tx.insert_message(_message(mid), [Recipient("b")])
                tx.add_history("t", DeliveryEvent(mid, "b", 1.0, "noted", "by " + mid))

            return fn

        # queued together: the writer runs them as one batch, then one by one
        results = await asyncio.gather(
            store.transact(insert("m1")),
            store.transact(insert("m0")),
            store.transact(insert("m2")),
            return_exceptions=True,
        )
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], AlreadyExists)

        def events(tx: Tx) -> dict[str, list[str]]:
            return {m: [e.event for e in tx.history("t", m)] for m in ("m0", "m1", "m2")}

        assert await store.read(events) == {
            "m0": ["queued"],
            "m1": ["queued", "noted"],
            "m2": ["queued", "noted"],
        }
    finally:
        await store.close()


async def test_history_written_in_a_transaction_is_read_in_it(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "hub.db")
    await store.open()
    try:
        await _setup(store)

        def fn(tx: Tx) -> tuple[list[str], int]:
            tx.insert_message(_message("m1"), [Recipient("b")])
            seen = [e.event for e in tx.history("t", "m1")]
            return seen, len(tx.feed("t", 0, 10))

        assert await store.transact(fn) == (["queued"], 1)
    finally:
        await store.close()


async def test_the_caches_stay_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_tx, "_CACHE_ROWS", 50)
    store = SqliteStore(tmp_path / "hub.db")
    await store.open()
    try:
        await _setup(store)
        sizes: list[int] = []

        def fn(tx: Tx) -> None:
            for i in range(30):
                tx.get_budget("t", f"pair:x{i}|y")
            assert isinstance(tx, sqlite_tx.SqliteTx)
            sizes.append(len(tx._budgets))

        for _ in range(6):
            await store.transact(fn)
        assert max(sizes) <= 50 + 30
        assert sizes[-1] < 30 * 6
    finally:
        await store.close()


async def test_budget_writes_are_one_row_a_key_and_read_back_whatever_was_dropped(
    tmp_path: Path,
) -> None:
    """A transaction's budget upserts go to SQLite once per key at the end: what it
    wrote is read back in it, after its cache was dropped (a member added), by
    ``list_budgets``, by the reader once committed; a failing job's budget is undone
    with it; a rolled-back transaction writes none."""
    statements: list[str] = []
    store = SqliteStore(tmp_path / "hub.db", on_statement=statements.append)
    await store.open()
    try:
        await _setup(store)

        def count(used: int) -> Callable[[Tx], None]:
            def fn(tx: Tx) -> None:
                tx.put_budget(Budget("t", "pair:a|b", 0.0, used=used))

            return fn

        def counted_then_dropped(tx: Tx) -> tuple[int, int, list[int]]:
            for used in (1, 2, 3):
                tx.put_budget(Budget("t", "pair:a|b", 0.0, used=used))
            tx.insert_member(Member("t", "c", MemberKind.LLM, 0.0, "h-c"))  # drops the cache
            got = tx.get_budget("t", "pair:a|b")
            upserts = sum("INTO budgets" in s for s in statements)
            tx.put_budget(Budget("t", "pair:a|c", 0.0, used=7))
            listed = [b.used for b in tx.list_budgets("t")]
            assert got is not None
            return got.used, upserts, listed

        statements.clear()
        used, upserts_before_the_read, listed = await store.transact(counted_then_dropped)
        assert used == 3 and listed == [3, 7]
        assert upserts_before_the_read == 1  # three writes of one key: one row
        assert sum("INTO budgets" in s for s in statements) == 2  # and a:c, once

        def fails(tx: Tx) -> None:
            tx.put_budget(Budget("t", "pair:b|c", 0.0, used=99))
            raise RuntimeError("refused after counting")

        with pytest.raises(RuntimeError):
            await store.transact(fails)
        # in one batch: the failing job's count is undone alone
        results = await store.transact_each([count(4), fails, count(5)])
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], RuntimeError)
        got = await store.read(lambda tx: [(b.key, b.used) for b in tx.list_budgets("t")])
        assert got == [("pair:a|b", 5), ("pair:a|c", 7)]
    finally:
        await store.close()


async def test_a_members_live_sessions_are_read_once_not_at_every_lease(tmp_path: Path) -> None:
    """A lease by a member that names no session asks for the member's live sessions
    (whichever runs the turn on what it was handed): the writer reads them once and
    keeps them until one of them changes, as it keeps the active ones a send asks for."""
    statements: list[str] = []
    store = SqliteStore(tmp_path / "hub.db", on_statement=statements.append)
    await store.open()
    try:
        await _setup(store)
        await store.transact(lambda tx: tx.put_session(_session("s1", SessionState.ACTIVE)))

        def live(tx: Tx) -> list[str]:
            return [s.session_id for s in tx.list_sessions("t", "a", which="live")]

        statements.clear()
        for _ in range(5):
            assert await store.transact(live) == ["s1"]
        assert sum("FROM sessions" in s for s in statements) == 1
        await store.transact(lambda tx: tx.put_session(_session("s2", SessionState.IDLE)))
        assert await store.transact(live) == ["s1", "s2"]
    finally:
        await store.close()
