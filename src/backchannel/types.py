"""The vocabulary every other module speaks: names, states, and frozen value objects.

Times are UNIX seconds as ``float`` throughout (the clock is injected, see
:class:`Clock`); states and kinds are ``str`` enums stored as their text.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

__all__ = [
    "BROADCAST",
    "HUB_SENDER",
    "MESSAGE_ID_PATTERN",
    "NAME_PATTERN",
    "SESSION_PATTERN",
    "USER",
    "Budget",
    "Clock",
    "Delegation",
    "DelegationState",
    "Delivery",
    "DeliveryEvent",
    "DeliveryState",
    "EventKind",
    "InboxEntry",
    "InboxMessage",
    "Job",
    "JobState",
    "Lease",
    "LedgerEntry",
    "Link",
    "LinkState",
    "Member",
    "MemberActivity",
    "MemberKind",
    "Message",
    "MessageKind",
    "Recipient",
    "Route",
    "SendResult",
    "Session",
    "SessionEvent",
    "SessionState",
    "SystemClock",
    "Team",
]

#: ``to`` value that reaches every member of the team but the sender.
BROADCAST = "*"
#: The human member every team has.
USER = "user"
#: Sender name of the hub's own ``system`` messages; no member may take it.
HUB_SENDER = "hub"

# The shapes of names and ids, matched whole (``re.fullmatch``: with ``re.match`` a
# ``$`` also accepts a trailing newline). ECMA-262 reads them the same way, so the
# OpenAPI document publishes these very strings.
#: Team and member names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
#: Session ids (a runtime's own id may carry '.' and ':').
SESSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$"
#: Message ids, a caller's own or the hub's.
MESSAGE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"

Json = dict[str, Any]


class MemberKind(StrEnum):
    CLAUDE_CODE = "claude-code"
    CODEX = "codex"
    GEMINI = "gemini"
    LLM = "llm"
    HTTP = "http"
    HUMAN = "human"


class SessionState(StrEnum):
    ACTIVE = "active"  # a turn is running
    IDLE = "idle"  # between turns
    EXITED = "exited"  # its process exited; resumable until the team's exit grace ends
    TERMINATED = "terminated"


class EventKind(StrEnum):
    """What a runtime reports about a session's turn, plus the hub's own records."""

    TURN_START = "turn_start"
    THOUGHT = "thought"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    AGENT_OUTPUT = "agent_output"
    AGENT_STOP = "agent_stop"
    CHECKPOINT = "checkpoint"
    # recorded by the hub
    INPUT = "input"  # a message handed to the session
    SENT = "sent"  # a send made during the turn (tool call or closing block)
    DUPLICATE_DROPPED = "duplicate_dropped"
    ROUTING_ERROR = "routing_error"
    SESSION = "session"  # opened, resumed, recovered, terminated

    @property
    def reported(self) -> bool:
        """True for the kinds a runtime may report."""
        return self in _REPORTED


_REPORTED = frozenset(
    {
        EventKind.TURN_START,
        EventKind.THOUGHT,
        EventKind.TOOL_CALL,
        EventKind.TOOL_RESULT,
        EventKind.AGENT_OUTPUT,
        EventKind.AGENT_STOP,
    }
)


class MessageKind(StrEnum):
    DIRECT = "direct"
    LINK = "link"
    TIMER = "timer"
    DELEGATION = "delegation"
    TOOL_RESULT = "tool_result"
    CHECKPOINT = "checkpoint"
    SYSTEM = "system"


class DeliveryState(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DELIVERED = "delivered"
    ACKED = "acked"
    DEAD = "dead"

    @property
    def pending(self) -> bool:
        """True while the hub still owes the recipient this message."""
        return self in (DeliveryState.QUEUED, DeliveryState.LEASED)


class Clock(Protocol):
    """Where the hub reads the time. Tests inject :class:`backchannel.testing.FakeClock`.

    A hub on a database other hubs share compares its clock with the database's (see
    ``Maintenance.check_clock``); a clock that does not follow the wall clock says so
    with a ``follows_wall_clock = False`` attribute (:class:`FakeClock` does), and is
    not compared."""

    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    created_at: float
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Member:
    team: str
    name: str
    kind: MemberKind
    created_at: float
    token_hash: str = field(repr=False)
    delivery: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Session:
    team: str
    session_id: str
    member: str
    state: SessionState
    created_at: float
    updated_at: float
    turn: int = 0  # number of turns started; the current one while ACTIVE
    turn_started_at: float | None = None
    turn_kind: str = "normal"  # "normal" or "checkpoint"
    last_output: str = ""
    last_stop_at: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """One line of a session's private transcript."""

    team: str
    session_id: str
    turn: int
    at: float
    kind: EventKind
    text: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    event_id: int = 0  # assigned by the store; increases in commit order

    def to_json(self) -> Json:
        return {
            "event_id": self.event_id,
            "session": self.session_id,
            "turn": self.turn,
            "at": self.at,
            "kind": self.kind.value,
            "text": self.text,
            "data": dict(self.data),
        }


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A text a session sent during its current turn (for duplicate suppression)."""

    team: str
    session_id: str
    to: str
    digest: str  # of the normalized text
    message_id: str
    at: float


class JobState(StrEnum):
    PENDING = "pending"
    DONE = "done"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Job:
    """Work the hub must do at ``due_at``: fire a timer, a checkpoint, a deadline.

    Jobs are durable; a job due while the hub was down runs when it comes back.
    """

    team: str
    kind: str
    due_at: float
    created_at: float
    session_id: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    state: JobState = JobState.PENDING
    job_id: int = 0  # assigned by the store
    done_at: float | None = None
    #: a member whose next message the job waits for (a timer's target): the hub finds
    #: the job with ``Tx.watching`` on each of that member's sends, and ends the watch
    #: with ``Tx.end_watch`` once the message it waited for came
    watch: str | None = None
    #: how many times its firing failed before (maintenance set it aside and retries
    #: it; see ``hub.maintenance``): given to its handler, never stored
    failures: int = 0


class LinkState(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Link:
    """A bidirectional conversation: each side's finished turn goes to the other."""

    team: str
    link_id: str
    initiator: str
    initiator_session: str
    responder: str
    responder_session: str | None  # bound when the responder's session first takes part
    budget: int
    created_at: float
    state: LinkState = LinkState.OPEN
    turns_used: int = 0
    closed_at: float | None = None
    close_reason: str | None = None
    history: tuple[Mapping[str, Any], ...] = ()

    @property
    def pair(self) -> str:
        """The member pair, order-free: at most one open link per pair."""
        a, b = sorted((self.initiator, self.responder))
        return f"{a}|{b}"

    def peer_of(self, member: str) -> tuple[str, str | None]:
        if member == self.initiator:
            return self.responder, self.responder_session
        return self.initiator, self.initiator_session

    def to_json(self) -> Json:
        return {
            "link_id": self.link_id,
            "initiator": self.initiator,
            "initiator_session": self.initiator_session,
            "responder": self.responder,
            "responder_session": self.responder_session,
            "state": self.state.value,
            "budget": self.budget,
            "turns_used": self.turns_used,
            "created_at": self.created_at,
            "closed_at": self.closed_at,
            "close_reason": self.close_reason,
            "history": [dict(h) for h in self.history],
        }


