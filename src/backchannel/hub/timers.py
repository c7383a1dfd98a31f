"""Intentional heartbeats: durable timers with intent, and the anchor rule.

A timer is a scheduled job of kind ``timer`` on the session that set it. When due it
becomes a ``timer`` message to that session, shown as the breadcrumb ``ANCHOR: <note>``
(``CHECK:`` with the peer's state and last output, ``WAIT:`` with whether the peer
replied). It waits for the session's turn to end like any message. Timers live in the
store; one due while the hub was down fires once when it comes back, marked late.

A timer with a target watches it (``Job.watch``): the target's first message with a copy
for the timer's member is noted on the timer as it is sent (:meth:`Timers.after_send`,
one of the send's reactions): its id, its time and the start of its text, which the
breadcrumb quotes from there, so retention may take the message meanwhile. A reply
already sent while the timer was being set is looked up when it is set. A delegation's
answer is the callee's reply as well, though it reaches the caller as the hub's tool
result.

A timer goes on in the conversation chain its session works in when it is set (the
chain of the turn that sets it, kept in the job's payload) at that hop: its firing is not
a hop, and the turn it starts sends one hop further, as the turn that set it would have.
A timer set on a session that works in no chain (a human typed its turn, or none ran)
starts a chain of its own. So an agent that answers a peer only from its timer's turn
cannot start a fresh chain with every answer, and a ring of such agents stops at the
chain budget.

A session that ends for good (terminated, or not resumed within its exit grace) takes no
input again: its pending timers are cancelled as it ends, and its record names them
(:meth:`Timers.on_terminate`), so none stays pending against the member's quota only to
fire into nothing.

The anchor rule (team setting ``anchor_policy``: ``enforce`` by default, ``warn``,
``off``): a session may ``send_message`` to a linked peer only while it holds a pending
anchor timer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backchannel.core import budget as budget_rules
from backchannel.core import messages, notices
from backchannel.core import timers as rules
from backchannel.errors import (
    AnchorRequired,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    UnknownMember,
)
from backchannel.hub.context import Ctx, Env, JobHandler, JobOutcome
from backchannel.hub.pipeline import NO_LINK, Pipeline, Send, SendOptions
from backchannel.hub.quotas import Quotas
from backchannel.hub.sessions import Sessions
from backchannel.stores.base import Tx
from backchannel.types import (
    EventKind,
    Job,
    JobState,
    MemberKind,
    Message,
    MessageKind,
    Session,
    SessionState,
)

log = logging.getLogger("backchannel.hub")

#: How many of a member's unread messages from a ``wait`` timer's target are looked at
#: for a reply sent before the timer was set (each costs a look for a later question).
UNREAD_REPLIES = 20
#: A ``check`` timer's target with no live session: how many of its latest sessions are
#: looked at for the one it left off in (the latest to change among them).
ENDED_LOOKED_AT = 20


@dataclass(frozen=True, slots=True)
class Timer:
    timer_id: int
    session: str
    member: str
    intent: str
    note: str
    target: str | None
    due_at: float
    set_at: float
    state: str

    @classmethod
    def of(cls, job: Job) -> Timer:
        p = job.payload
        return cls(
            timer_id=job.job_id,
            session=job.session_id or "",
            member=str(p.get("member", "")),
            intent=str(p.get("intent", "")),
            note=str(p.get("note", "")),
            target=p.get("target"),
            due_at=job.due_at,
            set_at=float(p.get("set_at", job.created_at)),
            state=job.state.value,
        )

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        out = {
            "timer_id": self.timer_id,
            "session": self.session,
            "member": self.member,
            "intent": self.intent,
            "note": self.note,
            "target": self.target,
            "due_at": self.due_at,
            "set_at": self.set_at,
            "state": self.state,
        }
        if now is not None:
            out["due_in"] = round(self.due_at - now, 3)
        return out


def _chain_of(s: Session) -> list[Any] | None:
    """The chain ``s`` works in (``[id, hop]``, as the budget part keeps it), if any."""
    raw = s.meta.get("chain")
    return list(raw) if isinstance(raw, list | tuple) and len(raw) == 2 else None


def _fired_chain(raw: Any) -> budget_rules.ChainRef | None:
    """The chain a timer's payload names for its firing (none: a chain of its own)."""
    if not isinstance(raw, list | tuple) or len(raw) != 2:
        return None
    chain_id, hop = raw
    if not isinstance(chain_id, str) or not isinstance(hop, int) or isinstance(hop, bool):
        return None
    return budget_rules.ChainRef(chain_id, max(0, hop))


