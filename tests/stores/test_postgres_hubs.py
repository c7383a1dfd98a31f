"""Several `backchannel serve` processes on one PostgreSQL, standing for hubs on several
hosts (one port each): shared state, cross-hub wake-ups, leases and redelivery, FIFO,
migrations at the same moment, failover after ``kill -9``, timers fired once, and what
a hub does when the database is unreachable, goes away, or is newer than the hub.

Every wait is bounded and waits for something observable; nothing is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from backchannel.stores.base import SCHEMA_VERSION
from backchannel.stores.postgres import _MIGRATION_LOCK, PostgresStore
from backchannel.testing import eventually_blocking
from tests.conftest import BIN, Server, free_port, start_server
from tests.pg_harness import PgServer

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(90)]

FALLBACK_S = 2.0  # PostgresStore's default fallback wake-up interval


# -- helpers -----------------------------------------------------------------------------


def start_hubs(base: Path, url: str, n: int = 2, *args: str) -> list[Server]:
    """Start ``n`` hubs on ``url`` at the same moment, sharing one admin token (as an
    operator copies ``admin.token`` to every host)."""
    token = "bca_" + secrets.token_urlsafe(32)
    homes = []
    for i in range(n):
        home = base / f"hub{i}"
        home.mkdir(parents=True)
        fd = os.open(home / "admin.token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        homes.append(home)
    servers: list[Server] = []
    errors: list[BaseException] = []
    with ThreadPoolExecutor(n) as pool:
        for fut in [pool.submit(start_server, home, url, *args) for home in homes]:
            try:
                servers.append(fut.result())
            except Exception as exc:
                errors.append(exc)
    if errors:
        stop_all(servers)
        raise errors[0]
    return servers


def stop_all(servers: list[Server]) -> None:
    for s in servers:
        s.stop()


def db(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def member(srv: Server, team: str, name: str) -> str:
    with srv.client() as c:
        r = c.post(f"/v1/teams/{team}/members", json={"name": name})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def send(c: httpx.Client, to: str, text: str, **extra: Any) -> httpx.Response:
    return c.post("/v1/messages", json={"to": to, "text": text, "link": False, **extra})


def receive(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/v1/inbox", params=params)
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


def ack(c: httpx.Client, ids: list[str]) -> int:
    r = c.post("/v1/inbox/ack", json={"message_ids": ids})
    assert r.status_code == 200, r.text
    return int(r.json()["acked"])


def send_until_answered(
    c: httpx.Client,
    prefix: str,
    stop: threading.Event,
    answered: list[str],
    others: list[str],
    attempted: set[str] | None = None,
    unavailable: list[tuple[float, str | None, float]] | None = None,
) -> None:
    """Stream sends ``{prefix}-0``, ``{prefix}-1``, … to ``rx`` until ``stop``, each made
    again under its id until answered, as a client does. What was answered goes to
    ``answered``; a failed call and an answer other than 2xx or 503 to ``others`` (the
    latter ends the stream); each 503 to ``unavailable`` as (when, Retry-After, took)."""
    i = 0
    while not stop.is_set():
        mid = f"{prefix}-{i}"
        if attempted is not None:
            attempted.add(mid)
        while not stop.is_set():  # a client retries the same id until answered
            t = time.monotonic()
            try:
                r = send(c, "rx", mid, message_id=mid)
            except httpx.HTTPError as exc:
                others.append(repr(exc))
                continue
            if r.status_code in (200, 201):
                answered.append(mid)
                break
            if r.status_code != 503:
                others.append(f"{r.status_code} {r.text}")
                return
            if unavailable is not None:
                unavailable.append((t, r.headers.get("retry-after"), time.monotonic() - t))
            stop.wait(0.2)
        i += 1


def drain(
    c: httpx.Client, until: Callable[[list[dict[str, Any]]], bool], seconds: float, **params: Any
) -> list[dict[str, Any]]:
    """Receive and ack through ``c`` until ``until(everything so far)`` or the deadline."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while not until(got) and time.monotonic() < deadline:
        batch = receive(c, limit=500, wait=1, **params)
        if batch:
            got.extend(batch)
            ack(c, [m["message_id"] for m in batch])
    return got