class DelegationState(StrEnum):
    PENDING = "pending"  # the callee is working on it
    ANSWERED = "answered"
    TIMED_OUT = "timed_out"  # past its deadline: the caller got a synthesized error
    LATE = "late"  # answered after timing out: delivered as a late result
    FAILED = "failed"  # the answer could not be delivered (dead letter)


class Route(StrEnum):
    LOCAL = "local"  # caller and callee on this hub
    OUTBOUND = "outbound"  # this hub's caller, a callee on another hub
    INBOUND = "inbound"  # another hub's caller, a callee on this hub


@dataclass(frozen=True, slots=True)
class Delegation:
    """One agent called as an asynchronous tool by another."""

    team: str
    delegation_id: str
    route: Route
    caller: str  # member (or, inbound, the remote hub's member name)
    caller_session: str
    tool_use_id: str
    callee: str  # member here, or ``agent@service`` for outbound
    task: str
    created_at: float
    deadline: float
    batch: str  # the caller's turn: results of one batch are gathered
    callee_session: str | None = None
    state: DelegationState = DelegationState.PENDING
    result: str | None = None
    error: str | None = None
    answered_at: float | None = None
    reply_service: str | None = None  # inbound: where the answer goes
    reply_token: str | None = field(default=None, repr=False)
    #: of an answer to ``delegate`` only, never stored: the same call made again under
    #: its ``tool_use_id``, answered with the delegation the first made
    replayed: bool = field(default=False, compare=False)

    def to_json(self) -> Json:
        return {
            "delegation_id": self.delegation_id,
            "route": self.route.value,
            "caller": self.caller,
            "caller_session": self.caller_session,
            "tool_use_id": self.tool_use_id,
            "callee": self.callee,
            "callee_session": self.callee_session,
            "task": self.task,
            "state": self.state.value,
            "created_at": self.created_at,
            "deadline": self.deadline,
            "answered_at": self.answered_at,
            "result": self.result,
            "error": self.error,
            "replayed": self.replayed,
        }


