"""Messages: sending, leasing, acknowledging, giving up; message status and traffic.

Every message is stored by :meth:`backchannel.hub.pipeline.Pipeline.insert`, whichever
route made it; this part is the member's side of it (``send``, ``receive``, ``ack``...)
and the hub's own ``system`` notices. Rules live in :mod:`backchannel.core.messages`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from backchannel.core import messages as rules
from backchannel.core import notices
from backchannel.core.budget import ChainRef, context_key
from backchannel.core.ids import new_message_id
from backchannel.core.messages import Outgoing
from backchannel.core.timers import (
    Reply,
    anchors_first,
    is_anchor,
    replied_after_firing,
    waiting_on,
)
from backchannel.errors import InvalidRequest, InvalidState, UnknownMessage, UnknownSession
from backchannel.hub.context import Ctx, Env, Taker, wait_any, wait_for
from backchannel.hub.pipeline import Pipeline, SendOptions, send_reads
from backchannel.hub.quotas import Quotas
from backchannel.stores.base import Reads, Tx
from backchannel.types import (
    BROADCAST,
    Delivery,
    DeliveryEvent,
    DeliveryState,
    InboxMessage,
    Lease,
    Message,
    MessageKind,
    SendResult,
    SessionState,
)

log = logging.getLogger("backchannel.hub")
__all__ = [
    "AckResult",
    "DeadLetter",
    "FeedItem",
    "Leased",
    "MessageStatus",
    "Messages",
    "Outgoing",
    "new_message_id",
]


#: The detail of a ``released`` event whose lease was not counted as an attempt.
UNTRIED = "given back untried: this lease is not counted as an attempt"
#: the history event a push delivery writes when it first holds a copy (its medium must
#: not take it now: ``HeldDelivery``): the hold's bound counts from it, across restarts
#: and hubs taking the member over (:meth:`Messages.first_held`)
HELD = "held"
#: The longest a named receive made again waits for the give-back of what the cancelled
#: receive of that name leased (one store transaction, normally milliseconds).
NAMED_GIVE_BACK_WAIT = 5.0


@dataclass(eq=False)
class StreamHold:
    """An event stream's hold on its name on this hub (:meth:`Messages.open_stream`):
    ``superseded`` is set, and ``wake`` too, when another stream is opened under it."""

    superseded: asyncio.Event
    wake: asyncio.Event


def _number(value: object, *, whole: bool = False) -> bool:
    """``value`` is a number (an int if ``whole``), not a bool, not NaN."""
    if isinstance(value, bool):
        return False
    if whole:
        return isinstance(value, int)
    return isinstance(value, int | float) and not math.isnan(value)


@dataclass(frozen=True, slots=True)
class AckResult:
    acked: tuple[str, ...]
    not_held: tuple[str, ...]


NOTHING_ACKED = AckResult((), ())


class Leased(list[InboxMessage]):
    """What a receive leased, in send order (a plain list to whoever wants one), with
    ``acked``: what became of the ids the receive was asked to ack first (nothing when
    it was asked none)."""

    __slots__ = ("acked",)

    def __init__(
        self, messages: Iterable[InboxMessage] = (), acked: AckResult = NOTHING_ACKED
    ) -> None:
        super().__init__(messages)
        self.acked = acked


def owns(tx: Tx, team: str, member: str, owner: str | None) -> bool:
    """Whether the store names ``owner`` (a push dispatcher's hub id) the hub that pushes
    the member's messages (``Tx.claim_dispatch``); True when no owner is named (a client
    that pulls). Read in the transaction that acts on it: on PostgreSQL it takes the
    team's lock, as a claim does, so no takeover commits between the check and the act."""
    return owner is None or (tx.dispatch_owner(team, member) or ("",))[0] == owner


