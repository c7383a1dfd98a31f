"""One PostgreSQL transaction on a pooled connection, as :class:`PgTx` runs it.

Writers run at ``READ COMMITTED`` and take the team's lock (``pg_advisory_xact_lock``) in
the same round trip as their first statement about that team; every statement after it
reads fresh data that no other writer can change until this transaction ends (see
:mod:`backchannel.stores.postgres.store`). History events are buffered and written in
the ``COMMIT`` round trip, writes nobody reads the answer of go with the next
statement, and wake-ups for other hubs follow the ``COMMIT`` in its round trip. Driver errors
become :mod:`backchannel.errors` here.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg import pq

from backchannel.errors import AlreadyExists, BackchannelError, InvalidRequest, StoreError
from backchannel.types import DeliveryEvent

__all__ = ["CHANNEL", "PgTransaction", "RetryTransaction"]

Cursor = psycopg.Cursor[Any]

#: The LISTEN/NOTIFY channel; payloads are ``"<origin>:<team>/<member>"``.
CHANNEL = "backchannel"
#: the wake-ups, one a payload
_NOTIFY = "SELECT pg_notify(%s, %s || p) FROM unnest(%s::text[]) AS p"
_BEGIN_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
#: SQLSTATEs (prefixes) of errors after which the server closes the session: connection
#: exceptions, operator intervention (57P01-57P05), idle_in_transaction_session_timeout
_SESSION_ENDED = ("08", "57P", "25P03")


#: the rows a transaction remembers (:attr:`PgTransaction._rows`, keyed by kind) that
#: a write to each table may change; a write to any other table (jobs, a session's
#: transcript, deliveries, history) changes none of them
_REMEMBERED: dict[str, frozenset[str]] = {
    "teams": frozenset("t"),
    "messages": frozenset("g"),
    "members": frozenset("m"),
    "sessions": frozenset("sav"),  # a session; a member's active and live ones
    "budgets": frozenset("b"),
    "links": frozenset("lko"),  # by pair, by id, a member's open ones
    "ledger": frozenset("L"),
    "delegations": frozenset("dB"),  # a callee session's, a caller turn's
}
_EVERY_KIND = frozenset().union(*_REMEMBERED.values())
_WRITES_TO = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)")


@functools.lru_cache(maxsize=512)
def _changes(sql: str) -> frozenset[str]:
    """The kinds of remembered rows ``sql`` may change: none for a ``SELECT`` (a
    ``SELECT`` that writes, as through a function, is not one the stores make), those of
    every table it writes to (in a ``WITH`` too), all of them for any other statement."""
    if sql.startswith("SELECT"):
        return frozenset()
    tables = _WRITES_TO.findall(sql)
    if not tables:
        return _EVERY_KIND
    return frozenset().union(*(_REMEMBERED.get(t, frozenset()) for t in tables))


def _lock_key(team: str) -> int:
    digest = hashlib.blake2b(f"backchannel:team:{team}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class RetryTransaction(StoreError):
    """A serialization failure or deadlock: the store re-runs the transaction function."""


class PgTransaction:
    """The plumbing under :class:`~backchannel.stores.postgres.tx.PgTx`: statements with
    the team lock taken first, row claims across teams, the history buffer, ``COMMIT``
    and the wake-ups after it."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        *,
        readonly: bool,
        origin: str,
        error: Callable[[psycopg.Error], StoreError],
    ) -> None:
        self._conn = conn
        self._readonly = readonly
        self._origin = origin  # this store's tag in NOTIFY payloads
        self._error = error  # driver error -> StoreError naming the (masked) URL
        self._locked: set[str] = set()
        self._events: list[tuple[str, DeliveryEvent]] = []
        self._notify: dict[str, None] = {}
        self._open = False  # BEGIN sent, COMMIT not yet done
        self._job_team: dict[int, str] = {}  # jobs seen in this transaction
        # pending jobs watching a sender, by (team, sender), as the insert of that
        # sender's message found them (``PgTx.watching`` answers from it)
        self._watch_ids: dict[tuple[str, str], list[int]] = {}
        # rows read in this transaction after its team's lock, by (kind, team, key):
        # what ``prefetch`` fetched in one round trip and the reads of a send answered
        # again; any write here drops them all (``_exec_all``), a retry starts afresh
        self._rows: dict[tuple[str, str, Any], Any] = {}
        # writes whose answer nobody reads, kept for the ``COMMIT`` round trip by key
        # (the last write of a key is its row: a budget counted twice is one upsert)
        self._later: dict[tuple[str, ...], tuple[str, Sequence[Any]]] = {}
        # writes whose answer nobody reads, sent ahead of the next statement in its
        # round trip (or in the ``COMMIT``'s), in the order they were made
        self._ahead: list[tuple[str, Sequence[Any]]] = []
        self._tainted = False  # a pipeline failed: psycopg may wrongly think a statement
        #                        is prepared, so the connection is closed afterwards
        self.retry = False  # the database asked for a re-run (deadlock)
        self.broken = False  # the connection was lost
        self.undefined = False  # a statement named a table or column the database lacks

    def _exec(
        self, sql: str, args: Sequence[Any] = (), team: str | None = None, *, keep: bool = False
    ) -> Cursor:
        return self._exec_all(((sql, args),), team, keep=keep)[0]

    def _exec_all(
        self,
        statements: Sequence[tuple[str, Sequence[Any]]],
        team: str | None = None,
        *,
        keep: bool = False,
    ) -> list[Cursor]:
        """Run ``statements`` in order, in one round trip (a pipeline) when there are
        several, or when the transaction must begin or take ``team``'s lock first (the
        lock is granted before any of them runs). A statement that may write one of
        the tables whose rows this transaction remembers (:attr:`_rows`) drops them,
        unless ``keep`` says it writes none of them (:func:`_changes`)."""
        conn = self._conn
        first: list[tuple[str, Sequence[Any]]] = []
        if not self._open:
            first.append((_BEGIN_READ if self._readonly else _BEGIN_WRITE, ()))
        if team is not None and team not in self._locked and not self._readonly:
            first.append(("SELECT pg_advisory_xact_lock(%s)", (_lock_key(team),)))
            self._locked.add(team)
        if self._ahead:  # the writes made before, in order, then these statements
            first += self._ahead
            self._ahead = []
        if self._rows and not keep:
            self._forget(statements)
        try:
            if not first and len(statements) == 1:
                sql, args = statements[0]
                return [conn.execute(sql, args)]
            self._open = self._tainted = True
            with conn.pipeline():
                for s, a in first:
                    conn.execute(s, a)
                curs = [conn.execute(sql, args) for sql, args in statements]
            self._tainted = False
            return curs
        except psycopg.Error as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: psycopg.Error) -> BackchannelError:
        if isinstance(exc, pgerr.SerializationFailure | pgerr.DeadlockDetected):
            self.retry = True
            return RetryTransaction(f"PostgreSQL asked to retry: {exc.sqlstate}")
        if isinstance(exc, pgerr.UndefinedTable | pgerr.UndefinedColumn):
            self.undefined = True
        if isinstance(exc, pgerr.UniqueViolation):
            return AlreadyExists(f"duplicate key: {exc.diag.message_detail or exc}")
        if isinstance(exc, pgerr.UntranslatableCharacter) or (
            isinstance(exc, psycopg.DataError) and "NUL" in str(exc)
        ):
            return InvalidRequest("text contains a NUL character (\\x00), which cannot be stored")
        # lost: the connection is gone, the server is ending the session (a terminated
        # backend, a shutdown, an idle-session timeout: the connection closes next), or the
        # driver failed with no word from the server. Any other error the server answers
        # on a live connection (a statement_timeout or lock_timeout, a full disk: psycopg
        # calls those OperationalError too) is not a lost connection, and re-running the
        # transaction on a fresh one would only meet it again
        state = exc.sqlstate or ""
        if (
            self._conn.broken
            or state.startswith(_SESSION_ENDED)
            or (isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and not state)
        ):
            self.broken = True
        return self._error(exc)

    def _behind(self, sql: str, args: Sequence[Any], team: str) -> None:
        """A write whose answer nobody reads (no row count, no row back, no error a
        caller handles): sent ahead of the next statement, in its round trip, or in the
        ``COMMIT``'s. PostgreSQL runs a pipeline's statements in order, so every later
        statement sees it; its error, if any, is raised by that statement. Sent now when
        the transaction has not yet begun or taken ``team``'s lock (the lock comes first)."""
        if not self._open or team not in self._locked:
            self._exec(sql, args, team)
            return
        self._forget(((sql, args),))
        self._ahead.append((sql, args))

    def _forget(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        """Drop the remembered rows ``statements`` may change (:func:`_changes`)."""
        kinds = frozenset().union(*(_changes(sql) for sql, _ in statements))
        if kinds == _EVERY_KIND:
            self._rows.clear()
        elif kinds:
            for key in [k for k in self._rows if k[0] in kinds]:
                del self._rows[key]

    def _one(self, sql: str, args: Sequence[Any], team: str | None = None) -> Any:
        return self._exec(sql, args, team).fetchone()

    def _all(
        self, sql: str, args: Sequence[Any], team: str | None = None, *, keep: bool = False
    ) -> list[Any]:
        return self._exec(sql, args, team, keep=keep).fetchall()

    def _lock_teams(self, teams: Iterable[str]) -> None:
        """Lock several teams at once, in sorted order (no deadlock between such calls)."""
        todo = sorted(set(teams) - self._locked)
        if todo and not self._readonly:
            self._exec(
                "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY "
                "AS u(k, o) ORDER BY o",
                ([_lock_key(t) for t in todo],),
            )
            self._locked.update(todo)

    def _claim(self, cols: str, table: str, where: str, order: str, args: Sequence[Any],
               limit: int) -> list[Any]:  # fmt: skip
        """Rows due across teams: lock their teams first (sorted), then the rows (``FOR
        UPDATE SKIP LOCKED``), so locks are always taken team first, row second."""
        sql = f"SELECT {cols} FROM {table} WHERE {where}"
        if self._readonly:
            return self._all(f"{sql} ORDER BY {order} LIMIT %s", (*args, limit))
        teams = self._all(
            f"SELECT DISTINCT team FROM (SELECT team FROM {table} WHERE {where} "
            f"ORDER BY {order} LIMIT %s) AS due",
            (*args, limit),
        )
        if not teams:
            return []
        self._lock_teams(r[0] for r in teams)
        return self._all(
            f"{sql} AND team = ANY(%s) ORDER BY {order} LIMIT %s FOR UPDATE SKIP LOCKED",
            (*args, sorted(self._locked), limit),
        )

    def _pending(self) -> list[tuple[str, Sequence[Any]]]:
        """Statements writing the buffered history events and the writes kept for the
        commit (empties both buffers)."""
        out: list[tuple[str, Sequence[Any]]] = [*self._ahead, *self._later.values()]
        self._ahead, self._later = [], {}
        if self._events:
            cols: list[list[Any]] = [[], [], [], [], [], []]
            for team, e in self._events:
                for col, v in zip(cols, (team, e.message_id, e.member, e.at, e.event, e.detail)):  # noqa: B905
                    col.append(v)
            out.append((
                "INSERT INTO delivery_events (team, id, message_id, member, at, event, detail) "
                "SELECT t, nextval('delivery_event_id'), m, b, a, e, d FROM unnest(%s::text[], "
                "%s::text[], %s::text[], %s::float8[], %s::text[], %s::text[]) "
                "WITH ORDINALITY AS u(t, m, b, a, e, d, o) ORDER BY o", cols))  # fmt: skip
        self._events = []
        return out

    def _flush(self) -> None:
        if pending := self._pending():
            self._exec_all(pending, keep=True)

    def _commit(self) -> None:
        """Buffered writes, ``COMMIT`` and the wake-ups of the other hubs in one round
        trip. The ``NOTIFY`` follows the ``COMMIT`` in the pipeline, so it runs in a
        transaction of its own (the implicit one that ends at the pipeline's sync):
        PostgreSQL serializes the commits of notifying transactions cluster-wide, and a
        notification-only transaction writes no WAL, so a send's WAL flush is never
        taken under that lock. A notification that fails (the connection lost after
        the commit, the server's notification queue full) is not the send's error: the
        data is committed and the wake-up is only a hint (the fallback timer wakes
        waiters anyway)."""
        if not self._open:
            return
        conn = self._conn
        payloads, self._notify = list(self._notify), {}
        self._tainted = True
        commit: Cursor | None = None
        try:
            with conn.pipeline():
                for sql, args in self._pending():
                    conn.execute(sql, args)
                commit = conn.execute("COMMIT")
                if payloads:
                    conn.execute(_NOTIFY, (CHANNEL, self._origin + ":", payloads))
        except psycopg.Error as exc:
            done = commit is not None and commit.pgresult is not None
            if not (done and commit.pgresult.status == pq.ExecStatus.COMMAND_OK):  # type: ignore[union-attr]
                raise self._translate(exc) from exc
            # committed; the wake-up was lost. The pipeline failed, so psycopg may be
            # wrong about what it prepared: the pool gets a fresh connection
            conn.close()
        self._open = self._tainted = False

    def _cleanup(self) -> None:
        """Roll back an unfinished transaction; a connection that cannot is closed (the
        pool replaces it; the server drops its locks)."""
        conn = self._conn
        if not self._open or conn.closed:
            return
        try:
            if conn.broken or self._tainted:
                raise psycopg.OperationalError("connection broken or tainted")
            conn.execute("ROLLBACK")
            self._open = False
        except psycopg.Error:
            conn.close()

    def _wake(self, team: str, member: str) -> None:
        self._notify[f"{team}/{member}"] = None

    def _event(self, team: str, ev: DeliveryEvent) -> None:
        self._events.append((team, ev))

    def _insert(self, sql: str, args: Sequence[Any], what: str, team: str) -> None:
        row = self._one(sql + " ON CONFLICT DO NOTHING RETURNING 1", args, team)
        if row is None:
            raise AlreadyExists(f"{what} already exists")