def sse_messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The ``event: message`` payloads of a server-sent event stream."""
    event = None
    for line in lines:
        if line.startswith("event:"):
            event = line.partition(":")[2].strip()
        elif line.startswith("data:") and event == "message":
            yield json.loads(line.partition(":")[2])
        elif not line:
            event = None


def serve_fails(home: Path, store_url: str) -> tuple[int, str]:
    """Run ``backchannel serve`` expecting it to refuse to start: (exit code, output)."""
    env = {**os.environ, "BACKCHANNEL_HOME": str(home), "COLUMNS": "1000"}
    proc = subprocess.run(
        [str(BIN), "serve", "--port", "0", "--store", store_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert not (home / "server.json").exists(), "a hub that did not start must not say it did"
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


class Proxy:
    """A loopback TCP proxy to PostgreSQL that can be cut: :meth:`down` drops every
    connection and refuses new ones (the database host vanished), :meth:`up` serves again."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = free_port()
        self.up()

    def up(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # down() closed the listener
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut while we connected
                    client.close()
                    upstream.close()
                    continue
                self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            socks, self._socks = self._socks, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def url(self, url: str) -> str:
        parts = urlsplit(url)
        netloc = parts.netloc.replace(f":{parts.port}", f":{self.port}")
        return urlunsplit(parts._replace(netloc=netloc))


# -- two hubs shared by the tests that do not stop them ------------------------------------


@pytest.fixture(scope="module")
def pair(
    postgres_server: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Server]]:
    url = postgres_server.new_database("hubs")
    hubs = start_hubs(tmp_path_factory.mktemp("pair"), url, 2)
    try:
        yield hubs
    finally:
        stop_all(hubs)


def test_what_one_hub_makes_the_other_knows(pair: list[Server]) -> None:
    a, b = pair
    tokens = a.team("known", "alice")  # team and member made through hub A
    bob = member(b, "known", "bob")  # a member made through hub B
    for hub in (a, b):
        with hub.client() as c:
            names = {m["name"] for m in c.get("/v1/teams/known/members").json()["members"]}
        assert {"alice", "bob", "user"} <= names
    with b.client(tokens["alice"]) as c:  # a token issued by A authenticates on B
        assert c.get("/v1/me").json()["name"] == "alice"
    with a.client(tokens["alice"]) as alice, b.client(bob) as bob_b:
        r = send(alice, "bob", "made on A, read on B", message_id="known-1")
        assert r.status_code == 201, r.text
        assert send(alice, "bob", "made on A, read on B", message_id="known-1").status_code == 200
        got = receive(bob_b)
        assert [m["message_id"] for m in got] == ["known-1"]
        assert ack(bob_b, ["known-1"]) == 1
        # A sees what B did: the message is acked
        assert alice.get("/v1/messages/known-1").json()["status"] == "acked"


