"""What a member may do, and what the administrator may do, as typed calls on a hub.

:class:`MemberApi` is one member of one team acting on a :class:`~backchannel.hub.Hub`:
every call is scoped to that member's team, and the sender of a message is always that
member. :class:`AdminApi` manages teams and members. The HTTP routes and the in-process
SDK transport both call these, so the two answer the same models with the same errors.

Both are cheap to build (one per request); they hold no state of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from backchannel.core.messages import Outgoing
from backchannel.core.pages import PAGE
from backchannel.core.timers import DEFAULT_ANCHOR_MINUTES, TIMER_PAGE
from backchannel.errors import BackchannelError, InvalidRequest, NotFound
from backchannel.models import (
    MAX_BATCH,
    Acked,
    AckedBatch,
    AckOutcome,
    Alive,
    Budget,
    BudgetList,
    ChatAccepted,
    Delegation,
    DelegationList,
    ErrorDetail,
    EventAnswer,
    GivenUp,
    HookResult,
    InboxAcked,
    Link,
    LinkList,
    Me,
    MemberCreated,
    MemberList,
    MemberUpdated,
    MessageIn,
    MessageReport,
    Pending,
    Reaction,
    Received,
    Released,
    Removal,
    SendOutcome,
    Sent,
    SentBatch,
    SessionInfo,
    SessionList,
    TeamCreated,
    TeamList,
    TeamRef,
    Timer,
    TimerList,
    TokenRotated,
    ToolResponseAccepted,
    Traffic,
    Transcript,
)
from backchannel.types import (
    MESSAGE_ID_PATTERN,
    USER,
    InboxMessage,
    Lease,
    Member,
    MemberKind,
    SendResult,
)

if TYPE_CHECKING:
    from backchannel.hub import Hub

__all__ = ["AdminApi", "MemberApi", "batch_error"]

_ID_RE = re.compile(MESSAGE_ID_PATTERN)


def batch_error(exc: Exception) -> tuple[ErrorDetail, int]:
    """One batch item's error: the error model and the status it alone would have had."""
    if isinstance(exc, BackchannelError):
        body = exc.to_json()["error"]
        return ErrorDetail.model_validate(body), exc.status
    if isinstance(exc, ValidationError):
        problems = [
            {
                "field": ".".join(str(p) for p in e.get("loc", ())) or "body",
                "problem": e.get("msg", "invalid"),
            }
            for e in exc.errors()
        ]
        text = "; ".join(f"{p['field']}: {p['problem']}" for p in problems)
        detail = {"code": "invalid_request", "message": f"invalid item: {text}"}
        return ErrorDetail.model_validate({**detail, "problems": problems}), 422
    raise exc


def _check_batch(items: Sequence[Any], name: str) -> None:
    """The batch bound the HTTP routes hold bodies to, for in-process callers too."""
    if len(items) > MAX_BATCH:
        raise InvalidRequest(
            f"{name} holds {len(items)} items, over the {MAX_BATCH} a batch may hold; "
            "split it into several batches",
            field=name,
        )


def _sent(result: SendResult) -> Sent:
    return Sent(
        message_id=result.message_id,
        status=result.status.value,
        recipients=[r.member for r in result.recipients],
        replayed=result.replayed,
        # set only when there is one: the answer leaves out what was not set
        **({"warnings": list(result.warnings)} if result.warnings else {}),
    )


