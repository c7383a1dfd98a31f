"""The MCP server: the agent tools, on stdio (``backchannel mcp``) and over streamable
HTTP (``/mcp`` on ``backchannel serve``, see :mod:`.agents_http`).

Each tool is one row of :data:`TOOLS`: a name, a description an LLM can follow, a
pydantic model for its arguments (which is also its JSON input schema) and a coroutine
that runs it for an :class:`Agent`. Nothing a caller sends can crash the server: bad
arguments and hub errors come back as tool errors (``isError``) that name the argument
and say what to do.

Tools act for the member whose token the server holds, and for its session: the one
named (``BACKCHANNEL_SESSION`` on stdio, the ``Backchannel-Session`` header over HTTP),
or else the member's one session whose turn is open, which is how the hub attributes a
tool's send to the turn that made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import os
import time
import typing
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

import mcp.types as mt
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backchannel import __version__
from backchannel.client import Client
from backchannel.core import framing
from backchannel.core.ids import new_message_id
from backchannel.core.timers import DEFAULT_ANCHOR_MINUTES
from backchannel.core.timers import MAX_SECONDS as MAX_TIMER_SECONDS
from backchannel.core.timers import MIN_SECONDS as MIN_TIMER_SECONDS
from backchannel.errors import (
    BackchannelError,
    InvalidRequest,
    InvalidState,
    ServiceError,
    UnknownSession,
)
from backchannel.hub.sessions import ALIVE_STEP_S, MIN_BEAT_S
from backchannel.interfaces.mcp_channel import CAPABILITY, ChannelPusher, notification
from backchannel.interfaces.strict import REFUSED, parse_json
from backchannel.models import MAX_INT, Received, SessionInfo
from backchannel.runtimes import liveness
from backchannel.runtimes.common import format_message
from backchannel.types import MESSAGE_ID_PATTERN, NAME_PATTERN

__all__ = ["TOOLS", "Agent", "Tool", "build_server", "serve_stdio", "whoami", "wire_snapshot"]

log = logging.getLogger("backchannel.mcp")


#: The client that takes channel pushes (``clientInfo.name`` of its ``initialize``).
CHANNEL_CLIENT = "claude-code"
#: After the handshake, how long before the first push (Claude Code sets up
#: its channel listener right after connecting; a push it missed is released anyway).
CHANNEL_SETTLE_S = 0.5
#: The most timers one ``list_timers`` answer shows the model (fewer when their notes
#: take more room than :data:`ANSWER_BYTES`; the rest a page at a time, ``after`` the
#: last one shown): a team's members may each hold a hundred, and the tool's answer goes
#: into the model's context whole.
LIST_TIMERS_SHOWN = 50
#: The most messages one ``check_inbox`` reads from each place it looks (the caller's
#: session, then its member inbox): the answer goes into the model's context whole.
CHECK_INBOX_BATCH = 50
#: The most UTF-8 bytes one tool's answer takes as a client shows it to the model, for
#: every tool (``check_inbox`` counts its text and its structured content together,
#: whole messages, the first whatever its length; the others their structured content
#: as compact JSON, see :func:`answer_size`): a client cuts or refuses a longer tool
#: answer, and what ``check_inbox``'s answer carries is acked. Codex keeps 10,000 bytes
#: of a tool's answer, its start and its end, and puts a marker in place of the middle
#: (Claude Code refuses one past 25,000 tokens), and both show the model the structured
#: content beside the text: every byte counts. Counted in bytes, not characters: CJK
#: text and emoji take three or four bytes a character. An answer longer than this is
#: cut by the tool itself, and says with which call to read the rest.
ANSWER_BYTES = 9_000
#: The most UTF-8 bytes of one message's text a tool answer carries: a message longer
#: than that is read in parts (``check_inbox`` answers its first, ``read_message`` each
#: next), cut at a line's end where one is near, so no client cuts its middle unseen. The
#: rest of :data:`ANSWER_BYTES` is room for its frame, the note naming the next and
#: the structured content.
PART_BYTES = 7_000

INSTRUCTIONS = (
    "backchannel connects you with your teammates (other agents and the user). "
    "send_message reaches a teammate; their finished turns and messages reach you between "
    "your turns, framed [From name]. check_inbox reads what waits now. Contribute before "
    "acknowledging, never restate a peer, ask only what blocks you; silence is valid. "
    + framing.READING
)


#: How long after a ``send_message`` or ``delegate`` call ended unanswered (the client
#: cancelled it, a timeout's ``notifications/cancelled``, or the hub's answer was lost)
#: the same call made again is made under the first one's id: a model told its call
#: failed or timed out calls again, often a minute or more later (Codex gives a tool
#: call 60 s, Gemini CLI 10 minutes, Claude Code ``MCP_TOOL_TIMEOUT``).
UNANSWERED_S = 600.0
#: The most unanswered calls a server keeps (the oldest go first).
UNANSWERED_MAX = 1000
#: How long what a stdio ``check_inbox`` answered with waits before it is acked: a
#: client that cancelled the call as its answer went out (Esc, a tool timeout; its
#: ``notifications/cancelled`` crossed the answer) drops that answer, unread, and the
#: messages are given back instead. A cancel crosses within the pipe's round trip.
CROSSED_S = 2.0


class Unanswered:
    """The ``send_message`` and ``delegate`` calls of one MCP server whose answer did not
    reach the client, by what they asked for: the id each was made under, and its hub
    call (which runs on when the tool call is cancelled, so that it is done or refused
    whole, never cut halfway).

    The same call made again within :data:`UNANSWERED_S` is made under that id, once
    the earlier hub call has ended: the hub stores a message (starts a delegation) once
    under its id, so a first call that did reach the hub is answered ``replayed`` and
    one that did not is made now. Nothing is dropped that was not sent: an id reused
    for a message the hub never stored stores it. See docs/decisions.md, "An MCP send
    made again after its call went unanswered"."""

    def __init__(self) -> None:
        self._calls: dict[tuple[Any, ...], tuple[str, asyncio.Future[Any], float]] = {}
        #: each recent call by its JSON-RPC request (team, member, session, request id):
        #: its key, id and hub call, for a ``notifications/cancelled`` that names it
        #: after it was answered (the client timed out as the answer went), or that
        #: reaches another request than the call's (stateless ``/mcp``)
        self._made: dict[tuple[Any, ...], tuple[tuple[Any, ...], str, asyncio.Future[Any], float]]
        self._made = {}
        #: the ``check_inbox`` calls whose answer went out and is not acked yet, by
        #: request: set when the client cancels one (see :data:`CROSSED_S`)
        self.crossed: dict[tuple[Any, ...], asyncio.Event] = {}
        #: set when the client can cancel nothing more (its stdin closed): those are
        #: acked at once
        self.closed = asyncio.Event()

    def made(
        self, request: tuple[Any, ...], key: tuple[Any, ...], ident: str, call: asyncio.Future[Any]
    ) -> None:
        while len(self._made) >= UNANSWERED_MAX:
            del self._made[next(iter(self._made))]
        self._made.pop(request, None)  # a request id used again: the newest call is last
        self._made[request] = (key, ident, call, time.monotonic() + UNANSWERED_S)

    def cancelled(self, request: tuple[Any, ...]) -> None:
        """The client cancelled ``request``: if it is a recent call, it went unanswered
        (a client's request ids start again in each connection: an old one is not it)."""
        found = self._made.pop(request, None)
        if found is not None and found[3] >= time.monotonic():
            self.keep(*found[:3])
        if (answered := self.crossed.pop(request, None)) is not None:
            answered.set()

    def take(self, key: tuple[Any, ...]) -> tuple[str, asyncio.Future[Any]] | None:
        """The id and hub call of the unanswered call ``key``, if one is recent."""
        found = self._calls.pop(key, None)
        if found is None or found[2] < time.monotonic():
            return None
        return found[0], found[1]

    def keep(self, key: tuple[Any, ...], ident: str, call: asyncio.Future[Any]) -> None:
        now = time.monotonic()
        for old in [k for k, v in self._calls.items() if v[2] < now]:
            del self._calls[old]
        while len(self._calls) >= UNANSWERED_MAX:
            del self._calls[next(iter(self._calls))]
        self._calls[key] = (ident, call, now + UNANSWERED_S)


@dataclass(frozen=True, slots=True)
class Agent:
    """Who the tools act for."""

    client: Client
    team: str
    name: str
    session: str | None = None  # the session named explicitly, if any
    #: the server's calls that went unanswered (:func:`build_server` sets its own)
    unanswered: Unanswered = field(default_factory=Unanswered, compare=False)
    #: the JSON-RPC id of the tool call it acts in (:func:`build_server` sets it)
    request: Any = None


