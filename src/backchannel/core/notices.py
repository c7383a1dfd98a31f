"""The messages the hub writes itself: one factory for their ids, kinds and framing.

Every message whose sender is the hub (``system`` notices, checkpoints, timers, tool
results, dead-letter notices) and every message the hub writes on a member's behalf
(link crossings, closing ``<message>`` blocks, a delegation's task) is made here.

Ids: a message that must be written at most once has an id derived from what it is
about, and the caller checks the id is free first (``dead-<message>-<member>``,
``late-<delegation>``, ``<link>-<n>``...); any other notice gets ``sys_`` and a random
hex id. The fingerprint of a hub-made message covers everything in it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from backchannel.core import links as link_rules
from backchannel.core import messages as rules
from backchannel.types import HUB_SENDER, Link, Message, MessageKind, Recipient

__all__ = [
    "block",
    "checkpoint",
    "crossing",
    "dead_letter",
    "new_system_id",
    "system",
    "task",
    "timer",
    "tool_result",
]

#: Longest summary the hub derives from a message's first line.
SUMMARY_WIDTH = 120


def new_system_id() -> str:
    return "sys_" + uuid.uuid4().hex


def _message(
    team: str,
    sender: str,
    to: str,
    text: str,
    kind: MessageKind,
    now: float,
    *,
    message_id: str,
    summary: str | None = None,
    meta: Mapping[str, Any] | None = None,
    pinned: str | None = None,
    sender_session: str | None = None,
    chain: tuple[str, int] | None = None,
) -> Message:
    meta = dict(meta or {})
    return Message(
        team=team,
        message_id=message_id,
        sender=sender,
        to=to,
        text=text,
        kind=kind,
        created_at=now,
        fingerprint=rules.fingerprint(sender, to, text, summary, kind.value, pinned, meta),
        summary=summary,
        sender_session=sender_session,
        meta=meta,
        chain_id=chain[0] if chain else None,
        hop=chain[1] if chain else 0,
    )


def system(
    team: str,
    to: str,
    text: str,
    now: float,
    *,
    message_id: str | None = None,
    summary: str | None = None,
    meta: Mapping[str, Any] | None = None,
    pinned: str | None = None,
    chain: tuple[str, int] | None = None,
) -> Message:
    """A ``system`` notice from the hub to member ``to`` (``pinned``: the session it is
    for; ``chain``: the chain it belongs to, so a turn it starts goes no further)."""
    return _message(
        team, HUB_SENDER, to, text, MessageKind.SYSTEM, now,
        message_id=message_id or new_system_id(), summary=summary, meta=meta, pinned=pinned,
        chain=chain,
    )  # fmt: skip


def dead_letter(
    msg: Message, recipient: Recipient, reason: str, now: float, advice: str | None = None
) -> Message:
    """Tells the sender of ``msg`` that its copy for ``recipient`` is dead."""
    notice = rules.dead_letter_notice(msg, recipient, reason, advice)
    return system(
        msg.team, notice.to, notice.text, now,
        message_id=rules.derived_id(f"dead-{msg.message_id}-{recipient.member}"),
        summary=notice.summary,
        meta=notice.meta,
    )  # fmt: skip


def checkpoint(team: str, member: str, session: str, text: str, now: float) -> Message:
    """The idle check-in prompt handed to ``session``."""
    return _message(
        team, HUB_SENDER, member, text, MessageKind.CHECKPOINT, now,
        message_id=new_system_id(), pinned=session,
    )  # fmt: skip


def timer(
    team: str,
    member: str,
    session: str,
    job_id: int,
    text: str,
    meta: Mapping[str, Any],
    now: float,
) -> Message:
    """A fired timer's breadcrumb, for the session that set it."""
    return _message(
        team, HUB_SENDER, member, text, MessageKind.TIMER, now,
        message_id=f"timer-{job_id}-{uuid.uuid4().hex[:8]}",
        summary=text.splitlines()[0][:SUMMARY_WIDTH], meta=meta, pinned=session,
    )  # fmt: skip


def tool_result(
    team: str,
    caller: str,
    text: str,
    meta: Mapping[str, Any],
    now: float,
    *,
    message_id: str,
    pinned: str | None,
) -> Message:
    """Delegation results (or a late result) for the caller's session."""
    return _message(
        team, HUB_SENDER, caller, text, MessageKind.TOOL_RESULT, now,
        message_id=message_id, summary=text.splitlines()[0][:SUMMARY_WIDTH], meta=meta,
        pinned=pinned,
    )  # fmt: skip


def crossing(link: Link, sender: str, session: str, peer: str, output: str, n: int, pinned: str | None, now: float) -> Message:  # fmt: skip
    """Turn ``n`` of ``link``: ``sender``'s output, framed, for its peer."""
    return _message(
        link.team, sender, peer, link_rules.frame(sender, output), MessageKind.LINK, now,
        message_id=f"{link.link_id}-{n}", meta={"link_id": link.link_id, "crossing": n},
        pinned=pinned, sender_session=session,
    )  # fmt: skip


def block(
    team: str, sender: str, session: str, to: str, body: str, now: float, *, message_id: str
) -> Message:
    """A closing ``<message to=...>`` block of ``session``'s turn, sent as its member."""
    return _message(
        team, sender, to, body, MessageKind.DIRECT, now,
        message_id=message_id, sender_session=session,
    )  # fmt: skip


def task(
    team: str,
    sender: str,
    callee: str,
    text: str,
    delegation_id: str,
    pinned: str | None,
    now: float,
    sender_session: str | None = None,
) -> Message:
    """A delegation's task for its callee, from the turn of ``sender_session`` when it
    is this hub's; the reply route stays in the delegation record, never in the
    message."""
    return _message(
        team, sender, callee, text, MessageKind.DELEGATION, now,
        message_id=f"task-{delegation_id}", meta={"delegation_id": delegation_id}, pinned=pinned,
        sender_session=sender_session,
    )  # fmt: skip