def test_send_on_one_hub_wakes_a_receiver_waiting_on_another(pair: list[Server]) -> None:
    a, b = pair
    tokens = a.team("wake", "tx", "rx")
    latencies: list[float] = []
    timeout = httpx.Timeout(10.0, read=FALLBACK_S * 2.5)  # a read past this fails the test
    with (
        a.client(tokens["tx"]) as tx,
        b.client(tokens["rx"]) as rx,
        rx.stream("GET", "/v1/inbox/stream", timeout=timeout) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert next(lines) == ": connected"
        messages = sse_messages(lines)
        for i in range(12):
            started = time.perf_counter()
            assert send(tx, "rx", f"ping {i}", message_id=f"w{i}").status_code == 201
            got = next(messages)  # the stream on hub B; bounded by the read timeout
            latencies.append(time.perf_counter() - started)
            assert got["message_id"] == f"w{i}"
            ack(rx, [got["message_id"]])
    # the fallback wake-up comes every 2 s: these came from LISTEN/NOTIFY
    assert max(latencies) < FALLBACK_S / 2, latencies
    assert statistics.median(latencies) < 0.1, latencies


def test_a_lease_taken_on_one_hub_expires_and_is_redelivered_through_another(
    pair: list[Server],
) -> None:
    a, b = pair
    tokens = a.team("lease", "tx", "rx")
    with (
        a.client(tokens["tx"]) as tx,
        a.client(tokens["rx"]) as rx_a,
        b.client(tokens["rx"]) as rx_b,
    ):
        assert send(tx, "rx", "lease me", message_id="l1").status_code == 201
        first = receive(rx_a, lease=1)  # leased through A for 1 s, never acked
        leased_at = time.monotonic()
        assert [(m["message_id"], m["attempt"]) for m in first] == [("l1", 1)]
        assert receive(rx_b) == [], "a leased message is not handed out again"
        again = receive(rx_b, wait=10)  # blocks on B until the lease expired
        waited = time.monotonic() - leased_at
        assert [(m["message_id"], m["attempt"]) for m in again] == [("l1", 2)]
        assert 0.9 <= waited < 1 + FALLBACK_S + 2, waited
        assert ack(rx_b, ["l1"]) == 1
        status = tx.get("/v1/messages/l1").json()
        assert status["status"] == "acked"
        assert [e["event"] for e in status["history"]].count("lease_expired") == 1


def test_fifo_per_session_while_both_hubs_send_and_deliver(pair: list[Server]) -> None:
    a, b = pair
    hubs = [a, b]
    tokens = a.team("fifo", "s1", "s2", "rx")
    with b.client(tokens["rx"]) as c:
        r = c.post("/v1/sessions", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
    per_sender = 40
    errors: list[BaseException] = []

    def sender(name: str) -> None:
        try:
            clients = [h.client(tokens[name]) for h in hubs]
            with clients[0], clients[1]:
                for i in range(per_sender):  # alternate hubs, one message at a time
                    r = send(clients[i % 2], "rx", f"{name} {i}", message_id=f"{name}-{i:03}",
                             session=sid)  # fmt: skip
                    assert r.status_code == 201, r.text
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(n,)) for n in ("s1", "s2")]
    for t in threads:
        t.start()
    seen: list[str] = []
    rx = [h.client(tokens["rx"]) for h in hubs]
    with rx[0], rx[1]:
        deadline = time.monotonic() + 40
        turn = 0
        while len(seen) < 2 * per_sender and time.monotonic() < deadline and not errors:
            # one consumer of the session, its requests landing on either hub in turn
            got = receive(rx[turn % 2], session=sid, limit=7, wait=1)
            if got:
                seen.extend(m["message_id"] for m in got)
                ack(rx[(turn + 1) % 2], [m["message_id"] for m in got])
            turn += 1
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(seen) == len(set(seen)) == 2 * per_sender
    for name in ("s1", "s2"):
        mine = [m for m in seen if m.startswith(name)]
        assert mine == sorted(mine), f"{name}'s messages out of send order"
    with db(a.store_url) as conn:
        in_seq = [
            r[0]
            for r in conn.execute(
                "SELECT message_id FROM deliveries WHERE team = 'fifo' AND member = 'rx' "
                "ORDER BY seq"
            )
        ]
    assert seen == in_seq, "delivered in exactly the inbox's (commit) order"


