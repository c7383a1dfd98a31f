"""PostgreSQL store: many hub processes on many hosts sharing one database.

How it keeps the :mod:`backchannel.stores.base` contract:

* **Transactions.** ``transact(fn)`` runs ``fn(tx)`` on a worker thread (at most
  ``pool_size`` at once, each on its own pooled psycopg connection) inside one
  PostgreSQL transaction; ``fn`` raising rolls it back and the exception propagates
  unchanged. A deadlock rolls the attempt back and re-runs ``fn`` on a fresh
  :class:`PgTx` (hence the contract's "no I/O from the function"), up to
  :data:`MAX_ATTEMPTS` times. ``read(fn)`` runs in a ``REPEATABLE READ READ ONLY``
  snapshot and takes no locks.
* **Isolation: one writer per team.** Every query on a team's rows names the team (the
  few that do not only read: ``list_teams``, ``member_by_token_hash``, ``next_*``; or
  touch no team's rows: ``spend_token``), and the first query
  of a writing transaction about a team takes that team's advisory lock
  (``pg_advisory_xact_lock``, in the same round trip) and holds it to ``COMMIT``. The
  transaction runs at ``READ COMMITTED``, so every statement after the lock reads the
  latest committed data, which no other writer can change until this one ends: writers
  of one team run one at a time across all hubs, exactly as if serial, without
  serialization failures. Writers of different teams touch disjoint rows and run in
  parallel. Since a team's writers take turns, each holds the lock for as few round
  trips as it can: the reads a function names first (``Tx.prefetch``: a send's checks,
  a lease's) go in the round trip that takes the lock and are answered from the
  transaction until it writes, and history and budgets are written in the ``COMMIT``
  round trip. The calls that span teams (``expired_leases``, ``due_jobs``) lock the teams
  of the rows they found, in sorted order, and then the rows themselves.
* **Ordering.** ``seq``, history cursors and event ids come from sequences drawn under
  the team lock, so within a team they grow in commit order: a lease sees a gap-free
  prefix of each inbox (FIFO by ``seq``), and a live feed that read up to cursor ``c``
  never later finds an event below ``c``.
* **Leases.** ``lease`` (and ``expired_leases``, ``due_jobs``) claim rows ``FOR UPDATE
  SKIP LOCKED``: two hubs never hand out one delivery or run one job twice.
* **Idempotency.** Inserts use ``ON CONFLICT DO NOTHING`` and raise ``AlreadyExists``
  without aborting the transaction, so a function may catch it and go on.
* **Durability.** ``transact`` returns after ``COMMIT`` returns: with the server's
  defaults (``fsync=on``, ``synchronous_commit=on``) after the WAL is on disk.
* **Wake-ups.** Each queued (or re-queued) delivery sends ``NOTIFY backchannel`` with
  payload ``"<origin>:<team>/<member>"`` right after ``COMMIT``, in its own statement
  and transaction but in the ``COMMIT``'s round trip (PostgreSQL serializes the commits of notifying transactions cluster-wide, so a
  notify inside the transaction would serialize every send's WAL flush). A listener
  thread on its own connection reports other hubs' notifications through
  :meth:`Store.on_external_change` on the loop that called :meth:`open` (a hub's own
  are skipped: it wakes its waiters itself), and every ``fallback_interval`` seconds
  reports ``(None, None)``, so a lost notification or a listener reconnecting after the
  database went away only delays a delivery. A token rotated, or a member or team
  removed, notifies ``"<origin>:<team>/"``, reported as ``(team, None)``: a change to
  the team as a whole, so other hubs end at once the requests that wait with a token
  that no longer works.
* **Failures.** An unreachable database at :meth:`open`, a lost connection, a pool that
  cannot hand out a connection in ``connect_timeout``, or any driver error becomes
  ``StoreError`` (HTTP 503: retry later) naming the URL without its password. A
  connection lost *before* ``COMMIT`` is retried on a fresh connection; lost *during*
  ``COMMIT`` the outcome is unknown and the error says so (sends are idempotent on
  ``message_id``: the caller retries). An error the server answers on a live connection
  (a ``statement_timeout`` or ``lock_timeout`` set for the role, a read-only database,
  a full disk) is not retried: it ends the request, naming the way out. The pool
  replaces broken connections. A hub that
  dies mid-transaction: PostgreSQL rolls the transaction back and frees its locks;
  leases it handed out expire and are re-queued by any hub.
* **Outages.** While the listener cannot reach the database, a transaction waits at
  most :data:`OUTAGE_WAIT` for a connection (not ``connect_timeout``), so callers get
  their 503 at once and retry; the pool retries connecting every few seconds at most
  (``reconnect_timeout=connect_timeout``: psycopg_pool's default backs off for five
  minutes, which would keep a hub failing for minutes after the database is back).
* **Migrations.** Numbered scripts recorded in ``schema_migrations``, applied in one
  transaction under an advisory lock: hubs starting together migrate once. A database
  newer than this code is refused, naming both versions; a migration announces the
  version it reached (``NOTIFY backchannel, 'schema:N'``), and a hub told of one newer
  than its code refuses every write from then on (a rolling upgrade).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from backchannel.errors import StoreError
from backchannel.stores.base import (
    SCHEMA_VERSION,
    Store,
    Tx,
    schema_moved_on,
    schema_put_back,
    tell_finished,
)
from backchannel.stores.postgres.schema import MIGRATIONS, SCHEMA_NOTICE, migrate
from backchannel.stores.postgres.transaction import CHANNEL, RetryTransaction
from backchannel.stores.postgres.tx import PgTx

__all__ = ["LISTENER_NAME", "MIGRATIONS", "PgTx", "PostgresStore", "mask_url"]

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("backchannel.stores.postgres")

LISTENER_NAME = "backchannel-listen"
#: What libpq adds to "server closed the connection unexpectedly" (spread over lines)
_LIBPQ_GUESS = (
    "This probably means the server terminated abnormally before or while processing the request."
)
MAX_ATTEMPTS = 30
#: Seconds a transaction waits for a pooled connection while the database is known to be
#: unreachable (the listener lost it), before failing with ``StoreError`` (HTTP 503).
OUTAGE_WAIT = 1.0
#: TCP settings every connection gets unless its URL sets them: a database host that
#: vanishes from the network without closing anything (a partition, a failover that moves
#: its address, a NAT that forgets the connection) answers nothing, and without these a
#: statement waits for its answer for the kernel's retransmission limit (~15 minutes) and
#: an idle or listening connection for the 2-hour keepalive: requests hang and the
#: listener never notices. ``tcp_user_timeout`` ends a connection whose sent bytes go
#: unacknowledged for 10 s, keepalives one that has heard nothing for about 11 s. Neither
#: touches a slow statement (a wait for a team's lock): the server's kernel acknowledges
#: and answers probes while PostgreSQL works.
#: How often the listener asks the server a trivial question (``SELECT 1``), and how long
#: it waits for the answer before it asks whether the server is frozen (the defaults of
#: ``PostgresStore(heartbeat_every=, frozen_after=)`` and of ``serve --pg-heartbeat``,
#: ``--pg-frozen-after``): a server whose processes are stopped (SIGSTOP, a paused VM, a
#: host stalled in swap) keeps its sockets open and its kernel acknowledges every byte and
#: keepalive probe, so neither TCP setting above ends a statement waiting on it, and it
#: would wait until the server resumes. An unanswered heartbeat alone does not tell a
#: frozen server from a live one that is slow (a backend starved of CPU, the hub's own
#: process stalled): the listener then opens a fresh connection (:meth:`_answers`), and
#: a server that completes its startup handshake within :func:`probe_wait` runs: nothing
#: is cut, only the listener's connection is replaced. A server that does not is taken
#: for frozen: the statements in flight on it are cut (their connections shut down: they
#: fail with ``StoreError``, 503) and every new one cut once it has waited as long, until
#: the listener connects again.
HEARTBEAT_EVERY = 2.0
FROZEN_AFTER = 10.0
TCP_DEFAULTS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}
#: Seconds a session of the hub may sit inside a transaction waiting for its next
#: statement before PostgreSQL ends it (``idle_in_transaction_session_timeout``; the
#: default of ``PostgresStore(idle_in_transaction=)``). A hub frozen in the middle of a
#: transaction (SIGSTOP, a paused VM, a host stalled in swap or gone from the network)
#: holds its team's lock, and every other hub's writes to that team wait behind it, until
#: the server ends the session: by default never. The hub's own transactions last
#: milliseconds and never wait on anything outside the database between statements, so
#: this only ends sessions whose hub stopped; the transaction is rolled back, and the hub,
#: if it comes back, finds its connection gone and runs the transaction again.
IDLE_IN_TRANSACTION = 15.0
#: PostgreSQL's own bound on that setting (2^31 - 1 ms), in whole seconds
IDLE_IN_TRANSACTION_MAX = 2_147_483
#: The server's side of :data:`TCP_DEFAULTS`: PostgreSQL notices a hub host gone from the
#: network in about 11 s, not after the system's 2 hours, and frees its connection slots.
SERVER_TCP: dict[str, str] = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
}
#: Each setting set for the session only where nobody set it (``source = 'default'``):
#: an administrator's value (``postgresql.conf``, ``ALTER ROLE … SET``, ``ALTER DATABASE
#: … SET``) or the URL's own (``?options=-c%20idle_in_transaction_session_timeout%3D60s``)
#: stands. One round trip, once a connection.
_SESSION_SETTINGS = (
    "SELECT set_config(s.name, v.value, false) FROM pg_settings AS s "
    "JOIN unnest(%s::text[], %s::text[]) AS v(name, value) ON s.name = v.name "
    "WHERE s.source = 'default'"
)


def probe_wait(frozen_after: float) -> float:
    """Seconds the fresh connection that asks whether the server runs may take to complete
    its handshake: half of ``frozen_after``, within libpq's 2 s floor and 5 s."""
    return min(5.0, max(2.0, frozen_after / 2))


