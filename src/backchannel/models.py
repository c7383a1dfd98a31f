"""The wire models: every request body the API v1 reads and every answer it gives.

The HTTP routes validate bodies with the ``*In`` models and answer with the others; the
OpenAPI document shows them, names and ids with their patterns. The SDK returns the same
models whether it talks to a hub over HTTP or runs one in this process, so what a
caller gets cannot depend on where the hub runs.

Answers ignore fields they do not know (a newer hub may add some); request bodies refuse
them (a misspelt field is a mistake worth hearing about).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
)
from typing_extensions import TypeAliasType

from backchannel.core.budget import MAX_HOP
from backchannel.core.messages import MAX_LEASE, MAX_LIMIT, MAX_WAIT
from backchannel.core.timers import MAX_SECONDS as MAX_TIMER_SECONDS
from backchannel.core.timers import MIN_SECONDS as MIN_TIMER_SECONDS
from backchannel.types import MESSAGE_ID_PATTERN, NAME_PATTERN, SESSION_PATTERN, MemberKind

if TYPE_CHECKING:
    from backchannel.client import Client

#: Largest integer a typed field accepts: what a signed 64-bit column holds.
MAX_INT = 2**63 - 1
#: A member name, or ``*`` for every member but the sender.
TO_PATTERN = r"^(\*|[A-Za-z0-9][A-Za-z0-9_-]{0,63})$"
#: Most items in one batch request (sends or acks).
MAX_BATCH = 1000

#: Any JSON value kept as given (``data``, ``settings``, ``delivery``, ``meta``).
JsonValue = TypeAliasType(
    "JsonValue",
    "bool | int | Annotated[float, Field(allow_inf_nan=False)] | str | "
    "list[JsonValue] | dict[str, JsonValue] | None",
)
JsonObject = dict[str, JsonValue]

NameField = Annotated[str, Field(pattern=NAME_PATTERN)]
SessionField = Annotated[str, Field(pattern=SESSION_PATTERN)]
IdField = Annotated[str, Field(pattern=MESSAGE_ID_PATTERN)]
EventKindName = Literal[
    "turn_start", "thought", "tool_call", "tool_result", "agent_output", "agent_stop"
]


# -- request bodies -------------------------------------------------------------------

#: what ``receive_id`` is, in both receive routes' documentation
RECEIVE_ID = (
    "a name for this receive, new for each one and the same when the client makes it "
    "again because its answer was lost on the way (a proxy or a broken connection): "
    "the receive made again is answered with the messages the first one leased and "
    "still holds, instead of others while those wait out their lease"
)


class _Body(BaseModel):
    # strict: a JSON 0 is no boolean and "5" no number, as the schema says
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class TeamIn(_Body):
    name: NameField = Field(description="team name: letters, digits, '_' or '-', at most 64")
    settings: JsonObject = Field(default_factory=dict)


class MemberIn(_Body):
    name: NameField
    kind: Annotated[MemberKind, Field(strict=False)] = MemberKind.LLM
    delivery: JsonObject = Field(default_factory=dict)
    settings: JsonObject = Field(default_factory=dict)


class MemberPatch(_Body):
    delivery: JsonObject | None = None
    settings: JsonObject | None = None


class MessageIn(_Body):
    # a broadcast can neither name one session of its recipients nor close a link
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "not": {
                        "required": ["to", "session"],
                        "properties": {"to": {"const": "*"}, "session": {"type": "string"}},
                    }
                },
                {
                    "not": {
                        "required": ["to", "close_link"],
                        "properties": {"to": {"const": "*"}, "close_link": {"const": True}},
                    }
                },
            ]
        }
    )
    to: str = Field(
        pattern=TO_PATTERN, description="a member name, or '*' for every member but you"
    )
    text: str
    summary: str | None = None
    message_id: IdField | None = Field(None, description="your id for idempotent retries")
    session: SessionField | None = Field(
        None, description="deliver to this session of the recipient only"
    )
    from_session: SessionField | None = Field(
        None, description="your session that is sending (its turn)"
    )
    close_link: bool = Field(False, description="deliver, then close your open link with them")
    link: bool = Field(True, description="open a link to the recipient if none is open")
    link_budget: int | None = Field(None, ge=1, le=1000, description="turns for a new link")


class MessageBatchIn(_Body):
    """Many sends in one request. Each item is checked and answered on its own."""

    messages: list[JsonValue] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description=f"up to {MAX_BATCH} bodies of POST /v1/messages, each checked on its own",
    )


class AckIn(_Body):
    message_ids: list[IdField] = Field(min_length=1, max_length=MAX_BATCH)


#: The longest reason a give-up carries (``POST /v1/inbox/give-up``).
GIVE_UP_REASON = 1000


class GiveUpIn(_Body):
    """Leased messages their receiver will never handle (its model fails for good):
    each is dead with ``reason``, and its sender is told."""

    message_ids: list[IdField] = Field(min_length=1, max_length=MAX_BATCH)
    reason: str = Field(
        min_length=1,
        max_length=GIVE_UP_REASON,
        description="why they will never be handled: the senders read it in their notice",
    )


class ReceiveIn(_Body):
    """A receive that first acks the messages you are done with: ``GET /v1/inbox``'s
    parameters, and ``ack``."""

    ack: list[IdField] = Field(
        default_factory=list,
        max_length=MAX_BATCH,
        description=(
            f"up to {MAX_BATCH} ids of messages you received earlier and are done with; "
            "acked in the same transaction as the first lease, before any wait"
        ),
    )
    limit: int = Field(10, ge=1, le=MAX_LIMIT)
    wait: float = Field(0, ge=0, le=MAX_WAIT, description="seconds to wait for the first")
    session: SessionField | None = None
    lease: float | None = Field(None, gt=0, le=MAX_LEASE)
    pinned_only: bool = False
    receive_id: IdField | None = Field(None, description=RECEIVE_ID)


class AckBatchIn(_Body):
    """Many acks in one request. Each id is checked and answered on its own."""

    message_ids: list[JsonValue] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description=f"up to {MAX_BATCH} message ids, each checked and answered on its own",
    )


class SessionIn(_Body):
    session_id: SessionField | None = None


class EventIn(_Body):
    kind: EventKindName = Field(
        description="turn_start, thought, tool_call, tool_result, agent_output or agent_stop"
    )
    text: str = ""
    data: JsonObject = Field(default_factory=dict)
    request_id: IdField | None = Field(
        None,
        description="your id for this report, for retries: the same id again answers the "
        "first answer (replayed) and does nothing",
    )


class TerminateIn(_Body):
    reason: str = ""


class AliveIn(_Body):
    """A runtime process's beat (its stdio MCP server sends it while the runtime runs,
    see :mod:`backchannel.runtimes.liveness`)."""

    runtime: str = Field(
        min_length=1,
        max_length=200,
        description="The runtime process, as the command hook names it on each event.",
    )


class ReactionIn(_Body):
    emoji: str = Field(min_length=1, max_length=32)


class DelegateIn(_Body):
    to: str = Field(description="a member, or agent@service for an agent on another hub")
    task: str = Field(pattern=r"\S", description="what the callee should do")
    timeout_s: float | None = Field(None, ge=1, le=86400)
    tool_use_id: IdField | None = None
    session: SessionField | None = Field(None, description="your session [your only open turn]")


class ReplyRoute(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    callbackService: str
    bearerToken: str


class ChainIn(BaseModel):
    """The conversation chain a task from another hub, or its answer, goes on in."""

    model_config = ConfigDict(extra="ignore", strict=True)
    id: IdField = Field(description="the chain's id (a message id of the hub that started it)")
    hop: int = Field(
        ge=0,
        le=MAX_HOP,
        description="the task's hop in the chain: the caller's turn's hop, one further",
    )


class ChatIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    agent: NameField
    message: str
    reply: ReplyRoute
    session_id: SessionField | None = None
    tool_use_id: IdField | None = None
    timeout_s: float | None = Field(None, ge=1, le=86400)
    chain: ChainIn | None = Field(
        None,
        description="the chain the task goes on in (the callee's turn continues it, and the "
        "team's chain_budget counts its hops); without it the task starts a new chain",
    )


class ToolResponseIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    result: JsonValue
    chain: ChainIn | None = Field(
        default=None,
        description=(
            "the conversation chain the answer goes on in (the callee's turn's, one hop "
            "further): the caller's session goes on in it"
        ),
    )


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("give a number, or leave the field out")
    return value


def _duration(unit: float, what: str) -> Any:
    """A number of ``unit`` seconds from the shortest timer (a second) to the longest;
    null is refused (leave the field out instead), so the schema need not allow it."""
    top, least = MAX_TIMER_SECONDS / unit, MIN_TIMER_SECONDS / unit
    schema = {"type": "number", "minimum": least, "maximum": top, "description": what}

    def in_range(value: float | None) -> float | None:
        if value is not None and not least <= value <= top:
            raise ValueError(
                f"a timer is due between 1 second and 30 days from now, not {value * unit:g} s"
            )
        return value

    return Annotated[
        float | None,
        AfterValidator(in_range),
        BeforeValidator(_not_null),
        WithJsonSchema(schema),
    ]


class TimerIn(_Body):
    # at most one of minutes and seconds (an anchor without either is due in the default
    # time); check and wait name their peer and one of the two
    model_config = ConfigDict(
        json_schema_extra={
            "not": {"required": ["minutes", "seconds"]},
            "if": {"required": ["intent"], "properties": {"intent": {"enum": ["check", "wait"]}}},
            "then": {
                "required": ["target"],
                "properties": {"target": {"type": "string"}},
                "anyOf": [{"required": ["minutes"]}, {"required": ["seconds"]}],
            },
        }
    )
    intent: Literal["anchor", "check", "wait"] = Field(
        description="anchor (return to your task), check (look at a peer), wait (see whether a peer replied)"
    )
    minutes: _duration(60, "due in this many minutes (an anchor: 10 when not given)") = None  # type: ignore[valid-type]
    seconds: _duration(1, "or in this many seconds") = None  # type: ignore[valid-type]
    note: str = Field(
        pattern=r"\S", max_length=2000, description="the breadcrumb you will read when it fires"
    )
    target: NameField | None = Field(None, description="the peer, for check and wait")
    session: SessionField | None = Field(None, description="your session [your only open one]")
    request_id: IdField | None = Field(
        None,
        description="your id for this timer, for retries: the same id again answers the "
        "timer it set and sets none",
    )


class ExtendIn(_Body):
    key: str = Field(
        min_length=3,
        max_length=300,
        description="the budget: 'pair:<a>|<b>' or 'chain:<chain_id>'",
    )
    by: int = Field(ge=1, le=1000, description="how many more exchanges (or hops) to let through")
    request_id: IdField | None = Field(
        None,
        description="your id for this extension, for retries: the same id again answers "
        "the budget as it is (replayed) and extends nothing",
    )


# -- answers --------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    def __getitem__(self, key: str) -> Any:
        """A field by its name or its name on the wire: ``sent["message_id"]``,
        ``received["from"]`` (scripts written against the JSON keep working)."""
        fields = type(self).model_fields
        if key in fields:
            return getattr(self, key)
        for name, info in fields.items():
            if info.alias == key:
                return getattr(self, name)
        extra = self.__pydantic_extra__ or {}
        if key in extra:
            return extra[key]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


class ErrorDetail(BaseModel):
    """``code`` is stable (e.g. ``unknown_recipient``); ``message`` says what was wrong
    and the way out. Some errors add fields (``suggestions``, ``limit``, ``problems``)."""

    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorBody(_Out):
    """Every error the API answers (4xx and 5xx) has this shape."""

    error: ErrorDetail


class Health(_Out):
    """``ok``; ``degraded`` while maintenance has set scheduled jobs aside because firing
    them failed (``failing_jobs`` of them), or expired leases because returning them
    failed (``failing_leases``): the hub's log names each and the way out, everything
    else going on; or while this hub's clock is further off the shared database's than
    hubs on one database may be (``clock_skew``, its clock minus the database's, in
    seconds: leases are returned by the database's clock meanwhile)."""

    status: str
    failing_jobs: int | None = None
    failing_leases: int | None = None
    clock_skew: float | None = None


class Me(_Out):
    """Who the token is: the administrator (``admin``) or one member of one team."""

    admin: bool
    team: str | None
    name: str | None
    kind: str | None = None


class TeamCreated(_Out):
    name: str
    created_at: float
    user_token: str = Field(description="the team's human member's token, shown only once")


class TeamRef(_Out):
    name: str


class TeamList(_Out):
    teams: list[TeamRef]
    #: the last team name of this page when more follow: ask again with ``after`` set to
    #: it (None: this page is the last)
    next_after: str | None = None


class MemberCreated(_Out):
    name: str
    team: str
    kind: str
    token: str = Field(description="shown only once")


class MemberUpdated(_Out):
    name: str
    team: str
    kind: str
    delivery: JsonObject
    settings: JsonObject


class Presence(_Out):
    """A member's state as its Claude Code inbox traffic shows it."""

    state: str
    last_activity: float | None = None
    last_event: str | None = None
    terminated_at: float | None = None


class PushCircuitInfo(_Out):
    """A member whose push target is down, as the hub that pushes to it stored it: its
    queued messages are dead-lettered at once and the next one is sent as a probe at
    ``next_probe_at``."""

    state: str
    target: str
    reason: str
    down_since: float
    next_probe_at: float
    probes: int
    dead_lettered: int


class MemberInfo(_Out):
    name: str
    kind: str
    created_at: float
    delivery: JsonObject | None = Field(
        default=None,
        description="the member's push delivery setting (``{}``: it pulls), for the admin "
        "only, with secret values (tokens, passwords, auth headers, keys) as '***'",
    )
    presence: Presence | None = None
    push_circuit: PushCircuitInfo | None = Field(
        default=None,
        description="present while the push to the member is down (backchannel.delivery.circuit)",
    )


class MemberList(_Out):
    members: list[MemberInfo]
    #: the last member name of this page when more follow: ask again with ``after`` set
    #: to it (None: this page is the last)
    next_after: str | None = None


class TokenRotated(_Out):
    name: str
    team: str
    token: str = Field(description="the new token, shown only once")


class Removal(_Out):
    """What removing a member (or a team) settled."""

    team: str
    name: str | None
    dead_letters: int = 0
    sessions_terminated: int = 0
    links_closed: int = 0
    jobs_cancelled: int = 0
    dropped: int = 0


class Sent(_Out):
    """A send's answer. ``replayed``: a message with this ``message_id`` was already
    sent (the hub answered the first result again; HTTP says 200 instead of 201)."""

    message_id: str
    status: str
    recipients: list[str]
    replayed: bool = False
    warnings: list[str] = Field(
        default_factory=list,
        description="what the sender should know although the send was taken (a "
        "recipient's push delivery is down)",
    )


class CopyState(_Out):
    """One recipient's copy of a message."""

    to: str
    session: str | None
    state: str
    attempts: int
    lease_until: float | None
    dead_reason: str | None
    updated_at: float


class HistoryEntry(_Out):
    at: float
    to: str | None
    event: str
    detail: str | None


class MessageReport(_Out):
    """A message you sent or received: its copies' states and its delivery history."""

    message_id: str
    sender: str = Field(alias="from")
    to: str
    kind: str
    summary: str | None
    text: str
    created_at: float
    chain_id: str | None = None
    hop: int = 0
    status: str
    deliveries: list[CopyState]
    history: list[HistoryEntry]


class Received(_Out):
    """A message handed to you (leased). Call :meth:`ack` once you have handled it."""

    message_id: str
    sender: str = Field(alias="from")
    to: str
    session: str | None = None
    kind: str
    text: str
    summary: str | None = None
    created_at: float
    attempt: int
    meta: dict[str, Any] = Field(default_factory=dict)
    chain_id: str | None = None
    hop: int = 0
    _client: Client | None = PrivateAttr(default=None)
    _ack_now: Callable[[Sequence[str]], object] | None = PrivateAttr(default=None)

    def bind(self, client: Client | None) -> Received:
        """This message, answering :meth:`ack` through ``client``."""
        self._client = client
        return self

    def bind_sync(self, ack: Callable[[Sequence[str]], object]) -> Received:
        """This message, acking at once through a blocking ``ack`` (a SyncClient's)."""
        self._ack_now = ack
        return self

    def ack(self) -> Awaitable[None]:
        """Ack this message. From an async client ``await msg.ack()``; from a
        :class:`~backchannel.SyncClient` a plain ``msg.ack()`` acks at once (and the
        awaitable it returns is already done)."""
        if self._ack_now is not None:
            self._ack_now([self.message_id])
            return _Done()
        if self._client is None:
            from backchannel.errors import InvalidRequest

            raise InvalidRequest("this message is not bound to a client")
        return self._ack_async(self._client)

    async def _ack_async(self, client: Client) -> None:
        await client.ack([self.message_id])


class _Done:
    """An awaitable that is already complete."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


class Inbox(_Out):
    messages: list[Received]


class Pending(_Out):
    pending: int


class Acked(_Out):
    acked: int
    not_held: list[str] = Field(
        default_factory=list, description="ids you did not hold (acked before, or not yours)"
    )


class InboxAcked(_Out):
    """A receive that acked first: the messages it leased, and what became of the ids
    it acked (as :class:`Acked` says it)."""

    messages: list[Received]
    acked: int
    not_held: list[str] = Field(
        default_factory=list, description="ids you did not hold (acked before, or not yours)"
    )


class Released(_Out):
    released: int


class GivenUp(_Out):
    given_up: int = Field(description="how many leased copies are now dead, senders told")


class Reaction(_Out):
    message_id: str
    emoji: str


class BatchItemError(_Out):
    error: ErrorDetail
    status: int = Field(description="the HTTP status this item alone would have had")


class SendOutcome(_Out):
    """One item of a batch send: ``sent`` (with the answer) or ``error``."""

    index: int
    sent: Sent | None = None
    error: ErrorDetail | None = None
    status: int = Field(description="201 sent, 200 replayed, else the item's error status")


class SentBatch(_Out):
    results: list[SendOutcome]
    sent: int = Field(description="items sent (or replayed)")
    failed: int


class AckOutcome(_Out):
    """One id of a batch ack: ``acked``, ``not_held`` or ``invalid`` (with ``error``)."""

    message_id: str | None
    outcome: Literal["acked", "not_held", "invalid"]
    error: ErrorDetail | None = None


class AckedBatch(_Out):
    results: list[AckOutcome]
    acked: int
    not_held: int
    invalid: int


class Link(_Out):
    """A conversation between two sessions: turns used of its budget, state, why closed."""

    link_id: str
    initiator: str
    initiator_session: str
    responder: str
    responder_session: str | None
    state: str
    budget: int
    turns_used: int
    created_at: float
    closed_at: float | None
    close_reason: str | None
    history: list[JsonObject] = Field(default_factory=list)


class LinkList(_Out):
    links: list[Link]
    #: the last link id of this page when more follow: ask again with ``after`` set to
    #: it (None: this page is the last)
    next_after: str | None = None


class Delegation(_Out):
    """One agent called as an asynchronous tool by another."""

    delegation_id: str
    route: str
    caller: str
    caller_session: str
    tool_use_id: str
    callee: str
    callee_session: str | None
    task: str
    state: str
    created_at: float
    deadline: float
    answered_at: float | None
    result: str | None
    error: str | None
    replayed: bool = Field(
        False,
        description="a delegate call made again under its tool_use_id: the delegation the "
        "first made, which runs once (false in lists and reads)",
    )


class DelegationList(_Out):
    delegations: list[Delegation]
    #: the last delegation id of this page when more follow: ask again with ``after``
    #: set to it (None: this page is the last)
    next_after: str | None = None


class ChatAccepted(_Out):
    delegation_id: str
    status: str
    session: str | None


class ToolResponseAccepted(_Out):
    delegation_id: str
    state: str


class Timer(_Out):
    """A heartbeat: ``anchor``, ``check`` or ``wait``, due at ``due_at``."""

    timer_id: int
    session: str
    member: str
    intent: str
    note: str
    target: str | None
    due_at: float
    set_at: float
    state: str
    due_in: float | None = Field(None, description="seconds from the hub's now")


class TimerList(_Out):
    timers: list[Timer]
    #: the last timer id of this page when more follow: ask again with ``after`` set to
    #: it (None: this page is the last)
    next_after: int | None = None


class SessionInfo(_Out):
    """One run of a member: ``active`` while a turn runs, ``idle`` between, ``terminated``."""

    session_id: str
    member: str
    state: str
    created_at: float
    updated_at: float
    turn: int
    turn_kind: str = "normal"
    turn_started_at: float | None
    last_stop_at: float | None
    last_output: str


class SessionList(_Out):
    sessions: list[SessionInfo]
    #: the last session id of this page when more follow: ask again with ``after`` set
    #: to it (None: this page is the last)
    next_after: str | None = None


class Alive(_Out):
    """What a runtime's beat did: the sessions it kept alive, and how soon to beat again."""

    sessions: list[str]
    next_in: float


class EventAnswer(_Out):
    """What reporting an event did. ``agent_stop`` adds what the closing text became
    (``sent``, ``duplicates_dropped``, ``unknown_destinations``, ``output``).
    ``replayed``: the session's last report was made with this ``request_id``, and this
    is its answer again (nothing was done twice)."""

    model_config = ConfigDict(extra="allow")
    session: str
    turn: int
    event_id: int | None = None
    state: str | None = None
    retried: bool | None = None
    checkpoint: JsonValue = None
    output: str | None = None
    sent: list[str] | None = None
    duplicates_dropped: list[str] | None = None
    unknown_destinations: list[str] | None = None
    replayed: bool = False


class Event(_Out):
    """One line of a session's transcript."""

    event_id: int
    session: str
    turn: int
    at: float
    kind: str
    text: str
    data: JsonObject


class Transcript(_Out):
    session: SessionInfo
    events: list[Event]
    truncated: bool
    next_since: int | None
    note: str | None


class Budget(_Out):
    """A used conversation budget: per pair of members, or per chain."""

    key: str
    scope: str
    members: list[str]
    used: int
    limit: int
    granted: int
    spent: bool
    window_start: float | None
    resets_at: float | None
    last_from: str | None
    updated_at: float | None
    replayed: bool = Field(
        False,
        description="an extension made again under its request_id: the budget as it is, "
        "extended once",
    )


class BudgetList(_Out):
    budgets: list[Budget]
    #: the last key of this page when more follow: ask again with ``after`` set to it
    #: (None: this page is the last)
    next_after: str | None = None


class HookAnswer(BaseModel):
    """The runtime's own hook output JSON (``{}`` when there is nothing to say)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    decision: str | None = None
    reason: str | None = None
    hook_specific_output: JsonObject | None = Field(None, alias="hookSpecificOutput")


# -- the dashboard's reads (its page is their one client) ------------------------------


class Ticket(_Out):
    ticket: str = Field(description="opens the team's dashboard stream once, for a minute")
    expires_at: float


class DashboardSession(_Out):
    session_id: str
    member: str
    state: str
    created_at: float
    updated_at: float
    turn: int
    turn_started_at: float | None
    last_stop_at: float | None
    last_output: str = Field(description="the first 300 characters of the last output")


class DashboardMember(_Out):
    name: str
    kind: str
    created_at: float
    state: str
    last_activity: float | None
    sessions: list[DashboardSession]
    sessions_total: int
    presence: Presence | None = None
    push_circuit: PushCircuitInfo | None = None


class DashboardMembers(_Out):
    members: list[DashboardMember]


class Hidden(_Out):
    links: int
    delegations: int
    timers: int
    budgets: int
    dead: int


class DeadLetterView(_Out):
    """A copy the hub gave up on: to whom, when, why, and its message's sender and summary."""

    message_id: str
    to: str
    at: float = Field(description="when the hub gave up on it")
    reason: str
    attempts: int
    sender: str | None = Field(alias="from")
    kind: str | None
    summary: str | None


class Snapshot(_Out):
    """Members, the first page of links, timers and delegations, spent budgets and the
    latest dead letters."""

    now: float
    members: list[DashboardMember]
    links: list[Link]
    timers: list[Timer]
    delegations: list[Delegation]
    delegation_tally: dict[str, int]
    budgets: list[Budget]
    dead: list[DeadLetterView] = Field(description="the latest dead letters, latest first")
    hidden: Hidden


class LinkPage(_Out):
    links: list[Link]
    offset: int
    hidden: int


class BudgetPage(_Out):
    budgets: list[Budget]
    offset: int
    hidden: int


class TimerPage(_Out):
    timers: list[Timer]
    offset: int
    total: int


class DelegationPage(_Out):
    delegations: list[Delegation]
    offset: int
    hidden: int


class MessageView(MessageReport):
    sender_session: str | None
    meta: JsonObject


class SessionView(_Out):
    session: DashboardSession
    transcript: list[Event]
    note: str | None


# -- what only the SDK shows (no route answers these as they are) ----------------------


class Traffic(_Out):
    """One line of a team's live traffic (``GET /v1/teams/{team}/events``)."""

    cursor: int
    at: float
    event: str
    detail: str | None
    message_id: str
    to: str | None
    sender: str | None = Field(alias="from")
    kind: str | None
    summary: str | None


class HookResult(_Out):
    """A hook call's answer for the runtime, and why it had no effect when it had none."""

    answer: JsonObject
    problem: str | None = None
    delivered: list[str] = Field(
        default_factory=list, description="ids the answer hands over, to record as seen"
    )
