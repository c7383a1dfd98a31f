"""Sessions: open, resume, exit, terminate; their events and transcripts.

A session is one run of a member. A resumed session keeps its id, links, timers and
ledger; a session whose process exited keeps them for the team's exit grace
(``exit_grace_seconds``), after which it terminates. A session whose process died
without saying so (a crash, ``kill -9``, a runtime restarted under a new session id)
is found by what waits for it: a session that shows no sign of life for the exit grace
while a message waits pinned to it ends the same way (``session_silent``). A sign of life
is an event, or a beat of the runtime process it runs under (its MCP server's, while the
runtime runs: :mod:`backchannel.runtimes.liveness`). What a turn does (``turn_start``,
``agent_stop``, the ledger, checkpoints) is :mod:`backchannel.hub.turns`.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from backchannel.core import messages as rules
from backchannel.core import turns
from backchannel.core.ids import new_session_id
from backchannel.errors import (
    Forbidden,
    InvalidRequest,
    InvalidState,
    UnknownMember,
    UnknownSession,
)
from backchannel.hub.context import Ctx, Env, JobHandler, JobOutcome
from backchannel.hub.pipeline import Pipeline
from backchannel.stores.base import SessionFilter, Tx
from backchannel.types import (
    DeliveryState,
    EventKind,
    Job,
    JobState,
    Message,
    MessageKind,
    Session,
    SessionEvent,
    SessionState,
)

__all__ = [
    "EXIT_JOB",
    "RUNTIME_META",
    "SILENT_JOB",
    "Sessions",
    "alive_step",
    "exit_grace",
    "new_session_id",
    "session_json",
]

_TRANSCRIPT_BATCH = 32

EXIT_JOB = "session_exit"
#: How long an exited session keeps its links and timers for a resume (team setting
#: ``exit_grace_seconds``; docs/decisions.md says why an hour).
DEFAULT_EXIT_GRACE_S = 3600.0
#: The job that looks, an exit grace after a message came to wait pinned to a session,
#: whether the session is still alive (:meth:`Sessions.watch_pinned`).
SILENT_JOB = "session_silent"
#: An event that changes nothing else in its session's record (a tool call) writes its
#: time there (``updated_at``, the session's last sign of life) at most this often.
ALIVE_STEP_S = 60.0
#: The key of a session's record (``meta``) that names the runtime process it runs under
#: (:mod:`backchannel.runtimes.liveness`).
RUNTIME_META = "runtime"
#: The shortest time between two beats of a runtime's MCP server: a team whose exit
#: grace is a few seconds (a test's) does not have every MCP server beat many times a
#: second (a grace under three of these is too short for beats to keep a session).
MIN_BEAT_S = 1.0
#: How many of a member's undelivered copies a silent session's check looks through.
_SILENT_SCAN = 1000


def exit_grace(settings: Mapping[str, Any]) -> float:
    value = settings.get("exit_grace_seconds", DEFAULT_EXIT_GRACE_S)
    try:
        grace = float(value)
    except (TypeError, ValueError):
        return DEFAULT_EXIT_GRACE_S
    return grace if grace >= 0 else DEFAULT_EXIT_GRACE_S


def alive_step(grace: float) -> float:
    """How often a runtime's MCP server beats, and how often a beat is written: often
    enough that a session whose runtime lives never looks silent for a whole exit grace
    (two steps at most between the last write and a look), and no more than once a
    minute."""
    return max(MIN_BEAT_S, min(ALIVE_STEP_S, grace / 3))


def _owed(m: Message | None) -> bool:
    """Whether a copy waiting for a session is owed to someone: the hub's own notices
    wait for the session's next turn and ride along with it, whenever that comes."""
    return m is not None and m.kind is not MessageKind.SYSTEM


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


class MemberSessions(NamedTuple):
    """A member's sessions as the dashboard shows them (:meth:`Sessions.member_sessions`)."""

    live: list[Session]  # not terminated, oldest first
    latest: list[Session]  # the latest few, newest first
    total: int  # how many it has, terminated ones too