# -- arguments --------------------------------------------------------------------------


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _NoArgs(_Args):
    pass


Name = Annotated[str, Field(min_length=1, max_length=200)]
CallId = Annotated[str, Field(pattern=MESSAGE_ID_PATTERN)]


class SendArgs(_Args):
    to: Name = Field(description="The teammate's member name (see list_members), or '*' for all.")
    message: str = Field(min_length=1, description="What to tell them, self-contained.")
    summary: str | None = Field(
        None, max_length=200, description="Optional one-line summary shown in listings."
    )
    close_link: bool = Field(
        False,
        description="Deliver this message, then close the conversation link you opened "
        "with them (only the member who opened a link may close it).",
    )
    id: CallId | None = Field(
        None,
        description="Optional message id (1-128 letters, digits, '_', '-', '.', ':'). When a "
        "send_message call failed or timed out, call again with the same arguments and "
        "the id its error names (or the one you gave): a message is delivered once under "
        "its id, so a send that did arrive is not sent twice.",
    )


class SessionDataArgs(_Args):
    session: Name = Field(
        description="A session id, or a teammate's member name for their latest session."
    )
    since: int = Field(
        0, ge=0, le=MAX_INT, description="Only events after this event id (to page on)."
    )
    tail_chars: int | None = Field(
        None, ge=1, le=1_000_000, description="Only the last this-many characters of text."
    )
    start: int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Where to begin in the text of the first event after since, in "
        "characters: an event longer than one answer is read in parts, and each answer "
        "names the start= of the next. 0 (the default) is its beginning.",
    )


class TimerArgs(_Args):
    intent: Literal["anchor", "check", "wait"] = Field(
        description="anchor: bring you back to your own task; check: look at a peer's state "
        "(needs target); wait: tell you whether a peer replied (needs target)."
    )
    # the hub's range, as HTTP takes it (1 second to 30 days)
    minutes: float = Field(
        DEFAULT_ANCHOR_MINUTES,
        ge=MIN_TIMER_SECONDS / 60,
        le=MAX_TIMER_SECONDS / 60,
        description=f"Due in this many minutes ({DEFAULT_ANCHOR_MINUTES} if not given; "
        f"up to {MAX_TIMER_SECONDS // 86_400} days).",
    )
    note: str = Field(
        min_length=1, max_length=2000, description="The breadcrumb you will read when it fires."
    )
    target: str | None = Field(None, description="The peer's member name, for check and wait.")


#: The most members one list_members answer names (fewer when they take more room than
#: :data:`ANSWER_BYTES`); it says how to read the next page.
LIST_MEMBERS_SHOWN = 50


class ListMembersArgs(_Args):
    after: Annotated[str, Field(pattern=NAME_PATTERN)] | None = Field(
        None,
        description="Only members named after this one: the name a previous answer said "
        "to go on after (none: from the first).",
    )


class ListTimersArgs(_Args):
    after: int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Only timers set after this timer id: the one a previous answer "
        "said to go on after (0: from the first).",
    )
    member: Name | None = Field(None, description="Only this member's timers (yours: your name).")


class CancelTimerArgs(_Args):
    id: int = Field(ge=1, le=MAX_INT, description="The timer id that set_timer returned.")


class ReadTimerArgs(_Args):
    id: int = Field(
        ge=1, le=MAX_INT, description="The timer id (set_timer's, or one list_timers showed)."
    )
    start: int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Where to begin, in characters of the note: the start= an answer that "
        "could not show all of it names. 0 (the default) is the beginning.",
    )


class ReactionArgs(_Args):
    message_id: Name = Field(description="The id of a message you sent or received.")
    emoji: str = Field(min_length=1, max_length=32, description="One emoji, e.g. 👍.")


class DelegateArgs(_Args):
    to: Name = Field(description="The teammate's member name.")
    task: str = Field(min_length=1, description="The task, self-contained: they see only this.")
    timeout_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="Give up after this many seconds (a late answer still arrives).",
    )
    id: CallId | None = Field(
        None,
        description="Optional id of this delegation (1-128 letters, digits, '_', '-', '.', "
        "':'). When a delegate call failed or timed out, call again with the same arguments "
        "and the id its error names (or the one you gave): a delegation is started once "
        "under its id, so the teammate does not do the task twice.",
    )


# -- the tools ---------------------------------------------------------------------------

Output = tuple[str, Any]


class Unsure(ServiceError):
    """A ``send_message`` or ``delegate`` whose hub call failed on the way (unreachable,
    or its answer lost): it may have been made. Names the id to call again with."""


async def _once(
    a: Agent, key: tuple[Any, ...], given: str | None, fresh: str, call: Callable[[str], Any]
) -> tuple[Any, bool]:
    """Make the hub call ``call(ident)`` of a tool call that must happen once, and return
    its answer, and whether ``ident`` is an earlier call's (a replay then is that call's;
    under ``fresh`` it is only the client's own retry, which the model never saw). ``ident`` is the id of the same call made earlier and left
    unanswered (see :class:`Unanswered`), else ``given`` (the model's), else ``fresh``.
    The hub call runs in a task of its own: a tool call cancelled meanwhile leaves it to
    finish, and is kept, as is one whose hub call failed on the way, for the same call
    made again."""
    key = (a.team, a.name, a.session, *key)
    earlier = a.unanswered.take(key)
    ident = earlier[0] if earlier else given or fresh
    if earlier is not None and not earlier[1].done():
        # the earlier try is still on its way to the hub: made alongside, the two
        # could race for one id; this call is made once it has ended
        try:
            await asyncio.wait({earlier[1]})
        except asyncio.CancelledError:
            a.unanswered.keep(key, ident, earlier[1])
            raise
    hub = asyncio.ensure_future(call(ident))
    _SETTLING.add(hub)
    hub.add_done_callback(_SETTLING.discard)
    if a.request is not None:
        a.unanswered.made((a.team, a.name, a.session, a.request), key, ident, hub)
    try:
        return await asyncio.shield(hub), ident != fresh
    except asyncio.CancelledError:  # the client gave up on the call: it may be made again
        a.unanswered.keep(key, ident, hub)
        raise
    except ServiceError as exc:  # the hub may have done it: its answer did not come
        a.unanswered.keep(key, ident, hub)
        raise Unsure(exc.message, **{**exc.details, "id": ident}) from exc


async def _send(a: Agent, x: SendArgs) -> Output:
    key = ("send", x.to, x.message, x.summary, x.close_link)

    def sending(ident: str) -> Any:
        return a.client.send(
            x.to,
            x.message,
            summary=x.summary,
            close_link=x.close_link,
            from_session=a.session,
            message_id=ident,
        )

    r, again = await _once(a, key, x.id, new_message_id(), sending)
    closed = " Your link with them is now closed." if x.close_link else ""

    def answer(k: int) -> Output:
        """The answer naming the first ``k`` recipients (a broadcast to a big team names
        more than an answer holds), and as many of the warnings."""
        hidden = len(r.recipients) - k
        to = ", ".join(r.recipients[:k]) + (f" and {hidden} more" if hidden else "")
        # a recipient whose push delivery is down: the agent learns it now, not at the
        # dead letter (backchannel.delivery.circuit)
        warned = "".join(f"\nWarning: {w}" for w in r.warnings[:k])
        if len(r.warnings) > k:
            warned += f"\n(and {len(r.warnings) - k} more warnings like these)"
        data = _json(r) | {"recipients": r.recipients[:k], "warnings": r.warnings[:k]}
        if hidden or len(r.warnings) > k:
            data |= {"more_recipients": hidden, "more_warnings": max(len(r.warnings) - k, 0)}
        if r.replayed and again:
            return (
                f"Already sent to {to} (message_id {r.message_id}): an earlier call made this "
                f"send, and the message is delivered once.{closed}{warned}",
                data,
            )
        return f"Sent to {to} (message_id {r.message_id}).{closed}{warned}", data

    most = max(len(r.recipients), len(r.warnings))
    return answer(most if _fits(answer(most)) else max(_most(answer, most), 1))


def _json(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True)


def structured(text: str, data: Any) -> dict[str, Any]:
    """A tool answer's structured content: its text first, then its fields (Claude Code
    and Codex show the model this, not the text)."""
    fields = data if isinstance(data, dict) else {"result": data}
    return {"text": text, **{k: v for k, v in fields.items() if k != "text"}}


def answer_size(text: str, data: Any) -> int:
    """The UTF-8 bytes of a tool's answer as Codex shows it to the model: its structured
    content (:func:`structured`) as compact JSON. Codex writes it with ``serde_json``,
    which escapes quotes, backslashes and control characters and keeps every other
    character as it is, as this does."""
    return _jsize(structured(text, data))


