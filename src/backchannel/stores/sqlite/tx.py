"""The SQL side of :class:`backchannel.stores.sqlite.SqliteStore`: :class:`SqliteTx`, the
:class:`~backchannel.stores.base.Tx` it hands to transaction functions. See
:mod:`backchannel.stores.sqlite.store` for the guarantees and
:mod:`backchannel.stores.sqlite.schema` for the tables; the statements and row mappers
it shares with PostgreSQL are in :mod:`backchannel.stores.sql`."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import astuple, replace
from typing import Any

from backchannel.errors import AlreadyExists
from backchannel.stores.base import COMPACT_START, BudgetNeed, CompactCursor, Reads, SessionFilter
from backchannel.stores.sql import (
    CLOSED_LINKS_COUNT,
    LATEST_CLOSED_LINKS,
    LATEST_SESSIONS,
    SESSION_COUNTS,
    budgets_for_human_query,
    budgets_query,
    delegation_counts,
    delegation_counts_query,
    delegations_by_state_query,
    delegations_query,
    jobs_query,
    links_query,
    members_query,
    sessions_query,
    teams_query,
    timers_query,
)
from backchannel.stores.sql.inbox import activity_rows
from backchannel.stores.sql.lifecycle import LifecycleSql
from backchannel.stores.sql.rows import (
    BUDGET_COLS,
    DEL_COLS,
    DELIVERY_COLS,
    LINK_COLS,
    MEMBER_COLS,
    MSG_COLS,
    SESSION_COLS,
    TEAM_COLS,
    delegation,
    delegation_args,
    delivery,
    rows,
)
from backchannel.stores.sql.statements import Sql
from backchannel.types import (
    A2AClaim,
    A2ATask,
    Budget,
    Delegation,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxEntry,
    InboxMessage,
    Job,
    JobState,
    Lease,
    LedgerEntry,
    Link,
    Member,
    MemberActivity,
    Message,
    Recipient,
    Session,
    SessionEvent,
    Team,
)

__all__ = ["SqliteTx"]


def _loads(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text and text != "{}" else {}


def _dumps(value: Any) -> str:
    return json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False) if value else "{}"


def _dumps_list(value: list[Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


# JSON travels as text; built once, the mappers are plain functions
_ROWS = rows(_loads, json.loads, _dumps, _dumps_list)
_message = _ROWS.message
_member = _ROWS.member
_session = _ROWS.session
_link = _ROWS.link
_job = _ROWS.job
_event = _ROWS.event
Q = Sql(str, job_id="id", event_id="id")

_INSERT_MESSAGE = (
    "INSERT INTO messages (team, message_id, sender, sender_session, to_name, kind, "
    "text, summary, created_at, fingerprint, meta, chain_id, hop) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_DELIVERY = (
    "INSERT INTO deliveries (team, message_id, member, session, state, attempts, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, 'queued', 0, ?, ?)"
)

#: ``UPDATE … RETURNING`` (SQLite 3.35, 2021); older libraries read the states first
RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

_INSERT_EVENTS = (
    "INSERT INTO delivery_events (team, message_id, member, at, event, detail) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
#: a reaction, unless it is there (``delivery_events_reaction``, migration 15)
_ADD_REACTION = (
    "INSERT OR IGNORE INTO delivery_events (team, message_id, member, at, event, detail) "
    "VALUES (?, ?, ?, ?, 'reaction', ?)"
)
_LEASE = (
    f"SELECT d.seq, d.session, d.attempts, {MSG_COLS} FROM deliveries d "
    "JOIN messages m ON m.team = d.team AND m.message_id = d.message_id "
    "WHERE d.team = ? AND d.member = ? AND d.state = 'queued' "
    "AND ((d.session IS NULL AND ?) OR d.session = ?) ORDER BY d.seq LIMIT ?"
)
_MARK_LEASED = (
    "UPDATE deliveries SET state = 'leased', attempts = attempts + 1, lease_until = ?, "
    "updated_at = ?, lease_holder = ? WHERE seq = ?"
)
#: the copies still leased to a named receive (``deliveries_holder``), in send order
_HELD = (
    f"SELECT d.seq, d.session, d.attempts, d.updated_at, d.lease_until, {MSG_COLS} "
    "FROM deliveries d "
    "JOIN messages m ON m.team = d.team AND m.message_id = d.message_id "
    "WHERE d.team = ? AND d.member = ? AND d.state = 'leased' AND d.lease_holder = ? "
    "AND d.lease_until > ? AND (d.updated_at > ? OR (d.updated_at = ? AND d.seq > ?)) "
    "ORDER BY d.updated_at, d.seq LIMIT ?"
)
_EXPIRED_LEASES = (
    f"SELECT {DELIVERY_COLS} FROM deliveries WHERE state = 'leased' AND lease_until <= ? "
    "ORDER BY lease_until, seq LIMIT ?"
)
_GIVEN_AFTER = (
    f"SELECT {DELIVERY_COLS} FROM deliveries WHERE state = 'leased' AND updated_at > ? "
    "AND updated_at < ? ORDER BY lease_until, seq LIMIT ?"
)
_RESTART_LEASE = (
    "UPDATE deliveries SET lease_until = ? + lease_until - updated_at, updated_at = ? WHERE seq = ?"
)
_DUE_JOBS = (
    f"SELECT {Q.job_cols} FROM jobs WHERE state = 'pending' AND due_at <= ? "
    "ORDER BY due_at, id LIMIT ?"
)
#: a job by its request id (``jobs_request``, an index on the same expression)
_JOB_BY_REQUEST = (
    f"SELECT {Q.job_cols} FROM jobs WHERE team = ? AND session_id = ? AND kind = ? "
    "AND json_extract(payload, '$.request_id') = ? ORDER BY id LIMIT 1"
)
#: the attempts a kind's pending jobs made, summed in the store (jobs_kind_pending)
_JOB_ATTEMPTS = (
    "SELECT coalesce(sum(json_extract(payload, '$.attempt')), 0) FROM jobs "
    "WHERE team = ? AND kind = ? AND state = 'pending'"
)
#: the member a timer's payload names, as ``jobs_timers_member`` indexes it
_TIMER_MEMBER = "json_extract(payload, '$.member')"
#: a team's pending watching jobs, in ``jobs_watch``'s order: by watch, then id
_WATCHING = (
    f"SELECT {Q.job_cols} FROM jobs WHERE team = ? AND watch IS NOT NULL AND state = 'pending'"
)
_UNTIL_NONE = 2**62  # list_events with no upper bound
#: Rows a cache of the writer's connection may hold before it starts over (each is a
#: few hundred bytes; a hub with many members and pairs stays bounded)
_CACHE_ROWS = 20_000


class SqliteTx(LifecycleSql):
    """:class:`Tx` over one sqlite3 connection, inside a transaction the store opened."""

    _TIMER_MEMBER_OF = _TIMER_MEMBER

    def _lifecycle_exec(self, sql: str, args: Sequence[Any], team: str) -> Any:
        if not sql.startswith("SELECT"):  # removal and credentials: rare, drop it all
            self.flush()
            self._drop_cached()
        return self._c.execute(sql, args)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn
        # Rows every send reads, as read (or written) on this connection: the team, the
        # sender and recipient, the pair's and the chain's budgets, the sender's active
        # sessions and the pair's open link. Dropped by the writes here that could
        # change them, by the store after a rollback, and when another connection
        # committed since (``begin_write``); a reader drops them per job.
        self._teams: dict[str, Team | None] = {}
        self._members: dict[tuple[str, str], Member | None] = {}
        self._budgets: dict[tuple[str, str], Budget | None] = {}
        self._active: dict[tuple[str, str], dict[tuple[str, int | None], list[Session]]] = {}
        self._open_links: dict[tuple[str, str], Link | None] = {}
        # each team's pending jobs that watch a sender, by sender (asked on every send)
        self._watching: dict[str, dict[str, list[Job]]] = {}
        self._data_version = -1
        # delivery history written by this transaction and not yet sent to SQLite: one
        # ``executemany`` at the end (``flush``) instead of a statement per event
        self._history: list[tuple[str, str, str, float, str, str]] = []
        # budget rows written by this transaction and not yet sent, by key (the last
        # write of a key is its row: a pair counted by fifty sends is one upsert)
        self._budget_rows: dict[tuple[str, str], tuple[Any, ...]] = {}

    @property
    def _caches(self) -> tuple[dict[Any, Any], ...]:
        return (
            self._teams,
            self._members,
            self._budgets,
            self._active,
            self._open_links,
            self._watching,
        )

    def _drop_cached(self) -> None:
        for cache in self._caches:
            cache.clear()

    def forget(self) -> None:
        """Drop what was read and the history and budgets not yet written (a rollback,
        a new snapshot)."""
        self._drop_cached()
        self._history.clear()
        self._budget_rows.clear()

    def flush(self) -> None:
        """Write the delivery history and the budgets this transaction recorded; the
        store calls it before every commit (and before a savepoint is released), and
        the reads and deletes of ``delivery_events`` and ``budgets`` call it first."""
        if self._history:
            rows, self._history = self._history, []
            self._c.executemany(_INSERT_EVENTS, rows)
        self._write_budgets()

    def _write_budgets(self) -> None:
        if self._budget_rows:
            rows = list(self._budget_rows.values())
            self._budget_rows.clear()
            self._c.executemany(Q.put_budget, rows)

    def begin_write(self) -> None:
        """The write lock is taken (``BEGIN IMMEDIATE``): what was read stays good
        unless another connection committed since it was read (SQLite's
        ``data_version`` moves only for other connections' commits)."""
        version = self._c.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            self._data_version = version
            self.forget()
        elif max(map(len, self._caches)) > _CACHE_ROWS:  # a long-lived hub's bound
            self._drop_cached()

    prefetches = False

    def prefetch(self, reads: Reads) -> None:
        """Nothing to do: a statement is a function call here, not a round trip (and the
        rows a send reads are cached across transactions already)."""

    def _one(self, sql: str, args: Sequence[Any]) -> Any:
        return self._c.execute(sql, args).fetchone()

    def _insert(self, sql: str, args: Sequence[Any], what: str) -> None:
        try:
            self._c.execute(sql, args)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"{what} already exists") from exc

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None:
        try:
            return self._teams[name]
        except KeyError:
            pass
        row = self._one(Q.get_team, (name,))
        found = self._teams[name] = _ROWS.team(row) if row else None
        return found

    def insert_team(self, team: Team) -> None:
        self._drop_cached()
        self._insert(Q.insert_team, _ROWS.team_args(team), f"team {team.name!r}")

    def link_crossings(self, team: str) -> int:
        row = self._one("SELECT coalesce(sum(turns_used), 0) FROM links WHERE team = ?", (team,))
        return int(row[0]) if row else 0

    def list_teams(self, *, after: str | None = None, limit: int | None = None) -> list[Team]:
        sql, args = teams_query(TEAM_COLS, after, limit)
        return [_ROWS.team(r) for r in self._c.execute(sql, args)]

    def count_teams(self) -> int:
        row = self._one("SELECT count(*) FROM teams", ())
        return int(row[0]) if row else 0

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None:
        key = (team, name)
        try:
            return self._members[key]
        except KeyError:
            pass
        row = self._one(Q.get_member, key)
        found = self._members[key] = _member(row) if row else None
        return found

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        row = self._one(Q.member_by_token_hash, (token_hash,))
        return _member(row) if row else None

    def insert_member(self, member: Member) -> None:
        self._drop_cached()
        self._insert(
            Q.insert_member,
            _ROWS.member_args(member),
            f"member {member.name!r} in team {member.team!r}",
        )

    def update_member(self, member: Member) -> None:
        self._drop_cached()
        self._c.execute(
            Q.update_member,
            (_dumps(member.delivery), _dumps(member.settings), member.team, member.name),
        )

    def list_members(
        self, team: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Member]:
        if after is None and limit is None:
            return [_member(r) for r in self._c.execute(Q.list_members, (team,))]
        sql, args = members_query(MEMBER_COLS, team, after, limit)
        return [_member(r) for r in self._c.execute(sql, args)]

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None:
        row = self._one(Q.get_session, (team, session_id))
        return _session(row) if row else None

    def put_session(self, session: Session) -> None:
        self._active.pop((session.team, session.member), None)
        self._c.execute(Q.put_session, _ROWS.session_args(session))

    def list_sessions(
        self,
        team: str,
        member: str | None = None,
        *,
        which: SessionFilter = "all",
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        if member is None or which == "all" or after is not None:
            sql, args = sessions_query(SESSION_COLS, team, member, which, limit, after)
            return [_session(r) for r in self._c.execute(sql, args)]
        # "whose turn is this send?" (active) and "who takes this lease?" (live): asked
        # on every send and every lease by a member
        cached = self._active.setdefault((team, member), {})
        try:
            return list(cached[which, limit])
        except KeyError:
            pass
        sql, args = sessions_query(SESSION_COLS, team, member, which, limit)
        found = cached[which, limit] = [_session(r) for r in self._c.execute(sql, args)]
        return list(found)

    def session_counts(self, team: str) -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in self._c.execute(SESSION_COUNTS, (team,))}

    def latest_sessions(self, team: str, member: str, limit: int) -> list[Session]:
        sql = f"SELECT {SESSION_COLS}{LATEST_SESSIONS}"
        return [_session(r) for r in self._c.execute(sql, (team, member, limit))]

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None:
        row = self._one(Q.get_message, (team, message_id))
        return _message(row) if row else None

    def _events(self, team: str, events: Sequence[DeliveryEvent]) -> None:
        self._history.extend(
            (team, e.message_id, e.member, e.at, e.event, e.detail) for e in events
        )

    def insert_message(self, message: Message, recipients: Sequence[Recipient]) -> list[Delivery]:
        m = message
        self._insert(_INSERT_MESSAGE, _ROWS.message_args(m), f"message {m.message_id!r}")
        out = []
        for r in recipients:
            cur = self._c.execute(
                _INSERT_DELIVERY,
                (m.team, m.message_id, r.member, r.session, m.created_at, m.created_at),
            )
            seq = cur.lastrowid
            assert seq is not None
            out.append(
                Delivery(
                    team=m.team,
                    message_id=m.message_id,
                    recipient=r,
                    seq=seq,
                    state=DeliveryState.QUEUED,
                    attempts=0,
                    created_at=m.created_at,
                    updated_at=m.created_at,
                )
            )
        # history rows as the insert takes them (no DeliveryEvent a row: every send
        # writes one a recipient, and every lease and ack one a message)
        self._history.extend(
            (m.team, m.message_id, r.member, m.created_at, "queued", "") for r in recipients
        )
        return out

    def lease(
        self,
        team: str,
        member: str,
        session: str | None,
        now: float,
        lease_until: float,
        limit: int,
        include_unpinned: bool = True,
        holder: str | None = None,
    ) -> list[InboxMessage]:
        rows = self._c.execute(_LEASE, (team, member, include_unpinned, session, limit)).fetchall()
        if not rows:
            return []
        self._c.executemany(_MARK_LEASED, [(lease_until, now, holder, r[0]) for r in rows])
        out = [
            InboxMessage(
                _message(r[3:]), Recipient(member, r[1]), r[2] + 1, r[0], lease_until=lease_until
            )
            for r in rows
        ]
        self._history.extend(
            (team, im.message.message_id, member, now, "leased", f"attempt {im.attempt}")
            for im in out
        )
        return out

    def held(
        self,
        team: str,
        member: str,
        holder: str,
        now: float,
        after: tuple[float, int] | None = None,
        limit: int | None = None,
    ) -> list[InboxMessage]:
        at, seq = after if after is not None else (-1e300, -1)
        args = (team, member, holder, now, at, at, seq, -1 if limit is None else limit)
        rows = self._c.execute(_HELD, args).fetchall()
        return [
            InboxMessage(_message(r[5:]), Recipient(member, r[1]), r[2], r[0], r[3], r[4])
            for r in rows
        ]

    def held_again(
        self,
        team: str,
        member: str,
        holder: str,
        now: float,
        limit: int,
        after: tuple[float, int] | None = None,
    ) -> list[InboxMessage]:
        out = [
            replace(m, lease_until=math.nextafter(m.lease_until, math.inf))
            for m in self.held(team, member, holder, now, after, limit)
        ]
        if out:
            self._c.executemany(
                "UPDATE deliveries SET lease_until = ? WHERE seq = ?",
                [(m.lease_until, m.seq) for m in out],
            )
        return out

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        return [delivery(r) for r in self._c.execute(_EXPIRED_LEASES, (now, limit))]

    def next_lease_expiry(self) -> float | None:
        row = self._one(Q.next_lease_expiry, ())
        return row[0] if row else None

    def restart_leases(
        self, now: float, given_after: float, limit: int, given_before: float = 1e15
    ) -> list[Delivery]:
        found = [
            delivery(r) for r in self._c.execute(_GIVEN_AFTER, (given_after, given_before, limit))
        ]
        self._c.executemany(_RESTART_LEASE, [(now, now, d.seq) for d in found])
        return found

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
        refund: bool = False,
        lease: Lease | None = None,
    ) -> bool:
        marks = ",".join("?" * len(from_states))
        keep_lease = to_state is DeliveryState.LEASED
        attempts = "MAX(attempts - 1, 0)" if refund else "attempts"
        # with a lease named, only while the copy is still under it
        named = (
            " AND lease_holder IS ? AND attempts = ? AND lease_until = ?"
            if lease is not None
            else ""
        )
        cur = self._c.execute(
            f"UPDATE deliveries SET state = ?, updated_at = ?, attempts = {attempts}, "
            f"lease_until = {'lease_until' if keep_lease else 'NULL'}, "
            "dead_reason = COALESCE(?, dead_reason) "
            f"WHERE team = ? AND message_id = ? AND member = ? AND state IN ({marks}){named}",
            (
                to_state.value,
                now,
                dead_reason if to_state is DeliveryState.DEAD else None,
                team,
                message_id,
                member,
                *(s.value for s in from_states),
                *(() if lease is None else (lease.holder, lease.attempt, lease.until)),
            ),
        )
        if cur.rowcount == 0:
            return False
        self._events(team, [DeliveryEvent(message_id, member, now, event, detail)])
        return True

    def ack(self, team: str, member: str, message_ids: Sequence[str], now: float) -> list[str]:
        """Ack by chunks of 500 ids; copies already acked count as acked, once."""
        ids = list(dict.fromkeys(message_ids))
        if not ids:
            return []
        fresh: set[str] = set()
        done: set[str] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            changed, acked = (
                self._ack_returning(team, member, chunk, now)
                if RETURNING
                else self._ack_read_first(team, member, chunk, now)
            )
            fresh |= changed
            done |= acked
        if fresh:
            self._history.extend(
                (team, mid, member, now, "acked", "") for mid in ids if mid in fresh
            )
        done |= fresh
        return [mid for mid in ids if mid in done]

    def _ack_returning(
        self, team: str, member: str, chunk: list[str], now: float
    ) -> tuple[set[str], set[str]]:
        """One ``UPDATE … RETURNING``; the copies it did not change are looked up only
        when there are any. The ids it acked, and those acked before."""
        marks = ",".join("?" * len(chunk))
        changed = {
            r[0]
            for r in self._c.execute(
                "UPDATE deliveries SET state = 'acked', lease_until = NULL, updated_at = ? "
                f"WHERE team = ? AND member = ? AND message_id IN ({marks}) "
                "AND (state IN ('leased', 'delivered') OR (state = 'queued' AND attempts > 0)) "
                "RETURNING message_id",
                (now, team, member, *chunk),
            )
        }
        rest = [mid for mid in chunk if mid not in changed]
        if not rest:
            return changed, set()
        marks = ",".join("?" * len(rest))
        acked = {
            r[0]
            for r in self._c.execute(
                "SELECT message_id FROM deliveries WHERE team = ? AND member = ? "
                f"AND message_id IN ({marks}) AND state = 'acked'",
                (team, member, *rest),
            )
        }
        return changed, acked

    def _ack_read_first(
        self, team: str, member: str, chunk: list[str], now: float
    ) -> tuple[set[str], set[str]]:
        """The same for SQLite before 3.35 (no ``RETURNING``): the states, then an update."""
        marks = ",".join("?" * len(chunk))
        fresh: list[str] = []
        acked: set[str] = set()
        for mid, state, attempts in self._c.execute(
            f"SELECT message_id, state, attempts FROM deliveries WHERE team = ? AND member = ? "
            f"AND message_id IN ({marks})",
            (team, member, *chunk),
        ):
            if state == "acked":
                acked.add(mid)
            elif state in ("leased", "delivered") or (state == "queued" and attempts > 0):
                fresh.append(mid)
        if fresh:
            self._c.executemany(
                "UPDATE deliveries SET state = 'acked', lease_until = NULL, updated_at = ? "
                "WHERE team = ? AND message_id = ? AND member = ?",
                [(now, team, mid, member) for mid in fresh],
            )
        return set(fresh), acked

    def first_message_from(
        self, team: str, sender: str, recipient: str, since: float
    ) -> Message | None:
        row = self._one(
            f"SELECT {MSG_COLS} FROM messages m INDEXED BY messages_created JOIN deliveries d "
            "ON d.team = m.team AND d.message_id = m.message_id AND d.member = ? "
            "WHERE m.created_at >= ? AND m.team = ? AND m.sender = ? "
            "ORDER BY m.created_at LIMIT 1",
            (recipient, since, team, sender),
        )
        return _message(row) if row else None

    def unread_from(self, team: str, member: str, sender: str, limit: int) -> list[Message]:
        rows = self._c.execute(
            f"SELECT {MSG_COLS} FROM deliveries d INDEXED BY deliveries_queued JOIN messages m "
            "ON m.team = d.team AND m.message_id = d.message_id WHERE d.team = ? "
            "AND d.member = ? AND d.state = 'queued' AND m.sender = ? ORDER BY d.seq LIMIT ?",
            (team, member, sender, limit),
        )
        return [_message(r) for r in rows]

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        self._events(team, [event])

    def add_reaction(self, team: str, event: DeliveryEvent) -> bool:
        self.flush()  # the history before it keeps its place in the feed
        e = event
        cur = self._c.execute(_ADD_REACTION, (team, e.message_id, e.member, e.at, e.detail))
        return cur.rowcount == 1

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        return [delivery(r) for r in self._c.execute(Q.deliveries, (team, message_id))]

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        self.flush()
        return [DeliveryEvent(*r) for r in self._c.execute(Q.history, (team, message_id))]

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        self.flush()
        rows = self._c.execute(Q.feed, (team, after, limit))
        return [(r[0], DeliveryEvent(*r[1:])) for r in rows]

    def feed_removed(self, team: str) -> int:
        row = self._one("SELECT feed_removed FROM teams WHERE name = ?", (team,))
        return int(row[0]) if row else 0

    def feed_start(self, team: str, last: int) -> int:
        self.flush()
        row = self._one(Q.feed_start, (team, last))
        return int(row[0]) if row else 0

    def dead_letters(self, team: str, limit: int) -> tuple[list[Delivery], int]:
        found = [delivery(r) for r in self._c.execute(Q.dead_letters, (team, limit))]
        return found, int(self._one(Q.dead_count, (team,))[0])

    def pending_count(self, team: str, member: str) -> int:
        return int(self._one(Q.pending_count, (team, member))[0])

    def pending_counts(self, team: str) -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in self._c.execute(Q.pending_counts, (team,))}

    def compact(
        self, before: float, after: CompactCursor | None, limit: int
    ) -> tuple[int, CompactCursor | None]:
        self.flush()
        rows = self._c.execute(
            "SELECT team, message_id, created_at FROM messages WHERE created_at < ? "
            "AND (created_at, team, message_id) > (?, ?, ?) "
            "ORDER BY created_at, team, message_id LIMIT ?",
            (before, *(after or COMPACT_START), limit),
        ).fetchall()
        top = self._top_event_id()
        gone = []
        for team, message_id, _ in rows:
            live = self._one(
                "SELECT 1 FROM deliveries WHERE team = ? AND message_id = ? "
                "AND (state NOT IN ('acked', 'dead') OR updated_at >= ?) LIMIT 1",
                (team, message_id, before),
            )
            if live is None:
                gone.append((team, message_id))
        removed: dict[str, int] = {}
        for team, message_id in gone:
            row = self._one(
                "SELECT max(id) FROM delivery_events WHERE team = ? AND message_id = ?",
                (team, message_id),
            )
            if row and row[0] is not None:
                removed[team] = max(removed.get(team, 0), int(row[0]))
        self._c.executemany(
            "UPDATE teams SET feed_removed = max(feed_removed, ?) WHERE name = ?",
            [(top_id, team) for team, top_id in removed.items()],
        )
        for table in ("delivery_events", "deliveries", "messages"):
            self._c.executemany(f"DELETE FROM {table} WHERE team = ? AND message_id = ?", gone)
        self._keep_top_event_id(top)
        self._c.execute("DELETE FROM jobs WHERE state != 'pending' AND done_at < ?", (before,))
        return len(gone), ((rows[-1][2], *rows[-1][:2]) if len(rows) == limit else None)

    def delete_team(self, name: str) -> int:
        self.flush()
        top = self._top_event_id()
        n = super().delete_team(name)
        self._keep_top_event_id(top)
        return n

    # -- history ids are never given twice ------------------------------------
    def _top_event_id(self) -> int | None:
        row = self._one("SELECT max(id) FROM delivery_events", ())
        return row[0] if row else None

    def _keep_top_event_id(self, top: int | None) -> None:
        """After a deletion from ``delivery_events``: SQLite gives a new row the largest id
        in the table plus one, so once the rows with the largest ids are gone (retention
        took a message that waited long and was acked last) ids would be given again,
        below the cursor of a feed reader that saw them (``tail --after``, the
        dashboard), which would miss what comes next. A placeholder row (team ``''``,
        which no team is named; no query about a team or message sees it) keeps the
        largest id given so far; older placeholders go."""
        if top is None:
            return
        self._c.execute(
            "INSERT OR IGNORE INTO delivery_events (id, team, message_id, member, at, event) "
            "VALUES (?, '', '', '', 0, '')",
            (top,),
        )
        self._c.execute("DELETE FROM delivery_events WHERE team = '' AND id < ?", (top,))

    # -- push delivery ownership ---------------------------------------------
    def claim_dispatch(
        self, team: str, member: str, owner: str, now: float, lease_until: float
    ) -> bool:
        return (
            self._c.execute(Q.claim_dispatch, (team, member, owner, lease_until, now)).rowcount > 0
        )

    def release_dispatch(self, team: str, member: str, owner: str) -> bool:
        return self._c.execute(Q.release_dispatch, (team, member, owner)).rowcount > 0

    def dispatch_owner(self, team: str, member: str) -> tuple[str, float] | None:
        row = self._one(Q.dispatch_owner, (team, member))
        return (row[0], row[1]) if row else None

    # -- push circuits ---------------------------------------------------------
    def push_circuit(self, team: str, member: str) -> dict[str, Any] | None:
        row = self._one(Q.push_circuit, (team, member))
        return dict(json.loads(row[0])) if row else None

    def push_circuits(self) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self._c.execute(Q.push_circuits).fetchall()
        return [(r[0], r[1], dict(json.loads(r[2]))) for r in rows]

    def set_push_circuit(self, team: str, member: str, state: Mapping[str, Any] | None) -> None:
        if state is None:
            self._c.execute(Q.forget_push_circuit, (team, member))
        else:
            self._c.execute(Q.set_push_circuit, (team, member, json.dumps(dict(state))))

    def requeue_leased(self, team: str, member: str, now: float, detail: str) -> list[str]:
        # the WHERE repeats deliveries_open's condition word for word, so SQLite uses it
        ids = [
            r[0]
            for r in self._c.execute(
                "SELECT message_id FROM deliveries WHERE team = ? AND member = ? "
                "AND state IN ('queued', 'leased') AND state = 'leased' ORDER BY seq",
                (team, member),
            )
        ]
        if not ids:
            return []
        self._c.executemany(
            "UPDATE deliveries SET state = 'queued', lease_until = NULL, updated_at = ? "
            "WHERE team = ? AND message_id = ? AND member = ?",
            [(now, team, mid, member) for mid in ids],
        )
        self._events(team, [DeliveryEvent(mid, member, now, "released", detail) for mid in ids])
        return ids

    def unpin_session(
        self, team: str, member: str, session: str, now: float, detail: str
    ) -> list[str]:
        # the WHERE repeats deliveries_open's condition word for word, so SQLite uses it
        ids = [
            r[0]
            for r in self._c.execute(
                "SELECT message_id FROM deliveries WHERE team = ? AND member = ? "
                "AND state IN ('queued', 'leased') AND session = ? ORDER BY seq",
                (team, member, session),
            )
        ]
        if not ids:
            return []
        self._c.executemany(
            "UPDATE deliveries SET session = NULL, updated_at = ? "
            "WHERE team = ? AND message_id = ? AND member = ?",
            [(now, team, mid, member) for mid in ids],
        )
        self._events(team, [DeliveryEvent(mid, member, now, "unpinned", detail) for mid in ids])
        return ids

    def append_event(self, event: SessionEvent) -> int:
        e = event
        cur = self._c.execute(
            "INSERT INTO session_events (team, session_id, turn, at, kind, text, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (e.team, e.session_id, e.turn, e.at, e.kind.value, e.text, _dumps(e.data)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    note_event = append_event  # the same statement; its id goes unread

    def list_events(
        self, team: str, session_id: str, after: int, until: int | None, limit: int
    ) -> list[SessionEvent]:
        last = until if until is not None else _UNTIL_NONE
        return [
            _event(r)
            for r in self._c.execute(Q.list_events, (team, session_id, after, last, limit))
        ]

    # -- ledger --------------------------------------------------------------
    def ledger_add(self, entry: LedgerEntry) -> None:
        e = entry
        self._c.execute(Q.ledger_add, (e.team, e.session_id, e.to, e.digest, e.message_id, e.at))

    def ledger(self, team: str, session_id: str) -> list[LedgerEntry]:
        return [LedgerEntry(*r) for r in self._c.execute(Q.ledger, (team, session_id))]

    def ledger_clear(self, team: str, session_id: str) -> int:
        return self._c.execute(Q.ledger_clear, (team, session_id)).rowcount

    def ledger_forget(self, team: str, session_id: str) -> None:
        self._c.execute(Q.ledger_clear, (team, session_id))

    # -- links ---------------------------------------------------------------
    def insert_link(self, link: Link) -> Link:
        existing = self.find_open_link(link.team, link.initiator, link.responder)
        if existing is not None:
            return existing
        self._open_links.pop((link.team, link.pair), None)
        self._c.execute(Q.insert_link, (*_ROWS.link_args(link), link.pair))
        return link

    def get_link(self, team: str, link_id: str) -> Link | None:
        row = self._one(Q.get_link, (team, link_id))
        return _link(row) if row else None

    def find_open_link(self, team: str, member_a: str, member_b: str) -> Link | None:
        key = (team, "|".join(sorted((member_a, member_b))))
        try:
            return self._open_links[key]
        except KeyError:
            pass
        row = self._one(Q.find_open_link, key)
        found = self._open_links[key] = _link(row) if row else None
        return found

    def update_link(self, link: Link) -> None:
        self._open_links.pop((link.team, link.pair), None)
        args = _ROWS.link_args(link)
        self._c.execute(Q.update_link, (*args[2:], link.team, link.link_id))

    def list_links(
        self,
        team: str,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        sql, args = links_query(LINK_COLS, team, member, open_only, after, limit)
        return [_link(r) for r in self._c.execute(sql, args)]

    def latest_closed_links(self, team: str, limit: int) -> list[Link]:
        sql = f"SELECT {LINK_COLS}{LATEST_CLOSED_LINKS}"
        return [_link(r) for r in self._c.execute(sql, (team, limit))]

    def count_closed_links(self, team: str) -> int:
        row = self._one(CLOSED_LINKS_COUNT, (team, team))
        return int(row[0]) if row else 0

    # -- jobs ----------------------------------------------------------------
    def add_job(self, job: Job) -> int:
        j = job
        if j.watch is not None:
            self._watching.pop(j.team, None)
        cur = self._c.execute(
            Q.add_job,
            (j.team, j.kind, j.due_at, j.created_at, j.session_id, _dumps(j.payload), j.watch),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def get_job(self, team: str, job_id: int) -> Job | None:
        row = self._one(Q.get_job, (team, job_id))
        return _job(row) if row else None

    def due_jobs(self, now: float, limit: int) -> list[Job]:
        return [_job(r) for r in self._c.execute(_DUE_JOBS, (now, limit))]

    def job_by_request(self, team: str, session_id: str, kind: str, request_id: str) -> Job | None:
        row = self._one(_JOB_BY_REQUEST, (team, session_id, kind, request_id))
        return _job(row) if row else None

    def next_job_due(self) -> float | None:
        row = self._one(
            "SELECT due_at FROM jobs WHERE state = 'pending' ORDER BY due_at, id LIMIT 1", ()
        )
        return row[0] if row else None

    def last_job_id(self) -> int:
        row = self._one("SELECT max(id) FROM jobs", ())
        return int(row[0]) if row and row[0] is not None else 0

    def finish_job(self, job_id: int, state: JobState, at: float) -> bool:
        self._watching.clear()
        return self._c.execute(Q.finish_job, (state.value, at, job_id)).rowcount > 0

    def list_jobs(
        self,
        team: str,
        *,
        session_id: str | None = None,
        kind: str | None = None,
        pending_only: bool = True,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Job]:
        sql, args = jobs_query(
            Q.job_cols, "id", team, session_id, kind, pending_only, limit, offset
        )
        return [_job(r) for r in self._c.execute(sql, args)]

    def count_pending_jobs(self, team: str, kind: str) -> int:
        return int(self._one(Q.count_pending_jobs, (team, kind))[0])

    def pending_job_attempts(self, team: str, kind: str) -> int:
        return int(self._one(_JOB_ATTEMPTS, (team, kind))[0])

    def list_timers(
        self,
        team: str,
        *,
        member: str | None = None,
        session_id: str | None = None,
        pending_only: bool = True,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Job]:
        sql, args = timers_query(
            Q.job_cols, "id", _TIMER_MEMBER, team, member, session_id, pending_only, after, limit
        )
        return [_job(r) for r in self._c.execute(sql, args)]

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        self._watching.clear()
        return self._c.execute(Q.reschedule_job, (due_at, _dumps(payload), job_id)).rowcount > 0

    def watching(self, team: str, sender: str) -> list[Job]:
        by_sender = self._watching.get(team)
        if by_sender is None:
            by_sender = self._watching[team] = {}
            for r in self._c.execute(_WATCHING, (team,)):
                job = _job(r)
                by_sender.setdefault(job.watch or "", []).append(job)
        return list(by_sender.get(sender, ()))

    def end_watch(self, job_id: int, payload: Mapping[str, Any]) -> bool:
        self._watching.clear()
        return self._c.execute(Q.end_watch, (_dumps(payload), job_id)).rowcount > 0

    # -- delegation ------------------------------------------------------------
    def insert_delegation(self, d: Delegation) -> None:
        self._insert(Q.insert_delegation, delegation_args(d), f"delegation {d.delegation_id!r}")

    def get_delegation(self, team: str, delegation_id: str) -> Delegation | None:
        row = self._one(Q.get_delegation, (team, delegation_id))
        return delegation(row) if row else None

    def find_delegation(
        self,
        team: str,
        *,
        caller_session: str | None = None,
        tool_use_id: str | None = None,
        callee_session: str | None = None,
    ) -> Delegation | None:
        if callee_session is not None:
            row = self._one(Q.open_delegation_of_callee, (team, callee_session))
            if row is None:
                row = self._one(Q.delegation_of_callee, (team, callee_session))
        else:
            row = self._one(Q.delegation_of_call, (team, caller_session, tool_use_id))
        return delegation(row) if row else None

    def update_delegation(self, d: Delegation) -> None:
        self._c.execute(
            Q.update_delegation,
            (d.state.value, d.result, d.error, d.answered_at, d.callee_session,
             d.created_at, d.deadline, d.team, d.delegation_id),
        )  # fmt: skip

    def list_delegations(
        self,
        team: str,
        *,
        batch: str | None = None,
        member: str | None = None,
        peer: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
        pending_only: bool = False,
    ) -> list[Delegation]:
        sql, args = delegations_query(
            DEL_COLS, team, batch, member, peer, after, limit, pending_only=pending_only
        )
        return [delegation(r) for r in self._c.execute(sql, args)]

    def spend_token(self, jti: str, expires_at: float) -> bool:
        return self._c.execute(Q.spend_token, (jti, expires_at)).rowcount > 0

    def delegations_by_state(
        self, team: str, *, pending: bool, member: str | None = None, limit: int | None = None
    ) -> list[Delegation]:
        sql, args = delegations_by_state_query(DEL_COLS, team, member, pending, limit)
        found = [delegation(r) for r in self._c.execute(sql, args)]
        if pending and member is not None:  # the team's pending ones, a member's kept
            return [d for d in found if member in (d.caller, d.callee)][:limit]
        return found

    def count_delegations(self, team: str, *, member: str | None = None) -> dict[str, int]:
        sql, args = delegation_counts_query(team, member)
        return delegation_counts(self._c.execute(sql, args), member)

    def prune_delegations(self, team: str, *, ended_before: float, expired_before: float) -> int:
        args = (team, ended_before, expired_before, team)
        return self._c.execute(Q.prune_delegations, args).rowcount

    def prune_spent_tokens(self, now: float) -> int:
        return self._c.execute(Q.prune_spent_tokens, (now,)).rowcount

    # -- inbox files read back -----------------------------------------------
    def inbox_known(self, team: str, inbox: str, entry_ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for i in range(0, len(entry_ids), 500):
            chunk = list(entry_ids[i : i + 500])
            marks = ",".join("?" * len(chunk))
            rows = self._c.execute(
                f"SELECT entry_id FROM inbox_entries WHERE team = ? AND inbox = ? "
                f"AND entry_id IN ({marks})",
                [team, inbox, *chunk],
            )
            found.update(r[0] for r in rows)
        return found

    def inbox_activity(self, team: str) -> list[MemberActivity]:
        rows = self._c.execute(Q.inbox_activity, (team, team))
        return activity_rows(team, rows)

    def inbox_record(self, entries: Sequence[InboxEntry]) -> None:
        self._c.executemany(
            Q.inbox_record,
            [
                (e.team, e.inbox, e.entry_id, e.sender, e.kind, e.at, e.seen_at, int(e.terminates))
                for e in entries
            ],
        )

    def inbox_forget(self, team: str, inbox: str, before: float, keep: Collection[str]) -> int:
        rows = self._c.execute(Q.inbox_seen_before, (team, inbox, before)).fetchall()
        drop = [(team, inbox, r[0]) for r in rows if r[0] not in keep]
        self._c.executemany(
            "DELETE FROM inbox_entries WHERE team = ? AND inbox = ? AND entry_id = ?", drop
        )
        return len(drop)

    # -- conversation budgets ----------------------------------------------------
    def get_budget(self, team: str, key: str) -> Budget | None:
        k = (team, key)
        try:
            return self._budgets[k]
        except KeyError:
            pass
        self._write_budgets()  # the cache was dropped: what this transaction wrote first
        row = self._one(Q.get_budget, k)
        found = self._budgets[k] = Budget(*row) if row else None
        return found

    def put_budget(self, budget: Budget) -> None:
        b = budget
        self._budgets[(b.team, b.key)] = b  # the upsert overwrites every column
        self._budget_rows[(b.team, b.key)] = (
            b.team, b.key, b.window_start, b.used, b.granted, b.last_from, b.stopped_at,
            b.updated_at,
        )  # fmt: skip

    def list_budgets(
        self,
        team: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        hidden: str | None = None,
    ) -> list[Budget]:
        self._write_budgets()
        sql, args = budgets_query(BUDGET_COLS, team, after, limit, hidden)
        return [Budget(*r) for r in self._c.execute(sql, args)]

    def budgets_for_human(
        self, team: str, need: BudgetNeed, *, offset: int = 0, limit: int | None = None
    ) -> list[Budget]:
        self._write_budgets()
        sql, args = budgets_for_human_query(BUDGET_COLS, team, need, offset, limit)
        return [Budget(*r) for r in self._c.execute(sql, args)]

    def count_budgets_for_human(self, team: str, need: BudgetNeed) -> int:
        self._write_budgets()
        sql, args = budgets_for_human_query(BUDGET_COLS, team, need, 0, None, count=True)
        row = self._c.execute(sql, args).fetchone()
        return int(row[0]) if row else 0

    # -- A2A tasks -----------------------------------------------------------
    def put_a2a_task(self, task: A2ATask) -> None:
        self._c.execute(Q.put_a2a_task, astuple(task))

    def get_a2a_task(self, team: str, task_id: str) -> A2ATask | None:
        row = self._one(Q.get_a2a_task, (team, task_id))
        return A2ATask(*row) if row else None

    def list_a2a_tasks(self, team: str, member: str, owner: str) -> list[A2ATask]:
        rows = self._c.execute(Q.list_a2a_tasks, (team, member, owner))
        return [A2ATask(*r) for r in rows]

    def claim_a2a_message(self, claim: A2AClaim) -> A2AClaim:
        self._c.execute(Q.claim_a2a_message, astuple(claim))
        held = self.get_a2a_claim(claim.team, claim.message_id)
        assert held is not None  # inserted now, or before
        return held

    def get_a2a_claim(self, team: str, message_id: str) -> A2AClaim | None:
        row = self._one(Q.get_a2a_claim, (team, message_id))
        return A2AClaim(*row) if row else None
