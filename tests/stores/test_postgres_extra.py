"""PostgreSQL-specific guarantees: several hubs (here: several PostgresStore instances)
sharing one database. The generic contract is checked by the conformance suite."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, cast
from urllib.parse import urlsplit

import psycopg
import pytest

from backchannel.errors import AlreadyExists, InvalidRequest, StoreError
from backchannel.stores.base import SCHEMA_VERSION, Reads, Tx
from backchannel.stores.postgres import LISTENER_NAME, PostgresStore, mask_url
from backchannel.stores.postgres.tx import PgTx
from backchannel.testing import eventually
from backchannel.types import (
    Delivery,
    DeliveryEvent,
    DeliveryState,
    Job,
    JobState,
    LedgerEntry,
    Link,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Team,
)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

T0 = 1_700_000_000.0
TEAM = "alpha"
Heard = list[tuple[str | None, str | None]]


def setup_team(tx: Tx, team: str = TEAM) -> None:
    tx.insert_team(Team(team, T0))
    for who in ("a", "b", "c"):
        tx.insert_member(Member(team, who, MemberKind.LLM, T0, f"hash-{team}-{who}"))


def msg(mid: str, to: str = "b", text: str = "hi") -> Message:
    return Message(TEAM, mid, "a", to, text, MessageKind.DIRECT, T0, f"fp-{mid}-{text}")


def send(mid: str, to: str = "b", text: str = "hi") -> Callable[[Tx], str]:
    """A hub-style idempotent send: replay if the id exists, insert otherwise."""

    def fn(tx: Tx) -> str:
        if tx.get_message(TEAM, mid) is not None:
            return "replayed"
        tx.insert_message(msg(mid, to, text), [Recipient(to)])
        return "inserted"

    return fn


def lease(member: str = "b", limit: int = 5) -> Callable[[Tx], list[tuple[int, str]]]:
    def fn(tx: Tx) -> list[tuple[int, str]]:
        got = tx.lease(TEAM, member, None, T0, T0 + 60, limit)
        return [(g.seq, g.message.message_id) for g in got]

    return fn


def feed_after(after: int) -> Callable[[Tx], list[tuple[int, DeliveryEvent]]]:
    return lambda tx: tx.feed(TEAM, after, 1000)


def copies_of(mid: str) -> Callable[[Tx], list[Delivery]]:
    return lambda tx: tx.deliveries(TEAM, mid)


def history_of(mid: str) -> Callable[[Tx], list[DeliveryEvent]]:
    return lambda tx: tx.history(TEAM, mid)


def requeue(tx: Tx) -> int:
    """What a hub's maintenance does with expired leases."""
    moved = 0
    for d in tx.expired_leases(T0 + 61, 10):
        moved += tx.transition(
            d.team, d.message_id, d.recipient.member, from_states=[DeliveryState.LEASED],
            to_state=DeliveryState.QUEUED, now=T0 + 61, event="lease_expired",
        )  # fmt: skip
    return moved


@pytest.fixture
async def two_hubs(new_postgres_url: Callable[[], str]) -> AsyncIterator[list[PostgresStore]]:
    """Two stores (standing for two hubs) on one fresh database, team ``alpha`` in it."""
    stores = await open_hubs(new_postgres_url(), 2)
    try:
        await stores[0].transact(setup_team)
        yield stores
    finally:
        for s in stores:
            await s.close()


async def open_hubs(url: str, n: int, **kwargs: Any) -> list[PostgresStore]:
    stores = [PostgresStore(url, **kwargs) for _ in range(n)]
    for s in stores:
        await s.open()
    return stores


def listen(store: PostgresStore) -> Heard:
    heard: Heard = []
    store.on_external_change(lambda team, member: heard.append((team, member)))
    return heard


# -- leases across hubs ---------------------------------------------------------


async def test_concurrent_leases_on_two_hubs_hand_out_each_delivery_once(
    two_hubs: list[PostgresStore],
) -> None:
    a, b = two_hubs
    for i in range(120):
        await (a if i % 2 else b).transact(send(f"m{i:03}"))
    batches = await asyncio.gather(*(s.transact(lease(limit=7)) for _ in range(12) for s in (a, b)))
    rest = await a.transact(lease(limit=1000))
    seen = [mid for batch in [*batches, rest] for _, mid in batch]
    assert len(seen) == len(set(seen)) == 120, "every delivery handed out exactly once"
    for batch in batches:
        assert batch == sorted(batch), "each lease is in send order"


