"""Sessions, turns and events; closing-text routing; the per-turn ledger; checkpoints.

Rules (from :mod:`backchannel.core.turns`): a turn runs from ``turn_start`` to
``agent_stop``; messages for a session wait while its turn runs; at ``agent_stop`` the
closing text's ``<message to=...>`` blocks are sent (unless this turn already sent the
same text to the same recipient) and the rest is the turn's output. The ledger of what
a turn sent is durable and is cleared at turn start, after every ``agent_stop``, on a
retried turn, and when a session recovers from a crash.
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backchannel.core import messages as rules
from backchannel.core import turns
from backchannel.errors import (
    BudgetExhausted,
    Forbidden,
    InvalidRequest,
    InvalidState,
    QuotaExceeded,
    UnknownMember,
    UnknownSession,
)
from backchannel.hub.messages import HubBase, JobHandler, SendOptions
from backchannel.stores.base import Tx
from backchannel.types import (
    HUB_SENDER,
    DeliveryEvent,
    EventKind,
    InboxMessage,
    Job,
    LedgerEntry,
    Message,
    MessageKind,
    Recipient,
    Session,
    SessionEvent,
    SessionState,
)

CHECKPOINT_JOB = "checkpoint"
#: Events read per store round trip when paging a transcript (each may be large).
_TRANSCRIPT_BATCH = 32

EXIT_JOB = "session_exit"
#: Session meta of a turn a stop hook's answer continued: the closing text before it
#: (a runtime that reports the whole continuation's text repeats it first).
CONTINUED = "continued_from"
#: How long an exited session keeps its links and timers for a resume (team setting
#: ``exit_grace_seconds``; docs/decisions.md says why an hour).
DEFAULT_EXIT_GRACE_S = 3600.0


def exit_grace(settings: Mapping[str, Any]) -> float:
    value = settings.get("exit_grace_seconds", DEFAULT_EXIT_GRACE_S)
    try:
        grace = float(value)
    except (TypeError, ValueError):
        return DEFAULT_EXIT_GRACE_S
    return grace if grace >= 0 else DEFAULT_EXIT_GRACE_S


DEFAULT_CHECKPOINT_TEXT = (
    "Checkpoint: you have been idle for a while. In two or three lines, say where your "
    "task stands, what is next, and whether anything blocks you."
)
#: Message kinds whose delivery to a session's turn does not feed the ledger.
_LEDGER_KINDS = (MessageKind.DIRECT,)


@dataclass(frozen=True, slots=True)
class StopResult:
    """What ``agent_stop`` did with the closing text."""

    session: Session
    output: str
    sent: tuple[str, ...] = ()  # message ids
    duplicates: tuple[str, ...] = ()  # recipients whose block was dropped as a repeat
    unknown: tuple[str, ...] = ()  # destinations that do not exist
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session.session_id,
            "state": self.session.state.value,
            "turn": self.session.turn,
            "output": self.output,
            "sent": list(self.sent),
            "duplicates_dropped": list(self.duplicates),
            "unknown_destinations": list(self.unknown),
            **dict(self.extra),
        }


def session_json(s: Session) -> dict[str, Any]:
    return {
        "session_id": s.session_id,
        "member": s.member,
        "state": s.state.value,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
        "turn": s.turn,
        "turn_kind": s.turn_kind,
        "turn_started_at": s.turn_started_at,
        "last_stop_at": s.last_stop_at,
        "last_output": s.last_output,
    }


class SessionsMixin(HubBase):
    """Sessions, turns and events (see the module docstring)."""

    # -- sessions --------------------------------------------------------------
    async def open_session(self, team: str, member: str, session_id: str | None = None) -> Session:
        """Open a session for ``member``, or resume ``session_id`` with its state, links
        and timers. Resuming a session whose turn was running means its process died
        mid-turn: the turn is closed and its ledger cleared, so nothing it recorded can
        suppress the next turn."""
        sid = (
            rules.check_session_id(session_id)
            if session_id
            else f"{member}-{uuid.uuid4().hex[:12]}"
        )
        now = self.clock.now()

        def fn(tx: Tx) -> Session:
            if tx.get_member(team, member) is None:
                raise UnknownMember(f"unknown member {member!r} in team {team!r}", member=member)
            existing = tx.get_session(team, sid)
            if existing is None:
                session = Session(team, sid, member, SessionState.IDLE, now, now)
                tx.put_session(session)
                self._event(tx, session, EventKind.SESSION, "opened")
                return session
            self._own(existing, member)
            if existing.state is SessionState.TERMINATED:
                raise InvalidState(f"session {sid!r} was terminated; open a new session instead")
            if existing.state is SessionState.EXITED:
                return self._resume(tx, existing, now)
            if existing.state is SessionState.ACTIVE:
                tx.ledger_clear(team, sid)
                recovered = dataclasses.replace(
                    existing, state=SessionState.IDLE, updated_at=now, turn_started_at=None
                )
                tx.put_session(recovered)
                self._turn_over(tx, recovered, existing.turn, now)
                self._event(
                    tx,
                    recovered,
                    EventKind.SESSION,
                    f"recovered: turn {existing.turn} was interrupted and is closed",
                    {"recovered_turn": existing.turn},
                )
                return recovered
            return existing

        session = await self.store.transact(fn)
        self._flush_due()
        self._waiters.notify(team, member)
        return session

    def _resume(self, tx: Tx, s: Session, now: float) -> Session:
        """An exited session comes back (its runtime resumed it): idle again, with its
        links, timers and ledger; what arrived meanwhile waits in its inbox."""
        back = dataclasses.replace(s, state=SessionState.IDLE, updated_at=now)
        tx.put_session(back)
        self._event(tx, back, EventKind.SESSION, "resumed")
        return back

    async def exit_session(
        self, team: str, member: str, session_id: str, reason: str = ""
    ) -> Session:
        """The session's process exited (``SessionEnd`` of a one-shot run): the session
        keeps its links, timers and ledger for the team's exit grace
        (``exit_grace_seconds``, default an hour), and a resume picks it up again; after
        the grace it terminates. A running turn is closed. Idempotent."""
        now = self.clock.now()

        def fn(tx: Tx) -> Session:
            s = self._load(tx, team, member, session_id)
            if s.state in (SessionState.TERMINATED, SessionState.EXITED):
                return s
            gone = dataclasses.replace(
                s, state=SessionState.EXITED, updated_at=now, turn_started_at=None
            )
            tx.put_session(gone)
            if s.state is SessionState.ACTIVE:
                tx.ledger_clear(team, session_id)
                self._turn_over(tx, gone, s.turn, now)
            t = tx.get_team(team)
            grace = exit_grace(t.settings if t else {})
            self._event(
                tx,
                gone,
                EventKind.SESSION,
                f"exited{': ' + reason if reason else ''}; kept {grace:g} s for a resume",
                {"grace_seconds": grace},
            )
            due = now + grace
            tx.add_job(Job(team, EXIT_JOB, due, now, session_id, {"exited_at": now}))
            self._scheduled.append(due)
            return gone

        session = await self.store.transact(fn)
        self._flush_due()
        self._waiters.notify(team, None)
        return session

    def _fire_exit(self, tx: Tx, job: Job, now: float) -> Iterable[tuple[str, str]]:
        s = tx.get_session(job.team, job.session_id or "")
        if s is None or s.state is not SessionState.EXITED:
            return ()  # resumed (or ended) meanwhile
        if s.updated_at != job.payload.get("exited_at"):
            return ()  # exited again later: that exit's job decides
        done = dataclasses.replace(s, state=SessionState.TERMINATED, updated_at=now)
        tx.ledger_clear(s.team, s.session_id)
        tx.put_session(done)
        self._event(tx, done, EventKind.SESSION, "terminated: not resumed within the exit grace")
        self._on_terminate(tx, done, "not resumed within the exit grace")
        return ()

    @staticmethod
    def _own(session: Session, member: str) -> None:
        if session.member != member:
            raise Forbidden(
                f"session {session.session_id!r} belongs to {session.member!r}, not {member!r}; "
                "report events for your own sessions"
            )

    def _event(
        self,
        tx: Tx,
        session: Session,
        kind: EventKind,
        text: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> int:
        return tx.append_event(
            SessionEvent(
                session.team,
                session.session_id,
                session.turn,
                self.clock.now(),
                kind,
                text,
                dict(data or {}),
            )
        )

    async def terminate_session(
        self, team: str, member: str, session_id: str, reason: str = ""
    ) -> Session:
        """End a session for good. Idempotent."""
        now = self.clock.now()

        def fn(tx: Tx) -> Session:
            s = self._load(tx, team, member, session_id)
            if s.state is SessionState.TERMINATED:
                return s
            tx.ledger_clear(team, session_id)
            done = dataclasses.replace(
                s, state=SessionState.TERMINATED, updated_at=now, turn_started_at=None
            )
            tx.put_session(done)
            if s.state is SessionState.ACTIVE:
                self._turn_over(tx, done, s.turn, now)
            self._event(tx, done, EventKind.SESSION, f"terminated{': ' + reason if reason else ''}")
            self._on_terminate(tx, done, reason)
            return done

        session = await self.store.transact(fn)
        self._flush_due()
        self._waiters.notify(team, None)
        return session

    def _on_terminate(self, tx: Tx, session: Session, reason: str) -> None:
        """Hook for the parts on top (links close when a session terminates)."""

    def _load(self, tx: Tx, team: str, member: str, session_id: str) -> Session:
        s = tx.get_session(team, session_id)
        if s is None:
            raise UnknownSession(
                f"unknown session {session_id!r} in team {team!r}; open it first",
                session=session_id,
            )
        self._own(s, member)
        return s

    # -- events -------------------------------------------------------------------
    async def report_event(
        self,
        team: str,
        member: str,
        session_id: str,
        kind: EventKind | str,
        text: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record what a runtime reports. ``turn_start`` opens a turn (a second one while
        a turn runs is a retry: the ledger is cleared); ``agent_stop`` closes it and
        routes the closing text. Other events need an open turn."""
        try:
            kind = EventKind(kind)
        except ValueError:
            allowed = ", ".join(k.value for k in EventKind if k.reported)
            raise InvalidRequest(f"unknown event kind {kind!r}; use one of: {allowed}") from None
        if not kind.reported:
            allowed = ", ".join(k.value for k in EventKind if k.reported)
            raise InvalidRequest(f"{kind.value!r} is recorded by the hub; report one of: {allowed}")
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", field="text")
        rules.check_text(text, self.config.max_text)
        data = dict(data or {})
        turns.check_event_data(data)
        now = self.clock.now()
        woken: set[tuple[str, str]] = set()

        def fn(tx: Tx) -> dict[str, Any]:
            s = self._load(tx, team, member, session_id)
            if s.state is SessionState.TERMINATED:
                raise InvalidState(
                    f"session {session_id!r} is terminated; open a new session to report events"
                )
            if s.state is SessionState.EXITED:  # the runtime resumed it
                s = self._resume(tx, s, now)
            if kind is EventKind.TURN_START:
                return self._turn_start(tx, s, text, data, now)
            if s.state is not SessionState.ACTIVE:
                raise InvalidState(
                    f"no turn is open in session {session_id!r}: report turn_start before "
                    f"{kind.value}"
                )
            if kind is EventKind.AGENT_STOP:
                result = self._agent_stop(tx, s, text, data, now, woken)
                return result.to_json()
            eid = self._event(tx, s, kind, text, data)
            return {"event_id": eid, "session": s.session_id, "turn": s.turn}

        result = await self.store.transact(fn)
        self._flush_due()
        if kind is EventKind.AGENT_STOP:
            woken.add((team, member))
        for t, m in woken:
            self._waiters.notify(t, m)
        self._waiters.notify(team, None)
        return result

    def _turn_start(
        self, tx: Tx, s: Session, text: str, data: Mapping[str, Any], now: float
    ) -> dict[str, Any]:
        retried = s.state is SessionState.ACTIVE
        tx.ledger_clear(s.team, s.session_id)
        # only a turn on the checkpoint the hub handed over is a checkpoint turn: a human
        # who typed something else meanwhile started an ordinary one
        checkpoint = (
            bool(s.meta.get("checkpoint_pending", False))
            and data.get("checkpoint") is not False
            and turns.is_hub_input(text, s.meta.get("checkpoint_texts") or ())
        )
        for job in tx.list_jobs(s.team, session_id=s.session_id, kind=CHECKPOINT_JOB):
            tx.finish_job(job.job_id, job.state.CANCELLED, now)
        meta = {
            k: v
            for k, v in s.meta.items()
            if k not in ("checkpoint_pending", "checkpoint_texts", CONTINUED)
        }
        if data.get("continued_by"):  # a stop hook's answer keeps the turn going
            meta[CONTINUED] = str(data.get("continued_after") or s.last_output or "")
        started = dataclasses.replace(
            s,
            state=SessionState.ACTIVE,
            turn=s.turn + 1,
            turn_started_at=now,
            turn_kind="checkpoint" if checkpoint else "normal",
            updated_at=now,
            meta=meta,
        )
        tx.put_session(started)
        if retried:
            self._turn_over(tx, started, s.turn, now)
        eid = self._event(
            tx,
            started,
            EventKind.TURN_START,
            text,
            {**data, "retried": retried, "checkpoint": checkpoint},
        )
        return {
            "event_id": eid,
            "session": s.session_id,
            "turn": started.turn,
            "retried": retried,
            "checkpoint": checkpoint,
        }

    def _agent_stop(
        self,
        tx: Tx,
        s: Session,
        text: str,
        data: Mapping[str, Any],
        now: float,
        woken: set[tuple[str, str]],
    ) -> StopResult:
        parsed = self._closing_text(tx, s, turns.parse_closing_text(text))
        self._event(tx, s, EventKind.AGENT_STOP, text, data)
        # the member list is only needed to route blocks (most closing texts have none)
        members = [m.name for m in tx.list_members(s.team)] if parsed.blocks else []
        ledger = tx.ledger(s.team, s.session_id) if parsed.blocks else []
        sent: list[str] = []
        dups: list[str] = []
        unknown: list[str] = []
        refused: list[str] = []
        for d in turns.route_blocks(parsed.blocks, s.member, members, ledger):
            b = d.block
            if d.action is turns.BlockAction.SEND:
                n = len(sent) + len(dups) + len(unknown) + len(refused)
                for i, to in enumerate(d.only if d.only is not None else (b.to,)):
                    if not self._block_fits(tx, s, to, now):
                        woken.add((s.team, s.member))  # told why, by a system notice
                        continue
                    mid = f"{s.session_id}-t{s.turn}-b{n}" + (f"-{i}" if d.only else "")
                    msg = self._message(
                        s, to, b.body, MessageKind.DIRECT, now, message_id=mid[:128]
                    )
                    try:
                        result = self._insert(tx, msg, None)
                    except BudgetExhausted as exc:  # told, never dropped in silence
                        refused.append(to)
                        self._refused_block(tx, s, to, b.body, exc, now)
                        woken.add((s.team, s.member))
                        continue
                    woken.update((s.team, r.member) for r in result.recipients)
                    sent.append(mid[:128])
            elif d.action is turns.BlockAction.DUPLICATE:
                dups.append(b.to)
                self._event(
                    tx,
                    s,
                    EventKind.DUPLICATE_DROPPED,
                    f"closing <message to={b.to!r}> dropped: this turn already sent the same "
                    f"text to {b.to} ({d.duplicate_of})",
                    {"to": b.to, "duplicate_of": d.duplicate_of},
                )
            elif d.action is turns.BlockAction.UNKNOWN:
                unknown.append(b.to)
                notice = turns.unknown_destination_notice(b.to, s.member, s.team, members)
                self._event(tx, s, EventKind.ROUTING_ERROR, notice, {"to": b.to})
                sysmsg = self._message(
                    s,
                    s.member,
                    notice,
                    MessageKind.SYSTEM,
                    now,
                    sender=HUB_SENDER,
                    meta={"unknown_destination": b.to, "body": b.body},
                )
                self._insert(tx, sysmsg, s.session_id)
                woken.add((s.team, s.member))
        checkpoint_turn = s.turn_kind == "checkpoint"
        stopped = dataclasses.replace(
            s,
            state=SessionState.IDLE,
            updated_at=now,
            turn_started_at=None,
            last_stop_at=now,
            last_output=s.last_output if checkpoint_turn else parsed.output,
        )
        tx.put_session(stopped)
        sent_this_turn = tx.ledger(s.team, s.session_id)  # tool sends and the blocks above
        extra = self._after_stop(
            tx, stopped, parsed.output, checkpoint_turn, sent_this_turn, now, woken
        )
        tx.ledger_clear(s.team, s.session_id)
        if not checkpoint_turn:
            self._schedule_checkpoint(tx, stopped, now)
        if refused:
            extra = {**extra, "refused": refused}
        return StopResult(stopped, parsed.output, tuple(sent), tuple(dups), tuple(unknown), extra)

    def _block_fits(self, tx: Tx, s: Session, to: str, now: float) -> bool:
        """A closing block is a send: over the recipient's inbox quota it is refused, and
        the session is told (the rest of the stop goes on)."""
        try:
            self._check_inbox_room(tx, s.team, s.member, to)
        except QuotaExceeded as exc:
            notice = f"Your closing <message to={to!r}> block was not delivered: {exc.message}"
            self._event(tx, s, EventKind.ROUTING_ERROR, notice, {"to": to})
            sysmsg = self._message(s, s.member, notice, MessageKind.SYSTEM, now, sender=HUB_SENDER)
            self._insert(tx, sysmsg, s.session_id)
            return False
        return True

    def _turn_over(self, tx: Tx, session: Session, turn: int, now: float) -> None:
        """Hook for the parts on top: turn ``turn`` of ``session`` (as it is now) ended
        other than by its ``agent_stop``: retried, recovered after a crash, or terminated.
        Runs in that transaction."""

    def _closing_text(self, tx: Tx, s: Session, parsed: turns.ClosingText) -> turns.ClosingText:
        """Hook for the parts on top: they may take blocks out of routing and make them the
        turn's output (a delegated request answered in blocks). Runs in the stop's tx."""
        return parsed

    def _refused_block(
        self, tx: Tx, s: Session, to: str, body: str, exc: BudgetExhausted, now: float
    ) -> None:
        """A closing block over a conversation budget comes back to its sender."""
        notice = f'Your closing <message to="{to}"> block was {exc.message}'
        self._event(tx, s, EventKind.ROUTING_ERROR, notice, {"to": to, **exc.details})
        # told once per session and budget state: a notice that woke an agent which tries
        # again must not wake it again (that would be a loop with the hub)
        told = "refused-" + rules.fingerprint(
            s.session_id, str(exc.details.get("key")), str(exc.details.get("limit")), "", "system",
            None, {"resets_at": exc.details.get("resets_at")},
        )  # fmt: skip
        if tx.get_message(s.team, told) is not None:
            return
        sysmsg = self._message(
            s,
            s.member,
            notice,
            MessageKind.SYSTEM,
            now,
            sender=HUB_SENDER,
            meta={"refused_to": to, "body": body, **exc.details},
            message_id=told[:128],
        )
        self._insert(tx, sysmsg, s.session_id)

    def _after_stop(
        self,
        tx: Tx,
        session: Session,
        output: str,
        checkpoint_turn: bool,
        ledger: Sequence[LedgerEntry],
        now: float,
        woken: set[tuple[str, str]],
    ) -> dict[str, Any]:
        """Hook for the parts on top (links carry the output). Runs in the stop's tx."""
        return {}

    def _message(
        self,
        s: Session,
        to: str,
        text: str,
        kind: MessageKind,
        now: float,
        *,
        sender: str | None = None,
        message_id: str | None = None,
        meta: Mapping[str, Any] | None = None,
        summary: str | None = None,
    ) -> Message:
        sender = sender or s.member
        mid = message_id or f"msg_{uuid.uuid4().hex}"
        return Message(
            team=s.team,
            message_id=mid,
            sender=sender,
            to=to,
            text=text,
            kind=kind,
            created_at=now,
            fingerprint=rules.fingerprint(sender, to, text, summary, kind.value, None, meta),
            summary=summary,
            sender_session=s.session_id if sender == s.member else None,
            meta=dict(meta or {}),
        )

    # -- the ledger is fed by sends made during a turn ------------------------------
    def _after_insert(
        self, tx: Tx, message: Message, recipients: Sequence[Recipient], options: SendOptions
    ) -> None:
        super()._after_insert(tx, message, recipients, options)
        if message.kind not in _LEDGER_KINDS or message.sender == HUB_SENDER:
            return
        session = self._turn_session(tx, message)
        if session is None:
            return
        tx.ledger_add(
            LedgerEntry(
                message.team,
                session.session_id,
                message.to,
                turns.digest(message.text),
                message.message_id,
                message.created_at,
            )
        )
        self._event(
            tx,
            session,
            EventKind.SENT,
            message.text,
            {"to": message.to, "message_id": message.message_id},
        )

    def _turn_session(self, tx: Tx, message: Message) -> Session | None:
        """The session whose open turn made this send: the one named, or the member's only
        active session."""
        found: Session | None = self._memo(
            message, "turn_session", lambda: self._find_turn_session(tx, message)
        )
        return found

    def _find_turn_session(self, tx: Tx, message: Message) -> Session | None:
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

    def _after_lease(
        self, tx: Tx, session: Session, got: Sequence[InboxMessage], now: float
    ) -> None:
        super()._after_lease(tx, session, got, now)
        for m in got:
            self._event(
                tx,
                session,
                EventKind.INPUT,
                m.message.text,
                {
                    "from": m.message.sender,
                    "kind": m.message.kind.value,
                    "message_id": m.message.message_id,
                },
            )
        pending = all(m.message.kind is MessageKind.CHECKPOINT for m in got)
        texts = [m.message.text for m in got] if pending else None
        if pending != bool(session.meta.get("checkpoint_pending", False)) or (
            texts != session.meta.get("checkpoint_texts")
        ):
            meta = {**session.meta, "checkpoint_pending": pending, "checkpoint_texts": texts}
            tx.put_session(dataclasses.replace(session, meta=meta, updated_at=now))

    # -- checkpoints ----------------------------------------------------------------
    def _schedule_checkpoint(self, tx: Tx, s: Session, now: float) -> None:
        member = tx.get_member(s.team, s.member)
        policy = member.settings.get("checkpoint") if member else None
        if not isinstance(policy, Mapping) or not policy.get("idle_seconds"):
            return
        due = now + float(policy["idle_seconds"])
        tx.add_job(
            Job(
                s.team,
                CHECKPOINT_JOB,
                due,
                now,
                s.session_id,
                {"stop_at": now, "text": str(policy.get("text") or DEFAULT_CHECKPOINT_TEXT)},
            )
        )
        self._scheduled.append(due)  # picked up on the loop after the commit

    def _fire_checkpoint(self, tx: Tx, job: Job, now: float) -> Iterable[tuple[str, str]]:
        s = tx.get_session(job.team, job.session_id or "")
        if (
            s is None
            or s.state is not SessionState.IDLE
            or s.last_stop_at != job.payload.get("stop_at")
        ):
            return ()  # the session moved on (a new turn, or it ended): no checkpoint
        text = str(job.payload.get("text") or DEFAULT_CHECKPOINT_TEXT)
        msg = self._message(s, s.member, text, MessageKind.CHECKPOINT, now, sender=HUB_SENDER)
        self._insert(tx, msg, s.session_id)
        self._event(tx, s, EventKind.CHECKPOINT, text)
        return ((s.team, s.member),)

    def _job_handlers(self) -> dict[str, JobHandler]:
        return {
            **super()._job_handlers(),
            CHECKPOINT_JOB: self._fire_checkpoint,
            EXIT_JOB: self._fire_exit,
        }

    # -- transcripts ----------------------------------------------------------------
    async def get_session_data(
        self,
        team: str,
        session_id: str,
        *,
        since: int = 0,
        until: int | None = None,
        tail_chars: int | None = None,
        max_chars: int = 20_000,
        limit: int = 500,
    ) -> dict[str, Any]:
        """A session's full transcript (thoughts, tool calls, inputs, outputs) for a
        member of the same team: paged by event id, capped in size with a marker that
        says where it was cut and how to read on."""
        if since < 0 or (until is not None and until < since):
            raise InvalidRequest("since must be >= 0 and until >= since", field="since")
        if tail_chars is not None and not 1 <= tail_chars <= 1_000_000:
            raise InvalidRequest("tail_chars must be between 1 and 1000000", field="tail_chars")
        if not 1 <= max_chars <= 1_000_000:
            raise InvalidRequest("max_chars must be between 1 and 1000000", field="max_chars")

        session = await self.store.read(lambda tx: tx.get_session(team, session_id))
        if session is None:
            raise UnknownSession(
                f"unknown session {session_id!r} in team {team!r}; list sessions to see them",
                session=session_id,
            )
        # read in small batches and keep only what the page can show: a transcript of
        # large events never sits in memory whole
        kept: collections.deque[SessionEvent] = collections.deque()
        kept_chars = skipped = 0
        after, more = since, False
        while True:
            batch = await self.store.read(
                lambda tx, after=after: tx.list_events(  # type: ignore[misc]
                    team, session_id, after, until, _TRANSCRIPT_BATCH
                )
            )
            for ev in batch:
                if tail_chars is None and (len(kept) >= limit or kept_chars > max_chars):
                    more = True
                    break
                kept.append(ev)
                kept_chars += turns.viewable(ev)[1]
                # the tail keeps one event beyond its budget (shown cut), and no more
                # than ``limit`` events (empty ones weigh nothing)
                while tail_chars is not None and len(kept) > 1:
                    first = turns.viewable(kept[0])[1]
                    if kept_chars - first < tail_chars and len(kept) <= limit:
                        break
                    kept.popleft()
                    kept_chars -= first
                    skipped += 1
            if more or len(batch) < _TRANSCRIPT_BATCH:
                break
            after = batch[-1].event_id
        page = turns.page_transcript(
            list(kept), max_chars=max_chars, tail_chars=tail_chars, more=more, skipped=skipped
        )
        return {
            "session": session_json(session),
            "events": [e.to_json() for e in page.events],
            "truncated": page.truncated,
            "next_since": page.next_since,
            "note": page.note,
        }

    async def react(self, team: str, member: str, message_id: str, emoji: str) -> None:
        """Add a reaction to a message you sent or received. A reaction is not a send: it
        never feeds the ledger and never crosses a link; it is recorded in the message's
        history."""
        if not isinstance(emoji, str) or not 1 <= len(emoji) <= 32:
            raise InvalidRequest("emoji must be 1 to 32 characters", field="emoji")
        status = await self.message_status(team, message_id, viewer=member)
        now = self.clock.now()
        await self.store.transact(
            lambda tx: tx.add_history(
                team, DeliveryEvent(message_id, member, now, "reaction", emoji)
            )
        )
        del status