class Sessions:
    """Sessions and their events (see the module docstring)."""

    def __init__(self, env: Env, pipeline: Pipeline) -> None:
        self.env = env
        self.store, self.clock = env.store, env.clock
        self.pipeline = pipeline

    async def get_session(self, team: str, session_id: str) -> Session:
        session = await self.store.read(lambda tx: tx.get_session(team, session_id))
        if session is None:
            raise UnknownSession(f"unknown session {session_id!r} in team {team!r}")
        return session

    async def list_sessions(
        self,
        team: str,
        member: str | None = None,
        *,
        which: SessionFilter = "all",
        after: str | None = None,
        limit: int | None = None,
    ) -> list[Session]:
        """A team's sessions (or one member's; ``which``: all, the live or the active
        ones), in the order they were opened: those opened after session ``after`` (the
        last one of the page before), at most ``limit`` (all when None). Sessions are
        kept as long as their team, so ``after`` names one the team still has; one
        opened meanwhile is read in its place."""

        def read(tx: Tx) -> list[Session]:
            start = None
            if after is not None:
                last = tx.get_session(team, after)
                if last is None:
                    raise InvalidRequest(
                        f"after names no session of team {team!r} ({after!r}); give the "
                        "last session id of the page before, or none for the first page",
                        field="after",
                    )
                start = (last.created_at, last.session_id)
            return tx.list_sessions(team, member, which=which, limit=limit, after=start)

        return await self.store.read(read)

    async def member_sessions(self, team: str, shown: int) -> dict[str, MemberSessions]:
        """What the dashboard shows of each member's sessions, in one read bounded by the
        team's live sessions and ``shown`` per member, not by every session the team
        ever opened: its live ones, its latest ``shown`` newest first, and how many it
        has (counted from an index). Members without a session are left out."""

        def read(tx: Tx) -> dict[str, MemberSessions]:
            # a member's live sessions from their own index (sessions_live): a team-wide
            # read of them is served by sessions_team, every session of the team
            return {
                name: MemberSessions(
                    tx.list_sessions(team, name, which="live"),
                    tx.latest_sessions(team, name, shown),
                    total,
                )
                for name, total in tx.session_counts(team).items()
            }

        return await self.store.read(read)

    async def open_session(
        self,
        team: str,
        member: str,
        session_id: str | None = None,
        *,
        first: Callable[[Ctx], object] | None = None,
    ) -> Session:
        """Open a session for ``member``, or resume ``session_id`` with its state, links
        and timers. Resuming a session whose turn was running means its process died
        mid-turn: the turn is closed and its ledger cleared, so nothing it recorded can
        suppress the next turn.

        ``first`` (a send's transaction function, :meth:`Messages.sending`) gives the
        session its input in the same transaction: a send that is refused (a spent
        budget, a full inbox) opens no session either, so a task refused at the door
        leaves nothing behind."""
        sid = rules.check_session_id(session_id) if session_id else new_session_id(member)
        now = self.clock.now()

        def fn(c: Ctx) -> Session:
            session = self._opening(c, team, member, sid, now)
            if first is not None:
                first(c)
            return session

        return await self.env.transact(fn)

    def _opening(self, c: Ctx, team: str, member: str, sid: str, now: float) -> Session:
        """:meth:`open_session`'s work inside a transaction."""
        tx = c.tx
        c.wake(team, member)
        if tx.get_member(team, member) is None:
            raise UnknownMember(f"unknown member {member!r} in team {team!r}", member=member)
        existing = tx.get_session(team, sid)
        if existing is None:
            session = Session(team, sid, member, SessionState.IDLE, now, now)
            tx.put_session(session)
            self.event(c, session, EventKind.SESSION, "opened")
            return session
        self.own(existing, member)
        if existing.state is SessionState.TERMINATED:
            raise InvalidState(f"session {sid!r} was terminated; open a new session instead")
        if existing.state is SessionState.EXITED:
            return self.resume(c, existing, now)
        if existing.state is SessionState.ACTIVE:
            tx.ledger_clear(team, sid)
            recovered = dataclasses.replace(
                existing, state=SessionState.IDLE, updated_at=now, turn_started_at=None
            )
            tx.put_session(recovered)
            self.pipeline.turn_over(c, recovered, existing.turn, now)
            self.event(
                c,
                recovered,
                EventKind.SESSION,
                f"recovered: turn {existing.turn} was interrupted and is closed",
                {"recovered_turn": existing.turn},
            )
            return recovered
        return existing

    async def start_session(
        self,
        team: str,
        member: str,
        session_id: str,
        *,
        recover: bool,
        runtime: str | None = None,
        leaving: str | None = None,
    ) -> tuple[Session, list[str]]:
        """A runtime's ``SessionStart``, in ONE transaction: session ``session_id`` is
        opened (or resumed when exited; an active one is recovered only when
        ``recover``), noted as running under runtime process ``runtime``, and, when
        ``leaving`` is given (the reason), the member's other idle or active sessions
        under that same process exit (the process moved to this conversation:
        ``/clear``, Codex's ``/new``). No reader (a send's ``"session": "auto"``, the
        runner, the dashboard, a timer's peer view, the process's beats) ever sees the
        old and the new conversation of one process live at once. Returns the session
        and the ids of the sessions that exited."""
        sid = rules.check_session_id(session_id)
        now = self.clock.now()

        def fn(c: Ctx) -> tuple[Session, list[str]]:
            s = c.tx.get_session(team, sid)
            if (
                s is None
                or s.state is SessionState.EXITED
                or (recover and s.state is SessionState.ACTIVE)
            ):
                s = self._opening(c, team, member, sid, now)
            else:
                self.own(s, member)
                if s.state is SessionState.TERMINATED:
                    raise InvalidState(f"session {sid!r} was terminated; open a new one instead")
            if runtime is not None and s.meta.get(RUNTIME_META) != runtime:
                s = dataclasses.replace(s, meta={**s.meta, RUNTIME_META: runtime})
                c.tx.put_session(s)
            left: list[str] = []
            if runtime is not None and leaving is not None:
                for o in c.tx.list_sessions(team, member, which="live"):
                    if (
                        o.session_id != sid
                        and o.state in (SessionState.IDLE, SessionState.ACTIVE)
                        and o.meta.get(RUNTIME_META) == runtime
                    ):
                        self._exit(c, o, leaving, now)
                        left.append(o.session_id)
            return s, left

        return await self.env.transact(fn)

    def resume(self, c: Ctx, s: Session, now: float) -> Session:
        """An exited session comes back (its runtime resumed it): idle again, with its
        links, timers and ledger; what arrived meanwhile waits in its inbox."""
        back = dataclasses.replace(s, state=SessionState.IDLE, updated_at=now)
        c.tx.put_session(back)
        self.event(c, back, EventKind.SESSION, "resumed")
        if self._waiting(c.tx, back):  # an exited session had no watch: one now
            self.watch_pinned(c, back, now)
        return back

    async def exit_session(
        self, team: str, member: str, session_id: str, reason: str = ""
    ) -> Session:
        """The session's process exited (``SessionEnd`` of a one-shot run): the session
        keeps its links, timers and ledger for the team's exit grace
        (``exit_grace_seconds``, default an hour), and a resume picks it up again; after
        the grace it terminates. A running turn is closed. Idempotent."""
        now = self.clock.now()

        def fn(c: Ctx) -> Session:
            return self._exit(c, self.load(c, team, member, session_id), reason, now)

        return await self.env.transact(fn)

    def _exit(self, c: Ctx, s: Session, reason: str, now: float) -> Session:
        """:meth:`exit_session`'s work inside a transaction."""
        tx = c.tx
        c.wake(s.team, s.member)  # its session's inbox may be open to receivers now
        if s.state in (SessionState.TERMINATED, SessionState.EXITED):
            return s
        gone = dataclasses.replace(
            s, state=SessionState.EXITED, updated_at=now, turn_started_at=None
        )
        tx.put_session(gone)
        if s.state is SessionState.ACTIVE:
            tx.ledger_clear(s.team, s.session_id)
            self.pipeline.turn_over(c, gone, s.turn, now)
        t = tx.get_team(s.team)
        grace = exit_grace(t.settings if t else {})
        self.event(
            c,
            gone,
            EventKind.SESSION,
            f"exited{': ' + reason if reason else ''}; kept {grace:g} s for a resume",
            {"grace_seconds": grace},
        )
        due = now + grace
        tx.add_job(Job(s.team, EXIT_JOB, due, now, s.session_id, {"exited_at": now}))
        c.schedule(due)
        return gone

    def _fire_exit(self, c: Ctx, job: Job, now: float) -> JobOutcome | None:
        tx = c.tx
        s = tx.get_session(job.team, job.session_id or "")
        if s is None or s.state is not SessionState.EXITED:
            return None  # resumed (or ended) meanwhile
        if s.updated_at != job.payload.get("exited_at"):
            return None  # exited again later: that exit's job decides
        done = dataclasses.replace(s, state=SessionState.TERMINATED, updated_at=now)
        tx.ledger_clear(s.team, s.session_id)
        tx.put_session(done)
        self.event(c, done, EventKind.SESSION, "terminated: not resumed within the exit grace")
        self.pipeline.terminated(c, done, "not resumed within the exit grace")
        return None

    # -- a session that died without saying so ------------------------------------------
    def alive(self, c: Ctx, s: Session, now: float, step: float = ALIVE_STEP_S) -> None:
        """An event of ``s`` that changes nothing else in its record is a sign of life:
        written as its ``updated_at``, at most every ``step`` seconds."""
        if now - s.updated_at >= step:
            c.tx.put_session(dataclasses.replace(s, updated_at=now))

    async def note_runtime(
        self, team: str, member: str, session_id: str, key: str, *, note: str = ""
    ) -> None:
        """Session ``session_id`` runs under the runtime process ``key`` (its command hook
        says so, :mod:`backchannel.runtimes.liveness`): kept on the session, so that the
        beats of that process's MCP server (:meth:`runtime_alive`) keep it alive. Written
        only when it changes (a session's first event, a resume in a new process).
        ``note``, when given, goes into the session's transcript (a ``session`` event)."""

        def fn(c: Ctx) -> None:
            s = self.load(c, team, member, session_id)
            if note and s.state is not SessionState.TERMINATED:
                self.event(c, s, EventKind.SESSION, note, {RUNTIME_META: key})
            if s.state is SessionState.TERMINATED or s.meta.get(RUNTIME_META) == key:
                return
            c.tx.put_session(dataclasses.replace(s, meta={**s.meta, RUNTIME_META: key}))

        await self.env.transact(fn)

    async def runtime_alive(self, team: str, member: str, key: str) -> tuple[list[str], float]:
        """The runtime process ``key`` of ``member`` is alive (its MCP server beats while
        its parent runs, :mod:`backchannel.runtimes.liveness`): a sign of life of each of
        the member's sessions that runs under it and has not exited. A runtime idle at
        its prompt, or in one long tool call, reports no event, and is alive all the
        same. Only a session watched for silence (:meth:`watch_pinned`) needs it written:
        as its ``updated_at``, at most every :func:`alive_step`; the others' records
        are left as they are. Returns the sessions vouched for and how soon to beat
        again."""
        now = self.clock.now()

        def under(tx: Any) -> tuple[list[Session], list[Session], float]:
            t = tx.get_team(team)
            step = alive_step(exit_grace(t.settings if t else {}))
            found = [
                s
                for s in tx.list_sessions(team, member, which="live")
                if s.state in (SessionState.IDLE, SessionState.ACTIVE)
                and s.meta.get(RUNTIME_META) == key
            ]
            stale = [
                s
                for s in found
                if now - s.updated_at >= step and tx.count_jobs(team, s.session_id, SILENT_JOB, 1)
            ]
            return found, stale, step

        found, stale, step = await self.store.read(under)
        if stale:

            def fn(c: Ctx) -> None:
                for s in under(c.tx)[1]:
                    self.alive(c, s, now, step)

            await self.env.transact(fn)
        return [s.session_id for s in found], step

    def watch_pinned(self, c: Ctx, s: Session, now: float) -> None:
        """A copy now waits pinned to ``s``, which nothing but ``s`` can take. Unless a
        watch is set already, a job looks an exit grace later whether ``s`` is still
        alive (:meth:`_fire_silent`); an exited session has its own job."""
        if s.state in (SessionState.TERMINATED, SessionState.EXITED):
            return
        tx = c.tx
        if tx.count_jobs(s.team, s.session_id, SILENT_JOB, 1):
            return
        t = tx.get_team(s.team)
        due = now + exit_grace(t.settings if t else {})
        tx.add_job(Job(s.team, SILENT_JOB, due, now, s.session_id))
        c.schedule(due)

    def _fire_silent(self, c: Ctx, job: Job, now: float) -> JobOutcome | None:
        """A session that has shown no sign of life (an event, a turn, a beat of its
        runtime process: :meth:`runtime_alive`) for the exit grace while a message owed
        to it (not a hub notice) waited pinned to it, untaken, all that time has gone as an
        exited one does after its grace: it terminates, its links close with both sides
        told, and what waited for it goes to its member (docs/decisions.md, "A session
        that died without saying so"). One that is alive is looked at again an exit
        grace after its last sign of life, as long as something waits for it."""
        tx = c.tx
        s = tx.get_session(job.team, job.session_id or "")
        if s is None or s.state in (SessionState.TERMINATED, SessionState.EXITED):
            return None
        waiting = self._waiting(tx, s)
        if not waiting:
            return None  # taken: the next copy pinned to it sets a new watch
        t = tx.get_team(s.team)
        grace = exit_grace(t.settings if t else {})
        # the hub hears no sign of life while it does not run itself: silence counts
        # from its start, or its return from a stop (docs/decisions.md, "A hub that
        # did not run")
        quiet_since = max(s.updated_at, min(waiting), self.env.awake_since)
        if now < quiet_since + grace:
            tx.reschedule_job(job.job_id, quiet_since + grace, job.payload)
            c.schedule(quiet_since + grace)
            return JobOutcome(keep=True)
        reason = (
            f"no sign of life for {grace:g} s while {len(waiting)} message(s) waited for it "
            "(its process ended without a SessionEnd, and no MCP server of it beats)"
        )
        tx.finish_job(job.job_id, JobState.DONE, now)  # done: not one of those dropped
        self.end(c, s, now, reason, link_reason="session_silent")
        return None

    @staticmethod
    def _waiting(tx: Tx, s: Session) -> list[float]:
        """Since when each message owed to ``s`` (not a hub notice) has waited pinned to
        it, untaken."""
        return [
            d.updated_at
            for d in tx.undelivered(s.team, s.member, _SILENT_SCAN)
            if d.recipient.session == s.session_id
            and d.state is DeliveryState.QUEUED
            and _owed(tx.get_message(s.team, d.message_id))
        ]

    def job_handlers(self) -> dict[str, JobHandler]:
        return {EXIT_JOB: self._fire_exit, SILENT_JOB: self._fire_silent}

    def on_terminate(self, c: Ctx, s: Session) -> None:
        """A session ended for good: the copies pinned to it, waiting or leased, become
        its member's as a whole, for any receive of the member to take (nothing leases
        for a terminated session; one given back or run out comes back unpinned), and
        its ``session_silent`` watch is cancelled."""
        now = self.clock.now()
        detail = f"session {s.session_id} ended"
        if c.tx.unpin_session(s.team, s.member, s.session_id, now, detail):
            c.wake(s.team, s.member)
        # nothing is pinned to it any more: its watch has nothing left to look for
        for job in c.tx.list_jobs(s.team, session_id=s.session_id, kind=SILENT_JOB):
            c.tx.finish_job(job.job_id, JobState.CANCELLED, now)

    @staticmethod
    def own(session: Session, member: str) -> None:
        if session.member != member:
            raise Forbidden(
                f"session {session.session_id!r} belongs to {session.member!r}, not {member!r}; "
                "report events for your own sessions"
            )

    def event(
        self,
        c: Ctx,
        session: Session,
        kind: EventKind,
        text: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> int:
        return c.tx.append_event(self._event_row(session, kind, text, data))

    def note(
        self,
        c: Ctx,
        session: Session,
        kind: EventKind,
        text: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """As :meth:`event`, for a caller that needs no event id (the store may send it
        with its next statement)."""
        c.tx.note_event(self._event_row(session, kind, text, data))

    def _event_row(
        self, session: Session, kind: EventKind, text: str, data: Mapping[str, Any] | None
    ) -> SessionEvent:
        return SessionEvent(
            session.team,
            session.session_id,
            session.turn,
            self.clock.now(),
            kind,
            text,
            dict(data or {}),
        )

    async def terminate_session(
        self, team: str, member: str, session_id: str, reason: str = ""
    ) -> Session:
        """End a session for good. Idempotent."""
        now = self.clock.now()

        def fn(c: Ctx) -> Session:
            c.wake(team, member)  # its session's inbox may be open to receivers now
            s = self.load(c, team, member, session_id)
            if s.state is SessionState.TERMINATED:
                return s
            return self.end(c, s, now, reason)

        return await self.env.transact(fn)

    def end(
        self,
        c: Ctx,
        s: Session,
        now: float,
        reason: str,
        *,
        link_reason: str = "session_terminated",
    ) -> Session:
        """Terminate ``s`` inside ``c``: its running turn is closed, then what waits for
        it, its timers and its links (closed for ``link_reason``) are settled."""
        tx = c.tx
        c.wake(s.team, s.member)
        tx.ledger_clear(s.team, s.session_id)
        done = dataclasses.replace(
            s, state=SessionState.TERMINATED, updated_at=now, turn_started_at=None
        )
        tx.put_session(done)
        if s.state is SessionState.ACTIVE:
            self.pipeline.turn_over(c, done, s.turn, now)
        self.event(c, done, EventKind.SESSION, f"terminated{': ' + reason if reason else ''}")
        self.pipeline.terminated(c, done, reason, link_reason=link_reason)
        return done

    def load(self, c: Ctx, team: str, member: str, session_id: str) -> Session:
        s = c.tx.get_session(team, session_id)
        if s is None:
            raise UnknownSession(
                f"unknown session {session_id!r} in team {team!r}; open it first",
                session=session_id,
            )
        self.own(s, member)
        return s

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
