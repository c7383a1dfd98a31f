"""Heartbeat rules: timers with intent, their breadcrumbs, and the anchor rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backchannel.errors import InvalidRequest
from backchannel.types import HUB_SENDER, InboxMessage, Message, MessageKind, Session

TIMER_JOB = "timer"
#: Firing later than this after the due time is reported as late (the hub was down).
LATE_AFTER = 2.0
MAX_SECONDS = 30 * 24 * 3600
#: The shortest timer. An agent that answers each firing by setting the next timer is
#: held to one firing a second at most (each also waits for the turn it starts to end).
MIN_SECONDS = 1
PREVIEW = 200
#: How many timers ``GET /v1/timers`` answers when no ``limit`` is given, and the most
#: it answers at once (a team's members may each hold a hundred; fired and cancelled
#: ones stay until retention removes them): the rest are read page by page, ``after``
#: the last timer id of the page before.
TIMER_PAGE = 100
MAX_TIMER_PAGE = 1000


class Intent(StrEnum):
    ANCHOR = "anchor"  # come back to your own task
    CHECK = "check"  # look at how a peer is doing
    WAIT = "wait"  # see whether a peer replied


class AnchorPolicy(StrEnum):
    ENFORCE = "enforce"
    WARN = "warn"
    OFF = "off"


def check_timer(intent: str, seconds: float, note: str, target: str | None) -> Intent:
    """Validate a ``set_timer`` call; the errors say how to call it right."""
    try:
        it = Intent(intent)
    except ValueError:
        raise InvalidRequest(
            f"unknown timer intent {intent!r}; use 'anchor' (return to your task), "
            "'check' (look at a peer) or 'wait' (see whether a peer replied)",
            field="intent",
        ) from None
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not MIN_SECONDS <= seconds <= MAX_SECONDS
    ):
        raise InvalidRequest(
            f"a timer is due between 1 second and 30 days from now, not {seconds!r} s",
            field="minutes",
        )
    if not isinstance(note, str) or not note.strip():
        raise InvalidRequest(
            "a timer needs a note: the breadcrumb you will read when it fires, e.g. "
            "'return to task 3 — implement the report generator'",
            field="note",
        )
    if len(note) > 2000:
        raise InvalidRequest("a timer note is at most 2000 characters", field="note")
    if it in (Intent.CHECK, Intent.WAIT) and not target:
        raise InvalidRequest(
            f"a {it.value!r} timer needs target: the peer to {'look at' if it is Intent.CHECK else 'wait for'}",
            field="target",
        )
    return it


def anchor_policy(settings: Mapping[str, Any]) -> AnchorPolicy:
    try:
        return AnchorPolicy(settings.get("anchor_policy", AnchorPolicy.ENFORCE.value))
    except ValueError:
        return AnchorPolicy.ENFORCE


#: How far ahead an anchor is set when no time is given (see docs/decisions.md): long
#: enough for a real piece of work, short enough that a conversation cannot hold an
#: agent away from its task for long.
class AnchorAction(StrEnum):
    PASS = "pass"  # the send goes on
    REFUSE = "refuse"  # AnchorRequired: the send is not made
    REMIND = "remind"  # the send goes on, and the sender is reminded


def anchor_action(policy: AnchorPolicy, anchored: bool) -> AnchorAction:
    """The anchor rule, for an agent's send to a peer it has an open link with:
    ``anchored`` says whether the sending session holds a pending anchor timer."""
    if policy is AnchorPolicy.OFF or anchored:
        return AnchorAction.PASS
    return AnchorAction.REFUSE if policy is AnchorPolicy.ENFORCE else AnchorAction.REMIND


DEFAULT_ANCHOR_MINUTES = 10


def anchor_call(peer: str) -> str:
    return (
        f'set_timer(intent="anchor", minutes={DEFAULT_ANCHOR_MINUTES}, '
        f'note="return to <your task> (talking with {peer})")'
    )


def is_anchor(m: InboxMessage) -> bool:
    """A fired anchor timer (handed over first: :func:`anchors_first`)."""
    return m.message.kind is MessageKind.TIMER and m.message.meta.get("intent") == "anchor"


def anchors_first(got: list[InboxMessage]) -> list[InboxMessage]:
    """A fired anchor is handed over before any other input leased with it (the order
    is otherwise kept): the agent reads where its own task stands before the rest."""
    if not any(is_anchor(m) for m in got):
        return got
    return [m for m in got if is_anchor(m)] + [m for m in got if not is_anchor(m)]


def anchor_missing(session_id: str, peer: str) -> str:
    return (
        f"session {session_id!r} holds no pending anchor timer, and {peer!r} is a linked peer: "
        "set an anchor first so you come back to your own work, for example "
        f"{anchor_call(peer)}; then send again"
    )


def anchor_reminder(peer: str) -> str:
    return (
        f"Reminder: you messaged your linked peer {peer} without a pending anchor timer. "
        f"Set one so you come back to your own work: {anchor_call(peer)}"
    )


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW else flat[: PREVIEW - 1] + "…"


@dataclass(frozen=True, slots=True)
class Reply:
    """The first message from a ``wait`` timer's target since it was set, as the timer
    notes it when it is sent (``noted``, in the job's payload): the breadcrumb quotes it
    from there, so retention may remove the message meanwhile."""

    message_id: str
    created_at: float
    preview: str

    @classmethod
    def of(cls, message: Message) -> Reply:
        return cls(message.message_id, message.created_at, _preview(message.text))

    def noted(self) -> dict[str, Any]:
        return {"reply": self.message_id, "reply_at": self.created_at, "reply_text": self.preview}

    @classmethod
    def answers(cls, message: Message) -> list[tuple[str, str | None, Reply]]:
        """The answers a hub's tool result carries: for each, the callee, the
        delegation's id and the answer as a reply at the tool result's time (the hub
        puts the time the callee answered in its place). A delegation's answer reaches
        its caller as the hub's message, never as one from the callee; a callee that
        failed or timed out did not reply."""
        if message.kind is not MessageKind.TOOL_RESULT or message.sender != HUB_SENDER:
            return []
        results = message.meta.get("results")
        out = []
        for r in results if isinstance(results, list) else []:
            if not isinstance(r, Mapping) or not isinstance(callee := r.get("to"), str):
                continue
            if "result" not in r:
                continue  # an error: the callee did not answer
            answer = r["result"] if isinstance(r["result"], str) else ""
            did = r.get("delegation_id")
            reply = cls(message.message_id, message.created_at, _preview(answer))
            out.append((callee, did if isinstance(did, str) else None, reply))
        return out

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Reply | None:
        """The reply a payload noted whole (``None`` when it names none, or only its id,
        as a timer noted before the text was)."""
        mid, at, text = payload.get("reply"), payload.get("reply_at"), payload.get("reply_text")
        if isinstance(mid, str) and isinstance(at, int | float) and isinstance(text, str):
            return cls(mid, float(at), text)
        return None


@dataclass(frozen=True, slots=True)
class PeerView:
    """What a ``check`` or ``wait`` timer needs to know about its target."""

    member: str
    session: Session | None
    #: the first message from the peer since the timer was set, or the one before it
    #: that its member had not read yet when it set it (an answer to its question)
    reply: Reply | None
    #: the reply came before the timer was set (found unread as it was set)
    before: bool = False


def breadcrumb(
    intent: Intent,
    note: str,
    *,
    due_at: float,
    now: float,
    set_at: float,
    peer: PeerView | None = None,
    failures: int = 0,
) -> tuple[str, dict[str, Any]]:
    """The text a firing timer shows its session, and its machine-readable facts. A timer
    late because its firing failed ``failures`` times (set aside by maintenance and
    retried with backoff) says so; any other lateness is the hub's absence."""
    lines = [f"{intent.value.upper()}: {note}"]
    meta: dict[str, Any] = {"intent": intent.value, "due_at": due_at}
    late = now - due_at
    if late > LATE_AFTER:
        if failures:
            times = f"{failures} time{'s' if failures > 1 else ''}"
            why = f"it was set aside after its firing failed ({times}) and retried"
        else:
            why = "the hub was not running when it was due"
        lines.append(f"(late by {_ago(late)}: {why})")
        meta["late_seconds"] = round(late, 3)
    if failures:
        meta["failures"] = failures
    if intent is Intent.CHECK and peer is not None:
        s = peer.session
        if s is None:
            lines.append(f"{peer.member} has no session yet.")
            meta["peer_state"] = None
        else:
            lines.append(
                f"{peer.member} is {s.state.value} (session {s.session_id}, turn {s.turn})."
            )
            meta["peer_state"] = s.state.value
            if s.last_output:
                lines.append(f'Its last finished output began: "{_preview(s.last_output)}"')
            else:
                lines.append("It has not finished a turn with output yet.")
    elif intent is Intent.WAIT and peer is not None:
        meta["target"] = peer.member
        if peer.reply is not None and peer.before:
            lines.append(
                f"{peer.member} replied before you set this timer "
                f"({_ago(set_at - peer.reply.created_at)} before), in a message you had "
                f'not read yet: "{peer.reply.preview}"'
            )
            meta["replied"] = True
            meta["reply_message_id"] = peer.reply.message_id
        elif peer.reply is not None:
            lines.append(
                f"{peer.member} has replied since you set this timer "
                f'({_ago(peer.reply.created_at - set_at)} after): "{peer.reply.preview}"'
            )
            meta["replied"] = True
            meta["reply_message_id"] = peer.reply.message_id
        else:
            lines.append(
                f"{peer.member} has not replied since you set this timer ({_ago(now - set_at)} ago)."
            )
            meta["replied"] = False
    return "\n".join(lines), meta


def waiting_on(message: Message) -> str | None:
    """The peer a fired ``wait`` breadcrumb said had not replied (None for any other
    message, or a breadcrumb of a hub that did not note its target)."""
    meta = message.meta
    if message.kind is not MessageKind.TIMER or message.sender != HUB_SENDER:
        return None
    if meta.get("intent") != Intent.WAIT.value or meta.get("replied") is not False:
        return None
    target = meta.get("target")
    return target if isinstance(target, str) else None


def replied_after_firing(message: Message, reply: Reply) -> Message:
    """A fired ``wait`` breadcrumb as it is handed over when its peer replied after it
    fired (it waited for its session's turn to end): it says the reply, not the "has
    not replied" of its firing, so the model does not act on words the reply, handed
    over with it, already made wrong. The stored message keeps the words of its
    firing; its history says when it was handed over."""
    target = waiting_on(message)
    lines = message.text.splitlines()
    said = f"{target} has not replied since you set this timer"
    fresh = (
        f"{target} replied after this timer fired, before you read it "
        f'({_ago(reply.created_at - message.created_at)} after it fired): "{reply.preview}"'
    )
    text = "\n".join(fresh if line.startswith(said) else line for line in lines)
    meta = {
        **message.meta,
        "replied": True,
        "reply_message_id": reply.message_id,
        "replied_after_firing": True,
    }
    return dataclasses.replace(message, text=text, meta=meta)
