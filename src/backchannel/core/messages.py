"""Delivery rules: names, recipients, idempotent sends, leases and dead letters."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from backchannel.core.budget import ChainRef
from backchannel.errors import (
    InvalidName,
    InvalidRequest,
    MessageIdConflict,
    TooLarge,
    UnknownRecipient,
)
from backchannel.types import (
    BROADCAST,
    MESSAGE_ID_PATTERN,
    NAME_PATTERN,
    SESSION_PATTERN,
    DeliveryState,
    Message,
    MessageKind,
    Recipient,
    Session,
    SessionState,
)

# use with ``fullmatch`` only: ``match`` lets ``$`` accept a trailing newline
NAME_RE = re.compile(NAME_PATTERN)
SESSION_RE = re.compile(SESSION_PATTERN)
MESSAGE_ID_RE = re.compile(MESSAGE_ID_PATTERN)
DEFAULT_MAX_TEXT = 256 * 1024


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message of :meth:`Messages.send_many`: the arguments of :meth:`Messages.send`
    after the sender."""

    to: str
    text: str
    summary: str | None = None
    message_id: str | None = None
    kind: MessageKind = MessageKind.DIRECT
    sender_session: str | None = None
    to_session: str | None = None
    meta: Mapping[str, Any] | None = None
    link: bool = True
    close_link: bool = False
    link_budget: int | None = None
    chain: ChainRef | None = None  # named by another hub: see ``SendOptions.chain``


