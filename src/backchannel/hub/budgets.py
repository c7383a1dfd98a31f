"""Conversation budgets applied to every send (rules in :mod:`backchannel.core.budget`).

Every message passes through :meth:`Pipeline.insert`, whichever route made it, so the
budget is checked there, inside the send's transaction: ``stamp`` gives the message
its chain and hop, ``refuse`` refuses a send over a spent budget
(:class:`~backchannel.errors.BudgetExhausted`, before anything is written), and
``record`` records the exchange and, when it spends a budget, tells both sides
and the team's human. The routes the hub drives itself (link crossings, closing
blocks) catch the refusal and tell the sender with a ``system`` notice instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from backchannel.core import budget as rules
from backchannel.core import messages, notices, turns
from backchannel.errors import (
    BudgetExhausted,
    Conflict,
    Forbidden,
    InvalidRequest,
    UnknownTeam,
)
from backchannel.hub.context import Ctx, Env
from backchannel.hub.links import Links
from backchannel.hub.pipeline import Pipeline, Send
from backchannel.stores.base import BudgetNeed, Tx
from backchannel.types import (
    BROADCAST,
    HUB_SENDER,
    USER,
    Budget,
    InboxMessage,
    MemberKind,
    Message,
    MessageKind,
    Recipient,
    Route,
    Session,
)

#: Kinds of message an agent originates; each counts against its pair and its chain.
_AGENT_KINDS = (MessageKind.DIRECT, MessageKind.LINK, MessageKind.DELEGATION)
# A member's ``ctx:`` record (``rules.context_key``) keeps the chain it was handed last
# (``used`` is the hop, ``last_from`` the chain id): its sends outside a turn continue
# that chain. When it was handed without a session, ``last_from`` goes on with the ids of
# what it was handed, after a space (no message id holds one): a session that starts
# later takes the chain when its first turn's prompt carries one of their texts
# (:meth:`Budgets.on_turn_start`).

#: How many of the messages handed to a member without a session its record names.
_CTX_IDS = 20
#: Session meta: the messages with a chain handed to the session that no turn has started
#: on yet, ``{"at": the newest one's creation, "ids": [...]}``: ``ids`` are those of them
#: handed to its member without a session (the last ``_CTX_IDS``), which its member's
#: ``ctx:`` record names too until a turn takes them.
PENDING = "handed_pending"
#: Session meta: when the newest of what bound the running turn to its chain was made (a
#: retry of the turn is bound by it too).
BOUND = "bound_at"


def _pending(meta: Mapping[str, Any]) -> tuple[float, list[str]] | None:
    """A session's :data:`PENDING` record, or ``None``."""
    raw = meta.get(PENDING)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("at"), int | float):
        return None
    return float(raw["at"]), [i for i in raw.get("ids") or () if isinstance(i, str)]


def _ctx_read(record: Budget | None) -> tuple[rules.ChainRef | None, list[str]]:
    """The chain a member's ``ctx:`` record names, and the ids of the messages it was
    handed in it without a session (none when a session was handed them)."""
    if record is None or not record.last_from:
        return None, []
    chain_id, *ids = record.last_from.split(" ")
    return rules.ChainRef(chain_id, record.used), ids


#: Kinds of the hub's own messages that start a chain of their own.
_CHAIN_STARTERS = (MessageKind.TIMER,)


def _carried(message: Message) -> bool:
    """A task from another hub comes with its chain (``accept_chat`` put it there)."""
    return message.kind is MessageKind.DELEGATION and message.chain_id is not None


def _held_by(record: Budget, member: str) -> Budget:
    """A chain's record as it stops at ``member``, the agent its last hop reached (kept
    in ``last_from``, which a chain's record has no other use for): an extension wakes
    it, and the chain goes on from there."""
    return dataclasses.replace(record, last_from=member)


def _ref(meta: Mapping[str, Any]) -> rules.ChainRef | None:
    raw = meta.get("chain")
    if isinstance(raw, list | tuple) and len(raw) == 2:
        return rules.ChainRef(str(raw[0]), int(raw[1]))
    return None