async def test_fifo_holds_across_hubs(two_hubs: list[PostgresStore]) -> None:
    a, b = two_hubs
    for i in range(40):
        await (a if i % 3 else b).transact(send(f"m{i:03}"))
    order: list[str] = []
    for turn in range(10):  # alternating hubs read the inbox together, in order
        order += [mid for _, mid in await (a, b)[turn % 2].transact(lease(limit=4))]
    assert order == [f"m{i:03}" for i in range(40)]


async def test_seq_and_cursors_follow_commit_order_under_concurrent_writers(
    two_hubs: list[PostgresStore],
) -> None:
    """Writers on both hubs, one reader alternating hubs: a lease never finds a delivery
    numbered below one it already got, and an incremental feed reader misses nothing."""
    a, b = two_hubs
    done = asyncio.Event()

    async def writers() -> None:
        await asyncio.gather(*(s.transact(send(f"{t}{i:03}")) for i in range(150) for s, t in ((a, "a"), (b, "b"))))  # fmt: skip
        done.set()

    async def reader() -> tuple[list[int], list[int]]:
        seqs: list[int] = []
        cursors: list[int] = []
        turn = 0
        while True:
            finished = done.is_set()
            store = (a, b)[turn % 2]
            turn += 1
            got = await store.transact(lease(limit=50))
            seqs += [seq for seq, _ in got]
            after = cursors[-1] if cursors else 0
            feed = await store.read(feed_after(after))
            cursors += [c for c, _ in feed]
            if finished and not got and not feed:
                return seqs, cursors

    (seqs, cursors), _ = await asyncio.gather(reader(), writers())
    assert len(seqs) == 300
    assert seqs == sorted(seqs), "a later lease found a lower seq: numbers out of commit order"
    full = await a.read(lambda tx: tx.feed(TEAM, 0, 100_000))
    assert cursors == [c for c, _ in full], "the incremental feed missed events"


async def test_same_message_id_on_two_hubs_at_once_is_stored_once(
    two_hubs: list[PostgresStore],
) -> None:
    a, b = two_hubs
    results = await asyncio.gather(
        *(s.transact(send(f"dup{i}")) for i in range(20) for s in (a, b, a, b))
    )
    assert results.count("inserted") == 20 and results.count("replayed") == 60
    for i in range(20):
        assert len(await a.read(copies_of(f"dup{i}"))) == 1
    with pytest.raises(AlreadyExists):
        await b.transact(lambda tx: tx.insert_message(msg("dup0"), [Recipient("b")]))


async def test_two_hubs_expire_leases_without_colliding(two_hubs: list[PostgresStore]) -> None:
    a, b = two_hubs
    await b.transact(lambda tx: setup_team(tx, "beta"))
    for i in range(30):
        await a.transact(send(f"m{i:02}"))
    await a.transact(lease(limit=30))
    while sum(await asyncio.gather(a.transact(requeue), b.transact(requeue))):
        pass
    assert await a.read(lambda tx: tx.expired_leases(T0 + 61, 100)) == []
    for i in range(30):
        hist = await b.read(history_of(f"m{i:02}"))
        assert [e.event for e in hist] == ["queued", "leased", "lease_expired"], hist


async def test_two_hubs_never_run_one_job_twice(two_hubs: list[PostgresStore]) -> None:
    a, b = two_hubs
    await a.transact(lambda tx: setup_team(tx, "beta"))

    def add(tx: Tx) -> None:
        for i in range(40):
            tx.add_job(Job("alpha" if i % 2 else "beta", "timer", T0 + i, T0))

    await a.transact(add)

    def run_due(tx: Tx) -> list[int]:
        jobs = tx.due_jobs(T0 + 100, 3)
        for j in jobs:
            assert tx.finish_job(j.job_id, JobState.DONE, T0 + 100)
        return [j.job_id for j in jobs]

    ran: list[int] = []
    while batch := [i for ids in await asyncio.gather(*(s.transact(run_due) for s in (a, b, a, b))) for i in ids]:  # fmt: skip
        ran += batch
    assert len(ran) == len(set(ran)) == 40
    assert await b.read(lambda tx: tx.next_job_due()) is None


