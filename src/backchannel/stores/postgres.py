"""PostgreSQL store: many hub processes on many hosts sharing one database.

How it keeps the :mod:`backchannel.stores.base` contract:

* **Transactions.** ``transact(fn)`` runs ``fn(tx)`` on a worker thread (at most
  ``pool_size`` at once, each with its own pooled psycopg connection) inside one
  ``SERIALIZABLE`` PostgreSQL transaction, so transaction functions behave as if run one
  at a time across every hub on the database. A serialization failure or deadlock rolls
  the attempt back and re-runs ``fn`` on a fresh :class:`PgTx` (hence the contract's
  "no I/O from the function"), up to :data:`MAX_ATTEMPTS` times. ``read(fn)`` runs in a
  ``REPEATABLE READ READ ONLY`` snapshot, which never conflicts.
* **Durability.** ``transact`` returns after ``COMMIT`` returns; with the server's
  defaults (``fsync=on``, ``synchronous_commit=on``) that is after the WAL flush.
* **Ordering.** Delivery ``seq`` numbers and history cursors come from sequences, drawn
  only while holding a per-team advisory lock (``pg_advisory_xact_lock``) that is held
  until commit. Within a team, numbers therefore grow in commit order: a lease sees a
  gap-free prefix of each inbox (FIFO by ``seq``) and a live feed that read up to
  cursor ``c`` never later finds an event below ``c``. The lock is taken as late as
  possible (history events are buffered and written just before ``COMMIT``), so only
  the tail of writing transactions of one team is serialized. Across teams ``seq``
  grows but is not tied to commit order; nothing reads it across teams.
* **Leases.** ``lease`` picks rows ``FOR UPDATE SKIP LOCKED``: hubs leasing the same
  inbox at once never hand out one delivery twice and never wait on each other.
  ``expired_leases`` skips locked rows too, so several hubs' maintenance loops share the
  work instead of colliding.
* **Idempotency.** Inserts use ``ON CONFLICT DO NOTHING`` and raise ``AlreadyExists``
  without aborting the transaction, so a function may catch it and go on; a concurrent
  insert of the same key surfaces as a serialization failure and the retry sees the row.
* **Wake-ups.** Each queued (or re-queued) delivery sends ``NOTIFY backchannel`` with
  payload ``"<origin>:<team>/<member>"`` (delivered on commit). A listener thread on
  its own connection reports other hubs' notifications through
  :meth:`Store.on_external_change` on the loop that called :meth:`open`, and every
  ``fallback_interval`` seconds reports ``(None, None)`` so a lost notification (or a
  listener reconnecting after the database went away) only delays a delivery.
* **Failures.** An unreachable database at :meth:`open`, a lost connection, a pool that
  cannot hand out a connection, or any driver error becomes ``StoreError`` (HTTP 503,
  retry later) naming the URL without its password. A connection lost *before* commit
  is retried on a fresh connection; lost *during* commit the outcome is unknown and the
  error says so (sends are idempotent on ``message_id``, so the caller retries). The
  pool replaces broken connections. Crash of a hub mid-transaction: PostgreSQL rolls
  the transaction back; leases it handed out expire and are re-queued.
* **Migrations.** Numbered scripts recorded in ``schema_migrations``, applied in one
  transaction under ``pg_advisory_xact_lock``: hubs starting together migrate once. A
  database newer than this code is refused with both versions named.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerr
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from backchannel.errors import AlreadyExists, BackchannelError, InvalidRequest, StoreError
from backchannel.stores.base import SCHEMA_VERSION, Store, Tx
from backchannel.types import (
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxMessage,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Session,
    SessionState,
    Team,
)

__all__ = ["MIGRATIONS", "PgTx", "PostgresStore", "mask_url"]

T = TypeVar("T")
log = logging.getLogger("backchannel.stores.postgres")

CHANNEL = "backchannel"
LISTENER_NAME = "backchannel-listen"
MAX_ATTEMPTS = 30
_MIGRATION_LOCK = 0x6263_6D69_6772_6174  # "bcmigrat"

MIGRATIONS: list[str] = [
    # 1: the messaging core (mirrors the SQLite schema; every key starts with team)
    """
    CREATE TABLE teams (
        name text PRIMARY KEY,
        created_at double precision NOT NULL,
        settings jsonb NOT NULL DEFAULT '{}'
    );
    CREATE TABLE members (
        team text NOT NULL,
        name text NOT NULL,
        kind text NOT NULL,
        created_at double precision NOT NULL,
        token_hash text NOT NULL UNIQUE,
        delivery jsonb NOT NULL DEFAULT '{}',
        settings jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, name)
    );
    CREATE TABLE sessions (
        team text NOT NULL,
        session_id text NOT NULL,
        member text NOT NULL,
        state text NOT NULL,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        turn integer NOT NULL DEFAULT 0,
        turn_started_at double precision,
        turn_kind text NOT NULL DEFAULT 'normal',
        last_output text NOT NULL DEFAULT '',
        last_stop_at double precision,
        meta jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, session_id)
    );
    CREATE INDEX sessions_member ON sessions (team, member, created_at);
    CREATE TABLE messages (
        team text NOT NULL,
        message_id text NOT NULL,
        sender text NOT NULL,
        sender_session text,
        to_name text NOT NULL,
        kind text NOT NULL,
        text text NOT NULL,
        summary text,
        created_at double precision NOT NULL,
        fingerprint text NOT NULL,
        meta jsonb NOT NULL DEFAULT '{}',
        PRIMARY KEY (team, message_id)
    );
    CREATE SEQUENCE delivery_seq;
    CREATE TABLE deliveries (
        team text NOT NULL,
        message_id text NOT NULL,
        member text NOT NULL,
        session text,
        seq bigint NOT NULL,
        state text NOT NULL,
        attempts integer NOT NULL DEFAULT 0,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        lease_until double precision,
        dead_reason text,
        PRIMARY KEY (team, message_id, member)
    );
    CREATE INDEX deliveries_queued ON deliveries (team, member, seq) WHERE state = 'queued';
    CREATE INDEX deliveries_open ON deliveries (team, member) WHERE state IN ('queued', 'leased');
    CREATE INDEX deliveries_leased ON deliveries (lease_until) WHERE state = 'leased';
    CREATE SEQUENCE delivery_event_id;
    CREATE TABLE delivery_events (
        team text NOT NULL,
        id bigint NOT NULL,
        message_id text NOT NULL,
        member text NOT NULL,
        at double precision NOT NULL,
        event text NOT NULL,
        detail text NOT NULL DEFAULT '',
        PRIMARY KEY (team, id)
    );
    CREATE INDEX delivery_events_message ON delivery_events (team, message_id, id);
    """,
]
assert len(MIGRATIONS) == SCHEMA_VERSION

_MSG_COLS = (
    "m.team, m.message_id, m.sender, m.to_name, m.text, m.kind, m.created_at, "
    "m.fingerprint, m.summary, m.sender_session, m.meta"
)
_DELIVERY_COLS = (
    "team, message_id, member, session, seq, state, attempts, created_at, updated_at, "
    "lease_until, dead_reason"
)
_MEMBER_COLS = "team, name, kind, created_at, token_hash, delivery, settings"
_SESSION_COLS = (
    "team, session_id, member, state, created_at, updated_at, turn, turn_started_at, "
    "turn_kind, last_output, last_stop_at, meta"
)


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


def _lock_key(kind: str, name: str) -> int:
    digest = hashlib.blake2b(f"backchannel:{kind}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _dump(value: Mapping[str, Any] | None) -> Jsonb:
    return Jsonb(dict(value) if value else {})


def _message(r: Sequence[Any]) -> Message:
    return Message(
        team=r[0], message_id=r[1], sender=r[2], to=r[3], text=r[4], kind=MessageKind(r[5]),
        created_at=r[6], fingerprint=r[7], summary=r[8], sender_session=r[9], meta=r[10] or {},
    )  # fmt: skip


def _delivery(r: Sequence[Any]) -> Delivery:
    return Delivery(
        team=r[0], message_id=r[1], recipient=Recipient(r[2], r[3]), seq=r[4],
        state=DeliveryState(r[5]), attempts=r[6], created_at=r[7], updated_at=r[8],
        lease_until=r[9], dead_reason=r[10],
    )  # fmt: skip


def _member(r: Sequence[Any]) -> Member:
    return Member(
        team=r[0], name=r[1], kind=MemberKind(r[2]), created_at=r[3], token_hash=r[4],
        delivery=r[5] or {}, settings=r[6] or {},
    )  # fmt: skip


def _session(r: Sequence[Any]) -> Session:
    return Session(
        team=r[0], session_id=r[1], member=r[2], state=SessionState(r[3]), created_at=r[4],
        updated_at=r[5], turn=r[6], turn_started_at=r[7], turn_kind=r[8], last_output=r[9],
        last_stop_at=r[10], meta=r[11] or {},
    )  # fmt: skip


class _Retry(StoreError):
    """A serialization failure or deadlock: the store re-runs the transaction function."""


class PgTx:
    """:class:`Tx` over one connection inside a transaction opened by the store.

    History events and notifications are buffered and written by :meth:`_flush` just
    before ``COMMIT`` (or before a read of history), under the team ordering lock.
    """

    def __init__(self, conn: psycopg.Connection[Any], store: PostgresStore, readonly: bool) -> None:
        self._conn = conn
        self._store = store
        self._readonly = readonly
        self._locked: set[str] = set()
        self._events: list[tuple[str, DeliveryEvent]] = []
        self._notify: dict[str, None] = {}
        self.retry = False  # set when the database asked for a re-run
        self.broken = False  # set when the connection was lost

    # -- plumbing ----------------------------------------------------------
    def _exec(self, sql: str, args: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        try:
            return self._conn.execute(sql, args)
        except psycopg.Error as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: psycopg.Error) -> BackchannelError:
        if isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected):
            self.retry = True
            return _Retry(f"PostgreSQL asked to retry: {exc.sqlstate}")
        if isinstance(exc, pgerr.UniqueViolation):
            return AlreadyExists(f"duplicate key: {exc.diag.message_detail or exc}")
        if isinstance(exc, pgerr.UntranslatableCharacter) or (
            isinstance(exc, psycopg.DataError) and "NUL" in str(exc)
        ):
            return InvalidRequest("text contains a NUL character (\\x00), which cannot be stored")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) or self._conn.broken:
            self.broken = True
        return self._store._error(exc)

    def _one(self, sql: str, args: Sequence[Any]) -> Any:
        return self._exec(sql, args).fetchone()

    def _all(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return self._exec(sql, args).fetchall()

    def _lock_teams(self, teams: Iterable[str]) -> None:
        """Take each team's ordering lock (sorted, once per transaction, held to commit)."""
        todo = sorted(set(teams) - self._locked)
        if todo:
            self._exec(
                "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k",
                ([_lock_key("team", t) for t in todo],),
            )
            self._locked.update(todo)

    def _event(self, team: str, ev: DeliveryEvent) -> None:
        self._events.append((team, ev))

    def _flush(self) -> None:
        if self._events:
            self._lock_teams(team for team, _ in self._events)
            evs, self._events = self._events, []
            cols: list[list[Any]] = [[], [], [], [], [], []]
            for team, e in evs:
                for col, value in zip(
                    cols, (team, e.message_id, e.member, e.at, e.event, e.detail), strict=True
                ):
                    col.append(value)
            self._exec(
                "INSERT INTO delivery_events (team, id, message_id, member, at, event, detail) "
                "SELECT t, nextval('delivery_event_id'), m, b, a, e, d FROM unnest("
                "%s::text[], %s::text[], %s::text[], %s::float8[], %s::text[], %s::text[]) "
                "WITH ORDINALITY AS u(t, m, b, a, e, d, o) ORDER BY o",
                cols,
            )
        if self._notify:
            payloads, self._notify = list(self._notify), {}
            self._exec(
                "SELECT pg_notify(%s, %s || p) FROM unnest(%s::text[]) AS p",
                (CHANNEL, self._store._origin + ":", payloads),
            )

    def _wake(self, team: str, member: str) -> None:
        self._notify[f"{team}/{member}"] = None

    def _insert(self, sql: str, args: Sequence[Any], what: str) -> None:
        if self._exec(sql + " ON CONFLICT DO NOTHING RETURNING 1", args).fetchone() is None:
            raise AlreadyExists(f"{what} already exists")

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None:
        row = self._one("SELECT name, created_at, settings FROM teams WHERE name = %s", (name,))
        return Team(row[0], row[1], row[2] or {}) if row else None

    def insert_team(self, team: Team) -> None:
        self._insert(
            "INSERT INTO teams (name, created_at, settings) VALUES (%s, %s, %s)",
            (team.name, team.created_at, _dump(team.settings)),
            f"team {team.name!r}",
        )

    def list_teams(self) -> list[Team]:
        rows = self._all("SELECT name, created_at, settings FROM teams ORDER BY name", ())
        return [Team(r[0], r[1], r[2] or {}) for r in rows]

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None:
        row = self._one(
            f"SELECT {_MEMBER_COLS} FROM members WHERE team = %s AND name = %s", (team, name)
        )
        return _member(row) if row else None

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        row = self._one(f"SELECT {_MEMBER_COLS} FROM members WHERE token_hash = %s", (token_hash,))
        return _member(row) if row else None

    def insert_member(self, member: Member) -> None:
        m = member
        self._insert(
            f"INSERT INTO members ({_MEMBER_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (m.team, m.name, m.kind.value, m.created_at, m.token_hash, _dump(m.delivery),
             _dump(m.settings)),
            f"member {m.name!r} in team {m.team!r}",
        )  # fmt: skip

    def list_members(self, team: str) -> list[Member]:
        rows = self._all(
            f"SELECT {_MEMBER_COLS} FROM members WHERE team = %s ORDER BY name", (team,)
        )
        return [_member(r) for r in rows]

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None:
        row = self._one(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE team = %s AND session_id = %s",
            (team, session_id),
        )
        return _session(row) if row else None

    def put_session(self, session: Session) -> None:
        s = session
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _SESSION_COLS.split(", ")[2:])
        self._exec(
            f"INSERT INTO sessions ({_SESSION_COLS}) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            f"ON CONFLICT (team, session_id) DO UPDATE SET {updates}",
            (s.team, s.session_id, s.member, s.state.value, s.created_at, s.updated_at, s.turn,
             s.turn_started_at, s.turn_kind, s.last_output, s.last_stop_at, _dump(s.meta)),
        )  # fmt: skip

    def list_sessions(self, team: str, member: str | None = None) -> list[Session]:
        rows = self._all(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE team = %s "
            "AND (%s::text IS NULL OR member = %s) ORDER BY created_at, session_id",
            (team, member, member),
        )
        return [_session(r) for r in rows]

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None:
        row = self._one(
            f"SELECT {_MSG_COLS} FROM messages m WHERE m.team = %s AND m.message_id = %s",
            (team, message_id),
        )
        return _message(row) if row else None

    def insert_message(self, message: Message, recipients: Sequence[Recipient]) -> list[Delivery]:
        m = message
        if recipients:
            self._lock_teams([m.team])  # seq numbers grow in commit order within the team
        rows = self._all(
            "WITH msg AS (INSERT INTO messages (team, message_id, sender, sender_session, "
            "to_name, kind, text, summary, created_at, fingerprint, meta) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING team, message_id), "
            "dl AS (INSERT INTO deliveries (team, message_id, member, session, seq, state, "
            "attempts, created_at, updated_at) SELECT msg.team, msg.message_id, r.b, r.s, "
            "nextval('delivery_seq'), 'queued', 0, %s, %s FROM msg, "
            "unnest(%s::text[], %s::text[]) WITH ORDINALITY AS r(b, s, o) ORDER BY r.o "
            "RETURNING member, seq) "
            "SELECT NULL, NULL FROM msg UNION ALL SELECT member, seq FROM dl",
            (m.team, m.message_id, m.sender, m.sender_session, m.to, m.kind.value, m.text,
             m.summary, m.created_at, m.fingerprint, _dump(m.meta), m.created_at, m.created_at,
             [r.member for r in recipients], [r.session for r in recipients]),
        )  # fmt: skip
        if not rows:
            raise AlreadyExists(f"message {m.message_id!r} already exists")
        seqs = {member: seq for member, seq in rows if member is not None}
        out = []
        for r in recipients:
            out.append(Delivery(m.team, m.message_id, r, seqs[r.member], DeliveryState.QUEUED,
                                0, m.created_at, m.created_at))  # fmt: skip
            self._event(m.team, DeliveryEvent(m.message_id, r.member, m.created_at, "queued"))
            self._wake(m.team, r.member)
        return out

    def lease(
        self,
        team: str,
        member: str,
        session: str | None,
        now: float,
        lease_until: float,
        limit: int,
    ) -> list[InboxMessage]:
        rows = self._all(
            "WITH picked AS (SELECT message_id FROM deliveries WHERE team = %s AND member = %s "
            "AND state = 'queued' AND (session IS NULL OR session = %s) "
            "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) "
            "UPDATE deliveries d SET state = 'leased', attempts = d.attempts + 1, "
            "lease_until = %s, updated_at = %s FROM picked p, messages m "
            "WHERE d.team = %s AND d.member = %s AND d.message_id = p.message_id "
            "AND m.team = d.team AND m.message_id = d.message_id "
            f"RETURNING d.seq, d.session, d.attempts, {_MSG_COLS}",
            (team, member, session, limit, lease_until, now, team, member),
        )
        rows.sort(key=lambda r: r[0])
        out = [InboxMessage(_message(r[3:]), Recipient(member, r[1]), r[2], r[0]) for r in rows]
        for im in out:
            ev = DeliveryEvent(
                im.message.message_id, member, now, "leased", f"attempt {im.attempt}"
            )
            self._event(team, ev)
        return out

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        lock = "" if self._readonly else " FOR UPDATE SKIP LOCKED"
        rows = self._all(
            f"SELECT {_DELIVERY_COLS} FROM deliveries WHERE state = 'leased' "
            f"AND lease_until <= %s ORDER BY seq LIMIT %s{lock}",
            (now, limit),
        )
        return [_delivery(r) for r in rows]

    def next_lease_expiry(self) -> float | None:
        row = self._one("SELECT min(lease_until) FROM deliveries WHERE state = 'leased'", ())
        return row[0] if row else None

    def transition(
        self,
        team: str,
        message_id: str,
        member: str,
        *,
        from_states: Sequence[DeliveryState],
        to_state: DeliveryState,
        now: float,
        event: str,
        detail: str = "",
        dead_reason: str | None = None,
    ) -> bool:
        keep_lease = "lease_until" if to_state is DeliveryState.LEASED else "NULL"
        row = self._one(
            f"UPDATE deliveries SET state = %s, updated_at = %s, lease_until = {keep_lease}, "
            "dead_reason = COALESCE(%s, dead_reason) WHERE team = %s AND message_id = %s "
            "AND member = %s AND state = ANY(%s::text[]) RETURNING 1",
            (to_state.value, now, dead_reason if to_state is DeliveryState.DEAD else None,
             team, message_id, member, [s.value for s in from_states]),
        )  # fmt: skip
        if row is None:
            return False
        self._event(team, DeliveryEvent(message_id, member, now, event, detail))
        if to_state is DeliveryState.QUEUED:
            self._wake(team, member)
        return True

    def ack(self, team: str, member: str, message_ids: Sequence[str], now: float) -> list[str]:
        ids = list(dict.fromkeys(message_ids))
        if not ids:
            return []
        rows = self._all(
            "WITH upd AS (UPDATE deliveries SET state = 'acked', lease_until = NULL, "
            "updated_at = %s WHERE team = %s AND member = %s AND message_id = ANY(%s::text[]) "
            "AND state IN ('leased', 'delivered') RETURNING message_id) "
            "SELECT message_id, true FROM upd UNION ALL SELECT message_id, false "
            "FROM deliveries WHERE team = %s AND member = %s AND message_id = ANY(%s::text[]) "
            "AND state = 'acked'",
            (now, team, member, ids, team, member, ids),
        )
        fresh = {mid for mid, new in rows if new}
        done = {mid for mid, _ in rows}
        for mid in ids:
            if mid in fresh:
                self._event(team, DeliveryEvent(mid, member, now, "acked"))
        return [mid for mid in ids if mid in done]

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        rows = self._all(
            f"SELECT {_DELIVERY_COLS} FROM deliveries WHERE team = %s AND message_id = %s "
            "ORDER BY member",
            (team, message_id),
        )
        return [_delivery(r) for r in rows]

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        self._flush()
        rows = self._all(
            "SELECT message_id, member, at, event, detail FROM delivery_events "
            "WHERE team = %s AND message_id = %s ORDER BY id",
            (team, message_id),
        )
        return [DeliveryEvent(*r) for r in rows]

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        self._flush()
        rows = self._all(
            "SELECT id, message_id, member, at, event, detail FROM delivery_events "
            "WHERE team = %s AND id > %s ORDER BY id LIMIT %s",
            (team, after, limit),
        )
        return [(r[0], DeliveryEvent(*r[1:])) for r in rows]

    def pending_count(self, team: str, member: str) -> int:
        row = self._one(
            "SELECT count(*) FROM deliveries WHERE team = %s AND member = %s "
            "AND state IN ('queued', 'leased')",
            (team, member),
        )
        return int(row[0])