class Budgets:
    """Conversation budgets (see the module docstring)."""

    def __init__(self, env: Env, links: Links, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock = env.store, env.clock
        self.links = links  # a spent pair budget closes the pair's link
        self.pipeline = pipeline

    # -- which sends count -------------------------------------------------------------
    def _is_agent(self, tx: Tx, team: str, name: str) -> bool:
        if name == HUB_SENDER:
            return False
        m = tx.get_member(team, name)
        return m is not None and m.kind is not MemberKind.HUMAN

    def _counted_pairs(
        self, tx: Tx, message: Message, recipients: Sequence[Recipient]
    ) -> list[tuple[str, str, bool]]:
        """``(from, to, refusable)`` for every pair of agents this message is an exchange
        between."""
        team, sender = message.team, message.sender
        if message.kind in _AGENT_KINDS and self._is_agent(tx, team, sender):
            if len(recipients) == 1:  # most sends: no set of names to build
                to = recipients[0].member
                return [(sender, to, True)] if to != sender and self._is_agent(tx, team, to) else []
            names = dict.fromkeys(r.member for r in recipients if r.member != sender)
            return [(sender, n, True) for n in names if self._is_agent(tx, team, n)]
        if message.kind is MessageKind.TOOL_RESULT:
            # a delegation's answer: the callee answering the caller; owed, never refused
            out = []
            for r in message.meta.get("results") or ():
                callee = r.get("to") if isinstance(r, Mapping) else None
                if (
                    isinstance(callee, str)
                    and "result" in r
                    and callee != message.to
                    and self._is_agent(tx, team, callee)
                    and self._is_agent(tx, team, message.to)
                ):
                    out.append((callee, message.to, False))
            return out
        return []

    def _pairs(self, s: Send) -> list[tuple[str, str, bool]]:
        """:meth:`_counted_pairs` of the send, read once (its first step asks first)."""
        pairs = s.budget_pairs
        if pairs is None:
            pairs = s.budget_pairs = self._counted_pairs(s.c.tx, s.message, s.recipients)
        return pairs

    def _turn_chain(self, s: Send, *, recent_only: bool = False) -> rules.ChainRef | None:
        """The chain the turn that makes the send works in. ``recent_only``: the chain its
        member was handed last counts only while that is recent (:meth:`_recent`)."""
        tx, message = s.c.tx, s.message
        if message.kind is MessageKind.TOOL_RESULT:
            refs = []
            for r in message.meta.get("results") or ():
                did = r.get("delegation_id") if isinstance(r, Mapping) else None
                d = tx.get_delegation(message.team, did) if isinstance(did, str) else None
                callee = (
                    tx.get_session(message.team, d.callee_session)
                    if d and d.callee_session
                    else None
                )
                refs.append(_ref(callee.meta) if callee else None)
            return rules.turn_chain(refs, None)
        session = s.turn_session()
        if session is None and message.sender_session is not None:
            session = tx.get_session(message.team, message.sender_session)
        if session is not None:
            ref = _ref(session.meta)
            if ref is not None or session.turn > 0:
                return ref
            # a session that has run no turn (opened for this send, or by a wrapper whose
            # run reports none) was handed nothing: it goes on as its member does, below
        # no turn to place it in (a member without sessions, a send that names none
        # outside a turn or while several run): the chain it was handed last
        record = tx.get_budget(message.team, rules.context_key(message.sender))
        if (
            recent_only
            and record is not None
            and not self._recent(tx, message.team, record.updated_at, message.created_at)
        ):
            return None
        return _ctx_read(record)[0]

    # -- the three steps of a send -------------------------------------------------------
    def stamp(self, s: Send) -> Message:
        """The message with the chain it belongs to and its hop in it. A chain another hub
        named (a task's from ``/api/chat``, an A2A task's) may raise the chain and hop the
        message would otherwise have, never lower them (:func:`rules.named_chain`)."""
        tx, message = s.c.tx, s.message
        if _carried(message):
            # a task from another hub goes on in the chain it named, never below the
            # chain of a turn its sender runs here: a member of this team that calls
            # /api/chat from a turn of a spent chain cannot name a fresh one
            named = rules.ChainRef(message.chain_id or "", message.hop)
            # what its member was handed long ago is no turn of the caller's: the member
            # that stands for another hub here is sent local messages too, and a task of
            # that hub's human must not be refused for a chain one of them spent
            turn = self._turn_chain(s, recent_only=True)
            own = None if turn is None else rules.ChainRef(turn.chain_id, turn.hop + 1)
            goes_on = self._named(tx, message.team, named, own)
            s.budget_own = own if own is not None and goes_on.chain_id != own.chain_id else None
            if goes_on == named:
                return message
            return message.in_chain(goes_on.chain_id, goes_on.hop)
        own = self._own_chain(s)
        ref = (
            own if s.options.chain is None else self._named(tx, message.team, s.options.chain, own)
        )
        if own is not None and ref is not None and ref.chain_id != own.chain_id:
            # another chain was named and stands: the send's own chain is checked too
            # unless it is one this message starts (a timer's, an outside task's)
            s.budget_own = own if own.chain_id != message.message_id else None
        if ref is None:
            return message
        return message.in_chain(ref.chain_id, ref.hop)

    @staticmethod
    def _named(
        tx: Tx, team: str, named: rules.ChainRef, otherwise: rules.ChainRef | None
    ) -> rules.ChainRef:
        record = tx.get_budget(team, rules.chain_key(named.chain_id))
        return rules.named_chain(named, record, otherwise)

    def _own_chain(self, s: Send) -> rules.ChainRef | None:
        """The chain a message is in by its own route (no chain named for it)."""
        tx, message = s.c.tx, s.message
        pairs = self._pairs(s)
        if pairs or (
            message.kind in _AGENT_KINDS and self._is_agent(tx, message.team, message.sender)
        ):
            ref = rules.chain_for_send(
                counted=True,
                turn_chain=self._turn_chain(s),
                message_id=message.message_id,
            )
        elif message.kind in _CHAIN_STARTERS or (
            message.sender != HUB_SENDER and message.kind in _AGENT_KINDS
        ):
            ref = rules.ChainRef(message.message_id, 0)  # a human's message or a timer
        else:
            ref = None
        if message.kind is MessageKind.TOOL_RESULT:
            ref = rules.turn_chain([ref, *self._answered_chains(tx, message)], None)
        return ref

    @staticmethod
    def _answered_chains(tx: Tx, message: Message) -> list[rules.ChainRef | None]:
        """The chains the answers of another hub's (or an A2A agent's) callees in a tool
        result went on in: :meth:`answered` raised them on the session that delegated, so
        that session's chain is at least theirs. The result carries it, so whichever turn
        takes it goes on in it: the session that asked may have ended (a one-shot
        ``claude -p`` run) and the result reach another of the member's sessions, whose
        turn would otherwise start a fresh chain on every answer and never stop."""
        out: list[rules.ChainRef | None] = []
        for r in message.meta.get("results") or ():
            did = r.get("delegation_id") if isinstance(r, Mapping) else None
            d = tx.get_delegation(message.team, did) if isinstance(did, str) else None
            if d is None or d.route is not Route.OUTBOUND:
                continue
            caller = tx.get_session(message.team, d.caller_session)
            out.append(_ref(caller.meta) if caller is not None else None)
        return out

    def _decide_pair(
        self,
        record: Budget | None,
        team: str,
        sender: str,
        to: str,
        now: float,
        lim: rules.Limits,
        refusable: bool,
    ) -> rules.Decision:
        """:func:`rules.decide_pair`, but for a window that looks passed only because the
        wall clock stepped forward since maintenance last looked (:meth:`Env.stepped`):
        it is taken as moved by the step, as maintenance will move it, so the step grants
        no budget. The record is written with its window as stored, which maintenance
        moves once. The clock is read only for a window that looks passed, never on the
        send path's usual way."""
        if record is None or now < record.window_start + lim.pair_window:
            return rules.decide_pair(record, team, sender, to, now, lim, refusable=refusable)
        step = self.env.stepped(now)
        if not step:
            return rules.decide_pair(record, team, sender, to, now, lim, refusable=refusable)
        seen = dataclasses.replace(record, window_start=record.window_start + step)
        d = rules.decide_pair(seen, team, sender, to, now, lim, refusable=refusable)
        if d.record is not None and d.record.window_start == seen.window_start:
            stored = dataclasses.replace(d.record, window_start=record.window_start)
            d = dataclasses.replace(d, record=stored)
        return d

    def _budget_decisions(self, s: Send) -> list[rules.Decision]:
        tx, message = s.c.tx, s.message
        pairs = self._pairs(s)
        if not pairs and not _carried(message):
            return []
        team = tx.get_team(message.team)
        lim = rules.limits(team.settings if team else {})
        now = message.created_at
        out = []
        for a, b, refusable in pairs:
            key = rules.pair_key(a, b)
            record = tx.get_budget(message.team, key)
            out.append(self._decide_pair(record, message.team, a, b, now, lim, refusable))
        if message.chain_id is not None and message.hop >= lim.chain_budget:
            ref = rules.ChainRef(message.chain_id, message.hop)
            record = tx.get_budget(message.team, rules.chain_key(ref.chain_id))
            d = rules.decide_chain(message.team, ref, record, lim, now)
            if d.refusal is not None and not all(r for _, _, r in pairs):
                d = rules.Decision()  # an owed answer is never refused
            out.append(d)
        own = s.budget_own
        if own is not None and own.hop > lim.chain_budget and all(r for _, _, r in pairs):
            # the chain named (one a human extended, say) never lets through a send the
            # chain of its sender's own turn refuses
            record = tx.get_budget(message.team, rules.chain_key(own.chain_id))
            refusal = rules.decide_chain(message.team, own, record, lim, now).refusal
            if refusal is not None:
                out.append(rules.Decision(refusal=refusal))
        return out

    def refuse(self, s: Send) -> None:
        """Refuse a send over a spent budget, before anything is written."""
        decisions = s.budget_decisions
        if decisions is None:
            decisions = s.budget_decisions = self._budget_decisions(s)
        for d in decisions:
            if d.refusal is not None:
                raise BudgetExhausted(d.refusal.text, **d.refusal.details())

    def record(self, s: Send) -> None:
        """Count the stored exchange; a budget it spends is announced."""
        for d in s.budget_decisions or ():
            if d.record is None:
                continue
            record = d.record
            if d.stops and record.key.startswith("chain:"):
                # a broadcast reached everyone, so no one recipient holds the chain: its
                # sender does, and an extension wakes it to go on from there
                m = s.message
                record = _held_by(record, m.sender if m.to == BROADCAST else m.to)
            s.c.tx.put_budget(record)
            if d.stops:
                self._announce_stop(s.c, record, s.message)

    # -- telling people ---------------------------------------------------------------------
    def _announce_stop(self, c: Ctx, b: Budget, message: Message) -> None:
        to = [] if message.to == BROADCAST else [message.to]
        chain = (message.chain_id, message.hop) if message.chain_id else None
        self._tell_stop(c, b, [message.sender, *to], chain, message.created_at)

    def _tell_stop(
        self, c: Ctx, b: Budget, sides: list[str], chain: tuple[str, int] | None, at: float
    ) -> None:
        """Tell both sides of the send that spent budget ``b`` (a chain's: ``sides``) and
        the team's human."""
        tx = c.tx
        team = tx.get_team(b.team)
        lim = rules.limits(team.settings if team else {})
        scope = rules.Scope(b.key.partition(":")[0])
        if scope is rules.Scope.PAIR:
            limit = lim.pair_budget + b.granted
            resets: float | None = b.window_start + lim.pair_window
            sides = list(rules.key_members(b.key))
        else:
            limit, resets = lim.chain_budget + b.granted, None
        if scope is rules.Scope.PAIR:
            link = tx.find_open_link(b.team, sides[0], sides[1])
            if link is not None:  # nothing more could cross it
                self.links.close(c, link, "conversation_budget", at)
        meta = {"budget": scope.value, "key": b.key, "limit": limit, "resets_at": resets}
        for who in dict.fromkeys([*sides, USER]):
            if tx.get_member(b.team, who) is None:
                continue
            human = who == USER or not self._is_agent(tx, b.team, who)
            text = rules.stop_text(scope, b.key, limit, resets, for_human=human)
            # the notice belongs to the chain it stops: a turn it starts goes no further
            msg = notices.system(
                b.team, who, text, self.clock.now(), summary=f"{scope.value} budget spent: {b.key}",
                meta=meta, chain=chain,
            )  # fmt: skip
            self.pipeline.insert(c, msg, None)

    # -- a task for another hub ----------------------------------------------------------------
    def outbound_chain(
        self, c: Ctx, team: str, caller: str, session: Session, callee: str, now: float
    ) -> tuple[rules.ChainRef | None, rules.Refusal | None]:
        """The chain a task of ``session``'s turn for ``callee`` on another hub goes on in
        (its turn's chain, one hop further; ``None`` when the turn has none), and the
        refusal when that hop is past the chain budget, as for a task of this hub. The task
        that reaches the budget spends it: the caller and the team's human are told."""
        turn = _ref(session.meta)
        if turn is None:
            return None, None
        ref = rules.chain_for_send(counted=True, turn_chain=turn, message_id="")
        assert ref is not None
        tx = c.tx
        t = tx.get_team(team)
        lim = rules.limits(t.settings if t else {})
        if ref.hop < lim.chain_budget:
            return ref, None
        d = rules.decide_chain(
            team, ref, tx.get_budget(team, rules.chain_key(ref.chain_id)), lim, now
        )
        if d.refusal is not None:
            return ref, d.refusal
        if d.record is not None:
            # the callee is no member of this hub: the chain is held by the caller, and
            # an extension wakes it to go on from there
            record = _held_by(d.record, caller) if d.stops else d.record
            tx.put_budget(record)
            if d.stops:
                self._tell_stop(c, record, [caller, callee], (ref.chain_id, ref.hop), now)
        return ref, None

    # -- the pair of an exchange between hubs -------------------------------------------------
    @staticmethod
    def remote_party(tx: Tx, team: str, callee: str, member: str | None = None) -> str:
        """Who, on this hub, ``callee`` (``agent@service``: an agent of another hub or an
        A2A agent) is for the pair budget: the other hub's member of this team, the one
        its tasks for this team come in as, so a task out, its answer back and a task in
        are exchanges of one pair. That is ``member`` (the service's ``member:`` setting)
        when it is an agent of the team, otherwise the member named like the service
        when there is one, otherwise the agent itself, ``agent@service``. A ``member:``
        that names no agent of the team refuses the task at ``delegate``
        (:meth:`check_service_member`); an answer is owed, so here it falls through."""
        service = callee.partition("@")[2]
        for name in (member, service):
            m = tx.get_member(team, name) if name else None
            if name and m is not None and m.kind is not MemberKind.HUMAN:
                return name
        return callee

    @staticmethod
    def check_service_member(tx: Tx, team: str, service: str, member: str | None) -> None:
        """Refuse a task for ``service`` whose ``member:`` setting names no agent of
        ``team``: counted against the caller and the agent itself, a task out and a task
        in would be two pairs, and the pair budget twice what it says."""
        if member is None:
            return
        m = tx.get_member(team, member)
        if m is not None and m.kind is not MemberKind.HUMAN:
            return
        what = "no member of" if m is None else "a human of"
        raise InvalidRequest(
            f"callback service {service!r} names {member!r} as the member its tasks for "
            f"this team come in as (its member: setting), and {member!r} is {what} team "
            f"{team!r}, so the pair budget cannot count this task; the operator adds the "
            f"other hub to team {team!r} as the agent member {member!r}, or sets the "
            "service's member: (in the config file, or BACKCHANNEL_CALLBACK_MEMBERS="
            f"{service}=...) to the member it is and restarts the hub",
            field="to",
            service=service,
            member=member,
        )

    def across(
        self, c: Ctx, team: str, sender: str, to: str, now: float, *, refusable: bool
    ) -> rules.Refusal | None:
        """One exchange from ``sender`` to ``to`` that no message of this hub carries (a
        task for another hub, an answer from or for one): it counts against their pair
        as a send between members would. Returns the refusal when the pair is spent and
        the exchange ``refusable`` (an answer is owed: it counts, never refused); one
        that spends the pair tells both sides that are members here and the team's
        human."""
        tx = c.tx
        t = tx.get_team(team)
        lim = rules.limits(t.settings if t else {})
        record = tx.get_budget(team, rules.pair_key(sender, to))
        d = self._decide_pair(record, team, sender, to, now, lim, refusable)
        if d.refusal is not None:
            return d.refusal
        if d.record is not None:
            tx.put_budget(d.record)
            if d.stops:
                self._tell_stop(c, d.record, [], None, now)
        return None

    # -- an answer between hubs ---------------------------------------------------------------
    def answer_chain(self, session: Session) -> rules.ChainRef | None:
        """The chain a callee's answer to another hub goes on in: the chain its turn works
        in, one hop further, as a send of that turn would be (``None``: the turn has none)."""
        turn = _ref(session.meta)
        return None if turn is None else rules.ChainRef(turn.chain_id, turn.hop + 1)

    def answered(
        self,
        c: Ctx,
        team: str,
        session: Session,
        named: rules.ChainRef,
        callee: str,
        now: float,
    ) -> None:
        """Another hub answered a delegation of ``session`` in chain ``named``: the session
        works in that chain from now on, as it would after a local callee's answer, so a
        turn that asks again on the answer goes on one hop further and a lead and another
        hub's agent that always ask again stop at the chain budget. The hop named may raise
        the session's chain, never lower it (:func:`rules.named_chain`). The answer is
        owed, so it is never refused; one that reaches the budget spends it, and the caller
        and the team's human are told."""
        tx = c.tx
        s = tx.get_session(team, session.session_id) or session
        current = _ref(s.meta)
        ref = self._named(tx, team, named, current)
        if ref != current:
            s = dataclasses.replace(s, meta={**s.meta, "chain": [ref.chain_id, ref.hop]})
            tx.put_session(s)
            self._remember(tx, team, s.member, ref, now)
        t = tx.get_team(team)
        lim = rules.limits(t.settings if t else {})
        if ref.hop < lim.chain_budget:
            return
        d = rules.decide_chain(
            team, ref, tx.get_budget(team, rules.chain_key(ref.chain_id)), lim, now
        )
        if d.record is not None:  # a refusal is left alone: the answer is owed
            record = _held_by(d.record, s.member) if d.stops else d.record
            tx.put_budget(record)
            if d.stops:
                self._tell_stop(c, record, [s.member, callee], (ref.chain_id, ref.hop), now)

    # -- the chain a session's turn works in -----------------------------------------------
    def on_lease(self, c: Ctx, session: Session, got: Sequence[InboxMessage], now: float) -> None:
        """The turn ``session`` starts on ``got`` works in the chain they belong to; a
        send of its member the hub cannot place in a turn continues it too."""
        self._handed(c, session, [m.message for m in got], now)

    def _handed(
        self, c: Ctx, session: Session, got: Sequence[Message], now: float, *, remember: bool = True
    ) -> None:
        tx = c.tx
        refs = [rules.ChainRef(m.chain_id, m.hop) if m.chain_id else None for m in got]
        s = tx.get_session(session.team, session.session_id) or session
        previous = _ref(s.meta)
        ref = rules.turn_chain(refs, previous)
        # what was handed over, to tell a turn on it from a turn a human typed
        texts = [turns.handed_text(m.sender, m.kind.value, m.text) for m in got][-20:]
        meta = {**s.meta, "input_texts": texts}
        if ref is not None:
            meta["chain"] = [ref.chain_id, ref.hop]
            if remember:
                self._remember(tx, session.team, session.member, ref, now)
        chained = [m for m in got if m.chain_id]
        if chained:
            # no turn has started on these yet: the next one goes on in their chain
            # whatever its prompt says, while they are recent (on_turn_start)
            was = _pending(s.meta)
            at = max([m.created_at for m in chained] + ([was[0]] if was else []))
            ids = [*was[1]] if was else []
            if not remember:  # a copy of what the member was handed: see _strike
                ids += [m.message_id for m in chained]
            meta[PENDING] = {"at": at, "ids": ids[-_CTX_IDS:]}
        tx.put_session(dataclasses.replace(s, meta=meta))

    def on_read_from_file(
        self, c: Ctx, team: str, member: str, got: Sequence[Message], now: float
    ) -> None:
        """``member`` reads ``got`` from its own Claude Code inbox file, where teammates
        wrote them (the hub took them in for the record and never hands them over): the
        file handed them to it, as a lease for the member would have
        (:meth:`_handed_to_member`). Without this a ring through a teammate's file and the
        hub's sends started a fresh chain at every turn and never stopped."""
        self._handed_to_member(c, team, member, got, now)

    def _handed_to_member(
        self, c: Ctx, team: str, member: str, got: Sequence[Message], now: float
    ) -> None:
        """``got`` were handed to ``member`` without a session: each live session of the
        member (whichever runs the turn on them: the hub cannot tell) starts its next turn
        in their chain, with their texts among the inputs its reported prompt is checked
        against, and a send of the member the hub cannot place in a turn continues it
        too."""
        tx = c.tx
        live = tx.list_sessions(team, member, which="live")  # one index range, not ended ones
        for s in live:
            self._handed(c, s, got, now, remember=False)
        refs = [rules.ChainRef(m.chain_id, m.hop) if m.chain_id else None for m in got]
        ref = rules.turn_chain(refs, None)
        if ref is not None:
            # a session that starts after this (a one-shot run on what the member was
            # handed) finds them here: see on_turn_start
            ids = [m.message_id for m in got][-_CTX_IDS:]
            self._remember(tx, team, member, ref, now, ids)

    def on_turn_start(self, c: Ctx, s: Session, text: str, *, retried: bool = False) -> None:
        """The chain the turn ``s`` starts on ``text`` works in. A turn on what the hub
        handed the session goes on in its chain; so does a turn on anything else while the
        session holds messages with a chain that no turn has started on yet and that are
        recent (younger than the team's ``pair_window``): an SDK agent or a wrapper that
        reports its prompt in its own words (a template, a summary, a made-up prompt) is
        still working on them. Only a turn on other input with nothing recent pending is
        one a human typed, and starts a new chain (a human back the next day with a task
        of their own, whatever waited for the session meanwhile). A session in no chain
        whose turn's prompt carries what its member was handed without a session, or
        that is started while that is recent (a one-shot run a wrapper started on it, in
        a session of its own), goes on in that chain: otherwise a ring of such runs
        started a fresh chain at every run. A retried turn is the same turn: what bound
        it still does."""
        tx = c.tx
        started = tx.get_session(s.team, s.session_id)
        if started is None:
            return
        meta = {k: v for k, v in started.meta.items() if k != PENDING}
        pending = _pending(started.meta)
        at = pending[0] if pending else None
        bound = started.meta.get(BOUND)
        if retried and isinstance(bound, int | float):
            at = bound if at is None else max(at, bound)
        meta.pop(BOUND, None)
        if at is not None:
            meta[BOUND] = at
        now = self.clock.now()
        if "chain" not in meta:
            meta = self._take_member_chain(tx, started, meta, text, now, retried=retried)
        elif not turns.is_hub_input(text, meta.get("input_texts") or ()) and not (
            at is not None and self._recent(tx, s.team, at, now)
        ):
            # a human typed this turn's input into the runtime: a new chain begins
            meta = {k: v for k, v in meta.items() if k not in ("chain", "input_texts", BOUND)}
        if pending and pending[1]:
            self._strike(tx, started.team, started.member, pending[1], now)
        if meta != started.meta:
            tx.put_session(dataclasses.replace(started, meta=meta))

    @staticmethod
    def _recent(tx: Tx, team: str, at: float, now: float) -> bool:
        """Whether a message handed over at ``at`` (its creation) still binds a turn
        that does not carry its text: younger than the team's ``pair_window``, the time a
        conversation's exchanges are counted over."""
        t = tx.get_team(team)
        return now - at < rules.limits(t.settings if t else {}).pair_window

    def on_member_lease(
        self, c: Ctx, team: str, member: str, got: Sequence[InboxMessage], now: float
    ) -> None:
        """Messages were handed to a member that named no session (a plain SDK or HTTP
        client; an adapter without a ``session`` setting, while the member's turns run in
        its hook-attached session): see :meth:`_handed_to_member`."""
        self._handed_to_member(c, team, member, [m.message for m in got], now)

    def _take_member_chain(
        self,
        tx: Tx,
        started: Session,
        meta: dict[str, Any],
        text: str,
        now: float,
        *,
        retried: bool,
    ) -> dict[str, Any]:
        """``started``, in no chain, starts a turn on ``text``: its ``meta`` as the turn
        leaves it. When its member was handed messages without a session that no session
        has taken yet, and the text carries one of them (or is no text at all: a runtime
        that reports none is taken at its word, as for a session's own input), or they
        are recent (:meth:`_recent`: a wrapper's run that reports its prompt in its own
        words), the turn works in their chain and they are taken, so a later session
        does not take them again. Otherwise (a human's own task; what a member was
        handed the day before) the turn starts no chain."""
        record = tx.get_budget(started.team, rules.context_key(started.member))
        ref, ids = _ctx_read(record)
        if record is None or ref is None or not ids:
            return meta
        handed = [m for m in (tx.get_message(started.team, i) for i in ids) if m is not None]
        texts = [turns.handed_text(m.sender, m.kind.value, m.text) for m in handed]
        at = max((m.created_at for m in handed if m.chain_id), default=None)
        if not turns.is_hub_input(text, texts) and not (
            at is not None and self._recent(tx, started.team, at, now)
        ):
            return meta
        tx.put_budget(dataclasses.replace(record, last_from=ref.chain_id, updated_at=now))
        out = {**meta, "chain": [ref.chain_id, ref.hop], "input_texts": texts}
        if at is not None:
            out[BOUND] = at if not retried else max(at, meta.get(BOUND) or at)
        return out

    @staticmethod
    def _strike(tx: Tx, team: str, member: str, taken: Sequence[str], now: float) -> None:
        """A turn started on ``taken``: they are struck from the ids its member's record
        names as handed without a session (a copy of them was handed to each live
        session), so a session started later does not take them again."""
        record = tx.get_budget(team, rules.context_key(member))
        ref, ids = _ctx_read(record)
        if record is None or ref is None or not ids:
            return
        left = [i for i in ids if i not in taken]
        if left != ids:
            said = " ".join([ref.chain_id, *left])
            tx.put_budget(dataclasses.replace(record, last_from=said, updated_at=now))

    @staticmethod
    def _remember(
        tx: Tx, team: str, member: str, ref: rules.ChainRef, now: float, ids: Sequence[str] = ()
    ) -> None:
        """``ref`` is the chain ``member`` was handed last (read by :meth:`_turn_chain`),
        ``ids`` what it was handed in it without a session (read by
        :meth:`_take_member_chain`)."""
        key = rules.context_key(member)
        said = " ".join([ref.chain_id, *ids])
        last = tx.get_budget(team, key)  # only its chain, hop and ids are ever read
        if last is None or (last.last_from, last.used) != (said, ref.hop):
            tx.put_budget(Budget(team, key, now, ref.hop, 0, said, None, now))

    # -- reading and extending ----------------------------------------------------------------
    async def list_budgets(
        self, team: str, *, after: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The team's pair and chain budgets that have been used, as JSON, by key: those
        after the key ``after`` (the last one of the page before), at most ``limit`` (all
        when None)."""
        now = self.clock.now()

        def fn(tx: Tx) -> list[dict[str, Any]]:
            t = tx.get_team(team)
            if t is None:
                raise UnknownTeam(f"unknown team {team!r}", team=team)
            lim = rules.limits(t.settings)
            return [
                rules.budget_json(b, lim, now)
                for b in tx.list_budgets(team, after=after, limit=limit, hidden=rules.CONTEXT)
            ]

        return await self.store.read(fn)

    async def budgets_for_human(
        self, team: str, *, offset: int = 0, limit: int = 50
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of the team's budgets that need a human (spent, or extended), as JSON,
        the most recently updated first, and how many there are in all. Read from an
        index in that order: the page's records and a count of index entries, never
        every spent chain the team ever had."""
        now = self.clock.now()

        def fn(tx: Tx) -> tuple[list[dict[str, Any]], int]:
            t = tx.get_team(team)
            if t is None:
                raise UnknownTeam(f"unknown team {team!r}", team=team)
            lim = rules.limits(t.settings)
            need = BudgetNeed(lim.pair_budget, lim.chain_budget, now - lim.pair_window)
            page = tx.budgets_for_human(team, need, offset=offset, limit=limit)
            total = tx.count_budgets_for_human(team, need)
            return [rules.budget_json(b, lim, now) for b in page], total

        return await self.store.read(fn)

    async def extend_budget(
        self, team: str, key: str, by: int, *, by_whom: str, request_id: str | None = None
    ) -> dict[str, Any]:
        """Let exactly ``by`` more exchanges (``pair:a|b``) or hops (``chain:<id>``)
        through. Only the team's human or an administrator (``by_whom="admin"``) may.

        Idempotent on ``request_id`` (the caller's): the same id again answers the budget
        as it is now, ``replayed``, and extends nothing (an extension made again when its
        answer was lost). The notices an extension sends carry ids made from it, and the
        human's notice is how the hub knows the extension was made; another extension
        under the same id is a conflict."""
        if request_id is not None:
            messages.check_message_id(request_id, "request_id")
        if not isinstance(by, int) or isinstance(by, bool) or not 1 <= by <= rules.MAX_EXTEND:
            raise InvalidRequest(
                f"by must be a whole number from 1 to {rules.MAX_EXTEND}", field="by"
            )
        scope, _, rest = key.partition(":") if isinstance(key, str) else ("", "", "")
        if scope not in (rules.Scope.PAIR.value, rules.Scope.CHAIN.value) or not rest:
            raise InvalidRequest(
                "key names a budget: 'pair:<a>|<b>' or 'chain:<chain_id>' (GET the team's "
                "budgets to see them)",
                field="key",
            )
        if scope == rules.Scope.PAIR.value:
            names = rest.split("|")
            if len(names) != 2:
                raise InvalidRequest("a pair key is 'pair:<a>|<b>'", field="key")
            key = rules.pair_key(*names)
        now = self.clock.now()

        def fn(c: Ctx) -> dict[str, Any]:
            tx = c.tx
            c.watched(team)  # the notices wake their readers as they are stored
            t = tx.get_team(team)
            if t is None:
                raise UnknownTeam(f"unknown team {team!r}", team=team)
            if by_whom != "admin":
                m = tx.get_member(team, by_whom)
                if m is None or m.kind is not MemberKind.HUMAN:
                    raise Forbidden(
                        "only the team's human (user) or an administrator extends a budget"
                    )
            lim = rules.limits(t.settings)
            record = tx.get_budget(team, key)
            if request_id is not None:
                done = tx.get_message(team, _notice_id(by_whom, request_id, USER))
                if done is not None:  # this extension, made again: its answer was lost
                    if (done.meta.get("key"), done.meta.get("extended_by")) != (key, by):
                        raise Conflict(
                            f"request_id {request_id!r} was already used to extend "
                            f"{done.meta.get('key')} by {done.meta.get('extended_by')}; "
                            "pick a new request_id for each extension"
                        )
                    if scope == rules.Scope.PAIR.value:
                        record = rules.current_pair(record, team, key, now, lim)
                    elif record is None:
                        record = rules.fresh(team, key, now)
                    return {**rules.budget_json(record, lim, now), "replayed": True}
            if scope == rules.Scope.PAIR.value:
                for name in rules.key_members(key):
                    agent, at, service = name.partition("@")
                    if at and agent and service:
                        continue  # another hub's agent (Budgets.remote_party)
                    if tx.get_member(team, name) is None:
                        known = [m.name for m in tx.list_members(team)]
                        raise messages.unknown_recipient(name, team, known)
                record = rules.current_pair(record, team, key, now, lim)
            elif record is None:
                record = rules.fresh(team, key, now)
            new = rules.extend(record, by, now)
            tx.put_budget(new)
            out = rules.budget_json(new, lim, now)
            text = f"{by_whom} extended the conversation budget {key} by {by}: {out['used']} of {out['limit']} used."
            chain: tuple[str, int] | None = None
            if scope == rules.Scope.PAIR.value:
                sides: tuple[str, ...] = rules.key_members(key)
            else:
                # the member the chain stopped at (it holds the chain's furthest hop) is
                # told, in the chain at that hop: its turn on the notice goes on from
                # there, exactly `by` hops further
                sides = (record.last_from,) if record.last_from else ()
                chain = (rest, record.used)
            for who in dict.fromkeys([*sides, USER]):
                if tx.get_member(team, who) is not None:
                    msg = notices.system(
                        team, who, text, now, summary=f"budget {key} extended by {by}",
                        meta={"budget": scope, "key": key, "extended_by": by},
                        chain=chain if who != USER else None,
                        message_id=(
                            None if request_id is None
                            else _notice_id(by_whom, request_id, who)
                        ),
                    )  # fmt: skip
                    self.pipeline.insert(c, msg, None)
            return out

        return await self.env.transact(fn)


def _notice_id(by_whom: str, request_id: str, to: str) -> str:
    """The id of the notice to ``to`` of the extension ``by_whom`` made under
    ``request_id``: the same for the same three, so the extension made again finds it."""
    digest = hashlib.sha256(f"{by_whom}\0{request_id}\0{to}".encode()).hexdigest()
    return f"budget_{digest[:48]}"