def test_two_hubs_fire_each_timer_exactly_once(pair: list[Server]) -> None:
    a, b = pair
    tokens = a.team("timers", "w")
    with a.client(tokens["w"]) as c:
        sid = c.post("/v1/sessions", json={}).json()["session_id"]
    n = 60
    due = time.time() + 3.0  # every timer due at the same instant
    errors: list[BaseException] = []

    def set_timers(hub: Server, first: int) -> None:
        try:
            with hub.client(tokens["w"]) as c:
                for i in range(first, n, 2):
                    r = c.post("/v1/timers", json={"intent": "anchor", "session": sid,
                               "seconds": due - time.time(), "note": f"task {i}"})  # fmt: skip
                    assert r.status_code == 201, r.text
        except BaseException as exc:
            errors.append(exc)

    # half of them set through each hub, so both hubs' maintenance wakes when they fall due
    threads = [threading.Thread(target=set_timers, args=(h, k)) for k, h in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert time.time() < due, "setting the timers took too long for them to be due together"
    with b.client(tokens["w"]) as c:
        fired = drain(c, lambda got: len(got) >= n, due - time.time() + 20, session=sid)
    assert all(m["kind"] == "timer" for m in fired)
    with db(a.store_url) as conn:
        pending = conn.execute(
            "SELECT count(*) FROM jobs WHERE team = 'timers' AND kind = 'timer' "
            "AND state = 'pending'"
        ).fetchone()
        counts = conn.execute(
            "SELECT count(*), count(DISTINCT meta->>'timer_id') FROM messages "
            "WHERE team = 'timers' AND kind = 'timer'"
        ).fetchone()
    assert pending == (0,)
    assert counts == (n, n), f"{counts[0] if counts else 0} timer messages for {n} timers"
    assert len(fired) == n


# -- hubs of their own ------------------------------------------------------------------------


def test_two_hubs_starting_together_on_a_fresh_database_migrate_once(
    new_postgres_url: Callable[[], str], tmp_path: Path
) -> None:
    url = new_postgres_url()
    with db(url) as gate:
        # hold the migration lock, so both hubs are certain to be waiting for it at once
        gate.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        starting: list[list[Server]] = []
        failed: list[BaseException] = []

        def start() -> None:
            try:
                starting.append(start_hubs(tmp_path, url, 2))
            except BaseException as exc:
                failed.append(exc)

        launcher = threading.Thread(target=start)
        launcher.start()

        def both_waiting() -> bool:
            row = gate.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
            ).fetchone()
            return row == (2,) or bool(failed)

        eventually_blocking(both_waiting, within=30, what="both hubs to wait on the migration lock")
        gate.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
        launcher.join(60)
    assert not failed, failed
    hubs = starting[0]
    try:
        with db(url) as conn:
            versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
        assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1)), versions
        tokens = hubs[0].team("mig", "x")
        with hubs[1].client(tokens["x"]) as c:
            assert c.get("/v1/me").json()["team"] == "mig"
    finally:
        stop_all(hubs)


def test_kill_9_of_a_hub_mid_stream_the_other_delivers_every_answered_send_once(
    new_postgres_url: Callable[[], str], tmp_path: Path
) -> None:
    a, b = start_hubs(tmp_path, new_postgres_url(), 2)
    try:
        tokens = a.team("fo", "tx", "rx")
        answered: list[str] = []
        attempted: set[str] = set()
        stop = threading.Event()

        def stream(worker: int) -> None:
            with a.client(tokens["tx"]) as c:
                c.timeout = httpx.Timeout(5.0)
                i = 0
                while not stop.is_set():
                    mid = f"f{worker}-{i}"
                    attempted.add(mid)
                    try:
                        r = send(c, "rx", mid, message_id=mid)
                    except httpx.HTTPError:
                        return  # hub A died under us: this send was never answered
                    if r.status_code in (200, 201):
                        answered.append(mid)
                    i += 1

        senders = [threading.Thread(target=stream, args=(w,)) for w in range(4)]
        for t in senders:
            t.start()
        try:
            eventually_blocking(
                lambda: len(answered) >= 300, within=30, what="300 answered sends through hub A"
            )
            with a.client(tokens["rx"]) as rx_a:
                leased = receive(rx_a, limit=50, lease=2)  # held by a receiver on A ...
            a.kill()  # ... when A is killed with SIGKILL, in the middle of the stream
        finally:
            stop.set()
            for t in senders:
                t.join(15)
        leased_ids = {m["message_id"] for m in leased}
        assert len(leased_ids) == 50
        with b.client(tokens["rx"]) as rx_b:
            # everything answered, and the dead hub's leases once they expired (any hub's
            # maintenance re-queues them: here only B is left)
            want = set(answered) | leased_ids
            seen = drain(rx_b, lambda got: want <= {m["message_id"] for m in got}, 30, lease=30)
            pending = rx_b.get("/v1/inbox/pending").json()["pending"]
        ids = [m["message_id"] for m in seen]
        assert len(ids) == len(set(ids)), "nothing delivered twice"
        missing = set(answered) - set(ids)
        assert not missing, f"{len(missing)} answered sends lost, e.g. {sorted(missing)[:3]}"
        assert set(ids) <= attempted
        attempts = {m["message_id"]: m["attempt"] for m in seen}
        assert all(attempts[mid] == 2 for mid in leased_ids), "redelivered after the lease"
        assert pending == 0
    finally:
        stop_all([a, b])


