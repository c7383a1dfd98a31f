"""The SQL side of :class:`backchannel.stores.sqlite.SqliteStore`: :class:`SqliteTx`, the
:class:`~backchannel.stores.base.Tx` it hands to transaction functions. See
:mod:`backchannel.stores.sqlite.store` for the guarantees and
:mod:`backchannel.stores.sqlite.schema` for the tables."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import astuple
from typing import Any

from backchannel.errors import AlreadyExists
from backchannel.stores.base import SessionFilter
from backchannel.stores.inbox_sql import INBOX_ACTIVITY_SQL, activity_rows
from backchannel.stores.lifecycle import LifecycleSql
from backchannel.stores.sql import OPEN_DELEGATION, links_query, sessions_query
from backchannel.types import (
    A2ATask,
    Budget,
    Delegation,
    DelegationState,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    EventKind,
    InboxEntry,
    InboxMessage,
    Job,
    JobState,
    LedgerEntry,
    Link,
    LinkState,
    Member,
    MemberActivity,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Route,
    Session,
    SessionEvent,
    SessionState,
    Team,
)

__all__ = ["SqliteTx"]

_MSG_COLS = (
    "m.team, m.message_id, m.sender, m.to_name, m.text, m.kind, m.created_at, "
    "m.fingerprint, m.summary, m.sender_session, m.meta, m.chain_id, m.hop"
)


def _loads(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text and text != "{}" else {}


def _dumps(value: Any) -> str:
    return json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False) if value else "{}"


def _message(row: Sequence[Any]) -> Message:
    return Message(
        team=row[0],
        message_id=row[1],
        sender=row[2],
        to=row[3],
        text=row[4],
        kind=MessageKind(row[5]),
        created_at=row[6],
        fingerprint=row[7],
        summary=row[8],
        sender_session=row[9],
        meta=_loads(row[10]),
        chain_id=row[11],
        hop=row[12],
    )


_DELIVERY_COLS = (
    "team, message_id, member, session, seq, state, attempts, created_at, updated_at, "
    "lease_until, dead_reason"
)


def _delivery(row: Sequence[Any]) -> Delivery:
    return Delivery(
        team=row[0],
        message_id=row[1],
        recipient=Recipient(row[2], row[3]),
        seq=row[4],
        state=DeliveryState(row[5]),
        attempts=row[6],
        created_at=row[7],
        updated_at=row[8],
        lease_until=row[9],
        dead_reason=row[10],
    )


_MEMBER_COLS = "team, name, kind, created_at, token_hash, delivery, settings"


def _member(row: Sequence[Any]) -> Member:
    return Member(
        team=row[0],
        name=row[1],
        kind=MemberKind(row[2]),
        created_at=row[3],
        token_hash=row[4],
        delivery=_loads(row[5]),
        settings=_loads(row[6]),
    )


_SESSION_COLS = (
    "team, session_id, member, state, created_at, updated_at, turn, turn_started_at, "
    "turn_kind, last_output, last_stop_at, meta"
)


def _session(row: Sequence[Any]) -> Session:
    return Session(
        team=row[0],
        session_id=row[1],
        member=row[2],
        state=SessionState(row[3]),
        created_at=row[4],
        updated_at=row[5],
        turn=row[6],
        turn_started_at=row[7],
        turn_kind=row[8],
        last_output=row[9],
        last_stop_at=row[10],
        meta=_loads(row[11]),
    )


class SqliteTx(LifecycleSql):
    """:class:`Tx` over one sqlite3 connection, inside a transaction the store opened."""

    def _lifecycle_exec(self, sql: str, args: Sequence[Any], team: str) -> Any:
        return self._c.execute(sql, args)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    def _one(self, sql: str, args: Sequence[Any]) -> Any:
        return self._c.execute(sql, args).fetchone()

    def _insert(self, sql: str, args: Sequence[Any], what: str) -> None:
        try:
            self._c.execute(sql, args)
        except sqlite3.IntegrityError as exc:
            raise AlreadyExists(f"{what} already exists") from exc

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None:
        row = self._one("SELECT name, created_at, settings FROM teams WHERE name = ?", (name,))
        return Team(row[0], row[1], _loads(row[2])) if row else None

    def insert_team(self, team: Team) -> None:
        self._insert(
            "INSERT INTO teams (name, created_at, settings) VALUES (?, ?, ?)",
            (team.name, team.created_at, _dumps(team.settings)),
            f"team {team.name!r}",
        )

    def list_teams(self) -> list[Team]:
        rows = self._c.execute("SELECT name, created_at, settings FROM teams ORDER BY name")
        return [Team(r[0], r[1], _loads(r[2])) for r in rows]

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None:
        row = self._one(
            f"SELECT {_MEMBER_COLS} FROM members WHERE team = ? AND name = ?", (team, name)
        )
        return _member(row) if row else None

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        row = self._one(f"SELECT {_MEMBER_COLS} FROM members WHERE token_hash = ?", (token_hash,))
        return _member(row) if row else None

    def insert_member(self, member: Member) -> None:
        self._insert(
            f"INSERT INTO members ({_MEMBER_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                member.team,
                member.name,
                member.kind.value,
                member.created_at,
                member.token_hash,
                _dumps(member.delivery),
                _dumps(member.settings),
            ),
            f"member {member.name!r} in team {member.team!r}",
        )

    def update_member(self, member: Member) -> None:
        self._c.execute(
            "UPDATE members SET delivery = ?, settings = ? WHERE team = ? AND name = ?",
            (_dumps(member.delivery), _dumps(member.settings), member.team, member.name),
        )

    def list_members(self, team: str) -> list[Member]:
        rows = self._c.execute(
            f"SELECT {_MEMBER_COLS} FROM members WHERE team = ? ORDER BY name", (team,)
        )
        return [_member(r) for r in rows]

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None:
        row = self._one(
            f"SELECT {_SESSION_COLS} FROM sessions WHERE team = ? AND session_id = ?",
            (team, session_id),
        )
        return _session(row) if row else None

    def put_session(self, session: Session) -> None:
        s = session
        self._c.execute(
            f"INSERT OR REPLACE INTO sessions ({_SESSION_COLS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                s.team,
                s.session_id,
                s.member,
                s.state.value,
                s.created_at,
                s.updated_at,
                s.turn,
                s.turn_started_at,
                s.turn_kind,
                s.last_output,
                s.last_stop_at,
                _dumps(s.meta),
            ),
        )

    def list_sessions(
        self,
        team: str,
        member: str | None = None,
        *,
        which: SessionFilter = "all",
        limit: int | None = None,
    ) -> list[Session]:
        sql, args = sessions_query(_SESSION_COLS, team, member, which, limit)
        return [_session(r) for r in self._c.execute(sql, args)]

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None:
        row = self._one(
            f"SELECT {_MSG_COLS} FROM messages m WHERE m.team = ? AND m.message_id = ?",
            (team, message_id),
        )
        return _message(row) if row else None

    def _events(self, team: str, events: Sequence[DeliveryEvent]) -> None:
        self._c.executemany(
            "INSERT INTO delivery_events (team, message_id, member, at, event, detail) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(team, e.message_id, e.member, e.at, e.event, e.detail) for e in events],
        )

    def insert_message(self, message: Message, recipients: Sequence[Recipient]) -> list[Delivery]:
        m = message
        self._insert(
            "INSERT INTO messages (team, message_id, sender, sender_session, to_name, kind, "
            "text, summary, created_at, fingerprint, meta, chain_id, hop) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                m.team,
                m.message_id,
                m.sender,
                m.sender_session,
                m.to,
                m.kind.value,
                m.text,
                m.summary,
                m.created_at,
                m.fingerprint,
                _dumps(m.meta),
                m.chain_id,
                m.hop,
            ),
            f"message {m.message_id!r}",
        )
        out = []
        for r in recipients:
            cur = self._c.execute(
                "INSERT INTO deliveries (team, message_id, member, session, state, attempts, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, 'queued', 0, ?, ?)",
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
        self._events(
            m.team,
            [DeliveryEvent(m.message_id, r.member, m.created_at, "queued") for r in recipients],
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
    ) -> list[InboxMessage]:
        rows = self._c.execute(
            f"SELECT d.seq, d.session, d.attempts, {_MSG_COLS} FROM deliveries d "
            "JOIN messages m ON m.team = d.team AND m.message_id = d.message_id "
            "WHERE d.team = ? AND d.member = ? AND d.state = 'queued' "
            "AND ((d.session IS NULL AND ?) OR d.session = ?) ORDER BY d.seq LIMIT ?",
            (team, member, include_unpinned, session, limit),
        ).fetchall()
        if not rows:
            return []
        self._c.executemany(
            "UPDATE deliveries SET state = 'leased', attempts = attempts + 1, lease_until = ?, "
            "updated_at = ? WHERE seq = ?",
            [(lease_until, now, r[0]) for r in rows],
        )
        out = [InboxMessage(_message(r[3:]), Recipient(member, r[1]), r[2] + 1, r[0]) for r in rows]
        self._events(
            team,
            [
                DeliveryEvent(im.message.message_id, member, now, "leased", f"attempt {im.attempt}")
                for im in out
            ],
        )
        return out

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        rows = self._c.execute(
            f"SELECT {_DELIVERY_COLS} FROM deliveries WHERE state = 'leased' AND lease_until <= ? "
            "ORDER BY lease_until, seq LIMIT ?",
            (now, limit),
        )
        return [_delivery(r) for r in rows]

    def next_lease_expiry(self) -> float | None:
        row = self._one("SELECT MIN(lease_until) FROM deliveries WHERE state = 'leased'", ())
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
        marks = ",".join("?" * len(from_states))
        keep_lease = to_state is DeliveryState.LEASED
        cur = self._c.execute(
            f"UPDATE deliveries SET state = ?, updated_at = ?, "
            f"lease_until = {'lease_until' if keep_lease else 'NULL'}, "
            "dead_reason = COALESCE(?, dead_reason) "
            f"WHERE team = ? AND message_id = ? AND member = ? AND state IN ({marks})",
            (
                to_state.value,
                now,
                dead_reason if to_state is DeliveryState.DEAD else None,
                team,
                message_id,
                member,
                *(s.value for s in from_states),
            ),
        )
        if cur.rowcount == 0:
            return False
        self._events(team, [DeliveryEvent(message_id, member, now, event, detail)])
        return True

    def ack(self, team: str, member: str, message_ids: Sequence[str], now: float) -> list[str]:
        ids = list(dict.fromkeys(message_ids))
        if not ids:
            return []
        acked: list[str] = []
        fresh: list[str] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for mid, state in self._c.execute(
                f"SELECT message_id, state FROM deliveries WHERE team = ? AND member = ? "
                f"AND message_id IN ({marks})",
                (team, member, *chunk),
            ):
                if state == "acked":
                    acked.append(mid)
                elif state in ("leased", "delivered"):
                    fresh.append(mid)
        if fresh:
            self._c.executemany(
                "UPDATE deliveries SET state = 'acked', lease_until = NULL, updated_at = ? "
                "WHERE team = ? AND message_id = ? AND member = ?",
                [(now, team, mid, member) for mid in fresh],
            )
            self._events(team, [DeliveryEvent(mid, member, now, "acked") for mid in fresh])
        done = set(acked) | set(fresh)
        return [mid for mid in ids if mid in done]

    def first_message_from(
        self, team: str, sender: str, recipient: str, since: float
    ) -> Message | None:
        row = self._one(
            f"SELECT {_MSG_COLS} FROM messages m JOIN deliveries d "
            "ON d.team = m.team AND d.message_id = m.message_id AND d.member = ? "
            "WHERE m.team = ? AND m.sender = ? AND m.created_at >= ? "
            "ORDER BY m.created_at LIMIT 1",
            (recipient, team, sender, since),
        )
        return _message(row) if row else None

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        self._events(team, [event])

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        rows = self._c.execute(
            f"SELECT {_DELIVERY_COLS} FROM deliveries WHERE team = ? AND message_id = ? "
            "ORDER BY member",
            (team, message_id),
        )
        return [_delivery(r) for r in rows]

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        rows = self._c.execute(
            "SELECT message_id, member, at, event, detail FROM delivery_events "
            "WHERE team = ? AND message_id = ? ORDER BY id",
            (team, message_id),
        )
        return [DeliveryEvent(*r) for r in rows]

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        rows = self._c.execute(
            "SELECT id, message_id, member, at, event, detail FROM delivery_events "
            "WHERE team = ? AND id > ? ORDER BY id LIMIT ?",
            (team, after, limit),
        )
        return [(r[0], DeliveryEvent(*r[1:])) for r in rows]

    def pending_count(self, team: str, member: str) -> int:
        row = self._one(
            "SELECT COUNT(*) FROM deliveries WHERE team = ? AND member = ? "
            "AND state IN ('queued', 'leased')",
            (team, member),
        )
        return int(row[0])

    def compact(self, before: float, after: float, limit: int) -> tuple[int, float | None]:
        rows = self._c.execute(
            "SELECT team, message_id, created_at FROM messages "
            "WHERE created_at >= ? AND created_at < ? ORDER BY created_at LIMIT ?",
            (after, before, limit),
        ).fetchall()
        gone = []
        for team, message_id, _ in rows:
            live = self._one(
                "SELECT 1 FROM deliveries WHERE team = ? AND message_id = ? "
                "AND state NOT IN ('acked', 'dead') LIMIT 1",
                (team, message_id),
            )
            if live is None:
                gone.append((team, message_id))
        for table in ("delivery_events", "deliveries", "messages"):
            self._c.executemany(f"DELETE FROM {table} WHERE team = ? AND message_id = ?", gone)
        self._c.execute("DELETE FROM jobs WHERE state != 'pending' AND done_at < ?", (before,))
        return len(gone), (rows[-1][2] if len(rows) == limit else None)

    # -- transcripts ---------------------------------------------------------
    # -- push delivery ownership ---------------------------------------------
    def claim_dispatch(
        self, team: str, member: str, owner: str, now: float, lease_until: float
    ) -> bool:
        cur = self._c.execute(
            "INSERT INTO dispatch_owners (team, member, owner, lease_until) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (team, member) DO UPDATE SET owner = excluded.owner, "
            "lease_until = excluded.lease_until "
            "WHERE dispatch_owners.owner = excluded.owner OR dispatch_owners.lease_until <= ?",
            (team, member, owner, lease_until, now),
        )
        return cur.rowcount > 0

    def release_dispatch(self, team: str, member: str, owner: str) -> bool:
        cur = self._c.execute(
            "DELETE FROM dispatch_owners WHERE team = ? AND member = ? AND owner = ?",
            (team, member, owner),
        )
        return cur.rowcount > 0

    def dispatch_owner(self, team: str, member: str) -> tuple[str, float] | None:
        row = self._one(
            "SELECT owner, lease_until FROM dispatch_owners WHERE team = ? AND member = ?",
            (team, member),
        )
        return (row[0], row[1]) if row else None

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

    def append_event(self, event: SessionEvent) -> int:
        e = event
        cur = self._c.execute(
            "INSERT INTO session_events (team, session_id, turn, at, kind, text, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (e.team, e.session_id, e.turn, e.at, e.kind.value, e.text, _dumps(e.data)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def list_events(
        self, team: str, session_id: str, after: int, until: int | None, limit: int
    ) -> list[SessionEvent]:
        rows = self._c.execute(
            "SELECT id, team, session_id, turn, at, kind, text, data FROM session_events "
            "WHERE team = ? AND session_id = ? AND id > ? AND id <= ? ORDER BY id LIMIT ?",
            (team, session_id, after, until if until is not None else 2**62, limit),
        )
        return [
            SessionEvent(r[1], r[2], r[3], r[4], EventKind(r[5]), r[6], _loads(r[7]), r[0])
            for r in rows
        ]

    # -- ledger --------------------------------------------------------------
    def ledger_add(self, entry: LedgerEntry) -> None:
        e = entry
        self._c.execute(
            "INSERT INTO ledger (team, session_id, to_name, digest, message_id, at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (e.team, e.session_id, e.to, e.digest, e.message_id, e.at),
        )

    def ledger(self, team: str, session_id: str) -> list[LedgerEntry]:
        rows = self._c.execute(
            "SELECT team, session_id, to_name, digest, message_id, at FROM ledger "
            "WHERE team = ? AND session_id = ? ORDER BY id",
            (team, session_id),
        )
        return [LedgerEntry(*r) for r in rows]

    def ledger_clear(self, team: str, session_id: str) -> int:
        cur = self._c.execute(
            "DELETE FROM ledger WHERE team = ? AND session_id = ?", (team, session_id)
        )
        return cur.rowcount

    # -- links ---------------------------------------------------------------
    _LINK_COLS = (
        "team, link_id, initiator, initiator_session, responder, responder_session, budget, "
        "created_at, state, turns_used, closed_at, close_reason, history"
    )

    @staticmethod
    def _link(r: Sequence[Any]) -> Link:
        return Link(
            team=r[0],
            link_id=r[1],
            initiator=r[2],
            initiator_session=r[3],
            responder=r[4],
            responder_session=r[5],
            budget=r[6],
            created_at=r[7],
            state=LinkState(r[8]),
            turns_used=r[9],
            closed_at=r[10],
            close_reason=r[11],
            history=tuple(json.loads(r[12])),
        )

    def _link_args(self, link: Link) -> tuple[Any, ...]:
        return (
            link.team,
            link.link_id,
            link.initiator,
            link.initiator_session,
            link.responder,
            link.responder_session,
            link.budget,
            link.created_at,
            link.state.value,
            link.turns_used,
            link.closed_at,
            link.close_reason,
            json.dumps([dict(h) for h in link.history], separators=(",", ":")),
        )

    def insert_link(self, link: Link) -> Link:
        existing = self.find_open_link(link.team, link.initiator, link.responder)
        if existing is not None:
            return existing
        self._c.execute(
            f"INSERT INTO links ({self._LINK_COLS}, pair) VALUES ({','.join('?' * 14)})",
            (*self._link_args(link), link.pair),
        )
        return link

    def get_link(self, team: str, link_id: str) -> Link | None:
        row = self._one(
            f"SELECT {self._LINK_COLS} FROM links WHERE team = ? AND link_id = ?", (team, link_id)
        )
        return self._link(row) if row else None

    def find_open_link(self, team: str, member_a: str, member_b: str) -> Link | None:
        pair = "|".join(sorted((member_a, member_b)))
        row = self._one(
            f"SELECT {self._LINK_COLS} FROM links WHERE team = ? AND pair = ? AND state = 'open'",
            (team, pair),
        )
        return self._link(row) if row else None

    def update_link(self, link: Link) -> None:
        args = self._link_args(link)
        self._c.execute(
            "UPDATE links SET initiator = ?, initiator_session = ?, responder = ?, "
            "responder_session = ?, budget = ?, created_at = ?, state = ?, turns_used = ?, "
            "closed_at = ?, close_reason = ?, history = ? WHERE team = ? AND link_id = ?",
            (*args[2:], link.team, link.link_id),
        )

    def list_links(
        self, team: str, *, member: str | None = None, open_only: bool = False
    ) -> list[Link]:
        sql, args = links_query(self._LINK_COLS, team, member, open_only)
        rows = self._c.execute(sql, args)
        return [self._link(r) for r in rows]

    # -- jobs ----------------------------------------------------------------
    _JOB_COLS = "id, team, kind, due_at, created_at, session_id, payload, state, done_at"

    @staticmethod
    def _job(r: Sequence[Any]) -> Job:
        return Job(
            team=r[1],
            kind=r[2],
            due_at=r[3],
            created_at=r[4],
            session_id=r[5],
            payload=_loads(r[6]),
            state=JobState(r[7]),
            job_id=r[0],
            done_at=r[8],
        )

    def add_job(self, job: Job) -> int:
        j = job
        cur = self._c.execute(
            "INSERT INTO jobs (team, kind, due_at, created_at, session_id, payload, state) "
            "VALUES (?, ?, ?, ?, ?, ?, 'pending')",
            (j.team, j.kind, j.due_at, j.created_at, j.session_id, _dumps(j.payload)),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def get_job(self, team: str, job_id: int) -> Job | None:
        row = self._one(
            f"SELECT {self._JOB_COLS} FROM jobs WHERE id = ? AND team = ?", (job_id, team)
        )
        return self._job(row) if row else None

    def due_jobs(self, now: float, limit: int) -> list[Job]:
        rows = self._c.execute(
            f"SELECT {self._JOB_COLS} FROM jobs WHERE state = 'pending' AND due_at <= ? "
            "ORDER BY due_at, id LIMIT ?",
            (now, limit),
        )
        return [self._job(r) for r in rows]

    def next_job_due(self) -> float | None:
        row = self._one(
            "SELECT due_at FROM jobs WHERE state = 'pending' ORDER BY due_at, id LIMIT 1", ()
        )
        return row[0] if row else None

    def finish_job(self, job_id: int, state: JobState, at: float) -> bool:
        cur = self._c.execute(
            "UPDATE jobs SET state = ?, done_at = ? WHERE id = ? AND state = 'pending'",
            (state.value, at, job_id),
        )
        return cur.rowcount > 0

    def list_jobs(
        self,
        team: str,
        *,
        session_id: str | None = None,
        kind: str | None = None,
        pending_only: bool = True,
    ) -> list[Job]:
        sql = f"SELECT {self._JOB_COLS} FROM jobs WHERE team = ?"
        args: list[Any] = [team]
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        if pending_only:
            sql += " AND state = 'pending'"
        rows = self._c.execute(sql + " ORDER BY due_at, id", args)
        return [self._job(r) for r in rows]

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        cur = self._c.execute(
            "UPDATE jobs SET due_at = ?, payload = ? WHERE id = ? AND state = 'pending'",
            (due_at, _dumps(payload), job_id),
        )
        return cur.rowcount > 0

    # -- delegation ------------------------------------------------------------
    _DEL_COLS = (
        "team, delegation_id, route, caller, caller_session, tool_use_id, callee, task, "
        "created_at, deadline, batch, callee_session, state, result, error, answered_at, "
        "reply_service, reply_token"
    )

    @staticmethod
    def _delegation(r: Sequence[Any]) -> Delegation:
        return Delegation(
            team=r[0],
            delegation_id=r[1],
            route=Route(r[2]),
            caller=r[3],
            caller_session=r[4],
            tool_use_id=r[5],
            callee=r[6],
            task=r[7],
            created_at=r[8],
            deadline=r[9],
            batch=r[10],
            callee_session=r[11],
            state=DelegationState(r[12]),
            result=r[13],
            error=r[14],
            answered_at=r[15],
            reply_service=r[16],
            reply_token=r[17],
        )

    @staticmethod
    def _delegation_args(d: Delegation) -> tuple[Any, ...]:
        return (
            d.team,
            d.delegation_id,
            d.route.value,
            d.caller,
            d.caller_session,
            d.tool_use_id,
            d.callee,
            d.task,
            d.created_at,
            d.deadline,
            d.batch,
            d.callee_session,
            d.state.value,
            d.result,
            d.error,
            d.answered_at,
            d.reply_service,
            d.reply_token,
        )

    def insert_delegation(self, d: Delegation) -> None:
        self._insert(
            f"INSERT INTO delegations ({self._DEL_COLS}) VALUES ({','.join('?' * 18)})",
            self._delegation_args(d),
            f"delegation {d.delegation_id!r}",
        )

    def get_delegation(self, team: str, delegation_id: str) -> Delegation | None:
        row = self._one(
            f"SELECT {self._DEL_COLS} FROM delegations WHERE team = ? AND delegation_id = ?",
            (team, delegation_id),
        )
        return self._delegation(row) if row else None

    def find_delegation(
        self,
        team: str,
        *,
        caller_session: str | None = None,
        tool_use_id: str | None = None,
        callee_session: str | None = None,
    ) -> Delegation | None:
        if callee_session is not None:
            # the oldest one still waiting for its answer, else the oldest: two indexed
            # searches, however many delegations the session has answered
            sql = f"SELECT {self._DEL_COLS} FROM delegations WHERE team = ? AND callee_session = ?"
            order = " ORDER BY created_at, delegation_id LIMIT 1"
            row = self._one(sql + f" AND {OPEN_DELEGATION}" + order, (team, callee_session))
            if row is None:
                row = self._one(sql + order, (team, callee_session))
        else:
            row = self._one(
                f"SELECT {self._DEL_COLS} FROM delegations WHERE team = ? AND caller_session = ? "
                "AND tool_use_id = ?",
                (team, caller_session, tool_use_id),
            )
        return self._delegation(row) if row else None

    def update_delegation(self, d: Delegation) -> None:
        self._c.execute(
            "UPDATE delegations SET state = ?, result = ?, error = ?, answered_at = ?, "
            "callee_session = ? WHERE team = ? AND delegation_id = ?",
            (
                d.state.value,
                d.result,
                d.error,
                d.answered_at,
                d.callee_session,
                d.team,
                d.delegation_id,
            ),
        )

    def list_delegations(
        self, team: str, *, batch: str | None = None, member: str | None = None
    ) -> list[Delegation]:
        sql = f"SELECT {self._DEL_COLS} FROM delegations WHERE team = ?"
        args: list[Any] = [team]
        if batch is not None:
            sql += " AND batch = ?"
            args.append(batch)
        if member is not None:
            sql += " AND (caller = ? OR callee = ?)"
            args += [member, member]
        rows = self._c.execute(sql + " ORDER BY created_at, delegation_id", args)
        return [self._delegation(r) for r in rows]

    def spend_token(self, jti: str, expires_at: float) -> bool:
        cur = self._c.execute(
            "INSERT OR IGNORE INTO spent_tokens (jti, expires_at) VALUES (?, ?)", (jti, expires_at)
        )
        return cur.rowcount > 0

    def prune_delegations(self, team: str, *, ended_before: float, expired_before: float) -> int:
        cur = self._c.execute(
            "DELETE FROM delegations WHERE team = ? AND COALESCE(answered_at, deadline) < ? "
            "AND deadline < ? AND batch NOT IN "
            "(SELECT batch FROM delegations WHERE team = ? AND state = 'pending')",
            (team, ended_before, expired_before, team),
        )
        return cur.rowcount

    def prune_spent_tokens(self, now: float) -> int:
        return self._c.execute("DELETE FROM spent_tokens WHERE expires_at <= ?", (now,)).rowcount

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

    def inbox_record(self, entries: Sequence[InboxEntry]) -> None:
        self._c.executemany(
            "INSERT OR IGNORE INTO inbox_entries (team, inbox, entry_id, sender, kind, at, "
            "seen_at, terminates) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (e.team, e.inbox, e.entry_id, e.sender, e.kind, e.at, e.seen_at, int(e.terminates))
                for e in entries
            ],
        )

    def inbox_activity(self, team: str) -> list[MemberActivity]:
        rows = self._c.execute(INBOX_ACTIVITY_SQL.replace("%s", "?"), (team, team))
        return activity_rows(team, rows)

    def inbox_forget(self, team: str, inbox: str, before: float, keep: Collection[str]) -> int:
        rows = self._c.execute(
            "SELECT entry_id FROM inbox_entries WHERE team = ? AND inbox = ? AND seen_at < ?",
            (team, inbox, before),
        ).fetchall()
        drop = [(team, inbox, r[0]) for r in rows if r[0] not in keep]
        self._c.executemany(
            "DELETE FROM inbox_entries WHERE team = ? AND inbox = ? AND entry_id = ?", drop
        )
        return len(drop)

    # -- conversation budgets ----------------------------------------------------
    _BUDGET_COLS = "team, key, window_start, used, granted, last_from, stopped_at, updated_at"

    def get_budget(self, team: str, key: str) -> Budget | None:
        row = self._one(
            f"SELECT {self._BUDGET_COLS} FROM budgets WHERE team = ? AND key = ?", (team, key)
        )
        return Budget(*row) if row else None

    def put_budget(self, budget: Budget) -> None:
        b = budget
        self._c.execute(
            f"INSERT OR REPLACE INTO budgets ({self._BUDGET_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (b.team, b.key, b.window_start, b.used, b.granted, b.last_from, b.stopped_at,
             b.updated_at),
        )  # fmt: skip

    def list_budgets(self, team: str) -> list[Budget]:
        rows = self._c.execute(
            f"SELECT {self._BUDGET_COLS} FROM budgets WHERE team = ? ORDER BY key", (team,)
        )
        return [Budget(*r) for r in rows]

    # -- A2A tasks -----------------------------------------------------------
    def put_a2a_task(self, task: A2ATask) -> None:
        self._c.execute(
            "INSERT INTO a2a_tasks (team, task_id, member, owner, context_id, state, body, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (team, task_id) DO UPDATE SET member = excluded.member, "
            "owner = excluded.owner, context_id = excluded.context_id, state = excluded.state, "
            "body = excluded.body, updated_at = excluded.updated_at",
            astuple(task),
        )

    def get_a2a_task(self, team: str, task_id: str) -> A2ATask | None:
        row = self._one(
            "SELECT team, task_id, member, owner, context_id, state, body, created_at, updated_at FROM a2a_tasks WHERE team = ? AND task_id = ?",
            (team, task_id),
        )
        return A2ATask(*row) if row else None

    def list_a2a_tasks(self, team: str, member: str, owner: str) -> list[A2ATask]:
        rows = self._c.execute(
            "SELECT team, task_id, member, owner, context_id, state, body, created_at, updated_at FROM a2a_tasks WHERE team = ? AND member = ? AND owner = ? "
            "ORDER BY updated_at DESC, task_id",
            (team, member, owner),
        )
        return [A2ATask(*r) for r in rows]