@dataclass(frozen=True, slots=True)
class Recipient:
    """One copy's destination: a member, optionally pinned to one of its sessions."""

    member: str
    session: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """The durable envelope. ``to`` is what the sender wrote (a name, a session, or ``*``)."""

    team: str
    message_id: str
    sender: str
    to: str
    text: str
    kind: MessageKind
    created_at: float
    fingerprint: str
    summary: str | None = None
    sender_session: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: the conversation chain this message belongs to (started by a human's message, a
    #: timer or a task from outside) and how many agent-originated hops it is from there
    chain_id: str | None = None
    hop: int = 0

    def in_chain(self, chain_id: str, hop: int) -> Message:
        """This message as hop ``hop`` of chain ``chain_id``: ``dataclasses.replace``
        without its cost (it looks the fields up on every call, and every send is
        stamped)."""
        return Message(
            team=self.team,
            message_id=self.message_id,
            sender=self.sender,
            to=self.to,
            text=self.text,
            kind=self.kind,
            created_at=self.created_at,
            fingerprint=self.fingerprint,
            summary=self.summary,
            sender_session=self.sender_session,
            meta=self.meta,
            chain_id=chain_id,
            hop=hop,
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """How much of a conversation budget is spent: a pair of members
    (``key = "pair:a|b"``, names sorted) or a chain (``key = "chain:<id>"``).

    ``used`` counts exchanges (a pair) or hops (a chain) in the window that began at
    ``window_start``; ``granted`` is what a human or administrator added on top of the
    team's budget; ``last_from`` is the member who made the pair's last exchange;
    ``stopped_at`` is set while the budget is spent (the stop was announced)."""

    team: str
    key: str
    window_start: float
    used: int = 0
    granted: int = 0
    last_from: str | None = None
    stopped_at: float | None = None
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One recipient's copy of a message and where it stands."""

    team: str
    message_id: str
    recipient: Recipient
    seq: int
    state: DeliveryState
    attempts: int
    created_at: float
    updated_at: float
    lease_until: float | None = None
    dead_reason: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveryEvent:
    """A line of a delivery's history: ``queued``, ``leased``, ``lease_expired``, ``acked``..."""

    message_id: str
    member: str
    at: float
    event: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """An entry of a Claude Code inbox file that the hub has taken in (its read cursor).

    ``inbox`` names the file (``"<claude team>/<inbox name>"``); ``entry_id`` is the
    entry's ``msg_id``/``messageId`` or its derived id. ``kind`` is ``"message"`` (chat,
    now a hub message), ``"hub"`` (an entry the hub wrote itself), ``"skipped"``, or the
    protocol frame's ``type``; ``at`` is when the sender wrote it.
    """

    team: str
    inbox: str
    entry_id: str
    sender: str
    kind: str
    at: float
    seen_at: float
    terminates: bool = False


@dataclass(frozen=True, slots=True)
class MemberActivity:
    """What a member's inbox traffic says about it: its last activity, and when it
    last approved a shutdown."""

    team: str
    member: str
    last_at: float
    last_kind: str
    terminated_at: float | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease of one copy, as a give-back names it (``Tx.transition(lease=...)``):
    the receive it was leased to (``None``: no named receive), its attempt, and when it
    ends. A copy leased again, or answered again to its name (``Tx.held_again``), is
    under another lease: a give-back naming the old one leaves it alone."""

    holder: str | None
    attempt: int
    until: float


@dataclass(frozen=True, slots=True)
class InboxMessage:
    """A message as handed to its recipient: the envelope plus this copy's attempt number."""

    message: Message
    recipient: Recipient
    attempt: int
    seq: int
    #: when this copy was leased (its delivery's ``updated_at``), as :meth:`Tx.held`
    #: reports it (0 where the lease is not asked for): the order a stream sent it in
    leased_at: float = field(default=0.0, compare=False)
    #: when the lease it was handed under ends (its delivery's ``lease_until``), as
    #: :meth:`Tx.lease` and :meth:`Tx.held_again` report it (0 where not asked for):
    #: with ``attempt`` and the receive's name, the :class:`Lease` a give-back names
    lease_until: float = field(default=0.0, compare=False)

    def to_json(self) -> Json:
        m = self.message
        return {
            "message_id": m.message_id,
            "from": m.sender,
            "to": self.recipient.member,
            "session": self.recipient.session,
            "kind": m.kind.value,
            "text": m.text,
            "summary": m.summary,
            "created_at": m.created_at,
            "attempt": self.attempt,
            "meta": dict(m.meta),
            "chain_id": m.chain_id,
            "hop": m.hop,
        }


@dataclass(frozen=True, slots=True)
class SendResult:
    message_id: str
    status: DeliveryState
    recipients: tuple[Recipient, ...]
    replayed: bool = False
    #: what the sender should know although the send was taken (a recipient's push
    #: delivery is down, say)
    warnings: tuple[str, ...] = ()

    def to_json(self) -> Json:
        out: Json = {
            "message_id": self.message_id,
            "status": self.status.value,
            "recipients": [r.member for r in self.recipients],
        }
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


@dataclass(frozen=True, slots=True)
class A2ATask:
    """An A2A task a member works on: who asked (``owner``), the member's session that
    runs it, and the task as the A2A protocol shows it (``body``, JSON)."""

    team: str
    task_id: str
    member: str
    owner: str
    context_id: str
    state: str
    body: str
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class A2AClaim:
    """Which A2A task a caller's message started (``message_id``: the hub message that
    handed it to the member, :func:`backchannel.interfaces.a2a_tasks.input_id`). Written
    in the transaction that stores that message, so the same message sent again, to any
    hub on the store or to a hub restarted since, is answered with that one task."""

    team: str
    message_id: str
    task_id: str
    context_id: str
    created_at: float
