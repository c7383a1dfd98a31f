"""Column lists and row mappers that SQLite and PostgreSQL share: how a row becomes a
value of :mod:`backchannel.types`, and a value the arguments of its ``INSERT``.

The two differ only in how a JSON column travels (SQLite stores text; PostgreSQL stores
``jsonb``, which psycopg hands back as dicts and lists), so each store builds its
:class:`Rows` once, at import, from its own JSON codec (:func:`rows`). Every column list
here is in the order its mapper reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backchannel.types import (
    Delegation,
    DelegationState,
    Delivery,
    DeliveryState,
    EventKind,
    Job,
    JobState,
    Link,
    LinkState,
    Member,
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

__all__ = [
    "A2A_COLS",
    "BUDGET_COLS",
    "DELIVERY_COLS",
    "DEL_COLS",
    "LEDGER_COLS",
    "LINK_COLS",
    "MEMBER_COLS",
    "MSG_COLS",
    "SESSION_COLS",
    "TEAM_COLS",
    "Rows",
    "delegation",
    "delegation_args",
    "delivery",
    "event_cols",
    "job_cols",
    "rows",
]

Row = Sequence[Any]

TEAM_COLS = "name, created_at, settings"
MEMBER_COLS = "team, name, kind, created_at, token_hash, delivery, settings"
SESSION_COLS = (
    "team, session_id, member, state, created_at, updated_at, turn, turn_started_at, "
    "turn_kind, last_output, last_stop_at, meta"
)
#: the messages table is aliased ``m`` wherever it is read (leases join it to deliveries)
MSG_COLS = (
    "m.team, m.message_id, m.sender, m.to_name, m.text, m.kind, m.created_at, "
    "m.fingerprint, m.summary, m.sender_session, m.meta, m.chain_id, m.hop"
)
DELIVERY_COLS = (
    "team, message_id, member, session, seq, state, attempts, created_at, updated_at, "
    "lease_until, dead_reason"
)
LINK_COLS = (
    "team, link_id, initiator, initiator_session, responder, responder_session, budget, "
    "created_at, state, turns_used, closed_at, close_reason, history"
)
DEL_COLS = (
    "team, delegation_id, route, caller, caller_session, tool_use_id, callee, task, "
    "created_at, deadline, batch, callee_session, state, result, error, answered_at, "
    "reply_service, reply_token"
)
LEDGER_COLS = "team, session_id, to_name, digest, message_id, at"
BUDGET_COLS = "team, key, window_start, used, granted, last_from, stopped_at, updated_at"
A2A_COLS = "team, task_id, member, owner, context_id, state, body, created_at, updated_at"
A2A_CLAIM_COLS = "team, message_id, task_id, context_id, created_at"


def job_cols(job_id: str) -> str:
    """The jobs columns; the id column is ``id`` in SQLite and ``job_id`` in PostgreSQL."""
    return f"team, kind, due_at, created_at, session_id, payload, state, {job_id}, done_at, watch"


def event_cols(event_id: str) -> str:
    """The session_events columns (``id`` in SQLite, ``event_id`` in PostgreSQL)."""
    return f"team, session_id, turn, at, kind, text, data, {event_id}"


def delivery(r: Row) -> Delivery:
    return Delivery(
        team=r[0], message_id=r[1], recipient=Recipient(r[2], r[3]), seq=r[4],
        state=DeliveryState(r[5]), attempts=r[6], created_at=r[7], updated_at=r[8],
        lease_until=r[9], dead_reason=r[10],
    )  # fmt: skip


def delegation(r: Row) -> Delegation:
    return Delegation(
        team=r[0], delegation_id=r[1], route=Route(r[2]), caller=r[3], caller_session=r[4],
        tool_use_id=r[5], callee=r[6], task=r[7], created_at=r[8], deadline=r[9], batch=r[10],
        callee_session=r[11], state=DelegationState(r[12]), result=r[13], error=r[14],
        answered_at=r[15], reply_service=r[16], reply_token=r[17],
    )  # fmt: skip


def delegation_args(d: Delegation) -> tuple[Any, ...]:
    return (
        d.team, d.delegation_id, d.route.value, d.caller, d.caller_session, d.tool_use_id,
        d.callee, d.task, d.created_at, d.deadline, d.batch, d.callee_session, d.state.value,
        d.result, d.error, d.answered_at, d.reply_service, d.reply_token,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rows:
    """One dialect's mappers; see :func:`rows`."""

    team: Callable[[Row], Team]
    member: Callable[[Row], Member]
    session: Callable[[Row], Session]
    message: Callable[[Row], Message]
    link: Callable[[Row], Link]
    job: Callable[[Row], Job]
    event: Callable[[Row], SessionEvent]
    team_args: Callable[[Team], tuple[Any, ...]]
    member_args: Callable[[Member], tuple[Any, ...]]
    session_args: Callable[[Session], tuple[Any, ...]]
    message_args: Callable[[Message], tuple[Any, ...]]
    #: every column of LINK_COLS but ``pair`` (an INSERT appends it)
    link_args: Callable[[Link], tuple[Any, ...]]


