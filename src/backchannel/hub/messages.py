"""The hub's base: lifecycle, teams and members, messages, leases, scheduled jobs.

:class:`backchannel.hub.Hub` adds sessions and turns, links, timers and delegation as
mixins on top of this class. Each part loads what a rule needs, calls the pure rule from
:mod:`backchannel.core`, and writes every effect in one store transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from backchannel.core import messages as rules
from backchannel.core import quotas
from backchannel.core.timers import anchors_first
from backchannel.errors import (
    AlreadyExists,
    InvalidRequest,
    InvalidState,
    StoreError,
    UnknownMember,
    UnknownMessage,
    UnknownSession,
    UnknownTeam,
)
from backchannel.hub.checks import DeliveryChecks
from backchannel.stores.base import Store, Tx
from backchannel.types import (
    BROADCAST,
    HUB_SENDER,
    USER,
    Clock,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxMessage,
    Job,
    JobState,
    Member,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    SendResult,
    Session,
    SessionState,
    SystemClock,
    Team,
)

log = logging.getLogger("backchannel.hub")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What firing a job did, for the work that follows the commit."""

    woken: Iterable[tuple[str, str]] = ()  # inboxes that got messages
    keep: bool = False  # the handler rescheduled the job: leave it pending
    run_after: Job | None = None  # I/O to start once the transaction committed


#: Fires one scheduled job inside the maintenance transaction (no I/O there); returns
#: the ``(team, member)`` inboxes it put messages in, or a :class:`JobOutcome`.
JobHandler = Callable[[Tx, Job, float], "Iterable[tuple[str, str]] | JobOutcome"]

__all__ = [
    "AckResult",
    "FeedItem",
    "HubBase",
    "HubMiddleware",
    "MessageStatus",
    "hash_token",
    "new_token",
]


def new_token() -> str:
    return "bc_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


#: How long an authenticated token is remembered. A rotation or removal clears this
#: process's cache at once; other hub processes on the same store forget within this.
_TOKEN_CACHE_SECONDS = 5.0

_ID_PREFIX = secrets.token_hex(4)  # per process: ids from different processes never meet
_id_counter = itertools.count()


def new_message_id() -> str:
    """Time-ordered (nanoseconds, then a per-process random prefix and a counter): new
    rows land at the end of the indexes instead of all over them, which keeps commits
    small, and no system call is needed per id."""
    return f"msg_{time.time_ns():016x}{_ID_PREFIX}{next(_id_counter) & 0xFFFFFF:06x}"


DEFAULT_RETENTION = 30 * 86400.0
"""Acked and dead messages are kept 30 days by default (``retention_seconds``)."""
COMPACT_EVERY = 300.0  # seconds between retention passes once caught up


class HubMiddleware:
    """Ordered hooks around hub operations, for audit, metrics and the like.

    Every hook runs after the operation committed; an exception in a hook is logged
    and never undoes or fails the operation.
    """

    def after_send(self, hub: HubBase, message: Message, result: SendResult) -> None:
        """A message was accepted (not called on an idempotent replay)."""

    def after_ack(self, hub: HubBase, team: str, member: str, message_ids: Sequence[str]) -> None:
        """Copies were acknowledged."""

    def after_dead(self, hub: HubBase, delivery: Delivery, reason: str) -> None:
        """A copy was given up on."""


@dataclass(frozen=True, slots=True)
class SendOptions:
    """How a send takes part in links (see :mod:`backchannel.hub.links`)."""

    link: bool = True  # open a link to the recipient if none is open
    close_link: bool = False  # deliver, then close the open link (initiator only)
    link_budget: int | None = None  # turns for a link this send opens
    by_agent: bool = True  # an agent's own send (send_message), subject to its rules


#: Options of the hub's own sends (notices, crossings, closing blocks): no link changes,
#: no anchor rule.
_NO_LINK = SendOptions(link=False, by_agent=False)


@dataclass(frozen=True, slots=True)
class AckResult:
    acked: tuple[str, ...]
    not_held: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MessageStatus:
    message: Message
    state: DeliveryState
    deliveries: tuple[Delivery, ...]
    history: tuple[DeliveryEvent, ...]

    def to_json(self) -> dict[str, Any]:
        m = self.message
        return {
            "message_id": m.message_id,
            "from": m.sender,
            "to": m.to,
            "kind": m.kind.value,
            "summary": m.summary,
            "text": m.text,
            "created_at": m.created_at,
            "chain_id": m.chain_id,
            "hop": m.hop,
            "status": self.state.value,
            "deliveries": [
                {
                    "to": d.recipient.member,
                    "session": d.recipient.session,
                    "state": d.state.value,
                    "attempts": d.attempts,
                    "lease_until": d.lease_until,
                    "dead_reason": d.dead_reason,
                    "updated_at": d.updated_at,
                }
                for d in self.deliveries
            ],
            "history": [
                {"at": e.at, "to": e.member, "event": e.event, "detail": e.detail}
                for e in self.history
            ],
        }