def check_heartbeat(
    heartbeat_every: float,
    frozen_after: float,
    names: tuple[str, str] = ("heartbeat_every", "frozen_after"),
) -> None:
    """Raise ``ValueError`` naming the problem (each setting by its name in ``names``) and
    the way out if the listener's heartbeat settings cannot work."""
    every, after = names
    for name, value in ((every, heartbeat_every), (after, frozen_after)):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    if heartbeat_every < 0.2:
        raise ValueError(
            f"{every} {heartbeat_every:g} s is too short: the listener looks for "
            f"notifications every 0.2 s, so give at least 0.2 (the default is {HEARTBEAT_EVERY:g})"
        )
    if frozen_after < 1.0:
        raise ValueError(
            f"{after} {frozen_after:g} s is too short: a live server under load answers a "
            "trivial question late, and a hub that takes it for frozen cuts its requests; "
            f"give at least 1 (the default is {FROZEN_AFTER:g})"
        )


def _shut(conn: psycopg.Connection[Any]) -> None:
    """Shut down ``conn``'s socket from another thread: a statement waiting on it for
    an answer fails at once with a lost connection (the socket stays open until psycopg
    closes it, so its descriptor is never reused under it)."""
    with contextlib.suppress(OSError, psycopg.Error):
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (URL or ``key=value`` form)."""
    if "://" in url:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user, has_pw, _ = userinfo.partition(":")
            netloc = f"{user}:***@{host}" if has_pw else netloc
        query = re.sub(r"(?i)(^|&)password=[^&]*", r"\1password=***", parts.query)
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    return re.sub(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", url)


def _password(url: str) -> str | None:
    with contextlib.suppress(psycopg.Error, ValueError):
        return psycopg.conninfo.conninfo_to_dict(url).get("password") or None  # type: ignore[return-value]
    return None


def _answer(fut: asyncio.Future[Any], fn: Any, value: Any, error: BaseException | None) -> None:
    """A worker thread's answer, on the event loop. A caller that stopped waiting has its
    function told how it ended (each of ``transact_each``'s by its own outcome)."""
    if fut.cancelled():
        if isinstance(fn, list):
            for one, got in zip(fn, value or [error] * len(fn), strict=True):
                tell_finished(one, not isinstance(got, BaseException))
        else:
            tell_finished(fn, error is None)
    elif error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


#: What PostgreSQL's errors that no retry of the same request gets past mean for the
#: person running the hub, and what to do (``{role}``: the URL's user); any other failure
#: is transient, retried by the request's sender.
_WAY_OUT = {
    "53100": "the database server's disk is full: free space there, then retry",
    "53200": "the database server is out of memory: give it more, then retry",
    "53300": "the database server has no connection left for the hub: raise its "
    "max_connections (or the CONNECTION LIMIT of the role or database), or run fewer hubs "
    "or smaller pools on it, then retry",
    "25006": "the database is read-only (a hot standby, as after a failover, or "
    "default_transaction_read_only=on for the role or database): point the hub at the "
    "primary (with several hosts in the URL, add target_session_attrs=read-write and "
    "libpq picks it), then retry",
    "57014": "a statement_timeout set for the role or database (or an administrator) "
    "cancelled a statement; the hub's statements wait for a team's lock while another hub "
    "writes to that team: lift it for the hub (ALTER ROLE {role} SET statement_timeout = 0), "
    "then retry",
    "55P03": "a lock_timeout set for the role or database cancelled a wait for a lock; the "
    "hub waits for a team's lock while another hub writes to that team: lift it for the hub "
    "(ALTER ROLE {role} SET lock_timeout = 0), then retry",
}

#: How libpq words a refused connection when the server has no slot for it (53300, which
#: it does not hand over as a code at connect time).
_NO_SLOT = re.compile(
    r"too many clients already|too many connections for|remaining connection slots are reserved"
)


#: How libpq words a connection the server refused with an answer of its own: it runs.
_ANSWERED = re.compile(_NO_SLOT.pattern + r"|authentication failed|does not exist")


def _tcp_settings(url: str) -> dict[str, Any]:
    """:data:`TCP_DEFAULTS` less what ``url`` sets itself (its own values win)."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except (psycopg.Error, ValueError):
        given = {}
    return {k: v for k, v in TCP_DEFAULTS.items() if k not in given}


def _user(url: str) -> str | None:
    with contextlib.suppress(psycopg.Error, ValueError):
        return psycopg.conninfo.conninfo_to_dict(url).get("user") or None  # type: ignore[return-value]
    return None


class PostgresStore(Store):
    """The many-hosts store; see the module docstring for how it keeps the contract.

    ``url`` is a libpq URL (``postgresql://user:pass@host:5432/db``) or ``key=value``
    string. ``pool_size`` bounds connections *and* concurrent transactions of this hub;
    the listener uses one more connection. ``connect_timeout`` bounds how long open()
    and a transaction wait for a connection before raising ``StoreError``.
    ``idle_in_transaction`` (seconds, 0 to leave it to the server) is how long PostgreSQL
    lets a session of this hub sit inside a transaction before ending it, so that a hub
    frozen mid-transaction does not hold its team's lock from other hubs for good (see
    :data:`IDLE_IN_TRANSACTION`); a value set for the role, the database or in the URL's
    ``options`` wins.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        connect_timeout: float = 10.0,
        fallback_interval: float = 2.0,
        heartbeat_every: float = HEARTBEAT_EVERY,
        frozen_after: float = FROZEN_AFTER,
        idle_in_transaction: float = IDLE_IN_TRANSACTION,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        check_heartbeat(heartbeat_every, frozen_after)
        if not math.isfinite(idle_in_transaction) or not (
            idle_in_transaction == 0 or 1 <= idle_in_transaction <= IDLE_IN_TRANSACTION_MAX
        ):
            raise ValueError(
                "idle_in_transaction must be 0 (leave the server's setting alone) or a "
                f"number of seconds from 1 to {IDLE_IN_TRANSACTION_MAX:,} (under a second "
                "would end a live hub's transactions too), not "
                f"{idle_in_transaction!r}; the default is {IDLE_IN_TRANSACTION:g}"
            )
        settings = dict(SERVER_TCP)
        if idle_in_transaction:
            ms = max(1, round(idle_in_transaction * 1000))
            settings["idle_in_transaction_session_timeout"] = str(ms)
        self._session_settings = (list(settings), list(settings.values()))
        self._heartbeat_every = heartbeat_every
        self._frozen_after = frozen_after
        #: set by the heartbeat's watchdog when the server answered a fresh connection but
        #: not the listener's question: the listener reconnects, nothing is cut
        self._replacing = False
        self._dsn = url
        self.url = mask_url(url)
        self._secret = _password(url)
        self._role = _user(url) or "<role>"
        self._tcp = _tcp_settings(url)
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._fallback = fallback_interval
        self._origin = secrets.token_hex(6)
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()
        self._listening = threading.Event()
        #: set by the listener while it cannot reach the database: fail fast, not slowly
        self._unreachable = False
        #: set by the listener when the server stopped answering (``frozen_after``, and a
        #: fresh connection unanswered too), until it connects again: transactions in
        #: flight are cut, not left waiting
        self._frozen = False
        #: connections a transaction attempt is using -> when the attempt started
        self._busy: dict[psycopg.Connection[Any], float] = {}
        self._busy_lock = threading.Lock()
        #: the schema version a newer backchannel announced it migrated the database to
        #: (a rolling upgrade with this hub still running): it writes nothing more
        self._moved_on: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        #: Transaction attempts re-run after a serialization failure, deadlock or lost
        #: connection (a health signal: it grows with contention).
        self.retries = 0

    # -- errors ------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _one_line(self, exc: BaseException) -> str:
        """``exc`` as one line, the password scrubbed (libpq's messages span lines), and
        without libpq's guess at why a server closed the connection, which says nothing
        the first words do not."""
        text = " ".join(self._scrub(str(exc)).split())
        return text.replace(_LIBPQ_GUESS, "").strip()

    def _error(self, exc: BaseException, what: str = "failed") -> StoreError:
        detail = self._one_line(exc)
        way_out = _WAY_OUT.get(getattr(exc, "sqlstate", None) or "", "retry shortly")
        way_out = way_out.replace("{role}", self._role)
        return StoreError(
            f"PostgreSQL store {self.url} {what}: {detail}; {way_out}", store=self.url
        )

    # -- lifecycle ---------------------------------------------------------
    async def open(self) -> None:
        """Connect, migrate to :data:`SCHEMA_VERSION`, start the pool and the listener."""
        if self._pool is not None:
            return
        if self._closed:
            raise StoreError(f"PostgreSQL store {self.url} is closed; create a new one")
        self._loop = asyncio.get_running_loop()
        self._pool = await asyncio.to_thread(self._open_sync)
        self._executor = ThreadPoolExecutor(self._pool_size, thread_name_prefix="bc-pg")
        self._listener = threading.Thread(target=self._listen, name="bc-pg-listen", daemon=True)
        self._listener.start()
        # wake-ups are reliable from the moment open() returns (bounded wait; without the
        # listener the fallback timer still wakes waiters)
        await asyncio.to_thread(self._listening.wait, self._connect_timeout)

    def _connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self._dsn,
                connect_timeout=max(1, round(self._connect_timeout)),
                **self._tcp,
                **kwargs,
            )
        except psycopg.Error as exc:
            detail = self._scrub(str(exc).strip())
            way_out = (
                _WAY_OUT["53300"][0].upper() + _WAY_OUT["53300"][1:]
                if _NO_SLOT.search(detail)
                else "Check that the server is running and that the URL, user and password "
                "are right"
            )
            raise StoreError(
                f"cannot connect to PostgreSQL at {self.url}: {detail}. {way_out}",
                store=self.url,
            ) from exc

    def _open_sync(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._connect(autocommit=True) as conn:
            try:
                migrate(conn, self.url)
            except psycopg.errors.InsufficientPrivilege as exc:
                user = conn.info.user
                raise StoreError(
                    f"PostgreSQL store {self.url} could not be migrated: "
                    f"{self._scrub(str(exc).strip().splitlines()[0])}. The role {user!r} must "
                    "be allowed to create tables: make it the database's owner, or GRANT "
                    f'CREATE ON SCHEMA public TO "{user}" (PostgreSQL 15 and later no longer '
                    "grant that to every role)",
                    store=self.url,
                ) from exc
            except psycopg.Error as exc:
                raise self._error(exc, "could not be migrated") from exc
            row = conn.execute(
                "SELECT store_id, (SELECT oid FROM pg_database "
                "WHERE datname = current_database()) FROM store_identity"
            ).fetchone()
            if row is None:  # the row removed by hand: the store is no longer told apart
                raise StoreError(
                    f"the PostgreSQL store {self.url} has lost its identity (the table "
                    "store_identity is empty); put the row back from a backup",
                    store=self.url,
                )
            # the database's oid too: a copy (a restored dump) beside it is another store
            self.identity = f"postgresql:{row[0]}:{row[1]}"
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self._dsn,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, round(self._connect_timeout)),
                "application_name": "backchannel",
                **self._tcp,
            },
            min_size=1,
            max_size=self._pool_size,
            open=False,
            timeout=self._connect_timeout,
            # give up a reconnection attempt (and its growing backoff) after this long;
            # the next transaction starts a fresh one, so a hub reconnects within seconds
            # of the database coming back, however long it was away
            reconnect_timeout=self._connect_timeout,
            name=f"backchannel-{self._origin}",
            configure=self._configure,
        )
        try:
            pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            pool.close()
            raise StoreError(f"cannot connect to PostgreSQL at {self.url}: {exc}") from exc
        return pool

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """A new pooled connection's session settings (:data:`_SESSION_SETTINGS`). A
        server that refuses them still serves: the hub then lives without them."""
        try:
            conn.execute(_SESSION_SETTINGS, self._session_settings)
        except psycopg.Error as exc:
            if conn.broken:
                raise
            log.warning(
                "PostgreSQL store %s: the session settings %s were refused (%s); a hub "
                "frozen inside a transaction will hold its team's lock until the server "
                "ends its session: set idle_in_transaction_session_timeout for the role",
                self.url,
                ", ".join(self._session_settings[0]),
                self._one_line(exc),
            )

    async def close(self) -> None:
        """Let in-flight transactions finish, stop the listener, close the pool."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        executor, pool, listener = self._executor, self._pool, self._listener
        self._executor = self._pool = self._listener = None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True)
        if pool is not None:
            await asyncio.to_thread(pool.close)
        if listener is not None:
            await asyncio.to_thread(listener.join)

    # -- transactions ------------------------------------------------------
    def transact(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        return self._submit(self._run, fn, False)

    def read(self, fn: Callable[[Tx], T]) -> asyncio.Future[T]:
        return self._submit(self._run, fn, True)

    async def database_time(self) -> float:
        return await self.read(lambda tx: cast(PgTx, tx).database_time())

    def transact_each(
        self, fns: Sequence[Callable[[Tx], T]]
    ) -> asyncio.Future[list[T | Exception]]:
        """One after another on one worker thread (one hand-off for the lot), each in a
        transaction of its own with its own retries. They are not run concurrently:
        they are one sender's, in its team, whose lock would order them anyway, and in
        order they keep the sender's order."""
        return self._submit(self._run_each, list(fns))

    def _run_each(self, fns: list[Callable[[Tx], T]]) -> list[T | Exception]:
        done: list[T | Exception] = []
        for fn in fns:
            try:
                done.append(self._run(fn, False))
            except Exception as exc:
                done.append(exc)
        return done

    def _submit(self, call: Callable[..., R], fn: Any, *args: Any) -> asyncio.Future[R]:
        """``call(fn, *args)`` on a worker thread; the future it answers. It runs even if
        its caller stops waiting, and ``fn`` (or each of a list) is then told how it
        ended (:func:`tell_finished`)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        executor = self._executor
        if executor is None:
            fut.set_exception(StoreError(f"the PostgreSQL store {self.url} is not open"))
            return fut

        def work() -> None:
            try:
                outcome: tuple[Any, BaseException | None] = (call(fn, *args), None)
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                outcome = (None, exc)
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_answer, fut, fn, *outcome)

        try:
            executor.submit(work)
        except RuntimeError:  # shut down by close() meanwhile
            fut.set_exception(StoreError(f"the PostgreSQL store {self.url} is closed"))
        return fut

    def _run(self, fn: Callable[[Tx], T], readonly: bool) -> T:
        pool = self._pool
        if pool is None:
            raise StoreError(f"the PostgreSQL store {self.url} is closed")
        if self._moved_on is not None and not readonly:
            raise StoreError(
                schema_moved_on(f"PostgreSQL database {self.url}", self._moved_on),
                store=self.url,
            )
        lost = 0
        for attempt in range(1, MAX_ATTEMPTS + 1):
            outage = self._unreachable
            try:
                with pool.connection(
                    timeout=min(OUTAGE_WAIT, self._connect_timeout) if outage else None
                ) as conn:
                    tx = PgTx(conn, readonly=readonly, origin=self._origin, error=self._error)
                    with self._busy_lock:
                        self._busy[conn] = time.monotonic()
                    try:
                        outcome = self._attempt(tx, fn)
                    finally:
                        with self._busy_lock:
                            del self._busy[conn]
                        tx._cleanup()
            except StoreError as exc:
                if not tx.undefined:
                    raise
                raise self._put_back(pool, exc) from exc
            except (PoolTimeout, PoolClosed) as exc:
                what = "cannot reach the database" if outage else "has no connection available"
                raise self._error(exc, what) from exc
            if outcome is not None:
                return outcome[0]
            self.retries += 1
            if tx.broken and self._frozen:
                raise StoreError(self._frozen_message(), store=self.url)
            if tx.broken:
                lost += 1
                if lost > 2:
                    raise StoreError(
                        f"PostgreSQL store {self.url} keeps losing its connection; retry shortly",
                        store=self.url,
                    )
                with contextlib.suppress(Exception):
                    pool.check()  # drop the other dead connections at once
                continue
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
        raise StoreError(
            f"PostgreSQL store {self.url}: transaction kept conflicting with concurrent ones "
            f"({MAX_ATTEMPTS} attempts); retry shortly",
            store=self.url,
        )

    def _frozen_message(self) -> str:
        return (
            f"PostgreSQL at {self.url} stopped answering (no answer in {self._frozen_after:g} s, "
            "not even to a new connection: "
            "its server is stopped, paused or stalled); the request was cut off and not "
            "applied. Check that the PostgreSQL server is running, then retry"
        )

    def _cut(self, older_than: float | None = None) -> None:
        """Shut down the connections of the transaction attempts in flight (those started
        ``older_than`` seconds ago or more, if given): each fails at once with a lost
        connection, which the pool then drops, instead of waiting for a frozen server."""
        now = time.monotonic()
        with self._busy_lock:
            conns = [
                c for c, t in self._busy.items() if older_than is None or now - t >= older_than
            ]
            for conn in conns:
                _shut(conn)
        if conns:
            log.warning(
                "PostgreSQL at %s does not answer: %d transaction(s) in flight cut off",
                self.url,
                len(conns),
            )

    def _answers(self) -> bool:
        """Whether the server completes a fresh connection's TCP and startup handshake
        (authentication included) within :func:`probe_wait`: its postmaster runs and
        forks backends that answer. A frozen server's kernel accepts the TCP connection,
        but nothing answers the startup packet. A connection the server refuses in words
        (no connection slot left, authentication failed) was answered too: a busy server
        at its ``max_connections`` is not frozen."""
        try:
            with psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(2, math.ceil(probe_wait(self._frozen_after))),
                application_name=f"{LISTENER_NAME}-probe",
                **self._tcp,
            ):
                return True
        except psycopg.Error as exc:
            return bool(_ANSWERED.search(str(exc)))

    def _heartbeat(self, conn: psycopg.Connection[Any]) -> None:
        """Ask the server ``SELECT 1`` on the listener's connection; with no answer in
        ``frozen_after`` seconds, ask whether it runs at all (:meth:`_answers`). A server
        that answers a fresh connection is alive but slow (or this process stalled): the
        listener's connection is shut down (the question fails with ``psycopg.Error``) and
        replaced, and nothing else is touched. One that does not is taken for frozen: the
        connection is shut down and the transactions in flight cut."""

        def overdue() -> None:
            if self._answers():
                log.warning(
                    "PostgreSQL at %s took over %g s to answer the listener's heartbeat "
                    "but answers new connections: it is slow, not frozen (nothing is cut); "
                    "the listener reconnects",
                    self.url,
                    self._frozen_after,
                )
                self._replacing = True
                _shut(conn)
                return
            log.warning(
                "PostgreSQL at %s has not answered for %g s, nor a new connection in %g s "
                "(its server stopped, paused or stalled): requests in flight are cut off "
                "and answered 503 until it answers again",
                self.url,
                self._frozen_after,
                probe_wait(self._frozen_after),
            )
            self._frozen = True
            self._unreachable = True
            _shut(conn)
            self._cut()

        watchdog = threading.Timer(self._frozen_after, overdue)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.execute("SELECT 1")
        finally:
            watchdog.cancel()

    def _put_back(
        self, pool: ConnectionPool[psycopg.Connection[Any]], exc: StoreError
    ) -> StoreError:
        """A statement named a table or column the database lacks: if its schema is older
        than this code's (put back under the running hub), the error says so."""
        try:
            with pool.connection(timeout=self._connect_timeout) as conn:
                row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
        except (psycopg.Error, PoolTimeout, PoolClosed):
            return exc
        version = int(row[0]) if row and row[0] is not None else 0
        if version >= SCHEMA_VERSION:
            return exc
        return StoreError(
            schema_put_back(f"PostgreSQL database {self.url}", version), store=self.url
        )

    def _attempt(self, tx: PgTx, fn: Callable[[Tx], T]) -> tuple[T] | None:
        """One try: ``(result,)`` once committed, ``None`` if it must be re-run, else raises."""
        try:
            result = fn(tx)
        except BaseException as exc:
            if tx.retry or (tx.broken and isinstance(exc, StoreError)):
                return None  # the database failed under fn, not fn itself: run it again
            raise
        if tx.retry or tx.broken:  # fn swallowed a database error: the attempt is void
            return None
        try:
            tx._commit()
        except RetryTransaction:
            return None
        except StoreError as exc:
            if not tx.broken:
                raise
            raise StoreError(
                f"{exc.message} (the connection was lost while committing: the transaction "
                "may or may not have been applied)",
                store=self.url,
            ) from exc
        return (result,)

    # -- listener ------------------------------------------------------------
    def _post(self, team: str | None, member: str | None) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._emit_change, team, member)

    def _schema_announced(self, payload: str) -> None:
        """A hub migrated the database (``schema:N``, sent as its migration commits): if
        to a version newer than this code's, this hub stops writing (:meth:`_run`).
        A write that starts between the migration's commit and the notice's arrival
        (milliseconds, while the listener is connected) still goes through: the notice
        narrows a rolling upgrade's window, it does not close it."""
        try:
            version = int(payload[len(SCHEMA_NOTICE) :])
        except ValueError:
            return
        if version > SCHEMA_VERSION and self._moved_on is None:
            self._moved_on = version
            log.error("%s", schema_moved_on(f"PostgreSQL database {self.url}", version))

    def _deaf(self, how: str, exc: psycopg.Error, failures: int, backoff: float) -> float:
        """The listener's connection ``how`` ("failed", "lost"): said once in one line
        (then quietly, while it tries again), waiters woken to look for themselves, and
        a wait of ``backoff``; the next backoff."""
        self._unreachable = True
        if self._frozen:  # still no answer: what waited as long since is cut too
            self._cut(older_than=self._frozen_after)
        log.log(
            logging.WARNING if failures == 1 else logging.DEBUG,
            "LISTEN connection to %s %s: %s; check that PostgreSQL is running and "
            "reachable (tried again quietly until it is back)",
            self.url,
            how,
            self._one_line(exc),
        )
        self._post(None, None)
        self._stop.wait(backoff)
        return min(backoff * 2, self._fallback or 2.0)

    def _listen(self) -> None:
        """Background thread: LISTEN, report others' notifications, reconnect, fall back."""
        backoff = 0.1
        next_fallback = time.monotonic() + self._fallback
        next_heartbeat = time.monotonic() + self._heartbeat_every
        own = self._origin + ":"
        # an outage is said once, in one line, and its end once: the listener tries
        # again every few seconds, and a line each time would bury everything else
        failures = 0
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(
                    self._dsn,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=LISTENER_NAME,
                    **self._tcp,
                )
            except psycopg.Error as exc:
                failures += 1
                backoff = self._deaf("failed", exc, failures, backoff)
                continue
            try:
                with conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    # reset only once LISTEN is taken: a server that takes the connection
                    # but refuses LISTEN (a hot standby) is backed off from, not spun on
                    backoff = 0.1
                    # a migration while this listener was away is told by the table, one
                    # committed from now on by its notice (LISTEN came first: no gap)
                    with contextlib.suppress(psycopg.errors.UndefinedTable):
                        row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
                        if row and row[0] is not None:
                            self._schema_announced(f"{SCHEMA_NOTICE}{row[0]}")
                    self._unreachable = self._frozen = False
                    if failures:
                        log.warning("LISTEN connection to %s is back", self.url)
                        failures = 0
                    self._listening.set()
                    self._post(None, None)  # anything may have happened while deaf
                    while not self._stop.is_set():
                        seen: dict[str, None] = {}
                        # return with the first packet, not at the end of the 0.2 s window:
                        # a waiter on this hub wakes as soon as the other hub's NOTIFY lands
                        # (what a packet holds is still coalesced below)
                        for n in conn.notifies(timeout=0.2, stop_after=1):
                            if n.payload.startswith(SCHEMA_NOTICE):
                                self._schema_announced(n.payload)
                            elif not n.payload.startswith(own):
                                seen[n.payload.partition(":")[2]] = None
                        for key in seen:
                            team, _, member = key.partition("/")
                            self._post(team or None, member or None)
                        if self._fallback and time.monotonic() >= next_fallback:
                            next_fallback = time.monotonic() + self._fallback
                            self._post(None, None)
                        if time.monotonic() >= next_heartbeat:
                            self._heartbeat(conn)
                            next_heartbeat = time.monotonic() + self._heartbeat_every
            except psycopg.Error as exc:
                if self._replacing:  # a live server, slow on this connection: a fresh one
                    self._replacing = False
                    log.debug("LISTEN connection to %s replaced: %s", self.url, exc)
                    continue
                if not self._stop.is_set():
                    failures += 1
                    backoff = self._deaf("lost", exc, failures, backoff)