async def test_one_open_link_per_pair_across_hubs(two_hubs: list[PostgresStore]) -> None:
    a, b = two_hubs

    def open_link(i: int) -> Callable[[Tx], Link]:
        link = Link(TEAM, f"l{i}", "a", "sa", "b", None, 8, T0 + i)
        return lambda tx: tx.insert_link(link)

    links = await asyncio.gather(*(s.transact(open_link(i)) for i in range(10) for s in (a, b)))
    assert len({k.link_id for k in links}) == 1
    assert len(await a.read(lambda tx: tx.list_links(TEAM, open_only=True))) == 1


# -- wake-ups -------------------------------------------------------------------


async def test_notify_wakes_the_other_hub_quickly(new_postgres_url: Callable[[], str]) -> None:
    # no fallback timer: only NOTIFY can deliver these wake-ups
    a, b = await open_hubs(new_postgres_url(), 2, fallback_interval=0)
    try:
        heard_a = listen(a)
        heard_b = listen(b)
        await a.transact(setup_team)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await a.transact(send("m1", to="b"))
        await eventually(lambda: (TEAM, "b") in heard_b, what="b to hear m1", within=5)
        assert loop.time() - start < 1.0
        # b's send commits after a's: by the time a hears it, it would have heard its own
        await b.transact(send("m2", to="c"))
        await eventually(lambda: (TEAM, "c") in heard_a, what="a to hear m2", within=5)
        assert (TEAM, "b") not in heard_a, "a store is not woken by its own writes"
        # a delivery going back to the queue wakes the other hub too
        await a.transact(lease("c"))
        heard_b.clear()
        await a.transact(
            lambda tx: tx.transition(
                TEAM, "m2", "c", from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED, now=T0, event="released",
            )
        )  # fmt: skip
        await eventually(lambda: (TEAM, "c") in heard_b, what="b to hear m2 requeued", within=5)
    finally:
        await a.close()
        await b.close()


async def test_fallback_timer_and_listener_reconnect(new_postgres_url: Callable[[], str]) -> None:
    url = new_postgres_url()
    a, b = await open_hubs(url, 2, fallback_interval=0.2)
    try:
        heard = listen(b)
        await eventually(lambda: (None, None) in heard, what="the fallback timer", within=5)
        with psycopg.connect(url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND datname = current_database()",
                (LISTENER_NAME,),
            ).fetchone()
        assert killed == (2,)
        await a.transact(setup_team)
        for i in range(20):  # the listener comes back within a few backoff steps
            heard.clear()
            await a.transact(send(f"m{i}"))
            try:
                await eventually(lambda: (TEAM, "b") in heard, what=f"b to hear m{i}", within=1)
                break
            except AssertionError:
                continue
        else:
            raise AssertionError("the listener never came back after its connection died")
    finally:
        await a.close()
        await b.close()


