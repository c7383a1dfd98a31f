"""In-memory store: the fake for unit tests and for trying things out.

It keeps every guarantee of the contract except durability (it forgets everything
when the process ends). Transaction functions run one at a time on the caller's
thread; an undo journal rolls back a function that raises.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from backchannel.errors import AlreadyExists
from backchannel.stores.base import Store, Tx
from backchannel.types import (
    Delegation,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxMessage,
    Job,
    JobState,
    LedgerEntry,
    Link,
    LinkState,
    Member,
    Message,
    Recipient,
    Session,
    SessionEvent,
    Team,
)

T = TypeVar("T")
_MISSING = object()

_LEASABLE = (DeliveryState.QUEUED,)


class _Data:
    def __init__(self) -> None:
        self.teams: dict[str, Team] = {}
        self.members: dict[tuple[str, str], Member] = {}
        self.tokens: dict[str, tuple[str, str]] = {}
        self.sessions: dict[tuple[str, str], Session] = {}
        self.messages: dict[tuple[str, str], Message] = {}
        self.deliveries: dict[tuple[str, str, str], Delivery] = {}
        # (team, member) -> {seq: delivery key} for copies not yet acked or dead
        self.open: dict[tuple[str, str], dict[int, tuple[str, str, str]]] = {}
        self.history: dict[tuple[str, str], list[DeliveryEvent]] = {}
        self.feed: list[tuple[int, str, DeliveryEvent]] = []
        self.seq = 0
        self.events: dict[tuple[str, str], list[SessionEvent]] = {}
        self.event_seq = 0
        self.ledgers: dict[tuple[str, str], list[LedgerEntry]] = {}
        self.jobs: dict[int, Job] = {}
        self.links: dict[tuple[str, str], Link] = {}
        self.delegations: dict[tuple[str, str], Delegation] = {}
        self.spent: dict[str, float] = {}
        self.job_seq = 0


class MemoryTx:
    def __init__(self, data: _Data) -> None:
        self._d = data
        self._undo: list[Callable[[], None]] = []

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

    def list_teams(self) -> list[Team]:
        return [self._d.teams[k] for k in sorted(self._d.teams)]

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

    def list_members(self, team: str) -> list[Member]:
        return sorted(
            (m for (t, _), m in self._d.members.items() if t == team), key=lambda m: m.name
        )

    # -- sessions ----------------------------------------------------------
    def get_session(self, team: str, session_id: str) -> Session | None:
        return self._d.sessions.get((team, session_id))

    def put_session(self, session: Session) -> None:
        self._set(self._d.sessions, (session.team, session.session_id), session)

    def list_sessions(self, team: str, member: str | None = None) -> list[Session]:
        found = [
            s
            for (t, _), s in self._d.sessions.items()
            if t == team and (member is None or s.member == member)
        ]
        return sorted(found, key=lambda s: (s.created_at, s.session_id))

    # -- messages ----------------------------------------------------------
    def get_message(self, team: str, message_id: str) -> Message | None:
        return self._d.messages.get((team, message_id))

    def _event(self, team: str, ev: DeliveryEvent) -> None:
        hist = self._d.history.get((team, ev.message_id))
        if hist is None:
            hist = []
            self._set(self._d.history, (team, ev.message_id), hist)
        self._append(hist, ev)
        self._append(self._d.feed, (len(self._d.feed) + 1, team, ev))

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
            msg = self._d.messages[(team, d.message_id)]
            out.append(InboxMessage(msg, d.recipient, d.attempts, d.seq))
        return out

    def expired_leases(self, now: float, limit: int) -> list[Delivery]:
        found = [d for d in self._leased() if d.lease_until is not None and d.lease_until <= now]
        return sorted(found, key=lambda d: d.seq)[:limit]

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
        d = self._d.deliveries.get((team, message_id, member))
        if d is None or d.state not in from_states:
            return False
        self._replace(
            d,
            state=to_state,
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
            elif d.state in (DeliveryState.LEASED, DeliveryState.DELIVERED):
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

    def add_history(self, team: str, event: DeliveryEvent) -> None:
        self._event(team, event)

    def deliveries(self, team: str, message_id: str) -> list[Delivery]:
        found = [d for (t, m, _), d in self._d.deliveries.items() if t == team and m == message_id]
        return sorted(found, key=lambda d: d.recipient.member)

    def history(self, team: str, message_id: str) -> list[DeliveryEvent]:
        return list(self._d.history.get((team, message_id), []))

    def feed(self, team: str, after: int, limit: int) -> list[tuple[int, DeliveryEvent]]:
        out = []
        for cursor, t, ev in self._d.feed[after:]:
            if t == team:
                out.append((cursor, ev))
                if len(out) >= limit:
                    break
        return out

    def pending_count(self, team: str, member: str) -> int:
        inbox = self._d.open.get((team, member), {})
        return sum(1 for key in inbox.values() if self._d.deliveries[key].state.pending)

    def _bump(self, attr: str) -> int:
        old = getattr(self._d, attr)
        self._undo.append(functools.partial(setattr, self._d, attr, old))
        setattr(self._d, attr, old + 1)
        return int(old + 1)

    # -- transcripts ---------------------------------------------------------
    def append_event(self, event: SessionEvent) -> int:
        eid = self._bump("event_seq")
        key = (event.team, event.session_id)
        events = self._d.events.get(key)
        if events is None:
            events = []
            self._set(self._d.events, key, events)
        self._append(events, dataclasses.replace(event, event_id=eid))
        return eid

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
        self, team: str, *, member: str | None = None, open_only: bool = False
    ) -> list[Link]:
        found = [
            link
            for (t, _), link in self._d.links.items()
            if t == team
            and (member is None or member in (link.initiator, link.responder))
            and (not open_only or link.state is LinkState.OPEN)
        ]
        return sorted(found, key=lambda link: (link.created_at, link.link_id))

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

    def next_job_due(self) -> float | None:
        times = [j.due_at for j in self._d.jobs.values() if j.state is JobState.PENDING]
        return min(times) if times else None

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
    ) -> list[Job]:
        found = [
            j
            for j in self._d.jobs.values()
            if j.team == team
            and (session_id is None or j.session_id == session_id)
            and (kind is None or j.kind == kind)
            and (not pending_only or j.state is JobState.PENDING)
        ]
        return sorted(found, key=lambda j: (j.due_at, j.job_id))

    def reschedule_job(self, job_id: int, due_at: float, payload: Mapping[str, Any]) -> bool:
        job = self._d.jobs.get(job_id)
        if job is None or job.state is not JobState.PENDING:
            return False
        self._set(
            self._d.jobs, job_id, dataclasses.replace(job, due_at=due_at, payload=dict(payload))
        )
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
        for (t, _), d in self._d.delegations.items():
            if t != team:
                continue
            if callee_session is not None:
                if d.callee_session == callee_session:
                    return d
            elif d.caller_session == caller_session and d.tool_use_id == tool_use_id:
                return d
        return None

    def update_delegation(self, d: Delegation) -> None:
        self._set(self._d.delegations, (d.team, d.delegation_id), d)

    def list_delegations(
        self, team: str, *, batch: str | None = None, member: str | None = None
    ) -> list[Delegation]:
        found = [
            d
            for (t, _), d in self._d.delegations.items()
            if t == team
            and (batch is None or d.batch == batch)
            and (member is None or member in (d.caller, d.callee))
        ]
        return sorted(found, key=lambda d: (d.created_at, d.delegation_id))

    def spend_token(self, jti: str, expires_at: float) -> bool:
        if jti in self._d.spent:
            return False
        self._set(self._d.spent, jti, expires_at)
        return True


class MemoryStore(Store):
    """Everything in dicts; see the module docstring."""

    def __init__(self) -> None:
        self.url = "memory://"
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
