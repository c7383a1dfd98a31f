"""Turns: ``turn_start`` to ``agent_stop``; closing-text routing; the ledger; checkpoints.

Rules (from :mod:`backchannel.core.turns`): a turn runs from ``turn_start`` to
``agent_stop``; messages for a session wait while its turn runs; at ``agent_stop`` the
closing text's ``<message to=...>`` blocks are sent (unless this turn already sent the
same text to the same recipient) and the rest is the turn's output. The ledger of what
a turn sent is durable and is cleared at turn start, after every ``agent_stop``, on a
retried turn, and when a session recovers from a crash.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backchannel.core import messages as rules
from backchannel.core import notices, turns
from backchannel.errors import (
    BudgetExhausted,
    Conflict,
    InvalidRequest,
    InvalidState,
    QuotaExceeded,
)
from backchannel.hub.context import Ctx, Env, JobHandler, JobOutcome
from backchannel.hub.messages import Messages
from backchannel.hub.pipeline import Pipeline, Send
from backchannel.hub.quotas import Quotas
from backchannel.hub.sessions import Sessions
from backchannel.stores.base import Reads
from backchannel.types import (
    HUB_SENDER,
    EventKind,
    InboxMessage,
    Job,
    LedgerEntry,
    MessageKind,
    Session,
    SessionState,
)

__all__ = [
    "ANSWERED",
    "CHECKPOINT_JOB",
    "CONTINUED",
    "HANDED",
    "LAST_STOP",
    "SETTLED",
    "StopResult",
    "Turns",
]

CHECKPOINT_JOB = "checkpoint"
#: Session meta of a turn a stop hook's answer continued: the closing text before it
#: (a runtime that reports the whole continuation's text repeats it first).
CONTINUED = "continued_from"
#: Session meta of a turn a hook's answer fed: ``{"ids": [...], "at": "stop"|"prompt"}``,
#: the messages handed over, leased until the runtime's next event confirms them
#: (:mod:`backchannel.runtimes.receiver`); set from ``turn_start`` data ``handed``.
HANDED = "handed"
#: Key of a ``handed`` record once the runtime's next event settled it: the ids acked
#: (the rest were given back). Kept in the store, so the rest of the turn's events, a
#: hub restarted meanwhile and another hub on the same database leave it as it is.
SETTLED = "settled"
#: Session meta of an idle session: what marks the stop that ended its last turn, gone
#: when the next turn starts: ``agent_stop`` data ``last_stop`` as the hook receiver
#: gave it (the runtime's id of the stop, prints), else ``{"print": ...}`` of the closing
#: text (:func:`backchannel.core.turns.stop_print`). A hook receiver tells by it the same
#: ``Stop`` reported again from a new one.
LAST_STOP = "last_stop"

DEFAULT_CHECKPOINT_TEXT = (
    "Checkpoint: you have been idle for a while. In two or three lines, say where your "
    "task stands, what is next, and whether anything blocks you."
)
#: Session meta of the last event reported with a ``request_id``: ``{"id", "kind",
#: "answer"}``, the answer a repeat of that request gets again.
ANSWERED = "answered"
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


def _stop_mark(data: Mapping[str, Any], text: str) -> dict[str, str]:
    given = data.get(LAST_STOP)
    if isinstance(given, Mapping):
        return {str(k): str(v) for k, v in given.items() if isinstance(v, str)}
    return {"print": turns.stop_print(text)}


class Turns:
    """Turns and their closing texts (see the module docstring)."""

    def __init__(self, env: Env, sessions: Sessions, quotas: Quotas, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock, self.config = env.store, env.clock, env.config
        self.sessions = sessions
        self.quotas = quotas
        self.pipeline = pipeline

    async def report_event(
        self,
        team: str,
        member: str,
        session_id: str,
        kind: EventKind | str,
        text: str = "",
        data: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Record what a runtime reports. ``turn_start`` opens a turn (a second one while
        a turn runs is a retry: the ledger is cleared); ``agent_stop`` closes it and
        routes the closing text. Other events need an open turn.

        ``request_id`` (the caller's, for this one report) makes the report safe to make
        again when its answer was lost: the session keeps its last such report's answer,
        and the same id again is answered with it (``replayed``) and does nothing, so a
        turn is not started twice nor its closing text routed twice."""
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
        if request_id is not None:
            rules.check_message_id(request_id, "request_id")
        if kind is EventKind.AGENT_STOP:  # ends the turn whatever the model wrote
            text = turns.storable(text)
        else:
            rules.check_text(text, self.config.max_text)
        data = dict(data or {})
        turns.check_event_data(data)
        now = self.clock.now()

        def fn(c: Ctx) -> dict[str, Any]:
            c.watched(team)  # traffic watchers; inboxes wake as messages are stored
            s = self.sessions.load(c, team, member, session_id)
            if request_id is None:
                return report(c, s)
            last = s.meta.get(ANSWERED) or {}
            if last.get("id") == request_id:
                if last.get("kind") != kind.value:
                    raise Conflict(
                        f"request_id {request_id!r} was already used for the "
                        f"{last.get('kind')} report of session {session_id!r}; pick a new "
                        "request_id for each report"
                    )
                return {**last["answer"], "replayed": True}
            answer = report(c, s)
            now_s = c.tx.get_session(team, session_id) or s  # as the report left it
            meta = {
                **now_s.meta,
                ANSWERED: {"id": request_id, "kind": kind.value, "answer": answer},
            }
            c.tx.put_session(dataclasses.replace(now_s, meta=meta))
            return answer

        def report(c: Ctx, s: Session) -> dict[str, Any]:
            if s.state is SessionState.TERMINATED:
                raise InvalidState(
                    f"session {session_id!r} is terminated; open a new session to report events"
                )
            if s.state is SessionState.EXITED:  # the runtime resumed it
                s = self.sessions.resume(c, s, now)
            if kind is EventKind.TURN_START:
                return self._turn_start(c, s, text, data, now)
            if s.state is not SessionState.ACTIVE:
                raise InvalidState(
                    f"no turn is open in session {session_id!r}: report turn_start before "
                    f"{kind.value}"
                )
            if kind is EventKind.AGENT_STOP:
                return self._agent_stop(c, s, text, data, now).to_json()
            eid = self.sessions.event(c, s, kind, text, data)
            self.sessions.alive(c, s, now)  # a turn long at work is not a silent one
            return {"event_id": eid, "session": s.session_id, "turn": s.turn}

        return await self.env.transact(fn)

    async def forget_stop(self, team: str, member: str, session_id: str) -> Session:
        """Drop the mark of the stop that ended the idle session's last turn
        (:data:`LAST_STOP`): its runtime started it again (a new process, a cleared or
        compacted context), so the next stop is a turn of its own whatever its words,
        never that one reported again. A session that is not idle keeps what it has."""

        def fn(c: Ctx) -> Session:
            s = self.sessions.load(c, team, member, session_id)
            if s.state is not SessionState.IDLE or LAST_STOP not in s.meta:
                return s
            meta = {k: v for k, v in s.meta.items() if k != LAST_STOP}
            forgot = dataclasses.replace(s, meta=meta)
            c.tx.put_session(forgot)
            return forgot

        return await self.env.transact(fn)

    async def settle_handed(
        self,
        team: str,
        member: str,
        session_id: str,
        turn: int,
        ids: Sequence[str],
        taken: Sequence[str],
    ) -> frozenset[str]:
        """Settle what a hook answer handed over (session meta ``handed`` of ``turn``
        of ``session_id``, listing ``ids``): ack ``taken``, give the rest back, and note
        the record settled, in one transaction. Once only: a record settled already (by
        an earlier event, another hub, this hub before a restart) changes nothing, and
        the ids it acked are answered. A record that is no longer the session's (a turn
        started meanwhile) is left alone: its copies come back when their lease ends.
        Returns the ids the session has (acked now or before)."""
        now = self.clock.now()
        ids = list(ids)

        def fn(c: Ctx) -> frozenset[str]:
            s = self.sessions.load(c, team, member, session_id)
            record = s.meta.get(HANDED)
            if s.turn != turn or not isinstance(record, Mapping):
                return frozenset()
            if [i for i in record.get("ids") or () if isinstance(i, str)] != ids:
                return frozenset()
            done = record.get(SETTLED)
            if isinstance(done, list):
                return frozenset(i for i in done if isinstance(i, str))
            acked = [i for i in ids if i in taken]
            if acked:
                Messages._ack(c, team, member, acked, now)
            if Messages._release(c.tx, team, member, [i for i in ids if i not in acked], now):
                c.wake(team, member)
            meta = {**s.meta, HANDED: {**record, SETTLED: acked}}
            c.tx.put_session(dataclasses.replace(s, meta=meta))
            return frozenset(acked)

        return await self.env.transact(fn)

    def _turn_start(
        self, c: Ctx, s: Session, text: str, data: Mapping[str, Any], now: float
    ) -> dict[str, Any]:
        tx = c.tx
        retried = s.state is SessionState.ACTIVE
        tx.ledger_forget(s.team, s.session_id)
        # only a turn on the checkpoint the hub handed over is a checkpoint turn: a human
        # who typed something else meanwhile started an ordinary one
        checkpoint = turns.is_checkpoint_turn(
            bool(s.meta.get("checkpoint_pending", False)),
            data.get("checkpoint"),
            text,
            s.meta.get("checkpoint_texts") or (),
        )
        for job in tx.list_jobs(s.team, session_id=s.session_id, kind=CHECKPOINT_JOB):
            tx.finish_job(job.job_id, job.state.CANCELLED, now)
        meta = {
            k: v
            for k, v in s.meta.items()
            if k not in ("checkpoint_pending", "checkpoint_texts", CONTINUED, HANDED, LAST_STOP)
        }
        if data.get("continued_by"):  # a stop hook's answer keeps the turn going
            meta[CONTINUED] = str(data.get("continued_after") or s.last_output or "")
        if isinstance(data.get(HANDED), Mapping):  # what the hook answer hands over
            meta[HANDED] = dict(data[HANDED])
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
            self.pipeline.turn_over(c, started, s.turn, now)
        eid = self.sessions.event(
            c,
            started,
            EventKind.TURN_START,
            text,
            {**data, "retried": retried, "checkpoint": checkpoint},
        )
        self.pipeline.turn_started(c, started, text, retried=retried)
        return {
            "event_id": eid,
            "session": s.session_id,
            "turn": started.turn,
            "retried": retried,
            "checkpoint": checkpoint,
        }

    def _agent_stop(
        self, c: Ctx, s: Session, text: str, data: Mapping[str, Any], now: float
    ) -> StopResult:
        tx = c.tx
        c.wake(s.team, s.member)
        if tx.prefetches:  # what a turn's end reads, whatever its text, in one round trip
            tx.prefetch(
                Reads(
                    s.team,
                    members=(s.member,),
                    ledger_of=s.session_id,
                    links_of=s.member,
                    delegation_of=s.session_id,
                    batch=f"{s.session_id}#{s.turn}",
                )
            )
        limit = self.config.max_text
        fitted, cut = turns.fit_closing_text(turns.parse_closing_text(text), limit)
        parsed = self.pipeline.closing_text(c, s, fitted)
        self.sessions.note(c, s, EventKind.AGENT_STOP, turns.cut_to(text, limit)[0], data)
        if cut:
            self._told_cut(c, s, len(text.encode("utf-8")), now)
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
                    if not self._block_fits(c, s, to, now):
                        continue  # told why, by a system notice
                    mid = rules.derived_id(
                        f"{s.session_id}-t{s.turn}-b{n}" + (f"-{i}" if d.only else "")
                    )
                    msg = notices.block(
                        s.team, s.member, s.session_id, to, b.body, now, message_id=mid
                    )
                    try:
                        self.pipeline.insert(c, msg, None)
                    except BudgetExhausted as exc:  # told, never dropped in silence
                        refused.append(to)
                        self._refused_block(c, s, to, b.body, exc, now)
                        continue
                    sent.append(mid)
            elif d.action is turns.BlockAction.DUPLICATE:
                dups.append(b.to)
                self.sessions.note(
                    c,
                    s,
                    EventKind.DUPLICATE_DROPPED,
                    f"closing <message to={b.to!r}> dropped: this turn already sent the same "
                    f"text to {b.to} ({d.duplicate_of})",
                    {"to": b.to, "duplicate_of": d.duplicate_of},
                )
            elif d.action is turns.BlockAction.UNKNOWN:
                unknown.append(b.to)
                notice = turns.unknown_destination_notice(b.to, s.member, s.team, members)
                self.sessions.note(c, s, EventKind.ROUTING_ERROR, notice, {"to": b.to})
                sysmsg = notices.system(
                    s.team, s.member, notice, now,
                    meta={"unknown_destination": b.to, "body": b.body},
                )  # fmt: skip
                self.pipeline.insert(c, sysmsg, s.session_id)
        checkpoint_turn = s.turn_kind == "checkpoint"
        stopped = dataclasses.replace(
            s,
            state=SessionState.IDLE,
            updated_at=now,
            turn_started_at=None,
            last_stop_at=now,
            last_output=s.last_output if checkpoint_turn else parsed.output,
            meta={**s.meta, LAST_STOP: _stop_mark(data, text)},
        )
        tx.put_session(stopped)
        sent_this_turn = tx.ledger(s.team, s.session_id)  # tool sends and the blocks above
        extra = self.pipeline.after_stop(
            c, stopped, parsed.output, checkpoint_turn, sent_this_turn, now
        )
        tx.ledger_forget(s.team, s.session_id)
        if not checkpoint_turn:
            self._schedule_checkpoint(c, stopped, now)
        if refused:
            extra = {**extra, "refused": refused}
        return StopResult(stopped, parsed.output, tuple(sent), tuple(dups), tuple(unknown), extra)

    def _told_cut(self, c: Ctx, s: Session, size: int, now: float) -> None:
        """A closing text over the text limit was cut where it goes on (the crossing to a
        linked peer, a closing block): its session is told, so nothing is cut unheard."""
        limit = self.config.max_text
        notice = (
            f"Your turn's closing text was {size} bytes, over the hub's {limit}-byte limit: "
            "what it sent on (to a linked peer, or in <message> blocks) was cut to fit, "
            "marked […cut…]. Put long results in a file and send its path."
        )
        self.sessions.note(c, s, EventKind.ROUTING_ERROR, notice, {"size": size, "limit": limit})
        meta = {"closing_text_cut": size}
        msg = notices.system(s.team, s.member, notice, now, meta=meta)
        self.pipeline.insert(c, msg, s.session_id)

    def _block_fits(self, c: Ctx, s: Session, to: str, now: float) -> bool:
        """A closing block is a send: over the recipient's inbox quota it is refused, and
        the session is told (the rest of the stop goes on)."""
        try:
            self.quotas.check_inbox(c, s.team, s.member, to)
        except QuotaExceeded as exc:
            notice = f"Your closing <message to={to!r}> block was not delivered: {exc.message}"
            self.sessions.note(c, s, EventKind.ROUTING_ERROR, notice, {"to": to})
            self.pipeline.insert(c, notices.system(s.team, s.member, notice, now), s.session_id)
            return False
        return True

    def _refused_block(
        self, c: Ctx, s: Session, to: str, body: str, exc: BudgetExhausted, now: float
    ) -> None:
        """A closing block over a conversation budget comes back to its sender."""
        notice = f'Your closing <message to="{to}"> block was {exc.message}'
        self.sessions.note(c, s, EventKind.ROUTING_ERROR, notice, {"to": to, **exc.details})
        # told once per session and budget state: a notice that woke an agent which tries
        # again must not wake it again (that would be a loop with the hub)
        told = "refused-" + rules.fingerprint(
            s.session_id, str(exc.details.get("key")), str(exc.details.get("limit")), "", "system",
            None, {"resets_at": exc.details.get("resets_at")},
        )  # fmt: skip
        if c.tx.get_message(s.team, told[:128]) is not None:
            return
        sysmsg = notices.system(
            s.team, s.member, notice, now,
            message_id=told[:128], meta={"refused_to": to, "body": body, **exc.details},
        )  # fmt: skip
        self.pipeline.insert(c, sysmsg, s.session_id)

    # -- the ledger is fed by sends made during a turn ------------------------------
    def record_send(self, s: Send) -> None:
        """A send made during a turn feeds that turn's ledger and transcript."""
        message = s.message
        if message.kind not in _LEDGER_KINDS or message.sender == HUB_SENDER:
            return
        session = s.turn_session()
        if session is None:
            return
        s.c.tx.ledger_add(
            LedgerEntry(
                message.team,
                session.session_id,
                message.to,
                turns.digest(message.text),
                message.message_id,
                message.created_at,
            )
        )
        self.sessions.note(
            s.c,
            session,
            EventKind.SENT,
            message.text,
            {"to": message.to, "message_id": message.message_id},
        )

    def on_lease(self, c: Ctx, session: Session, got: Sequence[InboxMessage], now: float) -> None:
        """What a session was handed goes in its transcript; a turn on nothing but
        checkpoint prompts will be a checkpoint turn."""
        for m in got:
            self.sessions.note(
                c,
                session,
                EventKind.INPUT,
                m.message.text,
                {
                    "from": m.message.sender,
                    "kind": m.message.kind.value,
                    "message_id": m.message.message_id,
                },
            )
        pending = turns.checkpoint_handed([m.message.kind for m in got])
        texts = [m.message.text for m in got] if pending else None
        if pending != bool(session.meta.get("checkpoint_pending", False)) or (
            texts != session.meta.get("checkpoint_texts")
        ):
            meta = {**session.meta, "checkpoint_pending": pending, "checkpoint_texts": texts}
            c.tx.put_session(dataclasses.replace(session, meta=meta, updated_at=now))

    # -- checkpoints ----------------------------------------------------------------
    def _schedule_checkpoint(self, c: Ctx, s: Session, now: float) -> None:
        tx = c.tx
        member = tx.get_member(s.team, s.member)
        policy = turns.checkpoint_policy(member.settings) if member else None
        if policy is None:
            return
        idle, text = policy
        due = now + idle
        tx.add_job(
            Job(
                s.team,
                CHECKPOINT_JOB,
                due,
                now,
                s.session_id,
                {"stop_at": now, "text": text or DEFAULT_CHECKPOINT_TEXT},
            )
        )
        c.schedule(due)

    def _fire_checkpoint(self, c: Ctx, job: Job, now: float) -> JobOutcome | None:
        s = c.tx.get_session(job.team, job.session_id or "")
        if (
            s is None
            or s.state is not SessionState.IDLE
            or s.last_stop_at != job.payload.get("stop_at")
        ):
            return None  # the session moved on (a new turn, or it ended): no checkpoint
        text = str(job.payload.get("text") or DEFAULT_CHECKPOINT_TEXT)
        msg = notices.checkpoint(s.team, s.member, s.session_id, text, now)
        self.pipeline.insert(c, msg, s.session_id)
        self.sessions.note(c, s, EventKind.CHECKPOINT, text)
        return None

    def job_handlers(self) -> dict[str, JobHandler]:
        return {CHECKPOINT_JOB: self._fire_checkpoint}