def test_database_unreachable_at_start_exits_with_the_url_without_password(
    tmp_path: Path, postgres_url: str
) -> None:
    port = free_port()  # nothing listens there
    code, out = serve_fails(tmp_path / "h1", f"postgresql://bob:s3cret-pw@127.0.0.1:{port}/nowhere")
    assert code != 0
    assert f"cannot connect to PostgreSQL at postgresql://bob:***@127.0.0.1:{port}/nowhere" in out
    assert "s3cret-pw" not in out
    parts = urlsplit(postgres_url)
    if parts.password is None:
        return  # an external test server without passwords: nothing more to check
    # a reachable server, the wrong password
    wrong = urlunsplit(
        parts._replace(netloc=f"{parts.username}:not-the-pw@{parts.hostname}:{parts.port}")
    )
    code, out = serve_fails(tmp_path / "h2", wrong)
    assert code != 0
    assert "password authentication failed" in out and "not-the-pw" not in out
    assert f"{parts.username}:***@" in out


async def test_a_database_newer_than_the_hub_is_refused_naming_the_migration(
    new_postgres_url: Callable[[], str], tmp_path: Path
) -> None:
    url = new_postgres_url()
    store = PostgresStore(url)
    await store.open()  # the schema as this code knows it
    await store.close()
    newer = SCHEMA_VERSION + 1
    with db(url) as conn:  # a newer backchannel on another host migrated further
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (newer,))
    code, out = await asyncio.to_thread(serve_fails, tmp_path / "h", url)
    assert code != 0
    assert f"has schema version {newer}" in out
    assert f"supports up to version {SCHEMA_VERSION}" in out
    assert f"includes migration {newer}" in out and "upgrade backchannel" in out
    password = urlsplit(url).password
    assert password is None or password not in out
    with db(url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
    assert sorted(versions) == [*range(1, SCHEMA_VERSION + 1), newer], "left untouched"


def test_connection_lost_while_serving_503_with_retry_after_then_recovers(
    new_postgres_url: Callable[[], str], tmp_path: Path
) -> None:
    url = new_postgres_url()
    proxy = Proxy(urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 5432)
    hub = start_server(tmp_path / "hub", proxy.url(url))
    try:
        tokens = hub.team("cl", "tx", "rx")
        with hub.client(tokens["tx"]) as tx:
            assert send(tx, "rx", "warm", message_id="warm").status_code == 201
            # 1. PostgreSQL ends the hub's sessions (a restart, an admin): the hub retries
            #    on fresh connections; callers see nothing
            with db(url) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
            assert killed is not None and killed[0] >= 2  # the pool and the listener
            for i in range(5):
                assert send(tx, "rx", f"t{i}", message_id=f"t{i}").status_code == 201

        # 2. the database host goes away while three senders stream through the hub
        answered: list[str] = []
        attempted: set[str] = set()
        unavailable: list[tuple[float, str | None, float]] = []  # (when, Retry-After, took)
        others: list[str] = []
        stop = threading.Event()

        def stream(worker: int) -> None:
            with hub.client(tokens["tx"]) as c:
                c.timeout = httpx.Timeout(20.0)
                send_until_answered(c, f"c{worker}", stop, answered, others, attempted, unavailable)

        senders = [threading.Thread(target=stream, args=(w,)) for w in range(3)]
        for t in senders:
            t.start()
        try:
            eventually_blocking(
                lambda: len(answered) >= 50, within=20, what="sends before the outage"
            )
            proxy.down()
            down_at = time.monotonic()
            eventually_blocking(
                lambda: len(unavailable) >= 6, within=30, what="503 answers during the outage"
            )
            proxy.up()
            up_at = time.monotonic()
            before = len(answered)
            eventually_blocking(
                lambda: len(answered) >= before + 30,
                within=20,
                what="sends answered after the outage",
            )
            recovered = time.monotonic() - up_at
        finally:
            stop.set()
            for t in senders:
                t.join(30)
        assert not others, others[:3]
        assert all(ra is not None and int(ra) >= 1 for _, ra, _ in unavailable), unavailable
        during = [took for when, _, took in unavailable if when >= down_at]
        # the hub fails fast while it knows the database is away (not after connect_timeout)
        assert statistics.median(during) < 3.0, during
        assert recovered < 10.0, f"the hub took {recovered:.1f} s to reconnect"

        # 3. nothing acknowledged is lost, nothing is doubled
        want = set(answered) | {"warm"} | {f"t{i}" for i in range(5)}
        with hub.client(tokens["rx"]) as rx:
            seen = drain(rx, lambda got: want <= {m["message_id"] for m in got}, 20)
        ids = [m["message_id"] for m in seen]
        assert len(ids) == len(set(ids))
        assert want <= set(ids), sorted(want - set(ids))[:5]
        assert set(ids) <= attempted | want
    finally:
        hub.stop()
        proxy.down()


def test_timers_fire_once_through_a_kill_9_mid_firing_and_a_restart_of_every_hub(
    new_postgres_url: Callable[[], str], tmp_path: Path
) -> None:
    """Many timers fall due at once on two hubs; one is killed with SIGKILL as the
    firing has begun (a firing transaction of its may be cut off), the other goes on.
    Then every hub is down while more fall due, and one comes back. Each timer reaches
    its session exactly once; those due while no hub ran come late, marked so."""
    url = new_postgres_url()
    a, b = start_hubs(tmp_path, url, 2)
    hubs = [a, b]
    try:
        tokens = a.team("tk", "w")
        with a.client() as admin:
            r = admin.patch("/v1/teams/tk/members/w", json={"settings": {"max_timers": 1000}})
            assert r.status_code == 200, r.text
        with a.client(tokens["w"]) as c:
            sid = c.post("/v1/sessions", json={}).json()["session_id"]
        first, later = 400, 40
        due = time.time() + 12.0  # the first lot, all due at one instant
        due_later = due + 10.0  # the second lot, due while no hub runs

        def set_timers(hub: Server, lot: str, numbers: range, at: float) -> None:
            with hub.client(tokens["w"]) as c:
                for i in numbers:
                    r = c.post("/v1/timers", json={"intent": "anchor", "session": sid,
                               "seconds": at - time.time(), "note": f"{lot} {i}"})  # fmt: skip
                    assert r.status_code == 201, r.text

        with ThreadPoolExecutor(2) as pool:  # half of each lot through each hub
            jobs = [
                pool.submit(set_timers, h, lot, range(k, n, 2), at)
                for lot, n, at in (("first", first, due), ("later", later, due_later))
                for k, h in enumerate(hubs)
            ]
            for j in jobs:
                j.result()
        assert time.time() < due, "setting the timers took too long for them to be due together"

        def fired() -> int:
            with db(url) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM messages WHERE team = 'tk' AND kind = 'timer'"
                ).fetchone()
            return int(row[0]) if row else 0

        eventually_blocking(lambda: fired() > 0, within=due - time.time() + 20, what="firing")
        a.kill()  # in the middle of firing the first lot
        with db(url) as conn:  # B fires what A left, whatever A's cut-off transaction held
            eventually_blocking(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM jobs WHERE team = 'tk' AND kind = 'timer' "
                        "AND state = 'pending' AND due_at < %s",
                        (due_later - 4,),
                    ).fetchone()
                    == (0,)
                ),
                within=30,
                what="the first lot fired",
            )
        assert time.time() < due_later, "the first lot took too long to fire"
        b.kill()  # every hub is down while the second lot falls due
        assert fired() == first
        while time.time() < due_later + 3:
            time.sleep(0.2)
        hubs = [start_server(a.home, url)]  # one hub comes back
        with hubs[0].client(tokens["w"]) as c:
            got = drain(c, lambda g: len(g) >= first + later, 30, session=sid)
            assert receive(c, session=sid, wait=2) == [], "nothing more comes"
        notes = [m["text"].splitlines()[0] for m in got]
        assert len(notes) == len(set(notes)) == first + later, "each timer reached w once"
        assert set(notes) == {f"ANCHOR: first {i}" for i in range(first)} | {
            f"ANCHOR: later {i}" for i in range(later)
        }
        late = [m for m in got if m["text"].startswith("ANCHOR: later")]
        assert all("the hub was not running when it was due" in m["text"] for m in late)
        with db(url) as conn:
            counts = conn.execute(
                "SELECT count(*), count(DISTINCT meta->>'timer_id') FROM messages "
                "WHERE team = 'tk' AND kind = 'timer'"
            ).fetchone()
            states = conn.execute(
                "SELECT state, count(*) FROM jobs WHERE team = 'tk' AND kind = 'timer' "
                "GROUP BY state"
            ).fetchall()
        assert counts == (first + later, first + later)
        assert dict(states) == {"done": first + later}
    finally:
        stop_all(hubs)