@dataclass(frozen=True, slots=True)
class FeedItem:
    """One line of a team's live traffic: a history event with its message."""

    cursor: int
    event: DeliveryEvent
    message: Message | None

    def to_json(self) -> dict[str, Any]:
        m = self.message
        return {
            "cursor": self.cursor,
            "at": self.event.at,
            "event": self.event.event,
            "detail": self.event.detail,
            "message_id": self.event.message_id,
            "to": self.event.member,
            "from": m.sender if m else None,
            "kind": m.kind.value if m else None,
            "summary": (m.summary or _first_line(m.text)) if m else None,
        }


def _first_line(text: str, width: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Wait for ``event`` up to ``seconds``. (Not ``asyncio.wait_for``: on Python 3.11 it
    can swallow a cancellation that arrives as the event is set, leaving a task that will
    not stop.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


async def _wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class _Waiters:
    """Wake-ups for receivers blocked on an empty inbox; keyed by (team, member).

    A waiter takes the current event *before* it looks at the store, so a message
    committed between its look and its wait still wakes it.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[str | None, str | None], asyncio.Event] = {}

    def event(self, team: str | None, member: str | None) -> asyncio.Event:
        ev = self._events.get((team, member))
        if ev is None:
            ev = self._events[(team, member)] = asyncio.Event()
        return ev

    def notify_watchers(self, team: str) -> None:
        """Wake those watching the team's traffic, not its receivers."""
        ev = self._events.pop((team, None), None)
        if ev is not None:
            ev.set()

    def notify(self, team: str | None, member: str | None) -> None:
        if team is None:
            keys = list(self._events)
        else:
            keys = (
                [(team, member), (team, None)]
                if member is not None
                else [k for k in self._events if k[0] == team]
            )
        for key in keys:
            ev = self._events.pop(key, None)
            if ev is not None:
                ev.set()


@dataclass
class _Cached:
    member: Member
    until: float


@dataclass
class HubConfig:
    lease_seconds: float = 60.0
    max_attempts: int = 5
    max_text: int = rules.DEFAULT_MAX_TEXT
    default_limit: int = 10
    extra: Mapping[str, Any] = field(default_factory=dict)


class HubBase:
    """See the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        lease_seconds: float = 60.0,
        max_attempts: int = 5,
        max_text: int = rules.DEFAULT_MAX_TEXT,
        middleware: Iterable[HubMiddleware] = (),
        background: bool = True,
        check_delivery: bool = True,
        retention_seconds: float | None = DEFAULT_RETENTION,
    ) -> None:
        if lease_seconds <= 0:
            raise InvalidRequest("lease_seconds must be positive")
        if max_attempts < 1:
            raise InvalidRequest("max_attempts must be at least 1")
        self.store = store
        self.clock: Clock = clock or SystemClock()
        self.config = HubConfig(lease_seconds, max_attempts, max_text)
        self.middleware = list(middleware)
        self._background = background
        # refuse delivery settings the registered adapters do not understand (they
        # register their checks here, see hub/checks.py); off for a hub whose dispatcher
        # brings adapters of its own
        self._check_delivery_on = check_delivery
        self.delivery_checks = DeliveryChecks()
        self._waiters = _Waiters()
        self._tokens: dict[str, _Cached] = {}
        self._maint_task: asyncio.Task[None] | None = None
        self._maint_wake = asyncio.Event()
        self._next_due: float | None = None
        # due times scheduled inside transactions (which may run on a store thread);
        # drained on the event loop by _flush_due after the commit
        self._scheduled: list[float] = []
        self._send_memo: dict[str, dict[str, Any]] = {}
        self._inbox_room: dict[tuple[str, str], int] = {}  # sends left before a recount
        self._timer_room: dict[tuple[str, str], int] = {}  # timers left before a recount
        self._started = False
        if retention_seconds is not None and retention_seconds <= 0:
            raise InvalidRequest("retention_seconds must be positive (or None to keep all)")
        # acked and dead messages older than this are removed by maintenance
        self.retention_seconds = retention_seconds
        self._compact_at = 0.0
        self._compact_from = 0.0

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        await self.store.open()
        self.store.on_external_change(self._on_external_change)
        self._started = True
        if self._background:
            self._maint_task = asyncio.create_task(self._maintenance_loop(), name="bc-maintenance")

    async def close(self) -> None:
        if self._maint_task is not None:
            self._maint_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maint_task
            self._maint_task = None
        self._waiters.notify(None, None)
        await self.store.close()
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _due_at(self, when: float) -> None:
        """Something was scheduled for ``when``: make the maintenance task wake by then."""
        if self._next_due is None or when < self._next_due:
            self._next_due = when
            self._maint_wake.set()

    def _flush_due(self) -> None:
        while self._scheduled:
            self._due_at(self._scheduled.pop())

    def _on_external_change(self, team: str | None, member: str | None) -> None:
        self._waiters.notify(team, member)
        self._maint_wake.set()

    def _run_middleware(self, hook: str, *args: Any) -> None:
        for mw in self.middleware:
            try:
                getattr(mw, hook)(self, *args)
            except Exception:
                log.exception("middleware %s.%s failed", type(mw).__name__, hook)

    # -- teams and members ---------------------------------------------------
    async def create_team(
        self, name: str, *, settings: Mapping[str, Any] | None = None
    ) -> tuple[Team, str]:
        """Create a team and its ``user`` member. Returns the team and ``user``'s token."""
        rules.check_name("team", name)
        grace = (settings or {}).get("exit_grace_seconds")
        if grace is not None and (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not 0 <= grace <= 2_592_000
        ):
            raise InvalidRequest(
                f"exit_grace_seconds must be a number of seconds from 0 to 2592000 (30 days), "
                f"not {grace!r}",
                field="settings.exit_grace_seconds",
            )
        now = self.clock.now()
        token = new_token()
        team = Team(name, now, dict(settings or {}))
        user = Member(name, USER, MemberKind.HUMAN, now, hash_token(token))

        def fn(tx: Tx) -> None:
            if tx.get_team(name) is not None:
                raise AlreadyExists(f"team {name!r} already exists; pick another name")
            tx.insert_team(team)
            tx.insert_member(user)

        await self.store.transact(fn)
        return team, token

    async def get_team(self, name: str) -> Team:
        team = await self.store.read(lambda tx: tx.get_team(name))
        if team is None:
            raise UnknownTeam(f"unknown team {name!r}; create it first", team=name)
        return team

    async def list_teams(self) -> list[Team]:
        return await self.store.read(lambda tx: tx.list_teams())

    async def add_member(
        self,
        team: str,
        name: str,
        kind: MemberKind | str = MemberKind.LLM,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> tuple[Member, str]:
        """Add a member and return it with its secret token (shown only here)."""
        rules.check_name("member", name)
        try:
            kind = MemberKind(kind)
        except ValueError:
            choices = ", ".join(k.value for k in MemberKind)
            raise InvalidRequest(f"unknown member kind {kind!r}; use one of: {choices}") from None
        if name == HUB_SENDER:
            raise InvalidRequest(f"{HUB_SENDER!r} is reserved for the hub's own messages")
        if self._check_delivery_on:
            self.delivery_checks.check(delivery)
        token = new_token()
        member = Member(
            team,
            name,
            kind,
            self.clock.now(),
            hash_token(token),
            dict(delivery or {}),
            dict(settings or {}),
        )

        def fn(tx: Tx) -> None:
            if tx.get_team(team) is None:
                raise UnknownTeam(f"unknown team {team!r}; create it first", team=team)
            if tx.get_member(team, name) is not None:
                raise AlreadyExists(f"member {name!r} already exists in team {team!r}")
            tx.insert_member(member)

        await self.store.transact(fn)
        return member, token

    async def update_member(
        self,
        team: str,
        name: str,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Member:
        """Change how a member's messages reach it (``delivery``) or its ``settings``;
        what is not given stays."""
        if self._check_delivery_on:
            self.delivery_checks.check(delivery)

        def fn(tx: Tx) -> Member:
            m = tx.get_member(team, name)
            if m is None:
                if tx.get_team(team) is None:
                    raise UnknownTeam(f"unknown team {team!r}", team=team)
                raise UnknownMember(f"unknown member {name!r} in team {team!r}", member=name)
            new = dataclasses.replace(
                m,
                delivery=dict(delivery) if delivery is not None else m.delivery,
                settings=dict(settings) if settings is not None else m.settings,
            )
            tx.update_member(new)
            return new

        member = await self.store.transact(fn)
        self._tokens.clear()  # cached members carry the old settings
        self._inbox_room.clear()  # and the room left under the old limits
        self._timer_room.clear()
        return member

    async def list_members(self, team: str) -> list[Member]:
        def fn(tx: Tx) -> list[Member]:
            if tx.get_team(team) is None:
                raise UnknownTeam(f"unknown team {team!r}", team=team)
            return tx.list_members(team)

        return await self.store.read(fn)

    async def get_member(self, team: str, name: str) -> Member:
        member = await self.store.read(lambda tx: tx.get_member(team, name))
        if member is None:
            raise UnknownMember(f"unknown member {name!r} in team {team!r}", member=name)
        return member

    async def authenticate(self, token: str) -> Member | None:
        """The member whose token this is, or ``None``. Positive answers are cached
        briefly (tokens are 256-bit random strings; only their hashes are stored)."""
        digest = hash_token(token)
        now = self.clock.now()
        cached = self._tokens.get(digest)
        if cached is not None and cached.until > now:
            return cached.member
        member = await self.store.read(lambda tx: tx.member_by_token_hash(digest))
        if member is not None:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[digest] = _Cached(member, now + _TOKEN_CACHE_SECONDS)
        return member

    # -- sessions --------------------------------------------------------------
    async def get_session(self, team: str, session_id: str) -> Session:
        session = await self.store.read(lambda tx: tx.get_session(team, session_id))
        if session is None:
            raise UnknownSession(f"unknown session {session_id!r} in team {team!r}")
        return session

    async def list_sessions(self, team: str, member: str | None = None) -> list[Session]:
        return await self.store.read(lambda tx: tx.list_sessions(team, member))

    # -- messages --------------------------------------------------------------
    async def send(
        self,
        team: str,
        sender: str,
        to: str,
        text: str,
        *,
        summary: str | None = None,
        message_id: str | None = None,
        kind: MessageKind = MessageKind.DIRECT,
        sender_session: str | None = None,
        to_session: str | None = None,
        meta: Mapping[str, Any] | None = None,
        link: bool = True,
        close_link: bool = False,
        link_budget: int | None = None,
    ) -> SendResult:
        """Queue ``text`` for ``to`` (a member name, or ``*`` for everyone but the sender).

        Idempotent on ``message_id``: the same id with the same content returns the first
        result (``replayed=True``); with other content it raises ``MessageIdConflict``.
        Unknown recipients raise ``UnknownRecipient`` with the closest names.
        """
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", field="text")
        rules.check_text(text, self.config.max_text)
        if to != BROADCAST:
            rules.check_name("recipient", to)
        if link_budget is not None and not 1 <= link_budget <= 1000:
            raise InvalidRequest(
                "link_budget must be between 1 and 1000 turns", field="link_budget"
            )
        options = SendOptions(link, close_link, link_budget)
        mid = rules.check_message_id(message_id) if message_id else new_message_id()
        now = self.clock.now()
        fp = rules.fingerprint(sender, to, text, summary, kind.value, to_session, meta)
        message = Message(
            team=team,
            message_id=mid,
            sender=sender,
            to=to,
            text=text,
            kind=kind,
            created_at=now,
            fingerprint=fp,
            summary=summary,
            sender_session=sender_session,
            meta=dict(meta or {}),
        )

        minted = message_id is None  # a fresh hub id cannot be a replay

        def fn(tx: Tx) -> SendResult:
            existing = None if minted else tx.get_message(team, mid)
            if rules.decide_replay(existing, fp) is rules.Replay.REPLAY:
                copies = tx.deliveries(team, mid)
                return SendResult(
                    mid,
                    rules.aggregate_state(d.state for d in copies),
                    tuple(d.recipient for d in copies),
                    replayed=True,
                )
            self._check_inbox_room(tx, team, sender, to)
            return self._insert(tx, message, to_session, options)

        result = await self.store.transact(fn)
        if not result.replayed:
            for r in result.recipients:
                self._waiters.notify(team, r.member)
            self._run_middleware("after_send", message, result)
        return result

    def _check_inbox_room(self, tx: Tx, team: str, sender: str, to: str) -> None:
        """Refuse a send into an inbox at its quota (:mod:`backchannel.core.quotas`). The
        count is bounded by the limit and taken again only once about half the room seen
        at the last count is used, so a send into short inboxes costs nothing extra.
        (With several hub processes a queue may overshoot by what the others send
        between two counts.)"""
        if to == BROADCAST:
            names = [m.name for m in tx.list_members(team) if m.name != sender]
        else:
            names = [to]
        for name in names:
            key = (team, name)
            room = self._inbox_room.get(key, 0)
            if room > 0:
                self._inbox_room[key] = room - 1
                continue
            member = tx.get_member(team, name)
            if member is None:
                continue  # refused by _insert, with suggestions
            found = tx.get_team(team)
            cap = quotas.limit(quotas.MAX_QUEUED, found.settings if found else {}, member.settings)
            count = tx.queued_count(team, name, cap)
            if count >= cap:
                raise quotas.inbox_full(name, count, cap)
            if len(self._inbox_room) > 10_000:
                self._inbox_room.clear()
            self._inbox_room[key] = (cap - count) // 2

    def _insert(
        self,
        tx: Tx,
        message: Message,
        to_session: str | None,
        options: SendOptions | None = None,
    ) -> SendResult:
        """Resolve recipients and store ``message`` inside ``tx`` (shared by every sender)."""
        team, to = message.team, message.to
        if message.to == BROADCAST:
            names = [m.name for m in tx.list_members(team)]
        elif tx.get_member(team, to) is not None:
            names = [to]
        else:
            if tx.get_team(team) is None:
                raise UnknownTeam(f"unknown team {team!r}", team=team)
            names = [m.name for m in tx.list_members(team)]
        recipients = rules.resolve_recipients(team, to, message.sender, names, to_session)
        if not recipients:
            raise InvalidRequest(
                f"nobody to reach: team {team!r} has no member besides {message.sender!r}; "
                "add members first"
            )
        if to_session is not None:
            session = tx.get_session(team, to_session)
            if session is None or session.member != to:
                raise UnknownSession(
                    f"member {to!r} has no session {to_session!r}; send to the member instead",
                    session=to_session,
                )
        # reads several parts need about this one send are made once (see _memo)
        self._send_memo[message.message_id] = {}
        try:
            message = self._stamp(tx, message, recipients)
            self._before_insert(tx, message, recipients, options or _NO_LINK)
            tx.insert_message(message, recipients)
            self._after_insert(tx, message, recipients, options or _NO_LINK)
        finally:
            self._send_memo.pop(message.message_id, None)
        return SendResult(message.message_id, DeliveryState.QUEUED, recipients)

    def _memo(self, message: Message, key: str, compute: Callable[[], T]) -> T:
        """``compute()``, once per send of ``message`` (its parts ask the same questions:
        is there an open link, which session's turn is this)."""
        memo = self._send_memo.get(message.message_id)
        if memo is None:
            return compute()
        if key not in memo:
            memo[key] = compute()
        value: T = memo[key]
        return value

    def _open_link_of(self, tx: Tx, message: Message) -> Any:
        return self._memo(
            message, "link", lambda: tx.find_open_link(message.team, message.sender, message.to)
        )

    def _stamp(self, tx: Tx, message: Message, recipients: Sequence[Recipient]) -> Message:
        """Hook: the message as it will be stored (the budget part sets its chain)."""
        return message

    def _before_insert(
        self, tx: Tx, message: Message, recipients: Sequence[Recipient], options: SendOptions
    ) -> None:
        """Hook: may refuse a send before anything is written (the anchor rule, link
        permissions). Runs in ``tx``."""

    def _after_insert(
        self, tx: Tx, message: Message, recipients: Sequence[Recipient], options: SendOptions
    ) -> None:
        """Hook for the parts built on top (the per-turn ledger, links). Runs in ``tx``."""

    def _after_lease(
        self, tx: Tx, session: Session, got: Sequence[InboxMessage], now: float
    ) -> None:
        """Hook: messages were handed to ``session``. Runs in ``tx``."""

    def _after_member_lease(
        self, tx: Tx, team: str, member: str, got: Sequence[InboxMessage], now: float
    ) -> None:
        """Hook: messages were handed to a member that named no session. Runs in ``tx``."""

    def _job_handlers(self) -> dict[str, JobHandler]:
        """Scheduled-job kinds and what firing one does (extended by the parts on top)."""
        return {}

    def _start_after(self, job: Job) -> None:
        """Start the I/O a fired job asked for (the outbox overrides this)."""
        log.warning("job %s asked for work after commit, but nothing runs it", job.job_id)

    async def receive(
        self,
        team: str,
        member: str,
        *,
        session: str | None = None,
        limit: int | None = None,
        wait: float = 0.0,
        lease_seconds: float | None = None,
        pinned_only: bool = False,
        stop: asyncio.Event | None = None,
        owner: str | None = None,
    ) -> list[InboxMessage]:
        """Lease up to ``limit`` messages in send order, waiting up to ``wait`` seconds for
        the first. Leased messages come back after the lease unless acked. With
        ``pinned_only``, only messages pinned to ``session`` (a delegation's sub-session
        takes nothing addressed to the member as a whole). Setting ``stop`` ends the wait
        early (a long-poll whose client went away). With ``owner`` (a push dispatcher's
        hub id), nothing is leased unless ``owner`` holds the member's push-delivery lease
        (``Tx.claim_dispatch``), checked in the leasing transaction itself."""
        limit = self.config.default_limit if limit is None else limit
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be between 1 and 1000", field="limit")
        if wait < 0 or wait > 3600:
            raise InvalidRequest("wait must be between 0 and 3600 seconds", field="wait")
        lease = self.config.lease_seconds if lease_seconds is None else lease_seconds
        if lease <= 0:
            raise InvalidRequest("lease_seconds must be positive", field="lease_seconds")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            ready = self._waiters.event(team, member)
            now = self.clock.now()
            got = await self.store.transact(
                lambda tx, now=now: self._lease_tx(  # type: ignore[misc]
                    tx, team, member, session, now, now + lease, limit, not pinned_only, owner
                )
            )
            if got:
                self._due_at(now + lease)
                return got
            remaining = deadline - loop.time()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return []
            if stop is None:
                await _wait(ready, remaining)
            else:
                await _wait_any((ready, stop), remaining)

    def _lease_tx(
        self,
        tx: Tx,
        team: str,
        member: str,
        session: str | None,
        now: float,
        until: float,
        limit: int,
        include_unpinned: bool = True,
        owner: str | None = None,
    ) -> list[InboxMessage]:
        if owner is not None and (tx.dispatch_owner(team, member) or ("",))[0] != owner:
            return []  # another hub pushes this member's messages now
        if session is not None:
            s = tx.get_session(team, session)
            if s is None or s.member != member:
                raise UnknownSession(
                    f"member {member!r} has no session {session!r}; open it first",
                    session=session,
                )
            if s.state is SessionState.TERMINATED:
                raise InvalidState(f"session {session!r} is terminated; open a new one")
            if s.state is SessionState.ACTIVE:
                return []  # never injected mid-turn; delivered when the turn ends
            got = anchors_first(
                tx.lease(team, member, session, now, until, limit, include_unpinned)
            )
            if got:
                self._after_lease(tx, s, got, now)
            return got
        got = anchors_first(tx.lease(team, member, session, now, until, limit))
        if got:
            self._after_member_lease(tx, team, member, got, now)
        return got

    async def inbox(
        self,
        team: str,
        member: str,
        *,
        session: str | None = None,
        batch: int = 32,
        wait: float = 30.0,
    ) -> AsyncIterator[InboxMessage]:
        """Yield messages as they arrive, forever. The caller acks each one."""
        while True:
            for item in await self.receive(team, member, session=session, limit=batch, wait=wait):
                yield item

    async def ack(self, team: str, member: str, message_ids: Sequence[str]) -> AckResult:
        """Acknowledge copies the member holds. Ids it does not hold are reported back
        in ``not_held`` (nothing else changes)."""
        ids = [str(i) for i in message_ids]
        if not ids:
            raise InvalidRequest(
                "message_ids is empty; pass the ids you received", field="message_ids"
            )
        if len(ids) > 1000:
            raise InvalidRequest("at most 1000 message_ids per ack", field="message_ids")
        now = self.clock.now()
        acked = await self.store.transact(lambda tx: tx.ack(team, member, ids, now))
        done = set(acked)
        result = AckResult(tuple(acked), tuple(i for i in dict.fromkeys(ids) if i not in done))
        if acked:
            self._run_middleware("after_ack", team, member, result.acked)
            self._waiters.notify_watchers(team)
        return result

    async def release(self, team: str, member: str, message_ids: Sequence[str]) -> int:
        """Give leased copies back at once instead of waiting for the lease to end."""
        now = self.clock.now()

        def fn(tx: Tx) -> int:
            return sum(
                tx.transition(
                    team,
                    mid,
                    member,
                    from_states=[DeliveryState.LEASED],
                    to_state=DeliveryState.QUEUED,
                    now=now,
                    event="released",
                )
                for mid in dict.fromkeys(message_ids)
            )

        n = await self.store.transact(fn)
        if n:
            self._waiters.notify(team, member)
        return n

    async def mark_delivered(
        self, team: str, member: str, message_id: str, detail: str = ""
    ) -> bool:
        """An adapter put a leased copy in front of the agent (inbox file, hook answer...)."""
        now = self.clock.now()
        return await self.store.transact(
            lambda tx: tx.transition(
                team,
                message_id,
                member,
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.DELIVERED,
                now=now,
                event="delivered",
                detail=detail,
            )
        )

    async def pending(self, team: str, member: str) -> int:
        """How many copies the member has not acked yet (queued or leased)."""
        return await self.store.read(lambda tx: tx.pending_count(team, member))

    async def give_up(self, team: str, member: str, message_id: str, reason: str) -> bool:
        """An adapter cannot deliver a leased copy and retrying will not help (a 404 from
        a webhook, a pane that is gone): the copy is ``dead`` with ``reason`` and the
        sender is told. False if the copy was not leased."""
        now = self.clock.now()

        def fn(tx: Tx) -> tuple[bool, str | None]:
            copy = next(
                (d for d in tx.deliveries(team, message_id) if d.recipient.member == member), None
            )
            if copy is None or not self._kill(tx, copy, reason, now):
                return False, None
            return True, self._dead_notice(tx, copy, reason, now)

        moved, notified = await self.store.transact(fn)
        if notified is not None:
            self._waiters.notify(team, notified)
        return moved

    async def message_status(
        self, team: str, message_id: str, *, viewer: str | None = None
    ) -> MessageStatus:
        """Delivery state and history. ``viewer`` (when given) must be the sender or a
        recipient; anyone else is told the message does not exist."""

        def fn(tx: Tx) -> MessageStatus | None:
            msg = tx.get_message(team, message_id)
            if msg is None:
                return None
            copies = tx.deliveries(team, message_id)
            if (
                viewer is not None
                and viewer != msg.sender
                and all(d.recipient.member != viewer for d in copies)
            ):
                return None
            return MessageStatus(
                msg,
                rules.aggregate_state(d.state for d in copies),
                tuple(copies),
                tuple(tx.history(team, message_id)),
            )

        status = await self.store.read(fn)
        if status is None:
            raise UnknownMessage(
                f"no message {message_id!r} that you sent or received in team {team!r}",
                message_id=message_id,
            )
        return status

    async def feed(self, team: str, after: int = 0, limit: int = 200) -> list[FeedItem]:
        def fn(tx: Tx) -> list[FeedItem]:
            events = tx.feed(team, after, limit)
            cache: dict[str, Message | None] = {}
            out = []
            for cursor, ev in events:
                if ev.message_id not in cache:
                    cache[ev.message_id] = tx.get_message(team, ev.message_id)
                out.append(FeedItem(cursor, ev, cache[ev.message_id]))
            return out

        return await self.store.read(fn)

    async def watch(
        self, team: str, after: int = 0, *, idle_check: float = 1.0
    ) -> AsyncGenerator[FeedItem, None]:
        """Yield a team's traffic as it happens, from cursor ``after`` on."""
        while True:
            ready = self._waiters.event(team, None)
            items = await self.feed(team, after)
            for item in items:
                after = item.cursor
                yield item
            if not items:
                await _wait(ready, idle_check)

    # -- maintenance -------------------------------------------------------------
    async def maintain(self) -> float | None:
        """Do all work that is due now: expired leases go back to the queue, or dead
        after the last attempt (the sender is told). Returns when work is next due."""
        now = self.clock.now()
        max_attempts = self.config.max_attempts
        woken: set[tuple[str, str]] = set()
        dead: list[tuple[Delivery, str]] = []
        after: list[Job] = []

        def fn(tx: Tx) -> tuple[bool, float | None]:
            # a store may run this again after a failed commit: start from scratch
            woken.clear()
            dead.clear()
            after.clear()
            expired = tx.expired_leases(now, 500)
            for d in expired:
                member = d.recipient.member
                if rules.after_lease_expiry(d.attempts, max_attempts) is rules.ExpiryAction.REQUEUE:
                    moved = tx.transition(
                        d.team,
                        d.message_id,
                        member,
                        from_states=[DeliveryState.LEASED],
                        to_state=DeliveryState.QUEUED,
                        now=now,
                        event="lease_expired",
                        detail=f"attempt {d.attempts} was not acknowledged",
                    )
                    if moved:
                        woken.add((d.team, member))
                    continue
                reason = rules.exhausted_reason(d.attempts)
                if not self._kill(tx, d, reason, now):
                    continue  # acked meanwhile (by another hub): nothing to give up
                dead.append((d, reason))
                notice_to = self._dead_notice(tx, d, reason, now)
                if notice_to is not None:
                    woken.add((d.team, notice_to))
            handlers = self._job_handlers()
            jobs = tx.due_jobs(now, 200)
            for job in jobs:
                handler = handlers.get(job.kind)
                if handler is None:
                    log.warning(
                        "no handler for scheduled job kind %r; dropping job %s",
                        job.kind,
                        job.job_id,
                    )
                    tx.finish_job(job.job_id, JobState.DONE, now)
                    continue
                outcome = handler(tx, job, now)
                if not isinstance(outcome, JobOutcome):
                    outcome = JobOutcome(outcome)
                woken.update(outcome.woken)
                if outcome.run_after is not None:
                    after.append(outcome.run_after)
                if not outcome.keep:
                    tx.finish_job(job.job_id, JobState.DONE, now)
            dues = [t for t in (tx.next_lease_expiry(), tx.next_job_due()) if t is not None]
            return len(expired) == 500 or len(jobs) == 200, min(dues) if dues else None

        more = True
        next_due: float | None = None
        while more:
            more, next_due = await self.store.transact(fn)
            for team, member in woken:
                self._waiters.notify(team, member)
            for d, reason in dead:
                self._run_middleware("after_dead", d, reason)
            for job in after:
                self._start_after(job)
        if self.retention_seconds is not None and now >= self._compact_at:
            await self.compact(now - self.retention_seconds)
        self._next_due = next_due
        return next_due

    async def compact(self, before: float, *, batch: int = 500, max_batches: int = 8) -> int:
        """Remove acked and dead messages (with their history) created before
        ``before``, and finished jobs, a bounded number of batches at a time; maintenance
        calls this every few minutes with ``now - retention_seconds``. Messages still
        waiting for a recipient are never removed. Returns how many messages went."""
        removed = 0
        for _ in range(max_batches):
            frm = self._compact_from

            def fn(tx: Tx, frm: float = frm) -> tuple[int, float | None]:
                return tx.compact(before, frm, batch)

            gone, last = await self.store.transact(fn)
            removed += gone
            if last is None:  # reached the end: next time, look again from the oldest
                self._compact_from = 0.0
                self._compact_at = self.clock.now() + COMPACT_EVERY
                break
            self._compact_from = last
        else:
            self._compact_at = self.clock.now() + 1.0  # more to do: soon, in small steps
        if removed:
            log.info("retention: removed %d messages created before %.0f", removed, before)
        return removed

    @staticmethod
    def _kill(tx: Tx, d: Delivery, reason: str, now: float) -> bool:
        """A leased copy is given up on: ``dead``, with ``reason`` in its history."""
        return tx.transition(
            d.team,
            d.message_id,
            d.recipient.member,
            from_states=[DeliveryState.LEASED],
            to_state=DeliveryState.DEAD,
            now=now,
            event="dead",
            detail=reason,
            dead_reason=reason,
        )

    def _dead_notice(
        self, tx: Tx, d: Delivery, reason: str, now: float, advice: str | None = None
    ) -> str | None:
        msg = tx.get_message(d.team, d.message_id)
        if (
            msg is None
            or msg.kind is MessageKind.SYSTEM
            or tx.get_member(d.team, msg.sender) is None
        ):
            return None  # never a notice about a notice: no loops
        notice = rules.dead_letter_notice(msg, d.recipient, reason, advice)
        system = Message(
            team=d.team,
            message_id=f"dead-{d.message_id}-{d.recipient.member}"[:128],
            sender=HUB_SENDER,
            to=notice.to,
            text=notice.text,
            kind=MessageKind.SYSTEM,
            created_at=now,
            fingerprint=rules.fingerprint(
                HUB_SENDER, notice.to, notice.text, notice.summary, "system"
            ),
            summary=notice.summary,
            meta=notice.meta,
        )
        if tx.get_message(d.team, system.message_id) is None:
            tx.insert_message(system, [Recipient(notice.to)])
        return notice.to

    async def _maintenance_loop(self) -> None:
        while True:
            try:
                next_due = await self.maintain()
            except asyncio.CancelledError:
                raise
            except StoreError as exc:  # the store is down: say so once a second, briefly
                log.warning(
                    "maintenance could not reach the store (%s); retrying in 1 s", exc.message
                )
                next_due = self.clock.now() + 1.0
            except Exception:
                log.exception("maintenance failed; retrying in 1 s")
                next_due = self.clock.now() + 1.0
            # sleep until the next due work; local scheduling and other processes' changes
            # wake the loop earlier, and a minute is the longest it ever sleeps
            delay = 60.0 if next_due is None else min(max(next_due - self.clock.now(), 0.0), 60.0)
            self._maint_wake.clear()
            await _wait(self._maint_wake, delay + 0.001)