async def test_a_listener_refused_listen_backs_off_rather_than_spin(
    new_postgres_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes the connection but refuses ``LISTEN`` (a hot standby after a
    failover: "cannot execute LISTEN during recovery") has the listener back off between
    tries, as a refused connection does; before, it reconnected at once, as fast as the
    server answered, waking every waiting long-poll each time."""
    url = new_postgres_url()
    real_connect = psycopg.connect
    tries: list[float] = []

    class Standby:
        def __init__(self, conn: psycopg.Connection[Any]) -> None:
            self._conn = conn

        def __enter__(self) -> Standby:
            return self

        def __exit__(self, *exc: object) -> None:
            self._conn.close()

        def execute(self, query: str, *args: Any) -> Any:
            if query.startswith("LISTEN"):
                raise psycopg.errors.ReadOnlySqlTransaction("cannot execute LISTEN during recovery")
            return self._conn.execute(query, *args)

    def connect(*args: Any, **kwargs: Any) -> Any:
        conn = real_connect(*args, **kwargs)
        if kwargs.get("application_name") != LISTENER_NAME:
            return conn
        tries.append(time.monotonic())
        return Standby(conn)

    monkeypatch.setattr(psycopg, "connect", connect)
    (a,) = await open_hubs(url, 1, fallback_interval=2.0)
    try:
        heard = listen(a)
        start = len(tries)
        await asyncio.sleep(1.5)  # the span counted over, not a wait for an outcome
        assert len(tries) - start <= 8, f"{len(tries) - start} LISTEN connections in 1.5 s"
        assert len(heard) <= 8
    finally:
        await a.close()


# -- connections ----------------------------------------------------------------


async def test_pool_recovers_when_its_connections_are_killed(
    new_postgres_url: Callable[[], str],
) -> None:
    url = new_postgres_url()
    (a,) = await open_hubs(url, 1, pool_size=3)
    try:
        await a.transact(setup_team)
        await asyncio.gather(*(a.transact(send(f"w{i}")) for i in range(6)))
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'backchannel' AND datname = current_database()"
            )
        assert await a.transact(send("after")) == "inserted"
        assert await a.read(lambda tx: tx.pending_count(TEAM, "b")) == 7
    finally:
        await a.close()


async def test_a_hub_frozen_inside_a_transaction_holds_its_team_only_until_the_server_ends_it(
    new_postgres_url: Callable[[], str],
) -> None:
    """A hub's process stops between two statements of a transaction (SIGSTOP, a paused
    VM) while it holds its team's lock. Another hub's write to that team waits only until
    PostgreSQL ends the frozen session (``idle_in_transaction``), not until the frozen hub
    comes back; the frozen hub, back, finds its connection gone and runs its transaction
    again, on a fresh one, once."""
    url = new_postgres_url()
    frozen, other = PostgresStore(url, idle_in_transaction=1.0), PostgresStore(url)
    holding, thawed = threading.Event(), threading.Event()
    runs: list[int] = []

    def freeze_midway(tx: Tx) -> None:
        runs.append(len(runs) + 1)
        member = tx.get_member(TEAM, "a")
        assert member is not None
        tx.update_member(replace(member, settings={"run": len(runs)}))  # the team's lock
        holding.set()
        thawed.wait(60)  # the process stopped here
        tx.get_member(TEAM, "b")  # its next statement, once it runs again

    try:
        for s in (frozen, other):
            await s.open()
        await other.transact(setup_team)
        stalled = frozen.transact(freeze_midway)
        assert await asyncio.to_thread(holding.wait, 10)
        # without the setting this waits for the thaw, 60 s away
        assert await asyncio.wait_for(other.transact(send("meanwhile")), 20) == "inserted"
        assert not stalled.done()
        thawed.set()
        await asyncio.wait_for(stalled, 20)
        assert runs == [1, 2]
        member = await other.read(lambda tx: tx.get_member(TEAM, "a"))
        assert member is not None and member.settings == {"run": 2}
        assert await other.read(lambda tx: tx.pending_count(TEAM, "b")) == 1
    finally:
        thawed.set()
        for s in (frozen, other):
            await s.close()


async def test_a_transactions_remembered_rows_follow_its_own_writes(
    two_hubs: list[PostgresStore],
) -> None:
    """Rows a transaction read (a prefetch, a read of its own) are answered again from
    what it read until it writes their table: a write elsewhere (a job, a delivery)
    keeps them, a write to their own table is seen by the next read."""
    a, _ = two_hubs

    def fn(tx: Tx) -> list[object]:
        tx.prefetch(Reads(TEAM, members=("a",), ledger_of="s1", links_of="a"))
        seen: list[object] = [tx.get_member(TEAM, "a"), tx.ledger(TEAM, "s1")]
        tx.add_job(Job(TEAM, "timer", T0 + 60, T0, session_id="s1"))  # another table
        member = tx.get_member(TEAM, "a")
        assert member is seen[0]  # kept: not read again
        tx.update_member(replace(member, settings={"changed": True}))
        tx.ledger_add(LedgerEntry(TEAM, "s1", "b", "digest", "m1", T0))
        tx.insert_link(Link(TEAM, "lnk1", "a", "s1", "b", None, 8, T0))
        seen += [
            tx.get_member(TEAM, "a"),
            tx.ledger(TEAM, "s1"),
            tx.list_links(TEAM, member="a", open_only=True),
        ]
        return seen

    before, ledger, member, after, links = await a.transact(fn)
    assert ledger == [] and before.settings == {}
    assert member.settings == {"changed": True}
    assert [e.message_id for e in after] == ["m1"]
    assert [link.link_id for link in links] == ["lnk1"]


def _session_setting(name: str) -> Callable[[Tx], str]:
    return lambda tx: str(cast(PgTx, tx)._one(f"SHOW {name}", ())[0])


async def test_the_hubs_session_settings_stand_aside_for_the_administrators(
    new_postgres_url: Callable[[], str],
) -> None:
    """A hub's sessions get ``idle_in_transaction_session_timeout`` and the server's TCP
    keepalives where nobody set them; a value set for the database (as for a role) or in
    the URL's ``options`` is left as it is."""
    url = new_postgres_url()
    (plain,) = await open_hubs(url, 1)
    try:
        assert await plain.read(_session_setting("idle_in_transaction_session_timeout")) == "15s"
        assert await plain.read(_session_setting("tcp_keepalives_idle")) == "5"  # over TCP
    finally:
        await plain.close()
    with psycopg.connect(url, autocommit=True) as admin:
        db = admin.execute("SELECT current_database()").fetchone()
        assert db is not None
        admin.execute(f'ALTER DATABASE "{db[0]}" SET idle_in_transaction_session_timeout = 42000')
    given = url + ("&" if "?" in url else "?") + "options=-c%20tcp_keepalives_idle%3D9"
    (chosen,) = await open_hubs(given, 1)
    try:
        assert await chosen.read(_session_setting("idle_in_transaction_session_timeout")) == "42s"
        assert await chosen.read(_session_setting("tcp_keepalives_idle")) == "9"
    finally:
        await chosen.close()
    for bad in (-1, 0.5, 3e6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"idle_in_transaction must be 0 .* from 1 to"):
            PostgresStore(url, idle_in_transaction=bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_database_error_names_url_without_password() -> None:
    url = f"postgresql://bob:s3cret-pw@127.0.0.1:{_free_port()}/nowhere"
    store = PostgresStore(url, connect_timeout=2)
    assert "s3cret-pw" not in store.url and "bob:***@127.0.0.1" in store.url
    with pytest.raises(StoreError) as info:
        await store.open()
    text = str(info.value)
    assert "s3cret-pw" not in text and "s3cret-pw" not in repr(info.value.to_json())
    assert "127.0.0.1" in text and "nowhere" in text and "cannot connect" in text


async def test_wrong_password_error_has_no_password(postgres_url: str) -> None:
    bad = postgres_url.replace(postgres_url.split(":")[2].split("@")[0], "not-the-password")
    with pytest.raises(StoreError) as info:
        await PostgresStore(bad, connect_timeout=5).open()
    assert "not-the-password" not in str(info.value)
    assert "password authentication failed" in str(info.value)


async def test_store_not_open_and_closed_raise_store_error(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    with pytest.raises(StoreError, match="not open"):
        await store.transact(lambda tx: None)
    await store.open()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError):
        await store.transact(lambda tx: None)


async def test_nul_character_is_refused_cleanly(two_hubs: list[PostgresStore]) -> None:
    a, _ = two_hubs
    with pytest.raises(InvalidRequest, match="NUL"):
        await a.transact(send("nul", text="a\x00b"))
    assert await a.read(lambda tx: tx.get_message(TEAM, "nul")) is None
    assert await a.transact(send("fine")) == "inserted"  # the connection is still usable


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgres://u:p%40ss@h/db?sslmode=require", "postgres://u:***@h/db?sslmode=require"),
        ("postgresql://h/db?user=u&password=pw", "postgresql://h/db?user=u&password=***"),
        ("host=h user=u password=pw dbname=d", "host=h user=u password=*** dbname=d"),
        ("host=h password='a b' dbname=d", "host=h password=*** dbname=d"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


# -- migrations -----------------------------------------------------------------


async def test_hubs_starting_together_migrate_once(new_postgres_url: Callable[[], str]) -> None:
    url = new_postgres_url()
    stores = [PostgresStore(url) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    try:
        await stores[0].transact(setup_team)
        assert await stores[3].read(lambda tx: tx.get_team(TEAM)) is not None
    finally:
        for s in stores:
            await s.close()
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))


async def test_newer_schema_is_refused_with_both_versions(
    new_postgres_url: Callable[[], str],
) -> None:
    url = new_postgres_url()
    first = PostgresStore(url)
    await first.open()  # creates the schema
    await first.close()
    newer = SCHEMA_VERSION + 41
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (newer,))
    with pytest.raises(StoreError) as info:
        await PostgresStore(url).open()
    text = str(info.value)
    assert f"schema version {newer}" in text
    assert f"up to version {SCHEMA_VERSION}" in text
    assert "upgrade backchannel" in text
    assert info.value.details["database_version"] == newer