class MemberApi:
    """One member of one team, acting on ``hub``."""

    def __init__(self, hub: Hub, member: Member) -> None:
        self.hub = hub
        self.member = member
        self.team = member.team
        self.name = member.name

    def me(self) -> Me:
        m = self.member
        return Me(admin=False, team=m.team, name=m.name, kind=m.kind.value)

    async def members(self, *, after: str | None = None, limit: int = PAGE) -> MemberList:
        """A page of the team's members by name: at most ``limit`` after the name
        ``after``; ``next_after`` is where the next page starts (None: this was the last)."""
        return await _members(self.hub, self.team, after=after, limit=limit)

    # -- messages --------------------------------------------------------------------
    async def send(
        self,
        to: str,
        text: str,
        *,
        summary: str | None = None,
        message_id: str | None = None,
        session: str | None = None,
        from_session: str | None = None,
        link: bool = True,
        close_link: bool = False,
        link_budget: int | None = None,
    ) -> Sent:
        result = await self.hub.send(
            self.team,
            self.name,
            to,
            text,
            summary=summary,
            message_id=message_id,
            to_session=session,
            sender_session=from_session,
            link=link,
            close_link=close_link,
            link_budget=link_budget,
        )
        return _sent(result)

    async def send_batch(self, items: Sequence[Any]) -> SentBatch:
        """Send each item (a :class:`MessageIn` or its JSON) on its own: a bad item is
        answered with its error and the others still go. The items go to the hub as one
        call (:meth:`Hub.send_many`), so the store's writer commits them in few
        transactions and answers them together."""
        _check_batch(items, "messages")
        outcomes: list[Sent | Exception | None] = [None] * len(items)
        outgoing: list[Outgoing] = []
        places: list[int] = []
        for index, item in enumerate(items):
            try:
                body = item if isinstance(item, MessageIn) else MessageIn.model_validate(item)
            except ValidationError as exc:
                outcomes[index] = exc
                continue
            places.append(index)
            outgoing.append(
                Outgoing(
                    body.to,
                    body.text,
                    summary=body.summary,
                    message_id=body.message_id,
                    to_session=body.session,
                    sender_session=body.from_session,
                    link=body.link,
                    close_link=body.close_link,
                    link_budget=body.link_budget,
                )
            )
        done = await self.hub.send_many(self.team, self.name, outgoing)
        for index, got in zip(places, done, strict=True):
            outcomes[index] = got if isinstance(got, Exception) else _sent(got)
        results: list[SendOutcome] = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, Sent):
                status = 200 if outcome.replayed else 201
                results.append(SendOutcome(index=index, sent=outcome, status=status))
            else:
                assert outcome is not None
                error, status = batch_error(outcome)
                results.append(SendOutcome(index=index, error=error, status=status))
        sent = sum(1 for r in results if r.sent is not None)
        return SentBatch(results=results, sent=sent, failed=len(results) - sent)

    async def status(self, message_id: str) -> MessageReport:
        status = await self.hub.message_status(self.team, message_id, viewer=self.name)
        return MessageReport.model_validate(status.to_json())

    async def react(self, message_id: str, emoji: str) -> Reaction:
        await self.hub.react(self.team, self.name, message_id, emoji)
        return Reaction(message_id=message_id, emoji=emoji)

    # -- inbox -----------------------------------------------------------------------
    async def receive(
        self,
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
        stop: asyncio.Event | None = None,
        receive_id: str | None = None,
        fresh: bool = False,
    ) -> list[Received]:
        got = await self.ack_and_receive(
            (),
            limit=limit,
            wait=wait,
            session=session,
            lease=lease,
            pinned_only=pinned_only,
            stop=stop,
            receive_id=receive_id,
            fresh=fresh,
        )
        return got.messages

    async def held(self, receive_id: str) -> list[Received]:
        """What the receive named ``receive_id`` still holds (:meth:`Hub.held`)."""
        got = await self.hub.held(self.team, self.name, receive_id)
        return [Received.model_validate(m.to_json()) for m in got]

    async def stream_receive(
        self,
        receive_id: str,
        *,
        limit: int,
        wait: float = 0.0,
        session: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> list[tuple[Received, Lease]]:
        """New messages leased to the event stream named ``receive_id`` (:meth:`receive`
        with ``fresh``), each with the :class:`Lease` it is under: what the stream gives
        back names it (:meth:`give_back_leased`)."""
        got = await self.hub.receive(
            self.team,
            self.name,
            session=session,
            limit=limit,
            wait=wait,
            stop=stop,
            receive_id=receive_id,
            fresh=True,
        )
        return [_leased(m, receive_id) for m in got]

    async def held_again_since(
        self, receive_id: str, last: str | None = None
    ) -> AsyncGenerator[list[tuple[Received, Lease]], None]:
        """What the event stream named ``receive_id`` holds, after ``last`` when it holds
        that one, page by page, each page handed to the name anew (the stream opened
        again sends them: :meth:`Hub.held_since` with ``again``), each copy with the
        :class:`Lease` it is under now."""
        got = self.hub.held_since(self.team, self.name, receive_id, last, again=True)
        async with contextlib.aclosing(got):  # closed early: what it handed anew goes back
            async for page in got:
                yield [_leased(m, receive_id) for m in page]

    async def held_leases(self, receive_id: str, limit: int) -> dict[str, Lease]:
        """What ``receive_id`` holds leased, at most ``limit``, each with its lease
        (:meth:`Hub.held_leases`)."""
        return await self.hub.held_leases(self.team, self.name, receive_id, limit)

    async def give_back_leased(self, leases: Mapping[str, Lease], *, untried: bool) -> int:
        """Give back what an event stream holds, each copy only while still under the
        lease named for it (by message id): one sent since by the stream opened again
        under its name stays with that one. ``untried``: the reader took none of them in
        (the lease is not counted as an attempt)."""
        if not leases:
            return 0
        return await self.hub.release(
            self.team, self.name, list(leases), untried=untried, leases=leases
        )

    async def holding(
        self, receive_id: str, limit: int, wait: float = 0.0, stop: asyncio.Event | None = None
    ) -> list[str]:
        """The ids ``receive_id`` holds leased, at most ``limit`` (:meth:`Hub.holding`)."""
        return await self.hub.holding(self.team, self.name, receive_id, limit, wait, stop)

    async def ack_and_receive(
        self,
        ack: Sequence[str],
        *,
        limit: int = 10,
        wait: float = 0.0,
        session: str | None = None,
        lease: float | None = None,
        pinned_only: bool = False,
        stop: asyncio.Event | None = None,
        receive_id: str | None = None,
        fresh: bool = False,
    ) -> InboxAcked:
        """Ack ``ack`` (as :meth:`ack` does), then :meth:`receive`: the ack and the first
        lease attempt are one store transaction, committed before any wait. Ids not
        held come back in ``not_held``; they never fail the receive. ``receive_id``
        names the receive (:meth:`Hub.receive`)."""
        got = await self.hub.receive(
            self.team,
            self.name,
            session=session,
            limit=limit,
            wait=wait,
            lease_seconds=lease,
            pinned_only=pinned_only,
            stop=stop,
            ack=list(ack),
            receive_id=receive_id,
            fresh=fresh,
        )
        return InboxAcked(
            messages=[Received.model_validate(m.to_json()) for m in got],
            acked=len(got.acked.acked),
            not_held=list(got.acked.not_held),
        )

    async def pending(self) -> Pending:
        return Pending(pending=await self.hub.pending(self.team, self.name))

    async def ack(self, message_ids: Sequence[str]) -> Acked:
        result = await self.hub.ack(self.team, self.name, list(message_ids))
        return Acked(acked=len(result.acked), not_held=list(result.not_held))

    async def ack_batch(self, message_ids: Sequence[Any]) -> AckedBatch:
        """Ack each id on its own: a malformed id is answered ``invalid`` and the
        others are still acked (in one store transaction)."""
        _check_batch(message_ids, "message_ids")
        valid: list[str] = []
        results: list[AckOutcome] = []
        for mid in message_ids:
            if isinstance(mid, str) and _ID_RE.fullmatch(mid):
                valid.append(mid)
                results.append(AckOutcome(message_id=mid, outcome="acked"))
            else:
                error = ErrorDetail(
                    code="invalid_request",
                    message=(
                        f"{str(mid)[:80]!r} is not a message id: use 1 to 128 letters, "
                        "digits, '_', '-', '.' or ':', starting with a letter or digit"
                    ),
                )
                shown = mid if isinstance(mid, str) else None
                results.append(AckOutcome(message_id=shown, outcome="invalid", error=error))
        not_held: set[str] = set()
        if valid:
            got = await self.hub.ack(self.team, self.name, valid)
            not_held = set(got.not_held)
        for r in results:
            if r.outcome == "acked" and r.message_id in not_held:
                r.outcome = "not_held"
        counts = {k: sum(1 for r in results if r.outcome == k) for k in ("acked", "not_held")}
        return AckedBatch(
            results=results,
            acked=counts["acked"],
            not_held=counts["not_held"],
            invalid=len(results) - counts["acked"] - counts["not_held"],
        )

    async def release(self, message_ids: Sequence[str]) -> Released:
        return Released(released=await self.hub.release(self.team, self.name, list(message_ids)))

    async def give_back(self, message_ids: Sequence[str]) -> int:
        """Release copies leased for this member that the hub never handed to it (a
        stream or long-poll whose client went away before they were written): the
        lease is not counted as an attempt."""
        return await self.hub.release(self.team, self.name, list(message_ids), untried=True)

    async def give_up(self, message_ids: Sequence[str], reason: str) -> GivenUp:
        """Leased messages this member will never handle (its model fails for good):
        each copy it holds is dead with ``reason``, and its sender is told. Ids it does
        not hold leased (acked, given back, not its own) are left as they are."""
        n = 0
        for mid in dict.fromkeys(message_ids):
            n += await self.hub.give_up(self.team, self.name, mid, reason)
        return GivenUp(given_up=n)

    # -- links -----------------------------------------------------------------------
    async def links(
        self,
        *,
        member: str | None = None,
        open_only: bool = False,
        after: str | None = None,
        limit: int = PAGE,
    ) -> LinkList:
        """A page of the team's links (or one member's), in the order they opened: at
        most ``limit`` after link ``after``; ``next_after`` is where the next page starts
        (None: this was the last)."""
        found = await self.hub.list_links(
            self.team, member=member, open_only=open_only, after=after, limit=limit + 1
        )
        page = found[:limit]
        return LinkList(
            links=[Link.model_validate(x.to_json()) for x in page],
            next_after=page[-1].link_id if len(found) > limit else None,
        )

    async def link(self, link_id: str) -> Link:
        return Link.model_validate((await self.hub.get_link(self.team, link_id)).to_json())

    # -- delegation ------------------------------------------------------------------
    async def delegate(
        self,
        to: str,
        task: str,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        tool_use_id: str | None = None,
    ) -> Delegation:
        d = await self.hub.delegate(
            self.team, self.name, session, to, task, timeout_s=timeout_s, tool_use_id=tool_use_id
        )
        return Delegation.model_validate(d.to_json())

    async def delegations(
        self,
        *,
        member: str | None = None,
        pending_only: bool = False,
        after: str | None = None,
        limit: int = PAGE,
    ) -> DelegationList:
        """A page of the delegations this member made or was asked (``member``: only
        those that member is in too; ``pending_only``: those still pending), in the order
        they were made: at most ``limit``
        after delegation ``after``; ``next_after`` is where the next page starts (None:
        this was the last). The team's human sees every one of the team's (see
        docs/decisions.md, "Who sees a delegation")."""
        if self.name == USER:
            found = await self.hub.list_delegations(
                self.team, member=member, after=after, limit=limit + 1, pending_only=pending_only
            )
        else:
            found = await self.hub.list_delegations(
                self.team,
                member=self.name,
                peer=None if member == self.name else member,
                after=after,
                limit=limit + 1,
                pending_only=pending_only,
            )
        page = found[:limit]
        return DelegationList(
            delegations=[Delegation.model_validate(d.to_json()) for d in page],
            next_after=page[-1].delegation_id if len(found) > limit else None,
        )

    async def delegation(self, delegation_id: str) -> Delegation:
        """One delegation this member made or was asked (any of the team's, for its
        human); another is answered as one that does not exist."""
        try:
            d = await self.hub.get_delegation(self.team, delegation_id)
        except NotFound:
            d = None
        if d is None or (self.name != USER and self.name not in (d.caller, d.callee)):
            raise NotFound(
                f"no delegation {delegation_id!r} that you made or were asked in team "
                f"{self.team!r}; list yours with GET /v1/delegations"
            )
        return Delegation.model_validate(d.to_json())

    async def chat(
        self,
        agent: str,
        message: str,
        *,
        reply_service: str,
        reply_token: str,
        session_id: str | None = None,
        tool_use_id: str | None = None,
        timeout_s: float | None = None,
        chain: Mapping[str, Any] | None = None,
    ) -> ChatAccepted:
        """Another hub (this member) asks ``agent`` of this team to do a task; the answer
        goes to ``reply_service`` with ``reply_token``. ``chain`` (``{"id", "hop"}``): the
        conversation chain the task goes on in."""
        d = await self.hub.accept_chat(
            self.team,
            self.name,
            agent,
            message,
            reply_service=reply_service,
            reply_token=reply_token,
            session_id=session_id,
            tool_use_id=tool_use_id,
            timeout_s=timeout_s,
            chain=chain,
        )
        return ChatAccepted(
            delegation_id=d.delegation_id, status=d.state.value, session=d.callee_session
        )

    # -- timers ----------------------------------------------------------------------
    async def set_timer(
        self,
        intent: Literal["anchor", "check", "wait"] | str,
        minutes: float | None = None,
        note: str = "",
        target: str | None = None,
        *,
        seconds: float | None = None,
        session: str | None = None,
        request_id: str | None = None,
    ) -> Timer:
        """Exactly one of ``minutes`` and ``seconds`` (an anchor without either: the
        default time). Idempotent on ``request_id``."""
        if minutes is None and seconds is None and intent == "anchor":
            minutes = DEFAULT_ANCHOR_MINUTES
        if (minutes is None) == (seconds is None):
            raise InvalidRequest("give exactly one of minutes or seconds", field="minutes")
        due = seconds if seconds is not None else float(minutes or 0) * 60
        timer = await self.hub.set_timer(
            self.team, self.name, session, intent, due, note, target, request_id=request_id
        )
        return Timer.model_validate(timer.to_json(self.hub.clock.now()))

    async def timers(
        self,
        *,
        member: str | None = None,
        session: str | None = None,
        all: bool = False,
        after: int = 0,
        limit: int = TIMER_PAGE,
    ) -> TimerList:
        """A page of the team's timers, in the order they were set: at most ``limit``
        after timer id ``after``; ``next_after`` is where the next page starts (None:
        this was the last)."""
        found = await self.hub.list_timers(
            self.team,
            member=member,
            session_id=session,
            pending_only=not all,
            after=after,
            limit=limit + 1,
        )
        now = self.hub.clock.now()
        page = found[:limit]
        more = len(found) > limit
        return TimerList(
            timers=[Timer.model_validate(t.to_json(now)) for t in page],
            next_after=page[-1].timer_id if more else None,
        )

    async def timer(self, timer_id: int) -> Timer:
        """One timer of the team (pending, fired or cancelled), its note whole."""
        timer = await self.hub.get_timer(self.team, timer_id)
        return Timer.model_validate(timer.to_json(self.hub.clock.now()))

    async def cancel_timer(self, timer_id: int) -> Timer:
        timer = await self.hub.cancel_timer(self.team, self.name, timer_id)
        return Timer.model_validate(timer.to_json())

    # -- sessions --------------------------------------------------------------------
    async def open_session(self, session_id: str | None = None) -> SessionInfo:
        return _session(await self.hub.open_session(self.team, self.name, session_id))

    async def sessions(
        self,
        *,
        member: str | None = None,
        active_only: bool = False,
        live_only: bool = False,
        after: str | None = None,
        limit: int = PAGE,
    ) -> SessionList:
        """A page of the team's sessions (or one member's; with ``active_only``, those
        whose turn runs now; with ``live_only``, those not terminated), in the order they
        were opened: at most ``limit`` after session ``after``; ``next_after`` is where
        the next page starts (None: this was the last)."""
        found = await self.hub.list_sessions(
            self.team,
            member,
            which="active" if active_only else "live" if live_only else "all",
            after=after,
            limit=limit + 1,
        )
        page = found[:limit]
        more = len(found) > limit
        return SessionList(
            sessions=[_session(s) for s in page],
            next_after=page[-1].session_id if more else None,
        )

    async def session(self, session_id: str) -> SessionInfo:
        return _session(await self.hub.get_session(self.team, session_id))

    async def report_event(
        self,
        session_id: str,
        kind: str,
        text: str = "",
        data: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> EventAnswer:
        got = await self.hub.report_event(
            self.team, self.name, session_id, kind, text, dict(data or {}), request_id=request_id
        )
        return EventAnswer.model_validate(got)

    async def runtime_alive(self, runtime: str) -> Alive:
        sessions, next_in = await self.hub.runtime_alive(self.team, self.name, runtime)
        return Alive(sessions=sessions, next_in=next_in)

    async def terminate_session(self, session_id: str, reason: str = "") -> SessionInfo:
        return _session(await self.hub.terminate_session(self.team, self.name, session_id, reason))

    async def transcript(
        self,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
        max_chars: int = 20_000,
    ) -> Transcript:
        got = await self.hub.get_session_data(
            self.team,
            session_id,
            since=since,
            until=until,
            tail_chars=tail_chars,
            max_chars=max_chars,
        )
        return Transcript.model_validate(got)

    async def events(self, *, after: int = 0) -> AsyncIterator[Traffic]:
        """The team's live traffic from cursor ``after`` on; never ends by itself."""
        async for item in _watch(self.hub, self.team, after):
            yield item

    async def hook(self, runtime: str, payload: Any, *, expect: str | None = None) -> HookResult:
        """Apply a runtime's hook call (its own hook JSON); never raises for a payload
        it cannot use: the answer is then ``{}`` and ``problem`` says why."""
        from backchannel.runtimes.common import check_expected
        from backchannel.runtimes.receiver import handle_hook

        try:
            check_expected(self.member, expect)
        except BackchannelError as exc:
            return HookResult(answer={}, problem=exc.message)
        result = await handle_hook(self.hub, self.member, runtime, payload)
        return HookResult(
            answer=result.answer, problem=result.problem, delivered=list(result.delivered)
        )

    # -- budgets ---------------------------------------------------------------------
    async def budgets(self, *, after: str | None = None, limit: int = PAGE) -> BudgetList:
        return await _budgets(self.hub, self.team, after=after, limit=limit)

    async def extend_budget(self, key: str, by: int, *, request_id: str | None = None) -> Budget:
        """Only the team's human (``user``) may; the hub says so otherwise."""
        got = await self.hub.extend_budget(
            self.team, key, by, by_whom=self.name, request_id=request_id
        )
        return Budget.model_validate(got)


class AdminApi:
    """The administrator: teams and members, credentials and removal."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    @staticmethod
    def me() -> Me:
        return Me(admin=True, team=None, name=None)

    async def create_team(
        self, name: str, settings: Mapping[str, Any] | None = None
    ) -> TeamCreated:
        team, token = await self.hub.create_team(name, settings=dict(settings or {}))
        return TeamCreated(name=team.name, created_at=team.created_at, user_token=token)

    async def teams(self, *, after: str | None = None, limit: int = PAGE) -> TeamList:
        """The teams by name, a page: at most ``limit`` after the name ``after``."""
        found = await self.hub.list_teams(after=after, limit=limit + 1)
        teams = found[:limit]
        return TeamList(
            teams=[TeamRef(name=t.name) for t in teams],
            next_after=teams[-1].name if len(found) > limit else None,
        )

    async def add_member(
        self,
        team: str,
        name: str,
        kind: MemberKind | str = MemberKind.LLM,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> MemberCreated:
        member, token = await self.hub.add_member(
            team, name, kind, delivery=dict(delivery or {}), settings=dict(settings or {})
        )
        return MemberCreated(
            name=member.name, team=member.team, kind=member.kind.value, token=token
        )

    async def update_member(
        self,
        team: str,
        name: str,
        *,
        delivery: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> MemberUpdated:
        m = await self.hub.update_member(
            team,
            name,
            delivery=None if delivery is None else dict(delivery),
            settings=None if settings is None else dict(settings),
        )
        return MemberUpdated(
            name=m.name,
            team=m.team,
            kind=m.kind.value,
            delivery=dict(m.delivery),
            settings=dict(m.settings),
        )

    async def members(
        self, team: str, *, after: str | None = None, limit: int = PAGE
    ) -> MemberList:
        return await _members(self.hub, team, delivery=True, after=after, limit=limit)

    async def rotate_token(self, team: str, name: str) -> TokenRotated:
        token = await self.hub.rotate_token(team, name)
        return TokenRotated(name=name, team=team, token=token)

    async def remove_member(self, team: str, name: str, *, reason: str = "") -> Removal:
        got = await self.hub.remove_member(team, name, reason=reason)
        return Removal.model_validate(got.to_json())

    async def remove_team(self, team: str) -> Removal:
        return Removal.model_validate((await self.hub.remove_team(team)).to_json())

    async def budgets(
        self, team: str, *, after: str | None = None, limit: int = PAGE
    ) -> BudgetList:
        return await _budgets(self.hub, team, after=after, limit=limit)

    async def events(self, team: str, *, after: int = 0) -> AsyncIterator[Traffic]:
        async for item in _watch(self.hub, team, after):
            yield item

    async def extend_budget(
        self, team: str, key: str, by: int, *, request_id: str | None = None
    ) -> Budget:
        got = await self.hub.extend_budget(team, key, by, by_whom="admin", request_id=request_id)
        return Budget.model_validate(got)


#: A setting's key whose value is a secret (any case, anywhere in the name): ``secret``,
#: ``BOT_TOKEN``, ``password``, ``Authorization``, ``ANTHROPIC_API_KEY``, ``cookie``...
_SECRET_KEY = re.compile(
    r"secret|token|passw|auth|credential|api[_-]?key|private[_-]?key|cookie|signature", re.I
)
REDACTED = "***"


def redact_delivery(setting: Any, *, _all: bool = False) -> Any:
    """``setting`` (a member's ``delivery``) as it may be shown: the value of each key
    that names a secret (:data:`_SECRET_KEY`), and every value of a ``headers`` object,
    replaced by ``"***"``, at any depth. What the setting routes to (type, target,
    service, command) stays, so a listing still says where a member's messages go."""
    if isinstance(setting, Mapping):
        return {
            k: REDACTED
            if (_all or _SECRET_KEY.search(str(k))) and v not in (None, "")
            else redact_delivery(v, _all=str(k).lower() == "headers")
            for k, v in setting.items()
        }
    if isinstance(setting, list):
        return [redact_delivery(v, _all=_all) for v in setting]
    return setting


async def _members(
    hub: Hub,
    team: str,
    *,
    delivery: bool = False,
    after: str | None = None,
    limit: int = PAGE,
) -> MemberList:
    """A page of the team's members by name (at most ``limit`` after the name
    ``after``); with ``delivery`` (for the admin), each one's delivery setting, redacted
    (:func:`redact_delivery`)."""
    found = await hub.list_members(team, after=after, limit=limit + 1)
    members = found[:limit]
    states = await hub.member_states(team)  # from Claude Code inbox traffic
    await hub.push_circuits.refresh(0)  # whichever hub found a target down
    return MemberList.model_validate(
        {
            "members": [
                {
                    "name": m.name,
                    "kind": m.kind.value,
                    "created_at": m.created_at,
                    **({"delivery": redact_delivery(m.delivery)} if delivery else {}),
                    **({"presence": states[m.name]} if m.name in states else {}),
                    **(
                        {"push_circuit": c.to_json()}
                        if (c := hub.push_circuits.get(team, m.name)) is not None
                        else {}
                    ),
                }
                for m in members
            ],
            "next_after": members[-1].name if len(found) > limit else None,
        }
    )


async def _budgets(hub: Hub, team: str, *, after: str | None, limit: int) -> BudgetList:
    """A page of the team's used budgets by key: at most ``limit`` after the key
    ``after``."""
    found = await hub.list_budgets(team, after=after, limit=limit + 1)
    budgets = found[:limit]
    return BudgetList.model_validate(
        {"budgets": budgets, "next_after": budgets[-1]["key"] if len(found) > limit else None}
    )


async def _watch(hub: Hub, team: str, after: int) -> AsyncIterator[Traffic]:
    await hub.get_team(team)
    stream = hub.watch(team, after)
    try:
        async for item in stream:
            yield Traffic.model_validate(item.to_json())
    finally:
        await stream.aclose()


async def answer_delegation(
    hub: Hub, reply_token: str, result: Any, chain: Any = None
) -> ToolResponseAccepted:
    """A callee hub's answer to a delegation, carrying the one-time reply token (and the
    conversation chain the answer goes on in, when the callee hub names one)."""
    d = await hub.accept_tool_response(reply_token, result, chain=chain)
    return ToolResponseAccepted(delegation_id=d.delegation_id, state=d.state.value)


def _session(s: Any) -> SessionInfo:
    from backchannel.hub import session_json

    return SessionInfo.model_validate(session_json(s))


def _leased(m: InboxMessage, receive_id: str) -> tuple[Received, Lease]:
    """A copy handed to the event stream named ``receive_id``, and the lease it is under."""
    return Received.model_validate(m.to_json()), Lease(receive_id, m.attempt, m.lease_until)