def rows(
    load: Callable[[Any], Mapping[str, Any]],
    load_list: Callable[[Any], Sequence[Any]],
    dump: Callable[[Mapping[str, Any] | None], Any],
    dump_list: Callable[[list[Any]], Any],
) -> Rows:
    """The mappers over a JSON codec: ``load`` turns a stored JSON object into a mapping
    (``{}`` for none), ``load_list`` a stored array into a sequence, ``dump`` and
    ``dump_list`` do the reverse."""

    def team(r: Row) -> Team:
        return Team(r[0], r[1], load(r[2]))

    def member(r: Row) -> Member:
        return Member(
            team=r[0], name=r[1], kind=MemberKind(r[2]), created_at=r[3], token_hash=r[4],
            delivery=load(r[5]), settings=load(r[6]),
        )  # fmt: skip

    def session(r: Row) -> Session:
        return Session(
            team=r[0], session_id=r[1], member=r[2], state=SessionState(r[3]),
            created_at=r[4], updated_at=r[5], turn=r[6], turn_started_at=r[7],
            turn_kind=r[8], last_output=r[9], last_stop_at=r[10], meta=load(r[11]),
        )  # fmt: skip

    kinds = {k.value: k for k in MessageKind}  # every leased row has one: no Enum call

    def message(r: Row) -> Message:
        return Message(
            team=r[0], message_id=r[1], sender=r[2], to=r[3], text=r[4],
            kind=kinds.get(r[5]) or MessageKind(r[5]), created_at=r[6], fingerprint=r[7],
            summary=r[8], sender_session=r[9], meta=load(r[10]), chain_id=r[11], hop=r[12],
        )  # fmt: skip

    def link(r: Row) -> Link:
        return Link(
            team=r[0], link_id=r[1], initiator=r[2], initiator_session=r[3], responder=r[4],
            responder_session=r[5], budget=r[6], created_at=r[7], state=LinkState(r[8]),
            turns_used=r[9], closed_at=r[10], close_reason=r[11],
            history=tuple(load_list(r[12])),
        )  # fmt: skip

    def job(r: Row) -> Job:
        return Job(
            team=r[0], kind=r[1], due_at=r[2], created_at=r[3], session_id=r[4],
            payload=load(r[5]), state=JobState(r[6]), job_id=r[7], done_at=r[8], watch=r[9],
        )  # fmt: skip

    def event(r: Row) -> SessionEvent:
        return SessionEvent(r[0], r[1], r[2], r[3], EventKind(r[4]), r[5], load(r[6]), r[7])

    def team_args(t: Team) -> tuple[Any, ...]:
        return (t.name, t.created_at, dump(t.settings))

    def member_args(m: Member) -> tuple[Any, ...]:
        return (m.team, m.name, m.kind.value, m.created_at, m.token_hash, dump(m.delivery),
                dump(m.settings))  # fmt: skip

    def session_args(s: Session) -> tuple[Any, ...]:
        return (s.team, s.session_id, s.member, s.state.value, s.created_at, s.updated_at,
                s.turn, s.turn_started_at, s.turn_kind, s.last_output, s.last_stop_at,
                dump(s.meta))  # fmt: skip

    def message_args(m: Message) -> tuple[Any, ...]:
        return (m.team, m.message_id, m.sender, m.sender_session, m.to, m.kind.value, m.text,
                m.summary, m.created_at, m.fingerprint, dump(m.meta), m.chain_id, m.hop)  # fmt: skip

    def link_args(k: Link) -> tuple[Any, ...]:
        return (
            k.team, k.link_id, k.initiator, k.initiator_session, k.responder,
            k.responder_session, k.budget, k.created_at, k.state.value, k.turns_used,
            k.closed_at, k.close_reason, dump_list([dict(h) for h in k.history]),
        )  # fmt: skip

    return Rows(team, member, session, message, link, job, event, team_args, member_args,
                session_args, message_args, link_args)  # fmt: skip