def test_a_full_or_exhausted_database_server_says_what_to_do() -> None:
    import psycopg.errors as pgerr

    from backchannel.stores.postgres import PostgresStore

    store = PostgresStore("postgresql://hub@db.example/bc")
    full = store._error(pgerr.DiskFull('could not extend file "base/1/2": No space left'))
    assert "disk is full: free space there" in full.message
    crowded = store._error(pgerr.TooManyConnections("sorry, too many clients already"))
    assert "raise its max_connections" in crowded.message
    lost = store._error(OSError("connection reset"))
    assert lost.message.endswith("retry shortly")


def _tcp_user_timeouts(port: int) -> list[int]:
    """TCP_USER_TIMEOUT (ms) of each of this process's TCP sockets connected to ``port``."""
    found = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        with contextlib.suppress(OSError):
            s = socket.socket(fileno=os.dup(fd))
            with s:
                if s.family == socket.AF_INET and s.getpeername()[1] == port:
                    found.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
    return found


@pytest.mark.parametrize(("query", "want"), [("", 10_000), ("?tcp_user_timeout=30000", 30_000)])
async def test_every_connection_notices_a_vanished_database_unless_the_url_says_otherwise(
    new_postgres_url: Callable[[], str], query: str, want: int
) -> None:
    """The pool's and the listener's connections carry a TCP user timeout (and keepalives):
    a database host gone from the network fails them in seconds, not the kernel's 15
    minutes (tests/stores/test_postgres_partition.py shows it with packets dropped). A
    URL's own value wins."""
    url = new_postgres_url()
    port = urlsplit(url).port or 5432
    before = _tcp_user_timeouts(port)
    store = PostgresStore(url + query, pool_size=2)
    await store.open()
    try:
        await store.read(lambda tx: tx.list_teams())
        got = _tcp_user_timeouts(port)
        assert len(got) >= len(before) + 2, got  # a pooled connection and the listener
        assert got.count(want) >= 2, got
    finally:
        await store.close()


async def test_a_budget_put_then_sent_by_a_listing_reads_back_as_put(
    new_postgres_url: Callable[[], str],
) -> None:
    """``put_budget`` is kept for the ``COMMIT`` round trip and a listing of the team's
    budgets sends it first: a ``get_budget`` after the listing, in the same transaction,
    reads the row put, not the one read before it."""
    from backchannel.stores.base import Reads
    from backchannel.types import Budget, Team

    async with PostgresStore(new_postgres_url()) as store:
        await store.transact(lambda tx: tx.insert_team(Team("t", 0.0)))
        await store.transact(lambda tx: tx.put_budget(Budget("t", "pair:a|b", 0.0, used=1)))

        def fn(tx: Tx) -> tuple[int, int, int]:
            tx.prefetch(Reads("t", budgets=("pair:a|b",)))
            before = tx.get_budget("t", "pair:a|b")
            assert before is not None
            tx.put_budget(Budget("t", "pair:a|b", 0.0, used=2))
            listed = {b.key: b.used for b in tx.list_budgets("t")}
            after = tx.get_budget("t", "pair:a|b")
            assert after is not None
            return before.used, listed["pair:a|b"], after.used

        assert await store.transact(fn) == (1, 2, 2)