class PostgresStore(Store):
    """The many-hosts store; see the module docstring for how it keeps the contract.

    ``url`` is a libpq URL (``postgresql://user:pass@host:5432/db``) or ``key=value``
    string. ``pool_size`` bounds connections *and* concurrent transactions of this hub;
    the listener uses one more connection. ``connect_timeout`` bounds how long open()
    and a transaction wait for a connection before raising ``StoreError``.
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        connect_timeout: float = 10.0,
        fallback_interval: float = 2.0,
    ) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self._dsn = url
        self.url = mask_url(url)
        self._secret = _password(url)
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._fallback = fallback_interval
        self._origin = secrets.token_hex(6)
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._listener: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        #: Transaction attempts re-run after a serialization failure, deadlock or lost
        #: connection (a health signal: it grows with contention).
        self.retries = 0

    # -- errors ------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _error(self, exc: BaseException, what: str = "failed") -> StoreError:
        detail = self._scrub(str(exc).strip().replace("\n", " "))
        return StoreError(
            f"PostgreSQL store {self.url} {what}: {detail}; retry shortly", store=self.url
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

    def _connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self._dsn, connect_timeout=max(1, round(self._connect_timeout)), **kwargs
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to PostgreSQL at {self.url}: "
                f"{self._scrub(str(exc).strip())}. Check that the server is running and "
                "that the URL, user and password are right",
                store=self.url,
            ) from exc

    def _open_sync(self) -> ConnectionPool[psycopg.Connection[Any]]:
        with self._connect(autocommit=True) as conn:
            try:
                self._migrate(conn)
            except psycopg.Error as exc:
                raise self._error(exc, "could not be migrated") from exc
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self._dsn,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, round(self._connect_timeout)),
                "application_name": "backchannel",
            },
            min_size=1,
            max_size=self._pool_size,
            open=False,
            timeout=self._connect_timeout,
            name=f"backchannel-{self._origin}",
        )
        try:
            pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            pool.close()
            raise StoreError(f"cannot connect to PostgreSQL at {self.url}: {exc}") from exc
        return pool

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
            current = int(row[0]) if row and row[0] is not None else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"the PostgreSQL database {self.url} has schema version {current}, but "
                    f"this backchannel supports up to version {SCHEMA_VERSION}: upgrade "
                    "backchannel on this host to the version the other hubs run (or point it "
                    "at another database)",
                    store=self.url,
                    database_version=current,
                    supported_version=SCHEMA_VERSION,
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                log.info("migrating %s to schema version %d", self.url, version)
                conn.execute(MIGRATIONS[version - 1].encode())
                conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))

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
    async def transact(self, fn: Callable[[Tx], T]) -> T:
        return await self._submit(fn, readonly=False)

    async def read(self, fn: Callable[[Tx], T]) -> T:
        return await self._submit(fn, readonly=True)

    async def _submit(self, fn: Callable[[Tx], T], *, readonly: bool) -> T:
        executor = self._executor
        if executor is None:
            raise StoreError(f"the PostgreSQL store {self.url} is not open")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self._run, fn, readonly)

    def _run(self, fn: Callable[[Tx], T], readonly: bool) -> T:
        pool = self._pool
        if pool is None:
            raise StoreError(f"the PostgreSQL store {self.url} is closed")
        begin = (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            if readonly
            else "BEGIN ISOLATION LEVEL SERIALIZABLE"
        )
        lost = 0
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with pool.connection() as conn:
                    tx = PgTx(conn, self, readonly)
                    outcome = self._attempt(conn, tx, fn, begin)
            except (PoolTimeout, PoolClosed) as exc:
                raise self._error(exc, "has no connection available") from exc
            if outcome is not None:
                return outcome[0]
            self.retries += 1
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

    def _attempt(
        self, conn: psycopg.Connection[Any], tx: PgTx, fn: Callable[[Tx], T], begin: str
    ) -> tuple[T] | None:
        """One try: ``(result,)`` on commit, ``None`` if it must be re-run, else raises."""
        try:
            tx._exec(begin)
            result = fn(tx)
            if not tx.retry and not tx.broken:
                tx._flush()
        except BaseException as exc:
            self._rollback(conn)
            if tx.retry or (tx.broken and isinstance(exc, StoreError)):
                return None
            raise
        if tx.retry or tx.broken:  # fn swallowed the error; the attempt is void
            self._rollback(conn)
            return None
        try:
            conn.execute("COMMIT")
        except (pgerr.SerializationFailure, pgerr.DeadlockDetected):
            self._rollback(conn)
            return None
        except psycopg.Error as exc:
            self._rollback(conn)
            raise self._error(exc, "lost the connection while committing (the transaction "
                              "may or may not have been applied)") from exc  # fmt: skip
        return (result,)

    @staticmethod
    def _rollback(conn: psycopg.Connection[Any]) -> None:
        if conn.closed or conn.broken:
            return
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")

    # -- listener ------------------------------------------------------------
    def _post(self, team: str | None, member: str | None) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._emit_change, team, member)

    def _listen(self) -> None:
        """Background thread: LISTEN, report others' notifications, reconnect, fall back."""
        backoff = 0.1
        next_fallback = time.monotonic() + self._fallback
        own = self._origin + ":"
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=5, application_name=LISTENER_NAME
                )
            except psycopg.Error as exc:
                log.warning("LISTEN connection to %s failed: %s", self.url, self._scrub(str(exc)))
                self._post(None, None)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._fallback or 2.0)
                continue
            backoff = 0.1
            try:
                with conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._post(None, None)  # anything may have happened while deaf
                    while not self._stop.is_set():
                        seen: dict[str, None] = {}
                        for n in conn.notifies(timeout=0.2):
                            if not n.payload.startswith(own):
                                seen[n.payload.partition(":")[2]] = None
                        for key in seen:
                            team, _, member = key.partition("/")
                            self._post(team or None, member or None)
                        if self._fallback and time.monotonic() >= next_fallback:
                            next_fallback = time.monotonic() + self._fallback
                            self._post(None, None)
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    log.warning("LISTEN connection to %s lost: %s", self.url, self._scrub(str(exc)))
                    self._post(None, None)
