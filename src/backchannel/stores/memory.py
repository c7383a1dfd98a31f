"""In-memory store: the fake for unit tests and for trying things out.

It keeps every guarantee of the contract except durability (it forgets everything
when the process ends). Transaction functions run one at a time on the caller's
thread; an undo journal rolls back a function that raises.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from backchannel.errors import AlreadyExists
from backchannel.stores.base import (
    COMPACT_START,
    BudgetNeed,
    CompactCursor,
    Reads,
    SessionFilter,
    Store,
    Tx,
)
from backchannel.types import (
    A2AClaim,
    A2ATask,
    Budget,
    Delegation,
    DelegationState,
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
    LinkState,
    Member,
    MemberActivity,
    Message,
    Recipient,
    Session,
    SessionEvent,
    SessionState,
    Team,
)

T = TypeVar("T")
_MISSING = object()

_LEASABLE = (DeliveryState.QUEUED,)
_UNDELIVERED = (DeliveryState.QUEUED, DeliveryState.LEASED)


class _Data:
    def __init__(self) -> None:
        self.teams: dict[str, Team] = {}
        self.members: dict[tuple[str, str], Member] = {}
        self.tokens: dict[str, tuple[str, str]] = {}
        self.sessions: dict[tuple[str, str], Session] = {}
        self.messages: dict[tuple[str, str], Message] = {}
        self.deliveries: dict[tuple[str, str, str], Delivery] = {}
        # delivery key -> the named receive (``receive_id``) it was last leased to
        self.holders: dict[tuple[str, str, str], str] = {}
        # (team, member) -> {seq: delivery key} for copies not yet acked or dead
        self.open: dict[tuple[str, str], dict[int, tuple[str, str, str]]] = {}
        self.history: dict[tuple[str, str], list[DeliveryEvent]] = {}
        # team -> its history events with their cursors, oldest first; cursors come from
        # feed_seq (one sequence for every team, never reused)
        self.feed: dict[str, list[tuple[int, DeliveryEvent]]] = {}
        #: team -> the largest cursor of its events retention removed
        self.feed_removed: dict[str, int] = {}
        self.feed_seq = 0
        self.seq = 0
        self.events: dict[tuple[str, str], list[SessionEvent]] = {}
        self.event_seq = 0
        self.ledgers: dict[tuple[str, str], list[LedgerEntry]] = {}
        self.jobs: dict[int, Job] = {}
        self.links: dict[tuple[str, str], Link] = {}
        self.delegations: dict[tuple[str, str], Delegation] = {}
        self.spent: dict[str, float] = {}
        self.inbox: dict[tuple[str, str, str], InboxEntry] = {}
        self.budgets: dict[tuple[str, str], Budget] = {}
        self.a2a_tasks: dict[tuple[str, str], A2ATask] = {}
        # (team, hub message id) -> the A2A task the message started
        self.a2a_claims: dict[tuple[str, str], A2AClaim] = {}
        self.job_seq = 0
        # (team, member) -> (owner, lease_until): who pushes the member's messages
        self.dispatch: dict[tuple[str, str], tuple[str, float]] = {}
        # (team, member) -> its push circuit while the target is down
        self.circuits: dict[tuple[str, str], dict[str, Any]] = {}


class MemoryTx:
    def __init__(self, data: _Data) -> None:
        self._d = data
        self._undo: list[Callable[[], None]] = []

    prefetches = False

    def prefetch(self, reads: Reads) -> None:
        """Nothing to do: every read is a dictionary look-up."""

    # -- journal -----------------------------------------------------------
    def _set(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        old = table.get(key, _MISSING)
        if old is _MISSING:
            self._undo.append(lambda: table.pop(key, None))
        else:
            self._undo.append(lambda: table.__setitem__(key, old))
        table[key] = value

    def _pop(self, table: dict[Any, Any], key: Any) -> None:
        old = table.pop(key, _MISSING)
        if old is not _MISSING:
            self._undo.append(lambda: table.__setitem__(key, old))

    def _append(self, seq: list[Any], item: Any) -> None:
        seq.append(item)
        self._undo.append(seq.pop)

    def _rollback(self) -> None:
        while self._undo:
            self._undo.pop()()

    # -- teams -------------------------------------------------------------
    def get_team(self, name: str) -> Team | None:
        return self._d.teams.get(name)

    def insert_team(self, team: Team) -> None:
        if team.name in self._d.teams:
            raise AlreadyExists(f"team {team.name!r} already exists")
        self._set(self._d.teams, team.name, team)

    def link_crossings(self, team: str) -> int:
        return sum(x.turns_used for (t, _), x in self._d.links.items() if t == team)

    def list_teams(self, *, after: str | None = None, limit: int | None = None) -> list[Team]:
        names = sorted(k for k in self._d.teams if after is None or k > after)
        return [self._d.teams[k] for k in names[:limit]]

    def count_teams(self) -> int:
        return len(self._d.teams)

    # -- members -----------------------------------------------------------
    def get_member(self, team: str, name: str) -> Member | None:
        return self._d.members.get((team, name))

    def member_by_token_hash(self, token_hash: str) -> Member | None:
        key = self._d.tokens.get(token_hash)
        return self._d.members.get(key) if key else None

    def insert_member(self, member: Member) -> None:
        key = (member.team, member.name)
        if key in self._d.members:
            raise AlreadyExists(f"member {member.name!r} already exists in team {member.team!r}")
        if member.token_hash in self._d.tokens:
            raise AlreadyExists("token hash collision")
        self._set(self._d.members, key, member)
        self._set(self._d.tokens, member.token_hash, key)

    def update_member(self, member: Member) -> None:
        old = self._d.members.get((member.team, member.name))
        if old is not None:
            self._set(
                self._d.members,
                (member.team, member.name),
                dataclasses.replace(old, delivery=member.delivery, settings=member.settings),
            )

    def list_members(
        self, team: str, *, after: str | None = None, limit: int | None = None
    ) -> list[Member]:
        return sorted(
            (
                m
                for (t, _), m in self._d.members.items()
                if t == team and (after is None or m.name > after)
            ),
            key=lambda m: m.name,
        )[:limit]

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None:
        return self._d.sessions.get((team, session_id))

    def put_session(self, session: Session) -> None:
        self._set(self._d.sessions, (session.team, session.session_id), session)

    def list_sessions(
        self,
        team: str,
        member: str | None = None,
        *,
        which: SessionFilter = "all",
        limit: int | None = None,
        after: tuple[float, str] | None = None,
    ) -> list[Session]:
        found = [
            s
            for (t, _), s in self._d.sessions.items()
            if t == team
            and (member is None or s.member == member)
            and (after is None or (s.created_at, s.session_id) > after)
            and (
                which == "all"
                or (which == "live" and s.state is not SessionState.TERMINATED)
                or (which == "active" and s.state is SessionState.ACTIVE)
            )
        ]
        return sorted(found, key=lambda s: (s.created_at, s.session_id))[:limit]

    def session_counts(self, team: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for (t, _), s in self._d.sessions.items():
            if t == team:
                counts[s.member] = counts.get(s.member, 0) + 1
        return counts

    def latest_sessions(self, team: str, member: str, limit: int) -> list[Session]:
        found = self.list_sessions(team, member)
        return found[::-1][:limit]

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None:
        return self._d.messages.get((team, message_id))

    def _event(self, team: str, ev: DeliveryEvent) -> None:
        hist = self._d.history.get((team, ev.message_id))
        if hist is None:
            hist = []
            self._set(self._d.history, (team, ev.message_id), hist)
        self._append(hist, ev)
        feed = self._d.feed.get(team)
        if feed is None:
            feed = []
            self._set(self._d.feed, team, feed)
        old_seq = self._d.feed_seq
        self._d.feed_seq += 1
        self._undo.append(functools.partial(setattr, self._d, "feed_seq", old_seq))
        self._append(feed, (self._d.feed_seq, ev))

    def insert_message(self, message: Message, recipients: Sequence[Recipient]) -> list[Delivery]:
        key = (message.team, message.message_id)
        if key in self._d.messages:
            raise AlreadyExists(f"message {message.message_id!r} already exists")
        self._set(self._d.messages, key, message)
        out = []
        for r in recipients:
            old_seq = self._d.seq
            self._d.seq += 1
            self._undo.append(functools.partial(setattr, self._d, "seq", old_seq))
            d = Delivery(
                team=message.team,
                message_id=message.message_id,
                recipient=r,
                seq=self._d.seq,
                state=DeliveryState.QUEUED,
                attempts=0,
                created_at=message.created_at,
                updated_at=message.created_at,
            )
            dkey = (message.team, message.message_id, r.member)
            self._set(self._d.deliveries, dkey, d)
            inbox = self._d.open.get((message.team, r.member))
            if inbox is None:
                inbox = {}
                self._set(self._d.open, (message.team, r.member), inbox)
            self._set(inbox, d.seq, dkey)
            self._event(
                message.team,
                DeliveryEvent(message.message_id, r.member, message.created_at, "queued"),
            )
            out.append(d)
        return out

    def _replace(self, d: Delivery, **changes: Any) -> Delivery:
        new = dataclasses.replace(d, **changes)
        key = (d.team, d.message_id, d.recipient.member)
        self._set(self._d.deliveries, key, new)
        if not new.state.pending:
            inbox = self._d.open.get((d.team, d.recipient.member))
            if inbox is not None and d.seq in inbox:
                self._pop(inbox, d.seq)
        return new

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
        inbox = self._d.open.get((team, member), {})
        out: list[InboxMessage] = []
        for seq in sorted(inbox):
            if len(out) >= limit:
                break
            d = self._d.deliveries[inbox[seq]]
            if d.state not in _LEASABLE:
                continue
            if d.recipient.session is not None and d.recipient.session != session:
                continue
            if d.recipient.session is None and not include_unpinned:
                continue
            d = self._replace(
                d,
                state=DeliveryState.LEASED,
                attempts=d.attempts + 1,
                lease_until=lease_until,
                updated_at=now,
            )
            self._event(
                team, DeliveryEvent(d.message_id, member, now, "leased", f"attempt {d.attempts}")
            )
            key = (team, d.message_id, member)
            if holder is None:
                self._pop(self._d.holders, key)
            else:
                self._set(self._d.holders, key, holder)
            msg = self._d.messages[(team, d.message_id)]
            out.append(InboxMessage(msg, d.recipient, d.attempts, d.seq, lease_until=lease_until))
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
        inbox = self._d.open.get((team, member), {})
        found: list[Delivery] = []
        for key in inbox.values():
            d = self._d.deliveries[key]
            if (
                d.state is DeliveryState.LEASED
                and d.lease_until is not None
                and d.lease_until > now
                and self._d.holders.get(key) == holder
                and (after is None or (d.updated_at, d.seq) > after)
            ):
                found.append(d)
        found.sort(key=lambda d: (d.updated_at, d.seq))
        return [
            InboxMessage(
                self._d.messages[(team, d.message_id)],
                d.recipient,
                d.attempts,
                d.seq,
                d.updated_at,
                d.lease_until or 0.0,
            )
            for d in found[:limit]
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
        out = []
        for m in self.held(team, member, holder, now, after, limit):
            d = self._d.deliveries[(team, m.message.message_id, member)]
            assert d.lease_until is not None
            until = math.nextafter(d.lease_until, math.inf)
            self._replace(d, lease_until=until)
            out.append(dataclasses.replace(m, lease_until=until))
        return out

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        found = [d for d in self._leased() if d.lease_until is not None and d.lease_until <= now]
        return sorted(found, key=lambda d: (d.lease_until, d.seq))[:limit]

    def _leased(self) -> list[Delivery]:
        out = []
        for inbox in self._d.open.values():
            for key in inbox.values():
                d = self._d.deliveries[key]
                if d.state is DeliveryState.LEASED:
                    out.append(d)
        return out

    def next_lease_expiry(self) -> float | None:
        times = [d.lease_until for d in self._leased() if d.lease_until is not None]
        return min(times) if times else None

    def restart_leases(
        self, now: float, given_after: float, limit: int, given_before: float = 1e15
    ) -> list[Delivery]:
        found = [
            d
            for d in self._leased()
            if d.lease_until is not None and given_after < d.updated_at < given_before
        ]
        found = sorted(found, key=lambda d: (d.lease_until, d.seq))[:limit]
        for d in found:
            assert d.lease_until is not None
            self._replace(d, lease_until=now + d.lease_until - d.updated_at, updated_at=now)
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
        d = self._d.deliveries.get((team, message_id, member))
        if d is None or d.state not in from_states:
            return False
        if lease is not None and (
            self._d.holders.get((team, message_id, member)) != lease.holder
            or d.attempts != lease.attempt
            or d.lease_until != lease.until
        ):
            return False  # under another lease now
        self._replace(
            d,
            state=to_state,
            attempts=max(d.attempts - 1, 0) if refund else d.attempts,
            updated_at=now,
            lease_until=d.lease_until if to_state is DeliveryState.LEASED else None,
            dead_reason=dead_reason if to_state is DeliveryState.DEAD else d.dead_reason,
        )
        self._event(team, DeliveryEvent(message_id, member, now, event, detail))
        return True

    def ack(self, team: str, member: str, message_ids: Sequence[str], now: float) -> list[str]:
        acked = []
        for mid in dict.fromkeys(message_ids):
            d = self._d.deliveries.get((team, mid, member))
            if d is None:
                continue
            if d.state is DeliveryState.ACKED:
                acked.append(mid)
            elif d.state in (DeliveryState.LEASED, DeliveryState.DELIVERED) or (
                d.state is DeliveryState.QUEUED and d.attempts > 0
            ):
                self._replace(d, state=DeliveryState.ACKED, lease_until=None, updated_at=now)
                self._event(team, DeliveryEvent(mid, member, now, "acked"))
                acked.append(mid)
        return acked

    def first_message_from(
        self, team: str, sender: str, recipient: str, since: float
    ) -> Message | None:
        found = [
            m
            for (t, _), m in self._d.messages.items()
            if t == team
            and m.sender == sender
            and m.created_at >= since
            and (team, m.message_id, recipient) in self._d.deliveries
        ]
        return min(found, key=lambda m: m.created_at) if found else None

    def unread_from(self, team: str, member: str, sender: str, limit: int) -> list[Message]:
        inbox = self._d.open.get((team, member), {})
        found = (self._d.deliveries[inbox[seq]] for seq in sorted(inbox))
        out = []
        for d in found:
            m = self._d.messages.get((team, d.message_id))
            if d.state is DeliveryState.QUEUED and m is not None and m.sender == sender:
                out.append(m)
        return out[:limit]

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        self._event(team, event)

    def add_reaction(self, team: str, event: DeliveryEvent) -> bool:
        e = event
        for had in self._d.history.get((team, e.message_id), ()):
            if (had.member, had.event, had.detail) == (e.member, "reaction", e.detail):
                return False
        self._event(team, dataclasses.replace(e, event="reaction"))
        return True

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        found = [d for (t, m, _), d in self._d.deliveries.items() if t == team and m == message_id]
        return sorted(found, key=lambda d: d.recipient.member)

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        return list(self._d.history.get((team, message_id), []))

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        feed = self._d.feed.get(team, [])
        start = bisect.bisect_right(feed, after, key=lambda item: item[0])
        return feed[start : start + limit]

    def feed_removed(self, team: str) -> int:
        return self._d.feed_removed.get(team, 0)

    def feed_start(self, team: str, last: int) -> int:
        feed = self._d.feed.get(team, [])
        return feed[-last - 1][0] if len(feed) > last else 0

    def dead_letters(self, team: str, limit: int) -> tuple[list[Delivery], int]:
        dead = [
            d
            for (t, _, _), d in self._d.deliveries.items()
            if t == team and d.state is DeliveryState.DEAD
        ]
        dead.sort(key=lambda d: (d.updated_at, d.seq), reverse=True)
        return dead[:limit], len(dead)

    def pending_count(self, team: str, member: str) -> int:
        inbox = self._d.open.get((team, member), {})
        return sum(1 for key in inbox.values() if self._d.deliveries[key].state.pending)

    def pending_counts(self, team: str) -> dict[str, int]:
        counts = {m: self.pending_count(t, m) for (t, m) in self._d.open if t == team}
        return {m: n for m, n in counts.items() if n}

    # -- credentials, removal, quota counts ------------------------------------
    def set_token_hash(self, team: str, name: str, token_hash: str) -> bool:
        old = self._d.members.get((team, name))
        if old is None:
            return False
        self._pop(self._d.tokens, old.token_hash)
        self._set(self._d.tokens, token_hash, (team, name))
        self._set(self._d.members, (team, name), dataclasses.replace(old, token_hash=token_hash))
        return True

    def delete_member(self, team: str, name: str) -> bool:
        old = self._d.members.get((team, name))
        if old is None:
            return False
        self._pop(self._d.tokens, old.token_hash)
        self._pop(self._d.members, (team, name))
        if (team, name) in self._d.circuits:
            self._pop(self._d.circuits, (team, name))
        return True

    def delete_team(self, name: str) -> int:
        d = self._d
        dropped = sum(
            1 for (t, _, _), x in d.deliveries.items() if t == name and x.state in _UNDELIVERED
        )
        for m in [m for (t, _), m in d.members.items() if t == name]:
            self._pop(d.tokens, m.token_hash)
        tables: list[dict[Any, Any]] = [
            d.members, d.sessions, d.messages, d.deliveries, d.open, d.history, d.events,
            d.ledgers, d.links, d.delegations, d.budgets, d.inbox, d.a2a_tasks, d.dispatch,
            d.circuits, d.a2a_claims,
        ]  # fmt: skip
        for table in tables:
            for key in [k for k in table if k[0] == name]:
                self._pop(table, key)
        for job_id in [j for j, job in d.jobs.items() if job.team == name]:
            self._pop(d.jobs, job_id)
        self._pop(d.feed, name)
        self._pop(d.feed_removed, name)
        self._pop(d.teams, name)
        return dropped

    def undelivered(self, team: str, member: str, limit: int) -> list[Delivery]:
        inbox = self._d.open.get((team, member), {})
        found = (self._d.deliveries[inbox[seq]] for seq in sorted(inbox))
        return [x for x in found if x.state in _UNDELIVERED][:limit]

    def queued_count(self, team: str, member: str, limit: int) -> int:
        inbox = self._d.open.get((team, member), {})
        n = 0
        for key in inbox.values():
            if self._d.deliveries[key].state is DeliveryState.QUEUED:
                n += 1
                if n >= limit:
                    break
        return n

    def count_jobs(self, team: str, session_id: str, kind: str, limit: int) -> int:
        n = 0
        for job in self._d.jobs.values():
            if (job.team, job.session_id, job.kind, job.state) == (
                team,
                session_id,
                kind,
                JobState.PENDING,
            ):
                n += 1
                if n >= limit:
                    break
        return n

    def count_timers(self, team: str, member: str, limit: int) -> int:
        n = 0
        for job in self._d.jobs.values():
            if (job.team, job.kind, job.state) != (team, "timer", JobState.PENDING):
                continue
            if job.payload.get("member") != member:
                continue
            s = self._d.sessions.get((team, job.session_id or ""))
            if s is not None and s.state is SessionState.TERMINATED:
                continue
            n += 1
            if n >= limit:
                break
        return n

    def _bump(self, attr: str) -> int:
        old = getattr(self._d, attr)
        self._undo.append(functools.partial(setattr, self._d, attr, old))
        setattr(self._d, attr, old + 1)
        return int(old + 1)

    def compact(
        self, before: float, after: CompactCursor | None, limit: int
    ) -> tuple[int, CompactCursor | None]:
        start = after or COMPACT_START
        rows = sorted(
            (
                m
                for m in self._d.messages.values()
                if m.created_at < before and (m.created_at, m.team, m.message_id) > start
            ),
            key=lambda m: (m.created_at, m.team, m.message_id),
        )[:limit]
        gone: dict[str, set[str]] = {}  # team -> ids removed
        for m in rows:
            copies = [
                key
                for key, d in self._d.deliveries.items()
                if key[0] == m.team and key[1] == m.message_id
            ]
            final = (DeliveryState.ACKED, DeliveryState.DEAD)
            if any(
                (d := self._d.deliveries[key]).state not in final or d.updated_at >= before
                for key in copies
            ):
                continue
            for key in copies:
                self._pop(self._d.deliveries, key)
            self._pop(self._d.history, (m.team, m.message_id))
            self._pop(self._d.messages, (m.team, m.message_id))
            gone.setdefault(m.team, set()).add(m.message_id)
        for team, ids in gone.items():  # their events leave the feed too, as in SQL
            feed = self._d.feed.get(team, [])
            top = max((c for c, e in feed if e.message_id in ids), default=0)
            if top > self._d.feed_removed.get(team, 0):
                self._set(self._d.feed_removed, team, top)
            self._set(self._d.feed, team, [e for e in feed if e[1].message_id not in ids])
        for job_id, job in list(self._d.jobs.items()):
            if job.state is not JobState.PENDING and (job.done_at or before) < before:
                self._pop(self._d.jobs, job_id)
        last = rows[-1] if len(rows) == limit else None
        removed = sum(len(ids) for ids in gone.values())
        return removed, (last.created_at, last.team, last.message_id) if last else None

    # -- transcripts ---------------------------------------------------------
    def claim_dispatch(
        self, team: str, member: str, owner: str, now: float, lease_until: float
    ) -> bool:
        held = self._d.dispatch.get((team, member))
        if held is not None and held[0] != owner and held[1] > now:
            return False
        self._set(self._d.dispatch, (team, member), (owner, lease_until))
        return True

    def release_dispatch(self, team: str, member: str, owner: str) -> bool:
        held = self._d.dispatch.get((team, member))
        if held is None or held[0] != owner:
            return False
        self._pop(self._d.dispatch, (team, member))
        return True

    def dispatch_owner(self, team: str, member: str) -> tuple[str, float] | None:
        return self._d.dispatch.get((team, member))

    # -- push circuits ---------------------------------------------------------
    def push_circuit(self, team: str, member: str) -> dict[str, Any] | None:
        state = self._d.circuits.get((team, member))
        return dict(state) if state is not None else None

    def push_circuits(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(k[0], k[1], dict(self._d.circuits[k])) for k in sorted(self._d.circuits)]

    def set_push_circuit(self, team: str, member: str, state: Mapping[str, Any] | None) -> None:
        if state is None:
            if (team, member) in self._d.circuits:
                self._pop(self._d.circuits, (team, member))
        else:
            self._set(self._d.circuits, (team, member), dict(state))

    def requeue_leased(self, team: str, member: str, now: float, detail: str) -> list[str]:
        inbox = self._d.open.get((team, member), {})
        out: list[str] = []
        for seq in sorted(inbox):
            d = self._d.deliveries[inbox[seq]]
            if d.state is DeliveryState.LEASED:
                self._replace(d, state=DeliveryState.QUEUED, lease_until=None, updated_at=now)
                self._event(team, DeliveryEvent(d.message_id, member, now, "released", detail))
                out.append(d.message_id)
        return out

    def unpin_session(
        self, team: str, member: str, session: str, now: float, detail: str
    ) -> list[str]:
        inbox = self._d.open.get((team, member), {})
        out: list[str] = []
        for seq in sorted(inbox):
            d = self._d.deliveries[inbox[seq]]
            if d.recipient.session == session:
                self._replace(d, recipient=Recipient(member), updated_at=now)
                self._event(team, DeliveryEvent(d.message_id, member, now, "unpinned", detail))
                out.append(d.message_id)
        return out

    def append_event(self, event: SessionEvent) -> int:
        eid = self._bump("event_seq")
        key = (event.team, event.session_id)
        events = self._d.events.get(key)
        if events is None:
            events = []
            self._set(self._d.events, key, events)
        self._append(events, dataclasses.replace(event, event_id=eid))
        return eid

    def note_event(self, event: SessionEvent) -> None:
        self.append_event(event)

    def list_events(
        self, team: str, session_id: str, after: int, until: int | None, limit: int
    ) -> list[SessionEvent]:
        out = []
        for ev in self._d.events.get((team, session_id), []):
            if ev.event_id <= after or (until is not None and ev.event_id > until):
                continue
            out.append(ev)
            if len(out) >= limit:
                break
        return out

    # -- ledger --------------------------------------------------------------
    def ledger_add(self, entry: LedgerEntry) -> None:
        key = (entry.team, entry.session_id)
        entries = self._d.ledgers.get(key)
        if entries is None:
            entries = []
            self._set(self._d.ledgers, key, entries)
        self._append(entries, entry)

    def ledger(self, team: str, session_id: str) -> list[LedgerEntry]:
        return list(self._d.ledgers.get((team, session_id), []))

    def ledger_clear(self, team: str, session_id: str) -> int:
        n = len(self._d.ledgers.get((team, session_id), []))
        if n:
            self._pop(self._d.ledgers, (team, session_id))
        return n

    def ledger_forget(self, team: str, session_id: str) -> None:
        self.ledger_clear(team, session_id)

    # -- links ---------------------------------------------------------------
    def insert_link(self, link: Link) -> Link:
        existing = self.find_open_link(link.team, link.initiator, link.responder)
        if existing is not None:
            return existing
        self._set(self._d.links, (link.team, link.link_id), link)
        return link

    def get_link(self, team: str, link_id: str) -> Link | None:
        return self._d.links.get((team, link_id))

    def find_open_link(self, team: str, member_a: str, member_b: str) -> Link | None:
        pair = "|".join(sorted((member_a, member_b)))
        for (t, _), link in self._d.links.items():
            if t == team and link.state is LinkState.OPEN and link.pair == pair:
                return link
        return None

    def update_link(self, link: Link) -> None:
        self._set(self._d.links, (link.team, link.link_id), link)

    def list_links(
        self,
        team: str,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[Link]:
        found = [
            link
            for (t, _), link in self._d.links.items()
            if t == team
            and (member is None or member in (link.initiator, link.responder))
            and (not open_only or link.state is LinkState.OPEN)
            and (after is None or (link.created_at, link.link_id) > after)
        ]
        return sorted(found, key=lambda link: (link.created_at, link.link_id))[:limit]

    def latest_closed_links(self, team: str, limit: int) -> list[Link]:
        found = [x for x in self.list_links(team) if x.state is not LinkState.OPEN]
        return found[::-1][:limit]

    def count_closed_links(self, team: str) -> int:
        return sum(
            1 for (t, _), x in self._d.links.items() if t == team and x.state is not LinkState.OPEN
        )

    # -- jobs ----------------------------------------------------------------
    def add_job(self, job: Job) -> int:
        jid = self._bump("job_seq")
        self._set(self._d.jobs, jid, dataclasses.replace(job, job_id=jid, state=JobState.PENDING))
        return jid

    def get_job(self, team: str, job_id: int) -> Job | None:
        job = self._d.jobs.get(job_id)
        return job if job is not None and job.team == team else None

    def due_jobs(self, now: float, limit: int) -> list[Job]:
        due = [j for j in self._d.jobs.values() if j.state is JobState.PENDING and j.due_at <= now]
        return sorted(due, key=lambda j: (j.due_at, j.job_id))[:limit]

    def job_by_request(self, team: str, session_id: str, kind: str, request_id: str) -> Job | None:
        found = [
            j
            for j in self._d.jobs.values()
            if (j.team, j.session_id, j.kind) == (team, session_id, kind)
            and j.payload.get("request_id") == request_id
        ]
        return min(found, key=lambda j: j.job_id) if found else None

    def next_job_due(self) -> float | None:
        times = [j.due_at for j in self._d.jobs.values() if j.state is JobState.PENDING]
        return min(times) if times else None

    def last_job_id(self) -> int:
        return self._d.job_seq

    def finish_job(self, job_id: int, state: JobState, at: float) -> bool:
        job = self._d.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return False
        self._set(self._d.jobs, job_id, dataclasses.replace(job, state=state, done_at=at))
        return True

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
        if offset and limit is None:
            raise ValueError("list_jobs: an offset needs a limit")
        found = [
            j
            for j in self._d.jobs.values()
            if j.team == team
            and (session_id is None or j.session_id == session_id)
            and (kind is None or j.kind == kind)
            and (not pending_only or j.state is JobState.PENDING)
        ]
        ordered = sorted(found, key=lambda j: (j.due_at, j.job_id))
        return ordered[offset:] if limit is None else ordered[offset : offset + limit]

    def count_pending_jobs(self, team: str, kind: str) -> int:
        return sum(
            1
            for j in self._d.jobs.values()
            if j.team == team and j.kind == kind and j.state is JobState.PENDING
        )

    def pending_job_attempts(self, team: str, kind: str) -> int:
        return sum(
            int(j.payload.get("attempt", 0))
            for j in self._d.jobs.values()
            if j.team == team and j.kind == kind and j.state is JobState.PENDING
        )

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
        found = sorted(
            (
                j
                for j in self._d.jobs.values()
                if j.team == team
                and j.kind == "timer"
                and j.job_id > after
                and (not pending_only or j.state is JobState.PENDING)
                and (member is None or j.payload.get("member") == member)
                and (session_id is None or j.session_id == session_id)
            ),
            key=lambda j: j.job_id,
        )
        return found[:limit]

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        job = self._d.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return False
        self._set(
            self._d.jobs, job_id, dataclasses.replace(job, due_at=due_at, payload=dict(payload))
        )
        return True

    def watching(self, team: str, sender: str) -> list[Job]:
        found = [
            j
            for j in self._d.jobs.values()
            if j.watch == sender and j.team == team and j.state is JobState.PENDING
        ]
        return sorted(found, key=lambda j: j.job_id)

    def end_watch(self, job_id: int, payload: Mapping[str, Any]) -> bool:
        job = self._d.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING or job.watch is None:
            return False
        self._set(self._d.jobs, job_id, dataclasses.replace(job, watch=None, payload=dict(payload)))
        return True

    # -- delegation ------------------------------------------------------------
    def insert_delegation(self, d: Delegation) -> None:
        if (d.team, d.delegation_id) in self._d.delegations or self.find_delegation(
            d.team, caller_session=d.caller_session, tool_use_id=d.tool_use_id
        ):
            raise AlreadyExists(f"delegation {d.delegation_id!r} already exists")
        self._set(self._d.delegations, (d.team, d.delegation_id), d)

    def get_delegation(self, team: str, delegation_id: str) -> Delegation | None:
        return self._d.delegations.get((team, delegation_id))

    def find_delegation(
        self,
        team: str,
        *,
        caller_session: str | None = None,
        tool_use_id: str | None = None,
        callee_session: str | None = None,
    ) -> Delegation | None:
        if callee_session is not None:
            found = [
                d
                for (t, _), d in self._d.delegations.items()
                if t == team and d.callee_session == callee_session
            ]
            open_ = (DelegationState.PENDING, DelegationState.TIMED_OUT)
            found.sort(key=lambda d: (d.state not in open_, d.created_at, d.delegation_id))
            return found[0] if found else None
        for (t, _), d in self._d.delegations.items():
            if t == team and d.caller_session == caller_session and d.tool_use_id == tool_use_id:
                return d
        return None

    def update_delegation(self, d: Delegation) -> None:
        self._set(self._d.delegations, (d.team, d.delegation_id), d)

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
        found = [
            d
            for (t, _), d in self._d.delegations.items()
            if t == team
            and (batch is None or d.batch == batch)
            and (member is None or member in (d.caller, d.callee))
            and (peer is None or peer in (d.caller, d.callee))
            and (after is None or (d.created_at, d.delegation_id) > after)
            and (not pending_only or d.state is DelegationState.PENDING)
        ]
        return sorted(found, key=lambda d: (d.created_at, d.delegation_id))[:limit]

    def delegations_by_state(
        self, team: str, *, pending: bool, member: str | None = None, limit: int | None = None
    ) -> list[Delegation]:
        found = [
            d
            for d in self.list_delegations(team, member=member)
            if (d.state is DelegationState.PENDING) is pending
        ]
        return (found if pending else found[::-1])[:limit]

    def count_delegations(self, team: str, *, member: str | None = None) -> dict[str, int]:
        return dict(Counter(d.state.value for d in self.list_delegations(team, member=member)))

    def spend_token(self, jti: str, expires_at: float) -> bool:
        if jti in self._d.spent:
            return False
        self._set(self._d.spent, jti, expires_at)
        return True

    def prune_delegations(self, team: str, *, ended_before: float, expired_before: float) -> int:
        mine = [d for (t, _), d in self._d.delegations.items() if t == team]
        busy = {d.batch for d in mine if d.state is DelegationState.PENDING}
        gone = [
            d
            for d in mine
            if d.batch not in busy
            and (d.answered_at if d.answered_at is not None else d.deadline) < ended_before
            and d.deadline < expired_before
        ]
        for d in gone:
            self._pop(self._d.delegations, (team, d.delegation_id))
        return len(gone)

    def prune_spent_tokens(self, now: float) -> int:
        gone = [jti for jti, exp in self._d.spent.items() if exp <= now]
        for jti in gone:
            self._pop(self._d.spent, jti)
        return len(gone)

    def inbox_known(self, team: str, inbox: str, entry_ids: Sequence[str]) -> set[str]:
        return {i for i in entry_ids if (team, inbox, i) in self._d.inbox}

    def inbox_record(self, entries: Sequence[InboxEntry]) -> None:
        for e in entries:
            key = (e.team, e.inbox, e.entry_id)
            if key not in self._d.inbox:
                self._set(self._d.inbox, key, e)

    def inbox_activity(self, team: str) -> list[MemberActivity]:
        found: dict[str, MemberActivity] = {}
        for e in self._d.inbox.values():
            if e.team != team or e.kind in ("hub", "skipped"):
                continue
            a = found.get(e.sender) or MemberActivity(team, e.sender, e.at, e.kind)
            if e.at > a.last_at or (e.at == a.last_at and e.terminates):
                a = dataclasses.replace(a, last_at=e.at, last_kind=e.kind)
            if e.terminates and (a.terminated_at is None or e.at > a.terminated_at):
                a = dataclasses.replace(a, terminated_at=e.at)
            found[e.sender] = a
        return [found[k] for k in sorted(found)]

    def inbox_forget(self, team: str, inbox: str, before: float, keep: Collection[str]) -> int:
        drop = [
            k
            for k, e in self._d.inbox.items()
            if k[0] == team and k[1] == inbox and e.seen_at < before and k[2] not in keep
        ]
        for k in drop:
            self._pop(self._d.inbox, k)
        return len(drop)

    # -- conversation budgets ----------------------------------------------------
    def get_budget(self, team: str, key: str) -> Budget | None:
        return self._d.budgets.get((team, key))

    def put_budget(self, budget: Budget) -> None:
        self._set(self._d.budgets, (budget.team, budget.key), budget)

    def list_budgets(
        self,
        team: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        hidden: str | None = None,
    ) -> list[Budget]:
        return sorted(
            (
                b
                for (t, k), b in self._d.budgets.items()
                if t == team
                and (after is None or k > after)
                and not (hidden and k.startswith(hidden))
            ),
            key=lambda b: b.key,
        )[:limit]

    def _for_human(self, team: str, need: BudgetNeed) -> list[Budget]:
        def needs(b: Budget) -> bool:
            if b.key.startswith("chain:"):
                return b.used >= need.chain_budget + b.granted or b.granted > 0
            if b.key.startswith("pair:") and b.window_start > need.window_from:
                return b.used >= need.pair_budget + b.granted or b.granted > 0
            return False

        found = [b for (t, _), b in self._d.budgets.items() if t == team and needs(b)]
        return sorted(found, key=lambda b: (b.updated_at, b.key), reverse=True)

    def budgets_for_human(
        self, team: str, need: BudgetNeed, *, offset: int = 0, limit: int | None = None
    ) -> list[Budget]:
        found = self._for_human(team, need)[offset:]
        return found if limit is None else found[:limit]

    def count_budgets_for_human(self, team: str, need: BudgetNeed) -> int:
        return len(self._for_human(team, need))

    # -- A2A tasks -----------------------------------------------------------
    def put_a2a_task(self, task: A2ATask) -> None:
        self._set(self._d.a2a_tasks, (task.team, task.task_id), task)

    def get_a2a_task(self, team: str, task_id: str) -> A2ATask | None:
        return self._d.a2a_tasks.get((team, task_id))

    def list_a2a_tasks(self, team: str, member: str, owner: str) -> list[A2ATask]:
        found = [
            t
            for t in self._d.a2a_tasks.values()
            if (t.team, t.member, t.owner) == (team, member, owner)
        ]
        found.sort(key=lambda t: t.task_id)
        found.sort(key=lambda t: t.updated_at, reverse=True)
        return found

    def claim_a2a_message(self, claim: A2AClaim) -> A2AClaim:
        held = self._d.a2a_claims.get((claim.team, claim.message_id))
        if held is not None:
            return held
        self._set(self._d.a2a_claims, (claim.team, claim.message_id), claim)
        return claim

    def get_a2a_claim(self, team: str, message_id: str) -> A2AClaim | None:
        return self._d.a2a_claims.get((team, message_id))


class MemoryStore(Store):
    """Everything in dicts; see the module docstring."""

    def __init__(self) -> None:
        self.url = "memory://"
        self.identity = f"memory:{secrets.token_hex(16)}"  # each instance its own store
        self._data = _Data()
        self._lock = threading.Lock()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        with self._lock:
            tx = MemoryTx(self._data)
            try:
                return fn(tx)
            except BaseException:
                tx._rollback()
                raise
