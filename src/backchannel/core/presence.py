"""Claude Code team traffic read back: what an inbox entry is, and a member's state.

Claude Code teammates talk through inbox files (see
:mod:`backchannel.delivery.claude_inbox`). An entry is either chat (a teammate's words
for another member) or a protocol frame: a JSON object in ``text`` whose ``type`` is
``idle_notification``, ``shutdown_request``/``shutdown_approved``/``shutdown_rejected``/
``shutdown_response``, ``plan_approval_*`` or ``permission_*``. Chat becomes a hub
message; a protocol frame becomes the sender's state and a line of the team's traffic.

Member states, as the research on Claude Code teams defines them:

=============  ==============================================================
``active``     the member's last activity (any entry it wrote, chat or protocol,
               ``idle_notification`` included) is within 5 minutes of now
``idle``       its last activity is older
``terminated`` it approved a shutdown (``shutdown_approved``, or a
               ``shutdown_response`` with ``approve: true``) and wrote nothing since
=============  ==============================================================

Pure functions: no I/O, the time is passed in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from backchannel.types import MemberActivity, SessionState

__all__ = [
    "ACTIVE_WINDOW_S",
    "PROTOCOL_PREFIXES",
    "EntryKind",
    "activity_state",
    "classify",
    "entry_time",
    "protocol_frame",
]

#: A member counts as active this long after its last activity.
ACTIVE_WINDOW_S = 300.0

#: ``type`` values (exact, or prefixes ending in ``_``) that make an entry a protocol frame.
PROTOCOL_PREFIXES = (
    "idle_notification",
    "shutdown_",
    "plan_approval_",
    "permission_",
)


@dataclass(frozen=True, slots=True)
class EntryKind:
    """What one entry is. ``kind`` is ``"message"`` for chat, else the frame's ``type``;
    ``terminates`` is true for an approved shutdown (the sender's last word)."""

    kind: str
    frame: Mapping[str, Any] | None = None
    terminates: bool = False

    @property
    def is_chat(self) -> bool:
        return self.frame is None


def protocol_frame(text: Any) -> dict[str, Any] | None:
    """The JSON object Claude Code puts in ``text`` for protocol messages, else ``None``
    (any object with a string ``type``; :func:`classify` decides which ones are protocol)."""
    if not isinstance(text, str) or not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("type"), str) else None


def classify(entry: Mapping[str, Any]) -> EntryKind:
    """Chat or protocol frame. Frames of other types (``task_assignment``, say) are chat:
    they are meant for the recipient's model, so they travel as messages."""
    frame = protocol_frame(entry.get("text"))
    if frame is None:
        return EntryKind("message")
    kind = frame["type"]
    if not any(kind == p or (p.endswith("_") and kind.startswith(p)) for p in PROTOCOL_PREFIXES):
        return EntryKind("message")
    approved = kind == "shutdown_approved" or (
        kind == "shutdown_response" and frame.get("approve") is True
    )
    return EntryKind(kind, frame, approved)


def entry_time(stamp: Any, now: float) -> float:
    """When an entry was written: its ``timestamp`` (ISO-8601 or UNIX seconds) if it reads
    and is not in the future, else ``now`` (the moment the hub saw it)."""
    when: float | None = None
    if isinstance(stamp, int | float) and not isinstance(stamp, bool):
        when = float(stamp)
    elif isinstance(stamp, str):
        try:
            moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            when = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
        except ValueError:
            when = None
    return now if when is None or when != when or when > now else when


def activity_state(
    activity: MemberActivity, now: float, window_s: float = ACTIVE_WINDOW_S
) -> SessionState:
    """The research's state of a member from its inbox activity (see the module docstring).

    A shutdown approved at or after the member's last other activity is ``terminated``;
    anything the member writes later shows it is running again.
    """
    if activity.terminated_at is not None and activity.terminated_at >= activity.last_at:
        return SessionState.TERMINATED
    return SessionState.ACTIVE if now - activity.last_at <= window_s else SessionState.IDLE