def _without(model: Any, *keys: str) -> dict[str, Any]:
    return {k: v for k, v in _json(model).items() if k not in keys}


def _jsize(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _fits(answer: Output) -> bool:
    return answer_size(*answer) <= ANSWER_BYTES


def _most(build: Callable[[int], Output], n: int) -> int:
    """The largest ``k`` of ``1..n`` whose answer ``build(k)`` fits in
    :data:`ANSWER_BYTES` (an answer grows with ``k``: items shown, or characters of a
    text), 0 when none does."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(build(mid)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _cut_answer(text: str) -> Output:
    """``text`` cut to fit one answer, saying so (the last resort of :func:`build_server`)."""

    def cut(n: int) -> Output:
        rest = len(text) - n
        return f"{text[:n]}\n[… answer cut to fit one tool answer: {rest} more characters]", {
            "cut": rest
        }

    return cut(_most(cut, min(len(text), ANSWER_BYTES)))


def _at_line_end(text: str, k: int) -> int:
    """``k`` characters of ``text``, or fewer to end just after a line's end in the
    second half of them (a cut text reads on from a line's start)."""
    if k >= len(text):
        return k
    return text.rfind("\n", k // 2, k) + 1 or k


def _received(m: Received) -> str:
    return f"{format_message(m.sender, m.kind, m.text)}\n(message_id: {m.message_id})"


def shown_size(text: str) -> int:
    """The bytes ``text`` takes in a tool's answer as a client shows it: a JSON string's
    UTF-8 (a quote, a backslash or a line end takes two bytes, a control character six;
    plain text, its UTF-8 bytes, as :func:`.framing.size`)."""
    return _jsize(text) - 2


def parts(text: str) -> list[str]:
    """``text`` in parts of at most :data:`PART_BYTES` as :func:`shown_size` counts them,
    each cut just after a line's end when one is in its second half (else at the most
    characters that fit, never inside a ``\\r\\n`` nor between a character and the marks
    joined to it, :func:`.framing.keeps_together`): joined, they are ``text``
    (:func:`.framing.parts`, which counts plain bytes, cuts plain text the same)."""
    out = []
    while len(text) > PART_BYTES or shown_size(text) > PART_BYTES:
        head = text[:PART_BYTES]  # a character takes one byte or more
        lo, hi = 1, len(head)
        while lo < hi:  # the most characters that fit
            mid = (lo + hi + 1) // 2
            if shown_size(head[:mid]) <= PART_BYTES:
                lo = mid
            else:
                hi = mid - 1
        cut = text.rfind("\n", lo // 2, lo) + 1 or framing.keeps_together(text, lo)
        out.append(text[:cut])
        text = text[cut:]
    return [*out, text]


def _part(
    sender: str, kind: str, ident: str, text: str, part: int, start: int = 0
) -> tuple[str, str, int]:
    """Part ``part`` of a message as the model reads it (parts counted from character
    ``start`` of its text, the rest after what a hook showed): its frame, the part, and
    the exact call that reads the next (when one is); also the part's text, and how many
    parts there are."""
    split = parts(text[start:])
    body = split[part - 1]
    shown = f"{format_message(sender, framing.mid_kind(kind, start > 0 or part > 1), body)}"
    shown += f"\n(message_id: {ident}"
    if len(split) == 1 and not start:
        return shown + ")", body, 1
    shown += f", from character {start}" if start else ""
    shown += f", part {part} of {len(split)})"
    if part < len(split):
        at = f", start={start}" if start else ""
        shown += (
            f"\n[This message is longer than one answer: call read_message with "
            f"message_id={ident!r}{at} and part={part + 1} for its next part.]"
        )
    return shown, body, len(split)


#: The room of :data:`ANSWER_BYTES` a ``check_inbox`` answer's messages take: the rest
#: is for its own words ("N new messages:", "More messages may wait: ...") and the
#: structured content's frame, as JSON writes them.
INBOX_ROOM = ANSWER_BYTES - 160

#: acks and give-backs of what tools took from the inbox, run apart from the tool call
#: (which the client may cancel meanwhile); kept here so that none is collected unrun
_SETTLING: set[asyncio.Future[Any]] = set()


def _later(work: Awaitable[Any], what: str) -> None:
    """Run ``work`` in a task of its own: a cancelled call cannot stop it halfway."""

    async def run() -> None:
        try:
            await work
        except Exception as exc:
            log.warning("%s failed (the messages come back when their lease ends): %s", what, exc)

    task = asyncio.ensure_future(run())
    _SETTLING.add(task)
    task.add_done_callback(_SETTLING.discard)


#: how long a stopping server waits for them
SETTLE_S = 10.0

#: Set by a transport that knows whether a call's answer went out (``/mcp``, see
#: :meth:`.agents_http.McpEndpoint._unless_gone`): what ``check_inbox`` answered with is
#: acked once its answer was written, and given back if the client hung up before (its
#: answer reached no one). Each entry is told whether the answer was written.
ANSWERING: contextvars.ContextVar[list[Callable[[bool], None]] | None] = contextvars.ContextVar(
    "backchannel_mcp_answering", default=None
)


async def settled() -> None:
    """Wait (up to :data:`SETTLE_S`) for the acks and give-backs still under way, so that
    a server that stops right after answering has acked what it answered with."""
    if _SETTLING:
        await asyncio.wait(set(_SETTLING), timeout=SETTLE_S)


def _give_back(a: Agent, ids: Sequence[str]) -> None:
    if ids:
        _later(a.client.release(list(ids)), "giving back messages no answer showed")


async def _lease(a: Agent, limit: int, session: str | None) -> list[Received]:
    """Lease up to ``limit`` messages, in a hub call the tool call's cancel cannot cut:
    cancelled once the hub has leased them but before its answer is in, the messages
    would be held, unseen, until their lease ends (an attempt spent, the next
    ``check_inbox`` finding nothing meanwhile). A call cancelled while it runs leaves it
    to end, and gives back at once what it leased."""
    call = asyncio.ensure_future(a.client.receive(limit=limit, session=session))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:

        async def back() -> None:
            try:
                got = await call
            except Exception:  # it leased nothing
                return
            if got:
                await a.client.release([m.message_id for m in got])

        _later(back(), "giving back messages a cancelled check_inbox leased")
        raise


#: A ``check_inbox`` that found nothing while the session's turn runs. The hub hands
#: what is pinned to a session (a linked peer's finished turn, a fired timer, a message
#: sent to the session) only between its turns, by the CLI's hooks: a bare "No new
#: messages." told a model polling for a linked peer's reply that none had come.
NOTHING_MID_TURN = (
    "No new messages now. Messages for this session that arrive while your turn runs (a "
    "linked peer's reply, a timer of yours) are not shown here: they come as your next "
    "input once this turn ends, so end your turn to read a reply you wait for."
)


async def _turn_runs(a: Agent) -> bool:
    """Whether the agent's turn runs now: the named session's, else any of the member's
    (the one whose open turn the hub gives the tools' sends to). Asked only when
    ``check_inbox`` found nothing; a hub that cannot say is taken as no."""
    try:
        if a.session is not None:
            return (await a.client.session(a.session)).state == "active"
        return bool(await a.client.list_sessions(a.name, active_only=True, limit=1))
    except Exception:  # gone, unknown, or the hub away: the plain answer
        return False


def _entry(m: Received) -> dict[str, Any]:
    """A message's entry in ``check_inbox``'s structured content: all but its text."""
    return m.model_dump(mode="json", exclude={"chain_id", "hop", "text"})


def _entry_size(m: Received) -> int:
    """The bytes :func:`_entry` takes in an answer, with room for a long message's
    ``parts`` and ``part``."""
    return len(json.dumps(_entry(m), separators=(",", ":")).encode()) + 24


async def _check_inbox(a: Agent, x: _NoArgs) -> Output:
    """What waits now, leased; :func:`build_server`'s ``call_tool`` acks it once the answer
    is sure to be sent, and gives it back if the call ends any other way. At most
    :data:`CHECK_INBOX_BATCH` from each place it looks, and only the whole messages that
    fit in :data:`ANSWER_BYTES` (the rest are given back at once), the first of them
    when its text is longer than :data:`PART_BYTES` as its first part (the answer names
    the :func:`_read_message` call that gives the next); a batch that came back full, or
    gave messages back, means more may wait, and the answer says so (and ``more``), with
    how to read them."""
    got: list[Received] = []  # what the answer shows
    pieces: list[str] = []
    sizes: list[int] = []  # each one's bytes: its text and its structured entry
    cut: dict[str, int] = {}  # a long message's parts (its first is shown)
    more = False

    async def fill(session: str | None) -> None:
        """Lease about as many as the room left holds (one first, then by the length of
        those read so far), so that what does not fit and goes back is little, and is
        read by the next call: a message handed out and given back at every call would
        spend its attempts (a lease that runs out after the last makes it dead)."""
        nonlocal more
        taken = 0
        while taken < CHECK_INBOX_BATCH:
            used = sum(sizes) + 4 * len(sizes)
            fits = (INBOX_ROOM - used) * len(sizes) // used if sizes else 1
            limit = max(1, min(fits, CHECK_INBOX_BATCH - taken))
            step = await _lease(a, limit, session)
            taken += len(step)
            for i, m in enumerate(step):
                piece = _received(m)
                cost = shown_size(piece) + _entry_size(m)
                if sizes and sum(sizes) + 4 * len(sizes) + cost > INBOX_ROOM:
                    _give_back(a, [m.message_id for m in step[i:]])
                    more = True
                    return
                if len(m.text) > PART_BYTES or shown_size(m.text) > PART_BYTES:
                    # the first (no other fits): its first part
                    piece, _, cut[m.message_id] = _part(m.sender, m.kind, m.message_id, m.text, 1)
                    cost = shown_size(piece) + _entry_size(m)
                got.append(m)
                pieces.append(piece)
                sizes.append(cost)
            if len(step) < limit:
                return
        more = True  # a full batch: more may wait

    try:
        if a.session is not None:
            # pinned to the session: handed out only while it is between turns
            with contextlib.suppress(UnknownSession, InvalidState):
                await fill(a.session)
        if not more:
            await fill(None)
    except BaseException:  # cancelled (the client's notifications/cancelled), or failed
        _give_back(a, [m.message_id for m in got])
        raise
    # the structured answer names the messages the text shows, without their text: a
    # client that shows the model the structured content (Claude Code, Codex) would show
    # each message twice, framed in the answer's text and again raw here
    data = [_entry(m) for m in got]
    for d in data:
        if d["message_id"] in cut:
            d["parts"], d["part"] = cut[d["message_id"]], 1
    if not got:
        if await _turn_runs(a):
            return NOTHING_MID_TURN, {"messages": [], "turn_running": True}
        return "No new messages.", {"messages": []}

    def answer(n: int, more: bool) -> Output:
        text = f"{n} new message{'s' if n != 1 else ''}:\n\n" + "\n\n".join(pieces[:n])
        if not more:
            return text, {"messages": data[:n]}
        text += "\n\nMore messages may wait: call check_inbox again to read them."
        return text, {"messages": data[:n], "more": True}

    # the sizes counted leave out the answer's own words: the last message that takes
    # it past the room goes back, for the next call
    n = len(got)
    while n > 1 and not _fits(answer(n, more)):
        n, more = n - 1, True
    _give_back(a, [m.message_id for m in got[n:]])
    return answer(n, more)


class ReadMessageArgs(_Args):
    message_id: Name = Field(description="The id of a message you received (or sent).")
    part: int = Field(
        1,
        ge=1,
        le=MAX_INT,
        description="Which part of a long message (1 is the first), counted from start.",
    )
    start: int = Field(
        0,
        ge=0,
        le=MAX_INT,
        description="Where to begin, in characters of the message's text: a hook that "
        "showed only a message's start names the start= that reads the rest. 0 (the "
        "default) is the beginning.",
    )


async def _read_message(a: Agent, x: ReadMessageArgs) -> Output:
    """A message the agent received or sent, by its id, a part at a time: a message
    longer than one answer is read in parts (see :data:`PART_BYTES`). The hub keeps an
    acked message's text, so a part can be read again; reading does not ack anything."""
    r = await a.client.status(x.message_id)
    if x.start and x.start >= len(r.text):
        raise InvalidRequest(
            f"start={x.start} is past the end of message {x.message_id}: its text is "
            f"{len(r.text)} characters; call again with start between 0 and "
            f"{max(len(r.text) - 1, 0)} (the start= a hook's note names), or without start",
            field="start",
        )
    n = len(parts(r.text[x.start :]))
    if x.part > n:
        since = f" from character {x.start}" if x.start else ""
        raise InvalidRequest(
            f"message {x.message_id} has {n} part{'s' if n != 1 else ''}{since}; "
            f"call again with part between 1 and {n}",
            field="part",
        )
    shown, _, _ = _part(r.sender, r.kind, r.message_id, r.text, x.part, x.start)
    # the part once, in the text: the answer's room is the part's, not twice its size
    data = {"message_id": r.message_id, "from": r.sender, "part": x.part, "parts": n}
    return shown, {**data, "start": x.start} if x.start else data


async def sessions(a: Agent, member: str | None = None, *, live: bool = False) -> list[SessionInfo]:
    """Sessions of the agent's team (of one member; with ``live``, those not ended)."""
    return await a.client.list_sessions(member, live_only=live)


async def _session_data(a: Agent, x: SessionDataArgs) -> Output:
    """A page of a session's transcript that fits in :data:`ANSWER_BYTES`: from event
    ``x.since`` on, as many whole events as fit, ending with the call that reads on; or,
    with ``tail_chars``, the last events that fit, saying how to read the earlier ones.
    An event longer than one answer is shown a part at a time (``start``), each part
    naming the call that reads the next."""
    if x.start and x.tail_chars is not None:
        raise InvalidRequest(
            "start reads on in one event from since; call with since and start, without tail_chars",
            field="start",
        )
    # from since on: no more than an answer holds (the hub counts characters, of the
    # texts and the data); an event's rest (start): the first event, to learn its id
    room = 1 if x.start else ANSWER_BYTES
    name = x.session
    try:
        data = await a.client.session_data(
            name, since=x.since, tail_chars=x.tail_chars, max_chars=room
        )
    except UnknownSession:
        # a member's name: its latest live session (else its latest), read live first
        # (a member that ran for months has ended thousands)
        mine = await sessions(a, x.session, live=True) or await sessions(a, x.session)
        mine = [s for s in mine if s.member == x.session]
        if not mine:
            raise
        # a running one before one its process left (``/clear``), then the latest
        rank = {"active": 2, "idle": 2, "exited": 1}
        name = max(
            mine, key=lambda s: (rank.get(s.state, 0), s.updated_at, s.created_at)
        ).session_id
        data = await a.client.session_data(
            name, since=x.since, tail_chars=x.tail_chars, max_chars=room
        )
    s = data.session
    head = f"Session {s.session_id} of {s.member}: {s.state}, turn {s.turn}."
    call = f'get_session_data(session="{s.session_id}"'
    # the structured answer keeps each event but its text, which the answer's text shows:
    # a client that shows the model the structured content (Claude Code, Codex) would show
    # every text of the transcript twice (a program reads them raw from the HTTP API); the
    # session without its last output (the transcript's agent_stop shows it)
    info = _without(s, "last_output")
    events = data.events

    def answer(shown: Sequence[Any], note: str, **fields: Any) -> Output:
        lines = [head, *(f"#{e.event_id} turn {e.turn} {e.kind}: {e.text}" for e in shown)]
        body = {
            "session": info,
            "events": [_without(e, "text") for e in shown],
            "truncated": bool(note),
            "next_since": None,
            "note": note or None,
            **fields,
        }
        return "\n".join(lines + ([note] if note else [])), body

    if not events:
        if x.start:
            raise InvalidRequest(
                f"start={x.start}: no event of session {s.session_id} follows event "
                f"{x.since}; call without start",
                field="start",
            )
        return answer([], "")
    if x.tail_chars is not None:
        cut = data.truncated  # the hub left earlier events out, or cut the first

        def tail(j: int) -> Output:
            if not (cut or j < len(events)):
                return answer(events, "")
            first = events[len(events) - j].event_id if j else events[-1].event_id + 1
            return answer(
                events[len(events) - j :],
                f"[… earlier events not shown, to fit one answer: read them a page at a "
                f"time with {call}, since=0) from the first, or with since=N from event "
                f"N+1 on (the ones shown begin at #{first}), or ask for a smaller "
                "tail_chars …]",
            )

        j = _most(tail, len(events))
        if j:
            return tail(j)
        # the last event alone is more than an answer holds: its end, and how to read it
        last = events[-1]
        return _event_part(head, call, info, last, last.event_id - 1, -1, cut or len(events) > 1)
    more = data.truncated or len(events) > 1  # events follow the first

    def forward(k: int) -> Output:
        if not (data.truncated or k < len(events)):
            return answer(events, "")
        at = events[k - 1].event_id
        note = f"[… more events follow: call {call}, since={at}) to read on …]"
        return answer(events[:k], note, next_since=at)

    k = 0 if x.start else _most(forward, len(events))
    if k:
        return forward(k)
    # the first event alone is more than an answer holds: read whole, shown in parts
    first = events[0]
    whole = await a.client.session_data(
        s.session_id, since=x.since, until=first.event_id, max_chars=1_000_000
    )
    event = next((e for e in whole.events if e.event_id == first.event_id), first)
    if x.start >= len(event.text):
        raise InvalidRequest(
            f"start={x.start} is past the end of event #{event.event_id}: its text is "
            f"{len(event.text)} characters; call again with start between 0 and "
            f"{max(len(event.text) - 1, 0)}, or without start",
            field="start",
        )
    return _event_part(head, call, info, event, x.since, x.start, more)


def _event_part(
    head: str,
    call: str,
    info: dict[str, Any],
    event: Any,
    since: int,
    start: int,
    more: bool = False,
) -> Output:
    """One event too long for an answer, a part of its text: from character ``start``
    as much as fits, with the call that reads the next part, or the next event when
    ``more`` follow; ``start`` -1: as much of its end as fits, with the call that reads
    it from its start, and the one that reads the events before it when ``more`` came
    before."""
    text = event.text
    entry = _without(event, "text")
    if _jsize(entry["data"]) > ANSWER_BYTES // 4:  # the text is what the model reads
        entry["data"] = {"omitted": f"{_jsize(event.data)} bytes of data cut to fit the answer"}

    def part(n: int) -> Output:
        if start < 0:  # its end: the tail of a transcript
            begin, end = len(text) - n, len(text)
            where = f"its last {n} characters"
            note = (
                f"[event #{event.event_id} is longer than one answer: this is its last "
                f"{n} characters; read it whole from its start with {call}, "
                f"since={event.event_id - 1}) …]"
            )
            if more:
                note += (
                    f"\n[… earlier events not shown, to fit one answer: read them a page at "
                    f"a time with {call}, since=0) from the first …]"
                )
        else:
            begin, end = start, start + n
            if end < len(text):
                note = (
                    f"[event #{event.event_id} is longer than one answer: call {call}, "
                    f"since={since}, start={end}) for its next part …]"
                )
            elif more:
                note = f"[… more events follow: call {call}, since={event.event_id}) to read on …]"
            else:
                note = ""
            where = f"characters {begin} to {end} of {len(text)}"
        shown = f"#{event.event_id} turn {event.turn} {event.kind} ({where}): "
        body = {
            "session": info,
            "events": [entry],
            "truncated": True,
            "next_since": event.event_id if end == len(text) and more else None,
            "note": note or None,
            "start": begin,
            "end": end,
        }
        return "\n".join([head, shown + text[begin:end], *([note] if note else [])]), body

    left = len(text) - max(start, 0)
    n = _most(part, min(left, ANSWER_BYTES))
    if start >= 0:
        n = _at_line_end(text[start:], n) if n < left else n
    return part(max(n, 1))


async def _list_members(a: Agent, x: ListMembersArgs) -> Output:
    """A page of the team's members by name (at most :data:`LIST_MEMBERS_SHOWN` after
    the name ``x.after``, and no more than fit in :data:`ANSWER_BYTES`) with their open
    sessions, ending, when more follow, with the call that reads the next page: the
    answer goes into the model's context whole, so a team of thousands is read a page
    at a time, never in one answer. A member whose open sessions alone do not fit is
    shown with as many as fit, and how many more it has."""
    found = await a.client.members(after=x.after, limit=LIST_MEMBERS_SHOWN + 1)
    members, more = found[:LIST_MEMBERS_SHOWN], len(found) > LIST_MEMBERS_SHOWN
    shown = {m.name for m in members}
    live: dict[str, list[SessionInfo]] = {}
    for s in await sessions(a, live=True):
        if s.member in shown:
            live.setdefault(s.member, []).append(s)
    head = f"Team {a.team}:" if not x.after else f"Team {a.team}, after {x.after}:"

    def page(k: int, cap: int | None = None) -> Output:
        """The answer showing the first ``k`` members (``cap``: at most so many sessions
        of each)."""
        lines, listed = [head], []
        for m in members[:k]:
            own = live.get(m.name, [])
            hidden = len(own) - cap if cap is not None and len(own) > cap else 0
            own = own[: len(own) - hidden]
            listed += own
            you = " (you)" if m.name == a.name else ""
            ids = ", ".join(f"{s.session_id} ({s.state})" for s in own)
            where = f"; sessions: {ids}" if own else ""
            if hidden:
                where += (
                    f"{',' if own else '; sessions:'} and {hidden} more open "
                    f'(get_session_data(session="{m.name}") reads its latest)'
                )
            lines.append(f"- {m.name}{you}, {m.kind}{where}")
        if not members:
            lines.append("No more members.")
        next_after = members[k - 1].name if k and (more or k < len(members)) else None
        if next_after is not None:
            lines.append(f'More follow: call list_members(after="{next_after}") for the next page.')
        # each session without its last output, which the text does not show (its
        # transcript is get_session_data's)
        data = {
            "members": [_json(m) for m in members[:k]],
            "sessions": [_without(s, "last_output") for s in listed],
            "next_after": next_after,
        }
        return "\n".join(lines), data

    k = _most(page, len(members))
    if k or not members:
        return page(k)
    # the first member's sessions alone are more than an answer holds
    own = len(live.get(members[0].name, []))
    return page(1, max(0, _most(lambda cap: page(1, cap - 1), own + 1) - 1))


async def _set_timer(a: Agent, x: TimerArgs) -> Output:
    """The timer set, its note once (the text shows it; the structured content names the
    timer without it), cut when JSON makes it longer than an answer holds."""
    t = await a.client.set_timer(x.intent, x.minutes, x.note, x.target, session=a.session)
    about = f" about {t.target}" if t.target else ""

    def answer(keep: int) -> Output:
        note = t.note[:keep]
        if keep < len(t.note):
            note += f" […note cut here to fit one answer: {len(t.note) - keep} more characters]"
        return (
            f"{t.intent} timer {t.timer_id}{about} set on session {t.session}; it fires "
            f"in {x.minutes:g} min with: {note}. cancel_timer(id={t.timer_id}) cancels it.",
            _without(t, "note"),
        )

    whole = answer(len(t.note))
    return whole if _fits(whole) else answer(_most(answer, len(t.note)))


async def _cancel_timer(a: Agent, x: CancelTimerArgs) -> Output:
    # the timer without its note, which the model wrote and this answer does not show
    t = await a.client.cancel_timer(x.id)
    return f"Timer {x.id} cancelled.", _without(t, "note")


async def _read_timer(a: Agent, x: ReadTimerArgs) -> Output:
    """One timer of the team, pending, fired or cancelled, with its note whole from
    ``x.start``: a note longer than one answer holds (2,000 characters JSON writes six
    bytes each) is cut at a line's end where one is near, and the answer names the
    ``start`` that reads the rest. The structured content names the timer without its
    note, which the text shows."""
    t = await a.client.timer(x.id)
    if x.start > len(t.note):
        raise InvalidRequest(
            f"timer {x.id}'s note has {len(t.note)} characters: start is at most that",
            field="start",
        )
    rest = t.note[x.start :]
    due = f"due in {t.due_in:.0f} s" if t.state == "pending" and t.due_in is not None else t.state
    head = (
        f"{t.intent} timer {t.timer_id}{' about ' + t.target if t.target else ''} for "
        f"{t.member} (session {t.session}{', yours' if t.member == a.name else ''}), {due}"
    )

    def answer(keep: int) -> Output:
        note = rest[:keep]
        data = {**_without(t, "note"), "start": x.start, "next_start": None}
        if keep < len(rest):
            data["next_start"] = x.start + keep
            note += (
                f"\n[…the note goes on: {len(rest) - keep} more characters; call "
                f"read_timer(id={t.timer_id}, start={x.start + keep}) for the rest]"
            )
        where = f" (from character {x.start})" if x.start else ""
        return f"{head}. Note{where}: {note}", data

    whole = answer(len(rest))
    return whole if _fits(whole) else answer(_at_line_end(rest, _most(answer, len(rest))))


async def _list_timers(a: Agent, x: ListTimersArgs) -> Output:
    """A page of the team's pending timers (or one member's), in the order they were
    set: at most :data:`LIST_TIMERS_SHOWN` after timer ``x.after``, and no more than fit
    in :data:`ANSWER_BYTES`, the caller's own marked (the ones it may cancel). A page
    that is not the last says so, with the call that reads the next one: the answer goes
    into the model's context whole, so the list is never poured in at once, and never
    shown in part as if it were all. The structured content names each timer without
    its note, which the text shows."""
    page = await a.client.timers(member=x.member, after=x.after, limit=LIST_TIMERS_SHOWN + 1)
    shown, more = page[:LIST_TIMERS_SHOWN], len(page) > LIST_TIMERS_SHOWN
    whose = x.member or "your team"
    if not shown:
        text = f"No more pending timers of {whose} after timer {x.after}."
        if not x.after:
            text = f"No pending timers of {whose}."
        return text, {"timers": [], "next_after": None}

    def answer(k: int, keep: int | None = None) -> Output:
        """The answer showing the first ``k`` timers (``keep``: the first's note cut to
        so many characters)."""
        lines = []
        for t in shown[:k]:
            note = t.note
            if keep is not None and t is shown[0] and keep < len(note):
                note = (
                    f"{note[:keep]} […note cut here to fit one answer: {len(note) - keep} "
                    f"more characters; read_timer(id={t.timer_id}) reads it whole]"
                )
            lines.append(
                f"{t.timer_id}: {t.intent}{' about ' + t.target if t.target else ''} "
                f"for {t.member} (session {t.session}{', yours' if t.member == a.name else ''}), "
                f"due in {t.due_in or 0:.0f} s: {note}"
            )
        next_after = shown[k - 1].timer_id if k and (more or k < len(shown)) else None
        if next_after is not None:
            again = f"after={next_after}" + (f', member="{x.member}"' if x.member else "")
            lines.append(f"More follow: call list_timers({again}) for the next page.")
        data = {"timers": [_without(t, "note") for t in shown[:k]], "next_after": next_after}
        return "\n".join(lines), data

    k = _most(answer, len(shown))
    if k:
        return answer(k)
    # one timer's note is more than an answer holds (a note of 2,000 characters that
    # JSON writes six bytes each)
    return answer(1, _at_line_end(shown[0].note, _most(lambda n: answer(1, n), len(shown[0].note))))


async def _react(a: Agent, x: ReactionArgs) -> Output:
    await a.client.react(x.message_id, x.emoji)
    return f"Reacted {x.emoji} to {x.message_id}.", {"message_id": x.message_id, "emoji": x.emoji}


async def _delegate(a: Agent, x: DelegateArgs) -> Output:
    key = ("delegate", x.to, x.task, x.timeout_s)

    def delegating(ident: str) -> Any:
        return a.client.delegate(
            x.to, x.task, timeout_s=x.timeout_s, session=a.session, tool_use_id=ident
        )

    result, again = await _once(a, key, x.id, "tu_" + uuid.uuid4().hex[:16], delegating)

    def answer(n: int | None) -> Output:
        """The answer, the texts it echoes (the task, a replayed one's result or error)
        cut to ``n`` characters each (None: whole); the model wrote the task, and the
        answer reaches it as a tool result of its own."""
        data = _json(result)
        for k in ("task", "result", "error"):
            v = data.get(k)
            if n is not None and isinstance(v, str) and len(v) > n:
                data[k] = f"{v[:n]}… [{len(v) - n} more characters not shown]"
        if result.replayed and again:
            # an earlier call (one the model was told failed or timed out) made it: said,
            # so that the model waits for one answer, not two
            return (
                f"Already delegated to {x.to} (delegation {result.delegation_id}, "
                f"{result.state}): an earlier call under id {result.tool_use_id} made this "
                f"delegation, which runs once; its answer reaches you once, as a tool "
                f"result later. {json.dumps(data, default=str)}",
                data,
            )
        return (
            f"Delegated to {x.to}; this returns at once and their answer reaches you as a "
            f"tool result later. {json.dumps(data, default=str)}",
            data,
        )

    if _fits(answer(None)):
        return answer(None)
    return answer(_most(answer, 1000))


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    args: type[_Args]
    run: Callable[[Agent, Any], Awaitable[Output]]
    #: which argument a hub error is about, by error code or by the hub's field name
    blame: tuple[tuple[str, str], ...] = ()
    #: its answer's ``messages`` are leased from the inbox, acked once the answer is sent
    takes: bool = False

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = _clean(self.args.model_json_schema())
        return schema


TOOLS: tuple[Tool, ...] = (
    Tool(
        "send_message",
        "Send a message to a teammate. From a turn it opens a conversation link with them, "
        "so each of your finished turns reaches them and theirs reach you, within a turn "
        "budget. Refused for unknown names (with suggestions); set an anchor timer first "
        "if the hub asks for one.",
        SendArgs,
        _send,
        (("unknown_recipient", "to"), ("unknown_member", "to"), ("text", "message")),
    ),
    Tool(
        "check_inbox",
        "Read the messages waiting for you now (they are then marked read). Messages also "
        "reach you on their own between turns; call this when you expect something.",
        _NoArgs,
        _check_inbox,
        takes=True,
    ),
    Tool(
        "read_message",
        "Read a message you received or sent by its message_id, a part at a time: a "
        "message longer than one answer comes in parts, and its answer names the next. "
        "Call it as a note names it (with its start= after a hook showed the beginning).",
        ReadMessageArgs,
        _read_message,
        (("unknown_message", "message_id"), ("not_found", "message_id")),
    ),
    Tool(
        "get_session_data",
        "Read a teammate's session transcript (their inputs, thoughts, tool calls, outputs), "
        "paged and capped. Use it for a deep look; their finished turns already reach you.",
        SessionDataArgs,
        _session_data,
        (("unknown_session", "session"),),
    ),
    Tool(
        "list_members",
        "List your team's members with their kinds and open sessions, a page at a time "
        "(the answer says how to read the next).",
        ListMembersArgs,
        _list_members,
    ),
    Tool(
        "set_timer",
        "Set a heartbeat that fires as a message to you: anchor (return to your task; the "
        "hub requires a pending anchor before you message a linked peer), check (a peer's "
        "state and last output), wait (whether a peer replied).",
        TimerArgs,
        _set_timer,
        (("unknown_recipient", "target"), ("unknown_member", "target"), ("seconds", "minutes")),
    ),
    Tool(
        "cancel_timer",
        "Cancel one of your pending timers.",
        CancelTimerArgs,
        _cancel_timer,
        (("not_found", "id"), ("timer_id", "id"), ("forbidden", "id")),
    ),
    Tool(
        "read_timer",
        "Read one timer of your team by its id, pending, fired or cancelled, with its note "
        "whole (list_timers cuts a long one): a note longer than one answer comes in "
        "parts, and the answer names the start= of the next.",
        ReadTimerArgs,
        _read_timer,
        (("not_found", "id"), ("timer_id", "id")),
    ),
    Tool(
        "list_timers",
        "List your team's pending timers in the order they were set, yours marked: id, "
        f"intent, whose, due in how long, and the note, at most {LIST_TIMERS_SHOWN} at a "
        "time (the answer says how to read the next page when more follow).",
        ListTimersArgs,
        _list_timers,
        (("unknown_member", "member"),),
    ),
    Tool(
        "add_reaction",
        "React to a message you sent or received with an emoji (not a message: it never "
        "starts a turn for anyone).",
        ReactionArgs,
        _react,
        (("unknown_message", "message_id"),),
    ),
    Tool(
        "delegate",
        "Ask a teammate to do a task as an asynchronous tool call: returns a pending id at "
        "once and their answer arrives later as a tool result; your turn is not held.",
        DelegateArgs,
        _delegate,
        (("unknown_recipient", "to"), ("unknown_member", "to")),
    ),
)


def _clean(schema: Any) -> Any:
    """A pydantic JSON schema without titles, optional fields as plain types."""
    if isinstance(schema, dict):
        out = {k: _clean(v) for k, v in schema.items() if k != "title"}
        options = out.get("anyOf")
        if isinstance(options, list):
            real = [o for o in options if o != {"type": "null"}]
            if len(real) == 1 and len(real) < len(options):
                del out["anyOf"]
                out.update(real[0])
        if out.get("default", 0) is None:
            del out["default"]
        return out
    if isinstance(schema, list):
        return [_clean(v) for v in schema]
    return schema


# -- errors the model can read ----------------------------------------------------------------


def _error(text: str) -> mt.CallToolResult:
    return mt.CallToolResult(content=[mt.TextContent(text=text)], is_error=True)


def _validation_text(tool: Tool, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        arg = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        if err.get("type") == "missing":
            problems.append(f"missing argument '{arg}'")
        elif err.get("type") == "extra_forbidden":
            problems.append(f"unexpected argument '{arg}'")
        elif err.get("type") in ("model_type", "dict_type"):
            problems.append("arguments must be a JSON object")
        else:
            problems.append(f"invalid argument '{arg}': {err.get('msg', 'invalid')}")
    return f"{tool.name}: {'; '.join(problems)}. Fix the argument(s) and call again."


def _hub_error_text(tool: Tool, exc: BackchannelError) -> str:
    blame = dict(tool.blame)
    field = exc.details.get("field")
    arg = blame.get(str(field)) or (field if field in tool.args.model_fields else None)
    arg = arg or blame.get(exc.code)
    where = f" (argument '{arg}')" if arg else ""
    text = f"{tool.name} failed{where}: {exc.message}"
    if isinstance(exc, Unsure):
        text += (
            f". It may have reached the hub. Call {tool.name} again with the same arguments "
            f"and id={exc.details['id']!r}: under that id it is made once, never twice."
        )
    suggestions = exc.details.get("suggestions")
    if suggestions and "did you mean" not in exc.message:
        text += f" Did you mean: {', '.join(map(str, suggestions))}?"
    return text


# -- the server ----------------------------------------------------------------------------


async def _ack_unless_crossed(a: Agent, request: tuple[Any, ...], taken: list[str]) -> None:
    """Ack what a ``check_inbox`` answered with, unless the client cancels the call
    within :data:`CROSSED_S` (its cancel crossed the answer, which it dropped unread):
    then give it back, for the next call to show."""
    crossed = a.unanswered.crossed.setdefault(request, asyncio.Event())
    waits = {
        asyncio.ensure_future(crossed.wait()),
        asyncio.ensure_future(a.unanswered.closed.wait()),
    }
    try:
        await asyncio.wait(waits, timeout=CROSSED_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if a.unanswered.crossed.get(request) is crossed:
        del a.unanswered.crossed[request]
    if crossed.is_set():
        await a.client.release(taken)
    else:
        await a.client.ack(taken)


Resolver = Callable[[Any], Awaitable[Agent]]


def build_server(
    resolve: Resolver,
    *,
    delegate: bool = False,
    connected: Callable[[str], None] | None = None,
    unanswered: Unanswered | None = None,
) -> Server[Any]:
    """An MCP server with :data:`TOOLS` (``delegate`` only when the hub offers it);
    ``resolve(ctx)`` says which agent a call acts for; ``connected(client_name)`` is
    called once a client has finished the handshake; ``unanswered``: where its calls
    that went unanswered are kept (its own if not given)."""
    tools = {t.name: t for t in TOOLS if delegate or t.name != "delegate"}
    unanswered = unanswered or Unanswered()
    listed = [
        mt.Tool(name=t.name, description=t.description, input_schema=t.schema())
        for t in tools.values()
    ]

    async def list_tools(ctx: Any, params: mt.PaginatedRequestParams | None) -> mt.ListToolsResult:
        return mt.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: mt.CallToolRequestParams) -> mt.CallToolResult:
        tool = tools.get(params.name)
        if tool is None:
            return _error(f"unknown tool {params.name!r}; the tools are: {', '.join(tools)}")
        try:
            args = tool.args.model_validate(params.arguments or {})
        except ValidationError as exc:
            return _error(_validation_text(tool, exc))
        try:
            agent = replace(await resolve(ctx), unanswered=unanswered, request=ctx.request_id)
            text, data = await tool.run(agent, args)
        except BackchannelError as exc:
            return _error(_hub_error_text(tool, exc))
        except Exception as exc:
            log.exception("tool %s failed", tool.name)
            return _error(f"{tool.name} failed: internal error ({type(exc).__name__}: {exc})")
        if tool.takes and (taken := [m["message_id"] for m in data["messages"]]):
            # returned, not cancelled: the SDK sends this answer (a call the client
            # cancelled is interrupted at its next await and never answered, so the
            # messages it took were given back above). Acked now, not before: an ack
            # ahead of a cancel that came during it would lose them unseen. Over
            # ``/mcp``, once the answer was written (see :data:`ANSWERING`).
            settle = ANSWERING.get()
            if settle is None:
                request = (agent.team, agent.name, agent.session, ctx.request_id)
                _later(_ack_unless_crossed(agent, request, taken), "acking check_inbox's answer")
            else:

                def written(sent: bool, client: Client = agent.client) -> None:
                    if sent:
                        _later(client.ack(taken), "acking the messages check_inbox answered with")
                    else:
                        _later(client.release(taken), "giving back an answer that reached no one")

                settle.append(written)
        if not tool.takes and not _fits((text, data)):
            # each tool bounds its own answer, naming the call that reads the rest: one
            # that did not (a case no tool foresaw) is cut here, and says so, rather than
            # cut by the client in its middle without a word
            log.warning("tool %s answered %d bytes: cut", tool.name, answer_size(text, data))
            text, data = _cut_answer(text)
        # some clients (Claude Code, Codex) show the model the structured content instead
        # of the text: it leads with the same wording, then the fields a program reads
        return mt.CallToolResult(
            content=[mt.TextContent(text=text)], structured_content=structured(text, data)
        )

    server: Server[Any] = Server(
        "backchannel",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    # a legacy (handshake) server: Claude Code delivers channel notifications only on a
    # connection of the handshake era, so the modern era's discovery is declined
    server.add_request_handler("server/discover", mt.RequestParams, _no_discover)

    async def initialized(ctx: Any, params: Any) -> None:
        if connected is not None:
            params = ctx.session.client_params
            connected(params.client_info.name if params is not None else "")

    server.add_notification_handler("notifications/initialized", mt.NotificationParams, initialized)
    return server


async def _no_discover(ctx: Any, params: Any) -> Any:
    raise MCPError(mt.METHOD_NOT_FOUND, "Method not found")


def init_options(server: Server[Any]) -> Any:
    """What the server declares in ``initialize``: its tools, and the Claude Code channel."""
    return server.create_initialization_options(experimental_capabilities={CAPABILITY: {}})


async def whoami(client: Client) -> tuple[str, str]:
    """``(team, member)`` of the client's token."""
    me = await client.me()
    if me.admin or me.team is None or me.name is None:
        raise BackchannelError("the MCP server needs a member token, not the admin token")
    return me.team, me.name


async def serve_stdio(
    client: Client,
    *,
    session: str | None = None,
    expect: Sequence[str] = (),
    streams: tuple[Any, Any] | None = None,
) -> None:
    """Serve the tools on stdin/stdout as the member whose token ``client`` holds
    (``streams``: the lines in and out instead, as :mod:`.mcp_front` passes them)."""
    async with client:
        team, name = await whoami(client)
        if expect and tuple(expect) != (team, name):
            raise BackchannelError(
                f"BACKCHANNEL_TOKEN belongs to {team}/{name}, but this agent is attached as "
                f"{'/'.join(expect)}; export that member's token"
            )
        agent = Agent(client, team, name, session)

        async def resolve(ctx: Any) -> Agent:
            return agent

        hello: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def connected(client_name: str) -> None:
            if not hello.done():
                hello.set_result(client_name)

        unanswered = Unanswered()
        server = build_server(resolve, delegate=True, connected=connected, unanswered=unanswered)

        def cancelled(request: Any) -> None:
            unanswered.cancelled((team, name, session, request))

        lines = CheckedLines(streams[0] if streams else _stdin(), cancelled)
        async with stdio_server(lines, streams[1] if streams else None) as (read, write):  # type: ignore[arg-type]

            async def refuse() -> None:
                while True:
                    await write.send(SessionMessage(await lines.refused.get()))

            async def push(content: str, meta: dict[str, str]) -> None:
                note = mt.JSONRPCNotification.model_validate(notification(content, meta))
                await write.send(SessionMessage(note))

            pusher = ChannelPusher(client, name, push, session=session)

            async def channel() -> None:
                if await hello != CHANNEL_CLIENT:
                    return  # only Claude Code takes channel pushes; others get hook routes
                await asyncio.sleep(CHANNEL_SETTLE_S)
                try:
                    await pusher.run()
                except Exception:  # the tools go on; the hook routes deliver instead
                    log.exception("channel pushes stopped")

            tasks = [
                asyncio.create_task(channel()),
                asyncio.create_task(refuse()),
                asyncio.create_task(beat(client, runs_here=pusher.runs_here)),
            ]
            try:
                await server.run(read, write, init_options(server))
                unanswered.closed.set()  # no cancel can come: what was answered is acked now
                await settled()
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task


async def beat(
    client: Client,
    parent: int | None = None,
    *,
    runs_here: Callable[[list[str]], None] | None = None,
) -> None:
    """Tell the hub, while the runtime that started this server runs, that it does:
    the member's sessions that run under it are alive, idle at their prompt or in one
    long tool call (:mod:`backchannel.runtimes.liveness`). Stops when the parent goes (a
    runtime killed: this server is reparented, or its stdin closes and it exits), so
    the sessions of a dead runtime still end by the hub's rule. A hub that cannot be
    reached, or does not know beats, is tried again at the pace it last asked for (a
    minute before it answered once): one away for a while, stopped or restarted, counts
    its sessions' silence from its return, and a beat a minute later could come after a
    short exit grace.

    It beats for the few nearest ancestors that are neither shells nor known launchers
    (:func:`~backchannel.runtimes.liveness.runtime_keys`), each only while it runs: one
    started through a launcher that stays as its parent (``timeout``, a wrapper script)
    still beats for the runtime above it, which its hooks name. ``runs_here`` is told
    the sessions each round's answers name (the channel pusher's target after a
    ``/clear``)."""
    parent = os.getppid() if parent is None else parent
    keys = await asyncio.to_thread(liveness.runtime_keys, parent)
    if not keys:
        log.debug("no runtime process to beat for (parent %s)", parent)
        return
    every = ALIVE_STEP_S
    while os.getppid() == parent:
        paces = []
        vouched: list[str] = []
        for key in await asyncio.to_thread(lambda: [k for k in keys if liveness.running(k)]):
            try:
                alive = await client.runtime_alive(key)
            except Exception as exc:  # the tools go on; the next beat tries again
                log.debug("beat for %s: %s", key, exc)
                continue
            paces.append(alive.next_in)
            vouched.extend(alive.sessions)
        if paces:
            every = min(paces)
            if runs_here is not None:
                runs_here(vouched)
        await asyncio.sleep(max(MIN_BEAT_S, every))


def _stdin() -> AsyncIterable[str]:
    """The process's stdin as lines of text; bytes that are not UTF-8 are kept (as
    surrogate escapes) for :class:`CheckedLines` to refuse, not replaced."""
    import anyio

    return anyio.wrap_file(open(0, encoding="utf-8", errors="surrogateescape", closefd=False))


class CheckedLines:
    """The client's lines, less those the MCP SDK would drop without an answer.

    The SDK's stdio reader drops a line it cannot read as a JSON-RPC message, and its
    sender waits for an answer that never comes: a model's text with half an emoji pair
    (a lone UTF-16 surrogate) in a tool argument hangs the tool call. Each line is read
    here first, with the rules of the HTTP API (:func:`.strict.parse_json`: UTF-8, no
    lone surrogates, nesting and numbers bounded), and as a JSON-RPC message. A line that
    fails goes to :attr:`refused` as the JSON-RPC error that answers it (``-32700`` or
    ``-32600``, with the request's id when it can be read), and never reaches the SDK."""

    def __init__(
        self, lines: AsyncIterable[str], cancelled: Callable[[Any], None] | None = None
    ) -> None:
        self._lines = lines
        self._cancelled = cancelled
        self.refused: asyncio.Queue[mt.JSONRPCError] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._checked()

    async def _checked(self) -> AsyncIterator[str]:
        async for line in self._lines:
            if not line.strip():
                continue
            error = refusal(line)
            if error is None:
                if self._cancelled is not None and CANCELLED in line:
                    for request in cancelled_requests(line):
                        self._cancelled(request)
                yield line
            else:
                log.warning("refused a line from the client: %s", error.error.message)
                self.refused.put_nowait(error)


CANCELLED = "notifications/cancelled"


def cancelled_requests(body: str | bytes) -> list[Any]:
    """The request ids a client's message (or batch) cancels with ``notifications/cancelled``
    (the SDK acts on it only for a call still running in the same connection; the tools
    also need it for one already answered, see :class:`Unanswered`)."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return []
    found = []
    for msg in value if isinstance(value, list) else [value]:
        if isinstance(msg, dict) and msg.get("method") == CANCELLED and "id" not in msg:
            params = msg.get("params")
            request = params.get("requestId") if isinstance(params, dict) else None
            if isinstance(request, (int, str)) and not isinstance(request, bool):
                found.append(request)
    return found


def refusal(line: str) -> mt.JSONRPCError | None:
    """The JSON-RPC error that answers ``line``, or None when the SDK can read it."""
    try:
        value = parse_json(line.encode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as exc:
        code = mt.PARSE_ERROR
        message = (
            f"Parse error: {exc.msg.removeprefix(REFUSED)}; send one JSON-RPC 2.0 message a "
            "line, as UTF-8 JSON with no lone UTF-16 surrogate (half an emoji pair) in its "
            "strings"
        )
    else:
        try:
            mt.jsonrpc_message_adapter.validate_python(value, by_name=False)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"][1:]) or "the message"
            code = mt.INVALID_REQUEST
            message = (
                f"Invalid Request: not a JSON-RPC 2.0 message ({where}: {first['msg']}); "
                'send one JSON-RPC 2.0 message a line, an object with "jsonrpc": "2.0" and a '
                '"method"'
            )
        else:
            return _invalid_params(line, value)
    error = mt.ErrorData(code=code, message=message)
    return mt.JSONRPCError(jsonrpc="2.0", id=_request_id(line), error=error)


#: Each request the client may send, by its method: what the SDK reads its params as.
_REQUESTS: dict[str, type[BaseModel]] = {
    typing.get_args(kind.model_fields["method"].annotation)[0]: kind
    for kind in typing.get_args(mt.ClientRequest)
}


def _invalid_params(line: str, value: Any) -> mt.JSONRPCError | None:
    """The ``-32602`` error naming what is wrong with a request's params (the SDK answers
    such a request with "Invalid request parameters" alone: a caller, often a model,
    cannot tell what to change), or None when the params are what its method takes or
    the method is one the SDK answers itself."""
    if type(value) is not dict or "id" not in value:
        return None
    method = value.get("method")
    kind = _REQUESTS.get(method) if isinstance(method, str) else None
    if kind is None:
        return None
    try:
        kind.model_validate(value, by_name=False)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or 'the request'}: {err['msg']}"
            for err in exc.errors()[:3]
        )
        message = (
            f"Invalid params of {method}: {problems}; send the params the MCP specification "
            f"gives for {method}"
        )
        error = mt.ErrorData(code=mt.INVALID_PARAMS, message=message)
        return mt.JSONRPCError(jsonrpc="2.0", id=_request_id(line), error=error)
    return None


class _Int(str):
    """An integer of a refused line, kept as its digits (no digit limit)."""


def _request_id(line: str) -> int | str | None:
    """The id of a refused line, when a lenient reading finds one at its top level."""
    try:
        msg = json.loads(line, parse_int=_Int, parse_float=str, parse_constant=str)
    except (ValueError, RecursionError):
        return None
    ident = msg.get("id") if isinstance(msg, dict) else None
    if isinstance(ident, _Int):
        return int(ident) if len(ident) <= 20 else None
    return ident if isinstance(ident, str) else None


class _Script:
    """A scripted client on the stdio transport's line streams (for :func:`wire_snapshot`)."""

    def __init__(self, lines: Sequence[dict[str, Any]], last_id: int) -> None:
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.answers: dict[Any, Any] = {}
        self._last = last_id
        for msg in lines:
            self.inbox.put_nowait(json.dumps(msg))

    def __aiter__(self) -> _Script:
        return self

    async def __anext__(self) -> str:
        line = await self.inbox.get()
        if line is None:
            raise StopAsyncIteration
        return line

    async def write(self, text: str) -> None:
        msg = json.loads(text)
        self.answers[msg.get("id")] = msg.get("result", msg.get("error"))
        if msg.get("id") == self._last:
            self.inbox.put_nowait(None)

    async def flush(self) -> None:
        pass


async def wire_snapshot() -> dict[str, Any]:
    """What the stdio server answers to ``initialize`` (each handshake version) and to
    ``tools/list``: the answers :mod:`.mcp_front` gives while the server loads."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    async def nobody(ctx: Any) -> Agent:
        raise AssertionError("listing tools acts for no one")

    server = build_server(nobody, delegate=True)
    snapshot: dict[str, Any] = {"initialize": {}}
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        hello = {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "snapshot", "version": "0"},
        }
        script = _Script(
            [
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            ],
            last_id=2,
        )
        async with stdio_server(script, script) as (read, write):  # type: ignore[arg-type]
            await server.run(read, write, init_options(server))
        snapshot["initialize"][version] = script.answers[1]
        snapshot["tools/list"] = script.answers[2]
    return snapshot
