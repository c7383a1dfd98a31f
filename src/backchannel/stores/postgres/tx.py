"""The SQL side of :class:`backchannel.stores.postgres.PostgresStore`: :class:`PgTx`,
the :class:`~backchannel.stores.base.Tx` it hands to transaction functions. See
:mod:`backchannel.stores.postgres.store` for the guarantees and
:mod:`backchannel.stores.postgres.schema` for the tables; the statements and row mappers
it shares with SQLite are in :mod:`backchannel.stores.sql`."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import astuple, replace
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from backchannel.errors import AlreadyExists
from backchannel.stores.base import COMPACT_START, BudgetNeed, CompactCursor, Reads, SessionFilter
from backchannel.stores.postgres.transaction import PgTransaction
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
    pg,
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

__all__ = ["PgTx"]

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]


def _load(value: Any) -> Mapping[str, Any]:
    return value or {}


def _load_list(value: Any) -> Sequence[Any]:
    return value or ()


def _dump(value: Mapping[str, Any] | None) -> Jsonb:
    return Jsonb(dict(value) if value else {})


# JSON travels as jsonb (psycopg hands back dicts and lists); built once, at import
_ROWS = rows(_load, _load_list, _dump, Jsonb)
_message = _ROWS.message
_member = _ROWS.member
_session = _ROWS.session
_link = _ROWS.link
_job = _ROWS.job
Q = Sql(pg, job_id="job_id", event_id="event_id")
_INSERT_LINK = Q.insert_link + " ON CONFLICT DO NOTHING RETURNING 1"
_CLAIM_DISPATCH = Q.claim_dispatch + " RETURNING 1"
_RELEASE_DISPATCH = Q.release_dispatch + " RETURNING 1"
_ADD_JOB = Q.add_job + " RETURNING job_id"
_FINISH_JOB = Q.finish_job + " RETURNING 1"
_RESCHEDULE_JOB = Q.reschedule_job + " RETURNING 1"
#: a job by its request id (``jobs_request``, an index on the same expression)
_JOB_BY_REQUEST = (
    f"SELECT {Q.job_cols} FROM jobs WHERE team = %s AND session_id = %s AND kind = %s "
    "AND payload->>'request_id' = %s ORDER BY job_id LIMIT 1"
)
#: a reaction, unless it is there (``delivery_events_reaction``, migration 15): a
#: transaction inserting the same one at once waits for this one and then inserts nothing
_ADD_REACTION = (
    "INSERT INTO delivery_events (team, id, message_id, member, at, event, detail) "
    "VALUES (%s, nextval('delivery_event_id'), %s, %s, %s, 'reaction', %s) "
    "ON CONFLICT DO NOTHING RETURNING 1"
)
_END_WATCH = Q.end_watch + " RETURNING 1"
_SPEND_TOKEN = Q.spend_token + " RETURNING 1"
_APPEND_EVENT = (
    "INSERT INTO session_events (team, session_id, event_id, turn, at, kind, text, data) "
    "VALUES (%s, %s, nextval('session_event_id'), %s, %s, %s, %s, %s)"
)
_UNTIL_NONE = 2**62  # list_events with no upper bound
#: one member's active sessions, at most two (``Reads.active_of``)
_ACTIVE_SQL, _ = sessions_query(SESSION_COLS, "", "", "active", 2)
_ACTIVE = pg(_ACTIVE_SQL)
#: one member's live sessions (``Reads.live_of``)
_LIVE = pg(sessions_query(SESSION_COLS, "", "", "live", None)[0])


def _budget(row: Any) -> Budget:
    return Budget(*row)


def _ledger(row: Any) -> LedgerEntry:
    return LedgerEntry(*row)


def _one_built(build: Callable[[Any], Any]) -> Callable[[list[Cursor]], Any]:
    """What a prefetched read of one row keeps: the row built, or ``None``."""
    return lambda curs: build(row) if (row := curs[0].fetchone()) else None


def _all_built(build: Callable[[Any], Any]) -> Callable[[list[Cursor]], Any]:
    """What a prefetched read of rows keeps: each built, in order."""
    return lambda curs: [build(row) for row in curs[0].fetchall()]


def _sessions_built(curs: list[Cursor]) -> Any:
    return _sessions(curs[0].fetchall())


def _first_delegation(curs: list[Cursor]) -> Delegation | None:
    """``find_delegation(callee_session=)``: its oldest open one, else its oldest."""
    row = curs[0].fetchone() or curs[1].fetchone()
    return delegation(row) if row else None


def _open_links(team: str, member: str) -> tuple[str, Sequence[Any]]:
    """``list_links(team, member=member, open_only=True)``."""
    sql, args = links_query(LINK_COLS, team, member, True, None, None, parenthesized=True)
    return pg(sql), args


def _batch(team: str, batch: str) -> tuple[str, Sequence[Any]]:
    """``list_delegations(team, batch=batch)``."""
    sql, args = delegations_query(DEL_COLS, team, batch, None, None, None, None,
                                  pending_only=False, parenthesized=True)  # fmt: skip
    return pg(sql), args


def _sessions(rows: list[Any]) -> list[Session]:
    return [_session(r) for r in rows]


_LEASE = (
    "WITH picked AS (SELECT message_id FROM deliveries WHERE team = %s AND member = %s "
    "AND state = 'queued' AND ((session IS NULL AND %s) OR session = %s) "
    "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED) "
    "UPDATE deliveries d SET state = 'leased', attempts = d.attempts + 1, "
    "lease_until = %s, updated_at = %s, lease_holder = %s FROM picked p, messages m "
    "WHERE d.team = %s AND d.member = %s AND d.message_id = p.message_id "
    "AND m.team = d.team AND m.message_id = d.message_id "
    f"RETURNING d.seq, d.session, d.attempts, {MSG_COLS}"
)
#: the copies still leased to a named receive (``deliveries_holder``), in send order
_HELD = (
    f"SELECT d.seq, d.session, d.attempts, d.updated_at, d.lease_until, {MSG_COLS} "
    "FROM deliveries d "
    "JOIN messages m ON m.team = d.team AND m.message_id = d.message_id "
    "WHERE d.team = %s AND d.member = %s AND d.state = 'leased' AND d.lease_holder = %s "
    "AND d.lease_until > %s AND (d.updated_at > %s OR (d.updated_at = %s AND d.seq > %s)) "
    "ORDER BY d.updated_at, d.seq LIMIT %s"
)


class PgTx(PgTransaction, LifecycleSql):
    """:class:`Tx` over one pooled connection; the store drives its transaction (see
    :class:`~backchannel.stores.postgres.transaction.PgTransaction` for the locking)."""

    _TIMER_MEMBER_OF = "(payload->>'member')"

    # -- reads answered from what this transaction read ---------------------------
    prefetches = True

    def prefetch(self, reads: Reads) -> None:
        """Every read ``reads`` names (and the team's row) not made yet in this
        transaction, in one round trip: the one that takes the team's lock, when it is
        the first statement about the team. The answers are kept in :attr:`_rows` and
        dropped by the next write to their tables."""
        r, team = reads, reads.team
        one, many = _one_built, _all_built
        wanted: list[tuple[tuple[str, str, Any], list[tuple[str, Sequence[Any]]], Any]] = [
            (("t", team, ""), [(Q.get_team, (team,))], one(_ROWS.team))
        ]
        if r.message is not None:
            wanted.append(
                (("g", team, r.message), [(Q.get_message, (team, r.message))], one(_message))
            )
        for name in r.members:
            wanted.append((("m", team, name), [(Q.get_member, (team, name))], one(_member)))
        if r.session is not None:
            wanted.append(
                (("s", team, r.session), [(Q.get_session, (team, r.session))], one(_session))
            )
        if r.active_of is not None:
            wanted.append(
                (("a", team, r.active_of), [(_ACTIVE, (team, r.active_of, 2))], _sessions_built)
            )
        if r.live_of is not None:
            wanted.append((("v", team, r.live_of), [(_LIVE, (team, r.live_of))], _sessions_built))
        for key in r.budgets:
            wanted.append((("b", team, key), [(Q.get_budget, (team, key))], one(_budget)))
        if r.link is not None:
            pair = "|".join(sorted(r.link))
            wanted.append((("l", team, pair), [(Q.find_open_link, (team, pair))], one(_link)))
        if r.ledger_of is not None:
            wanted.append(
                (("L", team, r.ledger_of), [(Q.ledger, (team, r.ledger_of))], many(_ledger))
            )
        if r.links_of is not None:
            wanted.append((("o", team, r.links_of), [_open_links(team, r.links_of)], many(_link)))
        if r.delegation_of is not None:
            args: Sequence[Any] = (team, r.delegation_of)
            both: list[tuple[str, Sequence[Any]]] = [
                (Q.open_delegation_of_callee, args),
                (Q.delegation_of_callee, args),
            ]
            wanted.append((("d", team, r.delegation_of), both, _first_delegation))
        if r.batch is not None:
            wanted.append((("B", team, r.batch), [_batch(team, r.batch)], many(delegation)))
        picked = list({w[0]: w for w in wanted if w[0] not in self._rows}.values())
        if not picked:
            return
        curs = iter(self._exec_all([q for _, qs, _ in picked for q in qs], team))
        for kept, qs, build in picked:
            self._rows[kept] = build([next(curs) for _ in qs])

    def _cached(self, key: tuple[str, str, Any], sql: str, args: Sequence[Any], build: Any) -> Any:
        """One row (built) by ``key``: from :attr:`_rows`, or read (and kept) now."""
        try:
            return self._rows[key]
        except KeyError:
            pass
        row = self._one(sql, args, key[1])
        found = self._rows[key] = build(row) if row else None
        return found

    def _cached_rows(
        self,
        key: tuple[str, str, Any],
        query: tuple[str, Sequence[Any]],
        build: Callable[[Any], T],
    ) -> list[T]:
        """Rows (built) by ``key``: from :attr:`_rows`, or read (and kept) now; a copy of
        the list either way."""
        if key not in self._rows:
            sql, args = query
            self._rows[key] = [build(row) for row in self._all(sql, args, key[1])]
        return list(self._rows[key])

    def _lifecycle_exec(self, sql: str, args: Sequence[Any], team: str) -> Any:
        self._flush()  # buffered history first: a removal must not leave it behind
        self._watch_ids.clear()
        return self._exec(sql.replace("?", "%s"), args, team)

    # -- credentials: the other hubs hear of a change to a team's as a whole, ``(team,
    # None)``, and look the tokens their waiting requests hold up again (Admin)
    def set_token_hash(self, team: str, name: str, token_hash: str) -> bool:
        changed = super().set_token_hash(team, name, token_hash)
        if changed:
            self._wake(team, "")
        return changed

    def delete_member(self, team: str, name: str) -> bool:
        deleted = super().delete_member(team, name)
        if deleted:
            self._wake(team, "")
        return deleted

    def delete_team(self, name: str) -> int:
        dropped = super().delete_team(name)
        self._wake(name, "")
        return dropped

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None:
        found: Team | None = self._cached(("t", name, ""), Q.get_team, (name,), _ROWS.team)
        return found

    def insert_team(self, team: Team) -> None:
        self._insert(Q.insert_team, _ROWS.team_args(team), f"team {team.name!r}", team.name)

    def link_crossings(self, team: str) -> int:
        sql = pg("SELECT coalesce(sum(turns_used), 0) FROM links WHERE team = ?")
        row = self._one(sql, (team,), team)
        return int(row[0]) if row else 0

    def list_teams(self, *, after: str | None = None, limit: int | None = None) -> list[Team]:
        sql, args = teams_query(TEAM_COLS, after, limit)
        return [_ROWS.team(r) for r in self._all(pg(sql), args)]

    def count_teams(self) -> int:
        row = self._one(pg("SELECT count(*) FROM teams"), ())
        return int(row[0]) if row else 0

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None:
        found: Member | None = self._cached(("m", team, name), Q.get_member, (team, name), _member)
        return found

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        row = self._one(Q.member_by_token_hash, (token_hash,))
        return _member(row) if row else None

    def insert_member(self, member: Member) -> None:
        m = member
        what = f"member {m.name!r} in team {m.team!r}"
        self._insert(Q.insert_member, _ROWS.member_args(m), what, m.team)

    def update_member(self, member: Member) -> None:
        m = member
        args = (_dump(m.delivery), _dump(m.settings), m.team, m.name)
        self._exec(Q.update_member, args, m.team)

    def list_members(
        self, team: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Member]:
        if after is None and limit is None:
            return [_member(r) for r in self._all(Q.list_members, (team,), team)]
        sql, args = members_query(MEMBER_COLS, team, after, limit)
        return [_member(r) for r in self._all(pg(sql), args, team)]

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None:
        key = ("s", team, session_id)
        found: Session | None = self._cached(key, Q.get_session, (team, session_id), _session)
        return found

    def put_session(self, session: Session) -> None:
        self._behind(Q.put_session, _ROWS.session_args(session), session.team)

    def list_sessions(
        self,
        team: str,
        member: str | None = None,
        *,
        which: SessionFilter = "all",
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        if after is None and member is not None:
            if which == "active" and limit == 2:
                return self._sessions_of(("a", team, member), _ACTIVE, (team, member, 2))
            if which == "live" and limit is None:
                return self._sessions_of(("v", team, member), _LIVE, (team, member))
        sql, args = sessions_query(SESSION_COLS, team, member, which, limit, after)
        return [_session(r) for r in self._all(pg(sql), args, team)]

    def _sessions_of(
        self, key: tuple[str, str, Any], sql: str, args: Sequence[Any]
    ) -> list[Session]:
        if key not in self._rows:
            self._rows[key] = _sessions(self._all(sql, args, key[1]))
        return list(self._rows[key])

    def session_counts(self, team: str) -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in self._all(pg(SESSION_COUNTS), (team,), team)}

    def latest_sessions(self, team: str, member: str, limit: int) -> list[Session]:
        sql = pg(f"SELECT {SESSION_COLS}{LATEST_SESSIONS}")
        return [_session(r) for r in self._all(sql, (team, member, limit), team)]

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None:
        key = ("g", team, message_id)
        found: Message | None = self._cached(key, Q.get_message, (team, message_id), _message)
        return found

    def insert_message(self, message: Message, recipients: Sequence[Recipient]) -> list[Delivery]:
        m = message
        self._rows.pop(("g", m.team, m.message_id), None)  # the one row cached it writes
        rows = self._all(
            "WITH msg AS (INSERT INTO messages (team, message_id, sender, sender_session, "
            "to_name, kind, text, summary, created_at, fingerprint, meta, chain_id, hop) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING team, message_id), "
            "dl AS (INSERT INTO deliveries (team, message_id, member, session, seq, state, "
            "attempts, created_at, updated_at) SELECT msg.team, msg.message_id, r.b, r.s, "
            "nextval('delivery_seq'), 'queued', 0, %s, %s FROM msg, "
            "unnest(%s::text[], %s::text[]) WITH ORDINALITY AS r(b, s, o) ORDER BY r.o "
            "RETURNING member, seq) "
            "SELECT 'm', NULL, NULL FROM msg UNION ALL SELECT 'd', member, seq FROM dl "
            # the jobs watching the sender, asked for by the send next (one round trip)
            "UNION ALL SELECT 'w', NULL, job_id FROM jobs WHERE EXISTS (SELECT 1 FROM msg) "
            "AND team = %s AND watch = %s AND state = 'pending'",
            (*_ROWS.message_args(m), m.created_at, m.created_at,
             [r.member for r in recipients], [r.session for r in recipients],
             m.team, m.sender),
            m.team,
            keep=True,
        )  # fmt: skip
        if not any(part == "m" for part, _, _ in rows):
            raise AlreadyExists(f"message {m.message_id!r} already exists")
        seqs = {member: seq for part, member, seq in rows if part == "d"}
        self._watch_ids[(m.team, m.sender)] = [job_id for part, _, job_id in rows if part == "w"]
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
        include_unpinned: bool = True,
        holder: str | None = None,
    ) -> list[InboxMessage]:
        rows = self._all(
            _LEASE,
            (
                team,
                member,
                include_unpinned,
                session,
                limit,
                lease_until,
                now,
                holder,
                team,
                member,
            ),
            team,
            keep=True,  # deliveries only
        )
        rows.sort(key=lambda r: r[0])
        out = [
            InboxMessage(
                _message(r[3:]), Recipient(member, r[1]), r[2], r[0], lease_until=lease_until
            )
            for r in rows
        ]
        for im in out:
            ev = DeliveryEvent(
                im.message.message_id, member, now, "leased", f"attempt {im.attempt}"
            )
            self._event(team, ev)
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
        args = (team, member, holder, now, at, at, seq, None if limit is None else limit)
        rows = self._all(_HELD, args, team)
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
            self._exec(
                "UPDATE deliveries SET lease_until = v.until FROM unnest(%s::bigint[], "
                "%s::float8[]) AS v(seq, until) WHERE deliveries.seq = v.seq",
                ([m.seq for m in out], [m.lease_until for m in out]),
                team,
            )
            # the hub whose stream held them under the old leases looks at once
            self._wake(team, member)
        return out

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        where = "state = 'leased' AND lease_until <= %s"
        return [
            delivery(r)
            for r in self._claim(
                DELIVERY_COLS, "deliveries", where, "lease_until, seq", (now,), limit
            )
        ]

    def next_lease_expiry(self) -> float | None:
        row = self._one(Q.next_lease_expiry, ())
        return row[0] if row else None

    def database_time(self) -> float:
        """The database server's clock now (``clock_timestamp()``, not the transaction's
        start), in Unix seconds."""
        return float(self._one("SELECT extract(epoch FROM clock_timestamp())::float8", ())[0])

    def restart_leases(
        self, now: float, given_after: float, limit: int, given_before: float = 1e15
    ) -> list[Delivery]:
        where = "state = 'leased' AND updated_at > %s AND updated_at < %s"
        found = [
            delivery(r)
            for r in self._claim(
                DELIVERY_COLS,
                "deliveries",
                where,
                "lease_until, seq",
                (given_after, given_before),
                limit,
            )
        ]
        if found:  # the rows and their teams are locked by the claim
            self._exec(
                "UPDATE deliveries SET lease_until = %s + lease_until - updated_at, "
                "updated_at = %s WHERE seq = ANY(%s::bigint[])",
                (now, now, [d.seq for d in found]),
            )
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
        keep_lease = "lease_until" if to_state is DeliveryState.LEASED else "NULL"
        attempts = "GREATEST(attempts - 1, 0)" if refund else "attempts"
        # with a lease named, only while the copy is still under it
        named = (
            " AND lease_holder IS NOT DISTINCT FROM %s AND attempts = %s AND lease_until = %s"
            if lease is not None
            else ""
        )
        row = self._one(
            f"UPDATE deliveries SET state = %s, updated_at = %s, lease_until = {keep_lease}, "
            f"attempts = {attempts}, "
            "dead_reason = COALESCE(%s, dead_reason) WHERE team = %s AND message_id = %s "
            f"AND member = %s AND state = ANY(%s::text[]){named} RETURNING 1",
            (to_state.value, now, dead_reason if to_state is DeliveryState.DEAD else None,
             team, message_id, member, [s.value for s in from_states],
             *(() if lease is None else (lease.holder, lease.attempt, lease.until))),
            team,
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
            "AND (state IN ('leased', 'delivered') OR (state = 'queued' AND attempts > 0)) "
            "RETURNING message_id) "
            "SELECT message_id, true FROM upd UNION ALL SELECT message_id, false "
            "FROM deliveries WHERE team = %s AND member = %s AND message_id = ANY(%s::text[]) "
            "AND state = 'acked'",
            (now, team, member, ids, team, member, ids),
            team,
        )
        fresh = {mid for mid, new in rows if new}
        done = {mid for mid, _ in rows}
        for mid in ids:
            if mid in fresh:
                self._event(team, DeliveryEvent(mid, member, now, "acked"))
        return [mid for mid in ids if mid in done]

    def first_message_from(
        self, team: str, sender: str, recipient: str, since: float
    ) -> Message | None:
        row = self._one(
            f"SELECT {MSG_COLS} FROM messages m JOIN deliveries d ON d.team = m.team "
            "AND d.message_id = m.message_id AND d.member = %s WHERE m.team = %s "
            "AND m.sender = %s AND m.created_at >= %s ORDER BY m.created_at, d.seq LIMIT 1",
            (recipient, team, sender, since),
            team,
        )
        return _message(row) if row else None

    def unread_from(self, team: str, member: str, sender: str, limit: int) -> list[Message]:
        rows = self._all(
            f"SELECT {MSG_COLS} FROM deliveries d JOIN messages m ON m.team = d.team "
            "AND m.message_id = d.message_id WHERE d.team = %s AND d.member = %s "
            "AND d.state = 'queued' AND m.sender = %s ORDER BY d.seq LIMIT %s",
            (team, member, sender, limit),
            team,
        )
        return [_message(r) for r in rows]

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        if team not in self._locked:
            self._exec("SELECT 1", (), team)  # take the team's lock
        self._event(team, event)

    def add_reaction(self, team: str, event: DeliveryEvent) -> bool:
        self._flush()  # the history before it keeps its place in the feed
        e = event
        row = self._one(_ADD_REACTION, (team, e.message_id, e.member, e.at, e.detail), team)
        return row is not None

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        return [delivery(r) for r in self._all(Q.deliveries, (team, message_id), team)]

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        self._flush()
        return [DeliveryEvent(*r) for r in self._all(Q.history, (team, message_id), team)]

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        self._flush()
        rows = self._all(Q.feed, (team, after, limit), team)
        return [(r[0], DeliveryEvent(*r[1:])) for r in rows]

    def feed_removed(self, team: str) -> int:
        row = self._one("SELECT feed_removed FROM teams WHERE name = %s", (team,), team)
        return int(row[0]) if row else 0

    def feed_start(self, team: str, last: int) -> int:
        self._flush()
        row = self._one(Q.feed_start, (team, last), team)
        return int(row[0]) if row else 0

    def dead_letters(self, team: str, limit: int) -> tuple[list[Delivery], int]:
        found = [delivery(r) for r in self._all(Q.dead_letters, (team, limit), team)]
        return found, int(self._one(Q.dead_count, (team,), team)[0])

    def pending_count(self, team: str, member: str) -> int:
        return int(self._one(Q.pending_count, (team, member), team)[0])

    def pending_counts(self, team: str) -> dict[str, int]:
        return {str(r[0]): int(r[1]) for r in self._all(Q.pending_counts, (team,), team)}

    def compact(
        self, before: float, after: CompactCursor | None, limit: int
    ) -> tuple[int, CompactCursor | None]:
        rows = self._all(
            "SELECT team, message_id, created_at FROM messages WHERE created_at < %s "
            "AND (created_at, team, message_id) > (%s, %s, %s) "
            "ORDER BY created_at, team, message_id LIMIT %s",
            (before, *(after or COMPACT_START), limit),
        )
        self._lock_teams(sorted({r[0] for r in rows}))
        gone = self._all(
            "SELECT m.team, m.message_id FROM messages m "
            "WHERE (m.team, m.message_id) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
            "AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.team = m.team "
            "AND d.message_id = m.message_id "
            "AND (d.state NOT IN ('acked', 'dead') OR d.updated_at >= %s))",
            ([r[0] for r in rows], [r[1] for r in rows], before),
        )
        self._exec(
            "UPDATE teams t SET feed_removed = GREATEST(t.feed_removed, r.top) FROM ("
            "SELECT e.team, max(e.id) AS top FROM delivery_events e WHERE (e.team, "
            "e.message_id) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
            "GROUP BY e.team) r WHERE t.name = r.team",
            ([g[0] for g in gone], [g[1] for g in gone]),
        )
        for table in ("delivery_events", "deliveries", "messages"):
            self._exec(
                f"DELETE FROM {table} WHERE (team, message_id) IN "
                "(SELECT * FROM unnest(%s::text[], %s::text[]))",
                ([g[0] for g in gone], [g[1] for g in gone]),
            )
        self._exec("DELETE FROM jobs WHERE state != 'pending' AND done_at < %s", (before,))
        return len(gone), ((rows[-1][2], *rows[-1][:2]) if len(rows) == limit else None)

    # -- push delivery ownership ---------------------------------------------
    # Every statement takes the team's lock first (team=...), so a claim, a lease of the
    # member's messages and a requeue never interleave; the upsert's row lock alone
    # would also keep two claims from both winning.
    def claim_dispatch(
        self, team: str, member: str, owner: str, now: float, lease_until: float
    ) -> bool:
        args = (team, member, owner, lease_until, now)
        return self._one(_CLAIM_DISPATCH, args, team) is not None

    def release_dispatch(self, team: str, member: str, owner: str) -> bool:
        return self._one(_RELEASE_DISPATCH, (team, member, owner), team) is not None

    def dispatch_owner(self, team: str, member: str) -> tuple[str, float] | None:
        row = self._one(Q.dispatch_owner, (team, member), team)
        return (row[0], row[1]) if row else None

    # -- push circuits ---------------------------------------------------------
    def push_circuit(self, team: str, member: str) -> dict[str, Any] | None:
        row = self._one(Q.push_circuit, (team, member), team)
        return dict(json.loads(row[0])) if row else None

    def push_circuits(self) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self._all(Q.push_circuits, ())
        return [(r[0], r[1], dict(json.loads(r[2]))) for r in rows]

    def set_push_circuit(self, team: str, member: str, state: Mapping[str, Any] | None) -> None:
        if state is None:
            self._exec(Q.forget_push_circuit, (team, member), team)
        else:
            self._exec(Q.set_push_circuit, (team, member, json.dumps(dict(state))), team)

    def requeue_leased(self, team: str, member: str, now: float, detail: str) -> list[str]:
        rows = self._all(
            "WITH upd AS (UPDATE deliveries SET state = 'queued', lease_until = NULL, "
            "updated_at = %s WHERE team = %s AND member = %s AND state = 'leased' "
            "RETURNING message_id, seq) SELECT message_id FROM upd ORDER BY seq",
            (now, team, member),
            team,
        )
        return self._moved(team, member, rows, now, "released", detail)

    def unpin_session(
        self, team: str, member: str, session: str, now: float, detail: str
    ) -> list[str]:
        rows = self._all(
            "WITH upd AS (UPDATE deliveries SET session = NULL, updated_at = %s "
            "WHERE team = %s AND member = %s AND session = %s "
            "AND state IN ('queued', 'leased') RETURNING message_id, seq) "
            "SELECT message_id FROM upd ORDER BY seq",
            (now, team, member, session),
            team,
        )
        return self._moved(team, member, rows, now, "unpinned", detail)

    def _moved(
        self, team: str, member: str, rows: list[Any], now: float, event: str, detail: str
    ) -> list[str]:
        """The ids of copies a statement moved back to the member's inbox, each with its
        history line; the member's receivers are woken."""
        ids = [r[0] for r in rows]
        for mid in ids:
            self._event(team, DeliveryEvent(mid, member, now, event, detail))
        if ids:
            self._wake(team, member)
        return ids

    def append_event(self, event: SessionEvent) -> int:
        e = event
        row = self._one(
            _APPEND_EVENT + " RETURNING event_id",
            (e.team, e.session_id, e.turn, e.at, e.kind.value, e.text, _dump(e.data)),
            e.team,
        )
        return int(row[0])

    def note_event(self, event: SessionEvent) -> None:
        e = event
        self._behind(
            _APPEND_EVENT,
            (e.team, e.session_id, e.turn, e.at, e.kind.value, e.text, _dump(e.data)),
            e.team,
        )

    def list_events(
        self, team: str, session_id: str, after: int, until: int | None, limit: int
    ) -> list[SessionEvent]:
        last = until if until is not None else _UNTIL_NONE
        rows = self._all(Q.list_events, (team, session_id, after, last, limit), team)
        return [_ROWS.event(r) for r in rows]

    # -- the per-turn ledger -------------------------------------------------
    def ledger_add(self, entry: LedgerEntry) -> None:
        e = entry
        self._exec(Q.ledger_add, (e.team, e.session_id, e.to, e.digest, e.message_id, e.at), e.team)

    def ledger(self, team: str, session_id: str) -> list[LedgerEntry]:
        return self._cached_rows(("L", team, session_id), (Q.ledger, (team, session_id)), _ledger)

    def ledger_clear(self, team: str, session_id: str) -> int:
        return self._exec(Q.ledger_clear, (team, session_id), team).rowcount

    def ledger_forget(self, team: str, session_id: str) -> None:
        self._behind(Q.ledger_clear, (team, session_id), team)

    # -- links ---------------------------------------------------------------
    def insert_link(self, link: Link) -> Link:
        row = self._one(_INSERT_LINK, (*_ROWS.link_args(link), link.pair), link.team)
        if row is not None:
            return link
        existing = self.find_open_link(link.team, link.initiator, link.responder)
        if existing is None:
            raise AlreadyExists(f"link {link.link_id!r} already exists")
        return existing

    def get_link(self, team: str, link_id: str) -> Link | None:
        for key, link in self._rows.items():  # read by its pair already (``prefetch``)
            if key[0] == "l" and key[1] == team and link is not None and link.link_id == link_id:
                return link  # type: ignore[no-any-return]
        found: Link | None = self._cached(("k", team, link_id), Q.get_link, (team, link_id), _link)
        return found

    def find_open_link(self, team: str, member_a: str, member_b: str) -> Link | None:
        pair = "|".join(sorted((member_a, member_b)))
        found: Link | None = self._cached(("l", team, pair), Q.find_open_link, (team, pair), _link)
        return found

    def update_link(self, link: Link) -> None:
        self._behind(
            Q.update_link, (*_ROWS.link_args(link)[2:], link.team, link.link_id), link.team
        )

    def list_links(
        self,
        team: str,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        if member is not None and open_only and after is None and limit is None:
            return self._cached_rows(("o", team, member), _open_links(team, member), _link)
        sql, args = links_query(
            LINK_COLS, team, member, open_only, after, limit, parenthesized=True
        )
        return [_link(r) for r in self._all(pg(sql), args, team)]

    def latest_closed_links(self, team: str, limit: int) -> list[Link]:
        sql = pg(f"SELECT {LINK_COLS}{LATEST_CLOSED_LINKS}")
        return [_link(r) for r in self._all(sql, (team, limit), team)]

    def count_closed_links(self, team: str) -> int:
        row = self._one(pg(CLOSED_LINKS_COUNT), (team, team), team)
        return int(row[0]) if row else 0

    # -- scheduled jobs ------------------------------------------------------
    def add_job(self, job: Job) -> int:
        j = job
        self._watch_ids.clear()
        args = (j.team, j.kind, j.due_at, j.created_at, j.session_id, _dump(j.payload), j.watch)
        job_id = int(self._one(_ADD_JOB, args, j.team)[0])
        self._job_team[job_id] = j.team
        return job_id

    def get_job(self, team: str, job_id: int) -> Job | None:
        row = self._one(Q.get_job, (team, job_id), team)
        return self._jobs([row])[0] if row else None

    def _jobs(self, rows: Iterable[Sequence[Any]]) -> list[Job]:
        out = [_job(r) for r in rows]
        self._job_team.update((j.job_id, j.team) for j in out)
        return out

    def due_jobs(self, now: float, limit: int) -> list[Job]:
        where = "state = 'pending' AND due_at <= %s"
        return self._jobs(self._claim(Q.job_cols, "jobs", where, "due_at, job_id", (now,), limit))

    def job_by_request(self, team: str, session_id: str, kind: str, request_id: str) -> Job | None:
        row = self._one(_JOB_BY_REQUEST, (team, session_id, kind, request_id), team)
        return self._jobs([row])[0] if row else None

    def next_job_due(self) -> float | None:
        row = self._one("SELECT min(due_at) FROM jobs WHERE state = 'pending'", ())
        return row[0] if row else None

    def last_job_id(self) -> int:
        row = self._one("SELECT max(job_id) FROM jobs", ())
        return int(row[0]) if row and row[0] is not None else 0

    def _team_of_job(self, job_id: int) -> str | None:
        team = self._job_team.get(job_id)
        if team is None:  # a job this transaction has not seen: find its team to lock it
            found = self._one("SELECT team FROM jobs WHERE job_id = %s", (job_id,))
            team = str(found[0]) if found else None
        return team

    def finish_job(self, job_id: int, state: JobState, at: float) -> bool:
        self._watch_ids.clear()
        team = self._team_of_job(job_id)
        if team is None:
            return False
        return self._one(_FINISH_JOB, (state.value, at, job_id), team) is not None

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        self._watch_ids.clear()
        team = self._team_of_job(job_id)
        if team is None:
            return False
        return self._one(_RESCHEDULE_JOB, (due_at, _dump(payload), job_id), team) is not None

    def watching(self, team: str, sender: str) -> list[Job]:
        found = self._watch_ids.get((team, sender))
        if found == []:  # the insert of the sender's message found none, this transaction
            return []
        return self._jobs(self._all(Q.watching, (team, sender), team))

    def end_watch(self, job_id: int, payload: Mapping[str, Any]) -> bool:
        self._watch_ids.clear()
        team = self._team_of_job(job_id)
        if team is None:
            return False
        return self._one(_END_WATCH, (_dump(payload), job_id), team) is not None

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
            Q.job_cols, "job_id", team, session_id, kind, pending_only, limit, offset
        )
        return self._jobs(self._all(pg(sql), args, team))

    def count_pending_jobs(self, team: str, kind: str) -> int:
        return int(self._one(Q.count_pending_jobs, (team, kind), team)[0])

    def pending_job_attempts(self, team: str, kind: str) -> int:
        sql = pg(
            "SELECT coalesce(sum((payload->>'attempt')::bigint), 0) FROM jobs "
            "WHERE team = ? AND kind = ? AND state = 'pending'"
        )
        return int(self._one(sql, (team, kind), team)[0])

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
            Q.job_cols, "job_id", "(payload->>'member')", team, member, session_id,
            pending_only, after, limit,
        )  # fmt: skip
        return self._jobs(self._all(pg(sql), args, team))

    # -- delegation ----------------------------------------------------------
    def insert_delegation(self, d: Delegation) -> None:
        what = f"delegation {d.delegation_id!r}"
        self._insert(Q.insert_delegation, delegation_args(d), what, d.team)

    def get_delegation(self, team: str, delegation_id: str) -> Delegation | None:
        row = self._one(Q.get_delegation, (team, delegation_id), team)
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
            # its oldest open one, else its oldest: both asked in one round trip
            key = ("d", team, callee_session)
            if key not in self._rows:
                of: Sequence[Any] = (team, callee_session)
                self._rows[key] = _first_delegation(
                    self._exec_all(
                        [(Q.open_delegation_of_callee, of), (Q.delegation_of_callee, of)], team
                    )
                )
            found: Delegation | None = self._rows[key]
            return found
        else:
            row = self._one(Q.delegation_of_call, (team, caller_session, tool_use_id), team)
        return delegation(row) if row else None

    def update_delegation(self, d: Delegation) -> None:
        self._exec(
            Q.update_delegation,
            (d.state.value, d.result, d.error, d.answered_at, d.callee_session,
             d.created_at, d.deadline, d.team, d.delegation_id),
            d.team,
        )  # fmt: skip

    def delegations_by_state(
        self, team: str, *, pending: bool, member: str | None = None, limit: int | None = None
    ) -> list[Delegation]:
        sql, args = delegations_by_state_query(
            DEL_COLS, team, member, pending, limit, parenthesized=True
        )
        found = [delegation(r) for r in self._all(pg(sql), args, team)]
        if pending and member is not None:  # the team's pending ones, a member's kept
            return [d for d in found if member in (d.caller, d.callee)][:limit]
        return found

    def count_delegations(self, team: str, *, member: str | None = None) -> dict[str, int]:
        sql, args = delegation_counts_query(team, member)
        return delegation_counts(self._all(pg(sql), args, team), member)

    def prune_delegations(self, team: str, *, ended_before: float, expired_before: float) -> int:
        args = (team, ended_before, expired_before, team)
        return self._exec(Q.prune_delegations, args, team).rowcount

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
        if batch is not None and (member, peer, after, limit, pending_only) == (
            None, None, None, None, False
        ):  # fmt: skip
            return self._cached_rows(("B", team, batch), _batch(team, batch), delegation)
        sql, args = delegations_query(
            DEL_COLS,
            team,
            batch,
            member,
            peer,
            after,
            limit,
            pending_only=pending_only,
            parenthesized=True,
        )
        return [delegation(r) for r in self._all(pg(sql), args, team)]

    # -- inbox files read back -----------------------------------------------
    def inbox_known(self, team: str, inbox: str, entry_ids: Sequence[str]) -> set[str]:
        rows = self._all(
            "SELECT entry_id FROM inbox_entries WHERE team = %s AND inbox = %s "
            "AND entry_id = ANY(%s::text[])",
            (team, inbox, list(entry_ids)),
        )
        return {r[0] for r in rows}

    def inbox_record(self, entries: Sequence[InboxEntry]) -> None:
        for e in entries:
            args = (e.team, e.inbox, e.entry_id, e.sender, e.kind, e.at, e.seen_at, e.terminates)
            self._exec(Q.inbox_record, args, e.team)

    def inbox_activity(self, team: str) -> list[MemberActivity]:
        return activity_rows(team, self._all(Q.inbox_activity, (team, team)))

    def inbox_forget(self, team: str, inbox: str, before: float, keep: Collection[str]) -> int:
        rows = self._all(Q.inbox_seen_before, (team, inbox, before))
        drop = [r[0] for r in rows if r[0] not in keep]
        if drop:
            self._exec(
                "DELETE FROM inbox_entries WHERE team = %s AND inbox = %s "
                "AND entry_id = ANY(%s::text[])",
                (team, inbox, drop),
                team,
            )
        return len(drop)

    # -- one-time tokens -----------------------------------------------------
    def spend_token(self, jti: str, expires_at: float) -> bool:
        # not team-scoped: a concurrent spend of the same id waits for this one, then
        # finds the row and reports a replay
        return self._one(_SPEND_TOKEN, (jti, expires_at)) is not None

    def prune_spent_tokens(self, now: float) -> int:
        return self._exec(Q.prune_spent_tokens, (now,)).rowcount

    # -- conversation budgets ----------------------------------------------------
    def get_budget(self, team: str, key: str) -> Budget | None:
        written = self._later.get(("budget", team, key))
        if written is not None:  # put here, not sent yet: the row it will write
            return _budget(written[1])
        found: Budget | None = self._cached(("b", team, key), Q.get_budget, (team, key), _budget)
        return found

    def put_budget(self, budget: Budget) -> None:
        """Written in the ``COMMIT`` round trip (or before a read of the team's budgets
        as a list, or a removal); read back from :attr:`_rows` until then. The team's
        lock is taken now, as for any write; :meth:`get_budget` answers from it."""
        b = budget
        if b.team not in self._locked:
            self.get_team(b.team)  # the lock, and a row every writer of a team reads
        # the row read before is stale: once this write is sent ahead of a listing or a
        # removal (``_flush``), the key is read again
        self._rows.pop(("b", b.team, b.key), None)
        self._later[("budget", b.team, b.key)] = (
            Q.put_budget,
            (b.team, b.key, b.window_start, b.used, b.granted, b.last_from, b.stopped_at,
             b.updated_at),
        )  # fmt: skip

    def list_budgets(
        self,
        team: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        hidden: str | None = None,
    ) -> list[Budget]:
        self._flush()  # the budgets written in this transaction first
        sql, args = budgets_query(BUDGET_COLS, team, after, limit, hidden)
        return [Budget(*r) for r in self._all(pg(sql), args, team)]

    def budgets_for_human(
        self, team: str, need: BudgetNeed, *, offset: int = 0, limit: int | None = None
    ) -> list[Budget]:
        sql, args = budgets_for_human_query(BUDGET_COLS, team, need, offset, limit)
        return [Budget(*r) for r in self._all(pg(sql), args, team)]

    def count_budgets_for_human(self, team: str, need: BudgetNeed) -> int:
        sql, args = budgets_for_human_query(BUDGET_COLS, team, need, 0, None, count=True)
        row = self._one(pg(sql), args, team)
        return int(row[0]) if row else 0

    # -- A2A tasks -----------------------------------------------------------
    def put_a2a_task(self, task: A2ATask) -> None:
        self._exec(Q.put_a2a_task, astuple(task), task.team)

    def get_a2a_task(self, team: str, task_id: str) -> A2ATask | None:
        row = self._one(Q.get_a2a_task, (team, task_id), team)
        return A2ATask(*row) if row else None

    def list_a2a_tasks(self, team: str, member: str, owner: str) -> list[A2ATask]:
        return [A2ATask(*r) for r in self._all(Q.list_a2a_tasks, (team, member, owner), team)]

    def claim_a2a_message(self, claim: A2AClaim) -> A2AClaim:
        self._exec(Q.claim_a2a_message, astuple(claim), claim.team)
        held = self.get_a2a_claim(claim.team, claim.message_id)
        assert held is not None  # inserted now, or before
        return held

    def get_a2a_claim(self, team: str, message_id: str) -> A2AClaim | None:
        row = self._one(Q.get_a2a_claim, (team, message_id), team)
        return A2AClaim(*row) if row else None