def check_name(what: str, name: str) -> str:
    """Return ``name`` if it is a valid team or member name, else raise :class:`InvalidName`."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidName(
            f"invalid {what} name {name!r}: use 1 to 64 letters, digits, '_' or '-', "
            "starting with a letter or digit",
            field=what,
        )
    return name


def check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not SESSION_RE.fullmatch(session_id):
        raise InvalidName(
            f"invalid session id {session_id!r}: use 1 to 200 letters, digits, '_', '-', '.' "
            "or ':', starting with a letter or digit",
            field="session",
        )
    return session_id


def current_session(sessions: Iterable[Session]) -> Session | None:
    """A member's session that runs now, of ``sessions``: a running one (idle or active)
    before one that exited (its process left it: ``SessionEnd``, ``/clear``, Codex's
    ``/new``) before a terminated one, then the most recently active, then the newest.
    By activity alone, a session that exited in the same moment as (or after) its
    process opened the next conversation was taken for the current one."""
    rank = {SessionState.ACTIVE: 2, SessionState.IDLE: 2, SessionState.EXITED: 1}
    return max(
        sessions,
        key=lambda s: (rank.get(s.state, 0), s.updated_at, s.created_at),
        default=None,
    )


def check_message_id(message_id: str, field: str = "message_id") -> str:
    """A client-chosen id (``field``: which one, for the error)."""
    if not isinstance(message_id, str) or not MESSAGE_ID_RE.fullmatch(message_id):
        raise InvalidRequest(
            f"invalid {field} {message_id!r}: use 1 to 128 letters, digits, '_', '-', '.' "
            "or ':', starting with a letter or digit (or omit it and the hub picks one)",
            field=field,
        )
    return message_id


def check_receive_id(receive_id: str) -> str:
    """A name a client gives one receive, the same when it makes the receive again."""
    if not isinstance(receive_id, str) or not MESSAGE_ID_RE.fullmatch(receive_id):
        raise InvalidRequest(
            f"invalid receive_id {receive_id!r}: use 1 to 128 letters, digits, '_', '-', "
            "'.' or ':', starting with a letter or digit, a new one for each receive and "
            "the same when that receive is made again (or omit it)",
            field="receive_id",
        )
    return receive_id


#: A receive's bounds: messages in one answer, seconds it waits for the first, seconds a
#: lease a caller asks for may last (the hub's and the HTTP API's).
MAX_LIMIT = 1000
MAX_WAIT = 3600
MAX_LEASE = 86_400
#: The longest message id (``MESSAGE_ID_PATTERN``).
MAX_MESSAGE_ID = 128
#: The longest session id (``SESSION_PATTERN``).
MAX_SESSION_ID = 200


def derived_id(name: str, limit: int = MAX_MESSAGE_ID) -> str:
    """An id the hub derives from what it names (``dead-<message>-<member>``,
    ``<session>-t<turn>-b<n>``, a delegation's ``<session>--<tool_use_id>``): ``name``
    itself when it fits in ``limit`` characters, else its start and a hash of all of it,
    so that two names never share an id by being cut short."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return f"{name[: limit - len(digest) - 1]}-{digest}"


def check_text(text: str, limit: int) -> None:
    if "\x00" in text:
        raise InvalidRequest(
            "text contains a NUL character (\\x00), which no store keeps; remove it or "
            "encode binary data (base64)",
            field="text",
        )
    size = len(text.encode("utf-8"))
    if size > limit:
        raise TooLarge(
            f"message text is {size} bytes, over the {limit}-byte limit; "
            "split it into several messages or send a file path instead",
            limit=limit,
            size=size,
        )


def fingerprint(
    sender: str,
    to: str,
    text: str,
    summary: str | None,
    kind: str,
    to_session: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> str:
    """Identity of a send's content: the same ``message_id`` must come with the same print."""
    h = hashlib.sha256()
    # fields joined with a separator no name contains; absent values differ from empty ones
    for part in (sender, to, to_session, summary, kind):
        h.update(b"\x00" if part is None else part.encode("utf-8") + b"\x1f")
    h.update(text.encode("utf-8"))
    if meta:
        h.update(b"\x1e" + json.dumps(dict(meta), sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


class Replay(StrEnum):
    NEW = "new"
    REPLAY = "replay"


def decide_replay(existing: Message | None, new_fingerprint: str) -> Replay:
    """A send is idempotent on ``message_id``: same content replays, other content conflicts."""
    if existing is None:
        return Replay.NEW
    if existing.fingerprint == new_fingerprint:
        return Replay.REPLAY
    raise MessageIdConflict(
        f"message_id {existing.message_id!r} was already used for a different message; "
        "pick a new message_id, or resend the original content to get its first result",
        message_id=existing.message_id,
    )


def suggest(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Known names closest to ``name``, best first."""
    pool = list(known)
    lowered = {k.lower(): k for k in pool}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]


def unknown_recipient(name: str, team: str, known: Iterable[str]) -> UnknownRecipient:
    hints = suggest(name, known)
    tail = (
        f"; did you mean {' or '.join(repr(h) for h in hints)}?"
        if hints
        else ("; list the team's members to see who can be reached")
    )
    return UnknownRecipient(
        f"unknown recipient {name!r} in team {team!r}{tail}", recipient=name, suggestions=hints
    )


def resolve_recipients(
    team: str,
    to: str,
    sender: str,
    members: Sequence[str],
    to_session: str | None = None,
) -> tuple[Recipient, ...]:
    """Who gets a copy. ``*`` reaches every member but the sender; a name reaches that member."""
    if to == BROADCAST:
        if to_session is not None:
            raise InvalidRequest("a broadcast cannot name a session", field="session")
        return tuple(Recipient(m) for m in sorted(members) if m != sender)
    if to not in members:
        raise unknown_recipient(to, team, members)
    return (Recipient(to, to_session),)


class ExpiryAction(StrEnum):
    REQUEUE = "requeue"
    DEAD = "dead"


def after_lease_expiry(attempts: int, max_attempts: int) -> ExpiryAction:
    """An expired lease is retried until ``max_attempts`` hand-outs have been made."""
    return ExpiryAction.DEAD if attempts >= max_attempts else ExpiryAction.REQUEUE


def exhausted_reason(attempts: int) -> str:
    return f"not acknowledged after {attempts} delivery attempt{'s' if attempts != 1 else ''}"


@dataclass(frozen=True, slots=True)
class DeadNotice:
    to: str
    text: str
    summary: str
    meta: Mapping[str, Any]


def dead_letter_notice(
    message: Message, recipient: Recipient, reason: str, advice: str | None = None
) -> DeadNotice:
    """The ``system`` message that tells a sender one copy of its message is dead;
    ``advice`` replaces the usual "check it is running, then send again"."""
    first = (
        message.summary or message.text.strip().splitlines()[0][:80] if message.text.strip() else ""
    )
    return DeadNotice(
        to=message.sender,
        text=(
            f"Your message {message.message_id} to {recipient.member} was not delivered: {reason}. "
            f"It begins: {first!r}. "
            + (
                advice
                or f"Check that {recipient.member} is running and reading its inbox, then "
                "send it again with a new message_id."
            )
        ),
        summary=f"undelivered: {message.message_id} to {recipient.member}",
        meta={
            "dead_message_id": message.message_id,
            "recipient": recipient.member,
            "reason": reason,
        },
    )


def aggregate_state(states: Iterable[DeliveryState]) -> DeliveryState:
    """One state for a message with several copies: the least advanced pending one wins."""
    order = [
        DeliveryState.QUEUED,
        DeliveryState.LEASED,
        DeliveryState.DELIVERED,
        DeliveryState.ACKED,
        DeliveryState.DEAD,
    ]
    seen = set(states)
    if not seen:
        return DeliveryState.ACKED
    for s in order:
        if s in seen:
            return s
    return DeliveryState.QUEUED