def ack_ids(message_ids: Sequence[str], field: str) -> list[str]:
    """The ids an ack was given, checked as every ack checks them (at most 1000)."""
    ids = [str(i) for i in message_ids]
    if len(ids) > 1000:
        raise InvalidRequest(f"at most 1000 ids in {field} per ack", field=field)
    return ids


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


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A copy the hub gave up on, with its message."""

    delivery: Delivery
    message: Message | None

    def to_json(self) -> dict[str, Any]:
        d, m = self.delivery, self.message
        return {
            "message_id": d.message_id,
            "to": d.recipient.member,
            "at": d.updated_at,
            "reason": d.dead_reason or "",
            "attempts": d.attempts,
            "from": m.sender if m else None,
            "kind": m.kind.value if m else None,
            "summary": (m.summary or _first_line(m.text)) if m else None,
        }


def _first_line(text: str, width: int = 120) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


class Messages:
    """The member's side of messages (see the module docstring)."""

    def __init__(self, env: Env, quotas: Quotas, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock, self.config = env.store, env.clock, env.config
        self.quotas = quotas
        self.pipeline = pipeline
        self._giving_back: set[asyncio.Task[int]] = set()
        #: (team, member, receive name) -> the give-backs under way of what receives of
        #: that name leased and were cancelled: a receive made again under the name
        #: waits for them, so it never holds a copy a give-back then puts back
        self._named_give_backs: dict[tuple[str, str, str], set[asyncio.Future[None]]] = {}
        #: (team, member, receive name) -> the event stream open under that name on this
        #: hub (held weakly: a stream whose body never ran leaves nothing behind)
        self._streams: weakref.WeakValueDictionary[tuple[str, str, str], StreamHold] = (
            weakref.WeakValueDictionary()
        )

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
        chain: ChainRef | None = None,
    ) -> SendResult:
        """Queue ``text`` for ``to`` (a member name, or ``*`` for everyone but the sender).

        Idempotent on ``message_id``: the same id with the same content returns the first
        result (``replayed=True``); with other content it raises ``MessageIdConflict``.
        Unknown recipients raise ``UnknownRecipient`` with the closest names. ``chain``:
        the conversation chain another hub named for this send (an A2A task's), which
        may raise the chain and hop the send has, never lower them.
        """
        item = Outgoing(
            to,
            text,
            summary=summary,
            message_id=message_id,
            kind=kind,
            sender_session=sender_session,
            to_session=to_session,
            meta=meta,
            link=link,
            close_link=close_link,
            link_budget=link_budget,
            chain=chain,
        )
        result = await self.env.transact(self._sending(team, sender, item, hand_off=True))
        return await self._push_warnings(team, result)

    async def _push_warnings(self, team: str, result: SendResult) -> SendResult:
        """``result`` with a warning for each recipient whose push delivery a hub's
        dispatcher found down (:mod:`backchannel.delivery.circuit`): the send is taken,
        and its sender learns now, not at the dead letter, that it may not get through.
        The stored circuits are read at most once per ``CACHE_S`` on this hub, not per
        send."""
        circuits = self.env.push_circuits
        if circuits.stale():
            await circuits.refresh()
        if not circuits.any():
            return result
        down = [c for r in result.recipients if (c := circuits.get(team, r.member)) is not None]
        if not down:
            return result
        return replace(result, warnings=(*result.warnings, *(c.warning() for c in down)))

    async def send_many(
        self, team: str, sender: str, items: Sequence[Outgoing]
    ) -> list[SendResult | Exception]:
        """Send each of ``items`` as :meth:`send` does, in one call: the answer is, in
        order, each one's :class:`SendResult` or the error it alone raised (a bad item
        fails alone; the others are sent). The sends go to the store as one call
        (:meth:`Env.transact_each`), in the order given, so the writer commits them in
        few transactions and the event loop is answered once."""
        answers: list[SendResult | Exception | None] = [None] * len(items)
        fns: list[Callable[[Ctx], SendResult]] = []
        places: list[int] = []
        for index, item in enumerate(items):
            try:
                fns.append(self._sending(team, sender, item))
            except Exception as exc:  # a bad item: answered alone, nothing stored
                answers[index] = exc
            else:
                places.append(index)
        for index, outcome in zip(places, await self.env.transact_each(fns), strict=True):
            answers[index] = (
                await self._push_warnings(team, outcome)
                if isinstance(outcome, SendResult)
                else outcome
            )
        return [a for a in answers if a is not None]

    def sending(self, team: str, sender: str, item: Outgoing) -> Callable[[Ctx], SendResult]:
        """The transaction function of :meth:`send` for ``item``, to run inside another
        part's transaction (``Sessions.open_session``'s ``first``): the send is checked
        now; it is stored, or refused, with that transaction."""
        return self._sending(team, sender, item)

    def _sending(
        self, team: str, sender: str, item: Outgoing, *, hand_off: bool = False
    ) -> Callable[[Ctx], SendResult]:
        """Check ``item`` and build its message; the transaction function that stores
        it (or answers a replay of it). With ``hand_off``, a receive of a recipient
        waiting in this process is handed the message, leased in this transaction
        (:class:`~backchannel.hub.context.Takers`); a batch does not, so that a woken
        receiver leases the whole batch at once."""
        text, to, message_id = item.text, item.to, item.message_id
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", field="text")
        rules.check_text(text, self.config.max_text)
        if to != BROADCAST:
            rules.check_name("recipient", to)
        link_budget = item.link_budget
        if link_budget is not None and not 1 <= link_budget <= 1000:
            raise InvalidRequest(
                "link_budget must be between 1 and 1000 turns", field="link_budget"
            )
        options = SendOptions(item.link, item.close_link, link_budget, chain=item.chain)
        mid = rules.check_message_id(message_id) if message_id else new_message_id()
        now = self.clock.now()
        kind, to_session, meta = item.kind, item.to_session, item.meta
        fp = rules.fingerprint(sender, to, text, item.summary, kind.value, to_session, meta)
        message = Message(
            team=team,
            message_id=mid,
            sender=sender,
            to=to,
            text=text,
            kind=kind,
            created_at=now,
            fingerprint=fp,
            summary=item.summary,
            sender_session=item.sender_session,
            meta=dict(meta or {}),
        )

        minted = message_id is None  # a fresh hub id cannot be a replay

        def fn(c: Ctx) -> SendResult:
            tx = c.tx
            if tx.prefetches:
                tx.prefetch(send_reads(message, replay=not minted))
            existing = None if minted else tx.get_message(team, mid)
            if rules.decide_replay(existing, fp) is rules.Replay.REPLAY:
                copies = tx.deliveries(team, mid)
                return SendResult(
                    mid,
                    rules.aggregate_state(d.state for d in copies),
                    tuple(d.recipient for d in copies),
                    replayed=True,
                )
            self.quotas.check_inbox(c, team, sender, to)
            result = self.pipeline.insert(c, message, to_session, options)
            c.emit("after_send", message, result)
            takers = self.env.takers
            if hand_off and takers and to_session is None:
                for r in result.recipients:
                    taker = takers.claim(team, r.member) if r.session is None else None
                    if taker is not None:
                        got = self._lease(
                            c,
                            team,
                            r.member,
                            None,
                            now,
                            now + taker.lease,
                            taker.limit,
                            holder=taker.holder,
                        )
                        c.hand(taker, got)
            return result

        return fn

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
        ack: Sequence[str] = (),
        receive_id: str | None = None,
        fresh: bool = False,
    ) -> Leased:
        """Lease up to ``limit`` messages in send order, waiting up to ``wait`` seconds for
        the first. Leased messages come back after the lease unless acked. With
        ``pinned_only``, only messages pinned to ``session`` (a delegation's sub-session
        takes nothing addressed to the member as a whole). Setting ``stop`` ends the wait
        early (a long-poll whose client went away). With ``owner`` (a push dispatcher's
        hub id), nothing is leased unless ``owner`` holds the member's push-delivery lease
        (``Tx.claim_dispatch``), checked in the leasing transaction itself.

        ``ack`` names messages received earlier that the member is done with: they are
        acked as :meth:`ack` acks them, in the same store transaction as the first lease
        attempt, so a receiver loop costs one transaction per batch. The result's
        ``acked`` says which were acked and which not held; ids not held never fail the
        receive. The ack is committed before any wait for messages begins, and is not
        done again when the wait ends; a receive that fails (a bad session) acks
        nothing.

        ``receive_id`` names this receive (its client's name, new for each receive):
        what it leases is leased to that name, and a receive made again under the same
        name (its answer lost on the way: a proxy or a broken connection cut it after
        the hub wrote it) is answered with the messages the first one leased and still
        holds, the same attempt, instead of leasing others while those wait out their
        lease. With ``fresh``, what the name holds is not answered again: new messages
        are leased to it (the event stream, which sends each once per connection and
        asks for what its name holds with :meth:`held` when it is opened again)."""
        limit = self.config.default_limit if limit is None else limit
        # not NaN (which no comparison refuses: a NaN lease was stored as no lease end,
        # and the message was the caller's for ever), not a bool, a whole limit
        if not _number(limit, whole=True) or not 1 <= limit <= rules.MAX_LIMIT:
            raise InvalidRequest(
                f"limit must be a whole number between 1 and {rules.MAX_LIMIT}", field="limit"
            )
        if not _number(wait) or not 0 <= wait <= rules.MAX_WAIT:
            raise InvalidRequest(
                f"wait must be between 0 and {rules.MAX_WAIT} seconds", field="wait"
            )
        if lease_seconds is not None and (
            not _number(lease_seconds) or not 0 < lease_seconds <= rules.MAX_LEASE
        ):
            raise InvalidRequest(
                f"lease_seconds must be above 0 and at most {rules.MAX_LEASE}",
                field="lease_seconds",
            )
        lease = self.config.lease_seconds if lease_seconds is None else lease_seconds
        ids = ack_ids(ack, "ack")
        holder = None if receive_id is None else rules.check_receive_id(receive_id)
        if holder is not None:
            await self._given_back_under(team, member, holder)
        acked = NOTHING_ACKED

        def attempt(
            c: Ctx, now: float, ids: list[str], own: Taker
        ) -> tuple[AckResult, list[InboxMessage]]:
            done = self._ack(c, team, member, ids, now, owner) if ids else NOTHING_ACKED
            got = self._held(c, team, member, holder, now, limit) if holder and not fresh else []
            if not got:
                got = self._lease(
                    c,
                    team,
                    member,
                    session,
                    now,
                    now + lease,
                    limit,
                    not pinned_only,
                    owner,
                    holder,
                )
            if got:
                c.hand(own, got)  # answered on commit: given back if this receive is gone
            return done, got

        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            ready = self.env.waiters.event(team, member)
            # a receive cancelled while its lease runs in the store's thread (which may
            # still commit it, after a push worker stopped and another started, say):
            # what that lease took goes back to the queue at once, not at its end
            own = Taker(limit, lease, loop.create_future(), holder)
            try:
                done, got = await self.env.transact(
                    partial(attempt, now=self.clock.now(), ids=ids, own=own)
                )
            except asyncio.CancelledError:
                self._give_back(team, member, own, owner)
                raise
            if ids:  # acked with the first attempt only, and committed with it
                acked, ids = done, []
            if got:
                return Leased(got, acked)
            remaining = deadline - loop.time()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return Leased((), acked)
            # a send to this member may lease its message for this receive
            taker = None
            if session is None and owner is None:
                taker = Taker(limit, lease, loop.create_future(), holder)
                self.env.takers.add(team, member, taker)
            try:
                if stop is None:
                    await wait_for(ready, remaining)
                else:
                    await wait_any((ready, stop), remaining)
            except BaseException:
                if taker is not None and not self.env.takers.remove(team, member, taker):
                    self._give_back(team, member, taker)
                raise
            if taker is not None and not self.env.takers.remove(team, member, taker):
                try:  # claimed: that send's commit (or failure) answers it
                    got = await asyncio.shield(taker.future)
                except BaseException:
                    self._give_back(team, member, taker)
                    raise
                if got:
                    return Leased(got, acked)

    def _give_back(self, team: str, member: str, taker: Taker, owner: str | None = None) -> None:
        """A receive that stopped while a transaction leased for it (cancelled: a send
        had claimed it, or its own lease was still running): what that transaction
        leases for it goes back to the inbox at once, not at the lease's end (with
        ``owner``, only while it still holds the member's push delivery)."""

        settled: asyncio.Future[None] | None = None
        if taker.holder is not None:
            # a receive made again under the name (its client's retry) looks once this
            # give-back is over: it must not be answered with a copy about to go back
            key = (team, member, taker.holder)
            settled = asyncio.get_running_loop().create_future()
            self._named_give_backs.setdefault(key, set()).add(settled)

            def over(_: object, done: asyncio.Future[None] = settled) -> None:
                if not done.done():
                    done.set_result(None)
                waiting = self._named_give_backs.get(key)
                if waiting is not None:
                    waiting.discard(done)
                    if not waiting:
                        del self._named_give_backs[key]

        def handed(fut: asyncio.Future[list[InboxMessage]]) -> None:
            got = [] if fut.cancelled() else fut.result()
            if not got:
                if settled is not None:
                    over(None)
                return
            # each copy only while still under the lease this receive took: one answered
            # again to its name since (the client's retry, on another hub) stays leased
            leases = {
                m.message.message_id: Lease(taker.holder, m.attempt, m.lease_until) for m in got
            }
            task = asyncio.ensure_future(self._give_back_leases(team, member, leases, owner))
            self._giving_back.add(task)
            task.add_done_callback(self._given_back)
            if settled is not None:
                task.add_done_callback(over)

        taker.future.add_done_callback(handed)

    async def _give_back_leases(
        self, team: str, member: str, leases: Mapping[str, Lease], owner: str | None
    ) -> int:
        """Give back untried the copies still under the leases named (by message id)."""
        now = self.clock.now()

        def fn(tx: Tx) -> int:
            if not owns(tx, team, member, owner):
                return 0
            return self._release(tx, team, member, leases, now, untried=True, leases=leases)

        n = await self.store.transact(fn)
        if n:
            self.env.waiters.notify(team, member)
        return n

    async def _given_back_under(self, team: str, member: str, holder: str) -> None:
        """Wait (at most :data:`NAMED_GIVE_BACK_WAIT`) for the give-backs under way of
        what cancelled receives named ``holder`` leased (:meth:`_give_back`)."""
        waiting = self._named_give_backs.get((team, member, holder))
        if waiting:
            await asyncio.wait(list(waiting), timeout=NAMED_GIVE_BACK_WAIT)

    def _given_back(self, task: asyncio.Task[int]) -> None:
        self._giving_back.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning(
                "giving back messages leased for a receive that stopped failed (they come "
                "back when their lease ends): %s",
                task.exception(),
            )

    def _lease(
        self,
        c: Ctx,
        team: str,
        member: str,
        session: str | None,
        now: float,
        until: float,
        limit: int,
        include_unpinned: bool = True,
        owner: str | None = None,
        holder: str | None = None,
    ) -> list[InboxMessage]:
        tx = c.tx
        # what a lease reads besides the inbox, in the round trip that takes the lock
        if tx.prefetches:
            tx.prefetch(
                Reads(team, session=session)
                if session is not None
                else Reads(team, budgets=(context_key(member),), live_of=member)
            )
        if not owns(tx, team, member, owner):
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
                tx.lease(team, member, session, now, until, limit, include_unpinned, holder)
            )
            got = _replies_since_firing(tx, team, member, got)
            if got:
                c.schedule(until)  # the lease ends then
                self.pipeline.after_lease(c, s, got, now)
            return got
        got = anchors_first(tx.lease(team, member, session, now, until, limit, holder=holder))
        got = _replies_since_firing(tx, team, member, got)
        if got:
            c.schedule(until)
            self.pipeline.after_member_lease(c, team, member, got, now)
        return got

    async def held(self, team: str, member: str, receive_id: str) -> list[InboxMessage]:
        """What the receive named ``receive_id`` leased and still holds (up to
        ``MAX_LIMIT``), as it was handed over, the same attempt, in the order it was
        leased. Nothing is leased, and nothing of the lease's reactions runs again. An
        event stream opened again pages through all of it with :meth:`held_since`."""
        holder = rules.check_receive_id(receive_id)
        now = self.clock.now()
        return await self.env.transact(
            lambda c: self._held(c, team, member, holder, now, rules.MAX_LIMIT)
        )

    async def held_since(
        self,
        team: str,
        member: str,
        receive_id: str,
        last: str | None = None,
        *,
        again: bool = False,
    ) -> AsyncGenerator[list[InboxMessage], None]:
        """All the event stream named ``receive_id`` leased and still holds, in the order
        it sent them (by lease, a lease's fired anchors first: as :meth:`receive` handed
        them over), the same attempt, a page at a time (``config.held_page`` a store
        read, so a stream holding many costs no more memory than a page): those after
        the message ``last`` when the name holds it or the reader acked it (it saw that
        one and all sent before it), all of them otherwise. Nothing is leased or
        changed, unless ``again`` (the stream opened again, sending them): then each
        page is handed to the name anew in a transaction of its own
        (``Tx.held_again``), each copy under a lease of its own (its ``lease_until`` as
        it now is), so a give-back of the lease it had (the connection before this one,
        ending after it) leaves it alone; those before ``last`` too (the reader saw
        them: nothing of that connection's end puts them back), though they are not
        answered."""
        holder = rules.check_receive_id(receive_id)
        start: tuple[float, bool, int] | None = None
        if last:  # where the reader stopped, in the order the stream sent them
            async for page in self._held_pages(team, member, holder):
                for m in page:
                    if m.message.message_id == last:
                        start = _sent_order(m)
                        break
                if start is not None:
                    break
            if start is None:  # acked since: where it stood when it was leased
                start = await self.store.read(partial(_acked_order, team, member, last))

        def lost(copies: Sequence[InboxMessage]) -> None:
            # handed anew for the stream and never answered to it (its client left while
            # they were): back to the queue at once, untried, not left leased to nobody;
            # those before ``last`` stay, as if answered (the reader saw them)
            unsent = [m for m in copies if start is None or _sent_order(m) > start]
            if unsent:
                leases = {
                    m.message.message_id: Lease(holder, m.attempt, m.lease_until) for m in unsent
                }
                task = asyncio.ensure_future(self._give_back_leases(team, member, leases, None))
                self._giving_back.add(task)
                task.add_done_callback(self._given_back)

        pages = self._held_pages(
            team, member, holder, None if again else start, again, lost if again else None
        )
        async with contextlib.aclosing(pages):
            async for page in pages:
                out = [m for m in page if start is None or _sent_order(m) > start]
                if out:
                    yield out

    async def _held_pages(
        self,
        team: str,
        member: str,
        holder: str,
        start: tuple[float, bool, int] | None = None,
        again: bool = False,
        lost: Callable[[Sequence[InboxMessage]], None] | None = None,
    ) -> AsyncGenerator[list[InboxMessage], None]:
        """What ``holder`` holds, a lease at a time, in the order it was sent (from the
        lease of ``start`` on); a lease is held back until the next page shows it whole,
        so its anchors go first even when it spans pages. With ``again``, each page is
        handed to ``holder`` anew (``Tx.held_again``, one transaction a page), and those
        handed anew and not yielded when it stops (closed early, or cancelled while a
        page was handed: that transaction's copies once it commits) go to ``lost``."""
        page = max(1, int(self.config.held_page))
        after = None if start is None else (start[0], -1)
        lease: list[InboxMessage] = []
        left: dict[str, InboxMessage] = {}  # handed anew, not yielded
        try:
            while True:
                now = self.clock.now()
                look = partial(_held_page, team, member, holder, now, after, page, again=again)
                if again:
                    handing = asyncio.ensure_future(self.env.store.transact(look))
                    try:
                        got = await asyncio.shield(handing)
                    except asyncio.CancelledError:
                        if lost is not None:
                            handing.add_done_callback(partial(_handed_to_nobody, lost))
                        raise
                    left.update((m.message.message_id, m) for m in got)
                else:
                    got = await self.env.store.read(look)
                for m in got:
                    if lease and m.leased_at != lease[0].leased_at:
                        yield _yielded(anchors_first(lease), left)
                        lease = []
                    lease.append(m)
                if len(got) < page:
                    break
                after = (got[-1].leased_at, got[-1].seq)
            if lease:
                yield _yielded(anchors_first(lease), left)
        finally:
            if lost is not None and left:
                lost(list(left.values()))

    def open_stream(
        self, team: str, member: str, receive_id: str, wake: asyncio.Event
    ) -> StreamHold:
        """An event stream is opened under ``receive_id``: the one open under that name
        on this hub before it (its reader gone, its connection not yet seen to end) is
        superseded: its events are set (its waits end), and it leases nothing more and
        ends. The answer is this stream's hold on the name, whose ``superseded`` is set
        (with ``wake``) when a later one supersedes it; :meth:`close_stream` when it
        ends (the hub holds it weakly: one dropped unclosed is gone as well)."""
        key = (team, member, rules.check_receive_id(receive_id))
        old = self._streams.get(key)
        if old is not None:
            old.superseded.set()
            old.wake.set()
        self._streams[key] = mine = StreamHold(asyncio.Event(), wake)
        return mine

    def close_stream(self, team: str, member: str, receive_id: str, hold: StreamHold) -> None:
        """The event stream :meth:`open_stream` answered ``hold`` has ended."""
        key = (team, member, receive_id)
        if self._streams.get(key) is hold:
            del self._streams[key]

    def on_external_change(self, team: str | None, member: str | None) -> None:
        """Another hub changed the store, for ``member`` of ``team`` (or, None, for the
        team as a whole, or for anyone): the event streams open here for that member
        stop waiting (their ``wake`` is set) and look at their window now. A stream
        opened again under one's name on that hub has handed what it holds anew: the
        one here sees it and ends at once, not at its next keep-alive."""
        for (t, m, _), hold in list(self._streams.items()):
            if team is None or (t == team and (member is None or m == member)):
                hold.wake.set()

    async def holding(
        self,
        team: str,
        member: str,
        receive_id: str,
        limit: int,
        wait: float = 0.0,
        stop: asyncio.Event | None = None,
    ) -> list[str]:
        """The ids of what ``receive_id`` holds leased (at most ``limit``): an event
        stream's unacked window. With ``wait``, when it holds ``limit`` already, waits
        up to ``wait`` seconds (or until ``stop`` is set) for one of the team's acks and
        answers again."""
        holder = rules.check_receive_id(receive_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            acked = self.env.waiters.event(team, None)  # taken before the look
            now = self.clock.now()
            got = await self.env.store.read(
                partial(_held_page, team, member, holder, now, None, limit, reply=False)
            )
            remaining = deadline - loop.time()
            if len(got) < limit or remaining <= 0 or (stop is not None and stop.is_set()):
                return [m.message.message_id for m in got]
            events = (acked,) if stop is None else (acked, stop)
            await wait_any(events, remaining)

    async def held_leases(
        self, team: str, member: str, receive_id: str, limit: int
    ) -> dict[str, Lease]:
        """What ``receive_id`` holds leased (at most ``limit``, in lease order), by
        message id, each with the :class:`Lease` it is under: an event stream's unacked
        window, and whether a copy it holds was sent since by the stream opened again
        under its name (on another hub: its lease is not the one the stream keeps)."""
        holder = rules.check_receive_id(receive_id)
        now = self.clock.now()
        got = await self.env.store.read(
            partial(_held_page, team, member, holder, now, None, limit, reply=False)
        )
        return {m.message.message_id: Lease(holder, m.attempt, m.lease_until) for m in got}

    def _held(
        self, c: Ctx, team: str, member: str, holder: str, now: float, limit: int
    ) -> list[InboxMessage]:
        """What the receive named ``holder`` leased and still holds, as it was handed
        over (its answer was lost: this receive is that one made again). Nothing of the
        lease's reactions runs again; they ran with the lease. Each copy answered is
        handed to the name anew (``Tx.held_again``): a give-back of the lease it had
        under way (the first receive, cancelled as it leased, on another hub) leaves it
        with the client that has it now."""
        got = c.tx.held_again(team, member, holder, now, limit)
        return _replies_since_firing(c.tx, team, member, anchors_first(got))

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

    async def ack(
        self, team: str, member: str, message_ids: Sequence[str], *, owner: str | None = None
    ) -> AckResult:
        """Acknowledge copies the member holds. Ids it does not hold are reported back
        in ``not_held`` (nothing else changes). With ``owner`` (a push dispatcher's hub
        id), nothing is acked unless ``owner`` holds the member's push delivery, checked
        in the same transaction (so do :meth:`release`, :meth:`mark_delivered` and
        :meth:`give_up`): a hub that lost the member cannot touch a copy the new owner
        holds."""
        ids = ack_ids(message_ids, "message_ids")
        if not ids:
            raise InvalidRequest(
                "message_ids is empty; pass the ids you received", field="message_ids"
            )
        now = self.clock.now()
        return await self.env.transact(lambda c: self._ack(c, team, member, ids, now, owner))

    @staticmethod
    def _ack(
        c: Ctx, team: str, member: str, ids: list[str], now: float, owner: str | None = None
    ) -> AckResult:
        """The ack inside a transaction (:meth:`ack`, or a receive that acks first); the
        ``after_ack`` hooks and the team's watchers run once it committed."""
        if not owns(c.tx, team, member, owner):
            return AckResult((), tuple(dict.fromkeys(ids)))
        acked = c.tx.ack(team, member, ids, now)
        done = set(acked)
        result = AckResult(tuple(acked), tuple(i for i in dict.fromkeys(ids) if i not in done))
        if acked:
            c.emit("after_ack", team, member, result.acked)
            c.watched(team)
        return result

    @staticmethod
    def _release(
        tx: Tx,
        team: str,
        member: str,
        ids: Iterable[str],
        now: float,
        untried: bool = False,
        leases: Mapping[str, Lease] | None = None,
    ) -> int:
        """Give ``member``'s leased copies of ``ids`` back to the queue, inside a
        transaction (:meth:`release`, a hook answer settled, a give-back); how many went
        back. With ``leases``, each copy only while still under the lease named for it."""
        return sum(
            tx.transition(
                team,
                mid,
                member,
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.QUEUED,
                now=now,
                event="released",
                detail=UNTRIED if untried else "",
                refund=untried,
                lease=None if leases is None else leases[mid],
            )
            for mid in dict.fromkeys(ids)
        )

    async def release(
        self,
        team: str,
        member: str,
        message_ids: Sequence[str],
        *,
        owner: str | None = None,
        untried: bool = False,
        leases: Mapping[str, Lease] | None = None,
    ) -> int:
        """Give leased copies back at once instead of waiting for the lease to end (with
        ``owner``, only while it holds the member's push delivery; see :meth:`ack`).
        With ``untried`` (the hub's own give-backs of copies it never handed to anyone:
        a push worker stopped with the hub, a receive that never answered), the lease
        is not counted as an attempt; a receiver's own release always is. With
        ``leases`` (by message id, each of ``message_ids``), each copy only while still
        under the lease named for it: an event stream gives back what it leased, never
        a copy the stream opened again under its name has sent since."""
        now = self.clock.now()
        if leases is not None and any(mid not in leases for mid in message_ids):
            raise InvalidRequest("each id given back must name its lease", field="leases")

        def fn(tx: Tx) -> int:
            if not owns(tx, team, member, owner):
                return 0
            return Messages._release(tx, team, member, message_ids, now, untried, leases)

        n = await self.store.transact(fn)
        if n:
            self.env.waiters.notify(team, member)
        return n

    async def mark_delivered(
        self,
        team: str,
        member: str,
        message_id: str,
        detail: str = "",
        *,
        owner: str | None = None,
        ack: bool = False,
    ) -> bool:
        """An adapter put a leased copy in front of the agent (inbox file, hook answer...).
        False if the copy was not leased (or, with ``owner``, ``owner`` no longer holds the
        member's push delivery; see :meth:`ack`). With ``ack`` (an adapter whose delivery
        is the agent's receipt, as a webhook's 2xx), the copy is acked in the same
        transaction, as :meth:`ack` would (even if it was no longer leased: the push
        happened): one commit a push instead of two, which on a store whose writers of a
        team take turns (PostgreSQL's team lock, SQLite's one writer) is what bounds a
        team's push rate."""
        now = self.clock.now()

        def fn(c: Ctx) -> bool:
            if not owns(c.tx, team, member, owner):
                return False
            done = c.tx.transition(
                team,
                message_id,
                member,
                from_states=[DeliveryState.LEASED],
                to_state=DeliveryState.DELIVERED,
                now=now,
                event="delivered",
                detail=detail,
            )
            if ack:
                acked = tuple(c.tx.ack(team, member, [message_id], now))
                if acked:
                    c.emit("after_ack", team, member, acked)
                    c.watched(team)
            return done

        return await self.env.transact(fn)

    async def pending(self, team: str, member: str) -> int:
        """How many copies the member has not acked yet (queued or leased)."""
        return await self.store.read(lambda tx: tx.pending_count(team, member))

    async def give_up(
        self,
        team: str,
        member: str,
        message_id: str,
        reason: str,
        *,
        owner: str | None = None,
        untried: bool = False,
    ) -> bool:
        """An adapter cannot deliver a leased copy and retrying will not help (a 404 from
        a webhook, a pane that is gone): the copy is ``dead`` with ``reason`` and the
        sender is told. False if the copy was not leased (or, with ``owner``, ``owner``
        no longer holds the member's push delivery; see :meth:`ack`). With ``untried``
        (a copy held past its bound: nothing was typed or sent), the lease it is given
        up from is not counted as an attempt."""
        now = self.clock.now()

        def fn(c: Ctx) -> bool:
            if not owns(c.tx, team, member, owner):
                return False
            copy = next(
                (d for d in c.tx.deliveries(team, message_id) if d.recipient.member == member),
                None,
            )
            if copy is None or not self.kill(c, copy, reason, now, refund=untried):
                return False
            self.dead_notice(c, copy, reason, now)
            return True

        return await self.env.transact(fn)

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

    async def feed_removed(self, team: str) -> int:
        """The largest cursor of the team's events retention removed (0: none)."""
        return await self.store.read(lambda tx: tx.feed_removed(team))

    async def feed_start(self, team: str, last: int) -> int:
        """The cursor the team's latest ``last`` history events follow (0: all of them)."""
        return await self.store.read(lambda tx: tx.feed_start(team, last))

    async def dead_letters(self, team: str, limit: int) -> tuple[list[DeadLetter], int]:
        """The team's latest ``limit`` dead copies, the latest given up on first, each
        with its message; and how many dead copies the team holds in all."""

        def fn(tx: Tx) -> tuple[list[DeadLetter], int]:
            found, total = tx.dead_letters(team, limit)
            cache: dict[str, Message | None] = {}
            for d in found:
                if d.message_id not in cache:
                    cache[d.message_id] = tx.get_message(team, d.message_id)
            return [DeadLetter(d, cache[d.message_id]) for d in found], total

        return await self.store.read(fn)

    async def watch(
        self, team: str, after: int = 0, *, idle_check: float = 1.0
    ) -> AsyncGenerator[FeedItem, None]:
        """Yield a team's traffic as it happens, from cursor ``after`` on."""
        while True:
            ready = self.env.waiters.event(team, None)
            items = await self.feed(team, after)
            for item in items:
                after = item.cursor
                yield item
            if not items:
                await wait_for(ready, idle_check)

    @staticmethod
    def kill(c: Ctx, d: Delivery, reason: str, now: float, refund: bool = False) -> bool:
        """A leased copy is given up on: ``dead``, with ``reason`` in its history (with
        ``refund``, its lease is not counted as an attempt)."""
        return c.tx.transition(
            d.team,
            d.message_id,
            d.recipient.member,
            from_states=[DeliveryState.LEASED],
            to_state=DeliveryState.DEAD,
            now=now,
            event="dead",
            detail=reason,
            dead_reason=reason,
            refund=refund,
        )

    async def first_held(
        self, team: str, member: str, message_id: str, detail: str, *, owner: str | None = None
    ) -> float | None:
        """When the member's push delivery first held its copy of ``message_id`` (the
        hub's clock; a :data:`HELD` event in the copy's history, written now with
        ``detail`` when there is none yet): a hold's bound counts from there, whichever
        hub or worker held it. None (nothing written) when ``owner`` no longer holds the
        member's push delivery, or the copy is gone."""
        now = self.clock.now()

        def fn(tx: Tx) -> float | None:
            if not owns(tx, team, member, owner):
                return None
            for e in tx.history(team, message_id):
                if e.member == member and e.event == HELD:
                    return e.at
            if not any(d.recipient.member == member for d in tx.deliveries(team, message_id)):
                return None
            tx.add_history(team, DeliveryEvent(message_id, member, now, HELD, detail))
            return now

        return await self.store.transact(fn)

    def dead_notice(
        self, c: Ctx, d: Delivery, reason: str, now: float, advice: str | None = None
    ) -> None:
        """Tell the sender of a copy given up on (never a notice about a notice)."""
        tx = c.tx
        msg = tx.get_message(d.team, d.message_id)
        if (
            msg is None
            or msg.kind is MessageKind.SYSTEM
            or tx.get_member(d.team, msg.sender) is None
        ):
            return  # never a notice about a notice: no loops
        system = notices.dead_letter(msg, d.recipient, reason, now, advice)
        if tx.get_message(d.team, system.message_id) is None:
            self.pipeline.insert(c, system, None)

    async def notice(
        self,
        team: str,
        to: str,
        text: str,
        *,
        message_id: str,
        summary: str,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Send the hub's own ``system`` notice to member ``to`` (for parts outside the
        hub, such as the delivery dispatcher, that must tell a member something).
        Idempotent on ``message_id``; False when it was sent already or ``to`` is no
        member of ``team``."""
        msg = notices.system(
            team, to, text, self.clock.now(), message_id=message_id, summary=summary, meta=meta
        )

        def fn(c: Ctx) -> bool:
            tx = c.tx
            if tx.get_member(team, to) is None or tx.get_message(team, message_id) is not None:
                return False
            self.pipeline.insert(c, msg, None)
            return True

        return await self.env.transact(fn)

    async def react(self, team: str, member: str, message_id: str, emoji: str) -> None:
        """Add a reaction to a message you sent or received. A reaction is not a send: it
        never feeds the ledger and never crosses a link; it is recorded in the message's
        history. A member's reaction with one emoji is there once: the same reaction
        again (made again when its answer was lost, or twice at the same moment) changes
        nothing and is answered as the first was; the store enforces it
        (:meth:`Tx.add_reaction`)."""
        if not isinstance(emoji, str) or not 1 <= len(emoji) <= 32:
            raise InvalidRequest("emoji must be 1 to 32 characters", field="emoji")
        await self.message_status(team, message_id, viewer=member)
        event = DeliveryEvent(message_id, member, self.clock.now(), "reaction", emoji)
        await self.store.transact(lambda tx: tx.add_reaction(team, event))


def _held_page(
    team: str,
    member: str,
    holder: str,
    now: float,
    after: tuple[float, int] | None,
    limit: int,
    tx: Tx,
    reply: bool = True,
    again: bool = False,
) -> list[InboxMessage]:
    """A page of what ``holder`` holds (:meth:`Tx.held`), as it is handed over (with
    ``again``, handed to ``holder`` anew: :meth:`Tx.held_again`)."""
    if again:
        got = tx.held_again(team, member, holder, now, limit, after)
    else:
        got = tx.held(team, member, holder, now, after, limit)
    return _replies_since_firing(tx, team, member, got) if reply else got


def _yielded(lease: list[InboxMessage], left: dict[str, InboxMessage]) -> list[InboxMessage]:
    """``lease``, about to be yielded: no longer among those ``left`` unanswered."""
    for m in lease:
        left.pop(m.message.message_id, None)
    return lease


def _handed_to_nobody(
    lost: Callable[[Sequence[InboxMessage]], None], handing: asyncio.Future[list[InboxMessage]]
) -> None:
    """A page handed anew whose reader was cancelled while it was: its copies to ``lost``."""
    if not handing.cancelled() and handing.exception() is None:
        lost(handing.result())


def _acked_order(team: str, member: str, message_id: str, tx: Tx) -> tuple[float, bool, int] | None:
    """Where ``member``'s copy of ``message_id`` stood in the order a receive handed it
    over (:func:`_sent_order`), once it is acked: the reader saw it, so a stream opened
    again after it sends none of those handed over before it, acked or not. ``None``
    when the copy is not acked (or its history was compacted away): nothing tells where
    the reader stopped."""
    copy = next((d for d in tx.deliveries(team, message_id) if d.recipient.member == member), None)
    if copy is None or copy.state is not DeliveryState.ACKED:
        return None
    leased = [
        e.at for e in tx.history(team, message_id) if e.member == member and e.event == "leased"
    ]
    message = tx.get_message(team, message_id)
    if not leased or message is None:
        return None
    held = InboxMessage(message, copy.recipient, copy.attempts, copy.seq)
    return (leased[-1], not is_anchor(held), copy.seq)


def _sent_order(m: InboxMessage) -> tuple[float, bool, int]:
    """Where ``m`` stands in the order a receive handed it over: by its lease, a
    lease's fired anchors first (:func:`~backchannel.core.timers.anchors_first`), then
    by ``seq``."""
    return (m.leased_at, not is_anchor(m), m.seq)


def _replies_since_firing(
    tx: Tx, team: str, member: str, got: list[InboxMessage]
) -> list[InboxMessage]:
    """Fired ``wait`` breadcrumbs that said "has not replied", as they are handed over:
    one whose peer replied after it fired says that reply instead
    (:func:`backchannel.core.timers.replied_after_firing`). The look is one indexed
    read from the firing on, a moment a turn long."""
    out = []
    for item in got:
        target = waiting_on(item.message)
        reply = (
            tx.first_message_from(team, target, member, item.message.created_at)
            if target is not None
            else None
        )
        if reply is not None:
            fresh = replied_after_firing(item.message, Reply.of(reply))
            item = dataclasses.replace(item, message=fresh)
        out.append(item)
    return out
