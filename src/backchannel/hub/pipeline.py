"""What reacts to a send, a lease, a turn's start and end, a termination and a tick:
one ordered list per event, written here and nowhere else.

Every message, whichever route made it (a member's send, a link crossing, a closing
block, a notice, a timer, a delegation's task or result), is stored by
:meth:`Pipeline.insert` inside the caller's transaction; the parts react in the order
below and put their after-commit effects in the transaction's
:class:`~backchannel.hub.context.Ctx`. The facade builds the parts and then
:meth:`Pipeline.connect` hands them to the pipeline (the parts need the pipeline to
send, and the pipeline needs them to react).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backchannel.core import messages as rules
from backchannel.core import turns as turn_rules
from backchannel.core.budget import context_key, pair_key
from backchannel.errors import InvalidRequest, UnknownSession, UnknownTeam
from backchannel.hub.context import Ctx, Env, JobHandler
from backchannel.stores.base import Reads
from backchannel.types import (
    BROADCAST,
    DeliveryState,
    InboxMessage,
    LedgerEntry,
    Link,
    Message,
    MessageKind,
    Recipient,
    SendResult,
    Session,
    SessionState,
)

if TYPE_CHECKING:
    from backchannel.core.budget import ChainRef, Decision
    from backchannel.hub.budgets import Budgets
    from backchannel.hub.delegations import Delegations
    from backchannel.hub.links import Links
    from backchannel.hub.outbox import Outbox
    from backchannel.hub.sessions import Sessions
    from backchannel.hub.timers import Timers
    from backchannel.hub.turns import Turns
    from backchannel.types import Job

__all__ = ["NO_LINK", "Pipeline", "Send", "SendOptions"]


@dataclass(frozen=True, slots=True)
class SendOptions:
    """How a send takes part in links (see :mod:`backchannel.hub.links`)."""

    link: bool = True  # open a link to the recipient if none is open
    close_link: bool = False  # deliver, then close the open link (initiator only)
    link_budget: int | None = None  # turns for a link this send opens
    by_agent: bool = True  # an agent's own send (send_message), subject to its rules
    #: the conversation chain another hub named for the send (an A2A task's metadata):
    #: it may raise the send's chain, never lower it (``Budgets.stamp``)
    chain: ChainRef | None = None


#: Options of the hub's own sends (notices, crossings, closing blocks): no link changes,
#: no anchor rule.
NO_LINK = SendOptions(link=False, by_agent=False)


def find_turn_session(c: Ctx, message: Message) -> Session | None:
    """The session whose open turn made this send: the one named, or the member's only
    active session."""
    tx = c.tx
    if message.sender_session is not None:
        s = tx.get_session(message.team, message.sender_session)
        if s is None or s.member != message.sender:
            raise UnknownSession(
                f"{message.sender!r} has no session {message.sender_session!r}",
                session=message.sender_session,
            )
        return s if s.state is SessionState.ACTIVE else None
    active = tx.list_sessions(message.team, message.sender, which="active", limit=2)
    return active[0] if len(active) == 1 else None


def send_reads(message: Message, *, replay: bool) -> Reads:
    """What checking ``message`` reads (:meth:`Pipeline.insert` and the parts it calls),
    named at once for :meth:`Tx.prefetch`: the recipient and the sender, the sender's
    turn, the budgets of the pair and of the chain the sender was handed last, the
    pair's open link; with ``replay``, the message itself (a send under a client's id).
    A read named here that the send does not make costs nothing more."""
    m, team, sender = message, message.team, message.sender
    one = m.to != BROADCAST
    return Reads(
        team,
        members=(m.to, sender) if one else (sender,),
        budgets=(context_key(sender), pair_key(sender, m.to)) if one else (context_key(sender),),
        link=(sender, m.to) if one else None,
        session=m.sender_session,
        active_of=sender if m.sender_session is None else None,
        message=m.message_id if replay else None,
    )


#: Not read yet (``None`` is an answer: no open link, no session's turn).
_UNREAD: Any = object()


@dataclass(slots=True)
class Send:
    """One send going through the pipeline: the reads several parts need about it are
    made once (is there an open link, which session's turn is this), and the budget
    part keeps what it decided between its steps."""

    c: Ctx
    message: Message
    recipients: Sequence[Recipient]
    options: SendOptions
    _link: Any = _UNREAD
    _turn_session: Any = _UNREAD
    #: the pairs of agents the send is an exchange between (``Budgets``)
    budget_pairs: list[tuple[str, str, bool]] | None = None
    #: what the budgets decided about it (``Budgets.refuse``, then ``Budgets.record``)
    budget_decisions: list[Decision] | None = None
    #: the chain the send continues by its own route when another was named for it and
    #: stands (``Budgets.stamp``): the named chain never lets through what it refuses
    budget_own: ChainRef | None = None

    def open_link(self) -> Link | None:
        link = self._link
        if link is _UNREAD:
            m = self.message
            link = self._link = self.c.tx.find_open_link(m.team, m.sender, m.to)
        found: Link | None = link
        return found

    def turn_session(self) -> Session | None:
        session = self._turn_session
        if session is _UNREAD:
            session = self._turn_session = find_turn_session(self.c, self.message)
        found: Session | None = session
        return found


class Pipeline:
    """The send path and the ordered reactions of the parts (see the module docstring)."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def connect(
        self,
        *,
        sessions: Sessions,
        turns: Turns,
        links: Links,
        timers: Timers,
        outbox: Outbox,
        delegations: Delegations,
        budgets: Budgets,
    ) -> None:
        self.sessions, self.turns, self.links = sessions, turns, links
        self.timers, self.outbox = timers, outbox
        self.delegations, self.budgets = delegations, budgets

    # -- a send ------------------------------------------------------------------------
    def insert(
        self, c: Ctx, message: Message, to_session: str | None, options: SendOptions = NO_LINK
    ) -> SendResult:
        """Resolve recipients and store ``message`` inside ``c`` (every route sends
        through here); its recipients are woken after the commit."""
        tx, team, to = c.tx, message.team, message.to
        if tx.prefetches:  # what a send route did not name yet
            tx.prefetch(send_reads(message, replay=False))
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
            if session.state is SessionState.TERMINATED:
                # nothing leases for a terminated session: its member takes the message
                # (what waited for the session went the same way when it ended)
                recipients = rules.resolve_recipients(team, to, message.sender, names, None)
            elif message.kind is not MessageKind.SYSTEM:
                # only this session can take it: is it still alive? (a job looks; the
                # hub's own notices wait for its next turn, whenever that comes)
                self.sessions.watch_pinned(c, session, message.created_at)
        s = Send(c, message, recipients, options)
        # 1. the budget part gives the message its chain and hop, which the refusal
        #    below and every later hop of the chain read
        s.message = self.budgets.stamp(s)
        # 2. refusals, before anything is written; the budget first: a spent budget is
        #    the answer whatever else is wrong with the send
        self.budgets.refuse(s)
        self.links.check_close(s)  # close_link only by the initiator of an open link
        self.timers.check_anchor(s)  # the anchor rule, for an agent's own send
        tx.insert_message(s.message, recipients)
        # 3. reactions to the stored message: the ledger first (a link opened below
        #    must not be crossed by text this turn already sent), then links, then the
        #    budget, whose spending may close the link just opened; last, a timer
        #    waiting for this sender's reply notes it
        self.turns.record_send(s)
        self.links.after_send(s)
        self.budgets.record(s)
        self.timers.after_send(s)
        for r in recipients:
            c.wake(team, r.member)
        return SendResult(s.message.message_id, DeliveryState.QUEUED, recipients)

    # -- a lease -------------------------------------------------------------------------
    def after_lease(
        self, c: Ctx, session: Session, got: Sequence[InboxMessage], now: float
    ) -> None:
        """Messages were handed to ``session`` (its turn starts on them)."""
        # the session's record is rewritten by the first and the last step: the budget
        # part re-reads it, so it comes last and keeps what the turns part wrote
        self.turns.on_lease(c, session, got, now)  # its transcript; checkpoint pending?
        self.links.on_lease(c, session, got)  # a link's responder side binds to it
        self.delegations.on_lease(c, session, got)  # a task taken by another session
        self.budgets.on_lease(c, session, got, now)  # the chain its turn works in

    def after_member_lease(
        self, c: Ctx, team: str, member: str, got: Sequence[InboxMessage], now: float
    ) -> None:
        """Messages were handed to a member that named no session."""
        self.budgets.on_member_lease(c, team, member, got, now)

    # -- a turn ----------------------------------------------------------------------------
    def turn_started(self, c: Ctx, session: Session, text: str, *, retried: bool) -> None:
        """``turn_start`` was recorded: a turn a human typed starts a new chain."""
        self.budgets.on_turn_start(c, session, text, retried=retried)

    def closing_text(
        self, c: Ctx, session: Session, parsed: turn_rules.ClosingText
    ) -> turn_rules.ClosingText:
        """Before a closing text is routed: a delegated callee's blocks to its caller are
        its answer, not messages."""
        return self.delegations.closing_text(c, session, parsed)

    def after_stop(
        self,
        c: Ctx,
        session: Session,
        output: str,
        checkpoint_turn: bool,
        ledger: Sequence[LedgerEntry],
        now: float,
    ) -> dict[str, Any]:
        """A turn ended by its ``agent_stop`` (its blocks already sent, the ledger still
        full: a crossing must not repeat what the turn sent). Links carry the output
        first, then a delegation is answered with it and the turn's own delegations go
        out: both count against the pair's budget, and the crossing is counted first."""
        extra = self.links.after_stop(c, session, output, checkpoint_turn, ledger, now)
        return {**extra, **self.delegations.after_stop(c, session, output, checkpoint_turn, now)}

    def turn_over(self, c: Ctx, session: Session, turn: int, now: float) -> None:
        """Turn ``turn`` ended other than by its ``agent_stop`` (retried, recovered,
        exited or terminated): its delegations go out and their results are gathered."""
        self.delegations.turn_over(c, session, turn, now)

    # -- a termination -----------------------------------------------------------------------
    def terminated(
        self, c: Ctx, session: Session, reason: str, *, link_reason: str = "session_terminated"
    ) -> None:
        """A session ended for good: what waits for it goes to its member as a whole,
        its pending timers are cancelled, then its links close (for ``link_reason``) and
        both sides are told."""
        self.sessions.on_terminate(c, session)
        self.timers.on_terminate(c, session)
        self.links.on_terminate(c, session, link_reason)

    # -- a tick ----------------------------------------------------------------------------------
    def job_handlers(self) -> dict[str, JobHandler]:
        """Scheduled-job kinds and what firing one does (maintenance runs them)."""
        return {
            **self.sessions.job_handlers(),
            **self.turns.job_handlers(),
            **self.timers.job_handlers(),
            **self.outbox.job_handlers(),
            **self.delegations.job_handlers(),
        }

    def start_after(self, job: Job) -> None:
        """Start the I/O a fired job asked for, after its transaction committed."""
        self.outbox.start(job)

    # -- the outbox's verdicts ----------------------------------------------------------------
    def post_done(self, c: Ctx, job: Job, now: float) -> None:
        """A POST was accepted (2xx)."""

    def post_answered(
        self, c: Ctx, job: Job, text: str, now: float, chain: ChainRef | None = None
    ) -> None:
        """A call answered inline (an A2A agent): the answer resolves its delegation."""
        self.delegations.post_answered(c, job, text, now, chain)

    def post_dead(
        self,
        c: Ctx,
        job: Job,
        reason: str,
        now: float,
        status: int | None,
        *,
        reached: bool = True,
        refused: bool = True,
    ) -> None:
        """A POST was given up on: the delegation it carried fails or is marked."""
        self.delegations.post_dead(c, job, reason, now, status, reached=reached, refused=refused)
