"""What a runtime's hook call does to the hub, and what the agent is answered.

The hub is strict (an event needs an open turn, a session must exist); the hooks of real
runtimes are not so tidy, so this layer makes them fit:

* A session the hub does not know is opened by whichever event names it first (hooks
  attached mid-session, Codex ``notify``, a lost ``SessionStart``). ``SessionEnd`` for an
  unknown session changes nothing. ``SessionEnd`` of a known one means its process
  exited: the session is *exited*, keeping its links, timers and ledger for the team's
  exit grace, and any later event of the same runtime session id (a resume) makes it
  idle again. A runtime session that was terminated (the grace ran out, or an explicit
  terminate) and is then resumed continues as ``<id>.2`` (``.3``...).
* A tool event or a stop outside a turn opens one first (``turn_start``, marked
  ``opened_by``), so the closing text is still routed. A subagent's stop outside a turn
  opens none and is not recorded: it is the runtime's own agent (Claude Code's
  ``/compact`` summary), and the session stays idle at its prompt.
* ``SessionStart`` with source ``startup``/``resume`` on a session whose turn was running
  recovers it (the process died mid-turn), unless the turn's runtime process is another
  one that still runs (the conversation resumed in a second terminal): that turn is left
  to it, with its ledger; ``clear``/``compact`` leave the turn alone.
  A ``SessionStart`` (but ``compact``) exits the member's other sessions under the same
  runtime process: the process left them (``/clear``, Codex's ``/new``), whether or not
  a ``SessionEnd`` reached the hub, in the transaction that opens the new one (no
  reader sees both live).

Between-turn delivery: after ``agent_stop`` the session's waiting messages are leased,
framed (``[From x] ...``, hub notices, timer breadcrumbs; :mod:`backchannel.core.framing`)
and become the stop hook's "keep going" answer, and a ``turn_start`` is reported because
the runtime goes on with that input. The hub's own notices (link rules, unknown
destinations...) never start a turn by themselves: alone, they wait for the next turn
and ride along with it. When the runtime says its stop hook is already active, messages
the agent sent itself are held back, so a continuation can only be fed by others (peers
within their links' turn budgets, timers that fire once) and can never loop on its own.
``UserPromptSubmit``/``BeforeAgent`` hands waiting messages over as additional context of
the turn it opens.

Into the model exactly once: what a hook answer hands over stays *leased*; the
``turn_start`` it opens records the ids (session meta ``handed``), and the session's next
hook event settles them:

* a call from the command hook carries its record of what the session was shown
  (``HookEvent.had``, :mod:`.seen`, written only after the answer was printed): the ids
  it lists are acked, the others were never printed and are released: the session's
  next answer (this one, when it is a prompt of an idle session or a stop) hands them
  over again;
* a call without a record (an HTTP hook) settles by what the event is: the runtime went
  on with the answer when the next event is a tool call, a stop, or (prompt answers, and
  Gemini, which repeats ``BeforeAgent`` for a continuation) a prompt, or a compaction;
  any other ``SessionStart``, a ``SessionEnd``, or a new prompt after a stop answer shows
  the continuation never ran, and the ids are released.

An answer is settled once, by the first event after it, in one transaction with the
acks and releases: the record notes it (``settled``, the ids acked), so the rest of the
turn's events, the same session's events on another hub, and a hub restarted meanwhile
leave it as it is (an answer given back and then taken as had would lose its copies).

A session terminated between an answer and its next event (its exit grace ran out, an
explicit terminate) sends that event to ``<id>.N``: a continuation that has started no
turn settles the answer of the session it continues, by the same rules.

No event at all (the process died) leaves the copies leased: after the lease they are
queued again and the next answer hands them over, less those the command hook's record
(or a channel tag) shows the session already has, which are acked instead. A hook answer
adds no round trip: settling rides on the next call.

Anything wrong (malformed payload, missing fields, someone else's session, a hub error)
leaves the agent untouched: the answer is ``{}`` and the reason is logged and returned.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backchannel.core import framing
from backchannel.core.messages import check_session_id
from backchannel.core.turns import stop_print
from backchannel.errors import BackchannelError, Forbidden, InvalidState, UnknownSession
from backchannel.hub import Hub
from backchannel.hub.sessions import RUNTIME_META
from backchannel.hub.turns import CONTINUED, HANDED, LAST_STOP, SETTLED
from backchannel.runtimes import get_runtime, liveness
from backchannel.runtimes.common import (
    HookEvent,
    HookInputError,
    HookKind,
    Outcome,
    format_message,
)
from backchannel.types import InboxMessage, Member, MessageKind, Session, SessionState

__all__ = ["HookResult", "handle_hook"]

log = logging.getLogger("backchannel.hooks")

#: Most messages handed over in one hook answer (the rest wait for the next one).
MAX_DELIVERY = 20
#: The most UTF-8 bytes of messages one hook answer hands over (whole messages, the
#: first whatever its length; the rest wait for the next answer). A runtime keeps a
#: longer hook text from its model: Claude Code (2.1) saves an ``additionalContext`` or a
#: ``Stop`` ``reason`` past 10,000 UTF-16 code units to a file and shows a 2 KB preview,
#: and Codex cuts the middle out of one past its limit; UTF-8 bytes are never fewer than
#: code units, and the rest of the 10,000 is room for the heading and the notes.
HOOK_BYTES = 9_000
#: A message longer than that is handed over as its start, this long at most, with the
#: MCP tool call that reads the rest (``read_message`` from the first character not
#: shown, its ``start``; the attach sets the tool up).
HOOK_START_BYTES = 6_000
#: Runtimes that HTML-escape the hook context they show the model.
ESCAPES_CONTEXT = frozenset({"gemini"})
#: How many times one runtime session may be resumed after it was terminated.
MAX_RESUMES = 50
#: For a stop that names no turn (Claude Code's through a plain HTTP hook): how long
#: after a turn's end the same closing text reported again on the idle session, shown the
#: same, is that ``Stop`` again (two hook processes, a retried call), not a turn of its
#: own. The command hook gives up on the hub after 10 s and a session's hook processes
#: take turns on its lock, so a repeat comes within seconds.
REPEAT_STOP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class HookResult:
    answer: dict[str, Any]
    problem: str | None = None  # why the call had no effect, when it had none
    session: str | None = None
    delivered: tuple[str, ...] = ()


async def handle_hook(hub: Hub, member: Member, runtime: str, payload: Any) -> HookResult:
    """Apply one hook call for ``member``; never raises."""
    try:
        event = get_runtime(runtime).parse(payload)
    except HookInputError as exc:
        return _ignored(member, runtime, str(exc))
    except BackchannelError as exc:
        return _ignored(member, runtime, exc.message)
    except Exception as exc:  # a payload shape no parser expected
        return _ignored(member, runtime, f"unusable payload: {type(exc).__name__}: {exc}")
    try:
        outcome, session, delivered = await _apply(hub, member, event)
    except BackchannelError as exc:
        return _ignored(member, runtime, f"{event.name}: {exc.message}", event.session_id)
    except Exception as exc:  # a broken hook must never block the agent
        log.exception("hook %s %s for %s/%s failed", runtime, event.name, member.team, member.name)
        return _ignored(member, runtime, f"{event.name}: internal error: {exc}", event.session_id)
    answer = get_runtime(runtime).render(event, outcome)
    return HookResult(answer, None, session, delivered)


def _ignored(member: Member, runtime: str, reason: str, session: str | None = None) -> HookResult:
    log.warning(
        "hook %s from %s/%s (session %s) had no effect: %s",
        runtime,
        member.team,
        member.name,
        _one_line(session or "-"),
        _one_line(reason),
    )
    return HookResult({}, reason, session)


def _one_line(text: str) -> str:
    """``text`` for a log line: a payload's line ends and control characters escaped,
    so a member cannot write log lines of its own."""
    return text if text.isprintable() else repr(text)[1:-1]


def intro(member: Member, *, inline: bool = True) -> str:
    """Who the agent is and how to reach teammates. ``inline=False`` leaves out the
    closing-text ``message`` block, written with angle brackets, for a runtime that
    HTML-escapes hook context (Gemini CLI): the tools alone say it there."""
    how = ' or end your reply with <message to="name">...</message>' if inline else ""
    return (
        f"backchannel: you are '{member.name}' in team '{member.team}'. Teammates' messages "
        "reach you between turns, framed [From name]. Reach them with the backchannel tools "
        f"(send_message, check_inbox, list_members, set_timer){how}. " + framing.READING
    )


async def _apply(hub: Hub, m: Member, ev: HookEvent) -> tuple[Outcome, str | None, tuple[str, ...]]:
    if ev.kind is HookKind.SESSION_END:
        ended = await _find(hub, m, ev.session_id, create=False)
        if ended is None:
            raise UnknownSession(f"no open session {ev.session_id!r} to end", session=ev.session_id)
        reason = f"{ev.runtime} {ev.name}" + (f" ({ev.detail})" if ev.detail else "")
        await _settle(hub, m, ended, ev)
        # the process left; the session keeps its links for a resume (the exit grace)
        await hub.exit_session(m.team, m.name, ended.session_id, reason)
        return Outcome(), ended.session_id, ()
    if ev.kind is HookKind.SESSION_START:
        recover = ev.detail in ("", "startup", "resume")
        running = await _running_elsewhere(hub, m, ev) if recover else None
        if running is not None:
            # the same conversation opened in a second process while the first still
            # runs its turn: that turn is not a crashed one, and what the first was
            # handed is not this process's to settle
            await hub.note_runtime(
                m.team,
                m.name,
                running.session_id,
                str(running.meta.get(RUNTIME_META)),
                note=f"{ev.runtime} {ev.name} ({ev.detail or 'startup'}) in another process "
                f"while turn {running.turn} runs: the turn is left to its process",
            )
            context = intro(m, inline=ev.runtime not in ESCAPES_CONTEXT)
            return Outcome(context=context), running.session_id, ()
        started = await _start(hub, m, ev, recover=recover)
        await _settle(hub, m, started, ev)
        if started.state is SessionState.IDLE and LAST_STOP in started.meta:
            # a process (re)started, or its context was rebuilt: a stop after this is a
            # turn of its own, never the last one's reported again
            await hub.forget_stop(m.team, m.name, started.session_id)
        context = intro(m, inline=ev.runtime not in ESCAPES_CONTEXT)
        return Outcome(context=context), started.session_id, ()

    s = await _live(hub, m, ev.session_id)
    sid = s.session_id
    await _runs_under(hub, m, s, ev)
    if ev.seen:  # channel pushes the session shows: delivered, and never handed over again
        await hub.ack(m.team, m.name, list(ev.seen))
    had = await _settle(hub, m, s, ev) | frozenset(ev.seen)
    continued = s.meta.get(CONTINUED) if s.state is SessionState.ACTIVE else None
    if ev.kind is HookKind.PROMPT and continued is not None and ev.runtime == "gemini":
        # Gemini fires BeforeAgent again for the input an AfterAgent `deny` gave it:
        # the continuation is already this turn, not another one
        return Outcome(), sid, ()
    if ev.kind is HookKind.PROMPT:
        got = await _take(hub, m, sid, had) if s.state is SessionState.IDLE else []
        try:
            opened = {"hook": ev.name, **_handed(got, "prompt")}
            await _event(hub, m, sid, "turn_start", ev.text, opened)
        except BaseException:
            await _release(hub, m, got)
            raise
        if not got:
            return Outcome(), sid, ()
        text = _format(got, "arrived for you while you were away")
        return Outcome(context=text), sid, _ids(got)

    mark = _stop_mark(ev) if ev.kind is HookKind.STOP else None
    if mark is not None and _repeated_stop(hub, s, mark):
        return Outcome(), sid, ()  # routed once already; its answer was given then
    if ev.kind is HookKind.SUBAGENT_STOP and s.state is not SessionState.ACTIVE:
        # a subagent ending between turns is the runtime's own (Claude Code's summary
        # agent for /compact), not the member's work: opening a turn for it would leave
        # the session active at its prompt, so the next prompt (and a channel push)
        # would not bring the messages waiting for it
        return Outcome(), sid, ()
    if s.state is not SessionState.ACTIVE:
        opening = str(ev.extra.get("input") or "")
        await _event(hub, m, sid, "turn_start", opening, {"opened_by": ev.name})
    data: dict[str, Any] = {"hook": ev.name}
    if ev.tool:
        data["tool"] = ev.tool
    if ev.tool_id:
        data["id"] = ev.tool_id
    if ev.kind is HookKind.TOOL_CALL:
        await _event(hub, m, sid, "tool_call", ev.text, data)
        return Outcome(), sid, ()
    if ev.kind is HookKind.TOOL_RESULT:
        await _event(hub, m, sid, "tool_result", ev.text, data)
        return Outcome(), sid, ()
    if ev.kind is HookKind.SUBAGENT_STOP:
        await _event(hub, m, sid, "agent_output", ev.text, {**data, **ev.extra})
        return Outcome(), sid, ()

    # the turn's end: route the closing text, then hand over what waits
    closing = ev.text
    if isinstance(continued, str) and continued and closing.startswith(continued):
        # Gemini's AfterAgent after a continuation reports the text before it too:
        # only what the continuation added is this turn's (the rest was routed already)
        closing = closing[len(continued) :].lstrip()
    await _event(hub, m, sid, "agent_stop", closing, {**data, LAST_STOP: mark})
    if not ev.answerable:
        return Outcome(), sid, ()
    # a continuation never feeds itself: the agent's own messages are held back
    own = m.name if ev.stop_hook_active else None
    got = await _take(hub, m, sid, had, own)
    if not any(g.message.kind is not MessageKind.SYSTEM for g in got):
        await _release(hub, m, got)  # notices alone wait for the next turn
        return Outcome(), sid, ()
    text = _format(got, "arrived for you")
    try:
        continued_data = {
            "continued_by": ev.name,
            "messages": list(_ids(got)),
            "continued_after": ev.text,
            **_handed(got, "stop"),
        }
        await _event(hub, m, sid, "turn_start", text, continued_data)
    except BaseException:
        await _release(hub, m, got)
        raise
    return Outcome(continue_with=text), sid, _ids(got)


async def _runs_under(hub: Hub, m: Member, s: Session, ev: HookEvent) -> None:
    """Note the runtime process the command hook ran under on the session, when it
    says and it changed: that process's MCP server keeps the session alive while the
    runtime runs (:mod:`backchannel.runtimes.liveness`)."""
    if ev.runtime_key is not None and s.meta.get(RUNTIME_META) != ev.runtime_key:
        await hub.note_runtime(m.team, m.name, s.session_id, ev.runtime_key)


async def _running_elsewhere(hub: Hub, m: Member, ev: HookEvent) -> Session | None:
    """The session of ``ev``'s ``SessionStart``, when its turn runs in another runtime
    process that is still running (``claude --resume`` of a conversation open in another
    terminal): the session's runtime key names a process other than the hook's, and that
    process is seen running on this machine (:func:`liveness.running`). ``None`` when the
    turn's process is this one, is gone, or cannot be seen (another machine): then the
    turn was interrupted, and is recovered."""
    if ev.runtime_key is None:
        return None
    s = await _find(hub, m, ev.session_id, create=False)
    if s is None or s.state is not SessionState.ACTIVE:
        return None
    key = s.meta.get(RUNTIME_META)
    if not isinstance(key, str) or key == ev.runtime_key or not liveness.running(key):
        return None
    return s


async def _start(hub: Hub, m: Member, ev: HookEvent, *, recover: bool) -> Session:
    """The session a ``SessionStart`` starts, opened (or resumed, or recovered) in one
    transaction with the exit of the sessions its runtime process left: ``SessionStart``
    in a runtime process that ran others means the process moved to another
    conversation (Claude Code's ``/clear``, source ``clear``, and ``/resume``; Codex's
    ``/new``, source ``startup`` and no ``SessionEnd`` at all), so the member's other
    sessions that ran under it (the command hook says which process it ran under) were
    left, whether or not their ``SessionEnd`` reached the hub: they exit, as that
    ``SessionEnd`` would have made them. Without it the process's MCP server beats on
    for them (:mod:`.liveness`), and what was pinned to one (a link's crossing, a timer)
    waited as long as the process ran, shown to no model and never a dead letter. One
    transaction, so no reader sees both conversations of the process live: a send to
    ``"session": "auto"``, the runner, a timer or the beats would otherwise pick the one
    being left. Compaction keeps the conversation and leaves nothing. Exiting is
    idempotent, and a later event of such a session resumes it."""
    sid, _ = await _target(hub, m, ev.session_id)
    leaving = None
    if ev.detail != "compact":
        how = ev.detail or "startup"
        leaving = f"{ev.runtime} {ev.name} ({how}) of {sid}: the process left it"
    started, _ = await hub.start_session(
        m.team, m.name, sid, recover=recover, runtime=ev.runtime_key, leaving=leaving
    )
    return started


def _stop_mark(ev: HookEvent) -> dict[str, str]:
    """What tells this stop from another (kept as the session's ``last_stop``): the
    runtime's id of it where it gives one, and of the prompt its turn ran on; always the
    print of the closing text, and of what the session shows it was given (Claude Code's
    channel pushes in its transcript: a turn an idle session ran on a new push shows one
    more)."""
    mark = {"print": stop_print(ev.text)}
    if ev.stop_id:
        mark["id"] = ev.stop_id
    if ev.prompt_id:
        mark["prompt"] = ev.prompt_id
    if ev.seen:
        mark["seen"] = stop_print("\n".join(sorted(set(ev.seen))))
    return mark


def _repeated_stop(hub: Hub, s: Session, mark: Mapping[str, str]) -> bool:
    """Whether a stop on ``s`` is the one that ended its last turn, reported again: the
    session is idle since then (any event opens a turn, and a turn's start drops the
    mark, and so does a session start), and the stop is the same. Where both carry the
    runtime's id, the id alone says so, however late; stops of two prompts are two
    turns; else the closing text and what the session was shown must be the same,
    within :data:`REPEAT_STOP_SECONDS`. Routed as a turn of its own, a repeat's output
    would cross its links and its blocks go out a second time; taken for a repeat, a
    turn's would be lost."""
    last = s.meta.get(LAST_STOP)
    if isinstance(last, str):  # an older hub kept the print alone
        last = {"print": last}
    if s.state is not SessionState.IDLE or not isinstance(last, Mapping):
        return False
    if mark.get("id") and last.get("id"):
        return bool(mark["id"] == last["id"])
    if mark.get("prompt") and last.get("prompt") and mark["prompt"] != last["prompt"]:
        return False
    if last.get("print") != mark["print"] or last.get("seen") != mark.get("seen"):
        return False
    return s.last_stop_at is not None and hub.clock.now() - s.last_stop_at < REPEAT_STOP_SECONDS


async def _event(
    hub: Hub, m: Member, sid: str, kind: str, text: str, data: dict[str, Any]
) -> dict[str, Any]:
    if kind != "agent_stop":  # only the closing text is routed; the rest is a record
        limit = hub.config.max_text // 4
        if len(text.encode("utf-8")) > limit:
            text = text.encode("utf-8")[:limit].decode("utf-8", "ignore") + " […cut]"
    return await hub.report_event(m.team, m.name, sid, kind, text, data)


async def _live(hub: Hub, m: Member, runtime_sid: str, *, recover: bool = False) -> Session:
    found = await _find(hub, m, runtime_sid, create=True, recover=recover)
    assert found is not None
    return found


async def _find(
    hub: Hub, m: Member, runtime_sid: str, *, create: bool, recover: bool = False
) -> Session | None:
    """The hub session that carries runtime session ``runtime_sid`` now: the id itself,
    or ``<id>.N`` after it was terminated and resumed. Opened when ``create``."""
    sid, s = await _target(hub, m, runtime_sid)
    if s is None:
        return await hub.open_session(m.team, m.name, sid) if create else None
    resumed = create and s.state is SessionState.EXITED
    if resumed or (recover and s.state is SessionState.ACTIVE):
        s = await hub.open_session(m.team, m.name, sid)
    return s


async def _target(hub: Hub, m: Member, runtime_sid: str) -> tuple[str, Session | None]:
    """The hub session id that carries runtime session ``runtime_sid`` now: the id
    itself, or ``<id>.N`` after it was terminated and resumed (the first one unknown or
    not terminated), and that session, ``None`` when the hub does not know it yet."""
    base = check_session_id(runtime_sid)
    for n in range(1, MAX_RESUMES + 1):
        sid = check_session_id(base if n == 1 else f"{base}.{n}")
        try:
            s = await hub.get_session(m.team, sid)
        except UnknownSession:
            return sid, None
        if s.member != m.name:
            raise Forbidden(
                f"session {sid!r} belongs to {s.member!r}, not {m.name!r}; "
                "each agent needs its own member token"
            )
        if s.state is not SessionState.TERMINATED:
            return sid, s
    raise InvalidState(f"session {runtime_sid!r} was resumed too often; start a new one")


async def _lease(
    hub: Hub, m: Member, sid: str, had: frozenset[str], limit: int
) -> tuple[list[InboxMessage], int]:
    """Up to ``limit`` of the session's waiting messages, less copies it shows it already
    has (``had``: a channel push or a hook answer whose lease ran out before its ack):
    those are acked, not shown again; and how many were leased. What is returned stays
    leased until the next event settles it."""
    got = await hub.receive(m.team, m.name, session=sid, limit=limit, wait=0)
    shown = [g.message.message_id for g in got if g.message.message_id in had]
    if shown:
        await hub.ack(m.team, m.name, shown)
    return [g for g in got if g.message.message_id not in had], len(got)


def _shown(g: InboxMessage) -> str:
    """One message as a hook answer shows it: whole, or (longer than
    :data:`HOOK_START_BYTES`) its start and the call that reads the rest."""
    msg = g.message
    if framing.size(msg.text) <= HOOK_START_BYTES:
        return format_message(msg.sender, msg.kind.value, msg.text)
    start = framing.parts(msg.text, HOOK_START_BYTES)[0]
    # the rest from the first character not shown: a model that follows the note (and
    # each next one) reads every character once, none of the start again
    return (
        f"{format_message(msg.sender, msg.kind.value, start)}\n"
        f"[backchannel: this message (message_id {msg.message_id}) is longer than one hook "
        f"answer and only its start is above: call the backchannel tool read_message with "
        f"message_id={msg.message_id!r} and start={len(start)} to read the rest (its answer "
        f"names the call for the next part, if any).]"
    )


async def _take(
    hub: Hub, m: Member, sid: str, had: frozenset[str], own: str | None = None
) -> list[InboxMessage]:
    """The session's waiting messages one hook answer hands over (see :func:`_lease`):
    whole ones while they fit in :data:`HOOK_BYTES` (the first whatever its length, as
    :func:`_shown` shows it), less those from ``own``; the rest are released. Leased
    about as many as the room left holds (one first, then by the length of those taken
    so far), so that a message is not leased and given back at every answer: each lease
    spends one of its attempts."""
    kept: list[InboxMessage] = []
    back: list[InboxMessage] = []
    used = 0
    try:
        while len(kept) < MAX_DELIVERY:
            room = (HOOK_BYTES - used) * len(kept) // used if kept else 1
            limit = max(1, min(room, MAX_DELIVERY - len(kept)))
            step, leased = await _lease(hub, m, sid, had, limit)
            for i, g in enumerate(step):
                if own is not None and g.message.sender == own:
                    back.append(g)
                    continue
                size = framing.size(_shown(g)) + 2
                if kept and used + size > HOOK_BYTES:
                    back.extend(step[i:])
                    return kept
                kept.append(g)
                used += size
            if leased < limit:
                return kept
        return kept
    except BaseException:
        back.extend(kept)
        raise
    finally:
        await _release(hub, m, back)


async def _release(hub: Hub, m: Member, got: Sequence[InboxMessage]) -> None:
    if got:
        await hub.release(m.team, m.name, [g.message.message_id for g in got])


def _ids(got: Sequence[InboxMessage]) -> tuple[str, ...]:
    return tuple(g.message.message_id for g in got)


def _handed(got: Sequence[InboxMessage], at: str) -> dict[str, Any]:
    """``turn_start`` data that records a hand-out in the session (see the docstring)."""
    return {HANDED: {"ids": list(_ids(got)), "at": at}} if got else {}


def _took_it(ev: HookEvent, at: str, s: Session) -> bool:
    """Whether ``ev``, the first event after a hook answer made at ``at`` (``stop`` or
    ``prompt``), shows the runtime went on with that answer (no record to go by)."""
    if ev.kind is HookKind.SESSION_START:  # a compaction comes after the model had it
        return ev.detail == "compact"
    if ev.kind is HookKind.SESSION_END:
        return False
    if ev.kind is HookKind.PROMPT:  # Gemini repeats BeforeAgent for a continuation
        gemini_repeat = ev.runtime == "gemini" and s.state is SessionState.ACTIVE
        return at == "prompt" or gemini_repeat
    return True


async def _last_handed(hub: Hub, m: Member, s: Session) -> tuple[Session, Any]:
    """The session whose last hook answer is the one to settle, and its record of what
    that answer handed over. A continuation ``<id>.N`` that has started no turn yet
    settles the answer of the session it continues: a runtime whose session was
    terminated between a hook answer and its next event (the exit grace ran out, an
    explicit terminate) brings that event to ``<id>.N``, and it is the one that shows
    whether the runtime went on with the answer."""
    record = s.meta.get(HANDED)
    if record is not None or s.turn != 0:
        return s, record
    base, dot, n = s.session_id.rpartition(".")
    if not dot or not n.isdigit() or not 2 <= int(n) <= MAX_RESUMES:
        return s, None
    try:
        before = await hub.get_session(m.team, base if n == "2" else f"{base}.{int(n) - 1}")
    except UnknownSession:
        return s, None
    if before.member != m.name or before.state is not SessionState.TERMINATED:
        return s, None  # a runtime session id that merely ends in ".N"
    return before, before.meta.get(HANDED)


async def _settle(hub: Hub, m: Member, s: Session, ev: HookEvent) -> frozenset[str]:
    """Ack what the session's last hook answer handed over once ``ev`` shows the runtime
    has it, release the rest (module docstring); returns the ids the session has."""
    had = frozenset(ev.had or ())
    by, record = await _last_handed(hub, m, s)
    if not isinstance(record, Mapping) or not isinstance(record.get("ids"), list):
        return had
    ids = tuple(i for i in record["ids"] if isinstance(i, str))
    settled = record.get(SETTLED)
    if isinstance(settled, list):  # by an earlier event (of any hub, before any restart)
        return had | frozenset(i for i in settled if isinstance(i, str))
    if ev.had is not None:
        taken = [i for i in ids if i in had]
    else:
        taken = list(ids) if _took_it(ev, str(record.get("at")), s) else []
    rest = [i for i in ids if i not in taken]
    if rest:
        log.info(
            "%s %s of %s/%s does not show %d handed-over message(s); they go out again",
            ev.runtime,
            ev.name,
            m.team,
            s.session_id,
            len(rest),
        )
    return had | await hub.settle_handed(m.team, m.name, by.session_id, by.turn, ids, taken)


def _format(got: Sequence[InboxMessage], what: str) -> str:
    n = len(got)
    heading = (
        f"backchannel: {n} message{'s' if n != 1 else ''} {what}. Act or reply only if "
        "they need you; silence is valid."
    )
    return f"{heading}\n\n" + "\n\n".join(map(_shown, got))