class Timers:
    """Timers and the anchor rule (see the module docstring)."""

    def __init__(self, env: Env, sessions: Sessions, quotas: Quotas, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock = env.store, env.clock
        self.sessions = sessions
        self.quotas = quotas
        self.pipeline = pipeline

    async def set_timer(
        self,
        team: str,
        member: str,
        session_id: str | None,
        intent: str,
        seconds: float,
        note: str,
        target: str | None = None,
        *,
        request_id: str | None = None,
    ) -> Timer:
        """Set a timer on ``session_id`` (or the member's only open-turn session).

        Idempotent on ``request_id`` (the caller's, kept with the timer): the same id
        again answers the timer it set, fired or cancelled since, and sets none (a set
        made again when its answer was lost); another timer under it is a conflict."""
        it = rules.check_timer(intent, seconds, note, target)
        if request_id is not None:
            messages.check_message_id(request_id, "request_id")
        now = self.clock.now()

        def fn(c: Ctx) -> Timer:
            tx = c.tx
            s = self.session_for(c, team, member, session_id)
            if request_id is not None:
                again = self._set_under(tx, s, member, request_id, (it.value, note.strip(), target))
                if again is not None:
                    return again  # this set, made again: its answer was lost
            if target is not None:
                if tx.get_member(team, target) is None:
                    known = [m.name for m in tx.list_members(team)]
                    raise messages.unknown_recipient(target, team, known)
                if target == member:
                    raise InvalidRequest("a timer's target is a peer, not yourself", field="target")
            self.quotas.check_timers(c, team, member)
            job = Job(
                team,
                rules.TIMER_JOB,
                now + seconds,
                now,
                s.session_id,
                {
                    "intent": it.value,
                    "note": note.strip(),
                    "target": target,
                    "set_at": now,
                    "member": member,
                    **({"request_id": request_id} if request_id is not None else {}),
                    # the chain the session works in: the firing goes on in it
                    **({"chain": chain} if (chain := _chain_of(s)) is not None else {}),
                },
                watch=target,
            )
            if target is not None:  # a reply sent before this timer was stored
                early = self._early_reply(tx, team, member, target, now)
                if early is not None:
                    payload = {**job.payload, **rules.Reply.of(early).noted()}
                    if early.created_at < now:  # the peer answered before the timer
                        payload["reply_before"] = True
                    job = dataclasses.replace(job, payload=payload, watch=None)
            job_id = tx.add_job(job)
            c.schedule(job.due_at)
            return Timer.of(dataclasses.replace(job, job_id=job_id))

        return await self.env.transact(fn)

    @staticmethod
    def _early_reply(tx: Tx, team: str, member: str, target: str, now: float) -> Message | None:
        """The reply a ``wait`` timer has before it is stored: the first message from
        ``target`` that ``member`` has not read yet (its copy still queued) and that no
        later message of ``member``'s to ``target`` made old (it answers the latest
        question: the peer answered fast, between the question and the ``wait`` call);
        else one stored while the timer waited for the writer. One ``member`` has read
        already is no reply to wait for: it set the timer knowing it."""
        for m in tx.unread_from(team, member, target, UNREAD_REPLIES):
            if tx.first_message_from(team, member, target, m.created_at) is None:
                return m
        return tx.first_message_from(team, target, member, now)

    @staticmethod
    def _set_under(
        tx: Tx, s: Session, member: str, request_id: str, what: tuple[str, str, str | None]
    ) -> Timer | None:
        """The timer ``member`` set on ``s`` under ``request_id``, if any; one that is
        not ``what`` (intent, note, target) is a conflict."""
        job = tx.job_by_request(s.team, s.session_id, rules.TIMER_JOB, request_id)
        if job is None or job.payload.get("member") != member:
            return None
        t = Timer.of(job)
        if (t.intent, t.note, t.target) != what:
            raise Conflict(
                f"request_id {request_id!r} was already used for timer {t.timer_id} "
                f"({t.intent}: {t.note!r}); pick a new request_id for each timer"
            )
        return t

    def session_for(
        self, c: Ctx, team: str, member: str, session_id: str | None, purpose: str = "timer"
    ) -> Session:
        """The session named, or the member's only open-turn (else only live) session."""
        tx = c.tx
        if session_id is not None:
            s = self.sessions.load(c, team, member, session_id)
        else:
            live = tx.list_sessions(team, member, which="live")
            active = [x for x in live if x.state is SessionState.ACTIVE]
            pick = active if len(active) == 1 else live
            if tx.get_member(team, member) is None:
                raise UnknownMember(f"unknown member {member!r} in team {team!r}")
            if not live:
                raise InvalidRequest(
                    f"{member!r} has no open session for the {purpose}; open one first "
                    "(POST /v1/sessions, or `backchannel session open`)",
                    field="session",
                )
            if len(pick) != 1:
                ids = ", ".join(x.session_id for x in live)
                raise InvalidRequest(
                    f"{member!r} has {len(live)} open sessions ({ids}); say which one the "
                    f"{purpose} is for with session",
                    field="session",
                )
            s = pick[0]
        if s.state is SessionState.TERMINATED:
            raise InvalidRequest(f"session {s.session_id!r} is terminated", field="session")
        return s

    async def cancel_timer(self, team: str, member: str, timer_id: int) -> Timer:
        """Cancel one of your pending timers. A timer cancelled already is answered as it
        is (a cancel made again when its answer was lost); one that fired (on any hub,
        however close to this cancel) is refused with a conflict that says so, so the
        canceller knows its breadcrumb comes: a timer fires once or is cancelled, never
        both (the firing and this cancel are writes of the team, one after the other)."""
        now = self.clock.now()

        def fn(tx: Tx) -> Timer:
            job = tx.get_job(team, timer_id)
            if job is None or job.kind != rules.TIMER_JOB:
                raise NotFound(
                    f"no timer {timer_id} in team {team!r}; list your timers", timer_id=timer_id
                )
            if job.payload.get("member") != member:
                raise Forbidden(f"timer {timer_id} belongs to {job.payload.get('member')!r}")
            if job.state is JobState.CANCELLED:
                return Timer.of(job)
            if job.state is not JobState.PENDING:
                ago = f", {now - job.done_at:.0f} s ago" if job.done_at is not None else ""
                raise Conflict(
                    f"timer {timer_id} fired before this cancel{ago}: its breadcrumb went to "
                    f"session {job.session_id!r}, and there is nothing left to cancel",
                    timer_id=timer_id,
                )
            tx.finish_job(timer_id, JobState.CANCELLED, now)
            return Timer.of(dataclasses.replace(job, state=JobState.CANCELLED, done_at=now))

        return await self.store.transact(fn)

    async def get_timer(self, team: str, timer_id: int) -> Timer:
        """One timer of the team, whatever its state, with its note whole (a list shows
        a long note cut); ``NotFound`` when the team has no timer ``timer_id``."""

        def fn(tx: Tx) -> Timer:
            job = tx.get_job(team, timer_id)
            if job is None or job.kind != rules.TIMER_JOB:
                raise NotFound(
                    f"no timer {timer_id} in team {team!r}; list your timers", timer_id=timer_id
                )
            return Timer.of(job)

        return await self.store.read(fn)

    async def list_timers(
        self,
        team: str,
        *,
        member: str | None = None,
        session_id: str | None = None,
        pending_only: bool = True,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Timer]:
        """A team's timers in the order they were set (by id), those after timer id
        ``after``, at most ``limit`` (all when None): a page read from the store in that
        order, never every timer of the team."""
        jobs = await self.store.read(
            lambda tx: tx.list_timers(
                team,
                member=member,
                session_id=session_id,
                pending_only=pending_only,
                after=after,
                limit=limit,
            )
        )
        return [Timer.of(j) for j in jobs]

    async def timers_due(self, team: str, offset: int, limit: int) -> tuple[list[Timer], int]:
        """The dashboard's timers in one read: a page of the team's pending timers,
        soonest due first (``limit`` of them after the first ``offset``), and how many
        are pending in all, counted in the store: no more timers read than the page
        and the ones before it."""

        def read(tx: Tx) -> tuple[list[Timer], int]:
            page = tx.list_jobs(team, kind=rules.TIMER_JOB, limit=limit, offset=offset)
            return [Timer.of(j) for j in page], tx.count_pending_jobs(team, rules.TIMER_JOB)

        return await self.store.read(read)

    # -- firing -------------------------------------------------------------------
    def _fire_timer(self, c: Ctx, job: Job, now: float) -> JobOutcome | None:
        tx = c.tx
        timer = Timer.of(job)
        s = tx.get_session(job.team, timer.session)
        if s is None or s.state is SessionState.TERMINATED:
            # its session ended before it fell due: on_terminate cancelled it, in this
            # maintenance pass (it was due with the session's exit grace) or before it
            # was picked; or an older hub ended the session and left it pending, and it
            # is cancelled now, not done, since it reached no one
            if tx.finish_job(job.job_id, JobState.CANCELLED, now):
                log.warning(
                    "timer %s of team %r not fired: session %r has ended; cancelled",
                    job.job_id, job.team, timer.session,
                )  # fmt: skip
            return None
        peer = None
        if timer.target:
            # its live sessions, else its latest ones: never every session it ever had
            sessions = tx.list_sessions(job.team, timer.target, which="live") or (
                tx.latest_sessions(job.team, timer.target, ENDED_LOOKED_AT)
            )
            latest = messages.current_session(sessions)
            reply = rules.Reply.from_payload(job.payload)
            if reply is None and isinstance(reply_id := job.payload.get("reply"), str):
                # noted by id alone (before the text was noted too): still in the store
                # unless retention took it
                found = tx.get_message(job.team, reply_id)
                reply = rules.Reply.of(found) if found is not None else None
            before = reply is not None and job.payload.get("reply_before") is True
            peer = rules.PeerView(timer.target, latest, reply, before)
        text, meta = rules.breadcrumb(
            rules.Intent(timer.intent),
            timer.note,
            due_at=job.due_at,
            now=now,
            set_at=timer.set_at,
            peer=peer,
            failures=job.failures,
        )
        meta["timer_id"] = job.job_id
        msg = notices.timer(job.team, timer.member, s.session_id, job.job_id, text, meta, now)
        chain = _fired_chain(job.payload.get("chain"))
        # in the chain of the turn that set it, at that hop; else a chain of its own
        options = NO_LINK if chain is None else SendOptions(link=False, by_agent=False, chain=chain)
        self.pipeline.insert(c, msg, s.session_id, options)
        return None

    def job_handlers(self) -> dict[str, JobHandler]:
        return {rules.TIMER_JOB: self._fire_timer}

    def on_terminate(self, c: Ctx, session: Session) -> None:
        """A session ended for good: its pending timers can reach no one, so they are
        cancelled now (not left pending against the member's quota, to be dropped when
        due), and the session's record names them."""
        tx, now = c.tx, self.clock.now()
        jobs = tx.list_jobs(session.team, session_id=session.session_id, kind=rules.TIMER_JOB)
        gone = [j.job_id for j in jobs if tx.finish_job(j.job_id, JobState.CANCELLED, now)]
        if gone:
            ids = ", ".join(str(i) for i in gone)
            what = f"timer{'s' if len(gone) > 1 else ''} {ids} cancelled: the session ended"
            self.sessions.event(
                c, session, EventKind.SESSION, what,
                {"timers_cancelled": gone},
            )  # fmt: skip

    # -- a target's reply -----------------------------------------------------------------
    def after_send(self, s: Send) -> None:
        """A message was stored: the first one from a timer's target with a copy for the
        timer's member is noted on the timer, which then watches no more. A timer watches
        from the commit that set it, so every message stored while it watches came after
        it, whatever its time says (a clock stepped back, another hub's clock behind).
        A delegation's answer is the callee's reply too, though the hub hands it over as
        its own tool result: noted at the time the callee answered, with its answer."""
        message, tx = s.message, s.c.tx

        def note(sender: str, reply: Callable[[], rules.Reply]) -> None:
            watching = tx.watching(message.team, sender)
            if not watching:
                return
            reached = {r.member for r in s.recipients}
            for job in watching:
                if job.payload.get("member") in reached:
                    tx.end_watch(job.job_id, {**job.payload, **reply().noted()})

        note(message.sender, lambda: rules.Reply.of(message))
        for callee, delegation_id, answer in rules.Reply.answers(message):

            def answered(
                answer: rules.Reply = answer, did: str | None = delegation_id
            ) -> rules.Reply:
                d = tx.get_delegation(message.team, did) if did else None
                at = d.answered_at if d is not None else None
                return answer if at is None else dataclasses.replace(answer, created_at=at)

            note(callee, answered)

    # -- the anchor rule ----------------------------------------------------------------
    def check_anchor(self, s: Send) -> None:
        """An agent's own send to a linked peer needs a pending anchor timer on the
        sending session (the rule: :func:`backchannel.core.timers.anchor_action`)."""
        c, tx, message = s.c, s.c.tx, s.message
        if not s.options.by_agent or message.kind is not MessageKind.DIRECT:
            return
        link = s.open_link()
        if link is None:
            return
        sender = tx.get_member(message.team, message.sender)
        if sender is not None and sender.kind is MemberKind.HUMAN:
            return  # a person at a terminal is not held to the agents' heartbeat rule
        team = tx.get_team(message.team)
        policy = rules.anchor_policy(team.settings if team else {})
        if policy is rules.AnchorPolicy.OFF:
            return
        session = s.turn_session()
        sid = (
            session.session_id
            if session
            else (
                link.initiator_session
                if message.sender == link.initiator
                else link.responder_session
            )
        )
        if sid is None:
            return
        anchored = any(
            j.payload.get("intent") == rules.Intent.ANCHOR.value
            for j in tx.list_jobs(message.team, session_id=sid, kind=rules.TIMER_JOB)
        )
        action = rules.anchor_action(policy, anchored)
        if action is rules.AnchorAction.REFUSE:
            raise AnchorRequired(
                rules.anchor_missing(sid, message.to), session=sid, peer=message.to
            )
        if action is rules.AnchorAction.REMIND:
            reminder = notices.system(
                message.team, message.sender, rules.anchor_reminder(message.to),
                message.created_at, summary="set an anchor timer",
                meta={"anchor_reminder": True, "peer": message.to},
            )  # fmt: skip
            self.pipeline.insert(c, reminder, sid)
